//! Tape pipelining (enhanced mode, on FastWrite): a tape drive streams one
//! command at a time, so across a WAN each WRITE(6) costs a round trip.
//! Here the tunnel answers for the far drive and keeps the stream full.
//!
//! - Near the host ([`TapeHost`]): the tunnel learns which I_T_L nexuses
//!   are tapes from the INQUIRY data crossing it (peripheral device type
//!   01h). On such a nexus, a WRITE(6), or a WRITE FILEMARKS(6) with
//!   IMMED, is *accelerated*: forwarded marked, answered at once with a
//!   proxy FCP_XFER_RDY (as FastWrite does) and, when its data has left,
//!   a proxy FCP_RSP with GOOD status. At most `max_cmds` commands and
//!   `max_bytes` bytes per nexus are outstanding (not yet answered by
//!   the far drive); past that the next command is withheld (no
//!   XFER_RDY) until the far drive catches up. Every other command is a
//!   *sync point*: it waits, withheld, until everything before it has been
//!   answered by the drive, then crosses as usual. The far drive's own
//!   statuses for accelerated commands stay in the tunnel.
//! - An error the far drive reports for an accelerated command (already
//!   answered GOOD) is kept as a *deferred error* and given, once, to the
//!   host's next command on that nexus: CHECK CONDITION with the drive's
//!   sense as response code 71h (SPC-4 §4.5.1). That command is not sent;
//!   the host retries after handling the error, as SSC-3 expects.
//! - Near the drive ([`TapeTarget`]): accelerated commands of a nexus go
//!   to the drive one at a time, each after the previous one's status, so
//!   that once one fails none after it reaches the medium: the queued ones
//!   are discarded (TASK ABORTED back through the tunnel, their held data
//!   dropped).
//!
//! - Reads: variable-mode READ(6) streams are read ahead by the far side
//!   when both ends announce it ([`ahead`]).
//!
//! What is not accelerated (as the vendors document for theirs): fixed-
//! mode reads and reads on a nexus with writes pipelined (each costs a
//! round trip), fixed and variable writes larger than FastWrite's largest write (1 MiB), commands
//! with task management, and anything on a nexus whose INQUIRY the tunnel
//! did not see. A link loss forgets the pipeline; the host's exchange
//! timeouts recover what was in flight (commands answered GOOD by proxy
//! and lost with the link are lost: the drive never wrote them, and the
//! host learns it only from the position, as after a drive reset).

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;
use unifab_fc::wire::fcp::{FcpCmndRepr, FcpRspRepr, XferRdyRepr};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{FcHeaderRepr, FcId, OxId, RxId};

use super::fastwrite::HostAction;
use crate::wire::enhanced::{RECORD_FASTWRITE, RECORD_TAPE};

/// Default commands outstanding per nexus.
pub const DEFAULT_MAX_CMDS: usize = 64;
/// Default bytes outstanding per nexus.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
/// Tape nexuses a tunnel remembers (host, drive, LUN).
const MAX_TAPES: usize = 4096;
/// INQUIRY exchanges watched at once.
const MAX_INQUIRIES: usize = 1024;
/// Commands the drive side queues per nexus, and in all.
const MAX_QUEUED: usize = 256;
const MAX_QUEUED_ALL: usize = 8192;

const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;
const TASK_SET_FULL: u8 = 0x28;
const TASK_ABORTED: u8 = 0x40;

/// (host, drive, LUN).
type Nexus = (FcId, FcId, u64);
/// (host, drive, OX_ID): one exchange.
type Xchg = (FcId, FcId, OxId);

fn is_fcp(h: &FcHeaderRepr, r: RCtl) -> bool {
    h.fc_type == FcType::FCP && h.r_ctl == r
}

/// A command the pipeline may answer for: WRITE(6) with data no larger
/// than `max`, or WRITE FILEMARKS(6) with IMMED.
fn streamable(c: &FcpCmndRepr, max: u32) -> bool {
    let cdb = &c.cdb[..];
    match cdb.first() {
        Some(0x0a) => c.wrdata && !c.rddata && c.fcp_dl > 0 && c.fcp_dl <= max,
        Some(0x10) => cdb.get(1).is_some_and(|b| b & 0x01 != 0) && c.fcp_dl == 0,
        _ => false,
    }
}

