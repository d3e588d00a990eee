//! The FCP initiator engine: commands ([`Request`]) and task management to
//! remote FCP targets named by WWPN, answered with the remote's status,
//! sense, data-in and residual ([`NPortEvent::Completed`]).
//!
//! - Commands go out in the order they were submitted. A command for a
//!   target port that is not (yet) logged in waits for it, within the
//!   command timeout, or within `fast_io_fail` of the port's loss when
//!   that is set (a port lost longer ago fails its commands at once).
//! - Data-out is sent from the request's buffers by relative offset, as
//!   each FCP_XFER_RDY asks, in frames no larger than the target receives
//!   and never straddling two buffers (no copy).
//! - Data-in frames are kept as received (slices of the frames) and
//!   handed over in offset order; a gap or an offset outside the expected
//!   length is a protocol error.
//! - A command past its timeout is aborted with ABTS; its OX_ID is then
//!   recovered with RRQ (or after R_A_TOV). A command whose future was
//!   dropped is aborted the same way, silently.
//! - ABORT TASK is ABTS; ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT
//!   RESET, TARGET RESET and CLEAR ACA are FCP_CMND task management flags.
//!   When one succeeds, the engine's own commands it affects end with
//!   [`InitiatorError::Aborted`] before the function's completion.

use std::collections::VecDeque;

use std::time::{Duration, Instant};
use unifab_scsi_core::idmap::IdMap;

use bytes::Bytes;
use unifab_scsi_core::gather::Gathered;
use unifab_scsi_core::initiator::{InitiatorError, Request};
use unifab_scsi_core::{Lun, Residual, Status, TaskAttr, TaskResult, TmfFunction, TmfResponse};

use super::budget::{LinkBudget, Room, Ticket};
use super::{NPort, NPortEvent};
use crate::compose::{self, Route};
use crate::wire::fcp::{
    FcpCmndRepr, FcpRspCode, FcpRspFlags, FcpRspRepr, FcpTaskAttr, FcpTmf, XferRdy, XferRdyRepr,
};
use crate::wire::frame::Frame;
use crate::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use crate::wire::{FcId, OxId, RxId, Wwn};

/// Identifies a command or task management function submitted to the
/// initiator engine; its value is the tag the remote LU's users see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommandId(pub u64);

#[derive(Debug)]
enum Work {
    Command(Request),
    Tmf { lun: Lun, function: TmfFunction },
}

#[derive(Debug)]
struct Queued {
    id: u64,
    target: Wwn,
    work: Work,
    /// The command's own deadline (it keeps it once started).
    deadline: Instant,
    /// When it stops waiting for its port: `deadline`, or earlier under
    /// `fast_io_fail`.
    wait_until: Instant,
    /// Its port was ready; it waits for room under `max_frames_in`.
    for_window: bool,
    /// Its place in the link's line while it waits for room.
    ticket: Option<Ticket>,
}

impl Work {
    /// The frames a command can bring back ([`NPortConfig::max_frames_in`]):
    /// its data-in, an FCP_XFER_RDY if it writes, and its FCP_RSP. Task
    /// management functions are not held back.
    ///
    /// [`NPortConfig::max_frames_in`]: super::NPortConfig::max_frames_in
    fn frames_in(&self, frame_data: u16) -> u32 {
        match self {
            Work::Command(r) => {
                let data = r.data_in_len.div_ceil(u32::from(frame_data.max(1)));
                data.saturating_add(1 + u32::from(r.data_out_len > 0))
            }
            Work::Tmf { .. } => 0,
        }
    }
}

/// Most lost target ports remembered for `fast_io_fail`; beyond it the
/// longest-lost is forgotten (a command for it then waits `fast_io_fail`
/// from its own submission instead of failing at once).
pub const MAX_LOST_PORTS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AbortReason {
    Timeout,
    Abandoned,
    /// ABORT TASK issued by this task management function.
    Tmf(u64),
}

#[derive(Debug)]
enum Kind {
    Scsi {
        data_out: Vec<Bytes>,
        write_len: u32,
        read_len: u32,
        /// Data-in that arrived in relative-offset order, from 0 (the
        /// result's own list), payloads shorter than [`GATHER_BELOW`]
        /// copied together.
        data_in: Gathered,
        /// Bytes in `data_in`.
        in_order: u64,
        /// Data-in that did not (a gap before it, or an overlap), kept
        /// with its offset and merged when the response comes.
        scattered: Vec<(u32, Bytes)>,
        /// Bytes in `data_in` and `scattered`: never more than
        /// `read_len`, however often a target sends the same offsets.
        received: u64,
    },
    Tmf {
        function: TmfFunction,
    },
}

#[derive(Debug)]
struct Cmd {
    id: u64,
    /// Frames it can bring back (counted under `max_frames_in`).
    frames: u32,
    /// Those frames, held in the link's budget until the command ends.
    _room: Option<Room>,
    peer: FcId,
    lun: Lun,
    rx: RxId,
    kind: Kind,
    deadline: Instant,
    aborting: Option<(AbortReason, Instant)>,
}

/// The initiator engine's state (part of an [`NPort`]).
#[derive(Debug)]
pub struct InitiatorEngine {
    timeout: Duration,
    fast_io_fail: Option<Duration>,
    /// Target ports lost while logged in, and when (kept only with
    /// `fast_io_fail`, at most [`MAX_LOST_PORTS`]).
    lost: IdMap<Wwn, Instant>,
    queued: VecDeque<Queued>,
    cmds: IdMap<OxId, Cmd>,
    by_id: IdMap<u64, OxId>,
    /// The link's budget for `NPortConfig::max_frames_in`.
    budget: Option<LinkBudget>,
    /// [`LinkBudget::freed`] when this port last looked for room.
    seen_freed: u64,
    /// Data bytes per frame the targets send us (`rx_data_field_size`).
    frame_data: u16,
    /// Frames this port's open commands can still bring back.
    frames_in: u32,
    /// A command ended while others waited for room under the bound.
    room_freed: bool,
}

