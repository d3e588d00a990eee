//! Finding iSCSI PDU boundaries in a reassembled TCP stream.
//!
//! Digests: Login PDUs never carry them. For the PDUs after login, the
//! splitter uses what the login in the capture negotiated (the target's
//! HeaderDigest/DataDigest answers) when it saw one, and otherwise decides
//! by checking the CRC32C of the first PDU (a false match has a 2^-32
//! chance). After a gap it keeps the boundary when the PDU header before
//! the gap told where the next PDU starts; otherwise it resynchronises by
//! scanning for a plausible header (valid opcode for the direction, sane
//! lengths, the header digest when in use, and a plausible header right
//! after it).

use unifab_iscsi::text::TextParams;
use unifab_iscsi::wire::{BHS_LEN, Digests, digest};

use super::tcp::{Gap, Run};

/// A PDU found in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPdu {
    /// Frame in which the PDU's last byte arrived.
    pub frame: u64,
    /// Stream offset of its first byte.
    pub offset: u64,
    /// The whole PDU: BHS, AHS, header digest, data, padding, data digest.
    pub bytes: Vec<u8>,
    /// The digests it was framed with.
    pub digests: Digests,
}

/// Something other than a whole PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitEvent {
    /// A PDU.
    Pdu(SplitPdu),
    /// A PDU that runs into missing bytes (frame of its first byte).
    Truncated {
        /// Frame.
        frame: u64,
        /// Stream offset.
        offset: u64,
    },
    /// Bytes are missing from the stream.
    Gap(Gap),
    /// Bytes skipped to find the next PDU header.
    Resync {
        /// Frame of the first skipped byte.
        frame: u64,
        /// Bytes skipped.
        skipped: u64,
    },
}

/// Digest state learnt from a login, shared by both directions of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// A login was seen in the capture (digest keys default to None).
    pub login_seen: bool,
    /// HeaderDigest=CRC32C answered.
    pub header: bool,
    /// DataDigest=CRC32C answered.
    pub data: bool,
}

fn is_login(op: u8) -> bool {
    matches!(op & 0x3f, 0x03 | 0x23)
}

/// Opcodes valid from the initiator (`to_target`) or from the target.
pub fn opcode_valid(op: u8, to_target: bool) -> bool {
    let op = op & 0x3f;
    if to_target {
        matches!(op, 0x00..=0x06 | 0x10 | 0x1c..=0x1e)
    } else {
        matches!(op, 0x20..=0x26 | 0x31 | 0x32 | 0x3c..=0x3f)
    }
}

fn be24(b: &[u8]) -> usize {
    match b {
        [a, b, c, ..] => (usize::from(*a) << 16) | (usize::from(*b) << 8) | usize::from(*c),
        _ => 0,
    }
}

/// Length of the PDU whose header starts `h`, given digests. `None` if
/// fewer than 48 bytes.
fn pdu_len(h: &[u8], d: Digests) -> Option<usize> {
    let ahs = usize::from(*h.get(4)?) * 4;
    let dsl = be24(h.get(5..8)?);
    let mut len = BHS_LEN + ahs + if d.header { 4 } else { 0 };
    if dsl > 0 {
        len += dsl.next_multiple_of(4) + if d.data { 4 } else { 0 };
    }
    Some(len)
}

/// Splits one direction of a connection.
#[derive(Debug)]
pub struct Splitter {
    to_target: bool,
    header: Option<bool>,
    data: Option<bool>,
    /// Text of login PDUs seen (for learning the digests).
    login_text: Vec<u8>,
    negotiated: Negotiated,
}

impl Splitter {
    /// A splitter for one direction; `negotiated` carries what the other
    /// direction's login text said, if already known.
    pub fn new(to_target: bool, negotiated: Negotiated) -> Self {
        let (header, data) = if negotiated.login_seen {
            (Some(negotiated.header), Some(negotiated.data))
        } else {
            (None, None)
        };
        Splitter {
            to_target,
            header,
            data,
            login_text: Vec::new(),
            negotiated,
        }
    }

    /// What the login in this direction negotiated (meaningful for the
    /// target → initiator direction, whose Login Responses carry the answers).
    pub fn negotiated(&self) -> Negotiated {
        self.negotiated
    }

    fn digests_for(&self, h: &[u8]) -> Digests {
        let op = h.first().copied().unwrap_or(0);
        if is_login(op) {
            Digests::default()
        } else {
            Digests {
                header: self.header.unwrap_or(false),
                data: self.data.unwrap_or(false),
            }
        }
    }

    /// Decide unknown digest settings from the PDU at `b` (non-login).
    fn learn(&mut self, b: &[u8]) {
        let ahs = usize::from(b.get(4).copied().unwrap_or(0)) * 4;
        let hend = BHS_LEN + ahs;
        if self.header.is_none()
            && let (Some(hdr), Some(dg)) = (b.get(..hend), b.get(hend..hend + 4))
        {
            let got = digest::from_wire([dg[0], dg[1], dg[2], dg[3]]);
            self.header = Some(got == digest::crc32c(hdr));
        }
        let dsl = be24(b.get(5..8).unwrap_or_default());
        if self.data.is_none() && dsl > 0 {
            let start = hend + if self.header == Some(true) { 4 } else { 0 };
            let padded = dsl.next_multiple_of(4);
            if let (Some(seg), Some(dg)) = (
                b.get(start..start + padded),
                b.get(start + padded..start + padded + 4),
            ) {
                let got = digest::from_wire([dg[0], dg[1], dg[2], dg[3]]);
                self.data = Some(got == digest::crc32c(seg));
            }
        }
    }

