//! A crowd: a thousand iSCSI sessions on one gateway, each doing verified
//! I/O at once; and a gateway that runs out of file descriptors refuses
//! logins with a clear status and a log line, and recovers.
//!
//! `benches/peers/soak.sh` runs the first for as long as asked and prints
//! its figures; this test is its short, bounded form.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Gateway, file_lu_config};
use unifab_testkit::lines::child_portal;
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const SESSIONS: usize = 1000;
/// Threads that drive the sessions' I/O at once.
const DRIVERS: usize = 8;
const BLOCK: u32 = 512;
/// Blocks per I/O (4 KiB).
const BLOCKS: u32 = 8;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// This process opens a socket per session: its soft limit goes to the
/// hard one, which must allow the crowd.
fn raise_own_fd_limit(needed: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    assert!(
        hard >= needed,
        "the hard file descriptor limit ({hard}) is below the {needed} this test needs: raise it (ulimit -Hn)"
    );
}

fn opts(i: usize) -> RawOptions {
    RawOptions {
        isid: [0x80, 0, 0, 0, (i >> 8) as u8, i as u8],
        initiator: format!("iqn.2026-11.io.unifab:host{i}"),
        ..RawOptions::default()
    }
}

/// The block session `i` writes in round `round`: its number, the round
/// and the byte's offset, so that a block read back from another session's
/// place or an earlier round differs.
fn pattern(i: usize, round: u32) -> Vec<u8> {
    (0..(BLOCK * BLOCKS) as usize)
        .map(|k| (i as u32 ^ round.wrapping_mul(0x9e37) ^ (k as u32).wrapping_mul(31)) as u8)
        .collect()
}

#[test]
fn a_thousand_sessions_each_do_verified_io_at_once() {
    raise_own_fd_limit(SESSIONS as u64 + 100);
    let dir = tempfile::tempdir().unwrap();
    // Each session owns 4 KiB of a 16 MiB LU.
    let gw = Gateway::start(dir.path(), &file_lu_config(dir.path(), "16MiB"));
    let pid = gw.child.id();
    let mut warm = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
    warm.read16(0, BLOCKS, BLOCK).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (rss_before, fds_before) = (rss_kib(pid), fds(pid));

    let t0 = Instant::now();
    let mut sessions = Vec::with_capacity(SESSIONS);
    for i in 0..SESSIONS {
        let s = RawSession::login(gw.addr, &gw.iqn, &opts(i))
            .unwrap_or_else(|e| panic!("login {i} of {SESSIONS} failed: {e}"));
        sessions.push((i, s));
    }
    let login_s = t0.elapsed().as_secs_f64();
    let fds_open = fds(pid);
    assert!(
        fds_open >= fds_before + SESSIONS,
        "the gateway holds {fds_open} descriptors with {SESSIONS} sessions (before: {fds_before})"
    );

    // Three rounds: every session writes its block and reads it back, the
    // sessions spread over DRIVERS threads so that their I/O overlaps.
    let t1 = Instant::now();
    let mut sessions = verified_io(sessions, 3);
    let io_s = t1.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = rss_kib(pid);
    let per_session = rss_after.saturating_sub(rss_before) as f64 / SESSIONS as f64;
    eprintln!(
        "{SESSIONS} sessions: logins {login_s:.1} s; {} verified I/Os in {io_s:.1} s; RSS {rss_before} -> {rss_after} KiB ({per_session:.1} KiB per session); descriptors {fds_before} -> {fds_open}",
        SESSIONS * 3 * 2
    );
    // The idle-session budget (64 KiB, tests/idle_memory.rs) plus the
    // session's last I/O: a 4 KiB write and a 4 KiB read.
    assert!(
        per_session <= 64.0 + 8.0,
        "{per_session:.1} KiB per session after I/O (budget 72 KiB)"
    );
    assert_eq!(sessions.len(), SESSIONS);
    // Every session is still logged in and answers.
    for (i, s) in sessions.iter_mut().step_by(97) {
        let r = s
            .read16(*i as u64 * u64::from(BLOCKS), BLOCKS, BLOCK)
            .unwrap();
        assert_eq!(r.data, pattern(*i, 2), "session {i} after the rounds");
    }
}

