//! Conformance through FC: libiscsi's suite (`iscsi-test-cu --test ALL
//! --dataloss --allow-sanitize`, 230 tests) against unifab's iSCSI target
//! whose LU is `fc://…`: iSCSI target → RemoteLu → FCP initiator (an NPIV
//! port per host session) → the software fabric → FCP target N_Port →
//! file LU. It must pass exactly the tests the same file LU passes when
//! exported directly, measured in the same run, with one session and with
//! two (the MultipathIO suite).
//!
//! Needs the release binary (`cargo build --release -p unifab`) and
//! `iscsi-test-cu` (Debian `libiscsi-bin`); a missing one fails the test
//! with its name.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use unifab_testkit::lines::child_portal;
use unifab_testkit::medium;
use unifab_testkit::peers::{IscsiTestCu, Outcome, SuiteResult, Unifab, suites_except, unifab_bin};

const TARGET_WWPN: &str = "21:00:00:00:c9:00:00:0a";
const INITIATOR_WWPN: &str = "21:00:00:00:c9:00:00:0b";
const IQN: &str = "iqn.2026-11.io.unifab:via-fc";

/// `unifab run` with an fc:// LU; killed on drop.
struct FcGateway {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    log: std::path::PathBuf,
}

impl FcGateway {
    /// Fails with the gateway's log if it is not running any more.
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("unifab exited ({status}):\n{}", tail.join("\n"));
        }
    }
}

impl Drop for FcGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    unifab_testkit::peers::free_tcp_port().expect("a free port")
}

fn start_fc_gateway(dir: &Path) -> FcGateway {
    start_fc_gateway_with(dir, "", &["via-fc"])
}

/// A gateway whose FC target exports the file LU `disk`, with the fc:// LU
/// `via-fc` on it and the `[[lu]]` sections `more_lus`; its iSCSI target
/// exports `exported`, as LUN 0, 1, … in order.
fn start_fc_gateway_with(dir: &Path, more_lus: &str, exported: &[&str]) -> FcGateway {
    let bin = unifab_bin().expect("the release binary (cargo build --release -p unifab)");
    let admin_port = free_port();
    let exported = exported
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let cfg = format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/lu.img"
size = "1GiB"

[[lu]]
name = "via-fc"
backend = "fc://{TARGET_WWPN}/0"
{more_lus}

[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"

[[fabric.target]]
wwpn = "{TARGET_WWPN}"
luns = ["disk"]

[fabric.initiator]
wwpn = "{INITIATOR_WWPN}"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "{IQN}"
luns = [{exported}]

[admin]
listen = "127.0.0.1:{admin_port}"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    );
    let path = dir.join("unifab.toml");
    std::fs::write(&path, cfg).unwrap();
    let log = dir.join("unifab.log");
    let mut child = Command::new(bin)
        .arg("run")
        .arg("--config")
        .arg(&path)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn unifab");
    let (_, addr) = child_portal(&mut child, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("unifab did not print its portal: {e}"));
    FcGateway {
        child,
        addr,
        admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
        log,
    }
}

fn url(addr: SocketAddr) -> String {
    format!("iscsi://{addr}/{IQN}/0")
}

fn outcomes(r: &SuiteResult, o: Outcome) -> BTreeSet<String> {
    r.tests
        .iter()
        .filter(|t| t.outcome == o)
        .map(|t| t.name.clone())
        .collect()
}

