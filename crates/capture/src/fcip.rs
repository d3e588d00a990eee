//! FCIP in captures: each direction of a TCP connection on an FCIP port
//! is reassembled, cut into encapsulated frames (several may share a
//! segment, one may span several), and every frame is checked: the
//! encapsulation header with RFC 3821's receive checks and re-emitted,
//! the special frame parsed and re-emitted, the SOF/EOF words and FC CRC,
//! the FC frame by the FC checker, and SW_ILS payloads parsed and
//! re-emitted. A frame is reported at the capture frame that carried its
//! last byte. After a gap, or a frame that does not pass, the stream is
//! searched for the next frame that does (RFC 3821 Appendix D).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use unifab_fc::wire::ReplyTracker;
use unifab_fc::wire::header::FcType;
use unifab_fcip::wire::encap::{ENCAP_LEN, EncapHeader, EncapRepr};
use unifab_fcip::wire::frame::FcipFrame;
use unifab_fcip::wire::fsf::{SpecialFrame, SpecialFrameRepr};
use unifab_fcip::wire::sw_ils::{SwIlsCode, SwIlsRepr};

use super::fc::{first_difference, round_trip};
use super::tcp::{Flow, FlowKey, Run};
use crate::check::{Entry, Protocol, Report, StreamGap, Verdict};

fn frame_at(run: &Run, end: u64) -> u64 {
    run.frames
        .iter()
        .find(|(e, _)| *e >= end)
        .or(run.frames.last())
        .map_or(0, |(_, f)| *f)
}

/// Whether an encapsulation header starts at `b` (enough of it to tell).
fn looks_like_header(b: &[u8]) -> bool {
    b.len() >= 16 && EncapHeader::new_checked(b).is_ok_and(|h| h.check().is_ok())
}

/// Checks every FCIP stream of a capture. The frames of both directions
/// are checked in capture order, so an SW_ACC is decoded against the
/// request it answers.
pub fn check_flows(flows: &BTreeMap<FlowKey, Flow<'_>>, report: &mut Report) {
    let units = split_flows(flows, report);
    let mut tracker = ReplyTracker::new();
    let mut requests: HashMap<(FlowKey, u16), SwIlsCode> = HashMap::new();
    for (frame, key, bytes) in units {
        let reverse = FlowKey {
            src: key.dst,
            dst: key.src,
        };
        let (what, verdict) = check_one(&bytes, &mut tracker, &mut requests, key, reverse);
        report.entries.push(Entry {
            frame,
            protocol: Protocol::Fcip,
            what,
            verdict,
        });
    }
}

/// Every whole encapsulated frame of the FCIP streams, with the capture
/// frame that carried its last byte and its direction, in capture order
/// (for fuzz seeds). Gaps, truncated frames and bytes skipped to find a
/// header are left out.
pub fn frames(flows: &BTreeMap<FlowKey, Flow<'_>>) -> Vec<(u64, FlowKey, Vec<u8>)> {
    split_flows(flows, &mut Report::default())
}

/// Reassembles each stream and cuts it into encapsulated frames (sorted
/// by capture frame); gaps, truncation and resync go into `report`.
fn split_flows(
    flows: &BTreeMap<FlowKey, Flow<'_>>,
    report: &mut Report,
) -> Vec<(u64, FlowKey, Vec<u8>)> {
    let mut units: Vec<(u64, FlowKey, Vec<u8>)> = Vec::new();
    for (key, flow) in flows {
        let (runs, gaps) = flow.reassemble();
        for g in gaps {
            report.gaps.push(StreamGap {
                frame: g.frame,
                protocol: Protocol::Fcip,
                stream: format!("{} -> {}", key.src, key.dst),
                missing: g.len,
            });
        }
        for run in &runs {
            let d = &run.data[..];
            let mut at = 0usize;
            let mut skipped = 0u64;
            while at + ENCAP_LEN <= d.len() {
                let h = EncapHeader::new_unchecked(&d[at..]);
                if !looks_like_header(&d[at..]) {
                    at += 1;
                    skipped += 1;
                    continue;
                }
                let n = usize::from(h.frame_len()) * 4;
                if at + n > d.len() {
                    report.entries.push(Entry {
                        frame: frame_at(run, run.start + d.len() as u64),
                        protocol: Protocol::Fcip,
                        what: "FCIP frame".into(),
                        verdict: Verdict::Truncated,
                    });
                    break;
                }
                let frame = frame_at(run, run.start + (at + n) as u64);
                units.push((frame, *key, d[at..at + n].to_vec()));
                at += n;
            }
            if skipped > 0 {
                *report.resync_bytes.entry(Protocol::Fcip).or_default() += skipped;
            }
        }
    }
    units.sort_by_key(|u| u.0);
    units
}

