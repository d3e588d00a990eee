use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::*;
use crate::backend::MemoryBackend;
use crate::emulated::{EmulatedLu, EmulatedLuConfig};
use crate::initiator::{LoopbackFactory, Outcome, Submitted};
use crate::sense::{Sense, SenseKey, asc};
use crate::task::{Cdb, TargetPort, TaskAttr};

fn port(name: &str) -> TransportId {
    TransportId::Iscsi {
        name: name.into(),
        isid: None,
    }
}

fn target_port() -> TargetPort {
    TargetPort {
        id: port("iqn.2026-11.io.unifab:gw,t,0x0001"),
        relative_port_id: 1,
        port_group: 1,
    }
}

fn nexus(name: &str) -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: name.into(),
            isid: Some([0x80, 0, 0, 0, 0, 1]),
        },
        target_port(),
    )
}

fn emulated() -> Arc<EmulatedLu> {
    let cfg = EmulatedLuConfig {
        name: "remote-disk".into(),
        ..EmulatedLuConfig::default()
    };
    Arc::new(EmulatedLu::new(cfg, Arc::new(MemoryBackend::new(8 << 20))).unwrap())
}

fn cfg(identity: Identity) -> RemoteLuConfig {
    RemoteLuConfig {
        name: "bridged".into(),
        backend: "loopback:remote-disk".into(),
        remote_lun: Lun(0),
        identity,
        task_set_depth: 64,
        read_only: false,
    }
}

fn read_only() -> RemoteLuConfig {
    RemoteLuConfig {
        read_only: true,
        ..cfg(Identity::Passthrough)
    }
}

/// A read-only view of `lu`, one remote nexus per host.
fn view_of(lu: Arc<EmulatedLu>) -> RemoteLu {
    let f = Arc::new(LoopbackFactory::new(
        lu,
        target_port(),
        port("iqn.2026-11.io.unifab:gateway"),
        true,
    ));
    RemoteLu::new(read_only(), f)
}

fn loopback(lu: Arc<EmulatedLu>, per_nexus: bool) -> (RemoteLu, Arc<LoopbackFactory>) {
    let f = Arc::new(LoopbackFactory::new(
        lu,
        TargetPort {
            id: port("iqn.2026-11.io.unifab:remote,t,0x0001"),
            relative_port_id: 7,
            port_group: 3,
        },
        port("iqn.2026-11.io.unifab:gateway"),
        per_nexus,
    ));
    (RemoteLu::new(cfg(Identity::Passthrough), f.clone()), f)
}

fn task(n: &ItNexus, tag: u64, cdb: &[u8], data_in_len: u32) -> Task {
    Task::new(
        n.clone(),
        Lun(0),
        tag,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    )
    .with_data_in(data_in_len)
}

fn write10(n: &ItNexus, tag: u64, lba: u32, data: Bytes) -> Task {
    let blocks = (data.len() / 512) as u16;
    let mut cdb = [0u8; 10];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    task(n, tag, &cdb, 0).with_data(data)
}

fn read10(n: &ItNexus, tag: u64, lba: u32, blocks: u16, edtl: u32) -> Task {
    let mut cdb = [0u8; 10];
    cdb[0] = 0x28;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    task(n, tag, &cdb, edtl)
}

/// Clears the power-on unit attention a new nexus gets (it passes through
/// the bridge like every other answer).
async fn clear_ua(lu: &dyn LogicalUnit, n: &ItNexus) {
    let r = lu.execute(task(n, 999, &[0, 0, 0, 0, 0, 0], 0)).await;
    if r.status != Status::GOOD {
        assert_eq!(sense_of(&r).key, SenseKey::UNIT_ATTENTION);
    }
    assert_eq!(
        lu.execute(task(n, 999, &[0, 0, 0, 0, 0, 0], 0))
            .await
            .status,
        Status::GOOD
    );
}

/// The answer of a command the gateway answers itself, without the remote
/// (a test would hang on one that went to a held remote instead).
fn at_once(fut: BoxFuture<'static, TaskResult>) -> TaskResult {
    let mut fut = fut;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => panic!("the command went to the remote"),
    }
}

