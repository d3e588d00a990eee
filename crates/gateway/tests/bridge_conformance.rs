//! Conformance through the bridge: libiscsi's full suite
//! (`iscsi-test-cu -t ALL --dataloss --allow-sanitize`, two sessions) against
//! tgtd directly and against unifab re-exporting the same tgtd LU. No test
//! that passes against tgtd directly may fail (or skip) through unifab; the
//! tests that pass only through unifab are listed, with the reason, in
//! docs/bridge.md. The bridged run is also held to its own ratchet,
//! `conformance/bridge-tgtd.pass`.
//!
//! A read-only view of a tgtd LU (`read_only = true`) passes libiscsi's
//! `ALL.ReadOnly` and leaves the LU's medium as it was; through it, the
//! whole suite fails only where the view refused a command (or where it
//! fails against tgtd directly), and changes nothing; a reset through it
//! leaves the LU's owner its reservation and no unit attention. With one
//! remote session for every host, every host learns of a reset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bridge_support;

use bridge_support::*;
use unifab_testkit::medium;
use unifab_testkit::peers::{IscsiTestCu, Outcome, PassList, Tgtd, conformance_dir};

#[test]
fn a_read_only_view_of_a_tgtd_lu_passes_the_read_only_suite() {
    let dir = scratch();
    let file = dir.path().join("lu.img");
    medium::patterned(&file, 64 << 20).unwrap();
    let before = medium::digest(&file).unwrap();
    let tgtd = Tgtd::start(&file).unwrap_or_else(|e| panic!("{e}"));
    let gw = Gateway::start(
        dir.path(),
        &bridge_config_lu(dir.path(), &tgtd.url(), "read_only = true", ""),
    );

    // Directly, tgtd's LU is writable: the suite's one test skips.
    let direct = IscsiTestCu::new(tgtd.url())
        .tests("ALL.ReadOnly")
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        direct.outcome("ALL.ReadOnly.ReadOnlySBC"),
        Some(Outcome::Skipped),
        "direct run: {}",
        direct.stderr_tail
    );
    // Through the view it runs (MODE SENSE shows WP) and passes.
    let viewed = IscsiTestCu::new(gw.url(0))
        .tests("ALL.ReadOnly")
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    viewed.record("bridge-read-only").unwrap();
    let list = PassList::load(conformance_dir().join("bridge-read-only.pass")).unwrap();
    if let Err(f) = list.check(&viewed) {
        panic!("{f}\ngateway log:\n{}", tail(&gw.log(), 40));
    }
    let luns = gw.show("luns");
    assert_eq!(luns[0]["write_protected"], true, "{luns}");
    drop(gw);
    drop(tgtd);
    assert!(
        medium::digest(&file).unwrap() == before,
        "the remote LU's medium changed through a read-only view"
    );
}

/// tgtd serving a 64 MiB LU, a gateway exporting it with `lu_lines` and
/// `[lu.iscsi]` lines `remote`, and the LU's owner logged in to tgtd
/// directly: `body` gets the owner's session and the gateway's portal and
/// target name, and runs on a runtime of its own.
fn with_tgtd_behind_a_gateway<F>(
    lu_lines: &str,
    remote: &str,
    body: impl FnOnce(unifab_iscsi::initiator::io::IscsiInitiator, String, String) -> F,
) where
    F: std::future::Future<Output = ()>,
{
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 64 << 20);
    let tgtd = Tgtd::start(&file).unwrap_or_else(|e| panic!("{e}"));
    let gw = Gateway::start(
        dir.path(),
        &bridge_config_lu(dir.path(), &tgtd.url(), lu_lines, remote),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let portal = tgtd.addr().to_string();
        let owner = host::login("iqn.2026-11.io.example:owner", &portal, tgtd.iqn()).await;
        body(owner, gw.addr.to_string(), gw.iqn.clone()).await;
    });
}

