//! Reservations shared by a cluster of gateways ([`crate::pr::shared`]).
//!
//! With a store set ([`EmulatedLu::share_reservations`]) every change to
//! the reservation state — PERSISTENT RESERVE OUT, RESERVE(6) and
//! RELEASE(6), the RESERVE(6) a reset or the holder's nexus loss releases
//! — is decided on the latest stored version and written back only if
//! that version is still the latest; then applied here, with its unit
//! attentions and aborts; and the command is answered once every member
//! has applied it. Members apply the versions other members write
//! ([`EmulatedLu::apply_shared_reservations`], from the gateway's watch of
//! the store) with the effects meant for their own nexuses. Reservation
//! checks on the data path read the local copy, as without a store: I/O
//! never waits on the store.

use super::*;
use crate::pr::{ReservationStore, SharedReservations};

/// Attempts at a change before it is given up (other members' changes
/// won each time).
const MAX_ATTEMPTS: usize = 16;

impl EmulatedLu {
    /// Keeps this LU's reservation state in `store` from now on (a
    /// cluster's members each set their own store for the same LU). Set
    /// once; `false` if a store was already set. The store's state is the
    /// only one from then on: what this LU held (an APTPL file's state) is
    /// dropped, with a warning if it held anything.
    pub fn share_reservations(&self, store: Arc<dyn ReservationStore>) -> bool {
        if self.inner.shared.set(store).is_err() {
            return false;
        }
        let mut st = self.inner.lock();
        if st.pr.is_active() || st.reserve6.is_some() {
            tracing::warn!(
                "reservations: this LU's own reservation state is dropped; the cluster's store holds it from now on"
            );
        }
        st.pr = crate::pr::PrState::new();
        st.reserve6 = None;
        st.shared_version = 0;
        self.inner.update_reserved(&st);
        true
    }

    /// Applies `version` of the shared state as read from the store
    /// (`None`: nothing stored). The state replaces the local copy if it
    /// is newer; the unit attentions and aborts it carries are applied to
    /// this member's nexuses unless this member made the change (it
    /// applied them when it did).
    pub fn apply_shared_reservations(
        &self,
        version: u64,
        text: Option<&str>,
    ) -> Result<(), String> {
        let s = match text {
            None => SharedReservations::default(),
            Some(t) => SharedReservations::from_text(t)
                .ok_or_else(|| format!("shared reservation state version {version} is corrupt"))?,
        };
        let ours = self
            .inner
            .shared
            .get()
            .is_some_and(|st| st.member() == s.origin);
        self.inner.apply_shared(version, &s, !ours, !ours);
        Ok(())
    }

    /// The reservation held, as an operator reads it: `PR type T by
    /// INITIATOR (key K, N registrations)`, `RESERVE(6) by INITIATOR`, or
    /// `N registrations` with none held; `None` with nothing at all.
    pub fn reservation_summary(&self) -> Option<String> {
        let st = self.inner.lock();
        let name = |k: &PortKey| match &k.initiator {
            crate::task::TransportId::Iscsi { name, .. } => name.clone(),
            crate::task::TransportId::Fcp { wwpn } => format!("{wwpn:016x}"),
        };
        if let Some(h) = &st.reserve6 {
            return Some(format!("RESERVE(6) by {}", name(h)));
        }
        match st.pr.holder() {
            Some((t, k, key, n)) => Some(format!(
                "PR type {t} by {} (key {key:#x}, {n} registrations)",
                name(&k)
            )),
            None if st.pr.registrations() > 0 => {
                Some(format!("{} registrations", st.pr.registrations()))
            }
            None => None,
        }
    }

    /// The version of the shared reservation state applied here.
    pub fn shared_reservations_version(&self) -> u64 {
        self.inner.lock().shared_version
    }

    /// Releases a RESERVE(6) held through a target port `gone` names: the
    /// ports of a cluster member that left, every I_T nexus through them
    /// lost with it, and a RESERVE(6) ends with its holder's nexus (SPC-2
    /// §5.5.1; persistent reservations stay). A change through the store
    /// like any other; `Ok(true)` if one was released, `Ok(false)` if none
    /// was held there (or the LU shares no store).
    pub async fn release_reserve6_through(
        &self,
        gone: impl Fn(&TransportId) -> bool + Send + Sync,
    ) -> Result<bool, String> {
        let Some(store) = self.inner.shared() else {
            return Ok(false);
        };
        let released = std::sync::atomic::AtomicBool::new(false);
        let r = self
            .inner
            .change_shared(store, |s| {
                let held_there = s.reserve6.as_ref().is_some_and(|k| gone(&k.target));
                if held_there {
                    s.reserve6 = None;
                }
                released.store(held_there, Ordering::Relaxed);
                Ok(held_there)
            })
            .await;
        if r.status == Status::GOOD {
            Ok(released.load(Ordering::Relaxed))
        } else {
            Err(format!("{:?} {:?}", r.status, r.sense))
        }
    }
}

