//! Faults under load on the bridge: a host (`unifab bench`, verifying every
//! read) drives a unifab gateway that re-exports a tgtd LU through a TCP
//! relay, while the test
//!
//! - kills tgtd and starts it again,
//! - stops tgtd (SIGSTOP) for longer than the gateway's NOP timeout and
//!   command timeout, then continues it,
//! - drops the TCP connection between gateway and tgtd.
//!
//! Then, for each:
//! - no acknowledged write is lost: after recovery the host reads back
//!   every chunk it wrote and each holds the data of the last write it was
//!   told succeeded (`--final-verify`);
//! - every command the gateway could not complete ended with sense the host
//!   can retry (ABORTED COMMAND), before the host's own timeout: the host
//!   never had to time a command out itself (no "transport" retry), and no
//!   error was of a kind a host does not retry;
//! - the host never saw wrong data (no miscompare).
//!
//! The gateway runs with a 5 s command timeout, a 1 s NOP interval and a
//! 2 s NOP timeout; the host's own command timeout is 60 s.
//!
//! A fourth scenario kills tgtd for good, with the gateway's
//! `replacement_timeout` at 1 s and its command timeout at 30 s: the host
//! (command timeout 20 s) must hear LOGICAL UNIT COMMUNICATION FAILURE from
//! the gateway, not time its commands out itself, and I/O must work again
//! once tgtd is back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bridge_support;

use std::sync::Mutex;
use std::thread::sleep;
use std::time::Duration;

use bridge_support::*;
use unifab_testkit::peers::Tgtd;
use unifab_testkit::relay::TcpRelay;

/// The scenarios share the machine's two cores: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const REMOTE: &str = "command_timeout = 5\nnop_interval = 1\nnop_timeout = 2\nlogin_timeout = 2\n";

struct Rig {
    dir: tempfile::TempDir,
    file: std::path::PathBuf,
    tgtd: Option<Tgtd>,
    relay: TcpRelay,
    gw: Gateway,
}

fn rig() -> Rig {
    rig_with(REMOTE)
}

fn rig_with(remote: &str) -> Rig {
    let dir = scratch();
    let file = lu_file(dir.path(), "lu.img", 128 << 20);
    let tgtd = Tgtd::start(&file).unwrap_or_else(|e| panic!("{e}"));
    let relay = TcpRelay::start(tgtd.addr()).unwrap();
    let backend = format!("iscsi://{}/{}/1", relay.addr(), tgtd.iqn());
    let gw = Gateway::start(dir.path(), &bridge_config(dir.path(), &backend, remote));
    Rig {
        dir,
        file,
        tgtd: Some(tgtd),
        relay,
        gw,
    }
}

fn load(gw: &Gateway) -> std::process::Child {
    bench_spawn(
        &gw.url(0),
        &[
            "--rw",
            "rw",
            "--time",
            "25",
            "--final-verify",
            "--size",
            "64MiB",
            "--bs",
            "16KiB",
            "--qd",
            "16",
            "--command-timeout",
            "60",
            "--retry-time",
            "300",
        ],
    )
}

/// What must hold after every fault.
fn check(r: &BenchRun, rig: &Rig) {
    println!("host's view: {}", r.json);
    let log = || tail(&rig.gw.log(), 40);
    assert!(r.ok, "{}\ngateway log:\n{}", r.report(), log());
    assert_eq!(r.u64("miscompares"), 0, "wrong data reached the host");
    assert_eq!(r.u64("errors"), 0, "an error the host cannot retry");
    assert!(r.u64("verified_bytes") > 0);
    for (reason, n) in r.retry_reasons() {
        assert!(
            !reason.starts_with("transport"),
            "the host had to give up on the gateway itself ({n}x {reason}): a command did not end in time\n{}",
            r.report()
        );
    }
    // The data is on tgtd's LU: every sector there is whole and in place.
    let t = rig.tgtd.as_ref().unwrap();
    let direct = bench(
        &t.url(),
        &[
            "--rw",
            "read",
            "--size",
            "64MiB",
            "--bs",
            "1MiB",
            "--pattern",
            "sequential",
            "--ops",
            "64",
        ],
    );
    assert!(direct.ok, "{}", direct.report());
    assert_eq!(direct.u64("miscompares"), 0);
}

fn upstream_reconnected(rig: &Rig) -> bool {
    rig.gw.log().contains("logging in again")
}

#[test]
fn tcp_connection_drop_under_load() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = rig();
    let host = load(&rig.gw);
    sleep(Duration::from_secs(5));
    rig.relay.cut();
    sleep(Duration::from_secs(4));
    rig.relay.cut();
    let r = bench_wait(host);
    check(&r, &rig);
    assert!(
        upstream_reconnected(&rig),
        "the drop was felt:\n{}",
        rig.gw.log()
    );
    let _ = &rig.dir;
}

#[test]
fn tgtd_stopped_longer_than_the_nop_timeout_under_load() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = rig();
    let pid = rig.tgtd.as_ref().unwrap().pid() as libc::pid_t;
    let host = load(&rig.gw);
    sleep(Duration::from_secs(5));
    // SAFETY: signalling a child process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    struct Cont(libc::pid_t);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: as above; resumes tgtd even if the test fails.
            unsafe {
                libc::kill(self.0, libc::SIGCONT);
            }
        }
    }
    let cont = Cont(pid);
    // Longer than NOP interval + timeout (3 s) and the command timeout (5 s).
    sleep(Duration::from_secs(9));
    drop(cont);
    let r = bench_wait(host);
    check(&r, &rig);
    assert!(
        upstream_reconnected(&rig),
        "the stop was detected:\n{}",
        rig.gw.log()
    );
    // Commands in flight during the stop ended with retryable sense.
    let sensed: u64 = r
        .retry_reasons()
        .iter()
        .filter(|(reason, _)| reason.starts_with("aborted command 08/0"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        sensed > 0,
        "in-flight commands end with ABORTED COMMAND / LU communication failure or time-out: {:?}",
        r.retry_reasons()
    );
}

