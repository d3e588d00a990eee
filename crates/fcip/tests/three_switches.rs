//! Three switches in a chain, A (domain 1) — B (domain 2) — C (domain 3),
//! joined by two FCIP tunnels: FSPF gives A a route to C through B, the
//! name server at A learns C's target across B, and SCSI I/O crosses both
//! tunnels. A fourth switch that claims domain 1 again is isolated with
//! the reason, and nobody's fabric changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::{FcNode, Switch};
use unifab_fc::wire::Wwn;
use unifab_fcip::io::{CircuitConfig, InterSwitch, Listener, Tunnel, TunnelConfig};
use unifab_scsi_core::{LogicalUnit, Status, Task};
use unifab_testkit::fc;

const TARGET: Wwn = Wwn(0x2100_0000_0000_0c0a);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0a0b);

fn sw(domain: u8) -> (Switch, InterSwitch, Wwn) {
    let name = Wwn(0x1000_0000_0000_0000 | u64::from(domain) << 4 | 1);
    let s = Switch::new(FabricConfig {
        domain,
        switch_name: name,
        ..FabricConfig::default()
    });
    let c = InterSwitch::start(s.clone());
    (s, c, name)
}

fn accepting(name: &str, n: u32, peer: Wwn) -> TunnelConfig {
    TunnelConfig::new(
        name,
        n,
        peer,
        vec![CircuitConfig {
            peer: None,
            local: None,
            weight: 1,
        }],
    )
}

fn connecting(name: &str, n: u32, peer: Wwn, to: std::net::SocketAddr) -> TunnelConfig {
    TunnelConfig::new(
        name,
        n,
        peer,
        vec![CircuitConfig {
            peer: Some(to),
            local: None,
            weight: 1,
        }],
    )
}

fn task(tag: u64, cdb: &[u8], data: Option<Bytes>, data_in: u32) -> Task {
    unifab_testkit::scsi::task(
        &unifab_testkit::scsi::host_nexus(1),
        tag,
        cdb,
        data,
        data_in,
    )
}

async fn wait(f: impl FnMut() -> bool) -> bool {
    fc::eventually(Duration::from_secs(5), f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_three_switches_routes_and_finds_across_the_middle() {
    let (a, ca, wa) = sw(1);
    let (b, cb, wb) = sw(2);
    let (c, cc, wc) = sw(3);
    // B accepts from A and from C.
    let b_from_a = Tunnel::start(accepting("to-a", 0, wa), cb.clone());
    let b_from_c = Tunnel::start(accepting("to-c", 1, wc), cb.clone());
    let lb = Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        wb,
        vec![b_from_a, b_from_c],
        None,
    )
    .await
    .unwrap();
    let ta = Tunnel::start(connecting("to-b", 0, wb, lb.local_addr()), ca.clone());
    let tc = Tunnel::start(connecting("to-b", 0, wb, lb.local_addr()), cc.clone());
    // Target at C, initiator at A.
    let node_c = FcNode::spawn(&c, "site-c");
    fc::memory_target(&node_c, "fc1/1", TARGET, 8 << 20);
    assert!(
        wait(|| ca.routes().contains_key(&3) && cc.routes().contains_key(&1)).await,
        "FSPF: A {:?}, B {:?}, C {:?}; tunnels {:?} {:?}",
        ca.routes(),
        cb.routes(),
        cc.routes(),
        ta.stats().state,
        tc.stats().state
    );
    // A reaches 2 and 3 through the same port (its only tunnel).
    let ra = a.with_fabric(|f| f.routes());
    assert_eq!(ra.len(), 2);
    assert_eq!(ra[0].1, ra[1].1);
    let node_a = FcNode::spawn(&a, "site-a");
    node_a
        .add_port("fc1/1", fc::initiator_port(INITIATOR), None)
        .unwrap();
    assert!(
        node_a
            .wait_for_peer(INITIATOR, TARGET, Duration::from_secs(10))
            .await,
        "A's name server: {:?}",
        a.with_fabric(|f| f.remote_entries())
    );
    let remote = fc::remote_lu(&node_a, INITIATOR, TARGET, false, "far", 32);
    let _ = remote.execute(task(1, &[0; 6], None, 0)).await;
    let data = Bytes::from(vec![0x3c; 8192]);
    let r = remote
        .execute(task(
            2,
            &[0x2a, 0, 0, 0, 0, 8, 0, 0, 16, 0],
            Some(data.clone()),
            0,
        ))
        .await;
    assert_eq!(r.status, Status::GOOD);
    let r = remote
        .execute(task(3, &[0x28, 0, 0, 0, 0, 8, 0, 0, 16, 0], None, 8192))
        .await;
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert_eq!(got, &data[..]);
    // B, in the middle, sees both ends' ports.
    let rb = b.with_fabric(|f| f.remote_entries());
    assert!(
        rb.iter().any(|e| e.port_name == TARGET) && rb.iter().any(|e| e.port_name == INITIATOR)
    );

    // A fourth switch with domain 1 (another name): isolated, nothing changes.
    let (d, cd, _) = {
        let name = Wwn(0x1000_0000_0000_0d01);
        let s = Switch::new(FabricConfig {
            domain: 1,
            switch_name: name,
            ..FabricConfig::default()
        });
        let c = InterSwitch::start(s.clone());
        (s, c, name)
    };
    let b_from_d = Tunnel::start(accepting("to-d", 2, Wwn(0x1000_0000_0000_0d01)), cb.clone());
    let lb2 = Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        wb,
        vec![b_from_d.clone()],
        None,
    )
    .await
    .unwrap();
    let td = Tunnel::start(connecting("to-b", 0, wb, lb2.local_addr()), cd.clone());
    assert!(
        wait(|| td.stats().state.starts_with("isolated")).await,
        "{:?}",
        td.stats()
    );
    let why = td.stats().state;
    assert!(why.contains("domain ID conflict: domain 1"), "{why}");
    assert!(wait(|| b_from_d.stats().state.starts_with("isolated")).await);
    assert!(d.with_fabric(|f| f.routes()).is_empty());
    assert_eq!(
        b.with_fabric(|f| f.routes()).len(),
        2,
        "B's fabric is undisturbed"
    );
    let r = remote
        .execute(task(4, &[0x28, 0, 0, 0, 0, 8, 0, 0, 16, 0], None, 8192))
        .await;
    assert_eq!(r.status, Status::GOOD, "I/O across the chain goes on");
}
