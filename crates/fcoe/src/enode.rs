//! The ENode (FC-BB-6 §7.8, the host side of FIP and FCoE), sans-IO.
//!
//! The ENode finds its VLAN (FIP VLAN discovery), solicits FCFs and
//! selects one (available, its max FCoE size verified by a solicited
//! advertisement padded to that size, lowest priority value, then lowest
//! MAC), and then carries the frames of the N_Ports above it: their
//! fabric logins (FLOGI, FDISC, LOGO to FFFFFE) become FIP link-service
//! requests, the replies come back as the FC frames the N_Ports expect,
//! and everything else travels as FCoE from the granted VN_Port MAC to
//! the FCF-MAC. It sends ENode and VN_Port keep-alives, and when the FCF
//! stops advertising (2.5 × FKA_ADV_PERIOD) or clears the virtual links,
//! it reports the link down, forgets every VN_Port and starts over; the
//! N_Ports log in again when [`EnodeEvent::LinkUp`] comes.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, info, warn};
use unifab_fc::compose::{self, Route};
use unifab_fc::wire::els::{ElsRepr, Logo};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{Eof, FcType, HEADER_LEN, OxId, RCtl, Sof};
use unifab_fc::{FcId, Wwn};

use crate::fcf::{MAX_FCOE_SIZE, els_code};
use crate::out::{EthBody, EthOut};
use crate::wire::fcoe::decode;
use crate::wire::{
    Descriptor, EtherType, EthernetFrame, EthernetRepr, FcMap, FipFlags, FipOp, FipRepr,
    FipSubcode, MacAddr, VlanTag,
};

/// ENode settings.
#[derive(Debug, Clone)]
pub struct EnodeConfig {
    /// The ENode MAC.
    pub mac: MacAddr,
    /// The node name (Name Identifier descriptor).
    pub node_name: Wwn,
    /// The FCoE VLAN to use (`None`: untagged), and the fallback when
    /// VLAN discovery finds nothing.
    pub vlan: Option<u16>,
    /// Ask FCFs for the FCoE VLAN first (FIP VLAN discovery).
    pub vlan_discovery: bool,
    /// 802.1Q priority of tagged frames (3 by default).
    pub pcp: u8,
    /// Max FCoE size announced (and verified through the FCF).
    pub max_fcoe_size: u16,
    /// Solicitations are repeated this often until an FCF is selected.
    pub solicit_interval: Duration,
    /// How long after a solicitation advertisements are collected.
    pub selection_wait: Duration,
    /// VLAN requests are sent this often, three times.
    pub vlan_request_interval: Duration,
    /// VN_Port keep-alive period (90 s).
    pub vn_keep_alive_period: Duration,
}

impl EnodeConfig {
    /// Defaults for an ENode with `mac` and `node_name`.
    pub fn new(mac: MacAddr, node_name: Wwn, vlan: Option<u16>) -> EnodeConfig {
        EnodeConfig {
            mac,
            node_name,
            vlan,
            vlan_discovery: false,
            pcp: 3,
            max_fcoe_size: MAX_FCOE_SIZE,
            solicit_interval: Duration::from_secs(2),
            selection_wait: Duration::from_millis(300),
            vlan_request_interval: Duration::from_secs(1),
            vn_keep_alive_period: Duration::from_secs(90),
        }
    }
}

/// An FCF the ENode heard from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcfInfo {
    /// FCF-MAC.
    pub mac: MacAddr,
    /// FIP priority.
    pub priority: u8,
    /// Switch name.
    pub switch_name: Wwn,
    /// Fabric name.
    pub fabric_name: Wwn,
    /// FC-MAP.
    pub fc_map: FcMap,
    /// FKA_ADV_PERIOD.
    pub fka_adv_period: Duration,
    /// VN_Ports need not send keep-alives.
    pub no_vn_keep_alives: bool,
    /// Available for logins.
    pub available: bool,
    /// A solicited advertisement padded to our max FCoE size arrived.
    pub verified: bool,
}

/// A VN_Port of this ENode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnodeVnPort {
    /// Address.
    pub fc_id: FcId,
    /// Granted MAC.
    pub mac: MacAddr,
    /// Port name.
    pub port_name: Wwn,
}

