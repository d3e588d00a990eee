//! The Fibre Channel Forwarder (FC-BB-6 §7.8, the FCF side of FIP and
//! FCoE), sans-IO.
//!
//! The FCF sits between an Ethernet segment and a software fabric. Each
//! ENode that logs in gets a VF_Port of its own ([`VfPortId`]); the io
//! layer attaches a fabric port for it when [`FcfEvent::VfPortUp`] comes
//! out and detaches it on [`FcfEvent::VfPortDown`]. FIP FLOGI, FDISC and
//! LOGO requests are unwrapped and handed to the fabric's login server;
//! its replies come back through [`Fcf::handle_fabric`] and go out as FIP
//! replies carrying the granted fabric-provided MAC address (FPMA).
//!
//! Decisions:
//!
//! - FPMA only (the FP flag): a granted address is always FC-MAP ‖ FC_ID.
//! - Every FCoE frame from an ENode must come from the MAC address of the
//!   VN_Port its S_ID names, on that ENode's VF_Port; anything else is
//!   dropped and counted (`spoofed`).
//! - Logins are rate-limited per ENode (a token bucket, [`FcfConfig::login_burst`]
//!   and [`FcfConfig::login_refill`]) with a bound on outstanding
//!   requests, on ENodes and on VN_Ports per ENode: a flood is dropped and
//!   counted (`login_limited`), never queued.
//! - An ENode whose keep-alives stop for 2.5 × FKA_ADV_PERIOD loses its
//!   VF_Port (every VN_Port is logged out of the fabric) and gets a Clear
//!   Virtual Links; a VN_Port whose keep-alives stop for 2.5 × 90 s is
//!   logged out alone (LOGO to the login server on its behalf) and
//!   cleared.
//! - With a VLAN configured, FCoE and FIP go out tagged (priority
//!   [`FcfConfig::pcp`]); frames arrive tagged with that VLAN or untagged
//!   (an AF_PACKET socket sees them with the tag already removed by the
//!   kernel). VLAN notifications answer untagged, as VLAN requests come.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, info, warn};
use unifab_fc::compose::{self, Route};
use unifab_fc::wire::els::{ElsRepr, Logo};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{Eof, FcType, HEADER_LEN, OxId, RCtl, Sof};
use unifab_fc::{FcId, Wwn};

use crate::out::{EthBody, EthOut};
use crate::wire::fcoe::decode;
use crate::wire::{
    Descriptor, DescriptorType, EtherType, EthernetFrame, EthernetRepr, FcMap, FipFlags, FipOp,
    FipRepr, FipSubcode, MacAddr, VlanTag,
};

/// ELS command codes the FCF looks at.
pub(crate) mod els_code {
    pub const LS_ACC: u8 = 0x02;
    pub const FLOGI: u8 = 0x04;
    pub const LOGO: u8 = 0x05;
    pub const FDISC: u8 = 0x51;
}

/// The largest FCoE frame unifab accepts, as the Max FCoE Size descriptor
/// counts it (encapsulation, FC header, 2,112-byte payload, trailer).
pub const MAX_FCOE_SIZE: u16 = 2158;

/// FCF settings.
#[derive(Debug, Clone)]
pub struct FcfConfig {
    /// The FCF-MAC.
    pub mac: MacAddr,
    /// The FCoE VLAN (`None`: untagged).
    pub vlan: Option<u16>,
    /// 802.1Q priority of tagged frames (3 by default).
    pub pcp: u8,
    /// FIP priority advertised (lower is preferred; 128 by default).
    pub priority: u8,
    /// FC-MAP of the FPMAs granted.
    pub fc_map: FcMap,
    /// Switch name (Name Identifier descriptor).
    pub switch_name: Wwn,
    /// Fabric name (Fabric descriptor).
    pub fabric_name: Wwn,
    /// Virtual fabric identifier advertised.
    pub vf_id: u16,
    /// FKA_ADV_PERIOD: multicast advertisements and ENode keep-alives.
    pub fka_adv_period: Duration,
    /// VN_Port keep-alive period (FC-BB-6: 90 s).
    pub vn_keep_alive_period: Duration,
    /// Advertise the D bit (VN_Ports need not send keep-alives).
    pub no_vn_keep_alives: bool,
    /// Accepting logins (the A flag).
    pub available: bool,
    /// ENodes with a VF_Port at most.
    pub max_enodes: usize,
    /// VN_Ports per ENode at most (FLOGI + FDISCs).
    pub max_vn_ports_per_enode: usize,
    /// Login requests an ENode may send in a burst.
    pub login_burst: u32,
    /// One login token comes back per this period.
    pub login_refill: Duration,
    /// Unanswered login requests per ENode at most.
    pub max_pending_logins: usize,
    /// How long a login request waits for the fabric's answer.
    pub login_timeout: Duration,
}

