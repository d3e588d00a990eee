//! The node driver: one tokio task running the gateway's N_Ports — FCP
//! target ports serving a [`ScsiTarget`], FCP initiator ports, and the
//! NPIV virtual initiator ports the initiator factory creates per
//! front-end nexus — each physical port on its own fabric port (virtual
//! ports on their parent's), all fed by one in-memory frame channel.
//!
//! The node's state (the sans-IO [`NPort`]s, their LU futures, the
//! frame and control channels) sits behind one lock and is driven by
//! the node's driver, from two places:
//!
//! - the node's own task, whenever something it waits on is ready (a
//!   frame from another node's link, an LU future finishing on the blocking
//!   pool, the timeout tick);
//! - the caller that submits a task (a remote LU forwarding it through an
//!   [`FcpInitiatorFactory`](super::FcpInitiatorFactory) initiator), at
//!   once, when the lock is free: the FCP_CMND crosses the fabric, a target
//!   port of this node runs the task, and an answer that is ready comes
//!   back before `submit` returns — no task hop on the way there or back.
//!   Every poll made there uses the node task's waker, so whatever is not
//!   ready wakes the node's task, never a caller that has moved on. When
//!   the lock is taken (by the node's task, or by a chain that comes back
//!   to this node), the command goes through the control channel instead.
//!
//! LU futures run inside the node (no task per command); frames between
//! the node's own ports cross the switch synchronously and come back
//! through the channel.

use std::collections::{HashMap, VecDeque};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use unifab_scsi_core::idmap::IdMap;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use unifab_scsi_core::initiator::{InitiatorError, Outcome, Request};
use unifab_scsi_core::{Dispatch, Keyed, Lun, ScsiTarget, TaskResult, TmfFunction, TmfResponse};

use super::switch::{FabricPort, Switch};
use crate::link::{FcLink, LinkError};
use crate::nport::{CommandId, NPort, NPortConfig, NPortEvent, NPortStats, TaskId};
use crate::wire::frame::Frame;
use crate::wire::{FcId, Wwn};

/// What the node's ports look like, for `unifab show` and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortView {
    /// Port name.
    pub port_name: Wwn,
    /// Address (00.00.00 before fabric login).
    pub fc_id: FcId,
    /// Logged into the fabric.
    pub online: bool,
    /// Target role.
    pub target: bool,
    /// Initiator role.
    pub initiator: bool,
    /// NPIV port.
    pub virtual_port: bool,
    /// Peers with process login: (address, name, target?, initiator?).
    pub peers: Vec<(FcId, Wwn, bool, bool)>,
    /// When `online` last changed (or the port was added).
    pub since: Instant,
    /// Why the port last went offline, and when.
    pub last_offline: Option<(String, Instant)>,
    /// The remote ports it has had a process login with, up or down (at
    /// most [`SESSION_RECORDS`]; the one down longest is forgotten first).
    pub sessions: Vec<SessionRecord>,
    /// The port's counters, as of the view (the view is republished at
    /// least every [`STATS_REFRESH`], so they are at most that old).
    pub stats: NPortStats,
    /// Target role: write commands waiting for room in the write-data
    /// budget.
    pub writes_waiting: usize,
    /// Target role: write data its admitted write commands account for.
    pub write_bytes_held: u64,
    /// Target role: write data its admitted writes have yet to receive
    /// (counted, with the other target ports sharing its budget, under
    /// `max_write_in_flight`).
    pub write_bytes_to_come: u64,
    /// Initiator role: frames its open commands can still bring back
    /// (counted, with the other ports on its link, under `max_frames_in`).
    pub frames_in: u32,
    /// Initiator role: commands waiting for their target port or for room
    /// under the link's `max_frames_in`.
    pub commands_waiting: usize,
}

/// How stale the counters in a [`NodePortView`] may get.
pub const STATS_REFRESH: Duration = Duration::from_secs(1);

/// A port's sessions (process logins) with one remote port, over time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// The remote port.
    pub port_name: Wwn,
    /// In session now.
    pub up: bool,
    /// When `up` last changed.
    pub since: Instant,
    /// Process logins so far.
    pub logins: u64,
    /// Why the session last ended, and when.
    pub last_down: Option<(String, Instant)>,
}

/// Remote ports a node port keeps [`SessionRecord`]s for.
pub const SESSION_RECORDS: usize = 256;

/// What a slot remembers of its port for the view.
#[derive(Debug, Clone)]
struct PortHistory {
    since: Instant,
    last_offline: Option<(String, Instant)>,
    sessions: Vec<SessionRecord>,
}

impl PortHistory {
    fn new(now: Instant) -> PortHistory {
        PortHistory {
            since: now,
            last_offline: None,
            sessions: Vec::new(),
        }
    }

    fn session(&mut self, now: Instant, port_name: Wwn) -> &mut SessionRecord {
        if let Some(i) = self.sessions.iter().position(|r| r.port_name == port_name) {
            return &mut self.sessions[i];
        }
        if self.sessions.len() >= SESSION_RECORDS {
            // Forget the session down longest (all up: the oldest).
            let i = self
                .sessions
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| (r.up, r.since))
                .map_or(0, |(i, _)| i);
            self.sessions.swap_remove(i);
        }
        self.sessions.push(SessionRecord {
            port_name,
            up: false,
            since: now,
            logins: 0,
            last_down: None,
        });
        let last = self.sessions.len() - 1;
        &mut self.sessions[last]
    }
}

type TmfOutcome = Result<TmfResponse, InitiatorError>;

pub(crate) enum Control {
    AddPort {
        name: String,
        cfg: Box<NPortConfig>,
        scsi: Option<ScsiTarget>,
        /// A port that also carries NPIV ports of this (physical) port.
        carries_for: Option<Wwn>,
    },
    AddPortVia {
        name: String,
        cfg: Box<NPortConfig>,
        scsi: Option<ScsiTarget>,
        connect: Connect,
    },
    Link {
        att: usize,
        up: bool,
    },
    AcquireVirtual {
        parent: Wwn,
        wwpn: Wwn,
    },
    ReleaseVirtual {
        wwpn: Wwn,
    },
    Submit {
        local: Wwn,
        target: Wwn,
        id: CommandId,
        request: Request,
        reply: oneshot::Sender<Outcome>,
    },
    Tmf {
        local: Wwn,
        target: Wwn,
        id: CommandId,
        lun: Lun,
        function: TmfFunction,
        reply: oneshot::Sender<TmfOutcome>,
    },
    Abandon {
        local: Wwn,
        id: CommandId,
    },
    LogoutPeer {
        local: Wwn,
        peer: Wwn,
    },
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::AddPort { .. } => "AddPort",
            Control::AddPortVia { .. } => "AddPortVia",
            Control::Link { .. } => "Link",
            Control::AcquireVirtual { .. } => "AcquireVirtual",
            Control::ReleaseVirtual { .. } => "ReleaseVirtual",
            Control::Submit { .. } => "Submit",
            Control::Tmf { .. } => "Tmf",
            Control::Abandon { .. } => "Abandon",
            Control::LogoutPeer { .. } => "LogoutPeer",
        })
    }
}

