//! Fencing a departed gateway off the shared storage (RBD: blocklisting
//! its librados clients) before the others act on its departure.
//!
//! The ALUA fence stops a gateway that lost its lease from admitting
//! commands, and from issuing those it admitted; a write it had already
//! handed to librbd can still hang (an OSD failing over takes tens of
//! seconds) and land after another gateway served the same blocks. So each
//! member announces, as it registers, the clients its clustered LUs'
//! backends are to the storage (`BlockBackend::storage_clients`), in a
//! record without a lease, `PREFIX/fence/NAME/LEASE`, written in one
//! transaction with its member key. A record whose member key is gone or
//! is held under another lease (the gateway registered again, as new
//! clients: it reopens its images first) is stale, and every member that
//! lists it fences its clients off (`BlockBackend::fence_clients`, through
//! its own backend of the same LU, which waits for the OSD map that says
//! so) and deletes it. Until then the policy counts the record's member as
//! listed, so no group is promoted in its place while its writes can still
//! land. The members and the records are read at one revision: a gateway
//! that registers in between cannot look departed. The records outlive
//! every member (a gateway that starts later fences what no one did).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::{ClusteredLu, Member};

/// One registration's storage clients: what the others fence off once it
/// is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The member's `cluster.name`.
    pub member: String,
    /// The lease it registered under.
    pub lease: i64,
    /// Its iSCSI port's target port group.
    pub port_group: u16,
    /// Each clustered LU's storage clients, by LU name (LUs without any
    /// left out).
    pub clients: BTreeMap<String, Vec<String>>,
}

/// The record's key.
pub(crate) fn key(prefix: &str, member: &str, lease: i64) -> String {
    format!("{prefix}/fence/{member}/{lease:x}")
}

/// The records (key, record) whose member is not listed under the
/// record's lease.
pub(crate) fn stale(records: Vec<(String, Record)>, members: &[Member]) -> Vec<(String, Record)> {
    records
        .into_iter()
        .filter(|(_, r)| {
            !members
                .iter()
                .any(|m| m.name == r.member && m.lease == r.lease)
        })
        .collect()
}

/// The members departures are counted from: those listed, and those of
/// `before` that are not but whose storage clients are not fenced off yet
/// (a stale record of theirs is listed) — they have not departed as far
/// as what they held is concerned (a RESERVE(6) through their port).
pub(crate) fn counted(
    before: &[Member],
    members: &[Member],
    stale: &[(String, Record)],
) -> Vec<Member> {
    let mut out = members.to_vec();
    out.extend(
        before
            .iter()
            .filter(|m| !members.iter().any(|n| n.name == m.name))
            .filter(|m| stale.iter().any(|(_, r)| r.member == m.name))
            .cloned(),
    );
    out
}

/// The stale records not yet fenced off, the passes that fence them, and
/// the members departures are counted from ([`counted`]).
#[derive(Debug, Default)]
pub(crate) struct Fencing {
    counted: Mutex<Vec<Member>>,
    pending: Mutex<Vec<(String, Record)>>,
    /// Stale records this gateway fenced every client of that it could,
    /// left for a member that has the rest of their LUs.
    settled: Mutex<HashSet<String>>,
    running: AtomicBool,
    warned: Mutex<HashSet<String>>,
    done: AtomicU64,
}

impl Fencing {
    /// The stale records this gateway still has clients to fence off of
    /// (those it settled are left out; it forgets those no longer stale).
    pub(crate) fn unsettled(&self, stale: Vec<(String, Record)>) -> Vec<(String, Record)> {
        let mut settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        settled.retain(|k| stale.iter().any(|(s, _)| s == k));
        stale
            .into_iter()
            .filter(|(k, _)| !settled.contains(k))
            .collect()
    }

    /// The members counted at the last listing and now ([`counted`]).
    pub(crate) fn count(
        &self,
        members: &[Member],
        stale: &[(String, Record)],
    ) -> (Vec<Member>, Vec<Member>) {
        let mut c = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        let now = counted(&c, members, stale);
        (std::mem::replace(&mut *c, now.clone()), now)
    }

    /// Records the stale records of a listing; returns the port groups the
    /// policy is to count as listed: those of stale records' members that
    /// are not listed at all.
    pub(crate) fn listed(&self, stale: Vec<(String, Record)>, members: &[Member]) -> Vec<u16> {
        let held = stale
            .iter()
            .filter(|(_, r)| !members.iter().any(|m| m.name == r.member))
            .map(|(_, r)| r.port_group)
            .collect();
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = stale;
        held
    }

