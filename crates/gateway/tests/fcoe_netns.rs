//! FCoE across a veth pair between network namespaces, with real peers:
//!
//! - Open-FCoE's `fipvlan` (Debian fcoe-utils) finds unifab's FCF and its
//!   VLAN (and finds nothing before the FCF starts);
//! - an FCoE hop (iSCSI → unifab A → `fc://` LU → ENode → veth → FCF →
//!   unifab B's fabric → FCP target → file LU) carries verified I/O and a
//!   short iscsi-test-cu run, over AF_XDP and over AF_PACKET, while tshark
//!   on the veth decodes every FIP and FCoE frame with a good CRC and
//!   nothing malformed; IP keeps working on the same interfaces; `show
//!   flogi` lists the FCoE logins with VLAN and MAC; the XDP program is
//!   gone after shutdown;
//! - 600 short sessions through the hop, three at a time (each a login,
//!   the TEST UNIT READY that libiscsi sends after it, READ CAPACITY and a
//!   logout: an NPIV port created, logged in, used and released), all
//!   succeed.
//!
//! Needs root, the release binary, fipvlan, tshark and iscsi-test-cu; a
//! missing one fails the test with its name. The whole conformance suite
//! through the hop is `fcoe_conformance.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fcoe_support;

use std::process::Command;
use std::time::{Duration, Instant};

use fcoe_support::*;
use unifab_testkit::peers::IscsiTestCu;
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

/// A namespace of its own for fipvlan's end of the pair. fipvlan watches
/// every interface of its namespace: in the root namespace, another
/// test's veth coming or going while it runs made it give up during its
/// netlink dump ("unexpected netlink message type") or poll a descriptor
/// it had closed and reused ("fip_recv: error 88 Socket operation on
/// non-socket", then "No Fibre Channel Forwarders"). Here it sees only
/// `lo` and its own veth end. Named after the pair's namespace, so a
/// killed run's leftover is swept with it.
struct HostNs(String);

impl HostNs {
    fn take(veth: &Veth) -> HostNs {
        let ns = HostNs(format!("{}h", veth.ns));
        let ip = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().expect("ip");
            assert!(st.success(), "ip {args:?}: {st}");
        };
        ip(&["netns", "add", &ns.0]);
        ip(&["link", "set", &veth.a, "netns", &ns.0]);
        ip(&["-n", &ns.0, "link", "set", &veth.a, "mtu", "2500", "up"]);
        ns
    }
}

