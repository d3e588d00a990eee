//! The initiator side of the SCSI plane: how a remote logical unit reaches
//! its target through any transport (iSCSI, FCP over FCoE or FCIP).
//!
//! An [`Initiator`] is one I_T nexus to a remote SCSI target port: an iSCSI
//! session, an FCP N_Port login. It carries [`Request`]s (LUN, CDB, task
//! attribute, data-out) and gives back the remote device server's answer as
//! a [`TaskResult`]: status, sense, data-in and residual exactly as the
//! remote produced them. It also carries task management.
//!
//! An [`InitiatorFactory`] hands out the initiator that carries the tasks of
//! a given front-end I_T nexus, so a [`RemoteLu`](crate::remote::RemoteLu)
//! can keep one remote nexus per local one (reservations, unit attentions
//! and task sets then stay per initiator, as SAM-5 wants), or share one.
//!
//! # Contract for implementations
//!
//! - [`Initiator::submit`] is synchronous: the order of `submit` calls is
//!   the order in which the commands reach the remote task manager (iSCSI
//!   CmdSN order). It never blocks and never fails late to keep order: an
//!   error is reported through the returned future.
//! - Every submitted command ends: the future resolves within the
//!   initiator's configured command timeout, with the remote's answer or an
//!   [`InitiatorError`]. Never a silent success, never data that did not
//!   come from the remote for this command.
//! - Dropping the future before it resolves abandons the command: the
//!   initiator aborts it at the remote (ABORT TASK) if it was sent.
//! - [`Initiator::task_management`] resolves only after every command of
//!   this initiator that the function affects has ended; their futures
//!   resolve with [`InitiatorError::Aborted`].
//!
//! [`LoopbackInitiator`] is the reference implementation: its "remote" is a
//! local [`LogicalUnit`] (tests, benches, and a model for transports).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::lu::{BoxFuture, LogicalUnit, TmfFunction, TmfRequest, TmfResponse};
use crate::sense::{Sense, SenseKey, asc};
use crate::task::{
    Cdb, DataDirection, ItNexus, Lun, Status, TargetPort, Task, TaskAttr, TaskResult, TransportId,
};

/// One command to send to a remote logical unit.
#[derive(Debug, Clone)]
pub struct Request {
    /// The remote LUN (8-byte SAM encoding).
    pub lun: Lun,
    /// The CDB, sent unchanged.
    pub cdb: Cdb,
    /// Task attribute, sent unchanged.
    pub attr: TaskAttr,
    /// Command priority (SAM-5 §8.7); transports without one ignore it.
    pub priority: u8,
    /// Data-out in relative-offset order; its total length must equal
    /// `data_out_len`.
    pub data_out: Vec<Bytes>,
    /// Expected data-out transfer length.
    pub data_out_len: u32,
    /// Expected data-in transfer length.
    pub data_in_len: u32,
}

impl Request {
    /// A command without data-out.
    pub fn new(lun: Lun, cdb: Bytes, data_in_len: u32) -> Request {
        Request {
            lun,
            cdb: Cdb::new(cdb),
            attr: TaskAttr::Simple,
            priority: 0,
            data_out: Vec::new(),
            data_out_len: 0,
            data_in_len,
        }
    }

    /// A command carrying `data` as its data-out.
    pub fn with_data_out(lun: Lun, cdb: Bytes, data: Bytes) -> Request {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        Request {
            lun,
            cdb: Cdb::new(cdb),
            attr: TaskAttr::Simple,
            priority: 0,
            data_out: vec![data],
            data_out_len: len,
            data_in_len: 0,
        }
    }

    /// The command of a front-end task, addressed to `lun` at the remote:
    /// CDB, attribute, priority, data and lengths unchanged.
    pub fn from_task(task: Task, lun: Lun) -> Request {
        Request {
            lun,
            cdb: task.cdb,
            attr: task.attr,
            priority: task.priority,
            data_out: task.data_out,
            data_out_len: task.data_out_len,
            data_in_len: task.data_in_len,
        }
    }

    /// Total data-out bytes present.
    pub fn data_out_total(&self) -> usize {
        self.data_out.iter().map(Bytes::len).sum()
    }

    /// The direction implied by the expected lengths; with both zero, the
    /// direction the CDB's data moves in ([`cdb_direction`]), so that a
    /// host's READ or WRITE with an expected length of 0 still reaches the
    /// remote as a read or write (and gets the remote's overflow residual).
    pub fn direction(&self) -> DataDirection {
        match (self.data_in_len > 0, self.data_out_len > 0) {
            (false, false) => cdb_direction(self.cdb.as_bytes()).unwrap_or(DataDirection::None),
            (true, false) => DataDirection::In,
            (false, true) => DataDirection::Out,
            (true, true) => DataDirection::Bidirectional,
        }
    }

