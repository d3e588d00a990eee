//! Shared set-up of the in-process two-site tests: two switches, each
//! with its controller, a tunnel of two circuits (optionally through the
//! testkit WAN emulator), an FCP target at B and an initiator at A.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::{FcNode, Switch};
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_fcip::io::{CircuitConfig, InterSwitch, LinkMode, Listener, Tunnel, TunnelConfig};
use unifab_fcip::proto::compress;
use unifab_scsi_core::{ItNexus, RemoteLu, Task};
use unifab_testkit::fc;
use unifab_testkit::wan::{WanLink, WanProfile};

pub const SW_A: Wwn = Wwn(0x1000_0000_0000_00a1);
pub const SW_B: Wwn = Wwn(0x1000_0000_0000_00b1);
pub const TARGET: Wwn = Wwn(0x2100_0000_0000_0b0a);
pub const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0a0b);

pub fn nexus() -> ItNexus {
    unifab_testkit::scsi::host_nexus(1)
}

pub fn task(tag: u64, cdb: &[u8], data_out: Option<Bytes>, data_in_len: u32) -> Task {
    unifab_testkit::scsi::task(&nexus(), tag, cdb, data_out, data_in_len)
}

pub struct Sites {
    pub a: Switch,
    pub b: Switch,
    pub ta: Tunnel,
    /// Site B's tunnel and listener.
    pub tb: Tunnel,
    pub listener: Listener,
    pub remote: RemoteLu,
    pub links: Vec<WanLink>,
    _node_b: FcNode,
}

/// Logs to the test's output as `RUST_LOG` says.
pub fn trace() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub async fn sites(mode: LinkMode, fastwrite: bool, compression: compress::Mode) -> Sites {
    sites_via(mode, fastwrite, compression, None).await
}

/// With `wan`, each circuit runs through its own WAN emulator relay.
pub async fn sites_via(
    mode: LinkMode,
    fastwrite: bool,
    compression: compress::Mode,
    wan: Option<WanProfile>,
) -> Sites {
    build(mode, (fastwrite, fastwrite), compression, wan).await
}

/// FastWrite wanted at A and at B separately.
pub async fn build(
    mode: LinkMode,
    fastwrite: (bool, bool),
    compression: compress::Mode,
    wan: Option<WanProfile>,
) -> Sites {
    build_with(mode, fastwrite, compression, wan, |_| {}, |_| {}).await
}

/// As [`build`], with `tweak` applied to both tunnels' configurations and
/// `initiator` to site A's initiator port.
pub async fn build_with(
    mode: LinkMode,
    fastwrite: (bool, bool),
    compression: compress::Mode,
    wan: Option<WanProfile>,
    tweak: impl Fn(&mut TunnelConfig),
    initiator: impl Fn(&mut NPortConfig),
) -> Sites {
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
    tb.fastwrite = fastwrite.1;
    tb.compression = compression;
    tweak(&mut tb);
    let tunnel_b = Tunnel::start(tb, cb);
    let listener = Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        SW_B,
        vec![tunnel_b.clone()],
        None,
    )
    .await
    .unwrap();
    let node_b = FcNode::spawn(&b, "site-b");
    fc::memory_target(&node_b, "fc1/1", TARGET, 16 << 20);
    // Site A: initiator and the connecting tunnel (two circuits).
    let addr = listener.local_addr();
    let links: Vec<WanLink> = match wan {
        Some(p) => (0..2)
            .map(|_| WanLink::start("127.0.0.1:0".parse().unwrap(), addr, p).unwrap())
            .collect(),
        None => Vec::new(),
    };
    let peer = |i: usize| Some(links.get(i).map_or(addr, |l| l.addr()));
    let circuit = |i: usize| CircuitConfig {
        peer: peer(i),
        local: None,
        weight: 1,
    };
    let mut ta = TunnelConfig::new("fcip0", 0, SW_B, vec![circuit(0), circuit(1)]);
    ta.mode = mode;
    ta.fastwrite = fastwrite.0;
    ta.compression = compression;
    tweak(&mut ta);
    let ta = Tunnel::start(ta, ca);
    let node_a = FcNode::spawn(&a, "site-a");
    let mut i = fc::initiator_port(INITIATOR);
    initiator(&mut i);
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
    let remote = fc::remote_lu(&node_a, INITIATOR, TARGET, false, "remote", 128);
    Sites {
        a,
        b,
        ta,
        tb: tunnel_b,
        listener,
        remote,
        links,
        _node_b: node_b,
    }
}
