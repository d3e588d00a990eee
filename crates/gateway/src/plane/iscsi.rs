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

use crate::config::{IscsiConfig, TargetConfig};

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
    if let Some(s) = iscsi.nop_in_timeout {
        sc.limits.nop_in_timeout = Duration::from_secs(s.max(1));
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
    if let Some(p) = iscsi.relative_port {
        sc.relative_port_id = p;
        sc.portal_group_tag = p;
    }
    if let Some(g) = iscsi.port_group {
        sc.port_group = g;
    }
    sc.advertise = iscsi.advertise.clone().unwrap_or_default();
    sc
}

/// One target node per `[[iscsi.target]]`, its LUN map built from the LUs
/// `lus` finds by name (LUN 0, 1, … in the order listed), with the map
/// itself (a reload changes LUNs in it).
pub fn target_nodes(
    iscsi: &IscsiConfig,
    lus: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
) -> anyhow::Result<Vec<(TargetNode, Arc<ScsiTarget>)>> {
    let mut nodes = Vec::new();
    for t in &iscsi.target {
        let scsi = Arc::new(ScsiTarget::new());
        map_luns(t, &scsi, &lus)?;
        nodes.push((target_node(t, scsi.clone()), scsi));
    }
    Ok(nodes)
}

/// Makes `scsi`'s LUN map what `t.luns` lists: LUN i is the i-th LU
/// (as `lus` finds it), nothing past them. LUNs that already hold the
/// right LU are left alone; every change raises REPORTED LUNS DATA HAS
/// CHANGED for the target's hosts.
pub fn map_luns(
    t: &TargetConfig,
    scsi: &ScsiTarget,
    lus: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
) -> anyhow::Result<()> {
    let mut wanted = Vec::new();
    for (i, name) in t.luns.iter().enumerate() {
        let lu = lus(name).with_context(|| format!("lun {name:?} is not defined"))?;
        let index = u16::try_from(i).ok().and_then(Lun::from_index);
        let Some(lun) = index else {
            bail!("target {}: too many LUNs", t.iqn);
        };
        wanted.push((lun, lu));
    }
    for (lun, lu) in &wanted {
        if !scsi.get(*lun).is_some_and(|have| Arc::ptr_eq(&have, lu)) {
            scsi.insert(*lun, lu.clone());
        }
    }
    for lun in scsi.luns() {
        if !wanted.iter().any(|(l, _)| *l == lun) {
            scsi.remove(lun);
        }
    }
    Ok(())
}

/// The target node `t` describes, dispatching into `scsi`.
pub fn target_node(t: &TargetConfig, scsi: Arc<ScsiTarget>) -> TargetNode {
    TargetNode {
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
    }
}

/// The LUN map of each target, by IQN in lower case.
pub type LunMaps = std::collections::HashMap<String, Arc<ScsiTarget>>;

/// Binds the portal and prints what to connect to (the operator's first
/// lines); serve it with [`TargetServer::run`].
pub async fn bind(
    iscsi: &IscsiConfig,
    lus: impl Fn(&str) -> Option<Arc<dyn LogicalUnit>>,
) -> anyhow::Result<(TargetServer, Listeners, LunMaps)> {
    let mut maps = LunMaps::new();
    let mut nodes = Vec::new();
    for (node, scsi) in target_nodes(iscsi, lus)? {
        maps.insert(node.name.to_ascii_lowercase(), scsi);
        nodes.push(node);
    }
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
    Ok((server, listeners, maps))
}
