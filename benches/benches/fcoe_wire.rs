//! FCoE wire layer and state machines: encapsulating and decoding a
//! full-size (2,048-byte payload) FCoE data frame, CRC included (GB/s of
//! FC payload), FIP advertisement parse/emit (per message), and the FCF's
//! and ENode's per-frame data path (decode, source-MAC check, queueing)
//! in frames per second.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, OxId, RxId, Wwn};
use unifab_fcoe::fcf::{Fcf, FcfConfig};
use unifab_fcoe::out::{EthBody, EthOut};
use unifab_fcoe::wire::fcoe::decode;
use unifab_fcoe::wire::{
    Descriptor, EtherType, EthernetRepr, FcMap, FipFlags, FipOp, FipRepr, FipSubcode, MacAddr,
    VlanTag,
};

fn data_frame(s_id: FcId, d_id: FcId) -> Frame {
    let h = FcHeaderRepr {
        r_ctl: RCtl::FCP_DATA,
        d_id,
        s_id,
        fc_type: FcType::FCP,
        f_ctl: FCtl(0x88_0008),
        seq_id: 7,
        seq_cnt: 3,
        ox_id: OxId(0x1234),
        rx_id: RxId(0x5678),
        parameter: 8192,
        ..FcHeaderRepr::default()
    };
    Frame::new(h, Bytes::from(vec![0xa5u8; 2048]))
}

fn bench(c: &mut Criterion) {
    let fcf_mac = MacAddr([2, 0, 0, 0, 0xfc, 1]);
    let frame = data_frame(FcId::new(0x010100), FcId::new(0x010200));
    let out = EthOut {
        eth: EthernetRepr {
            dst: fcf_mac,
            src: MacAddr::fpma(FcMap::DEFAULT, FcId::new(0x010100)),
            vlan: Some(VlanTag::fcoe(100)),
            ethertype: EtherType::FCOE,
        },
        body: EthBody::Fcoe(frame.clone()),
    };
    let wire = out.to_bytes().unwrap_or_default();
    let mut buf = vec![0u8; 4096];
    let mut g = c.benchmark_group("fcoe_wire");
    g.throughput(Throughput::Bytes(2048));
    g.bench_function("encapsulate_2k", |b| {
        b.iter(|| black_box(&out).emit(&mut buf).ok())
    });
    let payload = wire.slice(18..);
    g.bench_function("decode_2k", |b| b.iter(|| decode(black_box(&payload)).ok()));

    let adv = FipRepr::new(
        FipOp::DISCOVERY,
        FipSubcode::ADVERTISEMENT,
        FipFlags::FP | FipFlags::A | FipFlags::F,
        vec![
            Descriptor::Priority(128),
            Descriptor::MacAddress(fcf_mac),
            Descriptor::NameIdentifier(Wwn(0x1000_0000_0000_0001)),
            Descriptor::Fabric {
                vf_id: 0,
                fc_map: FcMap::DEFAULT,
                fabric_name: Wwn(0x1000_0000_0000_0001),
            },
            Descriptor::FkaAdvPeriod {
                no_vn_keep_alives: false,
                period_ms: 8000,
            },
        ],
    );
    let mut adv_bytes = vec![0u8; adv.buffer_len()];
    adv.emit(&mut adv_bytes).unwrap_or_default();
    let adv_bytes = Bytes::from(adv_bytes);
    g.throughput(Throughput::Elements(1));
    g.bench_function("fip_advertisement_parse", |b| {
        b.iter(|| FipRepr::parse(black_box(&adv_bytes)).ok())
    });
    g.bench_function("fip_advertisement_emit", |b| {
        b.iter(|| black_box(&adv).emit(&mut buf).ok())
    });

    // The FCF's receive path for data frames of an unknown VN_Port
    // (decode, CRC, lookup, drop): the cost a spoofer imposes per frame.
    let mut fcf = Fcf::new(
        FcfConfig::new(fcf_mac, Some(100), Wwn(0x1000_0000_0000_0001)),
        Instant::now(),
    );
    let now = Instant::now() + Duration::from_secs(1);
    g.throughput(Throughput::Elements(1));
    g.bench_function("fcf_rx_spoofed_2k", |b| {
        b.iter(|| fcf.handle_ethernet(now, black_box(wire.clone())))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
