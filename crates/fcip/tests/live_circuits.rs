//! Circuits added to and removed from a running tunnel (what a reload of
//! `[[fcip.tunnel.circuit]]` does): in enhanced mode, writes run
//! throughout and every one completes GOOD and reads back; an added
//! circuit comes up and carries data; a removed one is closed and no
//! longer listed, its batches resent on the others. A change that cannot
//! be made live (a kept circuit's address, RFC mode) is refused and
//! changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{sites_via, task};
use unifab_fcip::io::{CircuitConfig, LinkMode};
use unifab_fcip::proto::compress;
use unifab_scsi_core::{LogicalUnit, Status};
use unifab_testkit::wan::{WanLink, WanProfile};

fn pattern(k: u64) -> Bytes {
    Bytes::from(
        (0..32768u64)
            .map(|i| (i.wrapping_mul(131) ^ k.wrapping_mul(7)) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn rw10(lba: u32, blocks: u16, read: bool) -> Vec<u8> {
    let mut c = vec![if read { 0x28 } else { 0x2a }, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn accepting(n: usize) -> Vec<CircuitConfig> {
    (0..n)
        .map(|_| CircuitConfig {
            peer: None,
            local: None,
            weight: 1,
        })
        .collect()
}

fn connecting(links: &[&WanLink]) -> Vec<CircuitConfig> {
    links
        .iter()
        .map(|l| CircuitConfig {
            peer: Some(l.addr()),
            local: None,
            weight: 1,
        })
        .collect()
}

/// Waits (bounded) until site A's tunnel lists exactly `slots`, all up.
async fn wait_circuits(s: &common::Sites, slots: &[usize]) {
    for _ in 0..400 {
        let st = s.ta.stats();
        let now: Vec<usize> = st.circuits.iter().map(|c| c.slot).collect();
        if now == slots && st.circuits.iter().all(|c| c.state == "up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("circuits {slots:?} not all up: {:?}", s.ta.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuits_come_and_go_under_writes_and_lose_nothing() {
    let s = Arc::new(
        sites_via(
            LinkMode::Enhanced,
            false,
            compress::Mode::None,
            Some(WanProfile::lan()),
        )
        .await,
    );
    let _ = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    wait_circuits(&s, &[1, 2]).await;

    // Writes and read-backs throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let io = {
        let (s, stop, done, failed) = (s.clone(), stop.clone(), done.clone(), failed.clone());
        tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let lba = (k % 256) as u32 * 64;
                let w = s
                    .remote
                    .execute(task(10 + 2 * k, &rw10(lba, 64, false), Some(pattern(k)), 0))
                    .await;
                let r = s
                    .remote
                    .execute(task(11 + 2 * k, &rw10(lba, 64, true), None, 32768))
                    .await;
                let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
                if w.status == Status::GOOD && r.status == Status::GOOD && got == pattern(k) {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    eprintln!("round {k}: write {:?} read {:?}", w.status, r.status);
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                k += 1;
            }
        })
    };
    let progress = |n: u64| {
        let done = done.clone();
        async move {
            let start = done.load(Ordering::Relaxed);
            for _ in 0..2000 {
                if done.load(Ordering::Relaxed) >= start + n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("no progress");
        }
    };
    progress(20).await;

    // A third circuit: B accepts it, then A connects it.
    let third = WanLink::start(
        "127.0.0.1:0".parse().unwrap(),
        s.listener.local_addr(),
        WanProfile::lan(),
    )
    .unwrap();
    s.tb.set_circuits(accepting(3)).await.unwrap();
    s.ta.set_circuits(connecting(&[&s.links[0], &s.links[1], &third]))
        .await
        .unwrap();
    wait_circuits(&s, &[1, 2, 3]).await;
    let before = third.forwarded();
    progress(60).await;
    assert!(
        third.forwarded() > before,
        "the added circuit carries data: {:?}",
        s.ta.stats()
    );

    // Refused, and nothing changes: a kept circuit's new address.
    let moved = connecting(&[&third, &s.links[1], &s.links[0]]);
    let e = s.ta.set_circuits(moved).await.unwrap_err();
    assert!(e.contains("circuit 1 changed its addresses"), "{e}");
    let e = s.ta.set_circuits(Vec::new()).await.unwrap_err();
    assert!(e.contains("1 to 16 circuits"), "{e}");
    let e = s.ta.set_circuits(accepting(3)).await.unwrap_err();
    assert!(e.contains("names a peer"), "{e}");
    wait_circuits(&s, &[1, 2, 3]).await;

    // Down to one circuit: A first, then B.
    s.ta.set_circuits(connecting(&[&s.links[0]])).await.unwrap();
    s.tb.set_circuits(accepting(1)).await.unwrap();
    wait_circuits(&s, &[1]).await;
    // A's side is gone, but B may still send on its end (an ack, a
    // keep-alive) until it drops the circuit too: the count is final once
    // both ends have closed the relayed connections.
    for link in [&s.links[1], &third] {
        let mut waited = 0;
        while link.connections() > 0 {
            assert!(waited < 400, "a removed circuit's connection stays open");
            tokio::time::sleep(Duration::from_millis(25)).await;
            waited += 1;
        }
    }
    let (c2, c3) = (s.links[1].forwarded(), third.forwarded());
    progress(40).await;
    assert_eq!(
        (s.links[1].forwarded(), third.forwarded()),
        (c2, c3),
        "removed circuits carry nothing"
    );
    stop.store(true, Ordering::Relaxed);
    io.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "failed or wrong I/O");
    assert_eq!(s.ta.stats().dropped, 0, "{:?}", s.ta.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_mode_circuits_change_only_at_a_restart() {
    let s = sites_via(LinkMode::Rfc, false, compress::Mode::None, None).await;
    let before = s.ta.stats().circuits.len();
    let e = s.tb.set_circuits(accepting(3)).await.unwrap_err();
    assert!(e.contains("RFC mode"), "{e}");
    assert_eq!(s.ta.stats().circuits.len(), before);
}