/// The node's receive queue: every link of the node hands frames to it.
/// Frames queued while the node is being driven are picked up by that same
/// drive (no wake-up); otherwise the node's task is woken.
struct Inbox {
    queue: Mutex<VecDeque<(usize, Frame)>>,
    /// `queue` is not empty. Set under the queue's lock by whoever pushes,
    /// cleared under it by whoever empties it; read without the lock, so
    /// a drive round with nothing queued costs no lock (SeqCst, paired
    /// with `driving`: a pusher that sees `driving` set relies on the
    /// driver seeing this flag after it clears `driving`).
    queued: AtomicBool,
    driving: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Inbox {
    /// Moves the queued frames into `out` (empty), keeping both buffers.
    fn take_into(&self, out: &mut VecDeque<(usize, Frame)>) {
        if !self.queued.load(Ordering::SeqCst) {
            return;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *q, out);
        self.queued.store(false, Ordering::SeqCst);
    }

    fn is_empty(&self) -> bool {
        !self.queued.load(Ordering::SeqCst)
    }

    fn wake(&self) {
        if let Some(w) = self
            .waker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            w.wake_by_ref();
        }
    }

    fn node_waker(&self) -> Waker {
        self.waker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| Waker::noop().clone())
    }
}

/// The link from the switch to one fabric port of a node.
struct NodeLink {
    inbox: Arc<Inbox>,
    tag: usize,
    name: String,
}

impl std::fmt::Debug for NodeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeLink({})", self.name)
    }
}

impl FcLink for NodeLink {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        {
            let mut q = self.inbox.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= FRAME_QUEUE {
                return Err(LinkError::Full);
            }
            q.push_back((self.tag, frame));
            self.inbox.queued.store(true, Ordering::SeqCst);
        }
        if !self.inbox.driving.load(Ordering::SeqCst) {
            self.inbox.wake();
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("node link {}", self.name)
    }
}

struct Shared {
    next_id: AtomicU64,
    view: Mutex<Vec<NodePortView>>,
    driver: Mutex<Driver>,
    inbox: Arc<Inbox>,
    /// The node's task found the driver busy and went back to sleep:
    /// whoever lets go of the driver next wakes it.
    wanted: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// A handle on a running node. Cheap to clone; the node stops when every
/// handle is gone.
#[derive(Debug, Clone)]
pub struct FcNode {
    pub(crate) tx: mpsc::Sender<Control>,
    shared: Arc<Shared>,
}

/// The node's end of a port attached through a link of its own (an FCoE
/// ENode's virtual link to a remote FCF, say) instead of a port of the
/// node's switch: frames handed to it reach the port, and the link's
/// owner reports the link's state with [`Uplink::set_link`]. The port
/// stays offline until the link is reported up, logs into the fabric
/// (FLOGI, then its NPIV ports' FDISCs) each time it comes up, and drops
/// every login when it goes down.
#[derive(Clone)]
pub struct Uplink {
    frames: Arc<NodeLink>,
    ctl: mpsc::WeakSender<Control>,
    att: usize,
}

impl std::fmt::Debug for Uplink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uplink({})", self.frames.name)
    }
}

impl Uplink {
    /// Reports the link up (log in) or down (every login ends).
    pub fn set_link(&self, up: bool) {
        if let Some(tx) = self.ctl.upgrade() {
            let _ = tx.try_send(Control::Link { att: self.att, up });
        }
    }
}

impl FcLink for Uplink {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        self.frames.transmit(frame)
    }

    fn describe(&self) -> String {
        self.frames.describe()
    }
}

/// Connects a port's [`Uplink`] (frames toward the port) to the link its
/// frames leave by, which it returns.
pub type Connect = Box<dyn FnOnce(Uplink) -> Arc<dyn FcLink> + Send>;

/// Where a port's frames leave the node.
#[derive(Debug)]
enum Attachment {
    Switch(FabricPort),
    Link(Arc<dyn FcLink>),
}

impl Attachment {
    fn transmit(&self, f: Frame) -> Result<(), LinkError> {
        match self {
            Attachment::Switch(p) => p.transmit(f),
            Attachment::Link(l) => l.transmit(f),
        }
    }

    fn transmit_all(&self, frames: impl IntoIterator<Item = Frame>) {
        match self {
            Attachment::Switch(p) => p.transmit_all(frames),
            Attachment::Link(l) => {
                for f in frames {
                    let _ = l.transmit(f);
                }
            }
        }
    }

    fn detach(&self) {
        if let Attachment::Switch(p) = self {
            p.detach();
        }
    }
}

/// Frames one node's channel holds at most (the receive side of every
/// port of the node).
const FRAME_QUEUE: usize = 65_536;
/// Control messages (commands) queued at most.
const CONTROL_QUEUE: usize = 16_384;
/// Rounds of taking what is ready before the node waits again.
const BATCH: usize = 64;
/// How often timeouts are checked.
const TICK: Duration = Duration::from_millis(50);

