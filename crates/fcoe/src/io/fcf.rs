//! The FCF driver: runs a [`Fcf`] over an Ethernet link, attaching a
//! fabric port of a [`Switch`] for each ENode's VF_Port.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use unifab_fc::io::{FabricPort, MemoryLink, Switch};
use unifab_fc::link::FcLink;
use unifab_fc::wire::frame::Frame;

use super::{BATCH, Timer};
use crate::fcf::{Fcf, FcfConfig, FcfCounters, FcfEvent, VfPortId, VnPortView};
use crate::link::{EthLink, send_out};

/// Frames the fabric may queue toward the FCF.
const FABRIC_QUEUE: usize = 65_536;

#[derive(Debug, Default)]
struct View {
    vn_ports: Vec<VnPortView>,
    counters: FcfCounters,
    fabric_ports: HashMap<VfPortId, usize>,
}

/// A running FCF. Dropping every handle does not stop it; [`FcfHandle::stop`] does.
#[derive(Debug, Clone)]
pub struct FcfHandle {
    view: Arc<Mutex<View>>,
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
    /// The interface ("veth0").
    pub interface: String,
    /// The FCoE VLAN.
    pub vlan: Option<u16>,
    /// The link ("af_xdp:veth0 (native, copy)", …).
    pub link: String,
}

impl FcfHandle {
    /// VN_Ports logged in through the FCF.
    pub fn vn_ports(&self) -> Vec<VnPortView> {
        self.view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .vn_ports
            .clone()
    }

    /// Counters.
    pub fn counters(&self) -> FcfCounters {
        self.view.lock().unwrap_or_else(|e| e.into_inner()).counters
    }

    /// The fabric port index of each VF_Port.
    pub fn fabric_ports(&self) -> HashMap<VfPortId, usize> {
        self.view
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fabric_ports
            .clone()
    }

    /// Clears every virtual link (CVL), detaches the VF_Ports and stops;
    /// returns when the driver has finished.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

struct Driver {
    fcf: Fcf,
    link: EthLink,
    switch: Switch,
    interface: String,
    ports: HashMap<VfPortId, FabricPort>,
    fabric_tx: mpsc::Sender<(usize, Frame)>,
    view: Arc<Mutex<View>>,
}

/// Starts an FCF on `link`, named `interface` for the operator; ENodes'
/// VF_Ports attach to `switch`. Must be called within a tokio runtime.
pub fn spawn_fcf(cfg: FcfConfig, link: EthLink, switch: Switch, interface: &str) -> FcfHandle {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(false);
    let (fabric_tx, fabric_rx) = mpsc::channel(FABRIC_QUEUE);
    let view = Arc::new(Mutex::new(View::default()));
    let handle = FcfHandle {
        view: view.clone(),
        stop: stop_tx,
        done: done_rx,
        interface: interface.to_string(),
        vlan: cfg.vlan,
        link: link.name.clone(),
    };
    let driver = Driver {
        fcf: Fcf::new(cfg, Instant::now()),
        link,
        switch,
        interface: interface.to_string(),
        ports: HashMap::new(),
        fabric_tx,
        view,
    };
    tokio::spawn(async move {
        driver.run(fabric_rx, stop_rx).await;
        let _ = done_tx.send(true);
    });
    handle
}

impl Driver {
    async fn run(
        mut self,
        mut fabric_rx: mpsc::Receiver<(usize, Frame)>,
        mut stop: watch::Receiver<bool>,
    ) {
        info!(interface = %self.interface, link = %self.link.name, mac = %self.fcf.config().mac,
            vlan = ?self.fcf.config().vlan, "FCF running");
        let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
        let mut changed = true;
        let mut published = Instant::now();
        let mut timer = Timer::new();
        loop {
            let now = Instant::now();
            self.fcf.handle_timeout(now);
            changed |= self.pump();
            if changed || now.duration_since(published) >= std::time::Duration::from_secs(1) {
                self.publish();
                changed = false;
                published = now;
            }
            timer.arm(self.fcf.poll_timeout());
            tokio::select! {
                r = self.link.rx.recv(&mut batch) => {
                    if let Err(e) = r {
                        warn!(interface = %self.interface, error = %e, "FCF link failed");
                        break;
                    }
                    let now = Instant::now();
                    for f in batch.drain(..) {
                        self.fcf.handle_ethernet(now, f);
                    }
                }
                f = fabric_rx.recv() => {
                    let Some((vf, f)) = f else { break };
                    let now = Instant::now();
                    self.fcf.handle_fabric(now, VfPortId(vf as u32), f);
                    for _ in 0..BATCH {
                        match fabric_rx.try_recv() {
                            Ok((vf, f)) => self.fcf.handle_fabric(now, VfPortId(vf as u32), f),
                            Err(_) => break,
                        }
                    }
                }
                () = timer.fired() => {}
                _ = stop.changed() => break,
            }
        }
        info!(interface = %self.interface, "FCF stopping: clearing virtual links");
        self.fcf.clear_all();
        self.pump();
        for (_, p) in self.ports.drain() {
            p.detach();
        }
        self.publish();
    }

    /// Moves everything the FCF queued; true if logins changed.
    fn pump(&mut self) -> bool {
        let mut changed = false;
        loop {
            let mut moved = false;
            while let Some(ev) = self.fcf.poll_event() {
                moved = true;
                changed = true;
                match ev {
                    FcfEvent::VfPortUp { vf, enode } => {
                        let name = format!("{}/vfc{}", self.interface, vf.0);
                        let link = MemoryLink::new(self.fabric_tx.clone(), vf.0 as usize, &name);
                        let port = self.switch.attach(&name, Arc::new(link));
                        info!(%enode, vf = vf.0, fabric_port = port.index().0, "VF_Port attached");
                        self.ports.insert(vf, port);
                    }
                    FcfEvent::VfPortDown { vf, enode, reason } => {
                        if let Some(p) = self.ports.remove(&vf) {
                            info!(%enode, vf = vf.0, reason, "VF_Port detached");
                            p.detach();
                        }
                    }
                    FcfEvent::LoggedIn(_) | FcfEvent::LoggedOut { .. } => {}
                }
            }
            while let Some((vf, f)) = self.fcf.poll_fabric() {
                moved = true;
                if let Some(p) = self.ports.get(&vf) {
                    let _ = p.transmit(f);
                }
            }
            while let Some(o) = self.fcf.poll_transmit() {
                moved = true;
                if let Err(e) = send_out(self.link.tx.as_mut(), &o) {
                    tracing::debug!(error = %e, "FCF transmit failed");
                }
            }
            if !moved {
                break;
            }
        }
        if let Err(e) = self.link.tx.flush() {
            tracing::debug!(error = %e, "FCF flush failed");
        }
        changed
    }

    fn publish(&self) {
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.vn_ports = self.fcf.vn_ports();
        v.counters = self.fcf.counters();
        v.fabric_ports = self.ports.iter().map(|(k, p)| (*k, p.index().0)).collect();
    }
}