/// A frame the tunnel sends the host as if from the drive.
fn reply(h: &FcHeaderRepr, r_ctl: RCtl, rx: RxId, f_ctl: FCtl, payload: Bytes) -> Frame {
    Frame::new(
        FcHeaderRepr {
            r_ctl,
            d_id: h.s_id,
            s_id: h.d_id,
            fc_type: FcType::FCP,
            f_ctl,
            seq_id: 0xf1,
            ox_id: h.ox_id,
            rx_id: rx,
            ..FcHeaderRepr::default()
        },
        payload,
    )
}

fn rsp(h: &FcHeaderRepr, rx: RxId, status: u8, sense: Bytes) -> Frame {
    let r = FcpRspRepr {
        scsi_status: status,
        sense,
        ..FcpRspRepr::default()
    };
    let payload = r.to_bytes().unwrap_or_else(|_| Bytes::from(vec![0u8; 24]));
    reply(h, RCtl::FCP_RSP, rx, FCtl::last_reply(), payload)
}

/// ABORTED COMMAND (fixed format), for commands the drive side discards
/// after a task management function.
fn aborted_sense() -> Bytes {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = 0x0b;
    s[7] = 10;
    Bytes::from(s)
}

/// The drive's sense as a deferred error (response code 71h); a failure
/// without sense becomes ABORTED COMMAND.
fn deferred(r: &FcpRspRepr) -> Bytes {
    let mut s = if r.sense.len() >= 14 && matches!(r.sense[0] & 0x7f, 0x70 | 0x71) {
        r.sense.to_vec()
    } else {
        let mut s = vec![0u8; 18];
        s[2] = 0x0b;
        s[7] = 10;
        s
    };
    s[0] = (s[0] & 0x80) | 0x71;
    Bytes::from(s)
}

/// What tape pipelining did, for `show fcip` and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapeStats {
    /// Commands answered by proxy (WRITE(6), WRITE FILEMARKS IMMED).
    pub accelerated: u64,
    /// Proxy GOOD statuses sent.
    pub proxy_status: u64,
    /// Deferred errors given to hosts.
    pub deferred_errors: u64,
    /// Commands withheld at a sync point or a full pipeline.
    pub withheld: u64,
    /// Queued commands the drive side discarded after an error.
    pub discarded: u64,
    /// Host READs answered from what the far side read ahead.
    pub read_ahead_hits: u64,
    /// Results read ahead and dropped unconsumed (the host sent another
    /// command).
    pub read_ahead_discarded: u64,
    /// Reads this side sent its drives ahead of the host.
    pub read_ahead_issued: u64,
}

#[derive(Debug)]
struct Accel {
    nexus: Nexus,
    proxy_rx: RxId,
    data_left: u32,
    bytes: u64,
    /// The host has its proxy GOOD.
    answered: bool,
    /// A frame of the exchange came back since the last sweep.
    touched: bool,
}

#[derive(Debug, Default)]
struct Pipe {
    outstanding: usize,
    bytes: u64,
    /// Commands withheld, in order.
    held: VecDeque<Frame>,
    /// The deferred error to give the host's next command.
    deferred: Option<Bytes>,
    /// An accelerated command failed: nothing is accelerated until the
    /// pipeline has drained and the error was given.
    failed: bool,
}

/// Tape pipelining near the host.
#[derive(Debug)]
pub struct TapeHost {
    max_cmds: usize,
    max_bytes: u64,
    max_write: u32,
    inquiries: HashMap<Xchg, u64>,
    tapes: HashSet<Nexus>,
    pipes: HashMap<Nexus, Pipe>,
    accel: HashMap<Xchg, Accel>,
    next_rx: u16,
    /// Read-ahead, when both ends announce it.
    ahead: Option<ahead::AheadHost>,
    /// What it did.
    pub stats: TapeStats,
}

