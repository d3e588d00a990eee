//! ALUA on the emulated disk: REPORT and SET TARGET PORT GROUPS, the unit
//! attentions of a transition, and what each state lets through, with two
//! hosts on ports of two groups.

use super::tests::{
    assert_good, assert_sense, assert_ua, caw, data, overwrite_params, run, rw10, rw16, sanitize,
    sense_of, xcopy_cdb, xcopy_list,
};
use super::*;
use crate::alua::{AccessState, AluaConfig, PortGroup};
use crate::backend::MemoryBackend;
use crate::task::TargetPort;

/// A host's nexus through relative port `port` of group `group`.
pub(super) fn via(init: &str, port: u16, group: u16) -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: init.into(),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: format!("iqn.2026-11.io.unifab:t,t,{port:#x}"),
                isid: None,
            },
            relative_port_id: port,
            port_group: group,
        },
    )
}

fn two_groups(explicit: bool) -> AluaConfig {
    AluaConfig {
        groups: vec![
            PortGroup {
                id: 1,
                state: AccessState::ActiveOptimized,
                preferred: true,
                ports: vec![1],
            },
            PortGroup {
                id: 2,
                state: AccessState::ActiveNonOptimized,
                preferred: false,
                ports: vec![2, 3],
            },
        ],
        explicit,
        transition_secs: 7,
    }
}

fn lu(alua: AluaConfig) -> Result<EmulatedLu, LuError> {
    EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            alua,
            ..EmulatedLuConfig::default()
        },
        Arc::new(MemoryBackend::new(1 << 20)),
    )
}

const TUR: [u8; 6] = [0; 6];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 1, 0, 0];
const MODE_SENSE6: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 96, 0];

fn rtpg(extended: bool) -> [u8; 12] {
    [
        0xa3,
        if extended { 0x2a } else { 0x0a },
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
    ]
}

fn stpg(len: u32) -> [u8; 12] {
    let l = len.to_be_bytes();
    [0xa4, 0x0a, 0, 0, 0, 0, l[0], l[1], l[2], l[3], 0, 0]
}

fn stpg_params(to: &[(u16, u8)]) -> Vec<u8> {
    let mut p = vec![0u8; 4];
    for (g, s) in to {
        p.extend_from_slice(&[*s, 0]);
        p.extend_from_slice(&g.to_be_bytes());
    }
    p
}

/// (PREF, state, group, status code, ports) of each RTPG descriptor.
fn groups_of(rtpg: &[u8], extended: bool) -> Vec<(bool, u8, u16, u8, Vec<u16>)> {
    let len = u32::from_be_bytes(rtpg[..4].try_into().unwrap()) as usize;
    let start = if extended { 8 } else { 4 };
    assert_eq!(rtpg.len(), start + len, "RETURN DATA LENGTH");
    let mut out = Vec::new();
    let mut at = start;
    while at < rtpg.len() {
        let d = &rtpg[at..];
        assert_eq!(d[1], 0x8f, "T_SUP U_SUP S_SUP AN_SUP AO_SUP");
        let n = usize::from(d[7]);
        let ports = (0..n)
            .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
            .collect();
        out.push((
            d[0] & 0x80 != 0,
            d[0] & 0x0f,
            u16::from_be_bytes([d[2], d[3]]),
            d[5],
            ports,
        ));
        at += 8 + 4 * n;
    }
    out
}

async fn ready(lu: &EmulatedLu, n: &ItNexus) {
    assert_ua(
        &run(lu, n, &TUR, &[]).await,
        asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
    );
    assert_good(&run(lu, n, &TUR, &[]).await);
}

