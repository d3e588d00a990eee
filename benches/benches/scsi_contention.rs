//! Many hosts on one LU against the same hosts on one LU each, without
//! sockets: N threads, each an I_T nexus of its own, submit 4 KiB READ(10)s
//! to emulated LUs over the memory backend (inline I/O, every task polled
//! to completion on its thread). What serializes a shared LU's commands
//! (its locks, the task set, shared counters) shows as fewer commands per
//! second on one LU than on N, with the same threads and the same work.
//!
//! Each LU also holds a unit attention for a host that has left (as
//! every LU that hosts come and go on does), which must not send the others
//! through the LU's lock.
//!
//! `SCSI_CONTENTION_THREADS="1 2 4 8 16"` sets the thread counts (default
//! 1, 2 and 4).
//!
//! Reported as commands per second over all threads (`Throughput::Elements`
//! = N per iteration). On a machine with fewer cores than N the threads
//! also share cores; compare the two layouts at the same N.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use unifab_scsi_core::task::Cdb;
use unifab_scsi_core::{
    EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend, Status,
    TargetPort, Task, TransportId,
};

const BLOCKS: u32 = 1 << 15; // 16 MiB per LU

fn lu() -> EmulatedLu {
    EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..Default::default()
        },
        Arc::new(MemoryBackend::new(u64::from(BLOCKS) * 512)),
    )
    .expect("lu")
}

fn nexus(host: usize) -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: format!("iqn.2026-11.io.unifab:host{host}"),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.io.unifab:t,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fn read10(lba: u32) -> Cdb {
    let mut c = [0x28u8, 0, 0, 0, 0, 0, 0, 0, 8, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    Cdb::new(Bytes::copy_from_slice(&c))
}

/// Runs `task` to completion on this thread.
fn run(lu: &EmulatedLu, task: Task) -> Status {
    let mut f = lu.execute(task);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
            return r.status;
        }
    }
}

/// `iters` reads by each of `lus.len()` hosts, host `i` on `lus[i]`, all
/// threads at once; the time until the last one finished.
fn hosts_reading(lus: &[Arc<EmulatedLu>], iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for (host, lu) in lus.iter().enumerate() {
            s.spawn(move || {
                let n = nexus(host);
                let mut lba = (host as u32 * 4096) % (BLOCKS - 8);
                for tag in 0..iters {
                    lba = (lba + 8) % (BLOCKS - 8);
                    let t = Task::new(n.clone(), Lun(0), tag, read10(lba)).with_data_in(4096);
                    assert_eq!(run(lu, t), Status::GOOD);
                }
            });
        }
    });
    start.elapsed()
}

/// Thread counts: `SCSI_CONTENTION_THREADS` (e.g. "1 2 4 8 16" on a
/// many-core machine), else 1, 2 and 4.
fn thread_counts() -> Vec<usize> {
    std::env::var("SCSI_CONTENTION_THREADS")
        .ok()
        .map(|v| {
            v.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![1, 2, 4])
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("scsi_contention");
    for threads in thread_counts() {
        g.throughput(Throughput::Elements(threads as u64));
        // Every host has met its power-on unit attention before timing, and
        // one more host has come and gone, leaving its I_T NEXUS LOSS
        // OCCURRED queued for when it returns, as hosts that reboot or
        // move do on a real SAN.
        let shared = Arc::new(lu());
        let one: Vec<Arc<EmulatedLu>> = (0..threads).map(|_| shared.clone()).collect();
        let each: Vec<Arc<EmulatedLu>> = (0..threads).map(|_| Arc::new(lu())).collect();
        for lus in [&one, &each] {
            for (host, l) in lus.iter().enumerate() {
                let t = Task::new(nexus(host), Lun(0), 0, read10(0)).with_data_in(4096);
                let _ = run(l, t);
            }
        }
        for l in one.iter().take(1).chain(each.iter()) {
            let gone = nexus(usize::MAX);
            let _ = run(
                l,
                Task::new(gone.clone(), Lun(0), 0, read10(0)).with_data_in(4096),
            );
            l.nexus_loss(&gone);
        }
        g.bench_with_input(BenchmarkId::new("one_lu", threads), &one, |b, lus| {
            b.iter_custom(|iters| hosts_reading(lus, iters))
        });
        g.bench_with_input(BenchmarkId::new("lu_each", threads), &each, |b, lus| {
            b.iter_custom(|iters| hosts_reading(lus, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
