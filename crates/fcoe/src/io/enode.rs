//! The ENode driver: runs an [`Enode`] over an Ethernet link and carries
//! the frames of an N_Port of a `unifab_fc` node (attached with
//! [`FcNode::add_port_via`](unifab_fc::io::FcNode::add_port_via)) to the
//! FCF it selects. The N_Port logs in when the ENode reports the link up
//! and loses its logins when the ENode loses the FCF.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};
use unifab_fc::io::{Connect, Uplink};
use unifab_fc::link::{FcLink, LinkError};
use unifab_fc::wire::frame::Frame;

use super::{BATCH, Timer};
use crate::enode::{Enode, EnodeConfig, EnodeCounters, EnodeEvent, EnodeVnPort, FcfInfo};
use crate::link::{EthLink, send_out};

/// Frames the N_Ports may queue toward the ENode.
const FC_QUEUE: usize = 65_536;

#[derive(Debug, Default)]
struct View {
    fcf: Option<FcfInfo>,
    vlan: Option<u16>,
    vn_ports: Vec<EnodeVnPort>,
    counters: EnodeCounters,
}

/// A running ENode.
#[derive(Debug, Clone)]
pub struct EnodeHandle {
    view: Arc<Mutex<View>>,
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
    /// The interface.
    pub interface: String,
    /// The link.
    pub link: String,
}

impl EnodeHandle {
    /// The selected FCF.
    pub fn fcf(&self) -> Option<FcfInfo> {
        self.view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fcf
            .clone()
    }

    /// The VLAN in use.
    pub fn vlan(&self) -> Option<u16> {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).vlan
    }

    /// The VN_Ports logged in.
    pub fn vn_ports(&self) -> Vec<EnodeVnPort> {
        self.view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .vn_ports
            .clone()
    }

    /// Counters.
    pub fn counters(&self) -> EnodeCounters {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).counters
    }

    /// Stops the driver; returns when it has finished.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

/// The N_Port's link toward the ENode: frames go into the driver's queue.
#[derive(Debug)]
struct ToEnode {
    tx: mpsc::Sender<Frame>,
    name: String,
}

impl FcLink for ToEnode {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        self.tx.try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LinkError::Full,
            mpsc::error::TrySendError::Closed(_) => LinkError::Down,
        })
    }

    fn describe(&self) -> String {
        format!("fcoe enode {}", self.name)
    }
}

/// Starts an ENode on `link`; the returned [`Connect`] attaches the N_Port
/// that will use it (pass it to `FcNode::add_port_via`). Must be called
/// within a tokio runtime.
pub fn spawn_enode(cfg: EnodeConfig, link: EthLink, interface: &str) -> (Connect, EnodeHandle) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(false);
    let (fc_tx, fc_rx) = mpsc::channel(FC_QUEUE);
    let (up_tx, up_rx) = oneshot::channel::<Uplink>();
    let view = Arc::new(Mutex::new(View {
        vlan: cfg.vlan,
        ..View::default()
    }));
    let handle = EnodeHandle {
        view: view.clone(),
        stop: stop_tx,
        done: done_rx,
        interface: interface.to_string(),
        link: link.name.clone(),
    };
    let name = interface.to_string();
    let connect: Connect = Box::new(move |uplink: Uplink| {
        let _ = up_tx.send(uplink);
        Arc::new(ToEnode { tx: fc_tx, name }) as Arc<dyn FcLink>
    });
    let driver = Driver {
        enode: Enode::new(cfg, Instant::now()),
        link,
        interface: interface.to_string(),
        uplink: None,
        link_up: false,
        view,
    };
    tokio::spawn(async move {
        driver.run(fc_rx, up_rx, stop_rx).await;
        let _ = done_tx.send(true);
    });
    (connect, handle)
}

struct Driver {
    enode: Enode,
    link: EthLink,
    interface: String,
    uplink: Option<Uplink>,
    link_up: bool,
    view: Arc<Mutex<View>>,
}

impl Driver {
    async fn run(
        mut self,
        mut fc_rx: mpsc::Receiver<Frame>,
        mut up_rx: oneshot::Receiver<Uplink>,
        mut stop: watch::Receiver<bool>,
    ) {
        info!(interface = %self.interface, link = %self.link.name, mac = %self.enode.config().mac,
            "ENode running");
        let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
        let mut changed = true;
        let mut published = Instant::now();
        let mut timer = Timer::new();
        let mut waiting_uplink = true;
        loop {
            let now = Instant::now();
            self.enode.handle_timeout(now);
            changed |= self.pump();
            if changed || now.duration_since(published) >= std::time::Duration::from_secs(1) {
                self.publish();
                changed = false;
                published = now;
            }
            timer.arm(self.enode.poll_timeout());
            tokio::select! {
                r = self.link.rx.recv(&mut batch) => {
                    if let Err(e) = r {
                        warn!(interface = %self.interface, error = %e, "ENode link failed");
                        break;
                    }
                    let now = Instant::now();
                    for f in batch.drain(..) {
                        self.enode.handle_ethernet(now, f);
                    }
                }
                f = fc_rx.recv() => {
                    let Some(f) = f else { break };
                    let now = Instant::now();
                    self.enode.handle_fc(now, f);
                    for _ in 0..BATCH {
                        match fc_rx.try_recv() {
                            Ok(f) => self.enode.handle_fc(now, f),
                            Err(_) => break,
                        }
                    }
                }
                u = &mut up_rx, if waiting_uplink => {
                    waiting_uplink = false;
                    if let Ok(u) = u {
                        if self.link_up {
                            u.set_link(true);
                        }
                        self.uplink = Some(u);
                    }
                }
                () = timer.fired() => {}
                _ = stop.changed() => break,
            }
        }
        if let Some(u) = &self.uplink {
            u.set_link(false);
        }
        info!(interface = %self.interface, "ENode stopped");
    }

    fn pump(&mut self) -> bool {
        let mut changed = false;
        loop {
            let mut moved = false;
            while let Some(ev) = self.enode.poll_event() {
                moved = true;
                changed = true;
                match ev {
                    EnodeEvent::LinkUp(f) => {
                        info!(interface = %self.interface, fcf = %f.mac, "virtual link up");
                        self.link_up = true;
                        if let Some(u) = &self.uplink {
                            u.set_link(true);
                        }
                    }
                    EnodeEvent::LinkDown { reason } => {
                        warn!(interface = %self.interface, reason, "virtual link down");
                        self.link_up = false;
                        if let Some(u) = &self.uplink {
                            u.set_link(false);
                        }
                    }
                    EnodeEvent::VlanDiscovered(_)
                    | EnodeEvent::VnPortUp(_)
                    | EnodeEvent::VnPortDown { .. } => {}
                }
            }
            while let Some(f) = self.enode.poll_fc() {
                moved = true;
                if let Some(u) = &self.uplink {
                    let _ = u.transmit(f);
                }
            }
            while let Some(o) = self.enode.poll_transmit() {
                moved = true;
                if let Err(e) = send_out(self.link.tx.as_mut(), &o) {
                    tracing::debug!(error = %e, "ENode transmit failed");
                }
            }
            if !moved {
                break;
            }
        }
        if let Err(e) = self.link.tx.flush() {
            tracing::debug!(error = %e, "ENode flush failed");
        }
        changed
    }

    fn publish(&self) {
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.fcf = self.enode.fcf().cloned();
        v.vlan = self.enode.vlan();
        v.vn_ports = self.enode.vn_ports();
        v.counters = self.enode.counters();
    }
}