    /// Checks what every transport needs: a CDB of 1 to 260 bytes and
    /// data-out matching its announced length.
    pub fn validate(&self) -> Result<(), InitiatorError> {
        if self.cdb.is_empty() || self.cdb.len() > 260 {
            return Err(InitiatorError::InvalidRequest("CDB length outside 1..=260"));
        }
        if self.data_out_total() != self.data_out_len as usize {
            return Err(InitiatorError::InvalidRequest(
                "data-out length differs from the expected data-out transfer length",
            ));
        }
        Ok(())
    }
}

/// The outcome of a command: the remote's answer, or why there is none.
pub type Outcome = Result<TaskResult, InitiatorError>;

/// A submitted command.
pub struct Submitted {
    /// The tag the initiator gave the command at the remote (the iSCSI ITT,
    /// the FCP OX_ID, widened); [`TmfFunction::AbortTask`] and
    /// [`TmfFunction::QueryTask`] sent through [`Initiator::task_management`]
    /// name commands by it.
    pub tag: u64,
    /// Resolves when the command has ended. Dropping it abandons the command.
    pub outcome: BoxFuture<'static, Outcome>,
}

impl fmt::Debug for Submitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Submitted").field("tag", &self.tag).finish()
    }
}

impl Submitted {
    /// A command that failed before it could be queued.
    pub fn failed(error: InitiatorError) -> Submitted {
        Submitted {
            tag: u64::MAX,
            outcome: Box::pin(std::future::ready(Err(error))),
        }
    }
}

/// One I_T nexus to a remote SCSI target port, over some transport.
///
/// See the [module documentation](self) for the contract.
pub trait Initiator: Send + Sync + fmt::Debug {
    /// Queues a command. Commands reach the remote in the order of the calls.
    fn submit(&self, request: Request) -> Submitted;

    /// Runs a task management function at the remote. For
    /// [`TmfFunction::AbortTask`] and [`TmfFunction::QueryTask`] the tag is
    /// the one [`Submitted::tag`] gave. Resolves after every affected
    /// command of this initiator has ended.
    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>>;

    /// Ends the nexus: commands already submitted still end as the contract
    /// says, later ones fail with [`InitiatorError::Closed`], then the
    /// initiator logs out. Returns at once.
    fn close(&self);

    /// The remote end as an operator reads it (no secrets), e.g.
    /// `iscsi://192.0.2.1:3260/iqn.2001-04.com.example:disk`.
    fn remote(&self) -> String;
}

/// Hands out the initiator that carries a front-end nexus's tasks.
pub trait InitiatorFactory: Send + Sync + fmt::Debug {
    /// The initiator for the tasks of `nexus`, or for the gateway's own
    /// commands (capacity probes) with `None`. Cheap after the first call
    /// for a nexus is not required: the caller keeps what it gets. Must not
    /// block; connecting happens in the background and commands queue.
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError>;

    /// True when [`InitiatorFactory::open`] gives every front-end initiator
    /// port its own remote I_T nexus; false when they share one.
    fn per_nexus(&self) -> bool;
}

/// Why an initiator could not give the remote's answer to a command or
/// task management function.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InitiatorError {
    /// The command did not end within the configured timeout. It was
    /// aborted at the remote where that was still possible.
    #[error("no answer from the remote within {after:?}")]
    Timeout {
        /// The timeout that expired.
        after: Duration,
    },
    /// The connection was lost while the command was outstanding and the
    /// command is not one that can be sent again safely.
    #[error("connection to the remote target lost")]
    Disconnected,
    /// The remote could not be reached or refused the login.
    #[error("remote target unreachable: {reason}")]
    Unreachable {
        /// What failed, for the log.
        reason: String,
    },
    /// The command was aborted by task management before it ended.
    #[error("aborted by task management")]
    Aborted,
    /// The remote broke the transport protocol for this command.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The remote rejected the command's PDU (iSCSI Reject reason code).
    #[error("the remote rejected the command (reason {reason:#04x})")]
    Rejected {
        /// The transport's reason code.
        reason: u8,
    },
    /// The remote answered with a transport service response other than
    /// "command completed" (iSCSI Response field, FCP RSP_CODE).
    #[error("the remote reported a target failure (service response {0:#04x})")]
    ServiceResponse(u8),
    /// The request cannot be carried (bad CDB length, data length mismatch).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The initiator holds as many commands as it is configured for.
    #[error("initiator queue full")]
    QueueFull,
    /// The initiator was closed.
    #[error("initiator closed")]
    Closed,
}

