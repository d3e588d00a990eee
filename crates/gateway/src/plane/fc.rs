//! The running FC plane: the software switch, the gateway's own FCP
//! target N_Ports presenting LUs, the FCP initiator N_Port behind
//! `fc://WWPN/LUN` backends, and the operator's views (`unifab show
//! flogi`, `fcns`, `zones`). Its configuration, `[fabric]`, is
//! [`crate::config::fabric`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tracing::{info, warn};
use unifab_fc::exchange::Timeouts;
use unifab_fc::fabric::zoning::{Zone, ZoneMember, ZoneSet};
use unifab_fc::fabric::{FabricConfig, LoginKind};
use unifab_fc::io::{FcNode, FcpInitiatorFactory, Switch};
use unifab_fc::nport::{LinkBudget, NPortConfig};
use unifab_fc::wire::Wwn;
use unifab_fc::wire::header::FcType;
use unifab_scsi_core::{LogicalUnit, Lun, RemoteLu, RemoteLuConfig, ScsiTarget};

use crate::config::LuConfig;
#[cfg(test)]
use crate::config::fabric::FCF_WRITE_IN_FLIGHT;
use crate::config::fabric::{
    ENODE_FRAMES_IN, FabricSection, FcUrl, fc_identity, node_name_for, wwn,
};

/// The budget of `max` among `budgets`, made and added if none has that
/// bound: ports given the same bound share one.
fn shared_budget(budgets: &mut Vec<LinkBudget>, max: u64) -> LinkBudget {
    match budgets.iter().find(|b| b.max() == max) {
        Some(b) => b.clone(),
        None => {
            let b = LinkBudget::new(max);
            budgets.push(b.clone());
            b
        }
    }
}

/// The running FC plane.
#[derive(Debug)]
pub struct FcPlane {
    switch: Switch,
    node: FcNode,
    initiator: Wwn,
    per_nexus: bool,
    npiv_names: unifab_fc::io::NpivNames,
    names: Vec<(Wwn, String)>,
}

impl FcPlane {
    /// Starts the switch, the target N_Ports (their LUs found with
    /// `lookup`) and the initiator N_Port. Must run inside the runtime.
    pub fn start(
        f: &FabricSection,
        lookup: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
    ) -> anyhow::Result<FcPlane> {
        FcPlane::start_with(f, lookup, None, false)
    }

