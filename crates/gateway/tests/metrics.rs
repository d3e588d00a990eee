//! `/metrics` counts what happened: logins, a refused login, connections,
//! commands and sessions, each moved by exactly what the test did.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use common::Gateway;
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const USER: &str = "host-user";
const SECRET: &str = "host-secret-123";

/// The counters and gauges at `/metrics`, by name (labelled series keep
/// their labels in the name).
fn metrics(admin: SocketAddr) -> HashMap<String, f64> {
    samples(TcpStream::connect(admin).unwrap())
}

/// `GET /metrics` on `stream`, its samples by name with labels.
fn samples(mut stream: impl Read + Write) -> HashMap<String, f64> {
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: unifab\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, v) = l.rsplit_once(' ').unwrap();
            (name.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn opts(i: u8, secret: &str) -> RawOptions {
    RawOptions {
        initiator: format!("iqn.2026-11.io.unifab:metrics-{i}"),
        isid: [0x80, 0, 0, 0, 0, i],
        chap: Some((USER.into(), secret.into())),
        // Every command is counted: none is sent but the test's own.
        clear_unit_attention: false,
        ..RawOptions::default()
    }
}

#[test]
fn counters_move_by_exactly_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "8MiB"

[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = 0

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:metrics"
luns = ["disk"]
chap = {{ user = "{USER}", secret = "{SECRET}" }}

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.path().display()
    );
    let gw = Gateway::start(dir.path(), &config);
    let before = metrics_at(dir.path());
    let at = |m: &HashMap<String, f64>, k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("no {k} at /metrics: {m:?}"))
    };
    assert_eq!(at(&before, "unifab_iscsi_sessions"), 0.0);

    let mut sessions: Vec<RawSession> = (1..=3)
        .map(|i| RawSession::login(gw.addr, &gw.iqn, &opts(i, SECRET)).unwrap())
        .collect();
    let refused = RawSession::login(gw.addr, &gw.iqn, &opts(9, "wrong-secret-456"));
    assert!(refused.is_err(), "a wrong CHAP secret logged in");
    let block = vec![0x5a; 4096];
    // Statuses other than GOOD the LU gave (a first command may meet a
    // unit attention).
    let mut not_good = 0;
    let (mut written, mut read) = (0, 0);
    for s in &mut sessions {
        for lba in 0..2 {
            let r = s.write16(lba * 8, &block, 512, false).unwrap();
            if r.status == 0 {
                written += 4096;
            } else {
                not_good += 1;
            }
        }
        for lba in 0..3 {
            let r = s.read16(lba * 8, 8, 512).unwrap();
            if r.status == 0 {
                read += r.data.len();
            } else {
                not_good += 1;
            }
        }
    }
    let after = metrics_at(dir.path());
    let moved = |k: &str| at(&after, k) - at(&before, k);
    assert_eq!(moved("unifab_iscsi_connections_total"), 4.0);
    assert_eq!(moved("unifab_iscsi_logins_total"), 3.0);
    assert_eq!(moved("unifab_iscsi_login_failures_total"), 1.0);
    assert_eq!(moved("unifab_scsi_commands_total"), 15.0);
    assert_eq!(at(&after, "unifab_iscsi_sessions"), 3.0);
    // Each session's own count: five commands each.
    let per_session: Vec<f64> = after
        .iter()
        .filter(|(k, _)| k.starts_with("unifab_iscsi_session_commands_total{"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(per_session, vec![5.0; 3], "{after:?}");
    // The LU's own families.
    let lu = |k: &str| format!("{k}{{lu=\"disk\"}}");
    assert_eq!(moved(&lu("unifab_lu_commands_total")), 15.0);
    assert_eq!(moved(&lu("unifab_lu_written_bytes_total")), written as f64);
    assert_eq!(moved(&lu("unifab_lu_read_bytes_total")), read as f64);
    assert!(read >= 6 * 4096, "{read}");
    assert_eq!(moved(&lu("unifab_lu_errors_total")), not_good as f64);
    assert_eq!(moved(&lu("unifab_lu_latency_seconds_count")), 15.0);
    assert_eq!(
        moved("unifab_lu_latency_seconds_bucket{le=\"+Inf\",lu=\"disk\"}"),
        15.0
    );
    assert!(moved(&lu("unifab_lu_latency_seconds_sum")) > 0.0);

    // A session that ends keeps its commands in the total.
    sessions.pop().unwrap().logout().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let ended = loop {
        let m = metrics_at(dir.path());
        if at(&m, "unifab_iscsi_sessions") == 2.0 || std::time::Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(at(&ended, "unifab_iscsi_sessions"), 2.0);
    assert_eq!(
        at(&ended, "unifab_scsi_commands_total"),
        at(&after, "unifab_scsi_commands_total")
    );
}

/// Two gateways joined by an enhanced-mode FCIP tunnel of two circuits,
/// each through a WAN emulator relay; a host on A does verified I/O to
/// the LU behind B. Circuit 2 is black-holed: at A exactly one circuit
/// failure and one failover are counted, circuit 2 reads down and the
/// tunnel up, and no command fails; when the cut ends circuit 2 is up
/// again and nothing more is counted.
#[test]
fn an_fcip_failover_moves_exactly_its_counters() {
    use std::time::{Duration, Instant};
    use unifab_testkit::wan::{WanLink, WanProfile};

    let free = || unifab_testkit::peers::free_tcp_port().unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let listen: SocketAddr = format!("127.0.0.1:{}", free()).parse().unwrap();
    let admin_a: SocketAddr = format!("127.0.0.1:{}", free()).parse().unwrap();
    let b = Gateway::start(
        dir_b.path(),
        &common::fcip_far_site(dir_b.path(), &listen.to_string(), "fcip0", 2),
    );
    let relays: Vec<WanLink> = (0..2)
        .map(|_| WanLink::start("127.0.0.1:0".parse().unwrap(), listen, WanProfile::lan()).unwrap())
        .collect();
    let circuits: Vec<Option<String>> = relays.iter().map(|r| Some(r.addr().to_string())).collect();
    let a = Gateway::start(
        dir_a.path(),
        &common::fcip_near_site(
            dir_a.path(),
            "iqn.2026-11.io.unifab:metrics-a",
            &common::fcip_tunnel("fcip0", "10:00:00:00:c9:00:00:b1", &circuits),
            &admin_a.to_string(),
        ),
    );
    let at = |m: &HashMap<String, f64>, k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("no {k} at /metrics: {m:?}"))
    };
    let circuit = |k: &str, n: u32| format!("unifab_fcip_circuit_{k}{{circuit=\"fcip0/{n}\"}}");
    let tunnel_m = |k: &str| format!("unifab_fcip_tunnel_{k}{{tunnel=\"fcip0\"}}");
    let wait = |what: &str, ok: &dyn Fn(&HashMap<String, f64>) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let m = metrics(admin_a);
            if ok(&m) {
                return m;
            }
            assert!(Instant::now() < deadline, "{what}: {m:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait("both circuits up", &|m| {
        m.get(&circuit("up", 1)) == Some(&1.0) && m.get(&circuit("up", 2)) == Some(&1.0)
    });

    // The host, once the LU behind the tunnel answers.
    let mut host = RawSession::login(
        a.addr,
        &a.iqn,
        &RawOptions {
            initiator: "iqn.2026-11.io.unifab:metrics-host".into(),
            // The path through the tunnel may not be ready yet: the loop
            // below waits for it.
            clear_unit_attention: false,
            ..RawOptions::default()
        },
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.read16(0, 1, 512).is_ok_and(|r| r.status == 0) {
        assert!(
            Instant::now() < deadline,
            "the LU behind the tunnel never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut round = 0u64;
    let mut io = |host: &mut RawSession, n: u64| {
        for _ in 0..n {
            let data: Vec<u8> = (0..65536).map(|i| ((i as u64 * 3) ^ round) as u8).collect();
            let lba = round % 256 * 128;
            let w = host.write16(lba, &data, 512, false).unwrap();
            assert_eq!(w.status, 0, "write {round}: {w:?}");
            let r = host.read16(lba, 128, 512).unwrap();
            assert!(
                r.status == 0 && r.data == data,
                "read {round}: {}",
                r.status
            );
            round += 1;
        }
    };
    io(&mut host, 20);
    let before = metrics(admin_a);
    assert_eq!(at(&before, &tunnel_m("failovers_total")), 0.0);
    assert_eq!(at(&before, &tunnel_m("up")), 1.0);

    relays[1].set_cut(true);
    let cut = Instant::now();
    while metrics(admin_a).get(&circuit("up", 2)) != Some(&0.0) {
        io(&mut host, 2);
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "circuit 2 never went down"
        );
    }
    io(&mut host, 10);
    let after = metrics(admin_a);
    let moved = |k: &str| at(&after, k) - at(&before, k);
    assert_eq!(moved(&circuit("failures_total", 2)), 1.0, "{after:?}");
    assert_eq!(moved(&circuit("failures_total", 1)), 0.0, "{after:?}");
    assert_eq!(moved(&tunnel_m("failovers_total")), 1.0, "{after:?}");
    assert_eq!(at(&after, &tunnel_m("up")), 1.0);
    assert_eq!(at(&after, &circuit("up", 1)), 1.0);

    relays[1].set_cut(false);
    let back = wait("circuit 2 back", &|m| {
        m.get(&circuit("up", 2)) == Some(&1.0)
    });
    io(&mut host, 10);
    assert_eq!(at(&back, &tunnel_m("failovers_total")), 1.0);
    assert_eq!(at(&back, &circuit("failures_total", 2)), 1.0);
    let end = wait("bytes counted", &|m| {
        m.get(&tunnel_m("frame_bytes_total"))
            .is_some_and(|b| *b > 0.0)
    });
    assert!(at(&end, &tunnel_m("wire_bytes_total")) > 0.0, "{end:?}");
    assert_eq!(at(&end, &tunnel_m("dropped_frames_total")), 0.0);
    drop(b);
}

/// `GET /metrics` on the admin socket under `dir/state`.
fn metrics_at(dir: &std::path::Path) -> HashMap<String, f64> {
    samples(std::os::unix::net::UnixStream::connect(dir.join("state/admin.sock")).unwrap())
}

/// `show luns` and `unifab_lu_write_path` say where each LU's writes run,
/// and agree: a memory LU inline; a file LU as its file system allows
/// (inline in RAM; on a disk file system offered to the no-wait path
/// until the file system refuses it, then the I/O threads), before and
/// after a write through iSCSI; exactly one path is 1 for each LU.
#[test]
fn where_writes_run_is_shown_and_counted_alike() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[[lu]]
name = "mem"
backend = "memory"
size = "8MiB"

[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "8MiB"

[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = 0

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:paths"
luns = ["disk", "mem"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.path().display()
    );
    let gw = Gateway::start(dir.path(), &config);
    let on_ram = {
        let c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a zeroed statfs for statfs(2) to fill; `c` is a C string.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
        st.f_type == libc::TMPFS_MAGIC
    };
    let paths = || {
        let luns = common::show_json(dir.path(), "luns");
        let m = metrics_at(dir.path());
        let mut shown = HashMap::new();
        for lu in ["mem", "disk"] {
            let row = luns.iter().find(|r| r["name"] == lu).unwrap();
            let path = row["write_path"].as_str().unwrap().to_string();
            let ones: Vec<&String> = m
                .iter()
                .filter(|(k, v)| {
                    k.starts_with("unifab_lu_write_path{")
                        && k.contains(&format!("lu=\"{lu}\""))
                        && **v == 1.0
                })
                .map(|(k, _)| k)
                .collect();
            assert_eq!(ones.len(), 1, "{lu}: {ones:?}");
            assert!(
                ones[0].contains(&format!("path=\"{path}\"")),
                "{lu}: shown {path}, metric {ones:?}"
            );
            shown.insert(lu, path);
        }
        shown
    };
    let before = paths();
    assert_eq!(before["mem"], "inline");
    let disk_first = if on_ram { "inline" } else { "no-wait" };
    assert_eq!(before["disk"], disk_first, "before any write");
    let mut s = RawSession::login(
        gw.addr,
        &gw.iqn,
        &RawOptions {
            initiator: "iqn.2026-11.io.unifab:paths-host".into(),
            ..RawOptions::default()
        },
    )
    .unwrap();
    let r = s.write16(0, &[0x5a; 4096], 512, false).unwrap();
    assert_eq!(r.status, 0, "{r:?}");
    let after = paths();
    assert_eq!(after["mem"], "inline");
    let allowed: &[&str] = if on_ram {
        &["inline"]
    } else {
        &["no-wait", "io threads"]
    };
    assert!(
        allowed.contains(&after["disk"].as_str()),
        "after a write: {}",
        after["disk"]
    );
}
