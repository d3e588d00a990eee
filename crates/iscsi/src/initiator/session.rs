//! The initiator side of a full-feature-phase iSCSI session, sans-IO
//! (RFC 7143 §3.2, §4.2, §7, §11; error recovery level 0).
//!
//! [`Session`] takes commands and task management functions from its user
//! ([`Session::submit`], [`Session::task_management`]), PDUs from the
//! connection ([`Session::handle_frame`]) and the time
//! ([`Session::handle_timeout`]). It produces PDUs to send
//! ([`Session::poll_transmit`]) and outcomes ([`Session::poll_event`]). It
//! owns no socket, clock or task: the tokio driver in
//! [`super::io`] runs it, and tests run it against the target's sans-IO
//! session with virtual time.
//!
//! A session outlives its connections. [`Session::connected`] starts full
//! feature phase on a freshly logged-in connection (a new session with the
//! same ISID, which reinstates the old one at the target);
//! [`Session::connection_lost`] ends it. Between the two, commands wait.
//!
//! What it does:
//! - commands go out in submission order, as far as the target's
//!   `[ExpCmdSN, MaxCmdSN]` window allows (pipelining);
//! - immediate data (up to FirstBurstLength and the target's
//!   MaxRecvDataSegmentLength), unsolicited Data-Out when InitialR2T=No, and
//!   Data-Out for every R2T, all as slices of the caller's buffers;
//! - Data-In is checked (DataSN, offset, expected length) and kept as the
//!   received slices; the status (collapsed into Data-In or in a SCSI
//!   Response) comes back with its sense and residual unchanged;
//! - task management, with the affected commands ended as
//!   [`InitiatorError::Aborted`] once the target confirms;
//! - NOP-Out pings when the target has been silent for a while, and a dead
//!   peer when one goes unanswered; answers to the target's pings;
//! - every command ends within [`SessionConfig::command_timeout`]: a
//!   command still outstanding then fails with
//!   [`InitiatorError::Timeout`] and is aborted at the target (ABORT TASK;
//!   if that goes unanswered the connection is declared dead, so that
//!   session reinstatement terminates it);
//! - after a connection loss, commands never sent are sent on the next
//!   connection; commands sent but unanswered are sent again if they are
//!   idempotent ([`is_idempotent`]) and have attempts left, else they fail
//!   with [`InitiatorError::Disconnected`]; they go out again before any
//!   newer command and in their original order;
//! - with [`SessionConfig::replacement_timeout`], commands stop waiting for
//!   a connection that long after the last one was lost, and fail with
//!   [`InitiatorError::Unreachable`] (so do new ones until the session is
//!   up again);
//! - a data digest error on Data-In or a SCSI Response fails only that
//!   command, which is sent again when idempotent;
//! - the target's asynchronous logout requests and drop notices.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, trace};

use unifab_scsi_core::gather::Gathered;
use unifab_scsi_core::initiator::{InitiatorError, Outcome, Request, is_idempotent};
use unifab_scsi_core::{
    DataDirection, Lun, Residual, Status, TaskAttr, TaskResult, TmfFunction, TmfResponse,
};

use crate::ffp::{DataSegment, FfpParams, RESERVED_TAG, sn_le, sn_lt};

use crate::wire::{
    Ahs, AsyncEvent, Bhs, DataIn, DataOut, LogoutReason, LogoutRequest, NopIn, NopOut, Opcode, Pdu,
    PduFrame, R2t, Reject, ScsiCommand, ScsiResponse, TaskAttrCode, TaskMgmtRequest,
    TaskMgmtResponse, TmfCode, TmfResponseCode,
};

/// The most commands a session can hold (queued and outstanding).
pub const MAX_COMMANDS: usize = 0x7fff;

/// Behaviour of a session, beyond what login negotiates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Every command ends within this time after [`Session::submit`].
    pub command_timeout: Duration,
    /// How long a task management function may go unanswered before the
    /// connection is declared dead.
    pub tmf_timeout: Duration,
    /// Send a NOP-Out ping after the target has been silent this long
    /// (`None`: never).
    pub nop_interval: Option<Duration>,
    /// A ping unanswered this long means the target is dead.
    pub nop_timeout: Duration,
    /// Most commands held at once (queued plus outstanding), at most
    /// [`MAX_COMMANDS`]; more are refused with [`InitiatorError::QueueFull`].
    pub max_commands: usize,
    /// How many times an idempotent command may be sent in all (1: it is
    /// never sent again after a connection loss).
    pub max_attempts: u8,
    /// How long commands wait for a connection to replace a lost one
    /// (`None`, the default: each waits out its `command_timeout`). Once the
    /// session has been without a connection this long, the commands
    /// waiting fail with [`InitiatorError::Unreachable`], and so does every
    /// command submitted until a connection is up again. The clock starts
    /// when a connection is lost, or when the session is created for its
    /// first one. This is open-iscsi's `replacement_timeout` (and the FC
    /// initiator's `fast_io_fail`): a multipath host hears of a dead path
    /// in seconds rather than after its own SCSI timeout.
    pub replacement_timeout: Option<Duration>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            command_timeout: Duration::from_secs(20),
            tmf_timeout: Duration::from_secs(5),
            nop_interval: Some(Duration::from_secs(5)),
            nop_timeout: Duration::from_secs(5),
            max_commands: 1024,
            max_attempts: 3,
            replacement_timeout: None,
        }
    }
}

/// Sequence numbers at the start of full feature phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartSn {
    /// The CmdSN of the first command (the target's ExpCmdSN).
    pub cmd_sn: u32,
    /// MaxCmdSN from the final Login Response.
    pub max_cmd_sn: u32,
    /// The next StatSN expected.
    pub exp_stat_sn: u32,
}

/// A PDU for the driver to send: header, AHS (empty or a multiple of 4
/// bytes) and data slices. The driver adds padding and digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPdu {
    /// The header.
    pub pdu: Pdu,
    /// The AHS segment.
    pub ahs: Bytes,
    /// The data segment.
    pub data: DataSegment,
}

/// What the session gives back.
#[derive(Debug)]
pub enum Event<T> {
    /// A command ended.
    Command {
        /// The token given to [`Session::submit`].
        token: T,
        /// The target's answer, or why there is none.
        outcome: Outcome,
    },
    /// A task management function ended.
    Tmf {
        /// The token given to [`Session::task_management`].
        token: T,
        /// The target's response.
        result: Result<TmfResponse, InitiatorError>,
    },
    /// [`Session::close`] finished: the session logged out (or had no
    /// connection). Nothing else will happen.
    Closed,
}

/// Why the connection must end. The driver closes it, tells the session
/// with [`Session::connection_lost`] and, unless the session is closed,
/// logs in again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The target broke the protocol in a way that loses the connection.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A NOP-Out ping went unanswered.
    #[error("the target did not answer a ping within the NOP timeout")]
    PeerDead,
    /// A task management function went unanswered.
    #[error("the target did not answer a task management request in time")]
    TmfTimeout,
    /// The target announced it drops the connection or session; log in
    /// again after this many seconds.
    #[error("the target drops the connection (retry after {time2wait} s)")]
    DropRequested {
        /// Seconds to wait before logging in again.
        time2wait: u16,
    },
    /// The logout finished.
    #[error("logged out")]
    LoggedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Sent,
}

