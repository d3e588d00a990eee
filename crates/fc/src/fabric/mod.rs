//! A software Fibre Channel fabric (one switch, one domain): the login
//! server at FFFFFE (FLOGI/FDISC, FC_ID assignment), the fabric controller
//! at FFFFFD (SCR, RSCN), the name server at FFFFFC (filtered by zoning),
//! zoning, and frame routing by D_ID with zoning enforced on every frame.
//!
//! Sans-IO: [`Fabric::handle_frame`] takes a frame that arrived on a port;
//! [`Fabric::poll_transmit`] yields the frames to send and the port to
//! send each on. Ports attach through whatever carries frames (the
//! in-memory link, FCoE VF_Ports, FCIP tunnels); the fabric only sees
//! [`PortIndex`]es.
//!
//! Decisions:
//!
//! - FC_IDs are `domain.area.port` with area = port index + 1 and port 00
//!   for FLOGI, 01, 02, … for FDISC (NPIV) on the same fabric port.
//! - Class 3 only: a frame that cannot be delivered (unknown D_ID, zoned
//!   out, spoofed S_ID) is discarded and counted, as a switch does.
//! - RSCNs go to ports that registered with SCR and may see the affected
//!   port: at fabric login and logout, when a port registers or changes
//!   its FC-4 types or features, and when zoning changes what a port sees.
//!   A port has one RSCN outstanding at a time; the changes that come
//!   before it answers are merged into the next (the `rscn` module).

pub mod isl;
pub mod name_server;
mod rscn;
pub mod zoning;

use std::collections::{BTreeMap, VecDeque};

use std::time::Instant;
use unifab_scsi_core::idmap::IdMap;

use crate::compose::{self, Route};
use crate::exchange::Timeouts;
use crate::wire::bls::{BaAcc, BlsRepr};
use crate::wire::ct::{CtBody, CtIu, CtReason, CtReject, GsSubtype, GsType, NsReason};
use crate::wire::els::{
    ClassServiceParams, CommonFeatures, CommonServiceParams, ElsRepr, LoginParams, LsAcc, LsRjt,
    LsRjtExplanation, LsRjtReason, RscnPage, rscn_format,
};
use crate::wire::frame::Frame;
use crate::wire::header::{FcType, RCtl};
use crate::wire::{FcId, RxId, Wwn};

use name_server::{NameServer, NsEntry};
use zoning::{Membership, Zone, ZoneSet, ZonedPort, Zoning, ZoningError};

/// A fabric port, as the fabric numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortIndex(pub usize);

/// Fabric settings.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Domain ID (1–239).
    pub domain: u8,
    /// Switch name (also the fabric name).
    pub switch_name: Wwn,
    /// E_D_TOV and R_A_TOV announced in FLOGI LS_ACC.
    pub timeouts: Timeouts,
    /// Largest frame payload the fabric accepts (≤ 2112).
    pub rx_data_field_size: u16,
    /// Ports in no active zone may talk to each other.
    pub default_zone_permit: bool,
}

impl Default for FabricConfig {
    fn default() -> FabricConfig {
        FabricConfig {
            domain: 1,
            switch_name: Wwn(0x1000_0000_0000_0001),
            timeouts: Timeouts::default(),
            rx_data_field_size: 2048,
            default_zone_permit: true,
        }
    }
}

/// How a port logged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginKind {
    /// FLOGI: the port's first (physical) N_Port.
    Flogi,
    /// FDISC: an additional (virtual, NPIV) N_Port.
    Fdisc,
}

/// One entry of the fabric login database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginEntry {
    /// Assigned address.
    pub fc_id: FcId,
    /// The fabric port.
    pub port: PortIndex,
    /// N_Port name.
    pub port_name: Wwn,
    /// Node name.
    pub node_name: Wwn,
    /// FLOGI or FDISC.
    pub kind: LoginKind,
}

/// Frame counters of one fabric port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames received from the port.
    pub rx_frames: u64,
    /// Payload bytes received.
    pub rx_bytes: u64,
    /// Frames sent to the port.
    pub tx_frames: u64,
    /// Payload bytes sent.
    pub tx_bytes: u64,
    /// Frames from this port dropped because zoning forbids them.
    pub zone_drops: u64,
    /// Frames from this port to an address nobody holds.
    pub unroutable_drops: u64,
    /// Frames from this port with an S_ID it does not hold.
    pub source_drops: u64,
    /// Link services from this port that did not parse.
    pub malformed: u64,
}

