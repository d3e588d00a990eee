//! Two switches (domains 1 and 2) joined by an FCIP tunnel over loopback
//! TCP: the VE_Ports come up (ELP, ESC, EFP, MR), FSPF routes, the
//! initiator at site A finds the target at site B through GID_FT (the
//! distributed name server), and SCSI writes and reads cross the tunnel —
//! in RFC mode, and in enhanced mode with compression and FastWrite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::{FcNode, FcpInitiatorFactory, Switch};
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_fcip::io::{CircuitConfig, InterSwitch, LinkMode, Listener, Tunnel, TunnelConfig};
use unifab_fcip::proto::compress;
use unifab_scsi_core::backend::MemoryBackend;
use unifab_scsi_core::remote::Identity;
use unifab_scsi_core::{
    Cdb, EmulatedLu, EmulatedLuConfig, ItNexus, LogicalUnit, Lun, RemoteLu, RemoteLuConfig,
    ScsiTarget, Status, TargetPort, Task, TaskAttr, TransportId,
};

const SW_A: Wwn = Wwn(0x1000_0000_0000_00a1);
const SW_B: Wwn = Wwn(0x1000_0000_0000_00b1);
const TARGET: Wwn = Wwn(0x2100_0000_0000_0b0a);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0a0b);

fn nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.io.unifab:host".into(),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.io.unifab:gw,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fn task(tag: u64, cdb: &[u8], data_out: Option<Bytes>, data_in_len: u32) -> Task {
    let (data_out, data_out_len) = match data_out {
        Some(d) => {
            let n = d.len() as u32;
            (vec![d], n)
        }
        None => (Vec::new(), 0),
    };
    Task {
        nexus: nexus(),
        lun: Lun(0),
        tag,
        attr: TaskAttr::Simple,
        priority: 0,
        cdb: Cdb::new(Bytes::copy_from_slice(cdb)),
        data_out,
        data_out_len,
        data_in_len,
    }
}

struct Sites {
    a: Switch,
    b: Switch,
    ta: Tunnel,
    remote: RemoteLu,
    _node_b: FcNode,
}

async fn sites(mode: LinkMode, fastwrite: bool, compression: compress::Mode) -> Sites {
    let a = Switch::new(FabricConfig {
        domain: 1,
        switch_name: SW_A,
        ..FabricConfig::default()
    });
    let b = Switch::new(FabricConfig {
        domain: 2,
        switch_name: SW_B,
        ..FabricConfig::default()
    });
    let ca = InterSwitch::start(a.clone());
    let cb = InterSwitch::start(b.clone());
    // Site B: target and listener.
    let mut tb = TunnelConfig::new(
        "fcip0",
        0,
        SW_A,
        vec![
            CircuitConfig {
                peer: None,
                local: None,
                weight: 1,
            },
            CircuitConfig {
                peer: None,
                local: None,
                weight: 1,
            },
        ],
    );
    tb.mode = mode;
    tb.fastwrite = fastwrite;
    tb.compression = compression;
    let tunnel_b = Tunnel::start(tb, cb);
    let listener = Listener::start("127.0.0.1:0".parse().unwrap(), SW_B, vec![tunnel_b], None)
        .await
        .unwrap();
    let node_b = FcNode::spawn(&b, "site-b");
    let scsi = ScsiTarget::new();
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(16 << 20)),
    )
    .unwrap();
    scsi.insert(Lun(0), Arc::new(lu));
    let mut t = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_0b0a));
    t.target = true;
    node_b.add_port("fc1/1", t, Some(scsi)).unwrap();
    // Site A: initiator and the connecting tunnel (two circuits).
    let addr = listener.local_addr();
    let mut ta = TunnelConfig::new(
        "fcip0",
        0,
        SW_B,
        vec![
            CircuitConfig {
                peer: Some(addr),
                local: None,
                weight: 1,
            },
            CircuitConfig {
                peer: Some(addr),
                local: None,
                weight: 1,
            },
        ],
    );
    ta.mode = mode;
    ta.fastwrite = fastwrite;
    ta.compression = compression;
    let ta = Tunnel::start(ta, ca);
    let node_a = FcNode::spawn(&a, "site-a");
    let mut i = NPortConfig::new(INITIATOR, Wwn(0x2000_0000_0000_0a0b));
    i.initiator = true;
    i.discover = true;
    node_a.add_port("fc1/1", i, None).unwrap();
    assert!(
        node_a
            .wait_for_peer(INITIATOR, TARGET, Duration::from_secs(10))
            .await,
        "the initiator at A never logged in to the target at B: tunnel {:?}\nA routes {:?} remote {:?} logins {:?}\nB routes {:?} remote {:?} logins {:?}",
        ta.stats(),
        a.with_fabric(|f| f.routes()),
        a.with_fabric(|f| f.remote_entries()),
        a.with_fabric(|f| f.logins()),
        b.with_fabric(|f| f.routes()),
        b.with_fabric(|f| f.remote_entries()),
        b.with_fabric(|f| f.logins()),
    );
    let factory = Arc::new(FcpInitiatorFactory::new(node_a, INITIATOR, TARGET, false));
    let remote = RemoteLu::new(
        RemoteLuConfig {
            name: "remote".into(),
            backend: format!("fc://{TARGET}/0"),
            remote_lun: Lun(0),
            identity: Identity::Passthrough,
            task_set_depth: 128,
        },
        factory,
    );
    Sites {
        a,
        b,
        ta,
        remote,
        _node_b: node_b,
    }
}