/// What the host side does with a frame from the tunnel.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Inbound {
    /// To the local fabric (toward the host).
    pub to_fabric: Vec<Frame>,
    /// Withheld commands released into the tunnel, with record flags.
    pub to_tunnel: Vec<(Frame, u8)>,
}

impl TapeHost {
    /// At most `max_cmds` commands and `max_bytes` outstanding per nexus;
    /// writes up to `max_write` bytes (FastWrite's largest) accelerated.
    pub fn new(max_cmds: usize, max_bytes: u64, max_write: u32) -> TapeHost {
        TapeHost {
            max_cmds: max_cmds.max(1),
            max_bytes,
            max_write,
            inquiries: HashMap::new(),
            tapes: HashSet::new(),
            pipes: HashMap::new(),
            accel: HashMap::new(),
            next_rx: 0x4000,
            ahead: None,
            stats: TapeStats::default(),
        }
    }

    /// Turns read-ahead on or off (at each link start: the peer may have
    /// changed).
    pub fn set_read_ahead(&mut self, on: bool) {
        if on != self.ahead.is_some() {
            self.ahead = on.then(ahead::AheadHost::new);
        }
    }

    /// What it did, read-ahead included.
    pub fn stats(&self) -> TapeStats {
        let mut s = self.stats;
        if let Some(a) = &self.ahead {
            s.read_ahead_hits = a.hits;
            s.read_ahead_discarded = a.discarded;
        }
        s
    }

    /// Nexuses known to be tapes.
    pub fn tapes(&self) -> usize {
        self.tapes.len()
    }

    /// Commands outstanding (accelerated, not yet answered by the drive).
    pub fn outstanding(&self) -> usize {
        self.accel.len()
    }

    fn proxy_rx(&mut self) -> RxId {
        let rx = RxId(self.next_rx);
        self.next_rx = if self.next_rx >= 0x7ffe {
            0x4000
        } else {
            self.next_rx + 1
        };
        rx
    }

