//! SET TARGET PORT GROUPS shared through etcd (scsi-core's
//! [`AluaStore`](unifab_scsi_core::alua::AluaStore)).
//!
//! Keys, under the cluster's prefix:
//!
//! - `alua/LU`: the states the cluster wants for the LU's groups, one
//!   `GROUP STATE` line each (absent: the configured states), and the I_T
//!   nexus of the last SET TARGET PORT GROUPS (`requester INIT TARGET`),
//!   which hears no unit attention. A SET TARGET PORT GROUPS is one
//!   transaction: *if* `mod_revision` is still the one read, put the
//!   wanted states with the request's changes.
//! - `alua-applied/LU/MEMBER`: the revision up to which MEMBER has applied
//!   them, under MEMBER's lease (as for reservations).
//!
//! Every member, the one that wrote them included, applies the policy to
//! the wanted states and the live members ([`super::policy`]) as explicit
//! transitions (STATUS CODE 01h) from its watch, and the command is
//! answered once every member has.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use unifab_scsi_core::BoxFuture;
use unifab_scsi_core::alua::{AccessState, AluaStore};
use unifab_scsi_core::pr::PortKey;

use super::reservations::{ApplyFn, Shared, bounded, settle};
use super::{AluaLu, Groups};

/// Most attempts at one SET TARGET PORT GROUPS against other members'.
const MAX_ATTEMPTS: usize = 16;

fn key(shared: &Shared, lu: &str) -> String {
    format!("{}/alua/{lu}", shared.prefix)
}

fn applied_prefix(shared: &Shared, lu: &str) -> String {
    format!("{}/alua-applied/{lu}/", shared.prefix)
}

/// `GROUP STATE` lines and the requester's.
fn to_text(states: &[(u16, AccessState)], requester: &PortKey) -> String {
    let mut s: String = states
        .iter()
        .map(|(g, s)| format!("{g} {}\n", s.name()))
        .collect();
    s.push_str(&format!("requester {}\n", requester.to_text()));
    s
}

/// The requester in [`to_text`].
fn requester(text: &str) -> Option<PortKey> {
    text.lines()
        .find_map(|l| l.strip_prefix("requester "))
        .and_then(PortKey::from_text)
}

/// Parses [`to_text`]; only groups the LU has, each state one a SET
/// TARGET PORT GROUPS may ask for.
fn parse(text: &str, configured: &[(u16, AccessState)]) -> Option<Vec<(u16, AccessState)>> {
    let mut out = configured.to_vec();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("requester "))
    {
        let (g, s) = line.split_once(' ')?;
        let g: u16 = g.parse().ok()?;
        let s = AccessState::parse(s)?;
        out.iter_mut().find(|(id, _)| *id == g)?.1 = s;
    }
    Some(out)
}

/// One LU's store.
#[derive(Debug)]
pub(crate) struct EtcdAlua {
    pub lu: Arc<AluaLu>,
    pub shared: Arc<Shared>,
}

impl AluaStore for EtcdAlua {
    fn set(
        &self,
        to: Vec<(u16, AccessState)>,
        requester: PortKey,
    ) -> BoxFuture<'static, Result<(), String>> {
        let (lu, shared) = (self.lu.clone(), self.shared.clone());
        Box::pin(async move {
            let k = key(&shared, &lu.name);
            for _ in 0..MAX_ATTEMPTS {
                let mut c = shared.session()?.client;
                let r = bounded(
                    "reading the port groups",
                    shared.step(),
                    c.get(k.as_str(), None),
                )
                .await?;
                let (rev, mut wanted) = match r.kvs().first() {
                    None => (0, lu.configured.clone()),
                    Some(kv) => (
                        kv.mod_revision(),
                        parse(&String::from_utf8_lossy(kv.value()), &lu.configured)
                            .ok_or_else(|| format!("{k} is corrupt"))?,
                    ),
                };
                for (g, s) in &to {
                    if let Some(w) = wanted.iter_mut().find(|(id, _)| id == g) {
                        w.1 = *s;
                    }
                }
                let txn = Txn::new()
                    .when([Compare::mod_revision(k.as_str(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(k.as_str(), to_text(&wanted, &requester), None)]);
                let r = bounded("writing the port groups", shared.step(), c.txn(txn)).await?;
                if !r.succeeded() {
                    continue;
                }
                let at = r.header().map_or(0, |h| h.revision());
                // Every member's watch applies it, this one's too.
                return settle(
                    shared.clone(),
                    applied_prefix(&shared, &lu.name),
                    u64::try_from(at).unwrap_or(0),
                    true,
                )
                .await;
            }
            Err(format!(
                "{MAX_ATTEMPTS} attempts lost to other members' changes"
            ))
        })
    }
}

/// Installs wanted states on `groups`' LUs: a change is applied as
/// explicit transitions, the requester's nexus (on the member it asked
/// through) hearing no unit attention.
pub(super) fn apply_alua(groups: Arc<Groups>, prefix: String) -> ApplyFn {
    Box::new(move |lu, _rev, text| {
        let Some(l) = groups.lus.iter().find(|l| l.name == lu) else {
            return Ok(());
        };
        let wanted = match text {
            Some(t) => {
                parse(t, &l.configured).ok_or_else(|| format!("{prefix}/alua/{lu} is corrupt"))?
            }
            None => l.configured.clone(),
        };
        let changed = {
            let mut d = l.desired.lock().unwrap_or_else(|e| e.into_inner());
            let changed = *d != wanted;
            *d = wanted;
            changed
        };
        if changed {
            groups.apply_explicit(l, text.and_then(requester).as_ref());
        }
        Ok(())
    })
}
