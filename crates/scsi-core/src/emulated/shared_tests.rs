//! Reservations shared through a store: two emulated LUs (two gateways'
//! views of one LU) and an in-memory store that delivers every stored
//! version to both, as the gateway's etcd watch does.

use std::sync::Weak;

use super::tests::{assert_good, assert_ua, data, run};
use super::*;
use crate::backend::MemoryBackend;
use crate::pr::ReservationStore;
use crate::task::Lun;

#[derive(Debug, Default)]
struct Cell {
    /// Version and value.
    value: Mutex<(u64, Option<String>)>,
    /// The members' LUs, for delivering versions.
    lus: Mutex<Vec<Weak<EmulatedLu>>>,
    /// The next store loses to a change written in between (this text).
    race: Mutex<Option<String>>,
}

impl Cell {
    /// `lu`'s member is away from the store (fenced): nothing reaches it.
    fn away(&self, lu: &Arc<EmulatedLu>) {
        self.lus
            .lock()
            .unwrap()
            .retain(|w| !w.upgrade().is_some_and(|l| Arc::ptr_eq(&l, lu)));
    }

    /// `lu`'s member joins again: it applies the latest version, as it
    /// reads it at join, and every later one reaches it.
    fn back(&self, lu: &Arc<EmulatedLu>) {
        let (version, text) = self.value.lock().unwrap().clone();
        lu.apply_shared_reservations(version, text.as_deref())
            .unwrap();
        self.lus.lock().unwrap().push(Arc::downgrade(lu));
    }

    fn deliver(&self, version: u64, text: &str) {
        let lus: Vec<_> = self
            .lus
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for lu in lus {
            lu.apply_shared_reservations(version, Some(text)).unwrap();
        }
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    cell: Arc<Cell>,
}

impl ReservationStore for Member {
    fn member(&self) -> &str {
        &self.name
    }
    fn load(&self) -> BoxFuture<'static, Result<(u64, Option<String>), String>> {
        let v = self.cell.value.lock().unwrap().clone();
        Box::pin(std::future::ready(Ok(v)))
    }
    fn store(
        &self,
        version: u64,
        value: String,
    ) -> BoxFuture<'static, Result<Option<u64>, String>> {
        let cell = self.cell.clone();
        Box::pin(async move {
            if let Some(other) = cell.race.lock().unwrap().take() {
                let v = {
                    let mut g = cell.value.lock().unwrap();
                    g.0 += 1;
                    g.1 = Some(other.clone());
                    g.0
                };
                cell.deliver(v, &other);
            }
            let v = {
                let mut g = cell.value.lock().unwrap();
                if g.0 != version {
                    return Ok(None);
                }
                g.0 += 1;
                g.1 = Some(value.clone());
                g.0
            };
            cell.deliver(v, &value);
            Ok(Some(v))
        })
    }
    fn settle(&self, _version: u64) -> BoxFuture<'static, Result<(), String>> {
        // Delivery is synchronous: every member applied it already.
        Box::pin(std::future::ready(Ok(())))
    }
    fn detach(&self, work: BoxFuture<'static, ()>) {
        tokio::spawn(work);
    }
}

fn member_lu(name: &str, cell: &Arc<Cell>) -> Arc<EmulatedLu> {
    let lu = Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                ..EmulatedLuConfig::default()
            },
            Arc::new(MemoryBackend::new(1 << 20)),
        )
        .unwrap(),
    );
    assert!(lu.share_reservations(Arc::new(Member {
        name: name.into(),
        cell: cell.clone(),
    })));
    cell.lus.lock().unwrap().push(Arc::downgrade(&lu));
    lu
}

/// A host through gateway `port`'s target port (each gateway its own,
/// in its own group).
fn via(init: &str, port: u16) -> ItNexus {
    super::alua_tests::via(init, port, port)
}

async fn ready(lu: &EmulatedLu, n: &ItNexus) {
    let r = run(lu, n, &[0; 6], &[]).await;
    assert_ua(&r, asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED);
    assert_good(&run(lu, n, &[0; 6], &[]).await);
}