    /// A frame from the local fabric toward the tunnel: `Err` gives it
    /// back untouched (not pipelined: FastWrite and the link take it).
    pub fn outbound(&mut self, f: Frame) -> Result<Vec<HostAction>, Frame> {
        let h = f.header;
        let x: Xchg = (h.s_id, h.d_id, h.ox_id);
        if is_fcp(&h, RCtl::FCP_DATA) && self.accel.contains_key(&x) {
            return Ok(self.data(f, x));
        }
        if h.r_ctl == RCtl::ABTS
            && let Some(p) = self.pipes.values_mut().find(|p| {
                p.held
                    .iter()
                    .any(|c| (c.header.s_id, c.header.d_id, c.header.ox_id) == x)
            })
        {
            // A withheld command the host gives up on: it never left.
            p.held
                .retain(|c| (c.header.s_id, c.header.d_id, c.header.ox_id) != x);
            let acc = Frame::new(
                FcHeaderRepr {
                    r_ctl: RCtl::BA_ACC,
                    d_id: h.s_id,
                    s_id: h.d_id,
                    fc_type: FcType::BLS,
                    f_ctl: FCtl::last_reply(),
                    ox_id: h.ox_id,
                    rx_id: h.rx_id,
                    ..FcHeaderRepr::default()
                },
                {
                    // BA_ACC: no SEQ_ID, the exchange's OX_ID and RX_ID,
                    // the whole SEQ_CNT range.
                    let mut b = vec![0u8; 12];
                    b[4..6].copy_from_slice(&h.ox_id.0.to_be_bytes());
                    b[6..8].copy_from_slice(&h.rx_id.0.to_be_bytes());
                    b[10..12].copy_from_slice(&[0xff, 0xff]);
                    Bytes::from(b)
                },
            );
            return Ok(vec![HostAction::Fabric(acc)]);
        }
        if !is_fcp(&h, RCtl::FCP_CMND) {
            return Err(f);
        }
        let Ok(c) = FcpCmndRepr::parse(&f.payload) else {
            return Err(f);
        };
        let nexus = (h.s_id, h.d_id, c.lun.0);
        if c.cdb.first() == Some(&0x12) && c.cdb.get(1).is_some_and(|b| b & 0x01 == 0) {
            if self.inquiries.len() >= MAX_INQUIRIES {
                self.inquiries.clear();
            }
            self.inquiries.insert(x, c.lun.0);
        }
        if !self.tapes.contains(&nexus) {
            return Err(f);
        }
        // Read-ahead first: a hit is answered here; anything else ends the
        // stream (a READ that was waiting goes before it).
        let (f, before) = match &mut self.ahead {
            Some(a) => match a.command(nexus, &c, f, self.max_write) {
                ahead::HostCmd::Taken(acts) => return Ok(acts),
                ahead::HostCmd::Pass(f, before) => (f, before),
            },
            None => (f, Vec::new()),
        };
        let as_usual = |f: Frame, mut before: Vec<HostAction>| {
            if before.is_empty() {
                Err(f)
            } else {
                before.push(HostAction::Tunnel(f, 0));
                Ok(before)
            }
        };
        if c.tmf.0 != 0 {
            return as_usual(f, before);
        }
        let pipe = self.pipes.entry(nexus).or_default();
        let was_idle = pipe.held.is_empty() && pipe.outstanding == 0 && pipe.deferred.is_none();
        if was_idle && !pipe.failed && !streamable(&c, self.max_write) {
            // A sync point with nothing before it: it crosses as usual, a
            // READ(6) stream's first READ marked for read-ahead.
            if let Some(a) = &mut self.ahead
                && let Some(key) = ahead::stream_key(&c, self.max_write)
                && a.may_start(nexus)
            {
                a.start(nexus, key);
                let mut acts = before;
                acts.push(HostAction::Tunnel(f, ahead::RECORD_STREAM));
                return Ok(acts);
            }
            return as_usual(f, before);
        }
        pipe.held.push_back(f);
        let mut out = Vec::new();
        let mut to_tunnel = Vec::new();
        self.release(nexus, &mut out, &mut to_tunnel);
        let still_held = self.pipes.get(&nexus).is_some_and(|p| {
            p.held
                .iter()
                .any(|c| (c.header.s_id, c.header.d_id, c.header.ox_id) == x)
        });
        if still_held {
            self.stats.withheld += 1;
        }
        let mut actions = before;
        actions.extend(
            to_tunnel
                .into_iter()
                .map(|(f, fl)| HostAction::Tunnel(f, fl)),
        );
        actions.extend(out.into_iter().map(HostAction::Fabric));
        Ok(actions)
    }

    fn data(&mut self, f: Frame, x: Xchg) -> Vec<HostAction> {
        let n = u32::try_from(f.payload.len()).unwrap_or(u32::MAX);
        let h = f.header;
        let mut out = vec![HostAction::Tunnel(f, 0)];
        if let Some(a) = self.accel.get_mut(&x) {
            a.data_left = a.data_left.saturating_sub(n);
            if a.data_left == 0 && !a.answered {
                a.answered = true;
                self.stats.proxy_status += 1;
                out.push(HostAction::Fabric(rsp(&h, a.proxy_rx, GOOD, Bytes::new())));
            }
        }
        out
    }

