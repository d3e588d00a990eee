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

/// `[tuning] worker_threads` sizes the runtime: the running gateway reports
/// its worker threads (`unifab_runtime_workers` in `unifab show metrics`),
/// one per core unless configured.
#[test]
fn worker_threads_sizes_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let workers = |tuning: &str| -> usize {
        let admin = unifab_testkit::peers::free_tcp_port().unwrap();
        let cfg = file_lu_config(dir.path(), "1MiB").replace(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &format!("[admin]\nlisten = \"127.0.0.1:{admin}\""),
        );
        assert!(cfg.contains(&format!(":{admin}\"")), "{cfg}");
        let gw = Gateway::start(dir.path(), &format!("{cfg}\n{tuning}\n"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
            .args(["show", "metrics", "--admin", &format!("127.0.0.1:{admin}")])
            .output()
            .unwrap();
        gw.kill();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text.lines()
            .find_map(|l| l.strip_prefix("unifab_runtime_workers "))
            .unwrap_or_else(|| panic!("no unifab_runtime_workers in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(workers("[tuning]\nworker_threads = 3"), 3);
    assert_eq!(workers("[tuning]\nworker_threads = 1"), 1);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(workers(""), cores);
}