/// Data-In segments shorter than this are copied together instead of kept
/// one by one until the command ends: a target sending a read one byte
/// per Data-In would otherwise make the initiator keep an entry and a
/// buffer (~64 bytes) per byte read. Normal segments are far longer and
/// stay as they came.
const GATHER_BELOW: usize = 2048;

#[derive(Debug)]
struct Cmd<T> {
    tag: u64,
    /// `None` once the caller has its outcome (timed out) or dropped it.
    token: Option<T>,
    lun: u64,
    attr: TaskAttrCode,
    cdb: Bytes,
    data_out: Vec<Bytes>,
    data_out_len: u32,
    data_in_len: u32,
    direction: DataDirection,
    deadline: Instant,
    idempotent: bool,
    attempts: u8,
    phase: Phase,
    itt: u32,
    cmd_sn: u32,
    /// Data-In so far, segments shorter than [`GATHER_BELOW`] copied
    /// together.
    data_in: Gathered,
    data_in_got: u32,
    exp_data_sn: u32,
    /// Bytes R2Ts have asked for on this attempt: at ErrorRecoveryLevel 0
    /// no byte is asked for twice, so never more than `data_out_len` (a
    /// target that asks again cannot make the initiator queue data
    /// without bound).
    solicited: u32,
    /// An ABORT TASK for it is outstanding.
    aborting: bool,
    /// Task management asked for it to end (its outcome is Aborted).
    abort_requested: bool,
    /// Data-In was lost to a digest error.
    corrupt: bool,
    /// The target broke the protocol for this command.
    error: Option<&'static str>,
}

#[derive(Debug)]
enum Control<T> {
    Ping {
        deadline: Instant,
    },
    Tmf {
        token: Option<T>,
        function: TmfFunction,
        lun: u64,
        /// The ITT of the command an ABORT TASK / QUERY TASK names.
        referenced: u32,
        /// CmdSN when it was sent: it covers commands sent before.
        cmd_sn: u32,
        /// Sent on the current connection (else it waits for one).
        sent: bool,
        deadline: Instant,
        hard_deadline: Instant,
    },
    Logout {
        deadline: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No connection.
    Down,
    /// Full feature phase.
    Up,
    /// Hold new commands; log out when nothing is outstanding.
    Draining { deadline: Instant },
    /// Logout sent.
    LoggingOut,
    /// Closed for good.
    Closed,
}

/// One initiator session. `T` is the caller's token for each command or
/// task management function (the driver's completion channel).
#[derive(Debug)]
pub struct Session<T> {
    cfg: SessionConfig,
    params: FfpParams,
    state: State,
    closing: bool,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    slots: Vec<Option<Cmd<T>>>,
    free: Vec<u16>,
    live: usize,
    sent: usize,
    next_tag: u64,
    itt_gen: u16,
    queue: VecDeque<u16>,
    tx: VecDeque<OutPdu>,
    control: HashMap<u32, Control<T>>,
    control_gen: u16,
    events: VecDeque<Event<T>>,
    last_rx: Instant,
    ping: Option<u32>,
    /// No command deadline is earlier than this.
    scan_at: Option<Instant>,
    /// Since when the session has had no connection (`None` while up).
    down_since: Option<Instant>,
}

fn attr_code(a: TaskAttr) -> TaskAttrCode {
    match a {
        TaskAttr::Simple => TaskAttrCode::SIMPLE,
        TaskAttr::Ordered => TaskAttrCode::ORDERED,
        TaskAttr::HeadOfQueue => TaskAttrCode::HEAD_OF_QUEUE,
        TaskAttr::Aca => TaskAttrCode::ACA,
    }
}

fn tmf_code(f: TmfFunction) -> TmfCode {
    match f {
        TmfFunction::AbortTask { .. } => TmfCode::ABORT_TASK,
        TmfFunction::AbortTaskSet => TmfCode::ABORT_TASK_SET,
        TmfFunction::ClearAca => TmfCode::CLEAR_ACA,
        TmfFunction::ClearTaskSet => TmfCode::CLEAR_TASK_SET,
        TmfFunction::LogicalUnitReset => TmfCode::LOGICAL_UNIT_RESET,
        TmfFunction::TargetReset => TmfCode::TARGET_WARM_RESET,
        TmfFunction::ItNexusReset => TmfCode::I_T_NEXUS_RESET,
        TmfFunction::QueryTask { .. } => TmfCode::QUERY_TASK,
        TmfFunction::QueryTaskSet => TmfCode::QUERY_TASK_SET,
        TmfFunction::QueryAsyncEvent => TmfCode::QUERY_ASYNC_EVENT,
    }
}

/// Functions that end tasks: once they complete, the tasks they cover are
/// gone at the target.
fn aborts_tasks(f: TmfFunction) -> bool {
    matches!(
        f,
        TmfFunction::AbortTask { .. }
            | TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset
            | TmfFunction::TargetReset
            | TmfFunction::ItNexusReset
    )
}

/// Does a function that ends tasks cover a command on `cmd_lun`?
fn covers(f: TmfFunction, tmf_lun: u64, cmd_lun: u64) -> bool {
    match f {
        TmfFunction::TargetReset | TmfFunction::ItNexusReset => true,
        TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet | TmfFunction::LogicalUnitReset => {
            tmf_lun == cmd_lun
        }
        _ => false,
    }
}

fn tmf_response(code: TmfResponseCode) -> TmfResponse {
    match code {
        TmfResponseCode::FUNCTION_COMPLETE | TmfResponseCode::TASK_DOES_NOT_EXIST => {
            TmfResponse::FunctionComplete
        }
        TmfResponseCode::FUNCTION_SUCCEEDED => TmfResponse::FunctionSucceeded,
        TmfResponseCode::LUN_DOES_NOT_EXIST => TmfResponse::IncorrectLun,
        _ => TmfResponse::FunctionRejected,
    }
}

/// The slices of `data` covering `[offset, offset + len)`.
fn slice_data(data: &[Bytes], offset: u32, len: u32) -> DataSegment {
    let (mut off, mut left) = (offset as usize, len as usize);
    let mut out: Vec<Bytes> = Vec::new();
    let mut first: Option<Bytes> = None;
    for s in data {
        if left == 0 {
            break;
        }
        if off >= s.len() {
            off -= s.len();
            continue;
        }
        let n = (s.len() - off).min(left);
        let piece = s.slice(off..off + n);
        off = 0;
        left -= n;
        match first.take() {
            None if out.is_empty() => first = Some(piece),
            None => out.push(piece),
            Some(f) => {
                out.push(f);
                out.push(piece);
            }
        }
    }
    match (first, out.is_empty()) {
        (Some(f), true) => DataSegment::One(f),
        (None, true) => DataSegment::None,
        (Some(f), false) => {
            out.insert(0, f);
            DataSegment::Many(out)
        }
        (None, false) => DataSegment::Many(out),
    }
}

impl<T> Session<T> {
    /// A session with no connection yet.
    pub fn new(cfg: SessionConfig, now: Instant) -> Session<T> {
        let mut cfg = cfg;
        cfg.max_commands = cfg.max_commands.clamp(1, MAX_COMMANDS);
        cfg.max_attempts = cfg.max_attempts.max(1);
        Session {
            cfg,
            params: FfpParams::default(),
            state: State::Down,
            closing: false,
            cmd_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            exp_stat_sn: 0,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            sent: 0,
            next_tag: 1,
            itt_gen: 0,
            queue: VecDeque::new(),
            tx: VecDeque::new(),
            control: HashMap::new(),
            control_gen: 0,
            events: VecDeque::new(),
            last_rx: now,
            ping: None,
            scan_at: None,
            down_since: Some(now),
        }
    }