    /// As [`FcPlane::start`], with the initiator N_Port attached through
    /// `initiator_via` (an FCoE ENode's link to a remote FCF) instead of
    /// this gateway's switch. `behind_fcf`: the gateway runs an FCoE FCF,
    /// so its target ports bound the write data in flight toward them
    /// ([`crate::config::fabric::FCF_WRITE_IN_FLIGHT`]) unless configured otherwise.
    pub fn start_with(
        f: &FabricSection,
        lookup: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
        initiator_via: Option<unifab_fc::io::Connect>,
        behind_fcf: bool,
    ) -> anyhow::Result<FcPlane> {
        let switch_name = f.switch().map_err(anyhow::Error::msg)?;
        let timeouts = Timeouts::default();
        let switch = Switch::new(FabricConfig {
            domain: f.domain,
            switch_name,
            timeouts,
            rx_data_field_size: 2048,
            default_zone_permit: f.default_zone.as_deref() != Some("deny"),
        });
        switch.with_fabric(|fab| -> anyhow::Result<()> {
            for z in &f.zone {
                let members = z
                    .members
                    .iter()
                    .map(|m| m.parse::<ZoneMember>())
                    .collect::<Result<Vec<_>, _>>()?;
                fab.define_zone(Zone {
                    name: z.name.clone(),
                    members,
                });
            }
            for s in &f.zoneset {
                fab.define_zone_set(ZoneSet {
                    name: s.name.clone(),
                    zones: s.zones.clone(),
                });
            }
            if let Some(a) = &f.active_zoneset {
                fab.activate_zone_set(a)?;
            }
            Ok(())
        })?;
        let node = FcNode::spawn(&switch, "gateway");
        let mut names = Vec::new();
        // Target ports with the same `max_write_in_flight` share one
        // budget: behind an FCF they all receive through its link.
        let mut write_budgets: Vec<LinkBudget> = Vec::new();
        for (k, t) in f.target.iter().enumerate() {
            let wwpn = wwn("fabric.target.wwpn", &t.wwpn).map_err(anyhow::Error::msg)?;
            let wwnn = match &t.wwnn {
                Some(n) => wwn("fabric.target.wwnn", n).map_err(anyhow::Error::msg)?,
                None => node_name_for(wwpn),
            };
            let scsi = ScsiTarget::new();
            for (i, name) in t.luns.iter().enumerate() {
                let lu = lookup(name).with_context(|| format!("lu {name:?} is not defined"))?;
                let lun = u16::try_from(i)
                    .ok()
                    .and_then(Lun::from_index)
                    .with_context(|| format!("fabric.target {wwpn}: too many LUNs"))?;
                scsi.insert(lun, lu);
            }
            let mut cfg = NPortConfig::new(wwpn, wwnn);
            cfg.target = true;
            cfg.max_burst = t.max_burst().map_err(anyhow::Error::msg)?;
            cfg.max_write_held = t.max_write_held().map_err(anyhow::Error::msg)?;
            cfg.max_write_in_flight = t
                .max_write_in_flight(behind_fcf)
                .map_err(anyhow::Error::msg)?;
            cfg.write_budget = cfg
                .max_write_in_flight
                .map(|max| shared_budget(&mut write_budgets, max));
            cfg.timeouts = timeouts;
            cfg.relative_port_id = u16::try_from(k + 1).unwrap_or(u16::MAX);
            cfg.symbolic_name = format!("unifab FCP target {wwpn}");
            let iface = format!("fc1/{}", k + 1);
            node.add_port(&iface, cfg, Some(scsi))
                .map_err(|e| anyhow::anyhow!("fabric.target {wwpn}: {e}"))?;
            names.push((wwpn, iface));
            crate::notice!("FC target {wwpn} with {} LUN(s)", t.luns.len());
        }
        let mut cfg = f.initiator_port_config().map_err(anyhow::Error::msg)?;
        cfg.timeouts = timeouts;
        if initiator_via.is_some() && cfg.max_frames_in.is_none() {
            cfg.max_frames_in = Some(ENODE_FRAMES_IN);
        }
        let initiator = cfg.port_name;
        let iface = format!("fc1/{}", f.target.len() + 1);
        let base = cfg.clone();
        let via_enode = initiator_via.is_some();
        match initiator_via {
            Some(via) => node.add_port_via(&iface, cfg, None, via),
            None => node.add_port(&iface, cfg, None),
        }
        .map_err(|e| anyhow::anyhow!("fabric.initiator: {e}"))?;
        names.push((initiator, iface));
        // More physical ports for the hosts' NPIV ports (255 each), on the
        // gateway's own switch (over an FCoE ENode the remote FCF decides).
        if f.per_nexus() && !via_enode {
            for k in 1..f.physical_ports() {
                let mut c = base.clone();
                c.port_name = unifab_fc::io::initiator::carrier_port_name(initiator, k);
                c.node_name = node_name_for(c.port_name);
                c.discover = false;
                c.symbolic_name = format!("unifab FCP initiator {initiator} NPIV carrier {k}");
                let iface = format!("fc1/{}", f.target.len() + 1 + k as usize);
                node.add_npiv_carrier(&iface, c.clone(), initiator)
                    .map_err(|e| anyhow::anyhow!("fabric.initiator: {e}"))?;
                names.push((c.port_name, iface));
            }
        }
        info!(domain = f.domain, switch = %switch_name, "FC fabric running");
        Ok(FcPlane {
            switch,
            node,
            initiator,
            per_nexus: f.per_nexus(),
            npiv_names: f.npiv_names(),
            names,
        })
    }

