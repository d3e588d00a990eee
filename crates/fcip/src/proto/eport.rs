//! VE_Port bring-up over one FCIP link (FC-SW-4 §6): ELP → ESC (FSPF) →
//! EFP (domain lists) → MR (zone merge) in both directions, then the link
//! is up and FSPF takes over.
//!
//! Decisions:
//!
//! - The FCIP connector originates (sends ELP, ESC, EFP, its MR); the
//!   acceptor answers and, after merging, sends its own MR back, so both
//!   ends finish with the same zoning.
//! - Domain IDs are static: EFP never leads to BF or RCF. If a domain
//!   appears on both sides under different switch names, the link is
//!   isolated with an error naming the domain and both switches; neither
//!   fabric changes.
//! - Zone merge: no zoning on one side adopts the other's; the same active
//!   zone set name merges zones by name; differing set names, or a zone of
//!   the same name with other members, isolate the link with the reason.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use unifab_fc::fabric::zoning::{Zone, ZoneMember};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{Eof, FcHeaderRepr, FcId, OxId, RxId, Sof, Wwn};

use crate::wire::sw_ils::{
    self, Efp, EfpRecord, Elp, Esc, Mr, PROTOCOL_FSPF, SwAcc, SwIlsCode, SwIlsRepr,
    SwRjtExplanation, SwRjtReason, ZoneMemberObj, ZoneObject, ZoneStatus,
};

/// An active zoning configuration as exchanged by MR.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ZoneDb {
    /// Active zone set name and its zones; `None`: zoning not active.
    pub active: Option<(String, Vec<Zone>)>,
}

/// Zones a merged active zone set may hold.
pub const MAX_ZONES: usize = 4096;
/// Members all the zones of a merged active zone set may have together.
pub const MAX_ZONE_MEMBERS: usize = 65_536;

/// Merges two active configurations, or says why they cannot merge. The
/// result is bounded ([`MAX_ZONES`], [`MAX_ZONE_MEMBERS`]): a neighbour
/// that keeps sending merge requests with new zones cannot grow the
/// fabric's zoning without end.
pub fn merge(local: &ZoneDb, remote: &ZoneDb) -> Result<ZoneDb, String> {
    let m = merge_unbounded(local, remote)?;
    if let Some((_, zones)) = &m.active {
        let members: usize = zones.iter().map(|z| z.members.len()).sum();
        if zones.len() > MAX_ZONES || members > MAX_ZONE_MEMBERS {
            return Err(format!(
                "zone merge refused: the merged zone set would hold {} zones with {members} members (at most {MAX_ZONES} and {MAX_ZONE_MEMBERS})",
                zones.len()
            ));
        }
    }
    Ok(m)
}

fn merge_unbounded(local: &ZoneDb, remote: &ZoneDb) -> Result<ZoneDb, String> {
    match (&local.active, &remote.active) {
        (None, None) => Ok(ZoneDb::default()),
        (Some(_), None) => Ok(local.clone()),
        (None, Some(_)) => Ok(remote.clone()),
        (Some((a, za)), Some((b, zb))) => {
            if a != b {
                return Err(format!(
                    "zone merge refused: active zone set {a:?} here, {b:?} on the far side"
                ));
            }
            let mut zones: BTreeMap<String, Zone> =
                za.iter().map(|z| (z.name.clone(), z.clone())).collect();
            for z in zb {
                match zones.get(&z.name) {
                    Some(mine) => {
                        let x: BTreeSet<String> =
                            mine.members.iter().map(|m| m.to_string()).collect();
                        let y: BTreeSet<String> = z.members.iter().map(|m| m.to_string()).collect();
                        if x != y {
                            return Err(format!(
                                "zone merge refused: zone {:?} has different members on the two sides",
                                z.name
                            ));
                        }
                    }
                    None => {
                        zones.insert(z.name.clone(), z.clone());
                    }
                }
            }
            Ok(ZoneDb {
                active: Some((a.clone(), zones.into_values().collect())),
            })
        }
    }
}

