//! Exchange identifiers and their recovery (FC-FS-4 §12, FC-LS-3 §5.3,
//! §4.2.26): OX_ID allocation for exchanges a port originates, RX_ID
//! allocation for exchanges it answers, and the quarantine an aborted
//! exchange's identifiers sit in until RRQ releases them or R_A_TOV
//! expires.
//!
//! This module only manages identifiers and time; the engines keep the
//! state of each exchange keyed by them. Sans-IO: time is an argument.

use std::collections::VecDeque;

use std::time::{Duration, Instant};
use unifab_scsi_core::idmap::{IdMap, IdSet};

use crate::wire::{FcId, OxId, RxId};

/// Fibre Channel timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// E_D_TOV: error detect timeout (default 2 s).
    pub e_d_tov: Duration,
    /// R_A_TOV: resource allocation timeout (default 10 s).
    pub r_a_tov: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            e_d_tov: Duration::from_secs(2),
            r_a_tov: Duration::from_secs(10),
        }
    }
}

impl Timeouts {
    /// How long an ELS or CT request may wait for its reply (2 × R_A_TOV,
    /// FC-LS-3 §4.2.1).
    pub fn els_timeout(&self) -> Duration {
        self.r_a_tov * 2
    }
}

/// Too many exchanges are open: every identifier is in use or held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no free exchange identifier")]
pub struct NoExchange;

/// Allocates exchange identifiers for one N_Port and holds the
/// identifiers of aborted exchanges until they may be reused.
#[derive(Debug)]
pub struct ExchangeManager {
    timeouts: Timeouts,
    limit: usize,
    next_ox: u16,
    originated: IdSet<u16>,
    next_rx: u16,
    responded: IdMap<(FcId, u16), u16>,
    rx_in_use: IdSet<u16>,
    /// Identifiers of aborted exchanges, with the time they become free.
    held_ox: VecDeque<(Instant, u16)>,
    held_ox_set: IdSet<u16>,
    /// Held RX_IDs: when each becomes free, and the exchange (originator,
    /// OX_ID) it answered, which an RRQ must name to release it.
    held_rx: VecDeque<(Instant, u16, FcId, u16)>,
    held_rx_set: IdSet<u16>,
}

impl ExchangeManager {
    /// A manager allowing at most `limit` open exchanges in each role
    /// (at most 65,535).
    pub fn new(timeouts: Timeouts, limit: usize) -> ExchangeManager {
        ExchangeManager {
            timeouts,
            limit: limit.clamp(1, 0xffff),
            next_ox: 0,
            originated: IdSet::default(),
            next_rx: 0,
            responded: IdMap::default(),
            rx_in_use: IdSet::default(),
            held_ox: VecDeque::new(),
            held_ox_set: IdSet::default(),
            held_rx: VecDeque::new(),
            held_rx_set: IdSet::default(),
        }
    }

    /// The timeouts in force.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Exchanges this port originated and has not closed.
    pub fn originated(&self) -> usize {
        self.originated.len()
    }

    /// Exchanges this port answers and has not closed.
    pub fn responded(&self) -> usize {
        self.responded.len()
    }

    /// A new OX_ID for an exchange this port originates.
    pub fn alloc_ox(&mut self) -> Result<OxId, NoExchange> {
        if self.originated.len() + self.held_ox_set.len() >= self.limit {
            return Err(NoExchange);
        }
        for _ in 0..=0xffffu32 {
            let id = self.next_ox;
            self.next_ox = if id >= 0xfffe { 0 } else { id + 1 };
            if !self.originated.contains(&id) && !self.held_ox_set.contains(&id) {
                self.originated.insert(id);
                return Ok(OxId(id));
            }
        }
        Err(NoExchange)
    }

    /// Is this OX_ID one of ours and open?
    pub fn is_open_ox(&self, ox: OxId) -> bool {
        self.originated.contains(&ox.0)
    }

    /// The exchange ended normally: its OX_ID is free again.
    pub fn close_ox(&mut self, ox: OxId) {
        self.originated.remove(&ox.0);
    }

    /// The exchange was aborted (ABTS answered or timed out): its OX_ID is
    /// held until [`ExchangeManager::release_ox`] (RRQ accepted) or
    /// R_A_TOV from `now`.
    pub fn hold_ox(&mut self, now: Instant, ox: OxId) {
        if self.originated.remove(&ox.0) && self.held_ox_set.insert(ox.0) {
            self.held_ox.push_back((now + self.timeouts.r_a_tov, ox.0));
        }
    }

