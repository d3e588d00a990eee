//! The tunnel's actor: the task that drives the link's state machine
//! ([`crate::proto::link::Link`]) with what happens to the tunnel (frames
//! from the fabric and the switch's controller, connections coming and
//! going, frames read from them, the clock) and owns what the machine may
//! not: the circuits' connections and their tasks, the fabric port, the
//! statistics. What the machine asks of the world goes through `Wires`.

use super::*;

pub(super) struct Actor {
    pub(super) cfg: Arc<TunnelConfig>,
    pub(super) port: FabricPort,
    pub(super) port_no: u32,
    pub(super) ctl: InterSwitch,
    pub(super) ev: mpsc::Sender<Ev>,
    pub(super) ctl_tx: mpsc::Sender<Frame>,
    pub(super) stats: Arc<Mutex<TunnelStats>>,
    pub(super) dropped: Arc<AtomicU64>,
    /// RFC mode's fast path (see `super::fast`).
    pub(super) fast: Arc<FastPath>,
    pub(super) circuits: HashMap<usize, Circuit>,
    pub(super) counters: HashMap<usize, CircuitStats>,
    pub(super) epoch: u64,
    /// The link's protocol state.
    pub(super) link: Link,
    pub(super) last_rate: Instant,
    pub(super) last_bytes: HashMap<usize, (u64, u64)>,
    pub(super) local_wwn: Wwn,
    /// Signalled by a circuit writer each time it takes writes off its
    /// queue: the tunnel waits on it while every writer is full.
    pub(super) room: Arc<Notify>,
    /// Set when the tunnel stops.
    pub(super) stop: tokio::sync::watch::Sender<bool>,
    /// The circuits as they are now (`Tunnel::set_circuits` changes them).
    pub(super) circuit_cfg: Vec<CircuitConfig>,
    /// Each connector loop's stop: set when its circuit is removed or the
    /// tunnel stops.
    pub(super) connectors: HashMap<usize, tokio::sync::watch::Sender<bool>>,
}

/// Writes a circuit writer must have room for before the tunnel takes
/// more frames from the fabric: one `from_fabric` call makes at most a few
/// batches (512 frames of ≤ 2 KiB each in ≤ 256 KiB batches), RFC mode
/// one write per circuit.
pub(super) const WRITER_HEADROOM: usize = 8;

/// What the link's state machine needs of the tunnel's configuration.
pub(super) fn link_config(cfg: &TunnelConfig, port_no: u32) -> LinkConfig {
    LinkConfig {
        name: cfg.name.clone(),
        enhanced: cfg.mode == LinkMode::Enhanced,
        weights: cfg.circuits.iter().map(|c| c.weight).collect(),
        compression: cfg.compression,
        fastwrite: cfg.fastwrite,
        tape_pipelining: cfg.tape_pipelining,
        originates: cfg.connects(),
        window_bytes: cfg.window_bytes,
        keepalive: cfg.keepalive,
        dead_after: cfg.dead_after,
        k_a_tov: cfg.k_a_tov,
        port_no,
    }
}

impl Actor {
    pub(super) fn new(
        cfg: Arc<TunnelConfig>,
        port: FabricPort,
        ctl: InterSwitch,
        ev: mpsc::Sender<Ev>,
        ctl_tx: mpsc::Sender<Frame>,
        stats: Arc<Mutex<TunnelStats>>,
        fast: Arc<FastPath>,
    ) -> Actor {
        let local_wwn = ctl.switch().with_fabric(|f| f.switch_name());
        let port_no = port.index().0 as u32 + 1;
        let mut counters = HashMap::new();
        for s in slots(&cfg) {
            counters.insert(
                s,
                CircuitStats {
                    slot: s,
                    state: "down".into(),
                    // The configured address until a connection names
                    // the real one (class F, slot 0, goes to the first
                    // circuit's peer).
                    peer: cfg
                        .circuits
                        .get(s.saturating_sub(1))
                        .and_then(|c| c.peer)
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    weight: cfg
                        .circuits
                        .get(s.saturating_sub(1))
                        .map_or(0, |c| c.weight),
                    ..CircuitStats::default()
                },
            );
        }
        let now = Instant::now();
        let cfg_circuits = cfg.circuits.clone();
        Actor {
            link: Link::new(link_config(&cfg, port_no), now),
            cfg,
            port,
            port_no,
            ctl,
            ev,
            ctl_tx,
            stats,
            dropped: fast.dropped.clone(),
            fast,
            circuits: HashMap::new(),
            counters,
            epoch: 0,
            last_rate: now,
            last_bytes: HashMap::new(),
            local_wwn,
            room: Arc::new(Notify::new()),
            stop: tokio::sync::watch::channel(false).0,
            circuit_cfg: cfg_circuits,
            connectors: HashMap::new(),
        }
    }

