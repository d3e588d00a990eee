//! Read-ahead for READ(6) streams across the tunnel (tape pipelining).
//!
//! A host restoring from tape repeats one READ(6): variable mode, the same
//! transfer length, one at a time. Across a WAN each costs a round trip.
//! With read-ahead the side near the drive keeps reading on the host's
//! behalf and sends the results ahead; the side near the host answers the
//! host's next identical READ(6) from them.
//!
//! - Near the host ([`AheadHost`]): a variable-mode READ(6) on a tape
//!   nexus with nothing pipelined crosses marked [`RECORD_STREAM`]: it
//!   *starts a stream*. Each result the far side reads ahead arrives
//!   marked too: its FCP_CMND (the *announcement*, before the drive has
//!   answered), its FCP_DATA, its FCP_RSP. A READ(6) with the same LUN,
//!   CDB and length is a *hit*: answered here, data and status exactly as
//!   the drive gave them, and sent on marked [`RECORD_HIT`] (never to the
//!   drive) so the far side reads one more. A hit whose result is
//!   announced but not yet complete waits for it. Any other command, a
//!   READ(6) that differs included, *discards* the stream: what was read
//!   ahead is dropped, the command crosses as usual, and read-ahead
//!   frames still crossing are dropped until that command's exchange
//!   ends.
//! - Near the drive ([`AheadTarget`]): when the drive answers a
//!   stream-starting READ(6) with GOOD, the far side sends it the same
//!   READ(6) again as the host (its N_Port ID, the nexus's LUN; an OX_ID
//!   from `SPEC_OX`), one at a time, while fewer than `WINDOW_CMDS`
//!   results (and `WINDOW_BYTES`) are unconsumed. A result other than
//!   GOOD (a filemark, end-of-data, an ILI, an error) is sent on and ends
//!   the reading. A command that is not a hit waits here until the read
//!   at the drive ends; then the drive is spaced back over the blocks the
//!   host never consumed (SPACE(6) blocks, negative), and only then does
//!   the command go to the drive: the host finds the medium where its own
//!   commands left it.
//!
//! Spacing back over a filemark the read-ahead crossed is SPACE(6) blocks
//! −1: SSC-3 stops a reverse block space on the filemark's BOP side
//! (NO SENSE, FILEMARK), and drives that count a filemark as a block
//! (tgtd) end at the same place; SPACE filemarks −1 is not used, since
//! tgtd's goes one block too far. If a space back fails, the host's
//! command is answered CHECK CONDITION with the drive's sense as a
//! deferred error (response code 71h): the position is no longer known.
//!
//! Not read ahead: fixed-mode reads, READ(16), reads longer than
//! FastWrite's largest write (1 MiB), and a nexus with writes in the
//! pipeline. The speculative exchanges use the host's N_Port ID with
//! OX_IDs `SPEC_OX`; a host that has one of those open to another LUN of
//! the same drive port at the same instant would collide at the drive.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use unifab_fc::wire::fcp::{FcpCmndRepr, FcpRspRepr, FcpTaskAttr, FcpTmf};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::RCtl;
use unifab_fc::wire::{FcId, OxId, RxId};

use super::super::fastwrite::HostAction;
use super::{CHECK_CONDITION, GOOD, Nexus, Xchg, deferred, is_fcp, rsp};
pub use crate::wire::enhanced::{RECORD_AHEAD, RECORD_HIT, RECORD_STREAM};

/// Results read ahead and not yet consumed, per stream.
pub const WINDOW_CMDS: usize = 32;
/// Bytes read ahead and not yet consumed, per stream (at least one read).
pub const WINDOW_BYTES: u64 = 8 << 20;
/// Streams read ahead at once, per tunnel.
const MAX_STREAMS: usize = 64;
/// The OX_IDs of the far side's own exchanges with a drive.
const SPEC_OX: std::ops::RangeInclusive<u16> = 0xffc0..=0xfffe;

/// What a stream repeats: the LUN, the READ(6) CDB, the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    lun: u64,
    cdb: [u8; 6],
    dl: u32,
}

