//! CRC32C (header and data digests) on 48 B, 8 KiB and 256 KiB.
//! Throughput in bytes. The `crc32c` crate picks its SSE4.2 path at run
//! time; the bench prints which one this CPU gets.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use unifab_iscsi::wire::digest::crc32c;

fn bench(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    eprintln!(
        "crc32c: SSE4.2 {}",
        if is_x86_feature_detected!("sse4.2") {
            "available (hardware path)"
        } else {
            "absent (software path)"
        }
    );
    let mut g = c.benchmark_group("iscsi_crc32c");
    for len in [48usize, 8 * 1024, 256 * 1024] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &data, |b, d| {
            b.iter(|| crc32c(black_box(d)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
