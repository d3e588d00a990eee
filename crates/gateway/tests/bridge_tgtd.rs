//! unifab's iSCSI initiator against tgtd (Debian `tgt`): discovery, login
//! without CHAP, with CHAP and with mutual CHAP, digests on and off, and a
//! 256 MiB random write/read/verify with `unifab bench`, straight to tgtd
//! and through a unifab gateway that re-exports the tgtd LU.
//!
//! A missing tgtd is a failure naming the package, never a skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bridge_support;

use bridge_support::*;
use unifab_testkit::peers::{Chap, Digest, Tgtd};

const MIB: u64 = 1 << 20;

fn tgtd(file: &std::path::Path) -> unifab_testkit::peers::TgtdBuilder {
    Tgtd::builder(file)
}

#[test]
fn discovery_lists_tgtd_targets_and_luns() {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 64 * MIB);
    let t = tgtd(&file).start().unwrap_or_else(|e| panic!("{e}"));
    let (ok, out, err) = discover(&[&t.addr().to_string(), "--json"]);
    assert!(ok, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let targets = v.as_array().unwrap();
    assert_eq!(targets.len(), 1, "{out}");
    assert_eq!(targets[0]["name"], t.iqn());
    assert!(
        targets[0]["addresses"][0]
            .as_str()
            .unwrap()
            .starts_with(&t.addr().to_string()),
        "{out}"
    );
    let luns = targets[0]["luns"].as_array().unwrap();
    // tgtd: LUN 0 is its controller, LUN 1 the disk.
    assert_eq!(luns.len(), 2, "{out}");
    assert_eq!(luns[0]["device_type"], 0x0c);
    assert_eq!(luns[1]["lun"], 1);
    assert_eq!(luns[1]["device_type"], 0);
    assert_eq!(luns[1]["block_size"], 512);
    assert_eq!(luns[1]["blocks"], 64 * MIB / 512);
    assert_eq!(
        luns[1]["url"],
        format!("iscsi://{}/{}/1", t.addr(), t.iqn())
    );
    // The human form names the same things.
    let (ok, text, _) = discover(&[&t.addr().to_string()]);
    assert!(ok);
    assert!(
        text.contains(t.iqn()) && text.contains("LUN 1") && text.contains("64.00 MiB"),
        "{text}"
    );
}

#[test]
fn discovery_of_a_chap_target_needs_the_credentials() {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 16 * MIB);
    let t = tgtd(&file)
        .chap(Chap::new("alice", "alice-secret-123"))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let (ok, out, err) = discover(&[&t.addr().to_string()]);
    assert!(
        !ok,
        "listing LUNs of a CHAP target without credentials fails"
    );
    assert!(
        out.contains("authentication failure") || err.contains("authentication failure"),
        "{out}\n{err}"
    );
    let (ok, out, err) = discover(&[
        &format!("iscsi://alice%alice-secret-123@{}", t.addr()),
        "--json",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("\"blocks\": 32768"), "{out}");
}

/// One login configuration: (CHAP, mutual CHAP, digests at tgtd, offer
/// digests).
#[test]
fn login_without_with_chap_and_mutual_chap_digests_on_and_off() {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 64 * MIB);
    let cases: [(bool, bool, bool); 6] = [
        (false, false, false),
        (false, false, true),
        (true, false, false),
        (true, false, true),
        (true, true, false),
        (true, true, true),
    ];
    for (chap, mutual, digests) in cases {
        let mut b = tgtd(&file);
        if chap {
            b = b.chap(Chap::new("alice", "alice-secret-123"));
        }
        if mutual {
            b = b.mutual_chap(Chap::new("tgtd", "tgtd-secret-4567"));
        }
        if digests {
            b = b.header_digest(Digest::Crc32c).data_digest(Digest::Crc32c);
        }
        let t = b.start().unwrap_or_else(|e| panic!("{e}"));
        let what = format!("chap={chap} mutual={mutual} digests={digests}");
        // tgtd's URL carries the credentials the way libiscsi writes them.
        let mut args = vec!["--size", "16MiB", "--bs", "64KiB", "--qd", "8"];
        if digests {
            args.push("--digests");
        }
        let r = bench(&t.url(), &args);
        assert!(r.ok, "{what}: {}", r.report());
        assert_eq!(r.u64("miscompares"), 0, "{what}");
        assert_eq!(r.u64("verified_bytes"), 16 * MIB, "{what}");
        assert_eq!(
            r.json["digests"],
            if digests { "header+data" } else { "None" },
            "{what}"
        );
        if chap {
            // A wrong secret is refused, and the bench says why.
            let bad = t.url().replace("alice-secret-123", "wrong-secret-999");
            let out = std::process::Command::new(unifab())
                .args(["bench", &bad, "--size", "1MiB", "--quiet"])
                .env("RUST_LOG", "warn")
                .output()
                .unwrap();
            assert!(!out.status.success(), "{what}: a wrong secret must fail");
            let e = String::from_utf8_lossy(&out.stderr);
            assert!(e.contains("authentication failure"), "{what}: {e}");
        }
        if mutual {
            // A target that cannot prove itself is refused.
            let bad = t.url().replace("tgtd-secret-4567", "not-tgtds-secret");
            let out = std::process::Command::new(unifab())
                .args(["bench", &bad, "--size", "1MiB", "--quiet"])
                .env("RUST_LOG", "warn")
                .output()
                .unwrap();
            assert!(
                !out.status.success(),
                "{what}: a target with the wrong secret must be refused"
            );
        }
    }
}

#[test]
fn random_256mib_write_read_verify_direct_and_through_the_bridge() {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 320 * MIB);
    let t = tgtd(&file)
        .chap(Chap::new("gw", "gateway-secret-1"))
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    // Straight to tgtd, 4 KiB random at queue depth 32.
    let r = bench(
        &t.url(),
        &["--size", "256MiB", "--bs", "4KiB", "--qd", "32"],
    );
    assert!(r.ok, "{}", r.report());
    assert_eq!(r.u64("miscompares"), 0);
    assert_eq!(r.u64("errors"), 0);
    assert_eq!(r.u64("verified_bytes"), 256 * MIB);
    assert_eq!(r.json["write"]["ops"], 65536);
    assert_eq!(r.json["read"]["ops"], 65536);

    // Through the bridge: a host → unifab → tgtd (with CHAP), 64 KiB random.
    let g = Gateway::start(
        dir.path(),
        &bridge_config(dir.path(), &t.url(), "command_timeout = 30\n"),
    );
    let r = bench(
        &g.url(0),
        &["--size", "256MiB", "--bs", "64KiB", "--qd", "16"],
    );
    assert!(r.ok, "{}\ngateway log:\n{}", r.report(), tail(&g.log(), 30));
    assert_eq!(r.u64("miscompares"), 0);
    assert_eq!(r.u64("errors"), 0);
    assert_eq!(r.u64("verified_bytes"), 256 * MIB);
    // What the bridge wrote is on tgtd's LU: read it there directly, every
    // sector checked against what the bridged run wrote.
    let direct = bench(
        &t.url(),
        &[
            "--rw",
            "read",
            "--size",
            "256MiB",
            "--bs",
            "1MiB",
            "--pattern",
            "sequential",
            "--ops",
            "256",
        ],
    );
    assert!(direct.ok, "{}", direct.report());
    assert_eq!(direct.u64("miscompares"), 0);
    assert_eq!(
        direct.u64("unwritten_sectors"),
        0,
        "every sector was written"
    );
}
