//! Fibre Channel frames in captures: bare FC-2 (pcap link types 224 and
//! 225), FC inside FCoE (EtherType 0x8906), and the FC frames FIP carries
//! in its link-service descriptors (FLOGI, FDISC, LOGO and their
//! replies). Each frame is parsed with `unifab-fc`'s wire layer (replies
//! decoded against their requests), re-emitted, and compared byte for
//! byte; the CRC is checked where the capture has one.
//!
//! The FCoE header and trailer (version, reserved bytes, SOF, CRC, EOF)
//! are re-emitted here too; the FIP frame around an FC frame is not (a
//! FIP checker belongs to the FCoE crate), so FIP frames are still
//! counted as unchecked while their FC frames are checked.

use bytes::Bytes;
use unifab_fc::wire::crc::fc_crc;
use unifab_fc::wire::delimiter::{Eof, Sof};
use unifab_fc::wire::header::HEADER_LEN;
use unifab_fc::wire::{FrameRepr, ReplyTracker};

use super::pcap::LinkType;
use crate::check::{Entry, Protocol, Verdict};

/// FCoE encapsulation header length (version, reserved, SOF).
pub const FCOE_HEADER_LEN: usize = 14;
/// FCoE trailer length (CRC, EOF, reserved).
pub const FCOE_TRAILER_LEN: usize = 8;

pub(crate) fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Parses and re-emits header + payload; `what` and the verdict.
pub(crate) fn round_trip(body: &[u8], tracker: &mut ReplyTracker) -> (String, Verdict) {
    let bytes = Bytes::copy_from_slice(body);
    match FrameRepr::parse(&bytes, Some(tracker)) {
        Ok(r) => {
            let what = r.payload.kind();
            match r.to_bytes() {
                Ok(out) => match first_difference(&out, body) {
                    None => (what, Verdict::Ok),
                    Some(offset) => (what, Verdict::Mismatch { offset }),
                },
                Err(e) => (
                    what,
                    Verdict::NotAccepted {
                        reason: format!("re-emit: {e}"),
                    },
                ),
            }
        }
        Err(e) => (
            "FC frame".into(),
            Verdict::NotAccepted {
                reason: e.to_string(),
            },
        ),
    }
}

fn crc_verdict(body: &[u8], crc: &[u8]) -> Option<Verdict> {
    let received = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = fc_crc(body);
    (received != computed).then(|| Verdict::NotAccepted {
        reason: format!("FC CRC {received:#010x}, computed {computed:#010x}"),
    })
}

/// A bare FC frame (link type 224: header + payload; 225: SOF ordered
/// set, header, payload, CRC, EOF ordered set).
pub fn check_fc(
    number: u64,
    link_type: LinkType,
    data: &[u8],
    truncated: bool,
    tracker: &mut ReplyTracker,
) -> Entry {
    let entry = |what: String, verdict| Entry {
        frame: number,
        protocol: Protocol::Fc,
        what,
        verdict,
    };
    if truncated {
        return entry("FC frame".into(), Verdict::Truncated);
    }
    if link_type == LinkType::FC_2_WITH_FRAME_DELIMS {
        if data.len() < 4 + HEADER_LEN + 8 {
            return entry(
                "FC frame".into(),
                Verdict::NotAccepted {
                    reason: format!(
                        "{} bytes: shorter than delimiters, header and CRC",
                        data.len()
                    ),
                },
            );
        }
        let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let n = data.len();
        let sof = Sof::from_ordered_set(word(&data[..4]));
        let eof = Eof::from_ordered_set(word(&data[n - 4..]));
        let body = &data[4..n - 8];
        if sof.is_none() || eof.is_none() {
            return entry(
                "FC frame".into(),
                Verdict::NotAccepted {
                    reason: "unknown SOF or EOF ordered set".into(),
                },
            );
        }
        if let Some(v) = crc_verdict(body, &data[n - 8..n - 4]) {
            return entry("FC frame".into(), v);
        }
        let (what, v) = round_trip(body, tracker);
        return entry(what, v);
    }
    let (what, v) = round_trip(data, tracker);
    entry(what, v)
}

