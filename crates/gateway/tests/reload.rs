//! Reload under load: a host does verified I/O on LU A throughout a
//! sequence of reloads that add and remove LUs and a target, change the
//! target's LUN map and ACL, try an invalid file and a change that needs
//! a restart; the host on A sees no failed command, the hosts on the
//! changed target get the notices, and `--dry-run` changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{Gateway, reload, show_json};
use unifab_iscsi::wire::pdu::{AsyncEvent, Pdu};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const IQN_A: &str = "iqn.2026-11.io.unifab:reload-a";
const IQN_B: &str = "iqn.2026-11.io.unifab:reload-b";
const HOST_B: &str = "iqn.2026-11.io.example:host-b";
const HOST_C: &str = "iqn.2026-11.io.example:host-c";

/// The configuration: LU "a" and target A always; `extra_lus` (memory,
/// 8 MiB each); target B with `b_luns` and `b_allow` when given; and
/// `nop` as the portal's NOP-In interval.
fn config(dir: &Path, extra_lus: &[&str], b: Option<(&[&str], &str)>, nop: u32) -> String {
    let mut s = format!(
        r#"
[[lu]]
name = "a"
backend = "file:{dir}/a.img"
size = "8MiB"
"#,
        dir = dir.display()
    );
    for lu in extra_lus {
        s.push_str(&format!(
            "\n[[lu]]\nname = \"{lu}\"\nbackend = \"memory\"\nsize = \"8MiB\"\n"
        ));
    }
    s.push_str(&format!(
        r#"
[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = {nop}

[[iscsi.target]]
iqn = "{IQN_A}"
luns = ["a"]
"#
    ));
    if let Some((luns, allow)) = b {
        let luns: Vec<String> = luns.iter().map(|l| format!("\"{l}\"")).collect();
        s.push_str(&format!(
            "\n[[iscsi.target]]\niqn = \"{IQN_B}\"\nluns = [{}]\nallow = [\"{allow}\"]\n",
            luns.join(", ")
        ));
    }
    s.push_str(&format!(
        "\n[admin]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}/state\"\n",
        dir.display()
    ));
    s
}

fn host(name: &str) -> RawOptions {
    RawOptions {
        initiator: name.into(),
        ..RawOptions::default()
    }
}

/// LUNs REPORT LUNS lists.
fn report_luns(s: &mut RawSession) -> usize {
    let r = s
        .command(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[], 4096)
        .unwrap();
    assert_eq!(r.status, 0, "REPORT LUNS: {r:?}");
    u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as usize / 8
}

/// Waits for an Async Message asking this session to log out.
fn logout_requested(s: &mut RawSession) -> bool {
    for _ in 0..10 {
        match s.recv().map(|f| f.parse()) {
            Ok(Ok(Pdu::AsyncMessage(m))) => return m.event == AsyncEvent::LOGOUT_REQUEST,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
    false
}

fn show_luns(dir: &Path) -> Vec<String> {
    show_json(dir, "luns")
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn reloads_under_load_lose_no_command_and_tell_the_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = Gateway::start(d, &config(d, &[], None, 0));
    let cfg = gw.config.clone();

    // The host on A: verified writes and reads until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut a = RawSession::login(gw.addr, IQN_A, &host("iqn.2026-11.io.example:host-a")).unwrap();
    let io = {
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lba = round % 1024 * 8;
                let data: Vec<u8> = (0..4096).map(|i| (i as u64 ^ round) as u8).collect();
                let w = a.write16(lba, &data, 512, false);
                let r = a.read16(lba, 8, 512);
                match (w, r) {
                    (Ok(w), Ok(r)) if w.status == 0 && r.status == 0 && r.data == data => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        eprintln!("host A, round {round}: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                round += 1;
            }
        })
    };
    let progress = |n: u64| {
        let start = done.load(Ordering::Relaxed);
        while done.load(Ordering::Relaxed) < start + n {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    progress(50);

    // 1. A dry run prints the plan and changes nothing.
    std::fs::write(&cfg, config(d, &["b"], Some((&["b"], HOST_B)), 0)).unwrap();
    let out = reload(&cfg, true);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        plan.contains("+ lu \"b\" [live]")
            && plan.contains(&format!("+ iscsi.target \"{IQN_B}\" [live]")),
        "{plan}"
    );
    assert!(
        RawSession::login(gw.addr, IQN_B, &host(HOST_B)).is_err(),
        "a dry run added the target"
    );
    assert_eq!(show_luns(d), vec!["a"]);
    progress(20);

    // 2. Applied: B serves LU b to host B.
    let out = reload(&cfg, false);
    assert!(out.status.success(), "{out:?}");
    let mut b = RawSession::login(gw.addr, IQN_B, &host(HOST_B)).unwrap();
    assert_eq!(report_luns(&mut b), 1);
    assert_eq!(show_luns(d), vec!["a", "b"]);
    progress(20);

    // 3. B's LUN map grows: host B hears REPORTED LUNS DATA HAS CHANGED.
    std::fs::write(&cfg, config(d, &["b", "c"], Some((&["b", "c"], HOST_B)), 0)).unwrap();
    assert!(reload(&cfg, false).status.success());
    let r = b.read16(0, 1, 512).unwrap();
    assert_eq!(r.status, 2, "CHECK CONDITION after the map changed: {r:?}");
    assert_eq!(
        (r.sense[2] & 0x0f, r.sense[12], r.sense[13]),
        (6, 0x3f, 0x0e),
        "{r:?}"
    );
    assert_eq!(report_luns(&mut b), 2);
    assert_eq!(b.read16(0, 1, 512).unwrap().status, 0);
    progress(20);

    // 4. An invalid file changes nothing, and says why.
    std::fs::write(&cfg, config(d, &["b"], Some((&["b", "nope"], HOST_B)), 0)).unwrap();
    let out = reload(&cfg, false);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope"),
        "{out:?}"
    );
    assert_eq!(show_luns(d), vec!["a", "b", "c"]);
    assert_eq!(report_luns(&mut b), 2);

    // 5. A portal setting needs a restart: named, not applied; the rest
    // of the same file is.
    std::fs::write(&cfg, config(d, &["b", "c"], Some((&["b", "c"], HOST_C)), 7)).unwrap();
    let out = reload(&cfg, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    eprintln!("{plan}");
    assert!(out.status.success(), "{out:?}");
    assert!(plan.contains("~ [iscsi] [needs restart]"), "{plan}");
    assert!(
        plan.contains(&format!("~ iscsi.target \"{IQN_B}\" [live]: allow")),
        "{plan}"
    );
    // Host B is no longer allowed: asked to log out; host C gets in.
    assert!(logout_requested(&mut b), "host B was not asked to log out");
    drop(b);
    assert!(RawSession::login(gw.addr, IQN_B, &host(HOST_B)).is_err());
    let mut c = RawSession::login(gw.addr, IQN_B, &host(HOST_C)).unwrap();
    assert_eq!(report_luns(&mut c), 2);
    progress(20);

    // 6. SIGHUP reloads too: target B and LUs b and c go; host C is asked
    // to log out.
    std::fs::write(&cfg, config(d, &[], None, 7)).unwrap();
    let r = Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(r.success());
    assert!(logout_requested(&mut c), "host C was not asked to log out");
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while show_luns(d) != vec!["a"] && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(show_luns(d), vec!["a"]);
    assert!(RawSession::login(gw.addr, IQN_B, &host(HOST_C)).is_err());
    progress(50);

    stop.store(true, Ordering::Relaxed);
    io.join().unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "host A saw failed commands"
    );
    assert!(done.load(Ordering::Relaxed) >= 230);
}

/// A file LU grows and is write-protected under a logged-in host, which
/// hears CAPACITY DATA HAS CHANGED and MODE PARAMETERS CHANGED and then
/// sees the new capacity and its writes refused; shrinking it is named as
/// not live and changes nothing.
#[test]
fn a_file_lu_grows_and_turns_read_only_under_a_host() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = config(d, &[], None, 0);
    let gw = Gateway::start(d, &base);
    let cfg = gw.config.clone();
    let mut a = RawSession::login(gw.addr, IQN_A, &host("iqn.2026-11.io.example:host-a")).unwrap();
    let capacity = |s: &mut RawSession| {
        let r = s
            .command(
                &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
                &[],
                32,
            )
            .unwrap();
        assert_eq!(r.status, 0, "READ CAPACITY(16): {r:?}");
        u64::from_be_bytes(r.data[..8].try_into().unwrap()) + 1
    };
    let sense = |r: &unifab_testkit::raw_iscsi::CommandResult| {
        (r.sense[2] & 0x0f, r.sense[12], r.sense[13])
    };
    // The power-on attention first.
    let _ = a.command(&[0; 6], &[], 0).unwrap();
    assert_eq!(capacity(&mut a), 8 << 11);
    assert_eq!(a.write16(0, &[7; 512], 512, false).unwrap().status, 0);

    let grown = base.replace("size = \"8MiB\"", "size = \"16MiB\"\nread_only = true");
    std::fs::write(&cfg, &grown).unwrap();
    let out = reload(&cfg, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        plan.contains(
            "~ lu \"a\" [live]: grows from 8388608 to 16777216 bytes, write protection on"
        ),
        "{plan}"
    );
    assert_eq!(std::fs::metadata(d.join("a.img")).unwrap().len(), 16 << 20);
    let r = a.command(&[0; 6], &[], 0).unwrap();
    assert_eq!((r.status, sense(&r)), (2, (6, 0x2a, 0x09)), "{r:?}");
    let r = a.command(&[0; 6], &[], 0).unwrap();
    assert_eq!((r.status, sense(&r)), (2, (6, 0x2a, 0x01)), "{r:?}");
    assert_eq!(capacity(&mut a), 16 << 11);
    let r = a.read16((16 << 11) - 1, 1, 512).unwrap();
    assert_eq!(
        (r.status, r.data.len()),
        (0, 512),
        "the new last block reads"
    );
    let r = a.write16(0, &[8; 512], 512, false).unwrap();
    assert_eq!((r.status, sense(&r)), (2, (7, 0x27, 0x00)), "{r:?}");
    assert_eq!(a.read16(0, 1, 512).unwrap().data, vec![7; 512]);

    // Smaller again: not live, not applied.
    std::fs::write(
        &cfg,
        base.replace("size = \"8MiB\"", "size = \"8MiB\"\nread_only = true"),
    )
    .unwrap();
    let out = reload(&cfg, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains("[needs restart]") && plan.contains("never shrinks"),
        "{plan}"
    );
    assert_eq!(capacity(&mut a), 16 << 11);
    assert_eq!(
        a.command(&[0; 6], &[], 0).unwrap().status,
        0,
        "no attention"
    );
}

/// A target's CHAP secret changes under a logged-in host: the host's
/// session goes on (its login was authenticated when it was made), a new
/// login with the old secret is refused, one with the new secret admitted.
#[test]
fn a_chap_secret_changes_under_a_logged_in_host() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let with_chap = |secret: &str| {
        config(d, &[], None, 0).replace(
            "luns = [\"a\"]",
            &format!("luns = [\"a\"]\nchap = {{ user = \"host\", secret = \"{secret}\" }}"),
        )
    };
    let (old, new) = ("old-secret-0123", "new-secret-4567");
    let gw = Gateway::start(d, &with_chap(old));
    let opts = |secret: &str, i: u8| RawOptions {
        initiator: "iqn.2026-11.io.example:chap-host".into(),
        isid: [0x80, 0, 0, 0, 0, i],
        chap: Some(("host".into(), secret.into())),
        ..RawOptions::default()
    };
    let mut s = RawSession::login(gw.addr, IQN_A, &opts(old, 1)).unwrap();
    assert_eq!(s.write16(0, &[3; 512], 512, false).unwrap().status, 0);

    std::fs::write(&gw.config, with_chap(new)).unwrap();
    let out = reload(&gw.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        plan.contains(&format!("~ iscsi.target \"{IQN_A}\" [live]: chap")),
        "{plan}"
    );
    assert!(
        !plan.contains(old) && !plan.contains(new),
        "a secret in the plan: {plan}"
    );
    // The session goes on; the old secret no longer logs in; the new one does.
    let r = s.read16(0, 1, 512).unwrap();
    assert_eq!((r.status, r.data), (0, vec![3; 512]));
    assert!(RawSession::login(gw.addr, IQN_A, &opts(old, 2)).is_err());
    let mut t = RawSession::login(gw.addr, IQN_A, &opts(new, 3)).unwrap();
    assert_eq!(t.read16(0, 1, 512).unwrap().status, 0);
    assert_eq!(s.read16(0, 1, 512).unwrap().status, 0);
}