    /// RRQ was accepted: the held OX_ID is free. Its R_A_TOV entry goes
    /// too, so a later hold of the same OX_ID is not cut short by it.
    pub fn release_ox(&mut self, ox: OxId) {
        if self.held_ox_set.remove(&ox.0) {
            self.held_ox.retain(|(_, id)| *id != ox.0);
        }
    }

    /// A new RX_ID for an exchange `peer` originated with `ox`; the same
    /// RX_ID if the exchange is already known.
    pub fn alloc_rx(&mut self, peer: FcId, ox: OxId) -> Result<RxId, NoExchange> {
        if let Some(rx) = self.responded.get(&(peer, ox.0)) {
            return Ok(RxId(*rx));
        }
        if self.responded.len() + self.held_rx_set.len() >= self.limit {
            return Err(NoExchange);
        }
        for _ in 0..=0xffffu32 {
            let id = self.next_rx;
            self.next_rx = if id >= 0xfffe { 0 } else { id + 1 };
            if !self.rx_in_use.contains(&id) && !self.held_rx_set.contains(&id) {
                self.rx_in_use.insert(id);
                self.responded.insert((peer, ox.0), id);
                return Ok(RxId(id));
            }
        }
        Err(NoExchange)
    }

    /// The RX_ID given to `peer`'s exchange `ox`, if it is open.
    pub fn rx_of(&self, peer: FcId, ox: OxId) -> Option<RxId> {
        self.responded.get(&(peer, ox.0)).map(|r| RxId(*r))
    }

    /// The answered exchange ended normally.
    pub fn close_rx(&mut self, peer: FcId, ox: OxId) {
        if let Some(rx) = self.responded.remove(&(peer, ox.0)) {
            self.rx_in_use.remove(&rx);
        }
    }

    /// The answered exchange was aborted by the peer's ABTS: its RX_ID is
    /// held until the peer's RRQ ([`ExchangeManager::release_rx`]) or
    /// R_A_TOV.
    pub fn hold_rx(&mut self, now: Instant, peer: FcId, ox: OxId) {
        if let Some(rx) = self.responded.remove(&(peer, ox.0)) {
            self.rx_in_use.remove(&rx);
            if self.held_rx_set.insert(rx) {
                self.held_rx
                    .push_back((now + self.timeouts.r_a_tov, rx, peer, ox.0));
            }
        }
    }

    /// `peer`'s RRQ for its exchange `ox` (answered with `rx`, or with
    /// RX_ID FFFF when the originator never learned ours): releases the
    /// RX_ID held for that exchange. `false` when no RX_ID is held for it
    /// (the RRQ names an exchange that is not being recovered, or
    /// another port's).
    pub fn release_rx(&mut self, peer: FcId, ox: OxId, rx: RxId) -> bool {
        let Some(i) = self
            .held_rx
            .iter()
            .position(|(_, id, p, o)| *p == peer && *o == ox.0 && (*id == rx.0 || rx.0 == 0xffff))
        else {
            return false;
        };
        if let Some((_, id, _, _)) = self.held_rx.remove(i) {
            self.held_rx_set.remove(&id);
        }
        true
    }

    /// Every answered exchange of `peer` ends (logout, link loss).
    pub fn close_peer(&mut self, peer: FcId) {
        let gone: Vec<(FcId, u16)> = self
            .responded
            .keys()
            .filter(|(p, _)| *p == peer)
            .copied()
            .collect();
        for k in gone {
            if let Some(rx) = self.responded.remove(&k) {
                self.rx_in_use.remove(&rx);
            }
        }
    }

