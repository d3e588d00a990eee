//! ELS (and FCP link service) payloads under arbitrary input. The first
//! byte names the request an LS_ACC answers (0: unknown).
//!
//! `ElsRepr::parse` never panics; what parses re-emits, the re-emitted
//! bytes parse to the same repr (fixed point) and are a prefix-canonical
//! form of the input: same length for every fixed-size payload, never
//! longer than the input. The `From<&WireError>` answer is total.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::wire::els::{ElsCode, ElsRepr, LsRjt};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let answering = (sel != 0).then_some(ElsCode(sel));
    let b = Bytes::copy_from_slice(rest);
    match ElsRepr::parse(&b, answering) {
        Ok(e) => {
            let out = e.to_bytes().expect("a parsed ELS re-emits");
            assert!(out.len() <= b.len());
            let again = ElsRepr::parse(&out, answering).expect("re-emitted ELS parses");
            assert_eq!(again, e);
            assert_eq!(again.to_bytes().expect("re-emits"), out);
        }
        Err(err) => {
            let _ = LsRjt::from(&err);
        }
    }
});
