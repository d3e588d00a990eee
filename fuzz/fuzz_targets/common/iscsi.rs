//! Shared by the iSCSI session and login targets (each uses part of it,
//! hence `allow(dead_code)`): turning input into frames the
//! way the drivers do (`wire::Framer`, no digests), and checking that what
//! a session sends is a well-formed PDU.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use unifab_iscsi::wire::{Digests, Framer, Pdu, PduFrame, WireError, encode_pdu};

/// The framer's limit for PDUs built here (the sessions enforce their own).
pub const FRAMER_MAX: u32 = 1 << 24;

/// Frames `wire` as a driver would; `None` where the framer refuses it.
pub fn frame(wire: &[u8]) -> Option<PduFrame> {
    let framer = Framer {
        digests: Digests::default(),
        max_data_segment_length: FRAMER_MAX,
    };
    match framer.decode(&mut BytesMut::from(wire)) {
        Ok(Some(f)) => Some(f),
        _ => None,
    }
}

/// A PDU built from a repr and a data segment.
pub fn frame_pdu(pdu: &Pdu, data: &[u8]) -> Option<PduFrame> {
    let wire = encode_pdu(pdu, &[], data, Digests::default()).ok()?;
    frame(&wire)
}

/// A data segment of `len` bytes: taken from the input while it lasts,
/// then one repeated byte (long segments cost the fuzzer no input).
pub fn data(u: &mut Unstructured<'_>, len: usize) -> Result<Vec<u8>> {
    let fill: u8 = u.arbitrary()?;
    let take = len.min(u.len()).min(64);
    let mut v = u.bytes(take)?.to_vec();
    v.resize(len, fill);
    Ok(v)
}

/// A raw PDU from the input: 48 header bytes, up to two AHS words and a
/// data segment, with TotalAHSLength and DataSegmentLength made to match
/// (a stream whose lengths lie only desynchronises the framer, which
/// `iscsi_pdu` covers). `fix` may then patch fields in the header.
pub fn raw_pdu(
    u: &mut Unstructured<'_>,
    max_data: usize,
    fix: impl FnOnce(&mut [u8; 48], &mut Unstructured<'_>) -> Result<()>,
) -> Result<Option<PduFrame>> {
    let mut bhs = [0u8; 48];
    u.fill_buffer(&mut bhs)?;
    let ahs_words: u8 = u.int_in_range(0..=2)?;
    let mut ahs = vec![0u8; usize::from(ahs_words) * 4];
    u.fill_buffer(&mut ahs)?;
    let len = u.int_in_range(0..=max_data)?;
    let seg = data(u, len)?;
    fix(&mut bhs, u)?;
    bhs[4] = ahs_words;
    let dsl = u32::try_from(seg.len()).unwrap_or(u32::MAX).to_be_bytes();
    bhs[5..8].copy_from_slice(&dsl[1..]);
    let mut wire = bhs.to_vec();
    wire.extend_from_slice(&ahs);
    wire.extend_from_slice(&seg);
    wire.resize(wire.len().next_multiple_of(4), 0);
    Ok(frame(&wire))
}

/// Writes a big-endian u32 into a header.
pub fn put32(bhs: &mut [u8; 48], at: usize, v: u32) {
    bhs[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// Checks that a PDU a session emitted encodes, frames and parses back to
/// the same header; returns the length of its data segment.
pub fn check_emitted(pdu: &Pdu, ahs: &[u8], data: &[Bytes]) -> usize {
    let flat: Vec<u8> = data.iter().flat_map(|b| b.iter().copied()).collect();
    let wire = match encode_pdu(pdu, ahs, &flat, Digests::default()) {
        Ok(w) => w,
        Err(e) => panic!("an emitted PDU does not encode ({e}): {pdu:?}"),
    };
    let Some(f) = frame(&wire) else {
        panic!("an emitted PDU does not frame: {pdu:?}");
    };
    match f.parse() {
        Ok(back) => assert_eq!(&back, pdu, "an emitted PDU parses back differently"),
        Err(e) => panic!("an emitted PDU does not parse ({e}): {pdu:?}"),
    }
    flat.len()
}

/// Whether `FUZZ_TRACE` is set: the targets then print what they do, to
/// read a crash input's story (`FUZZ_TRACE=1 target/…/<target> crash-…`).
pub fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FUZZ_TRACE").is_some())
}

/// How far the clock moves in one step: microseconds, milliseconds, to
/// the session's next deadline (`next`, as its `poll_timeout` gives it), or
/// seconds.
pub fn time_step(
    u: &mut Unstructured<'_>,
    now: Instant,
    next: Option<Instant>,
) -> Result<Duration> {
    Ok(match u.int_in_range(0..=3)? {
        0 => Duration::from_micros(u.int_in_range(1..=2_000)?),
        1 => Duration::from_millis(u.int_in_range(1..=1_000)?),
        2 => match next {
            Some(t) if t > now => t - now,
            _ => Duration::from_millis(1),
        },
        _ => Duration::from_secs(u.int_in_range(1..=60)?),
    })
}

/// A tag that is mostly 0xffffffff (none), else any value.
pub fn mostly_reserved(u: &mut Unstructured<'_>, in_eight: u8) -> Result<u32> {
    Ok(if u.ratio(in_eight, 8)? {
        0xffff_ffff
    } else {
        u.arbitrary()?
    })
}

/// The framer of a replayed capture stream: `sel` bit 0 header digest,
/// bit 1 data digest.
pub fn replay_framer(sel: u8, max_data_segment_length: u32) -> Framer {
    Framer {
        digests: Digests {
            header: sel & 1 != 0,
            data: sel & 2 != 0,
        },
        max_data_segment_length,
    }
}

/// The next PDU of a replayed stream.
pub enum Next {
    /// A PDU, with a copy of its header to patch.
    Pdu(PduFrame, [u8; 48]),
    /// A PDU whose data digest failed: its header.
    DigestError(Bytes),
    /// The stream ended or lost its framing.
    End,
}

/// Splits the next PDU off a replayed stream.
pub fn next_pdu(framer: &Framer, buf: &mut BytesMut) -> Next {
    match framer.decode(buf) {
        Ok(Some(f)) => {
            let mut bhs = [0u8; 48];
            bhs.copy_from_slice(&f.bhs[..48]);
            Next::Pdu(f, bhs)
        }
        Err(WireError::DataDigest { bhs, .. }) => Next::DigestError(bhs),
        Ok(None) | Err(_) => Next::End,
    }
}
