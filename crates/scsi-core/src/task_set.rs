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
//! # Many hosts on one LU
//!
//! A SAN LU is shared by many hosts, each on cores of its own, so the
//! common case touches no cache line another host writes:
//!
//! - Tasks are kept, for task management, in *shards* by I_T nexus, each
//!   a lock of its own on cache lines of its own. While no ORDERED or HEAD
//!   OF QUEUE task (a *barrier*) is in the set, a SIMPLE task is enabled as
//!   it registers (every rule above is met at once): it enters its shard
//!   and nothing else. Its `ready` and `is_aborted` take no lock; completing
//!   it is one more lock of its shard.
//! - The depth bound is kept with credits: a shard takes places in the set
//!   from a shared pool a few at a time and gives them back when it holds
//!   too many, so the pool is touched once in several commands; when the
//!   pool runs dry, the shards' spare credits are gathered back before a
//!   task is refused, so TASK SET FULL means the set holds its depth.
//! - Every other task (an ORDERED or HEAD OF QUEUE one, or any task that
//!   arrives while a barrier is in the set) goes through the *ordered
//!   queue*, one lock, with a sequence number that orders it against the
//!   other queued tasks. Tasks enabled at registration are all SIMPLE and
//!   all older than every queued task (none registers that way while a
//!   barrier is in the set: the barrier count is read under the shard
//!   lock, and a barrier counts the shards' tasks under the same locks),
//!   so an ORDERED task waits for them by waiting for the shards to empty.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crossbeam_utils::CachePadded;

use crate::task::{ItNexus, TaskAttr};

/// The task was aborted by task management before it could run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task aborted")]
pub struct Aborted;

/// The task set already holds its configured depth (TASK SET FULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task set full")]
pub struct TaskSetFull;

/// Shards of tasks enabled at registration; a power of two.
const SHARDS: usize = 16;

/// Credits a shard takes from the free pool at a time, at most.
const MAX_BATCH: usize = 8;

#[derive(Debug)]
struct Entry {
    nexus: ItNexus,
    tag: u64,
    attr: TaskAttr,
    started: bool,
    aborted: bool,
    waker: Option<Waker>,
}

/// The ordered queue: tasks that did not start as they registered.
#[derive(Debug, Default)]
struct Queue {
    next_seq: u64,
    entries: BTreeMap<u64, Entry>,
    gone_wakers: Vec<Waker>,
    /// ORDERED tasks in the queue.
    ordered: usize,
    /// HEAD OF QUEUE tasks in the queue.
    head_of_queue: usize,
    /// Queued tasks not yet started (enabled).
    unstarted: usize,
}

impl Queue {
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

    /// Wakes every queued task not yet started (one may be enabled now)
    /// and every abort waiting for tasks to leave.
    fn wake_all(&mut self) {
        if self.unstarted > 0 {
            for e in self.entries.values_mut() {
                if !e.started
                    && let Some(w) = e.waker.take()
                {
                    w.wake();
                }
            }
        }
        for w in self.gone_wakers.drain(..) {
            w.wake();
        }
    }
}

/// Tasks of some I_T nexuses enabled as they registered, by key, and the
/// credits (places in the set) the shard holds for its next tasks.
#[derive(Debug, Default)]
struct Shard {
    next_key: u64,
    entries: BTreeMap<u64, Entry>,
    credits: usize,
}

