//! The target side of a full-feature-phase iSCSI connection, sans-IO
//! (RFC 7143 §4.2 – §4.4, §7, §11, error recovery level 0).
//!
//! [`Session`] takes received PDUs ([`Session::handle_frame`]), results of
//! SCSI tasks and task management functions the driver ran
//! ([`Session::complete_task`], [`Session::complete_tmf`]) and the time
//! ([`Session::handle_timeout`]). It produces PDUs to send
//! ([`Session::poll_transmit`]) and work for the driver
//! ([`Session::poll_event`]). It owns no socket, clock or task.
//!
//! What it enforces:
//! - the CmdSN window: non-immediate commands outside
//!   `[ExpCmdSN, MaxCmdSN]` or duplicates are silently ignored (§4.2.2.1);
//!   commands reach the logical unit in CmdSN order, except that a SIMPLE
//!   command need not wait for an older command still collecting its data
//!   (SAM-5 allows SIMPLE tasks to run in any order);
//! - the window is the configured queue depth minus the commands not yet
//!   completed, so a peer cannot queue more than the depth;
//! - immediate data, unsolicited Data-Out, FirstBurstLength, R2Ts bounded by
//!   MaxBurstLength and MaxOutstandingR2T, DataSN and Buffer Offset order,
//!   and a per-session budget of write data held in memory (R2Ts are the
//!   flow control: none is sent beyond the budget);
//! - Data-In segmented by the initiator's MaxRecvDataSegmentLength and
//!   MaxBurstLength, status collapsed into the last Data-In when GOOD,
//!   residual overflow/underflow;
//! - task management with the RFC's answers for tasks already completed
//!   ("Task does not exist") and never a response for an aborted task; at
//!   most [`MAX_PENDING_TMFS`] functions waiting at once (TMFs take no slot
//!   of the CmdSN window, and immediate ones no CmdSN at all);
//! - NOP-Out/NOP-In both ways with a dead-peer timeout, logout, and a
//!   Reject for every malformed PDU.

use crate::ffp::{DataSegment, FfpParams, RESERVED_TAG, sn_le, sn_lt};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tracing::{debug, trace};

use unifab_scsi_core::gather::Gathered;
use unifab_scsi_core::idmap::{IdMap, IdSet};
use unifab_scsi_core::{
    Cdb, ItNexus, Lun, Residual, Sense, SenseKey, Status, Task, TaskAttr, TaskResult, TmfFunction,
    TmfRequest, TmfResponse, sense::asc,
};

use crate::wire::{
    Ahs, DataIn, LogoutReason, LogoutResponse, NopIn, Pdu, PduFrame, R2t, Reject, RejectReason,
    ScsiCommand, ScsiResponse, TaskAttrCode, TaskMgmtRequest, TaskMgmtResponse, TmfCode,
    TmfResponseCode, WireError,
};

/// Limits the target sets for one session, whatever was negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Commands that may be outstanding (the CmdSN window).
    pub queue_depth: u32,
    /// Immediate (I bit) commands that may be outstanding besides.
    pub max_immediate: u32,
    /// Largest Expected Data Transfer Length accepted for one command.
    pub max_transfer_length: u32,
    /// Write data the session may hold in memory at once; R2Ts wait when
    /// it is used up.
    pub write_buffer_budget: u64,
    /// Idle time before the target pings with a NOP-In (`None`: never).
    pub nop_in_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is dropped.
    /// With the defaults (30 s, then 60 s, as SPDK's target) an initiator
    /// that does not read its socket for a minute (libiscsi's test tool
    /// sleeps 60 s between TEST UNIT READYs while a SANITIZE runs) is
    /// answered when it wakes, not dropped at the very moment it does.
    pub nop_in_timeout: Duration,
    /// How long a Logout may wait for outstanding tasks.
    pub logout_timeout: Duration,
    /// Holding answers back while many commands are in progress.
    pub coalescing: Coalescing,
}

/// Response coalescing, the target's interrupt moderation: while at least
/// `responses` commands are in progress on a connection, the answers of
/// those that finish are held until `responses` of them are ready or the
/// first has waited `max_delay`, and then go out in one write. The host
/// then handles a batch per wake-up and sends its next commands as a
/// batch too. Anything that is not an answer (an R2T, a NOP-In, a
/// reject, a task management response) sends everything queued at once.
/// A connection with fewer commands in progress is never held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// Commands in progress from which answers are held, and how many
    /// make a batch (0: never hold).
    pub responses: u32,
    /// The longest an answer is held.
    pub max_delay: Duration,
}

impl Coalescing {
    /// Never hold an answer.
    pub const OFF: Coalescing = Coalescing {
        responses: 0,
        max_delay: Duration::ZERO,
    };
}

impl Default for Coalescing {
    fn default() -> Self {
        Coalescing {
            responses: 16,
            max_delay: Duration::from_millis(1),
        }
    }
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            queue_depth: 128,
            max_immediate: 16,
            max_transfer_length: 16 << 20,
            write_buffer_budget: 64 << 20,
            nop_in_interval: Some(Duration::from_secs(30)),
            nop_in_timeout: Duration::from_secs(60),
            logout_timeout: Duration::from_secs(30),
            coalescing: Coalescing::default(),
        }
    }
}

/// A PDU for the driver to send: header fields, AHS and data slices. The
/// driver adds digests and padding (see [`crate::wire::encode_header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPdu {
    /// The header.
    pub pdu: Pdu,
    /// The data segment.
    pub data: DataSegment,
}

/// Work for the driver.
#[derive(Debug)]
pub enum Event {
    /// Run this task on the session's SCSI target, then call
    /// [`Session::complete_task`] with `itt` and the result.
    Execute {
        /// Key for [`Session::complete_task`].
        itt: u32,
        /// The task.
        task: Task,
    },
    /// Run this task management function, then call
    /// [`Session::complete_tmf`] with `itt` and the response.
    TaskManagement {
        /// Key for [`Session::complete_tmf`].
        itt: u32,
        /// The request.
        request: TmfRequest,
    },
    /// A whole Text Request (continuations already gathered) arrived in
    /// full-feature phase; answer with [`Session::text_response`].
    Text {
        /// The request's ITT.
        itt: u32,
        /// The complete text.
        data: Bytes,
    },
    /// The initiator asked a target cold reset: after the response is sent,
    /// drop every session of the target.
    TargetColdReset,
    /// Close the connection once every queued PDU has been sent.
    Close(CloseReason),
}

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// Logout completed.
    Logout,
    /// The peer stopped answering NOP-In pings.
    PingTimeout,
    /// A protocol error that loses framing or trust.
    Protocol(String),
}

#[derive(Debug)]
enum Phase {
    /// Write data still arriving.
    Collecting(Box<Collect>),
    /// Data complete; waiting its turn to reach the LU.
    Ready,
    /// Handed to the LU.
    Executing,
}

#[derive(Debug)]
struct Collect {
    /// The data in buffer-offset order, segments shorter than
    /// [`COALESCE_BELOW`] copied together; `received` is its total.
    segments: Gathered,
    received: u32,
    /// Unsolicited sequence in progress (TTT = 0xffffffff) and its next DataSN.
    unsolicited_open: bool,
    unsolicited_data_sn: u32,
    /// End of the unsolicited region.
    unsolicited_end: u32,
    /// Outstanding R2Ts: TTT -> (offset, length, next expected DataSN, bytes received).
    r2ts: Vec<OutstandingR2t>,
    /// Offset from which the next R2T solicits.
    next_r2t_offset: u32,
}

#[derive(Debug, Clone, Copy)]
struct OutstandingR2t {
    ttt: u32,
    offset: u32,
    length: u32,
    data_sn: u32,
    received: u32,
}

