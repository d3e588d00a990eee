//! `show interface`: counters and load rates for the iSCSI portal and the
//! fabric's ports, present and non-zero under load and back to zero once
//! the load stops (load intervals of 1 and 3 s so the test is short).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

fn show(admin: SocketAddr, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .arg("show")
        .args(args)
        .args(["--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn rows(admin: SocketAddr) -> Vec<serde_json::Value> {
    serde_json::from_str(&show(admin, &["interface", "--json"])).unwrap()
}

fn rate(rows: &[serde_json::Value], iface: &str, key: &str) -> f64 {
    let r = rows
        .iter()
        .find(|r| r["interface"] == iface)
        .unwrap_or_else(|| panic!("no interface {iface}: {rows:?}"));
    r[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{iface} {key}: {r}"))
}

#[test]
fn rates_move_under_load_and_fall_to_zero_after() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = common::fc_lu_config(
        dir.path(),
        "iqn.2026-11.io.unifab:interface",
        admin,
        &common::FcExtra {
            admin: "load_interval = [1, 3]",
            ..Default::default()
        },
    );
    let gw = common::Gateway::start(dir.path(), &config);
    let mut s = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
    // Reads for 2 s: longer than the 1 s window.
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        let r = s.read16(n % 256 * 8, 8, 512).unwrap();
        assert_eq!(r.status, 0);
        n += 1;
    }
    let busy = rows(admin);
    assert!(rate(&busy, "iscsi", "commands_1s") > 0.0, "{busy:?}");
    assert!(rate(&busy, "iscsi", "commands_3s") > 0.0, "{busy:?}");
    let fabric_rx: f64 = busy
        .iter()
        .filter(|r| r["kind"] == "fabric port")
        .map(|r| r["rx_frames_1s"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(
        fabric_rx > 0.0,
        "no frames through the fabric's ports: {busy:?}"
    );
    let commands = busy.iter().find(|r| r["interface"] == "iscsi").unwrap()["commands"]
        .as_u64()
        .unwrap();
    assert!(commands >= n, "{commands} < {n}");

    // Idle for longer than the 1 s window: its rates fall to zero.
    let deadline = Instant::now() + Duration::from_secs(5);
    let idle = loop {
        std::thread::sleep(Duration::from_millis(200));
        let r = rows(admin);
        if rate(&r, "iscsi", "commands_1s") == 0.0 || Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(rate(&idle, "iscsi", "commands_1s"), 0.0, "{idle:?}");
    for r in idle.iter().filter(|r| r["kind"] == "fabric port") {
        assert_eq!(r["rx_frames_1s"].as_f64(), Some(0.0), "{r}");
    }

    // The same counters at /metrics, once nothing moves.
    let text = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(admin).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut t = String::new();
        c.read_to_string(&mut t).unwrap();
        t
    };
    let now = rows(admin);
    let mut ports = 0;
    for r in now.iter().filter(|r| r["kind"] == "fabric port") {
        for counter in ["rx_frames", "tx_frames", "rx_bytes", "tx_bytes"] {
            let series = format!(
                "unifab_fabric_port_{counter}_total{{port=\"{}\"}} {}",
                r["interface"].as_str().unwrap(),
                r[counter]
            );
            assert!(text.contains(&series), "{series} not in:\n{text}");
        }
        ports += 1;
    }
    assert!(ports >= 2, "{now:?}");

    // One interface, as text.
    let text = show(admin, &["interface", "iscsi"]);
    assert!(
        text.starts_with("iscsi is up (") && text.contains("1s rate: commands 0.00/s"),
        "{text}"
    );
    drop(s);
}