async fn io(s: &Sites) {
    let t = std::time::Instant::now();
    let r = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    eprintln!("TUR {:?} {:?}", t.elapsed(), r.status);
    eprintln!(
        "A {:?}\nB {:?}\nT {:?}",
        s.a.with_fabric(|f| f.ports()),
        s.b.with_fabric(|f| f.ports()),
        s.ta.stats()
    );
    assert!(r.status == Status::CHECK_CONDITION || r.status == Status::GOOD);
    let data = Bytes::from(
        (0..262_144u32)
            .map(|x| (x / 512 * 13 + x) as u8)
            .collect::<Vec<u8>>(),
    );
    let mut w = vec![0x2a, 0, 0, 0, 0, 16, 0, 0x02, 0, 0];
    let r = s.remote.execute(task(2, &w, Some(data.clone()), 0)).await;
    assert_eq!(
        r.status,
        Status::GOOD,
        "{r:?}\nA {:?}\nB {:?}",
        s.a.with_fabric(|f| f.ports()),
        s.b.with_fabric(|f| f.ports())
    );
    w[0] = 0x28;
    let r = s.remote.execute(task(3, &w, None, 262_144)).await;
    assert_eq!(r.status, Status::GOOD);
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert_eq!(
        got,
        &data[..],
        "what was written through the tunnel reads back"
    );
    // Many small writes at once.
    let mut futs = Vec::new();
    for k in 0..32u32 {
        let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        c[2..6].copy_from_slice(&(4096 + k * 8).to_be_bytes());
        futs.push(s.remote.execute(task(
            100 + u64::from(k),
            &c,
            Some(Bytes::from(vec![k as u8; 4096])),
            0,
        )));
    }
    for f in futs {
        assert_eq!(f.await.status, Status::GOOD);
    }
    for k in 0..32u32 {
        let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        c[2..6].copy_from_slice(&(4096 + k * 8).to_be_bytes());
        let r = s
            .remote
            .execute(task(200 + u64::from(k), &c, None, 4096))
            .await;
        assert!(
            r.data_in
                .iter()
                .flat_map(|x| x.iter())
                .all(|b| *b == k as u8)
        );
    }
}

fn check_fabrics(s: &Sites) {
    // The distributed name server: A knows B's target, B knows A's initiator.
    let ra = s.a.with_fabric(|f| f.remote_entries());
    assert!(ra.iter().any(|e| e.port_name == TARGET), "{ra:?}");
    let rb = s.b.with_fabric(|f| f.remote_entries());
    assert!(rb.iter().any(|e| e.port_name == INITIATOR), "{rb:?}");
    assert_eq!(s.a.with_fabric(|f| f.routes()).len(), 1);
    let st = s.ta.stats();
    assert!(st.state.starts_with("up (domain 2"), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_mode_carries_scsi_between_sites() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let t = std::time::Instant::now();
    let s = sites(LinkMode::Rfc, false, compress::Mode::None).await;
    eprintln!("up after {:?}", t.elapsed());
    check_fabrics(&s);
    io(&s).await;
    eprintln!("io after {:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_mode_with_fastwrite_and_compression() {
    let s = sites(LinkMode::Enhanced, true, compress::Mode::Lz4).await;
    check_fabrics(&s);
    io(&s).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let st = s.ta.stats();
    assert!(st.fastwrite, "{st:?}");
    assert!(st.fastwrite_writes >= 33, "{st:?}");
    assert!(st.wire_bytes < st.raw_bytes, "{st:?}");
}