/// A variable-mode READ(6) of at most `max` bytes, as a stream key.
pub fn stream_key(c: &FcpCmndRepr, max: u32) -> Option<Key> {
    let cdb: [u8; 6] = c.cdb.get(..6)?.try_into().ok()?;
    let len = u32::from_be_bytes([0, cdb[2], cdb[3], cdb[4]]);
    let ok = cdb[0] == 0x08
        && cdb[1] & 0x01 == 0
        && len > 0
        && len <= max
        && c.fcp_dl == len
        && c.rddata
        && !c.wrdata
        && c.tmf.0 == 0;
    ok.then_some(Key {
        lun: c.lun.0,
        cdb,
        dl: len,
    })
}

/// Whether the far side reads on after this result: only after GOOD.
fn reads_on(r: &FcpRspRepr) -> bool {
    r.scsi_status == GOOD
}

/// A result read ahead, near the host: the drive's frames.
#[derive(Debug)]
struct Fetched {
    data: Vec<Frame>,
    rsp: Frame,
    bytes: u64,
}

#[derive(Debug)]
struct Stream {
    key: Key,
    /// An announcement came: the far side reads ahead for this stream.
    armed: bool,
    /// A result other than GOOD came: the far side reads no more.
    stopped: bool,
    /// Announced, not complete: the exchange and the data so far.
    owed: VecDeque<(OxId, Vec<Frame>)>,
    ready: VecDeque<Fetched>,
    /// FCP_DATA payload held, owed and ready.
    bytes: u64,
    /// The host's READ waiting for the owed result.
    waiting: Option<Frame>,
    touched: bool,
}

/// Why a nexus drops read-ahead frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Until the exchange of the host's command (OX_ID) ends.
    Until(OxId),
    /// Until the host's next command, then until its exchange ends.
    Next,
}

/// Read-ahead near the host.
#[derive(Debug, Default)]
pub struct AheadHost {
    streams: HashMap<Nexus, Stream>,
    draining: HashMap<Nexus, Drain>,
    /// Drains already there at the last sweep: ended at the next one.
    aged: std::collections::HashSet<Nexus>,
    next_rx: u16,
    /// Host READs answered from what was read ahead.
    pub hits: u64,
    /// Results read ahead and dropped unconsumed.
    pub discarded: u64,
}

/// What the host side does with a host command.
#[derive(Debug)]
pub enum HostCmd {
    /// Answered (a hit) or waiting: these actions, nothing else.
    Taken(Vec<HostAction>),
    /// Not read-ahead's: goes on as usual, after `before` (a waiting READ
    /// released by a discard).
    Pass(Frame, Vec<HostAction>),
}

impl AheadHost {
    /// Nothing read ahead.
    pub fn new() -> AheadHost {
        AheadHost {
            next_rx: 0x7f00,
            ..AheadHost::default()
        }
    }

