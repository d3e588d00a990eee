//! Memory per idle session: open many sessions that then sit idle, and
//! compare the gateway's resident set before and after. The target is at
//! most 64 KiB per idle session (issue: foundation, Performance).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Gateway, file_lu_config};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

#[test]
fn idle_sessions_cost_at_most_64_kib_each() {
    const N: usize = 400;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), &file_lu_config(dir.path(), "16MiB"));
    let pid = gw.child.id();
    // Warm up: one session does I/O so the one-time allocations are made.
    let mut warm = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
    warm.read16(0, 8, 512).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = rss_kib(pid);
    let mut sessions = Vec::new();
    for i in 0..N {
        let opts = RawOptions {
            isid: [0x80, 0, 0, 0, (i >> 8) as u8, i as u8],
            ..RawOptions::default()
        };
        let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
        // Each does one read, then goes idle.
        assert_eq!(s.read16(i as u64, 1, 512).unwrap().status, 0);
        sessions.push(s);
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = rss_kib(pid);
    let per_session = (after.saturating_sub(before)) as f64 / N as f64;
    eprintln!("RSS {before} KiB -> {after} KiB with {N} idle sessions: {per_session:.1} KiB each");
    assert!(
        per_session <= 64.0,
        "{per_session:.1} KiB per idle session (limit 64 KiB)"
    );
    drop(sessions);
}