    /// Sends what the pipeline lets go of nexus `n`'s withheld commands,
    /// in order: a deferred error answers the first; streamable commands
    /// are accelerated while there is room; a sync point goes once the
    /// pipeline is empty.
    fn release(&mut self, n: Nexus, to_fabric: &mut Vec<Frame>, to_tunnel: &mut Vec<(Frame, u8)>) {
        loop {
            let Some(p) = self.pipes.get_mut(&n) else {
                return;
            };
            let Some(front) = p.held.front() else {
                if p.failed && p.outstanding == 0 && p.deferred.is_none() {
                    p.failed = false;
                }
                return;
            };
            let h = front.header;
            let x: Xchg = (h.s_id, h.d_id, h.ox_id);
            if let Some(sense) = p.deferred.take() {
                p.held.pop_front();
                self.stats.deferred_errors += 1;
                let rx = self.proxy_rx();
                to_fabric.push(rsp(&h, rx, CHECK_CONDITION, sense));
                continue;
            }
            if self.accel.contains_key(&x) {
                // The host reused an exchange the drive has not answered.
                return;
            }
            let Ok(c) = FcpCmndRepr::parse(&front.payload) else {
                let f = p.held.pop_front();
                to_tunnel.extend(f.map(|f| (f, 0)));
                continue;
            };
            if streamable(&c, self.max_write) && !p.failed {
                let dl = u64::from(c.fcp_dl);
                if p.outstanding >= self.max_cmds
                    || (p.outstanding > 0 && p.bytes + dl > self.max_bytes)
                {
                    return;
                }
                let Some(f) = p.held.pop_front() else { return };
                p.outstanding += 1;
                p.bytes += dl;
                let rx = self.proxy_rx();
                self.stats.accelerated += 1;
                let flags = if dl > 0 {
                    RECORD_TAPE | RECORD_FASTWRITE
                } else {
                    RECORD_TAPE
                };
                to_tunnel.push((f, flags));
                if dl > 0 {
                    let x_rdy = XferRdyRepr {
                        data_ro: 0,
                        burst_len: c.fcp_dl,
                    };
                    to_fabric.push(reply(
                        &h,
                        RCtl::FCP_XFER_RDY,
                        rx,
                        FCtl(
                            FCtl::EXCHANGE_CONTEXT | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE,
                        ),
                        Bytes::copy_from_slice(&x_rdy.to_bytes()),
                    ));
                } else {
                    self.stats.proxy_status += 1;
                    to_fabric.push(rsp(&h, rx, GOOD, Bytes::new()));
                }
                self.accel.insert(
                    x,
                    Accel {
                        nexus: n,
                        proxy_rx: rx,
                        data_left: c.fcp_dl,
                        bytes: dl,
                        answered: dl == 0,
                        touched: true,
                    },
                );
                continue;
            }
            // A sync point (or anything while a failure drains).
            if p.outstanding > 0 {
                return;
            }
            let f = p.held.pop_front();
            to_tunnel.extend(f.map(|f| (f, 0)));
        }
    }

    /// A frame from the tunnel toward the host: `Err` gives it back
    /// untouched.
    /// `flags` are the frame's record flags.
    pub fn inbound(&mut self, f: Frame, flags: u8) -> Result<Inbound, Frame> {
        let mut f = match &mut self.ahead {
            Some(a) => match a.inbound(f, flags) {
                Ok(acts) => {
                    let mut out = Inbound::default();
                    for a in acts {
                        match a {
                            HostAction::Fabric(f) => out.to_fabric.push(f),
                            HostAction::Tunnel(f, fl) => out.to_tunnel.push((f, fl)),
                        }
                    }
                    return Ok(out);
                }
                Err(f) => f,
            },
            None => f,
        };
        let h = f.header;
        let x: Xchg = (h.d_id, h.s_id, h.ox_id);
        if let Some(&lun) = self.inquiries.get(&x) {
            if is_fcp(&h, RCtl::FCP_DATA) && h.parameter == 0 {
                let nexus = (h.d_id, h.s_id, lun);
                if f.payload
                    .first()
                    .is_some_and(|b| b & 0x1f == 0x01 && b >> 5 == 0)
                {
                    if self.tapes.len() < MAX_TAPES {
                        self.tapes.insert(nexus);
                    }
                } else {
                    self.tapes.remove(&nexus);
                }
            }
            if is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC {
                self.inquiries.remove(&x);
            }
            return Err(f);
        }
        let Some(a) = self.accel.get_mut(&x) else {
            return Err(f);
        };
        a.touched = true;
        if is_fcp(&h, RCtl::FCP_XFER_RDY) {
            return Ok(Inbound::default());
        }
        let ends = is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT;
        if !ends {
            f.header.rx_id = a.proxy_rx;
            return Ok(Inbound {
                to_fabric: vec![f],
                to_tunnel: Vec::new(),
            });
        }
        let Some(a) = self.accel.remove(&x) else {
            return Err(f);
        };
        let mut out = Inbound::default();
        let status = if is_fcp(&h, RCtl::FCP_RSP) {
            FcpRspRepr::parse(&f.payload).ok()
        } else {
            None
        };
        if let Some(p) = self.pipes.get_mut(&a.nexus) {
            p.outstanding = p.outstanding.saturating_sub(1);
            p.bytes = p.bytes.saturating_sub(a.bytes);
            let failed = status
                .as_ref()
                .is_some_and(|r| r.scsi_status != GOOD && r.scsi_status != TASK_ABORTED);
            if !a.answered {
                // The host still waits for this one: it hears the drive.
                if failed {
                    p.failed = true;
                }
                f.header.rx_id = a.proxy_rx;
                out.to_fabric.push(f);
            } else if failed
                && !p.failed
                && let Some(r) = &status
            {
                p.failed = true;
                p.deferred = Some(deferred(r));
            }
        }
        self.release(a.nexus, &mut out.to_fabric, &mut out.to_tunnel);
        // A deferred error with nothing withheld waits for the host's next
        // command (`outbound`).
        Ok(out)
    }

