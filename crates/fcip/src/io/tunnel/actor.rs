//! The tunnel's actor: its state, and its life cycle (events, circuits
//! coming and going, the link's bring-up and loss, ticks, statistics).
//! What it does with frames is in `rx` and `tx`.

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
    pub(super) eport: Option<EPort>,
    pub(super) up: Option<u8>,
    pub(super) isolated: Option<String>,
    pub(super) enhanced: bool,
    /// Enhanced mode: every circuit was silent at the last tick (see
    /// `enhanced_dead`).
    pub(super) all_silent: bool,
    pub(super) send: SendWindow,
    pub(super) recv: ReceiveWindow<HeldBatch>,
    pub(super) comp: Compressor,
    pub(super) host: Option<HostSide>,
    pub(super) target: Option<TargetSide>,
    pub(super) rr: usize,
    /// A data batch arrived and the peer has not yet been sent the ack
    /// for it: the circuit it came on.
    pub(super) ack_due: Option<usize>,
    /// When the standalone ack for `ack_due` goes out, unless a batch
    /// toward the peer (which carries the ack) goes first.
    pub(super) ack_at: Option<Instant>,
    /// Data batches received since the peer was last sent an ack.
    pub(super) unacked_rx: u32,
    pub(super) last_rate: Instant,
    /// When FastWrite's target side last swept idle exchanges.
    pub(super) last_sweep: Instant,
    pub(super) last_bytes: HashMap<usize, (u64, u64)>,
    pub(super) local_wwn: Wwn,
    /// Signalled by a circuit writer each time it takes writes off its
    /// queue: the tunnel waits on it while every writer is full.
    pub(super) room: Arc<Notify>,
    /// Enhanced mode: data batches in the send window that found no writer
    /// with room and wait to be sent.
    pub(super) unsent: bool,
    /// Set when the tunnel stops: the connector loops end.
    pub(super) stop: tokio::sync::watch::Sender<bool>,
}

/// A data batch as received, held in the receive window until it is in
/// order.
#[derive(Debug)]
pub(super) struct HeldBatch {
    /// The circuit it came on.
    pub(super) slot: usize,
    pub(super) codec: Codec,
    pub(super) raw_len: usize,
    pub(super) body: Bytes,
}

/// The receive window: batches held waiting for an earlier one are
/// bounded by `peer_bound`. A peer configured with a larger window than
/// that, or one that withholds a batch and sends on, has its circuit
/// closed.
pub(super) fn receive_window(cfg: &TunnelConfig) -> ReceiveWindow<HeldBatch> {
    ReceiveWindow::new(1 << 20, peer_bound(cfg))
}

/// What a peer may make this end hold, either way: twice the window plus
/// two batches (a sender may pass its window by one round of batches).
pub(super) fn peer_bound(cfg: &TunnelConfig) -> usize {
    cfg.window_bytes
        .saturating_mul(2)
        .saturating_add(2 * enhanced::MAX_BATCH_BODY)
}

