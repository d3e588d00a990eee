//! Two sites joined by FCIP, each gateway in its own network namespace,
//! the tunnel's two circuits through the testkit WAN emulator (running in
//! the root namespace between them):
//!
//! iSCSI host → unifab A (ns `fcip-a`) → LU `fc://WWPN-at-B/0` → FCIP (two
//! circuits, WAN relay) → unifab B (ns `fcip-b`) → FCP target → file LU.
//!
//! libiscsi's suite (`iscsi-test-cu --test ALL --dataloss
//! --allow-sanitize`) runs along that path in RFC mode and in enhanced
//! mode (LZ4, FastWrite): no test fails, and every test the direct export
//! of a file LU must pass (`conformance/unifab.pass`) and every test of the
//! FCIP ratchet (`conformance/unifab-fcip.pass`) passes. (Circuit loss
//! under load: `crates/fcip/tests/failover.rs`.)
//!
//! The tunnels run with a 100 ms keep-alive and a 2 s dead timer, not the
//! 20/80 ms defaults: this test is about what crosses the tunnel, and on a
//! CI host shared with builds an 80 ms stall of the class F connection in
//! RFC mode takes the link down (circuit loss is `crates/fcip/tests/
//! failover.rs`'s subject; see docs/fcip.md "Not yet shown").
//!
//! Needs root (network namespaces, veth: CI runs as root), the release
//! binary (`cargo build --release -p unifab`) and `iscsi-test-cu`
//! (Debian `libiscsi-bin`); a missing one fails the test with its name.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use unifab_testkit::lines::Lines;
use unifab_testkit::peers::{
    IscsiTestCu, Outcome, PassList, SuiteResult, conformance_dir, unifab_bin,
};
use unifab_testkit::wan::{Netns, WanLink, WanProfile};

const TARGET_WWPN: &str = "21:00:00:00:c9:00:0b:0a";
const INITIATOR_WWPN: &str = "21:00:00:00:c9:00:0a:0b";
const SW_A: &str = "10:00:00:00:c9:00:00:a1";
const SW_B: &str = "10:00:00:00:c9:00:00:b1";
const IQN: &str = "iqn.2026-11.io.unifab:site-a";

/// The namespaces are global: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Gw {
    child: Child,
    log: std::path::PathBuf,
}

impl Gw {
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("unifab exited ({status}):\n{}", tail.join("\n"));
        }
    }
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(ns: &Netns, dir: &Path, name: &str, cfg: &str, wait_for: &str) -> Gw {
    let bin = unifab_bin().expect("the release binary (cargo build --release -p unifab)");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, cfg).unwrap();
    let log = dir.join(format!("{name}.log"));
    let mut child = ns
        .command(bin.to_str().unwrap())
        .arg("run")
        .arg("--config")
        .arg(&path)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn unifab in its namespace");
    let mut lines = Lines::new(child.stdout.take().unwrap());
    if let Err(e) = lines.wait_for(Duration::from_secs(30), |l| {
        l.starts_with(wait_for).then_some(())
    }) {
        let _ = child.kill();
        panic!("{name} did not start: {e}");
    }
    lines.drain();
    Gw { child, log }
}

struct Sites {
    a: Gw,
    b: Gw,
    _links: Vec<WanLink>,
    iscsi: SocketAddr,
    ns_a: Netns,
    ns_b: Netns,
    dir: tempfile::TempDir,
}

/// The far site's LU: a 1 GiB file disk.
const DISK_LU: &str = "name = \"disk\"\nbackend = \"file:@DIR@/lu.img\"\nsize = \"1GiB\"";

fn sites(mode: &str, extra: &str, profile: WanProfile) -> Sites {
    sites_with(mode, extra, profile, lu(DISK_LU), "iscsi-readcapacity16")
}

/// A far LU given as a fixed `[[lu]]` body.
fn lu(body: &str) -> impl FnOnce(&Netns) -> String + '_ {
    move |_| body.to_string()
}

