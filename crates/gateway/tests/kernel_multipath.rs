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

use common::Gateway;
use kernel::{GUEST, assert_steps, image, text};
use unifab_testkit::peers::{Etcd, Guest, free_tcp_port};

const IQN: &str = "iqn.2026-11.io.unifab:clustered";

fn config(dir: &Path, shared: &Path, name: &str, etcd: &str, port: u16, rel: u16) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{shared}/disk.img"
size = "128MiB"

{alua}
[iscsi]
listen = ["127.0.0.1:{port}"]
relative_port = {rel}
port_group = {rel}

[[iscsi.target]]
iqn = "{IQN}"
luns = ["disk"]

[cluster]
name = "{name}"
etcd = ["{etcd}"]
lease_ttl = "3s"

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display(),
        shared = shared.display(),
        alua = common::TWO_GATEWAY_GROUPS,
    )
}

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
    let a = Gateway::start(&da, &config(&da, top.path(), "gw-a", &etcd.url(), pa, 1));
    let _b = Gateway::start(&db, &config(&db, top.path(), "gw-b", &etcd.url(), pb, 2));

    let script = format!(
        "{}\n{}",
        include_str!("kernel/common.sh"),
        include_str!("kernel/multipath.sh")
    )
    .replace("@PORTAL_A@", &format!("10.0.2.2:{pa}"))
    .replace("@PORTAL_B@", &format!("10.0.2.2:{pb}"))
    .replace("@IQN@", IQN)
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
    println!("guest ({}): {:.1?}", image.kernel_release(), run.elapsed);
    println!("{}", run.console);
    if let Err(why) = run.success() {
        panic!("{why}");
    }
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
