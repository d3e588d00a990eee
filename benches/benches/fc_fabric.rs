//! Fabric routing: frames per second through the sans-IO fabric (D_ID
//! lookup, source check, zoning) with and without an active zone set of
//! 64 zones, and through the switch into an in-memory link.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use unifab_fc::compose::{self, Route};
use unifab_fc::fabric::zoning::{Zone, ZoneMember, ZoneSet};
use unifab_fc::fabric::{Fabric, FabricConfig, PortIndex};
use unifab_fc::io::{MemoryLink, Switch};
use unifab_fc::link::FcLink;
use unifab_fc::wire::els::{ElsRepr, LoginParams};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, OxId, RxId, Wwn};

/// Logs `wwpn` in on a new port; returns the port and its FC_ID.
fn login(f: &mut Fabric, wwpn: u64) -> (PortIndex, FcId) {
    let p = f.attach(&format!("p{wwpn}"));
    let flogi = compose::els(
        Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(1)),
        &ElsRepr::Flogi(LoginParams::n_port(Wwn(wwpn), Wwn(wwpn + 1), 2048, 2000)),
    )
    .expect("FLOGI");
    f.handle_frame(Instant::now(), p, flogi);
    let mut id = FcId::UNIDENTIFIED;
    while let Some((_, fr)) = f.poll_transmit() {
        id = fr.header.d_id;
    }
    (p, id)
}

fn data_frame(s: FcId, d: FcId) -> Frame {
    Frame::new(
        FcHeaderRepr {
            r_ctl: RCtl::FCP_DATA,
            d_id: d,
            s_id: s,
            fc_type: FcType::FCP,
            f_ctl: FCtl(0x88_0008),
            ox_id: OxId(5),
            rx_id: RxId(6),
            ..FcHeaderRepr::default()
        },
        Bytes::from(vec![0u8; 2048]),
    )
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("fc_fabric");
    g.throughput(Throughput::Elements(1));
    for zoned in [false, true] {
        let mut f = Fabric::new(FabricConfig::default());
        let (pa, a) = login(&mut f, 0x2100_0000_0000_0001);
        let (_pb, b) = login(&mut f, 0x2100_0000_0000_0002);
        if zoned {
            let mut names = Vec::new();
            for z in 0..64u64 {
                let name = format!("z{z}");
                f.define_zone(Zone {
                    name: name.clone(),
                    members: vec![
                        ZoneMember::PortName(Wwn(0x2100_0000_0000_1000 + z)),
                        ZoneMember::PortName(Wwn(if z == 63 {
                            0x2100_0000_0000_0001
                        } else {
                            0x2100_0000_0000_2000 + z
                        })),
                        ZoneMember::PortName(Wwn(if z == 63 {
                            0x2100_0000_0000_0002
                        } else {
                            0x2100_0000_0000_3000 + z
                        })),
                    ],
                });
                names.push(name);
            }
            f.define_zone_set(ZoneSet {
                name: "cfg".into(),
                zones: names,
            });
            let _ = f.activate_zone_set("cfg");
            while f.poll_transmit().is_some() {}
        }
        let frame = data_frame(a, b);
        let name = if zoned { "route_zoned_64" } else { "route" };
        g.bench_function(name, |bch| {
            let now = Instant::now();
            bch.iter(|| {
                f.handle_frame(now, pa, frame.clone());
                f.poll_transmit()
            })
        });
    }
    // Through the switch (lock, route, hand to the destination link) and
    // out of the link's channel.
    let switch = Switch::new(FabricConfig::default());
    let (la, _ra) = MemoryLink::pair(1024, "a");
    let (lb, mut rb) = MemoryLink::pair(1024, "b");
    let pa = switch.attach("a", Arc::new(la));
    let _pb = switch.attach("b", Arc::new(lb));
    let flogi = |w: u64| {
        compose::els(
            Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(1)),
            &ElsRepr::Flogi(LoginParams::n_port(Wwn(w), Wwn(w + 1), 2048, 2000)),
        )
        .expect("FLOGI")
    };
    let _ = pa.transmit(flogi(0x2100_0000_0000_0001));
    let _ = _pb.transmit(flogi(0x2100_0000_0000_0002));
    while rb.try_recv().is_ok() {}
    let ids = switch.with_fabric(|f| f.logins());
    let (a, b) = (ids[0].fc_id, ids[1].fc_id);
    let frame = data_frame(a, b);
    g.bench_function("switch_to_memory_link", |bch| {
        bch.iter(|| {
            let _ = pa.transmit(frame.clone());
            rb.try_recv().ok()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
