//! `unifab pcap-check`: parse every frame of a protocol unifab implements,
//! re-emit it with the wire layer, and report what does not round-trip.
//!
//! The report is per frame number (Wireshark's numbering) and per protocol;
//! a PDU is reported at the frame that carried its last byte. Each protocol
//! has a checker behind [`Protocol`]; iSCSI is implemented here, and FC,
//! FCoE, FIP and FCIP add theirs by handling their [`LinkPayload`]s in
//! [`check_bytes`] and pushing [`Entry`]s with their own [`Protocol`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use thiserror::Error;
use unifab_iscsi::text::{TextParams, TextWriter};
use unifab_iscsi::wire::{Ahs, BHS_LEN, Bhs, Pdu, digest, encode_header};

use crate::iscsi::{Negotiated, SplitEvent, SplitPdu, Splitter};
use crate::net::{ETHERTYPE_FCOE, ETHERTYPE_FIP, LinkPayload, link_payload, tcp_segment};
use crate::pcap::{CaptureError, read_frames};
use crate::tcp::{Flow, FlowKey};

/// A protocol the checker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Protocol {
    /// iSCSI over TCP.
    Iscsi,
    /// Bare Fibre Channel (link types 224/225).
    Fc,
    /// FCoE (EtherType 0x8906).
    Fcoe,
    /// FIP (EtherType 0x8914).
    Fip,
    /// FCIP over TCP.
    Fcip,
}

/// The verdict for one frame (or PDU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Parsed and re-emitted byte for byte.
    Ok,
    /// Parsed, but the re-emitted bytes differ from `offset` on.
    Mismatch {
        /// First differing byte, from the start of the PDU/frame.
        offset: usize,
    },
    /// Cut short at capture or by lost segments: cannot be checked.
    Truncated,
    /// Not accepted by the parser.
    NotAccepted {
        /// Why.
        reason: String,
    },
}

/// One checked unit (a PDU or a frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Frame number.
    pub frame: u64,
    /// Protocol.
    pub protocol: Protocol,
    /// What it was (e.g. "Login Request").
    pub what: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// Missing bytes in a TCP stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamGap {
    /// Frame that resumes after the gap.
    pub frame: u64,
    /// Protocol of the stream.
    pub protocol: Protocol,
    /// Direction, `src -> dst`.
    pub stream: String,
    /// Bytes missing.
    pub missing: u64,
}

/// What a capture check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Frames in the file.
    pub frames: u64,
    /// Every checked unit, by frame.
    pub entries: Vec<Entry>,
    /// Gaps in reassembled streams.
    pub gaps: Vec<StreamGap>,
    /// Bytes skipped while resynchronising after gaps, per protocol.
    pub resync_bytes: BTreeMap<Protocol, u64>,
    /// Frames of a known protocol that no checker handles yet.
    pub unchecked: BTreeMap<Protocol, u64>,
}

impl Report {
    /// Entries of one protocol.
    pub fn of(&self, p: Protocol) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(move |e| e.protocol == p)
    }

    /// Count of `Ok` entries for a protocol.
    pub fn ok(&self, p: Protocol) -> usize {
        self.of(p).filter(|e| e.verdict == Verdict::Ok).count()
    }

    /// Entries of a protocol that did not round-trip (mismatch or not accepted).
    pub fn failures(&self, p: Protocol) -> Vec<&Entry> {
        self.of(p)
            .filter(|e| {
                matches!(
                    e.verdict,
                    Verdict::Mismatch { .. } | Verdict::NotAccepted { .. }
                )
            })
            .collect()
    }

    /// Count of truncated entries for a protocol.
    pub fn truncated(&self, p: Protocol) -> usize {
        self.of(p)
            .filter(|e| e.verdict == Verdict::Truncated)
            .count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.entries {
            match &e.verdict {
                Verdict::Ok => {}
                Verdict::Mismatch { offset } => writeln!(
                    f,
                    "frame {}: {:?} {}: mismatch at byte {offset}",
                    e.frame, e.protocol, e.what
                )?,
                Verdict::Truncated => writeln!(
                    f,
                    "frame {}: {:?} {}: truncated",
                    e.frame, e.protocol, e.what
                )?,
                Verdict::NotAccepted { reason } => writeln!(
                    f,
                    "frame {}: {:?} {}: not accepted: {reason}",
                    e.frame, e.protocol, e.what
                )?,
            }
        }
        for g in &self.gaps {
            writeln!(
                f,
                "frame {}: {:?} gap of {} bytes in {}",
                g.frame, g.protocol, g.missing, g.stream
            )?;
        }
        let mut protos: Vec<Protocol> = self.entries.iter().map(|e| e.protocol).collect();
        protos.sort();
        protos.dedup();
        for p in protos {
            writeln!(
                f,
                "{p:?}: {} ok, {} failed, {} truncated",
                self.ok(p),
                self.failures(p).len(),
                self.truncated(p)
            )?;
        }
        for (p, n) in &self.unchecked {
            writeln!(f, "{p:?}: {n} frames not checked (no checker yet)")?;
        }
        write!(f, "{} frames", self.frames)
    }
}