impl FcfConfig {
    /// Defaults for an FCF with `mac` on `vlan`.
    pub fn new(mac: MacAddr, vlan: Option<u16>, switch_name: Wwn) -> FcfConfig {
        FcfConfig {
            mac,
            vlan,
            pcp: 3,
            priority: 128,
            fc_map: FcMap::DEFAULT,
            switch_name,
            fabric_name: switch_name,
            vf_id: 0,
            fka_adv_period: Duration::from_secs(8),
            vn_keep_alive_period: Duration::from_secs(90),
            no_vn_keep_alives: false,
            available: true,
            max_enodes: 256,
            max_vn_ports_per_enode: 64,
            // An initiator gateway opens an NPIV port per host session
            // (FDISC) and closes it at the session's end (LOGO): a test
            // suite churns a few per second, a flood thousands.
            login_burst: 32,
            login_refill: Duration::from_millis(50),
            max_pending_logins: 8,
            login_timeout: Duration::from_secs(10),
        }
    }
}

/// The FCF's number for an ENode's VF_Port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VfPortId(pub u32);

/// What the FCF tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FcfEvent {
    /// An ENode needs a fabric port: attach one before handing frames
    /// for `vf` to the fabric.
    VfPortUp {
        /// The VF_Port.
        vf: VfPortId,
        /// The ENode's MAC.
        enode: MacAddr,
    },
    /// The VF_Port is gone: detach its fabric port (every login on it ends).
    VfPortDown {
        /// The VF_Port.
        vf: VfPortId,
        /// The ENode's MAC.
        enode: MacAddr,
        /// Why.
        reason: &'static str,
    },
    /// A VN_Port logged in.
    LoggedIn(VnPortView),
    /// A VN_Port logged out or was logged out.
    LoggedOut {
        /// Its view at the time.
        port: VnPortView,
        /// Why.
        reason: &'static str,
    },
}

/// A VN_Port behind the FCF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnPortView {
    /// The ENode's VF_Port.
    pub vf: VfPortId,
    /// The ENode's MAC.
    pub enode: MacAddr,
    /// The VN_Port's (granted) MAC.
    pub mac: MacAddr,
    /// Its address.
    pub fc_id: FcId,
    /// Its port name.
    pub port_name: Wwn,
    /// Its node name.
    pub node_name: Wwn,
    /// Logged in with FDISC (NPIV).
    pub npiv: bool,
}

/// The FCF's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FcfCounters {
    /// FIP frames received.
    pub rx_fip: u64,
    /// FCoE frames received and forwarded to the fabric.
    pub rx_fcoe: u64,
    /// FCoE frames sent to VN_Ports.
    pub tx_fcoe: u64,
    /// FIP frames that did not parse (wrong descriptor lengths, …).
    pub malformed_fip: u64,
    /// FIP frames parsed but not acceptable (missing descriptors, a MAC
    /// descriptor contradicting the source, an FCF's own messages).
    pub refused_fip: u64,
    /// FCoE frames that did not decode (CRC, delimiters, version).
    pub bad_fcoe: u64,
    /// FCoE frames whose source MAC is not the VN_Port's their S_ID names.
    pub spoofed: u64,
    /// Frames on another VLAN, or not addressed to the FCF.
    pub not_ours: u64,
    /// Login requests dropped by the rate limit or a resource bound.
    pub login_limited: u64,
    /// Logins granted.
    pub logins: u64,
    /// Keep-alive timeouts (ENode or VN_Port).
    pub keep_alive_timeouts: u64,
    /// Clear Virtual Links sent.
    pub cvl_sent: u64,
    /// Advertisements sent (multicast and solicited).
    pub advertisements: u64,
    /// Frames from the fabric for no known VN_Port.
    pub undeliverable: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginKind {
    Flogi,
    Fdisc,
    Logo,
}

#[derive(Debug, Clone)]
struct PendingLogin {
    kind: LoginKind,
    port_name: Wwn,
    node_name: Wwn,
    logo_of: FcId,
    deadline: Instant,
}

#[derive(Debug)]
struct Enode {
    vf: VfPortId,
    last_keep_alive: Instant,
    tokens: u32,
    last_refill: Instant,
    /// Open requests by (OX_ID, S_ID) (see the ENode's note).
    pending: HashMap<(OxId, FcId), PendingLogin>,
}

#[derive(Debug, Clone)]
struct VnPort {
    view: VnPortView,
    last_keep_alive: Instant,
}