    /// When commands stop waiting for a connection: `replacement_timeout`
    /// after the session lost its last one (`None`: up, or no such limit).
    fn replacement_deadline(&self) -> Option<Instant> {
        if self.state != State::Down {
            return None;
        }
        Some(self.down_since? + self.cfg.replacement_timeout?)
    }

    fn replacement_failure(&self) -> InitiatorError {
        InitiatorError::Unreachable {
            reason: format!(
                "no connection to the target for {:?} (replacement_timeout)",
                self.cfg.replacement_timeout.unwrap_or_default()
            ),
        }
    }

    /// Runs [`Session::handle_timeout`]'s command scan no later than `t`.
    fn scan_by(&mut self, t: Instant) {
        self.scan_at = Some(self.scan_at.map_or(t, |s| s.min(t)));
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// The parameters of the current (or last) connection.
    pub fn params(&self) -> &FfpParams {
        &self.params
    }

    /// True in full feature phase on a live connection.
    pub fn is_connected(&self) -> bool {
        matches!(
            self.state,
            State::Up | State::Draining { .. } | State::LoggingOut
        )
    }

    /// True once the session has closed for good.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// True after [`Session::close`].
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Commands held (queued or outstanding).
    pub fn command_count(&self) -> usize {
        self.live
    }

    /// Commands sent and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.sent
    }