#[derive(Debug)]
struct Shared {
    /// ORDERED and HEAD OF QUEUE tasks in the set. Changed under the queue
    /// lock; read by every registration and completion, changed rarely.
    barriers: CachePadded<AtomicUsize>,
    /// Places in the set held by nobody: the depth less the tasks in the
    /// set and the credits the shards hold.
    free: CachePadded<AtomicUsize>,
    /// Aborted tasks still in the set: while none is, a handle knows it is
    /// not aborted without a lock.
    aborted: CachePadded<AtomicUsize>,
    depth: usize,
    /// Credits a shard takes from `free` at a time.
    batch: usize,
    queue: CachePadded<Mutex<Queue>>,
    shards: Box<[CachePadded<Mutex<Shard>>]>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        locked(&self.queue)
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        locked(&self.shards[i % SHARDS])
    }

    /// Takes up to `n` places from the free pool; how many it got.
    fn take_free(&self, n: usize) -> usize {
        let mut f = self.free.load(Ordering::Acquire);
        loop {
            let take = f.min(n);
            if take == 0 {
                return 0;
            }
            match self
                .free
                .compare_exchange_weak(f, f - take, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return take,
                Err(now) => f = now,
            }
        }
    }

    /// Gives every credit the shards hold back to the free pool (when the
    /// pool is empty but the set may not be full).
    fn reclaim(&self) {
        for i in 0..SHARDS {
            let mut s = self.shard(i);
            let c = std::mem::take(&mut s.credits);
            if c > 0 {
                self.free.fetch_add(c, Ordering::AcqRel);
            }
        }
    }

    /// A place for a task of shard `s`, from its credits or the pool.
    fn take_credit(&self, s: &mut Shard) -> bool {
        if s.credits == 0 {
            s.credits = self.take_free(self.batch);
        }
        if s.credits == 0 {
            return false;
        }
        s.credits -= 1;
        true
    }

    fn enter(&self, nexus: &ItNexus, tag: u64, attr: TaskAttr) -> Result<Slot, TaskSetFull> {
        let simple = matches!(attr, TaskAttr::Simple | TaskAttr::Aca);
        if simple {
            let shard = (nexus.id() as usize) % SHARDS;
            for reclaimed in [false, true] {
                let mut s = self.shard(shard);
                // Read under the shard lock: a barrier entered before it
                // is seen here, and one entered after it finds this task
                // when it counts the shard's tasks.
                if self.barriers.load(Ordering::Acquire) > 0 {
                    break;
                }
                if self.take_credit(&mut s) {
                    let key = s.next_key;
                    s.next_key += 1;
                    s.entries.insert(
                        key,
                        Entry {
                            nexus: nexus.clone(),
                            tag,
                            attr,
                            started: true,
                            aborted: false,
                            waker: None,
                        },
                    );
                    return Ok(Slot::Shard { shard, key });
                }
                drop(s);
                if reclaimed {
                    return Err(TaskSetFull);
                }
                self.reclaim();
            }
        }
        let mut q = self.queue();
        if self.take_free(1) == 0 {
            self.reclaim();
            if self.take_free(1) == 0 {
                return Err(TaskSetFull);
            }
        }
        if !simple {
            self.barriers.fetch_add(1, Ordering::AcqRel);
        }
        let seq = q.next_seq;
        q.next_seq += 1;
        q.entries.insert(
            seq,
            Entry {
                nexus: nexus.clone(),
                tag,
                attr,
                started: false,
                aborted: false,
                waker: None,
            },
        );
        q.count(attr, true);
        q.unstarted += 1;
        Ok(Slot::Queue { seq })
    }

    fn is_aborted(&self, slot: Slot) -> bool {
        if self.aborted.load(Ordering::Acquire) == 0 {
            return false;
        }
        match slot {
            Slot::Shard { shard, key } => self
                .shard(shard)
                .entries
                .get(&key)
                .is_none_or(|e| e.aborted),
            Slot::Queue { seq } => self.queue().entries.get(&seq).is_none_or(|e| e.aborted),
        }
    }

    fn leave(&self, slot: Slot) {
        match slot {
            Slot::Shard { shard, key } => {
                let mut s = self.shard(shard);
                let aborted = s.entries.remove(&key).is_some_and(|e| e.aborted);
                s.credits += 1;
                if s.credits > 2 * self.batch {
                    let give = s.credits - self.batch;
                    s.credits -= give;
                    self.free.fetch_add(give, Ordering::AcqRel);
                }
                // Read under the shard lock (see `enter`): a queued
                // ORDERED task may wait for this one to leave.
                let barrier = self.barriers.load(Ordering::Acquire) > 0;
                drop(s);
                if aborted {
                    self.aborted.fetch_sub(1, Ordering::AcqRel);
                }
                // An abort may wait for it to leave too.
                if barrier || aborted {
                    self.queue().wake_all();
                }
            }
            Slot::Queue { seq } => {
                let mut q = self.queue();
                if let Some(e) = q.entries.remove(&seq) {
                    if e.aborted {
                        self.aborted.fetch_sub(1, Ordering::AcqRel);
                    }
                    q.count(e.attr, false);
                    if !e.started {
                        q.unstarted = q.unstarted.saturating_sub(1);
                    }
                    if !matches!(e.attr, TaskAttr::Simple | TaskAttr::Aca) {
                        self.barriers.fetch_sub(1, Ordering::AcqRel);
                    }
                    self.free.fetch_add(1, Ordering::AcqRel);
                }
                q.wake_all();
            }
        }
    }

    /// Tasks enabled at registration still in the set (all SIMPLE, all
    /// older than every queued task). The caller holds the queue lock.
    fn unqueued(&self) -> usize {
        (0..SHARDS).map(|i| self.shard(i).entries.len()).sum()
    }
}