impl Drop for HostNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// fipvlan's report for `iface`, run in namespace `ns`.
fn fipvlan(ns: &HostNs, iface: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, "fipvlan", iface])
        .output()
        .expect("fipvlan (Debian: fcoe-utils)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn fipvlan_finds(io: &str) {
    require_root("fipvlan against unifab's FCF");
    let dir = tempfile::tempdir().unwrap();
    let veth = Veth::new();
    let host = HostNs::take(&veth);
    let before = fipvlan(&host, &veth.a);
    assert!(
        before.contains("No Fibre Channel Forwarders"),
        "fipvlan found something before the FCF started:\n{before}"
    );
    let b = Gw::start(
        dir.path(),
        "b",
        &config_b(dir.path(), &veth.b, io, ""),
        Some(&veth.ns),
        "FCoE FCF on",
    );
    let fcf_mac = {
        let out = Command::new("ip")
            .args(["-n", &veth.ns, "-br", "link", "show", "dev", &veth.b])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap()
            .to_string()
    };
    let found = fipvlan(&host, &veth.a);
    let row = found
        .lines()
        .find(|l| l.contains(&fcf_mac))
        .unwrap_or_else(|| panic!("fipvlan did not list FCF {fcf_mac}:\n{found}"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cols, [veth.a.as_str(), "100", fcf_mac.as_str()], "{found}");
    let fcoe = b.show("fcoe");
    assert_eq!(fcoe[0]["mode"], "fcf");
    assert!(fcoe[0]["link"].as_str().unwrap().starts_with(io), "{fcoe}");
    println!("fipvlan over {io}:\n{found}");
}

#[test]
fn fipvlan_finds_the_fcf_and_its_vlan_over_af_xdp() {
    fipvlan_finds("af_xdp");
}

#[test]
fn fipvlan_finds_the_fcf_and_its_vlan_over_af_packet() {
    fipvlan_finds("af_packet");
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes and reads back `rounds` × 256 KiB with distinct patterns.
pub fn verified_io(s: &mut RawSession, rounds: u64, lba0: u64) {
    for r in 0..rounds {
        let data = pattern(lba0 + r, 256 * 1024);
        let lba = lba0 + r * 512;
        let w = s.write16(lba, &data, 512, r % 2 == 0).unwrap();
        assert_eq!(w.status, 0, "WRITE(16) at {lba}: {w:?}");
        let back = s.read16(lba, 512, 512).unwrap();
        assert_eq!(back.status, 0, "READ(16) at {lba}");
        assert!(back.data == data, "data read back at LBA {lba} differs");
    }
}

fn hop_smoke(io: &str) {
    require_root("the FCoE hop");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let hop = Hop::start(dir.path(), io, "");
    // Frames an AF_XDP socket sends (copy mode transmits with a direct
    // xmit) or receives (redirected before the stack) never reach packet
    // taps, so tshark on the veth sees the AF_PACKET runs only (here and
    // in the conformance test).
    let cap = (io == "af_packet").then(|| Capture::start(&hop.veth.a, dir.path().join("hop.pcap")));

    // Verified I/O through the hop.
    let mut s = RawSession::login(
        hop.a.iscsi.unwrap(),
        IQN,
        &RawOptions {
            timeout: Duration::from_secs(30),
            ..RawOptions::default()
        },
    )
    .unwrap();
    verified_io(&mut s, 16, 0);
    s.logout().unwrap();

    // A short run of libiscsi's suite through the same hop.
    let r = IscsiTestCu::new(hop.url())
        .tests("SCSI.Read16,SCSI.Write16,SCSI.TestUnitReady,SCSI.Inquiry")
        .timeout(Duration::from_secs(300))
        .run()
        .expect("iscsi-test-cu runs through the hop");
    assert!(r.is_complete(), "{}", r.stderr_tail);
    let failed = r.count(unifab_testkit::peers::Outcome::Failed);
    let passed = r.count(unifab_testkit::peers::Outcome::Passed);
    assert!(failed == 0 && passed >= 10, "{}", r.to_table());

    // IP still works on the interfaces the XDP program filters.
    let ping = Command::new("ping")
        .args(["-c", "2", "-W", "2", "169.254.77.2"])
        .output()
        .expect("ping (Debian: iputils-ping)");
    assert!(
        ping.status.success(),
        "IP across the FCoE veth failed: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    if let Some(cap) = cap {
        let pcap = cap.stop();
        let d = decode(&pcap);
        println!(
            "{io}: tshark decoded {} FIP and {} FCoE frames ({} with a good CRC)",
            d.fip, d.fcoe, d.crc_good
        );
        assert!(d.fip > 0 && d.fcoe > 1000, "too little on the wire");
        assert_eq!(d.crc_good, d.fcoe, "FCoE frames without a good CRC");
        assert!(d.flagged.is_empty(), "tshark flagged:\n{}", d.flagged);
    }

    // show flogi: the ENode's login on A, the VN_Port with VLAN and MAC on B.
    let fa = hop.a.show("flogi");
    let mine = fa
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["port_name"] == INITIATOR_WWPN)
        .unwrap_or_else(|| panic!("A's flogi lacks the ENode login: {fa}"));
    assert_eq!(mine["vlan"], VLAN);
    let mac = mine["mac"].as_str().unwrap().to_string();
    assert!(mac.starts_with("0e:fc:00:"), "{fa}");
    let fb = hop.b.show("flogi");
    let vn = fb
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["port_name"] == INITIATOR_WWPN)
        .unwrap_or_else(|| panic!("B's flogi lacks the VN_Port: {fb}"));
    assert_eq!(vn["vlan"], VLAN, "{fb}");
    assert_eq!(vn["mac"], mac.as_str(), "{fb}");
    assert!(vn["interface"].as_str().unwrap().starts_with(&hop.veth.b));
    assert_eq!(vn["fcid"], mine["fcid"]);

    // The XDP mode: generic on veth unless native was asked for.
    if let Some(rest) = io.strip_prefix("af_xdp") {
        let want = if rest == "/native" {
            "native"
        } else {
            "generic"
        };
        for gw in [&hop.a, &hop.b] {
            let fcoe = gw.show("fcoe");
            let link = fcoe[0]["link"].as_str().unwrap_or_default();
            assert!(link.contains(&format!("({want}, copy)")), "{fcoe}");
        }
    }

    // Shutdown leaves no XDP program behind.
    let Hop { veth, a, b } = hop;
    if io.starts_with("af_xdp") {
        assert_eq!(veth.xdp_on_a().as_deref(), Some("fcoe_filter"));
    }
    a.terminate();
    b.terminate();
    assert_eq!(veth.xdp_on_a(), None, "XDP program left on {}", veth.a);
}

#[test]
fn fcoe_hop_over_af_xdp() {
    hop_smoke("af_xdp");
}

/// veth's native XDP, which `auto` passes over on veth: kept working for
/// NICs, where `auto` picks it.
#[test]
fn fcoe_hop_over_af_xdp_in_native_mode() {
    hop_smoke("af_xdp/native");
}

