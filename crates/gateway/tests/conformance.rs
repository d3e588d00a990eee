//! libiscsi's conformance suite (`iscsi-test-cu --test ALL --dataloss
//! --allow-sanitize`, 230 tests) against `unifab run`'s file LU, once with one
//! session and once with a second session to the same LU (which turns on the
//! MultipathIO suite; that run leaves out the Sanitize suite, whose
//! Reservations test leaves the shared second path reserved). The suites that need a property the default LU does
//! not have run against an LU that has it: a removable medium
//! (PreventAllow, StartStopUnit), write protection (ReadOnly) and 4 KiB
//! physical blocks (the WRITE SAME / COMPARE AND WRITE tests that need
//! LBPPB > 1). A run passes when no test FAILS and every test in its
//! checked-in list (`conformance/unifab*.pass`, which only grows) passes.
//! The union of the lists is checked against `iscsi-test-cu --list`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;

use unifab_testkit::peers::{
    IscsiTestCu, PassList, SuiteResult, Unifab, UnifabBuilder, assert_run_passes, conformance_dir,
    list_tests, suites_except,
};

/// Every pass list of unifab's runs; their union is the whole suite.
const PASS_LISTS: &[&str] = &[
    "unifab.pass",
    "unifab-multipath.pass",
    "unifab-removable.pass",
    "unifab-read-only.pass",
    "unifab-4k-physical.pass",
];

fn check(list_name: &str, result: &SuiteResult) {
    assert_run_passes(list_name, result);
}

fn lu() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let path = dir.path().join("lu.img");
    (dir, path)
}

#[test]
fn unifab_passes_the_conformance_suite() {
    let (_dir, path) = lu();
    let gw = Unifab::builder()
        .file_lu(&path, 1 << 30)
        .start()
        .expect("unifab starts");
    let result = IscsiTestCu::new(gw.url())
        .run()
        .unwrap_or_else(|e| panic!("suite runs: {e}\nunifab's log:\n{}", gw.log()));
    result.record("unifab").expect("record the run");
    check("unifab.pass", &result);
}

#[test]
fn unifab_passes_the_conformance_suite_with_two_sessions() {
    let (_dir, path) = lu();
    let gw = Unifab::builder()
        .file_lu(&path, 1 << 30)
        .start()
        .expect("unifab starts");
    let result = IscsiTestCu::new(gw.url())
        // With a second URL, libiscsi's Sanitize.Reservations takes a
        // RESERVE(6) on the shared second path and never logs it out, so
        // Sanitize.Reset then meets RESERVATION CONFLICT, as it must on
        // any target; the one-session run covers the Sanitize suite.
        .tests(suites_except("ALL", &["Sanitize"]).expect("iscsi-test-cu --list"))
        .multipath_url(gw.url())
        .run()
        .unwrap_or_else(|e| panic!("suite runs: {e}\nunifab's log:\n{}", gw.log()));
    result.record("unifab-multipath").expect("record the run");
    check("unifab-multipath.pass", &result);
}

/// Runs `tests` against LUN 0 of a gateway made by `builder` with a 1 GiB
/// file LU at `path`, records it as `name` and checks `name.pass`.
fn special_run(name: &str, builder: impl FnOnce(UnifabBuilder) -> UnifabBuilder, tests: &str) {
    let (_dir, path) = lu();
    let gw = builder(Unifab::builder().file_lu(&path, 1 << 30))
        .start()
        .expect("unifab starts");
    let result = IscsiTestCu::new(gw.url())
        .tests(tests)
        .run()
        .unwrap_or_else(|e| panic!("suite runs: {e}\nunifab's log:\n{}", gw.log()));
    result.record(name).expect("record the run");
    check(&format!("{name}.pass"), &result);
}

#[test]
fn unifab_passes_the_removable_medium_suites() {
    special_run(
        "unifab-removable",
        UnifabBuilder::removable,
        "ALL.PreventAllow,ALL.StartStopUnit",
    );
}

#[test]
fn unifab_passes_the_read_only_suite() {
    let (_dir, path) = lu();
    // A read-only LU never creates its file.
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(1 << 30))
        .expect("create the medium");
    let gw = Unifab::builder()
        .file_lu(&path, 1 << 30)
        .read_only()
        .start()
        .expect("unifab starts");
    let result = IscsiTestCu::new(gw.url())
        .tests("ALL.ReadOnly")
        .run()
        .unwrap_or_else(|e| panic!("suite runs: {e}\nunifab's log:\n{}", gw.log()));
    result.record("unifab-read-only").expect("record the run");
    check("unifab-read-only.pass", &result);
}

#[test]
fn unifab_passes_the_physical_block_suites() {
    special_run(
        "unifab-4k-physical",
        |b| b.physical_block_size(4096),
        "ALL.CompareAndWrite,ALL.WriteSame10,ALL.WriteSame16",
    );
}

/// "The issue is resolved when the list is the whole suite": the union of
/// unifab's pass lists is exactly the `ALL` family `iscsi-test-cu --list`
/// names (230 tests in libiscsi 1.19), and no list names a test the suite
/// does not have.
#[test]
fn unifab_pass_lists_cover_the_whole_suite() {
    let suite: BTreeSet<String> = list_tests("ALL")
        .expect("iscsi-test-cu --list")
        .into_iter()
        .collect();
    assert_eq!(suite.len(), 230, "libiscsi 1.19's ALL family has 230 tests");
    let mut union = BTreeSet::new();
    for name in PASS_LISTS {
        let list = PassList::load(conformance_dir().join(name)).expect("pass list");
        let unknown: Vec<&String> = list.names.difference(&suite).collect();
        assert!(
            unknown.is_empty(),
            "{name} lists tests the suite does not have: {unknown:?}"
        );
        union.extend(list.names);
    }
    let missing: Vec<&String> = suite.difference(&union).collect();
    assert!(
        missing.is_empty(),
        "{} of {} tests are in no unifab pass list: {missing:?}",
        missing.len(),
        suite.len()
    );
}
