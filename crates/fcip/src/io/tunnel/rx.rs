//! Frames from the peer: enhanced-mode batches through the receive
//! window and decompression, class F to the E_Port, the rest to the fabric
//! (with FastWrite's sides in between).

use super::*;

impl Actor {
    pub(super) fn on_rx(&mut self, slot: usize, item: Item) {
        let Some(c) = self.circuits.get_mut(&slot) else {
            return;
        };
        c.last_rx = Instant::now();
        let Item::Frame(bytes) = item else {
            self.circuit_down(slot, "special frame after the handshake");
            return;
        };
        self.fast.count_rx(slot, bytes.len());
        let frame = match FcipFrame::new_checked(bytes).and_then(|f| f.to_fc_frame()) {
            Ok(f) => f,
            Err(e) => {
                self.circuit_down(slot, &format!("bad frame: {e}"));
                return;
            }
        };
        if self.enhanced || enhanced::is_fragment(&frame.header) {
            if !self.enhanced {
                // A batch on an RFC link: the peer is confused.
                return;
            }
            let done = match c.reasm.push(&frame) {
                Ok(d) => d,
                Err(e) => {
                    self.circuit_down(slot, &format!("bad batch: {e}"));
                    return;
                }
            };
            if let Some((h, body)) = done {
                self.on_batch(slot, h, body);
            }
            return;
        }
        self.dispatch(strip_data_fill(frame), 0);
    }

    pub(super) fn on_batch(&mut self, slot: usize, h: BatchHeader, body: Bytes) {
        self.send.on_ack(h.ack);
        match BatchKind(h.kind) {
            BatchKind::DATA => {
                // Held as it came (compressed) while it waits for an
                // earlier batch; decompressed once in order.
                let len = body.len();
                let held = HeldBatch {
                    slot,
                    codec: h.codec,
                    raw_len: h.raw_len as usize,
                    body,
                };
                match self.recv.accept(h.seq, held, len) {
                    Ok(ready) => {
                        for held in ready {
                            let b = match decompress(held.codec, held.body, held.raw_len) {
                                Ok(b) => b,
                                Err(e) => {
                                    // Its frames are lost (FCP recovers the
                                    // exchanges); the circuit that carried
                                    // it is not to be trusted.
                                    self.circuit_down(held.slot, &format!("bad batch: {e}"));
                                    continue;
                                }
                            };
                            match records(&b) {
                                Ok(fs) => {
                                    for (mut f, fl) in fs {
                                        // Not a slice of the batch (up to
                                        // 4 MiB decompressed), which the
                                        // frame would keep alive for as
                                        // long as its exchange holds it.
                                        f.payload = Bytes::copy_from_slice(&f.payload);
                                        self.dispatch(f, fl);
                                    }
                                }
                                Err(e) => {
                                    warn!(tunnel = %self.cfg.name, error = %e, "bad batch records")
                                }
                            }
                        }
                        self.ack_due = Some(slot);
                        self.unacked_rx = self.unacked_rx.saturating_add(1);
                    }
                    Err(e) => self.circuit_down(slot, &e.to_string()),
                }
            }
            BatchKind::CONTROL | BatchKind::HELLO => {}
            _ => {}
        }
    }

    /// A frame from the peer.
    pub(super) fn dispatch(&mut self, f: Frame, flags: u8) {
        let d = f.header.d_id;
        tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %d, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "rx");
        if d == FcId::FABRIC_CONTROLLER && f.header.fc_type == FcType::SW_ILS {
            if let Some(e) = &mut self.eport {
                e.handle(&f);
            }
            self.drain_eport();
            return;
        }
        if self.up.is_none() {
            return; // no data before the link is up
        }
        if unifab_fc::fabric::isl::controller_domain(d) == Some(self.ctl.domain())
            && f.header.r_ctl != unifab_fc::wire::RCtl::CT_REQUEST
        {
            // Replies to the controller's queries, SW_RSCN; name server
            // queries go to the fabric, which answers them.
            self.ctl.deliver(f);
            return;
        }
        let f = match &mut self.host {
            Some(h) => match h.inbound(f) {
                Some(f) => f,
                None => return,
            },
            None => f,
        };
        let out = match &mut self.target {
            Some(t) => t.inbound(f, flags),
            None => vec![f],
        };
        for f in out {
            let _ = self.port.transmit(f);
        }
    }

    pub(super) fn drain_eport(&mut self) {
        loop {
            let Some(o) = self.eport.as_mut().and_then(|e| e.poll()) else {
                return;
            };
            match o {
                Output::Send(f) => self.send_class_f(f),
                Output::ApplyZoning(z) => self.apply_zoning(z),
                Output::Up {
                    domain,
                    switch_name,
                    peer_domains,
                } => {
                    info!(tunnel = %self.cfg.name, domain, switch = %switch_name, enhanced = self.enhanced, fastwrite = self.host.is_some(), "VE_Port up");
                    self.up = Some(domain);
                    // RFC mode: class 3 frames may bypass this task now.
                    self.fast.set_open(!self.enhanced);
                    self.set_state(format!("up (domain {domain}, {switch_name})"));
                    self.ctl.link_up(
                        self.port_no,
                        LinkHandle {
                            tx: self.ctl_tx.clone(),
                            neighbor: domain,
                        },
                        &peer_domains,
                    );
                }
                Output::Isolated(why) => {
                    tracing::error!(tunnel = %self.cfg.name, reason = %why, "VE_Port isolated");
                    self.isolated = Some(why.clone());
                    self.set_state(format!("isolated: {why}"));
                    self.fast.set_open(false);
                    if self.up.take().is_some() {
                        self.ctl.link_down(self.port_no);
                    }
                }
                Output::Controller(r, _) => self.ctl.on_fspf(self.port_no, r),
            }
        }
    }

    pub(super) fn apply_zoning(&self, z: ZoneDb) {
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

    // ---- send side ----
}