impl InitiatorEngine {
    pub(crate) fn new(
        timeout: Duration,
        fast_io_fail: Option<Duration>,
        budget: Option<LinkBudget>,
        frame_data: u16,
    ) -> InitiatorEngine {
        InitiatorEngine {
            timeout,
            fast_io_fail,
            lost: IdMap::default(),
            queued: VecDeque::new(),
            cmds: IdMap::default(),
            by_id: IdMap::default(),
            seen_freed: budget.as_ref().map_or(0, LinkBudget::freed),
            budget,
            frame_data,
            frames_in: 0,
            room_freed: false,
        }
    }

    /// Room for a command bringing back `frames`, if it may start now
    /// (`Ok(None)`: no bound, or a command that brings nothing back). See
    /// [`LinkBudget::take`]: in line across the link, and always when
    /// nothing is open on it.
    fn room(&self, frames: u32, ticket: Option<&Ticket>) -> Result<Option<Room>, ()> {
        match &self.budget {
            Some(b) if frames > 0 => b.take(u64::from(frames), ticket).map(Some).ok_or(()),
            _ => Ok(None),
        }
    }

    /// A place in the link's line for a command that brings frames back.
    fn ticket(&self, frames: u32) -> Option<Ticket> {
        self.budget
            .as_ref()
            .filter(|_| frames > 0)
            .map(LinkBudget::ticket)
    }

    /// Frames this port's open commands can still bring back (the link's
    /// budget, `NPortConfig::max_frames_in`, bounds them with those of the
    /// other ports on the link).
    pub fn frames_in(&self) -> u32 {
        self.frames_in
    }

