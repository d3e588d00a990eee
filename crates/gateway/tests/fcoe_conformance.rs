//! Conformance through an FCoE hop: libiscsi's suite (`iscsi-test-cu
//! --test <every ALL suite but Sanitize> --dataloss --allow-sanitize URL
//! URL`, two sessions) along
//!
//!   iscsi-test-cu → unifab A's iSCSI target → LU `fc://…` → FCP
//!   initiator → FCoE ENode → veth → FCF in namespace B → unifab B's
//!   fabric → FCP target → file LU
//!
//! once with AF_XDP on both sides and once with AF_PACKET, each passing
//! exactly the tests the same file LU passes when exported directly
//! (measured in the same run), and every test of the checked-in ratchet
//! `conformance/unifab-fcoe-multipath.pass`. During the AF_PACKET run
//! tshark on the veth decodes every FIP and FCoE frame with a good CRC
//! and flags nothing (AF_XDP traffic never reaches packet taps).
//!
//! Needs root, the release binary, iscsi-test-cu and tshark.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fcoe_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fcoe_support::*;
use unifab_testkit::peers::{
    IscsiTestCu, Outcome, PassList, SuiteResult, Unifab, conformance_dir, suites_except,
};

fn outcomes(r: &SuiteResult, o: Outcome) -> BTreeSet<String> {
    r.tests
        .iter()
        .filter(|t| t.outcome == o)
        .map(|t| t.name.clone())
        .collect()
}

fn suite(url: &str) -> SuiteResult {
    // With two sessions the Sanitize suite is left out (as in
    // conformance.rs and fc_conformance.rs): its Reservations test leaves
    // the shared second path reserved, so Sanitize.Reset meets
    // RESERVATION CONFLICT on any target.
    let selection = suites_except("ALL", &["Sanitize"]).expect("iscsi-test-cu --list");
    IscsiTestCu::new(url)
        .tests(selection)
        .multipath_url(url)
        .timeout(Duration::from_secs(900))
        .run()
        .expect("iscsi-test-cu runs")
}

fn compare(name: &str, hop: &SuiteResult, direct: &SuiteResult) {
    assert!(
        hop.is_complete(),
        "{name}: the suite did not reach its end ({}):\n{}",
        hop.status,
        hop.stderr_tail
    );
    let failed = outcomes(hop, Outcome::Failed);
    let passed = outcomes(hop, Outcome::Passed);
    let direct_passed = outcomes(direct, Outcome::Passed);
    let lost: Vec<&String> = direct_passed.difference(&passed).collect();
    let gained: Vec<&String> = passed.difference(&direct_passed).collect();
    println!(
        "{name}: {} passed, {} skipped, {} FAILED (direct: {} passed, {} skipped, {} failed)",
        passed.len(),
        hop.count(Outcome::Skipped),
        failed.len(),
        direct_passed.len(),
        direct.count(Outcome::Skipped),
        direct.count(Outcome::Failed)
    );
    // A suite whose set-up login failed runs none of its tests: CUnit
    // counts nothing, only the warning on stdout and libiscsi's reason on
    // stderr say why.
    let uninitialized: Vec<&str> = hop
        .stdout
        .lines()
        .filter(|l| l.contains("Suite initialization failed"))
        .collect();
    assert!(
        failed.is_empty() && lost.is_empty() && gained.is_empty(),
        "{name}: FAILED {failed:?}; passed directly only {lost:?}; through FCoE only {gained:?}\n\
         {uninitialized:?}\nstderr (tail):\n{}\n{}\n{}",
        hop.stderr_tail,
        hop.failures(),
        hop.to_table()
    );
}

fn through_hop(io: &str, direct: &SuiteResult) {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut hop = Hop::start(dir.path(), io, "");
    let cap = (io == "af_packet").then(|| Capture::start(&hop.veth.a, dir.path().join("c.pcap")));
    let t = Instant::now();
    let r = suite(&hop.url());
    println!("{io}: suite took {:.0} s", t.elapsed().as_secs_f64());
    hop.a.check_alive();
    hop.b.check_alive();
    let table = r.record(&format!("unifab-fcoe-{io}")).expect("record");
    // The gateways' logs go next to the table (the scratch directory
    // goes away with the test).
    for (side, gw) in [("a", &hop.a), ("b", &hop.b)] {
        let _ = std::fs::copy(
            &gw.log,
            table.with_file_name(format!("unifab-fcoe-{io}-{side}.log")),
        );
    }
    // Commands the bridge failed in transport (each turns into ABORTED
    // COMMAND at the host, and a failed set-up login when it is the
    // suite's first TEST UNIT READY): said here, so that a failure in CI
    // shows its cause without the logs.
    for (side, gw) in [("a", &hop.a), ("b", &hop.b)] {
        for l in gw.transport_failures() {
            println!("{io}: gateway {side}: {l}");
        }
    }
    if let Some(cap) = cap {
        let d = decode(&cap.stop());
        println!(
            "{io}: tshark decoded {} FIP and {} FCoE frames, {} with a good CRC",
            d.fip, d.fcoe, d.crc_good
        );
        assert!(d.fip > 0 && d.fcoe > 10_000);
        assert_eq!(d.crc_good, d.fcoe);
        assert!(d.flagged.is_empty(), "tshark flagged:\n{}", d.flagged);
    }
    compare(&format!("through FCoE over {io}"), &r, direct);
    let list = PassList::load(conformance_dir().join("unifab-fcoe-multipath.pass")).unwrap();
    if let Err(f) = list.check(&r) {
        panic!("through FCoE over {io}: {f}");
    }
}

#[test]
fn conformance_through_an_fcoe_hop_equals_the_direct_export() {
    require_root("conformance through an FCoE hop");
    let ddir = tempfile::tempdir_in("/dev/shm").unwrap();
    let direct = {
        let gw = Unifab::builder()
            .file_lu(ddir.path().join("lu.img"), 1 << 30)
            .start()
            .expect("unifab starts");
        suite(&gw.url())
    };
    direct.record("unifab-fcoe-direct").expect("record");
    assert!(direct.is_complete(), "the direct run did not end");
    // Both runs happen before either verdict, so one report shows both.
    let xdp = std::panic::catch_unwind(|| through_hop("af_xdp", &direct));
    let packet = std::panic::catch_unwind(|| through_hop("af_packet", &direct));
    assert!(xdp.is_ok() && packet.is_ok(), "see the failures above");
}
