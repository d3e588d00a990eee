//! A crowd of iSCSI sessions on one target, each doing verified I/O, for a
//! stated time: the soak `benches/peers/soak.sh` runs (and
//! `crates/gateway/tests/thousand_sessions.rs` in short).
//!
//!     soak ADDR TARGET_IQN SESSIONS SECONDS [TARGET_PID]
//!
//! Logs in SESSIONS sessions (each its own initiator name and ISID), then
//! drives them from 8 threads: each session in turn writes its own 4 KiB
//! block with a pattern of its number and the round, and reads it back.
//! Every 10 s, and at the end, a line: I/Os, errors, and with TARGET_PID
//! the target's resident set and descriptors. Exits 1 if a login, a command
//! or a comparison failed.
//!
//! Not a product: a measuring tool.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const BLOCK: u32 = 512;
const BLOCKS: u32 = 8;
const DRIVERS: usize = 8;

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

fn pattern(i: usize, round: u32) -> Vec<u8> {
    (0..(BLOCK * BLOCKS) as usize)
        .map(|k| (i as u32 ^ round.wrapping_mul(0x9e37) ^ (k as u32).wrapping_mul(31)) as u8)
        .collect()
}

fn target_line(pid: Option<u32>) -> String {
    match pid {
        Some(p) => format!(
            "target RSS {} KiB, {} descriptors",
            rss_kib(p).map_or("?".into(), |v| v.to_string()),
            fds(p).map_or("?".into(), |v| v.to_string())
        ),
        None => String::new(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: soak ADDR TARGET_IQN SESSIONS SECONDS [TARGET_PID]");
        return ExitCode::from(2);
    }
    let (Ok(addr), Ok(n), Ok(secs)) = (
        args[1].parse::<SocketAddr>(),
        args[3].parse::<usize>(),
        args[4].parse::<u64>(),
    ) else {
        eprintln!("soak: bad ADDR, SESSIONS or SECONDS");
        return ExitCode::from(2);
    };
    let iqn = args[2].clone();
    let pid: Option<u32> = args.get(5).and_then(|p| p.parse().ok());
    let before = pid.and_then(rss_kib);

    let t0 = Instant::now();
    let mut sessions = Vec::with_capacity(n);
    let mut login_failures = 0u64;
    for i in 0..n {
        let opts = RawOptions {
            isid: [0x80, 0, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8],
            initiator: format!("iqn.2026-11.io.unifab:soak{i}"),
            ..RawOptions::default()
        };
        match RawSession::login(addr, &iqn, &opts) {
            Ok(s) => sessions.push((i, s)),
            Err(e) => {
                login_failures += 1;
                eprintln!("login {i}: {e}");
            }
        }
    }
    println!(
        "logins: {} of {n} in {:.1} s, {login_failures} failed; {}",
        sessions.len(),
        t0.elapsed().as_secs_f64(),
        target_line(pid)
    );

    let ios = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let per = sessions.len().div_ceil(DRIVERS).max(1);
    let mut handles = Vec::new();
    let mut it = sessions.into_iter();
    for _ in 0..DRIVERS {
        let mut group: Vec<(usize, RawSession)> = it.by_ref().take(per).collect();
        let (ios, errors, stop) = (ios.clone(), errors.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) && !group.is_empty() {
                for (i, s) in &mut group {
                    let lba = *i as u64 * u64::from(BLOCKS);
                    let data = pattern(*i, round);
                    let ok = match s.write16(lba, &data, BLOCK, false) {
                        Ok(w) if w.status == 0 => match s.read16(lba, BLOCKS, BLOCK) {
                            Ok(r) => r.status == 0 && r.data == data,
                            Err(_) => false,
                        },
                        _ => false,
                    };
                    if ok {
                        ios.fetch_add(2, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("session {i} round {round}: I/O failed or read back differs");
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                round = round.wrapping_add(1);
            }
            // Given back, so the sessions are still logged in when the
            // last figures are taken.
            group
        }));
    }
    let t1 = Instant::now();
    let end = t1 + Duration::from_secs(secs);
    let mut last = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200).min(end - Instant::now()));
        let s = t1.elapsed().as_secs();
        if s / 10 > last / 10 {
            last = s;
            println!(
                "{s:>5} s: {} I/Os, {} errors; {}",
                ios.load(Ordering::Relaxed),
                errors.load(Ordering::Relaxed),
                target_line(pid)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut held = Vec::new();
    for h in handles {
        held.extend(h.join().unwrap_or_default());
    }
    let alive = held.len();
    let dt = t1.elapsed().as_secs_f64();
    let total = ios.load(Ordering::Relaxed);
    let errs = errors.load(Ordering::Relaxed);
    let per_session = match (before, pid.and_then(rss_kib)) {
        (Some(b), Some(a)) if alive > 0 => {
            format!("{:.1} KiB", a.saturating_sub(b) as f64 / alive as f64)
        }
        _ => "?".into(),
    };
    println!(
        "end: {alive} sessions, {total} verified I/Os in {dt:.1} s ({:.0}/s), {errs} errors, {login_failures} failed logins; RSS per session {per_session}; {}",
        total as f64 / dt,
        target_line(pid)
    );
    drop(held);
    if errs > 0 || login_failures > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