    fn plausible(&self, b: &[u8], depth: u8) -> bool {
        let (Some(&op), Some(&ahs)) = (b.first(), b.get(4)) else {
            return false;
        };
        if op & 0x80 != 0 || !opcode_valid(op, self.to_target) || ahs > 64 {
            return false;
        }
        let d = self.digests_for(b);
        let Some(len) = pdu_len(b, d) else {
            return false;
        };
        if d.header {
            let hend = BHS_LEN + usize::from(ahs) * 4;
            match (b.get(..hend), b.get(hend..hend + 4)) {
                (Some(h), Some(dg)) => {
                    if digest::from_wire([dg[0], dg[1], dg[2], dg[3]]) != digest::crc32c(h) {
                        return false;
                    }
                }
                _ => return false,
            }
        }
        if depth == 0 {
            return true;
        }
        match b.get(len..) {
            Some(rest) if rest.len() >= BHS_LEN => self.plausible(rest, depth - 1),
            _ => true,
        }
    }

    fn note_login(&mut self, b: &[u8]) {
        let op = b.first().copied().unwrap_or(0) & 0x3f;
        if op != 0x23 {
            return;
        }
        let dsl = be24(b.get(5..8).unwrap_or_default());
        let cont = b.get(1).is_some_and(|f| f & 0x40 != 0);
        if let Some(d) = b.get(BHS_LEN..BHS_LEN + dsl) {
            self.login_text.extend_from_slice(d);
        }
        if !cont {
            if let Ok(t) = TextParams::parse(&self.login_text) {
                self.negotiated.login_seen = true;
                if let Some(v) = t.get("HeaderDigest") {
                    self.negotiated.header = v == "CRC32C";
                }
                if let Some(v) = t.get("DataDigest") {
                    self.negotiated.data = v == "CRC32C";
                }
            }
            self.login_text.clear();
        }
        // Digests start after the final Login Response.
        let transit = b.get(1).is_some_and(|f| f & 0x80 != 0 && f & 0x03 == 0x03);
        let ok = b.get(36).copied() == Some(0);
        if transit && ok && !self.to_target {
            self.header = Some(self.negotiated.header);
            self.data = Some(self.negotiated.data);
        }
    }

    /// Split the runs (in order) of this direction, with the gaps between them.
    pub fn split(&mut self, runs: &[Run], gaps: &[Gap]) -> Vec<SplitEvent> {
        let mut out = Vec::new();
        // The absolute offset of the next PDU boundary, when known.
        let mut next: Option<u64> = None;
        let mut align: Option<u64> = None;
        for (i, run) in runs.iter().enumerate() {
            if i > 0
                && let Some(g) = gaps.iter().find(|g| g.offset + g.len == run.start)
            {
                out.push(SplitEvent::Gap(*g));
            }
            let mut pos = run.start;
            match next {
                Some(n) if n >= run.start && n < run.end() => pos = n,
                Some(n) if n >= run.end() => {
                    next = Some(n);
                    continue;
                }
                None if run.at_stream_start => {}
                _ => {
                    // Resynchronise.
                    match self.resync(run, run.start, align) {
                        Some(p) => {
                            if p > run.start {
                                out.push(SplitEvent::Resync {
                                    frame: run.frame_at(run.start),
                                    skipped: p - run.start,
                                });
                            }
                            pos = p;
                        }
                        None => {
                            out.push(SplitEvent::Resync {
                                frame: run.frame_at(run.start),
                                skipped: run.data.len() as u64,
                            });
                            next = None;
                            continue;
                        }
                    }
                }
            }
            loop {
                let rel = usize::try_from(pos - run.start).unwrap_or(usize::MAX);
                let Some(rest) = run.data.get(rel..) else {
                    break;
                };
                if rest.is_empty() {
                    next = Some(pos);
                    break;
                }
                if rest.len() < BHS_LEN {
                    // The header runs into a gap (or the capture ends).
                    out.push(SplitEvent::Truncated {
                        frame: run.frame_at(pos),
                        offset: pos,
                    });
                    next = None;
                    break;
                }
                if !self.plausible(rest, 0) {
                    // Lost framing: find the next header in this run.
                    match self.resync(run, pos + 4, Some(pos % 4)) {
                        Some(p) => {
                            out.push(SplitEvent::Resync {
                                frame: run.frame_at(pos),
                                skipped: p - pos,
                            });
                            pos = p;
                            continue;
                        }
                        None => {
                            out.push(SplitEvent::Resync {
                                frame: run.frame_at(pos),
                                skipped: run.end() - pos,
                            });
                            next = None;
                            break;
                        }
                    }
                }
                if !is_login(rest[0]) {
                    self.learn(rest);
                }
                let d = self.digests_for(rest);
                let Some(len) = pdu_len(rest, d) else { break };
                align = Some(pos % 4);
                if rest.len() < len {
                    out.push(SplitEvent::Truncated {
                        frame: run.frame_at(pos),
                        offset: pos,
                    });
                    next = Some(pos + len as u64);
                    break;
                }
                let bytes = rest[..len].to_vec();
                if is_login(bytes[0]) {
                    self.note_login(&bytes);
                }
                let end = pos + len as u64;
                out.push(SplitEvent::Pdu(SplitPdu {
                    frame: run.frame_at(end - 1),
                    offset: pos,
                    bytes,
                    digests: d,
                }));
                pos = end;
            }
        }
        out
    }

    fn resync(&self, run: &Run, from: u64, align: Option<u64>) -> Option<u64> {
        let step = if align.is_some() { 4 } else { 1 };
        let mut p = from;
        if let Some(a) = align {
            while p % 4 != a {
                p += 1;
            }
        }
        while p + BHS_LEN as u64 <= run.end() {
            let rel = usize::try_from(p - run.start).ok()?;
            if self.plausible(run.data.get(rel..)?, 1) {
                return Some(p);
            }
            p += step;
        }
        None
    }
}