/// A remote LU (`iscsi://` to a second gateway) is added to a running
/// gateway and mapped to a target a host is logged in to: the host hears
/// REPORTED LUNS DATA HAS CHANGED, sees the new LUN and writes through it
/// to the remote; removed again, its LUN is gone and its session to the
/// remote logs out.
#[test]
fn a_remote_lu_is_added_and_removed_live() {
    let (dir_b, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Gateway::start(dir_b.path(), &common::file_lu_config(dir_b.path(), "8MiB"));
    let d = dir.path();
    let base = config(d, &[], None, 0);
    let gw = Gateway::start(d, &base);
    let mut h = RawSession::login(gw.addr, IQN_A, &host("iqn.2026-11.io.example:host-r")).unwrap();
    assert_eq!(report_luns(&mut h), 1);

    let with_remote = base
        .replace(
            "[iscsi]",
            &format!(
                "[[lu]]\nname = \"r\"\nbackend = \"iscsi://{}/{}/0\"\n\n[iscsi]",
                b.addr, b.iqn
            ),
        )
        .replace("luns = [\"a\"]", "luns = [\"a\", \"r\"]");
    std::fs::write(&gw.config, &with_remote).unwrap();
    let out = reload(&gw.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(plan.contains("+ lu \"r\" [live]: a remote LU"), "{plan}");
    let r = h.read16(0, 1, 512).unwrap();
    assert_eq!(
        (r.status, r.sense[2] & 0x0f, r.sense[12], r.sense[13]),
        (2, 6, 0x3f, 0x0e),
        "{r:?}"
    );
    assert_eq!(report_luns(&mut h), 2);
    // WRITE(16) through LUN 1 lands on the remote's LU.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[2..10].copy_from_slice(&8u64.to_be_bytes());
    cdb[13] = 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let w = h.command_lun(1, &cdb, &[0x6b; 512], 0).unwrap();
        if w.status == 0 {
            break;
        }
        // The first command meets the remote's power-on attention.
        assert!(std::time::Instant::now() < deadline, "{w:?}");
    }
    let mut direct =
        RawSession::login(b.addr, &b.iqn, &host("iqn.2026-11.io.example:check")).unwrap();
    assert_eq!(direct.read16(8, 1, 512).unwrap().data, vec![0x6b; 512]);
    let from_a = |b_dir: &Path| {
        show_json(b_dir, "sessions")
            .iter()
            .filter(|s| s["initiator"] != "iqn.2026-11.io.example:check")
            .count()
    };
    assert!(
        from_a(dir_b.path()) >= 1,
        "{:?}",
        show_json(dir_b.path(), "sessions")
    );

    // Removed: the LUN goes, and so does the session to the remote.
    std::fs::write(&gw.config, &base).unwrap();
    let out = reload(&gw.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("- lu \"r\" [live]"), "{plan}");
    let r = h.read16(0, 1, 512).unwrap();
    assert_eq!(
        (r.status, r.sense[12], r.sense[13]),
        (2, 0x3f, 0x0e),
        "{r:?}"
    );
    assert_eq!(report_luns(&mut h), 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while from_a(dir_b.path()) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the remote session stayed: {:?}",
            show_json(dir_b.path(), "sessions")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(show_json(d, "remotes").is_empty());
}

/// The portal's addresses change live: a new one accepts logins at once;
/// a removed one accepts no new connection, and the session it accepted
/// goes on.
#[test]
fn portal_addresses_change_live_and_keep_their_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = config(d, &[], None, 0);
    let gw = Gateway::start(d, &base);
    let mut first =
        RawSession::login(gw.addr, IQN_A, &host("iqn.2026-11.io.example:first")).unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let second: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let both = base.replace(
        "listen = [\"127.0.0.1:0\"]",
        &format!("listen = [\"127.0.0.1:0\", \"{second}\"]"),
    );
    assert_ne!(both, base);
    std::fs::write(&gw.config, &both).unwrap();
    let out = reload(&gw.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains(&format!(
            "~ [iscsi] listen [live]: [127.0.0.1:0] -> [127.0.0.1:0, {second}]"
        )),
        "{plan}"
    );
    assert!(!plan.contains("needs restart"), "{plan}");
    let mut other =
        RawSession::login(second, IQN_A, &host("iqn.2026-11.io.example:second")).unwrap();
    assert_eq!(other.write16(0, &[9; 512], 512, false).unwrap().status, 0);

    // The first address goes: no new connection there; its session stays.
    std::fs::write(
        &gw.config,
        base.replace(
            "listen = [\"127.0.0.1:0\"]",
            &format!("listen = [\"{second}\"]"),
        ),
    )
    .unwrap();
    let out = reload(&gw.config, false);
    assert!(out.status.success(), "{out:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(gw.addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} still accepts",
            gw.addr
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = first.read16(0, 1, 512).unwrap();
    assert_eq!((r.status, r.data), (0, vec![9; 512]));
    assert!(RawSession::login(second, IQN_A, &host("iqn.2026-11.io.example:third")).is_ok());
}

/// SendTargets as `initiator` sees the gateway at `addr`: each target's
/// name and TargetAddress values.
fn discovered(addr: std::net::SocketAddr, initiator: &str) -> Vec<(String, Vec<String>)> {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args([
            "iscsi",
            "discover",
            &addr.to_string(),
            "--no-luns",
            "--json",
        ])
        .args(["--initiator-name", initiator])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    v.iter()
        .map(|t| {
            let addrs = t["addresses"].as_array().unwrap();
            (
                t["name"].as_str().unwrap().to_string(),
                addrs
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

/// Discovery names a target only to the hosts its ACL lets in, and the
/// addresses it gives change live with `[iscsi] advertise` (a gateway
/// behind NAT), and back to the portal's own when the key goes.
#[test]
fn discovery_follows_the_acl_and_advertised_addresses_change_live() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = config(d, &["b"], Some((&["b"], HOST_B)), 0);
    let gw = Gateway::start(d, &base);
    let own = vec![format!("{},1", gw.addr)];
    assert_eq!(
        discovered(gw.addr, HOST_C),
        [(IQN_A.to_string(), own.clone())],
        "a host outside B's ACL is not told of B"
    );
    assert_eq!(
        discovered(gw.addr, HOST_B),
        [
            (IQN_A.to_string(), own.clone()),
            (IQN_B.to_string(), own.clone())
        ]
    );
    let natted = base.replace(
        "listen = [\"127.0.0.1:0\"]",
        "listen = [\"127.0.0.1:0\"]\nadvertise = [\"gw.example.net:13260\", \"[2001:db8::5]\"]",
    );
    assert_ne!(natted, base);
    std::fs::write(&gw.config, &natted).unwrap();
    let out = reload(&gw.config, false);
    assert!(out.status.success(), "{out:?}");
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains(
            "~ [iscsi] advertise [live]: the portals' own -> [gw.example.net:13260, [2001:db8::5]]"
        ),
        "{plan}"
    );
    assert!(!plan.contains("needs restart"), "{plan}");
    let advertised = vec![
        "gw.example.net:13260,1".to_string(),
        "[2001:db8::5],1".to_string(),
    ];
    assert_eq!(
        discovered(gw.addr, HOST_C),
        [(IQN_A.to_string(), advertised)]
    );
    std::fs::write(&gw.config, &base).unwrap();
    assert!(reload(&gw.config, false).status.success());
    assert_eq!(discovered(gw.addr, HOST_C), [(IQN_A.to_string(), own)]);
    // A bad address is refused with the reason, and changes nothing.
    std::fs::write(
        &gw.config,
        base.replace(
            "listen = [\"127.0.0.1:0\"]",
            "listen = [\"127.0.0.1:0\"]\nadvertise = [\"2001:db8::5:3260\"]",
        ),
    )
    .unwrap();
    let out = reload(&gw.config, false);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an IPv6 address goes in brackets"),
        "{out:?}"
    );
}

/// A reload whose LUs cannot all be opened changes nothing: not even the
/// LU that could be, nor the new portal address it also asked for.
#[test]
fn a_reload_that_fails_half_way_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = config(d, &[], None, 0);
    let gw = Gateway::start(d, &base);
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let bad = config(d, &["b"], Some((&["b"], HOST_B)), 0)
        .replace(
            "[iscsi]",
            "[[lu]]\nname = \"c\"\nbackend = \"file:/proc/unifab-no-such-dir/c.img\"\nsize = \"8MiB\"\n\n[iscsi]",
        )
        .replace(
            "listen = [\"127.0.0.1:0\"]",
            &format!("listen = [\"127.0.0.1:0\", \"127.0.0.1:{port}\"]"),
        )
        .replace("luns = [\"b\"]", "luns = [\"b\", \"c\"]");
    std::fs::write(&gw.config, &bad).unwrap();
    let out = reload(&gw.config, false);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lu \"c\""), "{err}");
    assert_eq!(show_luns(d), vec!["a"]);
    assert!(RawSession::login(gw.addr, IQN_B, &host(HOST_B)).is_err());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the new portal listens"
    );
    // The same file without the bad LU applies.
    std::fs::write(&gw.config, config(d, &["b"], Some((&["b"], HOST_B)), 0)).unwrap();
    assert!(reload(&gw.config, false).status.success());
    assert_eq!(show_luns(d), vec!["a", "b"]);
}

