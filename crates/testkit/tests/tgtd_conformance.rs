//! libiscsi's full conformance suite (`iscsi-test-cu -t ALL --dataloss`, 230
//! tests) against tgtd, checked with the ratchet against
//! `conformance/tgtd.pass` (single session) and
//! `conformance/tgtd-multipath.pass` (a second session to the same LU, which
//! turns on the MultipathIO suite).
//!
//! This proves the harness end to end on a real target: it fails if tgtd or
//! libiscsi is missing, if the suite cannot run, or if any listed test does
//! not pass. Each run takes about 25 s (tmpfs-backed 1 GiB LU).
//!
//! Every run's per-test table is written to
//! `target/conformance/<name>.txt`; `conformance/tgtd-1.0.85.txt` is such a
//! table, checked in as the baseline.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use unifab_testkit::peers::{IscsiTestCu, PassList, SuiteResult, Tgtd, conformance_dir};

/// A 1 GiB sparse LU on tmpfs (the size unifab's default LU has).
fn tmpfs_lu() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let path = dir.path().join("lu.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(1 << 30))
        .expect("sparse LU file");
    (dir, path)
}

fn check(list_name: &str, result: &SuiteResult) {
    assert!(
        result.is_complete(),
        "the suite did not reach its end ({}):\n{}",
        result.status,
        result.stderr_tail
    );
    let list = PassList::load(conformance_dir().join(list_name)).expect("pass list");
    match list.check(result) {
        Ok(report) => println!("{report}"),
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn tgtd_passes_its_conformance_list() {
    let (_dir, path) = tmpfs_lu();
    let tgtd = Tgtd::start(&path).expect("tgtd starts");
    let result = IscsiTestCu::new(tgtd.url()).run().expect("suite runs");
    result.record("tgtd").expect("record the run");
    check("tgtd.pass", &result);
}

#[test]
fn tgtd_passes_its_multipath_conformance_list() {
    let (_dir, path) = tmpfs_lu();
    let tgtd = Tgtd::start(&path).expect("tgtd starts");
    let result = IscsiTestCu::new(tgtd.url())
        .multipath_url(tgtd.url())
        .run()
        .expect("suite runs");
    result.record("tgtd-multipath").expect("record the run");
    check("tgtd-multipath.pass", &result);
}
