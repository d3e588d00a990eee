//! Frames toward the peer: class F on its circuit, RFC mode's frames on
//! the fast path or a circuit, enhanced mode's batches through the send
//! window and compression, acks and control batches.

use super::*;

impl Actor {
    pub(super) fn outbound(&mut self, frames: Vec<Frame>) {
        if self.up.is_none() {
            self.dropped
                .fetch_add(frames.len() as u64, Ordering::Relaxed);
            return;
        }
        let mut out: Vec<(Frame, u8)> = Vec::with_capacity(frames.len());
        for f in frames {
            tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %f.header.d_id, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "tx");
            let f = match &mut self.target {
                Some(t) => {
                    let (up, fed) = t.outbound(f);
                    for d in fed {
                        let _ = self.port.transmit(d);
                    }
                    match up {
                        Some(f) => f,
                        None => continue,
                    }
                }
                None => f,
            };
            match &mut self.host {
                Some(h) => {
                    for a in h.outbound(f) {
                        match a {
                            HostAction::Tunnel(f, fl) => out.push((f, fl)),
                            HostAction::Fabric(p) => {
                                let _ = self.port.transmit(p);
                            }
                        }
                    }
                }
                None => out.push((f, 0)),
            }
        }
        if out.is_empty() {
            return;
        }
        if self.enhanced {
            self.send_batches(out);
        } else {
            self.send_rfc(out);
        }
    }

    pub(super) fn send_class_f(&mut self, f: Frame) {
        if self.enhanced {
            // Class F is not held back by the window (the link's own
            // traffic must flow), but a peer that never acknowledges
            // cannot make it grow without bound either: past `peer_bound`
            // (twice the window plus two batches) unacknowledged, class F
            // is dropped and counted like any frame the tunnel cannot
            // take.
            if self.send.in_flight() > peer_bound(&self.cfg) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                debug!(tunnel = %self.cfg.name, in_flight = self.send.in_flight(), "class F dropped: the peer acknowledges nothing");
                return;
            }
            self.send_batches(vec![(f, 0)]);
        } else if let Some(s) = self.class_f_slot() {
            self.write_or_drop(s, vec![(f, 0)]);
        }
    }

    /// RFC mode: class F on slot 0, class 3 by exchange over the data slots.
    pub(super) fn send_rfc(&mut self, frames: Vec<(Frame, u8)>) {
        let data: Vec<(usize, u32)> = (1..=self.cfg.circuits.len())
            .filter(|s| self.circuits.contains_key(s))
            .map(|s| (s, self.cfg.circuits[s - 1].weight.max(1)))
            .collect();
        let mut per: HashMap<usize, Vec<(Frame, u8)>> = HashMap::new();
        for (f, fl) in frames {
            let slot = if f.sof == Sof::F {
                0
            } else {
                // The same choice as the fast path's.
                rfc_pick(&f.header, &data).unwrap_or(0)
            };
            per.entry(slot).or_default().push((f, fl));
        }
        for (s, fs) in per {
            self.write_or_drop(s, fs);
        }
    }

    /// Queues `frames` on circuit `slot`'s writer, or counts them as
    /// dropped when the circuit is gone or too far behind.
    pub(super) fn write_or_drop(&mut self, slot: usize, frames: Vec<(Frame, u8)>) {
        let n = frames.len() as u64;
        if !self.write_frames(slot, frames) {
            self.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Queues `frames` on circuit `slot`'s writer (behind its backlog, if
    /// it has one). False when the circuit is gone, its writer closed or
    /// its backlog full: nothing was queued. A frame too long for FCIP's length field (a
    /// local port breaking FC-FS's payload limit) is dropped, counted and
    /// logged.
    pub(super) fn write_frames(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool {
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
                    warn!(tunnel = %self.cfg.name, slot, error = %e, s_id = %f.header.s_id, d_id = %f.header.d_id, "frame not sent: it does not fit FCIP's length field");
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

    /// A circuit with room in its writer, by weight.
    pub(super) fn pick_slot(&mut self) -> Option<usize> {
        let mut live: Vec<(usize, u32)> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.has_room(1))
            .map(|(s, _)| {
                (
                    *s,
                    self.cfg.circuits.get(s - 1).map_or(1, |c| c.weight.max(1)),
                )
            })
            .collect();
        if live.is_empty() {
            return None;
        }
        live.sort_unstable();
        let total: u32 = live.iter().map(|(_, w)| w).sum();
        self.rr = self.rr.wrapping_add(1);
        let mut x = (self.rr as u32) % total;
        for (s, w) in &live {
            if x < *w {
                return Some(*s);
            }
            x -= w;
        }
        live.first().map(|l| l.0)
    }

    /// Enhanced mode: frames into numbered batches of at most ~256 KiB.
    pub(super) fn send_batches(&mut self, frames: Vec<(Frame, u8)>) {
        let mut body = BytesMut::with_capacity(64 * 1024);
        let mut it = frames.into_iter().peekable();
        while it.peek().is_some() {
            body.clear();
            while let Some((f, fl)) = it.peek() {
                if !body.is_empty() && body.len() + f.len() > 256 * 1024 {
                    break;
                }
                put_record(&mut body, f, *fl);
                it.next();
            }
            let raw = body.split().freeze();
            let raw_len = raw.len();
            let (codec, wire) = self.comp.compress(raw);
            let Some(slot) = self.pick_slot() else {
                // No circuit with room: keep it for when one has some.
                self.send.push(codec, raw_len, wire, usize::MAX);
                self.unsent = true;
                continue;
            };
            let h = self.send.push(codec, raw_len, wire.clone(), slot);
            self.write_batch(slot, h, wire);
        }
    }

    pub(super) fn write_batch(&mut self, slot: usize, mut h: BatchHeader, body: Bytes) {
        h.ack = self.recv.ack();
        self.acked_now();
        let frames: Vec<(Frame, u8)> = enhanced::fragments(&h, &body)
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        if !self.write_frames(slot, frames) && BatchKind(h.kind) == BatchKind::DATA {
            // Still in the send window: sent again once a writer has room
            // (or by a survivor, if this circuit is going down).
            self.send.unassign(&h);
            self.unsent = true;
        }
    }

    pub(super) fn send_standalone_ack(&mut self, slot: usize) {
        self.send_control(slot);
        if let Ok(mut st) = self.stats.lock() {
            st.standalone_acks += 1;
        }
    }

    /// A batch carrying the current ack is going out: no standalone ack
    /// is owed.
    pub(super) fn acked_now(&mut self) {
        self.ack_due = None;
        self.ack_at = None;
        self.unacked_rx = 0;
    }

    pub(super) fn send_control(&mut self, slot: usize) {
        if !self.circuits.contains_key(&slot) {
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
        self.write_or_drop(slot, frames);
    }
}
