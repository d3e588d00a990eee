//! The running gateway as its admin endpoint shows it: `unifab show`
//! views and the metric families, over the planes `unifab run` started.

use std::sync::Arc;

use unifab_iscsi::target::server::TargetServer;

use super::{AdminView, Unshown};

/// One interface's counters, as `show interface` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// `iscsi`, a fabric port's name (`fc1`, `vfc2`), an FCoE port's
    /// interface, `TUNNEL/N` for an FCIP circuit.
    pub name: String,
    /// What kind of port.
    pub kind: &'static str,
    /// Its state, where it has one.
    pub state: String,
    /// Counters since start, by name.
    pub counters: Vec<(&'static str, u64)>,
}

/// Load rates of the interfaces, sampled by [`View::sample`].
#[derive(Debug)]
pub struct Load {
    /// When the gateway started (samples are timed from it).
    pub started: std::time::Instant,
    /// The sampled counters.
    pub rates: std::sync::Mutex<super::rates::Rates>,
}

/// The running gateway's state as the admin endpoint shows it.
#[derive(Debug)]
pub struct View {
    /// Cluster membership, when `[cluster]` is configured.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The iSCSI portal, when configured.
    pub server: Option<TargetServer>,
    /// The FC plane, when configured.
    pub fc: Option<Arc<crate::plane::fc::FcPlane>>,
    /// The FCoE ports, when configured.
    pub fcoe: Option<Arc<crate::plane::fcoe::FcoePorts>>,
    /// The FCIP tunnels, when configured.
    pub fcip: Option<Arc<crate::plane::fcip::FcipPlane>>,
    /// Every LU by name, in configuration order.
    pub luns: crate::reload::LuList,
    /// Each `iscsi://` LU: name, redacted backend, its sessions' factory.
    pub remotes: crate::reload::IscsiRemotes,
    /// Each `fc://` LU: name and remote.
    pub fc_remotes: crate::reload::FcRemotes,
    /// The running configuration (as reloads leave it).
    pub running: crate::reload::Running,
    /// Interface load rates (`[admin] load_interval`).
    pub load: Load,
}

impl View {
    /// Every interface's counters now.
    pub fn interfaces(&self) -> Vec<Interface> {
        let mut v = Vec::new();
        if let Some(s) = &self.server {
            let st = s.stats();
            let addrs: Vec<String> = s.local_addrs().iter().map(|a| a.to_string()).collect();
            v.push(Interface {
                name: "iscsi".into(),
                kind: "iscsi portal",
                state: format!("up ({})", addrs.join(", ")),
                counters: vec![
                    ("commands", st.commands),
                    ("connections", st.connections),
                    ("logins", st.logins),
                    ("login_failures", st.login_failures),
                ],
            });
        }
        if let Some(fc) = &self.fc {
            for p in fc.switch().with_fabric(|f| f.ports()) {
                let c = p.counters;
                v.push(Interface {
                    name: p.name.clone(),
                    kind: "fabric port",
                    state: format!("{} login(s)", p.fc_ids.len()),
                    counters: vec![
                        ("rx_frames", c.rx_frames),
                        ("tx_frames", c.tx_frames),
                        ("rx_bytes", c.rx_bytes),
                        ("tx_bytes", c.tx_bytes),
                        (
                            "discards",
                            c.zone_drops + c.unroutable_drops + c.source_drops,
                        ),
                    ],
                });
            }
        }
        if let Some(f) = &self.fcoe {
            v.extend(f.interfaces());
        }
        if let Some(f) = &self.fcip {
            v.extend(f.interfaces());
        }
        v
    }

