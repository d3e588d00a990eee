//! Stopping tunnels and listeners: the VE_Port goes down on both sides,
//! the port leaves the switch, no circuit reconnects, and every socket the
//! tunnels and the listener held is closed. One test in its own binary,
//! since it counts the process's sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Sites, TARGET, build, task};
use unifab_fcip::io::LinkMode;
use unifab_fcip::proto::compress;
use unifab_scsi_core::{LogicalUnit, Status};
use unifab_testkit::wan::WanProfile;

/// The number of sockets the process holds (however many descriptors
/// each has).
fn sockets() -> usize {
    socket_inodes().len()
}

/// The inodes of the sockets this process holds.
fn socket_inodes() -> HashSet<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The inodes of the IPv4 TCP sockets whose remote port is `port`.
fn connected_to(port: u16) -> HashSet<u64> {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap();
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let rem = u16::from_str_radix(f.get(2)?.rsplit(':').next()?, 16).ok()?;
            (rem == port).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// Waits up to 10 s for `f` to hold.
async fn eventually(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() > end => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn stop_and_check(s: Sites, before: usize) {
    // Up and carrying I/O first.
    let r = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    assert!(r.status == Status::GOOD || r.status == Status::CHECK_CONDITION);
    let r = s.remote.execute(task(2, &[0; 6], None, 0)).await;
    assert_eq!(r.status, Status::GOOD, "{:?}", r.sense);
    assert_eq!(s.a.with_fabric(|f| f.routes()).len(), 1);
    let accepted = s.listener.stats().accepted;
    assert!(accepted >= 2, "{:?}", s.listener.stats());
    assert!(sockets() > before);

    s.ta.stop().await;
    assert!(s.ta.is_stopped());
    assert_eq!(s.ta.stats().state, "stopped");
    assert!(
        s.ta.stats().circuits.iter().all(|c| c.state == "down"),
        "{:?}",
        s.ta.stats()
    );
    // Site A's fabric: no route to B, no remote name server entries.
    assert!(s.a.with_fabric(|f| f.routes()).is_empty());
    assert!(
        !s.a.with_fabric(|f| f.remote_entries())
            .iter()
            .any(|e| e.port_name == TARGET)
    );
    // Site B sees its circuits close and takes its side of the link down.
    eventually("B's tunnel goes down", || {
        let st = s.tb.stats();
        let routes = s.b.with_fabric(|f| f.routes());
        if st.state.starts_with("down") && routes.is_empty() {
            Ok(())
        } else {
            Err(format!("{st:?}, routes {routes:?}"))
        }
    })
    .await;
    // A stopped tunnel does not reconnect: its connectors back off for
    // 100 ms at most, so several would have tried by now.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(s.listener.stats().accepted, accepted);
    // Stopping again is harmless.
    s.ta.stop().await;

    s.tb.stop().await;
    assert_eq!(s.tb.stats().state, "stopped");
    let addr = s.listener.local_addr();
    s.listener.stop();
    // Every socket of the tunnels and the listener closed.
    eventually("the sockets close", || {
        let n = sockets();
        if n == before {
            Ok(())
        } else {
            Err(format!("{n} sockets open, {before} before the sites"))
        }
    })
    .await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// One test: the checks count the process's sockets, so nothing else may
/// run beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_tunnels_and_listeners_let_go_of_everything() {
    common::trace();
    for mode in [LinkMode::Rfc, LinkMode::Enhanced] {
        let before = sockets();
        let s = build(mode, (true, true), compress::Mode::None, None).await;
        stop_and_check(s, before).await;
    }
    black_holed().await;
}

/// A tunnel whose peer has gone silent (every circuit black-holed: no
/// reset, no FIN, nothing read) still lets go of its sockets when stopped:
/// the peer never closing them must not keep them, nor their tasks, alive.
async fn black_holed() {
    let s = build(
        LinkMode::Enhanced,
        (true, true),
        compress::Mode::None,
        Some(WanProfile::rtt(Duration::ZERO, 0)),
    )
    .await;
    let r = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    assert!(r.status == Status::GOOD || r.status == Status::CHECK_CONDITION);
    // Site A's circuit sockets: connected to the relays.
    let mine = socket_inodes();
    let circuits: HashSet<u64> = s
        .links
        .iter()
        .flat_map(|l| connected_to(l.addr().port()))
        .filter(|i| mine.contains(i))
        .collect();
    assert_eq!(circuits.len(), 2, "{circuits:?}");
    for l in &s.links {
        l.set_cut(true);
    }
    s.ta.stop().await;
    // Aborting a task is asynchronous: its socket goes on its next turn.
    eventually("A's circuit sockets close", || {
        let open: Vec<u64> = socket_inodes().intersection(&circuits).copied().collect();
        if open.is_empty() {
            Ok(())
        } else {
            Err(format!("still open: {open:?}"))
        }
    })
    .await;
    s.tb.stop().await;
    s.listener.stop();
}