fn compare(name: &str, via_fc: &SuiteResult, direct: &SuiteResult) {
    assert!(
        via_fc.is_complete(),
        "{name}: the suite through FC did not reach its end ({}):\n{}",
        via_fc.status,
        via_fc.stderr_tail
    );
    assert!(direct.is_complete(), "{name}: the direct run did not end");
    let failed = outcomes(via_fc, Outcome::Failed);
    let fc_passed = outcomes(via_fc, Outcome::Passed);
    let direct_passed = outcomes(direct, Outcome::Passed);
    let lost: Vec<&String> = direct_passed.difference(&fc_passed).collect();
    let gained: Vec<&String> = fc_passed.difference(&direct_passed).collect();
    println!(
        "{name}: through FC {} passed, {} skipped, {} FAILED; direct {} passed, {} skipped, {} FAILED",
        fc_passed.len(),
        via_fc.count(Outcome::Skipped),
        failed.len(),
        direct_passed.len(),
        direct.count(Outcome::Skipped),
        direct.count(Outcome::Failed),
    );
    assert!(
        failed.is_empty() && lost.is_empty() && gained.is_empty(),
        "{name}: through FC FAILED {failed:?}; passed directly but not through FC {lost:?}; \
         passed through FC only {gained:?}\n{}\n{}",
        via_fc.failures(),
        via_fc.to_table()
    );
}

fn show(what: &str, admin: SocketAddr) -> String {
    show_with(&[what], admin)
}

