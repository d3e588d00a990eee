//! `dist/systemd/unifab.service` as systemd would run it: its check, its
//! start with readiness through `NOTIFY_SOCKET` (Type=notify), its
//! reload, and SIGTERM; plus the completions and man page.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The unit's `Key=` command line, with the installed paths replaced by
/// the test's binary and configuration.
fn unit_command(unit: &str, key: &str, config: &Path) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"));
    line.split_whitespace()
        .map(|w| match w {
            "/usr/bin/unifab" => env!("CARGO_BIN_EXE_unifab").to_string(),
            "/etc/unifab/unifab.toml" => config.display().to_string(),
            other => other.to_string(),
        })
        .collect()
}

fn run(argv: &[String]) -> std::process::Output {
    Command::new(&argv[0]).args(&argv[1..]).output().unwrap()
}

/// Waits up to `within` for a datagram on `sock` containing `what`.
fn notified(sock: &UnixDatagram, what: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        if let Ok(n) = sock.recv(&mut buf)
            && String::from_utf8_lossy(&buf[..n])
                .lines()
                .any(|l| l == what)
        {
            return true;
        }
    }
    false
}

#[test]
fn the_unit_checks_starts_notifies_reloads_and_stops() {
    let unit_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd/unifab.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    assert!(unit.contains("Type=notify"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("unifab.toml");
    std::fs::write(&config, common::file_lu_config(dir.path(), "8MiB")).unwrap();

    let out = run(&unit_command(&unit, "ExecStartPre", &config));
    assert!(out.status.success(), "ExecStartPre: {out:?}");

    let notify = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    let start = unit_command(&unit, "ExecStart", &config);
    let mut child = Command::new(&start[0])
        .args(&start[1..])
        .env("NOTIFY_SOCKET", &notify)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ready = notified(&sock, "READY=1", Duration::from_secs(20));
    if !ready {
        let _ = child.kill();
    }
    assert!(ready, "no READY=1 from ExecStart");

    let out = run(&unit_command(&unit, "ExecReload", &config));
    assert!(out.status.success(), "ExecReload: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to change"),
        "{out:?}"
    );
    // SIGHUP (kill -HUP $MAINPID) brackets its reload for systemd.
    Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(notified(&sock, "RELOADING=1", Duration::from_secs(10)));
    assert!(notified(&sock, "READY=1", Duration::from_secs(10)));

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(notified(&sock, "STOPPING=1", Duration::from_secs(10)));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("reload") && text.contains("pcap-check"),
            "{shell}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .arg("manpage")
        .output()
        .unwrap();
    assert!(out.status.success());
    let man = String::from_utf8_lossy(&out.stdout);
    assert!(
        man.contains(".TH unifab 1") && man.contains("reload"),
        "{man}"
    );
}
