//! `[cluster]` against a real etcd (Debian `etcd-server`): two gateways
//! join, each lists both; a gateway killed with SIGKILL leaves the list
//! when its lease expires; a gateway cut from etcd (etcd stopped with
//! SIGSTOP) fences itself within its local deadline — its port's group
//! Unavailable, media commands refused — and serves again once it holds a
//! new lease. With a one-node Ceph (`scripts/ceph.sh`'s), a gateway that
//! left is blocklisted off the shared RBD image before the survivor takes
//! its place, and joins again as a new client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Gateway;
use unifab_testkit::peers::{Etcd, free_tcp_port, free_tcp_ports};
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// A gateway of the cluster; every gateway's LU is the same file,
/// `shared/disk.img` (opened with a shared lock in a cluster).
fn config(dir: &Path, name: &str, etcd: &str, port: u16, admin: SocketAddr) -> String {
    let shared = dir.parent().unwrap().join("shared");
    common::clustered_config(
        dir,
        &shared,
        "4MiB",
        &common::Member {
            name,
            etcd,
            listen: "127.0.0.1:0",
            rel: port,
            admin: &admin.to_string(),
        },
    )
}

/// Gateways gw-a (port 1, group 1: Active/Optimized) and gw-b (port 2,
/// group 2: Active/Non-optimized) of one cluster on `etcd`, with their
/// admin addresses; the directory holding theirs and the shared file.
fn two_gateways(
    etcd: &Etcd,
) -> (
    tempfile::TempDir,
    (Gateway, SocketAddr),
    (Gateway, SocketAddr),
) {
    two_gateways_a_at(etcd, &etcd.url())
}

/// [`two_gateways`], gw-a reaching etcd at `a_etcd` (a relay that can cut
/// it off).
fn two_gateways_a_at(
    etcd: &Etcd,
    a_etcd: &str,
) -> (
    tempfile::TempDir,
    (Gateway, SocketAddr),
    (Gateway, SocketAddr),
) {
    let (top, da, db) = dirs();
    let start = |dir: &Path, name: &str, etcd: &str, port: u16| {
        let admin: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
        let g = Gateway::start(dir, &config(dir, name, etcd, port, admin));
        (g, admin)
    };
    let a = start(&da, "gw-a", a_etcd, 1);
    let b = start(&db, "gw-b", &etcd.url(), 2);
    (top, a, b)
}

/// A fresh etcd and [`two_gateways`], gw-a reaching etcd through a relay
/// the test can freeze (cutting gw-a off while it keeps running).
#[allow(clippy::type_complexity)]
fn two_gateways_a_behind_a_relay() -> (
    Etcd,
    unifab_testkit::relay::TcpRelay,
    tempfile::TempDir,
    (Gateway, SocketAddr),
    (Gateway, SocketAddr),
) {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let relay = unifab_testkit::relay::TcpRelay::start(etcd.addr()).unwrap();
    let (top, a, b) = two_gateways_a_at(&etcd, &format!("http://{}", relay.addr()));
    (etcd, relay, top, a, b)
}

const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];

/// Host h1 logged in to A and holding RESERVE(6) through it; host h2 on
/// B, refused with RESERVATION CONFLICT.
fn reserve6_through_a(a: &Gateway, b: &Gateway) -> (RawSession, RawSession) {
    let host = |name: &str| RawOptions {
        initiator: name.into(),
        ..RawOptions::default()
    };
    let mut h1 = RawSession::login(a.addr, &a.iqn, &host("iqn.2026-11.io.unifab:h1")).unwrap();
    let mut h2 = RawSession::login(b.addr, &b.iqn, &host("iqn.2026-11.io.unifab:h2")).unwrap();
    read_until(&mut h1, (0, 0, 0), "A serves");
    read_until(&mut h2, (0, 0, 0), "B serves");
    assert_eq!(retrying(&mut h1, &RESERVE6, &[], 0).unwrap().status, 0);
    assert_eq!(retrying(&mut h2, &READ10, &[], 512).unwrap().status, 0x18);
    (h1, h2)
}