fn data_of(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

fn sense_of(r: &TaskResult) -> Sense {
    Sense::parse(r.sense.as_deref().unwrap_or(&[])).unwrap()
}

#[tokio::test]
async fn answers_are_the_remotes_unchanged() {
    let lu = emulated();
    let (remote, _) = loopback(lu.clone(), true);
    let n = nexus("iqn.2026-11.io.example:host");
    let d = nexus("iqn.2026-11.io.example:direct");
    clear_ua(&remote, &n).await;
    clear_ua(&*lu, &d).await;
    let payload: Bytes = (0..4096u32)
        .map(|i| (i * 7 + 3) as u8)
        .collect::<Vec<_>>()
        .into();
    let w = remote.execute(write10(&n, 1, 100, payload.clone())).await;
    assert_eq!(w.status, Status::GOOD);
    let r = remote.execute(read10(&n, 2, 100, 8, 4096)).await;
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(data_of(&r), payload.to_vec());
    // Through the bridge and directly, the same commands give the same
    // status, sense, data and residual.
    let cdbs: Vec<(Vec<u8>, u32)> = vec![
        (vec![0x12, 0, 0, 0, 96, 0], 96),                      // INQUIRY
        (vec![0x12, 1, 0xb0, 0, 64, 0], 64),                   // VPD B0
        (vec![0x12, 1, 0x83, 0, 255, 0], 255),                 // VPD 83
        (vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8),            // READ CAPACITY(10)
        (vec![0x1a, 0, 0x3f, 0, 255, 0], 255),                 // MODE SENSE(6)
        (vec![0xc7, 0, 0, 0, 0, 0], 0),                        // bad opcode
        (vec![0x28, 0, 0, 0, 0, 100, 0, 0, 8, 0], 8192),       // read, EDTL > CDB
        (vec![0x28, 0, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0], 512), // LBA out of range
    ];
    for (i, (cdb, len)) in cdbs.iter().enumerate() {
        let via = remote.execute(task(&n, 10 + i as u64, cdb, *len)).await;
        let direct = lu.execute(task(&d, 10 + i as u64, cdb, *len)).await;
        assert_eq!(via.status, direct.status, "cdb {cdb:02x?}");
        assert_eq!(via.sense, direct.sense, "cdb {cdb:02x?}");
        assert_eq!(via.residual, direct.residual, "cdb {cdb:02x?}");
        if cdb[2] != 0x83 {
            // (VPD 0x83 names each side's own target port.)
            assert_eq!(data_of(&via), data_of(&direct), "cdb {cdb:02x?}");
        }
    }
    assert_eq!(
        remote.describe().block_size,
        512,
        "READ CAPACITY was snooped"
    );
    assert_eq!(remote.describe().blocks, (8 << 20) / 512);
}

/// A read-only view: reads and reports pass, writes and everything else
/// end at the gateway with DATA PROTECT and never reach the remote, and
/// MODE SENSE shows WP.
#[tokio::test]
async fn a_read_only_view_refuses_what_would_change_the_remote() {
    let lu = emulated();
    let remote = view_of(lu.clone());
    let n = nexus("iqn.2026-11.io.example:host");
    let d = nexus("iqn.2026-11.io.example:direct");
    clear_ua(&remote, &n).await;
    clear_ua(&*lu, &d).await;
    assert!(remote.describe().write_protected);
    assert!(!lu.describe().write_protected);

    let payload: Bytes = (0..4096u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let w = lu.execute(write10(&d, 1, 100, payload.clone())).await;
    assert_eq!(w.status, Status::GOOD);

    let protected = |r: &TaskResult, what: &str| {
        assert_eq!(r.status, Status::CHECK_CONDITION, "{what}");
        let s = sense_of(r);
        assert_eq!(
            (s.key, s.asc),
            (SenseKey::DATA_PROTECT, asc::WRITE_PROTECTED),
            "{what}"
        );
    };
    let w = remote
        .execute(write10(&n, 2, 100, Bytes::from(vec![0u8; 4096])))
        .await;
    protected(&w, "WRITE(10)");
    let mut same = task(&n, 3, &[0x41, 0, 0, 0, 0, 100, 0, 0, 8, 0], 0);
    same.data_out = vec![Bytes::from(vec![0u8; 512])];
    same.data_out_len = 512;
    protected(&remote.execute(same).await, "WRITE SAME(10)");
    let mut unmap = task(&n, 4, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 0);
    let mut list = vec![0u8; 24];
    list[1] = 22;
    list[3] = 16;
    list[8..16].copy_from_slice(&100u64.to_be_bytes());
    list[16..20].copy_from_slice(&8u32.to_be_bytes());
    unmap.data_out = vec![Bytes::from(list)];
    unmap.data_out_len = 24;
    protected(&remote.execute(unmap).await, "UNMAP");
    // An opcode the remote does not know is refused here, not there (the
    // remote would answer ILLEGAL REQUEST).
    protected(
        &remote.execute(task(&n, 5, &[0xc7, 0, 0, 0, 0, 0], 0)).await,
        "vendor",
    );
    let direct = lu.execute(task(&d, 5, &[0xc7, 0, 0, 0, 0, 0], 0)).await;
    assert_eq!(sense_of(&direct).key, SenseKey::ILLEGAL_REQUEST);
    // MODE SELECT(6) with the Control page setting SWP: refused, and the
    // remote stays writable.
    let mut select = task(&n, 6, &[0x15, 0x10, 0, 0, 16, 0], 0);
    let mut page = vec![0u8; 16];
    page[4] = 0x0a;
    page[5] = 0x0a;
    page[8] = 0x08;
    select.data_out = vec![Bytes::from(page)];
    select.data_out_len = 16;
    protected(&remote.execute(select).await, "MODE SELECT(6)");

    // Nothing reached the medium.
    let r = lu.execute(read10(&d, 7, 100, 8, 4096)).await;
    assert_eq!(data_of(&r), payload.to_vec());
    // Reads pass.
    let r = remote.execute(read10(&n, 8, 100, 8, 4096)).await;
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(data_of(&r), payload.to_vec());
    // MODE SENSE: WP set through the view, the rest as the remote's.
    for (i, (cdb, wp_at)) in [
        (vec![0x1a, 0, 0x3f, 0, 255, 0], 2usize),
        (vec![0x5a, 0, 0x3f, 0, 0, 0, 0, 0, 255, 0], 3),
    ]
    .into_iter()
    .enumerate()
    {
        let via = data_of(&remote.execute(task(&n, 20 + i as u64, &cdb, 255)).await);
        let mut direct = data_of(&lu.execute(task(&d, 20 + i as u64, &cdb, 255)).await);
        assert_eq!(direct[wp_at] & 0x80, 0, "the remote is writable");
        direct[wp_at] |= 0x80;
        assert_eq!(via, direct, "cdb {cdb:02x?}");
    }
}

/// A reset through a read-only view resets the view, not the remote: the
/// remote's owner keeps its reservation and gets no unit attention, and
/// the view's host gets the view's own.
#[tokio::test]
async fn a_reset_through_a_read_only_view_leaves_the_remote_alone() {
    let lu = emulated();
    let view = view_of(lu.clone());
    let owner = nexus("iqn.2026-11.io.example:owner");
    let host = nexus("iqn.2026-11.io.example:host");
    clear_ua(&*lu, &owner).await;
    clear_ua(&view, &host).await;
    let reserve = lu.execute(task(&owner, 1, &[0x16, 0, 0, 0, 0, 0], 0)).await;
    assert_eq!(reserve.status, Status::GOOD);
    let r = view.execute(read10(&host, 2, 0, 1, 512)).await;
    assert_eq!(r.status, Status::RESERVATION_CONFLICT);

    for function in [
        TmfFunction::LogicalUnitReset,
        TmfFunction::TargetReset,
        TmfFunction::ClearTaskSet,
    ] {
        let resp = view
            .task_management(TmfRequest {
                nexus: host.clone(),
                lun: Lun(0),
                function,
            })
            .await;
        assert_eq!(resp, TmfResponse::FunctionComplete, "{function:?}");
        let tur = lu.execute(task(&owner, 3, &[0, 0, 0, 0, 0, 0], 0)).await;
        assert_eq!(
            tur.status,
            Status::GOOD,
            "{function:?} through the view reached the owner: {:?}",
            tur.sense.as_deref().map(Sense::parse)
        );
        let r = view.execute(read10(&host, 4, 0, 1, 512)).await;
        if function == TmfFunction::LogicalUnitReset {
            // The view's own unit attention, then the remote's answer.
            assert_eq!(r.status, Status::CHECK_CONDITION);
            let s = sense_of(&r);
            assert_eq!(
                (s.key, s.asc),
                (
                    SenseKey::UNIT_ATTENTION,
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                )
            );
            let r = view.execute(read10(&host, 5, 0, 1, 512)).await;
            assert_eq!(r.status, Status::RESERVATION_CONFLICT, "still reserved");
        } else {
            // The requester learns of these from the response alone.
            assert_eq!(r.status, Status::RESERVATION_CONFLICT, "{function:?}");
        }
    }
}

/// The view's task management: its own tasks are aborted at the remote
/// (never a reset or a CLEAR TASK SET there), and each of its ports gets
/// the unit attention SAM-5 gives for the function.
#[tokio::test]
async fn a_read_only_view_aborts_only_its_own_tasks_and_keeps_its_unit_attentions() {
    let tur = [0u8; 6];
    for function in [
        TmfFunction::LogicalUnitReset,
        TmfFunction::TargetReset,
        TmfFunction::ClearTaskSet,
    ] {
        for per_nexus in [true, false] {
            let f = HeldFactory::new(per_nexus);
            let view = RemoteLu::new(read_only(), f.clone());
            let a = nexus("iqn.2026-11.io.example:a");
            let b = nexus("iqn.2026-11.io.example:b");
            let fa = tokio::spawn(view.execute(read10(&a, 1, 0, 1, 512)));
            let fb = tokio::spawn(view.execute(read10(&b, 1, 0, 1, 512)));
            tokio::task::yield_now().await;
            let resp = view
                .task_management(TmfRequest {
                    nexus: a.clone(),
                    lun: Lun(0),
                    function,
                })
                .await;
            assert_eq!(resp, TmfResponse::FunctionComplete);
            assert!(fa.await.unwrap().aborted);
            assert!(fb.await.unwrap().aborted);
            let opened = f.opened.lock().unwrap().clone();
            let mut sent: Vec<TmfFunction> = opened
                .iter()
                .flat_map(|h| h.tmfs.lock().unwrap().clone())
                .collect();
            sent.sort_by_key(|t| format!("{t:?}"));
            let want = if per_nexus {
                vec![TmfFunction::AbortTaskSet; 2]
            } else {
                let mut tags = opened[0].tags();
                tags.sort();
                tags.into_iter()
                    .map(|tag| TmfFunction::AbortTask { tag })
                    .collect()
            };
            assert_eq!(sent, want, "{function:?}, per_nexus {per_nexus}");

            let (for_a, for_b) = match function {
                TmfFunction::LogicalUnitReset => (
                    Some(asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED),
                    Some(asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED),
                ),
                TmfFunction::TargetReset => {
                    (None, Some(asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED))
                }
                _ => (None, Some(asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR)),
            };
            let query = |n: &ItNexus| {
                view.task_management(TmfRequest {
                    nexus: n.clone(),
                    lun: Lun(0),
                    function: TmfFunction::QueryAsyncEvent,
                })
            };
            assert_eq!(query(&b).await, TmfResponse::FunctionSucceeded);
            // INQUIRY leaves it pending; REQUEST SENSE returns it as data.
            let inq = view.execute(task(&b, 2, &[0x12, 0, 0, 0, 96, 0], 96));
            let h = f.get(if per_nexus { 1 } else { 0 });
            let before = h.tags().len();
            h.complete(*h.tags().last().unwrap(), Ok(TaskResult::good()));
            assert_eq!(inq.await.status, Status::GOOD);
            assert_eq!(h.tags().len(), before, "INQUIRY went to the remote");
            let rs = at_once(view.execute(task(&b, 3, &[0x03, 0, 0, 0, 18, 0], 18)));
            assert_eq!(rs.status, Status::GOOD);
            let data = data_of(&rs);
            assert_eq!((data[0], data[2] & 0x0f), (0x70, 0x06));
            assert_eq!(Some(Asc(data[12], data[13])), for_b);

            match for_a {
                Some(code) => {
                    let r = at_once(view.execute(task(&a, 4, &tur, 0)));
                    assert_eq!(r.status, Status::CHECK_CONDITION);
                    let s = sense_of(&r);
                    assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, code));
                }
                None => {
                    // No unit attention: the command goes to the remote.
                    let h = f.get(0);
                    let before = h.tags().len();
                    let r = view.execute(task(&a, 4, &tur, 0));
                    assert_eq!(h.tags().len(), before + 1, "{function:?}");
                    h.complete(*h.tags().last().unwrap(), Ok(TaskResult::good()));
                    assert_eq!(r.await.status, Status::GOOD);
                }
            }
        }
    }
}

