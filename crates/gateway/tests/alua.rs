//! ALUA through a real gateway and real iSCSI sessions: `[lu.alua]` with
//! two target port groups, this gateway's port in the Standby one
//! (`iscsi.relative_port`, `iscsi.port_group`). REPORT TARGET PORT GROUPS
//! and VPD 83h say so, media access is refused as SPC-4 says, SET TARGET
//! PORT GROUPS from one host makes the port Active/Optimized, and the
//! other host hears ASYMMETRIC ACCESS STATE CHANGED.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Gateway;
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

fn config(dir: &std::path::Path) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "4MiB"

[lu.alua]
transition_time = 5

[[lu.alua.group]]
id = 1
state = "active/optimized"
preferred = true
ports = [1]

[[lu.alua.group]]
id = 2
state = "standby"
ports = [2, 3]

[iscsi]
listen = ["127.0.0.1:0"]
relative_port = 2
port_group = 2

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:alua"
luns = ["disk"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
}

const TUR: [u8; 6] = [0; 6];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const RTPG: [u8; 12] = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];

fn sense(r: &CommandResult) -> (u8, u8, u8) {
    assert_eq!(r.status, 2, "CHECK CONDITION expected");
    (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
}

/// (state, group, ports) of each descriptor of extended RTPG data.
fn groups(d: &[u8]) -> Vec<(u8, u16, Vec<u16>)> {
    let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
    let d = &d[..8 + len];
    let mut out = Vec::new();
    let mut at = 8;
    while at < d.len() {
        let n = usize::from(d[at + 7]);
        let ports = (0..n)
            .map(|i| u16::from_be_bytes([d[at + 10 + 4 * i], d[at + 11 + 4 * i]]))
            .collect();
        out.push((
            d[at] & 0x0f,
            u16::from_be_bytes([d[at + 2], d[at + 3]]),
            ports,
        ));
        at += 8 + 4 * n;
    }
    out
}

/// A session with its power-on unit attention consumed.
fn session(g: &Gateway, name: &str) -> RawSession {
    let opts = RawOptions {
        initiator: name.into(),
        clear_unit_attention: false,
        ..RawOptions::default()
    };
    let mut s = RawSession::login(g.addr, &g.iqn, &opts).unwrap();
    let r = s.command(&TUR, &[], 0).unwrap();
    assert_eq!(sense(&r), (6, 0x29, 0), "POWER ON, RESET");
    s
}

#[test]
fn a_standby_port_refuses_media_access_until_a_host_moves_it() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(dir.path(), &config(dir.path()));
    let mut a = session(&g, "iqn.2026-11.io.unifab:host-a");
    let mut b = session(&g, "iqn.2026-11.io.unifab:host-b");

    let inq = a.command(&[0x12, 0, 0, 0, 96, 0], &[], 96).unwrap();
    assert_eq!((inq.status, inq.data[5] & 0x30), (0, 0x30), "TPGS 11b");
    // VPD 83h: RELATIVE TARGET PORT (type 4) 2, TARGET PORT GROUP (5) 2.
    let vpd = a.command(&[0x12, 1, 0x83, 0, 255, 0], &[], 255).unwrap();
    let mut at = 4;
    let mut seen = Vec::new();
    while at + 4 <= vpd.data.len() {
        let (ty, len) = (vpd.data[at + 1] & 0x0f, usize::from(vpd.data[at + 3]));
        if matches!(ty, 4 | 5) {
            let v = &vpd.data[at + 4..at + 4 + len];
            seen.push((ty, u16::from_be_bytes([v[2], v[3]])));
        }
        at += 4 + len;
    }
    assert_eq!(seen, vec![(4, 2), (5, 2)], "designators of this port");

    let r = a.command(&RTPG, &[], 256).unwrap();
    assert_eq!((r.status, r.data[4], r.data[5]), (0, 0x10, 5));
    assert_eq!(groups(&r.data), vec![(0, 1, vec![1]), (2, 2, vec![2, 3])]);

    // Standby: no media access, no TEST UNIT READY; INQUIRY and MODE
    // SENSE still answer.
    assert_eq!(
        sense(&a.command(&READ10, &[], 512).unwrap()),
        (2, 0x04, 0x0b)
    );
    assert_eq!(sense(&b.command(&TUR, &[], 0).unwrap()), (2, 0x04, 0x0b));
    assert_eq!(
        a.command(&[0x1a, 0, 0x3f, 0, 0xff, 0], &[], 255)
            .unwrap()
            .status,
        0
    );

    // Host A makes this port's group Active/Optimized, the other Standby.
    let params = [0u8, 0, 0, 0, 0x00, 0, 0, 2, 0x02, 0, 0, 1];
    let stpg = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0];
    assert_eq!(a.command(&stpg, &params, 0).unwrap().status, 0);
    assert_eq!(a.command(&READ10, &[], 512).unwrap().status, 0);
    assert_eq!(
        sense(&b.command(&READ10, &[], 512).unwrap()),
        (6, 0x2a, 0x06),
        "ASYMMETRIC ACCESS STATE CHANGED"
    );
    assert_eq!(b.command(&READ10, &[], 512).unwrap().status, 0);
    let r = b.command(&RTPG, &[], 256).unwrap();
    assert_eq!(groups(&r.data), vec![(2, 1, vec![1]), (0, 2, vec![2, 3])]);
}

#[test]
fn a_gateway_port_outside_every_group_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path()).replace("relative_port = 2", "relative_port = 7");
    let path = dir.path().join("unifab.toml");
    std::fs::write(&path, cfg).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in none of the LU's groups"), "{err}");
}

/// An operator changes a group's state in the file: `unifab reload`
/// applies it live as an implicit transition, and every host hears it.
#[test]
fn a_reload_moves_a_group_and_every_host_hears_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path()).replace("state = \"standby\"", "state = \"active/non-optimized\"");
    let g = Gateway::start(dir.path(), &cfg);
    let mut a = session(&g, "iqn.2026-11.io.unifab:host-a");
    let mut b = session(&g, "iqn.2026-11.io.unifab:host-b");
    assert_eq!(a.command(&READ10, &[], 512).unwrap().status, 0);

    std::fs::write(
        &g.config,
        cfg.replace(
            "state = \"active/non-optimized\"",
            "state = \"unavailable\"",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["reload", "--config"])
        .arg(&g.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("alua group 2"), "{said}");
    for s in [&mut a, &mut b] {
        assert_eq!(
            sense(&s.command(&READ10, &[], 512).unwrap()),
            (6, 0x2a, 0x06)
        );
        assert_eq!(
            sense(&s.command(&READ10, &[], 512).unwrap()),
            (2, 0x04, 0x0c)
        );
    }
    let r = a.command(&RTPG, &[], 256).unwrap();
    assert_eq!(groups(&r.data)[1].0, 3, "group 2 unavailable");
    assert_eq!(r.data[8 + 8 + 4 + 5], 2, "STATUS CODE 02h: implicit");
}