/// Errors of the checker.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a readable capture.
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// Options of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// TCP ports carrying iSCSI.
    pub iscsi_ports: Vec<u16>,
    /// TCP ports carrying FCIP.
    pub fcip_ports: Vec<u16>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            iscsi_ports: vec![3260],
            fcip_ports: vec![3225],
        }
    }
}

/// Check a capture file.
pub fn pcap_check(path: impl AsRef<Path>) -> Result<Report, CheckError> {
    let path = path.as_ref();
    let file = std::fs::read(path).map_err(|source| CheckError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    check_bytes(&file, &CheckOptions::default())
}

/// Check a capture held in memory.
pub fn check_bytes(file: &[u8], opts: &CheckOptions) -> Result<Report, CheckError> {
    let frames = read_frames(file)?;
    let mut report = Report {
        frames: frames.len() as u64,
        ..Report::default()
    };
    let mut iscsi_flows: BTreeMap<FlowKey, Flow<'_>> = BTreeMap::new();
    let mut fc_tracker = unifab_fc::wire::ReplyTracker::new();
    let mut fcip_flows: BTreeMap<FlowKey, Flow<'_>> = BTreeMap::new();
    for fr in &frames {
        match link_payload(fr) {
            LinkPayload::Ip(ip) => {
                let Some(seg) = tcp_segment(ip) else { continue };
                if opts.iscsi_ports.contains(&seg.src.port())
                    || opts.iscsi_ports.contains(&seg.dst.port())
                {
                    iscsi_flows
                        .entry(FlowKey {
                            src: seg.src,
                            dst: seg.dst,
                        })
                        .or_default()
                        .push(fr.number, &seg);
                } else if opts.fcip_ports.contains(&seg.src.port())
                    || opts.fcip_ports.contains(&seg.dst.port())
                {
                    fcip_flows
                        .entry(FlowKey {
                            src: seg.src,
                            dst: seg.dst,
                        })
                        .or_default()
                        .push(fr.number, &seg);
                }
            }
            LinkPayload::Ether {
                ethertype: ETHERTYPE_FCOE,
                payload,
            } => report.entries.push(crate::fc::check_fcoe(
                fr.number,
                payload,
                fr.is_truncated(),
                &mut fc_tracker,
            )),
            LinkPayload::Ether {
                ethertype: ETHERTYPE_FIP,
                payload,
            } => {
                // The FIP frame itself, then the FC frames it carries.
                report
                    .entries
                    .push(crate::fip::check(fr.number, payload, fr.is_truncated()));
                report.entries.extend(crate::fc::check_fip(
                    fr.number,
                    payload,
                    fr.is_truncated(),
                    &mut fc_tracker,
                ));
            }
            LinkPayload::Fc(data) => report.entries.push(crate::fc::check_fc(
                fr.number,
                fr.link_type,
                data,
                fr.is_truncated(),
                &mut fc_tracker,
            )),
            _ => {}
        }
    }
    check_iscsi(&iscsi_flows, opts, &mut report);
    crate::fcip::check_flows(&fcip_flows, &mut report);
    report.entries.sort_by_key(|e| e.frame);
    Ok(report)
}

/// Every whole FCIP encapsulated frame of a capture (TCP streams on
/// `opts.fcip_ports`, reassembled) with the capture frame that carried
/// its last byte and its direction, in capture order (for fuzz seeds).
pub fn fcip_frames(
    file: &[u8],
    opts: &CheckOptions,
) -> Result<Vec<(u64, FlowKey, Vec<u8>)>, CheckError> {
    let frames = read_frames(file)?;
    let mut flows: BTreeMap<FlowKey, Flow<'_>> = BTreeMap::new();
    for fr in &frames {
        if let LinkPayload::Ip(ip) = link_payload(fr)
            && let Some(seg) = tcp_segment(ip)
            && (opts.fcip_ports.contains(&seg.src.port())
                || opts.fcip_ports.contains(&seg.dst.port()))
        {
            flows
                .entry(FlowKey {
                    src: seg.src,
                    dst: seg.dst,
                })
                .or_default()
                .push(fr.number, &seg);
        }
    }
    Ok(crate::fcip::frames(&flows))
}

/// Every whole iSCSI PDU of a capture with its direction, in stream order
/// per direction (for fuzz seeds and transcript tests).
pub fn iscsi_pdus(
    file: &[u8],
    opts: &CheckOptions,
) -> Result<Vec<(FlowKey, SplitPdu)>, CheckError> {
    let frames = read_frames(file)?;
    let mut flows: BTreeMap<FlowKey, Flow<'_>> = BTreeMap::new();
    for fr in &frames {
        if let LinkPayload::Ip(ip) = link_payload(fr)
            && let Some(seg) = tcp_segment(ip)
            && (opts.iscsi_ports.contains(&seg.src.port())
                || opts.iscsi_ports.contains(&seg.dst.port()))
        {
            flows
                .entry(FlowKey {
                    src: seg.src,
                    dst: seg.dst,
                })
                .or_default()
                .push(fr.number, &seg);
        }
    }
    let mut out = Vec::new();
    let mut negotiated: BTreeMap<(std::net::SocketAddr, std::net::SocketAddr), Negotiated> =
        BTreeMap::new();
    // Target side first, so the initiator side knows the digests.
    let mut keys: Vec<&FlowKey> = flows.keys().collect();
    keys.sort_by_key(|k| !opts.iscsi_ports.contains(&k.src.port()));
    for key in keys {
        let Some(flow) = flows.get(key) else { continue };
        let to_target = opts.iscsi_ports.contains(&key.dst.port());
        let conn = if to_target {
            (key.src, key.dst)
        } else {
            (key.dst, key.src)
        };
        let neg = negotiated.get(&conn).copied().unwrap_or_default();
        let (runs, gaps) = flow.reassemble();
        let mut sp = Splitter::new(to_target, neg);
        for ev in sp.split(&runs, &gaps) {
            if let SplitEvent::Pdu(p) = ev {
                out.push((*key, p));
            }
        }
        if !to_target {
            negotiated.insert(conn, sp.negotiated());
        }
    }
    Ok(out)
}

fn check_iscsi(flows: &BTreeMap<FlowKey, Flow<'_>>, opts: &CheckOptions, report: &mut Report) {
    // Target → initiator first: its Login Responses say which digests apply.
    let mut done = Vec::new();
    for (key, flow) in flows {
        if !opts.iscsi_ports.contains(&key.src.port()) || done.contains(key) {
            continue;
        }
        let negotiated = split_flow(key, flow, false, Negotiated::default(), report);
        done.push(*key);
        let back = FlowKey {
            src: key.dst,
            dst: key.src,
        };
        if let Some(f) = flows.get(&back) {
            split_flow(&back, f, true, negotiated, report);
            done.push(back);
        }
    }
    for (key, flow) in flows {
        if !done.contains(key) {
            let to_target = opts.iscsi_ports.contains(&key.dst.port());
            split_flow(key, flow, to_target, Negotiated::default(), report);
        }
    }
}

fn split_flow(
    key: &FlowKey,
    flow: &Flow<'_>,
    to_target: bool,
    neg: Negotiated,
    report: &mut Report,
) -> Negotiated {
    let (runs, gaps) = flow.reassemble();
    let mut splitter = Splitter::new(to_target, neg);
    let stream = format!("{} -> {}", key.src, key.dst);
    let mut continuing = false;
    for ev in splitter.split(&runs, &gaps) {
        match ev {
            SplitEvent::Pdu(p) => {
                let (what, verdict) = check_pdu(&p, &mut continuing);
                report.entries.push(Entry {
                    frame: p.frame,
                    protocol: Protocol::Iscsi,
                    what,
                    verdict,
                });
            }
            SplitEvent::Truncated { frame, .. } => report.entries.push(Entry {
                frame,
                protocol: Protocol::Iscsi,
                what: "PDU".into(),
                verdict: Verdict::Truncated,
            }),
            SplitEvent::Gap(g) => report.gaps.push(StreamGap {
                frame: g.frame,
                protocol: Protocol::Iscsi,
                stream: stream.clone(),
                missing: g.len,
            }),
            SplitEvent::Resync { skipped, .. } => {
                *report.resync_bytes.entry(Protocol::Iscsi).or_default() += skipped
            }
        }
    }
    splitter.negotiated()
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// Parse one PDU, re-emit it and compare. `continuing` tracks a Login/Text
/// sequence split with the C bit (its pieces are checked as text only when
/// complete).
fn check_pdu(p: &SplitPdu, continuing: &mut bool) -> (String, Verdict) {
    let b = &p.bytes;
    let not = |r: String| Verdict::NotAccepted { reason: r };
    let Some(hdr) = b.get(..BHS_LEN) else {
        return ("PDU".into(), Verdict::Truncated);
    };
    let bhs = match Bhs::new_checked(hdr) {
        Ok(v) => v,
        Err(e) => return ("PDU".into(), not(e.to_string())),
    };
    let what = bhs.opcode().name().unwrap_or("unknown opcode").to_string();
    let pdu = match Pdu::parse(&bhs) {
        Ok(v) => v,
        Err(e) => return (what, not(e.to_string())),
    };
    let ahs_len = bhs.ahs_len();
    let dsl = bhs.data_segment_length() as usize;
    let ahs_bytes = Bytes::copy_from_slice(b.get(BHS_LEN..BHS_LEN + ahs_len).unwrap_or_default());
    let ahs = match Ahs::parse_all(&ahs_bytes) {
        Ok(a) => a,
        Err(e) => return (what, not(e.to_string())),
    };
    let mut ahs_out = Vec::new();
    for a in &ahs {
        a.emit(&mut ahs_out);
    }
    let mut at = BHS_LEN + ahs_len;
    if p.digests.header {
        let (Some(h), Some(d)) = (b.get(..at), b.get(at..at + 4)) else {
            return (what, Verdict::Truncated);
        };
        if digest::from_wire([d[0], d[1], d[2], d[3]]) != digest::crc32c(h) {
            return (what, not("header digest mismatch".into()));
        }
        at += 4;
    }
    let Some(data) = b.get(at..at + dsl) else {
        return (what, Verdict::Truncated);
    };
    if p.digests.data && dsl > 0 {
        let padded = dsl.next_multiple_of(4);
        let (Some(seg), Some(d)) = (b.get(at..at + padded), b.get(at + padded..at + padded + 4))
        else {
            return (what, Verdict::Truncated);
        };
        if digest::from_wire([d[0], d[1], d[2], d[3]]) != digest::crc32c(seg) {
            return (what, not("data digest mismatch".into()));
        }
    }
    // Login and Text data segments: parse and re-emit the text when the
    // sequence is complete.
    let (is_text, cont) = match pdu {
        Pdu::LoginRequest(r) => (true, r.continue_flag),
        Pdu::LoginResponse(r) => (true, r.continue_flag),
        Pdu::TextRequest(r) => (true, r.continue_flag),
        Pdu::TextResponse(r) => (true, r.continue_flag),
        _ => (false, false),
    };
    if is_text {
        let whole = !*continuing && !cont;
        *continuing = cont;
        if whole {
            match TextParams::parse(data) {
                Ok(t) => {
                    let mut w = TextWriter::with_limit(usize::MAX);
                    if let Err(e) = t.emit(&mut w) {
                        return (what, not(format!("text re-emit: {e}")));
                    }
                    if let Some(off) = first_diff(data, w.as_bytes()) {
                        return (what, Verdict::Mismatch { offset: at + off });
                    }
                }
                Err(e) => return (what, not(format!("text: {e}"))),
            }
        }
    }
    // Re-emit: header block from the parsed repr, then the data segment.
    // Padding bytes are opaque (RFC 7143 says SHOULD be zero; IET sends
    // garbage): they are carried over like payload, and the data digest is
    // recomputed over data + padding.
    let hdr = match encode_header(&pdu, &ahs_out, dsl as u32, p.digests.header) {
        Ok(h) => h,
        Err(e) => return (what, not(e.to_string())),
    };
    let mut out = hdr.to_vec();
    if dsl > 0 {
        let padded = dsl.next_multiple_of(4);
        let Some(seg) = b.get(at..at + padded) else {
            return (what, Verdict::Truncated);
        };
        out.extend_from_slice(data);
        out.extend_from_slice(seg.get(dsl..).unwrap_or_default());
        if p.digests.data {
            out.extend_from_slice(&digest::to_wire(digest::crc32c(seg)));
        }
    }
    match first_diff(b, &out) {
        None => (what, Verdict::Ok),
        Some(offset) => (what, Verdict::Mismatch { offset }),
    }
}