/// `unifab show ARGS --admin ADMIN`'s output; fails if the command does.
fn show_with(args: &[&str], admin: SocketAddr) -> String {
    let out = Command::new(unifab_bin().unwrap())
        .arg("show")
        .args(args)
        .args(["--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_pair(two_sessions: bool) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let mut gw = start_fc_gateway(dir.path());
    let table = show("flogi", gw.admin);
    assert!(
        table.contains(TARGET_WWPN) && table.contains(INITIATOR_WWPN),
        "{table}"
    );
    let ns = show("fcns", gw.admin);
    assert!(
        ns.contains("scsi-fcp:target") && ns.contains("scsi-fcp:init"),
        "{ns}"
    );
    // With two sessions the Sanitize suite is left out (as in
    // conformance.rs): its Reservations test leaves the shared second path
    // reserved, so Sanitize.Reset meets RESERVATION CONFLICT on any target.
    let selection = if two_sessions {
        suites_except("ALL", &["Sanitize"]).expect("iscsi-test-cu --list")
    } else {
        "ALL".to_owned()
    };
    let mut suite = IscsiTestCu::new(url(gw.addr)).tests(selection.clone());
    if two_sessions {
        suite = suite.multipath_url(url(gw.addr));
    }
    let via_fc = suite
        .timeout(Duration::from_secs(600))
        .run()
        .expect("suite runs through FC");
    gw.check_alive();
    let label = if two_sessions {
        "unifab-fc-multipath"
    } else {
        "unifab-fc"
    };
    via_fc.record(label).expect("record the run");
    drop(gw);

    let ddir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let direct_gw = Unifab::builder()
        .file_lu(ddir.path().join("lu.img"), 1 << 30)
        .start()
        .expect("unifab starts");
    let mut suite = IscsiTestCu::new(direct_gw.url()).tests(selection);
    if two_sessions {
        suite = suite.multipath_url(direct_gw.url());
    }
    let direct = suite
        .timeout(Duration::from_secs(600))
        .run()
        .expect("suite runs directly");
    compare(label, &via_fc, &direct);
}

#[test]
fn conformance_through_fc_equals_the_direct_export() {
    run_pair(false);
}

#[test]
fn conformance_through_fc_equals_the_direct_export_with_two_sessions() {
    run_pair(true);
}

/// `unifab show remotes` lists an `fc://` LU's session: the configured
/// initiator N_Port, logged in with the LU's target port, up since the
/// start with one login and no error. The rows of sessions that end are
/// the FC node's unit test's (`the_view_records_sessions_and_why_they_ended`).
#[test]
fn show_remotes_lists_the_fc_session() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let mut gw = start_fc_gateway(dir.path());
    let remotes = || -> Vec<serde_json::Value> {
        serde_json::from_str(&show_with(&["remotes", "--json"], gw.admin)).expect("JSON rows")
    };
    // The session comes up as soon as both ports are logged into the
    // fabric; the bound only keeps a broken build from hanging.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rows = remotes();
    while !rows.iter().any(|r| r["state"] == "up") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        rows = remotes();
    }
    gw.check_alive();
    let row = rows
        .iter()
        .find(|r| r["initiator"] == INITIATOR_WWPN)
        .unwrap_or_else(|| panic!("no row for the initiator port: {rows:?}"));
    assert_eq!(row["lu"], "via-fc", "{row}");
    assert_eq!(row["remote"], format!("fc://{TARGET_WWPN}/0"), "{row}");
    assert_eq!(row["state"], "up", "{row}");
    assert_eq!(row["logins"], 1, "{row}");
    assert!(row["last_error"].is_null(), "{row}");
    assert!(
        row["fcid"]
            .as_str()
            .is_some_and(|f| f.len() == 8 && f != "0x000000"),
        "{row}"
    );
    assert!(row["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{row}");
    // The table shows it too.
    let table = show("remotes", gw.admin);
    assert!(
        table.contains("via-fc") && table.contains(" up "),
        "{table}"
    );
    // /metrics carries both N_Ports' counters: the logins went both ways.
    let value = |text: &str, name: &str, wwpn: &str| -> Option<u64> {
        let key = format!("{name}{{wwpn=\"{wwpn}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.parse().ok())
    };
    let metrics = show("metrics", gw.admin);
    for wwpn in [INITIATOR_WWPN, TARGET_WWPN] {
        for name in [
            "unifab_fc_port_tx_frames_total",
            "unifab_fc_port_rx_frames_total",
        ] {
            assert!(
                value(&metrics, name, wwpn).is_some_and(|n| n > 0),
                "{name} {wwpn}: {metrics}"
            );
        }
        assert_eq!(
            value(&metrics, "unifab_fc_port_writes_waiting", wwpn),
            Some(0),
            "{metrics}"
        );
    }
    // Nothing is left open or waiting on any port, the hosts' NPIV ports
    // included, once the commands have ended: no room leaked, on the
    // initiator's side or the target's.
    for name in [
        "unifab_fc_port_frames_in",
        "unifab_fc_port_commands_waiting",
        "unifab_fc_port_writes_waiting",
        "unifab_fc_port_write_bytes_held",
        "unifab_fc_port_write_bytes_to_come",
    ] {
        let lines: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .collect();
        assert!(lines.len() >= 2, "{name}: {metrics}");
        assert!(lines.iter().all(|l| l.ends_with(" 0")), "{name}: {lines:?}");
    }
}

/// `iscsi-inq -e 1 -c PAGE` of LUN `lun` (libiscsi), as text; fails with
/// the tool's error if it does.
fn vpd(addr: SocketAddr, lun: u32, page: u8) -> String {
    let out = Command::new("iscsi-inq")
        .args(["-e", "1", "-c", &page.to_string()])
        .arg(format!("iscsi://{addr}/{IQN}/{lun}"))
        .output()
        .expect("iscsi-inq (libiscsi-bin, installed by scripts/setup.sh)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "iscsi-inq LUN {lun} page {page:#04x}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The logical-unit designators of a page 0x83 as iscsi-inq prints them
/// (target-port designators are the port's the host came in through).
fn lu_designators(page83: &str) -> Vec<String> {
    page83
        .split("DEVICE DESIGNATOR #")
        .filter(|d| d.contains("Association:(0) LOGICAL_UNIT"))
        .map(|d| d.split_once('\n').map_or("", |(_, rest)| rest).to_owned())
        .collect()
}

/// An fc:// LU's identity, seen by a host through the gateway's iSCSI
/// target: derived (the default) it differs from the remote LU's, so two
/// remote LUs with the same identity stay apart; with `[lu.fc] identity =
/// "passthrough"` it is the remote's own VPD 0x80 and 0x83 logical-unit
/// designators, so a host that also reaches the LU directly sees one
/// device.
#[test]
fn an_fc_lu_derives_its_identity_or_passes_the_remotes_through() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let passthrough = format!(
        "\n[[lu]]\nname = \"via-fc-pass\"\nbackend = \"fc://{TARGET_WWPN}/0\"\n[lu.fc]\nidentity = \"passthrough\"\n"
    );
    let mut gw =
        start_fc_gateway_with(dir.path(), &passthrough, &["disk", "via-fc", "via-fc-pass"]);
    let addr = gw.addr;
    let serial = |lun: u32| {
        let text = vpd(addr, lun, 0x80);
        text.split_once("Unit Serial Number:[")
            .and_then(|(_, s)| s.split_once(']'))
            .map(|(s, _)| s.to_owned())
            .unwrap_or_else(|| panic!("no serial number for LUN {lun}: {text}"))
    };
    let (direct, derived, passed) = (serial(0), serial(1), serial(2));
    gw.check_alive();
    assert_eq!(passed, direct, "passthrough: the remote's serial number");
    assert_ne!(derived, direct, "derived: a serial number of its own");
    assert!(
        derived.len() == 16 && derived.bytes().all(|b| b.is_ascii_hexdigit()),
        "{derived}"
    );
    let ids = |lun: u32| {
        let text = vpd(addr, lun, 0x83);
        let ids = lu_designators(&text);
        assert_eq!(ids.len(), 2, "LUN {lun}: T10 vendor ID and NAA: {text}");
        ids
    };
    let (direct, derived, passed) = (ids(0), ids(1), ids(2));
    assert_eq!(passed, direct, "passthrough: the remote's designators");
    assert!(
        derived.iter().all(|d| !direct.contains(d)),
        "derived: no designator of the remote's: {derived:?} against {direct:?}"
    );
    assert!(
        derived[0].contains(&format!("[UNIFAB  {}]", serial(1))),
        "{derived:?}"
    );
}

/// `read_only = true` on an fc:// LU makes it a read-only view: libiscsi's
/// `ALL.ReadOnly` passes through it (MODE SENSE shows WP, every write is
/// refused with DATA PROTECT), `unifab show luns` says so, and the FC
/// target's medium is unchanged.
#[test]
fn an_fc_lu_can_be_a_read_only_view() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    // The FC target's medium, with a pattern where the suite writes.
    let image = dir.path().join("lu.img");
    medium::patterned(&image, 1 << 30).unwrap();
    let before = medium::digest(&image).unwrap();
    let view = format!(
        "\n[[lu]]\nname = \"via-fc-ro\"\nbackend = \"fc://{TARGET_WWPN}/0\"\nread_only = true\n"
    );
    let mut gw = start_fc_gateway_with(dir.path(), &view, &["disk", "via-fc-ro"]);
    let viewed = IscsiTestCu::new(format!("iscsi://{}/{IQN}/1", gw.addr))
        .tests("ALL.ReadOnly")
        .run()
        .expect("suite runs");
    gw.check_alive();
    assert_eq!(
        viewed.outcome("ALL.ReadOnly.ReadOnlySBC"),
        Some(Outcome::Passed),
        "{}",
        viewed.to_table()
    );
    let luns: serde_json::Value =
        serde_json::from_str(&show_with(&["luns", "--json"], gw.admin)).unwrap();
    let protected = |name: &str| {
        luns.as_array()
            .and_then(|a| a.iter().find(|l| l["name"] == name))
            .map(|l| l["write_protected"].clone())
    };
    assert_eq!(
        protected("via-fc-ro"),
        Some(serde_json::Value::Bool(true)),
        "{luns}"
    );
    assert_eq!(
        protected("disk"),
        Some(serde_json::Value::Bool(false)),
        "{luns}"
    );
    drop(gw);
    assert!(
        medium::digest(&image).unwrap() == before,
        "the FC target's medium changed through a read-only view"
    );
}
