//! AF_XDP receive side: no frame is lost to an empty fill ring while the
//! stack holds received frames, or after it gives them back.
//!
//! FCoE assumes a lossless link, and FCP class 3 recovers a lost frame
//! only by the command's timeout, so the receive side must keep enough
//! UMEM frames in the kernel's fill ring for a burst arriving while its
//! task is off the CPU ([`Budget::burst`]), however many frames the stack
//! holds. Needs root (a veth pair and an XDP program); CI runs as root.
#![cfg(feature = "af-xdp")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use unifab_fcoe::link::af_xdp::{self, Budget, XdpConfig, XdpMode};
use unifab_fcoe::link::{EthLink, af_packet};
use unifab_testkit::veth::{VethPair, require_root};

mod numbered;
use numbered::{send, seqs};

/// Receives until `n` frames came. The frames were all sent before this
/// is called, so ten empty waits of 200 ms in a row mean the rest were
/// lost (a liveness bound, not a speed check).
async fn receive(link: &mut EthLink, n: usize) -> Vec<Bytes> {
    let mut got = Vec::new();
    let mut empty = 0;
    while got.len() < n {
        let mut out = Vec::new();
        match tokio::time::timeout(Duration::from_millis(200), link.rx.recv(&mut out)).await {
            Ok(r) => {
                r.unwrap();
                empty = 0;
                got.extend(out);
            }
            Err(_) => {
                empty += 1;
                assert!(
                    empty < 10,
                    "received {} of {n} frames: the rest were lost",
                    got.len()
                );
            }
        }
    }
    got
}

#[tokio::test]
async fn a_burst_fits_while_frames_are_held_and_after_they_return() {
    require_root("the AF_XDP burst test", "unifab-fcoe --features af-xdp");
    let veth = VethPair::new("uxl");
    let cfg = XdpConfig {
        frames: 1024,
        ring: 512,
        ..XdpConfig::new(XdpMode::Generic)
    };
    let budget = Budget::of(&cfg);
    // Something is lent, and the burst is more than the half of the
    // receive frames the split before 2026-11-24 left the kernel.
    assert!(
        budget.max_lent > 0 && budget.burst() > budget.rx / 2,
        "{budget:?}"
    );
    let burst = budget.burst();
    let mut rx = af_xdp::open(&veth.a, &cfg).unwrap();
    let mut tx = af_packet::open(&veth.b).unwrap();
    let to = rx.mac.0;

    // The stack holds every frame it receives (more than it may borrow
    // from the UMEM: the rest are copied).
    let mut held = Vec::new();
    let mut next = 0;
    while held.len() < budget.rx as usize {
        send(&mut tx, to, next, 32);
        let got = receive(&mut rx, 32).await;
        assert_eq!(seqs(&got), (next..next + 32).collect::<Vec<_>>());
        held.extend(got);
        next += 32;
    }

    // A burst arrives while the receiver does not run: the kernel must
    // find a fill-ring frame for each.
    send(&mut tx, to, next, burst);
    let got = receive(&mut rx, burst as usize).await;
    assert_eq!(seqs(&got), (next..next + burst).collect::<Vec<_>>());
    next += burst;
    drop(got);
    // What the stack holds was not handed back to the kernel under it.
    let n = held.len() as u32;
    assert_eq!(seqs(&held), (0..n).collect::<Vec<_>>());

    // Everything held comes back while the receiver is idle, then another
    // burst arrives before it runs again.
    drop(held);
    send(&mut tx, to, next, burst);
    let got = receive(&mut rx, burst as usize).await;
    assert_eq!(seqs(&got), (next..next + burst).collect::<Vec<_>>());
}