/// Two members' views of one LU (gw-a, gw-b) on one store, host h1
/// through port 1 of A and h2 through port 2 of B, both past their
/// power-on unit attention.
async fn two_members_ready() -> (Arc<EmulatedLu>, Arc<EmulatedLu>, ItNexus, ItNexus) {
    two_members_ready_on(&Arc::new(Cell::default())).await
}

/// [`two_members_ready`] on a store the test looks into.
async fn two_members_ready_on(
    cell: &Arc<Cell>,
) -> (Arc<EmulatedLu>, Arc<EmulatedLu>, ItNexus, ItNexus) {
    let (a, b) = (member_lu("gw-a", cell), member_lu("gw-b", cell));
    let h1 = via("iqn.2026-11.test:h1", 1);
    let h2 = via("iqn.2026-11.test:h2", 2);
    ready(&a, &h1).await;
    ready(&b, &h2).await;
    (a, b, h1, h2)
}

fn prout(sa: u8, ty: u8) -> [u8; 10] {
    [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0]
}
fn params(rk: u64, sark: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p
}
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const READ_KEYS: [u8; 10] = [0x5e, 0, 0, 0, 0, 0, 0, 0x40, 0, 0];
const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];

fn conflict(r: &TaskResult) {
    assert_eq!(r.status, Status::RESERVATION_CONFLICT, "{r:?}");
}

#[tokio::test]
async fn a_reservation_taken_through_one_gateway_holds_on_the_other() {
    let (a, b, h1, h2) = two_members_ready().await;
    // h1 registers key 0xa through A and takes WRITE EXCLUSIVE.
    assert_good(&run(&a, &h1, &prout(0, 0), &params(0, 0xa)).await);
    assert_good(&run(&a, &h1, &prout(1, 1), &params(0xa, 0)).await);
    // Through B: reads pass, writes conflict, the key is listed.
    assert_good(&run(&b, &h2, &READ10, &[]).await);
    conflict(&run(&b, &h2, &WRITE10, &[0; 512]).await);
    let keys = data(&run(&b, &h2, &READ_KEYS, &[]).await);
    assert_eq!(&keys[4..8], &8u32.to_be_bytes(), "{keys:?}");
    assert_eq!(&keys[8..16], &0xau64.to_be_bytes());
    // h2 registers through B and is preempted through A: B's nexus hears
    // REGISTRATIONS PREEMPTED, and its key is gone.
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0, 0xb)).await);
    let preempt = params(0xa, 0xb);
    assert_good(&run(&a, &h1, &prout(4, 1), &preempt).await);
    assert_ua(
        &run(&b, &h2, &READ10, &[]).await,
        asc::REGISTRATIONS_PREEMPTED,
    );
    let keys = data(&run(&b, &h2, &READ_KEYS, &[]).await);
    assert_eq!(&keys[4..8], &8u32.to_be_bytes(), "{keys:?}");
    // Released through A: B lets writes through again.
    assert_good(&run(&a, &h1, &prout(2, 1), &params(0xa, 0)).await);
    assert_good(&run(&b, &h2, &WRITE10, &[0; 512]).await);
    assert_eq!(
        a.shared_reservations_version(),
        b.shared_reservations_version()
    );
}