#[derive(Debug)]
struct PortState {
    name: String,
    f_port_name: Wwn,
    counters: PortCounters,
    /// The port number the last FDISC on this port was given: the next
    /// one starts searching after it, so an N_Port_ID that was just
    /// logged out is not handed out again at once (frames still in
    /// flight for the old login would reach the new one; FC-LS-3 asks
    /// for R_A_TOV before an address is reused).
    last_npiv: u8,
    /// An E_Port (VE_Port) to another switch: no logins, frames from
    /// other domains.
    e_port: bool,
}

/// A fabric port as `show` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortView {
    /// Index.
    pub index: PortIndex,
    /// Operator name (`fc1`, `vfc2`, …).
    pub name: String,
    /// The F_Port's name.
    pub f_port_name: Wwn,
    /// Addresses logged in on it.
    pub fc_ids: Vec<FcId>,
    /// Counters.
    pub counters: PortCounters,
}

/// The fabric.
#[derive(Debug)]
pub struct Fabric {
    cfg: FabricConfig,
    ports: Vec<Option<PortState>>,
    logins: IdMap<FcId, LoginEntry>,
    ns: NameServer,
    zoning: Zoning,
    membership: Membership,
    /// SCR registrations: port → registration function.
    scr: BTreeMap<FcId, u8>,
    next_ox: u16,
    next_rx: u16,
    out: VecDeque<(PortIndex, Frame)>,
    rscns_sent: u64,
    /// Per port, the RSCN it has not answered and what waits behind it
    /// (the `rscn` module).
    rscn_out: IdMap<FcId, rscn::Outstanding>,
    /// When the oldest unanswered RSCN stops holding the next.
    rscn_due: Option<Instant>,
    /// The latest time a frame was handled with.
    now: Instant,
    /// Inter-switch state: routes to other domains, their name server
    /// entries, local changes to announce.
    isl: isl::IslState,
}

fn f_port_params(cfg: &FabricConfig, f_port_name: Wwn, rx: u16) -> LoginParams {
    let ms = |d: std::time::Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    LoginParams {
        common: CommonServiceParams {
            fc_ph_version: 0x2020,
            bb_credit: 16,
            features: CommonFeatures(CommonFeatures::F_PORT | CommonFeatures::NPIV_ASSIGNED),
            bb_sc_n: 0,
            rx_data_field_size: rx,
            word2: ms(cfg.timeouts.r_a_tov),
            e_d_tov: ms(cfg.timeouts.e_d_tov),
        },
        port_name: f_port_name,
        node_name: cfg.switch_name,
        classes: [
            ClassServiceParams::default(),
            ClassServiceParams::default(),
            ClassServiceParams::class3(rx),
            ClassServiceParams::default(),
        ],
        vendor_version: [0; 16],
    }
}

