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
    /// Consecutive frames out of the fabric for one port, handed to its
    /// link together (kept here so that its buffer is reused).
    run: Vec<Frame>,
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
                fabric: Mutex::new(State {
                    fabric: Fabric::new(cfg),
                    links: Vec::new(),
                    run: Vec::new(),
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
        // Frames for the same port in a row go to its link in one call,
        // so that a link that can send them together does (an FCP
        // sequence's data frames through a tunnel: one write, not one per
        // frame).
        let State { fabric, links, run } = st;
        let mut port = None;
        while let Some((p, f)) = fabric.poll_transmit() {
            if port != Some(p) {
                if let Some(q) = port {
                    self.hand_over(links, q, run);
                }
                port = Some(p);
            }
            run.push(f);
        }
        if let Some(q) = port {
            self.hand_over(links, q, run);
        }
    }

    /// Hands `run`'s frames to port `p`'s link, leaving `run` empty, and
    /// counts what it did not take.
    fn hand_over(&self, links: &[Option<Arc<dyn FcLink>>], p: PortIndex, run: &mut Vec<Frame>) {
        let dropped = match links.get(p.0).and_then(|l| l.as_ref()) {
            None => {
                let n = run.len();
                run.clear();
                n
            }
            Some(l) if run.len() == 1 => match run.pop() {
                Some(f) => usize::from(l.transmit(f).is_err()),
                None => 0,
            },
            Some(l) => {
                let n = l.transmit_batch(run);
                run.clear();
                n
            }
        };
        if dropped > 0 {
            self.inner
                .link_drops
                .fetch_add(dropped as u64, Ordering::Relaxed);
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
        // The fabric keeps no timers: the time it is handed frames at is
        // its clock (an unanswered RSCN stops holding the next by it).
        let now = Instant::now();
        for f in frames {
            st.fabric.handle_frame(now, self.index, f);
        }
        self.switch.pump(&mut st);
    }
}

impl FcLink for FabricPort {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        let mut st = self.switch.lock();
        st.fabric.handle_frame(Instant::now(), self.index, frame);
        self.switch.pump(&mut st);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("fabric port {}", self.index.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::compose::{self, Route};
    use crate::wire::els::{ElsRepr, LoginParams};
    use crate::wire::{FcId, OxId, Wwn};

    /// A link that records how many frames each call handed it and
    /// refuses every frame after the first `take`.
    #[derive(Debug)]
    struct Recorder {
        calls: Mutex<Vec<usize>>,
        take: usize,
        taken: AtomicU64,
    }

    impl Recorder {
        fn new(take: usize) -> Arc<Recorder> {
            Arc::new(Recorder {
                calls: Mutex::new(Vec::new()),
                take,
                taken: AtomicU64::new(0),
            })
        }

        fn calls(&self) -> Vec<usize> {
            self.calls.lock().unwrap().clone()
        }

        fn one(&self) -> Result<(), LinkError> {
            if self.taken.fetch_add(1, Ordering::Relaxed) < self.take as u64 {
                Ok(())
            } else {
                Err(LinkError::Full)
            }
        }
    }

    impl FcLink for Recorder {
        fn transmit(&self, _: Frame) -> Result<(), LinkError> {
            self.calls.lock().unwrap().push(1);
            self.one()
        }

        fn transmit_batch(&self, frames: &mut Vec<Frame>) -> usize {
            self.calls.lock().unwrap().push(frames.len());
            frames.drain(..).filter(|_| self.one().is_err()).count()
        }

        fn describe(&self) -> String {
            "recorder".into()
        }
    }

    fn flogi(ox: u16) -> Frame {
        let p = LoginParams::n_port(
            Wwn(0x2100_0000_0000_0001),
            Wwn(0x2000_0000_0000_0001),
            2048,
            2000,
        );
        let route = Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(ox));
        compose::els(route, &ElsRepr::Flogi(p)).unwrap()
    }

    /// The fabric's answers to frames handed over together reach the
    /// port's link in one call (a link that can write them with one
    /// system call does); a lone frame goes through `transmit`; what the
    /// link refuses is counted, frame by frame.
    #[test]
    fn frames_for_one_port_in_a_row_reach_its_link_in_one_call() {
        let sw = Switch::new(FabricConfig::default());
        let rec = Recorder::new(3);
        let port = sw.attach("p1", rec.clone());
        port.transmit(flogi(1)).unwrap();
        assert_eq!(rec.calls(), vec![1]);
        port.transmit_all([flogi(2), flogi(3), flogi(4)]);
        assert_eq!(rec.calls(), vec![1, 3]);
        // The link took three frames in all: one of the batch is dropped.
        assert_eq!(sw.link_drops(), 1);
    }
}