#[derive(Debug)]
struct TaskEntry {
    cmd_sn: u32,
    immediate: bool,
    lun: u64,
    attr: TaskAttr,
    cdb: Cdb,
    read_len: u32,
    write_len: u32,
    phase: Phase,
    /// R2TSN / Data-In DataSN numbering (shared for bidirectional).
    next_r2t_sn: u32,
    /// A task management function aborts this task: send no response.
    abort_pending: bool,
    /// Data collected, for `Ready` tasks.
    data_out: Vec<Bytes>,
    /// Bytes of the session's write budget this task holds (solicited or
    /// received write data), released when the task ends.
    budget_held: u64,
}

#[derive(Debug)]
struct PendingTmf {
    request: TaskMgmtRequest,
    /// Tasks the TMF waits for (they are aborted but their futures have not
    /// resolved yet).
    waiting_tasks: IdSet<u32>,
    /// The LU's response, once it came.
    lu_response: Option<TmfResponse>,
    /// Whether the LU was asked at all.
    lu_asked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Active,
    /// Logout received: no new commands; respond when tasks are done.
    LoggingOut {
        itt: u32,
        deadline: Instant,
    },
    Closed,
}

/// The target side of one full-feature-phase connection (one connection
/// per session: MaxConnections is negotiated to 1).
#[derive(Debug)]
pub struct Session {
    nexus: ItNexus,
    params: FfpParams,
    limits: SessionLimits,
    cid: u16,
    state: State,

    stat_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    /// Non-immediate commands received and not yet completed.
    outstanding: u32,
    /// Immediate commands received and not yet completed.
    outstanding_immediate: u32,
    /// Commands that arrived ahead of ExpCmdSN (a command lost to a data
    /// digest error, or a misbehaving initiator), held until the gap
    /// fills; bounded by the window in number and, with what they carry
    /// (`ahead_bytes`), by the write budget in bytes.
    ahead: BTreeMap<u32, PduFrame>,
    /// Bytes of the PDUs in `ahead`.
    ahead_bytes: u64,

    tasks: IdMap<u32, TaskEntry>,
    /// ITTs in CmdSN order not yet handed to the LU.
    undelivered: VecDeque<u32>,
    ttt_to_itt: IdMap<u32, u32>,
    next_ttt: u32,
    budget_used: u64,
    /// Tasks waiting for budget to send their R2Ts, in arrival order.
    r2t_waiters: VecDeque<u32>,
    /// ITTs recently ended early (failed data phase, aborted): late
    /// Data-Out for them is dropped without a Reject.
    recently_ended: VecDeque<u32>,

    tmfs: IdMap<u32, PendingTmf>,

    /// A Text Request arriving in pieces (C bit): its ITT and text so far.
    text_in: Option<(u32, BytesMut)>,
    /// A Text Response too long for one PDU: ITT, TTT and what is left.
    text_out: Option<(u32, u32, Bytes)>,

    last_activity: Instant,
    ping: Option<(u32, Instant)>,

    outbox: VecDeque<OutPdu>,
    events: VecDeque<Event>,
}

/// The result of feeding a PDU to the session.
pub type HandleResult = Result<(), SessionError>;

/// Errors that end the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The connection was already closed.
    #[error("connection closed")]
    Closed,
    /// A framing-level error: the stream cannot be trusted.
    #[error("wire error: {0}")]
    Wire(#[from] WireError),
}

const RECENTLY_ENDED_MAX: usize = 256;

/// Data-Out segments shorter than this are copied together instead of
/// kept as slices of the receive buffer. The write budget counts data
/// bytes; a peer sending a write's data one byte per Data-Out would
/// otherwise make a session hold a slice entry (32 bytes) per data byte,
/// and each tiny slice would keep a whole receive buffer alive. Normal
/// Data-Outs are far longer and stay zero-copy.
const COALESCE_BELOW: usize = 2048;

impl Collect {
    /// Takes a Data-Out segment, in buffer-offset order.
    fn push(&mut self, data: Bytes) {
        self.segments.push(data, COALESCE_BELOW);
    }

    /// Every segment, in order.
    fn take(&mut self) -> Vec<Bytes> {
        self.segments.take()
    }
}

/// Task management functions one session may have waiting for the logical
/// unit at once. A TMF takes no slot of the CmdSN window (and an immediate
/// one no CmdSN), so without a bound a peer could keep any number waiting
/// (on a remote LU each is a round trip). Past it, an immediate TMF is
/// rejected ("too many immediate commands", RFC 7143 §11.17.1) and a
/// non-immediate one, whose CmdSN is already spent, answered "Function
/// rejected".
pub const MAX_PENDING_TMFS: usize = 64;