/// What the ENode tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnodeEvent {
    /// VLAN discovery chose a VLAN.
    VlanDiscovered(u16),
    /// An FCF was selected; the N_Ports may log in.
    LinkUp(FcfInfo),
    /// The FCF is gone or cleared the links: every login is lost.
    LinkDown {
        /// Why.
        reason: &'static str,
    },
    /// A VN_Port logged in.
    VnPortUp(EnodeVnPort),
    /// A VN_Port logged out or was cleared.
    VnPortDown {
        /// Its address.
        fc_id: FcId,
        /// Why.
        reason: &'static str,
    },
}

/// The ENode's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnodeCounters {
    /// FCoE frames received and delivered.
    pub rx_fcoe: u64,
    /// FCoE frames sent.
    pub tx_fcoe: u64,
    /// Received frames dropped (not from the FCF, not for a VN_Port,
    /// malformed).
    pub dropped: u64,
    /// Frames from the N_Ports dropped because no FCF is selected or no
    /// VN_Port holds their source address.
    pub unsendable: u64,
    /// Solicitations sent.
    pub solicitations: u64,
    /// Keep-alives sent.
    pub keep_alives: u64,
    /// Clear Virtual Links received.
    pub cvl_received: u64,
    /// Times the FCF was lost (advertisements stopped).
    pub fcf_lost: u64,
    /// FCF candidates forgotten to make room for a new one (the list
    /// holds at most `MAX_CANDIDATES`).
    pub candidates_evicted: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Vlan {
        next: Instant,
        tries: u32,
    },
    Soliciting {
        next: Instant,
        decide: Option<Instant>,
    },
    Online,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// `flogi`: the ENode's first login (FLOGI), on which the others
    /// (FDISC) depend.
    Login {
        port_name: Wwn,
        flogi: bool,
    },
    Logo {
        fc_id: FcId,
    },
}

#[derive(Debug)]
struct Selected {
    info: FcfInfo,
    last_adv: Instant,
    next_keep_alive: Instant,
}

#[derive(Debug)]
struct VnPort {
    port: EnodeVnPort,
    next_keep_alive: Instant,
    /// Logged in by FLOGI (the others by FDISC).
    flogi: bool,
}

/// The OX_ID of the LOGO an ENode hands up, as the F_Port's, for a VN_Port
/// a Clear Virtual Links named (the N_Port's answer goes nowhere: the
/// VN_Port is gone).
const CVL_LOGO_OX_ID: u16 = 0xfffd;

/// FCFs an ENode remembers at once (FC-BB-5 sets no number; a segment
/// with more FCFs than this is not a real one).
pub const MAX_CANDIDATES: usize = 64;

/// The ENode state machine.
#[derive(Debug)]
pub struct Enode {
    cfg: EnodeConfig,
    vlan: Option<u16>,
    state: State,
    /// FCFs heard from, and when each last advertised.
    candidates: HashMap<MacAddr, (FcfInfo, Instant)>,
    selected: Option<Selected>,
    vn_ports: HashMap<FcId, VnPort>,
    /// Open fabric logins and logouts by (OX_ID, S_ID): N_Ports sharing
    /// the link pick OX_IDs independently, and a LOGO from one may carry
    /// the OX_ID of another's FDISC.
    pending: HashMap<(OxId, FcId), Pending>,
    out: VecDeque<EthOut>,
    up: VecDeque<Frame>,
    events: VecDeque<EnodeEvent>,
    counters: EnodeCounters,
}

