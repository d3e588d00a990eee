//! A task set (SAM-5 §8): task attribute ordering and task management,
//! without any runtime dependency.
//!
//! A logical unit calls [`TaskSet::register`] synchronously inside
//! [`LogicalUnit::execute`](crate::LogicalUnit::execute), before it returns
//! the task's future, so that the order of `execute` calls is the order the
//! task manager received the tasks. The future then awaits
//! [`TaskHandle::ready`], which resolves when SAM-5's rules enable the task:
//!
//! - HEAD OF QUEUE: at once;
//! - ORDERED: when every older task has completed;
//! - SIMPLE (and ACA, which unifab treats as SIMPLE since it never
//!   establishes an ACA condition): when every older ORDERED task has
//!   completed.
//!
//! A HEAD OF QUEUE task counts as older than every task not yet started:
//! while one is in the set, no ORDERED or SIMPLE task starts.
//!
//! A task completes when its [`TaskHandle`] is dropped. Task management
//! marks tasks aborted ([`TaskSet::abort_matching`]); a task not yet
//! enabled then resolves `ready` with [`Aborted`] at once, a running one
//! notices [`TaskHandle::is_aborted`] when it ends, and the returned
//! [`AbortWait`] future resolves once every affected task has left the set.
//!
//! Many hosts share one LU, so the common case costs little under the set's
//! one lock: while no ORDERED or HEAD OF QUEUE task is in the set, a SIMPLE
//! task is enabled as it registers (every rule above is met at once), its
//! `ready` and `is_aborted` take no lock, and completing it scans nothing.
//! The set keeps counts of ORDERED, HEAD OF QUEUE and not-yet-started
//! tasks for that; only when one of those is present do the rules above
//! look at the other tasks.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::task::{ItNexus, TaskAttr};

/// The task was aborted by task management before it could run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task aborted")]
pub struct Aborted;

/// The task set already holds its configured depth (TASK SET FULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task set full")]
pub struct TaskSetFull;

#[derive(Debug)]
struct Entry {
    nexus: ItNexus,
    tag: u64,
    attr: TaskAttr,
    started: bool,
    aborted: bool,
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    entries: BTreeMap<u64, Entry>,
    gone_wakers: Vec<Waker>,
    /// ORDERED tasks in the set.
    ordered: usize,
    /// HEAD OF QUEUE tasks in the set.
    head_of_queue: usize,
    /// Tasks in the set not yet started (enabled).
    unstarted: usize,
}