impl Session {
    /// A session entering full-feature phase after login.
    ///
    /// `exp_cmd_sn` is the CmdSN the initiator will use next (the final
    /// Login Request's CmdSN), `stat_sn` the next StatSN to assign (one past
    /// the final Login Response's).
    pub fn new(
        nexus: ItNexus,
        cid: u16,
        params: FfpParams,
        limits: SessionLimits,
        exp_cmd_sn: u32,
        stat_sn: u32,
        now: Instant,
    ) -> Session {
        let queue_depth = limits.queue_depth.max(1);
        Session {
            nexus,
            params,
            limits: SessionLimits {
                queue_depth,
                ..limits
            },
            cid,
            state: State::Active,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn: exp_cmd_sn.wrapping_add(queue_depth - 1),
            outstanding: 0,
            outstanding_immediate: 0,
            ahead: BTreeMap::new(),
            ahead_bytes: 0,
            tasks: IdMap::default(),
            undelivered: VecDeque::new(),
            ttt_to_itt: IdMap::default(),
            next_ttt: 1,
            budget_used: 0,
            r2t_waiters: VecDeque::new(),
            recently_ended: VecDeque::new(),
            tmfs: IdMap::default(),
            text_in: None,
            text_out: None,
            last_activity: now,
            ping: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The I_T nexus of this session.
    pub fn nexus(&self) -> &ItNexus {
        &self.nexus
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &FfpParams {
        &self.params
    }

    /// Tasks known to the session (collecting data, queued or executing).
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// ExpCmdSN and MaxCmdSN as last advertised.
    pub fn cmd_window(&self) -> (u32, u32) {
        (self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// True once the session has nothing more to do.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Next PDU to send.
    pub fn poll_transmit(&mut self) -> Option<OutPdu> {
        self.outbox.pop_front()
    }

    /// Number of PDUs queued for sending.
    pub fn transmit_queue_len(&self) -> usize {
        self.outbox.len()
    }

    /// Next piece of work for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Session::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |d: Instant| t = Some(t.map_or(d, |c| c.min(d)));
        match self.ping {
            Some((_, deadline)) => consider(deadline),
            None => {
                if let Some(iv) = self.limits.nop_in_interval {
                    consider(self.last_activity + iv);
                }
            }
        }
        if let State::LoggingOut { deadline, .. } = self.state {
            consider(deadline);
        }
        t
    }

    /// Advances timers: sends NOP-In pings, ends a dead connection, and
    /// forces a logout that waited too long.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::Closed {
            return;
        }
        if let State::LoggingOut { itt, deadline } = self.state
            && now >= deadline
        {
            debug!(?self.nexus, "logout waited too long for tasks; closing");
            self.finish_logout(itt);
            return;
        }
        match self.ping {
            Some((_, deadline)) if now >= deadline => {
                debug!(?self.nexus, "NOP-In ping unanswered; dropping connection");
                self.close(CloseReason::PingTimeout);
            }
            Some(_) => {}
            None => {
                if let Some(iv) = self.limits.nop_in_interval
                    && now >= self.last_activity + iv
                    && self.state == State::Active
                {
                    let ttt = self.alloc_ttt();
                    self.ping = Some((ttt, now + self.limits.nop_in_timeout));
                    let pdu = Pdu::NopIn(NopIn {
                        lun: 0,
                        itt: RESERVED_TAG,
                        ttt,
                        // A ping does not advance StatSN (§11.19.2.3).
                        stat_sn: self.stat_sn,
                        exp_cmd_sn: self.exp_cmd_sn,
                        max_cmd_sn: self.max_cmd_sn,
                    });
                    self.outbox.push_back(OutPdu {
                        pdu,
                        data: DataSegment::None,
                    });
                }
            }
        }
    }

    /// Feeds one received PDU.
    pub fn handle_frame(&mut self, now: Instant, frame: PduFrame) -> HandleResult {
        if self.state == State::Closed {
            return Err(SessionError::Closed);
        }
        self.last_activity = now;
        let pdu = match frame.parse() {
            Ok(p) => p,
            Err(WireError::UnknownOpcode(op)) => {
                debug!(opcode = op, "unknown opcode");
                self.reject(RejectReason::COMMAND_NOT_SUPPORTED, &frame.bhs);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        trace!(?pdu, data = frame.data.len(), "rx");
        match pdu {
            Pdu::ScsiCommand(cmd) => self.on_command(cmd, frame),
            Pdu::DataOut(d) => self.on_data_out(d, frame),
            Pdu::NopOut(n) => self.on_nop_out(n, frame),
            Pdu::TaskMgmtRequest(t) => self.on_tmf(t, frame),
            Pdu::TextRequest(t) => self.on_text(t, frame),
            Pdu::LogoutRequest(l) => self.on_logout(now, l, frame),
            Pdu::SnackRequest(_) => {
                // No SNACK at ErrorRecoveryLevel 0 (§11.16).
                self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
            }
            Pdu::LoginRequest(_) => {
                // A Login Request in full-feature phase is a protocol error.
                self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
            }
            // Target opcodes arriving at a target.
            _ => self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs),
        }
        Ok(())
    }

    /// A PDU arrived whose data digest did not match (the framer consumed
    /// it; `bhs` is its header). RFC 7143 §7.8 at ERL 0: Reject it with
    /// "Data Digest Error"; a command or Data-Out it belonged to ends with
    /// CHECK CONDITION (ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR), and
    /// the CmdSN it carried is consumed so the window does not stall.
    pub fn handle_digest_error(&mut self, now: Instant, bhs: Bytes) -> HandleResult {
        if self.state == State::Closed {
            return Err(SessionError::Closed);
        }
        self.last_activity = now;
        let parsed = crate::wire::Bhs::new_checked(&bhs[..])
            .ok()
            .and_then(|h| Pdu::parse(&h).ok());
        self.reject(RejectReason::DATA_DIGEST_ERROR, &bhs);
        let crc_error = || {
            TaskResult::check_condition(Sense::new(
                SenseKey::ABORTED_COMMAND,
                unifab_scsi_core::Asc(0x47, 0x05),
            ))
        };
        match parsed {
            Some(Pdu::DataOut(d)) if self.tasks.contains_key(&d.itt) => {
                self.fail_task(d.itt, crc_error());
            }
            Some(Pdu::ScsiCommand(c)) => {
                if !c.immediate && c.cmd_sn == self.exp_cmd_sn {
                    self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
                    self.update_max_cmd_sn();
                }
                if !self.tasks.contains_key(&c.itt) {
                    let result = crc_error();
                    let (read_len, write_len) = (
                        if c.read {
                            c.expected_data_transfer_length
                        } else {
                            0
                        },
                        if c.write {
                            c.expected_data_transfer_length
                        } else {
                            0
                        },
                    );
                    let entry = TaskEntry {
                        cmd_sn: c.cmd_sn,
                        immediate: c.immediate,
                        lun: c.lun,
                        attr: TaskAttr::Simple,
                        cdb: Cdb::new(Bytes::new()),
                        read_len,
                        write_len,
                        phase: Phase::Ready,
                        next_r2t_sn: 0,
                        abort_pending: false,
                        data_out: Vec::new(),
                        budget_held: 0,
                    };
                    self.note_ended(c.itt);
                    self.send_result(c.itt, &entry, result);
                }
                self.drain_ahead();
            }
            Some(Pdu::NopOut(n))
                if !n.immediate && n.itt != RESERVED_TAG && n.cmd_sn == self.exp_cmd_sn =>
            {
                self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
                self.update_max_cmd_sn();
            }
            Some(Pdu::TextRequest(t)) if !t.immediate && t.cmd_sn == self.exp_cmd_sn => {
                self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
                self.update_max_cmd_sn();
            }
            _ => {}
        }
        Ok(())
    }

    /// Handles the result of a task run for [`Event::Execute`].
    pub fn complete_task(&mut self, itt: u32, result: TaskResult) {
        let Some(entry) = self.tasks.remove(&itt) else {
            return;
        };
        self.release_slot(&entry);
        self.update_max_cmd_sn();
        let mut silent = entry.abort_pending || result.aborted;
        if self.state == State::Closed {
            silent = true;
        }
        // A TMF waiting on this task learns it ended.
        let tmf_keys: Vec<u32> = self
            .tmfs
            .iter()
            .filter(|(_, t)| t.waiting_tasks.contains(&itt))
            .map(|(k, _)| *k)
            .collect();
        for k in tmf_keys {
            if let Some(t) = self.tmfs.get_mut(&k) {
                t.waiting_tasks.remove(&itt);
            }
            self.maybe_finish_tmf(k);
        }
        if silent {
            self.note_ended(itt);
        } else {
            self.send_result(itt, &entry, result);
        }
        self.after_completion();
    }

    /// Handles the response of a function run for [`Event::TaskManagement`].
    pub fn complete_tmf(&mut self, itt: u32, response: TmfResponse) {
        if let Some(t) = self.tmfs.get_mut(&itt) {
            t.lu_response = Some(response);
            self.maybe_finish_tmf(itt);
        }
    }

    /// Answers an [`Event::Text`]. A response longer than the initiator's
    /// MaxRecvDataSegmentLength goes out in pieces (C bit, a TTT the
    /// initiator returns in empty Text Requests to get the next piece).
    pub fn text_response(&mut self, itt: u32, data: Bytes) {
        self.text_out = None;
        self.send_text_piece(itt, data);
    }

    fn send_text_piece(&mut self, itt: u32, mut data: Bytes) {
        let max = self.params.max_xmit_data_segment_length.max(512) as usize;
        let (piece, more) = if data.len() > max {
            let piece = data.split_to(max);
            (piece, true)
        } else {
            (data.split_to(data.len()), false)
        };
        let ttt = if more { self.alloc_ttt() } else { RESERVED_TAG };
        if more {
            self.text_out = Some((itt, ttt, data));
        }
        let pdu = Pdu::TextResponse(crate::wire::TextResponse {
            final_flag: !more,
            continue_flag: more,
            lun: 0,
            itt,
            ttt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        });
        self.outbox.push_back(OutPdu {
            pdu,
            data: if piece.is_empty() {
                DataSegment::None
            } else {
                DataSegment::One(piece)
            },
        });
    }

    /// Queues an Asynchronous Message asking the initiator to log out
    /// within `seconds` (graceful shutdown, §11.9.1 AsyncEvent 1).
    pub fn request_logout(&mut self, seconds: u16) {
        if self.state != State::Active {
            return;
        }
        let pdu = Pdu::AsyncMessage(crate::wire::AsyncMessage {
            lun: 0,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            event: crate::wire::AsyncEvent::LOGOUT_REQUEST,
            vcode: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: seconds,
        });
        self.outbox.push_back(OutPdu {
            pdu,
            data: DataSegment::None,
        });
    }

    /// The connection is gone (socket error, reinstatement): every task is
    /// ended without a response. The driver reports I_T nexus loss to the
    /// SCSI target separately.
    pub fn abort_all(&mut self) {
        for e in self.tasks.values_mut() {
            e.abort_pending = true;
        }
        self.outbox.clear();
        self.state = State::Closed;
    }

    // ----- commands -------------------------------------------------------

    fn on_command(&mut self, cmd: ScsiCommand, frame: PduFrame) {
        if !self.accept_cmd_sn(cmd.immediate, cmd.cmd_sn, &frame) {
            return;
        }
        self.process_command(cmd, frame);
        self.drain_ahead();
    }

    /// CmdSN window rules (§4.2.2.1). Returns true when the command is to be
    /// processed now (ExpCmdSN has been advanced for it).
    fn accept_cmd_sn(&mut self, immediate: bool, cmd_sn: u32, frame: &PduFrame) -> bool {
        if immediate {
            return true;
        }
        if cmd_sn == self.exp_cmd_sn {
            if !sn_le(cmd_sn, self.max_cmd_sn) {
                debug!(
                    cmd_sn,
                    max = self.max_cmd_sn,
                    "CmdSN beyond MaxCmdSN; ignored"
                );
                return false;
            }
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            return true;
        }
        if sn_lt(self.exp_cmd_sn, cmd_sn) && sn_le(cmd_sn, self.max_cmd_sn) {
            // What waits here is data in memory the write budget does not
            // otherwise see (a command is charged when it is processed):
            // it shares the budget with the writes in progress. A command
            // that does not fit, like one past a full window, is not kept;
            // the initiator's recovery for the gap resends it.
            let len = pdu_bytes(frame);
            let fits = self.ahead.len() < self.limits.queue_depth as usize
                && self.budget_used + self.ahead_bytes + len <= self.limits.write_buffer_budget;
            if fits && !self.ahead.contains_key(&cmd_sn) {
                // The headers copied, so that a PDU waiting here does not
                // keep the receive buffer they came in alive (the data
                // segment is already its own or a large share of it).
                let kept = PduFrame {
                    bhs: Bytes::copy_from_slice(&frame.bhs),
                    ahs: Bytes::copy_from_slice(&frame.ahs),
                    data: frame.data.clone(),
                };
                self.ahead.insert(cmd_sn, kept);
                self.ahead_bytes += len;
            } else if !fits {
                debug!(
                    cmd_sn,
                    held = self.ahead.len(),
                    held_bytes = self.ahead_bytes,
                    "command ahead of ExpCmdSN not kept: no room"
                );
            }
            return false;
        }
        debug!(
            cmd_sn,
            exp = self.exp_cmd_sn,
            max = self.max_cmd_sn,
            "CmdSN outside the window; silently ignored (RFC 7143 §4.2.2.1)"
        );
        false
    }

    fn drain_ahead(&mut self) {
        while let Some(frame) = self.ahead.remove(&self.exp_cmd_sn) {
            self.ahead_bytes = self.ahead_bytes.saturating_sub(pdu_bytes(&frame));
            self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
            match frame.parse() {
                Ok(Pdu::ScsiCommand(c)) => self.process_command(c, frame),
                Ok(Pdu::TaskMgmtRequest(t)) => self.process_tmf(t, frame),
                Ok(Pdu::TextRequest(t)) => self.process_text(t, frame),
                Ok(Pdu::NopOut(n)) => self.process_nop_out(n, frame),
                Ok(Pdu::LogoutRequest(_)) | Ok(_) | Err(_) => {
                    self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
                }
            }
        }
    }

    fn process_command(&mut self, cmd: ScsiCommand, frame: PduFrame) {
        if let State::LoggingOut { .. } = self.state {
            // §11.14: no new commands after a logout request.
            self.reject(RejectReason::WAITING_FOR_LOGOUT, &frame.bhs);
            return;
        }
        if cmd.itt == RESERVED_TAG {
            self.reject(RejectReason::INVALID_PDU_FIELD, &frame.bhs);
            return;
        }
        if self.tasks.contains_key(&cmd.itt) {
            self.reject(RejectReason::TASK_IN_PROGRESS, &frame.bhs);
            return;
        }
        if cmd.immediate && self.outstanding_immediate >= self.limits.max_immediate {
            self.reject(RejectReason::IMMEDIATE_COMMAND_REJECT, &frame.bhs);
            return;
        }

        // AHS: extended CDB and bidirectional read length.
        let mut cdb_bytes: Option<Bytes> = None;
        let mut bidi_read: Option<u32> = None;
        if !frame.ahs.is_empty() {
            let Ok(list) = Ahs::parse_all(&frame.ahs) else {
                self.reject(RejectReason::INVALID_PDU_FIELD, &frame.bhs);
                return;
            };
            for a in list {
                if let Some(ext) = a.extended_cdb_bytes() {
                    let mut v = BytesMut::with_capacity(16 + ext.len());
                    v.extend_from_slice(&cmd.cdb);
                    v.extend_from_slice(&ext);
                    cdb_bytes = Some(v.freeze());
                } else if let Some(len) = a.bidi_read_expected_length() {
                    bidi_read = Some(len);
                }
            }
        }
        // A copy, not a slice of the BHS: the task may wait a long time (for
        // its data, or its turn in CmdSN order), and a slice would keep the
        // whole receive buffer it came in alive meanwhile.
        let cdb = Cdb::new(cdb_bytes.unwrap_or_else(|| Bytes::copy_from_slice(&cmd.cdb)));

        let edtl = cmd.expected_data_transfer_length;
        let (read_len, write_len) = match (cmd.read, cmd.write) {
            (true, true) => (bidi_read.unwrap_or(0), edtl),
            (true, false) => (edtl, 0),
            (false, true) => (0, edtl),
            (false, false) => (0, 0),
        };
        let imm_len = frame.data.len() as u32;

        // Protocol checks on the data that came with the command.
        let bad = if imm_len > 0 && !cmd.write {
            Some("immediate data without the W bit")
        } else if imm_len > 0 && !self.params.immediate_data {
            Some("immediate data when ImmediateData=No")
        } else if imm_len > self.params.first_burst_length.min(write_len) {
            Some("immediate data beyond FirstBurstLength or EDTL")
        } else if !cmd.final_flag && (self.params.initial_r2t || !cmd.write) {
            Some("F=0 (unsolicited data follows) when InitialR2T=Yes or no W bit")
        } else {
            None
        };
        if let Some(why) = bad {
            debug!(itt = cmd.itt, why, "rejecting SCSI Command");
            self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
            return;
        }

        let attr = match cmd.attr {
            TaskAttrCode::ORDERED => TaskAttr::Ordered,
            TaskAttrCode::HEAD_OF_QUEUE => TaskAttr::HeadOfQueue,
            TaskAttrCode::ACA => TaskAttr::Aca,
            _ => TaskAttr::Simple,
        };

        if cmd.immediate {
            self.outstanding_immediate += 1;
        } else {
            self.outstanding += 1;
        }

        let mut entry = TaskEntry {
            cmd_sn: cmd.cmd_sn,
            immediate: cmd.immediate,
            lun: cmd.lun,
            attr,
            cdb,
            read_len,
            write_len,
            phase: Phase::Ready,
            next_r2t_sn: 0,
            abort_pending: false,
            data_out: Vec::new(),
            budget_held: 0,
        };

        if edtl > self.limits.max_transfer_length {
            // Refuse before taking any data: the LU never sees it.
            debug!(
                itt = cmd.itt,
                edtl, "transfer length over the session limit"
            );
            self.tasks.insert(cmd.itt, entry);
            let sense = Sense::new(SenseKey::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB);
            self.fail_task(cmd.itt, TaskResult::check_condition(sense));
            return;
        }

        if write_len > 0 {
            let unsolicited_end = if self.params.initial_r2t {
                imm_len
            } else {
                self.params.first_burst_length.min(write_len)
            };
            let mut segments = Gathered::default();
            if imm_len > 0 {
                segments.push(frame.data.clone(), COALESCE_BELOW);
            }
            let collect = Collect {
                segments,
                received: imm_len,
                unsolicited_open: !cmd.final_flag,
                unsolicited_data_sn: 0,
                unsolicited_end,
                r2ts: Vec::new(),
                next_r2t_offset: imm_len,
            };
            entry.budget_held = u64::from(imm_len);
            self.budget_used += u64::from(imm_len);
            entry.phase = Phase::Collecting(Box::new(collect));
        }
        self.tasks.insert(cmd.itt, entry);
        self.undelivered.push_back(cmd.itt);
        self.progress_collect(cmd.itt);
        self.try_deliver();
    }

    /// After data arrives or budget frees: issue R2Ts or mark Ready.
    fn progress_collect(&mut self, itt: u32) {
        let Some(entry) = self.tasks.get_mut(&itt) else {
            return;
        };
        let write_len = entry.write_len;
        let lun = entry.lun;
        let TaskEntry {
            phase,
            budget_held,
            next_r2t_sn,
            data_out,
            ..
        } = entry;
        let Phase::Collecting(c) = phase else {
            return;
        };
        if c.received >= write_len && c.r2ts.is_empty() && !c.unsolicited_open {
            *data_out = c.take();
            *phase = Phase::Ready;
            return;
        }
        if c.unsolicited_open {
            return; // R2Ts follow the unsolicited sequence.
        }
        let solicited_from = c.unsolicited_end.max(c.received).min(write_len);
        if c.next_r2t_offset < solicited_from {
            c.next_r2t_offset = solicited_from;
        }
        let mut waiting = false;
        while c.next_r2t_offset < write_len
            && (c.r2ts.len() as u32) < self.params.max_outstanding_r2t.max(1)
        {
            let len = (write_len - c.next_r2t_offset).min(self.params.max_burst_length.max(512));
            let need = u64::from(len);
            // When the session holds no write data at all, a burst may go
            // ahead even if it alone exceeds the budget: no deadlock.
            if self.budget_used + need > self.limits.write_buffer_budget && self.budget_used > 0 {
                waiting = true;
                break;
            }
            self.budget_used += need;
            *budget_held += need;
            let mut ttt = self.next_ttt;
            while ttt == RESERVED_TAG || self.ttt_to_itt.contains_key(&ttt) {
                ttt = ttt.wrapping_add(1);
            }
            self.next_ttt = ttt.wrapping_add(1);
            self.ttt_to_itt.insert(ttt, itt);
            let r2t = OutstandingR2t {
                ttt,
                offset: c.next_r2t_offset,
                length: len,
                data_sn: 0,
                received: 0,
            };
            c.r2ts.push(r2t);
            c.next_r2t_offset += len;
            let r2t_sn = *next_r2t_sn;
            *next_r2t_sn = next_r2t_sn.wrapping_add(1);
            let pdu = Pdu::R2t(R2t {
                lun,
                itt,
                ttt,
                // R2T carries the next StatSN without advancing it.
                stat_sn: self.stat_sn,
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn,
                r2t_sn,
                buffer_offset: r2t.offset,
                desired_data_transfer_length: len,
            });
            self.outbox.push_back(OutPdu {
                pdu,
                data: DataSegment::None,
            });
        }
        if waiting && !self.r2t_waiters.contains(&itt) {
            self.r2t_waiters.push_back(itt);
        }
    }

    fn on_data_out(&mut self, d: crate::wire::DataOut, frame: PduFrame) {
        let len = frame.data.len() as u32;
        let Some(entry) = self.tasks.get_mut(&d.itt) else {
            if self.recently_ended.contains(&d.itt) {
                trace!(itt = d.itt, "late Data-Out for an ended task dropped");
            } else {
                debug!(itt = d.itt, "Data-Out for an unknown ITT");
                self.reject(RejectReason::INVALID_PDU_FIELD, &frame.bhs);
            }
            return;
        };
        let TaskEntry {
            phase, budget_held, ..
        } = entry;
        let Phase::Collecting(c) = phase else {
            // Data after all data arrived: more than EDTL.
            self.data_phase_error(d.itt, &frame.bhs, "Data-Out beyond the expected length");
            return;
        };
        // Which sequence does it belong to, and is it the next PDU of it?
        let r2t_pos = c.r2ts.iter().position(|r| r.ttt == d.ttt);
        let error: Option<&'static str> = if d.ttt == RESERVED_TAG {
            if !c.unsolicited_open {
                Some("unsolicited Data-Out not allowed here")
            } else if d.data_sn != c.unsolicited_data_sn {
                Some("DataSN out of order")
            } else if d.buffer_offset != c.received {
                Some("Buffer Offset out of order")
            } else if d.buffer_offset.saturating_add(len) > c.unsolicited_end {
                Some("unsolicited data beyond FirstBurstLength")
            } else {
                None
            }
        } else {
            match r2t_pos.map(|p| c.r2ts[p]) {
                None => Some("TTT matches no outstanding R2T"),
                Some(r) if d.data_sn != r.data_sn => Some("DataSN out of order"),
                Some(r) if d.buffer_offset != r.offset + r.received => {
                    Some("Buffer Offset out of order")
                }
                Some(r) if r.received + len > r.length => Some("data beyond the R2T's length"),
                // R2Ts are answered in order (DataSequenceInOrder=Yes).
                Some(_) if d.buffer_offset != c.received => Some("R2T sequences out of order"),
                Some(r) if d.final_flag && r.received + len != r.length => {
                    Some("F bit before the burst was complete")
                }
                Some(_) => None,
            }
        };
        if let Some(why) = error {
            self.data_phase_error(d.itt, &frame.bhs, why);
            return;
        }
        if len > 0 {
            c.push(frame.data.clone());
            c.received += len;
        }
        match r2t_pos {
            None => {
                c.unsolicited_data_sn = c.unsolicited_data_sn.wrapping_add(1);
                if d.final_flag {
                    c.unsolicited_open = false;
                }
                // Budget for unsolicited data is taken as it arrives.
                *budget_held += u64::from(len);
                self.budget_used += u64::from(len);
            }
            Some(pos) => {
                let r = &mut c.r2ts[pos];
                r.data_sn = r.data_sn.wrapping_add(1);
                r.received += len;
                if d.final_flag {
                    let ttt = r.ttt;
                    c.r2ts.remove(pos);
                    self.ttt_to_itt.remove(&ttt);
                }
            }
        }
        self.progress_collect(d.itt);
        self.try_deliver();
    }

    /// A data-phase protocol error at ERL 0: Reject the PDU and end the task
    /// with CHECK CONDITION (its data cannot be trusted).
    fn data_phase_error(&mut self, itt: u32, bhs: &Bytes, why: &'static str) {
        debug!(itt, why, "data phase error");
        self.reject(RejectReason::PROTOCOL_ERROR, bhs);
        let sense = Sense::new(SenseKey::ABORTED_COMMAND, asc::DATA_PHASE_ERROR);
        self.fail_task(itt, TaskResult::check_condition(sense));
    }

    /// Ends a task that never reached the LU with `result`. A task the LU
    /// is running is left alone: it keeps its ITT until the LU answers
    /// ([`Session::complete_task`]), or a new command could take the tag
    /// and be sent the old one's answer. The stray PDU that led here (a
    /// Data-Out after all the data, a Data-Out whose digest failed) has
    /// been rejected; the task ends as the LU says.
    fn fail_task(&mut self, itt: u32, result: TaskResult) {
        if self
            .tasks
            .get(&itt)
            .is_some_and(|e| matches!(e.phase, Phase::Executing))
        {
            debug!(itt, "the LU runs the task; it ends with the LU's answer");
            return;
        }
        let Some(entry) = self.tasks.remove(&itt) else {
            return;
        };
        self.undelivered.retain(|i| *i != itt);
        self.release_slot(&entry);
        self.update_max_cmd_sn();
        self.note_ended(itt);
        if !entry.abort_pending {
            self.send_result(itt, &entry, result);
        }
        self.after_completion();
    }

    /// Frees what a finished task held: its window slot, R2T tags, budget.
    fn release_slot(&mut self, entry: &TaskEntry) {
        if entry.immediate {
            self.outstanding_immediate = self.outstanding_immediate.saturating_sub(1);
        } else {
            self.outstanding = self.outstanding.saturating_sub(1);
        }
        if let Phase::Collecting(c) = &entry.phase {
            for r in &c.r2ts {
                self.ttt_to_itt.remove(&r.ttt);
            }
        }
        self.budget_used = self.budget_used.saturating_sub(entry.budget_held);
    }

    fn after_completion(&mut self) {
        self.update_max_cmd_sn();
        // Freed budget may let waiting writes solicit more data.
        let waiters: Vec<u32> = self.r2t_waiters.drain(..).collect();
        for itt in waiters {
            self.progress_collect(itt);
        }
        self.try_deliver();
        if let State::LoggingOut { itt, .. } = self.state
            && self.tasks.is_empty()
        {
            self.finish_logout(itt);
        }
    }

    fn note_ended(&mut self, itt: u32) {
        if self.recently_ended.len() >= RECENTLY_ENDED_MAX {
            self.recently_ended.pop_front();
        }
        self.recently_ended.push_back(itt);
    }

    fn update_max_cmd_sn(&mut self) {
        let free = self.limits.queue_depth.saturating_sub(self.outstanding);
        let candidate = self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1);
        // MaxCmdSN never moves backwards.
        if sn_lt(self.max_cmd_sn, candidate) {
            self.max_cmd_sn = candidate;
        }
    }

    /// Hands Ready tasks to the LU in CmdSN order. A SIMPLE (or HEAD OF
    /// QUEUE, or immediate) task may pass older tasks that are still
    /// collecting data, unless an older ORDERED task is undelivered.
    fn try_deliver(&mut self) {
        let mut i = 0;
        let mut blocked_by_ordered = false;
        while i < self.undelivered.len() {
            let itt = self.undelivered[i];
            let Some(entry) = self.tasks.get(&itt) else {
                self.undelivered.remove(i);
                continue;
            };
            let ready = matches!(entry.phase, Phase::Ready);
            let head = i == 0;
            let may_pass = !blocked_by_ordered
                && (entry.immediate
                    || matches!(entry.attr, TaskAttr::Simple | TaskAttr::HeadOfQueue));
            if ready && (head || may_pass) {
                self.undelivered.remove(i);
                self.deliver(itt);
                continue;
            }
            if matches!(entry.attr, TaskAttr::Ordered) {
                blocked_by_ordered = true;
            }
            i += 1;
        }
    }

    fn deliver(&mut self, itt: u32) {
        let Some(entry) = self.tasks.get_mut(&itt) else {
            return;
        };
        entry.phase = Phase::Executing;
        let task = Task::new(
            self.nexus.clone(),
            Lun(entry.lun),
            u64::from(itt),
            entry.cdb.clone(),
        )
        .with_attr(entry.attr)
        .with_data_out(std::mem::take(&mut entry.data_out), entry.write_len)
        .with_data_in(entry.read_len);
        self.events.push_back(Event::Execute { itt, task });
    }

    /// Builds the Data-In and/or SCSI Response PDUs for a finished task.
    fn send_result(&mut self, itt: u32, entry: &TaskEntry, result: TaskResult) {
        let read_len = entry.read_len;
        let mut data_in = result.data_in;
        // What the initiator asked for, at most.
        let produced: u64 = data_in.iter().map(|b| b.len() as u64).sum();
        let sendable = produced.min(u64::from(read_len)) as u32;

        let derived_read = {
            let p = u32::try_from(produced).unwrap_or(u32::MAX);
            match p.cmp(&read_len) {
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some(Residual::Overflow(p - read_len)),
                std::cmp::Ordering::Less => Some(Residual::Underflow(read_len - p)),
            }
        };
        // The device server's own residual wins (it knows what a write
        // needed; a pass-through LU reports the remote target's). For a
        // bidirectional command it is the write residual and the read
        // residual is derived from the data.
        let bidi = entry.read_len > 0 && entry.write_len > 0;
        let (main_residual, bidi_residual) = if bidi {
            (result.residual, derived_read)
        } else {
            (result.residual.or(derived_read), None)
        };

        let good = result.status == Status::GOOD && result.sense.is_none();
        truncate_slices(&mut data_in, sendable as usize);

        if sendable > 0 {
            let max_seg = self.params.max_xmit_data_segment_length.max(512) as usize;
            let max_burst = self.params.max_burst_length.max(512) as usize;
            let mut offset = 0usize;
            let total = sendable as usize;
            let mut cursor = SliceCursor::new(data_in);
            let mut burst_used = 0usize;
            // R2TSN and DataSN share numbering for bidirectional commands.
            let mut data_sn = if bidi { entry.next_r2t_sn } else { 0 };
            while offset < total {
                let room_in_burst = max_burst - burst_used;
                let len = (total - offset).min(max_seg).min(room_in_burst);
                let last = offset + len == total;
                let end_of_burst = last || burst_used + len == max_burst;
                let collapse = last && good && !bidi;
                let mut din = DataIn {
                    final_flag: end_of_burst,
                    acknowledge: false,
                    overflow: false,
                    underflow: false,
                    status_present: false,
                    status: 0,
                    lun: entry.lun,
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: 0,
                    exp_cmd_sn: self.exp_cmd_sn,
                    max_cmd_sn: self.max_cmd_sn,
                    data_sn,
                    buffer_offset: offset as u32,
                    residual_count: 0,
                };
                if collapse {
                    din.status_present = true;
                    din.status = result.status.0;
                    din.stat_sn = self.next_stat_sn();
                    match main_residual {
                        Some(Residual::Overflow(n)) => {
                            din.overflow = true;
                            din.residual_count = n;
                        }
                        Some(Residual::Underflow(n)) => {
                            din.underflow = true;
                            din.residual_count = n;
                        }
                        None => {}
                    }
                } else {
                    din.stat_sn = self.stat_sn;
                }
                let data = cursor.take(len);
                self.outbox.push_back(OutPdu {
                    pdu: Pdu::DataIn(din),
                    data,
                });
                data_sn = data_sn.wrapping_add(1);
                offset += len;
                burst_used = if end_of_burst { 0 } else { burst_used + len };
                if collapse {
                    return;
                }
            }
            // Status follows in a SCSI Response; ExpDataSN counts Data-In.
            self.send_scsi_response(
                itt,
                result.status,
                result.sense,
                main_residual,
                bidi_residual,
                data_sn,
            );
        } else {
            self.send_scsi_response(
                itt,
                result.status,
                result.sense,
                main_residual,
                bidi_residual,
                0,
            );
        }
    }

    fn send_scsi_response(
        &mut self,
        itt: u32,
        status: Status,
        sense: Option<Bytes>,
        residual: Option<Residual>,
        bidi_residual: Option<Residual>,
        exp_data_sn: u32,
    ) {
        let mut rsp = ScsiResponse {
            response: 0,
            status: status.0,
            itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            exp_data_sn,
            ..ScsiResponse::default()
        };
        match residual {
            Some(Residual::Overflow(n)) => {
                rsp.overflow = true;
                rsp.residual_count = n;
            }
            Some(Residual::Underflow(n)) => {
                rsp.underflow = true;
                rsp.residual_count = n;
            }
            None => {}
        }
        match bidi_residual {
            Some(Residual::Overflow(n)) => {
                rsp.bidi_overflow = true;
                rsp.bidi_residual_count = n;
            }
            Some(Residual::Underflow(n)) => {
                rsp.bidi_underflow = true;
                rsp.bidi_residual_count = n;
            }
            None => {}
        }
        let data = match sense {
            Some(s) if !s.is_empty() => {
                // SenseLength (2 bytes) + sense data (§11.4.7).
                let n = s.len().min(u16::MAX as usize - 2);
                let mut v = BytesMut::with_capacity(2 + n);
                v.extend_from_slice(&(n as u16).to_be_bytes());
                v.extend_from_slice(&s[..n]);
                DataSegment::One(v.freeze())
            }
            _ => DataSegment::None,
        };
        self.outbox.push_back(OutPdu {
            pdu: Pdu::ScsiResponse(rsp),
            data,
        });
    }

    // ----- NOP ------------------------------------------------------------

    fn on_nop_out(&mut self, n: crate::wire::NopOut, frame: PduFrame) {
        if n.itt == RESERVED_TAG {
            // An answer to our ping: must be immediate and not consume CmdSN.
            if let Some((ttt, _)) = self.ping
                && n.ttt == ttt
            {
                self.ping = None;
            }
            return;
        }
        if !self.accept_cmd_sn(n.immediate, n.cmd_sn, &frame) {
            return;
        }
        self.process_nop_out(n, frame);
        self.drain_ahead();
    }

    fn process_nop_out(&mut self, n: crate::wire::NopOut, frame: PduFrame) {
        if n.ttt != RESERVED_TAG {
            // A NOP-Out with a valid ITT must carry TTT 0xffffffff.
            self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
            return;
        }
        // Echo the ping data (bounded by what we accept and what the
        // initiator accepts).
        let max = self.params.max_xmit_data_segment_length as usize;
        let data = frame.data.slice(..frame.data.len().min(max));
        let pdu = Pdu::NopIn(NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        });
        self.outbox.push_back(OutPdu {
            pdu,
            data: if data.is_empty() {
                DataSegment::None
            } else {
                DataSegment::One(data)
            },
        });
    }