fn not_accepted(what: &str, reason: impl std::fmt::Display) -> (String, Verdict) {
    (
        what.to_string(),
        Verdict::NotAccepted {
            reason: reason.to_string(),
        },
    )
}

/// One encapsulated frame (exactly Frame Length words).
pub fn check_one(
    bytes: &[u8],
    tracker: &mut ReplyTracker,
    requests: &mut HashMap<(FlowKey, u16), SwIlsCode>,
    key: FlowKey,
    reverse: FlowKey,
) -> (String, Verdict) {
    let h = EncapHeader::new_unchecked(bytes);
    if h.pflags().special() {
        return match SpecialFrame::new_checked(bytes) {
            Ok(v) => {
                let r = SpecialFrameRepr::parse(&v);
                let out = r.to_bytes();
                match first_difference(&out, bytes) {
                    None => ("FCIP special frame".into(), Verdict::Ok),
                    Some(offset) => ("FCIP special frame".into(), Verdict::Mismatch { offset }),
                }
            }
            Err(e) => not_accepted("FCIP special frame", e),
        };
    }
    let v = match FcipFrame::new_checked(bytes) {
        Ok(v) => v,
        Err(e) => return not_accepted("FCIP frame", e),
    };
    if let Err(e) = v.check(true) {
        return not_accepted("FCIP frame", e);
    }
    let encap = match EncapRepr::parse(&v.encap()) {
        Ok(e) => e,
        Err(e) => return not_accepted("FCIP frame", e),
    };
    if let Some(offset) = first_difference(&encap.to_bytes(), &bytes[..ENCAP_LEN]) {
        return (
            "FCIP encapsulation header".into(),
            Verdict::Mismatch { offset },
        );
    }
    let body = v.fc_bytes();
    let (what, verdict) = round_trip(body, tracker);
    if verdict != Verdict::Ok {
        let verdict = match verdict {
            Verdict::Mismatch { offset } => Verdict::Mismatch {
                offset: offset + ENCAP_LEN + 4,
            },
            o => o,
        };
        return (format!("FCIP {what}"), verdict);
    }
    let fh = v.fc_header();
    if fh.fc_type() == FcType::SW_ILS {
        let payload = Bytes::copy_from_slice(&body[24..]);
        let ox = fh.ox_id().0;
        let is_reply = fh.r_ctl().0 == 0x03;
        let answering = if is_reply {
            requests.remove(&(reverse, ox))
        } else {
            None
        };
        let r = match SwIlsRepr::parse(&payload, answering) {
            Ok(r) => r,
            Err(e) => {
                let code = payload.first().copied().unwrap_or(0);
                let name = SwIlsCode(code).name().unwrap_or("SW_ILS");
                return not_accepted(&format!("FCIP SW_ILS {name}"), e);
            }
        };
        if !is_reply {
            requests.insert((key, ox), r.code());
        }
        let name = match (&r, answering) {
            (SwIlsRepr::Acc(_), Some(c)) => format!("SW_ACC ({})", c.name().unwrap_or("?")),
            _ => r.code().name().unwrap_or("SW_ILS").to_string(),
        };
        let out = r.to_bytes();
        return match first_difference(&out, &payload) {
            None => (format!("FCIP SW_ILS {name}"), Verdict::Ok),
            Some(o) => (
                format!("FCIP SW_ILS {name}"),
                Verdict::Mismatch {
                    offset: o + ENCAP_LEN + 4 + 24,
                },
            ),
        };
    }
    (format!("FCIP {what}"), Verdict::Ok)
}
