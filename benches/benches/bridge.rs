//! The bridge's own costs, without sockets or a runtime:
//!
//! - `initiator_session/read_4k`: one 4 KiB READ through the sans-IO iSCSI
//!   initiator session: submit, SCSI Command out, a Data-In with status in
//!   (encoded and framed as the wire carries it), the outcome back;
//! - `initiator_session/write_4k`: the same for a 4 KiB WRITE with
//!   immediate data and a SCSI Response;
//! - `remote_lu/read_4k`: a 4 KiB READ(10) through `RemoteLu` over a
//!   `LoopbackInitiator` to an emulated LU, against the same READ on the
//!   emulated LU directly (`emulated_lu/read_4k`): the remote LU's own
//!   bookkeeping (task set, tag map, outcome mapping).
//!
//! Throughput is in commands (Elements), so reports read in IOPS.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_iscsi::ffp::FfpParams;
use unifab_iscsi::initiator::session::{Event, Session, SessionConfig, StartSn};
use unifab_iscsi::wire::{DataIn, Digests, Framer, Pdu, ScsiResponse, encode_pdu};
use unifab_scsi_core::initiator::{LoopbackFactory, Request};
use unifab_scsi_core::remote::{Identity, RemoteLu, RemoteLuConfig};
use unifab_scsi_core::task::Cdb;
use unifab_scsi_core::{
    BoxFuture, EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend,
    TargetPort, Task, TaskResult, TransportId,
};

fn complete(mut f: BoxFuture<'static, TaskResult>) -> TaskResult {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
            return r;
        }
    }
}

fn port(name: &str) -> TransportId {
    TransportId::Iscsi {
        name: name.into(),
        isid: Some([0x80, 0, 0, 0, 0, 1]),
    }
}

fn target_port() -> TargetPort {
    TargetPort {
        id: TransportId::Iscsi {
            name: "iqn.bench:t,t,0x1".into(),
            isid: None,
        },
        relative_port_id: 1,
        port_group: 1,
    }
}

fn read16(lba: u64) -> Request {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 8;
    Request::new(Lun(0), Bytes::copy_from_slice(&cdb), 4096)
}

fn session() -> (Session<u32>, Instant) {
    let now = Instant::now();
    let mut s = Session::new(SessionConfig::default(), now);
    s.connected(
        now,
        FfpParams {
            max_xmit_data_segment_length: 262_144,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            protocol_level: 2,
            ..FfpParams::default()
        },
        StartSn {
            cmd_sn: 1,
            max_cmd_sn: u32::MAX / 2,
            exp_stat_sn: 1,
        },
    );
    (s, now)
}

fn frame(pdu: &Pdu, data: &[u8]) -> unifab_iscsi::wire::PduFrame {
    let wire = encode_pdu(pdu, &[], data, Digests::default()).expect("encode");
    Framer {
        digests: Digests::default(),
        max_data_segment_length: 1 << 20,
    }
    .decode(&mut BytesMut::from(&wire[..]))
    .expect("frame")
    .expect("whole")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("initiator_session");
    g.throughput(Throughput::Elements(1));
    let payload = vec![0x5au8; 4096];
    g.bench_function("read_4k", |b| {
        let (mut s, now) = session();
        let mut stat_sn = 1u32;
        b.iter(|| {
            s.submit(now, read16(7), 1).expect("submit");
            let out = s.poll_transmit().expect("command");
            let Pdu::ScsiCommand(cmd) = out.pdu else {
                panic!("{out:?}")
            };
            let d = Pdu::DataIn(DataIn {
                final_flag: true,
                status_present: true,
                itt: cmd.itt,
                ttt: u32::MAX,
                stat_sn,
                exp_cmd_sn: cmd.cmd_sn.wrapping_add(1),
                max_cmd_sn: cmd.cmd_sn.wrapping_add(128),
                ..DataIn::default()
            });
            stat_sn = stat_sn.wrapping_add(1);
            s.handle_frame(now, frame(&d, &payload)).expect("data-in");
            match s.poll_event() {
                Some(Event::Command { outcome: Ok(r), .. }) => r,
                other => panic!("{other:?}"),
            }
        })
    });
    g.bench_function("write_4k", |b| {
        let (mut s, now) = session();
        let data = Bytes::from(vec![0xa5u8; 4096]);
        let mut stat_sn = 1u32;
        b.iter(|| {
            let mut cdb = [0u8; 16];
            cdb[0] = 0x8a;
            cdb[13] = 8;
            s.submit(
                now,
                Request::with_data_out(Lun(0), Bytes::copy_from_slice(&cdb), data.clone()),
                1,
            )
            .expect("submit");
            let out = s.poll_transmit().expect("command");
            let Pdu::ScsiCommand(cmd) = out.pdu else {
                panic!("{out:?}")
            };
            let r = Pdu::ScsiResponse(ScsiResponse {
                itt: cmd.itt,
                stat_sn,
                exp_cmd_sn: cmd.cmd_sn.wrapping_add(1),
                max_cmd_sn: cmd.cmd_sn.wrapping_add(128),
                ..ScsiResponse::default()
            });
            stat_sn = stat_sn.wrapping_add(1);
            s.handle_frame(now, frame(&r, &[])).expect("response");
            match s.poll_event() {
                Some(Event::Command { outcome: Ok(r), .. }) => r,
                other => panic!("{other:?}"),
            }
        })
    });
    g.finish();

    let lu = Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(64 << 20)),
        )
        .expect("lu"),
    );
    let remote = RemoteLu::new(
        RemoteLuConfig {
            name: "bench".into(),
            backend: "loopback".into(),
            remote_lun: Lun(0),
            identity: Identity::Passthrough,
            task_set_depth: 1024,
            read_only: false,
        },
        Arc::new(LoopbackFactory::new(
            lu.clone(),
            target_port(),
            port("iqn.bench:gw"),
            true,
        )),
    );
    let nexus = ItNexus::new(port("iqn.bench:host"), target_port());
    let read = Cdb::new(Bytes::from_static(&[0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0]));
    let task = |tag: u64| Task::new(nexus.clone(), Lun(0), tag, read.clone()).with_data_in(4096);
    // Consume the power-on unit attentions of both nexuses.
    for _ in 0..2 {
        let _ = complete(remote.execute(task(0)));
        let _ = complete(lu.execute(task(0)));
    }
    let mut g = c.benchmark_group("remote_lu");
    g.throughput(Throughput::Elements(1));
    let mut tag = 1u64;
    g.bench_function("read_4k", |b| {
        b.iter(|| {
            tag += 1;
            complete(remote.execute(task(tag)))
        })
    });
    g.finish();
    let mut g = c.benchmark_group("emulated_lu");
    g.throughput(Throughput::Elements(1));
    g.bench_function("read_4k", |b| {
        b.iter(|| {
            tag += 1;
            complete(lu.execute(task(tag)))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