    /// Ends the accelerated commands no frame came back for since the last
    /// sweep (called every `fastwrite::SWEEP_EVERY`): the far drive never
    /// answered. Each nexus that had one fails as after a drive error, its
    /// deferred error ABORTED COMMAND, LOGICAL UNIT COMMUNICATION TIME-OUT,
    /// so that its sync points do not wait for ever. Returns what that
    /// releases.
    pub fn sweep(&mut self) -> Inbound {
        let mut dead = Vec::new();
        self.accel.retain(|x, a| {
            let keep = std::mem::take(&mut a.touched);
            if !keep {
                dead.push((*x, a.nexus, a.bytes, a.answered));
            }
            keep
        });
        let mut out = Inbound::default();
        let mut nexuses = Vec::new();
        for (_, n, bytes, answered) in dead {
            if let Some(p) = self.pipes.get_mut(&n) {
                p.outstanding = p.outstanding.saturating_sub(1);
                p.bytes = p.bytes.saturating_sub(bytes);
                if answered && !p.failed {
                    p.failed = true;
                    let mut sense = vec![0u8; 18];
                    sense[0] = 0x71;
                    sense[2] = 0x0b;
                    sense[7] = 10;
                    sense[12] = 0x08;
                    sense[13] = 0x01;
                    p.deferred = Some(Bytes::from(sense));
                }
            }
            if !nexuses.contains(&n) {
                nexuses.push(n);
            }
        }
        for n in nexuses {
            self.release(n, &mut out.to_fabric, &mut out.to_tunnel);
        }
        if let Some(a) = &mut self.ahead {
            for act in a.sweep() {
                match act {
                    HostAction::Fabric(f) => out.to_fabric.push(f),
                    HostAction::Tunnel(f, fl) => out.to_tunnel.push((f, fl)),
                }
            }
        }
        out
    }