#[tokio::test]
async fn probe_reads_the_capacity() {
    let (remote, _) = loopback(emulated(), false);
    assert_eq!(remote.describe().blocks, 0);
    let (bs, blocks) = remote.probe().await.unwrap();
    assert_eq!((bs, blocks), (512, (8 << 20) / 512));
    assert_eq!(remote.describe().blocks, blocks);
}

/// A remote tape has no READ CAPACITY: the probe says it is reachable,
/// with no capacity, instead of retrying for ever.
#[tokio::test]
async fn probe_of_a_tape_is_reachable_without_a_capacity() {
    let tape = crate::tape::TapeLu::new(
        crate::tape::TapeLuConfig::default(),
        Arc::new(MemoryBackend::new(1 << 20)),
    )
    .unwrap();
    let f = Arc::new(LoopbackFactory::new(
        Arc::new(tape),
        target_port(),
        port("iqn.2026-11.io.unifab:gateway"),
        false,
    ));
    let remote = RemoteLu::new(cfg(Identity::Passthrough), f);
    assert_eq!(remote.probe().await.unwrap(), (0, 0));
}

fn designators(page: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = 4 + page[at + 3] as usize;
        out.push((
            (page[at + 1] >> 4) & 3,
            page[at + 1] & 0xf,
            page[at + 4..(at + len).min(page.len())].to_vec(),
        ));
        at += len;
    }
    out
}

