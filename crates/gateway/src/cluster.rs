//! `[cluster]`: gateways that front the same LUs, kept together in etcd.
//!
//! Membership is a lease: each gateway grants itself one (`lease_ttl`),
//! writes `PREFIX/members/NAME` under it, and renews it every third of
//! the TTL. The members are the keys under `PREFIX/members/`; a gateway
//! that dies leaves the list when its lease expires at etcd.
//!
//! Fencing: a gateway serves its clustered LUs (those with `[lu.alua]`)
//! only while it holds its lease. It starts with its port's group
//! Unavailable; once it has a lease the policy below sets it. Its
//! local deadline is two thirds of the TTL after the last renewal it
//! *sent* that etcd answered (etcd counts the TTL from when it received
//! it, which is later): past that deadline without an answer it moves its
//! port's group Unavailable again (NOT READY, LOGICAL UNIT NOT ACCESSIBLE,
//! TARGET PORT IN UNAVAILABLE STATE for media commands) before etcd can
//! expire the lease and anyone else can act on it.
//!
//! The ALUA policy, applied by every member alike from the member list
//! (each member announces its port group): a group whose gateway is not
//! listed is Unavailable; the others have their wanted state (configured,
//! or set by SET TARGET PORT GROUPS), except that when no listed
//! gateway's group is wanted Active/Optimized, the listed group with the
//! lowest id among those wanted Active/Non-optimized is promoted to
//! Active/Optimized.
//!
//! Reservations: every clustered LU keeps its reservation state in etcd
//! (`cluster::reservations`); a member reads it and starts watching it before its
//! ports serve, and a watch that ends ends the membership (fenced).
//!
//! SET TARGET PORT GROUPS through any member changes the states the
//! cluster wants for a LU's groups, in etcd (`cluster::alua`); every member
//! applies the policy to them.
//!
//! Storage fencing (`cluster::fencing`): each member announces its
//! clustered LUs' storage clients (RBD's librados clients) as it
//! registers; when it leaves, the others blocklist them before its port
//! group stops counting, and it reopens its images as new clients before
//! it registers again.

pub(crate) mod alua;
pub(crate) mod fencing;
pub(crate) mod reservations;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

use unifab_scsi_core::alua::AccessState;

use crate::config::ClusterConfig;

/// One member as the cluster lists it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Member {
    /// Its `cluster.name`.
    pub name: String,
    /// Its admin endpoint, as it announced it.
    pub admin: String,
    /// When it joined (seconds since the epoch).
    pub since: u64,
    /// Its iSCSI port's target port group.
    pub port_group: u16,
    /// Its iSCSI port's RELATIVE TARGET PORT IDENTIFIER (absent from
    /// members that do not announce it).
    pub relative_port: Option<u16>,
    /// The lease its key is held under.
    #[serde(skip)]
    pub lease: i64,
}

/// What a gateway announces of itself: its admin endpoint, its iSCSI
/// port's target port group and relative target port identifier.
#[derive(Debug, Clone)]
pub struct Announce {
    /// The admin endpoint.
    pub admin: String,
    /// `[iscsi] port_group`.
    pub port_group: u16,
    /// `[iscsi] relative_port`.
    pub relative_port: u16,
}

/// This gateway's view of the cluster (`unifab show cluster`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    /// This gateway's name.
    pub name: String,
    /// `joining` (no lease yet), `member`, or `fenced` (lost its lease:
    /// its clustered ports Unavailable).
    pub state: String,
    /// The lease (hexadecimal), while it holds one.
    pub lease: Option<String>,
    /// The members etcd lists (at the last renewal).
    pub members: Vec<Member>,
    /// The last renewal's round trip, µs.
    pub etcd_latency_us: Option<u64>,
    /// Times this gateway fenced itself.
    pub fenced: u64,
    /// The last error talking to etcd.
    pub last_error: Option<String>,
    /// Departed members' storage clients fenced off by this gateway
    /// (`cluster::fencing`'s records).
    pub storage_fences: u64,
    /// The records of departed members whose storage clients are not
    /// fenced off yet: their port groups still count as listed.
    pub unfenced: Vec<String>,
}

/// What membership does to the LUs: `None` fences this gateway's port;
/// `Some(groups)` applies the policy for the port groups of the members
/// listed.
pub type Apply = Arc<dyn Fn(Option<&[u16]>) + Send + Sync>;