    /// The next CmdSN, ExpCmdSN and MaxCmdSN.
    pub fn cmd_window(&self) -> (u32, u32, u32) {
        (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// The next PDU to send.
    pub fn poll_transmit(&mut self) -> Option<OutPdu> {
        let mut out = self.tx.pop_front()?;
        let e = self.exp_stat_sn;
        match &mut out.pdu {
            Pdu::ScsiCommand(p) => p.exp_stat_sn = e,
            Pdu::DataOut(p) => p.exp_stat_sn = e,
            Pdu::NopOut(p) => p.exp_stat_sn = e,
            Pdu::TaskMgmtRequest(p) => p.exp_stat_sn = e,
            Pdu::LogoutRequest(p) => p.exp_stat_sn = e,
            _ => {}
        }
        Some(out)
    }

    /// PDUs waiting to be sent.
    pub fn transmit_queue_len(&self) -> usize {
        self.tx.len()
    }

    /// The next outcome.
    pub fn poll_event(&mut self) -> Option<Event<T>> {
        self.events.pop_front()
    }

    // ---- the user's side -------------------------------------------------

    /// Queues a command. Returns its tag, or the error and the token back.
    pub fn submit(
        &mut self,
        now: Instant,
        request: Request,
        token: T,
    ) -> Result<u64, (InitiatorError, T)> {
        if self.closing || self.state == State::Closed {
            return Err((InitiatorError::Closed, token));
        }
        if let Err(e) = request.validate() {
            return Err((e, token));
        }
        if self.live >= self.cfg.max_commands {
            return Err((InitiatorError::QueueFull, token));
        }
        let replaced_by = self.replacement_deadline();
        if replaced_by.is_some_and(|t| t <= now) {
            return Err((self.replacement_failure(), token));
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = self.slots.len();
                self.slots.push(None);
                s as u16
            }
        };
        let tag = (self.next_tag << 16) | u64::from(slot);
        self.next_tag += 1;
        let deadline = now + self.cfg.command_timeout;
        let idempotent = is_idempotent(request.cdb.as_bytes());
        let direction = request.direction();
        self.slots[usize::from(slot)] = Some(Cmd {
            tag,
            token: Some(token),
            lun: request.lun.0,
            attr: attr_code(request.attr),
            cdb: request.cdb.bytes().clone(),
            data_out: request.data_out,
            data_out_len: request.data_out_len,
            data_in_len: request.data_in_len,
            direction,
            deadline,
            idempotent,
            attempts: 0,
            phase: Phase::Queued,
            itt: RESERVED_TAG,
            cmd_sn: 0,
            data_in: Gathered::default(),
            data_in_got: 0,
            exp_data_sn: 0,
            solicited: 0,
            aborting: false,
            abort_requested: false,
            corrupt: false,
            error: None,
        });
        self.live += 1;
        if self.scan_at.is_none() {
            self.scan_at = Some(deadline);
        }
        if let Some(t) = replaced_by {
            self.scan_by(t);
        }
        self.queue.push_back(slot);
        self.pump();
        Ok(tag)
    }

    /// The caller no longer wants the command's outcome (it dropped its
    /// future): a queued command is forgotten, an outstanding one is
    /// aborted at the target.
    pub fn abandon(&mut self, now: Instant, tag: u64) {
        let Some(slot) = self.slot_of_tag(tag) else {
            return;
        };
        let Some(cmd) = self.cmd_mut(slot) else {
            return;
        };
        cmd.token = None;
        if cmd.phase == Phase::Queued {
            self.queue.retain(|&s| s != slot);
            self.free_slot(slot);
        } else {
            self.send_abort(now, slot);
        }
    }

    /// Runs a task management function; its response comes back as
    /// [`Event::Tmf`] with `token`. Tags in [`TmfFunction::AbortTask`] and
    /// [`TmfFunction::QueryTask`] are those [`Session::submit`] returned.
    pub fn task_management(&mut self, now: Instant, lun: Lun, function: TmfFunction, token: T) {
        if self.state == State::Closed {
            self.events.push_back(Event::Tmf {
                token,
                result: Err(InitiatorError::Closed),
            });
            return;
        }
        let rfc7144 = matches!(
            function,
            TmfFunction::QueryTask { .. }
                | TmfFunction::QueryTaskSet
                | TmfFunction::QueryAsyncEvent
                | TmfFunction::ItNexusReset
        );
        if rfc7144 && self.params.protocol_level < 2 && self.is_connected() {
            // The target did not negotiate iSCSIProtocolLevel 2.
            self.events.push_back(Event::Tmf {
                token,
                result: Ok(TmfResponse::FunctionRejected),
            });
            return;
        }
        let mut referenced = RESERVED_TAG;
        let mut ref_cmd_sn = 0;
        match function {
            TmfFunction::AbortTask { tag } | TmfFunction::QueryTask { tag } => {
                let query = matches!(function, TmfFunction::QueryTask { .. });
                let found = self
                    .slot_of_tag(tag)
                    .and_then(|s| self.cmd_ref(s).map(|c| (s, c.phase, c.itt, c.cmd_sn)));
                match found {
                    None => {
                        self.events.push_back(Event::Tmf {
                            token,
                            result: Ok(TmfResponse::FunctionComplete),
                        });
                        return;
                    }
                    Some((slot, Phase::Queued, ..)) => {
                        let result = if query {
                            TmfResponse::FunctionSucceeded
                        } else {
                            self.queue.retain(|&s| s != slot);
                            self.finish(slot, Err(InitiatorError::Aborted));
                            TmfResponse::FunctionComplete
                        };
                        self.events.push_back(Event::Tmf {
                            token,
                            result: Ok(result),
                        });
                        return;
                    }
                    Some((slot, Phase::Sent, itt, sn)) => {
                        if !query && let Some(c) = self.cmd_mut(slot) {
                            c.abort_requested = true;
                        }
                        referenced = itt;
                        ref_cmd_sn = sn;
                    }
                }
            }
            f if aborts_tasks(f) => {
                // Queued commands it covers end here; they never left.
                let lun = lun.0;
                let victims: Vec<u16> = self
                    .queue
                    .iter()
                    .copied()
                    .filter(|&s| self.cmd_ref(s).is_some_and(|c| covers(f, lun, c.lun)))
                    .collect();
                for s in victims {
                    self.queue.retain(|&q| q != s);
                    self.finish(s, Err(InitiatorError::Aborted));
                }
            }
            _ => {}
        }
        let up = self.is_connected();
        if let Some(t) = self.replacement_deadline() {
            if t <= now {
                let result = Err(self.replacement_failure());
                self.events.push_back(Event::Tmf { token, result });
                return;
            }
            self.scan_by(t);
        }
        let itt = self.control_itt();
        self.control.insert(
            itt,
            Control::Tmf {
                token: Some(token),
                function,
                lun: lun.0,
                referenced,
                cmd_sn: self.cmd_sn,
                sent: up,
                deadline: now + self.cfg.tmf_timeout,
                hard_deadline: now + self.cfg.command_timeout,
            },
        );
        if up {
            self.push_tmf(itt, function, lun.0, referenced, ref_cmd_sn);
        }
    }

    /// Closes the session: commands already submitted still end, later ones
    /// fail with [`InitiatorError::Closed`], then it logs out and emits
    /// [`Event::Closed`].
    pub fn close(&mut self, now: Instant) {
        if self.closing {
            return;
        }
        self.closing = true;
        match self.state {
            State::Down => {
                // Nothing can be sent any more: fail what is queued.
                while let Some(s) = self.queue.pop_front() {
                    self.finish(s, Err(InitiatorError::Closed));
                }
                self.fail_controls(InitiatorError::Closed);
                self.state = State::Closed;
                self.events.push_back(Event::Closed);
            }
            State::Up => {
                self.state = State::Draining {
                    deadline: now + self.cfg.command_timeout,
                };
                self.maybe_logout(now);
            }
            State::Draining { .. } | State::LoggingOut | State::Closed => {}
        }
    }

    // ---- the connection's side -------------------------------------------

    /// Full feature phase begins on a new connection.
    pub fn connected(&mut self, now: Instant, params: FfpParams, sn: StartSn) {
        if self.state == State::Closed {
            return;
        }
        self.params = params;
        self.cmd_sn = sn.cmd_sn;
        self.exp_cmd_sn = sn.cmd_sn;
        self.max_cmd_sn = sn.max_cmd_sn;
        self.exp_stat_sn = sn.exp_stat_sn;
        self.last_rx = now;
        self.ping = None;
        self.tx.clear();
        self.state = State::Up;
        self.down_since = None;
        // Functions that waited for a connection: the reinstatement ended
        // every task of the old session, which is what they asked for.
        let waiting: Vec<u32> = self
            .control
            .iter()
            .filter(|(_, c)| matches!(c, Control::Tmf { sent: false, .. }))
            .map(|(i, _)| *i)
            .collect();
        for itt in waiting {
            if let Some(Control::Tmf {
                token, function, ..
            }) = self.control.remove(&itt)
            {
                let result = if aborts_tasks(function) {
                    Ok(TmfResponse::FunctionComplete)
                } else {
                    Err(InitiatorError::Disconnected)
                };
                if let Some(token) = token {
                    self.events.push_back(Event::Tmf { token, result });
                }
            }
        }
        if self.closing {
            self.state = State::Draining {
                deadline: now + self.cfg.command_timeout,
            };
        }
        self.pump();
        self.maybe_logout(now);
    }

    /// The connection ended (or the login for it failed after
    /// [`Session::connected`]). Outstanding commands are sent again later
    /// where that is safe; the rest fail.
    pub fn connection_lost(&mut self, now: Instant) {
        if matches!(self.state, State::Down | State::Closed) {
            return;
        }
        let was_logging_out = self.state == State::LoggingOut;
        self.state = State::Down;
        self.down_since = Some(now);
        if let Some(t) = self.replacement_deadline() {
            self.scan_by(t);
        }
        self.tx.clear();
        self.ping = None;
        let mut resend: Vec<(u32, u16)> = Vec::new();
        for i in 0..self.slots.len() {
            let slot = i as u16;
            let Some(c) = self.cmd_ref(slot) else {
                continue;
            };
            if c.phase != Phase::Sent {
                continue;
            }
            if c.token.is_none() {
                self.free_slot(slot);
            } else if c.abort_requested {
                self.finish(slot, Err(InitiatorError::Aborted));
            } else if c.idempotent && c.attempts < self.cfg.max_attempts {
                resend.push((c.cmd_sn, slot));
            } else {
                self.finish(slot, Err(InitiatorError::Disconnected));
            }
        }
        // Back to the front of the queue, oldest CmdSN first.
        if let Some(&(base, _)) = resend.first() {
            let base = resend
                .iter()
                .map(|r| r.0)
                .fold(base, |m, sn| if sn_lt(sn, m) { sn } else { m });
            resend.sort_by_key(|(sn, _)| sn.wrapping_sub(base));
        }
        for &(_, slot) in resend.iter().rev() {
            if let Some(c) = self.cmd_mut(slot) {
                c.phase = Phase::Queued;
                c.aborting = false;
            }
            self.queue.push_front(slot);
        }
        self.sent = 0;
        // Pings die with the connection; functions wait for the next one.
        self.control
            .retain(|_, c| !matches!(c, Control::Ping { .. } | Control::Logout { .. }));
        for c in self.control.values_mut() {
            if let Control::Tmf { sent, token, .. } = c {
                *sent = false;
                if token.is_none() {
                    // Internal aborts: the reinstatement does their job.
                }
            }
        }
        self.control
            .retain(|_, c| !matches!(c, Control::Tmf { token: None, .. }));
        if self.closing && (was_logging_out || self.live == 0) {
            while let Some(s) = self.queue.pop_front() {
                self.finish(s, Err(InitiatorError::Closed));
            }
            self.fail_controls(InitiatorError::Closed);
            self.state = State::Closed;
            self.events.push_back(Event::Closed);
        }
    }

    /// Login for a new connection failed. With `permanent` (the target
    /// refused us: authentication, no such target), queued commands fail
    /// with [`InitiatorError::Unreachable`] now; otherwise they keep
    /// waiting for a connection until their deadlines. Only a session
    /// without a connection is logging in: while one is up this does
    /// nothing (commands sent on it wait for their answers).
    pub fn login_failed(&mut self, permanent: bool, reason: &str) {
        if !permanent || self.state != State::Down {
            return;
        }
        while let Some(s) = self.queue.pop_front() {
            self.finish(
                s,
                Err(InitiatorError::Unreachable {
                    reason: reason.to_string(),
                }),
            );
        }
        self.fail_controls(InitiatorError::Unreachable {
            reason: reason.to_string(),
        });
        if self.closing {
            self.state = State::Closed;
            self.events.push_back(Event::Closed);
        }
    }

    /// The earliest time [`Session::handle_timeout`] must run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            // Nothing is left to time (and `handle_timeout` does nothing).
            return None;
        }
        let mut t = self.scan_at;
        let mut consider = |d: Instant| t = Some(t.map_or(d, |c: Instant| c.min(d)));
        for c in self.control.values() {
            match c {
                Control::Ping { deadline } | Control::Logout { deadline } => consider(*deadline),
                Control::Tmf {
                    sent,
                    deadline,
                    hard_deadline,
                    ..
                } => {
                    if *sent {
                        consider(*deadline);
                    }
                    consider(*hard_deadline);
                }
            }
        }
        if let State::Draining { deadline } = self.state {
            consider(deadline);
        }
        if self.state == State::Up
            && self.ping.is_none()
            && let Some(i) = self.cfg.nop_interval
        {
            consider(self.last_rx + i);
        }
        t
    }