    /// Per iSCSI session (`unifab_iscsi_session_commands_total`, labels
    /// `target`, `initiator`, `isid`) and per path to a remote LU
    /// (`unifab_remote_path_up`, `unifab_remote_logins_total`, labels `lu`,
    /// `initiator`: a path's logins count its reconnects).
    fn session_and_remote_families(
        &self,
    ) -> Vec<(
        super::metrics::Family,
        prometheus_client::metrics::MetricType,
    )> {
        use super::metrics::{Family, Value, counter, gauge};
        let mut commands = Family::new(
            "unifab_iscsi_session_commands",
            "SCSI commands of one iSCSI session.",
        );
        for s in self.server.iter().flat_map(|s| s.sessions()) {
            commands = commands.with(
                vec![
                    ("target", s.target),
                    ("initiator", s.initiator),
                    ("isid", s.isid),
                ],
                Value::Counter(s.commands),
            );
        }
        let mut rows = crate::plane::remote::iscsi_remote_rows(
            &self.remotes.read().unwrap_or_else(|e| e.into_inner()),
        );
        if let Some(fc) = &self.fc {
            rows.extend(fc.remote_rows(&self.fc_remotes.read().unwrap_or_else(|e| e.into_inner())));
        }
        let mut up = Family::new(
            "unifab_remote_path_up",
            "1 while the path to a remote LU is logged in, else 0.",
        );
        let mut logins = Family::new(
            "unifab_remote_logins",
            "Logins of the path to a remote LU (the first and every reconnect).",
        );
        for r in &rows {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            let labels = || {
                let mut l = vec![("lu", s("lu")), ("initiator", s("initiator"))];
                if let Some(isid) = r["isid"].as_str() {
                    l.push(("isid", isid.to_string()));
                }
                l
            };
            up = up.with(labels(), Value::Gauge(i64::from(r["state"] == "up")));
            logins = logins.with(labels(), Value::Counter(r["logins"].as_u64().unwrap_or(0)));
        }
        vec![counter(commands), gauge(up), counter(logins)]
    }

    /// Samples every interface's counters for the load rates (the
    /// gateway calls it at a steady interval).
    pub fn sample(&self) {
        let now = self.load.started.elapsed();
        let ifs = self.interfaces();
        let mut r = self.load.rates.lock().unwrap_or_else(|e| e.into_inner());
        for i in &ifs {
            for (c, v) in &i.counters {
                r.observe(now, &i.name, c, *v);
            }
        }
        let names: Vec<String> = ifs.into_iter().map(|i| i.name).collect();
        r.retain(&names);
    }

    /// `show targets`: target → portal → LUN → LU, with its ACL and CHAP
    /// (the user names, never a secret), one row per LUN.
    fn show_targets(&self) -> Result<String, Unshown> {
        let Some(server) = &self.server else {
            return Err(Unshown::NotConfigured("[iscsi]"));
        };
        let cfg = self.running.read().unwrap_or_else(|e| e.into_inner());
        let portals: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
        let lus = self.luns.read().unwrap_or_else(|e| e.into_inner());
        let mut rows = Vec::new();
        for t in cfg.iscsi.iter().flat_map(|i| &i.target) {
            let acl = t
                .allow
                .as_ref()
                .map_or_else(|| "any".to_string(), |a| a.join(" "));
            let chap = match &t.chap {
                None => "none".to_string(),
                Some(c) => match &c.mutual_user {
                    Some(m) => format!("user {} (mutual: {m})", c.user),
                    None => format!("user {}", c.user),
                },
            };
            for (i, lu) in t.luns.iter().enumerate() {
                let backend = lus
                    .iter()
                    .find(|(n, _)| n == lu)
                    .map(|(_, g)| g.lu().describe().backend);
                rows.push(serde_json::json!({
                    "target": t.iqn, "alias": t.alias, "portals": portals.join(" "),
                    "lun": i, "lu": lu, "backend": backend,
                    "acl": acl, "chap": chap,
                }));
            }
        }
        Ok(serde_json::Value::Array(rows).to_string())
    }

    /// `show interface [NAME]`: counters, and their rates over each load
    /// interval (`rx_frames_1m` in per second).
    fn show_interfaces(&self, name: Option<&str>) -> Result<String, Unshown> {
        let ifs: Vec<Interface> = self
            .interfaces()
            .into_iter()
            .filter(|i| name.is_none_or(|n| n == i.name))
            .collect();
        if ifs.is_empty() && name.is_some() {
            return Err(Unshown::NoSuchView);
        }
        let r = self.load.rates.lock().unwrap_or_else(|e| e.into_inner());
        let rows: Vec<serde_json::Value> = ifs
            .iter()
            .map(|i| {
                let mut m = serde_json::Map::new();
                m.insert("interface".into(), i.name.clone().into());
                m.insert("kind".into(), i.kind.into());
                m.insert("state".into(), i.state.clone().into());
                for (c, v) in &i.counters {
                    m.insert((*c).into(), (*v).into());
                }
                m.insert(
                    "load_intervals".into(),
                    r.windows()
                        .iter()
                        .map(|w| serde_json::Value::from(super::rates::window_name(*w)))
                        .collect(),
                );
                for w in r.windows() {
                    let wn = super::rates::window_name(*w);
                    for (c, _) in &i.counters {
                        let rate = r.rate(&i.name, c, *w).map(|x| (x * 100.0).round() / 100.0);
                        m.insert(
                            format!("{c}_{wn}"),
                            rate.map_or(serde_json::Value::Null, Into::into),
                        );
                    }
                }
                serde_json::Value::Object(m)
            })
            .collect();
        Ok(serde_json::Value::Array(rows).to_string())
    }
}