/// A clustered LU: its name and the emulated LU.
pub type ClusteredLu = (String, Arc<unifab_scsi_core::EmulatedLu>);

/// A clustered LU's target port groups: the states configured, and the
/// states the cluster wants (the configured ones until a SET TARGET PORT
/// GROUPS through any member changes them, kept in etcd: `cluster::alua`). The
/// policy applies member liveness on top of the wanted states.
#[derive(Debug)]
pub struct AluaLu {
    /// The LU's name.
    pub name: String,
    /// The LU.
    pub lu: Arc<unifab_scsi_core::EmulatedLu>,
    /// Each group's configured state.
    pub configured: Vec<(u16, AccessState)>,
    /// Each group's wanted state.
    pub desired: Mutex<Vec<(u16, AccessState)>>,
}

/// What the membership and the stores apply the policy with.
#[derive(Debug)]
pub(crate) struct Groups {
    /// This gateway's port group.
    group: u16,
    lus: Vec<Arc<AluaLu>>,
    /// The members' port groups at the last listing; `None` while fenced.
    alive: Mutex<Option<Vec<u16>>>,
}

impl Groups {
    /// Applies the policy to every clustered LU for `alive` (`None`:
    /// this gateway is fenced, its group Unavailable), as implicit
    /// transitions.
    fn apply(&self, alive: Option<&[u16]>) {
        *self.alive.lock().unwrap_or_else(|e| e.into_inner()) = alive.map(<[u16]>::to_vec);
        for l in &self.lus {
            for (g, state) in self.states(l, alive) {
                if l.lu.set_alua_state(g, state) {
                    info!(lu = %l.name, group = g, state = state.name(), "cluster: ALUA transition");
                }
            }
        }
    }

    /// The states the policy gives `l` for `alive`.
    fn states(&self, l: &AluaLu, alive: Option<&[u16]>) -> Vec<(u16, AccessState)> {
        match alive {
            None => vec![(self.group, AccessState::Unavailable)],
            Some(alive) => policy(&l.desired.lock().unwrap_or_else(|e| e.into_inner()), alive),
        }
    }

    /// `l`'s wanted states changed (SET TARGET PORT GROUPS): applied as
    /// explicit transitions for the members alive now; `except` (the
    /// nexus that asked, on this member) hears no unit attention.
    pub(crate) fn apply_explicit(
        &self,
        l: &AluaLu,
        except: Option<&unifab_scsi_core::pr::PortKey>,
    ) {
        let alive = self.alive.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let to = self.states(l, alive.as_deref());
        if l.lu.set_alua_states_explicit(&to, except) {
            info!(lu = %l.name, states = ?to, "cluster: ALUA transition by SET TARGET PORT GROUPS");
        }
    }
}

/// The cluster member: a task renewing the lease, and its status.
#[derive(Debug)]
pub struct Cluster {
    status: Arc<Mutex<Status>>,
    groups: Arc<Groups>,
}

impl Cluster {
    /// Starts membership for this gateway (`admin`: its admin endpoint,
    /// announced to the others). The ports start fenced.
    pub fn start(
        cfg: &ClusterConfig,
        me: Announce,
        alua_lus: Vec<Arc<AluaLu>>,
        stop: watch::Receiver<bool>,
    ) -> Result<(Cluster, tokio::task::JoinHandle<()>), String> {
        let groups = Arc::new(Groups {
            group: me.port_group,
            lus: alua_lus.clone(),
            alive: Mutex::new(None),
        });
        let fence: Apply = {
            let groups = groups.clone();
            Arc::new(move |alive: Option<&[u16]>| groups.apply(alive))
        };
        let lus: Vec<ClusteredLu> = alua_lus
            .iter()
            .map(|l| (l.name.clone(), l.lu.clone()))
            .collect();
        let ttl = cfg.ttl()?;
        let shared = Arc::new(reservations::Shared {
            name: cfg.name.clone(),
            prefix: cfg.prefix(),
            ttl,
            session: Mutex::new(None),
        });
        for (name, lu) in &lus {
            let store = reservations::EtcdReservations {
                lu: name.clone(),
                shared: shared.clone(),
            };
            if !lu.share_reservations(Arc::new(store)) {
                return Err(format!("lu {name:?}: its reservations are shared already"));
            }
        }
        for l in &alua_lus {
            let store = alua::EtcdAlua {
                lu: l.clone(),
                shared: shared.clone(),
            };
            if !l.lu.share_alua(Arc::new(store)) {
                return Err(format!(
                    "lu {:?}: its port groups are shared already",
                    l.name
                ));
            }
        }
        let status = Arc::new(Mutex::new(Status {
            name: cfg.name.clone(),
            state: "joining".into(),
            ..Status::default()
        }));
        fence(None);
        let parts = Parts {
            shared,
            lus,
            groups: groups.clone(),
            fencing: Arc::default(),
        };
        let task = tokio::spawn(run(
            cfg.clone(),
            ttl,
            me,
            fence,
            parts,
            status.clone(),
            stop,
        ));
        Ok((Cluster { status, groups }, task))
    }

