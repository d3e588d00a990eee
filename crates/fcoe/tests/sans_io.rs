//! The FCF, ENodes, a software fabric and N_Ports driven against each
//! other with virtual time: logins through FIP, discovery and FCP
//! process login across FCoE, keep-alive supervision, Clear Virtual
//! Links and FCF loss with recovery, and the FCF's answers to bad input
//! (spoofed source MACs, FLOGI floods, wrong descriptor lengths).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use unifab_fc::compose::{self, Route};
use unifab_fc::fabric::{Fabric, FabricConfig, PortIndex};
use unifab_fc::nport::{NPort, NPortConfig, NPortEvent};
use unifab_fc::wire::els::{ElsRepr, LoginParams, Logo};
use unifab_fc::{FcId, OxId, Wwn};
use unifab_fcoe::enode::{Enode, EnodeConfig, EnodeEvent};
use unifab_fcoe::fcf::{Fcf, FcfConfig, FcfEvent, VfPortId};
use unifab_fcoe::out::{EthBody, EthOut};
use unifab_fcoe::wire::{
    Descriptor, EtherType, EthernetRepr, FcMap, FipFlags, FipOp, FipRepr, FipSubcode, MacAddr,
    VlanTag,
};

const FCF_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0xfc, 0x01]);
const TARGET: Wwn = Wwn(0x2100_0000_0000_00aa);

struct Host {
    enode: Enode,
    ports: Vec<NPort>,
    /// Driven (a host that stopped is silent: no timers, no input).
    alive: bool,
}

struct World {
    now: Instant,
    fabric: Fabric,
    fcf: Fcf,
    fcf_alive: bool,
    vf: HashMap<VfPortId, PortIndex>,
    target: NPort,
    target_port: PortIndex,
    hosts: Vec<Host>,
    /// Raw frames injected by a test, as if from some MAC on the segment.
    wire_log: Vec<Bytes>,
}

fn mac(n: u8) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, 0x10, n])
}

fn host(n: u8, now: Instant, vlan: Option<u16>) -> Host {
    let wwpn = Wwn(0x2000_0000_0000_0000 | u64::from(n));
    let mut cfg = NPortConfig::new(wwpn, Wwn(wwpn.0 | 0x0100_0000_0000_0000));
    cfg.initiator = true;
    cfg.discover = true;
    let mut ec = EnodeConfig::new(mac(n), Wwn(wwpn.0 | 0x0100_0000_0000_0000), vlan);
    ec.vlan_discovery = vlan.is_some();
    Host {
        enode: Enode::new(ec, now),
        ports: vec![NPort::new(cfg)],
        alive: true,
    }
}

