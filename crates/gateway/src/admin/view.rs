//! The running gateway as its admin endpoint shows it: `unifab show`
//! views and the Prometheus text, over the planes `unifab run` started.

use std::sync::Arc;

use unifab_iscsi::target::server::TargetServer;

use super::{AdminView, Unshown};

/// The running gateway's state as the admin endpoint shows it.
#[derive(Debug)]
pub struct View {
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
    pub remotes: Vec<(
        String,
        String,
        Arc<unifab_iscsi::initiator::io::IscsiInitiatorFactory>,
    )>,
    /// Each `fc://` LU: name and remote.
    pub fc_remotes: Vec<(String, crate::config::fabric::FcUrl)>,
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
                        serde_json::json!({
                            "name": name, "backend": d.backend, "block_size": d.block_size,
                            "blocks": d.blocks, "bytes": u64::from(d.block_size) * d.blocks,
                            "write_protected": d.write_protected,
                            "naa": lu.naa().map(|n| format!("{n:016x}")).unwrap_or_else(|| "remote".into()),
                        })
                    })
                    .collect();
                Ok(serde_json::Value::Array(v).to_string())
            }
            "remotes" => {
                let mut rows = crate::plane::remote::iscsi_remote_rows(&self.remotes);
                if let Some(fc) = &self.fc {
                    rows.extend(fc.remote_rows(&self.fc_remotes));
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
            "fcns" | "zones" => match &self.fc {
                Some(f) => f.show(what).ok_or(Unshown::NoSuchView),
                None => fabric(),
            },
            _ => Err(Unshown::NoSuchView),
        }
    }

    fn metrics(&self) -> String {
        let sessions = self.server.as_ref().map_or(0, |s| s.sessions().len());
        let stats = self.server.as_ref().map(|s| s.stats()).unwrap_or_default();
        let mut text = super::render_metrics(stats, sessions);
        let lus: Vec<(String, unifab_scsi_core::stats::LuStatsSnapshot)> = self
            .luns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(name, lu)| lu.lu().stats().map(|s| (name.clone(), s.snapshot())))
            .collect();
        text.push_str(&super::render_lu_metrics(&lus));
        if let Some(fc) = &self.fc {
            text.push_str(&fc.metrics());
        }
        text
    }
}
