//! iSCSI PDU header parse and emit: BHS view, SCSI Command, Data-In and
//! SCSI Response, and framing a Data-In PDU out of a receive buffer.
//! Throughput in PDUs (Elements): ns per PDU.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_iscsi::wire::{
    BHS_LEN, Bhs, DataIn, Digests, Framer, Pdu, ScsiCommand, ScsiResponse, TaskAttrCode,
    encode_header, encode_pdu,
};

fn scsi_command() -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x28, 0, 0, 0, 0x10, 0, 0, 0, 0x10, 0]);
    Pdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_flag: true,
        read: true,
        write: false,
        attr: TaskAttrCode::SIMPLE,
        lun: 0,
        itt: 0x1234,
        expected_data_transfer_length: 8192,
        cmd_sn: 77,
        exp_stat_sn: 12,
        cdb,
    })
}

fn data_in() -> Pdu {
    Pdu::DataIn(DataIn {
        final_flag: true,
        acknowledge: false,
        overflow: false,
        underflow: false,
        status_present: true,
        status: 0,
        lun: 0,
        itt: 0x1234,
        ttt: 0xffff_ffff,
        stat_sn: 13,
        exp_cmd_sn: 78,
        max_cmd_sn: 140,
        data_sn: 0,
        buffer_offset: 0,
        residual_count: 0,
    })
}

fn scsi_response() -> Pdu {
    Pdu::ScsiResponse(ScsiResponse {
        bidi_overflow: false,
        bidi_underflow: false,
        overflow: false,
        underflow: false,
        response: 0,
        status: 0,
        itt: 0x1234,
        snack_tag: 0,
        stat_sn: 13,
        exp_cmd_sn: 78,
        max_cmd_sn: 140,
        exp_data_sn: 0,
        bidi_residual_count: 0,
        residual_count: 0,
    })
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("iscsi_pdu");
    g.throughput(Throughput::Elements(1));
    let cmd = scsi_command().to_bhs(0, 0);
    g.bench_function("bhs_view", |b| {
        b.iter(|| {
            let v = Bhs::new_checked(black_box(&cmd[..])).ok();
            v.map(|v| (v.opcode(), v.data_segment_length(), v.initiator_task_tag()))
        })
    });
    for (name, pdu, dsl) in [
        ("scsi_command", scsi_command(), 0u32),
        ("data_in", data_in(), 8192),
        ("scsi_response", scsi_response(), 0),
    ] {
        let bytes = pdu.to_bhs(0, dsl);
        g.bench_function(format!("{name}/parse"), |b| {
            b.iter(|| Bhs::new_checked(black_box(&bytes[..])).and_then(|v| Pdu::parse(&v)))
        });
        g.bench_function(format!("{name}/emit"), |b| {
            let mut buf = [0u8; BHS_LEN];
            b.iter(|| {
                black_box(&pdu).emit(&mut Bhs::new_unchecked(&mut buf[..]), 0, dsl);
                black_box(buf[0])
            })
        });
        g.bench_function(format!("{name}/encode_header_with_digest"), |b| {
            b.iter(|| encode_header(black_box(&pdu), &[], dsl, true))
        });
    }
    // Framing: split one 8 KiB Data-In PDU (digests on) off a buffer.
    let data = vec![0x5au8; 8192];
    let wire = encode_pdu(
        &data_in(),
        &[],
        &data,
        Digests {
            header: true,
            data: true,
        },
    )
    .unwrap_or_default();
    let framer = Framer {
        digests: Digests {
            header: true,
            data: true,
        },
        max_data_segment_length: 1 << 20,
    };
    g.bench_function("data_in_8k/frame_and_verify", |b| {
        b.iter_batched(
            || BytesMut::from(&wire[..]),
            |mut buf| framer.decode(&mut buf).ok().flatten().map(|f| f.data.len()),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