impl AdminView for View {
    fn show(&self, what: &str) -> Result<String, Unshown> {
        let fabric = || Err(Unshown::NotConfigured("[fabric]"));
        match what {
            "sessions" => {
                let v: Vec<serde_json::Value> = self
                    .server
                    .iter()
                    .flat_map(|s| s.sessions())
                    .map(|s| {
                        serde_json::json!({
                            "target": s.target, "initiator": s.initiator, "isid": s.isid,
                            "tsih": s.tsih, "peer": s.peer, "digests": s.digests,
                            "commands": s.commands,
                        })
                    })
                    .collect();
                Ok(serde_json::Value::Array(v).to_string())
            }
            "luns" => {
                let v: Vec<serde_json::Value> = self
                    .luns
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(name, lu)| {
                        let d = lu.lu().describe();
                        let io = d.backend_io;
                        serde_json::json!({
                            "name": name, "backend": d.backend, "block_size": d.block_size,
                            "blocks": d.blocks, "bytes": u64::from(d.block_size) * d.blocks,
                            "write_protected": d.write_protected,
                            "fenced": d.fenced,
                            "state": if d.fenced {
                                "fenced"
                            } else if d.write_protected {
                                "write protected"
                            } else {
                                "ready"
                            },
                            "naa": lu.naa().map(|n| format!("{n:016x}")).unwrap_or_else(|| "remote".into()),
                            "backend_in_flight": io.map(|s| s.in_flight),
                            "backend_operations": io.map(|s| s.completed),
                            "backend_latency_us": io.and_then(|s| s.latency_us_total.checked_div(s.completed)),
                            "write_path": d.write_path.map(|p| p.name()),
                        })
                    })
                    .collect();
                Ok(serde_json::Value::Array(v).to_string())
            }
            "remotes" => {
                let mut rows = crate::plane::remote::iscsi_remote_rows(
                    &self.remotes.read().unwrap_or_else(|e| e.into_inner()),
                );
                if let Some(fc) = &self.fc {
                    rows.extend(
                        fc.remote_rows(&self.fc_remotes.read().unwrap_or_else(|e| e.into_inner())),
                    );
                }
                Ok(serde_json::Value::Array(rows).to_string())
            }
            "flogi" | "fcoe" if self.fc.is_none() && self.fcoe.is_none() => {
                Err(Unshown::NotConfigured("[fabric] or [fcoe]"))
            }
            "flogi" | "fcoe" => {
                crate::plane::fcoe::show(self.fc.as_deref(), self.fcoe.as_ref(), what)
                    .ok_or(Unshown::NoSuchView)
            }
            "fcip" => match &self.fcip {
                Some(f) => Ok(f.show()),
                None => Err(Unshown::NotConfigured("[fcip]")),
            },
            "cluster" => match &self.cluster {
                Some(c) => Ok(cluster_rows(&c.status()).to_string()),
                None => Err(Unshown::NotConfigured("[cluster]")),
            },
            "cluster-lus" => match &self.cluster {
                Some(c) => Ok(serde_json::Value::Array(c.lus()).to_string()),
                None => Err(Unshown::NotConfigured("[cluster]")),
            },
            "fcns" | "zones" => match &self.fc {
                Some(f) => f.show(what).ok_or(Unshown::NoSuchView),
                None => fabric(),
            },
            "interface" => self.show_interfaces(None),
            "targets" => self.show_targets(),
            other => match other.strip_prefix("interface/") {
                Some(name) => self.show_interfaces(Some(name)),
                None => Err(Unshown::NoSuchView),
            },
        }
    }

    fn metrics(&self) -> String {
        let sessions = self.server.as_ref().map_or(0, |s| s.sessions().len());
        let stats = self.server.as_ref().map(|s| s.stats()).unwrap_or_default();
        let mut families = super::gateway_families(stats, sessions);
        let lus: Vec<(String, unifab_scsi_core::stats::LuStatsSnapshot)> = self
            .luns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(name, lu)| lu.lu().stats().map(|s| (name.clone(), s.snapshot())))
            .collect();
        families.extend(super::lu_families(&lus));
        let mut backends = Vec::new();
        let mut paths = Vec::new();
        for (name, lu) in self.luns.read().unwrap_or_else(|e| e.into_inner()).iter() {
            let d = lu.lu().describe();
            if let Some(s) = d.backend_io {
                backends.push((name.clone(), s));
            }
            if let Some(p) = d.write_path {
                paths.push((name.clone(), p));
            }
        }
        families.extend(super::lu_backend_families(&backends));
        families.extend(super::lu_write_path_families(&paths));
        families.extend(super::interface_families(&self.interfaces()));
        families.extend(self.session_and_remote_families());
        if let Some(fc) = &self.fc {
            families.extend(fc.metric_families());
        }
        if let Some(fcip) = &self.fcip {
            families.extend(fcip.metric_families());
        }
        families.extend(self.alua_families());
        super::metrics::encode(families)
    }
}