impl InitiatorError {
    /// What a front end reports to its host when a forwarded command fails
    /// this way. Transport failures become CHECK CONDITION with sense key
    /// ABORTED COMMAND, which SAN hosts retry (Linux `scsi_check_sense`,
    /// Windows class drivers); the ASC says which failure:
    ///
    /// | error | status / sense |
    /// |---|---|
    /// | `Timeout` | ABORTED COMMAND, LOGICAL UNIT COMMUNICATION TIME-OUT (08/01) |
    /// | `Disconnected`, `Unreachable`, `Closed` | ABORTED COMMAND, LOGICAL UNIT COMMUNICATION FAILURE (08/00) |
    /// | `Protocol` | ABORTED COMMAND, DATA PHASE ERROR (4B/00) |
    /// | `Rejected`, `ServiceResponse` | ABORTED COMMAND, INTERNAL TARGET FAILURE (44/00) |
    /// | `InvalidRequest` | ILLEGAL REQUEST, INVALID FIELD IN CDB (24/00) |
    /// | `QueueFull` | TASK SET FULL |
    /// | `Aborted` | no response ([`TaskResult::aborted`]) |
    pub fn task_result(&self) -> TaskResult {
        let aborted = |a| TaskResult::check_condition(Sense::new(SenseKey::ABORTED_COMMAND, a));
        match self {
            InitiatorError::Timeout { .. } => aborted(asc::LOGICAL_UNIT_COMMUNICATION_TIME_OUT),
            InitiatorError::Disconnected
            | InitiatorError::Unreachable { .. }
            | InitiatorError::Closed => aborted(asc::LOGICAL_UNIT_COMMUNICATION_FAILURE),
            InitiatorError::Protocol(_) => aborted(asc::DATA_PHASE_ERROR),
            InitiatorError::Rejected { .. } | InitiatorError::ServiceResponse(_) => {
                aborted(asc::INTERNAL_TARGET_FAILURE)
            }
            InitiatorError::InvalidRequest(_) => TaskResult::check_condition(Sense::new(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_FIELD_IN_CDB,
            )),
            InitiatorError::QueueFull => TaskResult::status(Status::TASK_SET_FULL),
            InitiatorError::Aborted => TaskResult::aborted(),
        }
    }

    /// The task management response to report when a forwarded function
    /// fails this way.
    pub fn tmf_response(&self) -> TmfResponse {
        match self {
            InitiatorError::Rejected { .. } | InitiatorError::InvalidRequest(_) => {
                TmfResponse::FunctionRejected
            }
            _ => TmfResponse::ServiceDeliveryFailure,
        }
    }
}

impl From<&InitiatorError> for TaskResult {
    fn from(e: &InitiatorError) -> TaskResult {
        e.task_result()
    }
}

/// The direction a command's data moves in, by operation code, for the
/// common commands that move data (`None` for the rest). Transports carry
/// the direction in the PDU (iSCSI R/W bits, FCP RDDATA/WRDATA) even when
/// the expected length is 0; a front end's task keeps only the lengths, so
/// this recovers what the host sent.
pub fn cdb_direction(cdb: &[u8]) -> Option<DataDirection> {
    match *cdb.first()? {
        // READ(6/10/12/16), INQUIRY, MODE SENSE(6/10), READ CAPACITY(10),
        // REQUEST SENSE, LOG SENSE, READ DEFECT DATA(10/12), READ BUFFER,
        // PERSISTENT RESERVE IN, REPORT LUNS, SERVICE ACTION IN(16),
        // MAINTENANCE IN.
        0x08 | 0x28 | 0xa8 | 0x88 | 0x12 | 0x1a | 0x5a | 0x25 | 0x03 | 0x4d | 0x37 | 0xb7
        | 0x3c | 0x5e | 0xa0 | 0x9e | 0xa3 => Some(DataDirection::In),
        // WRITE(6/10/12/16), WRITE AND VERIFY(10/12/16), WRITE SAME(10/16),
        // COMPARE AND WRITE, MODE SELECT(6/10), PERSISTENT RESERVE OUT,
        // UNMAP, WRITE BUFFER, LOG SELECT, SEND DIAGNOSTIC.
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x41 | 0x93 | 0x89 | 0x15 | 0x55
        | 0x5f | 0x42 | 0x3b | 0x4c | 0x1d => Some(DataDirection::Out),
        _ => None,
    }
}