/// A change's answer when it could not be made.
fn store_failed(what: &str, e: &str) -> TaskResult {
    tracing::warn!(error = %e, "reservations: {what}");
    // This member cannot reach the cluster's store: the path is as good as
    // unavailable, and a host retries on another.
    check(
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE,
    )
}

impl Inner {
    pub(super) fn shared(&self) -> Option<Arc<dyn ReservationStore>> {
        self.shared.get().cloned()
    }

    /// Installs a version of the shared state: the state if newer than
    /// what is here; (`effects`) its unit attentions and aborts; and
    /// (`remote`: another member's change) the reset it reports, which the
    /// member that made it carried out itself.
    pub(super) fn apply_shared(
        &self,
        version: u64,
        s: &SharedReservations,
        effects: bool,
        remote: bool,
    ) {
        if remote {
            // What the versions this member never applied established (it
            // was away from the store: fenced, then joining again), oldest
            // first: its nexuses hear them as if it had been there. A member
            // that never applied any (it just started) missed nothing its
            // nexuses were there for.
            let had = self.lock().shared_version;
            let missed = s
                .history
                .iter()
                .filter(|p| had > 0 && p.version > had && p.version < version);
            if had > 0
                && s.history.len() == crate::pr::HISTORY
                && s.history.first().is_some_and(|p| p.version > had)
            {
                tracing::warn!(
                    had,
                    version,
                    "reservations: this member missed more changes than the shared state remembers; some unit attentions are lost"
                );
            }
            for p in missed {
                if let Some(code) = p.reset {
                    self.remote_reset(code);
                }
                self.ua_for(&mut self.lock(), &p.unit_attentions);
            }
        }
        if remote && let Some(code) = s.reset {
            self.remote_reset(code);
        }
        let mut st = self.lock();
        if version > st.shared_version {
            // Another member released a RESERVE(6) held through a nexus
            // here, and not by a reset (whose own unit attention says so):
            // only a member that departed has that done to its nexuses —
            // the others treated them as lost with it
            // (`release_reserve6_through`), possibly versions ago. The
            // holder hears what a lost nexus hears, so it does not go on
            // believing it holds the reservation.
            let lost = st
                .reserve6
                .clone()
                .filter(|k| remote && s.reset.is_none() && s.reserve6.as_ref() != Some(k));
            st.pr = s.pr.clone();
            st.reserve6 = s.reserve6.clone();
            st.shared_version = version;
            self.update_reserved(&st);
            if let Some(k) = lost {
                self.ua_where(&mut st, |n| *n == k, asc::I_T_NEXUS_LOSS_OCCURRED, true);
            }
        }
        if effects {
            self.ua_for(&mut st, &s.unit_attentions);
        }
        drop(st);
        if effects {
            for t in &s.abort {
                let t = t.clone();
                drop(
                    self.tasks
                        .abort_matching(move |n, _| t.matches(&PortKey::of(n))),
                );
            }
        }
    }

    /// Another member reset the LU: every task here ends, what a reset
    /// clears is cleared, and every nexus hears `code`.
    fn remote_reset(&self, code: crate::sense::Asc) {
        drop(self.tasks.abort_matching(|_, _| true));
        let mut st = self.lock();
        st.prevent.clear();
        st.copy_results.clear();
        self.ua_where(&mut st, |_| true, code, true);
    }

    /// One change to the shared state: `decide` is given the latest
    /// version (its effects cleared) and answers whether it changed it, or
    /// why the command is refused. Retried on a newer version when another
    /// change was stored first.
    pub(super) async fn change_shared(
        self: &Arc<Self>,
        store: Arc<dyn ReservationStore>,
        decide: impl Fn(&mut SharedReservations) -> Result<bool, PrRefusal>,
    ) -> TaskResult {
        for _ in 0..MAX_ATTEMPTS {
            let (version, text) = match store.load().await {
                Ok(v) => v,
                Err(e) => return store_failed("reading the shared state", &e),
            };
            let mut s = match text.as_deref() {
                None => SharedReservations::default(),
                Some(t) => match SharedReservations::from_text(t) {
                    Some(s) => s,
                    None => {
                        tracing::error!(version, "reservations: the shared state is corrupt");
                        return check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
                    }
                },
            };
            s.next_change(version);
            s.origin = store.member().to_string();
            match decide(&mut s) {
                Err(PrRefusal::Conflict) => {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
                Err(PrRefusal::Check(sense)) => return TaskResult::check_condition(sense),
                Ok(false) => return TaskResult::good(),
                Ok(true) => {}
            }
            let stored = match store.store(version, s.to_text()).await {
                Ok(Some(v)) => v,
                Ok(None) => continue,
                Err(e) => return store_failed("writing the shared state", &e),
            };
            self.apply_shared(stored, &s, true, false);
            return match store.settle(stored).await {
                Ok(()) => TaskResult::good(),
                Err(e) => store_failed("waiting for the members to apply a change", &e),
            };
        }
        tracing::warn!("reservations: {MAX_ATTEMPTS} attempts lost to other members' changes");
        check(SenseKey::ABORTED_COMMAND, asc::NO_ADDITIONAL_SENSE)
    }
}
