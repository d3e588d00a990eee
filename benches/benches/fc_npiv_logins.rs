//! Hosts joining a fabric one after another: a target port, then N
//! initiator-only ports that each log in (FLOGI), register, register for
//! RSCNs and discover, on the sans-IO fabric, every frame pumped in one
//! thread until nothing moves. With `restrict_login` (what the gateway's
//! per-host NPIV ports use) each port asks GFF_ID about a port an RSCN
//! names and logs into targets alone; without it each port logs into
//! every other and answers each RSCN with a whole GID_FT. The time per
//! bring-up of the whole fabric, both ways, in one run.

use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use unifab_fc::fabric::{Fabric, FabricConfig, PortIndex};
use unifab_fc::nport::{NPort, NPortConfig};
use unifab_fc::wire::Wwn;

/// Brings up a target and `hosts` initiator ports, each after the last has
/// settled; returns the frames that crossed the fabric.
fn bring_up(hosts: u64, restrict: bool) -> u64 {
    let now = Instant::now();
    let mut fabric = Fabric::new(FabricConfig::default());
    let mut ports: Vec<(NPort, PortIndex)> = Vec::new();
    let mut frames = 0u64;
    let add = |fabric: &mut Fabric, ports: &mut Vec<(NPort, PortIndex)>, cfg: NPortConfig| {
        let p = fabric.attach("p");
        let mut n = NPort::new(cfg);
        n.link_up(now);
        ports.push((n, p));
    };
    let pump = |fabric: &mut Fabric, ports: &mut Vec<(NPort, PortIndex)>, frames: &mut u64| loop {
        let mut moved = false;
        for (n, p) in ports.iter_mut() {
            while let Some(f) = n.poll_transmit() {
                moved = true;
                *frames += 1;
                fabric.handle_frame(now, *p, f);
            }
            while n.poll_event().is_some() {}
        }
        while let Some((p, f)) = fabric.poll_transmit() {
            moved = true;
            if let Some((n, _)) = ports.iter_mut().find(|(_, q)| *q == p) {
                n.handle_frame(now, f);
            }
        }
        if !moved {
            return;
        }
    };
    let mut t = NPortConfig::new(Wwn(0x2100_0000_0000_00a1), Wwn(0x2000_0000_0000_00a1));
    t.target = true;
    add(&mut fabric, &mut ports, t);
    pump(&mut fabric, &mut ports, &mut frames);
    for h in 0..hosts {
        let wwpn = 0x3000_0000_0000_0000 + h;
        let mut c = NPortConfig::new(Wwn(wwpn), Wwn(wwpn ^ 0x0100_0000_0000_0000));
        c.initiator = true;
        c.discover = true;
        c.restrict_login = restrict;
        add(&mut fabric, &mut ports, c);
        pump(&mut fabric, &mut ports, &mut frames);
    }
    frames
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("fc_npiv_logins");
    g.sample_size(10);
    for hosts in [50u64, 100] {
        for (name, restrict) in [("restrict_login", true), ("log_into_all", false)] {
            eprintln!(
                "{hosts} hosts, {name}: {} frames through the fabric",
                bring_up(hosts, restrict)
            );
            g.bench_with_input(BenchmarkId::new(name, hosts), &hosts, |b, &hosts| {
                b.iter(|| bring_up(hosts, restrict));
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