impl State {
    fn count(&mut self, attr: TaskAttr, added: bool) {
        let n = match attr {
            TaskAttr::Ordered => &mut self.ordered,
            TaskAttr::HeadOfQueue => &mut self.head_of_queue,
            TaskAttr::Simple | TaskAttr::Aca => return,
        };
        if added {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    depth: usize,
    /// Aborted tasks still in the set: while none is, a handle knows it is
    /// not aborted without the lock.
    aborted: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bounded task set. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct TaskSet {
    shared: Arc<Shared>,
}

/// A registered task; dropping it completes the task.
#[derive(Debug)]
pub struct TaskHandle {
    shared: Arc<Shared>,
    seq: u64,
    /// Enabled as it registered: `ready` need not look at the set.
    started: bool,
}

impl TaskSet {
    /// A task set holding at most `depth` tasks (at least 1).
    pub fn new(depth: usize) -> TaskSet {
        TaskSet {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                depth: depth.max(1),
                aborted: AtomicUsize::new(0),
            }),
        }
    }

    /// The configured depth.
    pub fn depth(&self) -> usize {
        self.shared.depth
    }

    /// Enters a task, in arrival order. Synchronous by design.
    pub fn register(
        &self,
        nexus: &ItNexus,
        tag: u64,
        attr: TaskAttr,
    ) -> Result<TaskHandle, TaskSetFull> {
        let mut st = self.shared.lock();
        if st.entries.len() >= self.shared.depth {
            return Err(TaskSetFull);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        // Nothing in the set can hold back a SIMPLE task: it is enabled now.
        let started = matches!(attr, TaskAttr::Simple | TaskAttr::Aca)
            && st.ordered == 0
            && st.head_of_queue == 0;
        st.entries.insert(
            seq,
            Entry {
                nexus: nexus.clone(),
                tag,
                attr,
                started,
                aborted: false,
                waker: None,
            },
        );
        st.count(attr, true);
        if !started {
            st.unstarted += 1;
        }
        Ok(TaskHandle {
            shared: self.shared.clone(),
            seq,
            started,
        })
    }

    /// Number of tasks in the set.
    pub fn len(&self) -> usize {
        self.shared.lock().entries.len()
    }

    /// True when no task is in the set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks every task for which `pred(nexus, tag)` holds as aborted, and
    /// returns how many and a future that resolves when all have ended.
    pub fn abort_matching(&self, pred: impl Fn(&ItNexus, u64) -> bool) -> AbortWait {
        let mut st = self.shared.lock();
        let mut seqs = Vec::new();
        for (seq, e) in st.entries.iter_mut() {
            if !e.aborted && pred(&e.nexus, e.tag) {
                e.aborted = true;
                self.shared.aborted.fetch_add(1, Ordering::Release);
                seqs.push(*seq);
                if let Some(w) = e.waker.take() {
                    w.wake();
                }
            }
        }
        AbortWait {
            shared: self.shared.clone(),
            seqs,
        }
    }

    /// Is a task with this tag of this nexus in the set (and not aborted)?
    pub fn contains(&self, nexus: &ItNexus, tag: u64) -> bool {
        self.shared
            .lock()
            .entries
            .values()
            .any(|e| !e.aborted && e.tag == tag && e.nexus == *nexus)
    }

    /// Does the nexus have any (non-aborted) task in the set?
    pub fn has_tasks_of(&self, nexus: &ItNexus) -> bool {
        self.shared
            .lock()
            .entries
            .values()
            .any(|e| !e.aborted && e.nexus == *nexus)
    }
}

/// A HEAD OF QUEUE task counts as older than every task not yet started,
/// whenever it arrived.
fn enabled(st: &State, seq: u64, attr: TaskAttr) -> bool {
    // Another HEAD OF QUEUE task is in the set (none but this task, when
    // this one is HEAD OF QUEUE itself).
    let hoq_pending = st.head_of_queue > usize::from(attr == TaskAttr::HeadOfQueue);
    match attr {
        TaskAttr::HeadOfQueue => true,
        TaskAttr::Ordered => !hoq_pending && st.entries.range(..seq).next().is_none(),
        TaskAttr::Simple | TaskAttr::Aca => {
            !hoq_pending
                && (st.ordered == 0
                    || !st
                        .entries
                        .range(..seq)
                        .any(|(_, e)| e.attr == TaskAttr::Ordered))
        }
    }
}

impl TaskHandle {
    /// Resolves when the task may run (then it counts as started), or with
    /// [`Aborted`] if task management aborted it first.
    pub fn ready(&self) -> Ready<'_> {
        Ready { handle: self }
    }

    /// True once task management aborted this task.
    pub fn is_aborted(&self) -> bool {
        if self.shared.aborted.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.shared
            .lock()
            .entries
            .get(&self.seq)
            .is_none_or(|e| e.aborted)
    }

    /// The sequence number (arrival order) of the task.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(e) = st.entries.remove(&self.seq) {
            if e.aborted {
                self.shared.aborted.fetch_sub(1, Ordering::Release);
            }
            st.count(e.attr, false);
            if !e.started {
                st.unstarted = st.unstarted.saturating_sub(1);
            }
        }
        // Tasks waiting to start may be enabled now.
        if st.unstarted > 0 {
            for e in st.entries.values_mut() {
                if !e.started
                    && let Some(w) = e.waker.take()
                {
                    w.wake();
                }
            }
        }
        for w in st.gone_wakers.drain(..) {
            w.wake();
        }
    }
}

