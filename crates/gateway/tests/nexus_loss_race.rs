//! The race CI met once in `ALL.PreventAllow.ITNexusLoss`: a host holds
//! PREVENT MEDIUM REMOVAL, drops its connection and, at once, a new nexus
//! asks to eject. The old connection's end is already in the target's
//! socket, but its session task may not have read it yet; the new login
//! must first end such sessions (their nexus loss releases the
//! prevention), so the eject succeeds every time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Gateway;
use unifab_scsi_core::Sense;
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

fn opts(isid: u8) -> RawOptions {
    RawOptions {
        timeout: Duration::from_secs(10),
        isid: [0x80, 0, 0, 0, 0, isid],
        ..RawOptions::default()
    }
}

#[test]
fn a_new_nexus_ejects_at_once_after_the_preventing_nexus_drops_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[[lu]]
name = "cd"
backend = "file:{dir}/cd.img"
size = "16MiB"
removable = true

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:race"
luns = ["cd"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.path().display()
    );
    let gw = Gateway::start(dir.path(), &config);
    const PREVENT: [u8; 6] = [0x1e, 0, 0, 0, 1, 0];
    const EJECT: [u8; 6] = [0x1b, 0, 0, 0, 0x02, 0]; // START STOP UNIT, LOEJ=1, START=0
    const LOAD: [u8; 6] = [0x1b, 0, 0, 0, 0x03, 0];
    for round in 0..50u8 {
        let mut old = RawSession::login(gw.addr, &gw.iqn, &opts(1)).unwrap();
        let r = old.command(&PREVENT, &[], 0).unwrap();
        assert_eq!(r.status, 0, "PREVENT: {:?}", Sense::parse(&r.sense));
        // The old connection ends (FIN now in the target's socket); the new
        // nexus logs in and ejects without waiting.
        drop(old);
        let mut new = RawSession::login(gw.addr, &gw.iqn, &opts(2)).unwrap();
        let r = new.command(&EJECT, &[], 0).unwrap();
        assert_eq!(
            r.status,
            0,
            "round {round}: eject refused: {:?}",
            Sense::parse(&r.sense)
        );
        let r = new.command(&LOAD, &[], 0).unwrap();
        assert_eq!(r.status, 0, "load: {:?}", Sense::parse(&r.sense));
        new.logout().unwrap();
    }
}