/// Commands an initiator may send again after a connection loss even though
/// they may already have run at the remote: running them twice has the same
/// effect as running them once, and their answer does not depend on whether
/// they ran before (reads, writes of the same data, inquiries).
///
/// Not in the list, and so failed with sense instead of being re-sent:
/// COMPARE AND WRITE, reservations (RESERVE/RELEASE, PERSISTENT RESERVE
/// OUT), REQUEST SENSE (it consumes the sense it reports), MODE SELECT, and
/// every command not named here.
pub fn is_idempotent(cdb: &[u8]) -> bool {
    let Some(&op) = cdb.first() else {
        return false;
    };
    match op {
        // TEST UNIT READY, READ(6), WRITE(6), INQUIRY, MODE SENSE(6),
        // READ CAPACITY(10), READ(10), WRITE(10), WRITE AND VERIFY(10),
        // VERIFY(10), SYNCHRONIZE CACHE(10), WRITE SAME(10), UNMAP,
        // LOG SENSE, MODE SENSE(10), PERSISTENT RESERVE IN, READ(16), WRITE(16),
        // WRITE AND VERIFY(16), VERIFY(16), SYNCHRONIZE CACHE(16),
        // WRITE SAME(16), REPORT LUNS, READ(12), WRITE(12),
        // WRITE AND VERIFY(12), VERIFY(12), GET LBA STATUS / READ CAPACITY(16).
        0x00 | 0x08 | 0x0a | 0x12 | 0x1a | 0x25 | 0x28 | 0x2a | 0x2e | 0x2f | 0x35 | 0x41
        | 0x42 | 0x4d | 0x5a | 0x5e | 0x88 | 0x8a | 0x8e | 0x8f | 0x91 | 0x93 | 0xa0 | 0xa8
        | 0xaa | 0xae | 0xaf => true,
        // SERVICE ACTION IN(16): READ CAPACITY(16) and GET LBA STATUS only.
        0x9e => matches!(cdb.get(1).map(|b| b & 0x1f), Some(0x10 | 0x12)),
        // MAINTENANCE IN: REPORT TARGET PORT GROUPS, REPORT SUPPORTED
        // OPERATION CODES, REPORT SUPPORTED TMFs.
        0xa3 => matches!(cdb.get(1).map(|b| b & 0x1f), Some(0x0a | 0x0c | 0x0d)),
        _ => false,
    }
}

/// An initiator whose remote device server is a local [`LogicalUnit`],
/// reached through its own I_T nexus. Commands run at once (no transport),
/// which makes it the reference for the contract and the baseline for
/// measuring a transport's cost.
#[derive(Debug)]
pub struct LoopbackInitiator {
    lu: Arc<dyn LogicalUnit>,
    nexus: ItNexus,
    next_tag: AtomicU64,
    closed: AtomicBool,
}

impl LoopbackInitiator {
    /// An initiator reaching `lu` as `nexus`.
    pub fn new(lu: Arc<dyn LogicalUnit>, nexus: ItNexus) -> LoopbackInitiator {
        LoopbackInitiator {
            lu,
            nexus,
            next_tag: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        }
    }

    /// The nexus the LU sees.
    pub fn nexus(&self) -> &ItNexus {
        &self.nexus
    }
}

impl Initiator for LoopbackInitiator {
    fn submit(&self, request: Request) -> Submitted {
        if self.closed.load(Ordering::Acquire) {
            return Submitted::failed(InitiatorError::Closed);
        }
        if let Err(e) = request.validate() {
            return Submitted::failed(e);
        }
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let task = Task::new(self.nexus.clone(), request.lun, tag, request.cdb)
            .with_attr(request.attr)
            .with_priority(request.priority)
            .with_data_out(request.data_out, request.data_out_len)
            .with_data_in(request.data_in_len);
        let fut = self.lu.execute(task);
        Submitted {
            tag,
            outcome: Box::pin(async move {
                let r = fut.await;
                if r.aborted {
                    Err(InitiatorError::Aborted)
                } else {
                    Ok(r)
                }
            }),
        }
    }

    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        let f = self.lu.task_management(TmfRequest {
            nexus: self.nexus.clone(),
            lun,
            function,
        });
        Box::pin(async move { Ok(f.await) })
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.lu.nexus_loss(&self.nexus);
        }
    }

    fn remote(&self) -> String {
        format!("loopback:{}", self.lu.describe().name)
    }
}

/// Opens [`LoopbackInitiator`]s to one LU: one nexus per front-end
/// initiator port (keeping its name), or one shared nexus.
#[derive(Debug)]
pub struct LoopbackFactory {
    lu: Arc<dyn LogicalUnit>,
    target: TargetPort,
    per_nexus: bool,
    own: TransportId,
    shared: Mutex<Option<Arc<LoopbackInitiator>>>,
    opened: AtomicU64,
}