/// Future of [`TaskHandle::ready`].
#[derive(Debug)]
pub struct Ready<'a> {
    handle: &'a TaskHandle,
}

impl Future for Ready<'_> {
    type Output = Result<(), Aborted>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.handle.is_aborted() {
            return Poll::Ready(Err(Aborted));
        }
        if self.handle.started {
            return Poll::Ready(Ok(()));
        }
        let seq = self.handle.seq;
        let mut st = self.handle.shared.lock();
        let Some(attr) = st.entries.get(&seq).map(|e| (e.attr, e.aborted, e.started)) else {
            return Poll::Ready(Err(Aborted));
        };
        if attr.1 {
            return Poll::Ready(Err(Aborted));
        }
        if attr.2 {
            return Poll::Ready(Ok(()));
        }
        if enabled(&st, seq, attr.0) {
            if let Some(e) = st.entries.get_mut(&seq) {
                e.started = true;
                e.waker = None;
            }
            st.unstarted = st.unstarted.saturating_sub(1);
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = st.entries.get_mut(&seq) {
            e.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Resolves when every task an abort marked has left the task set.
#[derive(Debug)]
pub struct AbortWait {
    shared: Arc<Shared>,
    seqs: Vec<u64>,
}

impl AbortWait {
    /// How many tasks were marked.
    pub fn count(&self) -> usize {
        self.seqs.len()
    }
}

impl Future for AbortWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.shared.lock();
        if self.seqs.iter().all(|s| !st.entries.contains_key(s)) {
            return Poll::Ready(());
        }
        st.gone_wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{TargetPort, TransportId};
    use std::task::Wake;

    fn nexus(n: &str) -> ItNexus {
        ItNexus::new(
            TransportId::Iscsi {
                name: n.into(),
                isid: Some([0; 6]),
            },
            TargetPort {
                id: TransportId::Iscsi {
                    name: "t".into(),
                    isid: None,
                },
                relative_port_id: 1,
                port_group: 1,
            },
        )
    }

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        let w = Waker::from(Arc::new(Flag(false.into())));
        Pin::new(f).poll(&mut Context::from_waker(&w))
    }

    #[test]
    fn ordered_waits_for_older_and_blocks_newer_simple() {
        let ts = TaskSet::new(8);
        let n = nexus("a");
        let s1 = ts.register(&n, 1, TaskAttr::Simple).unwrap();
        let o2 = ts.register(&n, 2, TaskAttr::Ordered).unwrap();
        let s3 = ts.register(&n, 3, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut s1.ready()), Poll::Ready(Ok(())));
        let h4 = ts.register(&n, 4, TaskAttr::HeadOfQueue).unwrap();
        let s5 = ts.register(&n, 5, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut o2.ready()), Poll::Pending);
        assert_eq!(poll_once(&mut s3.ready()), Poll::Pending);
        assert_eq!(poll_once(&mut s5.ready()), Poll::Pending);
        // HEAD OF QUEUE runs at once, even past the ORDERED task.
        assert_eq!(poll_once(&mut h4.ready()), Poll::Ready(Ok(())));
        drop(s1);
        assert_eq!(
            poll_once(&mut o2.ready()),
            Poll::Pending,
            "HOQ still running"
        );
        drop(h4);
        assert_eq!(poll_once(&mut o2.ready()), Poll::Ready(Ok(())));
        assert_eq!(poll_once(&mut s3.ready()), Poll::Pending);
        drop(o2);
        assert_eq!(poll_once(&mut s3.ready()), Poll::Ready(Ok(())));
        assert_eq!(poll_once(&mut s5.ready()), Poll::Ready(Ok(())));
    }

    #[test]
    fn simple_tasks_run_concurrently() {
        let ts = TaskSet::new(8);
        let n = nexus("a");
        let a = ts.register(&n, 1, TaskAttr::Simple).unwrap();
        let b = ts.register(&n, 2, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut a.ready()), Poll::Ready(Ok(())));
        assert_eq!(poll_once(&mut b.ready()), Poll::Ready(Ok(())));
    }

    #[test]
    fn simple_tasks_are_enabled_as_they_register_while_nothing_orders_them() {
        let ts = TaskSet::new(8);
        let n = nexus("a");
        // Enabled at registration: a HEAD OF QUEUE task arriving before
        // its first poll no longer holds it back.
        let early = ts.register(&n, 1, TaskAttr::Simple).unwrap();
        let hoq = ts.register(&n, 2, TaskAttr::HeadOfQueue).unwrap();
        assert_eq!(poll_once(&mut early.ready()), Poll::Ready(Ok(())));
        // While the HEAD OF QUEUE task is in the set, a new SIMPLE one waits
        // for it, and an ORDERED one holds back the SIMPLE ones after it.
        let late = ts.register(&n, 3, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut late.ready()), Poll::Pending);
        drop(hoq);
        assert_eq!(poll_once(&mut late.ready()), Poll::Ready(Ok(())));
        let ordered = ts.register(&n, 4, TaskAttr::Ordered).unwrap();
        let after = ts.register(&n, 5, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut after.ready()), Poll::Pending);
        drop((early, late));
        assert_eq!(poll_once(&mut ordered.ready()), Poll::Ready(Ok(())));
        assert_eq!(poll_once(&mut after.ready()), Poll::Pending);
        drop(ordered);
        assert_eq!(poll_once(&mut after.ready()), Poll::Ready(Ok(())));
        // Once the set has no ORDERED or HEAD OF QUEUE task again, SIMPLE
        // tasks are enabled as they register; an abort still reaches them.
        drop(after);
        let quick = ts.register(&n, 6, TaskAttr::Simple).unwrap();
        let w = ts.abort_matching(|_, tag| tag == 6);
        assert_eq!(w.count(), 1);
        assert!(quick.is_aborted());
        assert_eq!(poll_once(&mut quick.ready()), Poll::Ready(Err(Aborted)));
        assert!(!ts.register(&n, 7, TaskAttr::Simple).unwrap().is_aborted());
    }

    #[test]
    fn depth_bound() {
        let ts = TaskSet::new(2);
        let n = nexus("a");
        let _a = ts.register(&n, 1, TaskAttr::Simple).unwrap();
        let b = ts.register(&n, 2, TaskAttr::Simple).unwrap();
        assert_eq!(
            ts.register(&n, 3, TaskAttr::Simple).err(),
            Some(TaskSetFull)
        );
        drop(b);
        assert!(ts.register(&n, 3, TaskAttr::Simple).is_ok());
    }

    #[test]
    fn abort_waiting_and_running() {
        let ts = TaskSet::new(8);
        let (n, m) = (nexus("a"), nexus("b"));
        let run = ts.register(&n, 1, TaskAttr::Ordered).unwrap();
        let wait = ts.register(&n, 2, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut run.ready()), Poll::Ready(Ok(())));
        let other = ts.register(&m, 3, TaskAttr::HeadOfQueue).unwrap();
        assert_eq!(poll_once(&mut wait.ready()), Poll::Pending);
        assert!(ts.contains(&n, 2));
        assert!(ts.has_tasks_of(&m));
        let mut w = ts.abort_matching(|nx, _| *nx == n);
        assert_eq!(w.count(), 2);
        assert!(!ts.contains(&n, 2));
        assert!(!ts.has_tasks_of(&n));
        assert!(ts.has_tasks_of(&m));
        // The waiting task resolves aborted at once; the running one sees it.
        assert_eq!(poll_once(&mut wait.ready()), Poll::Ready(Err(Aborted)));
        assert!(run.is_aborted());
        assert!(!other.is_aborted());
        assert_eq!(poll_once(&mut w), Poll::Pending);
        drop(wait);
        assert_eq!(poll_once(&mut w), Poll::Pending);
        drop(run);
        assert_eq!(poll_once(&mut w), Poll::Ready(()));
        // ABORT TASK for a tag that is not there marks nothing.
        let none = ts.abort_matching(|nx, tag| *nx == m && tag == 99);
        assert_eq!(none.count(), 0);
    }
}