/// Waits (at most 20 s) until h2 reads through B: the RESERVE(6) held
/// through A is released. Only RESERVATION CONFLICT is expected before.
fn until_b_reads(h2: &mut RawSession, admin_b: SocketAddr, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = retrying(h2, &READ10, &[], 512).unwrap();
        if r.status == 0 {
            return;
        }
        assert!(
            r.status == 0x18,
            "through B: status {:#x} {:02x?}",
            r.status,
            sense(&r)
        );
        assert!(
            Instant::now() < deadline,
            "still RESERVATION CONFLICT through B 20 s after {after}: {:#?}",
            cluster(admin_b)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A host that sees unit attentions itself.
fn host_options() -> RawOptions {
    RawOptions {
        initiator: "iqn.2026-11.io.unifab:host".into(),
        clear_unit_attention: false,
        ..RawOptions::default()
    }
}

/// Two gateways' directories side by side, and the shared one beside.
fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let top = tempfile::tempdir().unwrap();
    let (a, b) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    (top, a, b)
}

fn cluster(admin: SocketAddr) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "cluster", "--json", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits (at most 15 s) until `show cluster` on `admin` satisfies `ok`.
fn wait_cluster(admin: SocketAddr, what: &str, ok: impl Fn(&[serde_json::Value]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rows = cluster(admin);
        if ok(&rows) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {rows:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of metric line `name` (with its labels) on `admin`.
fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "metrics", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// gw-a and gw-b listed, both members.
fn both(rows: &[serde_json::Value]) -> bool {
    names(rows)
        == vec![
            ("gw-a".to_string(), "member".to_string()),
            ("gw-b".to_string(), "member".to_string()),
        ]
}

fn names(rows: &[serde_json::Value]) -> Vec<(String, String)> {
    rows.iter()
        .map(|r| {
            (
                r["member"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn sense(r: &CommandResult) -> (u8, u8, u8) {
    if r.status != 2 {
        return (0, 0, 0);
    }
    (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
}

/// (state, group) of each descriptor of REPORT TARGET PORT GROUPS.
fn rtpg(s: &mut RawSession) -> Vec<(u8, u16)> {
    let r = s
        .command(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[], 256)
        .unwrap();
    if r.status == 2 && r.sense[2] & 0x0f == 6 {
        // A unit attention (ASYMMETRIC ACCESS STATE CHANGED): ask again.
        return Vec::new();
    }
    assert_eq!(r.status, 0, "RTPG: {:02x?}", r.sense);
    let len = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
    let d = &r.data[..4 + len];
    let mut out = Vec::new();
    let mut at = 4;
    while at < d.len() {
        out.push((d[at] & 0x0f, u16::from_be_bytes([d[at + 2], d[at + 3]])));
        at += 8 + 4 * usize::from(d[at + 7]);
    }
    out
}

/// RTPG until it answers `want`, at most 15 s.
fn rtpg_until(s: &mut RawSession, want: &[(u8, u16)], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = rtpg(s);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// READ(10) until it gets `want` (key, ASC, ASCQ; GOOD is zeros), past any
/// ASYMMETRIC ACCESS STATE CHANGED; at most 15 s.
fn read_until(s: &mut RawSession, want: (u8, u8, u8), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let got = sense(&s.command(&READ10, &[], 512).unwrap());
        if got == want {
            return;
        }
        assert!(
            got == (6, 0x2a, 0x06) || got == (2, 0x04, 0x0c) || got == (0, 0, 0) || got.0 == 6,
            "{what}: unexpected {got:02x?}"
        );
        assert!(Instant::now() < deadline, "{what}: still {got:02x?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn gateways_join_leave_and_fence_themselves_when_cut_from_etcd() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, (a, admin_a), (b, admin_b)) = two_gateways(&etcd);
    wait_cluster(admin_a, "both listed on A", both);
    wait_cluster(admin_b, "both listed on B", both);

    let opts = host_options();
    let mut host = RawSession::login(a.addr, &a.iqn, &opts).unwrap();
    read_until(&mut host, (0, 0, 0), "A serves once a member");
    rtpg_until(&mut host, &[(0, 1), (1, 2)], "both groups as configured");
    assert_eq!(metric(admin_a, "unifab_cluster_member"), Some(1.0));
    assert_eq!(metric(admin_a, "unifab_cluster_members"), Some(2.0));
    // Unavailable at start, then as configured: at least one transition.
    let t = metric(admin_a, "unifab_lu_alua_transitions_total{lu=\"disk\"}").unwrap();
    assert!(t >= 1.0, "{t}");

    // B dies: it leaves A's list when its lease expires, and its group is
    // Unavailable.
    b.kill();
    wait_cluster(admin_a, "B gone after its TTL", |rows| {
        names(rows) == vec![("gw-a".to_string(), "member".to_string())]
    });
    rtpg_until(&mut host, &[(0, 1), (3, 2)], "B's group Unavailable");

    // etcd stops answering: A fences itself.
    let pid = etcd.pid().to_string();
    let cut = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    read_until(
        &mut host,
        (2, 0x04, 0x0c),
        "A fenced: TARGET PORT IN UNAVAILABLE STATE",
    );
    let fenced_after = cut.elapsed();
    let rows = cluster(admin_a);
    assert_eq!(rows.last().unwrap()["state"], "fenced", "{rows:#?}");
    // At least this once (a loaded machine may have fenced it before).
    assert!(rows.last().unwrap()["fenced"].as_u64().unwrap() >= 1);
    assert_eq!(metric(admin_a, "unifab_cluster_member"), Some(0.0));
    assert!(metric(admin_a, "unifab_cluster_fenced_total").unwrap() >= 1.0);
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_cluster(admin_a, "A a member again", |rows| {
        names(rows) == vec![("gw-a".to_string(), "member".to_string())]
    });
    read_until(&mut host, (0, 0, 0), "A serves again");
    println!("fenced {fenced_after:?} after etcd stopped (lease TTL 3 s, local deadline 2 s)");
}

/// A gateway whose `[iscsi] relative_port` a member has already, or whose
/// `cluster.name` another gateway uses, does not join: it stays fenced
/// (its port Unavailable to its hosts) and `show cluster` says why, while
/// the members go on as they were.
#[test]
fn a_taken_relative_port_or_name_keeps_a_gateway_out() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (top, (a, admin_a), (_b, admin_b)) = two_gateways(&etcd);
    wait_cluster(admin_a, "both listed on A", both);
    wait_cluster(admin_b, "both listed on B", both);
    let refused = |dir: &str, name: &str, rel: u16, why: &'static str| {
        let d = top.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        let admin: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
        let g = Gateway::start(&d, &config(&d, name, &etcd.url(), rel, admin));
        wait_cluster(admin, why, |rows| {
            rows.iter().any(|r| {
                r["this"] == true
                    && r["state"] != "member"
                    && r["last_error"].as_str().is_some_and(|e| e.contains(why))
            })
        });
        let mut host = RawSession::login(g.addr, &g.iqn, &host_options()).unwrap();
        read_until(
            &mut host,
            (2, 0x04, 0x0c),
            "kept out: TARGET PORT IN UNAVAILABLE STATE",
        );
        g
    };
    let _c = refused("c", "gw-c", 1, "has relative port 1 too");
    let _d = refused("d", "gw-b", 2, "another gateway is a member as \"gw-b\"");
    // The members saw neither join.
    assert!(both(&cluster(admin_a)), "{:#?}", cluster(admin_a));
    assert!(both(&cluster(admin_b)), "{:#?}", cluster(admin_b));
    let mut host = RawSession::login(a.addr, &a.iqn, &host_options()).unwrap();
    read_until(&mut host, (0, 0, 0), "A serves on");
}

/// A host holds RESERVE(6) through A; another host, through B, gets
/// RESERVATION CONFLICT. A dies (SIGKILL): when its lease expires B, the
/// member left, releases the reservation — every I_T nexus through A went
/// with A, and a RESERVE(6) ends with its holder's nexus (SPC-2) — and the
/// host through B reads and reserves. Fails where the reservation outlives
/// the gateway it was held through.
#[test]
fn a_reserve6_held_through_a_gateway_that_died_is_released() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, (a, admin_a), (b, admin_b)) = two_gateways(&etcd);
    wait_cluster(admin_a, "both listed on A", both);
    wait_cluster(admin_b, "both listed on B", both);
    let (_h1, mut h2) = reserve6_through_a(&a, &b);
    a.kill();
    until_b_reads(&mut h2, admin_b, "A died");
    assert_eq!(retrying(&mut h2, &RESERVE6, &[], 0).unwrap().status, 0);
}

/// A gateway cut from etcd long enough to lose its lease keeps its
/// sessions, but the survivor treats every nexus through it as lost and
/// releases the RESERVE(6) a host held through it. When the gateway joins
/// again, that host hears I_T NEXUS LOSS OCCURRED before anything else
/// it sends is served, and finds the reservation gone. Fails where the
/// host, never logged out, goes on believing it holds the reservation.
#[test]
fn a_host_on_a_fenced_gateway_hears_that_its_reserve6_was_released() {
    let (_etcd, relay, _top, (a, admin_a), (b, admin_b)) = two_gateways_a_behind_a_relay();
    wait_cluster(admin_a, "both listed on A", both);
    wait_cluster(admin_b, "both listed on B", both);
    let (mut h1, mut h2) = reserve6_through_a(&a, &b);

    // A is cut from etcd; once its lease has expired B releases h1's
    // RESERVE(6), and h2 reads.
    relay.freeze();
    until_b_reads(&mut h2, admin_b, "A was cut");
    relay.thaw();
    wait_cluster(admin_a, "A a member again", both);

    // h1's commands through A: unit attentions (the ALUA changes, and the
    // nexus loss), then served, with nothing reserved.
    let mut heard = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let last = loop {
        let r = h1.command(&READ10, &[], 512).unwrap();
        let s = sense(&r);
        if r.status == 2 && s.0 == 6 {
            heard.push((s.1, s.2));
        } else if r.status == 2 && s == (2, 0x04, 0x0c) {
            // A's group not yet available again.
            assert!(Instant::now() < deadline, "A never served again");
            std::thread::sleep(Duration::from_millis(50));
        } else {
            break r;
        }
        assert!(
            heard.len() < 16,
            "unit attentions without end: {heard:02x?}"
        );
    };
    assert!(
        heard.contains(&(0x29, 0x07)),
        "h1 was not told its nexus counts as lost (I_T NEXUS LOSS OCCURRED); it heard {heard:02x?}"
    );
    assert_eq!(
        last.status,
        0,
        "h1's read after the unit attentions: {:02x?}",
        sense(&last)
    );
    let lus = cluster_lus(admin_a);
    assert!(
        lus[0]["reservation"].is_null(),
        "A lists a reservation: {lus:#?}"
    );
    assert_eq!(retrying(&mut h2, &RESERVE6, &[], 0).unwrap().status, 0);
    println!("h1 heard {heard:02x?}");
}

/// The clustered LUs as `unifab show cluster` lists them on `admin`.
fn cluster_lus(admin: SocketAddr) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args([
            "show",
            "cluster-lus",
            "--json",
            "--admin",
            &admin.to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The Active/Optimized gateway dies: the survivor promotes its own
/// Active/Non-optimized group, and its host hears of it.
#[test]
fn the_survivor_of_the_optimized_gateway_takes_over() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, (a, _), (b, admin_b)) = two_gateways(&etcd);
    wait_cluster(admin_b, "both listed on B", |rows| rows.len() == 2);
    let opts = host_options();
    let mut host = RawSession::login(b.addr, &b.iqn, &opts).unwrap();
    read_until(&mut host, (0, 0, 0), "B serves (Active/Non-optimized)");
    rtpg_until(&mut host, &[(0, 1), (1, 2)], "as configured");
    // What a host wrote through A, acknowledged, reads back through B
    // once A is gone: one LU (one file) behind both.
    let mut via_a = RawSession::login(a.addr, &a.iqn, &opts).unwrap();
    read_until(&mut via_a, (0, 0, 0), "A serves");
    let data: Vec<u8> = (0..64 * 512).map(|i| (i * 7 + 3) as u8).collect();
    let write10 = [0x2a, 0, 0, 0, 0, 16, 0, 0, 64, 0];
    let w = via_a.command(&write10, &data, 0).unwrap();
    assert_eq!(w.status, 0, "write through A: {:02x?}", w.sense);
    a.kill();
    rtpg_until(
        &mut host,
        &[(3, 1), (0, 2)],
        "B promoted, A's group Unavailable",
    );
    read_until(&mut host, (0, 0, 0), "B serves as the owner");
    let r = host
        .command(&[0x28, 0, 0, 0, 0, 16, 0, 0, 64, 0], &[], 64 * 512)
        .unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == data, "what A acknowledged reads back through B");
}

/// Outside a cluster a gateway holds its file alone: one that is not
/// clustered cannot open the file clustered gateways hold.
#[test]
fn only_clustered_gateways_share_a_file() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, da, db) = dirs();
    let admin_a: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
    let _a = Gateway::start(&da, &config(&da, "gw-a", &etcd.url(), 1, admin_a));
    let clustered = config(&db, "gw-b", &etcd.url(), 2, admin_a);
    let lu_only = clustered
        .split("[iscsi]")
        .next()
        .unwrap()
        .replace("explicit = false", "");
    let alone = format!(
        "{lu_only}[iscsi]\nlisten = [\"127.0.0.1:0\"]\nrelative_port = 2\nport_group = 2\n[admin]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}/state\"\n",
        db.display()
    );
    let path = db.join("alone.toml");
    std::fs::write(&path, alone).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is locked by another user"), "{err}");
    println!("refused: {}", err.lines().last().unwrap_or(""));
}

/// PERSISTENT RESERVE OUT `sa` (type `ty`) with reservation key `rk`,
/// service action key `sark` and the flags byte.
fn prout(s: &mut RawSession, sa: u8, ty: u8, rk: u64, sark: u64, flags: u8) -> CommandResult {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = flags;
    s.command(&[0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], &p, 0)
        .unwrap()
}

/// `cdb` with `data` until it is answered other than with a unit
/// attention (an ALUA transition, a reset: retried, as a host does).
fn retrying(
    s: &mut RawSession,
    cdb: &[u8],
    data: &[u8],
    alloc: u32,
) -> std::io::Result<CommandResult> {
    for _ in 0..20 {
        let r = s.command(cdb, data, alloc)?;
        if r.status == 2 && r.sense[2] & 0x0f == 6 {
            continue;
        }
        return Ok(r);
    }
    Err(std::io::Error::other("unit attentions without end"))
}

/// Failover under load, nothing lost: host H1 holds a WRITE EXCLUSIVE –
/// REGISTRANTS ONLY reservation (registered on every target port) and
/// writes random data at random places through the Active/Optimized
/// gateway A; A is SIGKILLed at a random moment mid-stream; H1 carries on
/// through B. Every write acknowledged (through either) reads back through
/// B, the reservation is still held, and a second initiator's write is
/// refused with RESERVATION CONFLICT through the survivor — and through A
/// once it is back. Three rounds, one file behind both gateways.
#[test]
fn failover_under_load_keeps_every_acknowledged_write_and_the_reservation() {
    use rand::{Rng, RngExt, SeedableRng};
    let seed: u64 = rand::rng().random();
    eprintln!("failover seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, da, db) = dirs();
    let [admin_a, admin_b] = free_tcp_ports::<2>()
        .unwrap()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let b = Gateway::start(&db, &config(&db, "gw-b", &etcd.url(), 2, admin_b));
    let h1 = RawOptions {
        initiator: "iqn.2026-11.io.unifab:h1".into(),
        ..host_options()
    };
    let h2 = RawOptions {
        initiator: "iqn.2026-11.io.unifab:h2".into(),
        ..host_options()
    };
    const KEY: u64 = 0x00c0_ffee;
    const BLOCKS: u64 = 4 << 20 >> 9;
    // Every acknowledged write: LBA (of 8 blocks) -> data.
    let mut acked: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let write16 = |lba: u64| {
        let mut c = [0u8; 16];
        c[0] = 0x8a;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&8u32.to_be_bytes());
        c
    };
    let read16 = |lba: u64| {
        let mut c = [0u8; 16];
        c[0] = 0x88;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&8u32.to_be_bytes());
        c
    };
    for round in 0..3 {
        let a = Gateway::start(&da, &config(&da, "gw-a", &etcd.url(), 1, admin_a));
        wait_cluster(admin_b, "both listed on B", |rows| rows.len() == 2);
        let mut via_b = RawSession::login(b.addr, &b.iqn, &h1).unwrap();
        read_until(&mut via_b, (0, 0, 0), "B serves");
        rtpg_until(&mut via_b, &[(0, 1), (1, 2)], "as configured");
        let mut via_a = RawSession::login(a.addr, &a.iqn, &h1).unwrap();
        read_until(&mut via_a, (0, 0, 0), "A serves");
        let mut other_a = RawSession::login(a.addr, &a.iqn, &h2).unwrap();
        read_until(&mut other_a, (0, 0, 0), "A serves H2");
        if round == 0 {
            // REGISTER with ALL_TG_PT, then RESERVE type 5, through A.
            let r = prout(&mut via_a, 0, 0, 0, KEY, 0x04);
            assert_eq!(r.status, 0, "REGISTER: {:02x?}", r.sense);
            let r = prout(&mut via_a, 1, 5, KEY, 0, 0);
            assert_eq!(r.status, 0, "RESERVE: {:02x?}", r.sense);
        }
        // The reservation holds through A (back, in later rounds).
        let r = retrying(&mut other_a, &write16(0), &[0u8; 4096], 0).unwrap();
        assert_eq!(r.status, 0x18, "round {round}: H2's write through A");
        // A dies at a random moment while H1 writes.
        let pid = a.child.id();
        let after = Duration::from_millis(rng.random_range(50..600));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(after);
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            a
        });
        let mut a_alive = true;
        let killed_by = Instant::now() + after;
        let mut through_b = 0;
        // Write until A is dead and B has written for one TTL and more
        // (through B's promotion and its unit attentions).
        while a_alive || through_b < 50 || Instant::now() < killed_by + Duration::from_secs(4) {
            let lba = rng.random_range(0..BLOCKS / 8) * 8;
            let mut data = vec![0u8; 4096];
            rng.fill_bytes(&mut data);
            if a_alive {
                match retrying(&mut via_a, &write16(lba), &data, 0) {
                    Ok(r) if r.status == 0 => {
                        acked.insert(lba, data);
                        continue;
                    }
                    // The connection went with A; or a NOT READY from a
                    // dying A: the write goes through B.
                    _ => a_alive = false,
                }
            }
            let r = retrying(&mut via_b, &write16(lba), &data, 0).unwrap();
            assert_eq!(
                r.status, 0,
                "round {round}: write through B: {:02x?}",
                r.sense
            );
            acked.insert(lba, data);
            through_b += 1;
        }
        let a = killer.join().unwrap();
        drop(a);
        rtpg_until(&mut via_b, &[(3, 1), (0, 2)], "B promoted");
        // Everything acknowledged reads back through B.
        for (lba, data) in &acked {
            let r = retrying(&mut via_b, &read16(*lba), &[], 4096).unwrap();
            assert_eq!(r.status, 0);
            assert!(r.data == *data, "round {round}: LBA {lba} differs");
        }
        // The reservation is still held and enforced by the survivor.
        let r = via_b
            .command(&[0x5e, 0x01, 0, 0, 0, 0, 0, 0, 64, 0], &[], 64)
            .unwrap();
        assert_eq!(r.status, 0);
        assert_eq!(
            &r.data[8..16],
            &KEY.to_be_bytes(),
            "round {round}: the holder's key"
        );
        assert_eq!(r.data[21] & 0x0f, 5, "round {round}: the type");
        let mut other_b = RawSession::login(b.addr, &b.iqn, &h2).unwrap();
        let r = retrying(&mut other_b, &write16(0), &[0u8; 4096], 0).unwrap();
        assert_eq!(r.status, 0x18, "round {round}: H2's write through B");
        // show cluster: B owns the LU now, and the reservation is H1's.
        let lus = cluster_lus(admin_b);
        assert_eq!(lus.len(), 1, "{lus:#?}");
        assert_eq!(lus[0]["lu"], "disk");
        assert_eq!(lus[0]["owner"], "gw-b", "{lus:#?}");
        assert_eq!(
            lus[0]["alua"], "1 unavailable, 2 active/optimized",
            "{lus:#?}"
        );
        let held = lus[0]["reservation"].as_str().unwrap_or_default();
        assert!(
            held.starts_with("PR type 5 by iqn.2026-11.io.unifab:h1 (key 0xc0ffee"),
            "{held}"
        );
        let table = Command::new(env!("CARGO_BIN_EXE_unifab"))
            .args(["show", "cluster", "--admin", &admin_b.to_string()])
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&table.stdout);
        assert!(
            table.contains("RESERVATION") && table.contains("gw-b"),
            "{table}"
        );
        println!(
            "round {round}: {} blocks of 8 acknowledged, {through_b} writes through B after A died",
            acked.len()
        );
        wait_cluster(admin_b, "A gone", |rows| rows.len() == 1);
    }
}

/// Fencing: gateway A reaches etcd only through a relay, which freezes (a
/// stopped etcd proxy: connections open, nothing answered). A host keeps
/// writing through A all along. A fences itself at its local deadline;
/// B takes over only after A's lease has expired at etcd; B then writes a
/// marker — and no write through A lands after it: the marker is still
/// there seconds later, and every write A acknowledged was answered
/// before B took over.
#[test]
fn a_gateway_cut_from_etcd_lands_no_write_after_the_other_took_over() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_etcd, relay, _top, (a, _), (b, admin_b)) = two_gateways_a_behind_a_relay();
    wait_cluster(admin_b, "both listed on B", |rows| rows.len() == 2);
    let opts = host_options();
    let mut host_b = RawSession::login(b.addr, &b.iqn, &opts).unwrap();
    read_until(&mut host_b, (0, 0, 0), "B serves");
    rtpg_until(&mut host_b, &[(0, 1), (1, 2)], "as configured");
    let mut host_a = RawSession::login(a.addr, &a.iqn, &opts).unwrap();
    read_until(&mut host_a, (0, 0, 0), "A serves");

    // The host writes block 0 through A without pause: "A" and a counter.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut acked: Vec<(u64, Instant)> = Vec::new();
            let mut refused = 0u64;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let mut data = vec![0u8; 512];
                data[0] = b'A';
                data[1..9].copy_from_slice(&n.to_be_bytes());
                match host_a.command(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &data, 0) {
                    Ok(r) if r.status == 0 => acked.push((n, Instant::now())),
                    Ok(_) => {
                        refused += 1;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => break,
                }
            }
            (acked, refused)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    relay.freeze();
    let cut = Instant::now();
    // B takes over: A's group Unavailable, B's promoted.
    rtpg_until(&mut host_b, &[(3, 1), (0, 2)], "B took over");
    let took_over = Instant::now();
    let mut marker = vec![0u8; 512];
    marker[0] = b'B';
    let r = retrying(&mut host_b, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0], &marker, 0).unwrap();
    assert_eq!(r.status, 0, "B's marker: {:02x?}", r.sense);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let (acked, refused) = writer.join().unwrap();
    let r = retrying(&mut host_b, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512).unwrap();
    assert_eq!(r.status, 0);
    assert!(
        r.data == marker,
        "a write through A landed after B took over: block 0 starts {:02x?}",
        &r.data[..9]
    );
    let last = acked.last().expect("A acknowledged writes before the cut");
    assert!(
        last.1 < took_over,
        "A acknowledged write {} {:?} after B took over",
        last.0,
        last.1 - took_over
    );
    assert!(refused > 0, "A went on writing without refusals");
    println!(
        "A: {} writes acknowledged, the last {:?} after the cut; {refused} refused; B took over {:?} after the cut",
        acked.len(),
        last.1.saturating_duration_since(cut),
        took_over - cut
    );
    relay.thaw();
}

