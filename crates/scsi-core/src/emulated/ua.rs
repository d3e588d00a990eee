//! Unit attentions and the I_T nexus registry: which nexuses the LU has
//! seen, the attentions queued for each (SAM-5 §5.14, SPC-4 §5.14), and the
//! fast-path flags that let a command skip the LU lock when none is pending.

use super::*;

impl Inner {
    /// Queues `code` for every known nexus matching `pred`; a reset-family
    /// code (29h) replaces what was queued.
    pub(super) fn ua_where(
        &self,
        st: &mut LuState,
        pred: impl Fn(&PortKey) -> bool,
        code: Asc,
        reset: bool,
    ) {
        for (key, q) in st.ua.iter_mut() {
            if !pred(key) {
                continue;
            }
            let (removed, added) = crate::sense::establish_ua(q, code, reset, UA_QUEUE);
            self.ua_total.fetch_sub(removed, Ordering::AcqRel);
            self.ua_total.fetch_add(added, Ordering::AcqRel);
        }
    }

    pub(super) fn ua_for(&self, st: &mut LuState, targets: &[(UaTarget, Asc)]) {
        for (t, code) in targets {
            self.ua_where(st, |k| t.matches(k), *code, false);
        }
    }

    pub(super) fn update_reserved(&self, st: &LuState) {
        self.reserved.store(
            st.reserve6.is_some() || st.pr.is_active(),
            Ordering::Release,
        );
    }

    /// Registers the nexus (first contact: POWER ON, RESET OR BUS DEVICE
    /// RESET OCCURRED) and returns its identity.
    pub(super) fn enter(&self, st: &mut LuState, nexus: &ItNexus) -> PortKey {
        let key = PortKey::of(nexus);
        if !st.ua.contains_key(&key) {
            if st.ua.len() >= MAX_NEXUSES {
                let victim = st
                    .ua
                    .iter()
                    .find(|(_, q)| q.is_empty())
                    .or_else(|| st.ua.iter().next())
                    .map(|(k, _)| k.clone());
                if let Some(q) = victim.and_then(|v| st.ua.remove(&v)) {
                    self.ua_total.fetch_sub(q.len(), Ordering::AcqRel);
                }
            }
            st.ua.insert(
                key.clone(),
                VecDeque::from([asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED]),
            );
            self.ua_total.fetch_add(1, Ordering::AcqRel);
        }
        if let Ok(mut seen) = self.seen.write() {
            seen.insert(nexus.id());
        }
        key
    }

    pub(super) fn take_ua(&self, st: &mut LuState, key: &PortKey) -> Option<Asc> {
        let code = st.ua.get_mut(key)?.pop_front()?;
        self.ua_total.fetch_sub(1, Ordering::AcqRel);
        Some(code)
    }
}