    /// Each clustered LU as this gateway sees it (`unifab show cluster`):
    /// its groups' states, the member that owns it (the one whose group is
    /// Active/Optimized) and the reservation held.
    pub fn lus(&self) -> Vec<serde_json::Value> {
        let members = self.status().members;
        self.groups
            .lus
            .iter()
            .map(|l| {
                let states = l.lu.alua_states();
                let alua = states
                    .iter()
                    .map(|(g, s)| format!("{g} {}", s.name()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let owner = states
                    .iter()
                    .find(|(_, s)| *s == AccessState::ActiveOptimized)
                    .and_then(|(g, _)| members.iter().find(|m| m.port_group == *g))
                    .map(|m| m.name.clone());
                serde_json::json!({
                    "lu": l.name,
                    "alua": alua,
                    "owner": owner,
                    "reservation": l.lu.reservation_summary(),
                })
            })
            .collect()
    }

    /// The status now.
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a membership works on: the stores' shared state, the clustered
/// LUs and their port groups, and the storage fencing.
struct Parts {
    shared: Arc<reservations::Shared>,
    lus: Vec<ClusteredLu>,
    groups: Arc<Groups>,
    fencing: Arc<fencing::Fencing>,
}

async fn run(
    cfg: ClusterConfig,
    ttl: Duration,
    admin: Announce,
    fence: Apply,
    parts: Parts,
    status: Arc<Mutex<Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let set = |f: &dyn Fn(&mut Status)| f(&mut status.lock().unwrap_or_else(|e| e.into_inner()));
    // This gateway registered its storage clients: the others may fence
    // them off once that registration is over, so it reopens its images
    // before the next.
    let mut registered = false;
    loop {
        let held = tokio::select! {
            r = member(&cfg, ttl, &admin, &fence, &parts, &status, &mut registered) => r,
            _ = stop.changed() => return,
        };
        // No reservation change goes through this gateway until it is a
        // member again.
        *parts
            .shared
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        let was_member = status.lock().unwrap_or_else(|e| e.into_inner()).state == "member";
        if was_member {
            // Before anything else: the lease may expire at etcd soon.
            fence(None);
            warn!(cluster = %cfg.name, "cluster: lease lost; this gateway's clustered ports are Unavailable");
        }
        set(&|s| {
            if s.state == "member" {
                s.fenced += 1;
                s.state = "fenced".into();
            }
            s.lease = None;
            if let Err(e) = &held {
                s.last_error = Some(e.clone());
            }
        });
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One membership: connect, grant a lease, register, renew until a
/// renewal misses the local deadline. Returns why it ended.
async fn member(
    cfg: &ClusterConfig,
    ttl: Duration,
    me: &Announce,
    fence: &Apply,
    Parts {
        shared,
        lus,
        groups,
        fencing,
    }: &Parts,
    status: &Arc<Mutex<Status>>,
    registered: &mut bool,
) -> Result<(), String> {
    // What the local deadline allows for renewing: two thirds of the TTL.
    let local = ttl * 2 / 3;
    let step = ttl / 3;
    let opts = ConnectOptions::new()
        .with_connect_timeout(step)
        .with_timeout(step);
    let mut client = tokio::time::timeout(ttl, Client::connect(&cfg.etcd, Some(opts)))
        .await
        .map_err(|_| "connecting to etcd timed out".to_string())?
        .map_err(|e| format!("connecting to etcd: {e}"))?;
    let prefix = cfg.prefix();
    let since = now_secs();
    // Who is there already: a gateway of this name elsewhere, or one whose
    // port has this relative port identifier, keeps the place; this one
    // stays fenced (and asks again) rather than join beside it.
    let (present, _) = members(&mut client, &prefix, Instant::now() + step).await?;
    conflict(&cfg.name, me, since, &present)?;
    if *registered {
        reconnect(lus).await?;
        *registered = false;
    }
    let clients = storage_clients(lus).await;
    let asked = Instant::now();
    let lease = tokio::time::timeout(step, client.lease_grant(ttl.as_secs() as i64, None))
        .await
        .map_err(|_| "granting a lease timed out".to_string())?
        .map_err(|e| format!("granting a lease: {e}"))?;
    let id = lease.id();
    let mut deadline = asked + local;
    let key = format!("{prefix}/members/{}", cfg.name);
    let value = serde_json::json!({
        "name": cfg.name, "admin": me.admin, "since": since, "port_group": me.port_group,
        "relative_port": me.relative_port,
    })
    .to_string();
    // The member key and, without a lease, the record of its storage
    // clients, in one transaction (`cluster::fencing`).
    let mut ops = vec![TxnOp::put(
        key.as_str(),
        value,
        Some(PutOptions::new().with_lease(id)),
    )];
    if !clients.is_empty() {
        let record = fencing::Record {
            member: cfg.name.clone(),
            lease: id,
            port_group: me.port_group,
            clients,
        };
        let text = serde_json::to_string(&record).map_err(|e| e.to_string())?;
        ops.push(TxnOp::put(fencing::key(&prefix, &cfg.name, id), text, None));
    }
    // From here the others may list this registration.
    *registered = true;
    tokio::time::timeout_at(deadline.into(), client.txn(Txn::new().and_then(ops)))
        .await
        .map_err(|_| "registering timed out".to_string())?
        .map_err(|e| format!("registering: {e}"))?;
    let (mut keeper, mut stream) =
        tokio::time::timeout_at(deadline.into(), client.lease_keep_alive(id))
            .await
            .map_err(|_| "starting renewals timed out".to_string())?
            .map_err(|e| format!("starting renewals: {e}"))?;
    // The reservations before serving: applied, and watched from there.
    let session = reservations::Session {
        client: client.clone(),
        lease: id,
    };
    let names: Vec<String> = lus.iter().map(|(n, _)| n.clone()).collect();
    let from = reservations::join_kind(
        shared,
        &session,
        "reservations",
        &names,
        deadline,
        &mut reservations::apply_reservations(lus),
    )
    .await?;
    let alua_from = reservations::join_kind(
        shared,
        &session,
        "alua",
        &names,
        deadline,
        &mut alua::apply_alua(groups.clone(), shared.prefix.clone()),
    )
    .await?;
    *shared.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(session.clone());
    let mut watching = AbortOnDrop(tokio::spawn(reservations::watch_kind(
        shared.clone(),
        session.clone(),
        "reservations",
        names.clone(),
        from,
        reservations::apply_reservations(lus),
    )));
    let mut watching_alua = AbortOnDrop(tokio::spawn(reservations::watch_kind(
        shared.clone(),
        session,
        "alua",
        names,
        alua_from,
        alua::apply_alua(groups.clone(), shared.prefix.clone()),
    )));
    // A member: the policy decides once the members are listed. Two that
    // joined at once both passed the check above: the later one leaves.
    let listing = Listing {
        prefix: &prefix,
        apply: fence,
        status,
        name: &cfg.name,
        me,
        since,
        lus,
        lease: id,
        step,
        fencing,
    };
    listing.run(&mut client, deadline).await?;
    info!(cluster = %cfg.name, lease = format!("{id:x}"), ttl_s = ttl.as_secs(), "cluster: member");
    {
        let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
        s.state = "member".into();
        s.lease = Some(format!("{id:x}"));
        s.last_error = None;
    }
    loop {
        let sent = Instant::now();
        let renewed = tokio::select! {
            r = tokio::time::timeout_at(deadline.into(), async {
                keeper.keep_alive().await?;
                stream.message().await
            }) => r,
            e = &mut watching.0 => return Err(e.unwrap_or_else(|j| j.to_string())),
            e = &mut watching_alua.0 => return Err(e.unwrap_or_else(|j| j.to_string())),
        };
        match renewed {
            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                deadline = sent + local;
                let us = sent.elapsed().as_micros() as u64;
                status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .etcd_latency_us = Some(us);
            }
            Ok(Ok(Some(_))) => return Err("the lease expired at etcd".into()),
            Ok(Ok(None)) => return Err("etcd ended the renewal stream".into()),
            Ok(Err(e)) => return Err(format!("renewing the lease: {e}")),
            Err(_) => return Err("no renewal within the local deadline".into()),
        }
        listing.run(&mut client, deadline).await?;
        tokio::time::sleep_until(Instant::min(sent + step, deadline).into()).await;
    }
}

/// Members listed `before` and gone now left the cluster with every I_T
/// nexus through their ports: a RESERVE(6) held through one of those ports
/// ends with its nexus (SPC-2), so the lowest-named member left releases
/// it on each clustered LU, through the store (any member could; one is
/// enough, and the store's compare-and-swap keeps a second harmless).
/// Persistent reservations stay. In the background: the renewals go on.
///
/// `before` and `now` are the members counted at the last listing and at
/// this one (a departed member whose storage clients are not fenced off
/// yet still counts: `fencing::counted`), `members` those etcd lists.
fn release_departed(
    name: &str,
    before: &[Member],
    now: &[Member],
    members: &[Member],
    lus: &[ClusteredLu],
) {
    let departed: Vec<u16> = before
        .iter()
        .filter(|m| m.name != name && !now.iter().any(|n| n.name == m.name))
        .filter_map(|m| m.relative_port)
        .collect();
    let lowest = members.iter().map(|m| m.name.as_str()).min();
    if departed.is_empty() || lowest != Some(name) {
        return;
    }
    let lus = lus.to_vec();
    tokio::spawn(async move {
        for port in departed {
            // The iSCSI target port's name: `IQN,t,0xTPGT`, the TPGT being
            // the relative port (`[iscsi] relative_port`).
            let suffix = format!(",t,0x{port:04x}");
            let through = |t: &unifab_scsi_core::TransportId| matches!(t, unifab_scsi_core::TransportId::Iscsi { name, .. } if name.ends_with(&suffix));
            for (lu, l) in &lus {
                match l.release_reserve6_through(through).await {
                    Ok(true) => info!(lu = %lu, relative_port = port,
                        "cluster: RESERVE(6) released: its holder's gateway left the cluster"),
                    Ok(false) => {}
                    Err(e) => warn!(lu = %lu, relative_port = port, error = %e,
                        "cluster: could not release a RESERVE(6) held through a gateway that left"),
                }
            }
        }
    });
}

/// A task that ends with its owner.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What each listing of the members needs: this gateway (`me`, its name
/// and time of joining), what applies the policy, the clustered LUs, and
/// the lease to give back when it may not stay.
struct Listing<'a> {
    prefix: &'a str,
    apply: &'a Apply,
    status: &'a Arc<Mutex<Status>>,
    name: &'a str,
    me: &'a Announce,
    since: u64,
    lus: &'a [ClusteredLu],
    lease: i64,
    step: Duration,
    fencing: &'a Arc<fencing::Fencing>,
}

impl Listing<'_> {
    /// Lists the members and the storage fencing records at one revision
    /// (before `deadline`), records them and applies the policy for the
    /// members' port groups and those of departed members not fenced off
    /// the storage yet (starting a pass that fences them:
    /// `cluster::fencing`), and releases what members that left held
    /// ([`release_departed`]) — unless one that joined before this gateway
    /// has its name or relative port ([`conflict`]): then it gives its
    /// lease back and the membership ends.
    async fn run(&self, client: &mut Client, deadline: Instant) -> Result<(), String> {
        let listed = async {
            let (members, at) = members(client, self.prefix, deadline).await?;
            conflict(self.name, self.me, self.since, &members)?;
            let records = records(client, self.prefix, at, deadline).await?;
            Ok::<_, String>((members, records))
        }
        .await;
        let (members, records) = match listed {
            Ok(m) => m,
            Err(e) => {
                let _ = tokio::time::timeout(self.step, client.lease_revoke(self.lease)).await;
                return Err(e);
            }
        };
        let stale = self.fencing.unsettled(fencing::stale(records, &members));
        let (before, now) = self.fencing.count(&members, &stale);
        let held = self.fencing.listed(stale, &members);
        self.fencing.start(client, self.lus, self.step);
        let mut groups: Vec<u16> = members.iter().map(|m| m.port_group).collect();
        groups.extend(held);
        (self.apply)(Some(&groups));
        release_departed(self.name, &before, &now, &members, self.lus);
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.unfenced = self.fencing.pending();
        s.storage_fences = self.fencing.done();
        s.members = members;
        Ok(())
    }
}

/// Why this gateway may not be a member beside `members`: one of them has
/// its name with another admin endpoint (etcd would keep only one of the
/// two under that key), or — having joined before it (earlier `since`,
/// then the lower name) — its relative port identifier: two target ports
/// of one number make one SCSI target port name, and a reservation held
/// through one would be held through the other.
pub fn conflict(name: &str, me: &Announce, since: u64, members: &[Member]) -> Result<(), String> {
    for m in members {
        if m.name == name {
            if m.admin != me.admin {
                return Err(format!(
                    "another gateway is a member as {name:?} (admin endpoint {}): each gateway of the cluster needs its own cluster.name",
                    m.admin
                ));
            }
            continue;
        }
        let earlier = (m.since, m.name.as_str()) < (since, name);
        if earlier && m.relative_port == Some(me.relative_port) {
            return Err(format!(
                "member {:?} (admin endpoint {}) has relative port {} too: each gateway in front of a LU needs its own [iscsi] relative_port; this one stays fenced",
                m.name, m.admin, me.relative_port
            ));
        }
    }
    Ok(())
}

/// Reopens every clustered LU's storage as new clients
/// ([`unifab_scsi_core::backend::BlockBackend::reconnect`]), on threads
/// that may block.
async fn reconnect(lus: &[ClusteredLu]) -> Result<(), String> {
    for (name, lu) in lus {
        if lu.backend().storage_clients().is_empty() {
            continue;
        }
        let lu = lu.clone();
        tokio::task::spawn_blocking(move || lu.backend().reconnect())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("lu {name:?}: reopening its storage as a new client: {e}"))?;
    }
    Ok(())
}

/// Each clustered LU's storage clients, by LU (those without any left
/// out).
async fn storage_clients(lus: &[ClusteredLu]) -> std::collections::BTreeMap<String, Vec<String>> {
    let lus = lus.to_vec();
    tokio::task::spawn_blocking(move || {
        lus.iter()
            .map(|(name, lu)| (name.clone(), lu.backend().storage_clients()))
            .filter(|(_, c)| !c.is_empty())
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// The storage fencing records (`cluster::fencing`) at revision `at`
/// (before `deadline`). One that does not parse is skipped with a warning.
async fn records(
    client: &mut Client,
    prefix: &str,
    at: i64,
    deadline: Instant,
) -> Result<Vec<(String, fencing::Record)>, String> {
    let r = tokio::time::timeout_at(
        deadline.into(),
        client.get(
            format!("{prefix}/fence/"),
            Some(GetOptions::new().with_prefix().with_revision(at)),
        ),
    )
    .await
    .map_err(|_| "listing the fence records timed out".to_string())?
    .map_err(|e| format!("listing the fence records: {e}"))?;
    Ok(r.kvs()
        .iter()
        .filter_map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match serde_json::from_slice(kv.value()) {
                Ok(rec) => Some((key, rec)),
                Err(e) => {
                    warn!(record = %key, error = %e, "cluster: a fence record that does not parse");
                    None
                }
            }
        })
        .collect())
}

/// The members etcd lists (before `deadline`), by name, and the revision
/// they were read at.
async fn members(
    client: &mut Client,
    prefix: &str,
    deadline: Instant,
) -> Result<(Vec<Member>, i64), String> {
    let r = tokio::time::timeout_at(
        deadline.into(),
        client.get(
            format!("{prefix}/members/"),
            Some(GetOptions::new().with_prefix()),
        ),
    )
    .await
    .map_err(|_| "listing the members timed out".to_string())?
    .map_err(|e| format!("listing the members: {e}"))?;
    let mut members: Vec<Member> = r
        .kvs()
        .iter()
        .filter_map(|kv| {
            let v: serde_json::Value = serde_json::from_slice(kv.value()).ok()?;
            Some(Member {
                name: v.get("name")?.as_str()?.to_string(),
                admin: v.get("admin")?.as_str()?.to_string(),
                since: v.get("since")?.as_u64()?,
                port_group: u16::try_from(v.get("port_group")?.as_u64()?).ok()?,
                relative_port: v
                    .get("relative_port")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok()),
                lease: kv.lease(),
            })
        })
        .collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((members, r.header().map_or(0, |h| h.revision())))
}

/// The policy: each configured group's state given the port groups of the
/// members listed (see the module's documentation).
pub fn policy(
    configured: &[(u16, unifab_scsi_core::alua::AccessState)],
    alive: &[u16],
) -> Vec<(u16, unifab_scsi_core::alua::AccessState)> {
    use unifab_scsi_core::alua::AccessState::*;
    let live = |g: &u16| alive.contains(g);
    let owner_alive = configured
        .iter()
        .any(|(g, s)| *s == ActiveOptimized && live(g));
    let promoted = if owner_alive {
        None
    } else {
        configured
            .iter()
            .filter(|(g, s)| *s == ActiveNonOptimized && live(g))
            .map(|(g, _)| *g)
            .min()
    };
    configured
        .iter()
        .map(|(g, s)| {
            let to = if !live(g) {
                Unavailable
            } else if Some(*g) == promoted {
                ActiveOptimized
            } else {
                *s
            };
            (*g, to)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use unifab_scsi_core::alua::AccessState::*;

    #[test]
    fn a_name_or_a_relative_port_taken_before_keeps_a_gateway_out() {
        let m = |name: &str, admin: &str, since: u64, rel: Option<u16>| Member {
            name: name.into(),
            admin: admin.into(),
            since,
            port_group: 1,
            relative_port: rel,
            lease: 0,
        };
        let me = Announce {
            admin: "10.0.0.3:9260".into(),
            port_group: 3,
            relative_port: 3,
        };
        let others = [
            m("gw-a", "10.0.0.1:9260", 100, Some(1)),
            m("gw-b", "10.0.0.2:9260", 100, None),
        ];
        assert_eq!(conflict("gw-c", &me, 200, &others), Ok(()));
        // Listed with itself: fine.
        let mut with_me = others.to_vec();
        with_me.push(m("gw-c", "10.0.0.3:9260", 200, Some(3)));
        assert_eq!(conflict("gw-c", &me, 200, &with_me), Ok(()));
        // Its name, elsewhere.
        let e = conflict("gw-a", &me, 200, &others).unwrap_err();
        assert!(e.contains("another gateway is a member as \"gw-a\""), "{e}");
        // Its relative port, taken by one that joined before; by one that
        // joined after, not (that one leaves); at the same second, the
        // lower name keeps it.
        let taken = [m("gw-a", "10.0.0.1:9260", 100, Some(3))];
        let e = conflict("gw-c", &me, 200, &taken).unwrap_err();
        assert!(e.contains("has relative port 3 too"), "{e}");
        assert_eq!(conflict("gw-c", &me, 50, &taken), Ok(()));
        assert!(conflict("gw-c", &me, 100, &taken).is_err());
        assert_eq!(conflict("gw-0", &me, 100, &taken), Ok(()));
    }

    #[test]
    fn the_policy_promotes_the_lowest_live_non_optimized_group() {
        let cfg = [
            (1, ActiveOptimized),
            (2, ActiveNonOptimized),
            (3, ActiveNonOptimized),
            (4, Standby),
        ];
        assert_eq!(policy(&cfg, &[1, 2, 3, 4]), cfg.to_vec());
        assert_eq!(
            policy(&cfg, &[2, 3, 4]),
            vec![
                (1, Unavailable),
                (2, ActiveOptimized),
                (3, ActiveNonOptimized),
                (4, Standby)
            ]
        );
        assert_eq!(
            policy(&cfg, &[3, 1]),
            vec![
                (1, ActiveOptimized),
                (2, Unavailable),
                (3, ActiveNonOptimized),
                (4, Unavailable)
            ]
        );
        assert_eq!(
            policy(&cfg, &[4]),
            vec![
                (1, Unavailable),
                (2, Unavailable),
                (3, Unavailable),
                (4, Standby)
            ],
            "a Standby group is never promoted"
        );
    }
}
