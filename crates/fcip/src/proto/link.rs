//! A tunnel's link, sans-IO: the VE_Port's E_Port engine, the enhanced
//! stream (numbered batches, the send and receive windows, delayed acks,
//! failover onto surviving circuits), compression, FastWrite's two sides,
//! and which circuit carries what. It is told what happens (a circuit came
//! up or went down, bytes arrived on one, frames left the fabric, the
//! clock moved) and acts through a [`LinkIo`]: queue frames on a circuit,
//! hand frames to the fabric or the switch's controller, report events.
//! It owns no socket, task or clock: `io::tunnel` drives it, as
//! `iscsi::target::io` drives a `Session`, and the tests below drive it
//! with a recording `LinkIo`.
//!
//! Circuits are named by slot: 0 is RFC mode's class F connection, 1… the
//! configured circuits. The machine's own table of circuits mirrors the
//! driver's: the driver says when one comes up or goes; when the machine
//! decides to drop one (a bad frame, a keep-alive timeout, RFC mode's class
//! F connection lost) it forgets it and tells the driver with
//! [`Event::Close`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tracing::{debug, info, warn};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FcHeaderRepr, FcType};
use unifab_fc::wire::{FcId, OxId, RxId, Sof, Wwn};

use super::compress::{self, Compressor, decompress};
use super::eport::{EPort, LocalSwitch, Output, ZoneDb, sw_ils_frame};
use super::fastwrite::{
    DEFAULT_MAX_BYTES, DEFAULT_TABLE, HostAction, HostSide, SWEEP_EVERY, TargetSide,
};
use super::stream::{ReceiveWindow, SendWindow};
use super::tape::ahead::AheadTarget;
use super::tape::{self, TapeHost, TapeStats, TapeTarget};
use crate::codec::Item;
use crate::wire::enhanced::{self, BatchHeader, BatchKind, Codec, Reassembly, put_record, records};
use crate::wire::frame::FcipFrame;
use crate::wire::framing::strip_data_fill;
use crate::wire::fsf::Capabilities;
use crate::wire::sw_ils::{FspfHeader, Hlo, SwIlsRepr};

/// How long a standalone ack waits for a batch toward the peer to carry it.
pub const ACK_DELAY: Duration = Duration::from_millis(1);
/// Data batches received before an ack goes out at once.
pub const ACK_EVERY: u32 = 16;
/// Largest batch body before compression.
const BATCH_BYTES: usize = 256 * 1024;

/// What the link needs to know of its tunnel's configuration.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The tunnel's name (for logs).
    pub name: String,
    /// Enhanced mode is configured (it is used only if the peer agrees).
    pub enhanced: bool,
    /// The circuits' weights, circuit 1 first.
    pub weights: Vec<u32>,
    /// Compression of enhanced-mode batches.
    pub compression: compress::Mode,
    /// FastWrite is wanted (used only if the peer offers it too).
    pub fastwrite: bool,
    /// Tape pipelining is wanted (with FastWrite; used only if the peer
    /// offers it too).
    pub tape_pipelining: bool,
    /// This end originates the E_Port exchange (it connects).
    pub originates: bool,
    /// Bytes of batches in flight before the fabric is held back.
    pub window_bytes: usize,
    /// Heartbeat interval.
    pub keepalive: Duration,
    /// Silence after which a circuit (or RFC mode's class F) is dead.
    pub dead_after: Duration,
    /// K_A_TOV, ms: how long every circuit may be silent at once before the
    /// link goes down.
    pub k_a_tov: u32,
    /// The VE_Port's index on its switch, 1-based (FSPF's port index).
    pub port_no: u32,
}

impl LinkConfig {
    /// What the link may make this end hold, either way: twice the window
    /// plus two batches (a sender may pass its window by one round of
    /// batches).
    pub fn peer_bound(&self) -> usize {
        self.window_bytes
            .saturating_mul(2)
            .saturating_add(2 * enhanced::MAX_BATCH_BODY)
    }
}