    // ----- text -----------------------------------------------------------

    fn on_text(&mut self, t: crate::wire::TextRequest, frame: PduFrame) {
        if !self.accept_cmd_sn(t.immediate, t.cmd_sn, &frame) {
            return;
        }
        self.process_text(t, frame);
        self.drain_ahead();
    }

    fn process_text(&mut self, t: crate::wire::TextRequest, frame: PduFrame) {
        const MAX_TEXT: usize = 64 * 1024;
        if t.itt == RESERVED_TAG {
            self.reject(RejectReason::INVALID_PDU_FIELD, &frame.bhs);
            return;
        }
        // The initiator asks for the next piece of a long response.
        if t.ttt != RESERVED_TAG {
            match self.text_out.take() {
                Some((itt, ttt, rest)) if itt == t.itt && ttt == t.ttt => {
                    self.send_text_piece(itt, rest);
                }
                _ => self.reject(RejectReason::INVALID_PDU_FIELD, &frame.bhs),
            }
            return;
        }
        // A new request ends any response still being paged out.
        self.text_out = None;
        let mut text = match self.text_in.take() {
            Some((itt, buf)) if itt == t.itt => buf,
            _ => BytesMut::new(),
        };
        if text.len() + frame.data.len() > MAX_TEXT {
            debug!(itt = t.itt, "text request over {MAX_TEXT} bytes");
            self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
            return;
        }
        text.extend_from_slice(&frame.data);
        if t.continue_flag {
            // Acknowledge the piece with an empty, non-final response.
            self.text_in = Some((t.itt, text));
            let ttt = self.alloc_ttt();
            let pdu = Pdu::TextResponse(crate::wire::TextResponse {
                final_flag: false,
                continue_flag: false,
                lun: 0,
                itt: t.itt,
                ttt,
                stat_sn: self.next_stat_sn(),
                exp_cmd_sn: self.exp_cmd_sn,
                max_cmd_sn: self.max_cmd_sn,
            });
            self.outbox.push_back(OutPdu {
                pdu,
                data: DataSegment::None,
            });
            return;
        }
        self.events.push_back(Event::Text {
            itt: t.itt,
            data: text.freeze(),
        });
    }