#[tokio::test]
async fn derived_identity_is_stable_distinct_and_keeps_port_designators() {
    let lu = emulated();
    let make = |seed: &str| {
        let f = Arc::new(LoopbackFactory::new(
            lu.clone(),
            target_port(),
            port("iqn.2026-11.io.unifab:gateway"),
            true,
        ));
        RemoteLu::new(cfg(Identity::Derived { seed: seed.into() }), f)
    };
    let a = make("iqn.2026-11.io.example:array/1");
    let a2 = make("iqn.2026-11.io.example:array/1");
    let b = make("iqn.2026-11.io.example:array/2");
    let n = nexus("iqn.2026-11.io.example:host");
    let page = |lu: &RemoteLu, tag| {
        let lu = lu.clone();
        let n = n.clone();
        async move {
            lu.execute(task(&n, tag, &[0x12, 1, 0x83, 0x01, 0, 0], 256))
                .await
        }
    };
    let pa = data_of(&page(&a, 1).await);
    let pa2 = data_of(&page(&a2, 2).await);
    let pb = data_of(&page(&b, 3).await);
    assert_eq!(pa, pa2, "same seed, same identity");
    assert_ne!(pa, pb, "different remote LUs are told apart");
    assert_eq!(pa[1], 0x83);
    assert_eq!(
        u16::from_be_bytes([pa[2], pa[3]]) as usize,
        pa.len() - 4,
        "page length matches"
    );
    let ds = designators(&pa);
    // Our NAA first, as the logical unit's designator.
    assert_eq!((ds[0].0, ds[0].1), (0, 3));
    assert_eq!(ds[0].2, a.naa().to_be_bytes().to_vec());
    // No logical-unit designator of the remote is left.
    let direct = data_of(
        &lu.execute(task(&n, 4, &[0x12, 1, 0x83, 0x01, 0, 0], 256))
            .await,
    );
    let lu_naa = lu.naa().to_be_bytes().to_vec();
    assert!(ds.iter().all(|d| d.2 != lu_naa));
    // The remote's target-port designators are kept, unchanged.
    let remote_ports: Vec<_> = designators(&direct)
        .into_iter()
        .filter(|d| d.0 != 0)
        .collect();
    assert!(!remote_ports.is_empty());
    for p in &remote_ports {
        assert!(ds.contains(p), "port designator {p:?} kept");
    }
    // Serial number page.
    let s = data_of(
        &a.execute(task(&n, 5, &[0x12, 1, 0x80, 0, 255, 0], 255))
            .await,
    );
    assert_eq!(
        &s[4..],
        format!("{:016x}", fnv1a("iqn.2026-11.io.example:array/1")).as_bytes()
    );
    // The host's allocation length is honoured.
    let short = a.execute(task(&n, 6, &[0x12, 1, 0x83, 0, 10, 0], 10)).await;
    assert_eq!(data_of(&short), pa[..10].to_vec());
    // An unsupported page's error passes through.
    let bad = a
        .execute(task(&n, 7, &[0x12, 1, 0x80, 0, 255, 1], 255))
        .await;
    assert_eq!(bad.status, Status::CHECK_CONDITION);
}

