//! FCIP hot paths: encapsulating and decapsulating a full data frame, the
//! stream decoder, batching with and without compression (database-like
//! pages), and FastWrite's table look-ups.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_benches::pages::Pages;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{FcHeaderRepr, FcId, OxId, RxId};
use unifab_fcip::codec::{Decoder, DecoderConfig};
use unifab_fcip::proto::compress::{Compressor, Mode, decompress};
use unifab_fcip::wire::enhanced::{self, BatchHeader, Reassembly, put_record};
use unifab_fcip::wire::frame::{FcipFrame, FcipFrameRepr};

fn data_frame(n: usize) -> Frame {
    Frame::new(
        FcHeaderRepr {
            r_ctl: RCtl::FCP_DATA,
            d_id: FcId::new(0x020200),
            s_id: FcId::new(0x010200),
            fc_type: FcType::FCP,
            f_ctl: FCtl(FCtl::RELATIVE_OFFSET),
            ox_id: OxId(1),
            rx_id: RxId(2),
            ..FcHeaderRepr::default()
        },
        Bytes::from(vec![0x5a; n]),
    )
}

fn encap(c: &mut Criterion) {
    let f = data_frame(2048);
    let bytes = Bytes::from(FcipFrameRepr::new(f.clone()).to_bytes().unwrap());
    let mut g = c.benchmark_group("fcip_frame");
    g.throughput(Throughput::Bytes(2048));
    g.bench_function("head_tail 2 KiB", |b| {
        b.iter(|| {
            black_box(
                FcipFrameRepr::new(black_box(f.clone()))
                    .head_tail()
                    .unwrap(),
            )
        })
    });
    g.bench_function("parse+check+crc 2 KiB", |b| {
        b.iter(|| {
            let v = FcipFrame::new_checked(black_box(bytes.clone())).unwrap();
            v.check(true).unwrap();
            black_box(v.to_fc_frame().unwrap())
        })
    });
    g.finish();
    let mut stream = Vec::new();
    for _ in 0..64 {
        stream.extend_from_slice(&bytes);
    }
    let mut g = c.benchmark_group("fcip_decoder");
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("64 frames, 64 KiB reads", |b| {
        b.iter(|| {
            let mut d = Decoder::new(DecoderConfig::default());
            let mut n = 0;
            for ch in stream.chunks(65536) {
                d.extend(ch);
                while let Ok(Some(_)) = d.decode() {
                    n += 1;
                }
            }
            assert_eq!(n, 64);
        })
    });
    g.finish();
}

fn batches(c: &mut Criterion) {
    let mut page_data = vec![0u8; 256 * 1024];
    Pages::new().fill(&mut page_data);
    let frames: Vec<Frame> = page_data
        .chunks(2048)
        .map(|ch| {
            let mut f = data_frame(0);
            f.payload = Bytes::copy_from_slice(ch);
            f
        })
        .collect();
    let mut g = c.benchmark_group("fcip_batch_256KiB_pages");
    g.throughput(Throughput::Bytes(page_data.len() as u64));
    g.sample_size(20);
    for (name, mode) in [
        ("none", Mode::None),
        ("lz4", Mode::Lz4),
        ("zstd", Mode::Zstd),
    ] {
        g.bench_function(
            format!("{name}: records+compress+fragment+reassemble+decompress"),
            |b| {
                let mut comp = Compressor::new(mode);
                b.iter(|| {
                    let mut body = BytesMut::with_capacity(300 * 1024);
                    for f in &frames {
                        put_record(&mut body, f, 0);
                    }
                    let raw = body.freeze();
                    let raw_len = raw.len();
                    let (codec, wire) = comp.compress(raw);
                    let h = BatchHeader {
                        codec,
                        seq: 1,
                        raw_len: raw_len as u32,
                        wire_len: wire.len() as u32,
                        ..BatchHeader::default()
                    };
                    let mut r = Reassembly::default();
                    let mut done = None;
                    for f in enhanced::fragments(&h, &wire) {
                        if let Some(x) = r.push(&f).unwrap() {
                            done = Some(x);
                        }
                    }
                    let (h, body) = done.unwrap();
                    let raw = decompress(h.codec, body, h.raw_len as usize).unwrap();
                    black_box(enhanced::records(&raw).unwrap().len())
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, encap, batches);
criterion_main!(benches);