    /// Commands sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.cmds.len()
    }

    /// Commands waiting for their target port.
    pub fn waiting(&self) -> usize {
        self.queued.len()
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let a = self
            .cmds
            .values()
            .map(|c| c.aborting.map_or(c.deadline, |(_, d)| d))
            .min();
        let b = self.queued.iter().map(|q| q.wait_until).min();
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn fcp_attr(a: TaskAttr) -> FcpTaskAttr {
    match a {
        TaskAttr::Simple => FcpTaskAttr::SIMPLE,
        TaskAttr::Ordered => FcpTaskAttr::ORDERED,
        TaskAttr::HeadOfQueue => FcpTaskAttr::HEAD_OF_QUEUE,
        TaskAttr::Aca => FcpTaskAttr::ACA,
    }
}

fn tmf_flags(f: TmfFunction) -> Option<FcpTmf> {
    Some(match f {
        TmfFunction::AbortTaskSet => FcpTmf::ABORT_TASK_SET,
        TmfFunction::ClearTaskSet => FcpTmf::CLEAR_TASK_SET,
        TmfFunction::LogicalUnitReset => FcpTmf::LOGICAL_UNIT_RESET,
        TmfFunction::TargetReset => FcpTmf::TARGET_RESET,
        TmfFunction::ClearAca => FcpTmf::CLEAR_ACA,
        _ => return None,
    })
}

fn tmf_response(code: FcpRspCode) -> Result<TmfResponse, InitiatorError> {
    Ok(match code {
        FcpRspCode::COMPLETE => TmfResponse::FunctionComplete,
        FcpRspCode::TMF_SUCCEEDED => TmfResponse::FunctionSucceeded,
        FcpRspCode::TMF_INCORRECT_LUN => TmfResponse::IncorrectLun,
        FcpRspCode::TMF_NOT_SUPPORTED => TmfResponse::FunctionRejected,
        FcpRspCode::TMF_FAILED => TmfResponse::ServiceDeliveryFailure,
        _ => return Err(InitiatorError::Protocol("unknown FCP_RSP_CODE for a TMF")),
    })
}

/// Data-in in relative-offset order, or `None` if the pieces leave a gap
/// or overlap. `in_order` starts at offset 0 and is contiguous; only
/// `scattered` (usually empty) needs sorting.
/// In-order data-in payloads shorter than this are copied together
/// instead of kept one by one: a target sending a read four bytes per
/// frame would otherwise make the initiator keep a buffer and an entry
/// per frame, far more than the read's length.
const GATHER_BELOW: usize = 512;

/// The most out-of-order pieces a read of `len` bytes may arrive in
/// before the command is failed: one per 512 bytes, and a few more.
fn max_scattered(len: u32) -> usize {
    len as usize / GATHER_BELOW + 8
}

fn merge_data_in(in_order: Vec<Bytes>, mut scattered: Vec<(u32, Bytes)>) -> Option<Vec<Bytes>> {
    if scattered.is_empty() {
        return Some(in_order);
    }
    let mut at = 0u64;
    for b in &in_order {
        scattered.push((at as u32, b.clone()));
        at += b.len() as u64;
    }
    scattered.sort_by_key(|(o, _)| *o);
    let mut at = 0u64;
    for (o, b) in &scattered {
        if u64::from(*o) != at {
            return None;
        }
        at += b.len() as u64;
    }
    Some(scattered.into_iter().map(|(_, b)| b).collect())
}

/// An FCP_CMND payload in one allocation (the CDB is not copied first:
/// the repr borrows the request's bytes); `None` for a CDB longer than FCP
/// carries.
#[allow(clippy::too_many_arguments)]
fn fcp_cmnd_bytes(
    lun: Lun,
    cdb: Bytes,
    attr: FcpTaskAttr,
    priority: u8,
    tmf: FcpTmf,
    (rd, wr): (bool, bool),
    fcp_dl: u32,
    bidi_read_dl: u32,
) -> Option<Bytes> {
    let c = FcpCmndRepr {
        lun,
        crn: 0,
        priority: priority & 0x0f,
        task_attribute: attr,
        tmf,
        rddata: rd,
        wrdata: wr,
        cdb,
        fcp_dl,
        bidirectional_read_dl: (rd && wr).then_some(bidi_read_dl),
    };
    let mut v = vec![0u8; c.buffer_len()];
    c.emit(&mut v).ok()?;
    Some(Bytes::from(v))
}

/// The pieces of `bufs` covering `[start, start + len)`, as slices.
fn slices(bufs: &[Bytes], start: usize, len: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let (mut at, end) = (0usize, start + len);
    for b in bufs {
        let (s, e) = (at, at + b.len());
        at = e;
        if e <= start || s >= end {
            continue;
        }
        let from = start.max(s) - s;
        let to = end.min(e) - s;
        out.push(b.slice(from..to));
    }
    out
}

impl NPort {
    /// Queues command `id` for the target port named `target`. Commands
    /// go out in the order of these calls. The answer comes as
    /// [`NPortEvent::Completed`] with the same id. The caller chooses ids
    /// and keeps them unique among the port's open commands.
    pub fn submit(&mut self, now: Instant, id: CommandId, target: Wwn, request: Request) {
        let id = id.0;
        if let Err(e) = request.validate() {
            self.event(NPortEvent::Completed {
                id: CommandId(id),
                outcome: Err(e),
            });
            return;
        }
        self.enqueue(now, id, target, Work::Command(request));
    }

    /// Queues task management function `id` for `target`. For ABORT TASK
    /// the tag is the [`CommandId`] of the command to abort. The answer
    /// comes as [`NPortEvent::TmfCompleted`].
    pub fn submit_tmf(
        &mut self,
        now: Instant,
        id: CommandId,
        target: Wwn,
        lun: Lun,
        function: TmfFunction,
    ) {
        let id = id.0;
        match function {
            TmfFunction::AbortTask { tag } => {
                self.abort_task(now, id, tag);
            }
            f if tmf_flags(f).is_some() => {
                self.enqueue(now, id, target, Work::Tmf { lun, function: f });
            }
            _ => self.event(NPortEvent::TmfCompleted {
                id: CommandId(id),
                outcome: Err(InitiatorError::InvalidRequest(
                    "task management function FCP does not carry",
                )),
            }),
        }
    }

    fn enqueue(&mut self, now: Instant, id: u64, target: Wwn, work: Work) {
        let deadline = now + self.initiator.timeout;
        let frames = work.frames_in(self.initiator.frame_data);
        // Behind anything already waiting for the same port, to keep
        // order, and behind anything waiting for room (no overtaking).
        let behind = self
            .initiator
            .queued
            .iter()
            .any(|q| q.target == target || (frames > 0 && q.for_window));
        match self.ready_port_by_name(target) {
            Some(peer) => {
                let room = if behind {
                    Err(())
                } else {
                    self.initiator.room(frames, None)
                };
                match room {
                    Ok(room) => self.start(now, id, peer, work, deadline, room),
                    // It waits for room, or behind one that does.
                    Err(()) => {
                        let ticket = self.initiator.ticket(frames);
                        self.initiator.queued.push_back(Queued {
                            id,
                            target,
                            work,
                            deadline,
                            wait_until: deadline,
                            for_window: true,
                            ticket,
                        });
                    }
                }
            }
            None if self.fabric_refused() => {
                // Not logged in to the fabric, and no login under way.
                self.fail(id, &work, InitiatorError::Disconnected);
            }
            None if self.target_invisible(target) => {
                let e = self.invisible(target);
                self.fail(id, &work, e);
            }
            None => {
                let wait_until = match self.initiator.fast_io_fail {
                    None => deadline,
                    Some(ff) => {
                        let since = self.initiator.lost.get(&target).copied().unwrap_or(now);
                        (since + ff).min(deadline)
                    }
                };
                if wait_until <= now {
                    let e = self.not_logged_in(now, target, true);
                    self.fail(id, &work, e);
                    return;
                }
                self.initiator.queued.push_back(Queued {
                    id,
                    target,
                    work,
                    deadline,
                    wait_until,
                    for_window: false,
                    ticket: None,
                });
            }
        }
    }

    /// A target port that was logged in is gone: remember when, for
    /// `fast_io_fail`.
    pub(super) fn initiator_port_lost(&mut self, now: Instant, name: Wwn) {
        let Some(ff) = self.initiator.fast_io_fail else {
            return;
        };
        let lost = &mut self.initiator.lost;
        if lost.len() >= MAX_LOST_PORTS
            && !lost.contains_key(&name)
            && let Some(oldest) = lost.iter().min_by_key(|(_, t)| **t).map(|(w, _)| *w)
        {
            lost.remove(&oldest);
        }
        lost.insert(name, now);
        // Commands already waiting for it wait no longer than that.
        for q in self
            .initiator
            .queued
            .iter_mut()
            .filter(|q| q.target == name)
        {
            q.wait_until = q.wait_until.min(now + ff);
        }
    }

    /// Why a command stopped waiting for `target`: `fast_io_fail` ended
    /// the wait, or else the command's own timeout did.
    fn invisible(&self, target: Wwn) -> InitiatorError {
        InitiatorError::Unreachable {
            reason: format!(
                "FC target port {target} is not in the name server for initiator port {} ({}): zoned out, or not logged in to the fabric",
                self.config().port_name,
                self.fc_id()
            ),
        }
    }

    /// Fails the commands waiting for a target port that discovery has
    /// settled without ([`NPort::target_invisible`]).
    pub(super) fn fail_invisible(&mut self, _now: Instant) {
        if !self.config().restrict_login {
            return;
        }
        let queued = std::mem::take(&mut self.initiator.queued);
        let (gone, keep): (Vec<Queued>, Vec<Queued>) = queued
            .into_iter()
            .partition(|q| !q.for_window && self.target_invisible(q.target));
        self.initiator.queued = keep.into_iter().collect();
        for q in gone {
            let e = self.invisible(q.target);
            self.fail(q.id, &q.work, e);
        }
    }

    fn not_logged_in(&self, now: Instant, target: Wwn, fast_fail: bool) -> InitiatorError {
        let ff = self.initiator.fast_io_fail.filter(|_| fast_fail);
        let reason = match (ff, self.initiator.lost.get(&target)) {
            (Some(ff), Some(t)) => format!(
                "FC target port {target} lost {:.1} s ago (fast_io_fail {:.1} s)",
                now.saturating_duration_since(*t).as_secs_f64(),
                ff.as_secs_f64()
            ),
            (Some(ff), None) => format!(
                "FC target port {target} not logged in within fast_io_fail ({:.1} s)",
                ff.as_secs_f64()
            ),
            (None, _) => format!("FC target port {target} not logged in"),
        };
        InitiatorError::Unreachable { reason }
    }

    fn start(
        &mut self,
        _now: Instant,
        id: u64,
        peer: FcId,
        work: Work,
        deadline: Instant,
        room: Option<Room>,
    ) {
        let frames = work.frames_in(self.initiator.frame_data);
        let Ok(ox) = self.xm.alloc_ox() else {
            self.fail(id, &work, InitiatorError::QueueFull);
            return;
        };
        let (payload, lun, kind) = match work {
            Work::Command(r) => {
                let (rd, wr) = (r.data_in_len > 0, r.data_out_len > 0);
                let payload = fcp_cmnd_bytes(
                    r.lun,
                    r.cdb.into_bytes(),
                    fcp_attr(r.attr),
                    r.priority,
                    FcpTmf::NONE,
                    (rd, wr),
                    if wr { r.data_out_len } else { r.data_in_len },
                    r.data_in_len,
                );
                (
                    payload,
                    r.lun,
                    Kind::Scsi {
                        data_out: r.data_out,
                        write_len: r.data_out_len,
                        read_len: r.data_in_len,
                        data_in: Gathered::default(),
                        in_order: 0,
                        scattered: Vec::new(),
                        received: 0,
                    },
                )
            }
            Work::Tmf { lun, function } => {
                let tmf = tmf_flags(function).unwrap_or(FcpTmf::NONE);
                let payload = fcp_cmnd_bytes(
                    lun,
                    Bytes::new(),
                    FcpTaskAttr::SIMPLE,
                    0,
                    tmf,
                    (false, false),
                    0,
                    0,
                );
                (payload, lun, Kind::Tmf { function })
            }
        };
        let Some(payload) = payload else {
            self.xm.close_ox(ox);
            let e = InitiatorError::InvalidRequest("CDB FCP cannot carry");
            match kind {
                Kind::Scsi { .. } => self.complete(id, Err(e)),
                Kind::Tmf { .. } => self.tmf_done(id, Err(e)),
            }
            return;
        };
        let seq = self.next_seq_id();
        let h = FcHeaderRepr {
            r_ctl: RCtl::FCP_CMND,
            d_id: peer,
            cs_ctl: 0,
            s_id: self.fc_id,
            fc_type: FcType::FCP,
            f_ctl: FCtl::request(),
            seq_id: seq,
            df_ctl: 0,
            seq_cnt: 0,
            ox_id: ox,
            rx_id: RxId::UNASSIGNED,
            parameter: 0,
        };
        self.initiator.by_id.insert(id, ox);
        self.initiator.frames_in = self.initiator.frames_in.saturating_add(frames);
        self.initiator.cmds.insert(
            ox,
            Cmd {
                frames,
                _room: room,
                id,
                peer,
                lun,
                rx: RxId::UNASSIGNED,
                kind,
                deadline,
                aborting: None,
            },
        );
        self.send(Frame::new(h, payload));
    }

    fn fail(&mut self, id: u64, work: &Work, e: InitiatorError) {
        match work {
            Work::Command(_) => self.complete(id, Err(e)),
            Work::Tmf { .. } => self.tmf_done(id, Err(e)),
        }
    }

    fn complete(&mut self, id: u64, outcome: Result<TaskResult, InitiatorError>) {
        self.event(NPortEvent::Completed {
            id: CommandId(id),
            outcome,
        });
    }

    fn tmf_done(&mut self, id: u64, outcome: Result<TmfResponse, InitiatorError>) {
        self.event(NPortEvent::TmfCompleted {
            id: CommandId(id),
            outcome,
        });
    }

    /// The command's future was dropped: abort it at the remote, report
    /// nothing.
    pub fn abandon(&mut self, now: Instant, id: CommandId) {
        if let Some(pos) = self.initiator.queued.iter().position(|q| q.id == id.0) {
            self.initiator.queued.remove(pos);
            return;
        }
        if let Some(ox) = self.initiator.by_id.get(&id.0).copied() {
            self.send_abts(now, ox, AbortReason::Abandoned);
        }
    }

    fn send_abts(&mut self, now: Instant, ox: OxId, reason: AbortReason) {
        let me = self.fc_id;
        let r_a_tov = self.cfg.timeouts.r_a_tov;
        let Some(c) = self.initiator.cmds.get_mut(&ox) else {
            return;
        };
        if c.aborting.is_some() {
            // Already aborting: a later reason (TMF) takes over the answer.
            if let AbortReason::Tmf(_) = reason {
                c.aborting = Some((reason, now + r_a_tov * 2));
            }
            return;
        }
        c.aborting = Some((reason, now + r_a_tov * 2));
        let route = Route {
            s_id: me,
            d_id: c.peer,
            ox_id: ox,
            rx_id: c.rx,
        };
        self.stats.abts_sent += 1;
        self.send(compose::abts(route, false));
    }

    fn abort_task(&mut self, now: Instant, tmf_id: u64, tag: u64) {
        if let Some(pos) = self.initiator.queued.iter().position(|q| q.id == tag) {
            if let Some(q) = self.initiator.queued.remove(pos) {
                self.fail(q.id, &q.work, InitiatorError::Aborted);
            }
            self.tmf_done(tmf_id, Ok(TmfResponse::FunctionComplete));
            return;
        }
        match self.initiator.by_id.get(&tag).copied() {
            Some(ox) => self.send_abts(now, ox, AbortReason::Tmf(tmf_id)),
            // Not here: it has ended already.
            None => self.tmf_done(tmf_id, Ok(TmfResponse::FunctionComplete)),
        }
    }

    fn take_cmd(&mut self, ox: OxId) -> Option<Cmd> {
        let c = self.initiator.cmds.remove(&ox)?;
        self.initiator.by_id.remove(&c.id);
        self.initiator.frames_in = self.initiator.frames_in.saturating_sub(c.frames);
        if c.frames > 0 && !self.initiator.queued.is_empty() {
            self.initiator.room_freed = true;
        }
        Some(c)
    }

    /// Starts what waited for room under `max_frames_in` (and for its
    /// port), in order, once a command has ended.
    pub(super) fn initiator_window_freed(&mut self, now: Instant) {
        let freed = std::mem::take(&mut self.initiator.room_freed);
        let link_freed = match &self.initiator.budget {
            Some(b) if !self.initiator.queued.is_empty() => {
                let f = b.freed();
                std::mem::replace(&mut self.initiator.seen_freed, f) != f
            }
            _ => false,
        };
        if freed || link_freed {
            self.start_queued(now);
        }
    }

    /// Starts every queued command whose port is ready and that fits
    /// under `max_frames_in`, in order: a command waits while an earlier
    /// one for its port waits, and no command that brings frames back
    /// overtakes one waiting for room.
    fn start_queued(&mut self, now: Instant) {
        let queued = std::mem::take(&mut self.initiator.queued);
        let mut keep = VecDeque::new();
        let mut held: Vec<Wwn> = Vec::new();
        let mut full = false;
        for mut q in queued {
            if held.contains(&q.target) {
                // Behind an earlier command for its port. If the port is
                // back, `fast_io_fail` no longer bounds the wait: only the
                // command's own timeout does, as for the one ahead.
                if q.wait_until < q.deadline && self.ready_port_by_name(q.target).is_some() {
                    q.wait_until = q.deadline;
                }
                keep.push_back(q);
                continue;
            }
            let Some(peer) = self.ready_port_by_name(q.target) else {
                // Waiting for its port again: out of the link's line, so
                // that it holds up no other port's commands.
                q.ticket = None;
                q.for_window = false;
                held.push(q.target);
                keep.push_back(q);
                continue;
            };
            let frames = q.work.frames_in(self.initiator.frame_data);
            let room = if full && frames > 0 {
                Err(())
            } else {
                self.initiator.room(frames, q.ticket.as_ref())
            };
            let Ok(room) = room else {
                full = true;
                q.for_window = true;
                q.wait_until = q.deadline;
                if q.ticket.is_none() {
                    q.ticket = self.initiator.ticket(frames);
                }
                held.push(q.target);
                keep.push_back(q);
                continue;
            };
            drop(q.ticket.take());
            self.start(now, q.id, peer, q.work, q.deadline, room);
        }
        // `start` queues nothing, so nothing was added meanwhile.
        keep.extend(std::mem::take(&mut self.initiator.queued));
        self.initiator.queued = keep;
    }

    /// An exchange that ended abnormally: its OX_ID is held and recovered
    /// with RRQ.
    fn recover(&mut self, now: Instant, peer: FcId, ox: OxId, rx: RxId, rrq: bool) {
        self.xm.hold_ox(now, ox);
        if rrq {
            self.send_rrq(now, peer, ox, rx);
        }
    }

    pub(super) fn initiator_xfer_rdy(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let Some(c) = self.initiator.cmds.get_mut(&h.ox_id) else {
            self.stats.discarded += 1;
            return;
        };
        if c.peer != h.s_id || c.aborting.is_some() {
            self.stats.discarded += 1;
            return;
        }
        c.rx = h.rx_id;
        let Ok(x) = XferRdy::new_checked(&frame.payload[..]).map(|v| XferRdyRepr::parse(&v)) else {
            self.send_abts(now, h.ox_id, AbortReason::Timeout);
            return;
        };
        let Kind::Scsi {
            data_out,
            write_len,
            ..
        } = &c.kind
        else {
            self.stats.discarded += 1;
            return;
        };
        let end = x.data_ro.checked_add(x.burst_len);
        if x.burst_len == 0 || end.is_none_or(|e| e > *write_len) {
            // The target asked for data the command does not have.
            let (id, peer, rx) = (c.id, c.peer, c.rx);
            self.take_cmd(h.ox_id);
            self.complete(
                id,
                Err(InitiatorError::Protocol(
                    "FCP_XFER_RDY outside the data-out",
                )),
            );
            let route = Route {
                s_id: self.fc_id,
                d_id: peer,
                ox_id: h.ox_id,
                rx_id: rx,
            };
            self.send(compose::abts(route, false));
            self.recover(now, peer, h.ox_id, rx, false);
            return;
        }
        let pieces = slices(data_out, x.data_ro as usize, x.burst_len as usize);
        let (peer, rx) = (c.peer, c.rx);
        let max = self
            .remotes
            .get(&peer)
            .map_or(2048, |r| usize::from(r.rx_size))
            .max(256);
        let seq = self.next_seq_id();
        let mut ro = x.data_ro as usize;
        let end = ro + x.burst_len as usize;
        let mut cnt: u16 = 0;
        for p in pieces {
            let mut off = 0;
            while off < p.len() {
                let n = (p.len() - off).min(max);
                let last = ro + n == end;
                let mut f = FCtl(FCtl::RELATIVE_OFFSET);
                if last {
                    f = f.with(FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE, true);
                }
                let h2 = FcHeaderRepr {
                    r_ctl: RCtl::FCP_DATA,
                    d_id: peer,
                    cs_ctl: 0,
                    s_id: self.fc_id,
                    fc_type: FcType::FCP,
                    f_ctl: f,
                    seq_id: seq,
                    df_ctl: 0,
                    seq_cnt: cnt,
                    ox_id: h.ox_id,
                    rx_id: rx,
                    parameter: ro as u32,
                };
                self.send(Frame::new(h2, p.slice(off..off + n)));
                cnt = cnt.wrapping_add(1);
                off += n;
                ro += n;
            }
        }
    }

    pub(super) fn initiator_data(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let Some(c) = self.initiator.cmds.get_mut(&h.ox_id) else {
            self.stats.discarded += 1;
            return;
        };
        if c.peer != h.s_id {
            self.stats.discarded += 1;
            return;
        }
        c.rx = h.rx_id;
        let Kind::Scsi {
            read_len,
            data_in,
            in_order,
            scattered,
            received,
            ..
        } = &mut c.kind
        else {
            self.stats.discarded += 1;
            return;
        };
        let len = frame.payload.len() as u64;
        if len == 0 {
            // Carries nothing; kept, a flood of them would cost memory.
            self.stats.discarded += 1;
            return;
        }
        let ro = if h.f_ctl.relative_offset_present() {
            u64::from(h.parameter)
        } else {
            *received
        };
        // Past the end, or more bytes than the command reads (offsets sent
        // twice): a target breaking the data protocol. Or scattered out
        // of order so finely that the pieces would outgrow the data.
        let why = if ro + len > u64::from(*read_len) || *received + len > u64::from(*read_len) {
            Some("data-in beyond the expected length")
        } else if ro != *in_order && scattered.len() >= max_scattered(*read_len) {
            Some("data-in scattered out of order too finely")
        } else {
            None
        };
        if let Some(why) = why {
            // Answer now; the abort only recovers the exchange.
            let (id, before) = (c.id, c.aborting.take());
            self.initiator.by_id.remove(&id);
            if let Some((AbortReason::Tmf(tid), _)) = before {
                self.tmf_done(tid, Ok(TmfResponse::FunctionComplete));
            }
            self.send_abts(now, h.ox_id, AbortReason::Abandoned);
            if !matches!(before, Some((AbortReason::Abandoned, _))) {
                self.complete(id, Err(InitiatorError::Protocol(why)));
            }
            return;
        }
        *received += len;
        if ro == *in_order {
            if data_in.is_empty() {
                // Room for the whole transfer in frames like this one (a
                // MiB is 512 of them), so the list does not grow nine
                // times; capped, since the frame size is the peer's.
                let frames = u64::from(*read_len).div_ceil(len).min(1024);
                data_in.reserve(frames as usize);
            }
            *in_order += len;
            data_in.push(frame.payload, GATHER_BELOW);
        } else {
            scattered.push((ro as u32, frame.payload));
        }
    }

    pub(super) fn initiator_response(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let ok = self
            .initiator
            .cmds
            .get(&h.ox_id)
            .is_some_and(|c| c.peer == h.s_id);
        if !ok {
            self.stats.discarded += 1;
            return;
        }
        let Some(c) = self.take_cmd(h.ox_id) else {
            return;
        };
        self.xm.close_ox(h.ox_id);
        if let Some((AbortReason::Abandoned, _)) = c.aborting {
            return;
        }
        let rsp = match FcpRspRepr::parse(&frame.payload) {
            Ok(r) => r,
            Err(_) => {
                let e = InitiatorError::Protocol("malformed FCP_RSP");
                match c.kind {
                    Kind::Scsi { .. } => self.complete(c.id, Err(e)),
                    Kind::Tmf { .. } => self.tmf_done(c.id, Err(e)),
                }
                return;
            }
        };
        if let Some((AbortReason::Tmf(tid), _)) = c.aborting {
            // The answer overtook the ABORT TASK: the task had ended.
            self.tmf_done(tid, Ok(TmfResponse::FunctionComplete));
        }
        match c.kind {
            Kind::Tmf { function } => {
                let code = rsp.rsp_code().unwrap_or(FcpRspCode::COMPLETE);
                let outcome = tmf_response(code);
                let success = matches!(
                    outcome,
                    Ok(TmfResponse::FunctionComplete | TmfResponse::FunctionSucceeded)
                );
                if success {
                    self.tmf_aborted_commands(now, c.peer, c.lun, c.id, function);
                }
                self.tmf_done(c.id, outcome);
            }
            Kind::Scsi {
                read_len,
                write_len,
                mut data_in,
                scattered,
                ..
            } => {
                if let Some(code) = rsp.rsp_code()
                    && code != FcpRspCode::COMPLETE
                {
                    self.complete(c.id, Err(InitiatorError::ServiceResponse(code.0)));
                    return;
                }
                let Some(data_in) = merge_data_in(data_in.take(), scattered) else {
                    self.complete(c.id, Err(InitiatorError::Protocol("data-in with a gap")));
                    return;
                };
                let flags = rsp.flags;
                let residual = if flags.contains(FcpRspFlags::RESID_OVER) {
                    Some(Residual::Overflow(rsp.resid))
                } else if flags.contains(FcpRspFlags::RESID_UNDER) {
                    Some(Residual::Underflow(rsp.resid))
                } else {
                    None
                };
                let _ = (read_len, write_len);
                let result = TaskResult {
                    status: Status(rsp.scsi_status),
                    sense: (!rsp.sense.is_empty()).then_some(rsp.sense),
                    data_in,
                    residual,
                    aborted: false,
                };
                self.complete(c.id, Ok(result));
            }
        }
    }

    /// A task management function succeeded: the commands it ended at
    /// the target end here, before the function's completion.
    fn tmf_aborted_commands(
        &mut self,
        now: Instant,
        peer: FcId,
        lun: Lun,
        tmf: u64,
        f: TmfFunction,
    ) {
        let hit: Vec<OxId> = self
            .initiator
            .cmds
            .iter()
            .filter(|(_, c)| c.peer == peer && c.id < tmf && matches!(c.kind, Kind::Scsi { .. }))
            .filter(|(_, c)| f == TmfFunction::TargetReset || c.lun == lun)
            .map(|(ox, _)| *ox)
            .collect();
        for ox in hit {
            if let Some(c) = self.take_cmd(ox) {
                self.xm.hold_ox(now, ox);
                if !matches!(c.aborting, Some((AbortReason::Abandoned, _))) {
                    self.complete(c.id, Err(InitiatorError::Aborted));
                }
            }
        }
    }

    /// BA_ACC or BA_RJT to our ABTS.
    pub(super) fn initiator_abts_answer(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let known = self
            .initiator
            .cmds
            .get(&h.ox_id)
            .is_some_and(|c| c.peer == h.s_id && c.aborting.is_some());
        if !known {
            self.stats.discarded += 1;
            return;
        }
        let Some(c) = self.take_cmd(h.ox_id) else {
            return;
        };
        let accepted = h.r_ctl == RCtl::BA_ACC;
        self.recover(now, c.peer, h.ox_id, c.rx, accepted);
        self.abort_finished(c);
    }

    fn abort_finished(&mut self, c: Cmd) {
        let Some((reason, _)) = c.aborting else {
            return;
        };
        let timeout = self.initiator.timeout;
        match reason {
            AbortReason::Abandoned => {}
            AbortReason::Timeout => match c.kind {
                Kind::Scsi { .. } => {
                    self.complete(c.id, Err(InitiatorError::Timeout { after: timeout }))
                }
                Kind::Tmf { .. } => {
                    self.tmf_done(c.id, Err(InitiatorError::Timeout { after: timeout }))
                }
            },
            AbortReason::Tmf(tid) => {
                self.complete(c.id, Err(InitiatorError::Aborted));
                self.tmf_done(tid, Ok(TmfResponse::FunctionComplete));
            }
        }
    }

    /// The target aborted one of our exchanges.
    pub(super) fn initiator_abts_from_target(&mut self, now: Instant, h: &FcHeaderRepr) {
        let known = self
            .initiator
            .cmds
            .get(&h.ox_id)
            .is_some_and(|c| c.peer == h.s_id);
        if !known {
            self.ba_rjt(h);
            return;
        }
        let acc = crate::wire::bls::BlsRepr::BaAcc(crate::wire::bls::BaAcc {
            seq_id_validity: 0,
            last_seq_id: 0,
            ox_id: h.ox_id,
            rx_id: h.rx_id,
            low_seq_cnt: 0,
            high_seq_cnt: 0xffff,
        });
        if let Ok(f) = compose::bls_reply(Route::reply_to(h, h.rx_id), &acc, false) {
            self.send(f);
        }
        if let Some(c) = self.take_cmd(h.ox_id) {
            self.xm.hold_ox(now, h.ox_id);
            let e = InitiatorError::Protocol("the target aborted the exchange");
            match (c.aborting, c.kind) {
                (Some((AbortReason::Abandoned, _)), _) => {}
                (Some((AbortReason::Tmf(tid), _)), _) => {
                    self.complete(c.id, Err(InitiatorError::Aborted));
                    self.tmf_done(tid, Ok(TmfResponse::FunctionComplete));
                }
                (_, Kind::Scsi { .. }) => self.complete(c.id, Err(e)),
                (_, Kind::Tmf { .. }) => self.tmf_done(c.id, Err(e)),
            }
        }
    }

    /// A target port completed process login: send what waited for it.
    pub(super) fn initiator_port_ready(&mut self, now: Instant, peer: FcId) {
        let Some(name) = self.remotes.get(&peer).map(|r| r.port_name) else {
            return;
        };
        self.initiator.lost.remove(&name);
        self.start_queued(now);
    }

    /// The port is going away: commands still waiting for their target
    /// port end with [`InitiatorError::Disconnected`]. (Commands in flight
    /// end with their peers, at logout or link down.)
    pub fn end_waiting_commands(&mut self) {
        for q in std::mem::take(&mut self.initiator.queued) {
            self.fail(q.id, &q.work, InitiatorError::Disconnected);
        }
    }

    /// A target port went away: its commands end.
    pub(super) fn initiator_port_gone(&mut self, now: Instant, peer: FcId) {
        let gone: Vec<OxId> = self
            .initiator
            .cmds
            .iter()
            .filter(|(_, c)| c.peer == peer)
            .map(|(ox, _)| *ox)
            .collect();
        for ox in gone {
            if let Some(c) = self.take_cmd(ox) {
                self.xm.hold_ox(now, ox);
                match (c.aborting, c.kind) {
                    (Some((AbortReason::Abandoned, _)), _) => {}
                    (Some((AbortReason::Tmf(tid), _)), _) => {
                        self.complete(c.id, Err(InitiatorError::Aborted));
                        self.tmf_done(tid, Ok(TmfResponse::FunctionComplete));
                    }
                    (_, Kind::Scsi { .. }) => {
                        self.complete(c.id, Err(InitiatorError::Disconnected))
                    }
                    (_, Kind::Tmf { .. }) => self.tmf_done(c.id, Err(InitiatorError::Disconnected)),
                }
            }
        }
    }

    pub(super) fn initiator_timeouts(&mut self, now: Instant) {
        // Commands still waiting for their port.
        let mut keep = VecDeque::new();
        let mut late = Vec::new();
        for q in self.initiator.queued.drain(..) {
            if q.wait_until <= now {
                late.push(q);
            } else {
                keep.push_back(q);
            }
        }
        self.initiator.queued = keep;
        for q in late {
            // Waiting for room, or behind a command that does, with its
            // port logged in: a timeout, not a port that never came.
            let e = if q.for_window || self.ready_port_by_name(q.target).is_some() {
                InitiatorError::Timeout {
                    after: self.initiator.timeout,
                }
            } else {
                self.not_logged_in(now, q.target, q.wait_until < q.deadline)
            };
            self.fail(q.id, &q.work, e);
        }
        // Commands past their timeout, and aborts without an answer.
        let due: Vec<(OxId, bool)> = self
            .initiator
            .cmds
            .iter()
            .filter_map(|(ox, c)| match c.aborting {
                None if c.deadline <= now => Some((*ox, false)),
                Some((_, d)) if d <= now => Some((*ox, true)),
                _ => None,
            })
            .collect();
        for (ox, abort_expired) in due {
            if abort_expired {
                if let Some(c) = self.take_cmd(ox) {
                    self.xm.hold_ox(now, ox);
                    self.abort_finished(c);
                }
            } else {
                self.send_abts(now, ox, AbortReason::Timeout);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lost-port memory is bounded: beyond the limit the longest-lost
    /// port is forgotten, and a port that is lost again moves up.
    #[test]
    fn lost_ports_are_bounded_and_the_oldest_goes_first() {
        let mut cfg = super::super::NPortConfig::new(Wwn(0x2100_0000_0000_0001), Wwn(1));
        cfg.initiator = true;
        cfg.fast_io_fail = Some(Duration::from_secs(5));
        let mut p = NPort::new(cfg);
        let t0 = Instant::now();
        let name = |k: u64| Wwn(0x2200_0000_0000_0000 + k);
        for k in 0..MAX_LOST_PORTS as u64 {
            p.initiator_port_lost(t0 + Duration::from_millis(k), name(k));
        }
        // Port 0 is lost again: it is now the newest.
        p.initiator_port_lost(t0 + Duration::from_secs(10), name(0));
        assert_eq!(p.initiator.lost.len(), MAX_LOST_PORTS);
        p.initiator_port_lost(t0 + Duration::from_secs(11), name(9999));
        assert_eq!(p.initiator.lost.len(), MAX_LOST_PORTS);
        assert!(
            !p.initiator.lost.contains_key(&name(1)),
            "the longest-lost goes"
        );
        assert!(p.initiator.lost.contains_key(&name(0)));
        assert!(p.initiator.lost.contains_key(&name(9999)));
        // Without fast_io_fail nothing is kept.
        let mut q = NPort::new(super::super::NPortConfig::new(Wwn(2), Wwn(3)));
        q.initiator_port_lost(t0, name(1));
        assert!(q.initiator.lost.is_empty());
    }

    #[test]
    fn slicing_never_copies_and_covers_the_range() {
        let a = Bytes::from_static(b"0123456789");
        let b = Bytes::from_static(b"abcdef");
        let v = slices(&[a.clone(), b], 8, 5);
        assert_eq!(v.len(), 2);
        assert_eq!(&v[0][..], b"89");
        assert_eq!(&v[1][..], b"abc");
        assert_eq!(v[0].as_ptr(), a[8..].as_ptr());
        assert!(slices(&[a], 10, 3).is_empty());
    }

    #[test]
    fn data_in_is_put_in_offset_order_and_gaps_or_overlaps_are_refused() {
        let b = |s: &'static [u8]| Bytes::from_static(s);
        let joined = |v: Option<Vec<Bytes>>| v.map(|v| v.concat());
        // In order: the list is the result, untouched.
        let v = merge_data_in(vec![b(b"ab"), b(b"cd")], Vec::new());
        assert_eq!(joined(v), Some(b"abcd".to_vec()));
        // The second piece first, then the first.
        let v = merge_data_in(vec![b(b"ab")], vec![(2, b(b"cd"))]);
        assert_eq!(joined(v), Some(b"abcd".to_vec()));
        let v = merge_data_in(
            Vec::new(),
            vec![(4, b(b"ef")), (2, b(b"cd")), (0, b(b"ab"))],
        );
        assert_eq!(joined(v), Some(b"abcdef".to_vec()));
        // A gap: bytes 2..4 never came.
        assert_eq!(merge_data_in(vec![b(b"ab")], vec![(4, b(b"ef"))]), None);
        assert_eq!(merge_data_in(Vec::new(), vec![(2, b(b"cd"))]), None);
        // An overlap: bytes 1..3 twice.
        assert_eq!(merge_data_in(vec![b(b"abc")], vec![(1, b(b"bc"))]), None);
    }
}
