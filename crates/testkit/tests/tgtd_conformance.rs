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

use unifab_testkit::peers::{
    IscsiTestCu, PassList, SuiteResult, Tgtd, conformance_dir, workspace_root,
};

/// A 1 GiB sparse LU on tmpfs (the size unifab's default LU has).
fn tmpfs_lu() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let path = dir.path().join("lu.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(1 << 30))
        .expect("sparse LU file");
    (dir, path)
}

fn record(name: &str, result: &SuiteResult) {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("conformance");
    std::fs::create_dir_all(&dir).expect("target/conformance");
    std::fs::write(dir.join(format!("{name}.txt")), result.to_table()).expect("write table");
    std::fs::write(dir.join(format!("{name}.console")), &result.stdout).expect("write console");
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
    record("tgtd", &result);
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
    record("tgtd-multipath", &result);
    check("tgtd-multipath.pass", &result);
}
