//! FCIP encapsulated frames and the stream decoder under arbitrary input.
//!
//! A header that passes RFC 3821's checks re-emits byte for byte; a whole
//! frame that parses (checks, delimiters, FC CRC) re-emits byte for byte;
//! the stream decoder, fed the input in chunks of input-chosen sizes,
//! never panics, and every frame it hands on is one that parses.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fcip::codec::{Decoder, DecoderConfig, Item};
use unifab_fcip::wire::encap::{EncapHeader, EncapRepr};
use unifab_fcip::wire::frame::{FcipFrame, FcipFrameRepr};
use unifab_fcip::wire::fsf::SpecialFrame;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = EncapHeader::new_checked(data) {
        if let Ok(r) = EncapRepr::parse(&h) {
            assert_eq!(&r.to_bytes()[..], &data[..28]);
        }
    }
    let b = Bytes::copy_from_slice(data);
    if let Ok(r) = FcipFrameRepr::parse(&b) {
        assert_eq!(r.to_bytes().expect("a parsed frame re-emits"), data);
    }
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut d = Decoder::new(DecoderConfig::default());
    for chunk in rest.chunks(step) {
        d.extend(chunk);
        loop {
            match d.decode() {
                Ok(Some(Item::Frame(f))) => {
                    let v = FcipFrame::new_checked(f).expect("decoded frames are whole");
                    v.check(true).expect("decoded frames pass the checks");
                }
                Ok(Some(Item::Special(s))) => {
                    SpecialFrame::new_checked(&s[..]).expect("decoded special frames parse");
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