/// A bounded task set. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct TaskSet {
    shared: Arc<Shared>,
}

/// Where a registered task is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Enabled as it registered: in shard `shard` under `key`.
    Shard { shard: usize, key: u64 },
    /// In the ordered queue under sequence number `seq`.
    Queue { seq: u64 },
}

/// A task entered with [`TaskSet::enter`], to be given back with
/// [`TaskSet::leave`].
#[derive(Debug)]
#[must_use = "a ticket not given back to TaskSet::leave leaves its task in the set"]
pub struct Ticket {
    slot: Slot,
}

/// A registered task; dropping it completes the task.
#[derive(Debug)]
pub struct TaskHandle {
    shared: Arc<Shared>,
    slot: Slot,
}

impl TaskSet {
    /// A task set holding at most `depth` tasks (at least 1).
    pub fn new(depth: usize) -> TaskSet {
        let depth = depth.max(1);
        TaskSet {
            shared: Arc::new(Shared {
                barriers: CachePadded::new(AtomicUsize::new(0)),
                free: CachePadded::new(AtomicUsize::new(depth)),
                aborted: CachePadded::new(AtomicUsize::new(0)),
                depth,
                batch: (depth / (4 * SHARDS)).clamp(1, MAX_BATCH),
                queue: CachePadded::new(Mutex::new(Queue::default())),
                shards: (0..SHARDS)
                    .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                    .collect(),
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
        let slot = self.shared.enter(nexus, tag, attr)?;
        Ok(TaskHandle {
            shared: self.shared.clone(),
            slot,
        })
    }

    /// Enters a task like [`register`](Self::register), without a
    /// reference to the set: for a caller that keeps the set alive as long
    /// as the task itself and saves the reference count, which every
    /// command of every host on the LU would otherwise change. The ticket
    /// must be given back with [`leave`](Self::leave), which completes the
    /// task; a ticket dropped without it leaves its task in the set, and
    /// the set counts it towards its depth until the set itself goes.
    pub fn enter(&self, nexus: &ItNexus, tag: u64, attr: TaskAttr) -> Result<Ticket, TaskSetFull> {
        self.shared
            .enter(nexus, tag, attr)
            .map(|slot| Ticket { slot })
    }

    /// Resolves when the ticket's task may run; [`TaskHandle::ready`].
    pub fn ready<'a>(&'a self, ticket: &Ticket) -> Ready<'a> {
        Ready {
            shared: &self.shared,
            slot: ticket.slot,
        }
    }

    /// True once task management aborted the ticket's task.
    pub fn is_aborted(&self, ticket: &Ticket) -> bool {
        self.shared.is_aborted(ticket.slot)
    }

    /// Completes the ticket's task: it leaves the set.
    pub fn leave(&self, ticket: Ticket) {
        self.shared.leave(ticket.slot);
    }
    /// Number of tasks in the set.
    pub fn len(&self) -> usize {
        let q = self.shared.queue();
        q.entries.len() + self.shared.unqueued()
    }

    /// True when no task is in the set.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks every task for which `pred(nexus, tag)` holds as aborted, and
    /// returns how many and a future that resolves when all have ended.
    pub fn abort_matching(&self, pred: impl Fn(&ItNexus, u64) -> bool) -> AbortWait {
        let sh = &self.shared;
        let mut slots = Vec::new();
        let mut mark = |slot: Slot, e: &mut Entry| {
            if !e.aborted && pred(&e.nexus, e.tag) {
                e.aborted = true;
                sh.aborted.fetch_add(1, Ordering::AcqRel);
                slots.push(slot);
                if let Some(w) = e.waker.take() {
                    w.wake();
                }
            }
        };
        let mut q = sh.queue();
        for (seq, e) in q.entries.iter_mut() {
            mark(Slot::Queue { seq: *seq }, e);
        }
        drop(q);
        for shard in 0..SHARDS {
            let mut s = sh.shard(shard);
            for (key, e) in s.entries.iter_mut() {
                mark(Slot::Shard { shard, key: *key }, e);
            }
        }
        AbortWait {
            shared: sh.clone(),
            slots,
        }
    }

    /// Calls `f` on every task in the set until it returns true.
    fn any(&self, f: impl Fn(&Entry) -> bool) -> bool {
        let sh = &self.shared;
        sh.queue().entries.values().any(&f)
            || (0..SHARDS).any(|i| sh.shard(i).entries.values().any(&f))
    }

    /// Is a task with this tag of this nexus in the set (and not aborted)?
    pub fn contains(&self, nexus: &ItNexus, tag: u64) -> bool {
        self.any(|e| !e.aborted && e.tag == tag && e.nexus == *nexus)
    }

    /// Does the nexus have any (non-aborted) task in the set?
    pub fn has_tasks_of(&self, nexus: &ItNexus) -> bool {
        self.any(|e| !e.aborted && e.nexus == *nexus)
    }
}

/// Whether the queued task `seq` may start. A HEAD OF QUEUE task counts
/// as older than every task not yet started, whenever it arrived; tasks
/// enabled at registration (`unqueued`, all SIMPLE) are older than every
/// queued one.
fn enabled(q: &Queue, seq: u64, attr: TaskAttr, unqueued: usize) -> bool {
    // Another HEAD OF QUEUE task is in the set (none but this task, when
    // this one is HEAD OF QUEUE itself).
    let hoq_pending = q.head_of_queue > usize::from(attr == TaskAttr::HeadOfQueue);
    match attr {
        TaskAttr::HeadOfQueue => true,
        TaskAttr::Ordered => {
            !hoq_pending && unqueued == 0 && q.entries.range(..seq).next().is_none()
        }
        TaskAttr::Simple | TaskAttr::Aca => {
            !hoq_pending
                && (q.ordered == 0
                    || !q
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
        Ready {
            shared: &self.shared,
            slot: self.slot,
        }
    }

    /// True once task management aborted this task.
    pub fn is_aborted(&self) -> bool {
        self.shared.is_aborted(self.slot)
    }
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        self.shared.leave(self.slot);
    }
}

/// Future of [`TaskHandle::ready`] and [`TaskSet::ready`].
#[derive(Debug)]
pub struct Ready<'a> {
    shared: &'a Shared,
    slot: Slot,
}

impl Future for Ready<'_> {
    type Output = Result<(), Aborted>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let sh = self.shared;
        if sh.is_aborted(self.slot) {
            return Poll::Ready(Err(Aborted));
        }
        let Slot::Queue { seq } = self.slot else {
            return Poll::Ready(Ok(()));
        };
        let mut q = sh.queue();
        let Some((attr, aborted, started)) =
            q.entries.get(&seq).map(|e| (e.attr, e.aborted, e.started))
        else {
            return Poll::Ready(Err(Aborted));
        };
        if aborted {
            return Poll::Ready(Err(Aborted));
        }
        if started {
            return Poll::Ready(Ok(()));
        }
        let unqueued = if attr == TaskAttr::Ordered {
            sh.unqueued()
        } else {
            0
        };
        if enabled(&q, seq, attr, unqueued) {
            if let Some(e) = q.entries.get_mut(&seq) {
                e.started = true;
                e.waker = None;
            }
            q.unstarted = q.unstarted.saturating_sub(1);
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = q.entries.get_mut(&seq) {
            e.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// Resolves when every task an abort marked has left the task set.
#[derive(Debug)]
pub struct AbortWait {
    shared: Arc<Shared>,
    slots: Vec<Slot>,
}

impl AbortWait {
    /// How many tasks were marked.
    pub fn count(&self) -> usize {
        self.slots.len()
    }
}

impl Future for AbortWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let sh = &self.shared;
        // The queue lock is held while the shards are looked at: a task
        // leaving a shard wakes the queue's gone_wakers under that lock
        // after it left, so the waker pushed here is not missed.
        let mut q = sh.queue();
        let gone = self.slots.iter().all(|s| match *s {
            Slot::Queue { seq } => !q.entries.contains_key(&seq),
            Slot::Shard { shard, key } => !sh.shard(shard).entries.contains_key(&key),
        });
        if gone {
            return Poll::Ready(());
        }
        q.gone_wakers.push(cx.waker().clone());
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
    fn ordered_waits_for_simple_tasks_of_every_nexus_enabled_before_it() {
        let ts = TaskSet::new(8);
        let (a, b) = (nexus("a"), nexus("b"));
        let sa = ts.register(&a, 1, TaskAttr::Simple).unwrap();
        let sb = ts.register(&b, 1, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut sa.ready()), Poll::Ready(Ok(())));
        assert_eq!(ts.len(), 2);
        let o = ts.register(&a, 2, TaskAttr::Ordered).unwrap();
        // Behind the ORDERED task, a SIMPLE one of another nexus waits.
        let late = ts.register(&b, 2, TaskAttr::Simple).unwrap();
        assert_eq!(poll_once(&mut o.ready()), Poll::Pending);
        drop(sa);
        assert_eq!(
            poll_once(&mut o.ready()),
            Poll::Pending,
            "b's task is older"
        );
        assert!(ts.contains(&b, 1));
        drop(sb);
        assert_eq!(poll_once(&mut o.ready()), Poll::Ready(Ok(())));
        assert_eq!(poll_once(&mut late.ready()), Poll::Pending);
        drop(o);
        assert_eq!(poll_once(&mut late.ready()), Poll::Ready(Ok(())));
        assert_eq!(ts.len(), 1);
        // The depth bound counts tasks of both kinds.
        let _more: Vec<_> = (3..10)
            .map(|t| ts.register(&a, t, TaskAttr::Simple).unwrap())
            .collect();
        assert_eq!(
            ts.register(&a, 10, TaskAttr::Ordered).err(),
            Some(TaskSetFull)
        );
        assert_eq!(
            ts.register(&b, 10, TaskAttr::Simple).err(),
            Some(TaskSetFull)
        );
    }

    #[test]
    fn tasks_from_many_threads_leave_the_set_empty() {
        let ts = TaskSet::new(64);
        std::thread::scope(|s| {
            for host in 0..4 {
                let ts = ts.clone();
                s.spawn(move || {
                    let n = nexus(&format!("h{host}"));
                    for tag in 0..2000u64 {
                        let attr = if tag % 97 == 0 {
                            TaskAttr::Ordered
                        } else {
                            TaskAttr::Simple
                        };
                        let h = ts.register(&n, tag, attr).unwrap();
                        let mut r = h.ready();
                        let w = Waker::noop();
                        let mut cx = Context::from_waker(w);
                        while Pin::new(&mut r).poll(&mut cx).is_pending() {
                            std::thread::yield_now();
                        }
                    }
                });
            }
        });
        assert!(ts.is_empty());
        assert_eq!(ts.shared.queue().entries.len(), 0);
        assert!((0..SHARDS).all(|i| ts.shared.shard(i).entries.is_empty()));
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