    /// Streams being read ahead.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    fn rx(&mut self) -> RxId {
        let rx = RxId(self.next_rx);
        self.next_rx = if self.next_rx >= 0x7ffe {
            0x7f00
        } else {
            self.next_rx + 1
        };
        rx
    }

    /// A command (`c`, parsed from `f`) from the host on tape nexus `n`.
    pub fn command(&mut self, n: Nexus, c: &FcpCmndRepr, f: Frame, max: u32) -> HostCmd {
        let ox = f.header.ox_id;
        if let Some(d) = self.draining.get_mut(&n) {
            if *d == Drain::Next {
                *d = Drain::Until(ox);
            }
            return HostCmd::Pass(f, Vec::new());
        }
        let Some(s) = self.streams.get_mut(&n) else {
            return HostCmd::Pass(f, Vec::new());
        };
        if stream_key(c, max) == Some(s.key) {
            if let Some(got) = s.ready.pop_front() {
                s.bytes = s.bytes.saturating_sub(got.bytes);
                let rx = self.rx();
                return HostCmd::Taken(self.hit(f, got, rx));
            }
            if s.armed && !s.stopped && s.waiting.is_none() {
                // Announced and not complete, or about to be: after every
                // hit the far side reads one more unless it has stopped.
                s.waiting = Some(f);
                return HostCmd::Taken(Vec::new());
            }
            if !s.armed || (s.stopped && s.owed.is_empty()) {
                // The far side reads nothing ahead for it (it never began,
                // or it ended and all of it was consumed): a new stream.
                self.streams.remove(&n);
                return HostCmd::Pass(f, Vec::new());
            }
        }
        let before = self.discard(n, Some(ox));
        HostCmd::Pass(f, before)
    }

    /// Whether a READ(6) on `n` may start a stream now.
    pub fn may_start(&self, n: Nexus) -> bool {
        !self.draining.contains_key(&n)
            && !self.streams.contains_key(&n)
            && self.streams.len() < MAX_STREAMS
    }

    /// A READ(6) crosses marked [`RECORD_STREAM`]: the stream it starts.
    pub fn start(&mut self, n: Nexus, key: Key) {
        self.streams.insert(
            n,
            Stream {
                key,
                armed: false,
                stopped: false,
                owed: VecDeque::new(),
                ready: VecDeque::new(),
                bytes: 0,
                waiting: None,
                touched: true,
            },
        );
    }

    /// Answers the host's READ `f` with `got`, and tells the far side.
    fn hit(&mut self, f: Frame, got: Fetched, rx: RxId) -> Vec<HostAction> {
        self.hits += 1;
        let h = f.header;
        let mut out = Vec::with_capacity(got.data.len() + 2);
        for mut d in got.data {
            d.header.d_id = h.s_id;
            d.header.s_id = h.d_id;
            d.header.ox_id = h.ox_id;
            d.header.rx_id = rx;
            out.push(HostAction::Fabric(d));
        }
        let mut r = got.rsp;
        r.header.d_id = h.s_id;
        r.header.s_id = h.d_id;
        r.header.ox_id = h.ox_id;
        r.header.rx_id = rx;
        out.push(HostAction::Fabric(r));
        out.push(HostAction::Tunnel(f, RECORD_HIT));
        out
    }

    /// Drops nexus `n`'s stream; read-ahead frames are dropped until the
    /// exchange `until` ends (or the next command's, for `None`). Returns
    /// a READ that was waiting, to cross as usual first.
    fn discard(&mut self, n: Nexus, until: Option<OxId>) -> Vec<HostAction> {
        let Some(s) = self.streams.remove(&n) else {
            return Vec::new();
        };
        self.discarded += (s.ready.len() + s.owed.len()) as u64;
        let drain = match (s.waiting.as_ref(), until) {
            (Some(w), _) => Drain::Until(w.header.ox_id),
            (None, Some(ox)) => Drain::Until(ox),
            (None, None) => Drain::Next,
        };
        // Even before an announcement came: one may be crossing.
        self.draining.insert(n, drain);
        self.aged.remove(&n);
        s.waiting
            .map(|w| vec![HostAction::Tunnel(w, 0)])
            .unwrap_or_default()
    }

    /// A frame from the tunnel toward the host with its record flags:
    /// `Err` gives it back (not read-ahead's). A read-ahead frame is kept,
    /// or dropped, and may answer a waiting READ.
    pub fn inbound(&mut self, f: Frame, flags: u8) -> Result<Vec<HostAction>, Frame> {
        let h = f.header;
        if flags & RECORD_AHEAD == 0 {
            if !self.draining.is_empty()
                && (is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT)
            {
                // The command that discarded a stream is done: whatever
                // was read ahead for it crossed before its answer.
                self.draining.retain(|n, d| {
                    !(n.0 == h.d_id && n.1 == h.s_id && *d == Drain::Until(h.ox_id))
                });
            }
            return Err(f);
        }
        if is_fcp(&h, RCtl::FCP_CMND) {
            // An announcement: the far side sent the drive this READ.
            let Ok(c) = FcpCmndRepr::parse(&f.payload) else {
                return Ok(Vec::new());
            };
            let n = (h.s_id, h.d_id, c.lun.0);
            if self.draining.contains_key(&n) {
                return Ok(Vec::new());
            }
            let Some(s) = self.streams.get_mut(&n) else {
                return Ok(Vec::new());
            };
            let unconsumed = s.ready.len() + s.owed.len();
            if unconsumed >= 2 * WINDOW_CMDS || s.stopped {
                // More than the far side may read ahead: drop the stream
                // and let the host's next command space the drive back.
                let _ = self.discard(n, None);
                return Ok(Vec::new());
            }
            s.armed = true;
            s.touched = true;
            s.owed.push_back((h.ox_id, Vec::new()));
            return Ok(Vec::new());
        }
        // The drive's frames for a read ahead: host d_id, drive s_id.
        let Some((n, s)) = self.streams.iter_mut().find(|(n, s)| {
            n.0 == h.d_id && n.1 == h.s_id && s.owed.front().is_some_and(|o| o.0 == h.ox_id)
        }) else {
            return Ok(Vec::new());
        };
        let n = *n;
        s.touched = true;
        if is_fcp(&h, RCtl::FCP_DATA) {
            s.bytes += f.payload.len() as u64;
            if s.bytes > 2 * WINDOW_BYTES + 2 * u64::from(s.key.dl) {
                let _ = self.discard(n, None);
                return Ok(Vec::new());
            }
            if let Some(o) = s.owed.front_mut() {
                o.1.push(f);
            }
            return Ok(Vec::new());
        }
        if !is_fcp(&h, RCtl::FCP_RSP) {
            return Ok(Vec::new());
        }
        let Some((_, data)) = s.owed.pop_front() else {
            return Ok(Vec::new());
        };
        let bytes = data.iter().map(|d| d.payload.len() as u64).sum();
        if !FcpRspRepr::parse(&f.payload).is_ok_and(|r| reads_on(&r)) {
            s.stopped = true;
        }
        s.ready.push_back(Fetched {
            data,
            rsp: f,
            bytes,
        });
        let Some(w) = s.waiting.take() else {
            return Ok(Vec::new());
        };
        let Some(got) = s.ready.pop_front() else {
            return Ok(Vec::new());
        };
        s.bytes = s.bytes.saturating_sub(got.bytes);
        let rx = self.rx();
        Ok(self.hit(w, got, rx))
    }

    /// Every `fastwrite::SWEEP_EVERY`: a READ waiting for a result no
    /// frame came for since the last sweep crosses as usual (the far side
    /// spaces the drive back first); a drain with no end is ended.
    pub fn sweep(&mut self) -> Vec<HostAction> {
        let mut out = Vec::new();
        let stale: Vec<Nexus> = self
            .streams
            .iter_mut()
            .filter_map(|(n, s)| {
                (!std::mem::take(&mut s.touched) && s.waiting.is_some()).then_some(*n)
            })
            .collect();
        for n in stale {
            out.extend(self.discard(n, None));
        }
        // A drain whose command never ended (its exchange aborted without
        // an answer crossing) ends a sweep interval later: long after
        // anything read ahead for the discarded stream could still cross.
        let aged = std::mem::take(&mut self.aged);
        self.draining.retain(|n, _| !aged.contains(n));
        self.aged = self.draining.keys().copied().collect();
        out
    }

    /// Link loss: everything read ahead is forgotten.
    pub fn clear(&mut self) {
        self.streams.clear();
        self.draining.clear();
        self.aged.clear();
    }
}