impl Fabric {
    /// A fabric with no ports.
    pub fn new(cfg: FabricConfig) -> Fabric {
        let zoning = Zoning::new(cfg.default_zone_permit);
        let membership = zoning.membership([]);
        Fabric {
            cfg,
            ports: Vec::new(),
            logins: IdMap::default(),
            ns: NameServer::default(),
            zoning,
            membership,
            scr: BTreeMap::new(),
            next_ox: 0,
            next_rx: 0,
            out: VecDeque::new(),
            rscns_sent: 0,
            rscn_out: IdMap::default(),
            rscn_due: None,
            now: Instant::now(),
            isl: isl::IslState::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FabricConfig {
        &self.cfg
    }

    /// Attaches a port (an F_Port / VF_Port) named `name`.
    pub fn attach(&mut self, name: &str) -> PortIndex {
        let slot = self.ports.iter().position(Option::is_none);
        let index = slot.unwrap_or(self.ports.len());
        let f_port_name = Wwn((self.cfg.switch_name.0 & !0xffff) | (index as u64 + 1));
        let st = PortState {
            name: name.to_string(),
            f_port_name,
            counters: PortCounters::default(),
            last_npiv: 0,
            e_port: false,
        };
        match slot {
            Some(i) => self.ports[i] = Some(st),
            None => self.ports.push(Some(st)),
        }
        PortIndex(index)
    }

    /// Detaches a port: every N_Port logged in on it is logged out.
    pub fn detach(&mut self, port: PortIndex) {
        let ids: Vec<FcId> = self
            .logins
            .values()
            .filter(|l| l.port == port)
            .map(|l| l.fc_id)
            .collect();
        for id in ids {
            self.logout(id);
        }
        if let Some(slot) = self.ports.get_mut(port.0) {
            *slot = None;
        }
        self.out.retain(|(p, _)| *p != port);
        self.isl_port_gone(port);
    }

    /// The next frame to send, and where.
    pub fn poll_transmit(&mut self) -> Option<(PortIndex, Frame)> {
        let (p, f) = self.out.pop_front()?;
        if let Some(Some(st)) = self.ports.get_mut(p.0) {
            st.counters.tx_frames += 1;
            st.counters.tx_bytes += f.payload.len() as u64;
        }
        Some((p, f))
    }

    /// Frames waiting in [`Fabric::poll_transmit`].
    pub fn pending(&self) -> usize {
        self.out.len()
    }

    /// Handles a frame that arrived on `port`.
    pub fn handle_frame(&mut self, now: Instant, port: PortIndex, frame: Frame) {
        self.rscn_expire(now);
        let Some(Some(st)) = self.ports.get_mut(port.0) else {
            return;
        };
        st.counters.rx_frames += 1;
        st.counters.rx_bytes += frame.payload.len() as u64;
        let e_port = st.e_port;
        let h = &frame.header;
        let d_id = h.d_id;
        if let Some(dom) = isl::controller_domain(d_id) {
            if !self.isl_route(port, e_port, dom, frame) {
                self.count(port, |c| c.unroutable_drops += 1);
            }
            return;
        }
        if d_id.is_well_known() {
            self.service(port, frame);
            return;
        }
        let s_id = h.s_id;
        let source_ok = if e_port {
            s_id.domain() != self.cfg.domain
        } else {
            self.logins.get(&s_id).is_some_and(|l| l.port == port)
        };
        if !source_ok {
            self.count(port, |c| c.source_drops += 1);
            return;
        }
        let dest = match self.logins.get(&d_id).map(|l| l.port) {
            Some(p) => p,
            None => match self.isl.route(d_id.domain()) {
                Some(p) if p != port && d_id.domain() != self.cfg.domain => p,
                _ => {
                    self.count(port, |c| c.unroutable_drops += 1);
                    return;
                }
            },
        };
        if !self.membership.allowed(s_id, d_id) {
            self.count(port, |c| c.zone_drops += 1);
            return;
        }
        self.out.push_back((dest, frame));
    }

    fn count(&mut self, port: PortIndex, f: impl FnOnce(&mut PortCounters)) {
        if let Some(Some(st)) = self.ports.get_mut(port.0) {
            f(&mut st.counters);
        }
    }

    fn send(&mut self, port: PortIndex, frame: Result<Frame, crate::wire::WireError>) {
        if let Ok(f) = frame {
            self.out.push_back((port, f));
        }
    }

    fn alloc_rx(&mut self) -> RxId {
        let r = self.next_rx;
        self.next_rx = if r >= 0xfffe { 0 } else { r + 1 };
        RxId(r)
    }

    /// Frames to the login server, fabric controller and name server.
    fn service(&mut self, port: PortIndex, frame: Frame) {
        let h = frame.header;
        let from_login = self.logins.get(&h.s_id).is_some_and(|l| l.port == port);
        match (h.fc_type, h.r_ctl) {
            (FcType::ELS, RCtl::ELS_REQUEST) => {
                let els = match ElsRepr::parse(&frame.payload, None) {
                    Ok(e) => e,
                    Err(e) => {
                        self.count(port, |c| c.malformed += 1);
                        let rx = self.alloc_rx();
                        let rjt = ElsRepr::LsRjt(LsRjt::from(&e));
                        self.send(port, compose::els(Route::reply_to(&h, rx), &rjt));
                        return;
                    }
                };
                let is_login = matches!(els, ElsRepr::Flogi(_) | ElsRepr::Fdisc(_));
                if !is_login && !from_login {
                    self.count(port, |c| c.source_drops += 1);
                    return;
                }
                self.els_request(port, &h, els);
            }
            // Replies to the fabric's own requests (RSCN): what waited
            // for the answer goes.
            (FcType::ELS, RCtl::ELS_REPLY) if from_login => {
                if h.d_id == FcId::FABRIC_CONTROLLER {
                    self.rscn_answered(h.s_id, h.ox_id);
                }
            }
            (FcType::ELS, RCtl::ELS_REPLY) => {}
            (FcType::CT, RCtl::CT_REQUEST) if from_login => {
                let rx = self.alloc_rx();
                let route = Route::reply_to(&h, rx);
                let iu = match CtIu::parse(&frame.payload, None) {
                    Ok(iu) => iu,
                    Err(e) => {
                        self.count(port, |c| c.malformed += 1);
                        // Answer with what little of the preamble there is.
                        let r = CtReject::from(&e);
                        let mut pre =
                            crate::wire::ct::CtPreamble::name_server(crate::wire::ct::CtCommand(0));
                        pre = pre.reject(r.reason, r.explanation);
                        let rjt = CtIu {
                            preamble: pre,
                            body: CtBody::Reject,
                        };
                        self.send(port, compose::ct(route, &rjt, true));
                        return;
                    }
                };
                let ns = h.d_id == FcId::NAME_SERVER
                    && iu.preamble.gs_type == GsType::DIRECTORY
                    && iu.preamble.gs_subtype == GsSubtype::NAME_SERVER;
                if !ns {
                    let rjt = CtIu {
                        preamble: iu
                            .preamble
                            .reject(CtReason::SERVER_NOT_AVAILABLE, NsReason::NONE),
                        body: CtBody::Reject,
                    };
                    self.send(port, compose::ct(route, &rjt, true));
                    return;
                }
                let m = &self.membership;
                let (reply, changed) = self.ns.handle(h.s_id, &iu, |a, b| m.allowed(a, b));
                self.send(port, compose::ct(route, &reply, true));
                if let Some(name_server::Changed(id)) = changed {
                    self.rscn_for(id, 1);
                }
            }
            (FcType::BLS, RCtl::ABTS) if from_login || h.s_id == FcId::UNIDENTIFIED => {
                // Every service answers at once: nothing is left to abort.
                let acc = BlsRepr::BaAcc(BaAcc {
                    seq_id_validity: 0,
                    last_seq_id: 0,
                    ox_id: h.ox_id,
                    rx_id: h.rx_id,
                    low_seq_cnt: 0,
                    high_seq_cnt: 0xffff,
                });
                self.send(
                    port,
                    compose::bls_reply(Route::reply_to(&h, h.rx_id), &acc, true),
                );
            }
            _ => self.count(port, |c| c.unroutable_drops += 1),
        }
    }

    fn els_request(&mut self, port: PortIndex, h: &crate::wire::FcHeaderRepr, els: ElsRepr) {
        let rx = self.alloc_rx();
        let route = Route::reply_to(h, rx);
        let f_port_name = self
            .ports
            .get(port.0)
            .and_then(|p| p.as_ref())
            .map_or(Wwn(0), |p| p.f_port_name);
        let rjt = |reason, expl| ElsRepr::LsRjt(LsRjt::new(reason, expl));
        match (h.d_id, els) {
            (FcId::LOGIN_SERVER, ElsRepr::Flogi(p)) => self.fabric_login(port, h, p, rx, false),
            (FcId::LOGIN_SERVER, ElsRepr::Fdisc(p)) => self.fabric_login(port, h, p, rx, true),
            (FcId::LOGIN_SERVER, ElsRepr::Logo(l)) => {
                let ok = self
                    .logins
                    .get(&l.n_port_id)
                    .is_some_and(|e| e.port == port && l.n_port_id == h.s_id);
                let reply = if ok {
                    ElsRepr::LsAcc(LsAcc::Plain)
                } else {
                    rjt(
                        LsRjtReason::LOGICAL_ERROR,
                        LsRjtExplanation::INVALID_PORT_ID,
                    )
                };
                self.send(port, compose::els(route, &reply));
                if ok {
                    self.logout(l.n_port_id);
                }
            }
            (FcId::FABRIC_CONTROLLER, ElsRepr::Scr(s)) => {
                if s.function == crate::wire::els::scr_function::CLEAR {
                    self.scr.remove(&h.s_id);
                } else {
                    self.scr.insert(h.s_id, s.function);
                }
                self.send(port, compose::els(route, &ElsRepr::LsAcc(LsAcc::Plain)));
            }
            // An N_Port may report a change it detected: accepted, nothing to do.
            (FcId::FABRIC_CONTROLLER, ElsRepr::Rscn(_)) => {
                self.send(port, compose::els(route, &ElsRepr::LsAcc(LsAcc::Plain)));
            }
            (
                FcId::LOGIN_SERVER | FcId::FABRIC_CONTROLLER | FcId::NAME_SERVER,
                ElsRepr::Plogi(p),
            ) => {
                let rx_size = p.common.rx_data_field_size.min(self.cfg.rx_data_field_size);
                let mut acc = f_port_params(&self.cfg, f_port_name, rx_size);
                // The service's own identity: its well-known address in the low bits.
                acc.port_name =
                    Wwn((self.cfg.switch_name.0 & !0xff_ffff) | u64::from(h.d_id.get()));
                acc.common.features = CommonFeatures(0);
                acc.common.word2 = (255 << 16) | 0x1f;
                self.send(
                    port,
                    compose::els(route, &ElsRepr::LsAcc(LsAcc::Login(acc))),
                );
            }
            (FcId::NAME_SERVER | FcId::FABRIC_CONTROLLER, ElsRepr::Logo(_)) => {
                self.send(port, compose::els(route, &ElsRepr::LsAcc(LsAcc::Plain)));
            }
            (_, ElsRepr::Echo(data)) => {
                self.send(
                    port,
                    compose::els(route, &ElsRepr::LsAcc(LsAcc::Echo(data))),
                );
            }
            _ => {
                let r = rjt(LsRjtReason::COMMAND_NOT_SUPPORTED, LsRjtExplanation::NONE);
                self.send(port, compose::els(route, &r));
            }
        }
    }

    fn fabric_login(
        &mut self,
        port: PortIndex,
        h: &crate::wire::FcHeaderRepr,
        p: LoginParams,
        rx: RxId,
        fdisc: bool,
    ) {
        let reply_route = |d_id| Route {
            s_id: FcId::LOGIN_SERVER,
            d_id,
            ox_id: h.ox_id,
            rx_id: rx,
        };
        let rjt = |reason, expl| ElsRepr::LsRjt(LsRjt::new(reason, expl));
        let area = port.0 + 1;
        if area > 0xff || !p.class3().is_valid() {
            let r = if area > 0xff {
                rjt(
                    LsRjtReason::UNABLE_TO_PERFORM,
                    LsRjtExplanation::INSUFFICIENT_RESOURCES,
                )
            } else {
                rjt(
                    LsRjtReason::PROTOCOL_ERROR,
                    LsRjtExplanation::SERVICE_PARAM_ERROR_OPTIONS,
                )
            };
            self.send(port, compose::els(reply_route(h.s_id), &r));
            return;
        }
        let on_port: Vec<LoginEntry> = self
            .logins
            .values()
            .filter(|l| l.port == port)
            .cloned()
            .collect();
        // The same WWPN logged in elsewhere is a duplicate name (a new FLOGI
        // on this port replaces what the port had).
        let duplicate = self
            .logins
            .values()
            .any(|l| l.port_name == p.port_name && (fdisc || l.port != port));
        let fc_id = if fdisc {
            if !on_port.iter().any(|l| l.kind == LoginKind::Flogi) || duplicate {
                let r = rjt(
                    LsRjtReason::LOGICAL_ERROR,
                    if duplicate {
                        LsRjtExplanation::INVALID_PORT_NAME
                    } else {
                        LsRjtExplanation::N_PORT_LOGIN_REQUIRED
                    },
                );
                self.send(port, compose::els(reply_route(h.s_id), &r));
                return;
            }
            let used: Vec<u8> = on_port.iter().map(|l| l.fc_id.port()).collect();
            let last = self
                .ports
                .get(port.0)
                .and_then(|p| p.as_ref())
                .map_or(0, |p| p.last_npiv);
            // Round robin over 01..FF, starting after the last one given.
            let next = (0..255u16)
                .map(|k| ((u16::from(last) + k) % 255 + 1) as u8)
                .find(|n| !used.contains(n));
            if let (Some(n), Some(Some(st))) = (next, self.ports.get_mut(port.0)) {
                st.last_npiv = n;
            }
            match next {
                Some(n) => FcId::from_parts(self.cfg.domain, area as u8, n),
                None => {
                    let r = rjt(
                        LsRjtReason::UNABLE_TO_PERFORM,
                        LsRjtExplanation::INSUFFICIENT_RESOURCES,
                    );
                    self.send(port, compose::els(reply_route(h.s_id), &r));
                    return;
                }
            }
        } else {
            // A new FLOGI on a port logs out everything it had.
            for l in &on_port {
                self.logout(l.fc_id);
            }
            if duplicate {
                let r = rjt(
                    LsRjtReason::LOGICAL_ERROR,
                    LsRjtExplanation::INVALID_PORT_NAME,
                );
                self.send(port, compose::els(reply_route(h.s_id), &r));
                return;
            }
            FcId::from_parts(self.cfg.domain, area as u8, 0)
        };
        let f_port_name = self
            .ports
            .get(port.0)
            .and_then(|p| p.as_ref())
            .map_or(Wwn(0), |p| p.f_port_name);
        self.logins.insert(
            fc_id,
            LoginEntry {
                fc_id,
                port,
                port_name: p.port_name,
                node_name: p.node_name,
                kind: if fdisc {
                    LoginKind::Fdisc
                } else {
                    LoginKind::Flogi
                },
            },
        );
        self.ns
            .register_login(fc_id, p.port_name, p.node_name, f_port_name);
        self.recompute_membership();
        let rx_size = p
            .common
            .rx_data_field_size
            .min(self.cfg.rx_data_field_size)
            .max(256);
        let acc = f_port_params(&self.cfg, f_port_name, rx_size);
        self.send(
            port,
            compose::els(reply_route(fc_id), &ElsRepr::LsAcc(LsAcc::Login(acc))),
        );
        self.rscn_for(fc_id, 0);
    }

    /// Removes a login: name server entry, SCR registration, RSCN to the
    /// ports that could see it.
    fn logout(&mut self, fc_id: FcId) {
        if !self.logins.contains_key(&fc_id) {
            return;
        }
        self.rscn_for(fc_id, 0);
        self.logins.remove(&fc_id);
        self.ns.remove(fc_id);
        self.scr.remove(&fc_id);
        self.rscn_forget(fc_id);
        self.recompute_membership();
    }

    fn zoned_ports(&self) -> Vec<ZonedPort> {
        self.logins
            .values()
            .map(|l| ZonedPort {
                fc_id: l.fc_id,
                port_name: l.port_name,
            })
            .chain(self.isl.remote_entries().map(|e| ZonedPort {
                fc_id: e.fc_id,
                port_name: e.port_name,
            }))
            .collect()
    }

    fn recompute_membership(&mut self) {
        self.membership = self.zoning.membership(self.zoned_ports());
    }

    /// Defines (or replaces) a zone; nothing changes until activation.
    pub fn define_zone(&mut self, zone: Zone) {
        self.zoning.define_zone(zone);
    }

    /// Defines (or replaces) a zone set.
    pub fn define_zone_set(&mut self, set: ZoneSet) {
        self.zoning.define_zone_set(set);
    }

    /// Replaces the zone and zone set definitions named in `remove`,
    /// `zones` and `sets` (definitions named nowhere, as those an FCIP
    /// merge brought, stay), then makes `default_permit` and `active` the
    /// enforced configuration at once: one membership change, one RSCN
    /// per registered port whose view changed. Nothing changes if `active`
    /// cannot be activated.
    pub fn reconfigure_zoning(
        &mut self,
        remove: (&[String], &[String]),
        zones: Vec<Zone>,
        sets: Vec<ZoneSet>,
        default_permit: bool,
        active: Option<&str>,
    ) -> Result<(), ZoningError> {
        let mut next = self.zoning.clone();
        for z in remove.0 {
            next.remove_zone(z);
        }
        for s in remove.1 {
            next.remove_zone_set(s);
        }
        for z in zones {
            next.define_zone(z);
        }
        for s in sets {
            next.define_zone_set(s);
        }
        next.set_default_permit(default_permit);
        match active {
            Some(a) => next.activate(a)?,
            None => next.deactivate(),
        }
        let before = self.membership.clone();
        self.zoning = next;
        self.apply_zoning(before);
        Ok(())
    }

    /// Sets the default zone policy and applies it.
    pub fn set_default_zone_permit(&mut self, permit: bool) {
        let before = self.membership.clone();
        self.zoning.set_default_permit(permit);
        self.apply_zoning(before);
    }

    /// Activates a zone set; every registered port whose view changed gets
    /// an RSCN naming the ports that appeared or disappeared.
    pub fn activate_zone_set(&mut self, name: &str) -> Result<(), ZoningError> {
        let before = self.membership.clone();
        self.zoning.activate(name)?;
        self.apply_zoning(before);
        Ok(())
    }

    /// Deactivates zoning (every port in the default zone).
    pub fn deactivate_zoning(&mut self) {
        let before = self.membership.clone();
        self.zoning.deactivate();
        self.apply_zoning(before);
    }

    fn apply_zoning(&mut self, before: Membership) {
        self.recompute_membership();
        let all: Vec<FcId> = {
            let mut v: Vec<FcId> = self.logins.keys().copied().collect();
            v.sort();
            v
        };
        let registered: Vec<FcId> = self.scr.keys().copied().collect();
        for r in registered {
            let pages: Vec<RscnPage> = all
                .iter()
                .filter(|p| **p != r)
                .filter(|p| before.allowed(r, **p) != self.membership.allowed(r, **p))
                .map(|p| RscnPage {
                    event_qualifier: 0,
                    address_format: rscn_format::PORT,
                    affected: *p,
                })
                .collect();
            if !pages.is_empty() {
                self.queue_rscn(r, pages);
            }
        }
    }

    /// The zoning database.
    pub fn zoning(&self) -> &Zoning {
        &self.zoning
    }

    /// May `a` and `b` exchange frames?
    pub fn zoned(&self, a: FcId, b: FcId) -> bool {
        self.membership.allowed(a, b)
    }

    /// The fabric login database, by address.
    pub fn logins(&self) -> Vec<LoginEntry> {
        let mut v: Vec<LoginEntry> = self.logins.values().cloned().collect();
        v.sort_by_key(|l| l.fc_id);
        v
    }

    /// The login of an address.
    pub fn login(&self, fc_id: FcId) -> Option<&LoginEntry> {
        self.logins.get(&fc_id)
    }

    /// The name server database.
    pub fn name_server(&self) -> Vec<NsEntry> {
        self.ns.entries().cloned().collect()
    }

    /// Ports registered for RSCN.
    pub fn scr_registrations(&self) -> Vec<(FcId, u8)> {
        self.scr.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// RSCNs sent so far.
    pub fn rscns_sent(&self) -> u64 {
        self.rscns_sent
    }

    /// Every attached port.
    pub fn ports(&self) -> Vec<PortView> {
        self.ports
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                let mut fc_ids: Vec<FcId> = self
                    .logins
                    .values()
                    .filter(|l| l.port.0 == i)
                    .map(|l| l.fc_id)
                    .collect();
                fc_ids.sort();
                Some(PortView {
                    index: PortIndex(i),
                    name: p.name.clone(),
                    f_port_name: p.f_port_name,
                    fc_ids,
                    counters: p.counters,
                })
            })
            .collect()
    }

    /// One port's counters.
    pub fn counters(&self, port: PortIndex) -> Option<PortCounters> {
        self.ports.get(port.0)?.as_ref().map(|p| p.counters)
    }

    /// The name of a fabric port.
    pub fn port_name(&self, port: PortIndex) -> Option<&str> {
        self.ports.get(port.0)?.as_ref().map(|p| p.name.as_str())
    }
}
