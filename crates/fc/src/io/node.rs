//! The node driver: one tokio task running the gateway's N_Ports — FCP
//! target ports serving a [`ScsiTarget`], FCP initiator ports, and the
//! NPIV virtual initiator ports the initiator factory creates per
//! front-end nexus — each physical port on its own fabric port (virtual
//! ports on their parent's), all fed by one in-memory frame channel.
//!
//! The task owns the sans-IO [`NPort`]s. It runs the LU futures of target
//! ports itself (no task per command), so a command's frames, its
//! execution and its answer stay on one task; frames between the node's
//! own ports cross the switch synchronously and come back through the
//! channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use unifab_scsi_core::initiator::{InitiatorError, Outcome, Request};
use unifab_scsi_core::{BoxFuture, Lun, ScsiTarget, TaskResult, TmfFunction, TmfResponse};

use super::memory::MemoryLink;
use super::switch::{FabricPort, Switch};
use crate::link::FcLink;
use crate::nport::{CommandId, NPort, NPortConfig, NPortEvent, TaskId};
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
}

type TmfOutcome = Result<TmfResponse, InitiatorError>;

pub(crate) enum Control {
    AddPort {
        name: String,
        cfg: Box<NPortConfig>,
        scsi: Option<ScsiTarget>,
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

#[derive(Debug)]
struct Shared {
    next_id: AtomicU64,
    view: Mutex<Vec<NodePortView>>,
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
#[derive(Debug, Clone)]
pub struct Uplink {
    frames: MemoryLink,
    ctl: mpsc::WeakSender<Control>,
    att: usize,
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
    fn transmit(&self, frame: Frame) -> Result<(), crate::link::LinkError> {
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
    fn transmit(&self, f: Frame) -> Result<(), crate::link::LinkError> {
        match self {
            Attachment::Switch(p) => p.transmit(f),
            Attachment::Link(l) => l.transmit(f),
        }
    }
}

/// Frames one node's channel holds at most (the receive side of every
/// port of the node).
const FRAME_QUEUE: usize = 65_536;
/// Control messages (commands) queued at most.
const CONTROL_QUEUE: usize = 16_384;
/// Messages taken from a channel before the node answers what it has.
const BATCH: usize = 256;

impl FcNode {
    /// Starts a node attached to `switch`. Must be called within a tokio
    /// runtime.
    pub fn spawn(switch: &Switch, name: &str) -> FcNode {
        let (tx, rx) = mpsc::channel(CONTROL_QUEUE);
        let (ftx, frx) = mpsc::channel(FRAME_QUEUE);
        let shared = Arc::new(Shared {
            next_id: AtomicU64::new(1),
            view: Mutex::new(Vec::new()),
        });
        let driver = Driver {
            ctl_tx: tx.downgrade(),
            name: name.to_string(),
            switch: switch.clone(),
            frame_tx: ftx,
            slots: Vec::new(),
            links: Vec::new(),
            replies: HashMap::new(),
            tmf_replies: HashMap::new(),
            tasks: FuturesUnordered::new(),
            tmfs: FuturesUnordered::new(),
            shared: shared.clone(),
        };
        tokio::spawn(driver.run(rx, frx));
        FcNode { tx, shared }
    }

    /// Adds an N_Port on a new fabric port named `name`, serving `scsi` if
    /// it is a target. It logs in at once.
    pub fn add_port(
        &self,
        name: &str,
        cfg: NPortConfig,
        scsi: Option<ScsiTarget>,
    ) -> Result<(), InitiatorError> {
        self.tx
            .try_send(Control::AddPort {
                name: name.to_string(),
                cfg: Box::new(cfg),
                scsi,
            })
            .map_err(|_| InitiatorError::QueueFull)
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
        self.tx
            .try_send(Control::AddPortVia {
                name: name.to_string(),
                cfg: Box::new(cfg),
                scsi,
                connect,
            })
            .map_err(|_| InitiatorError::QueueFull)
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
        let _ = self.tx.try_send(Control::LogoutPeer { local, peer });
    }
}

struct Slot {
    att: usize,
    port: NPort,
    scsi: Option<ScsiTarget>,
    virtual_users: usize,
    /// Waiting to send its fabric login (NPIV ports log in one at a
    /// time, after their parent).
    waiting_login: bool,
}

type TaskDone = (usize, TaskId, TaskResult);
type TmfDone = (usize, TaskId, TmfResponse);

struct Driver {
    ctl_tx: mpsc::WeakSender<Control>,
    name: String,
    switch: Switch,
    frame_tx: mpsc::Sender<(usize, Frame)>,
    slots: Vec<Option<Slot>>,
    /// Per attachment (fabric port or uplink): where frames are sent.
    links: Vec<Attachment>,
    replies: HashMap<CommandId, oneshot::Sender<Outcome>>,
    tmf_replies: HashMap<CommandId, oneshot::Sender<TmfOutcome>>,
    tasks: FuturesUnordered<BoxFuture<'static, TaskDone>>,
    tmfs: FuturesUnordered<BoxFuture<'static, TmfDone>>,
    shared: Arc<Shared>,
}

impl Driver {
    async fn run(
        mut self,
        mut ctl: mpsc::Receiver<Control>,
        mut frames: mpsc::Receiver<(usize, Frame)>,
    ) {
        info!(node = %self.name, "FC node running");
        loop {
            let deadline = self
                .slots
                .iter()
                .flatten()
                .filter_map(|s| s.port.poll_timeout())
                .min();
            let sleep = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                biased;
                f = frames.recv() => {
                    let Some((att, f)) = f else { break };
                    let now = Instant::now();
                    self.frame(now, att, f);
                    for _ in 0..BATCH {
                        match frames.try_recv() {
                            Ok((att, f)) => self.frame(now, att, f),
                            Err(_) => break,
                        }
                    }
                }
                Some((slot, id, r)) = self.tasks.next(), if !self.tasks.is_empty() => {
                    let now = Instant::now();
                    if let Some(Some(s)) = self.slots.get_mut(slot) {
                        s.port.complete_task(now, id, r);
                    }
                }
                Some((slot, id, r)) = self.tmfs.next(), if !self.tmfs.is_empty() => {
                    let now = Instant::now();
                    if let Some(Some(s)) = self.slots.get_mut(slot) {
                        s.port.complete_tmf(now, id, r);
                    }
                }
                c = ctl.recv() => {
                    let Some(c) = c else { break };
                    let now = Instant::now();
                    self.control(now, c);
                    for _ in 0..BATCH {
                        match ctl.try_recv() {
                            Ok(c) => self.control(now, c),
                            Err(_) => break,
                        }
                    }
                }
                () = sleep => {
                    let now = Instant::now();
                    for s in self.slots.iter_mut().flatten() {
                        s.port.handle_timeout(now);
                    }
                }
            }
            self.flush(Instant::now());
        }
        for l in &self.links {
            if let Attachment::Switch(p) = l {
                p.detach();
            }
        }
        info!(node = %self.name, "FC node stopped");
    }

    fn frame(&mut self, now: Instant, att: usize, f: Frame) {
        let h = f.header;
        let mut target = None;
        for (i, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.att != att {
                continue;
            }
            if s.port.is_online() && s.port.fc_id() == h.d_id {
                target = Some(i);
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

    fn slot_index(&self, w: Wwn) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.port.config().port_name == w))
    }

    fn slot_mut(&mut self, w: Wwn) -> Option<&mut Slot> {
        let i = self.slot_index(w)?;
        self.slots.get_mut(i).and_then(Option::as_mut)
    }

    fn control(&mut self, now: Instant, c: Control) {
        match c {
            Control::AddPort { name, cfg, scsi } => {
                let att = self.links.len();
                let link = MemoryLink::new(self.frame_tx.clone(), att, &name);
                let port = self.switch.attach(&name, Arc::new(link));
                self.links.push(Attachment::Switch(port));
                let mut np = NPort::new(*cfg);
                np.link_up(now);
                self.slots.push(Some(Slot {
                    att,
                    port: np,
                    scsi,
                    virtual_users: 0,
                    waiting_login: false,
                }));
            }
            Control::AddPortVia {
                name,
                cfg,
                scsi,
                connect,
            } => {
                let att = self.links.len();
                let uplink = Uplink {
                    frames: MemoryLink::new(self.frame_tx.clone(), att, &name),
                    ctl: self.ctl_tx.clone(),
                    att,
                };
                self.links.push(Attachment::Link(connect(uplink)));
                self.slots.push(Some(Slot {
                    att,
                    port: NPort::new(*cfg),
                    scsi,
                    virtual_users: 0,
                    waiting_login: false,
                }));
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
                self.publish();
            }
            Control::AcquireVirtual { parent, wwpn } => {
                if let Some(s) = self.slot_mut(wwpn) {
                    s.virtual_users += 1;
                    return;
                }
                let Some(p) = self.slot_mut(parent) else {
                    warn!(%parent, "no parent port for an NPIV port");
                    return;
                };
                let mut cfg = p.port.config().clone();
                let att = p.att;
                cfg.port_name = wwpn;
                cfg.virtual_port = true;
                cfg.target = false;
                cfg.initiator = true;
                cfg.discover = true;
                cfg.symbolic_name = format!("{} npiv", cfg.symbolic_name);
                self.slots.push(Some(Slot {
                    att,
                    port: NPort::new(cfg),
                    scsi: None,
                    virtual_users: 1,
                    waiting_login: true,
                }));
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
                    slot.port.logout(now);
                    // The LOGOs go out before the port does.
                    while let Some(f) = slot.port.poll_transmit() {
                        if let Some(l) = self.links.get(slot.att) {
                            let _ = l.transmit(f);
                        }
                    }
                    self.drain_events(i, &mut slot.port, None);
                    self.publish();
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
                if let Some(s) = self.slot_mut(local) {
                    if let Some(id) = s.port.ready_port_by_name(peer) {
                        s.port.logout_peer(now, id);
                    }
                }
            }
        }
    }

    /// Sends what the ports queued and runs their events.
    fn flush(&mut self, now: Instant) {
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
            if s.waiting_login && online.contains(&s.att) && !busy.contains(&s.att) {
                s.waiting_login = false;
                s.port.link_up(now);
                busy.push(s.att);
            }
        }
        let mut changed = false;
        for i in 0..self.slots.len() {
            let Some(mut slot) = self.slots.get_mut(i).and_then(Option::take) else {
                continue;
            };
            let scsi = slot.scsi.clone();
            changed |= self.drain_events(i, &mut slot.port, scsi.as_ref());
            while let Some(f) = slot.port.poll_transmit() {
                if let Some(l) = self.links.get(slot.att) {
                    let _ = l.transmit(f);
                }
            }
            self.slots[i] = Some(slot);
        }
        if changed {
            self.publish();
        }
    }

    /// Runs a port's events; true when something `show` displays changed.
    fn drain_events(&mut self, slot: usize, port: &mut NPort, scsi: Option<&ScsiTarget>) -> bool {
        let mut changed = false;
        while let Some(ev) = port.poll_event() {
            match ev {
                NPortEvent::Execute { id, task } => match scsi {
                    Some(scsi) => {
                        // The LU receives the task now (ordering contract).
                        let fut = scsi.dispatch(task);
                        self.tasks
                            .push(Box::pin(async move { (slot, id, fut.await) }));
                    }
                    None => port.complete_task(Instant::now(), id, TaskResult::aborted()),
                },
                NPortEvent::TaskManagement { id, request } => match scsi {
                    Some(scsi) => {
                        let fut = scsi.task_management(request);
                        self.tmfs
                            .push(Box::pin(async move { (slot, id, fut.await) }));
                    }
                    None => port.complete_tmf(Instant::now(), id, TmfResponse::FunctionRejected),
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
                    changed = true;
                }
                NPortEvent::Offline { reason } => {
                    warn!(node = %self.name, wwpn = %port.config().port_name, %reason, "N_Port offline");
                    changed = true;
                }
                NPortEvent::PortUp {
                    fc_id, port_name, ..
                } => {
                    debug!(%fc_id, %port_name, "FCP session up");
                    changed = true;
                }
                NPortEvent::PortDown { fc_id, port_name } => {
                    debug!(%fc_id, %port_name, "FCP session down");
                    changed = true;
                }
            }
        }
        changed
    }

    fn publish(&self) {
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
                }
            })
            .collect();
        *self.shared.view.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }
}