/// How a result read ahead moved the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moved {
    /// Past one block (GOOD, an ILI, an error on the block).
    Block,
    /// Past a filemark.
    Filemark,
    /// Not at all (BLANK CHECK at end-of-data, BUSY, a conflict).
    Nothing,
}

fn moved(r: &FcpRspRepr) -> Moved {
    match r.scsi_status {
        GOOD => Moved::Block,
        CHECK_CONDITION => {
            let s = &r.sense;
            let key = s.get(2).map_or(0, |b| b & 0x0f);
            if s.get(2).is_some_and(|b| b & 0x80 != 0) {
                Moved::Filemark
            } else if key == 0x08 {
                Moved::Nothing
            } else {
                Moved::Block
            }
        }
        _ => Moved::Nothing,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// The stream-starting READ is at the drive (its OX_ID); `false` once
    /// another command came first.
    Starting(OxId, bool),
    /// Reading ahead: the read at the drive, if any.
    Reading(Option<OxId>),
    /// Spacing back: the SPACE at the drive and the steps after it.
    Undoing(OxId, Vec<i32>),
}

#[derive(Debug)]
struct Reader {
    /// The host's READ(6), the template of every read ahead.
    cmnd: Frame,
    len: u64,
    phase: Phase,
    unconsumed: VecDeque<Moved>,
    stopped: bool,
    /// Commands from the host waiting for the drive to be spaced back.
    held: VecDeque<(Frame, u8)>,
    touched: bool,
}

/// Read-ahead near the drive.
#[derive(Debug, Default)]
pub struct AheadTarget {
    readers: HashMap<Nexus, Reader>,
    /// This side's own exchanges with drives (reads ahead, spaces back).
    own: HashMap<Xchg, Nexus>,
    next_ox: u16,
    /// Reads sent to drives ahead of the host.
    pub issued: u64,
    /// Spaces back after a discarded stream.
    pub spaced_back: u64,
}

/// What the drive side does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TargetAct {
    /// To the drive.
    pub to_fabric: Vec<Frame>,
    /// Into the tunnel (with record flags), before anything passed on.
    pub up: Vec<(Frame, u8)>,
    /// Host commands released, to go on as if they had just arrived.
    pub released: Vec<(Frame, u8)>,
    /// The frame, not read-ahead's: goes on as usual.
    pub pass: Option<Frame>,
    /// Host exchanges answered here: FastWrite drops data it holds for
    /// them.
    pub forget: Vec<(FcId, OxId)>,
}