    /// Link loss: the pipeline is forgotten, withheld commands with it
    /// (the host's exchange timeouts recover them); the nexuses stay
    /// known.
    pub fn clear(&mut self) {
        self.accel.clear();
        self.inquiries.clear();
        self.pipes.clear();
        if let Some(a) = &mut self.ahead {
            a.clear();
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    current: Option<OxId>,
    queue: VecDeque<Frame>,
    /// An accelerated command failed: every accelerated command after it
    /// (sent before the host side heard of the failure) is discarded,
    /// until a command that was not accelerated comes.
    failed: bool,
}

/// Ends every command queued on `q` (never sent to the drive): each is
/// answered `status` with `sense` through the tunnel, FastWrite is told
/// to drop its held data, and the counts follow.
fn discard_queued(
    q: &mut Queue,
    by_xchg: &mut HashMap<Xchg, Nexus>,
    queued: &mut usize,
    discarded: &mut u64,
    out: &mut Outbound,
    status: u8,
    sense: &Bytes,
) {
    for c in q.queue.drain(..) {
        let ch = c.header;
        by_xchg.remove(&(ch.s_id, ch.d_id, ch.ox_id));
        *queued = queued.saturating_sub(1);
        *discarded += 1;
        out.forget.push((ch.s_id, ch.ox_id));
        out.up.push(rsp(&ch, ch.rx_id, status, sense.clone()));
    }
}

/// Tape pipelining near the drive: one accelerated command at a time per
/// nexus, and none after a failure.
#[derive(Debug, Default)]
pub struct TapeTarget {
    queues: HashMap<Nexus, Queue>,
    by_xchg: HashMap<Xchg, Nexus>,
    /// Task management functions in progress (their exchange) and the
    /// accelerated command each may have ended at the drive.
    tmfs: HashMap<Xchg, (Nexus, OxId)>,
    queued: usize,
    /// Queued commands discarded after a failure, or refused (queue full).
    pub discarded: u64,
}

/// What the drive side does with the drive's answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outbound {
    /// Into the tunnel.
    pub up: Vec<Frame>,
    /// To the drive: the next queued command.
    pub to_fabric: Vec<Frame>,
    /// Exchanges discarded: FastWrite drops their held data.
    pub forget: Vec<(FcId, OxId)>,
}

impl TapeTarget {
    /// An empty queue.
    pub fn new() -> TapeTarget {
        TapeTarget::default()
    }

    /// Commands queued for drives.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// An accelerated command from the tunnel (record flag
    /// [`RECORD_TAPE`]): to the drive now (`Ok` with it), or queued
    /// (`Ok(None)`); `Err` with an answer for the tunnel when the queue is
    /// full (TASK SET FULL) or the nexus failed (TASK ABORTED).
    pub fn command(&mut self, f: Frame) -> Result<Option<Frame>, Frame> {
        let h = f.header;
        let Ok(c) = FcpCmndRepr::parse(&f.payload) else {
            return Ok(Some(f));
        };
        let nexus = (h.s_id, h.d_id, c.lun.0);
        if !self.queues.contains_key(&nexus) && self.queues.len() >= MAX_TAPES {
            self.discarded += 1;
            return Err(rsp(&h, h.rx_id, TASK_SET_FULL, Bytes::new()));
        }
        let q = self.queues.entry(nexus).or_default();
        if q.failed {
            self.discarded += 1;
            return Err(rsp(&h, h.rx_id, TASK_ABORTED, Bytes::new()));
        }
        if q.current.is_none() {
            q.current = Some(h.ox_id);
            self.by_xchg.insert((h.s_id, h.d_id, h.ox_id), nexus);
            return Ok(Some(f));
        }
        if q.queue.len() >= MAX_QUEUED || self.queued >= MAX_QUEUED_ALL {
            self.discarded += 1;
            return Err(rsp(&h, h.rx_id, TASK_SET_FULL, Bytes::new()));
        }
        self.by_xchg.insert((h.s_id, h.d_id, h.ox_id), nexus);
        q.queue.push_back(f);
        self.queued += 1;
        Ok(None)
    }

    /// A command that was not accelerated, on its way to a drive: the
    /// host side has heard of any failure, so the nexus takes accelerated
    /// commands again. A task management function (ABORT TASK SET, CLEAR
    /// TASK SET, LOGICAL UNIT RESET, TARGET RESET) ends what waits here:
    /// the queued commands are answered ABORTED COMMAND, which the host
    /// side gives as a deferred error (they were answered GOOD and never
    /// written), and what is still crossing is discarded until a plain
    /// command; the command at the drive is answered the same once the
    /// function's own response shows the drive has ended it.
    pub fn plain(&mut self, f: &Frame) -> Outbound {
        let mut out = Outbound::default();
        let h = f.header;
        if h.r_ctl != RCtl::FCP_CMND || h.fc_type != FcType::FCP {
            return out;
        }
        let Ok(c) = FcpCmndRepr::parse(&f.payload) else {
            return out;
        };
        let nexus = (h.s_id, h.d_id, c.lun.0);
        let ends_tasks = c.tmf.0 & 0x36 != 0;
        if !ends_tasks {
            if self
                .queues
                .get(&nexus)
                .is_some_and(|q| q.failed && q.current.is_none() && q.queue.is_empty())
            {
                self.queues.remove(&nexus);
            }
            return out;
        }
        let target_reset = c.tmf.0 & 0x20 != 0;
        let hit: Vec<Nexus> = self
            .queues
            .keys()
            .filter(|n| **n == nexus || (target_reset && n.1 == h.d_id))
            .copied()
            .collect();
        for n in hit {
            let Some(q) = self.queues.get_mut(&n) else {
                continue;
            };
            q.failed = true;
            let (status, sense) = (CHECK_CONDITION, aborted_sense());
            discard_queued(
                q,
                &mut self.by_xchg,
                &mut self.queued,
                &mut self.discarded,
                &mut out,
                status,
                &sense,
            );
            if let Some(ox) = q.current {
                self.tmfs.insert((h.s_id, h.d_id, h.ox_id), (n, ox));
            }
        }
        if self.tmfs.len() > MAX_QUEUED_ALL {
            self.tmfs.clear();
        }
        out
    }