    /// Starts the loop that keeps circuit `slot` connected, on the side
    /// that connects (class F, slot 0, goes to the first circuit's peer).
    pub(super) fn spawn_connector(&mut self, slot: usize) {
        if !self.cfg.connects() {
            return;
        }
        let Some(circuit) = self
            .circuit_cfg
            .get(slot.saturating_sub(1))
            .or(self.circuit_cfg.first())
            .cloned()
        else {
            return;
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        if let Some(old) = self.connectors.insert(slot, tx) {
            old.send_replace(true);
        }
        tokio::spawn(connect_loop(
            self.cfg.clone(),
            circuit,
            slot,
            self.local_wwn,
            self.ev.clone(),
            self.stats.clone(),
            rx,
        ));
    }

    /// `Tunnel::set_circuits`: checks the whole change first, then adds,
    /// removes and reweighs circuits.
    pub(super) fn set_circuits(&mut self, new: Vec<CircuitConfig>) -> Result<(), String> {
        let name = &self.cfg.name;
        if self.cfg.mode != LinkMode::Enhanced {
            return Err(format!(
                "tunnel {name:?}: RFC mode pins each exchange to a circuit; its circuits change at a restart"
            ));
        }
        if new.is_empty() || new.len() > MAX_CIRCUITS {
            return Err(format!(
                "tunnel {name:?}: a tunnel has 1 to {MAX_CIRCUITS} circuits, not {}",
                new.len()
            ));
        }
        if new.iter().any(|c| c.peer.is_some()) != self.cfg.connects() {
            return Err(format!(
                "tunnel {name:?}: every circuit names a peer (this side connects) or none does, as before"
            ));
        }
        let old = &self.circuit_cfg;
        let kept = old.len().min(new.len());
        if let Some(i) =
            (0..kept).find(|i| old[*i].peer != new[*i].peer || old[*i].local != new[*i].local)
        {
            return Err(format!(
                "tunnel {name:?}: circuit {} changed its addresses; circuits are numbered by their place on both ends, so only the last ones can be added or removed live",
                i + 1
            ));
        }
        let (before, after) = (old.len(), new.len());
        self.circuit_cfg = new;
        self.link
            .set_weights(self.circuit_cfg.iter().map(|c| c.weight).collect());
        for (i, c) in self.circuit_cfg.iter().enumerate().take(kept) {
            if let Some(s) = self.counters.get_mut(&(i + 1)) {
                s.weight = c.weight;
            }
        }
        for slot in (after + 1)..=before {
            if let Some(stop) = self.connectors.remove(&slot) {
                stop.send_replace(true);
            }
            // Closed without counting it a failure; its unacknowledged
            // batches go out on the others.
            self.counters.remove(&slot);
            if let Some(c) = self.circuits.remove(&slot) {
                self.fast.remove(slot);
                drop(c);
                info!(tunnel = %self.cfg.name, slot, "circuit closed: removed by the configuration");
                self.drive(|l, w| l.circuit_down(slot, "removed by the configuration", w));
            }
            self.last_bytes.remove(&slot);
            info!(tunnel = %self.cfg.name, slot, "circuit removed");
        }
        for slot in (before + 1)..=after {
            let c = &self.circuit_cfg[slot - 1];
            self.counters.insert(
                slot,
                CircuitStats {
                    slot,
                    state: "down".into(),
                    peer: c.peer.map(|a| a.to_string()).unwrap_or_default(),
                    weight: c.weight,
                    ..CircuitStats::default()
                },
            );
            self.spawn_connector(slot);
            info!(tunnel = %self.cfg.name, slot, "circuit added");
        }
        self.publish();
        Ok(())
    }

    pub(super) async fn run(
        mut self,
        mut fab: mpsc::Receiver<Frame>,
        mut ev: mpsc::Receiver<Ev>,
        mut ctl: mpsc::Receiver<Frame>,
    ) {
        let timer = tokio::time::sleep_until(self.link.poll_timeout().into());
        tokio::pin!(timer);
        let mut armed = Some(self.link.poll_timeout());
        let room = self.room.clone();
        loop {
            tokio::select! {
                biased;
                () = &mut timer => {
                    armed = None;
                    self.on_timeout();
                },
                e = ev.recv() => match e {
                    Some(e) => if self.on_event(e).is_break() {
                        return;
                    },
                    None => return,
                },
                () = room.notified(), if self.waiting_for_room() => {
                    self.flush_backlogs();
                    self.drive(|l, w| l.on_room(w));
                },
                f = ctl.recv() => if let Some(f) = f {
                    self.drive(|l, w| l.class_f(f, w));
                },
                f = fab.recv(), if self.fabric_ready() => match f {
                    Some(f) => {
                        let mut batch = vec![f];
                        while batch.len() < 512 {
                            match fab.try_recv() {
                                Ok(f) => batch.push(f),
                                Err(_) => break,
                            }
                        }
                        let n = batch.len();
                        self.drive(|l, w| l.from_fabric(batch, w));
                        self.fast.handled(n);
                    }
                    None => return,
                },
            }
            // The link's next deadline, if it moved.
            let at = self.link.poll_timeout();
            if armed != Some(at) {
                armed = Some(at);
                timer.as_mut().reset(at.into());
            }
        }
    }

    /// Runs `f` on the link with the tunnel's wires, then closes the
    /// circuits the link dropped.
    pub(super) fn drive<R>(&mut self, f: impl FnOnce(&mut Link, &mut Wires<'_>) -> R) -> R {
        let mut w = Wires {
            name: &self.cfg.name,
            port_no: self.port_no,
            local_wwn: self.local_wwn,
            port: &self.port,
            ctl: &self.ctl,
            ctl_tx: &self.ctl_tx,
            stats: &self.stats,
            dropped: &self.dropped,
            fast: &self.fast,
            circuits: &mut self.circuits,
            closed: Vec::new(),
            retransmits: Vec::new(),
        };
        let r = f(&mut self.link, &mut w);
        let Wires {
            closed,
            retransmits,
            ..
        } = w;
        for (s, n) in retransmits {
            if let Some(c) = self.counters.get_mut(&s) {
                c.retransmits += n;
            }
        }
        for (s, why) in closed {
            self.drop_circuit(s, &why);
        }
        r
    }

    pub(super) fn fabric_ready(&self) -> bool {
        self.link.can_take() && self.writers_ready()
    }

    /// Whether the writers can take what the next frames from the fabric
    /// make: while at least one circuit that carries data keeps up. In
    /// enhanced mode batches go to whichever has room; in RFC mode an
    /// exchange's circuit is fixed, and frames for a circuit that is behind
    /// wait in its backlog (bounded: a stalled connection cannot hold up the
    /// exchanges of the others, nor take unbounded memory).
    pub(super) fn writers_ready(&self) -> bool {
        let headroom = WRITER_HEADROOM.min(self.writer_queue());
        let data_slots = self.link.enhanced() || self.circuits.keys().any(|s| *s != 0);
        let mut carriers = self
            .circuits
            .iter()
            .filter(|(s, _)| !data_slots || **s != 0)
            .map(|(_, c)| c)
            .peekable();
        carriers.peek().is_none() || carriers.any(|c| c.has_room(headroom))
    }

    pub(super) fn waiting_for_room(&self) -> bool {
        self.link.has_unsent()
            || !self.writers_ready()
            || self.circuits.values().any(|c| !c.backlog.is_empty())
    }

    pub(super) fn flush_backlogs(&mut self) {
        for c in self.circuits.values_mut() {
            c.flush();
        }
    }

    pub(super) fn writer_queue(&self) -> usize {
        self.cfg.writer_queue.max(1)
    }

    /// Break: the tunnel has stopped.
    pub(super) fn on_event(&mut self, e: Ev) -> ControlFlow<()> {
        match e {
            Ev::Up(slot, conn, done) => self.circuit_up(slot, conn, done),
            Ev::Rx(slot, epoch, item) => {
                if self.circuits.get(&slot).is_some_and(|c| c.epoch == epoch) {
                    if let Item::Frame(b) = &item {
                        self.fast.count_rx(slot, b.len());
                    }
                    let now = Instant::now();
                    self.drive(|l, w| l.from_circuit(slot, item, now, w));
                    // Handled (if the circuit went with it, so did its
                    // reader and the count).
                    if let Some(c) = self.circuits.get(&slot).filter(|c| c.epoch == epoch) {
                        c.unhandled.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            Ev::Closed(slot, epoch, why) => {
                if self.circuits.get(&slot).is_some_and(|c| c.epoch == epoch) {
                    self.circuit_down(slot, &why);
                }
            }
            Ev::ConnectFailed(slot, why) => {
                if let Some(s) = self.counters.get_mut(&slot) {
                    s.connect_failures += 1;
                    s.last_error = format!("connect: {why}");
                    s.last_error_at = Some(Instant::now());
                }
                self.publish();
            }
            Ev::SetCircuits(list, done) => {
                let _ = done.send(self.set_circuits(list));
            }
            Ev::Stop(done) => {
                self.shut_down();
                let _ = done.send(());
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// `Tunnel::stop`: the link goes down first (so that losing the
    /// circuits resends nothing), then the circuits close, the connectors
    /// stop and the port leaves the switch.
    pub(super) fn shut_down(&mut self) {
        self.drive(|l, w| l.stop(w));
        self.stop.send_replace(true);
        for c in self.connectors.values() {
            c.send_replace(true);
        }
        let n = self.circuits.len();
        // Dropping a circuit aborts its reader and writer, which closes
        // the socket (the fast path's handle on it goes too); its
        // connector, told to stop, does not reconnect.
        for s in self.circuits.keys() {
            self.fast.remove(*s);
        }
        self.circuits.clear();
        self.port.detach();
        set_state(&self.stats, "stopped".into(), false);
        for c in self.counters.values_mut() {
            c.state = "down".into();
        }
        self.publish();
        info!(tunnel = %self.cfg.name, circuits = n, "tunnel stopped");
    }

    pub(super) fn circuit_up(
        &mut self,
        slot: usize,
        conn: Conn,
        done: Option<oneshot::Sender<()>>,
    ) {
        let valid = match self.cfg.mode {
            LinkMode::Rfc => slot <= self.circuit_cfg.len(),
            LinkMode::Enhanced => (1..=self.circuit_cfg.len()).contains(&slot),
        };
        if !valid {
            warn!(tunnel = %self.cfg.name, slot, "connection for an unknown circuit refused");
            return;
        }
        if self.circuits.contains_key(&slot) {
            self.circuit_down(slot, "replaced by a new connection");
        }
        self.epoch += 1;
        let epoch = self.epoch;
        let (wtx, wrx) = mpsc::channel::<Vec<Bytes>>(self.writer_queue());
        let (rd, wr) = tokio::io::split(conn.stream);
        let queued = Arc::new(AtomicUsize::new(0));
        let w = tokio::spawn(writer(
            wr,
            wrx,
            self.ev.clone(),
            slot,
            epoch,
            self.room.clone(),
            queued.clone(),
        ));
        let unhandled = Arc::new(AtomicUsize::new(0));
        let mut fast_rx = None;
        if self.cfg.mode == LinkMode::Rfc && slot >= 1 {
            self.fast.add(FastCircuit {
                slot,
                weight: self.circuit_cfg.get(slot - 1).map_or(1, |c| c.weight),
                sock: conn.direct.as_ref().and_then(|d| d.try_clone().ok()),
                writer: wtx.clone(),
                queued: queued.clone(),
            });
            fast_rx = Some(FastRx {
                fast: self.fast.clone(),
                port: self.port.clone(),
                slot,
                unhandled: unhandled.clone(),
            });
        }
        let r = tokio::spawn(reader(
            rd,
            conn.leftover,
            self.ev.clone(),
            slot,
            epoch,
            unhandled.clone(),
            fast_rx,
        ));
        let now = Instant::now();
        self.circuits.insert(
            slot,
            Circuit {
                epoch,
                writer: wtx,
                tasks: [w.abort_handle(), r.abort_handle()],
                done,
                fd: conn.fd,
                since: now,
                peer: conn.peer,
                backlog: Vec::new(),
                backlog_bytes: 0,
                direct: conn.direct,
                queued,
                unhandled,
            },
        );
        if let Some(c) = self.counters.get_mut(&slot) {
            c.state = "up".into();
            c.peer = conn.peer.to_string();
        }
        info!(tunnel = %self.cfg.name, slot, peer = %conn.peer, "circuit up");
        self.publish();
        let caps = conn.peer_caps;
        self.drive(|l, w| l.circuit_up(slot, caps, now, w));
    }

    /// Circuit `slot`'s connection ended: it is closed, and the link is
    /// told.
    pub(super) fn circuit_down(&mut self, slot: usize, why: &str) {
        if self.drop_circuit(slot, why) {
            self.drive(|l, w| l.circuit_down(slot, why, w));
        }
    }

    /// Closes circuit `slot`'s connection (its tasks end with it) and
    /// counts the failure; false if there was none.
    pub(super) fn drop_circuit(&mut self, slot: usize, why: &str) -> bool {
        let Some(mut c) = self.circuits.remove(&slot) else {
            return false;
        };
        self.fast.remove(slot);
        if let Some(d) = c.done.take() {
            let _ = d.send(());
        }
        if let Some(s) = self.counters.get_mut(&slot) {
            s.state = "down".into();
            s.failures += 1;
            s.last_error = why.to_string();
            s.last_error_at = Some(Instant::now());
        }
        // Another circuit carries on: a failover (not when the tunnel
        // stops, which drops its circuits all at once without this).
        let data = |s: &usize| self.cfg.mode == LinkMode::Enhanced || *s != 0;
        if data(&slot)
            && self.link.is_up()
            && self.circuits.keys().any(data)
            && let Ok(mut st) = self.stats.lock()
        {
            st.failovers += 1;
        }
        warn!(tunnel = %self.cfg.name, slot, peer = %c.peer, reason = why, "circuit down");
        self.publish();
        true
    }

    /// The link's deadline came: its delayed ack or periodic tick (and
    /// the writers' backlogs and the statistics with it).
    pub(super) fn on_timeout(&mut self) {
        let now = Instant::now();
        self.flush_backlogs();
        self.drive(|l, w| l.handle_timeout(now, w));
        if now.duration_since(self.last_rate) >= Duration::from_secs(1) {
            self.update_stats(now);
        }
    }

    /// Publishes the counters (rates only once a second).
    pub(super) fn publish(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_rate) >= Duration::from_secs(1) {
            self.update_stats(now);
            return;
        }
        let mut out: Vec<CircuitStats> = self.counters.values().cloned().collect();
        out.sort_by_key(|c| c.slot);
        for c in &mut out {
            if let Some(k) = self.circuits.get(&c.slot) {
                c.uptime_s = now.duration_since(k.since).as_secs_f64();
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            st.circuits = out;
        }
    }

    pub(super) fn update_stats(&mut self, now: Instant) {
        let dt = now.duration_since(self.last_rate).as_secs_f64();
        self.last_rate = now;
        let mut out = Vec::new();
        let mut slots: Vec<usize> = self.counters.keys().copied().collect();
        slots.sort_unstable();
        for s in slots {
            let Some(c) = self.counters.get_mut(&s) else {
                continue;
            };
            if let Some(b) = self.fast.bytes.get(s) {
                c.tx_bytes = b.tx.load(Ordering::Relaxed);
                c.rx_bytes = b.rx.load(Ordering::Relaxed);
            }
            let (ptx, prx) = self.last_bytes.get(&s).copied().unwrap_or((0, 0));
            c.tx_mbps = (c.tx_bytes - ptx) as f64 / dt / 1e6;
            c.rx_mbps = (c.rx_bytes - prx) as f64 / dt / 1e6;
            self.last_bytes.insert(s, (c.tx_bytes, c.rx_bytes));
            if let Some(k) = self.circuits.get(&s) {
                c.uptime_s = now.duration_since(k.since).as_secs_f64();
                c.rtt_us = tcp_rtt_us(k.fd).unwrap_or(0);
            } else {
                c.uptime_s = 0.0;
            }
            out.push(c.clone());
        }
        let rate: f64 = out.iter().map(|c| c.tx_mbps * 1e6).sum();
        self.link.observe_send_rate(rate);
        if let Ok(mut st) = self.stats.lock() {
            st.circuits = out;
            st.raw_bytes = self.link.raw_bytes();
            st.wire_bytes = self.link.wire_bytes();
            st.duplicates = self.link.duplicates();
            st.dropped = self.dropped.load(Ordering::Relaxed);
            st.fastwrite_writes = self.link.accelerated();
            st.tape_pipelining = self.link.tape_pipelining();
            st.tape = self.link.tape_stats();
        }
    }
}

/// Sets the state the tunnel's statistics show.
pub(super) fn set_state(stats: &Mutex<TunnelStats>, s: String, fastwrite: bool) {
    if let Ok(mut st) = stats.lock() {
        st.state = s;
        st.fastwrite = fastwrite;
    }
}
