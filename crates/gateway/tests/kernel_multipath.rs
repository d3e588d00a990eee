//! dm-multipath (multipath-tools, `scsi_dh_alua`) in a Debian 12 guest over
//! two clustered unifab gateways in front of one LU (etcd; gateway A's
//! port in group 1, Active/Optimized; B's in group 2,
//! Active/Non-optimized): `multipath -ll` shows the two ALUA groups as
//! unifab reports them; a reservation (Write Exclusive - Registrants Only,
//! the key registered through both paths) is taken; gateway A is killed
//! with SIGKILL under a verified ext4 write load, and the writes go on
//! through B with no I/O error reaching the multipath device or the
//! filesystem, fsck -f clean, every file intact, and the reservation read
//! through B afterwards.
//!
//! Needs root (the image build), etcd; a missing peer fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kernel;

use std::path::Path;
use std::time::Duration;

use common::{CLUSTERED_IQN, Gateway, Member, clustered_config};
use kernel::{GUEST, assert_steps, expect_passed, image, text};
use unifab_testkit::peers::{Etcd, Guest, free_tcp_port};

#[test]
fn dm_multipath_fails_over_between_clustered_gateways_without_an_io_error() {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let etcd = Etcd::start().unwrap();
    let top = tempfile::tempdir().unwrap();
    let (da, db) = (top.path().join("a"), top.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let (pa, pb) = (free_tcp_port().unwrap(), free_tcp_port().unwrap());
    let member = |dir: &Path, name: &str, port: u16, rel: u16| {
        let listen = format!("127.0.0.1:{port}");
        let config = clustered_config(
            dir,
            top.path(),
            "128MiB",
            &Member {
                name,
                etcd: &etcd.url(),
                listen: &listen,
                rel,
                admin: "127.0.0.1:0",
            },
        );
        Gateway::start(dir, &config)
    };
    let a = member(&da, "gw-a", pa, 1);
    let _b = member(&db, "gw-b", pb, 2);

    let script = format!(
        "{}\n{}",
        include_str!("kernel/common.sh"),
        include_str!("kernel/multipath.sh")
    )
    .replace("@PORTAL_A@", &format!("10.0.2.2:{pa}"))
    .replace("@PORTAL_B@", &format!("10.0.2.2:{pb}"))
    .replace("@IQN@", CLUSTERED_IQN)
    .replace("@PORTAL@", "unused");
    let mut guest = Guest::builder()
        .script(script)
        .limit(Duration::from_secs(480))
        .start(&image)
        .unwrap();
    guest
        .wait_for_file("kill-now", Duration::from_secs(300))
        .unwrap();
    // SIGKILL of the Active/Optimized gateway under the write load.
    a.kill();
    guest.write_file("killed", b"").unwrap();
    let run = guest.wait().unwrap();
    expect_passed(&run, &image, String::new);
    assert_steps(
        &run,
        &[
            "one multipath map over both paths",
            "writes went on through the failover; fsck -f clean, checksums match",
            "no I/O error above dm-multipath",
            "the reservation read through the surviving path",
        ],
    );
    // Before: the ALUA handler, and two path groups by priority: the
    // Active/Optimized one (alua prio 50) and the Active/Non-optimized one
    // (10), as unifab's groups say.
    let before = text(&run, "mp-before.txt");
    assert!(before.contains("hwhandler='1 alua'"), "{before}");
    assert!(
        before.contains("prio=50") && before.contains("prio=10"),
        "the ALUA groups are not as unifab reports them:\n{before}"
    );
    // After: gateway A's path failed.
    let after = text(&run, "mp-after.txt");
    assert!(
        after.contains("failed") || after.contains("faulty"),
        "gateway A's path is not failed:\n{after}"
    );
    // The reservation held before and after.
    let pr = text(&run, "pr-before.txt");
    assert!(pr.contains("Key=0xabc"), "{pr}");
    let pr = text(&run, "pr-after.txt");
    assert!(
        pr.contains("Key=0xabc") && pr.contains("registrants only"),
        "the reservation did not survive the failover:\n{pr}"
    );
    let keys = text(&run, "keys-after.txt");
    assert!(keys.contains("0xabc"), "{keys}");
}
