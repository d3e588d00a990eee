//! From the peer: frames off a circuit, enhanced mode's batches through
//! the receive window and decompression, class F to the E_Port, the rest
//! to the fabric (through FastWrite's sides).

use super::*;

impl Link {
    /// What circuit `slot`'s decoder found after the special frame
    /// exchange (the driver has counted its bytes). A frame that is not
    /// FCIP, a batch that does not reassemble, or a second special frame
    /// closes the circuit.
    pub fn from_circuit(&mut self, slot: usize, item: Item, now: Instant, io: &mut impl LinkIo) {
        self.on_rx(slot, item, now, io);
        // Delayed ack: the reply to what just arrived usually goes back
        // within the delay and carries the ack; a standalone one would
        // arrive first and cost the peer a wake-up of its own. Bulk one-way
        // traffic is acked every ACK_EVERY batches.
        if let Some(slot) = self.ack_due {
            if self.unacked_rx >= ACK_EVERY {
                self.send_standalone_ack(slot, io);
            } else if self.ack_at.is_none() {
                self.ack_at = Some(now + ACK_DELAY);
            }
        }
    }

    pub(super) fn on_rx(&mut self, slot: usize, item: Item, now: Instant, io: &mut impl LinkIo) {
        let Some(c) = self.paths.get_mut(&slot) else {
            return;
        };
        c.last_rx = now;
        let Item::Frame(bytes) = item else {
            self.close(slot, "special frame after the handshake", io);
            return;
        };
        let frame = match FcipFrame::new_checked(bytes).and_then(|f| f.to_fc_frame()) {
            Ok(f) => f,
            Err(e) => {
                self.close(slot, &format!("bad frame: {e}"), io);
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
                    self.close(slot, &format!("bad batch: {e}"), io);
                    return;
                }
            };
            if let Some((h, body)) = done {
                self.on_batch(slot, h, body, io);
            }
            return;
        }
        self.dispatch(strip_data_fill(frame), 0, io);
    }

    pub(super) fn on_batch(
        &mut self,
        slot: usize,
        h: BatchHeader,
        body: Bytes,
        io: &mut impl LinkIo,
    ) {
        self.send.on_ack(h.ack);
        if BatchKind(h.kind) != BatchKind::DATA {
            // CONTROL and HELLO carry nothing but the ack.
            return;
        }
        // Held as it came (compressed) while it waits for an earlier
        // batch; decompressed once in order.
        let len = body.len();
        let held = HeldBatch {
            slot,
            codec: h.codec,
            raw_len: h.raw_len as usize,
            body,
        };
        let ready = match self.recv.accept(h.seq, held, len) {
            Ok(r) => r,
            Err(e) => {
                self.close(slot, &e.to_string(), io);
                return;
            }
        };
        for held in ready {
            let b = match decompress(held.codec, held.body, held.raw_len) {
                Ok(b) => b,
                Err(e) => {
                    // Its frames are lost (FCP recovers the exchanges);
                    // the circuit that carried it is not to be trusted.
                    self.close(held.slot, &format!("bad batch: {e}"), io);
                    continue;
                }
            };
            match records(&b) {
                Ok(fs) => {
                    for (mut f, fl) in fs {
                        // Not a slice of the batch (up to 4 MiB
                        // decompressed), which the frame would keep alive
                        // for as long as its exchange holds it.
                        f.payload = Bytes::copy_from_slice(&f.payload);
                        self.dispatch(f, fl, io);
                    }
                }
                Err(e) => warn!(tunnel = %self.cfg.name, error = %e, "bad batch records"),
            }
        }
        self.ack_due = Some(slot);
        self.unacked_rx = self.unacked_rx.saturating_add(1);
    }

    /// A frame from the peer.
    pub(super) fn dispatch(&mut self, f: Frame, flags: u8, io: &mut impl LinkIo) {
        let d = f.header.d_id;
        tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %d, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "rx");
        if d == FcId::FABRIC_CONTROLLER && f.header.fc_type == FcType::SW_ILS {
            if let Some(e) = &mut self.eport {
                e.handle(&f);
            }
            self.drain_eport(io);
            return;
        }
        if self.up.is_none() {
            return; // no data before the link is up
        }
        if unifab_fc::fabric::isl::controller_domain(d) == Some(self.domain)
            && f.header.r_ctl != unifab_fc::wire::RCtl::CT_REQUEST
        {
            // Replies to the controller's queries, SW_RSCN; name server
            // queries go to the fabric, which answers them.
            io.to_controller(f);
            return;
        }
        // Near the host: tape pipelining's answers from the drive stay
        // here and may release withheld commands.
        let f = match &mut self.tape_host {
            Some(t) => match t.inbound(f, flags) {
                Ok(got) => {
                    for f in got.to_fabric {
                        io.to_fabric(f);
                    }
                    self.tunnel_out(got.to_tunnel, io);
                    return;
                }
                Err(f) => f,
            },
            None => f,
        };
        let f = match &mut self.host {
            Some(h) => match h.inbound(f) {
                Some(f) => f,
                None => return,
            },
            None => f,
        };
        let frames = match &mut self.target {
            Some(t) => t.inbound(f, flags),
            None => vec![f],
        };
        for f in frames {
            self.toward_drive(f, flags, io);
        }
    }

    /// Near the drive, after FastWrite: read-ahead, then tape pipelining's
    /// queue, then the fabric.
    pub(super) fn toward_drive(&mut self, f: Frame, flags: u8, io: &mut impl LinkIo) {
        let is_cmnd =
            f.header.r_ctl == unifab_fc::wire::RCtl::FCP_CMND && f.header.fc_type == FcType::FCP;
        let f = match &mut self.ahead_target {
            Some(a) if is_cmnd => {
                let act = a.command(f, flags);
                match self.ahead_act(act, io) {
                    Some(f) => f,
                    None => return,
                }
            }
            _ => f,
        };
        {
            let tape_cmd = flags & crate::wire::enhanced::RECORD_TAPE != 0 && is_cmnd;
            match &mut self.tape_target {
                Some(t) if tape_cmd => match t.command(f) {
                    Ok(Some(f)) => io.to_fabric(f),
                    Ok(None) => {}
                    Err(refused) => {
                        if let Some(fw) = &mut self.target {
                            fw.forget(refused.header.d_id, refused.header.ox_id);
                        }
                        self.tunnel_out(vec![(refused, 0)], io);
                    }
                },
                Some(t) => {
                    let o = t.plain(&f);
                    io.to_fabric(f);
                    if let Some(fw) = &mut self.target {
                        for (s_id, ox) in o.forget {
                            fw.forget(s_id, ox);
                        }
                    }
                    self.tunnel_out(o.up.into_iter().map(|f| (f, 0)).collect(), io);
                }
                None => io.to_fabric(f),
            }
        }
    }

    /// Carries out what read-ahead near the drive decided; returns the
    /// frame it let pass.
    pub(super) fn ahead_act(
        &mut self,
        act: super::tape::ahead::TargetAct,
        io: &mut impl LinkIo,
    ) -> Option<Frame> {
        for f in act.to_fabric {
            io.to_fabric(f);
        }
        if let Some(fw) = &mut self.target {
            for (s_id, ox) in act.forget {
                fw.forget(s_id, ox);
            }
        }
        self.tunnel_out(act.up, io);
        for (f, fl) in act.released {
            self.toward_drive(f, fl, io);
        }
        act.pass
    }

    pub(super) fn drain_eport(&mut self, io: &mut impl LinkIo) {
        loop {
            let Some(o) = self.eport.as_mut().and_then(|e| e.poll()) else {
                return;
            };
            match o {
                Output::Send(f) => self.class_f(f, io),
                Output::ApplyZoning(z) => io.apply_zoning(z),
                Output::Up {
                    domain,
                    switch_name,
                    peer_domains,
                } => {
                    info!(tunnel = %self.cfg.name, domain, switch = %switch_name, enhanced = self.enhanced, fastwrite = self.host.is_some(), "VE_Port up");
                    self.up = Some(domain);
                    io.event(Event::Up {
                        domain,
                        switch_name,
                        peer_domains,
                        enhanced: self.enhanced,
                        fastwrite: self.host.is_some(),
                    });
                }
                Output::Isolated(why) => {
                    tracing::error!(tunnel = %self.cfg.name, reason = %why, "VE_Port isolated");
                    self.isolated = Some(why.clone());
                    let was_up = self.up.take().is_some();
                    io.event(Event::Isolated {
                        why,
                        was_up,
                        fastwrite: self.host.is_some(),
                    });
                }
                Output::Controller(r, _) => io.fspf(r),
            }
        }
    }
}