impl AheadTarget {
    /// Nothing read ahead.
    pub fn new() -> AheadTarget {
        AheadTarget {
            next_ox: *SPEC_OX.start(),
            ..AheadTarget::default()
        }
    }

    /// Streams being read ahead.
    pub fn readers(&self) -> usize {
        self.readers.len()
    }

    fn ox(&mut self, host: FcId, drive: FcId) -> OxId {
        for _ in SPEC_OX {
            let ox = self.next_ox;
            self.next_ox = if ox >= *SPEC_OX.end() {
                *SPEC_OX.start()
            } else {
                ox + 1
            };
            if !self.own.contains_key(&(host, drive, OxId(ox))) {
                return OxId(ox);
            }
        }
        // Every one busy (63 streams of one host to one drive port, each
        // with a read at the drive): reuse the next; bounded by MAX_STREAMS.
        OxId(self.next_ox)
    }

    /// An FCP_CMND from the tunnel with its record flags.
    pub fn command(&mut self, f: Frame, flags: u8) -> TargetAct {
        let mut act = TargetAct::default();
        let h = f.header;
        let Ok(c) = FcpCmndRepr::parse(&f.payload) else {
            act.pass = Some(f);
            return act;
        };
        let n = (h.s_id, h.d_id, c.lun.0);
        if flags & RECORD_HIT != 0 {
            // Answered near the host: one result consumed, one more read.
            if let Some(r) = self.readers.get_mut(&n) {
                r.unconsumed.pop_front();
                r.touched = true;
            }
            self.read_on(n, &mut act);
            return act;
        }
        if let Some(r) = self.readers.get_mut(&n) {
            let idle = r.phase == Phase::Reading(None);
            if let Phase::Starting(_, live) = &mut r.phase {
                // Another command before the first READ's answer: no
                // read-ahead for that stream.
                *live = false;
            } else if idle && r.unconsumed.is_empty() {
                // All of it consumed: nothing to space back over.
                self.readers.remove(&n);
            } else if c.tmf.0 != 0 {
                // Task management goes at once and ends the stream; what
                // waited goes first.
                let r = self.readers.remove(&n);
                act.released.extend(r.into_iter().flat_map(|r| r.held));
            } else {
                r.held.push_back((f, flags));
                r.touched = true;
                if idle {
                    self.space_back(n, &mut act);
                }
                return act;
            }
        }
        if flags & RECORD_STREAM != 0
            && !self.readers.contains_key(&n)
            && self.readers.len() < MAX_STREAMS
            && stream_key(&c, u32::MAX).is_some()
        {
            self.readers.insert(
                n,
                Reader {
                    cmnd: f.clone(),
                    len: u64::from(c.fcp_dl),
                    phase: Phase::Starting(h.ox_id, true),
                    unconsumed: VecDeque::new(),
                    stopped: false,
                    held: VecDeque::new(),
                    touched: true,
                },
            );
        }
        act.pass = Some(f);
        act
    }