/// Two sites whose far LU is what `far_lu` makes of site B's namespace
/// (the body of its `[[lu]]`, named "disk", `@DIR@` the test's
/// directory); `probe` (a libiscsi utility taking the URL) answers when
/// the LU is reachable through the tunnel.
fn sites_with(
    mode: &str,
    extra: &str,
    profile: WanProfile,
    far_lu: impl FnOnce(&Netns) -> String,
    probe: &str,
) -> Sites {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let ns_a = Netns::create("fcip-a", 77, 1).expect("network namespace fcip-a (needs root)");
    let ns_b = Netns::create("fcip-b", 77, 2).expect("network namespace fcip-b (needs root)");
    let d = dir.path().display();
    let far_lu = far_lu(&ns_b).replace("@DIR@", &d.to_string());
    let b_cfg = format!(
        r#"
[[lu]]
{far_lu}

[fabric]
domain = 2
switch_wwn = "{SW_B}"

[[fabric.target]]
wwpn = "{TARGET_WWPN}"
luns = ["disk"]

[fcip]
listen = "{}:3225"

[[fcip.tunnel]]
name = "fcip0"
peer = "{SW_A}"
mode = "{mode}"
keepalive_ms = 100
dead_ms = 2000
{extra}

[[fcip.tunnel.circuit]]
[[fcip.tunnel.circuit]]

[admin]
listen = "127.0.0.1:9260"
data_dir = "{d}/state-b"
"#,
        ns_b.inside
    );
    let b = start(&ns_b, dir.path(), "site-b", &b_cfg, "FCIP listening");
    let up = SocketAddr::from((ns_b.inside, 3225));
    let links: Vec<WanLink> = (0..2)
        .map(|_| {
            WanLink::start(SocketAddr::from((ns_a.outside, 0)), up, profile).expect("WAN relay")
        })
        .collect();
    let a_cfg = format!(
        r#"
[[lu]]
name = "via-fcip"
backend = "fc://{TARGET_WWPN}/0"

[fabric]
domain = 1
switch_wwn = "{SW_A}"

[fabric.initiator]
wwpn = "{INITIATOR_WWPN}"

[fcip]

[[fcip.tunnel]]
name = "fcip0"
peer = "{SW_B}"
mode = "{mode}"
keepalive_ms = 100
dead_ms = 2000
{extra}

[[fcip.tunnel.circuit]]
peer = "{}"
[[fcip.tunnel.circuit]]
peer = "{}"

[iscsi]
listen = ["{}:3260"]

[[iscsi.target]]
iqn = "{IQN}"
luns = ["via-fcip"]

[admin]
listen = "127.0.0.1:9260"
data_dir = "{d}/state-a"
"#,
        links[0].addr(),
        links[1].addr(),
        ns_a.inside
    );
    let a = start(&ns_a, dir.path(), "site-a", &a_cfg, "iSCSI target");
    let iscsi = SocketAddr::from((ns_a.inside, 3260));
    let s = Sites {
        a,
        b,
        _links: links,
        iscsi,
        ns_a,
        ns_b,
        dir,
    };
    wait_reachable(&s, probe);
    s
}