    // ----- task management -------------------------------------------------

    fn on_tmf(&mut self, t: TaskMgmtRequest, frame: PduFrame) {
        if !self.accept_cmd_sn(t.immediate, t.cmd_sn, &frame) {
            return;
        }
        self.process_tmf(t, frame);
        self.drain_ahead();
    }

    fn process_tmf(&mut self, t: TaskMgmtRequest, frame: PduFrame) {
        if self.tmfs.contains_key(&t.itt) || self.tasks.contains_key(&t.itt) {
            self.reject(RejectReason::TASK_IN_PROGRESS, &frame.bhs);
            return;
        }
        if self.tmfs.len() >= MAX_PENDING_TMFS {
            debug!(
                itt = t.itt,
                immediate = t.immediate,
                "too many TMFs waiting; refused"
            );
            if t.immediate {
                self.reject(RejectReason::IMMEDIATE_COMMAND_REJECT, &frame.bhs);
            } else {
                self.send_tmf_response(t.itt, TmfResponseCode::FUNCTION_REJECTED);
            }
            return;
        }
        let lun = Lun(t.lun);
        let function = match t.function {
            TmfCode::ABORT_TASK => {
                let referenced = t.referenced_task_tag;
                match self.tasks.get(&referenced) {
                    None => {
                        // §11.5.1: a RefCmdSN inside the window that has not
                        // arrived yet is "Function complete"; otherwise the
                        // task is gone (its response was already sent).
                        let response = if sn_le(self.exp_cmd_sn, t.ref_cmd_sn)
                            && sn_le(t.ref_cmd_sn, self.max_cmd_sn)
                            && sn_lt(t.ref_cmd_sn, t.cmd_sn)
                            && !self.ahead.contains_key(&t.ref_cmd_sn)
                        {
                            TmfResponseCode::FUNCTION_COMPLETE
                        } else {
                            TmfResponseCode::TASK_DOES_NOT_EXIST
                        };
                        self.send_tmf_response(t.itt, response);
                        return;
                    }
                    Some(e) if !matches!(e.phase, Phase::Executing) => {
                        // Never reached the LU: end it here, no response.
                        if let Some(e) = self.tasks.get_mut(&referenced) {
                            e.abort_pending = true;
                        }
                        self.fail_task(referenced, TaskResult::aborted());
                        self.send_tmf_response(t.itt, TmfResponseCode::FUNCTION_COMPLETE);
                        return;
                    }
                    Some(e) => {
                        debug!(
                            referenced,
                            cmd_sn = e.cmd_sn,
                            ref_cmd_sn = t.ref_cmd_sn,
                            "ABORT TASK for a running task"
                        );
                        TmfFunction::AbortTask {
                            tag: u64::from(referenced),
                        }
                    }
                }
            }
            TmfCode::ABORT_TASK_SET => TmfFunction::AbortTaskSet,
            TmfCode::CLEAR_TASK_SET => TmfFunction::ClearTaskSet,
            TmfCode::CLEAR_ACA => TmfFunction::ClearAca,
            TmfCode::LOGICAL_UNIT_RESET => TmfFunction::LogicalUnitReset,
            TmfCode::TARGET_WARM_RESET | TmfCode::TARGET_COLD_RESET => TmfFunction::TargetReset,
            TmfCode::I_T_NEXUS_RESET => TmfFunction::ItNexusReset,
            TmfCode::QUERY_TASK => TmfFunction::QueryTask {
                tag: u64::from(t.referenced_task_tag),
            },
            TmfCode::QUERY_TASK_SET => TmfFunction::QueryTaskSet,
            TmfCode::QUERY_ASYNC_EVENT => TmfFunction::QueryAsyncEvent,
            TmfCode::TASK_REASSIGN => {
                // Needs ErrorRecoveryLevel 2 (§11.5.1).
                self.send_tmf_response(
                    t.itt,
                    TmfResponseCode::TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED,
                );
                return;
            }
            _ => {
                self.send_tmf_response(t.itt, TmfResponseCode::NOT_SUPPORTED);
                return;
            }
        };

        // Which of this session's tasks the function ends.
        let affected: Vec<u32> = match function {
            TmfFunction::AbortTask { tag } => vec![tag as u32],
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset => self
                .tasks
                .iter()
                .filter(|(_, e)| e.lun == t.lun)
                .map(|(k, _)| *k)
                .collect(),
            TmfFunction::TargetReset | TmfFunction::ItNexusReset => {
                self.tasks.keys().copied().collect()
            }
            _ => Vec::new(),
        };
        let mut waiting = IdSet::default();
        for itt in affected {
            let executing = match self.tasks.get_mut(&itt) {
                Some(e) => {
                    e.abort_pending = true;
                    matches!(e.phase, Phase::Executing)
                }
                None => continue,
            };
            if executing {
                waiting.insert(itt);
            } else {
                self.fail_task(itt, TaskResult::aborted());
            }
        }
        self.tmfs.insert(
            t.itt,
            PendingTmf {
                request: t,
                waiting_tasks: waiting,
                lu_response: None,
                lu_asked: true,
            },
        );
        self.events.push_back(Event::TaskManagement {
            itt: t.itt,
            request: TmfRequest {
                nexus: self.nexus.clone(),
                lun,
                function,
            },
        });
    }

