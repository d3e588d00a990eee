//! `[cluster]` against a real etcd (Debian `etcd-server`): two gateways
//! join, each lists both; a gateway killed with SIGKILL leaves the list
//! when its lease expires; a gateway cut from etcd (etcd stopped with
//! SIGSTOP) fences itself within its local deadline — its port's group
//! Unavailable, media commands refused — and serves again once it holds a
//! new lease.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Gateway;
use unifab_testkit::peers::{Etcd, free_tcp_port};
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

fn config(dir: &Path, name: &str, etcd: &str, port: u16, admin: SocketAddr) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "memory"
size = "4MiB"

[lu.alua]
[[lu.alua.group]]
id = 1
state = "active/optimized"
ports = [1]
[[lu.alua.group]]
id = 2
state = "active/non-optimized"
ports = [2]

[iscsi]
listen = ["127.0.0.1:0"]
relative_port = {port}
port_group = {port}

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:clustered"
luns = ["disk"]

[cluster]
name = "{name}"
etcd = ["{etcd}"]
lease_ttl = "2s"

[admin]
listen = "{admin}"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
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
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let admin_a: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
    let admin_b: SocketAddr = ([127, 0, 0, 1], free_tcp_port().unwrap()).into();
    let a = Gateway::start(
        da.path(),
        &config(da.path(), "gw-a", &etcd.url(), 1, admin_a),
    );
    let b = Gateway::start(
        db.path(),
        &config(db.path(), "gw-b", &etcd.url(), 2, admin_b),
    );
    let both = |rows: &[serde_json::Value]| {
        names(rows)
            == vec![
                ("gw-a".to_string(), "member".to_string()),
                ("gw-b".to_string(), "member".to_string()),
            ]
    };
    wait_cluster(admin_a, "both listed on A", both);
    wait_cluster(admin_b, "both listed on B", both);

    let opts = RawOptions {
        initiator: "iqn.2026-11.io.unifab:host".into(),
        clear_unit_attention: false,
        ..RawOptions::default()
    };
    let mut host = RawSession::login(a.addr, &a.iqn, &opts).unwrap();
    read_until(&mut host, (0, 0, 0), "A serves once a member");

    // B dies: it leaves A's list when its lease expires.
    b.kill();
    wait_cluster(admin_a, "B gone after its TTL", |rows| {
        names(rows) == vec![("gw-a".to_string(), "member".to_string())]
    });

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
    assert_eq!(rows.last().unwrap()["fenced"], 1);
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
    println!("fenced {fenced_after:?} after etcd stopped (lease TTL 2 s, local deadline 1.33 s)");
}