/// Writes a circuit writer must have room for before the tunnel takes
/// more frames from the fabric: one `outbound` call makes at most a few
/// batches (512 frames of ≤ 2 KiB each in ≤ 256 KiB batches), RFC mode
/// one write per circuit.
pub(super) const WRITER_HEADROOM: usize = 8;

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
                    weight: cfg
                        .circuits
                        .get(s.saturating_sub(1))
                        .map_or(0, |c| c.weight),
                    ..CircuitStats::default()
                },
            );
        }
        Actor {
            comp: Compressor::new(cfg.compression),
            send: SendWindow::new(cfg.window_bytes),
            recv: receive_window(&cfg),
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
            eport: None,
            up: None,
            isolated: None,
            enhanced: false,
            all_silent: false,
            host: None,
            target: None,
            rr: 0,
            ack_due: None,
            ack_at: None,
            unacked_rx: 0,
            last_rate: Instant::now(),
            last_sweep: Instant::now(),
            last_bytes: HashMap::new(),
            local_wwn,
            room: Arc::new(Notify::new()),
            unsent: false,
            stop: tokio::sync::watch::channel(false).0,
        }
    }

    pub(super) async fn run(
        mut self,
        mut fab: mpsc::Receiver<Frame>,
        mut ev: mpsc::Receiver<Ev>,
        mut ctl: mpsc::Receiver<Frame>,
    ) {
        let tick = (self.cfg.keepalive / 2).max(Duration::from_millis(5));
        let mut timer = tokio::time::interval(tick);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ack_sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_sleep);
        let room = self.room.clone();
        loop {
            tokio::select! {
                biased;
                () = &mut ack_sleep, if self.ack_at.is_some() => {
                    self.ack_at = None;
                    if let Some(slot) = self.ack_due.take() {
                        self.send_standalone_ack(slot);
                    }
                },
                e = ev.recv() => match e {
                    Some(e) => if self.on_event(e).is_break() {
                        return;
                    },
                    None => return,
                },
                () = room.notified(), if self.waiting_for_room() => {
                    self.flush_backlogs();
                    self.send_unsent();
                },
                f = ctl.recv() => if let Some(f) = f { self.send_class_f(f) },
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
                        self.outbound(batch);
                        self.fast.handled(n);
                    }
                    None => return,
                },
                _ = timer.tick() => self.on_tick(),
            }
            // Delayed ack: the reply to what just arrived usually goes
            // back within the delay and carries the ack; a standalone one
            // would arrive first and cost the peer a wake-up of its own.
            // Bulk one-way traffic is acked every ACK_EVERY batches.
            if let Some(slot) = self.ack_due {
                if self.unacked_rx >= ACK_EVERY {
                    self.send_standalone_ack(slot);
                } else if self.ack_at.is_none() {
                    let at = Instant::now() + ACK_DELAY;
                    self.ack_at = Some(at);
                    ack_sleep.as_mut().reset(at.into());
                }
            }
        }
    }

    pub(super) fn fabric_ready(&self) -> bool {
        (!self.enhanced || self.send.has_room()) && self.writers_ready()
    }

    /// Whether the writers can take what the next frames from the fabric
    /// make: while at least one circuit that carries data keeps up. In
    /// enhanced mode batches go to whichever has room; in RFC mode an
    /// exchange's circuit is fixed, and frames for a circuit that is behind
    /// wait in its backlog (bounded: a stalled connection cannot hold up the
    /// exchanges of the others, nor take unbounded memory).
    pub(super) fn writers_ready(&self) -> bool {
        let headroom = WRITER_HEADROOM.min(self.writer_queue());
        let data_slots = self.enhanced || self.circuits.keys().any(|s| *s != 0);
        let mut carriers = self
            .circuits
            .iter()
            .filter(|(s, _)| !data_slots || **s != 0)
            .map(|(_, c)| c)
            .peekable();
        carriers.peek().is_none() || carriers.any(|c| c.has_room(headroom))
    }

    pub(super) fn waiting_for_room(&self) -> bool {
        self.unsent
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

    /// Enhanced mode: sends the batches that found every writer full.
    pub(super) fn send_unsent(&mut self) {
        if !self.unsent || !self.enhanced {
            self.unsent = false;
            return;
        }
        let open: Vec<usize> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.has_room(1))
            .map(|(s, _)| *s)
            .collect();
        if open.is_empty() {
            // Still waiting: a writer's progress or a new circuit calls
            // again.
            return;
        }
        let alive: Vec<usize> = self.circuits.keys().copied().collect();
        let moved = {
            let mut rr = self.rr;
            let r = self.send.orphans(&alive, |_| {
                rr += 1;
                open.get(rr % open.len()).copied()
            });
            self.rr = rr;
            r
        };
        // Every waiting batch was assigned; one whose write fails again
        // sets `unsent` again.
        self.unsent = false;
        for (c, h, b) in moved {
            self.write_batch(c, h, b);
        }
    }

    pub(super) fn class_f_slot(&self) -> Option<usize> {
        if self.enhanced {
            None
        } else {
            self.circuits.contains_key(&0).then_some(0)
        }
    }

    pub(super) fn link_ready(&self) -> bool {
        if self.cfg.mode == LinkMode::Rfc {
            self.circuits.contains_key(&0)
        } else {
            !self.circuits.is_empty()
        }
    }

    /// Break: the tunnel has stopped.
    pub(super) fn on_event(&mut self, e: Ev) -> ControlFlow<()> {
        match e {
            Ev::Up(slot, conn, done) => self.circuit_up(slot, conn, done),
            Ev::Rx(slot, epoch, item) => {
                if self.circuits.get(&slot).is_some_and(|c| c.epoch == epoch) {
                    self.on_rx(slot, item);
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
        self.link_down("stopped");
        self.stop.send_replace(true);
        let n = self.circuits.len();
        // Dropping a circuit aborts its reader and writer, which closes
        // the socket (the fast path's handle on it goes too); its
        // connector, told to stop, does not reconnect.
        for s in self.circuits.keys() {
            self.fast.remove(*s);
        }
        self.circuits.clear();
        self.port.detach();
        self.isolated = None;
        self.set_state("stopped".into());
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
            LinkMode::Rfc => slot <= self.cfg.circuits.len(),
            LinkMode::Enhanced => (1..=self.cfg.circuits.len()).contains(&slot),
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
                weight: self.cfg.circuits[slot - 1].weight,
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
                last_rx: now,
                since: now,
                reasm: Reassembly::default(),
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
        let peer_enhanced = conn
            .peer_caps
            .is_some_and(|c| c.has(Capabilities::ENHANCED));
        if self.eport.is_none() && self.link_ready() {
            self.enhanced = self.cfg.mode == LinkMode::Enhanced && peer_enhanced;
            self.link_start(conn.peer_caps);
        } else if self.enhanced {
            // Batches orphaned while no circuit was up go out now.
            self.unsent = true;
            self.send_unsent();
        }
    }

    pub(super) fn link_start(&mut self, peer_caps: Option<Capabilities>) {
        let fastwrite = self.enhanced
            && self.cfg.fastwrite
            && peer_caps.is_some_and(|c| c.has(Capabilities::FASTWRITE));
        if fastwrite {
            self.host = Some(HostSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
            self.target = Some(TargetSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
        }
        let zoning = self.ctl.switch().with_fabric(|f| {
            let z = f.zoning();
            ZoneDb {
                active: z
                    .active()
                    .map(|a| (a.to_string(), z.active_zones().to_vec())),
            }
        });
        let t = unifab_fc::exchange::Timeouts::default();
        let local = LocalSwitch {
            domain: self.ctl.domain(),
            switch_name: self.local_wwn,
            port_name: Wwn((self.local_wwn.0 & !0xffff) | 0x8000 | u64::from(self.port_no)),
            domains: self.ctl.known_domains(),
            zoning,
            r_a_tov: t.r_a_tov.as_millis() as u32,
            e_d_tov: t.e_d_tov.as_millis() as u32,
        };
        let mut e = EPort::new(local, self.cfg.connects());
        e.start();
        self.eport = Some(e);
        self.isolated = None;
        self.set_state("negotiating".into());
        self.drain_eport();
    }

    pub(super) fn set_state(&self, s: String) {
        if let Ok(mut st) = self.stats.lock() {
            st.state = s;
            st.fastwrite = self.host.is_some();
        }
    }

    pub(super) fn link_down(&mut self, why: &str) {
        if self.eport.take().is_some() {
            warn!(tunnel = %self.cfg.name, reason = why, "link down");
        }
        self.fast.set_open(false);
        if self.up.take().is_some() {
            self.ctl.link_down(self.port_no);
        }
        if let Some(h) = &mut self.host {
            h.clear();
        }
        if let Some(t) = &mut self.target {
            t.clear();
        }
        self.host = None;
        self.target = None;
        self.send = SendWindow::new(self.cfg.window_bytes);
        self.recv = receive_window(&self.cfg);
        if self.isolated.is_none() {
            self.set_state(format!("down: {why}"));
        }
    }

    pub(super) fn circuit_down(&mut self, slot: usize, why: &str) {
        let Some(mut c) = self.circuits.remove(&slot) else {
            return;
        };
        self.fast.remove(slot);
        if let Some(d) = c.done.take() {
            let _ = d.send(());
        }
        if let Some(s) = self.counters.get_mut(&slot) {
            s.state = "down".into();
            s.failures += 1;
        }
        warn!(tunnel = %self.cfg.name, slot, peer = %c.peer, reason = why, "circuit down");
        self.publish();
        if !self.link_ready() {
            self.link_down(why);
            // RFC: data connections go with the class F one.
            if self.cfg.mode == LinkMode::Rfc {
                let rest: Vec<usize> = self.circuits.keys().copied().collect();
                for s in rest {
                    self.circuit_down(s, "class F connection lost");
                }
            }
            return;
        }
        if self.enhanced {
            let live: Vec<usize> = self.circuits.keys().copied().collect();
            let mut rr = self.rr;
            let moved = self.send.fail_circuit(slot, |_| {
                rr += 1;
                live.get(rr % live.len()).copied()
            });
            self.rr = rr;
            if let Some(s) = self.counters.get_mut(&slot) {
                s.retransmits += moved.len() as u64;
            }
            for (c, h, b) in moved {
                self.write_batch(c, h, b);
            }
        }
    }

    /// Enhanced mode: which of the circuits past the dead interval
    /// (`silent`) are declared dead. Losing one circuit of several costs a
    /// resend on a survivor; losing the last takes the link down and fails
    /// every exchange in flight, and the two ends must not each keep a
    /// circuit the other closed. So:
    ///
    /// - a circuit is dead only if another was heard half a dead interval
    ///   after it fell silent: circuits cut together go quiet a tick apart,
    ///   and the first past the interval must not be closed while the
    ///   others, as silent but a tick younger, still count as alive (seen
    ///   once in CI: the two ends each closed a different one);
    /// - when every circuit is silent, none is dead until one is heard from
    ///   again or all have been silent for K_A_TOV: all falling silent
    ///   together is as likely a starved host (this one or the peer) as an
    ///   outage of every path, and neither end can tell which will come
    ///   back first;
    /// - the first circuit back after that gives the others a whole dead
    ///   interval from now to be heard from too, since each end may hear a
    ///   different one first.
    pub(super) fn enhanced_dead(&mut self, mut silent: Vec<usize>, now: Instant) -> Vec<usize> {
        if silent.is_empty() {
            // Nothing past the interval: not every circuit is silent.
            self.all_silent = false;
            return silent;
        }
        if silent.len() < self.circuits.len() {
            let margin = self.cfg.dead_after / 2;
            silent.retain(|s| {
                let Some(quiet_since) = self.circuits.get(s).map(|c| c.last_rx) else {
                    return false;
                };
                self.circuits
                    .iter()
                    .any(|(o, c)| o != s && c.last_rx > quiet_since + margin)
            });
            if std::mem::take(&mut self.all_silent) {
                for s in silent.drain(..) {
                    if let Some(c) = self.circuits.get_mut(&s) {
                        c.last_rx = now;
                    }
                }
            }
            return silent;
        }
        // Every circuit is past the interval.
        let newest = self
            .circuits
            .values()
            .map(|c| now.duration_since(c.last_rx))
            .min()
            .unwrap_or_default();
        if newest <= Duration::from_millis(u64::from(self.cfg.k_a_tov)) {
            self.all_silent = true;
            Vec::new()
        } else {
            self.all_silent = false;
            silent
        }
    }

    pub(super) fn on_tick(&mut self) {
        let now = Instant::now();
        let mut dead: Vec<usize> = self
            .circuits
            .iter()
            .filter(|(s, c)| {
                let watched = self.enhanced || **s == 0;
                watched && now.duration_since(c.last_rx) > self.cfg.dead_after
            })
            .map(|(s, _)| *s)
            .collect();
        if self.enhanced {
            dead = self.enhanced_dead(dead, now);
        }
        for s in dead {
            self.circuit_down(s, "keep-alive timeout (nothing received)");
        }
        self.flush_backlogs();
        self.send_unsent();
        // Heartbeats.
        if self.enhanced {
            let slots: Vec<usize> = self.circuits.keys().copied().collect();
            for s in slots {
                self.send_control(s);
            }
        } else if self.circuits.contains_key(&0) && self.up.is_some() {
            let hlo = SwIlsRepr::Hlo(Hlo {
                header: FspfHeader {
                    version: 2,
                    domain: self.ctl.domain(),
                    ..FspfHeader::default()
                },
                options: 0,
                hello_interval: self.cfg.keepalive.as_secs().max(1) as u32,
                dead_interval: self.cfg.dead_after.as_secs().max(1) as u32,
                recipient_domain: self.up.map_or(0xffff_ffff, u32::from),
                port_index: self.port_no,
            });
            let fc = FcId::FABRIC_CONTROLLER;
            let f = crate::proto::eport::sw_ils_frame(
                &hlo,
                false,
                OxId(0x7200),
                RxId::UNASSIGNED,
                fc,
                fc,
            );
            self.write_or_drop(0, vec![(f, 0)]);
        }
        if now.duration_since(self.last_rate) >= Duration::from_secs(1) {
            self.update_stats(now);
        }
        if now.duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.last_sweep = now;
            if let Some(t) = &mut self.target {
                let n = t.sweep();
                if n > 0 {
                    warn!(tunnel = %self.cfg.name, exchanges = n, "FastWrite: idle accelerated writes dropped with their held data");
                }
            }
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
        if self.enhanced && self.send.acked() > 0 {
            let rate: f64 = out.iter().map(|c| c.tx_mbps * 1e6).sum();
            self.comp.set_link_rate(rate);
        }
        if let Ok(mut st) = self.stats.lock() {
            st.circuits = out;
            st.raw_bytes = self.comp.raw_bytes;
            st.wire_bytes = self.comp.wire_bytes;
            st.duplicates = self.recv.duplicates;
            st.dropped = self.dropped.load(Ordering::Relaxed);
            st.fastwrite_writes = self.host.as_ref().map_or(0, |h| h.accelerated);
        }
    }

    // ---- receive side ----
}
