//! Parse a captured FC-2 frame header, print its fields, and emit it back.
//!
//!     cargo run -p unifab-fc --example header_roundtrip
use unifab_fc::WireError;
use unifab_fc::wire::{FcHeader, FcHeaderRepr};

/// The header of the FLOGI in frame 1 of fcoe-t11.pcap.
const FLOGI: [u8; 24] = [
    0x22, 0xff, 0xff, 0xfe, 0x00, 0x00, 0x00, 0x00, 0x01, 0x29, 0x00, 0x00, 0xee, 0x00, 0x00, 0x00,
    0x03, 0xf7, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00,
];

fn main() -> Result<(), WireError> {
    // A view checks the length once; after that no getter can panic.
    let view = FcHeader::new_checked(&FLOGI[..])?;
    println!(
        "R_CTL {:?}  D_ID {}  S_ID {}",
        view.r_ctl(),
        view.d_id(),
        view.s_id()
    );
    println!(
        "TYPE {:?}  F_CTL {:#08x}  OX_ID {:?}",
        view.fc_type(),
        view.f_ctl().bits(),
        view.ox_id()
    );
    // The owned meaning, and the same bytes again.
    let repr = FcHeaderRepr::parse(&view);
    let mut out = [0u8; 24];
    repr.emit(&mut FcHeader::new_unchecked(&mut out[..]));
    assert_eq!(out, FLOGI, "the header re-emits byte for byte");
    println!("re-emitted: identical");
    Ok(())
}