fn to_mr(db: &ZoneDb) -> Mr {
    Mr {
        full: Bytes::new(),
        active: db.active.as_ref().map(|(name, zones)| {
            let objs = zones
                .iter()
                .map(|z| ZoneObject {
                    kind: 2,
                    protocol: 0,
                    name: sw_ils::padded_name(&z.name),
                    members: z
                        .members
                        .iter()
                        .map(|m| match m {
                            ZoneMember::PortName(w) => ZoneMemberObj {
                                kind: 1,
                                flags: 0,
                                id: Bytes::copy_from_slice(&w.0.to_be_bytes()),
                            },
                            ZoneMember::FcId(id) => {
                                let mut v = vec![0u8];
                                v.extend_from_slice(&id.to_bytes());
                                ZoneMemberObj {
                                    kind: 3,
                                    flags: 0,
                                    id: Bytes::from(v),
                                }
                            }
                        })
                        .collect(),
                })
                .collect();
            (sw_ils::padded_name(name), objs)
        }),
    }
}

fn from_mr(mr: &Mr) -> Result<ZoneDb, String> {
    let Some((name, objs)) = &mr.active else {
        return Ok(ZoneDb::default());
    };
    let mut zones = Vec::new();
    for o in objs {
        let mut members = Vec::new();
        for m in &o.members {
            members.push(match (m.kind, m.id.len()) {
                (1, 8) => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&m.id);
                    ZoneMember::PortName(Wwn(u64::from_be_bytes(b)))
                }
                (3, 4) => ZoneMember::FcId(FcId::new(u32::from_be_bytes([
                    0, m.id[1], m.id[2], m.id[3],
                ]))),
                (k, _) => {
                    return Err(format!(
                        "zone merge refused: member type {k} is not supported"
                    ));
                }
            });
        }
        zones.push(Zone {
            name: o.name_str(),
            members,
        });
    }
    Ok(ZoneDb {
        active: Some((sw_ils::name_str(name), zones)),
    })
}

/// What this switch brings to a link.
#[derive(Debug, Clone)]
pub struct LocalSwitch {
    /// Domain ID.
    pub domain: u8,
    /// Switch name.
    pub switch_name: Wwn,
    /// This VE_Port's name.
    pub port_name: Wwn,
    /// Domains this switch knows (itself included) and their switches.
    pub domains: Vec<(u8, Wwn)>,
    /// Its active zoning.
    pub zoning: ZoneDb,
    /// R_A_TOV and E_D_TOV in ms.
    pub r_a_tov: u32,
    /// E_D_TOV in ms.
    pub e_d_tov: u32,
}

/// Link state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not started.
    Idle,
    /// Exchanging parameters.
    Negotiating,
    /// Up: the peer's domain and switch.
    Up {
        /// Peer domain.
        domain: u8,
        /// Peer switch name.
        switch_name: Wwn,
    },
    /// Isolated, with the reason.
    Isolated(String),
}

/// What the E_Port wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this class F frame.
    Send(Frame),
    /// Apply this zoning (the merge result) to the local fabric.
    ApplyZoning(ZoneDb),
    /// The link is up.
    Up {
        /// Peer domain.
        domain: u8,
        /// Peer switch.
        switch_name: Wwn,
        /// Every domain the peer announced.
        peer_domains: Vec<(u8, Wwn)>,
    },
    /// The link is isolated.
    Isolated(String),
    /// An FSPF or SW_RSCN request for the switch's controller (already
    /// acknowledged where SW_ILS wants an SW_ACC).
    Controller(SwIlsRepr, FcId),
}

/// The far switch: domain, name, and the domains its EFP listed.
type Peer = (u8, Wwn, Vec<(u8, Wwn)>);

/// The VE_Port's SW_ILS engine for one link.
#[derive(Debug)]
pub struct EPort {
    originator: bool,
    local: LocalSwitch,
    state: State,
    /// Outstanding request: its OX_ID and code.
    waiting: Option<(OxId, SwIlsCode)>,
    next_ox: u16,
    peer: Option<Peer>,
    merged: Option<ZoneDb>,
    /// The responder's own MR is outstanding / done.
    mr_sent: bool,
    out: VecDeque<Output>,
}