/// The gateway under a hard limit of 64 descriptors: logins past what it
/// can hold are refused with Out of resources (0302h) rather than left
/// hanging, one log line says why, and logins succeed again once sessions
/// leave.
#[test]
fn running_out_of_descriptors_refuses_logins_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unifab.toml");
    std::fs::write(&path, file_lu_config(dir.path(), "16MiB")).unwrap();
    let mut child = Command::new("prlimit")
        .arg("--nofile=64:64")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_unifab"))
        .arg("run")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) runs the gateway");
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let l2 = log.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            l2.lock().unwrap().push(line);
        }
    });
    let (iqn, addr) = child_portal(&mut child, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("unifab did not print its portal: {e}"));
    let gw = scopeguard(child);

    let t0 = Instant::now();
    let mut sessions = Vec::new();
    let refusal = loop {
        assert!(
            sessions.len() < 64,
            "64 sessions under a limit of 64 descriptors"
        );
        match RawSession::login(addr, &iqn, &opts(sessions.len())) {
            Ok(s) => sessions.push(s),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        refusal.contains("LoginStatus(770)"),
        "after {} sessions the login failed with {refusal:?}, not Out of resources (0302h)",
        sessions.len()
    );
    assert!(sessions.len() >= 20, "only {} sessions", sessions.len());
    // Refused again, not left waiting.
    for _ in 0..3 {
        match RawSession::login(addr, &iqn, &opts(900)) {
            Ok(_) => panic!("a login past the limit succeeded"),
            Err(e) => assert!(e.to_string().contains("LoginStatus(770)"), "{e}"),
        }
    }
    // Those held still work.
    for s in sessions.iter_mut().step_by(5) {
        assert_eq!(s.read16(0, BLOCKS, BLOCK).unwrap().status, 0);
    }
    let said = |log: &[String]| {
        log.iter()
            .filter(|l| l.contains("out of file descriptors"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while said(&log.lock().unwrap()) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let n = said(&log.lock().unwrap());
    let allowed = 1 + t0.elapsed().as_secs() as usize / 10;
    assert!(
        (1..=allowed).contains(&n),
        "{n} log lines about running out (expected 1 to {allowed}): {:?}",
        log.lock().unwrap()
    );
    // Half the sessions leave: logins succeed again.
    sessions.truncate(sessions.len() / 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        match RawSession::login(addr, &iqn, &opts(1000)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no login after sessions left: {e}"),
        }
    };
    drop(back);
    drop(gw);
}

/// Kills the child when dropped.
fn scopeguard(child: std::process::Child) -> impl Drop {
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    Kill(child)
}

/// A gateway whose iSCSI target exports an `fc://` LU on its own fabric,
/// with `physical_ports` initiator N_Ports; and its admin address.
fn fabric_gateway(dir: &std::path::Path, physical_ports: u32) -> (Gateway, SocketAddr) {
    let admin = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let physical = format!("physical_ports = {physical_ports}");
    let config = common::fc_lu_config(
        dir,
        "iqn.2026-11.io.unifab:via-fc",
        admin,
        &common::FcExtra {
            initiator: &physical,
            ..Default::default()
        },
    );
    (Gateway::start(dir, &config), admin)
}

/// Logs in hosts `range` from DRIVERS threads at once.
fn login_all(
    addr: SocketAddr,
    iqn: &str,
    range: std::ops::Range<usize>,
) -> Vec<(usize, RawSession)> {
    let all: Vec<usize> = range.collect();
    let per = all.len().div_ceil(DRIVERS).max(1);
    let handles: Vec<_> = all
        .chunks(per)
        .map(|c| {
            let (c, iqn) = (c.to_vec(), iqn.to_string());
            std::thread::spawn(move || {
                c.into_iter()
                    .map(|i| {
                        let s = RawSession::login(addr, &iqn, &opts(i))
                            .unwrap_or_else(|e| panic!("login of host {i} failed: {e}"));
                        (i, s)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("a login thread failed"))
        .collect()
}

/// `rounds` rounds in which each session writes its block (a pattern of
/// its number and the round) and reads it back, compared, the sessions
/// spread over DRIVERS threads so that their I/O overlaps.
fn verified_io(sessions: Vec<(usize, RawSession)>, rounds: u32) -> Vec<(usize, RawSession)> {
    let per = sessions.len().div_ceil(DRIVERS).max(1);
    let mut groups: Vec<Vec<(usize, RawSession)>> = Vec::new();
    let mut it = sessions.into_iter();
    loop {
        let g: Vec<_> = it.by_ref().take(per).collect();
        if g.is_empty() {
            break;
        }
        groups.push(g);
    }
    let handles: Vec<_> = groups
        .into_iter()
        .map(|mut g| {
            std::thread::spawn(move || {
                for round in 0..rounds {
                    for (i, s) in &mut g {
                        let lba = *i as u64 * u64::from(BLOCKS);
                        let data = pattern(*i, round);
                        let w = s.write16(lba, &data, BLOCK, false).unwrap();
                        assert_eq!(w.status, 0, "session {i} round {round}: write {w:?}");
                        let r = s.read16(lba, BLOCKS, BLOCK).unwrap();
                        assert_eq!(r.status, 0, "session {i} round {round}: read status");
                        assert!(
                            r.data == data,
                            "session {i} round {round}: read back differs"
                        );
                    }
                }
                g
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("a driver thread failed"))
        .collect()
}

/// NPIV logins `unifab show flogi` lists.
fn npiv_logins(admin: SocketAddr) -> usize {
    let out = Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "flogi", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(npiv)"))
        .count()
}

/// Hosts through the fabric: the exported LU is `fc://`, so every host's
/// session gets an NPIV initiator port of its own on the gateway's switch
/// (FDISC, name server registration, PLOGI and PRLI to the target port),
/// and its commands cross the fabric as FCP. NPIV ports share their
/// physical port's area, so one physical port holds at most 255 of them:
/// with `physical_ports = 4`, a thousand hosts spread over four. Each
/// host does a verified write and read; the switch must list an NPIV
/// login per host.
///
/// Every NPIV port registers for state change notifications, so each
/// login still costs every other port an RSCN; what keeps a thousand
/// affordable is that a host's port asks the name server about the one
/// port an RSCN names (GFF_ID) and logs into targets alone
/// (`restrict_login`), and that the fabric merges the RSCNs a port has
/// not yet answered.
#[test]
fn hosts_past_one_ports_npiv_limit_spread_over_physical_ports() {
    const FC_HOSTS: usize = 1000;
    raise_own_fd_limit(FC_HOSTS as u64 + 100);
    let dir = tempfile::tempdir().unwrap();
    let (gw, admin) = fabric_gateway(dir.path(), 4);
    let t0 = Instant::now();
    let sessions = login_all(gw.addr, &gw.iqn, 0..FC_HOSTS);
    let login_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let sessions = verified_io(sessions, 1);
    let io_s = t1.elapsed().as_secs_f64();
    let npiv = npiv_logins(admin);
    eprintln!(
        "{FC_HOSTS} hosts through the fabric on 4 physical ports: logins {login_s:.1} s, verified I/O {io_s:.1} s, {npiv} NPIV logins"
    );
    assert!(
        npiv >= FC_HOSTS,
        "{npiv} NPIV logins listed for {FC_HOSTS} hosts"
    );
    assert_eq!(sessions.len(), FC_HOSTS);
}

/// One physical initiator port (the default) holds 255 NPIV ports: the
/// fabric refuses the 256th FDISC (INSUFFICIENT RESOURCES, as real
/// switches do), and that host's commands fail at once with ABORTED
/// COMMAND, LOGICAL UNIT COMMUNICATION FAILURE (retryable), rather than
/// wait out the command timeout (30 s, past this client's 10 s) for a
/// port that is not coming.
#[test]
fn past_one_ports_255_npiv_hosts_commands_fail_at_once() {
    const FC_HOSTS: usize = 250;
    raise_own_fd_limit(FC_HOSTS as u64 + 100);
    let dir = tempfile::tempdir().unwrap();
    let (gw, admin) = fabric_gateway(dir.path(), 1);
    let mut sessions = verified_io(login_all(gw.addr, &gw.iqn, 0..FC_HOSTS), 1);
    assert!(npiv_logins(admin) >= FC_HOSTS);
    let mut refused = 0;
    for i in FC_HOSTS..FC_HOSTS + 10 {
        let o = RawOptions {
            clear_unit_attention: false,
            ..opts(i)
        };
        let mut s = RawSession::login(gw.addr, &gw.iqn, &o).unwrap();
        let mut r = s.command(&[0; 6], &[], 0).unwrap();
        if r.status == 0x02 && r.sense.get(2).is_some_and(|k| k & 0x0f == 0x06) {
            r = s.command(&[0; 6], &[], 0).unwrap();
        }
        if r.status != 0 {
            let sense = unifab_scsi_core::Sense::parse(&r.sense).expect("sense");
            assert_eq!(
                (sense.key, sense.asc),
                (
                    unifab_scsi_core::SenseKey::ABORTED_COMMAND,
                    unifab_scsi_core::sense::asc::LOGICAL_UNIT_COMMUNICATION_FAILURE
                ),
                "host {i}"
            );
            refused += 1;
        }
        sessions.push((i, s));
    }
    assert!(
        refused > 0,
        "all of {} NPIV hosts got a port",
        FC_HOSTS + 10
    );
}