    /// A frame from the drive toward the tunnel.
    pub fn outbound(&mut self, f: Frame) -> Outbound {
        let h = f.header;
        let x: Xchg = (h.d_id, h.s_id, h.ox_id);
        let ends = is_fcp(&h, RCtl::FCP_RSP) || h.r_ctl == RCtl::BA_ACC || h.r_ctl == RCtl::BA_RJT;
        let mut out = Outbound::default();
        if ends && let Some((n, ox)) = self.tmfs.remove(&x) {
            // The function is done: a command it ended at the drive will
            // never be answered by it.
            out.up.push(f);
            if let Some(q) = self.queues.get_mut(&n)
                && q.current == Some(ox)
            {
                q.current = None;
                let cx = (n.0, n.1, ox);
                if self.by_xchg.remove(&cx).is_some() {
                    let ch = FcHeaderRepr {
                        r_ctl: RCtl::FCP_CMND,
                        s_id: n.0,
                        d_id: n.1,
                        fc_type: FcType::FCP,
                        ox_id: ox,
                        rx_id: RxId::UNASSIGNED,
                        ..FcHeaderRepr::default()
                    };
                    self.discarded += 1;
                    out.forget.push((n.0, ox));
                    out.up
                        .push(rsp(&ch, ch.rx_id, CHECK_CONDITION, aborted_sense()));
                }
            }
            return out;
        }
        let nexus = if ends { self.by_xchg.remove(&x) } else { None };
        let Some(nexus) = nexus else {
            out.up.push(f);
            return out;
        };
        let good = is_fcp(&h, RCtl::FCP_RSP)
            && FcpRspRepr::parse(&f.payload).is_ok_and(|r| r.scsi_status == GOOD);
        out.up.push(f);
        let Some(q) = self.queues.get_mut(&nexus) else {
            return out;
        };
        if q.current == Some(h.ox_id) {
            q.current = None;
        } else {
            // A queued command's exchange ended (aborted by the host).
            let before = q.queue.len();
            q.queue.retain(|c| c.header.ox_id != h.ox_id);
            self.queued = self.queued.saturating_sub(before - q.queue.len());
            return out;
        }
        if good {
            if let Some(next) = q.queue.pop_front() {
                self.queued = self.queued.saturating_sub(1);
                q.current = Some(next.header.ox_id);
                out.to_fabric.push(next);
            }
        } else {
            q.failed = true;
            discard_queued(
                q,
                &mut self.by_xchg,
                &mut self.queued,
                &mut self.discarded,
                &mut out,
                TASK_ABORTED,
                &Bytes::new(),
            );
        }
        if q.current.is_none() && q.queue.is_empty() && !q.failed {
            self.queues.remove(&nexus);
        }
        out
    }

    /// Link loss: everything queued is dropped.
    pub fn clear(&mut self) {
        self.queues.clear();
        self.by_xchg.clear();
        self.tmfs.clear();
        self.queued = 0;
    }
}

pub mod ahead;
#[cfg(test)]
mod tests;
