//! libiscsi's suite across two gateways of one cluster: the first path to
//! gateway A, the multipath path (the second session, which the
//! reservation suites use as their second initiator) to gateway B, both in
//! front of one file LU (a shared-lock file in a cluster), with their
//! reservations shared through a real etcd. The run must pass every test
//! that the single-gateway two-session run passes
//! (`conformance/unifab-multipath.pass`), and its own list
//! (`conformance/unifab-cluster.pass`), which only grows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use unifab_testkit::peers::{
    Etcd, IscsiTestCu, Outcome, PassList, Unifab, assert_run_passes, conformance_dir, suites_except,
};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

fn member(path: &std::path::Path, etcd: &Etcd, name: &str, port: u16) -> Unifab {
    Unifab::builder()
        .file_lu(path, 1 << 30)
        .lu_table(common::TWO_GATEWAY_GROUPS)
        .iscsi_setting("relative_port", port.to_string())
        .iscsi_setting("port_group", port.to_string())
        .section(format!(
            "[cluster]\nname = \"{name}\"\netcd = [\"{}\"]\nlease_ttl = \"5s\"\n",
            etcd.url()
        ))
        .env("RUST_LOG", "info")
        .start()
        .unwrap_or_else(|e| panic!("{name} starts: {e}"))
}

/// Waits (at most 20 s) until a READ through `gw` is GOOD (the gateway is
/// a member and its port no longer Unavailable) and its REPORT TARGET
/// PORT GROUPS shows both groups active (it has listed the other member
/// too): no ALUA transition is left to interrupt the suite with
/// ASYMMETRIC ACCESS STATE CHANGED.
fn serving(gw: &Unifab) {
    let opts = RawOptions {
        clear_unit_attention: false,
        ..RawOptions::default()
    };
    let mut s = RawSession::login(gw.addr(), gw.iqn(), &opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = s
            .command(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512)
            .unwrap();
        let rtpg = s
            .command(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[], 256)
            .unwrap();
        // Group 1 Active/Optimized, group 2 Active/Non-optimized, one
        // port each.
        let both = rtpg.status == 0
            && rtpg.data.len() >= 28
            && rtpg.data[4] & 0x0f == 0
            && rtpg.data[6..8] == [0, 1]
            && rtpg.data[16] & 0x0f == 1
            && rtpg.data[18..20] == [0, 2];
        if r.status == 0 && both {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} does not serve both groups: READ status {:#x}, sense {:02x?}; RTPG {:02x?}\n{}",
            gw.addr(),
            r.status,
            r.sense,
            rtpg.data,
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_clustered_gateways_pass_what_one_gateway_passes_with_two_sessions() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let path = dir.path().join("lu.img");
    let a = member(&path, &etcd, "gw-a", 1);
    let b = member(&path, &etcd, "gw-b", 2);
    serving(&a);
    serving(&b);
    let result = IscsiTestCu::new(a.url())
        // As in the single-gateway two-session run (conformance.rs): the
        // Sanitize suite's Reservations test leaves the second path's
        // RESERVE(6) behind.
        .tests(suites_except("ALL", &["Sanitize"]).expect("iscsi-test-cu --list"))
        .multipath_url(b.url())
        .run()
        .expect("suite runs");
    result.record("unifab-cluster").expect("record the run");
    if result.count(Outcome::Failed) > 0 {
        eprintln!(
            "gateway A's log:\n{}\ngateway B's log:\n{}",
            a.log(),
            b.log()
        );
    }
    assert_run_passes("unifab-cluster.pass", &result);
    // Everything the single gateway passes with two sessions.
    let one = PassList::load(conformance_dir().join("unifab-multipath.pass")).unwrap();
    let two = PassList::load(conformance_dir().join("unifab-cluster.pass")).unwrap();
    let missing: Vec<&String> = one.names.difference(&two.names).collect();
    assert!(
        missing.is_empty(),
        "unifab-cluster.pass lacks tests of unifab-multipath.pass: {missing:?}"
    );
}