    /// The keys of the records not yet fenced off.
    pub(crate) fn pending(&self) -> Vec<String> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Records fenced off so far.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Starts a pass over the pending records, unless one runs: each
    /// record's clients are fenced off through this gateway's backend of
    /// the same LU, then the record is deleted. A record that cannot be
    /// fenced (no such LU here, or the storage refuses) stays, and the next
    /// listing tries again; it is logged once.
    pub(crate) fn start(self: &Arc<Self>, client: &Client, lus: &[ClusteredLu], step: Duration) {
        if self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
            || self.running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (me, mut client, lus) = (self.clone(), client.clone(), lus.to_vec());
        tokio::spawn(async move {
            let records = me.pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for (key, record) in records {
                let lus = lus.clone();
                let r = record.clone();
                let fenced = tokio::task::spawn_blocking(move || fence(&r, &lus))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                let complete = match fenced {
                    Ok(complete) => complete,
                    Err(e) => {
                        if me
                            .warned
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key.clone())
                        {
                            warn!(record = %key, member = %record.member, error = %e,
                                "cluster: cannot fence a departed gateway's storage clients off; its port group counts as listed until then");
                        }
                        continue;
                    }
                };
                if !complete {
                    me.settled
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key.clone());
                    me.pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|(k, _)| *k != key);
                    info!(record = %key, member = %record.member,
                        "cluster: a departed gateway's storage clients are fenced off on this gateway's LUs; the record names LUs it does not have, left for a member that has them");
                    continue;
                }
                match tokio::time::timeout(step, client.delete(key.as_str(), None)).await {
                    Ok(Ok(_)) => {
                        me.done.fetch_add(1, Ordering::Relaxed);
                        me.pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .retain(|(k, _)| *k != key);
                        info!(record = %key, member = %record.member, clients = ?record.clients,
                            "cluster: a departed gateway's storage clients are fenced off");
                    }
                    Ok(Err(e)) => {
                        warn!(record = %key, error = %e, "cluster: deleting a fence record")
                    }
                    Err(_) => warn!(record = %key, "cluster: deleting a fence record timed out"),
                }
            }
            me.running.store(false, Ordering::Release);
        });
    }
}