    /// Sends nexus `n`'s drive the next read ahead, if there is room.
    fn read_on(&mut self, n: Nexus, act: &mut TargetAct) {
        let Some(r) = self.readers.get(&n) else {
            return;
        };
        let room = r.unconsumed.len() < WINDOW_CMDS
            && (r.unconsumed.is_empty() || (r.unconsumed.len() as u64 + 1) * r.len <= WINDOW_BYTES);
        if r.phase != Phase::Reading(None) || r.stopped || !r.held.is_empty() || !room {
            return;
        }
        let ox = self.ox(n.0, n.1);
        let Some(r) = self.readers.get_mut(&n) else {
            return;
        };
        let mut c = r.cmnd.clone();
        if c.payload.get(8).is_some_and(|crn| *crn != 0) {
            // A command reference number belongs to the host's commands.
            let mut p = c.payload.to_vec();
            p[8] = 0;
            c.payload = Bytes::from(p);
        }
        c.header.ox_id = ox;
        c.header.rx_id = RxId::UNASSIGNED;
        r.phase = Phase::Reading(Some(ox));
        self.own.insert((n.0, n.1, ox), n);
        self.issued += 1;
        act.up.push((c.clone(), RECORD_AHEAD));
        act.to_fabric.push(c);
    }

    /// Spaces nexus `n`'s drive back over what the host never consumed,
    /// or releases what waits if there is nothing to undo.
    fn space_back(&mut self, n: Nexus, act: &mut TargetAct) {
        let Some(r) = self.readers.get_mut(&n) else {
            return;
        };
        let mut steps = Vec::new();
        if r.unconsumed.back() == Some(&Moved::Filemark) {
            steps.push(-1);
        }
        let blocks = r.unconsumed.iter().filter(|m| **m == Moved::Block).count();
        if blocks > 0 {
            steps.push(-(blocks as i32));
        }
        r.unconsumed.clear();
        if steps.is_empty() {
            let r = self.readers.remove(&n);
            act.released.extend(r.into_iter().flat_map(|r| r.held));
            return;
        }
        self.spaced_back += 1;
        self.next_space(n, steps, act);
    }

    fn next_space(&mut self, n: Nexus, mut steps: Vec<i32>, act: &mut TargetAct) {
        let count = steps.remove(0);
        let ox = self.ox(n.0, n.1);
        let Some(r) = self.readers.get_mut(&n) else {
            return;
        };
        let c = count.to_be_bytes();
        let mut cdb = [0u8; 16];
        cdb[..6].copy_from_slice(&[0x11, 0x00, c[1], c[2], c[3], 0]);
        let Ok(tmpl) = FcpCmndRepr::parse(&r.cmnd.payload) else {
            return;
        };
        let cmnd = FcpCmndRepr {
            lun: tmpl.lun,
            crn: 0,
            priority: 0,
            task_attribute: FcpTaskAttr::SIMPLE,
            tmf: FcpTmf(0),
            rddata: false,
            wrdata: false,
            cdb: Bytes::copy_from_slice(&cdb),
            fcp_dl: 0,
            bidirectional_read_dl: None,
        };
        let mut b = vec![0u8; cmnd.buffer_len()];
        if cmnd.emit(&mut b).is_err() {
            return;
        }
        let mut f = Frame::new(r.cmnd.header, Bytes::from(b));
        f.header.ox_id = ox;
        f.header.rx_id = RxId::UNASSIGNED;
        r.phase = Phase::Undoing(ox, steps);
        self.own.insert((n.0, n.1, ox), n);
        act.to_fabric.push(f);
    }