/// A LOGICAL UNIT RESET from a host of a read-only view resets the view,
/// not tgtd's LU: the owner (logged in to tgtd directly) keeps its
/// RESERVE(6) reservation and gets no unit attention; the view's host gets
/// the view's own.
#[test]
fn a_reset_through_a_read_only_view_leaves_the_owner_on_tgtd_alone() {
    use host::*;
    use unifab_scsi_core::sense::asc;
    use unifab_scsi_core::{Lun, SenseKey, Status, TmfFunction, TmfResponse};

    with_tgtd_behind_a_gateway(
        "read_only = true",
        "",
        |owner, gw_portal, gw_iqn| async move {
            let host = login("iqn.2026-11.io.example:host", &gw_portal, &gw_iqn).await;
            let owner_lun = Lun::from_index(Tgtd::LUN as u16).unwrap();
            let host_lun = Lun::ZERO;
            ready(&owner, owner_lun).await;
            ready(&host, host_lun).await;
            let r = run(&owner, owner_lun, RESERVE6, 0).await;
            assert_eq!(r.status, Status::GOOD, "RESERVE(6): {:?}", sense(&r));
            let r = run(&host, host_lun, READ10, 512).await;
            assert_eq!(
                r.status,
                Status::RESERVATION_CONFLICT,
                "the owner's reservation holds"
            );

            let resp = host
                .task_management(host_lun, TmfFunction::LogicalUnitReset)
                .await
                .unwrap();
            assert_eq!(resp, TmfResponse::FunctionComplete);

            let r = run(&owner, owner_lun, TUR, 0).await;
            assert_eq!(
                (r.status, sense(&r)),
                (Status::GOOD, None),
                "the reset through the view reached tgtd"
            );
            let r = run(&host, host_lun, READ10, 512).await;
            assert_eq!(
                sense(&r),
                Some((
                    SenseKey::UNIT_ATTENTION,
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                )),
                "the view's own unit attention"
            );
            let r = run(&host, host_lun, READ10, 512).await;
            assert_eq!(
                r.status,
                Status::RESERVATION_CONFLICT,
                "the owner's reservation survived"
            );
            let r = run(&owner, owner_lun, RELEASE6, 0).await;
            assert_eq!(r.status, Status::GOOD);
            let r = run(&host, host_lun, READ10, 512).await;
            assert_eq!(
                r.status,
                Status::GOOD,
                "readable once released: {:?}",
                sense(&r)
            );
            owner.close();
            host.close();
        },
    );
}

