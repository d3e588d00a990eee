//! The iSCSI plane: `[iscsi]` and its `[[iscsi.target]]`s turned into a
//! portal ([`TargetServer`]) whose target nodes each dispatch into a LUN
//! map of the gateway's LUs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use unifab_iscsi::negotiate::Digest;
use unifab_iscsi::target::io::Listeners;
use unifab_iscsi::target::server::{ChapSettings, ServerConfig, TargetNode, TargetServer};
use unifab_scsi_core::target::ScsiTarget;
use unifab_scsi_core::{LogicalUnit, Lun};

use crate::config::IscsiConfig;

/// The portal's settings from `[iscsi]`.
pub fn server_config(iscsi: &IscsiConfig) -> ServerConfig {
    let mut sc = ServerConfig::default();
    if let Some(n) = iscsi.max_connections {
        sc.max_connections = n;
    }
    if let Some(q) = iscsi.queue_depth {
        sc.limits.queue_depth = q.max(1);
    }
    if let Some(v) = iscsi.max_recv_data_segment_length {
        sc.negotiation.max_recv_data_segment_length = v.clamp(512, 16_777_215);
    }
    if let Some(v) = iscsi.max_burst_length {
        sc.negotiation.max_burst_length = v.clamp(512, 16_777_215);
    }
    if let Some(v) = iscsi.first_burst_length {
        sc.negotiation.first_burst_length = v.clamp(512, 16_777_215);
    }
    if let Some(v) = iscsi.immediate_data {
        sc.negotiation.immediate_data = v;
    }
    if let Some(v) = iscsi.initial_r2t {
        sc.negotiation.initial_r2t = v;
    }
    if let Some(d) = &iscsi.digests {
        let list: Vec<Digest> = d.iter().filter_map(|s| Digest::from_name(s)).collect();
        sc.negotiation.header_digests = list.clone();
        sc.negotiation.data_digests = list;
    }
    if let Some(s) = iscsi.nop_in_interval {
        sc.limits.nop_in_interval = (s > 0).then(|| Duration::from_secs(s));
    }
    if let Some(s) = iscsi.login_timeout {
        sc.login_timeout = Duration::from_secs(s.max(1));
    }
    if let Some(n) = iscsi.coalesce_responses {
        sc.limits.coalescing.responses = n;
    }
    if let Some(us) = iscsi.coalesce_max_delay_us {
        sc.limits.coalescing.max_delay = Duration::from_micros(us);
    }
    sc
}

/// One target node per `[[iscsi.target]]`, its LUN map built from the LUs
/// `lus` finds by name (LUN 0, 1, … in the order listed).
pub fn target_nodes(
    iscsi: &IscsiConfig,
    lus: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
) -> anyhow::Result<Vec<TargetNode>> {
    let mut nodes = Vec::new();
    for t in &iscsi.target {
        let scsi = Arc::new(ScsiTarget::new());
        for (i, name) in t.luns.iter().enumerate() {
            let lu = lus(name).with_context(|| format!("lun {name:?} is not defined"))?;
            let index = u16::try_from(i).ok().and_then(Lun::from_index);
            let Some(lun) = index else {
                bail!("target {}: too many LUNs", t.iqn);
            };
            scsi.insert(lun, lu);
        }
        nodes.push(TargetNode {
            name: t.iqn.clone(),
            alias: t.alias.clone(),
            scsi,
            allow: t.allow.clone(),
            chap: t.chap.as_ref().map(|c| ChapSettings {
                user: c.user.clone(),
                secret: c.secret.clone().into_bytes(),
                mutual: match (&c.mutual_user, &c.mutual_secret) {
                    (Some(u), Some(s)) => Some((u.clone(), s.clone().into_bytes())),
                    _ => None,
                },
            }),
        });
    }
    Ok(nodes)
}

/// Binds the portal and prints what to connect to (the operator's first
/// lines); serve it with [`TargetServer::run`].
pub async fn bind(
    iscsi: &IscsiConfig,
    lus: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
) -> anyhow::Result<(TargetServer, Listeners)> {
    let nodes = target_nodes(iscsi, lus)?;
    let sc = server_config(iscsi);
    let (server, listeners) = TargetServer::bind(&iscsi.listen, sc, nodes).await?;
    for addr in server.local_addrs() {
        for t in &iscsi.target {
            // The operator's first line: what to connect to.
            crate::notice!("iSCSI target {} on {addr}", t.iqn);
            for i in 0..t.luns.len() {
                crate::notice!("  iscsi://{addr}/{}/{i}", t.iqn);
            }
        }
    }
    Ok((server, listeners))
}
