//! What the link's state machine asks of the world, done by the tunnel:
//! writes on its circuits' connections, frames to the fabric port and the
//! switch's controller, and the events it reports (link up and down,
//! circuits it drops), applied to the controller, the fast path and the
//! statistics.

use super::*;

/// The tunnel's side of [`LinkIo`], lent to the link for one call.
pub(super) struct Wires<'a> {
    pub(super) name: &'a str,
    pub(super) port_no: u32,
    pub(super) local_wwn: Wwn,
    pub(super) port: &'a FabricPort,
    pub(super) ctl: &'a InterSwitch,
    pub(super) ctl_tx: &'a mpsc::Sender<Frame>,
    pub(super) stats: &'a Mutex<TunnelStats>,
    pub(super) dropped: &'a AtomicU64,
    pub(super) fast: &'a FastPath,
    pub(super) circuits: &'a mut HashMap<usize, Circuit>,
    /// Circuits the link dropped: closed once it returns.
    pub(super) closed: Vec<(usize, String)>,
    /// Batches resent after a circuit went down, by circuit.
    pub(super) retransmits: Vec<(usize, u64)>,
}

impl LinkIo for Wires<'_> {
    fn has_room(&self, slot: usize, writes: usize) -> bool {
        self.circuits.get(&slot).is_some_and(|c| c.has_room(writes))
    }

    /// Queues `frames` on circuit `slot`'s writer (behind its backlog, if
    /// it has one). False when the circuit is gone, its writer closed or
    /// its backlog full: nothing was queued. A frame too long for FCIP's
    /// length field (a local port breaking FC-FS's payload limit) is
    /// dropped, counted and logged.
    fn write(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool {
        if !self.circuits.contains_key(&slot) {
            return false;
        }
        let mut bufs = Vec::with_capacity(frames.len() * 3);
        let mut n = 0;
        for (f, _) in frames {
            match encode(f) {
                Ok((three, len)) => {
                    n += len;
                    bufs.extend(three);
                }
                Err((f, e)) => {
                    warn!(tunnel = %self.name, slot, error = %e, s_id = %f.header.s_id, d_id = %f.header.d_id, "frame not sent: it does not fit FCIP's length field");
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if bufs.is_empty() {
            return true;
        }
        let Some(c) = self.circuits.get_mut(&slot) else {
            return false;
        };
        // Err: closed (its down event is on its way) or backlog full.
        if c.queue(bufs, n).is_err() {
            return false;
        }
        self.fast.count_tx(slot, n);
        true
    }

    fn dropped(&mut self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    fn to_fabric(&mut self, f: Frame) {
        let _ = self.port.transmit(f);
    }

    fn to_controller(&mut self, f: Frame) {
        self.ctl.deliver(f);
    }

    fn fspf(&mut self, r: SwIlsRepr) {
        self.ctl.on_fspf(self.port_no, r);
    }

    fn apply_zoning(&mut self, z: ZoneDb) {
        let Some((name, zones)) = z.active else {
            return;
        };
        self.ctl.switch().with_fabric(|f| {
            if f.zoning().active() == Some(name.as_str())
                && f.zoning().active_zones().len() == zones.len()
            {
                return;
            }
            let names: Vec<String> = zones.iter().map(|z| z.name.clone()).collect();
            for zone in zones {
                f.define_zone(zone);
            }
            f.define_zone_set(ZoneSet {
                name: name.clone(),
                zones: names,
            });
            if let Err(e) = f.activate_zone_set(&name) {
                warn!(error = %e, "merged zone set not activated");
            }
        });
    }

    fn local_switch(&self) -> LocalSwitch {
        let zoning = self.ctl.switch().with_fabric(|f| {
            let z = f.zoning();
            ZoneDb {
                active: z
                    .active()
                    .map(|a| (a.to_string(), z.active_zones().to_vec())),
            }
        });
        let t = unifab_fc::exchange::Timeouts::default();
        LocalSwitch {
            domain: self.ctl.domain(),
            switch_name: self.local_wwn,
            port_name: Wwn((self.local_wwn.0 & !0xffff) | 0x8000 | u64::from(self.port_no)),
            domains: self.ctl.known_domains(),
            zoning,
            r_a_tov: t.r_a_tov.as_millis() as u32,
            e_d_tov: t.e_d_tov.as_millis() as u32,
        }
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Negotiating { fastwrite } => {
                set_state(self.stats, "negotiating".into(), fastwrite);
            }
            Event::Up {
                domain,
                switch_name,
                peer_domains,
                enhanced,
                fastwrite,
            } => {
                // RFC mode: class 3 frames may bypass the tunnel's task now.
                self.fast.set_open(!enhanced);
                set_state(
                    self.stats,
                    format!("up (domain {domain}, {switch_name})"),
                    fastwrite,
                );
                self.ctl.link_up(
                    self.port_no,
                    LinkHandle {
                        tx: self.ctl_tx.clone(),
                        neighbor: domain,
                    },
                    &peer_domains,
                );
            }
            Event::Isolated {
                why,
                was_up,
                fastwrite,
            } => {
                set_state(self.stats, format!("isolated: {why}"), fastwrite);
                self.fast.set_open(false);
                if was_up {
                    self.ctl.link_down(self.port_no);
                }
            }
            Event::Down {
                why,
                was_up,
                isolated,
            } => {
                self.fast.set_open(false);
                if was_up {
                    self.ctl.link_down(self.port_no);
                }
                if !isolated {
                    set_state(self.stats, format!("down: {why}"), false);
                }
            }
            Event::Close { slot, why } => self.closed.push((slot, why)),
            Event::Retransmits { slot, n } => self.retransmits.push((slot, n)),
            Event::StandaloneAck => {
                if let Ok(mut st) = self.stats.lock() {
                    st.standalone_acks += 1;
                }
            }
        }
    }
}
