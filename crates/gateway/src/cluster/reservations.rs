//! Reservations shared through etcd (scsi-core's
//! [`ReservationStore`](unifab_scsi_core::pr::ReservationStore)).
//!
//! Keys, under the cluster's prefix:
//!
//! - `reservations/LU`: the LU's shared reservation state (scsi-core's
//!   text); its version is the key's `mod_revision`. A change is one
//!   transaction: *if* `mod_revision` is still the one read, put.
//! - `reservations-applied/LU/MEMBER`: the etcd revision up to which
//!   MEMBER has applied the LU's state, under MEMBER's lease (so it goes
//!   when MEMBER leaves). Written as 0 when MEMBER joins, *before* it reads
//!   the state, then the revision of what it read, then each change's as
//!   its watch delivers it.
//!
//! A change is answered once every `reservations-applied/LU/*` key but
//! the changer's own holds its revision or more (or has gone with its
//! member's lease). docs/alua.md gives the argument that no member then
//! lets through a command the change forbids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use unifab_scsi_core::{BoxFuture, EmulatedLu, pr::ReservationStore};

/// How often a change polls the members' applied revisions.
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// The etcd session a membership holds: its client and lease.
#[derive(Clone)]
pub(crate) struct Session {
    pub client: Client,
    pub lease: i64,
}

/// What every LU's store shares: this member, the keys, and the session
/// (none while this gateway is not a member: changes then fail, and its
/// clustered ports are Unavailable anyway).
pub(crate) struct Shared {
    pub name: String,
    pub prefix: String,
    pub ttl: Duration,
    pub session: Mutex<Option<Session>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(super) fn session(&self) -> Result<Session, String> {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| "this gateway is not a cluster member now".to_string())
    }
    pub(super) fn state_key(&self, lu: &str) -> String {
        format!("{}/reservations/{lu}", self.prefix)
    }
    pub(super) fn applied_prefix(&self, lu: &str) -> String {
        format!("{}/reservations-applied/{lu}/", self.prefix)
    }
    /// One etcd call's bound: a third of the TTL.
    pub(super) fn step(&self) -> Duration {
        self.ttl / 3
    }
}

/// One LU's store.
#[derive(Debug)]
pub(crate) struct EtcdReservations {
    pub lu: String,
    pub shared: Arc<Shared>,
}

pub(super) async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| format!("{what} timed out"))?
        .map_err(|e| format!("{what}: {e}"))
}

impl ReservationStore for EtcdReservations {
    fn member(&self) -> &str {
        &self.shared.name
    }

    fn load(&self) -> BoxFuture<'static, Result<(u64, Option<String>), String>> {
        let shared = self.shared.clone();
        let key = shared.state_key(&self.lu);
        Box::pin(async move {
            let mut c = shared.session()?.client;
            let r = bounded("reading the reservations", shared.step(), c.get(key, None)).await?;
            Ok(match r.kvs().first() {
                None => (0, None),
                Some(kv) => (
                    u64::try_from(kv.mod_revision()).unwrap_or(0),
                    Some(String::from_utf8_lossy(kv.value()).into_owned()),
                ),
            })
        })
    }

    fn store(
        &self,
        version: u64,
        value: String,
    ) -> BoxFuture<'static, Result<Option<u64>, String>> {
        let shared = self.shared.clone();
        let key = shared.state_key(&self.lu);
        Box::pin(async move {
            let mut c = shared.session()?.client;
            let rev = i64::try_from(version).map_err(|_| "version out of range".to_string())?;
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.as_str(), value, None)]);
            let r = bounded("writing the reservations", shared.step(), c.txn(txn)).await?;
            if !r.succeeded() {
                return Ok(None);
            }
            let at = r.header().map_or(0, |h| h.revision());
            Ok(Some(u64::try_from(at).unwrap_or(0)))
        })
    }

    fn settle(&self, version: u64) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(settle(
            self.shared.clone(),
            self.shared.applied_prefix(&self.lu),
            version,
            false,
        ))
    }

    fn detach(&self, work: BoxFuture<'static, ()>) {
        tokio::spawn(work);
    }
}

