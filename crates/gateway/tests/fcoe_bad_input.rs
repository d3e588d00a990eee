//! Bad input to unifab's FCF on a real veth, while an honest ENode (unifab
//! A) does verified I/O through it the whole time:
//!
//! - a rogue ENode logs in, then sends FCoE frames naming the honest
//!   VN_Port's address from its own MAC, and its own address from the
//!   honest VN_Port's MAC: dropped and counted (`spoofed`);
//! - it floods FIP FLOGIs: limited (`login_limited`), logins bounded;
//! - it sends FIP frames with wrong descriptor lengths: dropped
//!   (`malformed_fip`);
//! - it stops sending keep-alives: logged out (`keep_alive_timeouts`),
//!   gone from `show flogi`.
//!
//! Needs root and the release binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fcoe_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fcoe_support::*;
use unifab_fc::compose::{self, Route};
use unifab_fc::wire::els::{ElsRepr, LoginParams};
use unifab_fc::{FcId, OxId, Wwn};
use unifab_fcoe::out::{EthBody, EthOut};
use unifab_fcoe::wire::{
    Descriptor, EtherType, EthernetFrame, EthernetRepr, FipFlags, FipOp, FipRepr, FipSubcode,
    MacAddr, VlanTag,
};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

/// A raw AF_PACKET socket on one interface.
struct Raw {
    fd: i32,
    ifindex: i32,
}

impl Raw {
    fn open(iface: &str) -> Raw {
        let name = std::ffi::CString::new(iface).unwrap();
        // SAFETY: plain libc calls; results checked.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            assert!(ifindex > 0, "no interface {iface}");
            let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto);
            assert!(fd >= 0, "AF_PACKET socket");
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto as u16;
            sll.sll_ifindex = ifindex;
            let rc = libc::bind(
                fd,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(rc, 0, "bind");
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 200_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
            Raw { fd, ifindex }
        }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sending a buffer we own on a bound socket.
        let n = unsafe { libc::send(self.fd, frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(n as usize, frame.len(), "raw send");
        let _ = self.ifindex;
    }

    /// The next frame, or None after the receive timeout.
    fn recv(&self) -> Option<Bytes> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: receiving into a buffer we own.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        (n > 0).then(|| {
            buf.truncate(n as usize);
            Bytes::from(buf)
        })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: closing our own fd.
        unsafe { libc::close(self.fd) };
    }
}

fn fip(dst: MacAddr, src: MacAddr, fip: FipRepr) -> Bytes {
    EthOut {
        eth: EthernetRepr {
            dst,
            src,
            vlan: Some(VlanTag::fcoe(VLAN)),
            ethertype: EtherType::FIP,
        },
        body: EthBody::Fip(fip),
    }
    .to_bytes()
    .unwrap()
}

fn flogi(fcf: MacAddr, src: MacAddr, ox: u16, wwpn: u64) -> Bytes {
    let f = compose::els(
        Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(ox)),
        &ElsRepr::Flogi(LoginParams::n_port(Wwn(wwpn), Wwn(wwpn ^ 1), 2048, 2000)),
    )
    .unwrap();
    let mut fc = Vec::new();
    f.write_to(&mut fc);
    fip(
        fcf,
        src,
        FipRepr::new(
            FipOp::LINK_SERVICE,
            FipSubcode::LS_REQUEST,
            FipFlags::FP,
            vec![
                Descriptor::Flogi(Bytes::from(fc)),
                Descriptor::MacAddress(MacAddr::ZERO),
            ],
        ),
    )
}

/// An FCoE frame (an ECHO to the target's address) from `src` with `s_id`.
fn fcoe(fcf: MacAddr, src: MacAddr, s_id: FcId, d_id: FcId) -> Bytes {
    let f = compose::els(
        Route::request(s_id, d_id, OxId(0x7777)),
        &ElsRepr::Echo(Bytes::from_static(&[0, 0, 0, 0])),
    )
    .unwrap();
    EthOut {
        eth: EthernetRepr {
            dst: fcf,
            src,
            vlan: Some(VlanTag::fcoe(VLAN)),
            ethertype: EtherType::FCOE,
        },
        body: EthBody::Fcoe(f),
    }
    .to_bytes()
    .unwrap()
}

