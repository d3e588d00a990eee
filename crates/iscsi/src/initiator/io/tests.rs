//! The driver over real TCP against unifab's own target server, with a
//! fault-injecting relay in between where a test needs one.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use unifab_scsi_core::backend::MemoryBackend;
use unifab_scsi_core::emulated::{EmulatedLu, EmulatedLuConfig};
use unifab_scsi_core::target::ScsiTarget;
use unifab_scsi_core::{LogicalUnit, Status, Task, TaskResult};
use unifab_testkit::relay::TcpRelay;

use super::*;
use crate::target::server::{ChapSettings, ServerConfig, TargetNode, TargetServer};
use unifab_scsi_core::Dispatch;

const IQN: &str = "iqn.2026-11.io.unifab:unit";

struct Target {
    addr: SocketAddr,
    server: TargetServer,
    _stop: watch::Sender<bool>,
}

async fn target(chap: Option<ChapSettings>, digests: Option<Vec<Digest>>) -> Target {
    let mut sc = ServerConfig::default();
    if let Some(d) = digests {
        sc.negotiation.header_digests = d.clone();
        sc.negotiation.data_digests = d;
    }
    serve(memory_lun0(64 << 20), sc, chap).await
}

/// A SCSI target whose LUN 0 is a memory LU of `size` bytes.
fn memory_lun0(size: u64) -> Arc<ScsiTarget> {
    let scsi = Arc::new(ScsiTarget::new());
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(size)),
    )
    .unwrap();
    scsi.insert(Lun(0), Arc::new(lu) as Arc<dyn LogicalUnit>);
    scsi
}

/// An iSCSI target server on 127.0.0.1 with one node, `IQN`.
async fn serve(scsi: Arc<dyn Dispatch>, sc: ServerConfig, chap: Option<ChapSettings>) -> Target {
    let (server, listeners) = TargetServer::bind(
        &["127.0.0.1:0".parse().unwrap()],
        sc,
        vec![TargetNode {
            name: IQN.into(),
            alias: None,
            scsi,
            allow: None,
            chap,
        }],
    )
    .await
    .unwrap();
    let (tx, rx) = watch::channel(false);
    let s2 = server.clone();
    tokio::spawn(async move { s2.run(listeners, rx).await });
    Target {
        addr: server.local_addrs()[0],
        server,
        _stop: tx,
    }
}

/// The target's session table once the login has registered there (the
/// initiator may be in full feature phase a moment before).
async fn settled_sessions(t: &Target) -> Vec<crate::target::io::SessionInfo> {
    for _ in 0..500 {
        let s = t.server.sessions();
        if !s.is_empty() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the target never listed the session");
}

fn cfg() -> InitiatorConfig {
    let mut c = InitiatorConfig::new("iqn.2026-11.io.unifab:unit-initiator");
    c.session.command_timeout = Duration::from_secs(5);
    c.session.nop_interval = Some(Duration::from_millis(500));
    c.session.nop_timeout = Duration::from_secs(1);
    c.login_timeout = Duration::from_secs(2);
    c.reconnect_min = Duration::from_millis(20);
    c.reconnect_max = Duration::from_millis(200);
    c
}

fn write16(lba: u64, data: Bytes) -> Request {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&((data.len() / 512) as u32).to_be_bytes());
    Request::with_data_out(Lun(0), Bytes::copy_from_slice(&cdb), data)
}

fn read16(lba: u64, blocks: u32) -> Request {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    Request::new(Lun(0), Bytes::copy_from_slice(&cdb), blocks * 512)
}

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8)
        .collect::<Vec<_>>()
        .into()
}

fn flat(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

/// Awaits an outcome, failing the test (not hanging) if the initiator
/// broke its promise that every command ends.
async fn outcome(s: Submitted) -> Outcome {
    tokio::time::timeout(Duration::from_secs(60), s.outcome)
        .await
        .expect("a command never ended")
}

/// TEST UNIT READY until GOOD (the first answer is the power-on UA).
async fn ready(ini: &IscsiInitiator) {
    for _ in 0..5 {
        let r = outcome(ini.submit(Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0))).await;
        if r.is_ok_and(|r| r.status == Status::GOOD) {
            return;
        }
    }
    panic!("never ready");
}

