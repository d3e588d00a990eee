//! `[tuning] cpu_latency_us`: the running gateway holds the PM QoS request,
//! and the kernel drops it when the process dies. Needs root (the device
//! is mode 0600), as CI runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Gateway, file_lu_config};
use unifab::tuning::{CPU_LATENCY_DEVICE, effective_cpu_latency_us};

/// Distinctive, and far below anything a system asks for by default.
const REQUEST_US: u32 = 4;

fn effective() -> u32 {
    effective_cpu_latency_us().unwrap_or_else(|e| {
        panic!("reading {CPU_LATENCY_DEVICE} needs root (CI runs as root): {e}")
    })
}

/// One test, in steps: the request is system-wide, so two gateways in
/// parallel tests would see each other's.
#[test]
fn the_gateway_holds_its_cpu_latency_request_while_it_runs_and_only_if_asked() {
    let before = effective();
    assert!(
        before > REQUEST_US,
        "another process already holds a CPU latency request of {before} µs; \
         this test needs none at or below {REQUEST_US} µs to tell the gateway's apart"
    );
    let dir = tempfile::tempdir().unwrap();

    let plain = Gateway::start(dir.path(), &file_lu_config(dir.path(), "1MiB"));
    let during = effective();
    assert_eq!(
        during, before,
        "a gateway without [tuning] changed the CPU latency"
    );
    plain.kill();

    let cfg = format!(
        "{}\n[tuning]\ncpu_latency_us = {REQUEST_US}\n",
        file_lu_config(dir.path(), "1MiB")
    );
    let tuned = Gateway::start(dir.path(), &cfg);
    let during = effective();
    assert!(
        during <= REQUEST_US,
        "the gateway is serving, yet the effective CPU latency is {during} µs"
    );
    tuned.kill();
    // The request dies with the descriptor, even on SIGKILL.
    let after = effective();
    assert!(
        after > REQUEST_US,
        "the gateway is gone, yet the effective CPU latency is still {after} µs"
    );
}