impl Enode {
    /// An ENode starting discovery at `now`.
    pub fn new(cfg: EnodeConfig, now: Instant) -> Enode {
        let state = if cfg.vlan_discovery {
            State::Vlan {
                next: now,
                tries: 0,
            }
        } else {
            State::Soliciting {
                next: now,
                decide: None,
            }
        };
        Enode {
            vlan: cfg.vlan,
            cfg,
            state,
            candidates: HashMap::new(),
            selected: None,
            vn_ports: HashMap::new(),
            pending: HashMap::new(),
            out: VecDeque::new(),
            up: VecDeque::new(),
            events: VecDeque::new(),
            counters: EnodeCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EnodeConfig {
        &self.cfg
    }

    /// The VLAN in use.
    pub fn vlan(&self) -> Option<u16> {
        self.vlan
    }

    /// The selected FCF.
    pub fn fcf(&self) -> Option<&FcfInfo> {
        self.selected.as_ref().map(|s| &s.info)
    }

    /// FCFs heard from.
    pub fn candidates(&self) -> Vec<FcfInfo> {
        let mut v: Vec<FcfInfo> = self.candidates.values().map(|(c, _)| c.clone()).collect();
        v.sort_by_key(|c| (c.priority, c.mac));
        v
    }

    /// The VN_Ports logged in.
    pub fn vn_ports(&self) -> Vec<EnodeVnPort> {
        let mut v: Vec<EnodeVnPort> = self.vn_ports.values().map(|p| p.port.clone()).collect();
        v.sort_by_key(|p| p.fc_id);
        v
    }

    /// The counters.
    pub fn counters(&self) -> EnodeCounters {
        self.counters
    }

    /// The next Ethernet frame to send.
    pub fn poll_transmit(&mut self) -> Option<EthOut> {
        self.out.pop_front()
    }

    /// The next FC frame for the N_Ports.
    pub fn poll_fc(&mut self) -> Option<Frame> {
        self.up.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<EnodeEvent> {
        self.events.pop_front()
    }

    fn tag(&self) -> Option<VlanTag> {
        self.vlan.map(|v| VlanTag {
            pcp: self.cfg.pcp & 7,
            dei: false,
            vid: v,
        })
    }

    fn send_fip(&mut self, dst: MacAddr, src: MacAddr, fip: FipRepr) {
        let eth = EthernetRepr {
            dst,
            src,
            vlan: self.tag(),
            ethertype: EtherType::FIP,
        };
        self.out.push_back(EthOut {
            eth,
            body: EthBody::Fip(fip),
        });
    }

    /// When [`Enode::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Vlan { next, .. } => Some(next),
            State::Soliciting { next, decide } => Some(decide.map_or(next, |d| d.min(next))),
            State::Online => {
                let s = self.selected.as_ref()?;
                let mut t = s
                    .next_keep_alive
                    .min(s.last_adv + s.info.fka_adv_period * 5 / 2);
                if !s.info.no_vn_keep_alives {
                    for v in self.vn_ports.values() {
                        t = t.min(v.next_keep_alive);
                    }
                }
                Some(t)
            }
        }
    }

    /// Runs what is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::Vlan { next, tries } if now >= next => {
                if tries >= 3 {
                    debug!(enode = %self.cfg.mac, "no VLAN notification: using the configured VLAN");
                    self.state = State::Soliciting {
                        next: now,
                        decide: None,
                    };
                    self.handle_timeout(now);
                    return;
                }
                let req = FipRepr::new(
                    FipOp::VLAN,
                    FipSubcode::VLAN_REQUEST,
                    0,
                    vec![
                        Descriptor::MacAddress(self.cfg.mac),
                        Descriptor::NameIdentifier(self.cfg.node_name),
                    ],
                );
                let eth = EthernetRepr {
                    dst: MacAddr::ALL_FCF_MACS,
                    src: self.cfg.mac,
                    vlan: None,
                    ethertype: EtherType::FIP,
                };
                self.out.push_back(EthOut {
                    eth,
                    body: EthBody::Fip(req),
                });
                self.state = State::Vlan {
                    next: now + self.cfg.vlan_request_interval,
                    tries: tries + 1,
                };
            }
            State::Soliciting { next, decide } => {
                if let Some(d) = decide
                    && now >= d
                {
                    self.state = State::Soliciting { next, decide: None };
                    self.select(now);
                    if self.state == State::Online {
                        return;
                    }
                }
                if let State::Soliciting { next, .. } = self.state
                    && now >= next
                {
                    self.solicit(now);
                }
            }
            State::Online => self.online_timeout(now),
            State::Vlan { .. } => {}
        }
    }

    fn solicit(&mut self, now: Instant) {
        let sol = FipRepr::new(
            FipOp::DISCOVERY,
            FipSubcode::SOLICITATION,
            FipFlags::FP,
            vec![
                Descriptor::MacAddress(self.cfg.mac),
                Descriptor::NameIdentifier(self.cfg.node_name),
                Descriptor::MaxFcoeSize(self.cfg.max_fcoe_size),
            ],
        );
        self.send_fip(MacAddr::ALL_FCF_MACS, self.cfg.mac, sol);
        self.counters.solicitations += 1;
        self.state = State::Soliciting {
            next: now + self.cfg.solicit_interval,
            decide: Some(now + self.cfg.selection_wait),
        };
    }

    /// Forgets candidates not heard from for 2.5 × their FKA_ADV_PERIOD
    /// (as the selected FCF is lost), except the selected one, which
    /// `online_timeout` watches.
    fn prune_candidates(&mut self, now: Instant) {
        let selected = self.selected.as_ref().map(|s| s.info.mac);
        self.candidates.retain(|mac, (c, heard)| {
            Some(*mac) == selected
                || now.saturating_duration_since(*heard) < c.fka_adv_period * 5 / 2
        });
    }

    fn select(&mut self, now: Instant) {
        self.prune_candidates(now);
        let best = self
            .candidates
            .values()
            .map(|(c, _)| c)
            .filter(|c| c.available && c.verified)
            .min_by_key(|c| (c.priority, c.mac))
            .cloned();
        let Some(info) = best else {
            return;
        };
        info!(enode = %self.cfg.mac, fcf = %info.mac, priority = info.priority, "FCF selected");
        self.selected = Some(Selected {
            info: info.clone(),
            last_adv: now,
            next_keep_alive: now + info.fka_adv_period,
        });
        self.state = State::Online;
        self.events.push_back(EnodeEvent::LinkUp(info));
    }

    fn online_timeout(&mut self, now: Instant) {
        let Some(s) = self.selected.as_mut() else {
            return;
        };
        if now.saturating_duration_since(s.last_adv) >= s.info.fka_adv_period * 5 / 2 {
            warn!(enode = %self.cfg.mac, fcf = %s.info.mac, "FCF advertisements stopped: FCF lost");
            self.counters.fcf_lost += 1;
            self.candidates.remove(&s.info.mac);
            self.lose(now, "FCF lost (advertisements stopped)");
            return;
        }
        let fcf = s.info.mac;
        let period = s.info.fka_adv_period;
        let vn_ka = !s.info.no_vn_keep_alives;
        if now >= s.next_keep_alive {
            s.next_keep_alive = now + period;
            let ka = FipRepr::new(
                FipOp::CONTROL,
                FipSubcode::KEEP_ALIVE,
                FipFlags::FP,
                vec![Descriptor::MacAddress(self.cfg.mac)],
            );
            self.send_fip(fcf, self.cfg.mac, ka);
            self.counters.keep_alives += 1;
        }
        if vn_ka {
            let due: Vec<EnodeVnPort> = self
                .vn_ports
                .values_mut()
                .filter(|v| now >= v.next_keep_alive)
                .map(|v| {
                    v.next_keep_alive = now + self.cfg.vn_keep_alive_period;
                    v.port.clone()
                })
                .collect();
            for p in due {
                let ka = FipRepr::new(
                    FipOp::CONTROL,
                    FipSubcode::KEEP_ALIVE,
                    FipFlags::FP,
                    vec![
                        Descriptor::MacAddress(self.cfg.mac),
                        Descriptor::VxPortId {
                            mac: p.mac,
                            fc_id: p.fc_id,
                            port_name: p.port_name,
                        },
                    ],
                );
                self.send_fip(fcf, p.mac, ka);
                self.counters.keep_alives += 1;
            }
        }
    }

    /// Every login is lost: report, forget, solicit again.
    fn lose(&mut self, now: Instant, reason: &'static str) {
        let mut ids: Vec<FcId> = self.vn_ports.keys().copied().collect();
        ids.sort();
        self.vn_ports.clear();
        self.pending.clear();
        for fc_id in ids {
            self.events
                .push_back(EnodeEvent::VnPortDown { fc_id, reason });
        }
        if self.selected.take().is_some() {
            self.events.push_back(EnodeEvent::LinkDown { reason });
        }
        self.state = State::Soliciting {
            next: now,
            decide: None,
        };
    }

    /// Handles a received Ethernet frame.
    pub fn handle_ethernet(&mut self, now: Instant, frame: Bytes) {
        let Ok(v) = EthernetFrame::new_checked(&frame[..]) else {
            self.counters.dropped += 1;
            return;
        };
        let eth = EthernetRepr::parse(&v);
        let payload = frame.slice(v.header_len()..);
        match eth.ethertype {
            EtherType::FIP => match FipRepr::parse(&payload) {
                Ok(fip) => self.fip(now, &eth, fip, payload.len()),
                Err(e) => {
                    self.counters.dropped += 1;
                    debug!(src = %eth.src, error = %e, "malformed FIP frame dropped");
                }
            },
            EtherType::FCOE => self.fcoe(&eth, &payload),
            _ => self.counters.dropped += 1,
        }
    }

    fn vlan_ok(&self, eth: &EthernetRepr) -> bool {
        match (eth.vlan, self.vlan) {
            (None, _) => true,
            (Some(t), Some(v)) => t.vid == v,
            (Some(t), None) => t.vid == 0,
        }
    }

    fn fip(&mut self, now: Instant, eth: &EthernetRepr, fip: FipRepr, fip_len: usize) {
        let to_us = eth.dst == self.cfg.mac;
        match (fip.op, fip.subcode) {
            (FipOp::VLAN, FipSubcode::VLAN_NOTIFICATION) if to_us => {
                if let (State::Vlan { .. }, Some(v)) = (self.state, fip.vlans().first().copied()) {
                    info!(enode = %self.cfg.mac, vlan = v, "FCoE VLAN discovered");
                    self.vlan = Some(v);
                    self.events.push_back(EnodeEvent::VlanDiscovered(v));
                    self.state = State::Soliciting {
                        next: now,
                        decide: None,
                    };
                    self.handle_timeout(now);
                }
            }
            (FipOp::DISCOVERY, FipSubcode::ADVERTISEMENT)
                if self.vlan_ok(eth) && (to_us || eth.dst == MacAddr::ALL_ENODE_MACS) =>
            {
                self.advertisement(now, eth, &fip, fip_len);
            }
            (FipOp::LINK_SERVICE, FipSubcode::LS_REPLY) if to_us && self.is_from_fcf(eth) => {
                self.ls_reply(now, &fip);
            }
            // To the ENode MAC only (FC-BB-5, as every FIP frame from an
            // FCF to an ENode; libfcoe drops others): one sent to a
            // VN_Port's MAC or a group address is not the FCF's.
            (FipOp::CONTROL, FipSubcode::CLEAR_VIRTUAL_LINKS) if to_us && self.is_from_fcf(eth) => {
                self.cvl(now, eth, &fip);
            }
            _ => self.counters.dropped += 1,
        }
    }

    fn is_from_fcf(&self, eth: &EthernetRepr) -> bool {
        self.vlan_ok(eth)
            && self
                .selected
                .as_ref()
                .is_some_and(|s| s.info.mac == eth.src)
    }

    fn advertisement(&mut self, now: Instant, eth: &EthernetRepr, fip: &FipRepr, fip_len: usize) {
        if !fip.flags.has(FipFlags::F) || fip.mac() != Some(eth.src) {
            self.counters.dropped += 1;
            return;
        }
        let (Some(priority), Some(switch_name), Some((_, fc_map, fabric_name)), Some((d, ms))) = (
            fip.priority(),
            fip.name_identifier(),
            fip.fabric(),
            fip.fka_adv_period(),
        ) else {
            self.counters.dropped += 1;
            return;
        };
        let solicited = fip.flags.has(FipFlags::S) && eth.dst == self.cfg.mac;
        let verified = solicited && fip_len >= usize::from(self.cfg.max_fcoe_size);
        let period = Duration::from_millis(u64::from(ms.max(250)));
        let mac = eth.src;
        let prev_verified = self.candidates.get(&mac).is_some_and(|(c, _)| c.verified);
        let info = FcfInfo {
            mac,
            priority,
            switch_name,
            fabric_name,
            fc_map,
            fka_adv_period: period,
            no_vn_keep_alives: d,
            available: fip.flags.has(FipFlags::A),
            verified: verified || prev_verified,
        };
        if let Some(s) = self.selected.as_mut()
            && s.info.mac == mac
        {
            s.last_adv = now;
            s.info.fka_adv_period = period;
            s.info.no_vn_keep_alives = d;
        }
        if !self.candidates.contains_key(&mac) && self.candidates.len() >= MAX_CANDIDATES {
            // Any host on the segment can advertise from fresh MACs: the
            // list is bounded. Stale candidates go first, then the one
            // heard from longest ago (never the selected FCF).
            self.prune_candidates(now);
            if self.candidates.len() >= MAX_CANDIDATES {
                let selected = self.selected.as_ref().map(|s| s.info.mac);
                let oldest = self
                    .candidates
                    .iter()
                    .filter(|(m, _)| Some(**m) != selected)
                    .min_by_key(|(_, (_, heard))| *heard)
                    .map(|(m, _)| *m);
                if let Some(m) = oldest {
                    self.candidates.remove(&m);
                    self.counters.candidates_evicted += 1;
                }
            }
        }
        self.candidates.insert(mac, (info, now));
    }

    fn ls_reply(&mut self, now: Instant, fip: &FipRepr) {
        let Some((_, fc)) = fip.link_service() else {
            self.counters.dropped += 1;
            return;
        };
        let Ok(frame) = Frame::parse(fc.clone(), Sof::I3, Eof::T) else {
            self.counters.dropped += 1;
            return;
        };
        let h = frame.header;
        // A LOGO is answered to the address it logged out; a login to the
        // address it was given, having been asked from 00.00.00.
        let Some(p) = self
            .pending
            .remove(&(h.ox_id, h.d_id))
            .or_else(|| self.pending.remove(&(h.ox_id, FcId::UNIDENTIFIED)))
        else {
            self.counters.dropped += 1;
            return;
        };
        let accepted = frame.payload.first() == Some(&els_code::LS_ACC);
        let Some(fcf) = self.selected.as_ref().map(|s| s.info.clone()) else {
            return;
        };
        match p {
            Pending::Login { port_name, flogi } if accepted => {
                let fc_id = h.d_id;
                let granted = fip.mac().unwrap_or(MacAddr::ZERO);
                let mac = if granted == MacAddr::ZERO {
                    MacAddr::fpma(fcf.fc_map, fc_id)
                } else {
                    granted
                };
                if !mac.is_unicast() {
                    self.counters.dropped += 1;
                    return;
                }
                let port = EnodeVnPort {
                    fc_id,
                    mac,
                    port_name,
                };
                info!(enode = %self.cfg.mac, %fc_id, %mac, wwpn = %port_name, "VN_Port logged in");
                self.vn_ports.insert(
                    fc_id,
                    VnPort {
                        port: port.clone(),
                        next_keep_alive: now + self.cfg.vn_keep_alive_period,
                        flogi,
                    },
                );
                self.events.push_back(EnodeEvent::VnPortUp(port));
            }
            Pending::Logo { fc_id } => {
                if self.vn_ports.remove(&fc_id).is_some() {
                    self.events.push_back(EnodeEvent::VnPortDown {
                        fc_id,
                        reason: "LOGO",
                    });
                }
                // An N_Port does not wait for the answer to its fabric
                // LOGO (it is offline at once, and an NPIV port is gone);
                // handed up, the answer could only be mistaken for the
                // reply to another port's login with the same OX_ID.
                return;
            }
            Pending::Login { .. } => {}
        }
        self.up.push_back(frame);
    }

    fn cvl(&mut self, now: Instant, eth: &EthernetRepr, fip: &FipRepr) {
        let Some(s) = self.selected.as_ref() else {
            return;
        };
        let name_ok = fip
            .name_identifier()
            .is_none_or(|n| n == s.info.switch_name);
        if fip.mac() != Some(eth.src) || !name_ok {
            self.counters.dropped += 1;
            return;
        }
        let listed = fip.vx_ports();
        let cleared: Vec<FcId> = listed
            .iter()
            .filter(|(mac, id, _)| self.vn_ports.get(id).is_some_and(|v| v.port.mac == *mac))
            .map(|(_, id, _)| *id)
            .collect();
        if !listed.is_empty() && cleared.is_empty() {
            return;
        }
        self.counters.cvl_received += 1;
        // No VN_Port named, or the one logged in by FLOGI (the others hang
        // on it): every virtual link goes, and discovery starts over
        // (FC-BB-5; libfcoe resets the whole controller the same way).
        let all = listed.is_empty()
            || cleared
                .iter()
                .any(|id| self.vn_ports.get(id).is_some_and(|v| v.flogi));
        if all {
            warn!(enode = %self.cfg.mac, fcf = %eth.src, "Clear Virtual Links received");
            self.lose(now, "Clear Virtual Links");
            return;
        }
        // Only NPIV VN_Ports named: those alone go. The N_Port above each
        // hears it as the F_Port's LOGO (an implicit fabric logout) and
        // logs in again by FDISC; the host ports beside it are untouched.
        for fc_id in cleared {
            let Some(v) = self.vn_ports.remove(&fc_id) else {
                continue;
            };
            warn!(enode = %self.cfg.mac, fcf = %eth.src, %fc_id, wwpn = %v.port.port_name,
                "Clear Virtual Links for one VN_Port");
            self.pending.retain(|(_, id), _| *id != fc_id);
            self.events.push_back(EnodeEvent::VnPortDown {
                fc_id,
                reason: "Clear Virtual Links",
            });
            if let Ok(logo) = compose::els(
                Route::request(FcId::LOGIN_SERVER, fc_id, OxId(CVL_LOGO_OX_ID)),
                &ElsRepr::Logo(Logo {
                    n_port_id: FcId::LOGIN_SERVER,
                    port_name: s.info.switch_name,
                }),
            ) {
                self.up.push_back(logo);
            }
        }
    }

    fn fcoe(&mut self, eth: &EthernetRepr, payload: &Bytes) {
        if !self.is_from_fcf(eth) {
            self.counters.dropped += 1;
            return;
        }
        let Ok(frame) = decode(payload) else {
            self.counters.dropped += 1;
            return;
        };
        match self.vn_ports.get(&frame.header.d_id) {
            Some(v) if v.port.mac == eth.dst => {
                self.counters.rx_fcoe += 1;
                self.up.push_back(frame);
            }
            _ => self.counters.dropped += 1,
        }
    }

    /// Handles a frame an N_Port above sends.
    pub fn handle_fc(&mut self, _now: Instant, frame: Frame) {
        let Some(fcf) = self.selected.as_ref().map(|s| s.info.mac) else {
            self.counters.unsendable += 1;
            return;
        };
        let h = frame.header;
        let code = frame.payload.first().copied();
        let login_server = h.d_id == FcId::LOGIN_SERVER
            && h.r_ctl == RCtl::ELS_REQUEST
            && h.fc_type == FcType::ELS;
        if login_server
            && matches!(
                code,
                Some(els_code::FLOGI | els_code::FDISC | els_code::LOGO)
            )
        {
            let mut fc = Vec::with_capacity(HEADER_LEN + frame.payload.len());
            frame.write_to(&mut fc);
            let fc = Bytes::from(fc);
            let p = &frame.payload;
            let (d, mac, pending) = match code {
                Some(els_code::LOGO) => {
                    let Some(v) = self.vn_ports.get(&h.s_id) else {
                        self.counters.unsendable += 1;
                        return;
                    };
                    (
                        Descriptor::Logo(fc),
                        v.port.mac,
                        Pending::Logo { fc_id: h.s_id },
                    )
                }
                Some(els_code::FDISC) => (
                    Descriptor::Fdisc(fc),
                    MacAddr::ZERO,
                    Pending::Login {
                        port_name: wwn_at(p, 20),
                        flogi: false,
                    },
                ),
                _ => (
                    Descriptor::Flogi(fc),
                    MacAddr::ZERO,
                    Pending::Login {
                        port_name: wwn_at(p, 20),
                        flogi: true,
                    },
                ),
            };
            self.pending.insert((h.ox_id, h.s_id), pending);
            let req = FipRepr::new(
                FipOp::LINK_SERVICE,
                FipSubcode::LS_REQUEST,
                FipFlags::FP,
                vec![d, Descriptor::MacAddress(mac)],
            );
            self.send_fip(fcf, self.cfg.mac, req);
            return;
        }
        let Some(v) = self.vn_ports.get(&h.s_id) else {
            self.counters.unsendable += 1;
            return;
        };
        let eth = EthernetRepr {
            dst: fcf,
            src: v.port.mac,
            vlan: self.tag(),
            ethertype: EtherType::FCOE,
        };
        self.counters.tx_fcoe += 1;
        self.out.push_back(EthOut {
            eth,
            body: EthBody::Fcoe(frame),
        });
    }
}

fn wwn_at(b: &[u8], at: usize) -> Wwn {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(Wwn(0), |a| Wwn(u64::from_be_bytes(a)))
}