#[test]
fn fcoe_hop_over_af_packet() {
    hop_smoke("af_packet");
}

/// The tshark check used on the veth captures accepts a clean FCoE
/// capture and flags frames cut short (so its silence above means
/// something). Needs tshark, not root.
#[test]
fn the_tshark_check_flags_bad_frames() {
    let captures =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures");
    let good = decode(&captures.join("fcoe-t11.pcap"));
    assert_eq!((good.fcoe, good.crc_good), (69, 69));
    assert!(good.flagged.is_empty(), "{}", good.flagged);
    let short = decode(&captures.join("fcoe-t11-short.cap"));
    assert_eq!((short.fcoe, short.crc_good), (20, 6));
    assert!(short.flagged.starts_with("14 frames"), "{}", short.flagged);
}

/// Sessions come and go through the hop as fast as libiscsi opens them,
/// three at a time: each one's first commands must find its NPIV port
/// (FDISC through the ENode and the FCF, name server, PLOGI/PRLI to the
/// target) and none may fail. A failure here is the one libiscsi's suite
/// reports as a failed set-up login (ABORTED COMMAND, 08/00).
fn login_storm(io: &str) {
    require_root("sessions through an FCoE hop");
    let probe = Command::new("iscsi-readcapacity16").arg("--help").output();
    assert!(
        probe.is_ok(),
        "iscsi-readcapacity16 (libiscsi-bin) is needed: {probe:?}"
    );
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut hop = Hop::start(dir.path(), io, "");
    const EACH: usize = 200;
    const AT_ONCE: usize = 3;
    let workers: Vec<_> = (0..AT_ONCE)
        .map(|w| {
            let url = hop.url();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for i in 0..EACH {
                    let out = Command::new("iscsi-readcapacity16")
                        .arg("-i")
                        .arg(format!("iqn.2026-11.io.unifab.test:storm-{w}"))
                        .arg(&url)
                        .output()
                        .unwrap();
                    if !out.status.success() {
                        failures.push(format!(
                            "worker {w}, session {i}: {}{}",
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        ));
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    hop.a.check_alive();
    hop.b.check_alive();
    let transport = hop.a.transport_failures();
    assert!(
        failures.is_empty() && transport.is_empty(),
        "{} of {} sessions failed:\n{}\ngateway A:\n{}",
        failures.len(),
        EACH * AT_ONCE,
        failures.join("\n"),
        transport.join("\n")
    );
    // Every session went through gateway A (the count is not a no-op).
    let sessions = std::fs::read_to_string(&hop.a.log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("session in full feature phase"))
        .count();
    assert_eq!(sessions, EACH * AT_ONCE, "sessions gateway A logged in");
}

#[test]
fn short_sessions_through_the_hop_over_af_packet_all_succeed() {
    login_storm("af_packet");
}

#[test]
fn short_sessions_through_the_hop_over_af_xdp_all_succeed() {
    login_storm("af_xdp");
}

/// `unifab bench URL` writing 1 MiB commands 32 at a time and reading
/// them back verified, each command within 20 s.
fn deep_bench(url: &str) -> Command {
    let mut c = Command::new(unifab_testkit::peers::unifab_bin().unwrap());
    c.args(["bench", url, "--rw", "wr", "--bs", "1MiB", "--qd", "32"])
        .args(["--command-timeout", "20"]);
    c
}

/// The lines of a gateway's log that tell of lost frames or a failed
/// forwarded command.
fn losses(gw: &Gw) -> Vec<String> {
    std::fs::read_to_string(&gw.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("receive drops") || l.contains("forwarded command failed"))
        .map(str::to_string)
        .collect()
}

/// Deep queues of large commands through the hop: `unifab bench` writes
/// 256 MiB in 1 MiB commands 32 at a time, then reads it all back,
/// verifying every block. Without PFC nothing can pause the far side, so
/// the gateways keep what is in flight toward each link within what it can
/// always take (`[fabric.initiator] max_frames_in` on A,
/// `[[fabric.target]] max_write_in_flight` on B). Without those bounds
/// (2026-11-24, the binary before them) B's AF_XDP link lost 540 frames
/// during the writes and A's 1,712 during the reads, and commands waited
/// out their timeout; AF_PACKET's 64 MiB socket buffers held.
fn deep_queues(io: &str) {
    require_root("deep queues through an FCoE hop");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let hop = Hop::start(dir.path(), io, "");
    let out = deep_bench(&hop.url())
        .args(["--size", "256MiB", "--seed", "7"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (la, lb) = (losses(&hop.a), losses(&hop.b));
    assert!(
        out.status.success() && la.is_empty() && lb.is_empty(),
        "unifab bench through the hop over {io}:\n{text}\ngateway A:\n{}\ngateway B:\n{}",
        la.join("\n"),
        lb.join("\n")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{io}: {}", stdout.lines().last().unwrap_or_default());
}

/// Several hosts reading deep through one ENode at once: each host's
/// session reaches the target through an NPIV port of its own
/// (`nexus = "per-initiator"`), and all of them share the link's frame
/// budget (`max_frames_in`, 4,104 frames by default, within the 4,160 the
/// AF_XDP link always takes). Three `unifab bench` processes, each its own
/// initiator on its own region, write 96 MiB in 1 MiB commands 32 at a
/// time and read it back verified, all at once. With a budget per NPIV
/// port, three hosts could have 12,312 frames coming back at once.
fn several_hosts_deep(io: &str) {
    require_root("several hosts reading deep through one FCoE ENode");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let hop = Hop::start(dir.path(), io, "");
    let hosts: Vec<_> = (0..3u64)
        .map(|k| {
            deep_bench(&hop.url())
                .args(["--offset", &format!("{}MiB", 96 * k), "--size", "96MiB"])
                .args(["--seed", &(11 + k).to_string()])
                .args([
                    "--initiator-name",
                    &format!("iqn.2026-11.io.unifab.test:host{k}"),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut failed = Vec::new();
    for (k, h) in hosts.into_iter().enumerate() {
        let out = h.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            println!(
                "{io} host{k}: {}",
                stdout.lines().last().unwrap_or_default()
            );
        } else {
            failed.push(format!(
                "host{k}: {}\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    let (la, lb) = (losses(&hop.a), losses(&hop.b));
    assert!(
        failed.is_empty() && la.is_empty() && lb.is_empty(),
        "three hosts through one ENode over {io}:\n{}\ngateway A:\n{}\ngateway B:\n{}",
        failed.join("\n"),
        la.join("\n"),
        lb.join("\n")
    );
}

#[test]
fn several_hosts_reading_deep_through_one_enode_over_af_xdp_lose_nothing() {
    several_hosts_deep("af_xdp");
}

#[test]
fn deep_queues_of_1mib_commands_through_the_hop_over_af_xdp_lose_nothing() {
    deep_queues("af_xdp");
}

#[test]
fn deep_queues_of_1mib_commands_through_the_hop_over_af_packet_lose_nothing() {
    deep_queues("af_packet");
}

/// Gateway B's FCF port removed by reload while gateway A's ENode is
/// logged in through it: B clears the virtual link (A's ENode loses its
/// FCF) and `show fcoe` lists no port; added again by reload: A's ENode
/// finds the FCF, logs in, and verified I/O through the hop works again.
#[test]
fn an_fcf_port_is_removed_and_added_by_reload() {
    require_root("the FCoE hop");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let hop = Hop::start(dir.path(), "af_packet", "");
    let login = || {
        RawSession::login(
            hop.a.iscsi.unwrap(),
            IQN,
            &RawOptions {
                timeout: Duration::from_secs(10),
                clear_unit_attention: false,
                ..RawOptions::default()
            },
        )
        .unwrap()
    };
    let mut s = login();
    let _ = s.command(&[0; 6], &[], 0);
    verified_io(&mut s, 4, 0);
    drop(s);

    assert!(
        hop.a.show("fcoe")[0]["fcf"].is_string(),
        "{}",
        hop.a.show("fcoe")
    );
    let path = dir.path().join("b.toml");
    let with_port = std::fs::read_to_string(&path).unwrap();
    let start = with_port.find("[[fcoe.port]]").unwrap();
    let end = with_port.find("[admin]").unwrap();
    let without = format!("{}{}", &with_port[..start], &with_port[end..]);
    let reload = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = Command::new(unifab_testkit::peers::unifab_bin().unwrap())
            .args(["reload", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let plan = reload(&without);
    let iface = &hop.veth.b;
    assert!(
        plan.contains(&format!("- [fcoe] port \"{iface}\" [live]")),
        "{plan}"
    );
    assert_eq!(hop.b.show("fcoe"), serde_json::json!([]));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !hop.a.show("fcoe")[0]["fcf"].is_null() {
        assert!(
            Instant::now() < deadline,
            "A's ENode kept its FCF: {}",
            hop.a.show("fcoe")
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let plan = reload(&with_port);
    assert!(
        plan.contains(&format!("+ [fcoe] port \"{iface}\" [live]")),
        "{plan}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut s = login();
        let ok = (0..3).any(|_| {
            s.write16(0, &[0x5c; 4096], 512, false)
                .is_ok_and(|r| r.status == 0)
        });
        if ok {
            verified_io(&mut s, 4, 4096);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no I/O through the re-added FCF port: A {} B {}",
            hop.a.show("fcoe"),
            hop.b.show("fcoe")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
