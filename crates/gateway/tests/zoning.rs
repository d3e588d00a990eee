//! Zoning and `fc://` together: hosts reach an FC target through NPIV
//! ports the operator can zone in advance (a WWPN set per host, or one
//! derived from the host's name alone). A host zoned with the target does
//! verified I/O; a host zoned out gets ABORTED COMMAND, LOGICAL UNIT
//! COMMUNICATION FAILURE at once (not after the command time-out, here
//! 60 s, past this client's 20 s), and `show remotes` says "zoned out".
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use unifab_fc::io::virtual_port_name;
use unifab_fc::wire::Wwn;
use unifab_scsi_core::TransportId;
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const HOST_A: &str = "iqn.2026-11.io.example:zoned-in";
const HOST_B: &str = "iqn.2026-11.io.example:zoned-out";
const A_WWPN: &str = "30:00:00:00:00:00:00:0a";
const PARENT: Wwn = Wwn(0x2100_0000_c900_000b);

fn opts(name: &str, clear: bool) -> RawOptions {
    RawOptions {
        initiator: name.into(),
        timeout: Duration::from_secs(20),
        clear_unit_attention: clear,
        ..RawOptions::default()
    }
}

#[test]
fn a_zoned_host_does_io_and_a_zoned_out_host_is_told_at_once() {
    // Host C is zoned in by the WWPN derived from its name alone.
    let host_c = "iqn.2026-11.io.example:derived";
    let c_wwpn = virtual_port_name(
        PARENT,
        &TransportId::Iscsi {
            name: host_c.into(),
            isid: None,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let fabric = format!(
        r#"default_zone = "deny"
active_zoneset = "cfg"

[[fabric.zone]]
name = "hosts"
members = ["pwwn:21:00:00:00:c9:00:00:0a", "pwwn:{A_WWPN}", "pwwn:{c_wwpn}"]

[[fabric.zoneset]]
name = "cfg"
zones = ["hosts"]"#
    );
    let initiator = format!(
        r#"npiv_name = "per-host"
command_timeout = 60

[[fabric.initiator.host]]
initiator = "{HOST_A}"
wwpn = "{A_WWPN}""#
    );
    let config = common::fc_lu_config(
        dir.path(),
        "iqn.2026-11.io.unifab:zoning",
        admin,
        &common::FcExtra {
            fabric: &fabric,
            initiator: &initiator,
            ..Default::default()
        },
    );
    assert!(config.contains(&format!("wwpn = \"{PARENT}\"")), "{config}");
    let gw = common::Gateway::start(dir.path(), &config);

    // Held to the end: a path is listed while its host is logged in.
    let mut held = Vec::new();
    for host in [HOST_A, host_c] {
        let mut s = RawSession::login(gw.addr, &gw.iqn, &opts(host, true)).unwrap();
        let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            s.write16(64, &data, 512, false).unwrap().status,
            0,
            "{host}"
        );
        let r = s.read16(64, 8, 512).unwrap();
        assert_eq!((r.status, r.data == data), (0, true), "{host}");
        held.push(s);
    }

    let mut b = RawSession::login(gw.addr, &gw.iqn, &opts(HOST_B, false)).unwrap();
    for _ in 0..2 {
        let r = b
            .read16(0, 8, 512)
            .expect("an answer, not the client's time-out");
        assert_eq!(r.status, 2, "{r:?}");
        assert_eq!(
            (r.sense[2] & 0x0f, r.sense[12], r.sense[13]),
            (0x0b, 0x08, 0x00),
            "ABORTED COMMAND, LOGICAL UNIT COMMUNICATION FAILURE: {r:?}"
        );
    }

    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "remotes", "--json", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let zoning = |wwpn: &str| {
        rows.iter()
            .find(|r| r["initiator"].as_str().is_some_and(|i| i.starts_with(wwpn)))
            .unwrap_or_else(|| panic!("no path from {wwpn}: {rows:?}"))["zoning"]
            .clone()
    };
    assert_eq!(zoning(A_WWPN), "zoned in");
    assert_eq!(zoning(&c_wwpn.to_string()), "zoned in");
    let b_wwpn = virtual_port_name(
        PARENT,
        &TransportId::Iscsi {
            name: HOST_B.into(),
            isid: None,
        },
    );
    assert_eq!(zoning(&b_wwpn.to_string()), "zoned out", "{rows:?}");
    // The same paths at /metrics: A's up with one login, B's down.
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "metrics", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&out.stdout);
    let sample = |name: &str, wwpn: &str| -> Option<String> {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("initiator=\"{wwpn} (npiv)\"")))
            .and_then(|l| l.rsplit_once(' ').map(|(_, v)| v.to_string()))
    };
    assert_eq!(
        sample("unifab_remote_path_up{", A_WWPN).as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        sample("unifab_remote_logins_total{", A_WWPN).as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        sample("unifab_remote_path_up{", &b_wwpn.to_string()).as_deref(),
        Some("0"),
        "{metrics}"
    );

    // A reload moves the zone from host A to host B, live: B's commands
    // go through once its port has heard the RSCN and logged in; A's
    // fail at once once its port has heard it lost the target.
    let cfg = std::fs::read_to_string(&gw.config)
        .unwrap()
        .replace(&format!("\"pwwn:{A_WWPN}\""), &format!("\"pwwn:{b_wwpn}\""));
    std::fs::write(&gw.config, cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["reload", "--config"])
        .arg(&gw.config)
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(plan.contains("~ [fabric] zoning [live]"), "{plan}");
    let until = |s: &mut RawSession, good: bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = s.read16(64, 8, 512).expect("an answer");
            if (r.status == 0) == good || std::time::Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let r = until(&mut b, true);
    assert_eq!(r.status, 0, "host B after the reload: {r:?}");
    let a = &mut held[0];
    let r = until(a, false);
    assert_eq!(
        (r.status, r.sense[2] & 0x0f, r.sense[12], r.sense[13]),
        (2, 0x0b, 0x08, 0x00),
        "host A after the reload: {r:?}"
    );
    drop(held);
}