    /// Runs what is due at `now`. An error ends the connection.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ConnectionError> {
        if self.state == State::Closed {
            return Ok(());
        }
        if self.scan_at.is_some_and(|t| t <= now) {
            self.scan_commands(now);
        }
        // Task management and pings.
        let mut dead = None;
        let mut expired: Vec<u32> = Vec::new();
        for (itt, c) in &self.control {
            match c {
                Control::Ping { deadline } if *deadline <= now => {
                    dead = Some(ConnectionError::PeerDead)
                }
                Control::Logout { deadline } if *deadline <= now => {
                    dead = Some(ConnectionError::PeerDead)
                }
                Control::Tmf {
                    sent,
                    deadline,
                    hard_deadline,
                    ..
                } => {
                    if *hard_deadline <= now {
                        expired.push(*itt);
                    } else if *sent && *deadline <= now {
                        dead = Some(ConnectionError::TmfTimeout);
                    }
                }
                _ => {}
            }
        }
        for itt in expired {
            if let Some(Control::Tmf { token, .. }) = self.control.remove(&itt)
                && let Some(token) = token
            {
                self.events.push_back(Event::Tmf {
                    token,
                    result: Err(InitiatorError::Timeout {
                        after: self.cfg.command_timeout,
                    }),
                });
            }
        }
        if let Some(e) = dead {
            return Err(e);
        }
        if let State::Draining { deadline } = self.state
            && deadline <= now
        {
            self.send_logout(now);
        }
        if self.state == State::Up
            && self.ping.is_none()
            && let Some(i) = self.cfg.nop_interval
            && now >= self.last_rx + i
        {
            let itt = self.control_itt();
            self.control.insert(
                itt,
                Control::Ping {
                    deadline: now + self.cfg.nop_timeout,
                },
            );
            self.ping = Some(itt);
            self.tx.push_back(OutPdu {
                pdu: Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                }),
                ahs: Bytes::new(),
                data: DataSegment::None,
            });
        }
        Ok(())
    }

    /// Handles one received PDU. An error ends the connection.
    pub fn handle_frame(&mut self, now: Instant, frame: PduFrame) -> Result<(), ConnectionError> {
        if !self.is_connected() {
            return Ok(());
        }
        self.last_rx = now;
        let pdu = frame
            .parse()
            .map_err(|_| ConnectionError::Protocol("unparsable PDU"))?;
        let r = match pdu {
            Pdu::ScsiResponse(r) => {
                self.window(r.exp_cmd_sn, r.max_cmd_sn);
                self.ack(r.stat_sn);
                self.on_response(r, frame.data);
                Ok(())
            }
            Pdu::DataIn(d) => {
                self.window(d.exp_cmd_sn, d.max_cmd_sn);
                if d.status_present {
                    self.ack(d.stat_sn);
                }
                self.on_data_in(d, frame.data);
                Ok(())
            }
            Pdu::R2t(r) => {
                self.window(r.exp_cmd_sn, r.max_cmd_sn);
                self.on_r2t(r);
                Ok(())
            }
            Pdu::NopIn(n) => {
                self.window(n.exp_cmd_sn, n.max_cmd_sn);
                self.on_nop_in(n, frame.data);
                Ok(())
            }
            Pdu::TaskMgmtResponse(t) => {
                self.window(t.exp_cmd_sn, t.max_cmd_sn);
                self.ack(t.stat_sn);
                self.on_tmf_response(t);
                Ok(())
            }
            Pdu::AsyncMessage(a) => {
                self.window(a.exp_cmd_sn, a.max_cmd_sn);
                self.ack(a.stat_sn);
                self.on_async(now, a.event, a.parameter2, a.parameter3)
            }
            Pdu::Reject(r) => {
                self.window(r.exp_cmd_sn, r.max_cmd_sn);
                self.ack(r.stat_sn);
                self.on_reject(r, &frame.data)
            }
            Pdu::LogoutResponse(l) => {
                self.window(l.exp_cmd_sn, l.max_cmd_sn);
                self.ack(l.stat_sn);
                if self.control.remove(&l.itt).is_some() {
                    Err(ConnectionError::LoggedOut)
                } else {
                    Ok(())
                }
            }
            Pdu::TextResponse(t) => {
                // We never send Text in full feature phase.
                self.window(t.exp_cmd_sn, t.max_cmd_sn);
                self.ack(t.stat_sn);
                Ok(())
            }
            _ => Err(ConnectionError::Protocol(
                "initiator opcode from the target",
            )),
        };
        self.pump();
        self.maybe_logout(now);
        r
    }

    /// A received PDU failed its data digest (the framer consumed it): the
    /// command it belongs to is sent again if idempotent, else it fails.
    pub fn handle_digest_error(
        &mut self,
        now: Instant,
        bhs: &Bytes,
    ) -> Result<(), ConnectionError> {
        let _ = now;
        let Ok(view) = Bhs::new_checked(&bhs[..]) else {
            return Err(ConnectionError::Protocol("data digest error"));
        };
        let op = view.opcode();
        if op != Opcode::SCSI_DATA_IN && op != Opcode::SCSI_RESPONSE {
            return Err(ConnectionError::Protocol("data digest error"));
        }
        let itt = view.initiator_task_tag();
        let Some(slot) = self.slot_of_itt(itt) else {
            return Ok(());
        };
        let len = view.data_segment_length();
        if let Some(c) = self.cmd_mut(slot) {
            c.corrupt = true;
            if op == Opcode::SCSI_DATA_IN {
                c.exp_data_sn = c.exp_data_sn.wrapping_add(1);
                c.data_in_got = c.data_in_got.saturating_add(len);
            }
        }
        // The status rode on the lost PDU: end the command now.
        let status_lost =
            op == Opcode::SCSI_RESPONSE || (op == Opcode::SCSI_DATA_IN && view.flags() & 0x01 != 0);
        if status_lost {
            self.retry_or_fail(slot, "data digest error");
        }
        self.pump();
        Ok(())
    }

    // ---- internals -------------------------------------------------------

    fn cmd_ref(&self, slot: u16) -> Option<&Cmd<T>> {
        self.slots.get(usize::from(slot)).and_then(Option::as_ref)
    }

    fn cmd_mut(&mut self, slot: u16) -> Option<&mut Cmd<T>> {
        self.slots
            .get_mut(usize::from(slot))
            .and_then(Option::as_mut)
    }

    fn slot_of_tag(&self, tag: u64) -> Option<u16> {
        let slot = (tag & 0xffff) as u16;
        self.cmd_ref(slot).filter(|c| c.tag == tag).map(|_| slot)
    }

    fn slot_of_itt(&self, itt: u32) -> Option<u16> {
        let slot = (itt & 0xffff) as u16;
        if usize::from(slot) >= MAX_COMMANDS {
            return None;
        }
        self.cmd_ref(slot)
            .filter(|c| c.phase == Phase::Sent && c.itt == itt)
            .map(|_| slot)
    }

    fn control_itt(&mut self) -> u32 {
        loop {
            self.control_gen = self.control_gen.wrapping_add(1);
            let itt = (u32::from(self.control_gen) << 16) | 0x8000;
            if !self.control.contains_key(&itt) {
                return itt;
            }
        }
    }

    fn free_slot(&mut self, slot: u16) {
        if let Some(c) = self.slots.get_mut(usize::from(slot)).and_then(Option::take) {
            self.live -= 1;
            if c.phase == Phase::Sent {
                self.sent = self.sent.saturating_sub(1);
            }
            self.free.push(slot);
        }
        if self.live == 0 {
            self.scan_at = None;
        }
    }

    /// Ends a command: its outcome goes to the caller (if still wanted).
    fn finish(&mut self, slot: u16, outcome: Outcome) {
        let token = self.cmd_mut(slot).and_then(|c| c.token.take());
        self.free_slot(slot);
        if let Some(token) = token {
            self.events.push_back(Event::Command { token, outcome });
        }
    }

    fn retry_or_fail(&mut self, slot: u16, why: &'static str) {
        let Some(c) = self.cmd_ref(slot) else {
            return;
        };
        let retry = c.token.is_some()
            && !c.abort_requested
            && c.idempotent
            && c.attempts < self.cfg.max_attempts;
        if retry {
            debug!(why, "sending the command again");
            self.sent = self.sent.saturating_sub(1);
            if let Some(c) = self.cmd_mut(slot) {
                c.phase = Phase::Queued;
            }
            self.queue.push_front(slot);
        } else {
            self.finish(slot, Err(InitiatorError::Protocol(why)));
        }
    }

    /// Commands whose deadline passed fail with Timeout; outstanding ones
    /// are aborted at the target. Down for `replacement_timeout`: every
    /// command and function waiting for a connection fails.
    fn scan_commands(&mut self, now: Instant) {
        let replaced_by = self.replacement_deadline();
        if replaced_by.is_some_and(|t| t <= now) {
            // Without a connection for replacement_timeout: everything that
            // waits for one fails (all commands wait while down).
            let e = self.replacement_failure();
            while let Some(slot) = self.queue.pop_front() {
                self.finish(slot, Err(e.clone()));
            }
            self.fail_controls(e);
        }
        let waiting = self.live > 0 || !self.control.is_empty();
        let mut next: Option<Instant> = replaced_by.filter(|&t| t > now && waiting);
        let mut expired: Vec<u16> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(c) = s {
                if c.token.is_none() {
                    continue;
                }
                if c.deadline <= now {
                    expired.push(i as u16);
                } else {
                    next = Some(next.map_or(c.deadline, |n| n.min(c.deadline)));
                }
            }
        }
        self.scan_at = next;
        let after = self.cfg.command_timeout;
        for slot in expired {
            let phase = self.cmd_ref(slot).map(|c| c.phase);
            match phase {
                Some(Phase::Queued) => {
                    self.queue.retain(|&s| s != slot);
                    self.finish(slot, Err(InitiatorError::Timeout { after }));
                }
                Some(Phase::Sent) => {
                    let token = self.cmd_mut(slot).and_then(|c| c.token.take());
                    if let Some(token) = token {
                        self.events.push_back(Event::Command {
                            token,
                            outcome: Err(InitiatorError::Timeout { after }),
                        });
                    }
                    self.send_abort(now, slot);
                }
                None => {}
            }
        }
    }

    /// ABORT TASK for an outstanding command nobody waits for any more.
    fn send_abort(&mut self, now: Instant, slot: u16) {
        let Some(c) = self.cmd_mut(slot) else {
            return;
        };
        if c.aborting {
            return;
        }
        c.aborting = true;
        let (lun, itt, sn) = (c.lun, c.itt, c.cmd_sn);
        if !self.is_connected() {
            return;
        }
        let citt = self.control_itt();
        self.control.insert(
            citt,
            Control::Tmf {
                token: None,
                function: TmfFunction::AbortTask { tag: 0 },
                lun,
                referenced: itt,
                cmd_sn: self.cmd_sn,
                sent: true,
                deadline: now + self.cfg.tmf_timeout,
                hard_deadline: now + self.cfg.command_timeout,
            },
        );
        self.push_tmf(citt, TmfFunction::AbortTask { tag: 0 }, lun, itt, sn);
    }

    fn push_tmf(
        &mut self,
        itt: u32,
        function: TmfFunction,
        lun: u64,
        referenced: u32,
        ref_cmd_sn: u32,
    ) {
        self.tx.push_back(OutPdu {
            pdu: Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: tmf_code(function),
                lun,
                itt,
                referenced_task_tag: referenced,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
                ref_cmd_sn,
                exp_data_sn: 0,
            }),
            ahs: Bytes::new(),
            data: DataSegment::None,
        });
    }

    fn fail_controls(&mut self, e: InitiatorError) {
        let all: Vec<u32> = self.control.keys().copied().collect();
        for itt in all {
            if let Some(Control::Tmf {
                token: Some(token), ..
            }) = self.control.remove(&itt)
            {
                self.events.push_back(Event::Tmf {
                    token,
                    result: Err(e.clone()),
                });
            }
        }
    }

    fn window_open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Sends queued commands as far as the window allows.
    fn pump(&mut self) {
        if self.state != State::Up && !matches!(self.state, State::Draining { .. } if self.closing)
        {
            return;
        }
        while let Some(&slot) = self.queue.front() {
            if !self.window_open() {
                break;
            }
            self.queue.pop_front();
            self.send_command(slot);
        }
    }

    fn next_itt(&mut self, slot: u16) -> u32 {
        self.itt_gen = self.itt_gen.wrapping_add(1);
        (u32::from(self.itt_gen) << 16) | u32::from(slot)
    }

    fn send_command(&mut self, slot: u16) {
        let itt = self.next_itt(slot);
        let cmd_sn = self.cmd_sn;
        let p = self.params;
        let exp_stat_sn = self.exp_stat_sn;
        let Some(c) = self
            .slots
            .get_mut(usize::from(slot))
            .and_then(Option::as_mut)
        else {
            return;
        };
        c.attempts = c.attempts.saturating_add(1);
        c.itt = itt;
        c.cmd_sn = cmd_sn;
        c.phase = Phase::Sent;
        c.data_in.clear();
        c.data_in_got = 0;
        c.exp_data_sn = 0;
        c.solicited = 0;
        c.corrupt = false;
        c.error = None;
        c.aborting = false;
        let (read, write) = match c.direction {
            DataDirection::None => (false, false),
            DataDirection::In => (true, false),
            DataDirection::Out => (false, true),
            DataDirection::Bidirectional => (true, true),
        };
        let edtl = if write { c.data_out_len } else { c.data_in_len };
        let mut cdb16 = [0u8; 16];
        let n = c.cdb.len().min(16);
        cdb16[..n].copy_from_slice(&c.cdb[..n]);
        let ahs = if c.cdb.len() > 16 || (read && write && c.data_in_len > 0) {
            let mut v = Vec::new();
            if let Some(rest) = c.cdb.get(16..)
                && !rest.is_empty()
            {
                Ahs::extended_cdb(rest).emit(&mut v);
            }
            if read && write && c.data_in_len > 0 {
                Ahs::bidi_read_length(c.data_in_len).emit(&mut v);
            }
            Bytes::from(v)
        } else {
            Bytes::new()
        };
        let mss = p.max_xmit_data_segment_length.max(512);
        let first_burst = p.first_burst_length.min(p.max_burst_length).max(1);
        let immediate = if write && p.immediate_data {
            c.data_out_len.min(first_burst).min(mss)
        } else {
            0
        };
        let unsolicited_end = if write && !p.initial_r2t {
            c.data_out_len.min(first_burst).max(immediate)
        } else {
            immediate
        };
        let data = if immediate > 0 {
            slice_data(&c.data_out, 0, immediate)
        } else {
            DataSegment::None
        };
        let lun = c.lun;
        self.tx.push_back(OutPdu {
            pdu: Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag: unsolicited_end <= immediate,
                read,
                write,
                attr: c.attr,
                lun,
                itt,
                expected_data_transfer_length: edtl,
                cmd_sn,
                exp_stat_sn,
                cdb: cdb16,
            }),
            ahs,
            data,
        });
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.sent += 1;
        if unsolicited_end > immediate {
            self.queue_data_out(slot, RESERVED_TAG, immediate, unsolicited_end - immediate);
        }
        trace!(itt, cmd_sn, "command sent");
    }

    /// Data-Out PDUs for `[offset, offset + len)`, each within the target's
    /// MaxRecvDataSegmentLength, DataSN from 0, F on the last.
    fn queue_data_out(&mut self, slot: u16, ttt: u32, offset: u32, len: u32) {
        let mss = self.params.max_xmit_data_segment_length.max(512);
        let Some(c) = self.slots.get(usize::from(slot)).and_then(Option::as_ref) else {
            return;
        };
        let end = offset.saturating_add(len).min(c.data_out_len);
        let mut at = offset;
        let mut data_sn = 0;
        while at < end {
            let n = (end - at).min(mss);
            self.tx.push_back(OutPdu {
                pdu: Pdu::DataOut(DataOut {
                    final_flag: at + n == end,
                    lun: c.lun,
                    itt: c.itt,
                    ttt,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: at,
                }),
                ahs: Bytes::new(),
                data: slice_data(&c.data_out, at, n),
            });
            data_sn += 1;
            at += n;
        }
    }

    /// ExpCmdSN and MaxCmdSN from a PDU (RFC 7143 §4.2.2.1).
    fn window(&mut self, exp: u32, max: u32) {
        if sn_lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if sn_lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if sn_lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
    }

    fn ack(&mut self, stat_sn: u32) {
        let next = stat_sn.wrapping_add(1);
        if sn_lt(self.exp_stat_sn, next) {
            self.exp_stat_sn = next;
        }
    }

    fn on_data_in(&mut self, d: DataIn, data: Bytes) {
        let Some(slot) = self.slot_of_itt(d.itt) else {
            trace!(itt = d.itt, "Data-In for no outstanding command");
            return;
        };
        let Some(c) = self.cmd_mut(slot) else {
            return;
        };
        let len = data.len() as u32;
        if c.error.is_none() {
            if d.data_sn != c.exp_data_sn {
                c.error = Some("Data-In DataSN out of order");
            } else if d.buffer_offset != c.data_in_got {
                c.error = Some("Data-In buffer offset out of order");
            } else if c
                .data_in_got
                .checked_add(len)
                .is_none_or(|e| e > c.data_in_len)
            {
                c.error = Some("Data-In beyond the expected data transfer length");
            }
        }
        c.exp_data_sn = c.exp_data_sn.wrapping_add(1);
        if c.error.is_none() && !data.is_empty() {
            c.data_in_got += len;
            c.data_in.push(data, GATHER_BELOW);
        }
        if !d.status_present {
            return;
        }
        if !d.final_flag {
            c.error = c
                .error
                .or(Some("Data-In with status but without the F bit"));
        }
        let residual = if d.overflow {
            Some(Residual::Overflow(d.residual_count))
        } else if d.underflow {
            Some(Residual::Underflow(d.residual_count))
        } else {
            None
        };
        let status = Status(d.status);
        self.complete(slot, status, None, residual);
    }

    fn on_response(&mut self, r: ScsiResponse, data: Bytes) {
        let Some(slot) = self.slot_of_itt(r.itt) else {
            trace!(itt = r.itt, "response for no outstanding command");
            return;
        };
        if r.response != 0 {
            self.finish(slot, Err(InitiatorError::ServiceResponse(r.response)));
            return;
        }
        let sense = if data.len() >= 2 {
            let n = usize::from(u16::from_be_bytes([data[0], data[1]]));
            (n > 0).then(|| data.slice(2..(2 + n).min(data.len())))
        } else {
            None
        };
        let residual = if r.overflow {
            Some(Residual::Overflow(r.residual_count))
        } else if r.underflow {
            Some(Residual::Underflow(r.residual_count))
        } else {
            None
        };
        self.complete(slot, Status(r.status), sense, residual);
    }

    fn complete(
        &mut self,
        slot: u16,
        status: Status,
        sense: Option<Bytes>,
        residual: Option<Residual>,
    ) {
        let Some(c) = self.cmd_mut(slot) else {
            return;
        };
        if c.corrupt {
            self.retry_or_fail(slot, "data digest error");
            return;
        }
        if let Some(e) = c.error {
            self.finish(slot, Err(InitiatorError::Protocol(e)));
            return;
        }
        let data_in = c.data_in.take();
        self.finish(
            slot,
            Ok(TaskResult {
                status,
                sense,
                data_in,
                residual,
                aborted: false,
            }),
        );
    }

    fn on_r2t(&mut self, r: R2t) {
        let Some(slot) = self.slot_of_itt(r.itt) else {
            trace!(itt = r.itt, "R2T for no outstanding command");
            return;
        };
        let ok = self.cmd_ref(slot).is_some_and(|c| {
            r.desired_data_transfer_length > 0
                && r.buffer_offset
                    .checked_add(r.desired_data_transfer_length)
                    .is_some_and(|e| e <= c.data_out_len)
        });
        if !ok {
            if let Some(c) = self.cmd_mut(slot) {
                c.error = Some("R2T outside the command's data-out");
            }
            return;
        }
        let Some(c) = self.cmd_mut(slot) else {
            return;
        };
        match c.solicited.checked_add(r.desired_data_transfer_length) {
            Some(total) if total <= c.data_out_len => c.solicited = total,
            _ => {
                c.error = Some("R2Ts ask for more data than the command carries");
                return;
            }
        }
        self.queue_data_out(slot, r.ttt, r.buffer_offset, r.desired_data_transfer_length);
    }

    fn on_nop_in(&mut self, n: NopIn, data: Bytes) {
        if n.itt != RESERVED_TAG {
            self.ack(n.stat_sn);
            if self.ping == Some(n.itt) {
                self.ping = None;
            }
            self.control.remove(&n.itt);
        }
        if n.ttt != RESERVED_TAG {
            // The target pings: answer with its TTT and data, as much of
            // it as the target accepts (RFC 7143 §11.18.3: reflected data
            // is limited to the receiver's MaxRecvDataSegmentLength; ours
            // may be the larger).
            let max = self.params.max_xmit_data_segment_length as usize;
            let data = data.slice(..data.len().min(max));
            self.tx.push_back(OutPdu {
                pdu: Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: n.lun,
                    itt: RESERVED_TAG,
                    ttt: n.ttt,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                }),
                ahs: Bytes::new(),
                data: if data.is_empty() {
                    DataSegment::None
                } else {
                    DataSegment::One(data)
                },
            });
        }
    }

    fn on_tmf_response(&mut self, t: TaskMgmtResponse) {
        let Some(Control::Tmf {
            token,
            function,
            lun,
            referenced,
            cmd_sn,
            ..
        }) = self.control.remove(&t.itt)
        else {
            return;
        };
        let done = matches!(
            t.response,
            TmfResponseCode::FUNCTION_COMPLETE | TmfResponseCode::TASK_DOES_NOT_EXIST
        );
        if done && aborts_tasks(function) {
            let victims: Vec<u16> = match function {
                TmfFunction::AbortTask { .. } => self.slot_of_itt(referenced).into_iter().collect(),
                f => (0..self.slots.len() as u16)
                    .filter(|&s| {
                        self.cmd_ref(s).is_some_and(|c| {
                            c.phase == Phase::Sent
                                && covers(f, lun, c.lun)
                                && sn_lt(c.cmd_sn, cmd_sn)
                        })
                    })
                    .collect(),
            };
            for s in victims {
                self.finish(s, Err(InitiatorError::Aborted));
            }
        } else if let TmfFunction::AbortTask { .. } = function
            && let Some(s) = self.slot_of_itt(referenced)
            && let Some(c) = self.cmd_mut(s)
        {
            // Not aborted: it runs on and ends normally.
            c.abort_requested = false;
            c.aborting = false;
        }
        if let Some(token) = token {
            self.events.push_back(Event::Tmf {
                token,
                result: Ok(tmf_response(t.response)),
            });
        }
    }

    fn on_async(
        &mut self,
        now: Instant,
        event: AsyncEvent,
        p2: u16,
        p3: u16,
    ) -> Result<(), ConnectionError> {
        match event {
            AsyncEvent::LOGOUT_REQUEST | AsyncEvent::NEGOTIATION_REQUEST => {
                debug!(?event, "the target asks us to log out");
                if self.state == State::Up {
                    let secs = if p3 == 0 { 2 } else { u64::from(p3) };
                    self.state = State::Draining {
                        deadline: now + Duration::from_secs(secs),
                    };
                    self.maybe_logout(now);
                }
                Ok(())
            }
            AsyncEvent::CONNECTION_DROP | AsyncEvent::SESSION_DROP => {
                Err(ConnectionError::DropRequested { time2wait: p2 })
            }
            _ => Ok(()),
        }
    }

    fn on_reject(&mut self, r: Reject, data: &Bytes) -> Result<(), ConnectionError> {
        let Ok(view) = Bhs::new_checked(&data[..]) else {
            return Err(ConnectionError::Protocol(
                "Reject without the rejected header",
            ));
        };
        let itt = view.initiator_task_tag();
        match view.opcode() {
            Opcode::SCSI_COMMAND => {
                if let Some(slot) = self.slot_of_itt(itt) {
                    self.finish(slot, Err(InitiatorError::Rejected { reason: r.reason.0 }));
                }
                Ok(())
            }
            Opcode::TASK_MGMT_REQUEST => {
                if let Some(Control::Tmf {
                    token: Some(token), ..
                }) = self.control.remove(&itt)
                {
                    self.events.push_back(Event::Tmf {
                        token,
                        result: Err(InitiatorError::Rejected { reason: r.reason.0 }),
                    });
                }
                Ok(())
            }
            Opcode::NOP_OUT => {
                if self.ping == Some(itt) {
                    self.ping = None;
                }
                self.control.remove(&itt);
                Ok(())
            }
            _ => Err(ConnectionError::Protocol("the target rejected a PDU")),
        }
    }

    /// Logs out once draining has nothing outstanding.
    fn maybe_logout(&mut self, now: Instant) {
        if let State::Draining { .. } = self.state {
            let idle = if self.closing {
                self.live == 0
            } else {
                self.sent == 0
            };
            if idle {
                self.send_logout(now);
            }
        }
    }

    fn send_logout(&mut self, now: Instant) {
        let itt = self.control_itt();
        self.control.insert(
            itt,
            Control::Logout {
                deadline: now + self.cfg.tmf_timeout,
            },
        );
        self.state = State::LoggingOut;
        self.tx.push_back(OutPdu {
            pdu: Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason: LogoutReason::CLOSE_SESSION,
                itt,
                cid: 0,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            }),
            ahs: Bytes::new(),
            data: DataSegment::None,
        });
    }
}

#[cfg(test)]
mod tests;