async fn verified_io(ini: &IscsiInitiator, base: u64, seed: u32) {
    let mut writes = Vec::new();
    for i in 0..32u64 {
        let data = pattern(64 * 1024, seed + i as u32);
        writes.push((
            base + i * 128,
            data.clone(),
            ini.submit(write16(base + i * 128, data)),
        ));
    }
    let mut reads = Vec::new();
    for (lba, data, w) in writes {
        let r = outcome(w).await.unwrap();
        assert_eq!(r.status, Status::GOOD);
        reads.push((data, ini.submit(read16(lba, 128))));
    }
    for (data, r) in reads {
        let r = outcome(r).await.unwrap();
        assert_eq!(r.status, Status::GOOD);
        assert!(flat(&r) == data.to_vec(), "read back what was written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_verified_io_over_tcp() {
    let t = target(None, None).await;
    let ini = IscsiInitiator::start(cfg(), &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    verified_io(&ini, 0, 1).await;
    assert_eq!(ini.logins(), 1);
    assert_eq!(settled_sessions(&t).await.len(), 1);
    assert_eq!(
        t.server.sessions()[0].initiator,
        "iqn.2026-11.io.unifab:unit-initiator"
    );
    ini.close();
    // The logout ends the target's session.
    for _ in 0..200 {
        if t.server.sessions().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(t.server.sessions().is_empty(), "logged out");
    assert_eq!(
        outcome(ini.submit(read16(0, 1))).await.unwrap_err(),
        InitiatorError::Closed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_mutual_chap_and_digests() {
    let secret = b"initiator-secret-1".to_vec();
    let tsecret = b"target-secret-12345".to_vec();
    // One-way CHAP.
    let t = target(
        Some(ChapSettings {
            user: "alice".into(),
            secret: secret.clone(),
            mutual: None,
        }),
        None,
    )
    .await;
    let mut c = cfg();
    c.chap = Some(ChapCredentials::new("alice", secret.clone()));
    let ini = IscsiInitiator::start(c, &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    ini.close();
    // A wrong secret fails the login for good: commands fail at once with
    // the reason instead of waiting for their timeout.
    let mut c = cfg();
    c.chap = Some(ChapCredentials::new("alice", b"wrong-secret-123".to_vec()));
    c.session.command_timeout = Duration::from_secs(3600);
    let bad = IscsiInitiator::start(c, &t.addr.to_string(), IQN);
    let e = bad
        .wait_connected(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(e, InitiatorError::Unreachable { .. }), "{e}");
    let e = outcome(bad.submit(read16(0, 1))).await.unwrap_err();
    assert!(
        matches!(e, InitiatorError::Unreachable { ref reason } if reason.contains("authentication failure (status 0x0201)")),
        "{e}"
    );
    bad.close();

    // Mutual CHAP with CRC32C digests required by the target.
    let t = target(
        Some(ChapSettings {
            user: "alice".into(),
            secret: secret.clone(),
            mutual: Some(("tgt".into(), tsecret.clone())),
        }),
        Some(vec![Digest::Crc32c]),
    )
    .await;
    let mut c = cfg().digests(
        &[Digest::Crc32c, Digest::None],
        &[Digest::Crc32c, Digest::None],
    );
    c.chap = Some(ChapCredentials::new("alice", secret.clone()));
    c.mutual_chap = Some(ChapCredentials::new("tgt", tsecret.clone()));
    let ini = IscsiInitiator::start(c, &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        settled_sessions(&t).await[0].digests,
        "header=CRC32C,data=CRC32C"
    );
    ready(&ini).await;
    verified_io(&ini, 4096, 7).await;
    ini.close();
    // The target fails mutual authentication: we refuse to go on.
    let mut c = cfg().digests(&[Digest::Crc32c], &[Digest::Crc32c]);
    c.chap = Some(ChapCredentials::new("alice", secret));
    c.mutual_chap = Some(ChapCredentials::new("tgt", b"not-the-targets-one".to_vec()));
    let ini = IscsiInitiator::start(c, &t.addr.to_string(), IQN);
    assert!(ini.wait_connected(Duration::from_secs(2)).await.is_err());
    ini.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_targets_discovery() {
    let t = target(None, None).await;
    let found = discover(&cfg(), &t.addr.to_string()).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, IQN);
    assert!(
        found[0]
            .addresses
            .iter()
            .any(|a| a.starts_with(&t.addr.to_string())),
        "{found:?}"
    );
    assert_eq!(address_of(&found[0].addresses[0]), t.addr.to_string());
}

/// Discovery names only the targets whose ACL lets the initiator in, and
/// gives the addresses the operator advertises (a portal behind NAT)
/// instead of the portal's own, until they are taken away again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_hides_what_the_acl_refuses_and_gives_advertised_addresses() {
    let t = target(None, None).await;
    let node = |name: &str, allow: Option<Vec<String>>| TargetNode {
        name: name.into(),
        alias: None,
        scsi: memory_lun0(1 << 20),
        allow,
        chap: None,
    };
    t.server.set_target(node(
        "iqn.2026-11.io.unifab:others-only",
        Some(vec!["iqn.2026-11.io.unifab:someone-else".into()]),
    ));
    t.server.set_target(node(
        "iqn.2026-11.io.unifab:ours-too",
        Some(vec![
            "iqn.2026-11.io.unifab:someone-else".into(),
            "IQN.2026-11.io.unifab:UNIT-INITIATOR".into(),
        ]),
    ));
    let names = |found: &[DiscoveredTarget]| -> Vec<String> {
        found.iter().map(|d| d.name.clone()).collect()
    };
    let found = discover(&cfg(), &t.addr.to_string()).await.unwrap();
    assert_eq!(
        names(&found),
        ["iqn.2026-11.io.unifab:ours-too", IQN],
        "{found:?}"
    );
    // The one it may not see cannot be logged into either.
    let ini = IscsiInitiator::start(
        cfg(),
        &t.addr.to_string(),
        "iqn.2026-11.io.unifab:others-only",
    );
    assert!(ini.wait_connected(Duration::from_secs(2)).await.is_err());
    ini.close();

    t.server.set_advertised(vec![
        "gw.example.net:13260".into(),
        "[2001:db8::5]:3260".into(),
    ]);
    let found = discover(&cfg(), &t.addr.to_string()).await.unwrap();
    for d in &found {
        assert_eq!(
            d.addresses,
            ["gw.example.net:13260,1", "[2001:db8::5]:3260,1"],
            "{d:?}"
        );
    }
    t.server.set_advertised(Vec::new());
    let found = discover(&cfg(), &t.addr.to_string()).await.unwrap();
    assert_eq!(found[0].addresses, [format!("{},1", t.addr)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_reinstated_and_nothing_is_lost() {
    let t = target(None, None).await;
    let relay = TcpRelay::start(t.addr).unwrap();
    let ini = IscsiInitiator::start(cfg(), &relay.addr().to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    // Writes in flight when the connection drops are sent again.
    let mut pending = Vec::new();
    for i in 0..64u64 {
        let data = pattern(32 * 1024, 100 + i as u32);
        pending.push((i * 64, data.clone(), ini.submit(write16(i * 64, data))));
        if i == 20 {
            relay.cut();
        }
    }
    let mut acknowledged = Vec::new();
    for (lba, data, w) in pending {
        match outcome(w).await {
            Ok(r) if r.status == Status::GOOD => acknowledged.push((lba, data)),
            // A unit attention after the reinstatement is the remote's
            // answer, passed on unchanged; never a silent success.
            Ok(r) => assert_eq!(r.status, Status::CHECK_CONDITION),
            Err(e) => panic!("writes are re-sent, not failed: {e}"),
        }
    }
    assert!(ini.logins() >= 2, "logged in again");
    // One session at the target: the new login reinstated the old one.
    assert_eq!(settled_sessions(&t).await.len(), 1);
    ready(&ini).await;
    for (lba, data) in acknowledged {
        let r = outcome(ini.submit(read16(lba, 64))).await.unwrap();
        assert!(
            flat(&r) == data.to_vec(),
            "acknowledged write at {lba} lost"
        );
    }
    ini.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_target_is_detected_and_commands_end_with_timeout() {
    let t = target(None, None).await;
    let relay = TcpRelay::start(t.addr).unwrap();
    let mut c = cfg();
    c.session.command_timeout = Duration::from_secs(3);
    // A command that is not idempotent in flight when the peer freezes.
    let ini = IscsiInitiator::start(c, &relay.addr().to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    relay.freeze();
    let r = ini.submit(read16(0, 8));
    let w = ini.submit(write16(0, pattern(4096, 3)));
    let r = outcome(r).await;
    let w = outcome(w).await;
    for o in [r, w] {
        let e = o.unwrap_err();
        assert!(
            matches!(e, InitiatorError::Timeout { after } if after == Duration::from_secs(3)),
            "{e}"
        );
    }
    // The ping went unanswered: the connection was declared dead.
    assert!(ini.last_error().is_some());
    relay.thaw();
    relay.cut();
    ini.wait_connected(Duration::from_secs(10)).await.unwrap();
    ready(&ini).await;
    verified_io(&ini, 1 << 16, 9).await;
    ini.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_wait_for_a_restarted_target() {
    let t = target(None, None).await;
    let relay = TcpRelay::start(t.addr).unwrap();
    let ini = IscsiInitiator::start(cfg(), &relay.addr().to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    // The target "dies": connections drop and new ones are refused.
    relay.refuse(true);
    relay.cut();
    let r = ini.submit(read16(0, 8));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // It comes back (elsewhere): the queued read is served.
    let t2 = target(None, None).await;
    relay.set_upstream(t2.addr);
    relay.refuse(false);
    let res = outcome(r).await.unwrap();
    // The new target's power-on unit attention, unchanged.
    assert!(res.status == Status::GOOD || res.status == Status::CHECK_CONDITION);
    ready(&ini).await;
    ini.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_management_over_tcp() {
    let t = target(None, None).await;
    let ini = IscsiInitiator::start(cfg(), &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    let r = ini
        .task_management(Lun(0), TmfFunction::AbortTask { tag: 12345 })
        .await
        .unwrap();
    assert_eq!(r, TmfResponse::FunctionComplete);
    let r = ini
        .task_management(Lun(0), TmfFunction::LogicalUnitReset)
        .await
        .unwrap();
    assert_eq!(r, TmfResponse::FunctionComplete);
    // The reset leaves a unit attention, reported unchanged.
    let r = outcome(ini.submit(Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0)))
        .await
        .unwrap();
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let r = ini
        .task_management(Lun(0), TmfFunction::QueryTaskSet)
        .await
        .unwrap();
    assert_eq!(r, TmfResponse::FunctionComplete);
    ini.close();
}

#[test]
fn upstream_identity() {
    let a = TransportId::Iscsi {
        name: "iqn.2026-11.io.example:h".into(),
        isid: Some([0x40, 0, 0, 0, 0, 1]),
    };
    let b = TransportId::Iscsi {
        name: "iqn.2026-11.io.example:h".into(),
        isid: Some([0x40, 0, 0, 0, 0, 2]),
    };
    assert_eq!(upstream_name(&a), "iqn.2026-11.io.example:h");
    assert_eq!(upstream_isid(&a, "lu1"), upstream_isid(&a.clone(), "lu1"));
    assert_ne!(upstream_isid(&a, "lu1"), upstream_isid(&b, "lu1"));
    assert_ne!(
        upstream_isid(&a, "lu1"),
        upstream_isid(&a, "lu2"),
        "two LUs of one target never share a session"
    );
    assert_eq!(upstream_isid(&a, "lu1")[0] & 0xc0, 0x80, "random ISID type");
    assert_ne!(
        upstream_isid(&a, "lu1")[1..],
        [0x40, 0, 0, 0, 1],
        "not the host's own ISID"
    );
    assert_ne!(random_isid(), random_isid());
    assert_eq!(
        upstream_name(&TransportId::Fcp {
            wwpn: 0x2000_0025_b500_0001
        }),
        "naa.20000025b5000001"
    );
    assert_eq!(address_of("192.0.2.1:3261,1"), "192.0.2.1:3261");
    assert_eq!(address_of("192.0.2.1"), "192.0.2.1:3260");
    assert_eq!(address_of("[::1]:3262,2"), "[::1]:3262");
    assert_eq!(address_of("[::1]"), "[::1]:3260");
    assert_eq!(address_of("fe80::1"), "[fe80::1]:3260");
    let t = parse_send_targets(b"TargetName=iqn.2026-11.a:1\0TargetAddress=1.2.3.4:3260,1\0TargetAddress=5.6.7.8:3260,1\0TargetName=iqn.2026-11.a:2\0").unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].addresses.len(), 2);
    assert!(t[1].addresses.is_empty());
    assert!(parse_send_targets(b"TargetAddress=1.2.3.4\0").is_err());
}

/// Busy polling reads the socket itself between yields: what it reads must
/// be exactly what the target sent (PDUs split across reads, data of
/// every size), at depth 1 (always polling) and with a depth limit above
/// the pipeline's (polling while 32 commands are out), and a connection
/// that drops while the reader polls is reinstated with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_reads_exactly_what_was_sent() {
    let t = target(None, None).await;
    let relay = TcpRelay::start(t.addr).unwrap();
    let mut c = cfg();
    c.busy_poll = Duration::from_millis(5);
    c.busy_poll_depth = 64;
    let ini = IscsiInitiator::start(c, &relay.addr().to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    // Depth 1, sizes from one block to 256 KiB.
    let mut written = Vec::new();
    for (i, blocks) in [1u32, 7, 8, 64, 129, 512].into_iter().enumerate() {
        let lba = 10_000 + i as u64 * 1024;
        let data = pattern(blocks as usize * 512, 7 + i as u32);
        let r = outcome(ini.submit(write16(lba, data.clone())))
            .await
            .unwrap();
        assert_eq!(r.status, Status::GOOD);
        let r = outcome(ini.submit(read16(lba, blocks))).await.unwrap();
        assert!(flat(&r) == data.to_vec(), "{blocks} blocks read back");
        written.push((lba, blocks, data));
    }
    // 32 at once.
    verified_io(&ini, 0, 3).await;
    // The connection drops while the reader polls (one command out).
    let data = pattern(4096, 99);
    let w = ini.submit(write16(20_000, data.clone()));
    relay.cut();
    match outcome(w).await {
        Ok(r) if r.status == Status::GOOD => written.push((20_000, 8, data)),
        Ok(r) => assert_eq!(r.status, Status::CHECK_CONDITION),
        Err(e) => panic!("the write is re-sent, not failed: {e}"),
    }
    ready(&ini).await;
    assert!(ini.logins() >= 2, "logged in again");
    for (lba, blocks, data) in written {
        let r = outcome(ini.submit(read16(lba, blocks))).await.unwrap();
        assert!(flat(&r) == data.to_vec(), "write at {lba} kept");
    }
    ini.close();
}

/// What `unifab show remotes` lists: every session a factory opened that
/// is still in use, up or down, with its name, ISID and last error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factory_lists_its_sessions_up_and_down() {
    let t = target(None, None).await;
    let relay = TcpRelay::start(t.addr).unwrap();
    let factory = IscsiInitiatorFactory::new(cfg(), &relay.addr().to_string(), IQN, "lu", true);
    assert!(factory.sessions().is_empty());
    let host = ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.io.example:host".into(),
            isid: Some([0x80, 0, 0, 0, 0, 9]),
        },
        unifab_scsi_core::TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.io.unifab:gw,t,0x0001".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    );
    let per_host = factory.open(Some(&host)).unwrap();
    let control = factory.open(None).unwrap();
    let _ = outcome(per_host.submit(read16(0, 1))).await;
    let _ = outcome(control.submit(read16(0, 1))).await;
    let s = factory.sessions();
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0].initiator_name, "iqn.2026-11.io.example:host");
    assert_eq!(s[0].isid, upstream_isid(host.initiator(), "lu"));
    assert_eq!(s[1].initiator_name, "iqn.2026-11.io.unifab:unit-initiator");
    assert!(
        s.iter()
            .all(|s| s.connected && s.logins == 1 && s.last_error.is_none())
    );
    assert!(s.iter().all(|s| s.last_error_age.is_none()), "{s:?}");
    assert!(s[0].remote.ends_with(IQN));
    // The remote goes away: both are listed down, with the reason.
    relay.set_upstream("127.0.0.1:1".parse().unwrap());
    let cut_at = std::time::Instant::now();
    relay.cut();
    let mut s = factory.sessions();
    for _ in 0..500 {
        if s.iter().all(|s| !s.connected && s.last_error.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        s = factory.sessions();
    }
    assert!(
        s.iter().all(|s| !s.connected && s.last_error.is_some()),
        "{s:?}"
    );
    // The failure is dated: it happened after the cut (each failed retry
    // dates it anew).
    let cut_ago = cut_at.elapsed();
    let ages: Vec<Duration> = s.iter().map(|s| s.last_error_age.unwrap()).collect();
    assert!(
        ages.iter().all(|a| *a <= cut_ago),
        "{ages:?} vs {cut_ago:?}"
    );
    // A session nobody holds any more is no longer listed.
    drop(per_host);
    let s = factory.sessions();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].initiator_name, "iqn.2026-11.io.unifab:unit-initiator");
}

/// A target that pings (NOP-In with a Target Transfer Tag, 64 KiB of data
/// each) but never reads what we send: the answers queue only up to
/// `MAX_ECHO_BACKLOG` once the socket is full, and the connection is then
/// dropped with the reason. While the socket takes them, they are all sent.
#[tokio::test]
async fn a_target_that_pings_without_reading_is_dropped_with_bounded_memory() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stream = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (_peer, _) = l.accept().await.unwrap(); // never read
    let (_rd, wr) = stream.into_split();
    let now = Instant::now();
    let mut session = Session::new(SessionConfig::default(), now);
    session.connected(
        now,
        FfpParams {
            max_recv_data_segment_length: 1 << 20,
            // The target takes the 64 KiB answers whole.
            max_xmit_data_segment_length: 1 << 20,
            ..FfpParams::default()
        },
        StartSn {
            cmd_sn: 1,
            max_cmd_sn: 64,
            exp_stat_sn: 1,
        },
    );
    let mut core = Core {
        session,
        out: Some(Outbox::new(wr, Digests::default())),
    };
    let framer = Framer {
        digests: Digests::default(),
        max_data_segment_length: 1 << 20,
    };
    let ping = Bytes::from(vec![0x5a; 64 << 10]);
    let mut answered_while_full = 0usize;
    for i in 0..2000u32 {
        let wire = encode_pdu(
            &Pdu::NopIn(crate::wire::NopIn {
                lun: 0,
                itt: crate::ffp::RESERVED_TAG,
                ttt: 0x100 + i,
                stat_sn: 1,
                exp_cmd_sn: 1,
                max_cmd_sn: 64,
            }),
            &[],
            &ping,
            Digests::default(),
        )
        .unwrap();
        let frame = framer
            .decode(&mut BytesMut::from(&wire[..]))
            .unwrap()
            .unwrap();
        core.session.handle_frame(now, frame).unwrap();
        let was_busy = core.out.as_ref().unwrap().busy;
        core.flush();
        let o = core.out.as_ref().unwrap();
        if was_busy && !o.failed {
            answered_while_full += 1;
        }
        if o.failed {
            break;
        }
    }
    let o = core.out.as_ref().unwrap();
    assert!(o.failed, "the connection was never dropped");
    assert_eq!(
        o.fail_reason,
        Some("the target pings but does not read what we send")
    );
    assert!(o.echo_backlog > MAX_ECHO_BACKLOG);
    // Queued while the socket was full: no more than the bound allows.
    let held: usize = o.pending.iter().map(Bytes::len).sum();
    assert!(answered_while_full >= 1);
    assert!(
        answered_while_full * (BHS_LEN + ping.len()) <= MAX_ECHO_BACKLOG + BHS_LEN + ping.len(),
        "{answered_while_full} answers queued while full"
    );
    assert!(
        held <= MAX_ECHO_BACKLOG + 2 * (BHS_LEN + ping.len()),
        "{held}"
    );
}

/// Reads at LBA 1000 and beyond wait until `release` flips to true; every
/// other command runs at once. `prompt`: the LU answers promptly
/// ([`Dispatch::answer_promptly`]), as an RBD LU does.
#[derive(Debug)]
struct Gate {
    inner: Arc<ScsiTarget>,
    release: watch::Receiver<bool>,
    prompt: bool,
}

impl Dispatch for Gate {
    fn dispatch(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let cdb = task.cdb.as_bytes();
        let gated = cdb[0] == 0x88 && u64::from_be_bytes(cdb[2..10].try_into().unwrap()) >= 1000;
        let run = self.inner.dispatch(task);
        if !gated {
            return run;
        }
        let mut release = self.release.clone();
        Box::pin(async move {
            let _ = release.wait_for(|r| *r).await;
            run.await
        })
    }
    fn task_management(
        &self,
        request: unifab_scsi_core::TmfRequest,
    ) -> BoxFuture<'static, TmfResponse> {
        self.inner.task_management(request)
    }
    fn nexus_loss(&self, nexus: &ItNexus) {
        self.inner.nexus_loss(nexus);
    }
    fn answer_promptly(&self, _lun: Lun) -> bool {
        self.prompt
    }
}

/// A session to a [`Gate`] over a memory LU, whose target coalesces
/// answers (batches of 16, held at most `max_delay`), without pings (a
/// NOP-In would send a held answer with it). `prompt`: the LU answers
/// promptly. With the sender that lets the gated reads go.
async fn gated_session(
    prompt: bool,
    max_delay: Duration,
) -> (watch::Sender<bool>, Target, IscsiInitiator) {
    let (release_tx, release) = watch::channel(false);
    let mut sc = ServerConfig::default();
    sc.limits.coalescing = crate::target::Coalescing {
        responses: 16,
        max_delay,
    };
    let gate = Gate {
        inner: memory_lun0(8 << 20),
        release,
        prompt,
    };
    let t = serve(Arc::new(gate), sc, None).await;
    let mut c = cfg();
    c.session.nop_interval = None;
    let ini = IscsiInitiator::start(c, &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    (release_tx, t, ini)
}

/// 20 reads the gate holds: more than a batch in progress.
fn stuck_reads(ini: &IscsiInitiator) -> Vec<Submitted> {
    (0..20).map(|i| ini.submit(read16(1000 + i, 1))).collect()
}

/// Lets the stuck reads go; each ends GOOD.
async fn release_stuck(release: watch::Sender<bool>, stuck: Vec<Submitted>) {
    release.send(true).unwrap();
    for s in stuck {
        assert_eq!(outcome(s).await.unwrap().status, Status::GOOD);
    }
}

/// Response coalescing holds an answer while a batch's worth of commands
/// is in progress, but never past its delay: with 20 commands stuck, a
/// read that finished is still answered (it would wait for the stuck ones,
/// and time out at the initiator, if the delay were not kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_answer_goes_out_at_its_delay_while_others_are_stuck() {
    let (release, _t, ini) = gated_session(false, Duration::from_millis(300)).await;
    let data = pattern(4096, 7);
    outcome(ini.submit(write16(0, data.clone()))).await.unwrap();

    let stuck = stuck_reads(&ini);
    // The initiator fails a command after 5 s (`cfg`); this one must be
    // answered long before that.
    let quick = outcome(ini.submit(read16(0, 8)))
        .await
        .expect("the finished read was held");
    assert_eq!(quick.status, Status::GOOD);
    assert!(flat(&quick) == data.to_vec(), "read back what was written");
    release_stuck(release, stuck).await;
    ini.close();
}

/// A LU that answers promptly (an RBD LU: librbd completes commands one
/// by one) has none of its answers held: with 20 commands stuck and
/// coalescing set to hold for a minute, a read that finished is answered
/// before the initiator's 5 s command timeout. Fails where its answer
/// waits for a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_lus_answers_are_never_held() {
    let (release, _t, ini) = gated_session(true, Duration::from_secs(60)).await;
    let stuck = stuck_reads(&ini);
    for lba in 0..3 {
        let quick = outcome(ini.submit(read16(lba, 8)))
            .await
            .expect("a finished read of a prompt LU was held");
        assert_eq!(quick.status, Status::GOOD);
    }
    release_stuck(release, stuck).await;
    ini.close();
}

/// A connection past `max_connections` is not dropped unanswered: its
/// Login Request gets a Login Response with status Out of resources
/// (0302h) for its ITT and ISID, and the connection closes. Once the first
/// connection goes, a login succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_limit_is_refused_out_of_resources() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::wire::{BHS_LEN, Bhs, Digests, LoginRequest, LoginResponse, Pdu, Stage};

    let sc = ServerConfig {
        max_connections: 1,
        ..ServerConfig::default()
    };
    let t = serve(memory_lun0(1 << 20), sc, None).await;
    // The one connection allowed: accepted, says nothing.
    let first = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    let req = Pdu::LoginRequest(LoginRequest {
        transit: true,
        csg: Stage::SECURITY_NEGOTIATION,
        nsg: Stage(1),
        isid: [0x80, 1, 2, 3, 4, 5],
        itt: 0x1234_5678,
        cmd_sn: 7,
        ..LoginRequest::default()
    });
    let bytes = crate::wire::encode_pdu(&req, &[], &[], Digests::default()).unwrap();
    second.write_all(&bytes).await.unwrap();
    let mut bhs = [0u8; BHS_LEN];
    tokio::time::timeout(Duration::from_secs(5), second.read_exact(&mut bhs))
        .await
        .expect("an answer, not silence")
        .unwrap();
    let Ok(Pdu::LoginResponse(LoginResponse {
        status_class,
        status_detail,
        itt,
        isid,
        ..
    })) = Pdu::parse(&Bhs::new_checked(&bhs[..]).unwrap())
    else {
        panic!("not a Login Response: {bhs:02x?}");
    };
    assert_eq!((status_class, status_detail), (0x03, 0x02));
    assert_eq!((itt, isid), (0x1234_5678, [0x80, 1, 2, 3, 4, 5]));
    // Then the connection closes.
    let mut rest = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut rest))
        .await
        .expect("closed, not held open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // The first connection goes: a real login succeeds.
    drop(first);
    let ini = IscsiInitiator::start(cfg(), &t.addr.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
}

/// A portal added while the server runs accepts logins and is listed by
/// SendTargets; removed, it accepts no new connection, and the session it
/// accepted goes on doing verified I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portals_come_and_go_while_the_server_runs() {
    let t = target(None, None).await;
    let added = t
        .server
        .add_portal("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    assert_ne!(added, t.addr);
    assert_eq!(t.server.local_addrs(), vec![t.addr, added]);
    let found = discover(&cfg(), &t.addr.to_string()).await.unwrap();
    assert!(
        found[0]
            .addresses
            .iter()
            .any(|a| address_of(a) == added.to_string()),
        "{found:?}"
    );
    let mut c = cfg();
    c.reconnect_max = Duration::from_millis(50);
    let ini = IscsiInitiator::start(c, &added.to_string(), IQN);
    ini.wait_connected(Duration::from_secs(5)).await.unwrap();
    ready(&ini).await;
    verified_io(&ini, 0, 7).await;

    assert!(t.server.remove_portal(added));
    assert!(!t.server.remove_portal(added), "removed once");
    assert_eq!(t.server.local_addrs(), vec![t.addr]);
    // No new connection there (bounded wait: the acceptor ends at once).
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(added).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the removed portal still accepts");
    // The session it accepted goes on.
    verified_io(&ini, 4096, 8).await;
    assert_eq!(ini.logins(), 1, "no reconnection");
    ini.close();
}