/// What the link does to the world, done by its driver at once (in the
/// order the link asks: a frame for the controller never overtakes the
/// link-up event that precedes it).
pub trait LinkIo {
    /// Whether circuit `slot` can take `writes` more writes now.
    fn has_room(&self, slot: usize, writes: usize) -> bool;
    /// Queues `frames` (with their FastWrite flags) on circuit `slot`.
    /// False when nothing was queued: the circuit is gone, or too far
    /// behind.
    fn write(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool;
    /// `n` frames could not be sent and were dropped.
    fn dropped(&mut self, n: u64);
    /// A frame for the local fabric.
    fn to_fabric(&mut self, f: Frame);
    /// A frame for the switch's inter-switch controller (replies to its
    /// queries, SW_RSCN).
    fn to_controller(&mut self, f: Frame);
    /// An FSPF or SW_RSCN request for the controller (already answered).
    fn fspf(&mut self, r: SwIlsRepr);
    /// The zoning merged with the peer's, to apply to the local fabric.
    fn apply_zoning(&mut self, z: ZoneDb);
    /// The local switch as the E_Port announces it (asked when the link
    /// starts).
    fn local_switch(&self) -> LocalSwitch;
    /// Something for the driver to act on or report.
    fn event(&mut self, e: Event);
}

/// What happened to the link.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The E_Port exchange began.
    Negotiating {
        /// FastWrite was agreed.
        fastwrite: bool,
    },
    /// The VE_Port is up.
    Up {
        /// The peer's domain.
        domain: u8,
        /// The peer switch.
        switch_name: Wwn,
        /// Every domain the peer announced.
        peer_domains: Vec<(u8, Wwn)>,
        /// Enhanced mode is in use (else RFC mode's fast path may open).
        enhanced: bool,
        /// FastWrite was agreed.
        fastwrite: bool,
    },
    /// The VE_Port is isolated (the E_Port exchange failed).
    Isolated {
        /// Why.
        why: String,
        /// It had been up.
        was_up: bool,
        /// FastWrite was agreed.
        fastwrite: bool,
    },
    /// The link went down: every exchange across it is lost.
    Down {
        /// Why.
        why: String,
        /// It had been up.
        was_up: bool,
        /// It is (still) isolated: the state to show is that.
        isolated: bool,
    },
    /// The link dropped circuit `slot`: its connection is to be closed.
    Close {
        /// The circuit.
        slot: usize,
        /// Why.
        why: String,
    },
    /// Batches of circuit `slot`, which went down, resent on the others.
    Retransmits {
        /// The circuit.
        slot: usize,
        /// Batches.
        n: u64,
    },
    /// An ack went out in a batch of its own.
    StandaloneAck,
}

/// A data batch as received, held in the receive window until it is in
/// order (compressed, as it came).
#[derive(Debug)]
struct HeldBatch {
    /// The circuit it came on.
    slot: usize,
    codec: Codec,
    raw_len: usize,
    body: Bytes,
}

/// A circuit as the link sees it.
#[derive(Debug)]
struct Path {
    last_rx: Instant,
    reasm: Reassembly,
    /// Enhanced mode: batch bytes given to this circuit, for the choice of
    /// the next one (`pick_slot`).
    sent: u64,
}