/// The FCF state machine.
#[derive(Debug)]
pub struct Fcf {
    cfg: FcfConfig,
    enodes: HashMap<MacAddr, Enode>,
    vn_ports: HashMap<FcId, VnPort>,
    next_vf: u32,
    next_adv: Instant,
    next_ox: u16,
    out: VecDeque<EthOut>,
    to_fabric: VecDeque<(VfPortId, Frame)>,
    events: VecDeque<FcfEvent>,
    counters: FcfCounters,
}

fn els_code(frame: &[u8]) -> Option<u8> {
    frame.get(HEADER_LEN).copied()
}

fn wwn_at(b: &[u8], at: usize) -> Wwn {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(Wwn(0), |a| Wwn(u64::from_be_bytes(a)))
}

impl Fcf {
    /// An FCF; the first multicast advertisement goes out at once.
    pub fn new(cfg: FcfConfig, now: Instant) -> Fcf {
        Fcf {
            cfg,
            enodes: HashMap::new(),
            vn_ports: HashMap::new(),
            next_vf: 1,
            next_adv: now,
            next_ox: 0x8000,
            out: VecDeque::new(),
            to_fabric: VecDeque::new(),
            events: VecDeque::new(),
            counters: FcfCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FcfConfig {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> FcfCounters {
        self.counters
    }

    /// Every VN_Port logged in through the FCF, by address.
    pub fn vn_ports(&self) -> Vec<VnPortView> {
        let mut v: Vec<VnPortView> = self.vn_ports.values().map(|p| p.view.clone()).collect();
        v.sort_by_key(|p| p.fc_id);
        v
    }

    /// ENodes with a VF_Port.
    pub fn enodes(&self) -> Vec<(MacAddr, VfPortId)> {
        let mut v: Vec<(MacAddr, VfPortId)> = self.enodes.iter().map(|(m, e)| (*m, e.vf)).collect();
        v.sort();
        v
    }

    /// The next Ethernet frame to send.
    pub fn poll_transmit(&mut self) -> Option<EthOut> {
        self.out.pop_front()
    }

    /// The next FC frame for the fabric, and the VF_Port it enters by.
    pub fn poll_fabric(&mut self) -> Option<(VfPortId, Frame)> {
        self.to_fabric.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<FcfEvent> {
        self.events.pop_front()
    }

    /// When [`Fcf::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.next_adv;
        let enode_limit = self.enode_timeout();
        for e in self.enodes.values() {
            t = t.min(e.last_keep_alive + enode_limit);
            for p in e.pending.values() {
                t = t.min(p.deadline);
            }
        }
        if !self.cfg.no_vn_keep_alives {
            let vn_limit = self.vn_timeout();
            for v in self.vn_ports.values() {
                t = t.min(v.last_keep_alive + vn_limit);
            }
        }
        Some(t)
    }

    fn enode_timeout(&self) -> Duration {
        self.cfg.fka_adv_period * 5 / 2
    }

    fn vn_timeout(&self) -> Duration {
        self.cfg.vn_keep_alive_period * 5 / 2
    }

    fn tag(&self) -> Option<VlanTag> {
        self.cfg.vlan.map(|v| VlanTag {
            pcp: self.cfg.pcp & 7,
            dei: false,
            vid: v,
        })
    }

    fn eth(&self, dst: MacAddr, ethertype: EtherType) -> EthernetRepr {
        EthernetRepr {
            dst,
            src: self.cfg.mac,
            vlan: self.tag(),
            ethertype,
        }
    }

    fn send_fip(&mut self, dst: MacAddr, fip: FipRepr) {
        let eth = self.eth(dst, EtherType::FIP);
        self.out.push_back(EthOut {
            eth,
            body: EthBody::Fip(fip),
        });
    }

    fn advertisement(&self, solicited: bool) -> FipRepr {
        let mut flags = FipFlags::FP | FipFlags::F;
        if self.cfg.available {
            flags |= FipFlags::A;
        }
        if solicited {
            flags |= FipFlags::S;
        }
        let period = u32::try_from(self.cfg.fka_adv_period.as_millis()).unwrap_or(u32::MAX);
        FipRepr::new(
            FipOp::DISCOVERY,
            FipSubcode::ADVERTISEMENT,
            flags,
            vec![
                Descriptor::Priority(self.cfg.priority),
                Descriptor::MacAddress(self.cfg.mac),
                Descriptor::NameIdentifier(self.cfg.switch_name),
                Descriptor::Fabric {
                    vf_id: self.cfg.vf_id,
                    fc_map: self.cfg.fc_map,
                    fabric_name: self.cfg.fabric_name,
                },
                Descriptor::FkaAdvPeriod {
                    no_vn_keep_alives: self.cfg.no_vn_keep_alives,
                    period_ms: period,
                },
            ],
        )
    }

    /// Runs what is due: multicast advertisements, keep-alive supervision,
    /// login timeouts.
    pub fn handle_timeout(&mut self, now: Instant) {
        if now >= self.next_adv {
            let adv = self.advertisement(false);
            self.send_fip(MacAddr::ALL_ENODE_MACS, adv);
            self.counters.advertisements += 1;
            self.next_adv = now + self.cfg.fka_adv_period;
        }
        let limit = self.enode_timeout();
        let dead: Vec<MacAddr> = self
            .enodes
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.last_keep_alive) >= limit)
            .map(|(m, _)| *m)
            .collect();
        for m in dead {
            warn!(enode = %m, "ENode keep-alives stopped: implicit logout");
            self.counters.keep_alive_timeouts += 1;
            self.drop_enode(m, "ENode keep-alive timeout", true);
        }
        for e in self.enodes.values_mut() {
            e.pending.retain(|_, p| p.deadline > now);
        }
        if !self.cfg.no_vn_keep_alives {
            let limit = self.vn_timeout();
            let dead: Vec<FcId> = self
                .vn_ports
                .values()
                .filter(|v| now.saturating_duration_since(v.last_keep_alive) >= limit)
                .map(|v| v.view.fc_id)
                .collect();
            for id in dead {
                warn!(fc_id = %id, "VN_Port keep-alives stopped: implicit logout");
                self.counters.keep_alive_timeouts += 1;
                self.drop_vn_port(id, "VN_Port keep-alive timeout", true);
            }
        }
    }

    /// Sends Clear Virtual Links to an ENode for every VN_Port it has and
    /// logs them all out (the operator's `clear`, or a shutdown).
    pub fn clear_virtual_links(&mut self, enode: MacAddr) {
        self.drop_enode(enode, "cleared by the FCF", true);
    }

    /// Sends Clear Virtual Links for one VN_Port to its ENode and logs it
    /// out of the fabric; its ENode's other VN_Ports stay. False if no
    /// VN_Port has that address.
    pub fn clear_vn_port(&mut self, fc_id: FcId) -> bool {
        if !self.vn_ports.contains_key(&fc_id) {
            return false;
        }
        self.drop_vn_port(fc_id, "cleared by the FCF", true);
        true
    }

    /// Clears every ENode (shutdown).
    pub fn clear_all(&mut self) {
        let all: Vec<MacAddr> = self.enodes.keys().copied().collect();
        for m in all {
            self.drop_enode(m, "FCF shutting down", true);
        }
    }

    fn cvl(&mut self, enode: MacAddr, ports: &[VnPortView]) {
        let mut d = vec![
            Descriptor::MacAddress(self.cfg.mac),
            Descriptor::NameIdentifier(self.cfg.switch_name),
        ];
        for p in ports {
            d.push(Descriptor::VxPortId {
                mac: p.mac,
                fc_id: p.fc_id,
                port_name: p.port_name,
            });
        }
        let fip = FipRepr::new(
            FipOp::CONTROL,
            FipSubcode::CLEAR_VIRTUAL_LINKS,
            FipFlags::FP,
            d,
        );
        self.counters.cvl_sent += 1;
        // To the ENode's MAC, as every FIP frame from an FCF to an ENode
        // (FC-BB-5): the VN_Ports to clear are in the descriptors.
        // Linux's libfcoe drops FIP frames addressed to anything else (a
        // VN_Port's FPMA included), and so ignored a CVL sent there.
        self.send_fip(enode, fip);
    }

    fn drop_enode(&mut self, enode: MacAddr, reason: &'static str, send_cvl: bool) {
        let Some(e) = self.enodes.remove(&enode) else {
            return;
        };
        let ports: Vec<VnPortView> = self
            .vn_ports
            .values()
            .filter(|v| v.view.enode == enode)
            .map(|v| v.view.clone())
            .collect();
        for p in &ports {
            self.vn_ports.remove(&p.fc_id);
        }
        if send_cvl {
            self.cvl(enode, &ports);
        }
        for port in ports {
            self.events.push_back(FcfEvent::LoggedOut { port, reason });
        }
        self.events.push_back(FcfEvent::VfPortDown {
            vf: e.vf,
            enode,
            reason,
        });
    }

    fn drop_vn_port(&mut self, fc_id: FcId, reason: &'static str, send_cvl: bool) {
        let Some(v) = self.vn_ports.remove(&fc_id) else {
            return;
        };
        if send_cvl {
            self.cvl(v.view.enode, std::slice::from_ref(&v.view));
        }
        // The fabric forgets the login: LOGO from the VN_Port's address.
        let ox = OxId(self.next_ox);
        self.next_ox = if self.next_ox >= 0xfffe {
            0x8000
        } else {
            self.next_ox + 1
        };
        let logo = ElsRepr::Logo(Logo {
            n_port_id: fc_id,
            port_name: v.view.port_name,
        });
        if let Ok(f) = compose::els(Route::request(fc_id, FcId::LOGIN_SERVER, ox), &logo) {
            self.to_fabric.push_back((v.view.vf, f));
        }
        self.events.push_back(FcfEvent::LoggedOut {
            port: v.view,
            reason,
        });
    }

    /// Handles a received Ethernet frame.
    pub fn handle_ethernet(&mut self, now: Instant, frame: Bytes) {
        let Ok(v) = EthernetFrame::new_checked(&frame[..]) else {
            self.counters.not_ours += 1;
            return;
        };
        let eth = EthernetRepr::parse(&v);
        let vlan_ok = match (eth.vlan, self.cfg.vlan) {
            (None, _) => true,
            (Some(t), Some(ours)) => t.vid == ours,
            (Some(t), None) => t.vid == 0,
        };
        if !vlan_ok {
            self.counters.not_ours += 1;
            return;
        }
        let payload = frame.slice(v.header_len()..);
        match eth.ethertype {
            EtherType::FIP => {
                self.counters.rx_fip += 1;
                match FipRepr::parse(&payload) {
                    Ok(fip) => self.fip(now, &eth, fip),
                    Err(e) => {
                        self.counters.malformed_fip += 1;
                        debug!(src = %eth.src, error = %e, "malformed FIP frame dropped");
                    }
                }
            }
            EtherType::FCOE => self.fcoe(&eth, &payload),
            _ => self.counters.not_ours += 1,
        }
    }

    fn refuse(&mut self, eth: &EthernetRepr, why: &str) {
        self.counters.refused_fip += 1;
        debug!(src = %eth.src, why, "FIP frame refused");
    }

    fn fip(&mut self, now: Instant, eth: &EthernetRepr, fip: FipRepr) {
        let from_fcf = fip.flags.has(FipFlags::F);
        let for_us = eth.dst == self.cfg.mac
            || eth.dst == MacAddr::ALL_FCF_MACS
            || eth.dst == MacAddr::BROADCAST;
        if from_fcf || !for_us || !eth.src.is_unicast() {
            // Another FCF's advertisements, ENode-bound multicast: not ours.
            self.counters.not_ours += 1;
            return;
        }
        // Every ENode message names the ENode's MAC, which must be the
        // sender's — except link service requests, whose MAC descriptor
        // proposes the VN_Port's address (zero for FPMA).
        // VN_Port keep-alives come from the VN_Port's MAC (checked below).
        let ls = fip.op == FipOp::LINK_SERVICE;
        let vn_ka = fip.op == FipOp::CONTROL && !fip.vx_ports().is_empty();
        if !ls && !vn_ka && fip.mac() != Some(eth.src) {
            self.refuse(eth, "MAC descriptor missing or not the sender's");
            return;
        }
        match (fip.op, fip.subcode) {
            (FipOp::VLAN, FipSubcode::VLAN_REQUEST) => {
                let Some(vlan) = self.cfg.vlan else {
                    // No FCoE VLAN to report: FCoE runs untagged here.
                    return;
                };
                let reply = FipRepr::new(
                    FipOp::VLAN,
                    FipSubcode::VLAN_NOTIFICATION,
                    0,
                    vec![Descriptor::MacAddress(self.cfg.mac), Descriptor::Vlan(vlan)],
                );
                let eth_out = EthernetRepr {
                    dst: eth.src,
                    src: self.cfg.mac,
                    vlan: eth.vlan,
                    ethertype: EtherType::FIP,
                };
                self.out.push_back(EthOut {
                    eth: eth_out,
                    body: EthBody::Fip(reply),
                });
            }
            (FipOp::DISCOVERY, FipSubcode::SOLICITATION) => {
                if fip.name_identifier().is_none() {
                    self.refuse(eth, "solicitation without a name identifier");
                    return;
                }
                let mut adv = self.advertisement(true);
                // Padded to the ENode's max FCoE size, so that the ENode
                // learns the path carries frames that large.
                let max = fip
                    .max_fcoe_size()
                    .unwrap_or(MAX_FCOE_SIZE)
                    .min(MAX_FCOE_SIZE);
                let header = self.eth(eth.src, EtherType::FIP).header_len();
                adv.pad_to(header, header + usize::from(max));
                self.counters.advertisements += 1;
                self.send_fip(eth.src, adv);
            }
            (FipOp::LINK_SERVICE, FipSubcode::LS_REQUEST) => self.ls_request(now, eth, &fip),
            (FipOp::CONTROL, FipSubcode::KEEP_ALIVE) => self.keep_alive(now, eth, &fip),
            _ => self.refuse(eth, "not a message an FCF accepts from an ENode"),
        }
    }

    fn keep_alive(&mut self, now: Instant, eth: &EthernetRepr, fip: &FipRepr) {
        let Some(enode) = fip.mac() else {
            self.refuse(eth, "keep-alive without the ENode's MAC");
            return;
        };
        let Some(e) = self.enodes.get_mut(&enode) else {
            self.refuse(eth, "keep-alive from an ENode without a login");
            return;
        };
        let vx = fip.vx_ports();
        match vx.as_slice() {
            [] if enode == eth.src => e.last_keep_alive = now,
            [] => {
                self.refuse(eth, "ENode keep-alive not from the ENode's MAC");
            }
            [(mac, fc_id, _)] => {
                let ok = *mac == eth.src
                    && self
                        .vn_ports
                        .get(fc_id)
                        .is_some_and(|v| v.view.enode == enode && v.view.mac == *mac);
                match self.vn_ports.get_mut(fc_id) {
                    Some(v) if ok => v.last_keep_alive = now,
                    _ => {
                        // A VN_Port the FCF does not know: tell the ENode.
                        let ghost = VnPortView {
                            vf: VfPortId(0),
                            enode,
                            mac: *mac,
                            fc_id: *fc_id,
                            port_name: vx.first().map_or(Wwn(0), |x| x.2),
                            node_name: Wwn(0),
                            npiv: false,
                        };
                        self.refuse(eth, "keep-alive for an unknown VN_Port");
                        self.cvl(enode, &[ghost]);
                    }
                }
            }
            _ => self.refuse(eth, "keep-alive with several VN_Ports"),
        }
    }

    fn ls_request(&mut self, now: Instant, eth: &EthernetRepr, fip: &FipRepr) {
        let Some((ty, fc)) = fip.link_service() else {
            self.refuse(eth, "link service request without an FLOGI/FDISC/LOGO");
            return;
        };
        let kind = match (ty, els_code(fc)) {
            (DescriptorType::FLOGI, Some(els_code::FLOGI)) => LoginKind::Flogi,
            (DescriptorType::FDISC, Some(els_code::FDISC)) => LoginKind::Fdisc,
            (DescriptorType::LOGO, Some(els_code::LOGO)) => LoginKind::Logo,
            _ => {
                self.refuse(eth, "link service descriptor and ELS disagree (or ELP)");
                return;
            }
        };
        let frame = match Frame::parse(fc.clone(), Sof::I3, Eof::T) {
            Ok(f) => f,
            Err(_) => {
                self.refuse(eth, "encapsulated frame does not parse");
                return;
            }
        };
        let h = frame.header;
        if h.d_id != FcId::LOGIN_SERVER || h.r_ctl != RCtl::ELS_REQUEST || h.fc_type != FcType::ELS
        {
            self.refuse(eth, "link service not addressed to the login server");
            return;
        }
        if kind != LoginKind::Logo && h.s_id != FcId::UNIDENTIFIED {
            self.refuse(eth, "fabric login with a source address");
            return;
        }
        let own = self
            .vn_ports
            .get(&h.s_id)
            .is_some_and(|v| v.view.enode == eth.src);
        if kind == LoginKind::Logo && !own {
            self.refuse(eth, "LOGO for a VN_Port of another ENode");
            return;
        }
        // Resources and rate.
        let enode_count = self.enodes.len();
        let vn_count = self
            .vn_ports
            .values()
            .filter(|v| v.view.enode == eth.src)
            .count();
        let cfg = &self.cfg;
        if !cfg.available && kind != LoginKind::Logo {
            self.counters.login_limited += 1;
            return;
        }
        let new_enode = !self.enodes.contains_key(&eth.src);
        if new_enode {
            if kind != LoginKind::Flogi || enode_count >= cfg.max_enodes {
                self.counters.login_limited += 1;
                return;
            }
            let vf = VfPortId(self.next_vf);
            self.next_vf += 1;
            self.enodes.insert(
                eth.src,
                Enode {
                    vf,
                    last_keep_alive: now,
                    tokens: cfg.login_burst,
                    last_refill: now,
                    pending: HashMap::new(),
                },
            );
            info!(enode = %eth.src, vf = vf.0, "ENode attached (VF_Port up)");
            self.events
                .push_back(FcfEvent::VfPortUp { vf, enode: eth.src });
        }
        let max_vn = cfg.max_vn_ports_per_enode;
        let max_pending = cfg.max_pending_logins;
        let refill = cfg.login_refill.max(Duration::from_micros(1));
        let burst = cfg.login_burst;
        let login_timeout = cfg.login_timeout;
        let Some(e) = self.enodes.get_mut(&eth.src) else {
            return;
        };
        refill_tokens(&mut e.tokens, &mut e.last_refill, now, refill, burst);
        let over = kind != LoginKind::Logo
            && (e.tokens == 0
                || e.pending.len() >= max_pending
                || (kind == LoginKind::Fdisc && vn_count >= max_vn));
        if over {
            self.counters.login_limited += 1;
            debug!(enode = %eth.src, "login request limited");
            return;
        }
        if kind != LoginKind::Logo {
            e.tokens -= 1;
        }
        e.last_keep_alive = now;
        let p = &frame.payload;
        let (port_name, node_name, logo_of) = match kind {
            LoginKind::Logo => (wwn_at(p, 8), Wwn(0), h.s_id),
            _ => (wwn_at(p, 20), wwn_at(p, 28), FcId::UNIDENTIFIED),
        };
        e.pending.insert(
            (h.ox_id, h.s_id),
            PendingLogin {
                kind,
                port_name,
                node_name,
                logo_of,
                deadline: now + login_timeout,
            },
        );
        let vf = e.vf;
        self.to_fabric.push_back((vf, frame));
    }

    fn fcoe(&mut self, eth: &EthernetRepr, payload: &Bytes) {
        if eth.dst != self.cfg.mac {
            self.counters.not_ours += 1;
            return;
        }
        let frame = match decode(payload) {
            Ok(f) => f,
            Err(e) => {
                self.counters.bad_fcoe += 1;
                debug!(src = %eth.src, error = %e, "FCoE frame dropped");
                return;
            }
        };
        let s_id = frame.header.s_id;
        let Some(v) = self.vn_ports.get(&s_id) else {
            self.counters.spoofed += 1;
            return;
        };
        if v.view.mac != eth.src {
            self.counters.spoofed += 1;
            debug!(src = %eth.src, s_id = %s_id, "FCoE frame with another VN_Port's address dropped");
            return;
        }
        self.counters.rx_fcoe += 1;
        self.to_fabric.push_back((v.view.vf, frame));
    }

    /// Handles a frame the fabric sends out of VF_Port `vf`.
    pub fn handle_fabric(&mut self, now: Instant, vf: VfPortId, frame: Frame) {
        let h = frame.header;
        if h.s_id == FcId::LOGIN_SERVER && h.r_ctl == RCtl::ELS_REPLY {
            let enode = self
                .enodes
                .iter()
                .find(|(_, e)| {
                    e.vf == vf
                        && (e.pending.contains_key(&(h.ox_id, h.d_id))
                            || e.pending.contains_key(&(h.ox_id, FcId::UNIDENTIFIED)))
                })
                .map(|(m, _)| *m);
            if let Some(m) = enode {
                self.login_reply(now, m, frame);
                return;
            }
        }
        match self.vn_ports.get(&h.d_id) {
            Some(v) if v.view.vf == vf => {
                let dst = v.view.mac;
                let eth = self.eth(dst, EtherType::FCOE);
                self.counters.tx_fcoe += 1;
                self.out.push_back(EthOut {
                    eth,
                    body: EthBody::Fcoe(frame),
                });
            }
            _ => self.counters.undeliverable += 1,
        }
    }

    fn login_reply(&mut self, now: Instant, enode: MacAddr, frame: Frame) {
        let h = frame.header;
        let Some(p) = self.enodes.get_mut(&enode).and_then(|e| {
            e.pending
                .remove(&(h.ox_id, h.d_id))
                .or_else(|| e.pending.remove(&(h.ox_id, FcId::UNIDENTIFIED)))
        }) else {
            return;
        };
        let Some(vf) = self.enodes.get(&enode).map(|e| e.vf) else {
            return;
        };
        let accepted = frame.payload.first() == Some(&els_code::LS_ACC);
        let mut mac = MacAddr::ZERO;
        match p.kind {
            LoginKind::Flogi | LoginKind::Fdisc if accepted => {
                let fc_id = h.d_id;
                mac = MacAddr::fpma(self.cfg.fc_map, fc_id);
                if p.kind == LoginKind::Flogi {
                    // A new FLOGI replaces everything the ENode had.
                    let old: Vec<FcId> = self
                        .vn_ports
                        .values()
                        .filter(|v| v.view.enode == enode)
                        .map(|v| v.view.fc_id)
                        .collect();
                    for id in old {
                        if let Some(v) = self.vn_ports.remove(&id) {
                            self.events.push_back(FcfEvent::LoggedOut {
                                port: v.view,
                                reason: "replaced by a new FLOGI",
                            });
                        }
                    }
                }
                let view = VnPortView {
                    vf,
                    enode,
                    mac,
                    fc_id,
                    port_name: p.port_name,
                    node_name: p.node_name,
                    npiv: p.kind == LoginKind::Fdisc,
                };
                info!(enode = %enode, %fc_id, wwpn = %p.port_name, %mac, "VN_Port logged in");
                self.counters.logins += 1;
                self.vn_ports.insert(
                    fc_id,
                    VnPort {
                        view: view.clone(),
                        last_keep_alive: now,
                    },
                );
                self.events.push_back(FcfEvent::LoggedIn(view));
            }
            LoginKind::Logo if accepted => {
                if let Some(v) = self.vn_ports.remove(&p.logo_of) {
                    mac = v.view.mac;
                    // A login its ENode ends itself gives its token back:
                    // the bucket limits VN_Ports opened faster than they
                    // close (a flood), not an initiator that opens and
                    // closes an NPIV port per host session.
                    let burst = self.cfg.login_burst;
                    if let Some(e) = self.enodes.get_mut(&v.view.enode) {
                        e.tokens = (e.tokens + 1).min(burst);
                    }
                    self.events.push_back(FcfEvent::LoggedOut {
                        port: v.view,
                        reason: "LOGO",
                    });
                }
            }
            _ => {}
        }
        let mut fc = Vec::with_capacity(frame.len());
        frame.write_to(&mut fc);
        let fc = Bytes::from(fc);
        let d = match p.kind {
            LoginKind::Flogi => Descriptor::Flogi(fc),
            LoginKind::Fdisc => Descriptor::Fdisc(fc),
            LoginKind::Logo => Descriptor::Logo(fc),
        };
        let mut descriptors = vec![d];
        if accepted && p.kind != LoginKind::Logo {
            descriptors.push(Descriptor::MacAddress(mac));
        }
        let reply = FipRepr::new(
            FipOp::LINK_SERVICE,
            FipSubcode::LS_REPLY,
            FipFlags::FP,
            descriptors,
        );
        self.send_fip(enode, reply);
    }
}

/// The per-ENode login token bucket: one token per `refill` since
/// `last`, up to `burst`. The clock advances by whole refill periods only,
/// so time short of the next token is kept, not lost: requests arriving
/// every 0.7 periods still earn one token per period (moving the clock to
/// `now` on every gain would earn one per 1.4 periods). A full bucket
/// restarts the clock, so idle time does not accrue beyond the burst.
fn refill_tokens(tokens: &mut u32, last: &mut Instant, now: Instant, refill: Duration, burst: u32) {
    let elapsed = now.saturating_duration_since(*last);
    let periods = elapsed.as_nanos() / refill.as_nanos().max(1);
    if periods == 0 {
        return;
    }
    let total = u64::from(*tokens).saturating_add(u64::try_from(periods).unwrap_or(u64::MAX));
    if total >= u64::from(burst) {
        *tokens = burst;
        *last = now;
    } else {
        *tokens = total as u32;
        // periods < burst here, so the product fits.
        *last += refill * (periods as u32);
    }
}

#[cfg(test)]
mod refill_tests {
    use super::*;

    #[test]
    fn login_tokens_keep_the_time_short_of_the_next_one() {
        let t0 = Instant::now();
        let r = Duration::from_millis(10);
        let (mut tokens, mut last) = (0u32, t0);
        // Requests every 7 ms for 700 ms: 70 tokens earned, not 50.
        let mut earned = 0;
        for k in 1..=100u32 {
            let now = t0 + Duration::from_millis(7) * k;
            refill_tokens(&mut tokens, &mut last, now, r, 1000);
            earned += tokens;
            tokens = 0;
        }
        assert_eq!(earned, 70);
        // A full bucket does not bank idle time.
        let (mut tokens, mut last) = (0u32, t0);
        refill_tokens(&mut tokens, &mut last, t0 + Duration::from_secs(10), r, 4);
        assert_eq!((tokens, last), (4, t0 + Duration::from_secs(10)));
        tokens = 0;
        refill_tokens(
            &mut tokens,
            &mut last,
            t0 + Duration::from_millis(10_015),
            r,
            4,
        );
        assert_eq!(tokens, 1);
    }
}
