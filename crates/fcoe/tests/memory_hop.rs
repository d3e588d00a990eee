//! Two gateways' worth of tokio drivers on an in-memory Ethernet segment:
//! an FCF in front of a switch with an FCP target, and an ENode carrying
//! another node's FCP initiator (and its NPIV ports) to it. SCSI I/O
//! through a `RemoteLu` crosses FIP logins and FCoE; then the FCF clears
//! the virtual links and the initiator recovers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::{FabricConfig, LoginKind};
use unifab_fc::io::{FcNode, Switch};
use unifab_fc::wire::Wwn;
use unifab_fcoe::enode::EnodeConfig;
use unifab_fcoe::fcf::FcfConfig;
use unifab_fcoe::io::{spawn_enode, spawn_fcf};
use unifab_fcoe::link::memory::MemorySegment;
use unifab_fcoe::wire::MacAddr;
use unifab_scsi_core::{LogicalUnit, Status};

const TARGET: Wwn = Wwn(0x2100_0000_0000_0a01);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0b01);
const FCF_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0xfc, 1]);
const ENODE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0xe0, 1]);

use unifab_testkit::fc;
use unifab_testkit::scsi::{host_nexus as nexus, task};

async fn until(f: impl FnMut() -> bool, what: &str) {
    assert!(
        fc::eventually(Duration::from_secs(10), f).await,
        "never happened: {what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scsi_through_fip_and_fcoe_on_a_memory_segment() {
    let segment = MemorySegment::new();
    // Side B: fabric, FCP target, FCF.
    let switch = Switch::new(FabricConfig::default());
    let node_b = FcNode::spawn(&switch, "b");
    fc::memory_target(&node_b, "fc1/1", TARGET, 16 << 20);
    let fcf = spawn_fcf(
        FcfConfig::new(FCF_MAC, Some(100), Wwn(0x1000_0000_0000_0001)),
        segment.attach(FCF_MAC, "b"),
        switch.clone(),
        "eth-b",
    );
    // Side A: an initiator node whose port goes through the ENode.
    let a_switch = Switch::new(FabricConfig::default());
    let node_a = FcNode::spawn(&a_switch, "a");
    let mut ec = EnodeConfig::new(ENODE_MAC, Wwn(0x2000_0000_0000_0b01), None);
    ec.vlan_discovery = true;
    let (connect, enode) = spawn_enode(ec, segment.attach(ENODE_MAC, "a"), "eth-a");
    node_a
        .add_port_via("eth-a", fc::initiator_port(INITIATOR), None, connect)
        .unwrap();
    assert!(
        node_a
            .wait_for_peer(INITIATOR, TARGET, Duration::from_secs(10))
            .await,
        "the initiator never reached the target through FCoE"
    );
    assert_eq!(enode.vlan(), Some(100), "VLAN discovery");
    assert_eq!(enode.fcf().unwrap().mac, FCF_MAC);

    let remote = fc::remote_lu(&node_a, INITIATOR, TARGET, true, "remote", 128);
    let a = nexus(1);
    let r = remote.execute(task(&a, 1, &[0; 6], None, 0)).await;
    assert_eq!(r.status, Status::CHECK_CONDITION, "unit attention first");
    let data = Bytes::from((0..262_144u32).map(|x| (x * 13) as u8).collect::<Vec<u8>>());
    let mut w = vec![0x2a, 0, 0, 0, 0, 16, 0, 0x02, 0, 0];
    let r = remote.execute(task(&a, 2, &w, Some(data.clone()), 0)).await;
    assert_eq!(r.status, Status::GOOD);
    w[0] = 0x28;
    let r = remote.execute(task(&a, 3, &w, None, 262_144)).await;
    assert_eq!(r.status, Status::GOOD);
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert!(got == data[..], "read back differs");
    // The NPIV port of the front-end nexus logged in with FIP FDISC.
    let vn = fcf.vn_ports();
    assert_eq!(vn.len(), 2, "{vn:?}");
    assert_eq!(vn.iter().filter(|v| v.npiv).count(), 1);
    assert!(vn.iter().all(|v| v.enode == ENODE_MAC));
    let logins = switch.with_fabric(|f| f.logins());
    assert_eq!(
        logins.iter().filter(|l| l.kind == LoginKind::Fdisc).count(),
        1
    );
    assert_eq!(enode.vn_ports().len(), 2);

    // Bad input from a stranger on the segment does not disturb the I/O.
    let mut spoof = vec![0u8; 80];
    spoof[..6].copy_from_slice(&FCF_MAC.0);
    spoof[6..12].copy_from_slice(&vn[0].mac.0);
    spoof[12..14].copy_from_slice(&[0x89, 0x06]);
    segment.inject(Bytes::from(spoof));

    // CVL: the ENode loses its logins, finds the FCF again, logs back in.
    let logins_before = fcf.counters().logins;
    let node_b2 = node_b.clone();
    until(|| !node_b2.ports().is_empty(), "target port").await;
    let cvl = fcf.counters().cvl_sent;
    // Stopping the FCF clears every virtual link, then a new FCF serves.
    fcf.stop().await;
    assert!(fcf.counters().cvl_sent > cvl);
    until(|| enode.counters().cvl_received >= 1, "ENode saw the CVL").await;
    let fcf2 = spawn_fcf(
        FcfConfig::new(FCF_MAC, Some(100), Wwn(0x1000_0000_0000_0001)),
        segment.attach(FCF_MAC, "b2"),
        switch.clone(),
        "eth-b",
    );
    until(|| fcf2.vn_ports().len() == 2, "logins again after recovery").await;
    assert!(fcf2.counters().logins >= 2 && logins_before >= 2);
    let mut r = remote.execute(task(&a, 4, &w, None, 262_144)).await;
    for tag in 5..200 {
        if r.status == Status::GOOD {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = remote.execute(task(&a, tag, &w, None, 262_144)).await;
    }
    assert_eq!(r.status, Status::GOOD, "no I/O after recovery");
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert!(got == data[..], "read back after recovery differs");
    enode.stop().await;
    fcf2.stop().await;
}