/// The link's state machine (see the module documentation).
#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    paths: BTreeMap<usize, Path>,
    eport: Option<EPort>,
    /// The local domain, once the link has started.
    domain: u8,
    /// The peer's domain while the VE_Port is up.
    up: Option<u8>,
    isolated: Option<String>,
    enhanced: bool,
    /// Enhanced mode: every circuit was silent at the last tick (see
    /// `enhanced_dead`).
    all_silent: bool,
    send: SendWindow,
    recv: ReceiveWindow<HeldBatch>,
    comp: Compressor,
    host: Option<HostSide>,
    target: Option<TargetSide>,
    tape_host: Option<TapeHost>,
    tape_target: Option<TapeTarget>,
    /// Tape read-ahead near the drive.
    ahead_target: Option<AheadTarget>,
    rr: usize,
    /// A data batch arrived and the peer has not yet been sent the ack
    /// for it: the circuit it came on.
    ack_due: Option<usize>,
    /// When the standalone ack for `ack_due` goes out, unless a batch
    /// toward the peer (which carries the ack) goes first.
    ack_at: Option<Instant>,
    /// Data batches received since the peer was last sent an ack.
    unacked_rx: u32,
    /// When FastWrite's target side last swept idle exchanges.
    last_sweep: Instant,
    /// When the next periodic tick is due (every half keep-alive).
    next_tick: Instant,
    /// Enhanced mode: data batches in the send window that found no
    /// circuit with room and wait to be sent.
    unsent: bool,
}

/// The receive window: batches held waiting for an earlier one are
/// bounded by `peer_bound`. A peer configured with a larger window than
/// that, or one that withholds a batch and sends on, has its circuit
/// closed.
fn receive_window(cfg: &LinkConfig) -> ReceiveWindow<HeldBatch> {
    ReceiveWindow::new(1 << 20, cfg.peer_bound())
}

/// The circuit for an RFC-mode class 3 frame among the data circuits that
/// are up (`data`: slot and weight, in slot order): by a hash of the
/// exchange (both N_Port IDs and the OX_ID), weighted, so that every frame
/// of an exchange, in either direction, takes the same circuit.
pub fn rfc_pick(h: &FcHeaderRepr, data: &[(usize, u32)]) -> Option<usize> {
    let total: u32 = data.iter().map(|(_, w)| *w).sum();
    let first = data.first()?.0;
    if total == 0 {
        return Some(first);
    }
    let (a, b) = if h.s_id < h.d_id {
        (h.s_id, h.d_id)
    } else {
        (h.d_id, h.s_id)
    };
    let key = (a.get() as u64) << 40 ^ (b.get() as u64) << 16 ^ u64::from(h.ox_id.0);
    let mut x = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32 % total;
    for (s, w) in data {
        if x < *w {
            return Some(*s);
        }
        x -= w;
    }
    Some(first)
}

/// The periodic tick: dead circuits, heartbeats, batches waiting for room.
fn tick_every(cfg: &LinkConfig) -> Duration {
    (cfg.keepalive / 2).max(Duration::from_millis(5))
}

