//! FCP round trips in memory: a 4 KiB READ(10) and WRITE(10) from an FCP
//! initiator N_Port through the fabric to an FCP target N_Port and an
//! emulated LU over RAM, and back.
//!
//! - `sans_io_*`: the sans-IO N_Ports and fabric pumped in one thread
//!   (inline LU, no runtime): the protocol engines' own cost per I/O.
//! - `remote_lu_qd32_read`: the whole runtime path the gateway uses for an
//!   `fc://` LU — RemoteLu → FcpInitiator → node driver → switch → target
//!   N_Port → EmulatedLu — 32 commands in flight, on a 2-thread runtime.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_fc::fabric::{Fabric, FabricConfig, PortIndex};
use unifab_fc::io::{FcNode, FcpInitiatorFactory, Switch};
use unifab_fc::nport::{CommandId, NPort, NPortConfig, NPortEvent};
use unifab_fc::wire::Wwn;
use unifab_scsi_core::Dispatch;
use unifab_scsi_core::initiator::Request;
use unifab_scsi_core::remote::Identity;
use unifab_scsi_core::task::Cdb;
use unifab_scsi_core::{
    EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend, RemoteLu,
    RemoteLuConfig, ScsiTarget, TargetPort, Task, TaskResult, TransportId,
};

const T: Wwn = Wwn(0x2100_0000_0000_0a01);
const I: Wwn = Wwn(0x2100_0000_0000_0b01);

fn rw10(op: u8, lba: u32, blocks: u16) -> Bytes {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    Bytes::from(c)
}

fn poll_now<T>(mut f: unifab_scsi_core::BoxFuture<'static, T>) -> T {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
            return r;
        }
    }
}

fn inline_lu() -> Arc<EmulatedLu> {
    Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(64 << 20)),
        )
        .expect("lu"),
    )
}

/// Two sans-IO N_Ports on a sans-IO fabric.
struct Rig {
    fabric: Fabric,
    ports: [(NPort, PortIndex); 2],
    scsi: ScsiTarget,
    next: u64,
    done: Option<TaskResult>,
}

impl Rig {
    fn new() -> Rig {
        let mut fabric = Fabric::new(FabricConfig::default());
        let mut t = NPortConfig::new(T, Wwn(T.0 + 1));
        t.target = true;
        let mut i = NPortConfig::new(I, Wwn(I.0 + 1));
        i.initiator = true;
        i.discover = true;
        let pt = fabric.attach("t");
        let pi = fabric.attach("i");
        let scsi = ScsiTarget::new();
        scsi.insert(Lun(0), inline_lu());
        let mut rig = Rig {
            fabric,
            ports: [(NPort::new(t), pt), (NPort::new(i), pi)],
            scsi,
            next: 0,
            done: None,
        };
        let now = Instant::now();
        rig.ports[0].0.link_up(now);
        rig.pump(now);
        rig.ports[1].0.link_up(now);
        rig.pump(now);
        // Clear the first unit attention.
        rig.run(Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0));
        rig
    }

    fn pump(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            for (p, idx) in &mut self.ports {
                while let Some(f) = p.poll_transmit() {
                    moved = true;
                    self.fabric.handle_frame(now, *idx, f);
                }
            }
            while let Some((idx, f)) = self.fabric.poll_transmit() {
                moved = true;
                if let Some((p, _)) = self.ports.iter_mut().find(|(_, i)| *i == idx) {
                    p.handle_frame(now, f);
                }
            }
            for (p, _) in &mut self.ports {
                while let Some(ev) = p.poll_event() {
                    moved = true;
                    match ev {
                        NPortEvent::Execute { id, task } => {
                            let r = poll_now(self.scsi.dispatch(task));
                            p.complete_task(now, id, r);
                        }
                        NPortEvent::Completed { outcome, .. } => {
                            self.done = outcome.ok();
                        }
                        _ => {}
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn run(&mut self, r: Request) -> Option<TaskResult> {
        let now = Instant::now();
        self.next += 1;
        self.ports[1].0.submit(now, CommandId(self.next), T, r);
        self.pump(now);
        self.done.take()
    }
}

fn front_nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.bench:host".into(),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.bench:gw,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("fc_fcp");
    g.throughput(Throughput::Elements(1));
    let mut rig = Rig::new();
    let data = Bytes::from(vec![0xa5u8; 4096]);
    g.bench_function("sans_io_read_4k", |b| {
        b.iter(|| rig.run(Request::new(Lun(0), rw10(0x28, 8, 8), 4096)))
    });
    g.bench_function("sans_io_write_4k", |b| {
        b.iter(|| {
            rig.run(Request::with_data_out(
                Lun(0),
                rw10(0x2a, 8, 8),
                data.clone(),
            ))
        })
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let remote = rt.block_on(async {
        let switch = Switch::new(FabricConfig::default());
        let node = FcNode::spawn(&switch, "bench");
        let scsi = ScsiTarget::new();
        scsi.insert(Lun(0), inline_lu());
        let mut t = NPortConfig::new(T, Wwn(T.0 + 1));
        t.target = true;
        node.add_port("t", t, Some(scsi)).expect("port");
        let mut i = NPortConfig::new(I, Wwn(I.0 + 1));
        i.initiator = true;
        i.discover = true;
        node.add_port("i", i, None).expect("port");
        assert!(
            node.wait_for_peer(I, T, std::time::Duration::from_secs(5))
                .await
        );
        let factory = Arc::new(FcpInitiatorFactory::new(node, I, T, true));
        RemoteLu::new(
            RemoteLuConfig {
                name: "bench".into(),
                backend: "fc://bench".into(),
                remote_lun: Lun(0),
                identity: Identity::Passthrough,
                task_set_depth: 256,
                read_only: false,
            },
            factory,
        )
    });
    let nexus = front_nexus();
    let task = |tag: u64, lba: u32| {
        Task::new(nexus.clone(), Lun(0), tag, Cdb::new(rw10(0x28, lba, 8))).with_data_in(4096)
    };
    // The first command on the nexus meets its unit attention.
    rt.block_on(remote.execute(task(0, 0)));
    g.throughput(Throughput::Elements(32));
    let mut tag = 1u64;
    g.bench_function("remote_lu_qd32_read_4k", |b| {
        b.iter(|| {
            let futs: Vec<_> = (0..32u32)
                .map(|k| {
                    tag += 1;
                    remote.execute(task(tag, k * 8))
                })
                .collect();
            rt.block_on(async {
                for f in futs {
                    let r = f.await;
                    assert_eq!(r.data_in_total(), 4096);
                }
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