impl View {
    /// ALUA transitions per LU with target port groups, and the cluster's
    /// membership.
    fn alua_families(
        &self,
    ) -> Vec<(
        super::metrics::Family,
        prometheus_client::metrics::MetricType,
    )> {
        use super::metrics::{Family, Value, counter, gauge};
        let mut out = Vec::new();
        let mut t = Family::new(
            "unifab_lu_alua_transitions",
            "Target port group state changes (SET TARGET PORT GROUPS, reloads, the cluster's policy and fencing).",
        );
        let mut any = false;
        for (name, lu) in self.luns.read().unwrap_or_else(|e| e.into_inner()).iter() {
            if let crate::plane::remote::GatewayLu::Emulated(e) = lu
                && !e.alua_states().is_empty()
            {
                any = true;
                t = t.with(
                    vec![("lu", name.clone())],
                    Value::Counter(e.alua_transitions()),
                );
            }
        }
        if any {
            out.push(counter(t));
        }
        if let Some(c) = &self.cluster {
            let s = c.status();
            out.push(gauge(
                Family::new(
                    "unifab_cluster_member",
                    "1 while this gateway holds its cluster lease, else 0 (joining or fenced).",
                )
                .with(vec![], Value::Gauge(i64::from(s.state == "member"))),
            ));
            out.push(gauge(
                Family::new(
                    "unifab_cluster_members",
                    "Members etcd lists (at the last renewal).",
                )
                .with(vec![], Value::Gauge(s.members.len() as i64)),
            ));
            out.push(counter(
                Family::new(
                    "unifab_cluster_fenced",
                    "Times this gateway fenced itself (lost its lease).",
                )
                .with(vec![], Value::Counter(s.fenced)),
            ));
            out.push(counter(
                Family::new(
                    "unifab_cluster_storage_fences",
                    "Departed members' storage clients (RBD) this gateway fenced off.",
                )
                .with(vec![], Value::Counter(s.storage_fences)),
            ));
            out.push(gauge(
                Family::new(
                    "unifab_cluster_unfenced",
                    "Departed members' registrations whose storage clients are not fenced off yet (their port groups still count as listed).",
                )
                .with(vec![], Value::Gauge(s.unfenced.len() as i64)),
            ));
            if let Some(us) = s.etcd_latency_us {
                out.push(gauge(
                    Family::new(
                        "unifab_cluster_etcd_latency_microseconds",
                        "The last lease renewal's round trip to etcd.",
                    )
                    .with(vec![], Value::Gauge(us as i64)),
                ));
            }
        }
        out
    }
}

/// `show cluster`: a row per member etcd lists, this gateway's with its
/// lease state (and a row of its own while it is not listed).
fn cluster_rows(s: &crate::cluster::Status) -> serde_json::Value {
    let own = |m: Option<&crate::cluster::Member>| {
        serde_json::json!({
            "member": s.name, "state": s.state, "admin": m.map(|m| &m.admin),
            "since": m.map(|m| m.since), "relative_port": m.and_then(|m| m.relative_port),
            "this": true, "lease": s.lease, "etcd_latency_us": s.etcd_latency_us,
            "fenced": s.fenced, "last_error": s.last_error,
            "storage_fences": s.storage_fences, "unfenced": s.unfenced,
        })
    };
    let mut rows: Vec<serde_json::Value> = s
        .members
        .iter()
        .map(|m| {
            if m.name == s.name && s.state == "member" {
                own(Some(m))
            } else {
                serde_json::json!({
                    "member": m.name, "state": "member", "admin": m.admin,
                    "since": m.since, "relative_port": m.relative_port,
                    "this": m.name == s.name,
                })
            }
        })
        .collect();
    if s.state != "member" || !s.members.iter().any(|m| m.name == s.name) {
        rows.retain(|r| r.get("member").and_then(|v| v.as_str()) != Some(s.name.as_str()));
        rows.push(own(None));
    }
    serde_json::Value::Array(rows)
}