#[tokio::test]
async fn reserve6_is_shared_and_a_reset_through_either_gateway_releases_it() {
    let cell = Arc::new(Cell::default());
    let (a, b, h1, h2) = two_members_ready_on(&cell).await;
    assert_good(&run(&a, &h1, &RESERVE6, &[]).await);
    conflict(&run(&b, &h2, &RESERVE6, &[]).await);
    conflict(&run(&b, &h2, &READ10, &[]).await);
    // RELEASE by a non-holder changes nothing.
    assert_good(&run(&b, &h2, &RELEASE6, &[]).await);
    conflict(&run(&b, &h2, &READ10, &[]).await);
    // A LOGICAL UNIT RESET through B releases A's holder.
    let r = b
        .task_management(TmfRequest {
            nexus: h2.clone(),
            lun: Lun::ZERO,
            function: TmfFunction::LogicalUnitReset,
        })
        .await;
    assert_eq!(r, TmfResponse::FunctionComplete);
    assert_ua(
        &run(&b, &h2, &READ10, &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    // A's nexus hears the reset too: one LU behind both gateways.
    assert_ua(
        &run(&a, &h1, &READ10, &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&b, &h2, &RESERVE6, &[]).await);
    // The holder's nexus loss releases it in the store (in the background).
    b.nexus_loss(&h2);
    for _ in 0..100 {
        if cell
            .value
            .lock()
            .unwrap()
            .1
            .as_deref()
            .is_some_and(|t| !t.contains("reserve6"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(a.inner.lock().reserve6.is_none(), "released on A too");
    assert_good(&run(&a, &h1, &RESERVE6, &[]).await);
}

/// A member leaves (its lease expired: every nexus through its port is
/// lost): a RESERVE(6) held through that port is released for the whole
/// cluster, and another host takes one through the survivor; a RESERVE(6)
/// held through a port still there stays. The host that held it, still
/// connected to the departed member, hears I_T NEXUS LOSS OCCURRED when
/// that member applies the release (as it does when it joins again): the
/// cluster treated its nexus as lost, so it must not go on believing it
/// holds the reservation. Fails where the release reaches the departed
/// member's copy silently.
#[tokio::test]
async fn a_reserve6_held_through_a_departed_members_port_is_released() {
    let (a, b, h1, h2) = two_members_ready().await;
    assert_good(&run(&a, &h1, &RESERVE6, &[]).await);
    conflict(&run(&b, &h2, &READ10, &[]).await);
    let port_of = |n: &ItNexus| n.target().id.clone();
    let (a_port, b_port) = (port_of(&h1), port_of(&h2));
    // Naming another port releases nothing.
    assert_eq!(
        b.release_reserve6_through(|t| *t == b_port).await,
        Ok(false)
    );
    conflict(&run(&b, &h2, &READ10, &[]).await);
    // A's port gone: released, on both members' copies.
    assert_eq!(b.release_reserve6_through(|t| *t == a_port).await, Ok(true));
    assert!(a.inner.lock().reserve6.is_none(), "still held on A's copy");
    // The host through B is told nothing: its nexus was not lost.
    assert_good(&run(&b, &h2, &READ10, &[]).await);
    assert_good(&run(&b, &h2, &RESERVE6, &[]).await);
    // The former holder hears it once; then it is a host like any other.
    assert_ua(
        &run(&a, &h1, &READ10, &[]).await,
        asc::I_T_NEXUS_LOSS_OCCURRED,
    );
    // Nothing held through A's port now: nothing to release.
    assert_eq!(
        b.release_reserve6_through(|t| *t == a_port).await,
        Ok(false)
    );
    conflict(&run(&a, &h1, &READ10, &[]).await);
}

#[tokio::test]
async fn a_change_that_loses_the_race_is_decided_again_on_the_newer_state() {
    let cell = Arc::new(Cell::default());
    let (a, b, h1, h2) = two_members_ready_on(&cell).await;
    // Another member's change lands between A's read and A's write: h2
    // took EXCLUSIVE ACCESS through B. A's REGISTER is then decided again
    // on that state (and kept), and its RESERVE conflicts.
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0, 0xb)).await);
    assert_good(&run(&b, &h2, &prout(1, 3), &params(0xb, 0)).await);
    let taken = cell.value.lock().unwrap().1.clone().unwrap();
    assert_good(&run(&b, &h2, &prout(2, 3), &params(0xb, 0)).await);
    *cell.race.lock().unwrap() = Some(taken);
    assert_good(&run(&a, &h1, &prout(0, 0), &params(0, 0xa)).await);
    conflict(&run(&a, &h1, &prout(1, 1), &params(0xa, 0)).await);
    conflict(&run(&a, &h1, &READ10, &[]).await);
    let keys = data(&run(&b, &h2, &READ_KEYS, &[]).await);
    assert_eq!(&keys[4..8], &16u32.to_be_bytes(), "both keys: {keys:?}");
}

#[tokio::test]
async fn a_corrupt_shared_state_is_refused_not_overwritten() {
    let cell = Arc::new(Cell::default());
    let a = member_lu("gw-a", &cell);
    let h1 = via("iqn.2026-11.test:h1", 1);
    ready(&a, &h1).await;
    *cell.value.lock().unwrap() = (7, Some("garbage".into()));
    let r = run(&a, &h1, &prout(0, 0), &params(0, 0xa)).await;
    assert_eq!(r.status, Status::CHECK_CONDITION);
    assert_eq!(cell.value.lock().unwrap().1.as_deref(), Some("garbage"));
    assert!(a.apply_shared_reservations(8, Some("garbage")).is_err());
}

/// A member away from the store (fenced) while another preempts its
/// host's registration and then makes another change: when it applies
/// the latest version (joining again) its host still hears REGISTRATIONS
/// PREEMPTED, which only the skipped version carried. Fails where a member
/// applies only the latest version's unit attentions.
#[tokio::test]
async fn a_member_that_skipped_versions_establishes_their_unit_attentions() {
    let cell = Arc::new(Cell::default());
    let (a, b, h1, h2) = two_members_ready_on(&cell).await;
    assert_good(&run(&a, &h1, &prout(0, 0), &params(0, 0xa)).await);
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0, 0xb)).await);
    assert_good(&run(&b, &h2, &prout(1, 3), &params(0xb, 0)).await);
    // A leaves the store's deliveries.
    cell.away(&a);
    // h2 preempts h1's registration (PREEMPT, key 0xa), then changes its
    // own key: the latest version carries no unit attention for h1.
    assert_good(&run(&b, &h2, &prout(4, 3), &params(0xb, 0xa)).await);
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0xb, 0xc)).await);
    cell.back(&a);
    assert_ua(
        &run(&a, &h1, &READ10, &[]).await,
        asc::REGISTRATIONS_PREEMPTED,
    );
    conflict(&run(&a, &h1, &WRITE10, &[0; 512]).await);
    // Applied once: the next change does not replay it (h2 holds
    // EXCLUSIVE ACCESS: h1's read conflicts, with nothing to hear first).
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0xc, 0xd)).await);
    conflict(&run(&a, &h1, &READ10, &[]).await);
}

