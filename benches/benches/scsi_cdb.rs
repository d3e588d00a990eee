//! CDB decoding and encoding, ns per CDB.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use unifab_scsi_core::Command;

fn cdbs() -> Vec<(&'static str, Vec<u8>)> {
    let mut read10 = vec![0x28, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0];
    read10[1] = 0;
    let mut write16 = vec![0u8; 16];
    write16[0] = 0x8a;
    write16[9] = 0x80;
    write16[13] = 8;
    let inquiry = vec![0x12, 1, 0x83, 0, 0xff, 0];
    let mut rsoc = vec![0u8; 12];
    rsoc[0] = 0xa3;
    rsoc[1] = 0x0c;
    rsoc[9] = 0xff;
    vec![
        ("read10", read10),
        ("write16", write16),
        ("inquiry", inquiry),
        ("rsoc", rsoc),
    ]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("scsi_cdb");
    g.throughput(Throughput::Elements(1));
    for (name, cdb) in cdbs() {
        g.bench_function(format!("parse/{name}"), |b| {
            b.iter(|| Command::parse(black_box(&cdb)))
        });
        let cmd = Command::parse(&cdb).expect("valid");
        g.bench_function(format!("emit/{name}"), |b| {
            let mut out = [0u8; 16];
            b.iter(|| black_box(&cmd).emit(&mut out))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