/// SET TARGET PORT GROUPS through one gateway moves the groups on every
/// gateway: the optimized group moves to B's, every host on every path
/// but the one that asked hears ASYMMETRIC ACCESS STATE CHANGED, both
/// report the same states with STATUS CODE 01h; and when the gateway of
/// the group made optimized dies, the policy promotes the survivor's.
#[test]
fn set_target_port_groups_through_one_gateway_moves_the_groups_on_every_gateway() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (_top, da, db) = dirs();
    let start = |dir: &Path, name: &str, port: u16| {
        let admin: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
        let text = config(dir, name, &etcd.url(), port, admin)
            .replace("explicit = false", "explicit = true");
        (Gateway::start(dir, &text), admin)
    };
    let (a, _) = start(&da, "gw-a", 1);
    let (b, admin_b) = start(&db, "gw-b", 2);
    wait_cluster(admin_b, "both listed on B", |rows| rows.len() == 2);
    let opts = host_options();
    let mut via_a = RawSession::login(a.addr, &a.iqn, &opts).unwrap();
    let mut via_b = RawSession::login(b.addr, &b.iqn, &opts).unwrap();
    read_until(&mut via_a, (0, 0, 0), "A serves");
    read_until(&mut via_b, (0, 0, 0), "B serves");
    rtpg_until(&mut via_a, &[(0, 1), (1, 2)], "as configured, through A");
    rtpg_until(&mut via_b, &[(0, 1), (1, 2)], "as configured, through B");
    // No unit attention left on either path.
    for s in [&mut via_a, &mut via_b] {
        while sense(&s.command(&[0; 6], &[], 0).unwrap()) != (0, 0, 0) {}
    }
    // Through A: group 1 Active/Non-optimized, group 2 Active/Optimized.
    let p = [0u8, 0, 0, 0, 0x01, 0, 0, 1, 0x00, 0, 0, 2];
    let r = via_a
        .command(&[0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0], &p, 0)
        .unwrap();
    assert_eq!(r.status, 0, "STPG: {:02x?}", r.sense);
    // B's host hears of it; A's, which asked, does not.
    assert_eq!(
        sense(&via_b.command(&[0; 6], &[], 0).unwrap()),
        (6, 0x2a, 0x06)
    );
    assert_eq!(sense(&via_a.command(&[0; 6], &[], 0).unwrap()), (0, 0, 0));
    assert_eq!(rtpg(&mut via_a), vec![(1, 1), (0, 2)]);
    assert_eq!(rtpg(&mut via_b), vec![(1, 1), (0, 2)]);
    // STATUS CODE 01h (by SET TARGET PORT GROUPS) on both.
    for s in [&mut via_a, &mut via_b] {
        let r = s
            .command(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[], 256)
            .unwrap();
        assert_eq!(
            (r.data[4 + 5], r.data[16 + 5]),
            (1, 1),
            "{:02x?}",
            &r.data[..28]
        );
    }
    // B, now the optimized group's gateway, dies: A's group is promoted.
    b.kill();
    rtpg_until(
        &mut via_a,
        &[(0, 1), (3, 2)],
        "A promoted, B's group Unavailable",
    );
}