/// An FCIP tunnel added to a running gateway by reload: the fabric joins
/// across it and a host reaches the LU behind the far gateway; removed,
/// the far switch's ports leave the fabric and `show fcip` lists nothing.
#[test]
fn an_fcip_tunnel_is_added_and_removed_live() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let listen = format!(
        "127.0.0.1:{}",
        unifab_testkit::peers::free_tcp_port().unwrap()
    );
    let _b = Gateway::start(
        dir_b.path(),
        &common::fcip_far_site(dir_b.path(), &listen, "to-a", 1),
    );
    let d = dir_a.path();
    let base = common::fcip_near_site(d, IQN_A, "", "127.0.0.1:0");
    let a = Gateway::start(d, &base);
    let with_tunnel = common::fcip_near_site(
        d,
        IQN_A,
        &common::fcip_tunnel("to-b", "10:00:00:00:c9:00:00:b1", &[Some(listen.clone())]),
        "127.0.0.1:0",
    );
    std::fs::write(&a.config, &with_tunnel).unwrap();
    let out = reload(&a.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(plan.contains("+ [fcip] tunnel \"to-b\" [live]"), "{plan}");
    let mut h = RawSession::login(
        a.addr,
        IQN_A,
        &RawOptions {
            initiator: "iqn.2026-11.io.example:across".into(),
            clear_unit_attention: false,
            ..RawOptions::default()
        },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !h
        .write16(0, &[0x42; 4096], 512, false)
        .is_ok_and(|r| r.status == 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the LU behind the added tunnel never answered: {:?}",
            show_json(d, "fcip")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(h.read16(0, 8, 512).unwrap().data, vec![0x42; 4096]);
    assert!(
        show_json(d, "fcip")
            .iter()
            .any(|r| r["tunnel"] == "to-b" && r["state"] == "up")
    );

    let far = |d: &Path| {
        show_json(d, "fcns")
            .iter()
            .any(|r| r["pwwn"] == "21:00:00:00:c9:00:0b:0a")
    };
    assert!(far(d), "the far target in A's name server");

    std::fs::write(&a.config, &base).unwrap();
    let out = reload(&a.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains("- [fcip] tunnel \"to-b\" [live]"), "{plan}");
    assert!(show_json(d, "fcip").is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while far(d) {
        assert!(
            std::time::Instant::now() < deadline,
            "the far target stayed in the fabric"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `GET path` on the TCP admin endpoint, with a bearer token: the status
/// line and the body; `None` if nothing accepts there.
fn get_tcp(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

/// The admin endpoint moves, takes a token and new load intervals by
/// reload: the old address no longer answers, the new one refuses a
/// request without the token and shows the new intervals with it.
#[test]
fn the_admin_endpoint_moves_and_takes_a_token_live() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let free = || unifab_testkit::peers::free_tcp_port().unwrap();
    let (p1, p2) = (free(), free());
    let first: std::net::SocketAddr = format!("127.0.0.1:{p1}").parse().unwrap();
    let second: std::net::SocketAddr = format!("127.0.0.1:{p2}").parse().unwrap();
    let base = config(d, &[], None, 0).replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!("[admin]\nlisten = \"{first}\""),
    );
    let gw = Gateway::start(d, &base);
    let (status, _) = get_tcp(first, "/show/luns", None).expect("the first address answers");
    assert!(status.contains("200"), "{status}");

    let token = "a-token-of-24-bytes-long";
    let moved = base.replace(
        &format!("[admin]\nlisten = \"{first}\""),
        &format!("[admin]\nlisten = \"{second}\"\ntoken = \"{token}\"\nload_interval = [30]"),
    );
    std::fs::write(&gw.config, &moved).unwrap();
    let out = reload(&gw.config, false);
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        plan.contains("~ [admin] [live]: listen, token, load_interval"),
        "{plan}"
    );
    assert!(!plan.contains(token), "the token in the plan: {plan}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while get_tcp(first, "/show/luns", None).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "{first} still answers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = get_tcp(second, "/show/luns", None).unwrap();
    assert!(status.contains("401"), "{status}");
    let (status, body) = get_tcp(second, "/show/interface", Some(token)).unwrap();
    assert!(status.contains("200"), "{status}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(
        rows[0]["load_intervals"],
        serde_json::json!(["30s"]),
        "{body}"
    );
}

/// The admin socket is the gateway user's alone: mode 0600, and a peer of
/// another user is refused even where the mode would let it in. Needs
/// root (to run the client as another user); CI runs as root.
#[test]
fn the_admin_socket_refuses_other_users() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        nix_euid_is_root(),
        "this test needs root: it runs `unifab reload` as user nobody"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gw = Gateway::start(d, &config(d, &[], None, 0));
    let sock = d.join("state/admin.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let as_nobody = || {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_unifab"))
            .args(["reload", "--dry-run", "--socket"])
            .arg(&sock)
            .output()
            .expect("setpriv (util-linux) runs")
    };
    // Refused by the file's mode.
    for p in [d, &d.join("state")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = as_nobody();
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // Refused by the gateway itself when the mode lets it connect.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody();
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403"),
        "{out:?}"
    );
    // Its own user gets the plan.
    let out = reload(&gw.config, true);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to change"));
}

fn nix_euid_is_root() -> bool {
    // /proc/self is owned by the effective user.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}