#[tokio::test]
async fn one_remote_nexus_per_initiator_port() {
    let lu = emulated();
    let (remote, f) = loopback(lu, true);
    let a = nexus("iqn.2026-11.io.example:a");
    let b = nexus("iqn.2026-11.io.example:b");
    clear_ua(&remote, &a).await;
    clear_ua(&remote, &b).await;
    // RESERVE(6) by A: B gets RESERVATION CONFLICT, as with a direct attach.
    let r = remote.execute(task(&a, 1, &[0x16, 0, 0, 0, 0, 0], 0)).await;
    assert_eq!(r.status, Status::GOOD);
    let r = remote.execute(read10(&b, 1, 0, 1, 512)).await;
    assert_eq!(r.status, Status::RESERVATION_CONFLICT);
    assert_eq!(f.opened(), 2);
    // A reinstated session of A (same ports, new nexus) is the same remote
    // nexus: still the reservation holder.
    let a2 = ItNexus::new(a.initiator().clone(), a.target().clone());
    let r = remote.execute(read10(&a2, 2, 0, 1, 512)).await;
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(f.opened(), 2);
    remote.nexus_loss(&a);
    let r = remote.execute(read10(&b, 2, 0, 1, 512)).await;
    assert_eq!(r.status, Status::RESERVATION_CONFLICT, "A2 still holds it");
    // The last nexus of A's port goes: the remote sees I_T nexus loss and
    // releases the RESERVE(6) reservation.
    remote.nexus_loss(&a2);
    let r = remote.execute(read10(&b, 3, 0, 1, 512)).await;
    assert_eq!(r.status, Status::GOOD);
}

/// An initiator whose commands end only when the test says so.
#[derive(Debug, Default)]
struct Held {
    next: Mutex<u64>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Outcome>>>,
    submitted: Mutex<Vec<(u64, u8, Lun, TaskAttr)>>,
    tmfs: Mutex<Vec<TmfFunction>>,
    closed: Mutex<bool>,
}

impl Held {
    fn complete(&self, tag: u64, o: Outcome) {
        if let Some(tx) = self.pending.lock().unwrap().remove(&tag) {
            let _ = tx.send(o);
        }
    }
    fn tags(&self) -> Vec<u64> {
        self.submitted.lock().unwrap().iter().map(|s| s.0).collect()
    }
}

impl Initiator for Held {
    fn submit(&self, request: Request) -> Submitted {
        let tag = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n + 1000
        };
        self.submitted.lock().unwrap().push((
            tag,
            request.cdb.opcode().unwrap_or(0),
            request.lun,
            request.attr,
        ));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(tag, tx);
        Submitted {
            tag,
            outcome: Box::pin(async move { rx.await.unwrap_or(Err(InitiatorError::Closed)) }),
        }
    }

    fn task_management(
        &self,
        _lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        self.tmfs.lock().unwrap().push(function);
        let victims: Vec<u64> = match function {
            TmfFunction::AbortTask { tag } => vec![tag],
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset => {
                self.pending.lock().unwrap().keys().copied().collect()
            }
            _ => Vec::new(),
        };
        for t in victims {
            self.complete(t, Err(InitiatorError::Aborted));
        }
        Box::pin(std::future::ready(Ok(TmfResponse::FunctionComplete)))
    }

    fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    fn remote(&self) -> String {
        "held".into()
    }
}

#[derive(Debug)]
struct HeldFactory {
    per_nexus: bool,
    opened: Mutex<Vec<Arc<Held>>>,
}

impl HeldFactory {
    fn new(per_nexus: bool) -> Arc<HeldFactory> {
        Arc::new(HeldFactory {
            per_nexus,
            opened: Mutex::new(Vec::new()),
        })
    }
    fn get(&self, i: usize) -> Arc<Held> {
        self.opened.lock().unwrap()[i].clone()
    }
}

impl InitiatorFactory for HeldFactory {
    fn open(&self, _nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        let mut o = self.opened.lock().unwrap();
        if !self.per_nexus && !o.is_empty() {
            return Ok(o[0].clone());
        }
        let h = Arc::new(Held::default());
        o.push(h.clone());
        Ok(h)
    }
    fn per_nexus(&self) -> bool {
        self.per_nexus
    }
}

fn held(per_nexus: bool) -> (RemoteLu, Arc<HeldFactory>) {
    let f = HeldFactory::new(per_nexus);
    let mut c = cfg(Identity::Passthrough);
    c.remote_lun = Lun(1 << 48);
    (RemoteLu::new(c, f.clone()), f)
}