/// A class F SW_ILS frame.
pub fn sw_ils_frame(
    repr: &SwIlsRepr,
    reply: bool,
    ox: OxId,
    rx: RxId,
    s_id: FcId,
    d_id: FcId,
) -> Frame {
    let f_ctl = if reply {
        FCtl(FCtl::EXCHANGE_CONTEXT | FCtl::LAST_SEQUENCE | FCtl::END_SEQUENCE)
    } else {
        FCtl(FCtl::FIRST_SEQUENCE | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE)
    };
    let header = FcHeaderRepr {
        r_ctl: if reply { RCtl(0x03) } else { RCtl(0x02) },
        d_id,
        s_id,
        fc_type: FcType::SW_ILS,
        f_ctl,
        ox_id: ox,
        rx_id: rx,
        ..FcHeaderRepr::default()
    };
    Frame {
        sof: Sof::F,
        header,
        payload: repr.to_bytes(),
        eof: Eof::T,
    }
}

impl EPort {
    /// An engine; `originator` for the FCIP connecting side.
    pub fn new(local: LocalSwitch, originator: bool) -> EPort {
        EPort {
            originator,
            local,
            state: State::Idle,
            waiting: None,
            next_ox: 0x100,
            peer: None,
            merged: None,
            mr_sent: false,
            out: VecDeque::new(),
        }
    }

    /// The state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Starts the bring-up (the originator sends ELP).
    pub fn start(&mut self) {
        self.state = State::Negotiating;
        if self.originator {
            let elp = Elp::unifab(
                self.local.port_name,
                self.local.switch_name,
                self.local.r_a_tov,
                self.local.e_d_tov,
            );
            self.request(SwIlsRepr::Elp(elp));
        }
    }