#[tokio::test]
async fn report_lists_every_group_and_set_moves_them_with_attentions_to_the_others() {
    let lu = lu(two_groups(true)).unwrap();
    let a = via("iqn.host-a", 1, 1);
    let b = via("iqn.host-b", 2, 2);
    ready(&lu, &a).await;
    ready(&lu, &b).await;
    let inq = data(&run(&lu, &a, &INQUIRY, &[]).await);
    assert_eq!(inq[5] & 0x30, 0x30, "TPGS = 11b: implicit and explicit");
    assert_eq!(inq[5] & 0x08, 0x08, "3PC: EXTENDED COPY is supported");
    let r = data(&run(&lu, &b, &rtpg(true), &[]).await);
    assert_eq!((r[4], r[5]), (0x10, 7), "extended format, transition time");
    assert_eq!(
        groups_of(&r, true),
        vec![(true, 0, 1, 0, vec![1]), (false, 1, 2, 0, vec![2, 3])]
    );
    assert_eq!(
        groups_of(&data(&run(&lu, &a, &rtpg(false), &[]).await), false).len(),
        2,
        "the same groups through either port, in either format"
    );

    // Host A moves the optimized group: its own to Standby.
    let p = stpg_params(&[(1, 2), (2, 0)]);
    assert_good(&run(&lu, &a, &stpg(p.len() as u32), &p).await);
    assert_eq!(
        lu.alua_states(),
        vec![(1, AccessState::Standby), (2, AccessState::ActiveOptimized)]
    );
    assert_ua(
        &run(&lu, &b, &TUR, &[]).await,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_good(&run(&lu, &b, &READ10, &[]).await);
    // A asked, so it hears no attention; through a Standby port only the
    // commands SPC-4 lists for Standby run.
    assert_sense(
        &run(&lu, &a, &READ10, &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
    );
    assert_sense(
        &run(&lu, &a, &TUR, &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
    );
    assert_good(&run(&lu, &a, &INQUIRY, &[]).await);
    assert_good(&run(&lu, &a, &MODE_SENSE6, &[]).await);
    let r = data(&run(&lu, &a, &rtpg(false), &[]).await);
    assert_eq!(
        groups_of(&r, false),
        vec![(true, 2, 1, 1, vec![1]), (false, 0, 2, 1, vec![2, 3])],
        "states and STATUS CODE 01h (altered by SET TARGET PORT GROUPS)"
    );

    // The gateway's own (implicit) transitions reach both hosts.
    assert!(lu.set_alua_state(1, AccessState::Unavailable));
    assert!(!lu.set_alua_state(1, AccessState::Unavailable), "no change");
    assert!(!lu.set_alua_state(9, AccessState::Standby), "no such group");
    for n in [&a, &b] {
        assert_ua(
            &run(&lu, n, &TUR, &[]).await,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
        );
    }
    assert_sense(
        &run(&lu, &a, &MODE_SENSE6, &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE,
    );
    let r = data(&run(&lu, &a, &rtpg(false), &[]).await);
    assert_eq!(groups_of(&r, false)[0].3, 2, "STATUS CODE 02h: implicit");
    assert!(lu.set_alua_state(1, AccessState::Transitioning));
    for n in [&a, &b] {
        assert_ua(
            &run(&lu, n, &TUR, &[]).await,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
        );
    }
    assert_sense(
        &run(&lu, &a, &TUR, &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_ASYMMETRIC_ACCESS_STATE_TRANSITION,
    );
    assert_good(&run(&lu, &a, &rtpg(true), &[]).await);
    // Back to active: everything runs again.
    let p = stpg_params(&[(1, 1)]);
    assert_sense(
        &run(&lu, &a, &stpg(p.len() as u32), &p).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_ASYMMETRIC_ACCESS_STATE_TRANSITION,
    );
    assert_good(&run(&lu, &b, &stpg(p.len() as u32), &p).await);
    assert_ua(
        &run(&lu, &a, &READ10, &[]).await,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_good(&run(&lu, &a, &READ10, &[]).await);
}

#[tokio::test]
async fn set_target_port_groups_checks_every_descriptor_before_changing_any() {
    let lu = lu(two_groups(true)).unwrap();
    let a = via("iqn.host-a", 1, 1);
    ready(&lu, &a).await;
    let before = lu.alua_states();
    // An unknown group after a good descriptor: nothing changes.
    for (p, field) in [
        (stpg_params(&[(2, 2), (5, 0)]), 10u16),
        (stpg_params(&[(2, 0xf)]), 4),
        (stpg_params(&[(2, 0xe)]), 4),
        (stpg_params(&[(1, 0), (1, 1)]), 10),
    ] {
        let r = run(&lu, &a, &stpg(p.len() as u32), &p).await;
        let s = sense_of(&r);
        assert_eq!(
            (s.key, s.asc),
            (
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_FIELD_IN_PARAMETER_LIST
            )
        );
        let ks = s.key_specific.expect("a field pointer");
        assert_eq!(ks[0] & 0xc0, 0x80, "SKSV, in the parameter list");
        assert_eq!(u16::from_be_bytes([ks[1], ks[2]]), field);
        assert_eq!(lu.alua_states(), before);
    }
    let p = vec![0u8; 6];
    assert_sense(
        &run(&lu, &a, &stpg(6), &p).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    // A list shorter than the length the CDB gives.
    assert_sense(
        &run(&lu, &a, &stpg(8), &[0u8; 4]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    assert_eq!(lu.alua_states(), before);

    // Implicit only: TPGS 01b, SET TARGET PORT GROUPS not supported.
    let lu = self::lu(two_groups(false)).unwrap();
    ready(&lu, &a).await;
    assert_eq!(data(&run(&lu, &a, &INQUIRY, &[]).await)[5] & 0x30, 0x10);
    let p = stpg_params(&[(2, 0)]);
    assert_sense(
        &run(&lu, &a, &stpg(p.len() as u32), &p).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
}

#[tokio::test]
async fn without_groups_the_arriving_port_is_active_optimized() {
    let lu = lu(AluaConfig::default()).unwrap();
    let n = via("iqn.host-a", 5, 3);
    ready(&lu, &n).await;
    let r = data(&run(&lu, &n, &rtpg(false), &[]).await);
    assert_eq!(groups_of(&r, false), vec![(false, 0, 3, 0, vec![5])]);
}

#[test]
fn inconsistent_groups_are_refused() {
    let mut c = two_groups(true);
    c.groups[1].id = 1;
    assert!(matches!(lu(c), Err(LuError::Alua(_))));
    let mut c = two_groups(true);
    c.groups[1].ports = vec![1];
    assert!(matches!(lu(c), Err(LuError::Alua(_))));
    let mut c = two_groups(true);
    c.groups[0].id = 0;
    assert!(matches!(lu(c), Err(LuError::Alua(_))));
    let mut c = two_groups(true);
    c.groups[0].state = AccessState::Transitioning;
    assert!(matches!(lu(c), Err(LuError::Alua(_))));
}

/// A cluster's store that applies a request on two members' LUs at once.
#[derive(Debug)]
struct TwoMembers {
    lus: std::sync::Mutex<Vec<std::sync::Weak<EmulatedLu>>>,
    asked: std::sync::Mutex<Vec<Vec<(u16, AccessState)>>>,
}

impl crate::alua::AluaStore for TwoMembers {
    fn set(
        &self,
        to: Vec<(u16, AccessState)>,
        requester: crate::pr::PortKey,
    ) -> BoxFuture<'static, Result<(), String>> {
        self.asked.lock().unwrap().push(to.clone());
        let lus: Vec<_> = self
            .lus
            .lock()
            .unwrap()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for lu in lus {
            lu.set_alua_states_explicit(&to, Some(&requester));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

#[tokio::test]
async fn set_through_a_clusters_store_is_checked_here_and_applied_on_every_member() {
    let store = Arc::new(TwoMembers {
        lus: Default::default(),
        asked: Default::default(),
    });
    let a = Arc::new(lu(two_groups(true)).unwrap());
    let b = Arc::new(lu(two_groups(true)).unwrap());
    for l in [&a, &b] {
        assert!(l.share_alua(store.clone()));
        store.lus.lock().unwrap().push(Arc::downgrade(l));
    }
    let h1 = via("iqn.2026-11.test:h1", 1, 1);
    let h2 = via("iqn.2026-11.test:h2", 2, 2);
    ready(&a, &h1).await;
    ready(&b, &h2).await;
    // A bad request is refused here and never reaches the store.
    let bad = stpg_params(&[(9, 0)]);
    let r = run(&a, &h1, &stpg(bad.len() as u32), &bad).await;
    assert_eq!(sense_of(&r).asc, asc::INVALID_FIELD_IN_PARAMETER_LIST);
    assert!(store.asked.lock().unwrap().is_empty());
    // Group 2 optimized, group 1 non-optimized, asked through A.
    let p = stpg_params(&[(2, 0), (1, 1)]);
    assert_good(&run(&a, &h1, &stpg(p.len() as u32), &p).await);
    assert_eq!(store.asked.lock().unwrap().len(), 1);
    for l in [&a, &b] {
        assert_eq!(
            l.alua_states(),
            vec![
                (1, AccessState::ActiveNonOptimized),
                (2, AccessState::ActiveOptimized)
            ]
        );
    }
    // B's host hears of it; A's, which asked, does not.
    assert_ua(
        &run(&b, &h2, &TUR, &[]).await,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_good(&run(&a, &h1, &TUR, &[]).await);
    // Both report STATUS CODE 01h (by SET TARGET PORT GROUPS).
    let g = groups_of(&data(&run(&b, &h2, &rtpg(false), &[]).await), false);
    assert_eq!(
        g.iter().map(|d| (d.1, d.2, d.3)).collect::<Vec<_>>(),
        vec![(1, 1, 1), (0, 2, 1)]
    );
}

/// A write that arrived while its port was active and waits (here for the
/// write lock, as it may for an I/O thread) while the port turns
/// Unavailable — a cluster member fencing itself — is not handed to the
/// backend: NOT READY, TARGET PORT IN UNAVAILABLE STATE, and the medium
/// is unchanged. The write has FUA, and a FUA write not issued is not a
/// failed flush: SYNCHRONIZE CACHE still succeeds after it (else every
/// flush of the LU would fail until a restart once the member is back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_held_up_past_its_ports_fencing_is_not_issued() {
    let lu = Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Blocking,
                alua: two_groups(false),
                ..EmulatedLuConfig::default()
            },
            Arc::new(MemoryBackend::new(1 << 20)),
        )
        .unwrap(),
    );
    let h = via("iqn.2026-11.test:h1", 1, 1);
    ready(&lu, &h).await;
    let write = [0x2a, 0x08, 0, 0, 0, 0, 0, 0, 1, 0];
    let held = lu.inner.write_lock.write().unwrap();
    let pending = {
        let (lu, h) = (lu.clone(), h.clone());
        tokio::spawn(async move { run(&lu, &h, &write, &[0xab; 512]).await })
    };
    // The write is past its arrival checks and waits for the lock.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!pending.is_finished());
    assert!(lu.set_alua_state(1, AccessState::Unavailable));
    drop(held);
    let r = pending.await.unwrap();
    assert_sense(
        &r,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE,
    );
    // Through the other group: the block was never written.
    let h2 = via("iqn.2026-11.test:h2", 2, 2);
    ready(&lu, &h2).await;
    let r = run(&lu, &h2, &READ10, &[]).await;
    assert_good(&r);
    assert!(
        data(&r).iter().all(|b| *b == 0),
        "the write reached the medium"
    );
    let sync = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_good(&run(&lu, &h2, &sync, &[]).await);
    assert!(lu.set_alua_state(1, AccessState::ActiveOptimized));
    assert_ua(
        &run(&lu, &h, &TUR, &[]).await,
        asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_good(&run(&lu, &h, &write, &[0xab; 512]).await);
}

/// Not only WRITE: every command that changes the medium — ORWRITE,
/// COMPARE AND WRITE, WRITE SAME (a pattern, zeros, UNMAP), UNMAP,
/// EXTENDED COPY, SANITIZE — that is past its arrival checks and waits (for
/// the write lock here, as it may for an I/O thread) while its port turns
/// Unavailable changes nothing and answers NOT READY, TARGET PORT IN
/// UNAVAILABLE STATE. Each case fails if its path hands the change to the
/// backend without asking the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_medium_change_is_issued_past_its_ports_fencing() {
    medium_changes_held_up_past_a_fence(false).await;
}

/// The same, with the port Active again before the command goes on — a
/// member that fenced itself and has joined the cluster again: what
/// arrived before the fence still changes nothing (in between, another
/// gateway may have served the LU, and the host may have sent the same
/// blocks there). Each case fails where the fence looks only at the
/// port's state now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_medium_change_admitted_before_a_fence_is_issued_after_it_ends() {
    medium_changes_held_up_past_a_fence(true).await;
}

/// Each medium-changing command, held up for the write lock while its
/// port's group turns Unavailable (and, with `active_again`, Active again)
/// then let go: refused, and the medium as it was.
async fn medium_changes_held_up_past_a_fence(active_again: bool) {
    const OLD: u8 = 0x5a;
    let unmap = |lba: u64, n: u32| {
        let mut p = vec![0u8; 8];
        p[1] = 22;
        p[3] = 16;
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&lba.to_be_bytes());
        d[8..12].copy_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&d);
        p
    };
    let overwrite = overwrite_params(0x01, &[0xab]);
    type Case = (&'static str, Vec<u8>, Vec<u8>);
    let cases: Vec<Box<dyn Fn(u64) -> Case>> = vec![
        Box::new(|_| {
            (
                "WRITE(16)",
                rw16(0x8a, 0, 0, 8).to_vec(),
                vec![0xab; 8 * 512],
            )
        }),
        Box::new(|_| {
            (
                "ORWRITE(16)",
                rw16(0x8b, 0, 0, 8).to_vec(),
                vec![0x01; 8 * 512],
            )
        }),
        Box::new(|_| {
            let mut d = vec![OLD; 512];
            d.extend_from_slice(&[0xab; 512]);
            ("COMPARE AND WRITE", caw(0, 1).to_vec(), d)
        }),
        Box::new(|_| {
            (
                "WRITE SAME(16)",
                rw16(0x93, 0, 0, 8).to_vec(),
                vec![0xab; 512],
            )
        }),
        Box::new(|_| {
            (
                "WRITE SAME(16) of zeros",
                rw16(0x93, 0, 0, 8).to_vec(),
                vec![0; 512],
            )
        }),
        Box::new(|_| {
            (
                "WRITE SAME(16) UNMAP",
                rw16(0x93, 0x08, 0, 8).to_vec(),
                vec![0; 512],
            )
        }),
        Box::new(move |_| {
            let p = unmap(0, 8);
            let mut c = [0u8; 10];
            c[0] = 0x42;
            c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
            ("UNMAP", c.to_vec(), p)
        }),
        Box::new(|naa| {
            // From blocks 1000.. (zeros) onto blocks 0..8.
            let p = xcopy_list(1, 0, naa, 8, 1000, 0);
            ("EXTENDED COPY", xcopy_cdb(p.len() as u32).to_vec(), p)
        }),
        Box::new(move |_| {
            (
                "SANITIZE OVERWRITE",
                sanitize(false, 1, overwrite.len() as u16).to_vec(),
                overwrite.clone(),
            )
        }),
        Box::new(|_| {
            (
                "SANITIZE BLOCK ERASE",
                sanitize(false, 2, 0).to_vec(),
                vec![],
            )
        }),
    ];
    for case in &cases {
        let lu = Arc::new(
            EmulatedLu::new(
                EmulatedLuConfig {
                    io_mode: IoMode::Blocking,
                    alua: two_groups(false),
                    sanitize_rate: 0,
                    ..EmulatedLuConfig::default()
                },
                Arc::new(MemoryBackend::new(1 << 20)),
            )
            .unwrap(),
        );
        let (what, cdb, out) = case(lu.naa());
        let h = via("iqn.2026-11.test:h1", 1, 1);
        let h2 = via("iqn.2026-11.test:h2", 2, 2);
        ready(&lu, &h).await;
        ready(&lu, &h2).await;
        assert_good(&run(&lu, &h2, &rw10(0x2a, 0, 0, 8), &[OLD; 8 * 512]).await);
        let held = lu.inner.write_lock.write().unwrap();
        let pending = {
            let (lu, h) = (lu.clone(), h.clone());
            tokio::spawn(async move { run(&lu, &h, &cdb, &out).await })
        };
        // The command is past its arrival checks and waits for the lock.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if pending.is_finished() {
            panic!("{what} did not wait for the lock: {:?}", pending.await);
        }
        assert!(lu.set_alua_state(1, AccessState::Unavailable));
        if active_again {
            assert!(lu.set_alua_state(1, AccessState::ActiveOptimized));
        }
        drop(held);
        let r = pending.await.unwrap();
        let s = sense_of(&r);
        assert_eq!(
            (s.key, s.asc),
            (
                SenseKey::NOT_READY,
                asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE
            ),
            "{what}"
        );
        // The medium itself (a SANITIZE that stopped leaves the LU in its
        // failure mode, so not through a READ): as it was.
        let mut medium = vec![0u8; 8 * 512];
        lu.inner.backend.read_at(0, &mut medium).unwrap();
        assert!(
            medium.iter().all(|b| *b == OLD),
            "{what} reached the medium after its port was fenced"
        );
    }
}