    /// Makes the switch's zoning what `new` says (zones and zone sets
    /// `old` had and `new` has not are forgotten): one change, an RSCN to
    /// each port whose view changed.
    pub fn reconfigure_zoning(
        &self,
        old: &crate::config::fabric::FabricSection,
        new: &crate::config::fabric::FabricSection,
    ) -> anyhow::Result<()> {
        let gone_zones: Vec<String> = old
            .zone
            .iter()
            .filter(|z| !new.zone.iter().any(|n| n.name == z.name))
            .map(|z| z.name.clone())
            .collect();
        let gone_sets: Vec<String> = old
            .zoneset
            .iter()
            .filter(|z| !new.zoneset.iter().any(|n| n.name == z.name))
            .map(|z| z.name.clone())
            .collect();
        let mut zones = Vec::new();
        for z in &new.zone {
            let members = z
                .members
                .iter()
                .map(|m| m.parse::<ZoneMember>())
                .collect::<Result<Vec<_>, _>>()?;
            zones.push(Zone {
                name: z.name.clone(),
                members,
            });
        }
        let sets = new
            .zoneset
            .iter()
            .map(|s| ZoneSet {
                name: s.name.clone(),
                zones: s.zones.clone(),
            })
            .collect();
        self.switch.with_fabric(|f| {
            f.reconfigure_zoning(
                (&gone_zones, &gone_sets),
                zones,
                sets,
                new.default_zone.as_deref() != Some("deny"),
                new.active_zoneset.as_deref(),
            )
        })?;
        Ok(())
    }