/// With `nexus = "shared"` tgtd sees one initiator for every host of the
/// gateway, and tells one of them (whichever sends the next command) what
/// concerns all: the gateway tells the others. A reset by the LU's owner
/// (directly on tgtd) and a reset by one of the gateway's hosts both reach
/// every host.
#[test]
fn on_a_shared_remote_nexus_every_host_learns_of_a_reset() {
    use host::*;
    use unifab_scsi_core::sense::asc;
    use unifab_scsi_core::{Lun, SenseKey, Status, TmfFunction, TmfResponse};

    with_tgtd_behind_a_gateway(
        "",
        "nexus = \"shared\"",
        |owner, gw_portal, gw_iqn| async move {
            let a = login("iqn.2026-11.io.example:a", &gw_portal, &gw_iqn).await;
            let b = login("iqn.2026-11.io.example:b", &gw_portal, &gw_iqn).await;
            let owner_lun = Lun::from_index(Tgtd::LUN as u16).unwrap();
            let lun = Lun::ZERO;
            ready(&owner, owner_lun).await;
            ready(&a, lun).await;
            ready(&b, lun).await;

            // The owner resets the LU at tgtd: A's next command gets tgtd's
            // unit attention, and B, whose commands tgtd cannot tell from
            // A's, gets the same from the gateway.
            let resp = owner
                .task_management(owner_lun, TmfFunction::LogicalUnitReset)
                .await
                .unwrap();
            assert_eq!(resp, TmfResponse::FunctionComplete);
            let r = run(&a, lun, TUR, 0).await;
            let Some((SenseKey::UNIT_ATTENTION, code)) = sense(&r) else {
                panic!(
                    "A: no unit attention after tgtd's reset: {:?}",
                    (r.status, sense(&r))
                );
            };
            let r = run(&b, lun, TUR, 0).await;
            assert_eq!(sense(&r), Some((SenseKey::UNIT_ATTENTION, code)), "B");
            for i in [&a, &b] {
                assert_eq!(run(i, lun, TUR, 0).await.status, Status::GOOD);
            }

            // A resets the LU through the gateway: tgtd tells no other
            // nexus of it but the owner; the gateway tells B.
            let resp = a
                .task_management(lun, TmfFunction::LogicalUnitReset)
                .await
                .unwrap();
            assert_eq!(resp, TmfResponse::FunctionComplete);
            let r = run(&b, lun, TUR, 0).await;
            assert_eq!(
                sense(&r),
                Some((
                    SenseKey::UNIT_ATTENTION,
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                )),
                "B after A's reset"
            );
            // tgtd also reports a reset to the nexus that asked for it, so its
            // own unit attention follows (on whichever host comes next, and
            // the gateway gives it to the others): a host may hear of the
            // reset twice, never not at all.
            ready(&b, lun).await;
            ready(&a, lun).await;
            for i in [owner, a, b] {
                i.close();
            }
        },
    );
}

