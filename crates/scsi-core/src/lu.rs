//! The logical unit interface and task management (SAM-5 §7).

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::task::{ItNexus, Lun, Task, TaskResult};

/// A boxed, sendable future (what `dyn LogicalUnit` methods return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`BoxFuture`] whose output comes back with a key (a task tag, a
/// port's slot): what `Box::pin(async move { (key, fut.await) })` gives a
/// transport's set of running tasks, without a second allocation per
/// command around the first.
pub struct Keyed<K, T> {
    key: K,
    fut: BoxFuture<'static, T>,
}

impl<K, T> Keyed<K, T> {
    /// `fut`'s output will come with `key`.
    pub fn new(key: K, fut: BoxFuture<'static, T>) -> Keyed<K, T> {
        Keyed { key, fut }
    }
}

impl<K, T> fmt::Debug for Keyed<K, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed").finish_non_exhaustive()
    }
}

impl<K: Copy + Unpin, T> Future for Keyed<K, T> {
    type Output = (K, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<(K, T)> {
        let key = self.key;
        self.fut.as_mut().poll(cx).map(|out| (key, out))
    }
}

/// A logical unit: emulated over a backend, or remote behind an initiator.
///
/// # Ordering contract
///
/// The order in which a transport *calls* [`LogicalUnit::execute`] is the
/// order in which the LU's task manager receives the tasks (for iSCSI, CmdSN
/// order; for FCP, arrival order). An implementation registers the task in
/// its task set synchronously, before returning the future, so that ORDERED
/// and HEAD OF QUEUE semantics and ABORT TASK SET see every received task even
/// if the transport polls the futures later or concurrently.
///
/// The returned future must be polled to completion for the task to run; a
/// transport that drops it aborts the task (its effects may or may not have
/// happened, as after an ABORT TASK).
pub trait LogicalUnit: Send + Sync + fmt::Debug {
    /// Runs one task. Never panics on any CDB or data: bad input ends in
    /// CHECK CONDITION with the sense SPC-4 gives.
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult>;

    /// Runs a task management function addressed to this LU. The response
    /// is returned only after every task it affects has ended (their
    /// futures resolve with [`TaskResult::aborted`]).
    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse>;

    /// The I_T nexus is gone (session closed without reinstatement, link
    /// lost): SAM-5 §6.3.4 I_T nexus loss. Aborts its tasks, releases a
    /// RESERVE(6/10) reservation it holds, and queues an I_T NEXUS LOSS
    /// OCCURRED unit attention where SPC-4 asks for one.
    fn nexus_loss(&self, nexus: &ItNexus);

    /// The I_T nexus is about to end in order (a logout): state shared
    /// beyond this process that its end releases (a cluster's RESERVE(6))
    /// is released before the future resolves. [`LogicalUnit::nexus_loss`]
    /// follows. By default nothing to wait for.
    fn nexus_closing(&self, _nexus: &ItNexus) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Identity and size, for `unifab show luns` and transports that need
    /// the block size (FCP/iSCSI never do; they pass CDBs through).
    fn describe(&self) -> LuDescription;

    /// The LU's counters (every command it ends, recorded by the LU
    /// itself); `None` (the default): not counted.
    fn stats(&self) -> Option<&crate::stats::LuStats> {
        None
    }

    /// Its commands' answers should go to the host as each completes,
    /// never held for a batch ([`crate::BlockBackend::answer_promptly`]).
    /// Default: false.
    fn answer_promptly(&self) -> bool {
        false
    }
}

/// What `unifab show luns` prints of a LU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuDescription {
    /// Configured name.
    pub name: String,
    /// `"memory"`, `"file:/path"`, `"iscsi://…"`, `"fc://…"`.
    pub backend: String,
    /// Logical block length in bytes (0 if unknown, e.g. remote before
    /// first contact).
    pub block_size: u32,
    /// Number of logical blocks (0 if unknown).
    pub blocks: u64,
    /// Hosts see the LU as write-protected (`read_only`, a read-only
    /// medium, or SWP set in the Control mode page).
    pub write_protected: bool,
    /// The backend's operations in flight and done, where it counts them
    /// (an RBD image).
    pub backend_io: Option<crate::backend::BackendIoStats>,
    /// Where its plain writes run now, for a LU with a block backend.
    pub write_path: Option<crate::backend::WritePath>,
    /// The storage has fenced this gateway off (an RBD client the cluster
    /// blocklisted): the LU serves nothing until it is reopened.
    pub fenced: bool,
}

/// A task management function (SAM-5 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmfFunction {
    /// Abort the task with this tag on the requesting nexus.
    AbortTask {
        /// The tag of the task to abort.
        tag: u64,
    },
    /// Abort every task of the requesting nexus on this LU.
    AbortTaskSet,
    /// Abort every task of every nexus on this LU (TST = 000b semantics).
    ClearTaskSet,
    /// Clear an ACA condition.
    ClearAca,
    /// Reset the LU: abort all tasks, clear reservations made by RESERVE,
    /// establish a unit attention for every nexus.
    LogicalUnitReset,
    /// The target resets; each LU does what LOGICAL UNIT RESET does, with
    /// the POWER ON/RESET family unit attention.
    TargetReset,
    /// Abort all tasks of the nexus on every LU (I_T NEXUS RESET).
    ItNexusReset,
    /// Is the task with this tag still in the task set?
    QueryTask {
        /// The tag asked about.
        tag: u64,
    },
    /// Does the nexus have any task in the task set?
    QueryTaskSet,
    /// Is a unit attention or deferred error pending for the nexus?
    QueryAsyncEvent,
}

/// A task management request.
#[derive(Debug, Clone)]
pub struct TmfRequest {
    /// The requesting nexus.
    pub nexus: ItNexus,
    /// The addressed LU.
    pub lun: Lun,
    /// What to do.
    pub function: TmfFunction,
}

/// A task management service response (SAM-5 §7.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmfResponse {
    /// FUNCTION COMPLETE.
    FunctionComplete,
    /// FUNCTION SUCCEEDED (query functions: the thing asked about exists).
    FunctionSucceeded,
    /// FUNCTION REJECTED.
    FunctionRejected,
    /// INCORRECT LOGICAL UNIT NUMBER.
    IncorrectLun,
    /// SERVICE DELIVERY OR TARGET FAILURE.
    ServiceDeliveryFailure,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll, Waker};

    #[test]
    fn keyed_gives_the_output_with_its_key_when_the_future_ends() {
        let mut cx = Context::from_waker(Waker::noop());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u8>();
        let mut k = Keyed::new(7u32, Box::pin(async move { rx.recv().await }));
        assert_eq!(Pin::new(&mut k).poll(&mut cx), Poll::Pending);
        tx.send(5).ok();
        assert_eq!(Pin::new(&mut k).poll(&mut cx), Poll::Ready((7, Some(5))));
    }
}