    fn maybe_finish_tmf(&mut self, itt: u32) {
        let done = match self.tmfs.get(&itt) {
            Some(t) => t.waiting_tasks.is_empty() && (!t.lu_asked || t.lu_response.is_some()),
            None => false,
        };
        if !done {
            return;
        }
        let Some(t) = self.tmfs.remove(&itt) else {
            return;
        };
        let code = match t.lu_response.unwrap_or(TmfResponse::FunctionComplete) {
            TmfResponse::FunctionComplete => TmfResponseCode::FUNCTION_COMPLETE,
            TmfResponse::FunctionSucceeded => TmfResponseCode::FUNCTION_SUCCEEDED,
            TmfResponse::FunctionRejected => TmfResponseCode::FUNCTION_REJECTED,
            TmfResponse::IncorrectLun => TmfResponseCode::LUN_DOES_NOT_EXIST,
            TmfResponse::ServiceDeliveryFailure => TmfResponseCode::FUNCTION_REJECTED,
        };
        // QUERY TASK for a task the LU does not know but this session still
        // collects data for: the task exists.
        let code = match (t.request.function, code) {
            (TmfCode::QUERY_TASK, TmfResponseCode::FUNCTION_COMPLETE)
                if self.tasks.contains_key(&t.request.referenced_task_tag) =>
            {
                TmfResponseCode::FUNCTION_SUCCEEDED
            }
            _ => code,
        };
        self.send_tmf_response(t.request.itt, code);
        // The sessions go only once the response is on its way (the LU's
        // reset may take a round trip, e.g. to a remote LU).
        if t.request.function == TmfCode::TARGET_COLD_RESET {
            self.events.push_back(Event::TargetColdReset);
        }
        self.after_completion();
    }