    /// A frame from a drive toward the tunnel.
    pub fn from_drive(&mut self, f: Frame) -> TargetAct {
        let mut act = TargetAct::default();
        let h = f.header;
        let x: Xchg = (h.d_id, h.s_id, h.ox_id);
        let ends = is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT;
        let Some(&n) = self.own.get(&x) else {
            if ends && !self.readers.is_empty() {
                self.started(x, &f, &mut act);
            }
            act.pass = Some(f);
            return act;
        };
        if !ends {
            if is_fcp(&h, RCtl::FCP_DATA) && self.readers.contains_key(&n) {
                act.up.push((f, RECORD_AHEAD));
            }
            return act;
        }
        self.own.remove(&x);
        let status = if is_fcp(&h, RCtl::FCP_RSP) {
            FcpRspRepr::parse(&f.payload).ok()
        } else {
            None
        };
        let Some(r) = self.readers.get_mut(&n) else {
            return act;
        };
        r.touched = true;
        match std::mem::replace(&mut r.phase, Phase::Reading(None)) {
            Phase::Reading(Some(ox)) if ox == h.ox_id => {
                let m = status.as_ref().map_or(Moved::Nothing, moved);
                if !status.as_ref().is_some_and(reads_on) {
                    r.stopped = true;
                }
                r.unconsumed.push_back(m);
                if r.held.is_empty() {
                    // The next read's announcement goes before this
                    // result, so the host side knows more is coming.
                    self.read_on(n, &mut act);
                    act.up.push((f, RECORD_AHEAD));
                } else {
                    act.up.push((f, RECORD_AHEAD));
                    self.space_back(n, &mut act);
                }
            }
            Phase::Undoing(ox, steps) if ox == h.ox_id => {
                // GOOD, or NO SENSE with FILEMARK: on the filemark's BOP
                // side, as asked.
                let ok = status.as_ref().is_some_and(|r| {
                    r.scsi_status == GOOD
                        || (r.scsi_status == CHECK_CONDITION
                            && r.sense.get(2).is_some_and(|b| b & 0x0f == 0))
                });
                if ok && !steps.is_empty() {
                    self.next_space(n, steps, &mut act);
                    return act;
                }
                let Some(mut r) = self.readers.remove(&n) else {
                    return act;
                };
                if !ok && let Some((c, _)) = r.held.pop_front() {
                    // The position is lost: the first command waiting
                    // hears it as a deferred error.
                    let sense = status
                        .as_ref()
                        .map_or_else(|| deferred(&FcpRspRepr::default()), deferred);
                    let ch = c.header;
                    act.forget.push((ch.s_id, ch.ox_id));
                    act.up
                        .push((rsp(&ch, RxId::UNASSIGNED, CHECK_CONDITION, sense), 0));
                }
                act.released.extend(r.held);
            }
            other => r.phase = other,
        }
        act
    }

    /// The drive answered a host exchange `x`: a stream-starting READ's
    /// GOOD starts reading ahead.
    fn started(&mut self, x: Xchg, f: &Frame, act: &mut TargetAct) {
        let n = self
            .readers
            .iter()
            .find(|(n, r)| {
                n.0 == x.0 && n.1 == x.1 && matches!(r.phase, Phase::Starting(ox, _) if ox == x.2)
            })
            .map(|(n, _)| *n);
        let Some(n) = n else { return };
        let go = matches!(self.readers.get(&n), Some(r) if r.phase == Phase::Starting(x.2, true))
            && is_fcp(&f.header, RCtl::FCP_RSP)
            && FcpRspRepr::parse(&f.payload).is_ok_and(|r| reads_on(&r));
        if !go {
            self.readers.remove(&n);
            return;
        }
        if let Some(r) = self.readers.get_mut(&n) {
            r.phase = Phase::Reading(None);
        }
        self.read_on(n, act);
    }

    /// Every `fastwrite::SWEEP_EVERY`: a stream whose drive answered
    /// nothing since the last sweep (a read ahead or a space back that
    /// never ended) is dropped and what waited for it goes on (the
    /// position is what the drive made it).
    pub fn sweep(&mut self) -> Vec<(Frame, u8)> {
        let mut out = Vec::new();
        let stale: Vec<Nexus> = self
            .readers
            .iter_mut()
            .filter_map(|(n, r)| {
                // An idle stream waits for its host, however long.
                let waiting_on_drive = r.phase != Phase::Reading(None);
                (!std::mem::take(&mut r.touched) && waiting_on_drive).then_some(*n)
            })
            .collect();
        for n in stale {
            if let Some(r) = self.readers.remove(&n) {
                out.extend(r.held);
            }
        }
        // Exchanges of streams that ended (task management) and that the
        // drive never closed.
        let readers = &self.readers;
        self.own.retain(|_, n| readers.contains_key(n));
        out
    }

    /// Link loss: everything is forgotten.
    pub fn clear(&mut self) {
        self.readers.clear();
        self.own.clear();
    }
}

#[cfg(test)]
mod tests;
