//! Toward the peer: frames from the fabric (through FastWrite's sides),
//! class F, RFC mode's choice of circuit, enhanced mode's batches through
//! the send window and compression, acks and heartbeats.

use super::*;

impl Link {
    /// Frames the fabric sends out through the VE_Port (dropped and
    /// counted while the link is not up).
    pub fn from_fabric(&mut self, frames: Vec<Frame>, io: &mut impl LinkIo) {
        if self.up.is_none() {
            io.dropped(frames.len() as u64);
            return;
        }
        let mut out: Vec<(Frame, u8)> = Vec::with_capacity(frames.len());
        for f in frames {
            tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %f.header.d_id, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "tx");
            // Near the target: FastWrite swallows the target's XFER_RDYs
            // and feeds it held data; tape pipelining sends a drive its
            // next queued command once it answered the last.
            let up = match &mut self.target {
                Some(t) => {
                    let (up, fed) = t.outbound(f);
                    for d in fed {
                        io.to_fabric(d);
                    }
                    match up {
                        Some(f) => f,
                        None => continue,
                    }
                }
                None => f,
            };
            // Read-ahead's own exchanges with the drive stay here; what
            // it sends the host side goes before the frame it passes on.
            let up = match &mut self.ahead_target {
                Some(a) => {
                    let act = a.from_drive(up);
                    for d in act.to_fabric {
                        io.to_fabric(d);
                    }
                    if let Some(fw) = &mut self.target {
                        for (s_id, ox) in act.forget {
                            fw.forget(s_id, ox);
                        }
                    }
                    out.extend(act.up);
                    for (f, fl) in act.released {
                        self.toward_drive(f, fl, io);
                    }
                    match act.pass {
                        Some(f) => f,
                        None => continue,
                    }
                }
                None => up,
            };
            let ups = match &mut self.tape_target {
                Some(t) => {
                    let o = t.outbound(up);
                    for d in o.to_fabric {
                        io.to_fabric(d);
                    }
                    if let Some(fw) = &mut self.target {
                        for (s_id, ox) in o.forget {
                            fw.forget(s_id, ox);
                        }
                    }
                    o.up
                }
                None => vec![up],
            };
            for f in ups {
                self.near_host(f, &mut out, io);
            }
        }
        self.tunnel_out(out, io);
    }

    /// Near the host: tape pipelining, then FastWrite.
    fn near_host(&mut self, f: Frame, out: &mut Vec<(Frame, u8)>, io: &mut impl LinkIo) {
        let f = match &mut self.tape_host {
            Some(t) => match t.outbound(f) {
                Ok(actions) => {
                    for a in actions {
                        match a {
                            HostAction::Tunnel(f, fl) => out.push((f, fl)),
                            HostAction::Fabric(p) => io.to_fabric(p),
                        }
                    }
                    return;
                }
                Err(f) => f,
            },
            None => f,
        };
        match &mut self.host {
            Some(h) => {
                for a in h.outbound(f) {
                    match a {
                        HostAction::Tunnel(f, fl) => out.push((f, fl)),
                        HostAction::Fabric(p) => io.to_fabric(p),
                    }
                }
            }
            None => out.push((f, 0)),
        }
    }

    /// Sends frames (with their record flags) toward the peer.
    pub(super) fn tunnel_out(&mut self, out: Vec<(Frame, u8)>, io: &mut impl LinkIo) {
        if out.is_empty() {
            return;
        }
        if self.enhanced {
            self.send_batches(out, io);
        } else {
            self.send_rfc(out, io);
        }
    }

    /// A class F frame from the switch's controller.
    pub fn class_f(&mut self, f: Frame, io: &mut impl LinkIo) {
        if self.enhanced {
            // Class F is not held back by the window (the link's own
            // traffic must flow), but a peer that never acknowledges
            // cannot make it grow without bound either: past `peer_bound`
            // (twice the window plus two batches) unacknowledged, class F
            // is dropped and counted like any frame the tunnel cannot
            // take.
            if self.send.in_flight() > self.cfg.peer_bound() {
                io.dropped(1);
                debug!(tunnel = %self.cfg.name, in_flight = self.send.in_flight(), "class F dropped: the peer acknowledges nothing");
                return;
            }
            self.send_batches(vec![(f, 0)], io);
        } else if let Some(s) = self.class_f_slot() {
            self.write_or_drop(s, vec![(f, 0)], io);
        }
    }

    /// RFC mode: class F on slot 0, class 3 by exchange over the data slots.
    pub(super) fn send_rfc(&mut self, frames: Vec<(Frame, u8)>, io: &mut impl LinkIo) {
        let data: Vec<(usize, u32)> = self
            .paths
            .range(1..)
            .map(|(s, _)| (*s, self.weight(*s)))
            .collect();
        let mut per: HashMap<usize, Vec<(Frame, u8)>> = HashMap::new();
        for (f, fl) in frames {
            let slot = if f.sof == Sof::F {
                0
            } else {
                // The same choice as the driver's fast path.
                rfc_pick(&f.header, &data).unwrap_or(0)
            };
            per.entry(slot).or_default().push((f, fl));
        }
        for (s, fs) in per {
            self.write_or_drop(s, fs, io);
        }
    }

    /// Circuit `slot`'s weight (at least 1).
    pub(super) fn weight(&self, slot: usize) -> u32 {
        slot.checked_sub(1)
            .and_then(|i| self.cfg.weights.get(i))
            .map_or(1, |w| (*w).max(1))
    }

    /// Queues `frames` on circuit `slot`, or counts them as dropped when it
    /// cannot take them.
    pub(super) fn write_or_drop(
        &mut self,
        slot: usize,
        frames: Vec<(Frame, u8)>,
        io: &mut impl LinkIo,
    ) {
        let n = frames.len() as u64;
        if !self.paths.contains_key(&slot) || !io.write(slot, frames) {
            io.dropped(n);
        }
    }

    /// A circuit with room in its writer, by weight.
    pub(super) fn pick_slot(&mut self, io: &impl LinkIo, len: usize) -> Option<usize> {
        // Weighted by bytes, not by batches: the circuit with room that
        // has carried the fewest bytes for its weight. (A count of batches
        // pins a regular pattern to one circuit: a tape host's command and
        // its data alternate, and every data batch went the same way.)
        let mut best: Option<(usize, u64, u32)> = None;
        for (s, p) in &self.paths {
            if !io.has_room(*s, 1) {
                continue;
            }
            let w = self.weight(*s);
            let better = match best {
                None => true,
                Some((_, bs, bw)) => {
                    u128::from(p.sent) * u128::from(bw) < u128::from(bs) * u128::from(w)
                }
            };
            if better {
                best = Some((*s, p.sent, w));
            }
        }
        let (slot, _, _) = best?;
        if let Some(p) = self.paths.get_mut(&slot) {
            p.sent = p.sent.saturating_add(len as u64);
        }
        Some(slot)
    }

    /// Enhanced mode: frames into numbered batches of at most ~256 KiB.
    pub(super) fn send_batches(&mut self, frames: Vec<(Frame, u8)>, io: &mut impl LinkIo) {
        let mut body = BytesMut::with_capacity(64 * 1024);
        let mut it = frames.into_iter().peekable();
        while it.peek().is_some() {
            body.clear();
            while let Some((f, fl)) = it.peek() {
                if !body.is_empty() && body.len() + f.len() > BATCH_BYTES {
                    break;
                }
                put_record(&mut body, f, *fl);
                it.next();
            }
            let raw = body.split().freeze();
            let raw_len = raw.len();
            let (codec, wire) = self.comp.compress(raw);
            let Some(slot) = self.pick_slot(io, wire.len()) else {
                // No circuit with room: keep it for when one has some.
                self.send.push(codec, raw_len, wire, usize::MAX);
                self.unsent = true;
                continue;
            };
            let h = self.send.push(codec, raw_len, wire.clone(), slot);
            self.write_batch(slot, h, wire, io);
        }
    }

    /// Enhanced mode: sends the batches that found every writer full.
    pub(super) fn send_unsent(&mut self, io: &mut impl LinkIo) {
        if !self.unsent || !self.enhanced {
            self.unsent = false;
            return;
        }
        let open: Vec<usize> = self
            .paths
            .keys()
            .copied()
            .filter(|s| io.has_room(*s, 1))
            .collect();
        if open.is_empty() {
            // Still waiting: a writer's progress or a new circuit calls
            // again.
            return;
        }
        let alive: Vec<usize> = self.paths.keys().copied().collect();
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
            self.write_batch(c, h, b, io);
        }
    }

    pub(super) fn write_batch(
        &mut self,
        slot: usize,
        mut h: BatchHeader,
        body: Bytes,
        io: &mut impl LinkIo,
    ) {
        h.ack = self.recv.ack();
        self.acked_now();
        let frames: Vec<(Frame, u8)> = enhanced::fragments(&h, &body)
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        let queued = self.paths.contains_key(&slot) && io.write(slot, frames);
        if !queued && BatchKind(h.kind) == BatchKind::DATA {
            // Still in the send window: sent again once a writer has room
            // (or by a survivor, if this circuit is going down).
            self.send.unassign(&h);
            self.unsent = true;
        }
    }

    pub(super) fn send_standalone_ack(&mut self, slot: usize, io: &mut impl LinkIo) {
        self.send_control(slot, io);
        io.event(Event::StandaloneAck);
    }

    /// A batch carrying the current ack is going out: no standalone ack
    /// is owed.
    pub(super) fn acked_now(&mut self) {
        self.ack_due = None;
        self.ack_at = None;
        self.unacked_rx = 0;
    }

    pub(super) fn send_control(&mut self, slot: usize, io: &mut impl LinkIo) {
        if !self.paths.contains_key(&slot) {
            return;
        }
        let h = BatchHeader {
            kind: BatchKind::CONTROL.0,
            codec: Codec::NONE,
            ack: self.recv.ack(),
            ..BatchHeader::default()
        };
        self.acked_now();
        let frames: Vec<(Frame, u8)> = enhanced::fragments(&h, &Bytes::new())
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        self.write_or_drop(slot, frames, io);
    }
}