    /// When the next held identifier becomes free.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let a = self.held_ox.front().map(|(t, _)| *t);
        let b = self.held_rx.front().map(|(t, ..)| *t);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Frees identifiers whose R_A_TOV has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((t, id)) = self.held_ox.front().copied() {
            if t > now {
                break;
            }
            self.held_ox.pop_front();
            self.held_ox_set.remove(&id);
        }
        while let Some((t, id, ..)) = self.held_rx.front().copied() {
            if t > now {
                break;
            }
            self.held_rx.pop_front();
            self.held_rx_set.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_held_after_abort() {
        let now = Instant::now();
        let mut m = ExchangeManager::new(Timeouts::default(), 4);
        let a = m.alloc_ox().unwrap();
        let b = m.alloc_ox().unwrap();
        assert_ne!(a, b);
        m.hold_ox(now, a);
        assert!(!m.is_open_ox(a));
        let c = m.alloc_ox().unwrap();
        let d = m.alloc_ox().unwrap();
        // a is held, b, c, d open: the limit is reached.
        assert_eq!(m.alloc_ox(), Err(NoExchange));
        assert!(![b, c, d].contains(&a));
        // R_A_TOV later the held id is free again.
        assert_eq!(m.poll_timeout(), Some(now + Duration::from_secs(10)));
        m.handle_timeout(now + Duration::from_secs(10));
        m.close_ox(b);
        assert!(m.alloc_ox().is_ok());
        // RRQ releases early.
        m.hold_ox(now, c);
        m.release_ox(c);
        m.close_ox(d);
        assert!(m.alloc_ox().is_ok());
        assert!(m.alloc_ox().is_ok());
    }

    #[test]
    fn responder_ids() {
        let now = Instant::now();
        let mut m = ExchangeManager::new(Timeouts::default(), 16);
        let p = FcId::new(0x010100);
        let r1 = m.alloc_rx(p, OxId(5)).unwrap();
        assert_eq!(
            m.alloc_rx(p, OxId(5)).unwrap(),
            r1,
            "same exchange, same RX_ID"
        );
        let r2 = m.alloc_rx(FcId::new(0x010200), OxId(5)).unwrap();
        assert_ne!(r1, r2);
        m.hold_rx(now, p, OxId(5));
        assert_eq!(m.rx_of(p, OxId(5)), None);
        let r3 = m.alloc_rx(p, OxId(6)).unwrap();
        assert_ne!(r3, r1, "a held RX_ID is not reused");
        assert!(m.release_rx(p, OxId(5), r1));
        m.close_peer(p);
        assert_eq!(m.responded(), 1);
    }

    /// An RRQ releases only the RX_ID held for the exchange it names, from
    /// that exchange's originator; a release takes the R_A_TOV entry with
    /// it, so abort/RRQ cycles leave no queue behind and a later hold of
    /// the same RX_ID lasts its whole R_A_TOV.
    #[test]
    fn rrq_releases_only_its_own_exchange_and_leaves_nothing_behind() {
        let now = Instant::now();
        let mut m = ExchangeManager::new(Timeouts::default(), 4);
        let (p, q) = (FcId::new(0x010100), FcId::new(0x010200));
        let r = m.alloc_rx(p, OxId(5)).unwrap();
        m.hold_rx(now, p, OxId(5));
        assert!(!m.release_rx(q, OxId(5), r), "another port");
        assert!(!m.release_rx(p, OxId(6), r), "another exchange");
        assert!(!m.release_rx(p, OxId(5), RxId(r.0 ^ 1)), "another RX_ID");
        assert!(m.held_rx_set.contains(&r.0));
        assert!(m.release_rx(p, OxId(5), r));
        assert!(!m.release_rx(p, OxId(5), r), "released once");
        // RX_ID FFFF: the originator never learned ours.
        m.alloc_rx(p, OxId(7)).unwrap();
        m.hold_rx(now, p, OxId(7));
        assert!(m.release_rx(p, OxId(7), RxId(0xffff)));

        // A million abort/RRQ cycles: nothing accumulates.
        for i in 0..1_000_000u32 {
            let ox = OxId(i as u16);
            let r = m.alloc_rx(p, ox).unwrap();
            m.hold_rx(now, p, ox);
            assert!(m.release_rx(p, ox, r));
        }
        assert!(m.held_rx.is_empty() && m.held_rx_set.is_empty());
        assert_eq!(m.poll_timeout(), None);

        // Held, released, held again at a later time: the first hold's
        // R_A_TOV does not free the second.
        let r = m.alloc_rx(p, OxId(1)).unwrap();
        m.hold_rx(now, p, OxId(1));
        assert!(m.release_rx(p, OxId(1), r));
        m.next_rx = r.0;
        let later = now + Duration::from_secs(5);
        assert_eq!(m.alloc_rx(p, OxId(2)).unwrap(), r);
        m.hold_rx(later, p, OxId(2));
        m.handle_timeout(now + Duration::from_secs(10));
        assert!(m.held_rx_set.contains(&r.0), "held until its own R_A_TOV");
        m.handle_timeout(later + Duration::from_secs(10));
        assert!(!m.held_rx_set.contains(&r.0));

        // The same for OX_IDs.
        let a = m.alloc_ox().unwrap();
        m.hold_ox(now, a);
        m.release_ox(a);
        assert!(m.held_ox.is_empty());
    }
}
