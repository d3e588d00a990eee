//! FSPF (FC-SW-4 §8), enough for paths between two or more switches:
//! each switch originates a switch link record (its domain and its
//! up links with their costs), floods it on every up link, installs newer
//! records from others, and computes the next hop to every domain by
//! Dijkstra over two-way links.
//!
//! Records are flooded over class F (reliable TCP in FCIP), so LSAs are
//! sent but nothing is retransmitted; records do not age out, a switch
//! withdraws a link by flooding a newer record without it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use crate::wire::sw_ils::{LinkDescriptor, Lsr, LsrHeader};

/// Default link cost of a VE_Port (FC-SW: 1000 × 1 Gb/s / speed; a WAN
/// link is costed as a slow one).
pub const DEFAULT_COST: u16 = 1000;

/// One switch's FSPF state.
#[derive(Debug, Clone)]
pub struct Fspf {
    domain: u8,
    incarnation: u32,
    /// Own up links: port index → (neighbour domain, neighbour port, cost).
    links: BTreeMap<u32, (u8, u32, u16)>,
    lsdb: BTreeMap<u8, Lsr>,
}

impl Fspf {
    /// A switch with no links.
    pub fn new(domain: u8) -> Fspf {
        let mut f = Fspf {
            domain,
            incarnation: 0x8000_0000,
            links: BTreeMap::new(),
            lsdb: BTreeMap::new(),
        };
        f.originate();
        f
    }

    fn originate(&mut self) {
        self.incarnation = self.incarnation.wrapping_add(1);
        let links: Vec<LinkDescriptor> = self
            .links
            .iter()
            .map(|(port, (d, np, cost))| LinkDescriptor {
                link_id: u32::from(*d),
                output_port: *port,
                neighbor_port: *np,
                link_type: 1,
                cost: *cost,
            })
            .collect();
        let lsr = Lsr {
            header: LsrHeader {
                lsr_type: 1,
                age: 0,
                options: 0,
                link_state_id: u32::from(self.domain),
                advertising_domain: u32::from(self.domain),
                incarnation: self.incarnation,
                checksum: 0,
                length: u16::try_from(28 + 16 * links.len()).unwrap_or(u16::MAX),
            },
            links,
        };
        self.lsdb.insert(self.domain, lsr);
    }

    /// A link came up on `port` to `neighbor`; returns the new own record
    /// to flood.
    pub fn link_up(&mut self, port: u32, neighbor: u8, neighbor_port: u32, cost: u16) -> Lsr {
        self.links.insert(port, (neighbor, neighbor_port, cost));
        self.originate();
        self.own()
    }

    /// A link went down; returns the new own record to flood.
    pub fn link_down(&mut self, port: u32) -> Lsr {
        self.links.remove(&port);
        self.originate();
        self.own()
    }

    /// This switch's own record.
    pub fn own(&self) -> Lsr {
        self.lsdb.get(&self.domain).cloned().unwrap_or_default()
    }

    /// The whole database (to send a new neighbour).
    pub fn database(&self) -> Vec<Lsr> {
        self.lsdb.values().cloned().collect()
    }

    /// Takes a record from a neighbour; `true` if it was newer and should
    /// be flooded on.
    pub fn receive(&mut self, lsr: &Lsr) -> bool {
        let d = lsr.header.link_state_id as u8;
        if d == self.domain {
            // Someone has an old copy of ours: outdo it.
            if lsr.header.incarnation >= self.incarnation {
                self.incarnation = lsr.header.incarnation;
                self.originate();
                return true;
            }
            return false;
        }
        match self.lsdb.get(&d) {
            Some(old) if old.header.incarnation >= lsr.header.incarnation => false,
            _ => {
                self.lsdb.insert(d, lsr.clone());
                true
            }
        }
    }

    /// Next-hop port for every reachable domain.
    pub fn routes(&self) -> BTreeMap<u8, u32> {
        let links_of = |d: u8| -> Vec<(u8, u32, u16)> {
            self.lsdb
                .get(&d)
                .map(|l| {
                    l.links
                        .iter()
                        .map(|x| (x.link_id as u8, x.output_port, x.cost))
                        .collect()
                })
                .unwrap_or_default()
        };
        let two_way = |a: u8, b: u8| links_of(b).iter().any(|(n, _, _)| *n == a);
        let mut dist: BTreeMap<u8, (u32, u32)> = BTreeMap::new(); // domain → (cost, first port)
        let mut heap = BinaryHeap::new();
        let mut done = BTreeSet::new();
        for (port, (n, _, cost)) in &self.links {
            if two_way(self.domain, *n) {
                let c = u32::from(*cost);
                if dist.get(n).is_none_or(|(x, _)| c < *x) {
                    dist.insert(*n, (c, *port));
                    heap.push(Reverse((c, *n)));
                }
            }
        }
        while let Some(Reverse((c, d))) = heap.pop() {
            if !done.insert(d) {
                continue;
            }
            let first = dist.get(&d).map_or(0, |x| x.1);
            for (n, _, cost) in links_of(d) {
                if n == self.domain || !two_way(d, n) {
                    continue;
                }
                let nc = c + u32::from(cost);
                if dist.get(&n).is_none_or(|(x, _)| nc < *x) {
                    dist.insert(n, (nc, first));
                    heap.push(Reverse((nc, n)));
                }
            }
        }
        dist.into_iter().map(|(d, (_, p))| (d, p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain 1 — 2 — 3: switch 1 reaches 3 through its port to 2.
    #[test]
    fn three_switches_in_a_chain() {
        let mut a = Fspf::new(1);
        let mut b = Fspf::new(2);
        let mut c = Fspf::new(3);
        a.link_up(1, 2, 1, DEFAULT_COST);
        b.link_up(1, 1, 1, DEFAULT_COST);
        b.link_up(2, 3, 1, DEFAULT_COST);
        c.link_up(1, 2, 2, DEFAULT_COST);
        // Flood until quiet.
        for _ in 0..4 {
            let all: Vec<Lsr> = [a.database(), b.database(), c.database()].concat();
            for l in &all {
                a.receive(l);
                b.receive(l);
                c.receive(l);
            }
        }
        assert_eq!(a.routes(), BTreeMap::from([(2, 1), (3, 1)]));
        assert_eq!(b.routes(), BTreeMap::from([(1, 1), (3, 2)]));
        assert_eq!(c.routes(), BTreeMap::from([(1, 1), (2, 1)]));
        // The 2—3 link goes: 1 loses 3.
        let l = b.link_down(2);
        a.receive(&l);
        assert_eq!(a.routes(), BTreeMap::from([(2, 1)]));
    }
}
