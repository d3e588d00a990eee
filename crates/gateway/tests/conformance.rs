//! libiscsi's conformance suite (`iscsi-test-cu --test ALL --dataloss
//! --allow-sanitize`, 230 tests) against `unifab run`'s file LU, once with one
//! session and once with a second session to the same LU (which turns on the
//! MultipathIO suite). A run passes when no test FAILS and every test in the
//! checked-in list (`conformance/unifab*.pass`, which only grows) passes.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use unifab_testkit::peers::{IscsiTestCu, Outcome, PassList, SuiteResult, Unifab, conformance_dir};

fn check(list_name: &str, result: &SuiteResult) {
    assert!(
        result.is_complete(),
        "the suite did not reach its end ({}):\n{}",
        result.status,
        result.stderr_tail
    );
    let failed: Vec<&str> = result
        .tests
        .iter()
        .filter(|t| t.outcome == Outcome::Failed)
        .map(|t| t.name.as_str())
        .collect();
    let list = PassList::load(conformance_dir().join(list_name)).expect("pass list");
    let report = list.check(result);
    if let Ok(r) = &report {
        println!("{r}");
    }
    assert!(
        failed.is_empty(),
        "tests FAILED against unifab: {failed:?}\n{}",
        result.to_table()
    );
    if let Err(f) = report {
        panic!("{f}");
    }
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
    let result = IscsiTestCu::new(gw.url()).run().expect("suite runs");
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
        .multipath_url(gw.url())
        .run()
        .expect("suite runs");
    result.record("unifab-multipath").expect("record the run");
    check("unifab-multipath.pass", &result);
}
