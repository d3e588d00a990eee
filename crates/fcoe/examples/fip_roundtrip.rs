//! Parse a captured FIP frame (FC-BB-5 §7.8), print its descriptors, and
//! emit it back.
//!
//!     cargo run -p unifab-fcoe --example fip_roundtrip
use bytes::Bytes;
use unifab_fcoe::wire::FipRepr;

/// Frame 2 of fip-ka.cap (a VN_Port keep-alive) after the EtherType, up to
/// the end of its descriptor list.
const KEEP_ALIVE: [u8; 38] = [
    0x10, 0x00, 0x00, 0x03, 0x00, 0x01, 0x00, 0x07, 0x80, 0x00, 0x02, 0x02, 0x00, 0x17, 0xa4, 0x3e,
    0x34, 0x8c, 0x0b, 0x05, 0x0e, 0xfc, 0x00, 0x13, 0x04, 0x00, 0x00, 0x13, 0x04, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

fn main() -> Result<(), unifab_fcoe::wire::WireError> {
    let frame = Bytes::from_static(&KEEP_ALIVE);
    let repr = FipRepr::parse(&frame)?;
    println!("{} from {:?}", repr.name(), repr.mac());
    for (mac, fc_id, wwpn) in repr.vx_ports() {
        println!("  VN_Port {mac:?} FC_ID {fc_id} WWPN {wwpn}");
    }
    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out)?;
    assert_eq!(out, KEEP_ALIVE, "the frame re-emits byte for byte");
    println!("re-emitted: identical");
    Ok(())
}
