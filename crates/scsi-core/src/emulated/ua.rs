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
        let mut any = false;
        for (key, q) in st.ua.iter_mut() {
            if !pred(key) {
                continue;
            }
            let (_, added) = crate::sense::establish_ua(q, code, reset, UA_QUEUE);
            any |= added > 0;
        }
        if any {
            // Every nexus looks at its queue again (under the LU lock).
            self.clear
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
    }

    /// Lets the nexus's commands skip the LU lock: it is registered and its
    /// queue is empty. Called under the LU lock.
    pub(super) fn mark_clear(&self, id: u64) {
        let known = self
            .clear
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id);
        if !known {
            self.clear
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id);
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
        enter_nexus(&mut st.ua, nexus, MAX_NEXUSES)
    }

    pub(super) fn take_ua(&self, st: &mut LuState, key: &PortKey) -> Option<Asc> {
        st.ua.get_mut(key)?.pop_front()
    }
}

/// Registers `nexus` in a LU's unit attention table (a new one is queued
/// POWER ON, RESET OR BUS DEVICE RESET OCCURRED) and returns its
/// identity. Past `max` entries one with nothing queued goes first (else
/// any other): that initiator, if it returns, hears POWER ON, RESET, which
/// it handles as after a reset. Every emulated device type keeps its
/// nexuses this way.
pub(crate) fn enter_nexus(
    ua: &mut HashMap<PortKey, VecDeque<Asc>>,
    nexus: &ItNexus,
    max: usize,
) -> PortKey {
    let key = PortKey::of(nexus);
    if !ua.contains_key(&key) {
        if ua.len() >= max {
            let victim = ua
                .iter()
                .find(|(_, q)| q.is_empty())
                .or_else(|| ua.iter().next())
                .map(|(k, _)| k.clone());
            if let Some(v) = victim {
                ua.remove(&v);
            }
        }
        ua.insert(
            key.clone(),
            VecDeque::from([asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED]),
        );
    }
    key
}