    fn send_tmf_response(&mut self, itt: u32, response: TmfResponseCode) {
        self.update_max_cmd_sn();
        let pdu = Pdu::TaskMgmtResponse(TaskMgmtResponse {
            response,
            itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        });
        self.outbox.push_back(OutPdu {
            pdu,
            data: DataSegment::None,
        });
    }

    // ----- logout ---------------------------------------------------------

    fn on_logout(&mut self, now: Instant, l: crate::wire::LogoutRequest, frame: PduFrame) {
        if !self.accept_cmd_sn(l.immediate, l.cmd_sn, &frame) {
            return;
        }
        match l.reason {
            LogoutReason::CLOSE_SESSION => {}
            LogoutReason::CLOSE_CONNECTION if l.cid == self.cid => {}
            LogoutReason::CLOSE_CONNECTION => {
                self.send_logout_response(l.itt, 1);
                return;
            }
            LogoutReason::REMOVE_FOR_RECOVERY => {
                // Connection recovery needs ErrorRecoveryLevel 2.
                self.send_logout_response(l.itt, 2);
                return;
            }
            _ => {
                self.reject(RejectReason::PROTOCOL_ERROR, &frame.bhs);
                return;
            }
        }
        self.state = State::LoggingOut {
            itt: l.itt,
            deadline: now + self.limits.logout_timeout,
        };
        // Tasks still collecting data will never get it now: end them.
        let collecting: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, e)| !matches!(e.phase, Phase::Executing))
            .map(|(k, _)| *k)
            .collect();
        for itt in collecting {
            let sense = Sense::new(SenseKey::ABORTED_COMMAND, asc::COMMAND_PHASE_ERROR);
            self.fail_task(itt, TaskResult::check_condition(sense));
        }
        if self.tasks.is_empty() {
            self.finish_logout(l.itt);
        }
    }

    fn finish_logout(&mut self, itt: u32) {
        self.send_logout_response(itt, 0);
        self.close(CloseReason::Logout);
    }

    fn send_logout_response(&mut self, itt: u32, response: u8) {
        let (time2wait, time2retain) = if response == 0 {
            (0, 0)
        } else {
            (
                self.params.default_time2wait,
                self.params.default_time2retain,
            )
        };
        let pdu = Pdu::LogoutResponse(LogoutResponse {
            response,
            itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            time2wait,
            time2retain,
        });
        self.outbox.push_back(OutPdu {
            pdu,
            data: DataSegment::None,
        });
    }

    fn close(&mut self, reason: CloseReason) {
        if self.state == State::Closed {
            return;
        }
        self.state = State::Closed;
        for e in self.tasks.values_mut() {
            e.abort_pending = true;
        }
        self.events.push_back(Event::Close(reason));
    }

    // ----- helpers --------------------------------------------------------

    fn reject(&mut self, reason: RejectReason, bhs: &Bytes) {
        let pdu = Pdu::Reject(Reject {
            reason,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            data_sn: 0,
        });
        // The data segment is the rejected PDU's header, copied: a slice
        // would keep its whole receive buffer alive until the Reject is
        // written.
        let header = Bytes::copy_from_slice(&bhs[..bhs.len().min(crate::wire::BHS_LEN)]);
        self.outbox.push_back(OutPdu {
            pdu,
            data: DataSegment::One(header),
        });
    }

    fn next_stat_sn(&mut self) -> u32 {
        let s = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        s
    }

    fn alloc_ttt(&mut self) -> u32 {
        let mut t = self.next_ttt;
        while t == RESERVED_TAG || self.ttt_to_itt.contains_key(&t) {
            t = t.wrapping_add(1);
        }
        self.next_ttt = t.wrapping_add(1);
        t
    }
}