#[tokio::test]
async fn submission_order_is_execute_order_and_attributes_pass() {
    let (remote, f) = held(true);
    let n = nexus("iqn.2026-11.io.example:a");
    let mut futs = Vec::new();
    for (i, attr) in [
        TaskAttr::Simple,
        TaskAttr::Ordered,
        TaskAttr::HeadOfQueue,
        TaskAttr::Simple,
    ]
    .into_iter()
    .enumerate()
    {
        let mut t = read10(&n, i as u64, i as u32, 1, 512);
        t.attr = attr;
        futs.push(remote.execute(t));
    }
    let h = f.get(0);
    let s = h.submitted.lock().unwrap().clone();
    assert_eq!(s.len(), 4, "submitted before any future was polled");
    assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(
        s.iter().map(|x| x.3).collect::<Vec<_>>(),
        vec![
            TaskAttr::Simple,
            TaskAttr::Ordered,
            TaskAttr::HeadOfQueue,
            TaskAttr::Simple
        ]
    );
    assert!(
        s.iter().all(|x| x.2 == Lun(1 << 48)),
        "the remote LUN is used"
    );
    // Complete in reverse; each future gets its own answer.
    for (i, tag) in h.tags().into_iter().enumerate().rev() {
        h.complete(
            tag,
            Ok(TaskResult::with_data(Bytes::from(vec![i as u8; 512]))),
        );
    }
    for (i, fut) in futs.into_iter().enumerate() {
        let r = fut.await;
        assert_eq!(data_of(&r), vec![i as u8; 512]);
    }
}

#[tokio::test]
async fn transport_failure_is_retryable_sense_never_good() {
    let (remote, f) = held(true);
    let n = nexus("iqn.2026-11.io.example:a");
    let a = remote.execute(read10(&n, 1, 0, 1, 512));
    let b = remote.execute(read10(&n, 2, 0, 1, 512));
    let h = f.get(0);
    let tags = h.tags();
    h.complete(tags[0], Err(InitiatorError::Disconnected));
    h.complete(
        tags[1],
        Err(InitiatorError::Timeout {
            after: std::time::Duration::from_secs(5),
        }),
    );
    let (a, b) = (a.await, b.await);
    for (r, want) in [
        (a, asc::LOGICAL_UNIT_COMMUNICATION_FAILURE),
        (b, asc::LOGICAL_UNIT_COMMUNICATION_TIME_OUT),
    ] {
        assert_eq!(r.status, Status::CHECK_CONDITION);
        assert!(r.data_in.is_empty());
        let s = sense_of(&r);
        assert_eq!((s.key, s.asc), (SenseKey::ABORTED_COMMAND, want));
    }
}

