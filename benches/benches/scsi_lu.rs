//! 4 KiB READ(10)/WRITE(10) through EmulatedLu over MemoryBackend: IOPS.
//!
//! Inline I/O mode, each task polled to completion with a no-op waker, so
//! this measures the device server's own path (task set, checks, backend
//! copy, the LU's counters), not a runtime. `read10_4k_via_target` takes
//! the transports' path instead, through `ScsiTarget::dispatch` (the LUN
//! map, the unit attention check): the difference from `read10_4k` is
//! what that door costs per command.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_scsi_core::target::{Dispatch, ScsiTarget};
use unifab_scsi_core::task::Cdb;
use unifab_scsi_core::{
    EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend, Status,
    TargetPort, Task, TaskResult, TransportId,
};

fn complete(lu: &EmulatedLu, task: Task) -> TaskResult {
    poll(lu.execute(task))
}

fn poll(mut f: unifab_scsi_core::BoxFuture<'static, TaskResult>) -> TaskResult {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
            return r;
        }
    }
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Cdb {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    Cdb::new(Bytes::from(c))
}

fn bench(c: &mut Criterion) {
    let blocks: u64 = 1 << 18; // 128 MiB
    let lu = Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(blocks * 512)),
        )
        .expect("lu"),
    );
    let target = ScsiTarget::new();
    target.insert(Lun::ZERO, lu.clone());
    let nexus = ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.bench:i".into(),
            isid: Some([0; 6]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.bench:t,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    );
    let task = |cdb: Cdb, data: Option<Bytes>| {
        let t = Task::new(nexus.clone(), Lun::ZERO, 1, cdb).with_data_in(4096);
        match data {
            Some(d) => t.with_data(d),
            None => t,
        }
    };
    // Consume the power-on unit attention.
    let _ = complete(&lu, task(rw10(0x00, 0, 0), None));
    let payload = Bytes::from(vec![0xa5u8; 4096]);
    let mut g = c.benchmark_group("scsi_lu");
    g.throughput(Throughput::Elements(1));
    let mut lba = 0u32;
    g.bench_function("write10_4k", |b| {
        b.iter(|| {
            lba = (lba + 8) % (blocks as u32 - 8);
            let r = complete(&lu, task(rw10(0x2a, lba, 8), Some(payload.clone())));
            assert_eq!(r.status, Status::GOOD);
        })
    });
    g.bench_function("read10_4k", |b| {
        b.iter(|| {
            lba = (lba + 8) % (blocks as u32 - 8);
            let r = complete(&lu, task(rw10(0x28, lba, 8), None));
            assert_eq!(r.status, Status::GOOD);
        })
    });
    g.bench_function("read10_4k_via_target", |b| {
        b.iter(|| {
            lba = (lba + 8) % (blocks as u32 - 8);
            let r = poll(target.dispatch(task(rw10(0x28, lba, 8), None)));
            assert_eq!(r.status, Status::GOOD);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