/// The bytes a received PDU holds in memory.
fn pdu_bytes(frame: &PduFrame) -> u64 {
    (frame.bhs.len() + frame.ahs.len() + frame.data.len()) as u64
}

fn truncate_slices(v: &mut Vec<Bytes>, max: usize) {
    let mut total = 0usize;
    let mut keep = 0usize;
    for b in v.iter_mut() {
        if total >= max {
            break;
        }
        if total + b.len() > max {
            b.truncate(max - total);
        }
        total += b.len();
        keep += 1;
    }
    v.truncate(keep);
}

/// Walks a list of slices handing out segments without copying.
struct SliceCursor {
    slices: VecDeque<Bytes>,
}

impl SliceCursor {
    fn new(v: Vec<Bytes>) -> Self {
        SliceCursor {
            slices: v.into_iter().filter(|b| !b.is_empty()).collect(),
        }
    }

    fn take(&mut self, mut len: usize) -> DataSegment {
        let mut out: Vec<Bytes> = Vec::new();
        while len > 0 {
            let Some(front) = self.slices.front_mut() else {
                break;
            };
            if front.len() <= len {
                len -= front.len();
                if let Some(b) = self.slices.pop_front() {
                    out.push(b);
                }
            } else {
                out.push(front.split_to(len));
                len = 0;
            }
        }
        match out.len() {
            0 => DataSegment::None,
            1 => DataSegment::One(out.pop().unwrap_or_default()),
            _ => DataSegment::Many(out),
        }
    }
}
