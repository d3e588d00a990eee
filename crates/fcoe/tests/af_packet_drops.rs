//! AF_PACKET receive side: a frame the kernel drops because the socket's
//! buffer is full is counted and logged, never lost without a word.
//!
//! FCoE assumes a lossless link, and FCP class 3 recovers a lost frame
//! only by the command's timeout, so an operator (and `fcoe_hop.sh`) must
//! be able to see every drop. Needs root (a veth pair, AF_PACKET); CI runs
//! as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use unifab_fcoe::link::af_packet;
use unifab_testkit::veth::{VethPair, require_root};

mod numbered;

/// The log, shared with the subscriber.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `dropped_total` of the last drop report in `log`.
fn dropped_total(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("AF_PACKET receive drops"))
        .filter_map(|l| l.split("dropped_total=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or(0)
}

#[tokio::test]
async fn frames_the_socket_cannot_hold_are_counted_and_logged() {
    require_root("the AF_PACKET drops test", "unifab-fcoe");
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let veth = VethPair::new("upd");
    let mut rx = af_packet::open(&veth.a).unwrap();
    let mut tx = af_packet::open(&veth.b).unwrap();
    let to = rx.mac.0;

    // Nobody takes frames from `rx` while they are sent: its receive
    // thread fills its queue, then the socket's buffer fills, then the
    // kernel drops. (The buffer is 64 MiB; a small frame costs the socket
    // well over 320 bytes of it.)
    const SENT: u32 = 250_000;
    numbered::send(&mut tx, to, 0, SENT);

    // Now take everything that was kept, until the link is quiet.
    let mut got = 0u64;
    loop {
        let mut out = Vec::new();
        match tokio::time::timeout(Duration::from_secs(1), rx.rx.recv(&mut out)).await {
            Ok(r) => {
                r.unwrap();
                got += out.len() as u64;
            }
            Err(_) => break,
        }
    }
    // The counter is read when the socket has been quiet for a while.
    // (Polled up to 50 times, 100 ms apart: a liveness bound.)
    let mut dropped = 0;
    for _ in 0..50 {
        let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
        dropped = dropped_total(&text);
        if got + dropped >= u64::from(SENT) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        dropped > 0,
        "no drop reported; {got} of {SENT} frames received"
    );
    assert_eq!(
        got + dropped,
        u64::from(SENT),
        "received {got}, dropped {dropped}"
    );
}
