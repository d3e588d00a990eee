//! AF_PACKET receive side: a frame the kernel drops because the socket's
//! buffer is full is counted and logged, never lost without a word.
//!
//! FCoE assumes a lossless link, and FCP class 3 recovers a lost frame
//! only by the command's timeout, so an operator (and `fcoe_hop.sh`) must
//! be able to see every drop. Needs root (a veth pair, AF_PACKET); CI runs
//! as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use unifab_fcoe::link::af_packet;

fn run(cmd: &[&str]) {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        cmd.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Veth(String, String);

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

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
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(
        uid == 0,
        "this test needs root (a veth pair, AF_PACKET); running as uid {uid}. CI runs as \
         root; run `sudo -E cargo test -p unifab-fcoe --test af_packet_drops` by hand."
    );
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let id = std::process::id() % 100_000;
    let veth = Veth(format!("upda{id}"), format!("updb{id}"));
    let _ = Command::new("ip").args(["link", "del", &veth.0]).output();
    run(&[
        "ip", "link", "add", &veth.0, "type", "veth", "peer", "name", &veth.1,
    ]);
    for i in [&veth.0, &veth.1] {
        run(&["ip", "link", "set", i, "up"]);
    }
    let mut rx = af_packet::open(&veth.0).unwrap();
    let mut tx = af_packet::open(&veth.1).unwrap();
    let (to, src) = (rx.mac.0, tx.mac.0);

    // Nobody takes frames from `rx` while they are sent: its receive
    // thread fills its queue, then the socket's buffer fills, then the
    // kernel drops. (The buffer is 64 MiB; a small frame costs the socket
    // well over 320 bytes of it.)
    const SENT: u32 = 250_000;
    for seq in 0..SENT {
        tx.tx
            .send(64, &mut |buf| {
                buf[..6].copy_from_slice(&to);
                buf[6..12].copy_from_slice(&src);
                buf[12..14].copy_from_slice(&0x8906u16.to_be_bytes());
                buf[14..18].copy_from_slice(&seq.to_be_bytes());
                buf[18..64].fill(0);
                Ok(64)
            })
            .unwrap();
    }

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
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut dropped = 0;
    while Instant::now() < deadline {
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