fn counter(gw: &Gw, name: &str) -> u64 {
    gw.show("fcoe")[0][name].as_u64().unwrap()
}

/// The MACs the FLOGI flood comes from.
const FLOOD_MACS: u16 = 4;

/// The sum over its series of a family at `/metrics`.
fn metric_sum(gw: &Gw, family: &str) -> f64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", gw.ns.as_deref().unwrap()])
        .arg(unifab_testkit::peers::unifab_bin().unwrap())
        .args(["show", "metrics", "--admin", &gw.admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} ")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn flogi_rows(gw: &Gw) -> Vec<serde_json::Value> {
    gw.show("flogi").as_array().unwrap().clone()
}

#[test]
fn a_rogue_enode_is_refused_limited_and_logged_out_while_others_do_io() {
    require_root("bad input to the FCF");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let hop = Hop::start(dir.path(), "af_packet", "fka_adv_period = 1.0");
    let fcf_mac: MacAddr = {
        let out = std::process::Command::new("ip")
            .args([
                "-n",
                &hop.veth.ns,
                "-br",
                "link",
                "show",
                "dev",
                &hop.veth.b,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap()
            .parse()
            .unwrap()
    };
    let honest = flogi_rows(&hop.b)
        .into_iter()
        .find(|r| r["port_name"] == INITIATOR_WWPN)
        .expect("the honest VN_Port");
    let honest_id: FcId = honest["fcid"].as_str().unwrap().parse().unwrap();
    let honest_mac: MacAddr = honest["mac"].as_str().unwrap().parse().unwrap();
    let target_id: FcId = flogi_rows(&hop.b)
        .iter()
        .find(|r| r["port_name"] == TARGET_WWPN)
        .unwrap()["fcid"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    // The honest host does verified I/O throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let addr = hop.a.iscsi.unwrap();
    let stop2 = stop.clone();
    let io = std::thread::spawn(move || {
        let mut s = RawSession::login(
            addr,
            IQN,
            &RawOptions {
                timeout: Duration::from_secs(30),
                ..RawOptions::default()
            },
        )
        .unwrap();
        let mut rounds = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let data: Vec<u8> = (0..65536u64)
                .map(|i| (i.wrapping_mul(31) ^ rounds) as u8)
                .collect();
            let lba = (rounds % 64) * 128;
            assert_eq!(s.write16(lba, &data, 512, false).unwrap().status, 0);
            let back = s.read16(lba, 128, 512).unwrap();
            assert_eq!(back.status, 0);
            assert!(back.data == data, "honest host read back other data");
            rounds += 1;
        }
        s.logout().unwrap();
        rounds
    });

    // What the keep-alive counters say before the rogue comes.
    let misses = "unifab_fcoe_port_keep_alive_misses_total";
    let (misses0, timeouts0, logins_before) = (
        metric_sum(&hop.b, misses),
        counter(&hop.b, "keep_alive_timeouts"),
        counter(&hop.b, "logins"),
    );

    // The rogue ENode logs in.
    let raw = Raw::open(&hop.veth.a);
    let rogue = MacAddr([0x02, 0xba, 0xd0, 0, 0, 1]);
    raw.send(&flogi(fcf_mac, rogue, 1, 0x2000_0000_0bad_0001));
    let deadline = Instant::now() + Duration::from_secs(5);
    let (rogue_id, rogue_vn) = loop {
        assert!(
            Instant::now() < deadline,
            "the rogue's FLOGI was not answered"
        );
        let Some(f) = raw.recv() else { continue };
        let Ok(v) = EthernetFrame::new_checked(&f[..]) else {
            continue;
        };
        let eth = EthernetRepr::parse(&v);
        if eth.dst != rogue || eth.ethertype != EtherType::FIP {
            continue;
        }
        let r = FipRepr::parse(&f.slice(v.header_len()..)).unwrap();
        if r.op == FipOp::LINK_SERVICE
            && let Some((_, fc)) = r.link_service()
        {
            let d_id = FcId::new(u32::from_be_bytes([0, fc[1], fc[2], fc[3]]));
            break (d_id, r.mac().unwrap());
        }
    };
    assert!(
        flogi_rows(&hop.b)
            .iter()
            .any(|r| r["fcid"] == rogue_id.to_string()),
        "the rogue's login is not in show flogi"
    );

    // 1. Spoofing: another VN_Port's address from the rogue's MAC, and the
    //    rogue's address from the honest VN_Port's MAC.
    let spoofed0 = counter(&hop.b, "spoofed");
    for _ in 0..50 {
        raw.send(&fcoe(fcf_mac, rogue_vn, honest_id, target_id));
        raw.send(&fcoe(fcf_mac, honest_mac, rogue_id, target_id));
    }
    // 2. A FLOGI flood from a handful of MACs.
    let limited0 = counter(&hop.b, "login_limited");
    let logins0 = counter(&hop.b, "logins");
    for i in 0..2000u16 {
        let src = MacAddr([0x02, 0xba, 0xd1, 0, (i % FLOOD_MACS) as u8, 1]);
        raw.send(&flogi(
            fcf_mac,
            src,
            i,
            0x2000_0000_0bad_1000 + u64::from(i),
        ));
    }
    // 3. Wrong descriptor lengths.
    let malformed0 = counter(&hop.b, "malformed_fip");
    let mut bad = flogi(
        fcf_mac,
        MacAddr([0x02, 0xba, 0xd2, 0, 0, 1]),
        9,
        0x2000_0000_0bad_2000,
    )
    .to_vec();
    bad[18 + 10 + 1] = 30; // the FLOGI descriptor, 30 words instead of 36
    raw.send(&bad);
    let mut ka = fip(
        fcf_mac,
        rogue,
        FipRepr::new(
            FipOp::CONTROL,
            FipSubcode::KEEP_ALIVE,
            FipFlags::FP,
            vec![Descriptor::MacAddress(rogue)],
        ),
    )
    .to_vec();
    ka[18 + 10 + 1] = 1; // a MAC descriptor of 1 word
    raw.send(&ka);
    std::thread::sleep(Duration::from_secs(1));
    assert!(counter(&hop.b, "spoofed") >= spoofed0 + 100);
    let limited = counter(&hop.b, "login_limited") - limited0;
    let granted = counter(&hop.b, "logins") - logins0;
    println!("FLOGI flood: {granted} granted, {limited} limited of 2000");
    // Four flooding MACs, each with a burst of 32 (refilled at 20/s).
    assert!(limited >= 1800 && granted <= 4 * 40, "{limited} {granted}");
    assert_eq!(counter(&hop.b, "malformed_fip"), malformed0 + 2);

    // 4. The rogue (and the flooders) never send keep-alives: logged out
    //    within 2.5 × FKA_ADV_PERIOD (1 s here).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = flogi_rows(&hop.b);
        let rogue_gone = rows.iter().all(|r| r["fcid"] != rogue_id.to_string());
        let only_honest = rows.iter().filter(|r| r["mac"].is_string()).all(|r| {
            r["port_name"] == INITIATOR_WWPN || r["interface"].as_str().unwrap().contains("npiv")
        });
        if rogue_gone && only_honest {
            break;
        }
        assert!(Instant::now() < deadline, "rogue logins remain: {rows:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every ENode that logged in and went silent (the rogue and each
    // flooding MAC, whatever number of VN_Ports it held) was logged out
    // once for want of keep-alives, counted in `show fcoe` and at
    // /metrics alike.
    assert!(counter(&hop.b, "logins") - logins_before > u64::from(FLOOD_MACS));
    let silent = 1 + u64::from(FLOOD_MACS);
    assert_eq!(counter(&hop.b, "keep_alive_timeouts") - timeouts0, silent);
    assert_eq!(metric_sum(&hop.b, misses) - misses0, silent as f64);
    // The honest ENode kept its login and its I/O.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let rounds = io.join().expect("the honest host's I/O failed");
    assert!(rounds > 10, "the honest host did only {rounds} rounds");
    assert!(
        flogi_rows(&hop.b)
            .iter()
            .any(|r| r["fcid"] == honest_id.to_string()),
        "the honest login was lost"
    );
    assert_eq!(counter(&hop.a, "cvl_received"), 0);
    println!("honest host: {rounds} verified 64 KiB write/read rounds during the attack");
}
