//! Task management (SAM-5 §7) on the emulated LU: ABORT TASK (SET),
//! CLEAR TASK SET, the resets and the queries, with the unit attentions
//! and reservation releases each establishes, and the end of an I_T nexus.

use super::*;

impl Inner {
    /// Runs a task management function on this LU's task set and state.
    pub(super) fn task_management(
        self: &Arc<Self>,
        request: TmfRequest,
    ) -> BoxFuture<'static, TmfResponse> {
        let inner = self.clone();
        let nexus = request.nexus.clone();
        let ts = &inner.tasks;
        let wait = match request.function {
            TmfFunction::AbortTask { tag } => {
                let n = nexus.clone();
                let w = ts.abort_matching(move |x, t| *x == n && t == tag);
                if w.count() == 0 {
                    // Nothing to abort: FUNCTION COMPLETE (RFC 7143 maps a
                    // vanished task to "task does not exist" itself).
                    return Box::pin(std::future::ready(TmfResponse::FunctionComplete));
                }
                w
            }
            TmfFunction::AbortTaskSet => {
                let n = nexus.clone();
                ts.abort_matching(move |x, _| *x == n)
            }
            TmfFunction::ClearTaskSet => {
                let w = ts.abort_matching(|_, _| true);
                let me = PortKey::of(&nexus);
                let mut st = inner.lock();
                inner.ua_where(
                    &mut st,
                    |k| *k != me,
                    asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR,
                    false,
                );
                w
            }
            TmfFunction::ClearAca => {
                return Box::pin(std::future::ready(TmfResponse::FunctionRejected));
            }
            TmfFunction::LogicalUnitReset | TmfFunction::TargetReset => {
                let w = ts.abort_matching(|_, _| true);
                let me = PortKey::of(&nexus);
                let code = if request.function == TmfFunction::TargetReset {
                    asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED
                } else {
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                };
                let mut st = inner.lock();
                st.reserve6 = None;
                st.prevent.clear();
                st.copy_results.clear();
                // LOGICAL UNIT RESET: a unit attention for every I_T nexus,
                // the requester's included (SAM-5 §6.3.2; libiscsi's
                // MultipathIO.Reset counts it on the resetting path too).
                // TARGET RESET: every nexus but the requester's, which
                // learns of the reset from the TMF response; libiscsi's
                // Reserve6.LUNReset, run right after TargetWarmReset on the
                // same session, expects its next command to succeed.
                let is_target = request.function == TmfFunction::TargetReset;
                inner.ua_where(&mut st, |k| !is_target || *k != me, code, true);
                inner.update_reserved(&st);
                w
            }
            TmfFunction::ItNexusReset => {
                let n = nexus.clone();
                let w = ts.abort_matching(move |x, _| *x == n);
                let me = PortKey::of(&nexus);
                let mut st = inner.lock();
                st.prevent.remove(&me);
                if st.reserve6.as_ref() == Some(&me) {
                    st.reserve6 = None;
                    inner.update_reserved(&st);
                }
                w
            }
            TmfFunction::QueryTask { tag } => {
                let r = if ts.contains(&nexus, tag) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryTaskSet => {
                let r = if ts.has_tasks_of(&nexus) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryAsyncEvent => {
                let st = inner.lock();
                let pending = st
                    .ua
                    .get(&PortKey::of(&nexus))
                    .is_some_and(|q| !q.is_empty());
                let r = if pending {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
        };
        // With a cluster's store, a reset through any gateway resets the
        // one LU they front: it goes through the store (the RESERVE(6) it
        // releases, and the reset itself for the other members' tasks and
        // nexuses) before the function completes; an I_T NEXUS RESET
        // releases that nexus's RESERVE(6) there.
        let shared = inner.shared();
        let function = request.function;
        Box::pin(async move {
            wait.await;
            if let Some(store) = shared {
                let _ = match function {
                    TmfFunction::LogicalUnitReset | TmfFunction::TargetReset => {
                        let code = if function == TmfFunction::TargetReset {
                            asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED
                        } else {
                            asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                        };
                        inner
                            .change_shared(store, move |s| {
                                s.reserve6 = None;
                                s.reset = Some(code);
                                Ok(true)
                            })
                            .await
                    }
                    TmfFunction::ItNexusReset => {
                        inner
                            .release_shared6(store, Some(PortKey::of(&nexus)))
                            .await
                    }
                    _ => TaskResult::good(),
                };
            }
            TmfResponse::FunctionComplete
        })
    }

    /// Releases the shared RESERVE(6): any holder's, or only `holder`'s.
    async fn release_shared6(
        self: &Arc<Self>,
        store: Arc<dyn crate::pr::ReservationStore>,
        holder: Option<PortKey>,
    ) -> TaskResult {
        self.change_shared(store, move |s| {
            let held = match (&s.reserve6, &holder) {
                (Some(_), None) => true,
                (Some(h), Some(me)) => h == me,
                (None, _) => false,
            };
            if held {
                s.reserve6 = None;
            }
            Ok(held)
        })
        .await
    }

    /// The I_T nexus is about to end in order: with a cluster's store, the
    /// RESERVE(6) it holds is released there first.
    pub(super) fn nexus_closing(self: &Arc<Self>, nexus: &ItNexus) -> BoxFuture<'static, ()> {
        let me = PortKey::of(nexus);
        let store = self
            .shared()
            .filter(|_| self.lock().reserve6.as_ref() == Some(&me));
        let inner = self.clone();
        Box::pin(async move {
            if let Some(store) = store {
                let _ = inner.release_shared6(store, Some(me)).await;
            }
        })
    }

    /// The I_T nexus is gone: its tasks, PREVENT, RESERVE(6) and copy
    /// results go, and its identity gets I_T NEXUS LOSS OCCURRED.
    pub(super) fn nexus_loss(self: &Arc<Self>, nexus: &ItNexus) {
        let inner = self;
        let n = nexus.clone();
        drop(inner.tasks.abort_matching(move |x, _| *x == n));
        let me = PortKey::of(nexus);
        let mut st = inner.lock();
        st.prevent.remove(&me);
        st.copy_results.retain(|(k, _, _)| *k != me);
        let held6 = st.reserve6.as_ref() == Some(&me);
        if held6 {
            st.reserve6 = None;
            inner.update_reserved(&st);
        }
        if st.ua.contains_key(&me) {
            inner.ua_where(&mut st, |k| *k == me, asc::I_T_NEXUS_LOSS_OCCURRED, true);
        }
        drop(st);
        if let Ok(mut clear) = inner.clear.write() {
            clear.remove(&nexus.id());
        }
        // The shared RESERVE(6) this nexus held (taken through this
        // member, so the local copy knew it): released in the store in the
        // background, as no command waits for it.
        if held6 && let Some(store) = self.shared() {
            let inner = self.clone();
            store.clone().detach(Box::pin(async move {
                let _ = inner.release_shared6(store, Some(me)).await;
            }));
        }
    }
}
