//! The switch: the sans-IO fabric behind a lock, with the links of its
//! ports. A frame handed to a [`FabricPort`] is routed at once, in the
//! caller's context, and handed to the destination port's link: no task
//! hop inside the switch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::fabric::{Fabric, FabricConfig, PortIndex};
use crate::link::{FcLink, LinkError};
use crate::wire::frame::Frame;

#[derive(Debug)]
struct Inner {
    /// The fabric's notion of "now" for routing (it keeps no timers).
    epoch: Instant,
    fabric: Mutex<State>,
    /// Frames a destination link refused (congested or down).
    link_drops: AtomicU64,
    /// Signalled when local ports changed (for SW_RSCN).
    changes: Arc<tokio::sync::Notify>,
}

#[derive(Debug)]
struct State {
    fabric: Fabric,
    links: Vec<Option<Arc<dyn FcLink>>>,
}

/// A software FC switch. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Switch {
    inner: Arc<Inner>,
}

impl Switch {
    /// A switch running a fabric with `cfg`.
    pub fn new(cfg: FabricConfig) -> Switch {
        Switch {
            inner: Arc::new(Inner {
                epoch: Instant::now(),
                fabric: Mutex::new(State {
                    fabric: Fabric::new(cfg),
                    links: Vec::new(),
                }),
                link_drops: AtomicU64::new(0),
                changes: Arc::new(tokio::sync::Notify::new()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.fabric.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches a port whose outgoing frames go to `link`; the returned
    /// [`FabricPort`] takes the frames that arrive on it.
    pub fn attach(&self, name: &str, link: Arc<dyn FcLink>) -> FabricPort {
        let mut st = self.lock();
        let index = st.fabric.attach(name);
        if st.links.len() <= index.0 {
            st.links.resize_with(index.0 + 1, || None);
        }
        st.links[index.0] = Some(link);
        FabricPort {
            switch: self.clone(),
            index,
        }
    }

    /// Attaches an E_Port (a tunnel's VE_Port) whose outgoing frames go
    /// to `link`.
    pub fn attach_e_port(&self, name: &str, link: Arc<dyn FcLink>) -> FabricPort {
        let mut st = self.lock();
        let index = st.fabric.attach_e_port(name);
        if st.links.len() <= index.0 {
            st.links.resize_with(index.0 + 1, || None);
        }
        st.links[index.0] = Some(link);
        FabricPort {
            switch: self.clone(),
            index,
        }
    }

    /// Notified whenever local ports changed (logins, registrations):
    /// the inter-switch controller then takes
    /// [`Fabric::take_local_changes`].
    pub fn local_changes(&self) -> Arc<tokio::sync::Notify> {
        self.inner.changes.clone()
    }

    /// Runs `f` on the fabric (zoning, views), then sends what it queued.
    pub fn with_fabric<R>(&self, f: impl FnOnce(&mut Fabric) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.fabric);
        self.pump(&mut st);
        r
    }

    /// Frames destination links refused.
    pub fn link_drops(&self) -> u64 {
        self.inner.link_drops.load(Ordering::Relaxed)
    }

    fn pump(&self, st: &mut State) {
        if st.fabric.has_local_changes() {
            self.inner.changes.notify_one();
        }
        while let Some((p, f)) = st.fabric.poll_transmit() {
            let link = st.links.get(p.0).and_then(|l| l.as_ref());
            let ok = link.is_some_and(|l| l.transmit(f).is_ok());
            if !ok {
                self.inner.link_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A port of the switch: frames handed to it enter the fabric. A clone is
/// another handle on the same port (frames through either enter the fabric
/// as the port's).
#[derive(Debug, Clone)]
pub struct FabricPort {
    switch: Switch,
    index: PortIndex,
}

impl FabricPort {
    /// The fabric's number for this port.
    pub fn index(&self) -> PortIndex {
        self.index
    }

    /// The switch.
    pub fn switch(&self) -> &Switch {
        &self.switch
    }

    /// Takes the port off the fabric: every login on it ends.
    pub fn detach(&self) {
        let mut st = self.switch.lock();
        st.fabric.detach(self.index);
        if let Some(l) = st.links.get_mut(self.index.0) {
            *l = None;
        }
        self.switch.pump(&mut st);
    }
}

impl FabricPort {
    /// Hands several frames to the fabric under one lock, in order.
    pub fn transmit_all(&self, frames: impl IntoIterator<Item = Frame>) {
        let mut st = self.switch.lock();
        let now = self.switch.inner.epoch;
        for f in frames {
            st.fabric.handle_frame(now, self.index, f);
        }
        self.switch.pump(&mut st);
    }
}

impl FcLink for FabricPort {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        let mut st = self.switch.lock();
        st.fabric
            .handle_frame(self.switch.inner.epoch, self.index, frame);
        self.switch.pump(&mut st);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("fabric port {}", self.index.0)
    }
}