impl FcNode {
    /// Starts a node attached to `switch`. Must be called within a tokio
    /// runtime.
    pub fn spawn(switch: &Switch, name: &str) -> FcNode {
        let (tx, rx) = mpsc::channel(CONTROL_QUEUE);
        let inbox = Arc::new(Inbox {
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicBool::new(false),
            driving: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let driver = Driver {
            ctl_tx: tx.downgrade(),
            name: name.to_string(),
            switch: switch.clone(),
            inbox: inbox.clone(),
            scratch: VecDeque::new(),
            out: Vec::new(),
            ctl: rx,
            tick,
            slots: Vec::new(),
            links: Vec::new(),
            by_addr: IdMap::default(),
            by_name: IdMap::default(),
            replies: IdMap::default(),
            tmf_replies: IdMap::default(),
            tasks: FuturesUnordered::new(),
            tmfs: FuturesUnordered::new(),
            view_changed: false,
            published_at: Instant::now(),
        };
        let shared = Arc::new(Shared {
            next_id: AtomicU64::new(1),
            view: Mutex::new(Vec::new()),
            driver: Mutex::new(driver),
            inbox,
            wanted: AtomicBool::new(false),
        });
        let task_shared = shared.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            info!(node = %name, "FC node running");
            std::future::poll_fn(|cx| {
                {
                    let mut w = task_shared
                        .inbox
                        .waker
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *w = Some(cx.waker().clone());
                    }
                }
                task_shared.drive(cx)
            })
            .await;
            let d = task_shared.driver.lock().unwrap_or_else(|p| p.into_inner());
            for l in &d.links {
                l.detach();
            }
            info!(node = %name, "FC node stopped");
        });
        FcNode { tx, shared }
    }

    /// Runs `c` now if the node is free, else queues it for the node's
    /// task. Fails only when the queue is full.
    ///
    /// Controls keep their order: what was queued while the node was busy
    /// runs before `c` (a session's first command must not overtake the
    /// request that creates its virtual N_Port, or it finds no port and
    /// fails with LOGICAL UNIT COMMUNICATION FAILURE).
    pub(crate) fn run(&self, c: Control) -> Result<(), InitiatorError> {
        match self.shared.try_driver() {
            Some(mut d) => {
                let now = Instant::now();
                while let Ok(queued) = d.ctl.try_recv() {
                    d.control(now, queued);
                }
                d.control(now, c);
                let waker = self.shared.inbox.node_waker();
                let mut cx = Context::from_waker(&waker);
                let _ = d.drive(&mut cx, &self.shared, true);
                drop(d);
                self.shared.released();
                Ok(())
            }
            None => self.tx.try_send(c).map_err(|_| InitiatorError::QueueFull),
        }
    }

    /// Adds an N_Port on a new fabric port named `name`, serving `scsi` if
    /// it is a target. It logs in at once.
    pub fn add_port(
        &self,
        name: &str,
        cfg: NPortConfig,
        scsi: Option<ScsiTarget>,
    ) -> Result<(), InitiatorError> {
        self.run(Control::AddPort {
            name: name.to_string(),
            cfg: Box::new(cfg),
            scsi,
            carries_for: None,
        })
    }

    /// Adds a physical initiator N_Port on a switch port of its own that
    /// carries NPIV ports for `primary` beside it: one physical port's
    /// NPIV ports share its area, so it holds at most 255, and a gateway
    /// with more hosts than that spreads them over `primary` and its
    /// carriers (a new NPIV port goes to the least loaded).
    pub fn add_npiv_carrier(
        &self,
        name: &str,
        cfg: NPortConfig,
        primary: Wwn,
    ) -> Result<(), InitiatorError> {
        self.run(Control::AddPort {
            name: name.to_string(),
            cfg: Box::new(cfg),
            scsi: None,
            carries_for: Some(primary),
        })
    }

    /// Adds an N_Port whose frames travel through a link of its own:
    /// `connect` receives the port's [`Uplink`] and returns the link
    /// toward the fabric. The port logs in when the uplink reports the
    /// link up.
    pub fn add_port_via(
        &self,
        name: &str,
        cfg: NPortConfig,
        scsi: Option<ScsiTarget>,
        connect: Connect,
    ) -> Result<(), InitiatorError> {
        self.run(Control::AddPortVia {
            name: name.to_string(),
            cfg: Box::new(cfg),
            scsi,
            connect,
        })
    }

    pub(crate) fn next_id(&self) -> CommandId {
        CommandId(self.shared.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// The node's ports.
    pub fn ports(&self) -> Vec<NodePortView> {
        self.shared
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until `local` has a process login with `target`, up to
    /// `timeout` (start-up, tests).
    pub async fn wait_for_peer(&self, local: Wwn, target: Wwn, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ok = self
                .ports()
                .iter()
                .any(|p| p.port_name == local && p.peers.iter().any(|q| q.1 == target));
            if ok {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Explicit N_Port logout (LOGO) from `peer`.
    pub fn logout_peer(&self, local: Wwn, peer: Wwn) {
        let _ = self.run(Control::LogoutPeer { local, peer });
    }
}

impl Shared {
    /// The node's task: drives the node unless a submitter is driving it
    /// inline right now. Then the task does not wait for the lock (a
    /// submitter preempted while holding it would park a runtime worker
    /// behind it, on a 2-core host for a whole time slice); it asks the
    /// holder to wake it on release and yields.
    fn drive(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut guard = self.try_driver();
        if guard.is_none() {
            self.wanted.store(true, Ordering::SeqCst);
            // The holder may have let go between the two looks; if the
            // lock is still taken, its release sees `wanted`.
            guard = self.try_driver();
        }
        let Some(mut d) = guard else {
            return Poll::Pending;
        };
        self.wanted.store(false, Ordering::SeqCst);
        let r = d.drive(cx, self, false);
        drop(d);
        self.released();
        r
    }

    fn try_driver(&self) -> Option<std::sync::MutexGuard<'_, Driver>> {
        match self.driver.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// After letting go of the driver: wakes the node's task if it found
    /// the driver busy meanwhile.
    fn released(&self) {
        if self.wanted.swap(false, Ordering::SeqCst) {
            self.inbox.wake();
        }
    }
}

struct Slot {
    att: usize,
    port: NPort,
    /// A physical port that carries NPIV ports of this primary port too.
    carries_for: Option<Wwn>,
    scsi: Option<ScsiTarget>,
    virtual_users: usize,
    /// Waiting to send its fabric login (NPIV ports log in one at a
    /// time, after their parent).
    waiting_login: bool,
    /// An NPIV port nobody uses any more, kept until the fabric answers
    /// its FDISC so that it can log out of the address it is given.
    closing: bool,
    history: PortHistory,
}

/// Notes where a scan found a port. The map is bounded: past twice the
/// number of places it holds mostly entries of ports long gone, and starts
/// again.
fn remember<K: std::hash::Hash + Eq>(
    map: &mut IdMap<K, usize>,
    key: K,
    place: usize,
    places: usize,
) {
    if map.len() >= places * 2 {
        map.clear();
    }
    map.insert(key, place);
}

struct Driver {
    /// Handed to uplinks, which report their link state through it.
    ctl_tx: mpsc::WeakSender<Control>,
    name: String,
    switch: Switch,
    inbox: Arc<Inbox>,
    scratch: VecDeque<(usize, Frame)>,
    out: Vec<Frame>,
    ctl: mpsc::Receiver<Control>,
    tick: tokio::time::Interval,
    /// Boxed: a slot is taken out and put back on every flush.
    slots: Vec<Option<Box<Slot>>>,
    /// Per attachment (fabric port or uplink): where frames are sent.
    links: Vec<Attachment>,
    /// Where a frame's port was last found, by attachment and D_ID, and a
    /// port by name: each entry is checked when used and a miss falls back
    /// to scanning the slots, so a stale entry costs a scan, never the
    /// wrong port. (A gateway with a host session per NPIV port has as
    /// many slots as sessions.)
    by_addr: IdMap<(usize, FcId), usize>,
    by_name: IdMap<Wwn, usize>,
    replies: IdMap<CommandId, oneshot::Sender<Outcome>>,
    tmf_replies: IdMap<CommandId, oneshot::Sender<TmfOutcome>>,
    /// Target tasks still running: (slot, task) and the LU's answer.
    tasks: FuturesUnordered<Keyed<(usize, TaskId), TaskResult>>,
    tmfs: FuturesUnordered<Keyed<(usize, TaskId), TmfResponse>>,
    view_changed: bool,
    /// When the view was last published (the counters in it age).
    published_at: Instant,
}

impl Driver {
    /// Handles everything that is ready, polling with `cx`; `Ready` once
    /// every handle on the node is gone.
    ///
    /// `inline` (a caller drives): the control channel and the tick are left
    /// to the node's task, whose registrations stay in place.
    fn drive(&mut self, cx: &mut Context<'_>, shared: &Shared, inline: bool) -> Poll<()> {
        self.inbox.driving.store(true, Ordering::SeqCst);
        let r = self.drive_rounds(cx, shared, inline);
        self.inbox.driving.store(false, Ordering::SeqCst);
        // A frame that came in after the last look wakes the node's task.
        if !self.inbox.is_empty() {
            self.inbox.wake();
        }
        r
    }

    fn drive_rounds(&mut self, cx: &mut Context<'_>, shared: &Shared, inline: bool) -> Poll<()> {
        let now = Instant::now();
        let mut idle = false;
        for _ in 0..BATCH {
            let mut any = false;
            if inline {
                while let Ok(c) = self.ctl.try_recv() {
                    self.control(now, c);
                    any = true;
                }
            } else {
                loop {
                    match self.ctl.poll_recv(cx) {
                        Poll::Ready(Some(c)) => {
                            self.control(now, c);
                            any = true;
                        }
                        // Every handle is gone: the node stops.
                        Poll::Ready(None) => return Poll::Ready(()),
                        Poll::Pending => break,
                    }
                }
            }
            self.inbox.take_into(&mut self.scratch);
            while let Some((att, f)) = self.scratch.pop_front() {
                self.frame(now, att, f);
                any = true;
            }
            // An empty set is not polled: polling registers the waker (an
            // atomic swap on a line the completing threads also write).
            while !self.tasks.is_empty() {
                let Poll::Ready(Some(((slot, id), r))) = self.tasks.poll_next_unpin(cx) else {
                    break;
                };
                self.task_done(now, slot, id, r);
                any = true;
            }
            while !self.tmfs.is_empty() {
                let Poll::Ready(Some(((slot, id), r))) = self.tmfs.poll_next_unpin(cx) else {
                    break;
                };
                if let Some(Some(s)) = self.slots.get_mut(slot) {
                    s.port.complete_tmf(now, id, r);
                }
                any = true;
            }
            if !inline && self.tick.poll_tick(cx).is_ready() {
                for s in self.slots.iter_mut().flatten() {
                    s.port.handle_timeout(now);
                }
                if now.saturating_duration_since(self.published_at) >= STATS_REFRESH {
                    self.view_changed = true;
                }
                any = true;
            }
            any |= self.flush(cx, now);
            if !any {
                idle = true;
                break;
            }
        }
        if std::mem::take(&mut self.view_changed) {
            self.publish(shared);
            self.published_at = now;
        }
        if !idle {
            // Every round found work: yield to the runtime, but come back
            // (nothing else may wake the node for what is still ready, such
            // as a task pushed in the last round and not yet polled).
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    fn task_done(&mut self, now: Instant, slot: usize, id: TaskId, r: TaskResult) {
        if let Some(Some(s)) = self.slots.get_mut(slot) {
            s.port.complete_task(now, id, r);
        }
    }

    fn frame(&mut self, now: Instant, att: usize, f: Frame) {
        let h = f.header;
        if let Some(&i) = self.by_addr.get(&(att, h.d_id)) {
            match self.slots.get_mut(i).and_then(Option::as_mut) {
                Some(s) if s.att == att && s.port.is_online() && s.port.fc_id() == h.d_id => {
                    s.port.handle_frame(now, f);
                    return;
                }
                _ => {
                    self.by_addr.remove(&(att, h.d_id));
                }
            }
        }
        let mut target = None;
        for (i, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.att != att {
                continue;
            }
            if s.port.is_online() && s.port.fc_id() == h.d_id {
                target = Some(i);
                remember(&mut self.by_addr, (att, h.d_id), i, self.slots.len());
                break;
            }
            if s.port.awaits_fabric_login(h.ox_id) {
                target = Some(i);
            }
        }
        match target
            .and_then(|i| self.slots.get_mut(i))
            .and_then(Option::as_mut)
        {
            Some(s) => s.port.handle_frame(now, f),
            None => debug!(node = %self.name, d_id = %h.d_id, "frame for no port of this node"),
        }
    }

    fn slot_index(&mut self, w: Wwn) -> Option<usize> {
        let named =
            |s: &Option<Box<Slot>>| s.as_ref().is_some_and(|s| s.port.config().port_name == w);
        if let Some(&i) = self.by_name.get(&w) {
            if self.slots.get(i).is_some_and(named) {
                return Some(i);
            }
            self.by_name.remove(&w);
        }
        let i = self.slots.iter().position(named)?;
        remember(&mut self.by_name, w, i, self.slots.len());
        Some(i)
    }

    fn slot_mut(&mut self, w: Wwn) -> Option<&mut Slot> {
        let i = self.slot_index(w)?;
        self.slots
            .get_mut(i)
            .and_then(Option::as_mut)
            .map(|b| &mut **b)
    }

    /// The physical port a new NPIV port of `parent` goes on: `parent` or
    /// one of its carriers, online first, then the one with the fewest
    /// NPIV ports.
    fn npiv_carrier(&self, parent: Wwn) -> Option<usize> {
        let mut load: HashMap<usize, usize> = HashMap::new();
        for s in self.slots.iter().flatten() {
            if s.port.config().virtual_port {
                *load.entry(s.att).or_default() += 1;
            }
        }
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
            .filter(|(_, s)| {
                !s.port.config().virtual_port
                    && (s.port.config().port_name == parent || s.carries_for == Some(parent))
            })
            .min_by_key(|(i, s)| {
                (
                    !s.port.is_online(),
                    load.get(&s.att).copied().unwrap_or(0),
                    *i,
                )
            })
            .map(|(i, _)| i)
    }

    fn control(&mut self, now: Instant, c: Control) {
        match c {
            Control::AddPort {
                name,
                cfg,
                scsi,
                carries_for,
            } => {
                let att = self.links.len();
                let link = NodeLink {
                    inbox: self.inbox.clone(),
                    tag: att,
                    name: name.clone(),
                };
                let port = self.switch.attach(&name, Arc::new(link));
                self.links.push(Attachment::Switch(port));
                let mut np = NPort::new(*cfg);
                np.link_up(now);
                self.slots.push(Some(Box::new(Slot {
                    att,
                    port: np,
                    carries_for,
                    scsi,
                    virtual_users: 0,
                    waiting_login: false,
                    closing: false,
                    history: PortHistory::new(Instant::now()),
                })));
            }
            Control::AddPortVia {
                name,
                cfg,
                scsi,
                connect,
            } => {
                let att = self.links.len();
                let uplink = Uplink {
                    frames: Arc::new(NodeLink {
                        inbox: self.inbox.clone(),
                        tag: att,
                        name,
                    }),
                    ctl: self.ctl_tx.clone(),
                    att,
                };
                self.links.push(Attachment::Link(connect(uplink)));
                self.slots.push(Some(Box::new(Slot {
                    att,
                    port: NPort::new(*cfg),
                    carries_for: None,
                    scsi,
                    virtual_users: 0,
                    waiting_login: false,
                    closing: false,
                    history: PortHistory::new(Instant::now()),
                })));
            }
            Control::Link { att, up } => {
                for s in self.slots.iter_mut().flatten() {
                    if s.att != att {
                        continue;
                    }
                    let virtual_port = s.port.config().virtual_port;
                    if up {
                        if virtual_port {
                            s.waiting_login = true;
                        } else {
                            s.port.link_up(now);
                        }
                    } else {
                        if s.port.is_online() || s.port.fabric_login_pending() {
                            s.port.link_down(now, "link down");
                        }
                        s.waiting_login = virtual_port;
                    }
                }
                self.view_changed = true;
            }
            Control::AcquireVirtual { parent, wwpn } => {
                if let Some(s) = self.slot_mut(wwpn) {
                    // Also a port still closing: the same host is back
                    // before its last session's FDISC was answered.
                    s.virtual_users += 1;
                    s.closing = false;
                    return;
                }
                let Some(carrier) = self.npiv_carrier(parent) else {
                    warn!(%parent, "no parent port for an NPIV port");
                    return;
                };
                let Some(p) = self.slots.get(carrier).and_then(Option::as_ref) else {
                    return;
                };
                let mut cfg = p.port.config().clone();
                let att = p.att;
                cfg.port_name = wwpn;
                cfg.virtual_port = true;
                cfg.target = false;
                cfg.initiator = true;
                cfg.discover = true;
                // A host's port needs the targets alone (NPortConfig::restrict_login).
                cfg.restrict_login = true;
                cfg.symbolic_name = format!("{} npiv", cfg.symbolic_name);
                let slot = Some(Box::new(Slot {
                    att,
                    port: NPort::new(cfg),
                    carries_for: None,
                    scsi: None,
                    virtual_users: 1,
                    waiting_login: true,
                    closing: false,
                    history: PortHistory::new(Instant::now()),
                }));
                // A released NPIV port's place is taken again: one slot per
                // session ever opened would make every lookup by name
                // slower for the life of the gateway. Only NPIV ports,
                // which serve no LUs, leave places, so no target task
                // still holds the index.
                match self.slots.iter().position(Option::is_none) {
                    Some(i) => self.slots[i] = slot,
                    None => self.slots.push(slot),
                }
            }
            Control::ReleaseVirtual { wwpn } => {
                let Some(i) = self.slot_index(wwpn) else {
                    return;
                };
                let done = match self.slots.get_mut(i).and_then(Option::as_mut) {
                    Some(s) => {
                        s.virtual_users = s.virtual_users.saturating_sub(1);
                        s.virtual_users == 0 && s.port.config().virtual_port
                    }
                    None => false,
                };
                if !done {
                    return;
                }
                if let Some(mut slot) = self.slots.get_mut(i).and_then(Option::take) {
                    slot.port.end_waiting_commands();
                    // The fabric may yet give the port an address: then it
                    // stays until the answer, and logs out (`flush`).
                    slot.closing = slot.port.fabric_login_pending();
                    self.retire(now, i, &mut slot);
                    if slot.closing {
                        self.slots[i] = Some(slot);
                    }
                }
            }
            Control::Submit {
                local,
                target,
                id,
                request,
                reply,
            } => match self.slot_mut(local) {
                Some(s) => {
                    s.port.submit(now, id, target, request);
                    self.replies.insert(id, reply);
                }
                None => {
                    warn!(node = %self.name, %local, "command for an N_Port this node does not have");
                    let _ = reply.send(Err(InitiatorError::Closed));
                }
            },
            Control::Tmf {
                local,
                target,
                id,
                lun,
                function,
                reply,
            } => match self.slot_mut(local) {
                Some(s) => {
                    s.port.submit_tmf(now, id, target, lun, function);
                    self.tmf_replies.insert(id, reply);
                }
                None => {
                    let _ = reply.send(Err(InitiatorError::Closed));
                }
            },
            Control::Abandon { local, id } => {
                self.replies.remove(&id);
                if let Some(s) = self.slot_mut(local) {
                    s.port.abandon(now, id);
                }
            }
            Control::LogoutPeer { local, peer } => {
                if let Some(s) = self.slot_mut(local)
                    && let Some(id) = s.port.ready_port_by_name(peer)
                {
                    s.port.logout_peer(now, id);
                }
            }
        }
    }

    /// Logs a port that is going away out of the fabric and its peers (if
    /// it is logged in), sends the LOGOs and answers what it still held.
    /// (A port whose FDISC is still out only has its answers given here;
    /// `flush` retires it again once the fabric has answered.)
    fn retire(&mut self, now: Instant, i: usize, slot: &mut Slot) {
        slot.port.logout(now);
        while let Some(f) = slot.port.poll_transmit() {
            if let Some(l) = self.links.get(slot.att) {
                let _ = l.transmit(f);
            }
        }
        let waker = Waker::noop();
        self.drain_events(
            &mut Context::from_waker(waker),
            now,
            i,
            &mut slot.port,
            None,
            &mut slot.history,
        );
        self.view_changed = true;
    }

    /// Sends what the ports queued and runs their events; true when
    /// something happened that may have made more work ready.
    fn flush(&mut self, cx: &mut Context<'_>, now: Instant) -> bool {
        if self.slots.iter().flatten().any(|s| s.waiting_login) {
            self.start_virtual_logins(now);
        }
        let mut any = false;
        for i in 0..self.slots.len() {
            let Some(mut slot) = self.slots.get_mut(i).and_then(Option::take) else {
                continue;
            };
            // The slot is out of `self.slots`: its port and LU map can be
            // borrowed beside `self` (no refcount traffic per round).
            let Slot {
                port,
                scsi,
                history,
                ..
            } = &mut *slot;
            // Room another port on the link gave back may be this one's
            // turn (`max_frames_in` is the link's: NPIV ports share it).
            port.start_waiting(now);
            any |= self.drain_events(cx, now, i, port, scsi.as_ref(), history);
            let mut out = std::mem::take(&mut self.out);
            while let Some(f) = slot.port.poll_transmit() {
                out.push(f);
            }
            if !out.is_empty() {
                any = true;
                if let Some(l) = self.links.get(slot.att) {
                    l.transmit_all(out.drain(..));
                }
                out.clear();
            }
            self.out = out;
            if slot.closing && !slot.port.fabric_login_pending() {
                // The FDISC was answered (or timed out): out it goes.
                self.retire(now, i, &mut slot);
                any = true;
                continue;
            }
            self.slots[i] = Some(slot);
        }
        any
    }

    /// NPIV ports log in one at a time per fabric port, after their parent.
    fn start_virtual_logins(&mut self, now: Instant) {
        let mut busy: Vec<usize> = Vec::new();
        let mut online: Vec<usize> = Vec::new();
        for s in self.slots.iter().flatten() {
            if s.port.fabric_login_pending() {
                busy.push(s.att);
            }
            if !s.port.config().virtual_port && s.port.is_online() {
                online.push(s.att);
            }
        }
        for s in self.slots.iter_mut().flatten() {
            if s.waiting_login && !s.closing && online.contains(&s.att) && !busy.contains(&s.att) {
                s.waiting_login = false;
                s.port.link_up(now);
                busy.push(s.att);
            }
        }
    }

    /// Runs a port's events; true when there were any.
    fn drain_events(
        &mut self,
        cx: &mut Context<'_>,
        now: Instant,
        slot: usize,
        port: &mut NPort,
        scsi: Option<&ScsiTarget>,
        history: &mut PortHistory,
    ) -> bool {
        let mut changed = false;
        let mut any = false;
        while let Some(ev) = port.poll_event() {
            any = true;
            match ev {
                NPortEvent::Execute { id, task } => match scsi {
                    Some(scsi) => {
                        // The LU receives the task now (ordering contract);
                        // an answer that is ready at once goes out at once.
                        let mut fut = scsi.dispatch(task);
                        match fut.as_mut().poll(cx) {
                            Poll::Ready(r) => port.complete_task(now, id, r),
                            Poll::Pending => self.tasks.push(Keyed::new((slot, id), fut)),
                        }
                    }
                    None => port.complete_task(now, id, TaskResult::aborted()),
                },
                NPortEvent::TaskManagement { id, request } => match scsi {
                    Some(scsi) => {
                        let fut = scsi.task_management(request);
                        self.tmfs.push(Keyed::new((slot, id), fut));
                    }
                    None => port.complete_tmf(now, id, TmfResponse::FunctionRejected),
                },
                NPortEvent::NexusLoss(n) => {
                    if let Some(scsi) = scsi {
                        scsi.nexus_loss(&n);
                    }
                }
                NPortEvent::Completed { id, outcome } => {
                    if let Some(tx) = self.replies.remove(&id) {
                        let _ = tx.send(outcome);
                    }
                }
                NPortEvent::TmfCompleted { id, outcome } => {
                    if let Some(tx) = self.tmf_replies.remove(&id) {
                        let _ = tx.send(outcome);
                    }
                }
                NPortEvent::Online { fc_id } => {
                    info!(node = %self.name, wwpn = %port.config().port_name, %fc_id, "N_Port logged into the fabric");
                    history.since = now;
                    changed = true;
                }
                NPortEvent::Offline { reason } => {
                    warn!(node = %self.name, wwpn = %port.config().port_name, %reason, "N_Port offline");
                    history.since = now;
                    history.last_offline = Some((reason, now));
                    changed = true;
                }
                NPortEvent::PortUp {
                    fc_id, port_name, ..
                } => {
                    debug!(node = %self.name, wwpn = %port.config().port_name, %fc_id, %port_name, "FCP session up");
                    let r = history.session(now, port_name);
                    r.up = true;
                    r.since = now;
                    r.logins += 1;
                    changed = true;
                }
                NPortEvent::PortDown {
                    fc_id,
                    port_name,
                    reason,
                } => {
                    info!(node = %self.name, wwpn = %port.config().port_name, %fc_id, %port_name, %reason, "FCP session down");
                    let r = history.session(now, port_name);
                    r.up = false;
                    r.since = now;
                    r.last_down = Some((reason, now));
                    changed = true;
                }
            }
        }
        self.view_changed |= changed;
        any
    }

    fn publish(&self, shared: &Shared) {
        let v: Vec<NodePortView> = self
            .slots
            .iter()
            .flatten()
            .map(|s| {
                let c = s.port.config();
                NodePortView {
                    port_name: c.port_name,
                    fc_id: s.port.fc_id(),
                    online: s.port.is_online(),
                    target: c.target,
                    initiator: c.initiator,
                    virtual_port: c.virtual_port,
                    peers: s.port.ready_ports(),
                    since: s.history.since,
                    last_offline: s.history.last_offline.clone(),
                    sessions: s.history.sessions.clone(),
                    stats: s.port.stats(),
                    writes_waiting: s.port.writes_waiting(),
                    frames_in: s.port.frames_in(),
                    commands_waiting: s.port.commands_waiting(),
                    write_bytes_held: s.port.write_bytes_held(),
                    write_bytes_to_come: s.port.write_bytes_to_come(),
                }
            })
            .collect();
        *shared.view.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::fabric::FabricConfig;
    use crate::io::FcpInitiatorFactory;
    use crate::nport::NPortConfig;
    use bytes::Bytes;
    use unifab_scsi_core::initiator::{InitiatorFactory, Request};
    use unifab_scsi_core::{Cdb, ItNexus, Lun, TaskAttr};

    const PARENT: Wwn = Wwn(0x2100_0000_0000_0b01);
    const TARGET: Wwn = Wwn(0x2100_0000_0000_0a01);

    /// A node on a fabric of its own with an initiator port, and a factory
    /// giving each front-end initiator port an NPIV port under it.
    fn npiv_node() -> (Switch, FcNode, FcpInitiatorFactory) {
        let switch = Switch::new(FabricConfig::default());
        let node = FcNode::spawn(&switch, "gateway");
        let mut cfg = NPortConfig::new(PARENT, Wwn(0x2000_0000_0000_0b01));
        cfg.initiator = true;
        node.add_port("fc-initiator", cfg, None).unwrap();
        let factory = FcpInitiatorFactory::new(node.clone(), PARENT, TARGET, true);
        (switch, node, factory)
    }

    /// A node with an initiator port (PARENT, discovering) and a target
    /// port (TARGET, no LUs) on one switch.
    fn initiator_and_target() -> (Switch, FcNode) {
        let switch = Switch::new(FabricConfig::default());
        let node = FcNode::spawn(&switch, "gateway");
        let mut cfg = NPortConfig::new(PARENT, Wwn(0x2000_0000_0000_0b01));
        cfg.initiator = true;
        cfg.discover = true;
        node.add_port("fc-initiator", cfg, None).unwrap();
        let mut cfg = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_0a01));
        cfg.target = true;
        node.add_port("fc-target", cfg, Some(ScsiTarget::new()))
            .unwrap();
        (switch, node)
    }

    /// Waits (up to 5 s) until the fabric has a login.
    async fn parent_logged_in(switch: &Switch) {
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while switch.with_fabric(|f| f.logins().is_empty()) {
            assert!(
                tokio::time::Instant::now() < until,
                "the parent never logged in"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Asks the driver for NPIV port `wwpn` under the parent.
    fn acquire(d: &mut Driver, now: Instant, wwpn: Wwn) {
        d.control(
            now,
            Control::AcquireVirtual {
                parent: PARENT,
                wwpn,
            },
        );
    }

    /// Asks for NPIV port `wwpn` and sends its FDISC.
    fn send_fdisc(d: &mut Driver, now: Instant, wwpn: Wwn) {
        acquire(d, now, wwpn);
        d.flush(&mut Context::from_waker(Waker::noop()), now);
    }

    /// Whether `cond` holds within 5 s.
    async fn eventually(cond: impl Fn() -> bool) -> bool {
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while !cond() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cond()
    }

    /// TEST UNIT READY to LUN 0.
    fn tur() -> Request {
        Request {
            lun: Lun(0),
            cdb: Cdb::new(Bytes::from_static(&[0; 6])),
            attr: TaskAttr::Simple,
            priority: 0,
            data_out: Vec::new(),
            data_out_len: 0,
            data_in_len: 0,
        }
    }

    /// A control queued while the node was busy runs before one that a
    /// caller then runs inline: a host session's first command finds the
    /// virtual N_Port that opening the session asked for. (Before, the
    /// command overtook the request and failed at once with `Closed`.)
    /// The runtime has one thread, so the node's task cannot take the
    /// queued request in between.
    #[tokio::test]
    async fn inline_controls_do_not_overtake_queued_ones() {
        let (_switch, node, factory) = npiv_node();
        let nexus = ItNexus::iscsi(
            "iqn.2026-11.io.unifab:host",
            [0x40, 0, 0, 0, 0, 1],
            "iqn.2026-11.io.unifab:gw,t,0x1",
        );
        // The node is busy: opening the session queues its port request.
        let busy = node.shared.try_driver().expect("the node is idle");
        let initiator = factory.open(Some(&nexus)).unwrap();
        drop(busy);
        // The node is free: the session's first command runs inline.
        let mut submitted = initiator.submit(tur());
        let mut cx = Context::from_waker(Waker::noop());
        // Waiting for its port, or (the fabric has no target here) ended
        // by that port's settled discovery: either way after the port.
        match submitted.outcome.as_mut().poll(&mut cx) {
            Poll::Pending => {}
            Poll::Ready(Err(InitiatorError::Unreachable { reason }))
                if reason.contains("is not in the name server for initiator port") => {}
            Poll::Ready(r) => panic!("the command ended before its port existed: {r:?}"),
        }
    }

    /// The view keeps each session with a remote port: up, how many
    /// logins, and why and when it last ended (`unifab show remotes`).
    #[tokio::test]
    async fn the_view_records_sessions_and_why_they_ended() {
        // Both ports are on this node: logins may finish inside `add_port`.
        let started = Instant::now();
        let (_switch, node) = initiator_and_target();
        let record = || {
            node.ports()
                .into_iter()
                .find(|p| p.port_name == PARENT)
                .and_then(|p| p.sessions.into_iter().find(|r| r.port_name == TARGET))
        };
        assert!(
            eventually(|| record().is_some_and(|r| r.up)).await,
            "{:?}",
            node.ports()
        );
        let up = record().unwrap();
        assert_eq!((up.logins, &up.last_down), (1, &None), "{up:?}");
        assert!(up.since >= started, "{up:?}");
        let parent = node
            .ports()
            .into_iter()
            .find(|p| p.port_name == PARENT)
            .unwrap();
        assert!(parent.online && parent.since >= started && parent.last_offline.is_none());

        let before_logout = Instant::now();
        node.logout_peer(PARENT, TARGET);
        assert!(
            eventually(|| record().is_some_and(|r| !r.up)).await,
            "{:?}",
            record()
        );
        let down = record().unwrap();
        let (why, at) = down.last_down.clone().expect("a reason");
        assert_eq!(why, "we logged out of the port");
        assert!(at >= before_logout && down.since == at, "{down:?}");
        assert_eq!(down.logins, 1);
    }

    /// The view carries each port's counters, and they keep up with the
    /// port even when nothing else in the view changes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_view_carries_the_ports_counters() {
        let (_switch, node) = initiator_and_target();
        let stats = |wwpn: Wwn| {
            node.ports()
                .into_iter()
                .find(|p| p.port_name == wwpn)
                .map(|p| p.stats)
                .unwrap_or_default()
        };
        // Fabric login, PLOGI and PRLI went both ways.
        assert!(
            eventually(|| {
                let (i, t) = (stats(PARENT), stats(TARGET));
                i.tx_frames > 0 && i.rx_frames > 0 && t.tx_frames > 0 && t.rx_frames > 0
            })
            .await,
            "{:?}",
            node.ports()
        );
        let factory = FcpInitiatorFactory::new(node.clone(), PARENT, TARGET, false);
        let initiator = factory.open(None).unwrap();
        // Commands move only the frame counters, which no other change
        // in the view publishes: they show up within STATS_REFRESH.
        let before = stats(PARENT).tx_frames;
        for _ in 0..3 {
            let answer =
                tokio::time::timeout(Duration::from_secs(5), initiator.submit(tur()).outcome)
                    .await
                    .expect("an answer");
            assert!(answer.is_ok(), "{answer:?}");
        }
        assert!(
            eventually(|| stats(PARENT).tx_frames >= before + 3).await,
            "{:?} then {:?}",
            before,
            stats(PARENT)
        );
    }

    /// A port remembers at most `SESSION_RECORDS` remote ports; the one
    /// down longest goes first, and sessions that are up stay.
    #[test]
    fn session_records_are_bounded() {
        let t0 = Instant::now();
        let mut h = PortHistory::new(t0);
        for i in 0..SESSION_RECORDS as u64 {
            let r = h.session(t0 + Duration::from_secs(i), Wwn(i));
            r.since = t0 + Duration::from_secs(i);
            r.up = i % 2 == 0;
        }
        assert_eq!(h.sessions.len(), SESSION_RECORDS);
        // Port 1 is the one down longest.
        h.session(t0 + Duration::from_secs(1000), Wwn(9999)).up = true;
        assert_eq!(h.sessions.len(), SESSION_RECORDS);
        let names: Vec<u64> = h.sessions.iter().map(|r| r.port_name.0).collect();
        assert!(!names.contains(&1) && names.contains(&3) && names.contains(&0));
        assert!(names.contains(&9999));
        // An existing record is found, not added.
        h.session(t0, Wwn(0)).logins = 7;
        assert_eq!(h.sessions.len(), SESSION_RECORDS);
        assert_eq!(
            h.sessions
                .iter()
                .find(|r| r.port_name == Wwn(0))
                .unwrap()
                .logins,
            7
        );
    }

    /// Sessions come and go (libiscsi's suite opens two per suite, a
    /// host reconnects for years): the NPIV ports they get and give back
    /// reuse the node's places instead of adding one per session.
    #[tokio::test]
    async fn released_virtual_ports_leave_no_places_behind() {
        let (_switch, node, factory) = npiv_node();
        let mut live = Vec::new();
        for n in 0..200u8 {
            let nexus = ItNexus::iscsi(
                "iqn.2026-11.io.unifab:host",
                [0x40, 0, 0, 0, 1, n],
                "iqn.2026-11.io.unifab:gw,t,0x1",
            );
            live.push(factory.open(Some(&nexus)).unwrap());
            // At most two sessions at a time, as in the suite.
            if live.len() > 2 {
                live.remove(0).close();
            }
            tokio::task::yield_now().await;
        }
        let d = node.shared.try_driver().expect("the node is idle");
        let ports = d.slots.iter().flatten().count();
        assert_eq!(ports, 3, "the parent and two NPIV ports");
        assert!(
            d.slots.len() <= 4,
            "{} places for {ports} ports",
            d.slots.len()
        );
    }

    /// A session that ends while its NPIV port's FDISC is in flight
    /// leaves no login behind in the fabric: the port stays until the
    /// answer comes and then logs out, instead of vanishing with its
    /// address still registered (and its name, which the same host's next
    /// session asks for again).
    #[tokio::test]
    async fn a_port_released_during_its_fdisc_leaves_no_login_in_the_fabric() {
        let (switch, node, _factory) = npiv_node();
        let names = || {
            switch.with_fabric(|f| {
                let mut v: Vec<Wwn> = f.logins().into_iter().map(|l| l.port_name).collect();
                v.sort();
                v
            })
        };
        parent_logged_in(&switch).await;
        let npiv = Wwn(0x2f00_0000_0000_0001);
        {
            let mut d = node.shared.try_driver().expect("the node is idle");
            let now = Instant::now();
            send_fdisc(&mut d, now, npiv);
            let slot = d.slot_mut(npiv).expect("the NPIV port");
            assert!(slot.port.fabric_login_pending(), "the FDISC went out");
            // The session ends before the node reads the answer.
            d.control(now, Control::ReleaseVirtual { wwpn: npiv });
        }
        assert_eq!(names(), [PARENT, npiv], "the fabric accepted the FDISC");
        node.shared.released();
        eventually(|| names() == [PARENT]).await;
        assert_eq!(names(), [PARENT], "the NPIV port's login outlived it");
        let d = node.shared.try_driver().expect("the node is idle");
        assert_eq!(d.slots.iter().flatten().count(), 1, "only the parent");
    }

    /// The same host back before its last session's FDISC was answered
    /// gets the port that is still there, and it stays logged in.
    #[tokio::test]
    async fn a_port_asked_for_again_while_closing_stays() {
        let (switch, node, _factory) = npiv_node();
        parent_logged_in(&switch).await;
        let npiv = Wwn(0x2f00_0000_0000_0003);
        {
            let mut d = node.shared.try_driver().expect("the node is idle");
            let now = Instant::now();
            send_fdisc(&mut d, now, npiv);
            d.control(now, Control::ReleaseVirtual { wwpn: npiv });
            acquire(&mut d, now, npiv);
        }
        node.shared.released();
        let online = || node.ports().iter().any(|p| p.port_name == npiv && p.online);
        assert!(
            eventually(online).await,
            "the NPIV port did not come up: {:?}",
            node.ports()
        );
        // Settled: a port retired after its FDISC would be gone by now.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(online(), "the NPIV port went away: {:?}", node.ports());
        let logins = switch.with_fabric(|f| f.logins().len());
        assert_eq!(logins, 2, "the parent and the NPIV port");
    }

    /// A command waiting for its target port ends when the NPIV port it
    /// was given to goes away, instead of waiting for an answer that no
    /// port will give.
    #[tokio::test]
    async fn a_released_port_ends_the_commands_waiting_in_it() {
        let (_switch, node, _factory) = npiv_node();
        let npiv = Wwn(0x2f00_0000_0000_0002);
        let (tx, mut rx) = oneshot::channel();
        {
            let mut d = node.shared.try_driver().expect("the node is idle");
            let now = Instant::now();
            acquire(&mut d, now, npiv);
            d.control(
                now,
                Control::Submit {
                    local: npiv,
                    target: TARGET,
                    id: CommandId(1),
                    request: tur(),
                    reply: tx,
                },
            );
            d.control(now, Control::ReleaseVirtual { wwpn: npiv });
        }
        match rx.try_recv() {
            Ok(Err(InitiatorError::Disconnected)) => {}
            other => panic!("the waiting command got {other:?}"),
        }
    }

    /// The routes the node remembers are checked before use: a frame whose
    /// remembered place now holds another port (here: every route and name
    /// pointed at the wrong place on purpose) still reaches its own port.
    #[tokio::test]
    async fn a_stale_route_is_checked_before_use() {
        use unifab_scsi_core::backend::MemoryBackend;
        use unifab_scsi_core::{EmulatedLu, EmulatedLuConfig};
        let (_switch, node, factory) = npiv_node();
        let scsi = ScsiTarget::new();
        let lu = EmulatedLu::new(
            EmulatedLuConfig::default(),
            Arc::new(MemoryBackend::new(1 << 20)),
        )
        .unwrap();
        scsi.insert(Lun(0), Arc::new(lu));
        let mut cfg = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_0a01));
        cfg.target = true;
        node.add_port("fc-target", cfg, Some(scsi)).unwrap();
        let nexus = ItNexus::iscsi(
            "iqn.2026-11.io.unifab:host",
            [0x40, 0, 0, 0, 3, 1],
            "iqn.2026-11.io.unifab:gw,t,0x1",
        );
        let initiator = factory.open(Some(&nexus)).unwrap();
        // Its unit attention; the routes are learnt on the way.
        let first = tokio::time::timeout(Duration::from_secs(5), initiator.submit(tur()).outcome)
            .await
            .expect("an answer");
        assert!(first.is_ok(), "{first:?}");
        {
            let mut d = node.shared.try_driver().expect("the node is idle");
            let d = &mut *d;
            let places = d.slots.len();
            assert!(places >= 3 && !d.by_addr.is_empty() && !d.by_name.is_empty());
            for v in d.by_addr.values_mut().chain(d.by_name.values_mut()) {
                *v = (*v + 1) % places;
            }
        }
        let r = tokio::time::timeout(Duration::from_secs(5), initiator.submit(tur()).outcome)
            .await
            .expect("an answer through the stale routes");
        assert_eq!(r.map(|t| t.status), Ok(unifab_scsi_core::Status::GOOD));
    }
}
