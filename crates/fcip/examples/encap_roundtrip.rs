//! Parse a captured FCIP encapsulation header (RFC 3643/3821), check it as
//! a receiver must, and emit it back.
//!
//!     cargo run -p unifab-fcip --example encap_roundtrip
use unifab_fcip::wire::{EncapHeader, EncapRepr};

/// The header of frame 26 of fcip_trace.cap (an ELP, 42 words).
const ELP: [u8; 28] = [
    0x01, 0x01, 0xfe, 0xfe, 0x01, 0x01, 0xfe, 0xfe, 0x00, 0x00, 0xff, 0xff, 0x00, 0x2a, 0xff, 0xd5,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

fn main() -> Result<(), unifab_fcip::wire::WireError> {
    let view = EncapHeader::new_checked(&ELP[..])?;
    // Protocol, version and the ones' complement copies (RFC 3821 §5.6).
    view.check()?;
    let repr = EncapRepr::parse(&view)?;
    println!(
        "protocol {:?}, frame of {} words, CRC valid: {}",
        view.protocol(),
        repr.frame_len,
        repr.flags.crc_valid()
    );
    assert_eq!(repr.to_bytes(), ELP, "the header re-emits byte for byte");
    println!("re-emitted: identical");
    Ok(())
}
