//! FC-2 frames under arbitrary input.
//!
//! 1. `FcHeaderRepr` keeps all 24 bytes: parse → emit is byte-exact.
//! 2. `FrameRepr::parse` (with a reply tracker fed by earlier frames of the
//!    same input, so accepts are decoded against requests) never panics; a
//!    frame that parses re-emits to as many bytes as it had (the trailer
//!    keeps whatever the structure does not cover), and the re-emitted
//!    bytes parse to the same frame (fixed point). Byte equality with the
//!    input holds only for canonical input: reserved fields are written
//!    as zero (every frame of the real captures is canonical, see the
//!    capture tests).
//! 3. `Frame::parse` and the CRC over header and payload agree with the
//!    byte layout.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::wire::crc::fc_crc;
use unifab_fc::wire::delimiter::{Eof, Sof};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{FcHeaderRepr, FrameRepr, ReplyTracker};

/// A tracker that knows the request this frame answers, when the frame
/// itself is a request (replies are checked without context: opaque).
fn tracker_snapshot(b: &Bytes) -> Option<ReplyTracker> {
    // Requests carry their own context; a fresh tracker decodes them alike.
    match b.first() {
        Some(0x22 | 0x02 | 0x32) => Some(ReplyTracker::new()),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = FcHeaderRepr::parse_bytes(data) {
        assert_eq!(&h.to_bytes()[..], &data[..24]);
    }
    // The input is a sequence of frames, each prefixed by a 2-byte length.
    let mut tracker = ReplyTracker::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])) % 2200;
        rest = &rest[2..];
        let take = n.min(rest.len());
        let b = Bytes::copy_from_slice(&rest[..take]);
        rest = &rest[take..];
        let before = tracker_snapshot(&b);
        if let Ok(r) = FrameRepr::parse(&b, Some(&mut tracker)) {
            let out = Bytes::from(r.to_bytes().expect("a parsed frame re-emits"));
            assert_eq!(out.len(), b.len(), "{:?}", r.payload.kind());
            let mut t = before;
            let again = FrameRepr::parse(&out, t.as_mut()).expect("re-emitted frame parses");
            if t.is_some() {
                assert_eq!(again, r);
            }
            assert_eq!(again.to_bytes().expect("re-emits"), &out[..]);
        }
        if let Ok(f) = Frame::parse(b.clone(), Sof::I3, Eof::T) {
            let mut v = Vec::new();
            f.write_to(&mut v);
            assert_eq!(v, &b[..]);
            assert_eq!(f.crc(), fc_crc(&b));
        }
    }
});
