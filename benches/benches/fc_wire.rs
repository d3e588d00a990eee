//! FC wire layer: frame header parse and emit (ns per frame), whole-frame
//! decode of a FLOGI, FCP IU parse/emit, and the FC CRC over a full-size
//! data frame.

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use unifab_fc::wire::crc::fc_crc;
use unifab_fc::wire::els::{ElsRepr, LoginParams};
use unifab_fc::wire::fcp::{FcpCmndRepr, FcpRspRepr};
use unifab_fc::wire::header::{FCtl, FcHeader, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, FrameRepr, OxId, RxId, Wwn};
use unifab_scsi_core::Lun;

fn bench(c: &mut Criterion) {
    let h = FcHeaderRepr {
        r_ctl: RCtl::FCP_DATA,
        d_id: FcId::new(0x010200),
        s_id: FcId::new(0x010100),
        fc_type: FcType::FCP,
        f_ctl: FCtl(0x88_0008),
        seq_id: 7,
        seq_cnt: 3,
        ox_id: OxId(0x1234),
        rx_id: RxId(0x5678),
        parameter: 8192,
        ..FcHeaderRepr::default()
    };
    let bytes = h.to_bytes();
    let mut g = c.benchmark_group("fc_wire");
    g.throughput(Throughput::Elements(1));
    g.bench_function("header_parse", |b| {
        b.iter(|| FcHeaderRepr::parse(&FcHeader::new_unchecked(black_box(&bytes[..]))))
    });
    g.bench_function("header_view_d_id", |b| {
        b.iter(|| {
            FcHeader::new_checked(black_box(&bytes[..]))
                .map(|v| v.d_id())
                .ok()
        })
    });
    g.bench_function("header_emit", |b| {
        let mut out = [0u8; 24];
        b.iter(|| {
            black_box(&h).emit(&mut FcHeader::new_unchecked(&mut out[..]));
            black_box(&out);
        })
    });
    let flogi = {
        let p = ElsRepr::Flogi(LoginParams::n_port(Wwn(1), Wwn(2), 2048, 2000));
        let mut v = FcHeaderRepr {
            r_ctl: RCtl::ELS_REQUEST,
            d_id: FcId::LOGIN_SERVER,
            fc_type: FcType::ELS,
            f_ctl: FCtl::request(),
            ..FcHeaderRepr::default()
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(&p.to_bytes().unwrap_or_default());
        Bytes::from(v)
    };
    g.bench_function("frame_parse_flogi", |b| {
        b.iter(|| FrameRepr::parse(black_box(&flogi), None).ok())
    });
    let cmnd = {
        let c = FcpCmndRepr::command(
            Lun(0),
            &[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0],
            4096,
            true,
            false,
        );
        let mut v = vec![0u8; c.buffer_len()];
        let _ = c.emit(&mut v);
        Bytes::from(v)
    };
    g.bench_function("fcp_cmnd_parse", |b| {
        b.iter(|| FcpCmndRepr::parse(black_box(&cmnd)).ok())
    });
    let rsp = FcpRspRepr::default();
    g.bench_function("fcp_rsp_emit", |b| {
        let mut out = [0u8; 24];
        b.iter(|| black_box(&rsp).emit(&mut out).ok())
    });
    let data = vec![0x5au8; 24 + 2048];
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("crc_2k_frame", |b| b.iter(|| fc_crc(black_box(&data))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