#[test]
fn every_test_that_passes_on_tgtd_passes_through_unifab() {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 1 << 30);
    let tgtd = Tgtd::start(&file).unwrap_or_else(|e| panic!("{e}"));
    let gw = Gateway::start(dir.path(), &bridge_config(dir.path(), &tgtd.url(), ""));

    let direct = IscsiTestCu::new(tgtd.url())
        .multipath_url(tgtd.url())
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    direct.record("bridge-direct-tgtd").unwrap();
    assert!(direct.is_complete(), "direct run: {}", direct.stderr_tail);

    let bridged = IscsiTestCu::new(gw.url(0))
        .multipath_url(gw.url(0))
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    bridged.record("bridge-tgtd").unwrap();
    assert!(
        bridged.is_complete(),
        "bridged run: {}\ngateway log:\n{}",
        bridged.stderr_tail,
        tail(&gw.log(), 40)
    );

    let mut regressions = Vec::new();
    let mut gains = Vec::new();
    for t in &direct.tests {
        let through = bridged.outcome(&t.name);
        if t.outcome == Outcome::Passed && through != Some(Outcome::Passed) {
            let detail = bridged
                .tests
                .iter()
                .find(|b| b.name == t.name)
                .map(|b| b.detail.clone())
                .unwrap_or_else(|| "did not run".into());
            regressions.push(format!("{} ({through:?}): {detail}", t.name));
        }
        if t.outcome != Outcome::Passed && through == Some(Outcome::Passed) {
            gains.push(format!("{} ({} directly)", t.name, t.outcome));
        }
    }
    println!(
        "direct: {} passed, {} skipped, {} failed; bridged: {} passed, {} skipped, {} failed",
        direct.count(Outcome::Passed),
        direct.count(Outcome::Skipped),
        direct.count(Outcome::Failed),
        bridged.count(Outcome::Passed),
        bridged.count(Outcome::Skipped),
        bridged.count(Outcome::Failed),
    );
    for g in &gains {
        println!("passes only through unifab: {g}");
    }
    assert!(
        regressions.is_empty(),
        "tests that pass on tgtd but not through unifab:\n{}\ngateway log:\n{}",
        regressions.join("\n"),
        tail(&gw.log(), 40)
    );
    let list = PassList::load(conformance_dir().join("bridge-tgtd.pass")).unwrap();
    if let Err(f) = list.check(&bridged) {
        panic!("{f}");
    }
    drop(gw);

    // The whole suite through a read-only view of the same LU: the medium
    // does not change, and a test fails only if the view refused one of
    // its commands (DATA PROTECT, WRITE PROTECTED) or it fails directly.
    let view_dir = dir.path().join("view");
    std::fs::create_dir_all(&view_dir).unwrap();
    let view_gw = Gateway::start(
        &view_dir,
        &bridge_config_lu(&view_dir, &tgtd.url(), "read_only = true", ""),
    );
    let before = medium::digest(&file).unwrap();
    let viewed = IscsiTestCu::new(view_gw.url(0))
        .multipath_url(view_gw.url(0))
        .run()
        .unwrap_or_else(|e| panic!("{e}"));
    viewed.record("bridge-read-only-all").unwrap();
    assert!(
        viewed.is_complete(),
        "read-only run: {}",
        viewed.stderr_tail
    );
    let unexplained: Vec<String> = viewed
        .tests
        .iter()
        .filter(|t| t.outcome == Outcome::Failed)
        .filter(|t| {
            let refused = t.detail.contains("WRITE_PROTECTED")
                || t.detail.contains("(0x07)/(0x2700)")
                || (WRITES_WITHOUT_SENSE.contains(&t.name.as_str())
                    && t.detail.contains("SCSI_STATUS_CHECK_CONDITION"));
            !refused && direct.outcome(&t.name) == Some(Outcome::Passed)
        })
        .map(|t| format!("{}: {}", t.name, t.detail))
        .collect();
    println!(
        "read-only view: {} passed, {} skipped, {} failed",
        viewed.count(Outcome::Passed),
        viewed.count(Outcome::Skipped),
        viewed.count(Outcome::Failed),
    );
    assert!(
        unexplained.is_empty(),
        "tests that pass on tgtd fail through a read-only view without a refusal:\n{}",
        unexplained.join("\n")
    );
    // What only reads must not be refused: every test of the reading
    // suites that passes on tgtd passes through the view.
    let lost_reads: Vec<&str> = direct
        .tests
        .iter()
        .filter(|t| t.outcome == Outcome::Passed)
        .filter(|t| READ_SUITES.contains(&t.name.split('.').nth(1).unwrap_or("")))
        .filter(|t| viewed.outcome(&t.name) != Some(Outcome::Passed))
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        lost_reads.is_empty()
            && viewed.outcome("ALL.ReadOnly.ReadOnlySBC") == Some(Outcome::Passed),
        "reading tests that fail through the view: {lost_reads:?}\n{}",
        viewed.to_table()
    );
    drop(view_gw);
    assert!(
        medium::digest(&file).unwrap() == before,
        "the LU changed through a read-only view"
    );
}

/// libiscsi suites whose tests only read, report or verify.
const READ_SUITES: &[&str] = &[
    "Inquiry",
    "Prefetch10",
    "Prefetch16",
    "Read6",
    "Read10",
    "Read12",
    "Read16",
    "ReadCapacity10",
    "ReadCapacity16",
    "ReadDefectData10",
    "ReadDefectData12",
    "ReportSupportedOpcodes",
    "TestUnitReady",
    "Verify10",
    "Verify12",
    "Verify16",
];

/// Tests whose writes fail through a read-only view but which print only
/// that the status was CHECK CONDITION, not the sense: Write10.Async
/// asserts `status != SCSI_STATUS_CHECK_CONDITION` for its writes, and so
/// does iSCSITMF.AbortTaskSimpleAsync for the WRITE(10) it then aborts
/// (the view refuses the write at once, so the abort usually finds it
/// ended: the test fails unless the abort overtakes the refusal).
const WRITES_WITHOUT_SENSE: &[&str] = &["ALL.Write10.Async", "ALL.iSCSITMF.AbortTaskSimpleAsync"];
