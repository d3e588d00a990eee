//! CT_IUs (name server) under arbitrary input, and the name server
//! answering them. The first two bytes name the request an FS_ACC answers.
//!
//! 1. `CtIu::parse` never panics; what parses re-emits, and the
//!    re-emitted bytes parse to the same IU (fixed point).
//! 2. A parsed request is answered by a name server holding a few
//!    entries, with a zoning predicate derived from the input; the answer
//!    emits and parses back to itself.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::fabric::name_server::NameServer;
use unifab_fc::wire::ct::{CtCommand, CtIu, CtReject};
use unifab_fc::wire::{FcId, Wwn};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let answering = CtCommand(u16::from_be_bytes([data[0], data[1]]));
    let b = Bytes::copy_from_slice(&data[2..]);
    match CtIu::parse(&b, Some(answering)) {
        Ok(iu) => {
            let out = iu.to_bytes().expect("a parsed CT_IU re-emits");
            let again = CtIu::parse(&out, Some(answering)).expect("re-emitted CT_IU parses");
            assert_eq!(again, iu);
        }
        Err(e) => {
            let _ = CtReject::from(&e);
        }
    }
    if let Ok(iu) = CtIu::parse(&b, None) {
        let mut ns = NameServer::default();
        for k in 1..=4u32 {
            ns.register_login(
                FcId::from_parts(1, k as u8, 0),
                Wwn(0x2100_0000_0000_0000 | u64::from(k)),
                Wwn(0x2000_0000_0000_0000 | u64::from(k)),
                Wwn(0x1000_0000_0000_0000 | u64::from(k)),
            );
        }
        let mask = data[0];
        let requester = FcId::from_parts(1, 1 + (data[1] % 4), 0);
        let (reply, _) = ns.handle(requester, &iu, |a, b| {
            a == b || mask & (1 << ((a.area() ^ b.area()) % 8)) != 0
        });
        let out = reply.to_bytes().expect("an answer emits");
        let back = CtIu::parse(&out, Some(iu.preamble.command)).expect("the answer parses");
        assert_eq!(back, reply);
    }
});