#[test]
fn tgtd_killed_and_started_again_under_load() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut rig = rig();
    let host = load(&rig.gw);
    sleep(Duration::from_secs(5));
    // SIGKILL (tgtd ignores SIGTERM); its connections reset.
    drop(rig.tgtd.take());
    sleep(Duration::from_secs(3));
    let t = Tgtd::start(&rig.file).unwrap_or_else(|e| panic!("{e}"));
    rig.relay.set_upstream(t.addr());
    rig.tgtd = Some(t);
    let r = bench_wait(host);
    check(&r, &rig);
    assert!(
        upstream_reconnected(&rig),
        "the kill was felt:\n{}",
        rig.gw.log()
    );
}

#[test]
fn tgtd_gone_for_good_fails_fast_with_replacement_timeout() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut rig = rig_with(
        "command_timeout = 30\nreplacement_timeout = 1\nnop_interval = 1\nnop_timeout = 2\nlogin_timeout = 2\n",
    );
    let host = bench_spawn(
        &rig.gw.url(0),
        &[
            "--rw",
            "rw",
            "--time",
            "12",
            "--size",
            "64MiB",
            "--bs",
            "16KiB",
            "--qd",
            "8",
            // Shorter than the gateway's command timeout: without
            // replacement_timeout the host would give up on the gateway.
            "--command-timeout",
            "20",
            "--retry-time",
            "3",
        ],
    );
    sleep(Duration::from_secs(4));
    drop(rig.tgtd.take());
    let r = bench_wait(host);
    println!("host's view: {}", r.json);
    let reasons = r.retry_reasons();
    assert_eq!(r.u64("miscompares"), 0, "wrong data reached the host");
    assert!(
        r.u64("errors") > 0,
        "with tgtd gone, commands must fail once their retries run out: {}",
        r.report()
    );
    for (reason, n) in &reasons {
        assert!(
            !reason.starts_with("transport"),
            "the host had to give up on the gateway itself ({n}x {reason}): replacement_timeout did not end the wait\n{}",
            r.report()
        );
    }
    // Each command that finally failed did so with the gateway's sense.
    let problems = r.json["problems"].as_array().cloned().unwrap_or_default();
    assert!(!problems.is_empty(), "{}", r.report());
    for p in &problems {
        let p = p.as_str().unwrap_or_default();
        assert!(
            p.contains("CHECK CONDITION sense Some((SenseKey(11), Asc(8, 0)))"),
            "a command failed otherwise than with ABORTED COMMAND 08/00: {p}\n{}",
            r.report()
        );
    }
    assert!(
        reasons
            .iter()
            .any(|(reason, _)| reason == "aborted command 08/00"),
        "commands for the lost remote end with ABORTED COMMAND, LOGICAL UNIT COMMUNICATION FAILURE: {reasons:?}\ngateway log:\n{}",
        tail(&rig.gw.log(), 40)
    );
    // The operator sees the sessions to the remote down, and why.
    let remotes = rig.gw.show("remotes");
    let rows = remotes.as_array().unwrap();
    assert!(!rows.is_empty(), "{remotes}");
    for row in rows {
        assert_eq!(row["lu"], "bridged", "{row}");
        assert_eq!(row["state"], "down", "{row}");
        assert!(
            row["last_error"]
                .as_str()
                .is_some_and(|e| !e.is_empty() && !e.ends_with("ago)")),
            "the reason alone, typed: {row}"
        );
        assert!(row["last_error_seconds"].as_f64().unwrap() >= 0.0, "{row}");
        assert!(row["seconds"].as_f64().unwrap() > 0.0, "{row}");
    }
    // tgtd back: the session reconnects and I/O works again.
    let t = Tgtd::start(&rig.file).unwrap_or_else(|e| panic!("{e}"));
    rig.relay.set_upstream(t.addr());
    rig.tgtd = Some(t);
    let again = bench(
        &rig.gw.url(0),
        &[
            "--rw",
            "rw",
            "--ops",
            "200",
            "--size",
            "8MiB",
            "--bs",
            "16KiB",
            "--qd",
            "4",
            "--retry-time",
            "30",
        ],
    );
    assert!(
        again.ok,
        "{}\ngateway log:\n{}",
        again.report(),
        tail(&rig.gw.log(), 40)
    );
    assert_eq!(again.u64("miscompares"), 0);
    // Back up: the control session logs in again (its backoff is at most
    // 2 s; the 30 s bound only keeps a broken build from hanging).
    let mut remotes = rig.gw.show("remotes");
    for _ in 0..300 {
        let relogged = remotes.as_array().unwrap().iter().any(|r| {
            r["state"] == "up" && r["logins"].as_u64().unwrap() >= 2 && r["last_error"].is_string()
        });
        if relogged {
            return;
        }
        sleep(Duration::from_millis(100));
        remotes = rig.gw.show("remotes");
    }
    panic!("no session to the remote logged in again: {remotes}");
}