/// A member that never applied a version (a gateway that just started)
/// establishes none of the earlier versions' unit attentions: its nexuses
/// were not there for them. And a member that was away hears a reset it
/// missed.
#[tokio::test]
async fn a_missed_reset_is_heard_by_a_member_that_was_away_not_by_a_new_one() {
    let cell = Arc::new(Cell::default());
    let (a, b, h1, h2) = two_members_ready_on(&cell).await;
    assert_good(&run(&a, &h1, &prout(0, 0), &params(0, 0xa)).await);
    cell.away(&a);
    // A LOGICAL UNIT RESET through B, then another change.
    let r = b
        .task_management(TmfRequest {
            nexus: h2.clone(),
            lun: Lun::ZERO,
            function: TmfFunction::LogicalUnitReset,
        })
        .await;
    assert_eq!(r, TmfResponse::FunctionComplete);
    assert_ua(
        &run(&b, &h2, &READ10, &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&b, &h2, &prout(0, 0), &params(0, 0xb)).await);
    let (version, text) = cell.value.lock().unwrap().clone();
    // A new member, its host already logged in, applies the latest.
    let c = member_lu("gw-c", &cell);
    let h3 = via("iqn.2026-11.test:h3", 3);
    ready(&c, &h3).await;
    c.apply_shared_reservations(version, text.as_deref())
        .unwrap();
    assert_good(&run(&c, &h3, &READ10, &[]).await);
    // A, joining again, hears the reset.
    cell.back(&a);
    assert_ua(
        &run(&a, &h1, &READ10, &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&a, &h1, &READ10, &[]).await);
}