/// The initiator follows ALUA across portals: a third gateway bridges to
/// the clustered LU through both gateways (`iscsi://A` with `portals =
/// [B]`), learns A's path Active/Optimized and B's Active/Non-optimized
/// (`show remotes`), sends its host's commands through A, and when A is
/// SIGKILLed carries on through B: every write its host had acknowledged
/// reads back, and `show remotes` reports the path failures and B's path
/// Active/Optimized once B is promoted.
#[test]
fn a_bridge_with_two_portals_follows_alua_and_fails_over() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let (top, (a, _), (b, admin_b)) = two_gateways(&etcd);
    wait_cluster(admin_b, "both listed on B", |rows| rows.len() == 2);
    let mut probe = RawSession::login(b.addr, &b.iqn, &host_options()).unwrap();
    rtpg_until(&mut probe, &[(0, 1), (1, 2)], "as configured");
    let front_dir = top.path().join("front");
    std::fs::create_dir_all(&front_dir).unwrap();
    let admin_f: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
    let front = Gateway::start(
        &front_dir,
        &format!(
            r#"
[[lu]]
name = "bridged"
backend = "iscsi://{}/{}/0"
[lu.iscsi]
portals = ["{}"]
replacement_timeout = 1
command_timeout = 5

[iscsi]
listen = ["127.0.0.1:0"]
[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:front"
luns = ["bridged"]

[admin]
listen = "{admin_f}"
data_dir = "{}/state"
"#,
            a.addr,
            a.iqn,
            b.addr,
            front_dir.display()
        ),
    );
    let remotes = || {
        let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
            .args(["show", "remotes", "--json", "--admin", &admin_f.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        rows
    };
    // (remote portal, path state) of the front's rows.
    let paths = || -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = remotes()
            .iter()
            .map(|r| {
                (
                    r["remote"].as_str().unwrap().to_string(),
                    r["path"].as_str().unwrap_or("-").to_string(),
                )
            })
            .collect();
        v.dedup();
        v
    };
    let opts = RawOptions {
        timeout: Duration::from_secs(30),
        ..host_options()
    };
    let mut host = RawSession::login(front.addr, &front.iqn, &opts).unwrap();
    read_until(&mut host, (0, 0, 0), "the front serves");
    let via_a = format!("iscsi://{}/{}/0", a.addr, a.iqn);
    let via_b = format!("iscsi://{}/{}/0", b.addr, b.iqn);
    let want = vec![
        (via_a.clone(), "active/optimized".to_string()),
        (via_b.clone(), "active/non-optimized".to_string()),
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    while paths() != want {
        assert!(Instant::now() < deadline, "path states: {:?}", paths());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Writes through the front; A dies part way.
    let mut acked: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut a = Some(a);
    for i in 0..64u32 {
        if i == 24 {
            a.take().unwrap().kill();
        }
        let data: Vec<u8> = (0..4096u32).map(|k| (k * 31 + i * 7) as u8).collect();
        let lba = i * 8;
        let mut cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        let r = retrying(&mut host, &cdb, &data, 0).unwrap();
        assert_eq!(r.status, 0, "write {i} through the front: {:02x?}", r.sense);
        acked.push((lba, data));
    }
    for (lba, data) in &acked {
        let mut cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        let r = retrying(&mut host, &cdb, &[], 4096).unwrap();
        assert_eq!(r.status, 0);
        assert!(r.data == *data, "LBA {lba} differs");
    }
    // B promoted once A's lease expired; the front learns it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = remotes();
        let b_row = rows.iter().find(|r| r["remote"] == via_b.as_str()).unwrap();
        let a_row = rows.iter().find(|r| r["remote"] == via_a.as_str()).unwrap();
        if b_row["path"] == "active/optimized"
            && a_row["path_detail"]["failures"].as_u64().unwrap_or(0) >= 1
        {
            break;
        }
        assert!(Instant::now() < deadline, "after A's death: {rows:#?}");
        // The front learns states again when a command tells it to.
        let _ = host.command(&READ10, &[], 512);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The address (`IP:PORT/NONCE`) of each client watching RBD image `image`.
fn rbd_watchers(ceph: &unifab_testkit::peers::Ceph, image: &str) -> Vec<String> {
    let status = ceph
        .rbd(&["status", &format!("rbd/{image}")])
        .expect("rbd status");
    status
        .lines()
        .filter_map(|l| l.trim().strip_prefix("watcher="))
        .filter_map(|w| w.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A gateway that left the cluster is fenced off the shared RBD image
/// before the survivor takes its place, and serves again as a new client.
/// gw-a (Active/Optimized) and gw-b front one image (no exclusive lock:
/// the cluster arbitrates); gw-a reaches etcd through a relay that
/// freezes. Once gw-a's lease is gone, gw-b blocklists gw-a's librados
/// client (announced in etcd as gw-a registered) and only then promotes
/// its own group; when the relay thaws, gw-a reopens the image as a new
/// client before it registers again, writes through it (a blocklisted
/// client would answer NOT READY, MANUAL INTERVENTION REQUIRED for
/// good), and gw-b reads what it wrote. A RESERVE(6) held through gw-a's
/// port is released once gw-a's client is fenced off.
#[test]
fn a_departed_gateway_is_fenced_off_the_rbd_image_and_serves_again_as_a_new_client() {
    use unifab_testkit::peers::{Ceph, ObjectStore};
    let ceph = Ceph::start(ObjectStore::Memstore)
        .unwrap_or_else(|e| panic!("the test Ceph cluster did not start: {e}"));
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let relay = unifab_testkit::relay::TcpRelay::start(etcd.addr()).unwrap();
    let (_top, da, db) = dirs();
    let lu = format!(
        "backend = \"rbd:rbd/shared\"\nsize = \"16MiB\"\nceph_conf = \"{}\"\nceph_exclusive_lock = false",
        ceph.conf().display()
    );
    let start = |dir: &Path, name: &str, etcd: &str, rel: u16| {
        let admin: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
        let member = common::Member {
            name,
            etcd,
            listen: "127.0.0.1:0",
            rel,
            admin: &admin.to_string(),
        };
        let g = Gateway::start(dir, &common::clustered_config_with(dir, &lu, &member));
        (g, admin)
    };
    let (a, admin_a) = start(&da, "gw-a", &format!("http://{}", relay.addr()), 1);
    wait_cluster(admin_a, "gw-a a member", |rows| {
        names(rows) == [("gw-a".to_string(), "member".to_string())]
    });
    let old_a = rbd_watchers(&ceph, "shared");
    assert_eq!(old_a.len(), 1, "gw-a alone watches the image: {old_a:?}");
    let (b, admin_b) = start(&db, "gw-b", &etcd.url(), 2);
    wait_cluster(admin_b, "both listed on B", both);

    // h1 holds RESERVE(6) through A; h2 on B is refused.
    let (mut host_a, mut host_b) = reserve6_through_a(&a, &b);
    rtpg_until(&mut host_b, &[(0, 1), (1, 2)], "as configured");
    for _ in 0..20 {
        let r = retrying(&mut host_a, &READ10, &[], 512).unwrap();
        assert_eq!(r.status, 0, "{:02x?}", r.sense);
    }
    let ops = r#"unifab_lu_backend_operations_total{lu="disk"}"#;
    let ops_before = metric(admin_a, ops).expect("gw-a's backend operations");
    assert!(ops_before >= 20.0, "{ops_before}");

    relay.freeze();
    let nonce = old_a[0].rsplit('/').next().unwrap();
    let blocklisted = || {
        let list = ceph
            .ceph(&["osd", "blocklist", "ls"])
            .expect("ceph osd blocklist ls");
        (list.contains(&format!("/{nonce}")), list)
    };
    rtpg_until(&mut host_b, &[(3, 1), (0, 2)], "B took over");
    // B promoted its group: gw-a's client is on the blocklist already.
    let (fenced, list) = blocklisted();
    assert!(
        fenced,
        "gw-b took over before gw-a's client {} was blocklisted: {list}",
        old_a[0]
    );
    // And the RESERVE(6) held through gw-a's port is released (after the
    // blocklist, which the promotion showed).
    until_b_reads(&mut host_b, admin_b, "gw-a left");
    let own = |rows: &[serde_json::Value]| rows.iter().find(|r| r["this"] == true).cloned();
    let row = own(&cluster(admin_b)).unwrap();
    assert!(row["storage_fences"].as_u64() >= Some(1), "{row:#}");
    assert_eq!(
        metric(admin_b, "unifab_cluster_storage_fences_total"),
        Some(1.0)
    );

    relay.thaw();
    wait_cluster(admin_a, "gw-a a member again", |rows| {
        own(rows).is_some_and(|r| r["state"] == "member")
    });
    let data: Vec<u8> = (0..512).map(|i| (i * 13 + 5) as u8).collect();
    let write10 = [0x2a, 0, 0, 0, 0, 8, 0, 0, 1, 0];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = retrying(&mut host_a, &write10, &data, 0).unwrap();
        if r.status == 0 {
            break;
        }
        let got = sense(&r);
        assert_ne!(
            got,
            (2, 0x04, 0x03),
            "gw-a's write met the blocklist: it did not reopen the image"
        );
        assert!(Instant::now() < deadline, "gw-a does not write: {got:02x?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = retrying(&mut host_b, &[0x28, 0, 0, 0, 0, 8, 0, 0, 1, 0], &[], 512).unwrap();
    assert_eq!(r.status, 0, "{:02x?}", r.sense);
    assert!(
        r.data == data,
        "what gw-a wrote as a new client reads back through gw-b"
    );
    // The new client counts on from the old one's figures.
    let ops_after = metric(admin_a, ops).expect("gw-a's backend operations");
    assert!(ops_after > ops_before, "{ops_after} after {ops_before}");
    let now = rbd_watchers(&ceph, "shared");
    assert!(
        now.len() == 2 && !now.contains(&old_a[0]),
        "gw-a watches as a new client: {now:?}, was {old_a:?}"
    );
}