#[tokio::test]
async fn abort_task_goes_out_by_the_remote_tag_and_waits_for_the_task() {
    let (remote, f) = held(true);
    let n = nexus("iqn.2026-11.io.example:a");
    let keep = remote.execute(read10(&n, 7, 0, 1, 512));
    let victim = tokio::spawn(remote.execute(read10(&n, 8, 0, 1, 512)));
    let h = f.get(0);
    let remote_tag = h.tags()[1];
    let resp = remote
        .task_management(TmfRequest {
            nexus: n.clone(),
            lun: Lun(0),
            function: TmfFunction::AbortTask { tag: 8 },
        })
        .await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert_eq!(
        h.tmfs.lock().unwrap().clone(),
        vec![TmfFunction::AbortTask { tag: remote_tag }]
    );
    assert!(victim.is_finished() || victim.await.unwrap().aborted);
    // The other task is untouched.
    h.complete(h.tags()[0], Ok(TaskResult::good()));
    assert_eq!(keep.await.status, Status::GOOD);
    // ABORT TASK for a tag that is not in flight is FUNCTION COMPLETE and
    // sends nothing.
    let resp = remote
        .task_management(TmfRequest {
            nexus: n,
            lun: Lun(0),
            function: TmfFunction::AbortTask { tag: 99 },
        })
        .await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert_eq!(h.tmfs.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_task_that_ends_after_the_abort_was_marked_reports_aborted() {
    let (remote, f) = held(true);
    let n = nexus("iqn.2026-11.io.example:a");
    let fut = remote.execute(read10(&n, 1, 0, 1, 512));
    // The abort is marked locally first; the remote's good status racing it
    // must not reach the host after the TMF.
    let wait = remote.inner.tasks.abort_matching(|_, t| t == 1);
    let h = f.get(0);
    h.complete(h.tags()[0], Ok(TaskResult::good()));
    assert!(fut.await.aborted);
    wait.await;
}

#[tokio::test]
async fn abort_task_set_per_nexus_and_shared() {
    for per_nexus in [true, false] {
        let (remote, f) = held(per_nexus);
        let a = nexus("iqn.2026-11.io.example:a");
        let b = nexus("iqn.2026-11.io.example:b");
        let fa1 = tokio::spawn(remote.execute(read10(&a, 1, 0, 1, 512)));
        let fa2 = tokio::spawn(remote.execute(read10(&a, 2, 0, 1, 512)));
        let fb = remote.execute(read10(&b, 1, 0, 1, 512));
        let resp = remote
            .task_management(TmfRequest {
                nexus: a.clone(),
                lun: Lun(0),
                function: TmfFunction::AbortTaskSet,
            })
            .await;
        assert_eq!(resp, TmfResponse::FunctionComplete);
        assert!(fa1.await.unwrap().aborted);
        assert!(fa2.await.unwrap().aborted);
        let ha = f.get(0);
        let tmfs = ha.tmfs.lock().unwrap().clone();
        if per_nexus {
            assert_eq!(tmfs, vec![TmfFunction::AbortTaskSet]);
            let hb = f.get(1);
            assert!(hb.tmfs.lock().unwrap().is_empty());
            hb.complete(hb.tags()[0], Ok(TaskResult::good()));
        } else {
            // A shared remote nexus: only A's tasks, one ABORT TASK each.
            let tags = ha.tags();
            let mut sent: Vec<_> = tmfs
                .iter()
                .map(|t| match t {
                    TmfFunction::AbortTask { tag } => *tag,
                    other => panic!("unexpected {other:?}"),
                })
                .collect();
            sent.sort();
            assert_eq!(sent, vec![tags[0], tags[1]]);
            ha.complete(tags[2], Ok(TaskResult::good()));
        }
        assert_eq!(fb.await.status, Status::GOOD, "B's task is not affected");
    }
}

#[tokio::test]
async fn lu_reset_goes_out_and_aborts_other_nexuses_tasks_at_the_remote() {
    let (remote, f) = held(true);
    let a = nexus("iqn.2026-11.io.example:a");
    let b = nexus("iqn.2026-11.io.example:b");
    let fa = tokio::spawn(remote.execute(read10(&a, 1, 0, 1, 512)));
    let fb = tokio::spawn(remote.execute(read10(&b, 1, 0, 1, 512)));
    tokio::task::yield_now().await;
    let resp = remote
        .task_management(TmfRequest {
            nexus: a.clone(),
            lun: Lun(0),
            function: TmfFunction::TargetReset,
        })
        .await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert!(fa.await.unwrap().aborted);
    assert!(fb.await.unwrap().aborted);
    assert_eq!(
        f.get(0).tmfs.lock().unwrap().clone(),
        vec![TmfFunction::LogicalUnitReset],
        "TARGET RESET becomes LOGICAL UNIT RESET at the remote"
    );
    assert_eq!(
        f.get(1).tmfs.lock().unwrap().clone(),
        vec![TmfFunction::AbortTaskSet]
    );
}

/// On a shared remote nexus the remote tells one host (the one whose
/// command comes next) what it means for all: the gateway tells the
/// others. With a remote nexus per host the remote tells each itself.
#[tokio::test]
async fn a_shared_remote_nexus_tells_every_host_of_a_unit_attention_or_reset() {
    let tur = [0u8; 6];
    for per_nexus in [false, true] {
        let (remote, f) = held(per_nexus);
        let a = nexus("iqn.2026-11.io.example:a");
        let b = nexus("iqn.2026-11.io.example:b");
        // Runs a command that must reach the remote and answers it.
        let forwarded = |n: &ItNexus, tag: u64, answer: TaskResult| {
            let sent = || -> usize {
                let opened = f.opened.lock().unwrap().clone();
                opened.iter().map(|h| h.tags().len()).sum()
            };
            let before = sent();
            let fut = remote.execute(task(n, tag, &tur, 0));
            assert_eq!(sent(), before + 1, "tag {tag} did not reach the remote");
            let h = f.get(if per_nexus && *n == b { 1 } else { 0 });
            h.complete(*h.tags().last().unwrap(), Ok(answer));
            fut
        };
        assert_eq!(
            forwarded(&a, 1, TaskResult::good()).await.status,
            Status::GOOD
        );
        assert_eq!(
            forwarded(&b, 1, TaskResult::good()).await.status,
            Status::GOOD
        );

        let changed = TaskResult::check_condition(Sense::new(
            SenseKey::UNIT_ATTENTION,
            asc::MODE_PARAMETERS_CHANGED,
        ));
        let r = forwarded(&a, 2, changed).await;
        assert_eq!(
            sense_of(&r).asc,
            asc::MODE_PARAMETERS_CHANGED,
            "A's, unchanged"
        );
        if per_nexus {
            let r = forwarded(&b, 2, TaskResult::good()).await;
            assert_eq!(r.status, Status::GOOD, "B's own remote nexus tells B");
        } else {
            let r = at_once(remote.execute(task(&b, 2, &tur, 0)));
            let s = sense_of(&r);
            assert_eq!(
                (s.key, s.asc),
                (SenseKey::UNIT_ATTENTION, asc::MODE_PARAMETERS_CHANGED),
                "B learns it from the gateway"
            );
            assert_eq!(
                forwarded(&b, 3, TaskResult::good()).await.status,
                Status::GOOD
            );
        }
        assert_eq!(
            forwarded(&a, 3, TaskResult::good()).await.status,
            Status::GOOD
        );

        // A LOGICAL UNIT RESET from A.
        let resp = remote
            .task_management(TmfRequest {
                nexus: a.clone(),
                lun: Lun(0),
                function: TmfFunction::LogicalUnitReset,
            })
            .await;
        assert_eq!(resp, TmfResponse::FunctionComplete);
        assert_eq!(
            f.get(0).tmfs.lock().unwrap().clone(),
            vec![TmfFunction::LogicalUnitReset]
        );
        if per_nexus {
            assert_eq!(
                forwarded(&b, 4, TaskResult::good()).await.status,
                Status::GOOD
            );
        } else {
            let r = at_once(remote.execute(task(&b, 4, &tur, 0)));
            assert_eq!(sense_of(&r).asc, asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED);
        }
        assert_eq!(
            forwarded(&a, 4, TaskResult::good()).await.status,
            Status::GOOD
        );
    }
}

#[tokio::test]
async fn queries_are_answered_from_tasks_in_flight() {
    let (remote, f) = held(true);
    let n = nexus("iqn.2026-11.io.example:a");
    let fut = remote.execute(read10(&n, 5, 0, 1, 512));
    let q = |function| {
        remote.task_management(TmfRequest {
            nexus: n.clone(),
            lun: Lun(0),
            function,
        })
    };
    assert_eq!(
        q(TmfFunction::QueryTask { tag: 5 }).await,
        TmfResponse::FunctionSucceeded
    );
    assert_eq!(
        q(TmfFunction::QueryTask { tag: 6 }).await,
        TmfResponse::FunctionComplete
    );
    assert_eq!(
        q(TmfFunction::QueryTaskSet).await,
        TmfResponse::FunctionSucceeded
    );
    let h = f.get(0);
    h.complete(h.tags()[0], Ok(TaskResult::good()));
    fut.await;
    assert_eq!(
        q(TmfFunction::QueryTaskSet).await,
        TmfResponse::FunctionComplete
    );
    assert!(h.tmfs.lock().unwrap().is_empty());
}

#[tokio::test]
async fn task_set_full_and_dropped_futures() {
    let f = HeldFactory::new(true);
    let mut c = cfg(Identity::Passthrough);
    c.task_set_depth = 2;
    let remote = RemoteLu::new(c, f.clone());
    let n = nexus("iqn.2026-11.io.example:a");
    let a = remote.execute(read10(&n, 1, 0, 1, 512));
    let _b = remote.execute(read10(&n, 2, 0, 1, 512));
    let full = remote.execute(read10(&n, 3, 0, 1, 512)).await;
    assert_eq!(full.status, Status::TASK_SET_FULL);
    assert_eq!(f.get(0).tags().len(), 2, "the third was not sent");
    drop(a);
    // Dropping the front end's future frees the slot (the initiator
    // abandons the command).
    let h = f.get(0);
    let c3 = remote.execute(read10(&n, 3, 0, 1, 512));
    h.complete(h.tags()[2], Ok(TaskResult::good()));
    assert_eq!(c3.await.status, Status::GOOD);
}

#[tokio::test]
async fn nexus_loss_closes_only_per_nexus_initiators() {
    for per_nexus in [true, false] {
        let (remote, f) = held(per_nexus);
        let a = nexus("iqn.2026-11.io.example:a");
        let fut = remote.execute(task(&a, 1, &[0, 0, 0, 0, 0, 0], 0));
        let h = f.get(0);
        h.complete(h.tags()[0], Ok(TaskResult::good()));
        fut.await;
        remote.nexus_loss(&a);
        assert_eq!(*h.closed.lock().unwrap(), per_nexus);
    }
}

#[test]
fn extended_copy_cscds_naming_the_derived_naa_name_the_remote() {
    let from = 0x3000_0000_0000_0001u64;
    let to = 0x6000_0000_0000_0002u64;
    let cscd = |naa: u64| {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 8;
        d[8..16].copy_from_slice(&naa.to_be_bytes());
        d
    };
    let mut list = vec![0u8; 16];
    list[3] = 64;
    list.extend(cscd(from));
    list.extend(cscd(0x3000_0000_0000_0009));
    list.extend(vec![0x02u8; 28]);
    // Split across two slices, as data-out PDUs may be.
    let parts = [
        Bytes::copy_from_slice(&list[..40]),
        Bytes::copy_from_slice(&list[40..]),
    ];
    let out = super::rewrite_cscd_naa(&parts, from, to).expect("rewritten");
    assert_eq!(&out[24..32], &to.to_be_bytes());
    assert_eq!(&out[56..64], &0x3000_0000_0000_0009u64.to_be_bytes());
    assert_eq!(&out[..16], &list[..16]);
    assert_eq!(&out[80..], &list[80..]);
    assert!(super::rewrite_cscd_naa(&parts, to, from).is_none());
    assert!(super::rewrite_cscd_naa(&[Bytes::from_static(&[0, 1])], from, to).is_none());
}

/// A burst of transport failures is logged once and counted: the first
/// is logged, the rest of the second only counted (and reported with the
/// next one logged); aborts are the host's own doing and not counted.
#[test]
fn failure_log_counts_a_burst_instead_of_repeating_it() {
    let log = FailureLog::default();
    let cfg = RemoteLuConfig {
        name: "lu".into(),
        backend: "fc://x/0".into(),
        remote_lun: Lun::ZERO,
        identity: Identity::Passthrough,
        task_set_depth: 1,
        read_only: false,
    };
    log.record(&cfg, 0x28, &InitiatorError::Disconnected);
    assert!(log.last.lock().unwrap().is_some(), "the first is logged");
    for _ in 0..5 {
        log.record(&cfg, 0x28, &InitiatorError::Closed);
    }
    log.record(&cfg, 0x28, &InitiatorError::Aborted);
    assert_eq!(log.suppressed.load(Ordering::Relaxed), 5);
    // A second later the next one is logged and takes the count with it.
    *log.last.lock().unwrap() = Some(std::time::Instant::now() - std::time::Duration::from_secs(2));
    log.record(&cfg, 0x2a, &InitiatorError::Disconnected);
    assert_eq!(log.suppressed.load(Ordering::Relaxed), 0);
}