/// Waits until every key under `prefix` (members' applied revisions)
/// but this member's (`mine_too`: and this member's) holds `version` or
/// more, or has gone with its member's lease; at most two TTLs.
pub(super) async fn settle(
    shared: Arc<Shared>,
    prefix: String,
    version: u64,
    mine_too: bool,
) -> Result<(), String> {
    let mine = if mine_too {
        String::new()
    } else {
        format!("{prefix}{}", shared.name)
    };
    // A member that neither applies the change nor leaves within two
    // TTLs is stuck: the host hears an error and retries.
    let give_up = Instant::now() + shared.ttl * 2;
    loop {
        let mut c = shared.session()?.client;
        let r = bounded(
            "reading the members' applied revisions",
            shared.step(),
            c.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let behind: Vec<String> = r
            .kvs()
            .iter()
            .filter(|kv| kv.key() != mine.as_bytes())
            .filter(|kv| {
                kv.value_str()
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_none_or(|v| v < version)
            })
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() >= give_up {
            return Err(format!(
                "members have not applied revision {version}: {}",
                behind.join(", ")
            ));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// One kind of per-LU state every member applies: `PREFIX/KIND/LU`, with
/// each member's applied revision at `PREFIX/KIND-applied/LU/MEMBER`
/// under its lease. `apply(lu, revision, value)` installs one version
/// (`None`: nothing stored).
pub(super) type ApplyFn = Box<dyn FnMut(&str, i64, Option<&str>) -> Result<(), String> + Send>;

/// Joins `kind` for `lus`: marks this member as applying them (revision
/// 0) *before* it reads them, reads and applies them, and records the
/// revision read. Returns the revision to watch from.
pub(super) async fn join_kind(
    shared: &Shared,
    session: &Session,
    kind: &str,
    lus: &[String],
    deadline: Instant,
    apply: &mut ApplyFn,
) -> Result<i64, String> {
    let mut c = session.client.clone();
    let opts = || Some(PutOptions::new().with_lease(session.lease));
    let limit = deadline.saturating_duration_since(Instant::now());
    let what = format!("joining the {kind}");
    let ack = |lu: &str| format!("{}/{kind}-applied/{lu}/{}", shared.prefix, shared.name);
    for lu in lus {
        bounded(&what, limit, c.put(ack(lu), "0", opts())).await?;
    }
    let r = bounded(
        &what,
        limit,
        c.get(
            format!("{}/{kind}/", shared.prefix),
            Some(GetOptions::new().with_prefix()),
        ),
    )
    .await?;
    let at = r.header().map_or(0, |h| h.revision());
    let stored: HashMap<&[u8], (i64, &[u8])> = r
        .kvs()
        .iter()
        .map(|kv| (kv.key(), (kv.mod_revision(), kv.value())))
        .collect();
    for lu in lus {
        let key = format!("{}/{kind}/{lu}", shared.prefix);
        match stored.get(key.as_bytes()) {
            Some((rev, value)) => apply(lu, *rev, Some(&String::from_utf8_lossy(value)))?,
            None => apply(lu, 0, None)?,
        }
        bounded(&what, limit, c.put(ack(lu), at.to_string(), opts())).await?;
    }
    Ok(at)
}

/// Applies every change to `kind` of `lus` after revision `from`, as etcd
/// delivers them, and records each as applied. Returns (an error) when
/// the watch ends: the membership ends with it.
pub(super) async fn watch_kind(
    shared: Arc<Shared>,
    session: Session,
    kind: &'static str,
    lus: Vec<String>,
    from: i64,
    mut apply: ApplyFn,
) -> String {
    let mut c = session.client.clone();
    let prefix = format!("{}/{kind}/", shared.prefix);
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(from + 1);
    let (_watcher, mut stream) = match c.watch(prefix.as_str(), Some(opts)).await {
        Ok(w) => w,
        Err(e) => return format!("watching the {kind}: {e}"),
    };
    loop {
        let msg = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return format!("etcd ended the {kind} watch"),
            Err(e) => return format!("the {kind} watch: {e}"),
        };
        if msg.canceled() {
            return format!("etcd cancelled the {kind} watch: {}", msg.cancel_reason());
        }
        for ev in msg.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key());
            let Some(lu) = key
                .strip_prefix(prefix.as_str())
                .filter(|lu| lus.iter().any(|l| l == lu))
            else {
                continue;
            };
            let rev = kv.mod_revision();
            let text = match ev.event_type() {
                EventType::Put => Some(String::from_utf8_lossy(kv.value()).into_owned()),
                EventType::Delete => None,
            };
            if let Err(e) = apply(lu, rev, text.as_deref()) {
                return e;
            }
            let ack = format!("{}/{kind}-applied/{lu}/{}", shared.prefix, shared.name);
            let put = c.put(
                ack,
                rev.to_string(),
                Some(PutOptions::new().with_lease(session.lease)),
            );
            if let Err(e) = bounded("recording an applied change", shared.step(), put).await {
                return e;
            }
        }
    }
}

/// Installs reservation state versions on `lus`.
pub(super) fn apply_reservations(lus: &[(String, Arc<EmulatedLu>)]) -> ApplyFn {
    let lus: HashMap<String, Arc<EmulatedLu>> = lus.iter().cloned().collect();
    Box::new(move |lu, rev, text| match (lus.get(lu), text) {
        (Some(l), Some(text)) => {
            l.apply_shared_reservations(u64::try_from(rev).unwrap_or(0), Some(text))
        }
        (Some(l), None) if rev > 0 => {
            l.apply_shared_reservations(u64::try_from(rev).unwrap_or(0), None)
        }
        _ => Ok(()),
    })
}