impl LoopbackFactory {
    /// A factory for `lu`, seen through `target`; `own` names the
    /// initiator port of the shared (and control) nexus.
    pub fn new(
        lu: Arc<dyn LogicalUnit>,
        target: TargetPort,
        own: TransportId,
        per_nexus: bool,
    ) -> LoopbackFactory {
        LoopbackFactory {
            lu,
            target,
            per_nexus,
            own,
            shared: Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    /// How many initiators (remote nexuses) were opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

impl InitiatorFactory for LoopbackFactory {
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        match nexus {
            Some(n) if self.per_nexus => {
                self.opened.fetch_add(1, Ordering::Relaxed);
                Ok(Arc::new(LoopbackInitiator::new(
                    self.lu.clone(),
                    ItNexus::new(n.initiator().clone(), self.target.clone()),
                )))
            }
            _ => {
                let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let i = s.get_or_insert_with(|| {
                    self.opened.fetch_add(1, Ordering::Relaxed);
                    Arc::new(LoopbackInitiator::new(
                        self.lu.clone(),
                        ItNexus::new(self.own.clone(), self.target.clone()),
                    ))
                });
                Ok(i.clone())
            }
        }
    }

    fn per_nexus(&self) -> bool {
        self.per_nexus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_failure_maps_to_retryable_sense() {
        for e in [
            InitiatorError::Timeout {
                after: Duration::from_secs(1),
            },
            InitiatorError::Disconnected,
            InitiatorError::Unreachable { reason: "x".into() },
            InitiatorError::Closed,
            InitiatorError::Protocol("p"),
            InitiatorError::Rejected { reason: 9 },
            InitiatorError::ServiceResponse(1),
        ] {
            let r = e.task_result();
            assert_eq!(r.status, Status::CHECK_CONDITION, "{e}");
            assert!(!r.aborted);
            assert!(r.data_in.is_empty(), "never data with a failure");
            let s = Sense::parse(r.sense.as_deref().unwrap_or(&[])).unwrap();
            assert_eq!(s.key, SenseKey::ABORTED_COMMAND, "{e}");
        }
        let t = InitiatorError::Timeout {
            after: Duration::from_secs(1),
        }
        .task_result();
        let s = Sense::parse(t.sense.as_deref().unwrap_or(&[])).unwrap();
        assert_eq!(s.asc, asc::LOGICAL_UNIT_COMMUNICATION_TIME_OUT);
        assert!(InitiatorError::Aborted.task_result().aborted);
        assert_eq!(
            InitiatorError::QueueFull.task_result().status,
            Status::TASK_SET_FULL
        );
        let bad = InitiatorError::InvalidRequest("x").task_result();
        let s = Sense::parse(bad.sense.as_deref().unwrap_or(&[])).unwrap();
        assert_eq!(s.key, SenseKey::ILLEGAL_REQUEST);
    }

    #[test]
    fn idempotent_commands() {
        assert!(is_idempotent(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0]));
        assert!(is_idempotent(&[0x8a; 16]));
        assert!(is_idempotent(&[0x9e, 0x10]));
        assert!(!is_idempotent(&[0x9e, 0x11]));
        assert!(!is_idempotent(&[0x89; 16]), "COMPARE AND WRITE");
        assert!(!is_idempotent(&[0x5f; 10]), "PERSISTENT RESERVE OUT");
        assert!(!is_idempotent(&[0x03; 6]), "REQUEST SENSE");
        assert!(!is_idempotent(&[0x16; 6]), "RESERVE(6)");
        assert!(!is_idempotent(&[]));
    }

    #[test]
    fn request_validation() {
        let ok = Request::with_data_out(
            Lun(0),
            Bytes::from_static(&[0x2a; 10]),
            Bytes::from_static(&[0; 512]),
        );
        assert!(ok.validate().is_ok());
        assert_eq!(ok.direction(), DataDirection::Out);
        let mut short = ok.clone();
        short.data_out_len = 1024;
        assert!(short.validate().is_err());
        let empty = Request::new(Lun(0), Bytes::new(), 0);
        assert!(empty.validate().is_err());
        let long = Request::new(Lun(0), Bytes::from(vec![0u8; 261]), 0);
        assert!(long.validate().is_err());
        assert_eq!(
            Request::new(Lun(0), Bytes::from_static(&[0x12; 6]), 36).direction(),
            DataDirection::In
        );
    }
}