    /// The remote LU of an `fc://` backend.
    pub fn remote_lu(&self, lu: &LuConfig, url: FcUrl) -> Arc<RemoteLu> {
        let factory = Arc::new(
            FcpInitiatorFactory::new(self.node.clone(), self.initiator, url.wwpn, self.per_nexus)
                .with_names(self.npiv_names.clone()),
        );
        let remote = Arc::new(RemoteLu::new(
            RemoteLuConfig {
                name: lu.name.clone(),
                backend: url.to_string(),
                remote_lun: Lun::from_index(url.lun).unwrap_or(Lun::ZERO),
                identity: fc_identity(lu, url),
                task_set_depth: 1024,
                read_only: lu.read_only,
            },
            factory,
        ));
        // Learn the capacity once the target is reachable.
        let probe = remote.clone();
        let name = lu.name.clone();
        tokio::spawn(async move {
            for _ in 0..30 {
                match probe.probe().await {
                    Ok((bs, blocks)) => {
                        info!(lu = %name, block_size = bs, blocks, "fc:// LU reachable");
                        return;
                    }
                    Err(e) => {
                        warn!(lu = %name, error = %e, "fc:// LU not reachable yet");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        });
        remote
    }

    /// Rows of `unifab show remotes` for the `fc://` LUs `lus`: for each,
    /// the session of every initiator N_Port of this gateway (the
    /// configured one and, with one remote nexus per host, each host's NPIV
    /// port) with the LU's target port.
    pub fn remote_rows(&self, lus: &[(String, FcUrl)]) -> Vec<serde_json::Value> {
        let ports: Vec<_> = self
            .node
            .ports()
            .into_iter()
            .filter(|p| p.initiator && (p.port_name == self.initiator || p.virtual_port))
            .collect();
        let logins = self.switch.with_fabric(|f| f.logins());
        let mut rows = Vec::new();
        for (name, url) in lus {
            // What the gateway's own switch says of this path: zoning, or
            // a target that is not logged in (a path through a remote
            // FCF's fabric: unknown here).
            let target = logins
                .iter()
                .find(|l| l.port_name == url.wwpn)
                .map(|l| l.fc_id);
            let path = |fc_id: unifab_fc::wire::FcId| -> &'static str {
                if !logins.iter().any(|l| l.fc_id == fc_id) {
                    return "-";
                }
                match target {
                    None => "target not logged in to the fabric",
                    Some(t) if !self.switch.with_fabric(|f| f.zoned(fc_id, t)) => "zoned out",
                    Some(_) => "zoned in",
                }
            };
            for p in &ports {
                let record = p.sessions.iter().find(|r| r.port_name == url.wwpn);
                let up = p.online && record.is_some_and(|r| r.up);
                // Since when it has been so: the session's last change, or
                // the port's if it never had one.
                let since = record.map_or(p.since, |r| r.since);
                // The latest of the session's end and the port's going offline.
                let last = [
                    record.and_then(|r| r.last_down.as_ref()),
                    p.last_offline.as_ref(),
                ]
                .into_iter()
                .flatten()
                .max_by_key(|(_, at)| *at);
                let iface = if p.virtual_port {
                    format!("{} (npiv)", p.port_name)
                } else {
                    p.port_name.to_string()
                };
                let remote = url.to_string();
                let row = crate::plane::remote::RemoteRow {
                    lu: name,
                    remote: &remote,
                    initiator: iface,
                    up,
                    for_how_long: since.elapsed(),
                    logins: record.map_or(0, |r| r.logins),
                    last_error: last.map(|(e, at)| (e.as_str(), at.elapsed())),
                };
                let zoning = path(p.fc_id);
                rows.push(
                    row.to_json(
                        serde_json::json!({ "fcid": p.fc_id.to_string(), "zoning": zoning }),
                    ),
                );
            }
        }
        rows
    }

    /// The switch (zoning changes, counters).
    pub fn switch(&self) -> &Switch {
        &self.switch
    }

    fn interface(&self, port_index: usize, wwpn: Wwn) -> String {
        self.names
            .iter()
            .find(|(w, _)| *w == wwpn)
            .map(|(_, n)| n.clone())
            .unwrap_or_else(|| format!("vfc{}", port_index + 1))
    }

    /// The node's N_Ports' counters as metric families, one sample per
    /// port (label `wwpn`; the counters are at most
    /// [`unifab_fc::io::STATS_REFRESH`] old).
    pub fn metric_families(
        &self,
    ) -> Vec<(
        crate::admin::metrics::Family,
        prometheus_client::metrics::MetricType,
    )> {
        use crate::admin::metrics::{Family, Value};
        let ports = self.node.ports();
        type Get = fn(&unifab_fc::io::NodePortView) -> u64;
        // (name, help, value); a name ending in _total is a counter, the
        // rest gauges.
        let series: [(&str, &str, Get); 13] = [
            (
                "unifab_fc_port_rx_frames_total",
                "FC frames the N_Port received.",
                |p| p.stats.rx_frames,
            ),
            (
                "unifab_fc_port_tx_frames_total",
                "FC frames the N_Port sent.",
                |p| p.stats.tx_frames,
            ),
            (
                "unifab_fc_port_discarded_frames_total",
                "Frames the N_Port discarded (not for it, malformed, no login).",
                |p| p.stats.discarded,
            ),
            (
                "unifab_fc_port_abts_sent_total",
                "ABTS the N_Port sent.",
                |p| p.stats.abts_sent,
            ),
            (
                "unifab_fc_port_abts_received_total",
                "ABTS the N_Port received.",
                |p| p.stats.abts_received,
            ),
            (
                "unifab_fc_port_write_refusals_total",
                "Writes refused as larger than the whole write-data budget.",
                |p| p.stats.write_refusals,
            ),
            (
                "unifab_fc_port_logins_refused_total",
                "PLOGIs refused because the port had its most remote ports logged in.",
                |p| p.stats.logins_refused,
            ),
            (
                "unifab_fc_port_writes_deferred_total",
                "Writes that waited for the write-data budget.",
                |p| p.stats.writes_deferred,
            ),
            (
                "unifab_fc_port_writes_waiting",
                "Writes waiting for the write-data budget now.",
                |p| p.writes_waiting as u64,
            ),
            (
                "unifab_fc_port_write_bytes_held",
                "Write data the admitted writes account for.",
                |p| p.write_bytes_held,
            ),
            (
                "unifab_fc_port_write_bytes_to_come",
                "Write data the admitted writes have yet to receive (the link's max_write_in_flight bounds the sum over the target ports sharing it).",
                |p| p.write_bytes_to_come,
            ),
            (
                "unifab_fc_port_frames_in",
                "Frames the initiator's open commands can still bring back (the link's max_frames_in bounds the sum over its ports).",
                |p| u64::from(p.frames_in),
            ),
            (
                "unifab_fc_port_commands_waiting",
                "Initiator commands waiting for their target port or for room under the link's max_frames_in.",
                |p| p.commands_waiting as u64,
            ),
        ];
        let mut out = Vec::new();
        for (name, help, get) in series {
            // A name ending in _total is a counter (the family is named
            // without it), the rest gauges.
            let (family, counter) = match name.strip_suffix("_total") {
                Some(f) => (f, true),
                None => (name, false),
            };
            let mut f = Family::new(family, help);
            for p in &ports {
                let v = get(p);
                let value = if counter {
                    Value::Counter(v)
                } else {
                    Value::Gauge(i64::try_from(v).unwrap_or(i64::MAX))
                };
                f = f.with(vec![("wwpn", p.port_name.to_string())], value);
            }
            out.push(if counter {
                crate::admin::metrics::counter(f)
            } else {
                crate::admin::metrics::gauge(f)
            });
        }
        out
    }

    /// JSON for `unifab show flogi|fcns|zones`, or `None` for other views.
    pub fn show(&self, what: &str) -> Option<String> {
        let v = match what {
            "flogi" => {
                let logins = self.switch.with_fabric(|f| {
                    f.logins()
                        .into_iter()
                        .map(|l| (l.clone(), f.port_name(l.port).map(str::to_string)))
                        .collect::<Vec<_>>()
                });
                logins
                    .into_iter()
                    .map(|(l, port)| {
                        let iface = match (&port, l.kind) {
                            (Some(p), LoginKind::Flogi) => p.clone(),
                            (Some(p), LoginKind::Fdisc) => format!("{p} (npiv)"),
                            (None, _) => self.interface(l.port.0, l.port_name),
                        };
                        serde_json::json!({
                            "interface": iface,
                            "fcid": l.fc_id.to_string(),
                            "port_name": l.port_name.to_string(),
                            "node_name": l.node_name.to_string(),
                        })
                    })
                    .collect::<Vec<_>>()
            }
            "fcns" => self
                .switch
                .with_fabric(|f| f.name_server())
                .into_iter()
                .map(|e| {
                    let feats = e.fc4_features.get(FcType::FCP);
                    let fc4 = if e.fc4_types.contains(FcType::FCP) {
                        let role = match (feats & 1 != 0, feats & 2 != 0) {
                            (true, true) => ":init,target",
                            (true, false) => ":target",
                            (false, true) => ":init",
                            (false, false) => "",
                        };
                        format!("scsi-fcp{role}")
                    } else {
                        "-".into()
                    };
                    serde_json::json!({
                        "fcid": e.fc_id.to_string(),
                        "type": "N",
                        "pwwn": e.port_name.to_string(),
                        "nwwn": e.node_name.to_string(),
                        "fc4_type_feature": fc4,
                        "symbolic_name": String::from_utf8_lossy(&e.symbolic_port_name),
                    })
                })
                .collect(),
            "zones" => self.switch.with_fabric(|f| {
                let z = f.zoning();
                let active = z.active().map(str::to_string);
                let mut rows = Vec::new();
                for set in z.zone_sets() {
                    for zname in &set.zones {
                        let members = z
                            .zones()
                            .find(|x| &x.name == zname)
                            .map(|x| x.members.clone())
                            .unwrap_or_default();
                        for m in members {
                            rows.push(serde_json::json!({
                                "zoneset": set.name,
                                "zone": zname,
                                "member": m.to_string(),
                                "active": active.as_deref() == Some(set.name.as_str()),
                            }));
                        }
                    }
                }
                rows
            }),
            _ => return None,
        };
        Some(serde_json::Value::Array(v).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ports_with_the_same_write_bound_share_one_budget() {
        let mut budgets = Vec::new();
        let a = shared_budget(&mut budgets, FCF_WRITE_IN_FLIGHT);
        let b = shared_budget(&mut budgets, FCF_WRITE_IN_FLIGHT);
        let c = shared_budget(&mut budgets, 1 << 20);
        assert!(a.same(&b));
        assert!(!a.same(&c));
        assert_eq!((c.max(), budgets.len()), (1 << 20, 2));
    }
}
