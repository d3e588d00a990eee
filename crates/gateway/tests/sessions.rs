//! Session life cycle against a real gateway process: session
//! reinstatement (a new login with the same InitiatorName and ISID ends the
//! old session) and graceful shutdown (SIGTERM asks every initiator to log
//! out with an Asynchronous Message, then the process exits).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Gateway, file_lu_config};
use unifab_iscsi::wire::{AsyncEvent, Pdu};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

#[test]
fn a_second_login_with_the_same_isid_reinstates_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), &file_lu_config(dir.path(), "16MiB"));
    let opts = RawOptions::default();
    let mut old = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
    assert_eq!(old.read16(0, 1, 512).unwrap().status, 0);
    let old_tsih = old.outcome.tsih;
    let mut new = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
    assert_ne!(
        new.outcome.tsih, old_tsih,
        "a reinstated session gets a new TSIH"
    );
    assert!(
        old.is_closed_by_peer(),
        "the old session's connection is closed"
    );
    assert_eq!(new.read16(0, 1, 512).unwrap().status, 0);
    // A different ISID is a different session: both live.
    let other = RawOptions {
        isid: [0x80, 0, 0, 0, 0, 9],
        ..RawOptions::default()
    };
    let mut third = RawSession::login(gw.addr, &gw.iqn, &other).unwrap();
    assert_eq!(third.read16(0, 1, 512).unwrap().status, 0);
    assert_eq!(new.read16(0, 1, 512).unwrap().status, 0);
}

#[test]
fn sigterm_asks_initiators_to_log_out_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut gw = Gateway::start(dir.path(), &file_lu_config(dir.path(), "16MiB"));
    let mut s = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
    assert_eq!(s.read16(0, 1, 512).unwrap().status, 0);
    // SIGTERM, as an init system stops a service.
    let ok = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(gw.child.id().to_string())
        .status()
        .unwrap();
    assert!(ok.success());
    let f = s
        .recv()
        .expect("an Asynchronous Message before the connection closes");
    match f.parse().unwrap() {
        Pdu::AsyncMessage(m) => {
            assert_eq!(m.event, AsyncEvent::LOGOUT_REQUEST);
            assert!(
                m.parameter3 > 0,
                "Parameter3 gives the seconds to log out in"
            );
        }
        other => panic!("expected an Async Message, got {other:?}"),
    }
    // Log out as asked; the gateway answers and then exits cleanly.
    s.logout().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            assert!(status.success(), "unifab exited with {status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unifab did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `unifab bench --replacement-timeout`: when its target dies, the reads
/// waiting for a connection fail once the session has been without one
/// that long, naming `replacement_timeout`, instead of each waiting out
/// its 600 s command timeout; the bench then ends with its errors.
#[test]
fn bench_commands_fail_after_replacement_timeout_when_the_target_dies() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), &file_lu_config(dir.path(), "64MiB"));
    let url = format!("iscsi://{}/{}/0", gw.addr, gw.iqn);
    let mut bench = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args([
            "bench", &url, "--rw", "read", "--ops", "500000", "--qd", "8",
        ])
        .args(["--retry-time", "0", "--command-timeout", "600"])
        .args(["--replacement-timeout", "1", "--quiet"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Let it log in and read for a while, then take the target away.
    std::thread::sleep(Duration::from_secs(1));
    gw.kill();
    // Not a timing check: a bench still waiting after 120 s would wait
    // out its 600 s command timeout; end it, so that the test fails with
    // what it printed instead of hanging. (Its output, with --quiet, is
    // far below a pipe's buffer, so polling cannot block it.)
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while bench.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = bench.kill();
    let out = bench.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "the bench must report errors:\n{text}"
    );
    assert!(
        text.contains("replacement_timeout"),
        "the failed reads must name replacement_timeout:\n{text}"
    );
}