/// An FCoE frame: `payload` is what follows the EtherType.
pub fn check_fcoe(
    number: u64,
    payload: &[u8],
    truncated: bool,
    tracker: &mut ReplyTracker,
) -> Entry {
    let entry = |what: String, verdict| Entry {
        frame: number,
        protocol: Protocol::Fcoe,
        what,
        verdict,
    };
    if truncated {
        return entry("FCoE frame".into(), Verdict::Truncated);
    }
    let n = payload.len();
    if n < FCOE_HEADER_LEN + HEADER_LEN + FCOE_TRAILER_LEN {
        return entry(
            "FCoE frame".into(),
            Verdict::NotAccepted {
                reason: format!("{n} bytes: shorter than an FCoE frame"),
            },
        );
    }
    let version = payload[0] >> 4;
    let sof = Sof(payload[FCOE_HEADER_LEN - 1]);
    let body = &payload[FCOE_HEADER_LEN..n - FCOE_TRAILER_LEN];
    let crc = &payload[n - FCOE_TRAILER_LEN..n - FCOE_TRAILER_LEN + 4];
    let eof = Eof(payload[n - 4]);
    if version != 0 || !sof.is_valid() || !eof.is_valid() {
        return entry(
            "FCoE frame".into(),
            Verdict::NotAccepted {
                reason: format!(
                    "not a standard FCoE frame (version {version}, SOF {sof:?}, EOF {eof:?})"
                ),
            },
        );
    }
    if let Some(v) = crc_verdict(body, crc) {
        return entry("FCoE frame".into(), v);
    }
    let (what, v) = round_trip(body, tracker);
    if v != Verdict::Ok {
        let v = match v {
            Verdict::Mismatch { offset } => Verdict::Mismatch {
                offset: offset + FCOE_HEADER_LEN,
            },
            other => other,
        };
        return entry(what, v);
    }
    // The encapsulation, re-emitted: zero reserved bits, SOF, the CRC
    // computed over the frame, EOF, zero reserved bytes.
    let mut out = vec![0u8; n];
    out[FCOE_HEADER_LEN - 1] = sof.0;
    out[FCOE_HEADER_LEN..n - FCOE_TRAILER_LEN].copy_from_slice(body);
    out[n - FCOE_TRAILER_LEN..n - 4].copy_from_slice(&fc_crc(body).to_le_bytes());
    out[n - 4] = eof.0;
    match first_difference(&out, payload) {
        None => entry(what, Verdict::Ok),
        Some(offset) => entry(what, Verdict::Mismatch { offset }),
    }
}

/// The FC frames inside a FIP link-service frame (FIP protocol code 2:
/// FLOGI, FDISC, LOGO, ELP descriptors and their replies); `payload` is
/// what follows the EtherType. Empty for other FIP frames.
pub fn check_fip(
    number: u64,
    payload: &[u8],
    truncated: bool,
    tracker: &mut ReplyTracker,
) -> Vec<Entry> {
    let mut out = Vec::new();
    if payload.len() < 10 || u16::from_be_bytes([payload[2], payload[3]]) != 2 {
        return out;
    }
    let declared = usize::from(u16::from_be_bytes([payload[6], payload[7]])) * 4;
    let mut d = payload.get(10..).unwrap_or(&[]);
    d = &d[..declared.min(d.len())];
    while d.len() >= 2 {
        let (ty, words) = (d[0], usize::from(d[1]));
        if words == 0 {
            break;
        }
        let len = words * 4;
        // Descriptor types 7–10 (FLOGI, FDISC, LOGO, ELP) carry an FC frame after 2
        // reserved bytes.
        let carries_fc = matches!(ty, 7..=10);
        if len > d.len() {
            if carries_fc && truncated {
                out.push(Entry {
                    frame: number,
                    protocol: Protocol::Fc,
                    what: "FC frame in FIP".into(),
                    verdict: Verdict::Truncated,
                });
            }
            break;
        }
        if carries_fc && len >= 4 + HEADER_LEN {
            let (what, verdict) = round_trip(&d[4..len], tracker);
            out.push(Entry {
                frame: number,
                protocol: Protocol::Fc,
                what: format!("{what} (in FIP)"),
                verdict,
            });
        }
        d = &d[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use unifab_fc::wire::crc::fc_crc_bytes;

    fn flogi_body() -> Vec<u8> {
        let mut v = vec![
            0x22, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0x01, 0x29, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0,
            0, 0, 0,
        ];
        let mut p = vec![0u8; 116];
        p[0] = 4;
        p[68] = 0x88;
        v.extend_from_slice(&p);
        v
    }

    #[test]
    fn fcoe_round_trip_and_truncation() {
        let body = flogi_body();
        let mut fcoe = vec![0u8; 13];
        fcoe.push(0x2e);
        fcoe.extend_from_slice(&body);
        fcoe.extend_from_slice(&fc_crc_bytes(&body));
        fcoe.extend_from_slice(&[0x42, 0, 0, 0]);
        let mut t = ReplyTracker::new();
        let e = check_fcoe(1, &fcoe, false, &mut t);
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
        assert_eq!(e.what, "ELS FLOGI");
        let e = check_fcoe(2, &fcoe[..60], true, &mut t);
        assert_eq!(e.verdict, Verdict::Truncated);
        // Every cut, marked or not, ends in a verdict, never a panic.
        for n in 0..fcoe.len() {
            let _ = check_fcoe(3, &fcoe[..n], false, &mut t);
        }
        let mut bad = fcoe.clone();
        let n = bad.len();
        bad[n - 6] ^= 1;
        assert!(matches!(
            check_fcoe(4, &bad, false, &mut t).verdict,
            Verdict::NotAccepted { .. }
        ));
        // FC-2 with delimiters.
        let mut d = 0xbcb5_5656u32.to_be_bytes().to_vec();
        d.extend_from_slice(&body);
        d.extend_from_slice(&fc_crc_bytes(&body));
        d.extend_from_slice(&0xbc95_7575u32.to_be_bytes());
        let e = check_fc(5, LinkType::FC_2_WITH_FRAME_DELIMS, &d, false, &mut t);
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
        let e = check_fc(6, LinkType::FC_2, &body, false, &mut t);
        assert_eq!(e.verdict, Verdict::Ok, "{e:?}");
    }
}
