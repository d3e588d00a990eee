//! The FCIP Special Frame and the handshake under arbitrary input.
//!
//! A special frame that passes its checks re-emits byte for byte (but for
//! the reserved byte 57 and the reserved pFlags bits, written as zero) and
//! parses back to the same repr; the acceptor and the echo
//! check never panic, and the acceptor's echo is either the input or the
//! input with Ch and the destination filled in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unifab_fc::wire::Wwn;
use unifab_fcip::proto::handshake::{Accepted, Acceptor, check_echo};
use unifab_fcip::wire::encap::PFlags;
use unifab_fcip::wire::fsf::{SPECIAL_FRAME_LEN, SpecialFrame, SpecialFrameRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = SpecialFrame::new_checked(data) {
        let r = SpecialFrameRepr::parse(&v);
        let mut out = r.to_bytes();
        // Reserved bits are written as zero: the reserved byte 57 and the
        // pFlags bits other than Ch and SF (byte 8, complement in byte 10).
        // Everything else re-emits byte for byte, and the output is a
        // fixed point.
        assert_eq!(out[8], data[8] & (PFlags::CH | PFlags::SF));
        assert_eq!(out[10], !out[8]);
        let again = SpecialFrameRepr::parse(
            &SpecialFrame::new_checked(&out[..]).expect("re-emitted special frame parses"),
        );
        assert_eq!(again, r);
        out[8] = data[8];
        out[10] = data[10];
        out[57] = data[57];
        assert_eq!(&out[..], data);
    }
    let mut a = Acceptor::new(Wwn(0x1000_0000_0000_0001));
    let ip = std::net::IpAddr::from([10, 0, 0, 1]);
    for _ in 0..2 {
        match a.accept(ip, data, |r| r.source_wwn.0 & 1 == 0) {
            Ok(Accepted::Join { echo, .. }) => assert_eq!(&echo[..], data),
            Ok(Accepted::Identify(e)) => {
                let r = SpecialFrameRepr::parse(
                    &SpecialFrame::new_checked(&e[..]).expect("echo parses"),
                );
                assert!(r.changed);
            }
            Err(_) => {}
        }
    }
    if data.len() >= SPECIAL_FRAME_LEN {
        let mut sent = [0u8; SPECIAL_FRAME_LEN];
        sent.copy_from_slice(&data[..SPECIAL_FRAME_LEN]);
        let _ = check_echo(&sent, &data[SPECIAL_FRAME_LEN..]);
    }
});