/// Fences one record's clients off, LU by LU (blocks), through this
/// gateway's backend of each LU it has; `Ok(true)` when it had every LU
/// the record names. A LU it does not have it does not serve: what lands
/// there is not its concern, but the record stays for a member that has
/// it.
fn fence(record: &Record, lus: &[ClusteredLu]) -> Result<bool, String> {
    let mut complete = true;
    for (lu, clients) in &record.clients {
        let Some((_, l)) = lus.iter().find(|(name, _)| name == lu) else {
            complete = false;
            continue;
        };
        l.backend()
            .fence_clients(clients)
            .map_err(|e| format!("lu {lu:?}: {e}"))?;
    }
    Ok(complete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unifab_scsi_core::backend::{AllocationRun, BackendCaps, BackendError};

    fn member(name: &str, lease: i64, group: u16) -> Member {
        Member {
            name: name.into(),
            admin: String::new(),
            since: 1,
            port_group: group,
            relative_port: Some(group),
            lease,
        }
    }

    fn record(name: &str, lease: i64, group: u16) -> (String, Record) {
        let clients = BTreeMap::from([(
            "disk".to_string(),
            vec![format!("v2:10.0.0.{group}:0/{lease}")],
        )]);
        (
            key("/unifab", name, lease),
            Record {
                member: name.into(),
                lease,
                port_group: group,
                clients,
            },
        )
    }

    #[test]
    fn a_record_is_stale_once_its_lease_holds_no_member_key() {
        let records = vec![
            record("gw-a", 0xa1, 1),
            record("gw-a", 0xa0, 1),
            record("gw-b", 0xb1, 2),
            record("gw-c", 0xc1, 3),
        ];
        // gw-a registered again (lease a1), gw-b is listed, gw-c is gone.
        let members = [member("gw-a", 0xa1, 1), member("gw-b", 0xb1, 2)];
        let s = stale(records, &members);
        let keys: Vec<&str> = s.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["/unifab/fence/gw-a/a0", "/unifab/fence/gw-c/c1"]);
        // Only the group of a member not listed at all is held.
        let f = Fencing::default();
        assert_eq!(f.listed(s, &members), [3]);
        assert_eq!(
            f.pending(),
            ["/unifab/fence/gw-a/a0", "/unifab/fence/gw-c/c1"]
        );
        assert!(f.listed(Vec::new(), &members).is_empty());
        assert!(f.pending().is_empty());
    }

    #[test]
    fn a_member_not_fenced_off_yet_has_not_departed() {
        let (a, b) = (member("gw-a", 0xa1, 1), member("gw-b", 0xb1, 2));
        let f = Fencing::default();
        let names = |m: &[Member]| m.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
        let (before, now) = f.count(&[a.clone(), b.clone()], &[]);
        assert!(before.is_empty());
        assert_eq!(names(&now), ["gw-a", "gw-b"]);
        // gw-a's key is gone, its record not fenced yet: still counted.
        let pending = [record("gw-a", 0xa1, 1)];
        let (before, now) = f.count(std::slice::from_ref(&b), &pending);
        assert_eq!(names(&before), ["gw-a", "gw-b"]);
        assert_eq!(names(&now), ["gw-b", "gw-a"]);
        let (_, now) = f.count(std::slice::from_ref(&b), &pending);
        assert_eq!(names(&now), ["gw-b", "gw-a"]);
        // Fenced off: it departs now.
        let (before, now) = f.count(std::slice::from_ref(&b), &[]);
        assert_eq!(names(&before), ["gw-b", "gw-a"]);
        assert_eq!(names(&now), ["gw-b"]);
        // A member whose record is stale but who is listed again under a
        // new lease counts once.
        let a2 = member("gw-a", 0xa2, 1);
        let (_, now) = f.count(&[a2, b], &pending);
        assert_eq!(names(&now), ["gw-a", "gw-b"]);
    }

    /// A memory LU whose backend records the clients it is asked to fence
    /// off (as an RBD image blocklists them).
    #[derive(Debug)]
    struct Fenceable {
        mem: unifab_scsi_core::backend::MemoryBackend,
        fenced: Mutex<Vec<String>>,
    }

    impl unifab_scsi_core::backend::BlockBackend for Fenceable {
        fn size(&self) -> u64 {
            self.mem.size()
        }
        fn read_at(&self, o: u64, b: &mut [u8]) -> Result<(), BackendError> {
            self.mem.read_at(o, b)
        }
        fn write_at(&self, o: u64, d: &[bytes::Bytes], fua: bool) -> Result<(), BackendError> {
            self.mem.write_at(o, d, fua)
        }
        fn flush(&self) -> Result<(), BackendError> {
            self.mem.flush()
        }
        fn discard(&self, o: u64, l: u64) -> Result<(), BackendError> {
            self.mem.discard(o, l)
        }
        fn write_zeroes(&self, o: u64, l: u64) -> Result<(), BackendError> {
            self.mem.write_zeroes(o, l)
        }
        fn allocation(&self, o: u64, l: u64) -> Result<AllocationRun, BackendError> {
            self.mem.allocation(o, l)
        }
        fn caps(&self) -> BackendCaps {
            self.mem.caps()
        }
        fn describe(&self) -> String {
            "fenceable".into()
        }
        fn fence_clients(&self, clients: &[String]) -> Result<(), BackendError> {
            self.fenced.lock().unwrap().extend_from_slice(clients);
            Ok(())
        }
    }

    fn lu(name: &str, backend: Arc<dyn unifab_scsi_core::backend::BlockBackend>) -> ClusteredLu {
        let lu = unifab_scsi_core::EmulatedLu::new(Default::default(), backend).unwrap();
        (name.to_string(), Arc::new(lu))
    }

    #[test]
    fn a_record_is_fenced_through_the_lus_this_gateway_has() {
        let f = Arc::new(Fenceable {
            mem: unifab_scsi_core::backend::MemoryBackend::new(1 << 20),
            fenced: Mutex::new(Vec::new()),
        });
        let lus = [lu("disk", f.clone())];
        let (_, mut r) = record("gw-a", 0xa1, 1);
        assert_eq!(fence(&r, &lus), Ok(true));
        assert_eq!(*f.fenced.lock().unwrap(), ["v2:10.0.0.1:0/161"]);
        // A LU it does not have: fenced where it could, not complete.
        r.clients
            .insert("other".into(), vec!["v2:10.0.0.1:0/9".into()]);
        assert_eq!(fence(&r, &lus), Ok(false));
        // A backend that cannot fence: an error, the record held.
        let mem = [lu(
            "disk",
            Arc::new(unifab_scsi_core::backend::MemoryBackend::new(1 << 20)),
        )];
        assert!(fence(&r, &mem).unwrap_err().contains("cannot fence"));
        // A record settled here is no longer pending here, until it is no
        // longer stale.
        let fencing = Fencing::default();
        let (key, rec) = record("gw-c", 0xc1, 3);
        fencing.settled.lock().unwrap().insert(key.clone());
        assert!(
            fencing
                .unsettled(vec![(key.clone(), rec.clone())])
                .is_empty()
        );
        assert!(fencing.unsettled(Vec::new()).is_empty());
        assert_eq!(fencing.unsettled(vec![(key.clone(), rec)]).len(), 1);
    }

    #[test]
    fn a_record_names_its_member_and_lease() {
        assert_eq!(key("/p", "gw-a", 0x694d), "/p/fence/gw-a/694d");
        let (_, r) = record("gw-a", 7, 1);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r);
    }
}