    /// The next thing to do.
    pub fn poll(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn request(&mut self, r: SwIlsRepr) {
        let ox = OxId(self.next_ox);
        self.next_ox = self.next_ox.wrapping_add(1).max(0x100);
        self.waiting = Some((ox, r.code()));
        let fc = FcId::FABRIC_CONTROLLER;
        self.out.push_back(Output::Send(sw_ils_frame(
            &r,
            false,
            ox,
            RxId::UNASSIGNED,
            fc,
            fc,
        )));
    }

    fn reply(&mut self, req: &FcHeaderRepr, r: SwIlsRepr) {
        let f = sw_ils_frame(&r, true, req.ox_id, RxId(0x10), req.d_id, req.s_id);
        self.out.push_back(Output::Send(f));
    }

    fn isolate(&mut self, why: String) {
        if !matches!(self.state, State::Isolated(_)) {
            self.state = State::Isolated(why.clone());
            self.out.push_back(Output::Isolated(why));
        }
    }

    fn reject(&mut self, req: &FcHeaderRepr, reason: SwRjtReason, explanation: SwRjtExplanation) {
        self.reply(
            req,
            SwIlsRepr::Rjt {
                reason,
                explanation,
                vendor: 0,
            },
        );
    }

    fn domain_conflict(&self, peer: &[(u8, Wwn)]) -> Option<String> {
        for (d, w) in peer {
            if let Some((_, mine)) = self.local.domains.iter().find(|(x, _)| x == d)
                && (mine != w || *d == self.local.domain)
            {
                return Some(format!(
                    "domain ID conflict: domain {d} is switch {mine} here and switch {w} on the far side; link isolated, neither fabric changed"
                ));
            }
        }
        None
    }

    fn efp(&self) -> Efp {
        Efp {
            principal_priority: 0xfe,
            principal_name: self.local.switch_name,
            records: self
                .local
                .domains
                .iter()
                .map(|(d, w)| EfpRecord {
                    kind: 1,
                    domain: *d,
                    switch_name: *w,
                })
                .collect(),
        }
    }

    fn peer_domains(e: &Efp) -> Vec<(u8, Wwn)> {
        e.records
            .iter()
            .filter(|r| r.kind == 1)
            .map(|r| (r.domain, r.switch_name))
            .collect()
    }

    fn go_up(&mut self) {
        if let Some((d, w, list)) = self.peer.clone() {
            self.state = State::Up {
                domain: d,
                switch_name: w,
            };
            self.out.push_back(Output::Up {
                domain: d,
                switch_name: w,
                peer_domains: list,
            });
        }
    }

    /// Handles a class F SW_ILS frame from the peer.
    pub fn handle(&mut self, f: &Frame) {
        if matches!(self.state, State::Isolated(_)) {
            return;
        }
        let h = f.header;
        if h.fc_type != FcType::SW_ILS {
            return;
        }
        let is_reply = h.r_ctl == RCtl(0x03);
        let answering = self
            .waiting
            .filter(|(ox, _)| is_reply && *ox == h.ox_id)
            .map(|(_, c)| c);
        let repr = match SwIlsRepr::parse(&f.payload, answering) {
            Ok(r) => r,
            Err(e) => {
                if !is_reply {
                    self.reply(&h, SwIlsRepr::reject_for(&e));
                }
                return;
            }
        };
        if is_reply {
            self.on_reply(answering, repr);
        } else {
            self.on_request(&h, repr);
        }
    }

    fn on_reply(&mut self, answering: Option<SwIlsCode>, repr: SwIlsRepr) {
        let Some(code) = answering else { return };
        self.waiting = None;
        match (code, repr) {
            (
                c,
                SwIlsRepr::Rjt {
                    reason,
                    explanation,
                    ..
                },
            ) => {
                self.isolate(format!(
                    "the far side rejected {} (reason {:#04x}, explanation {:#04x})",
                    c.name().unwrap_or("request"),
                    reason.0,
                    explanation.0
                ));
            }
            (SwIlsCode::ELP, SwIlsRepr::Acc(SwAcc::Elp(_))) => {
                let esc = Esc {
                    vendor_id: *b"UNIFAB  ",
                    protocols: vec![(*b"T11     ", PROTOCOL_FSPF)],
                };
                self.request(SwIlsRepr::Esc(esc));
            }
            (SwIlsCode::ESC, SwIlsRepr::Acc(SwAcc::Esc(e))) => {
                if e.protocols.first().map(|p| p.1) != Some(PROTOCOL_FSPF) {
                    self.isolate("the far side does not run FSPF".into());
                    return;
                }
                let efp = self.efp();
                self.request(SwIlsRepr::Efp(efp));
            }
            (SwIlsCode::EFP, SwIlsRepr::Acc(SwAcc::Efp(e))) => {
                let list = Self::peer_domains(&e);
                if let Some(why) = self.domain_conflict(&list) {
                    self.isolate(why);
                    return;
                }
                let principal = e.principal_name;
                let Some((d, _)) = list.iter().find(|(_, w)| *w == principal).copied() else {
                    self.isolate("EFP accept does not list the far switch's own domain".into());
                    return;
                };
                self.peer = Some((d, principal, list));
                let mr = to_mr(&self.local.zoning);
                self.request(SwIlsRepr::Mr(mr));
            }
            (SwIlsCode::MR, SwIlsRepr::Acc(SwAcc::Zone(z))) => {
                if z.status != 0 {
                    self.isolate(format!(
                        "the far side refused the zone merge (reason {:#04x})",
                        z.reason
                    ));
                } else if !self.originator {
                    // Our own MR (the merged set) was taken: up.
                    self.go_up();
                }
                // The originator waits for the responder's MR.
            }
            (c, other) => self.isolate(format!(
                "unexpected reply to {}: {:?}",
                c.name().unwrap_or("request"),
                other.code()
            )),
        }
    }

    fn on_request(&mut self, h: &FcHeaderRepr, repr: SwIlsRepr) {
        match repr {
            SwIlsRepr::Elp(e) => {
                if e.r_a_tov != self.local.r_a_tov || e.e_d_tov != self.local.e_d_tov {
                    self.reject(
                        h,
                        SwRjtReason::UNABLE_TO_PERFORM,
                        SwRjtExplanation::TOV_MISMATCH,
                    );
                    self.isolate(format!(
                        "R_A_TOV/E_D_TOV mismatch: {}/{} ms here, {}/{} ms on the far side",
                        self.local.r_a_tov, self.local.e_d_tov, e.r_a_tov, e.e_d_tov
                    ));
                    return;
                }
                let mine = Elp::unifab(
                    self.local.port_name,
                    self.local.switch_name,
                    self.local.r_a_tov,
                    self.local.e_d_tov,
                );
                self.reply(h, SwIlsRepr::Acc(SwAcc::Elp(mine)));
            }
            SwIlsRepr::Esc(e) => {
                if let Some(p) = e.protocols.iter().find(|p| p.1 == PROTOCOL_FSPF) {
                    let acc = Esc {
                        vendor_id: *b"UNIFAB  ",
                        protocols: vec![*p],
                    };
                    self.reply(h, SwIlsRepr::Acc(SwAcc::Esc(acc)));
                } else {
                    self.reject(
                        h,
                        SwRjtReason::UNABLE_TO_PERFORM,
                        SwRjtExplanation::NO_PROTOCOL,
                    );
                    self.isolate("the far side offers no protocol unifab runs (FSPF)".into());
                }
            }
            SwIlsRepr::Efp(e) => {
                let list = Self::peer_domains(&e);
                let efp = self.efp();
                self.reply(h, SwIlsRepr::Acc(SwAcc::Efp(efp)));
                if let Some(why) = self.domain_conflict(&list) {
                    self.isolate(why);
                    return;
                }
                let principal = e.principal_name;
                match list.iter().find(|(_, w)| *w == principal) {
                    Some((d, _)) => self.peer = Some((*d, principal, list.clone())),
                    None => self.isolate("EFP does not list the far switch's own domain".into()),
                }
            }
            SwIlsRepr::Mr(mr) => {
                let theirs = match from_mr(&mr) {
                    Ok(z) => z,
                    Err(why) => {
                        self.reply(h, zone_status(2, 0x08));
                        self.isolate(why);
                        return;
                    }
                };
                let base = self
                    .merged
                    .clone()
                    .unwrap_or_else(|| self.local.zoning.clone());
                match merge(&base, &theirs) {
                    Ok(m) => {
                        self.reply(h, zone_status(0, 0));
                        self.out.push_back(Output::ApplyZoning(m.clone()));
                        self.merged = Some(m.clone());
                        if self.originator {
                            self.go_up();
                        } else if !self.mr_sent {
                            self.mr_sent = true;
                            self.request(SwIlsRepr::Mr(to_mr(&m)));
                        }
                    }
                    Err(why) => {
                        self.reply(h, zone_status(2, 0x0a));
                        self.isolate(why);
                    }
                }
            }
            r @ (SwIlsRepr::Hlo(_) | SwIlsRepr::Lsu(_) | SwIlsRepr::Lsa(_)) => {
                self.out.push_back(Output::Controller(r, h.s_id));
            }
            r @ SwIlsRepr::Rscn(_) => {
                self.reply(h, SwIlsRepr::Acc(SwAcc::Plain));
                self.out.push_back(Output::Controller(r, h.s_id));
            }
            _ => self.reject(h, SwRjtReason::NOT_SUPPORTED, SwRjtExplanation::NONE),
        }
    }
}

fn zone_status(status: u8, reason: u8) -> SwIlsRepr {
    SwIlsRepr::Acc(SwAcc::Zone(ZoneStatus {
        status,
        reason,
        vendor: 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(domain: u8, zoning: ZoneDb) -> LocalSwitch {
        let w = Wwn(0x1000_0000_0000_0000 | u64::from(domain));
        LocalSwitch {
            domain,
            switch_name: w,
            port_name: Wwn(0x2000_0000_0000_0000 | u64::from(domain)),
            domains: vec![(domain, w)],
            zoning,
            r_a_tov: 10_000,
            e_d_tov: 2_000,
        }
    }

    /// Runs two engines against each other; returns their outputs.
    fn pair(a: LocalSwitch, b: LocalSwitch) -> (EPort, EPort, Vec<Output>, Vec<Output>) {
        let mut x = EPort::new(a, true);
        let mut y = EPort::new(b, false);
        x.start();
        y.start();
        let (mut ox, mut oy) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            let mut moved = false;
            while let Some(o) = x.poll() {
                moved = true;
                if let Output::Send(f) = &o {
                    y.handle(f);
                }
                ox.push(o);
            }
            while let Some(o) = y.poll() {
                moved = true;
                if let Output::Send(f) = &o {
                    x.handle(f);
                }
                oy.push(o);
            }
            if !moved {
                break;
            }
        }
        (x, y, ox, oy)
    }

    fn zone(name: &str, w: u64) -> Zone {
        Zone {
            name: name.into(),
            members: vec![ZoneMember::PortName(Wwn(w))],
        }
    }

    #[test]
    fn two_switches_come_up_and_merge_zoning() {
        let za = ZoneDb {
            active: Some(("cfg".into(), vec![zone("z1", 1)])),
        };
        let zb = ZoneDb {
            active: Some(("cfg".into(), vec![zone("z2", 2)])),
        };
        let (x, y, ox, oy) = pair(sw(1, za), sw(2, zb));
        assert_eq!(
            x.state(),
            &State::Up {
                domain: 2,
                switch_name: Wwn(0x1000_0000_0000_0002)
            }
        );
        assert!(matches!(y.state(), State::Up { domain: 1, .. }));
        let applied = |o: &[Output]| {
            o.iter()
                .filter_map(|o| match o {
                    Output::ApplyZoning(z) => Some(z.clone()),
                    _ => None,
                })
                .last()
                .unwrap()
        };
        assert_eq!(applied(&ox), applied(&oy));
        assert_eq!(applied(&ox).active.unwrap().1.len(), 2);
    }

    /// Merging is bounded: a far side that sends zone after new zone
    /// (each MR adding a few, as a peer repeating merge requests would)
    /// is refused once the result passes the limit, with the reason.
    #[test]
    fn merged_zoning_is_bounded() {
        let mut db = ZoneDb {
            active: Some((
                "cfg".into(),
                (1..MAX_ZONES as u64)
                    .map(|k| zone(&format!("z{k}"), k))
                    .collect(),
            )),
        };
        let one_more = |k: u64| ZoneDb {
            active: Some(("cfg".into(), vec![zone(&format!("new{k}"), k)])),
        };
        // Up to the limit: merged.
        db = merge(&db, &one_more(1)).unwrap();
        assert_eq!(db.active.as_ref().unwrap().1.len(), MAX_ZONES);
        // One past it: refused, with the reason.
        let why = merge(&db, &one_more(2)).unwrap_err();
        assert!(why.contains("at most 4096"), "{why}");
        // Members count too.
        let fat = Zone {
            name: "fat".into(),
            members: (0..MAX_ZONE_MEMBERS as u64 + 1)
                .map(|w| ZoneMember::PortName(Wwn(w)))
                .collect(),
        };
        let theirs = ZoneDb {
            active: Some(("cfg".into(), vec![fat])),
        };
        assert!(merge(&ZoneDb::default(), &theirs).is_err());
    }

    #[test]
    fn a_domain_conflict_isolates_both_ends() {
        let mut other = sw(1, ZoneDb::default());
        other.switch_name = Wwn(0x1000_0000_0000_0099);
        other.domains = vec![(1, other.switch_name)];
        let (x, y, _, _) = pair(sw(1, ZoneDb::default()), other);
        for s in [x.state(), y.state()] {
            let State::Isolated(why) = s else {
                panic!("{s:?}")
            };
            assert!(why.contains("domain ID conflict: domain 1"), "{why}");
        }
    }

    #[test]
    fn conflicting_zoning_is_refused_with_the_reason() {
        let za = ZoneDb {
            active: Some(("cfg".into(), vec![zone("z1", 1)])),
        };
        let zb = ZoneDb {
            active: Some(("cfg".into(), vec![zone("z1", 9)])),
        };
        let (x, y, _, _) = pair(sw(1, za), sw(2, zb));
        let State::Isolated(why) = y.state() else {
            panic!()
        };
        assert!(why.contains("zone \"z1\" has different members"), "{why}");
        assert!(matches!(x.state(), State::Isolated(_)));
        let names = ZoneDb {
            active: Some(("other".into(), vec![])),
        };
        let (_, y, _, _) = pair(
            sw(1, names),
            sw(
                2,
                ZoneDb {
                    active: Some(("cfg".into(), vec![])),
                },
            ),
        );
        assert!(matches!(y.state(), State::Isolated(w) if w.contains("active zone set")));
    }
}