impl World {
    fn new(vlan: Option<u16>, hosts: u8) -> World {
        let now = Instant::now();
        let mut fabric = Fabric::new(FabricConfig::default());
        let target_port = fabric.attach("target");
        let mut tc = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_00aa));
        tc.target = true;
        let mut target = NPort::new(tc);
        target.link_up(now);
        let fcf = Fcf::new(
            FcfConfig::new(FCF_MAC, vlan, Wwn(0x1000_0000_0000_0001)),
            now,
        );
        World {
            now,
            fabric,
            fcf,
            fcf_alive: true,
            vf: HashMap::new(),
            target,
            target_port,
            hosts: (1..=hosts).map(|n| host(n, now, vlan)).collect(),
            wire_log: Vec::new(),
        }
    }

    /// Delivers an Ethernet frame from `from` (None: the FCF) to everyone else.
    fn ether(&mut self, from: Option<usize>, f: &EthOut) {
        let bytes = f.to_bytes().unwrap();
        self.wire_log.push(bytes.clone());
        if from.is_some() && self.fcf_alive {
            self.fcf.handle_ethernet(self.now, bytes.clone());
        }
        for (i, h) in self.hosts.iter_mut().enumerate() {
            if Some(i) != from && h.alive {
                h.enode.handle_ethernet(self.now, bytes.clone());
            }
        }
    }

    /// Runs until nothing moves.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(ev) = self.fcf.poll_event() {
                moved = true;
                match ev {
                    FcfEvent::VfPortUp { vf, enode } => {
                        let p = self.fabric.attach(&format!("vf{}-{enode}", vf.0));
                        self.vf.insert(vf, p);
                    }
                    FcfEvent::VfPortDown { vf, .. } => {
                        if let Some(p) = self.vf.remove(&vf) {
                            self.fabric.detach(p);
                        }
                    }
                    _ => {}
                }
            }
            while let Some((vf, f)) = self.fcf.poll_fabric() {
                moved = true;
                if let Some(p) = self.vf.get(&vf) {
                    self.fabric.handle_frame(self.now, *p, f);
                }
            }
            while let Some((p, f)) = self.fabric.poll_transmit() {
                moved = true;
                if p == self.target_port {
                    self.target.handle_frame(self.now, f);
                } else if let Some((vf, _)) = self.vf.iter().find(|(_, x)| **x == p) {
                    let vf = *vf;
                    self.fcf.handle_fabric(self.now, vf, f);
                }
            }
            while let Some(f) = self.target.poll_transmit() {
                moved = true;
                self.fabric.handle_frame(self.now, self.target_port, f);
            }
            while self.target.poll_event().is_some() {}
            while let Some(o) = self.fcf.poll_transmit() {
                moved = true;
                if self.fcf_alive {
                    self.ether(None, &o);
                }
            }
            for i in 0..self.hosts.len() {
                if !self.hosts[i].alive {
                    continue;
                }
                while let Some(o) = self.hosts[i].enode.poll_transmit() {
                    moved = true;
                    self.ether(Some(i), &o);
                }
                let now = self.now;
                let h = &mut self.hosts[i];
                while let Some(ev) = h.enode.poll_event() {
                    moved = true;
                    match ev {
                        EnodeEvent::LinkUp(_) => {
                            for p in &mut h.ports {
                                p.link_up(now);
                            }
                        }
                        EnodeEvent::LinkDown { .. } => {
                            for p in &mut h.ports {
                                p.link_down(now, "link down");
                            }
                        }
                        _ => {}
                    }
                }
                while let Some(f) = h.enode.poll_fc() {
                    moved = true;
                    let d = f.header.d_id;
                    let ox = f.header.ox_id;
                    if let Some(p) = h
                        .ports
                        .iter_mut()
                        .find(|p| (p.is_online() && p.fc_id() == d) || p.awaits_fabric_login(ox))
                    {
                        p.handle_frame(now, f);
                    }
                }
                for p in &mut h.ports {
                    while let Some(f) = p.poll_transmit() {
                        moved = true;
                        h.enode.handle_fc(now, f);
                    }
                    while let Some(ev) = p.poll_event() {
                        if matches!(ev, NPortEvent::Execute { .. }) {
                            panic!("initiator asked to execute");
                        }
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("world does not settle");
    }

    /// Advances virtual time to `until`, running every timer on the way.
    fn run_until(&mut self, until: Instant) {
        loop {
            self.settle();
            let mut next = until;
            if self.fcf_alive {
                next = next.min(self.fcf.poll_timeout().unwrap_or(until));
            }
            next = next.min(self.target.poll_timeout().unwrap_or(until));
            for h in self.hosts.iter().filter(|h| h.alive) {
                next = next.min(h.enode.poll_timeout().unwrap_or(until));
                for p in &h.ports {
                    next = next.min(p.poll_timeout().unwrap_or(until));
                }
            }
            let next = next.max(self.now);
            self.now = next;
            if self.fcf_alive {
                self.fcf.handle_timeout(next);
            }
            self.target.handle_timeout(next);
            for h in self.hosts.iter_mut().filter(|h| h.alive) {
                h.enode.handle_timeout(next);
                for p in &mut h.ports {
                    p.handle_timeout(next);
                }
            }
            if next >= until {
                self.settle();
                return;
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    fn sees_target(&self, host: usize) -> bool {
        self.hosts[host].ports[0]
            .ready_ports()
            .iter()
            .any(|p| p.1 == TARGET)
    }

    /// Hands a raw frame to the FCF, as if it came from the wire.
    fn inject(&mut self, bytes: Bytes) {
        self.fcf.handle_ethernet(self.now, bytes);
        self.settle();
    }
}

#[test]
fn login_discovery_and_process_login_across_fcoe() {
    let mut w = World::new(Some(100), 2);
    w.run_for(Duration::from_secs(3));
    for h in 0..2 {
        assert!(w.sees_target(h), "host {h} did not reach the target");
        assert_eq!(w.hosts[h].enode.vlan(), Some(100));
        let vn = w.hosts[h].enode.vn_ports();
        assert_eq!(vn.len(), 1);
        assert_eq!(vn[0].mac, MacAddr::fpma(Default::default(), vn[0].fc_id));
    }
    let fcf_view = w.fcf.vn_ports();
    assert_eq!(fcf_view.len(), 2);
    let fabric_ids: Vec<FcId> = w.fabric.logins().iter().map(|l| l.fc_id).collect();
    for v in &fcf_view {
        assert!(fabric_ids.contains(&v.fc_id));
    }
    // Every frame on the segment after VLAN discovery is tagged with VLAN 100, priority 3.
    let tagged = w
        .wire_log
        .iter()
        .filter(|b| b[12..14] == [0x81, 0x00])
        .count();
    assert!(tagged > 10);
    for b in w.wire_log.iter().filter(|b| b[12..14] == [0x81, 0x00]) {
        assert_eq!(u16::from_be_bytes([b[14], b[15]]), VlanTag::fcoe(100).tci());
    }
    // Keep-alives keep everyone logged in well past every timeout.
    w.run_for(Duration::from_secs(600));
    assert_eq!(w.fcf.vn_ports().len(), 2);
    assert_eq!(w.fcf.counters().keep_alive_timeouts, 0);
    assert!(w.sees_target(0) && w.sees_target(1));
}

#[test]
fn stopped_keep_alives_log_the_enode_out() {
    let mut w = World::new(None, 2);
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.fcf.vn_ports().len(), 2);
    let gone = w.hosts[0].enode.vn_ports()[0].fc_id;
    w.hosts[0].alive = false;
    w.run_for(Duration::from_secs(25));
    assert_eq!(w.fcf.counters().keep_alive_timeouts, 1);
    assert!(w.fcf.vn_ports().iter().all(|v| v.fc_id != gone));
    assert!(w.fabric.logins().iter().all(|l| l.fc_id != gone));
    // The other host is untouched.
    assert!(w.sees_target(1));
    assert_eq!(w.fcf.vn_ports().len(), 1);
}

#[test]
fn clear_virtual_links_and_fcf_loss_recover() {
    let mut w = World::new(None, 1);
    w.run_for(Duration::from_secs(3));
    assert!(w.sees_target(0));
    let before = w.fcf.counters().logins;
    w.fcf.clear_virtual_links(mac(1));
    // The CVL goes to the ENode's own MAC (FC-BB-5; Linux's libfcoe drops
    // FIP frames to any other address, its VN_Port's FPMA included).
    let mut cvls = 0;
    while let Some(o) = w.fcf.poll_transmit() {
        if let EthBody::Fip(f) = &o.body
            && f.subcode == FipSubcode::CLEAR_VIRTUAL_LINKS
        {
            assert_eq!(o.eth.dst, mac(1), "CVL sent to {}", o.eth.dst);
            cvls += 1;
        }
        w.ether(None, &o);
    }
    assert_eq!(cvls, 1);
    w.run_for(Duration::from_secs(5));
    assert_eq!(w.hosts[0].enode.counters().cvl_received, 1);
    assert!(w.sees_target(0), "no recovery after CVL");
    // The same CVL sent to the VN_Port's MAC, or to All-ENode-MACs, is not
    // the FCF's (FC-BB-5 sends it to the ENode MAC): the ENode ignores it.
    let vn_mac = w.hosts[0].enode.vn_ports()[0].mac;
    w.fcf.clear_virtual_links(mac(1));
    let mut cvl = None;
    while let Some(o) = w.fcf.poll_transmit() {
        if matches!(&o.body, EthBody::Fip(f) if f.subcode == FipSubcode::CLEAR_VIRTUAL_LINKS) {
            cvl = Some(o);
        }
    }
    let cvl = cvl.expect("the FCF sent a CVL");
    let dropped = w.hosts[0].enode.counters().dropped;
    for dst in [vn_mac, MacAddr::ALL_ENODE_MACS] {
        let mut o = cvl.clone();
        o.eth.dst = dst;
        let now = w.now;
        w.hosts[0].enode.handle_ethernet(now, o.to_bytes().unwrap());
    }
    let c = w.hosts[0].enode.counters();
    assert_eq!(
        c.cvl_received, 1,
        "a CVL not sent to the ENode MAC was taken"
    );
    assert_eq!(c.dropped, dropped + 2);
    // The FCF did clear its side: the ENode gets back in on its own.
    w.run_for(Duration::from_secs(60));
    assert!(w.fcf.counters().logins > before, "no new login after CVL");
    assert!(w.sees_target(0), "no recovery after CVL");
    // The FCF goes silent: the ENode notices within 2.5 × FKA_ADV_PERIOD.
    w.fcf_alive = false;
    w.run_for(Duration::from_secs(21));
    assert_eq!(w.hosts[0].enode.counters().fcf_lost, 1);
    assert!(w.hosts[0].enode.fcf().is_none());
    assert!(!w.hosts[0].ports[0].is_online());
    // It comes back (having forgotten everything): the host logs in again.
    w.fcf_alive = true;
    w.fcf.clear_all();
    w.run_for(Duration::from_secs(10));
    assert!(w.sees_target(0), "no recovery after the FCF came back");
}

/// A Clear Virtual Links naming one NPIV VN_Port clears that one alone:
/// its N_Port hears the F_Port's LOGO and logs in again by FDISC, while the
/// ENode's FLOGI port — a host's sessions beside it — stays logged in
/// without a blink. One naming the FLOGI port clears them all (the others
/// hang on it). Fails where any CVL resets the whole ENode.
#[test]
fn clear_virtual_links_for_one_npiv_port_clears_that_one() {
    let mut w = World::new(None, 1);
    w.run_for(Duration::from_secs(3));
    assert!(w.sees_target(0));
    let wwpn = Wwn(0x2000_0000_0000_0f01);
    let mut cfg = NPortConfig::new(wwpn, Wwn(wwpn.0 | 0x0100_0000_0000_0000));
    cfg.initiator = true;
    cfg.discover = true;
    cfg.virtual_port = true;
    let mut npiv = NPort::new(cfg);
    npiv.link_up(w.now);
    w.hosts[0].ports.push(npiv);
    w.run_for(Duration::from_secs(3));
    let sees = |w: &World, i: usize| {
        w.hosts[0].ports[i]
            .ready_ports()
            .iter()
            .any(|p| p.1 == TARGET)
    };
    assert!(sees(&w, 1), "the NPIV port never saw the target");
    let phys = w.hosts[0].ports[0].fc_id();
    let virt = w.hosts[0].ports[1].fc_id();
    assert_ne!(phys, virt);
    let flogis = |w: &World| {
        w.wire_log
            .iter()
            .filter(|b| {
                b.get(12..14) == Some(&[0x89, 0x14][..])
                    && FipRepr::parse(&b.slice(14..)).is_ok_and(|f| {
                        f.subcode == FipSubcode::LS_REQUEST
                            && f.descriptors
                                .iter()
                                .any(|d| matches!(d, Descriptor::Flogi(_)))
                    })
            })
            .count()
    };
    let flogis_before = flogis(&w);
    let logins_before = w.fcf.counters().logins;

    assert!(w.fcf.clear_vn_port(virt));
    w.run_for(Duration::from_secs(3));
    let e = w.hosts[0].enode.counters();
    assert_eq!(e.cvl_received, 1);
    assert_eq!(e.fcf_lost, 0);
    assert_eq!(flogis(&w), flogis_before, "the FLOGI port logged in again");
    assert_eq!(w.hosts[0].ports[0].fc_id(), phys);
    assert!(w.hosts[0].ports[0].is_online());
    assert_eq!(
        w.fcf.counters().logins,
        logins_before + 1,
        "one FDISC, for the cleared port"
    );
    assert!(w.hosts[0].ports[1].is_online());
    assert!(
        sees(&w, 1),
        "the cleared NPIV port did not find the target again"
    );
    assert!(sees(&w, 0));

    // The FLOGI port named: everything goes (the NPIV port with it) and
    // the FLOGI port comes back.
    assert!(w.fcf.clear_vn_port(phys));
    w.hosts[0].ports.truncate(1);
    w.run_for(Duration::from_secs(5));
    assert_eq!(w.hosts[0].enode.counters().cvl_received, 2);
    assert!(
        flogis(&w) > flogis_before,
        "no new FLOGI after the FLOGI port was cleared"
    );
    assert!(w.hosts[0].enode.vn_ports().iter().all(|v| v.fc_id != virt));
    assert!(sees(&w, 0));
}

/// A multicast FCF advertisement from `src` (no FCF behind it).
fn spoofed_advertisement(src: MacAddr) -> Bytes {
    EthOut {
        eth: EthernetRepr {
            dst: MacAddr::ALL_ENODE_MACS,
            src,
            vlan: None,
            ethertype: EtherType::FIP,
        },
        body: EthBody::Fip(FipRepr::new(
            FipOp::DISCOVERY,
            FipSubcode::ADVERTISEMENT,
            FipFlags::FP | FipFlags::F | FipFlags::A,
            vec![
                Descriptor::Priority(1),
                Descriptor::MacAddress(src),
                Descriptor::NameIdentifier(Wwn(0x1000_0000_0000_0099)),
                Descriptor::Fabric {
                    vf_id: 0,
                    fc_map: FcMap::DEFAULT,
                    fabric_name: Wwn(0x1000_0000_0000_0099),
                },
                Descriptor::FkaAdvPeriod {
                    no_vn_keep_alives: false,
                    period_ms: 8000,
                },
            ],
        )),
    }
    .to_bytes()
    .unwrap()
}

#[test]
fn a_flood_of_advertisements_from_fresh_macs_is_bounded_and_io_goes_on() {
    let mut w = World::new(None, 1);
    w.run_for(Duration::from_secs(3));
    assert!(w.sees_target(0));
    let fcf = w.hosts[0].enode.fcf().unwrap().mac;
    for k in 0..1000u32 {
        let src = MacAddr([0x02, 0xee, 0, (k >> 16) as u8, (k >> 8) as u8, k as u8]);
        w.hosts[0]
            .enode
            .handle_ethernet(w.now, spoofed_advertisement(src));
    }
    let e = &w.hosts[0].enode;
    assert_eq!(e.candidates().len(), unifab_fcoe::enode::MAX_CANDIDATES);
    assert_eq!(
        e.counters().candidates_evicted,
        1000 - (unifab_fcoe::enode::MAX_CANDIDATES as u64 - 1)
    );
    // The selected FCF is never the one evicted, and the host stays on it.
    assert!(e.candidates().iter().any(|c| c.mac == fcf));
    w.run_for(Duration::from_secs(3));
    assert_eq!(w.hosts[0].enode.fcf().map(|f| f.mac), Some(fcf));
    assert!(w.sees_target(0));
    // The spoofed ones, never heard again, are forgotten after 2.5 × their
    // FKA_ADV_PERIOD (8 s) once the ENode next looks at the list.
    w.run_for(Duration::from_secs(21));
    w.hosts[0].enode.handle_ethernet(
        w.now,
        spoofed_advertisement(MacAddr([0x02, 0xef, 0, 0, 0, 1])),
    );
    let e = &w.hosts[0].enode;
    let left: Vec<MacAddr> = e.candidates().iter().map(|c| c.mac).collect();
    assert_eq!(left.len(), 2, "the real FCF and the newest: {left:?}");
    assert!(left.contains(&fcf));
    assert_eq!(
        e.counters().candidates_evicted,
        1000 - (unifab_fcoe::enode::MAX_CANDIDATES as u64 - 1),
        "stale ones are pruned, not evicted"
    );
}

fn flogi_request(src: MacAddr, ox: u16, wwpn: u64) -> Bytes {
    let params = LoginParams::n_port(Wwn(wwpn), Wwn(wwpn ^ 1), 2048, 2000);
    let f = compose::els(
        Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(ox)),
        &ElsRepr::Flogi(params),
    )
    .unwrap();
    let mut fc = Vec::new();
    f.write_to(&mut fc);
    EthOut {
        eth: EthernetRepr {
            dst: FCF_MAC,
            src,
            vlan: None,
            ethertype: EtherType::FIP,
        },
        body: EthBody::Fip(FipRepr::new(
            FipOp::LINK_SERVICE,
            FipSubcode::LS_REQUEST,
            FipFlags::FP,
            vec![
                Descriptor::Flogi(Bytes::from(fc)),
                Descriptor::MacAddress(MacAddr::ZERO),
            ],
        )),
    }
    .to_bytes()
    .unwrap()
}

#[test]
fn bad_input_is_refused_limited_or_dropped() {
    let mut w = World::new(None, 2);
    w.run_for(Duration::from_secs(3));
    assert!(w.sees_target(0) && w.sees_target(1));
    let a = w.hosts[0].enode.vn_ports()[0].clone();
    let b = w.hosts[1].enode.vn_ports()[0].clone();

    // Host B sends an FCoE frame claiming A's address from B's MAC, and
    // from A's MAC on B's behalf: both dropped and counted.
    let target_id = w
        .fabric
        .logins()
        .iter()
        .find(|l| l.port_name == TARGET)
        .unwrap()
        .fc_id;
    let rx_before = w.fabric.counters(w.target_port).unwrap().tx_frames;
    for (src, s_id) in [(b.mac, a.fc_id), (mac(2), a.fc_id), (a.mac, b.fc_id)] {
        let echo = compose::els(
            Route::request(s_id, target_id, OxId(0x4242)),
            &ElsRepr::Echo(Bytes::from_static(&[0, 0, 0, 0])),
        )
        .unwrap();
        let bytes = EthOut {
            eth: EthernetRepr {
                dst: FCF_MAC,
                src,
                vlan: None,
                ethertype: EtherType::FCOE,
            },
            body: EthBody::Fcoe(echo),
        }
        .to_bytes()
        .unwrap();
        w.inject(bytes);
    }
    assert_eq!(w.fcf.counters().spoofed, 3);
    assert_eq!(
        w.fabric.counters(w.target_port).unwrap().tx_frames,
        rx_before,
        "a spoofed frame reached the target"
    );

    // A rogue ENode floods FLOGIs: at most the burst passes, and only
    // `max_pending_logins` at a time.
    let rogue = mac(0x66);
    let logins_before = w.fcf.counters().logins;
    for i in 0..500u16 {
        w.fcf.handle_ethernet(
            w.now,
            flogi_request(rogue, i, 0x2000_0000_0000_6600 + u64::from(i)),
        );
    }
    w.settle();
    let c = w.fcf.counters();
    assert!(c.login_limited >= 480, "{c:?}");
    assert!(c.logins - logins_before <= 32, "{c:?}");
    assert!(w.fcf.vn_ports().iter().filter(|v| v.enode == rogue).count() <= 1);

    // Wrong descriptor lengths: a MAC descriptor of 3 words, a priority of 2.
    let mut bad = flogi_request(mac(0x77), 1, 0x2000_0000_0000_7700).to_vec();
    // The FLOGI descriptor starts at 14 + 10; its length word at +1.
    bad[14 + 10 + 1] = 35;
    w.inject(Bytes::from(bad));
    let mut ka = EthOut {
        eth: EthernetRepr {
            dst: FCF_MAC,
            src: mac(1),
            vlan: None,
            ethertype: EtherType::FIP,
        },
        body: EthBody::Fip(FipRepr::new(
            FipOp::CONTROL,
            FipSubcode::KEEP_ALIVE,
            FipFlags::FP,
            vec![Descriptor::MacAddress(mac(1))],
        )),
    }
    .to_bytes()
    .unwrap()
    .to_vec();
    ka[14 + 10 + 1] = 3;
    w.inject(Bytes::from(ka));
    assert_eq!(w.fcf.counters().malformed_fip, 2);
    assert!(w.fcf.vn_ports().iter().all(|v| v.enode != mac(0x77)));

    // The real hosts never noticed.
    w.run_for(Duration::from_secs(120));
    assert!(w.sees_target(0) && w.sees_target(1));
    assert_eq!(
        w.fcf
            .vn_ports()
            .iter()
            .filter(|v| v.enode == mac(1) || v.enode == mac(2))
            .count(),
        2
    );
}

/// A FIP link-service request carrying `els` from `s_id`.
fn ls_request(
    src: MacAddr,
    s_id: FcId,
    ox: u16,
    els: &ElsRepr,
    wrap: fn(Bytes) -> Descriptor,
    mac_descriptor: MacAddr,
) -> Bytes {
    let f = compose::els(Route::request(s_id, FcId::LOGIN_SERVER, OxId(ox)), els).unwrap();
    let mut fc = Vec::new();
    f.write_to(&mut fc);
    EthOut {
        eth: EthernetRepr {
            dst: FCF_MAC,
            src,
            vlan: None,
            ethertype: EtherType::FIP,
        },
        body: EthBody::Fip(FipRepr::new(
            FipOp::LINK_SERVICE,
            FipSubcode::LS_REQUEST,
            FipFlags::FP,
            vec![
                wrap(Bytes::from(fc)),
                Descriptor::MacAddress(mac_descriptor),
            ],
        )),
    }
    .to_bytes()
    .unwrap()
}

/// An initiator gateway opens an NPIV port per host session and closes it
/// at the session's end: four times the login burst of FDISC + LOGO pairs
/// at one instant (no refill) are all granted; the limit is on VN_Ports
/// opened faster than they close.
#[test]
fn npiv_ports_closed_by_logo_do_not_run_the_login_limit_dry() {
    let mut w = World::new(None, 0);
    let host = mac(0x55);
    w.inject(flogi_request(host, 1, 0x2000_0000_0000_5500));
    assert_eq!(w.fcf.vn_ports().len(), 1, "the ENode's FLOGI");
    let before = w.fcf.counters();
    let burst = FcfConfig::new(FCF_MAC, None, Wwn(1)).login_burst as u16;
    for i in 0..4 * burst {
        let wwpn = Wwn(0x2000_0000_0000_5600 + u64::from(i));
        let fdisc = ElsRepr::Fdisc(LoginParams::n_port(wwpn, Wwn(wwpn.0 ^ 1), 2048, 2000));
        w.inject(ls_request(
            host,
            FcId::UNIDENTIFIED,
            0x100 + i,
            &fdisc,
            Descriptor::Fdisc,
            MacAddr::ZERO,
        ));
        let vn = w
            .fcf
            .vn_ports()
            .into_iter()
            .find(|v| v.port_name == wwpn)
            .unwrap_or_else(|| panic!("FDISC {i} not granted: {:?}", w.fcf.counters()));
        let logo = ElsRepr::Logo(Logo {
            n_port_id: vn.fc_id,
            port_name: wwpn,
        });
        w.inject(ls_request(
            host,
            vn.fc_id,
            0x8000 + i,
            &logo,
            Descriptor::Logo,
            vn.mac,
        ));
        assert!(
            w.fcf.vn_ports().iter().all(|v| v.port_name != wwpn),
            "LOGO {i} not taken"
        );
    }
    let c = w.fcf.counters();
    assert_eq!(c.login_limited, before.login_limited, "{c:?}");
    assert_eq!(c.logins - before.logins, u64::from(4 * burst), "{c:?}");
}
