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