fn show_fcip(s: &Sites) -> String {
    let out = s
        .ns_a
        .command(unifab_bin().unwrap().to_str().unwrap())
        .args(["show", "fcip", "--admin", "127.0.0.1:9260"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the fc:// LU answers through the tunnel (`probe`, e.g.
/// iscsi-readcapacity16).
fn wait_reachable(s: &Sites, probe: &str) {
    let url = url(s.iscsi);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = Command::new(probe)
            .arg(&url)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the LU behind the tunnel never became reachable\nshow fcip:\n{}\nsite A log:\n{}\nsite B log:\n{}",
            show_fcip(s),
            s.a.log_tail(),
            s.b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn url(addr: SocketAddr) -> String {
    format!("iscsi://{addr}/{IQN}/0")
}

/// The run through FCIP passes: it reached its end, no test FAILED, and
/// every test of both checked-in lists passed — `unifab.pass` (what the
/// direct export of a file LU must pass, `tests/conformance.rs`) and
/// `unifab-fcip.pass` (the FCIP path's own ratchet, which only grows).
/// A failure says why (what each failed test logged, CUnit's assertion
/// lines) and shows the end of both gateways' logs.
fn check(label: &str, via: &SuiteResult, s: &Sites) {
    assert!(
        via.is_complete(),
        "{label}: the suite through FCIP did not reach its end ({}):\n{}\nsite A log:\n{}\nsite B log:\n{}",
        via.status,
        via.stderr_tail,
        s.a.log_tail(),
        s.b.log_tail()
    );
    let failed = failed_names(via);
    println!(
        "{label}: through FCIP {} passed, {} skipped, {} FAILED",
        via.count(Outcome::Passed),
        via.count(Outcome::Skipped),
        failed.len(),
    );
    assert!(
        failed.is_empty(),
        "{label}: tests FAILED through FCIP: {failed:?}\n{}\n{}\nsite A log:\n{}\nsite B log:\n{}",
        via.failures(),
        via.to_table(),
        s.a.log_tail(),
        s.b.log_tail()
    );
    for list in ["unifab.pass", "unifab-fcip.pass"] {
        let list = PassList::load(conformance_dir().join(list)).expect("pass list");
        match list.check(via) {
            Ok(r) => println!("{label}: {r}"),
            Err(f) => panic!("{label}: {f}"),
        }
    }
}

/// The names of the tests that FAILED in `via`, in run order.
fn failed_names(via: &SuiteResult) -> Vec<&str> {
    via.tests
        .iter()
        .filter(|t| t.outcome == Outcome::Failed)
        .map(|t| t.name.as_str())
        .collect()
}

/// The one test whose start races the end of the test before it.
///
/// libiscsi's Sanitize.Reservations ends by closing a second connection
/// that holds a RESERVE(6), and Sanitize.Reset sends its SANITIZE on the
/// first connection at once. The reservation ends with its I_T nexus: at
/// the far site, when site A's N_Port for the closed session has logged
/// out of the target port, one tunnel crossing after site A saw the
/// close. A SANITIZE that crosses first meets RESERVATION CONFLICT, as
/// SPC-4 requires of any target; it never starts, and the test fails
/// (CI met a Sanitize.Reset failure once in many runs, and that suite
/// run took 71 s instead of 134: the 60 s wait for a running SANITIZE
/// never came, as when the SANITIZE never started). The test tool's
/// order, not the gateway, makes the race; so when it is the only test
/// that failed, it runs once more on its own, with no reservation left
/// before it, and that outcome counts. Both outcomes are printed.
const RACES_THE_CLOSE_BEFORE_IT: &str = "ALL.Sanitize.Reset";

/// Runs [`RACES_THE_CLOSE_BEFORE_IT`] alone when it is the only failure
/// of `via`, and takes that run's outcome.
fn rerun_the_racing_test(label: &str, via: &mut SuiteResult, s: &Sites) {
    let failed = failed_names(via);
    if failed != [RACES_THE_CLOSE_BEFORE_IT] {
        return;
    }
    println!(
        "{label}: {RACES_THE_CLOSE_BEFORE_IT} failed in the suite run:\n{}\n\
         it runs once more on its own (see RACES_THE_CLOSE_BEFORE_IT)",
        via.failures()
    );
    let alone = IscsiTestCu::new(url(s.iscsi))
        .tests(RACES_THE_CLOSE_BEFORE_IT)
        .timeout(Duration::from_secs(300))
        .run()
        .expect("the test runs alone through FCIP");
    let outcome = alone.outcome(RACES_THE_CLOSE_BEFORE_IT);
    println!(
        "{label}: {RACES_THE_CLOSE_BEFORE_IT} alone: {}\n{}",
        outcome.map_or("did not run", Outcome::as_str),
        alone.failures()
    );
    if let (Some(outcome), Some(t)) = (
        outcome,
        via.tests
            .iter_mut()
            .find(|t| t.name == RACES_THE_CLOSE_BEFORE_IT),
    ) {
        t.outcome = outcome;
        t.detail = format!(
            "{}\n(in the suite run it FAILED; this is the outcome of its run alone)",
            alone
                .tests
                .iter()
                .find(|t| t.name == RACES_THE_CLOSE_BEFORE_IT)
                .map(|t| t.detail.as_str())
                .unwrap_or_default()
        );
    }
}

fn conformance(mode: &str, extra: &str, label: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut s = sites(mode, extra, WanProfile::lan());
    let table = show_fcip(&s);
    assert!(table.contains("up (domain 2"), "{table}");
    let circuits_up: Vec<&str> = table
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.first() == Some(&"fcip0") && cols.get(2) == Some(&"up")).then(|| cols[1])
        })
        .collect();
    assert!(
        circuits_up.contains(&"1") && circuits_up.contains(&"2"),
        "show fcip lists both circuits up:\n{table}"
    );
    let mut via = IscsiTestCu::new(url(s.iscsi))
        .timeout(Duration::from_secs(900))
        .run()
        .expect("suite runs through FCIP");
    s.a.check_alive();
    s.b.check_alive();
    via.record(label).expect("record the run");
    println!("{}", show_fcip(&s));
    rerun_the_racing_test(label, &mut via, &s);
    s.a.check_alive();
    s.b.check_alive();
    check(label, &via, &s);
}

#[test]
fn conformance_through_fcip_rfc_mode_equals_the_direct_export() {
    conformance("rfc", "", "unifab-fcip-rfc");
}

#[test]
fn conformance_through_fcip_enhanced_mode_equals_the_direct_export() {
    conformance(
        "enhanced",
        "compression = \"lz4\"\nfastwrite = true",
        "unifab-fcip-enhanced",
    );
}

/// `unifab reload` of site `name`'s file, rewritten by `edit`: the plan.
fn reload_site(s: &Sites, name: &str, edit: impl Fn(&str) -> String) -> String {
    let path = s.dir.path().join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(&text)).unwrap();
    let out = Command::new(unifab_bin().unwrap())
        .arg("reload")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "reload {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Site A's circuits of tunnel fcip0 that are up, by number.
fn circuits_up(s: &Sites) -> Vec<String> {
    let out = s
        .ns_a
        .command(unifab_bin().unwrap().to_str().unwrap())
        .args(["show", "fcip", "--json", "--admin", "127.0.0.1:9260"])
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    rows.iter()
        .filter(|r| r["tunnel"] == "fcip0" && r["state"] == "up")
        .filter_map(|r| r["circuit"].as_str().map(str::to_string))
        .collect()
}

fn wait_circuits(s: &Sites, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while circuits_up(s) != want {
        assert!(
            Instant::now() < deadline,
            "circuits up {:?}, not {want:?}\n{}",
            circuits_up(s),
            show_fcip(s)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A third circuit added to the running enhanced-mode tunnel at both
/// sites by `unifab reload`, then removed again, while a host does
/// verified writes and reads through it: no command fails or reads back
/// wrong, the added circuit comes up, and the removed one is gone.
#[test]
fn circuits_added_and_removed_by_reload_lose_no_command() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s = sites("enhanced", "", WanProfile::lan());
    wait_circuits(&s, &["1", "2"]);
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut host = RawSession::login(s.iscsi, IQN, &RawOptions::default()).unwrap();
    // The power-on attention.
    let _ = host.command(&[0; 6], &[], 0);
    let io = {
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lba = round % 512 * 64;
                let data: Vec<u8> = (0..32768).map(|i| ((i as u64 * 7) ^ round) as u8).collect();
                let w = host.write16(lba, &data, 512, false);
                let r = host.read16(lba, 64, 512);
                match (w, r) {
                    (Ok(w), Ok(r)) if w.status == 0 && r.status == 0 && r.data == data => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        eprintln!("round {round}: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                round += 1;
            }
        })
    };
    let progress = |n: u64| {
        let start = done.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.load(Ordering::Relaxed) < start + n {
            assert!(Instant::now() < deadline, "I/O stalled:\n{}", show_fcip(&s));
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    progress(20);

    let third = WanLink::start(
        SocketAddr::from((s.ns_a.outside, 0)),
        SocketAddr::from((s.ns_b.inside, 3225)),
        WanProfile::lan(),
    )
    .expect("WAN relay");
    let two = "[[fcip.tunnel.circuit]]\n[[fcip.tunnel.circuit]]\n";
    let three = "[[fcip.tunnel.circuit]]\n[[fcip.tunnel.circuit]]\n[[fcip.tunnel.circuit]]\n";
    let plan = reload_site(&s, "site-b", |t| t.replace(two, three));
    assert!(
        plan.contains("~ [fcip] tunnel \"fcip0\" circuits [live]: 2 -> 3 circuits"),
        "{plan}"
    );
    let added = format!(
        "[[fcip.tunnel.circuit]]\npeer = \"{}\"\n\n[iscsi]",
        third.addr()
    );
    let plan = reload_site(&s, "site-a", |t| t.replacen("[iscsi]", &added, 1));
    assert!(plan.contains("2 -> 3 circuits"), "{plan}");
    wait_circuits(&s, &["1", "2", "3"]);
    let before = third.forwarded();
    progress(40);
    assert!(third.forwarded() > before, "the added circuit carries data");

    let plan = reload_site(&s, "site-a", |t| t.replacen(&added, "[iscsi]", 1));
    assert!(plan.contains("3 -> 2 circuits"), "{plan}");
    reload_site(&s, "site-b", |t| t.replace(three, two));
    wait_circuits(&s, &["1", "2"]);
    progress(40);
    stop.store(true, Ordering::Relaxed);
    io.join().unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "the host saw failed or wrong I/O"
    );
}

/// The far site's tape: unifab's own drive over a 512 MiB image.
const TAPE_LU: &str =
    "name = \"disk\"\ntype = \"tape\"\nbackend = \"file:@DIR@/tape.img\"\nsize = \"512MiB\"";

/// Tape across the WAN (issue 35's two sites): at 1 ms RTT, in enhanced
/// mode with FastWrite and tape pipelining on or off, a host streams
/// 256 MiB to the far site's tape and reads it back
/// ([`stream_and_verify`]).
fn backup_stream(pipelining: bool) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let extra = if pipelining {
        "fastwrite = true\ntape_pipelining = true"
    } else {
        "fastwrite = true"
    };
    let s = sites_with(
        "enhanced",
        extra,
        WanProfile::rtt(Duration::from_millis(1), 0),
        lu(TAPE_LU),
        "iscsi-inq",
    );
    let (wrote, read) = stream_and_verify(&s, BLOCKS, PER_FILE);
    let mb = f64::from(BLOCKS) * TAPE_BLK as f64 / 1e6;
    let table = show_fcip(&s);
    println!(
        "tape across FCIP at 1 ms RTT, tape pipelining {}: writes {:.1} MB/s, reads {:.1} MB/s\n{table}",
        if pipelining { "on" } else { "off" },
        mb / wrote.as_secs_f64(),
        mb / read.as_secs_f64()
    );
    if pipelining {
        assert!(
            table.contains("on ("),
            "show fcip names tape pipelining on:\n{table}"
        );
        // The tunnels' statistics are refreshed every second or so.
        let acc = tape_counter_reaching(&s, "tape_accelerated", u64::from(BLOCKS));
        assert!(
            acc >= u64::from(BLOCKS),
            "{acc} commands accelerated:\n{table}"
        );
        // Each file's first READ(6) crosses; the rest are read ahead. The
        // tunnels' statistics are refreshed every second or so.
        let want = u64::from(BLOCKS) * 9 / 10;
        let hits = tape_counter_reaching(&s, "tape_read_ahead_hits", want);
        assert!(
            hits >= want,
            "{hits} reads answered from what was read ahead:\n{table}"
        );
    } else {
        assert_eq!(tape_counter(&s, "tape_accelerated"), 0);
        assert_eq!(tape_counter(&s, "tape_read_ahead_hits"), 0);
    }
    let mut s = s;
    s.a.check_alive();
    s.b.check_alive();
}

/// Through site A: the drive's INQUIRY, `blocks` 64 KiB blocks with a
/// filemark after every `per_file`, REWIND, SPACE over three files and a
/// read of the fourth's first block, then REWIND and every block and
/// filemark read back and checked, and end-of-data. Returns the write and
/// read times.
fn stream_and_verify(s: &Sites, blocks: u32, per_file: u32) -> (Duration, Duration) {
    use unifab_testkit::raw_iscsi::{RawOptions, RawSession};
    let opts = RawOptions {
        initiator: "iqn.2026-11.io.unifab:backup-host".into(),
        timeout: Duration::from_secs(60),
        ..RawOptions::default()
    };
    let mut h = RawSession::login(s.iscsi, IQN, &opts).expect("login through site A");
    let inq = h.command(&[0x12, 0, 0, 0, 36, 0], &[], 36).unwrap();
    assert_eq!(
        (inq.status, inq.data[0]),
        (0, 0x01),
        "a tape behind the tunnel"
    );
    let good = |r: &unifab_testkit::raw_iscsi::CommandResult, what: &str| {
        assert_eq!(r.status, 0, "{what}: sense {:02x?}", r.sense);
    };
    let t0 = Instant::now();
    for i in 0..blocks {
        good(
            &h.command(&WRITE6, &tape_block(i), 0).unwrap(),
            &format!("write {i}"),
        );
        if i % per_file == per_file - 1 {
            good(
                &h.command(&[0x10, 0, 0, 0, 1, 0], &[], 0).unwrap(),
                "filemark",
            );
        }
    }
    let wrote = t0.elapsed();
    good(
        &h.command(&[0x01, 0, 0, 0, 0, 0], &[], 0).unwrap(),
        "rewind",
    );
    good(
        &h.command(&[0x11, 1, 0, 0, 3, 0], &[], 0).unwrap(),
        "space 3 filemarks",
    );
    let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
    good(&r, "read after space");
    assert_eq!(
        r.data,
        tape_block(3 * per_file),
        "the fourth file's first block"
    );
    // Whatever was read ahead, the drive is where the host's commands
    // left it: a TEST UNIT READY discards the stream, and the next READ(6)
    // gets the block after the last one the host read, or the filemark
    // once a whole file was read (read-ahead may have crossed it). tgtd's
    // READ POSITION answers zeros, so the blocks themselves tell.
    let tur = |h: &mut RawSession| {
        let r = h.command(&[0, 0, 0, 0, 0, 0], &[], 0).unwrap();
        assert_eq!(r.status, 0, "TEST UNIT READY: {:02x?}", r.sense);
    };
    tur(&mut h);
    let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
    good(&r, "read after a discarded stream");
    assert!(
        r.data == tape_block(3 * per_file + 1),
        "the fourth file's second block"
    );
    good(
        &h.command(&[0x01, 0, 0, 0, 0, 0], &[], 0).unwrap(),
        "rewind",
    );
    for b in 0..per_file {
        if b == 5 {
            tur(&mut h);
        }
        let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
        good(&r, &format!("read {b} of the first file"));
        assert!(r.data == tape_block(b), "block {b} differs");
    }
    tur(&mut h);
    let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
    assert_eq!(
        (r.status, r.sense.get(2).map(|k| k & 0x80)),
        (2, Some(0x80)),
        "the first file's filemark after a discarded stream"
    );
    good(
        &h.command(&[0x01, 0, 0, 0, 0, 0], &[], 0).unwrap(),
        "rewind",
    );
    let t1 = Instant::now();
    for i in 0..blocks {
        let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
        good(&r, &format!("read {i}"));
        assert!(r.data == tape_block(i), "block {i} differs");
        if i % per_file == per_file - 1 {
            let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
            assert_eq!(r.status, 2, "filemark after block {i}");
            assert_eq!((r.sense[2] & 0x8f, r.sense[12], r.sense[13]), (0x80, 0, 1));
        }
    }
    let read = t1.elapsed();
    // End-of-data: BLANK CHECK (unifab's drive adds END-OF-DATA DETECTED,
    // tgtd's 00h/00h: crates/gateway/tests/tape.rs).
    let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
    assert_eq!((r.status, r.sense[2] & 0x0f), (2, 8), "end-of-data");
    (wrote, read)
}

const TAPE_BLK: usize = 64 * 1024;
const BLOCKS: u32 = 4096; // 256 MiB
const PER_FILE: u32 = 512; // 32 MiB
const WRITE6: [u8; 6] = [0x0a, 0, 0x01, 0x00, 0x00, 0];
const READ6: [u8; 6] = [0x08, 0, 0x01, 0x00, 0x00, 0];

fn tape_block(i: u32) -> Vec<u8> {
    let mut b = vec![(i % 251) as u8; TAPE_BLK];
    b[..4].copy_from_slice(&i.to_be_bytes());
    b[TAPE_BLK - 4..].copy_from_slice(&i.to_le_bytes());
    b
}

/// A tape pipelining counter of site A's tunnel, from `show fcip --json`.
fn tape_counter(s: &Sites, key: &str) -> u64 {
    let out = s
        .ns_a
        .command(unifab_bin().unwrap().to_str().unwrap())
        .args(["show", "fcip", "--json", "--admin", "127.0.0.1:9260"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "show fcip --json: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    v.as_array()
        .and_then(|rows| rows.first())
        .and_then(|r| r.get(key))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// [`tape_counter`] once it reaches `want`, or after 10 s (the tunnels'
/// statistics are refreshed every second or so).
fn tape_counter_reaching(s: &Sites, key: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = tape_counter(s, key);
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_backup_stream_crosses_fcip_to_a_far_tape_without_pipelining() {
    backup_stream(false);
}

#[test]
fn a_backup_stream_crosses_fcip_to_a_far_tape_with_pipelining() {
    backup_stream(true);
}

/// With tape pipelining, a far drive that reports an error for a write
/// the host was already told succeeded (here its medium fills: early
/// warning, at 1 ms RTT) gives the host one deferred error (response code
/// 71h, EOM) on a later command, and no block after the failing one
/// reaches the medium: the tape holds exactly a prefix of the stream,
/// shorter than what was answered GOOD, and end-of-data after it.
#[test]
fn a_far_drive_error_is_one_deferred_error_and_nothing_after_it_is_written() {
    use unifab_testkit::raw_iscsi::{RawOptions, RawSession};
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let small = "name = \"disk\"\ntype = \"tape\"\nbackend = \"file:@DIR@/tape.img\"\nsize = \"16MiB\"\nearly_warning = \"1MiB\"";
    // The tunnel's traffic, captured on site B's veth from before the
    // tunnel comes up: `unifab pcap-check` must round-trip every frame.
    let pcap = tempfile::NamedTempFile::new().unwrap();
    let mut dumpcap = None;
    let s = sites_with(
        "enhanced",
        "fastwrite = true\ntape_pipelining = true",
        WanProfile::rtt(Duration::from_millis(1), 0),
        |ns_b: &Netns| {
            dumpcap = Some(capture(&format!("{}-h", ns_b.name), pcap.path()));
            small.to_string()
        },
        "iscsi-inq",
    );
    let opts = RawOptions {
        initiator: "iqn.2026-11.io.unifab:backup-host".into(),
        timeout: Duration::from_secs(60),
        ..RawOptions::default()
    };
    let mut h = RawSession::login(s.iscsi, IQN, &opts).expect("login through site A");
    let inq = h.command(&[0x12, 0, 0, 0, 36, 0], &[], 36).unwrap();
    assert_eq!((inq.status, inq.data[0]), (0, 0x01));
    let mut acknowledged = 0u32;
    let mut deferred = None;
    for i in 0..400u32 {
        let r = h.command(&WRITE6, &tape_block(i), 0).unwrap();
        if r.status == 0 {
            acknowledged += 1;
            continue;
        }
        assert_eq!(r.status, 2, "write {i}");
        deferred = Some((i, r.sense.clone()));
        break;
    }
    let (at, sense) = deferred.expect("the drive's early warning never reached the host");
    assert_eq!(sense[0] & 0x7f, 0x71, "a deferred error: {sense:02x?}");
    assert_eq!(
        (sense[2] & 0x4f, sense[12], sense[13]),
        (0x40, 0, 2),
        "EOM, END-OF-PARTITION/MEDIUM DETECTED: {sense:02x?}"
    );
    // Once: what follows is answered by the drive itself.
    let pos = h
        .command(&[0x34, 6, 0, 0, 0, 0, 0, 0, 0, 0], &[], 32)
        .unwrap();
    assert_eq!(pos.status, 0, "READ POSITION: {:02x?}", pos.sense);
    let on_tape = u64::from_be_bytes(pos.data[8..16].try_into().unwrap()) as u32;
    assert!(
        on_tape < acknowledged,
        "{on_tape} blocks on the medium, {acknowledged} answered GOOD before the deferred error at command {at}"
    );
    assert_eq!(h.command(&[0x01, 0, 0, 0, 0, 0], &[], 0).unwrap().status, 0);
    for i in 0..on_tape {
        let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
        assert_eq!(r.status, 0, "read {i}: {:02x?}", r.sense);
        assert!(
            r.data == tape_block(i),
            "block {i} on the medium is not the stream's: {} bytes, {:02x?}…",
            r.data.len(),
            &r.data[..r.data.len().min(8)]
        );
    }
    let r = h.command(&READ6, &[], TAPE_BLK as u32).unwrap();
    assert_eq!(
        (r.status, r.sense[2] & 0x0f, r.sense[13]),
        (2, 8, 5),
        "end-of-data right after"
    );
    // The tunnels' statistics are refreshed every second or so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tape_counter(&s, "tape_deferred_errors") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(tape_counter(&s, "tape_deferred_errors"), 1);
    println!(
        "deferred error at command {at}; {acknowledged} writes answered GOOD, {on_tape} on the medium\n{}",
        show_fcip(&s)
    );
    stop_capture(dumpcap.take().expect("dumpcap ran"));
    let report = unifab_capture::check::pcap_check(pcap.path()).expect("the capture reads");
    let fcip: Vec<_> = report.of(unifab_capture::check::Protocol::Fcip).collect();
    let not_ok: Vec<String> = fcip
        .iter()
        .filter(|e| e.verdict != unifab_capture::check::Verdict::Ok)
        .map(|e| format!("frame {}: {} {:?}", e.frame, e.what, e.verdict))
        .collect();
    assert!(
        fcip.len() > 100,
        "{} FCIP frames checked:\n{report}",
        fcip.len()
    );
    assert!(
        not_ok.is_empty(),
        "not round-tripped:\n{}",
        not_ok.join("\n")
    );
    println!(
        "pcap-check: {} FCIP frames of the run round-trip",
        fcip.len()
    );
    drop(h);
    let mut s = s;
    s.a.check_alive();
    s.b.check_alive();
}

/// Tape pipelining against a tape drive nobody here wrote: site B's LU is
/// tgtd's tape (`iscsi://` to tgtd on the root side of site B's veth, no
/// `type`: its commands pass through), exported over FC and reached from
/// site A across the tunnel at 1 ms RTT. A 64 MiB stream with a filemark
/// every 16 MiB is written, spaced over and read back byte for byte, the
/// writes were accelerated and the reads read ahead.
#[test]
fn tape_pipelining_streams_to_tgtds_tape_behind_the_far_site() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let scratch = tempfile::tempdir().unwrap();
    let img = scratch.path().join("tgt-tape.img");
    unifab_testkit::peers::Tgtd::make_tape(&img, 256).unwrap_or_else(|e| panic!("{e}"));
    let mut tgtd = None;
    let s = sites_with(
        "enhanced",
        "fastwrite = true\ntape_pipelining = true",
        WanProfile::rtt(Duration::from_millis(1), 0),
        |ns_b: &Netns| {
            let t = unifab_testkit::peers::Tgtd::builder(&img)
                .tape()
                .portal_ip(ns_b.outside)
                .start()
                .unwrap_or_else(|e| panic!("{e}"));
            let lu = format!(
                "name = \"disk\"\nbackend = \"iscsi://{}/{}/{}\"",
                t.addr(),
                t.iqn(),
                unifab_testkit::peers::Tgtd::LUN
            );
            tgtd = Some(t);
            lu
        },
        "iscsi-inq",
    );
    let (wrote, read) = stream_and_verify(&s, 1024, 256);
    // The tunnels' statistics are refreshed every second or so (a loaded
    // CI machine once read 834 here right after the stream).
    let acc = tape_counter_reaching(&s, "tape_accelerated", 1024);
    assert!(acc >= 1024, "{acc} commands accelerated\n{}", show_fcip(&s));
    // Each file's first READ(6) crosses; the rest are read ahead, and the
    // discarded streams were spaced back on tgtd's drive.
    let hits = tape_counter_reaching(&s, "tape_read_ahead_hits", 900);
    assert!(hits >= 900, "{hits} reads read ahead\n{}", show_fcip(&s));
    println!(
        "tgtd's tape across FCIP at 1 ms RTT, tape pipelining on: writes {:.1} MB/s, reads {:.1} MB/s",
        64.0 * 1.048_576 / wrote.as_secs_f64(),
        64.0 * 1.048_576 / read.as_secs_f64()
    );
    let mut s = s;
    s.a.check_alive();
    s.b.check_alive();
    drop(s);
    drop(tgtd);
}

/// `dumpcap` writing what crosses `iface` on the FCIP port to `path`
/// (pcap), started and ready (its capture file begun) within 10 s.
fn capture(iface: &str, path: &Path) -> Child {
    let mut c = Command::new("dumpcap")
        .args(["-q", "-P", "-i", iface, "-f", "tcp port 3225", "-w"])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dumpcap (Debian wireshark-common, installed with tshark)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(path).map_or(0, |m| m.len()) == 0 {
        if let Ok(Some(st)) = c.try_wait() {
            panic!("dumpcap exited at once ({st})");
        }
        assert!(Instant::now() < deadline, "dumpcap did not start writing");
        std::thread::sleep(Duration::from_millis(50));
    }
    c
}

/// Ends a capture: SIGTERM (dumpcap flushes and closes the file), then
/// waits for it, at most 10 s.
fn stop_capture(mut c: Child) {
    // SAFETY: kill(2) on a child we own and have not yet reaped.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            panic!("dumpcap did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