impl Link {
    /// A link with no circuit.
    pub fn new(cfg: LinkConfig, now: Instant) -> Link {
        Link {
            comp: Compressor::new(cfg.compression),
            send: SendWindow::new(cfg.window_bytes),
            recv: receive_window(&cfg),
            next_tick: now + tick_every(&cfg),
            cfg,
            paths: BTreeMap::new(),
            eport: None,
            domain: 0,
            up: None,
            isolated: None,
            enhanced: false,
            all_silent: false,
            host: None,
            target: None,
            tape_host: None,
            tape_target: None,
            ahead_target: None,
            rr: 0,
            ack_due: None,
            ack_at: None,
            unacked_rx: 0,
            last_sweep: now,
            unsent: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Enhanced mode is in use.
    pub fn enhanced(&self) -> bool {
        self.enhanced
    }

    /// FastWrite is in use.
    pub fn fastwrite(&self) -> bool {
        self.host.is_some()
    }

    /// The VE_Port is up.
    pub fn is_up(&self) -> bool {
        self.up.is_some()
    }

    /// Whether the link takes more frames from the fabric (enhanced mode:
    /// while the send window has room).
    pub fn can_take(&self) -> bool {
        !self.enhanced || self.send.has_room()
    }

    /// Enhanced mode: batches wait for a circuit with room.
    pub fn has_unsent(&self) -> bool {
        self.unsent
    }

    /// When [`Link::handle_timeout`] is next due: the delayed ack, if one
    /// is owed, or the periodic tick.
    pub fn poll_timeout(&self) -> Instant {
        self.ack_at
            .map_or(self.next_tick, |a| a.min(self.next_tick))
    }

    /// The clock reached [`Link::poll_timeout`]: a delayed ack goes out on
    /// its own; the periodic tick closes dead circuits, sends what waits
    /// for room, the heartbeats, and sweeps FastWrite's idle exchanges.
    pub fn handle_timeout(&mut self, now: Instant, io: &mut impl LinkIo) {
        if self.ack_at.is_some_and(|t| t <= now) {
            self.on_ack_timer(io);
        }
        if self.next_tick <= now {
            self.next_tick = now + tick_every(&self.cfg);
            self.tick(now, io);
        }
    }

    /// Bytes before compression.
    pub fn raw_bytes(&self) -> u64 {
        self.comp.raw_bytes
    }

    /// Bytes after compression.
    pub fn wire_bytes(&self) -> u64 {
        self.comp.wire_bytes
    }

    /// Batches received twice and dropped.
    pub fn duplicates(&self) -> u64 {
        self.recv.duplicates
    }

    /// Writes FastWrite accelerated.
    pub fn accelerated(&self) -> u64 {
        self.host.as_ref().map_or(0, |h| h.accelerated)
    }

    /// What tape pipelining did (zeros while it is not agreed).
    pub fn tape_stats(&self) -> TapeStats {
        let mut s = self
            .tape_host
            .as_ref()
            .map(|h| h.stats())
            .unwrap_or_default();
        s.discarded = self.tape_target.as_ref().map_or(0, |t| t.discarded);
        s.read_ahead_issued = self.ahead_target.as_ref().map_or(0, |t| t.issued);
        s
    }

    /// Tape pipelining is in use.
    pub fn tape_pipelining(&self) -> bool {
        self.tape_host.is_some()
    }

    /// The circuits' weights from now on, circuit 1 first (circuits added
    /// or removed while the tunnel runs; a removed circuit's connection is
    /// reported gone with [`Link::circuit_down`], which resends what it
    /// carried on the others).
    pub fn set_weights(&mut self, weights: Vec<u32>) {
        self.cfg.weights = weights;
    }

    /// The rate the circuits send at, in bytes per second, for adaptive
    /// compression (ignored until the peer has acknowledged something).
    pub fn observe_send_rate(&mut self, bytes_per_second: f64) {
        if self.enhanced && self.send.acked() > 0 {
            self.comp.set_link_rate(bytes_per_second);
        }
    }

    /// Circuit `slot` is up (a new connection; the driver has reported
    /// the old one's end first). The link starts once the circuits it
    /// needs are up: class F's in RFC mode, any in enhanced mode.
    pub fn circuit_up(
        &mut self,
        slot: usize,
        peer_caps: Option<Capabilities>,
        now: Instant,
        io: &mut impl LinkIo,
    ) {
        // A circuit that joins starts level with the least used one, so
        // that it does not take every batch until it has caught up.
        let sent = self.paths.values().map(|p| p.sent).min().unwrap_or(0);
        self.paths.insert(
            slot,
            Path {
                last_rx: now,
                reasm: Reassembly::default(),
                sent,
            },
        );
        let peer_enhanced = peer_caps.is_some_and(|c| c.has(Capabilities::ENHANCED));
        if self.eport.is_none() && self.link_ready() {
            self.enhanced = self.cfg.enhanced && peer_enhanced;
            self.link_start(peer_caps, io);
        } else if self.enhanced {
            // Batches orphaned while no circuit was up go out now.
            self.unsent = true;
            self.send_unsent(io);
        }
    }

    /// Circuit `slot` is gone (its connection ended). Enhanced mode resends
    /// its unacknowledged batches on the others; without the circuits it
    /// needs, the link goes down.
    pub fn circuit_down(&mut self, slot: usize, why: &str, io: &mut impl LinkIo) {
        if self.paths.remove(&slot).is_none() {
            return;
        }
        if !self.link_ready() {
            self.link_down(why, io);
            // RFC: data connections go with the class F one.
            if !self.cfg.enhanced {
                let rest: Vec<usize> = self.paths.keys().copied().collect();
                for s in rest {
                    self.close(s, "class F connection lost", io);
                }
            }
            return;
        }
        if self.enhanced {
            let live: Vec<usize> = self.paths.keys().copied().collect();
            let mut rr = self.rr;
            let moved = self.send.fail_circuit(slot, |_| {
                rr += 1;
                live.get(rr % live.len()).copied()
            });
            self.rr = rr;
            io.event(Event::Retransmits {
                slot,
                n: moved.len() as u64,
            });
            for (c, h, b) in moved {
                self.write_batch(c, h, b, io);
            }
        }
    }

    /// The tunnel stops: the link goes down (so that losing the circuits
    /// resends nothing) and forgets its circuits.
    pub fn stop(&mut self, io: &mut impl LinkIo) {
        self.link_down("stopped", io);
        self.paths.clear();
        self.isolated = None;
    }

    /// Drops circuit `slot` on the link's own account.
    fn close(&mut self, slot: usize, why: &str, io: &mut impl LinkIo) {
        if !self.paths.contains_key(&slot) {
            return;
        }
        io.event(Event::Close {
            slot,
            why: why.to_string(),
        });
        self.circuit_down(slot, why, io);
    }

    fn class_f_slot(&self) -> Option<usize> {
        if self.enhanced {
            None
        } else {
            self.paths.contains_key(&0).then_some(0)
        }
    }

    fn link_ready(&self) -> bool {
        if self.cfg.enhanced {
            !self.paths.is_empty()
        } else {
            self.paths.contains_key(&0)
        }
    }

    fn link_start(&mut self, peer_caps: Option<Capabilities>, io: &mut impl LinkIo) {
        let fastwrite = self.enhanced
            && self.cfg.fastwrite
            && peer_caps.is_some_and(|c| c.has(Capabilities::FASTWRITE));
        if fastwrite {
            self.host = Some(HostSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
            self.target = Some(TargetSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
        }
        if fastwrite
            && self.cfg.tape_pipelining
            && peer_caps.is_some_and(|c| c.has(Capabilities::TAPE))
        {
            // The tapes learned before a link loss are still tapes.
            if self.tape_host.is_none() {
                self.tape_host = Some(TapeHost::new(
                    tape::DEFAULT_MAX_CMDS,
                    tape::DEFAULT_MAX_BYTES,
                    DEFAULT_MAX_BYTES,
                ));
            }
            self.tape_target = Some(TapeTarget::new());
            let read_ahead = peer_caps.is_some_and(|c| c.has(Capabilities::READ_AHEAD));
            if let Some(t) = &mut self.tape_host {
                t.set_read_ahead(read_ahead);
            }
            self.ahead_target = read_ahead.then(AheadTarget::new);
        } else {
            self.tape_host = None;
            self.tape_target = None;
            self.ahead_target = None;
        }
        let local = io.local_switch();
        self.domain = local.domain;
        let mut e = EPort::new(local, self.cfg.originates);
        e.start();
        self.eport = Some(e);
        self.isolated = None;
        io.event(Event::Negotiating { fastwrite });
        self.drain_eport(io);
    }

    fn link_down(&mut self, why: &str, io: &mut impl LinkIo) {
        if self.eport.take().is_some() {
            warn!(tunnel = %self.cfg.name, reason = why, "link down");
        }
        let was_up = self.up.take().is_some();
        io.event(Event::Down {
            why: why.to_string(),
            was_up,
            isolated: self.isolated.is_some(),
        });
        if let Some(h) = &mut self.host {
            h.clear();
        }
        if let Some(t) = &mut self.target {
            t.clear();
        }
        self.host = None;
        self.target = None;
        if let Some(t) = &mut self.tape_host {
            t.clear();
        }
        self.tape_target = None;
        self.ahead_target = None;
        self.send = SendWindow::new(self.cfg.window_bytes);
        self.recv = receive_window(&self.cfg);
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
    fn enhanced_dead(&mut self, mut silent: Vec<usize>, now: Instant) -> Vec<usize> {
        if silent.is_empty() {
            // Nothing past the interval: not every circuit is silent.
            self.all_silent = false;
            return silent;
        }
        if silent.len() < self.paths.len() {
            let margin = self.cfg.dead_after / 2;
            silent.retain(|s| {
                let Some(quiet_since) = self.paths.get(s).map(|c| c.last_rx) else {
                    return false;
                };
                self.paths
                    .iter()
                    .any(|(o, c)| o != s && c.last_rx > quiet_since + margin)
            });
            if std::mem::take(&mut self.all_silent) {
                for s in silent.drain(..) {
                    if let Some(c) = self.paths.get_mut(&s) {
                        c.last_rx = now;
                    }
                }
            }
            return silent;
        }
        // Every circuit is past the interval.
        let newest = self
            .paths
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

    /// The periodic tick (every half keep-alive interval): dead circuits,
    /// batches waiting for room, heartbeats, FastWrite's sweep.
    fn tick(&mut self, now: Instant, io: &mut impl LinkIo) {
        let mut dead: Vec<usize> = self
            .paths
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
            self.close(s, "keep-alive timeout (nothing received)", io);
        }
        self.send_unsent(io);
        // Heartbeats.
        if self.enhanced {
            let slots: Vec<usize> = self.paths.keys().copied().collect();
            for s in slots {
                self.send_control(s, io);
            }
        } else if self.paths.contains_key(&0) && self.up.is_some() {
            let hlo = SwIlsRepr::Hlo(Hlo {
                header: FspfHeader {
                    version: 2,
                    domain: self.domain,
                    ..FspfHeader::default()
                },
                options: 0,
                hello_interval: self.cfg.keepalive.as_secs().max(1) as u32,
                dead_interval: self.cfg.dead_after.as_secs().max(1) as u32,
                recipient_domain: self.up.map_or(0xffff_ffff, u32::from),
                port_index: self.cfg.port_no,
            });
            let fc = FcId::FABRIC_CONTROLLER;
            let f = sw_ils_frame(&hlo, false, OxId(0x7200), RxId::UNASSIGNED, fc, fc);
            self.write_or_drop(0, vec![(f, 0)], io);
        }
        if now.duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.last_sweep = now;
            if let Some(t) = &mut self.target {
                let n = t.sweep();
                if n > 0 {
                    warn!(tunnel = %self.cfg.name, exchanges = n, "FastWrite: idle accelerated writes dropped with their held data");
                }
            }
            if let Some(t) = &mut self.tape_host {
                let before = t.outstanding();
                let got = t.sweep();
                if t.outstanding() < before {
                    warn!(tunnel = %self.cfg.name, commands = before - t.outstanding(), "tape pipelining: the far drive never answered; its hosts get a deferred error");
                }
                for f in got.to_fabric {
                    io.to_fabric(f);
                }
                self.tunnel_out(got.to_tunnel, io);
            }
            if let Some(a) = &mut self.ahead_target {
                let released = a.sweep();
                if !released.is_empty() {
                    warn!(tunnel = %self.cfg.name, commands = released.len(), "tape read-ahead: a drive never answered a read ahead; the commands waiting for it go on");
                }
                for (f, fl) in released {
                    self.toward_drive(f, fl, io);
                }
            }
        }
    }

    /// The delayed ack is due: it goes out on its own.
    fn on_ack_timer(&mut self, io: &mut impl LinkIo) {
        self.ack_at = None;
        if let Some(slot) = self.ack_due.take() {
            self.send_standalone_ack(slot, io);
        }
    }

    /// A circuit's writer has room again: batches that found every writer
    /// full go out.
    pub fn on_room(&mut self, io: &mut impl LinkIo) {
        self.send_unsent(io);
    }
}

mod recv;
mod send;
#[cfg(test)]
mod tests;
