//! `[cluster]`: gateways that front the same LUs, kept together in etcd.
//!
//! Membership is a lease: each gateway grants itself one (`lease_ttl`),
//! writes `PREFIX/members/NAME` under it, and renews it every third of
//! the TTL. The members are the keys under `PREFIX/members/`; a gateway
//! that dies leaves the list when its lease expires at etcd.
//!
//! Fencing: a gateway serves its clustered LUs (those with `[lu.alua]`)
//! only while it holds its lease. It starts with its port's group
//! Unavailable; once it has a lease it restores the configured state. Its
//! local deadline is two thirds of the TTL after the last renewal it
//! *sent* that etcd answered (etcd counts the TTL from when it received
//! it, which is later): past that deadline without an answer it moves its
//! port's group Unavailable again (NOT READY, LOGICAL UNIT NOT ACCESSIBLE,
//! TARGET PORT IN UNAVAILABLE STATE for media commands) before etcd can
//! expire the lease and anyone else can act on it.
//!
//! Not yet here (issue 32): ALUA states and persistent reservations shared
//! through etcd, and in-flight commands drained at fencing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{info, warn};

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
}

/// What fencing does to the LUs: `true` fences, `false` restores.
pub type Fence = Arc<dyn Fn(bool) + Send + Sync>;

/// The cluster member: a task renewing the lease, and its status.
#[derive(Debug)]
pub struct Cluster {
    status: Arc<Mutex<Status>>,
}

impl Cluster {
    /// Starts membership for this gateway (`admin`: its admin endpoint,
    /// announced to the others). The ports start fenced.
    pub fn start(
        cfg: &ClusterConfig,
        admin: String,
        fence: Fence,
        stop: watch::Receiver<bool>,
    ) -> Result<(Cluster, tokio::task::JoinHandle<()>), String> {
        let ttl = cfg.ttl()?;
        let status = Arc::new(Mutex::new(Status {
            name: cfg.name.clone(),
            state: "joining".into(),
            ..Status::default()
        }));
        fence(true);
        let task = tokio::spawn(run(cfg.clone(), ttl, admin, fence, status.clone(), stop));
        Ok((Cluster { status }, task))
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

async fn run(
    cfg: ClusterConfig,
    ttl: Duration,
    admin: String,
    fence: Fence,
    status: Arc<Mutex<Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let set = |f: &dyn Fn(&mut Status)| f(&mut status.lock().unwrap_or_else(|e| e.into_inner()));
    loop {
        let held = tokio::select! {
            r = member(&cfg, ttl, &admin, &fence, &status) => r,
            _ = stop.changed() => return,
        };
        let was_member = status.lock().unwrap_or_else(|e| e.into_inner()).state == "member";
        if was_member {
            // Before anything else: the lease may expire at etcd soon.
            fence(true);
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
    admin: &str,
    fence: &Fence,
    status: &Arc<Mutex<Status>>,
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
    let asked = Instant::now();
    let lease = tokio::time::timeout(step, client.lease_grant(ttl.as_secs() as i64, None))
        .await
        .map_err(|_| "granting a lease timed out".to_string())?
        .map_err(|e| format!("granting a lease: {e}"))?;
    let id = lease.id();
    let mut deadline = asked + local;
    let prefix = cfg.prefix();
    let key = format!("{prefix}/members/{}", cfg.name);
    let value =
        serde_json::json!({ "name": cfg.name, "admin": admin, "since": now_secs() }).to_string();
    tokio::time::timeout_at(
        deadline.into(),
        client.put(key.as_str(), value, Some(PutOptions::new().with_lease(id))),
    )
    .await
    .map_err(|_| "registering timed out".to_string())?
    .map_err(|e| format!("registering: {e}"))?;
    let (mut keeper, mut stream) =
        tokio::time::timeout_at(deadline.into(), client.lease_keep_alive(id))
            .await
            .map_err(|_| "starting renewals timed out".to_string())?
            .map_err(|e| format!("starting renewals: {e}"))?;
    // A member: serve.
    fence(false);
    info!(cluster = %cfg.name, lease = format!("{id:x}"), ttl_s = ttl.as_secs(), "cluster: member");
    {
        let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
        s.state = "member".into();
        s.lease = Some(format!("{id:x}"));
        s.last_error = None;
    }
    loop {
        let sent = Instant::now();
        let renewed = tokio::time::timeout_at(deadline.into(), async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
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
        let listed = tokio::time::timeout_at(
            deadline.into(),
            client.get(
                format!("{prefix}/members/"),
                Some(GetOptions::new().with_prefix()),
            ),
        )
        .await;
        if let Ok(Ok(r)) = listed {
            let mut members: Vec<Member> = r
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let v: serde_json::Value = serde_json::from_slice(kv.value()).ok()?;
                    Some(Member {
                        name: v.get("name")?.as_str()?.to_string(),
                        admin: v.get("admin")?.as_str()?.to_string(),
                        since: v.get("since")?.as_u64()?,
                    })
                })
                .collect();
            members.sort_by(|a, b| a.name.cmp(&b.name));
            status.lock().unwrap_or_else(|e| e.into_inner()).members = members;
        }
        tokio::time::sleep_until(Instant::min(sent + step, deadline).into()).await;
    }
}
