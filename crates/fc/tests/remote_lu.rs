//! A scsi-core `RemoteLu` on top of FCP: front-end tasks go through the
//! FCP initiator engine (an NPIV port per front-end nexus), the switch,
//! and the FCP target engine to an emulated LU — on the tokio drivers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::fabric::LoginKind;
use unifab_fc::io::{FcNode, Switch, virtual_port_name};
use unifab_fc::wire::Wwn;
use unifab_scsi_core::{ItNexus, LogicalUnit, RemoteLu, Status};

const TARGET: Wwn = Wwn(0x2100_0000_0000_0a01);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0b01);

use unifab_testkit::fc;
use unifab_testkit::scsi::{host_nexus as front_nexus, task};

/// A node with an FCP target port (a 16 MiB memory LU) and an initiator
/// port on a switch, and a `RemoteLu` over it with an NPIV port per
/// front-end nexus.
async fn rig() -> (Switch, RemoteLu) {
    let switch = Switch::new(FabricConfig::default());
    let node = FcNode::spawn(&switch, "gateway");
    fc::memory_target(&node, "fc-target", TARGET, 16 << 20);
    node.add_port("fc-initiator", fc::initiator_port(INITIATOR), None)
        .unwrap();
    assert!(
        node.wait_for_peer(INITIATOR, TARGET, Duration::from_secs(5))
            .await
    );
    let remote = fc::remote_lu(&node, INITIATOR, TARGET, true, "remote", 128);
    (switch, remote)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_lu_over_fcp_with_a_port_per_front_end_nexus() {
    let (switch, remote) = rig().await;
    let (a, b) = (front_nexus(1), front_nexus(2));
    // Each front-end nexus starts with its own unit attention, from its
    // own NPIV port's new nexus at the target.
    for n in [&a, &b] {
        let r = remote.execute(task(n, 1, &[0; 6], None, 0)).await;
        assert_eq!(r.status, Status::CHECK_CONDITION);
        assert_eq!(r.sense.unwrap()[2] & 0x0f, 6);
    }
    let data = Bytes::from((0..65536u32).map(|x| (x * 7) as u8).collect::<Vec<u8>>());
    let mut w = vec![0x2a, 0, 0, 0, 0, 16, 0, 0, 128, 0];
    let r = remote.execute(task(&a, 2, &w, Some(data.clone()), 0)).await;
    assert_eq!(r.status, Status::GOOD);
    w[0] = 0x28;
    let r = remote.execute(task(&b, 3, &w, None, 65536)).await;
    assert_eq!(r.status, Status::GOOD);
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert_eq!(got, &data[..], "b reads what a wrote");
    // Many commands at once: every answer comes back, in any order.
    let mut futs = Vec::new();
    for k in 0..64u32 {
        let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        c[2..6].copy_from_slice(&(k * 8).to_be_bytes());
        futs.push(remote.execute(task(&a, 100 + u64::from(k), &c, None, 4096)));
    }
    for f in futs {
        assert_eq!(f.await.status, Status::GOOD);
    }
    // The fabric holds the physical ports (FLOGI) and one NPIV port per
    // front-end nexus (FDISC), named after the front-end ports.
    let logins = switch.with_fabric(|f| f.logins());
    let fdisc: Vec<Wwn> = logins
        .iter()
        .filter(|l| l.kind == LoginKind::Fdisc)
        .map(|l| l.port_name)
        .collect();
    assert_eq!(fdisc.len(), 2);
    assert!(fdisc.contains(&virtual_port_name(INITIATOR, a.initiator())));
    assert!(fdisc.contains(&virtual_port_name(INITIATOR, b.initiator())));
    assert_eq!(
        logins.iter().filter(|l| l.kind == LoginKind::Flogi).count(),
        2
    );
    // The last nexus loss of a front-end port logs its NPIV port out.
    remote.nexus_loss(&a);
    let gone = virtual_port_name(INITIATOR, a.initiator());
    for _ in 0..200 {
        if switch.with_fabric(|f| f.logins().iter().all(|l| l.port_name != gone)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(switch.with_fabric(|f| f.logins().iter().all(|l| l.port_name != gone)));
    assert_eq!(switch.link_drops(), 0);
}

/// Host sessions come and go, each through an NPIV port of its own that
/// takes the place (and often the address) a gone one had: every
/// command's frames still reach the port that sent it, and a long-lived
/// session beside them is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_that_come_and_go_get_their_own_frames() {
    let (switch, remote) = rig().await;
    let stay = front_nexus(200);
    // Its unit attention first.
    remote.execute(task(&stay, 1, &[0; 6], None, 0)).await;
    let mut tag = 10u64;
    // Up to four sessions live, ended out of the order they began in, so
    // places and addresses change hands between ports.
    let mut live: Vec<(u8, ItNexus)> = Vec::new();
    for n in 0..60u8 {
        let host = front_nexus(n);
        tag += 1;
        let r = remote.execute(task(&host, tag, &[0; 6], None, 0)).await;
        assert_eq!(
            r.status,
            Status::CHECK_CONDITION,
            "session {n}: its unit attention"
        );
        // A block of its own, written through its own port.
        let w = vec![0x2a, 0, 0, 0, 0, n, 0, 0, 1, 0];
        tag += 1;
        let r = remote
            .execute(task(&host, tag, &w, Some(Bytes::from(vec![n; 512])), 0))
            .await;
        assert_eq!(r.status, Status::GOOD, "session {n}: write");
        live.push((n, host));
        // Every live session and the long-lived one read every live
        // session's block at once.
        let mut reads = Vec::new();
        for (m, _) in &live {
            let r = vec![0x28, 0, 0, 0, 0, *m, 0, 0, 1, 0];
            for (_, who) in live.iter().chain([&(200, stay.clone())]) {
                tag += 1;
                reads.push((*m, remote.execute(task(who, tag, &r, None, 512))));
            }
        }
        for (m, f) in reads {
            let r = f.await;
            assert_eq!(r.status, Status::GOOD, "block {m} after session {n}");
            let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
            assert_eq!(got, vec![m; 512], "block {m} after session {n}");
        }
        if live.len() == 4 {
            let (_, gone) = live.remove(usize::from(n) * 7 % 4);
            remote.nexus_loss(&gone);
        }
    }
    assert_eq!(switch.link_drops(), 0);
}
