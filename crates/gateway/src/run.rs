//! `unifab run`: builds the logical units, the SCSI targets and the iSCSI
//! portal from a [`Config`], serves until SIGINT/SIGTERM, then shuts down
//! gracefully (every initiator is asked to log out; in-flight tasks finish).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::sync::watch;
use tracing::{info, warn};

use unifab_iscsi::negotiate::Digest;
use unifab_iscsi::target::server::{ChapSettings, ServerConfig, TargetNode, TargetServer};
use unifab_scsi_core::backend::{BlockBackend, FileBackend, FileOptions, MemoryBackend};
use unifab_scsi_core::emulated::{EmulatedLu, EmulatedLuConfig};
use unifab_scsi_core::target::ScsiTarget;
use unifab_scsi_core::{LogicalUnit, Lun};

use crate::admin::{self, AdminView, Metrics};
use crate::config::{Backend, Config, LuConfig};
use crate::remote::GatewayLu;

/// Opens a LU's backend and builds the emulated LU.
pub fn build_lu(
    lu: &LuConfig,
    data_dir: &std::path::Path,
) -> anyhow::Result<(Arc<EmulatedLu>, Arc<dyn BlockBackend>)> {
    let backend: Arc<dyn BlockBackend> = match lu.parsed_backend().map_err(anyhow::Error::msg)? {
        Backend::Memory => {
            let size = lu.size.map(|s| s.0).context("a memory LU needs a size")?;
            Arc::new(MemoryBackend::new(size))
        }
        Backend::File(path) => {
            if let Some(dir) = path.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
            }
            let b = FileBackend::open(
                &path,
                lu.size.map(|s| s.0),
                FileOptions {
                    read_only: lu.read_only,
                },
            )
            .with_context(|| format!("lu {:?}: opening {}", lu.name, path.display()))?;
            Arc::new(b)
        }
        Backend::Iscsi(_) => {
            bail!(
                "lu {:?}: an iscsi:// LU is built by remote::build_remote_lu",
                lu.name
            )
        }
        Backend::Fc(_) => bail!("lu {:?}: an fc:// LU is built by the FC plane", lu.name),
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let defaults = EmulatedLuConfig::default();
    let cfg = EmulatedLuConfig {
        name: lu.name.clone(),
        block_size: lu.block_size.unwrap_or(512),
        serial: lu.serial.clone().unwrap_or_default(),
        identity: lu.name.clone(),
        pr_path: Some(data_dir.join(format!("{}.pr", sanitize(&lu.name)))),
        write_cache: lu.write_cache.unwrap_or(defaults.write_cache),
        read_only: lu.read_only,
        physical_block_size: lu.physical_block_size,
        removable: lu.removable,
        sanitize_rate: lu.sanitize_rate.map_or(defaults.sanitize_rate, |s| s.0),
        ..defaults
    };
    let emulated = EmulatedLu::new(cfg, backend.clone())
        .with_context(|| format!("lu {:?}: cannot build the logical unit", lu.name))?;
    Ok((Arc::new(emulated), backend))
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The running gateway's state as the admin endpoint shows it.
struct View {
    server: Option<TargetServer>,
    fc: Option<Arc<crate::plane::fc::FcPlane>>,
    fcoe: Option<Arc<crate::fcoe::FcoePorts>>,
    fcip: Option<Arc<crate::fcip::FcipPlane>>,
    luns: Vec<(String, GatewayLu)>,
    /// Each `iscsi://` LU: name, redacted backend, its sessions' factory.
    remotes: Vec<(
        String,
        String,
        Arc<unifab_iscsi::initiator::io::IscsiInitiatorFactory>,
    )>,
    /// Each `fc://` LU: name and remote.
    fc_remotes: Vec<(String, crate::config::fabric::FcUrl)>,
    metrics: Arc<Metrics>,
}

impl AdminView for View {
    fn show(&self, what: &str) -> Option<String> {
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
                Some(serde_json::Value::Array(v).to_string())
            }
            "luns" => {
                let v: Vec<serde_json::Value> = self
                    .luns
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
                Some(serde_json::Value::Array(v).to_string())
            }
            "remotes" => {
                let mut rows = crate::remote::iscsi_remote_rows(&self.remotes);
                if let Some(fc) = &self.fc {
                    rows.extend(fc.remote_rows(&self.fc_remotes));
                }
                Some(serde_json::Value::Array(rows).to_string())
            }
            "flogi" | "fcoe" => crate::fcoe::show(self.fc.as_deref(), self.fcoe.as_ref(), what),
            "fcip" => Some(
                self.fcip
                    .as_ref()
                    .map_or_else(|| "[]".to_string(), |f| f.show()),
            ),
            other => self.fc.as_ref().and_then(|f| f.show(other)),
        }
    }

    fn metrics(&self) -> String {
        let sessions = self.server.as_ref().map_or(0, |s| s.sessions().len());
        if let Some(s) = &self.server {
            self.metrics
                .scsi_commands
                .store(s.commands(), std::sync::atomic::Ordering::Relaxed);
        }
        let mut text = self.metrics.render(sessions);
        if let Some(fc) = &self.fc {
            text.push_str(&fc.metrics());
        }
        text
    }
}

/// Serves `cfg` until a termination signal.
pub async fn run(cfg: Config) -> anyhow::Result<ExitCode> {
    // Held until `run` returns: the request lasts as long as the gateway.
    let cpu_latency = cfg.tuning.apply().map_err(anyhow::Error::msg)?;
    if let Some(held) = &cpu_latency {
        info!(
            requested_us = held.requested_us(),
            device = %held.device().display(),
            "holding a CPU wake-up latency request (system-wide)"
        );
    }
    let data_dir = cfg.admin.data_dir.clone();
    let mut lus: HashMap<String, GatewayLu> = HashMap::new();
    let mut lu_list = Vec::new();
    let mut backends = Vec::new();
    let mut remotes = Vec::new();
    for lu in &cfg.lu {
        if let Ok(Backend::Fc(_)) = lu.parsed_backend() {
            continue;
        }
        if let Ok(Backend::Iscsi(_)) = lu.parsed_backend() {
            let (remote, sessions) = crate::remote::build_remote(lu)?;
            info!(lu = %lu.name, remote = %remote.config().backend, "remote logical unit configured");
            remotes.push((lu.name.clone(), remote.config().backend.clone(), sessions));
            crate::remote::spawn_probe(lu.name.clone(), remote.clone());
            lus.insert(lu.name.clone(), GatewayLu::Remote(remote.clone()));
            lu_list.push((lu.name.clone(), GatewayLu::Remote(remote)));
            continue;
        }
        let (built, backend) = build_lu(lu, &data_dir)?;
        backends.push(backend);
        let d = built.describe();
        info!(
            lu = %lu.name,
            backend = %d.backend,
            bytes = u64::from(d.block_size) * d.blocks,
            block_size = d.block_size,
            "logical unit ready"
        );
        lus.insert(lu.name.clone(), GatewayLu::Emulated(built.clone()));
        lu_list.push((lu.name.clone(), GatewayLu::Emulated(built)));
    }

    // The FC plane: target N_Ports over the LUs above, then fc:// LUs.
    // FCoE links open first: an ENode port carries the initiator N_Port.
    let initiator_node = cfg
        .fabric
        .as_ref()
        .map(|f| f.initiator_node_name())
        .transpose()
        .map_err(anyhow::Error::msg)?
        .unwrap_or_default();
    let mut fcoe_opened = crate::fcoe::open(&cfg, initiator_node)?;
    let fc = match &cfg.fabric {
        Some(f) => Some(Arc::new(crate::plane::fc::FcPlane::start_with(
            f,
            |name| lus.get(name).map(GatewayLu::lu),
            fcoe_opened.initiator_via.take(),
            cfg.fcoe
                .as_ref()
                .is_some_and(|c| c.port.iter().any(|p| p.mode == "fcf")),
        )?)),
        None => None,
    };
    let fcoe = match &fc {
        Some(plane) => {
            let name = plane.switch().with_fabric(|f| f.config().switch_name);
            Some(Arc::new(fcoe_opened.start(plane.switch(), name)?))
        }
        None => None,
    };
    let fcip = match (&cfg.fcip, &fc) {
        (Some(f), Some(plane)) => Some(Arc::new(
            crate::fcip::FcipPlane::start(f, plane.switch()).await?,
        )),
        _ => None,
    };
    let mut fc_remotes = Vec::new();
    if let Some(plane) = &fc {
        for lu in &cfg.lu {
            if let Ok(Backend::Fc(url)) = lu.parsed_backend() {
                let remote = plane.remote_lu(lu, url);
                info!(lu = %lu.name, remote = %url, "remote logical unit configured");
                fc_remotes.push((lu.name.clone(), url));
                lus.insert(lu.name.clone(), GatewayLu::Remote(remote.clone()));
                lu_list.push((lu.name.clone(), GatewayLu::Remote(remote)));
            }
        }
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics = Arc::new(Metrics::default());
    let mut server_handle = None;
    // Bound before the portal is printed: whoever reads that line (an
    // operator, a script, a test) can run `unifab show` at once (the
    // connection waits in the backlog until the endpoint serves).
    let admin_listener = tokio::net::TcpListener::bind(cfg.admin.listen).await;
    let mut tasks = Vec::new();

    if let Some(iscsi) = &cfg.iscsi {
        let mut nodes = Vec::new();
        for t in &iscsi.target {
            let scsi = Arc::new(ScsiTarget::new());
            for (i, name) in t.luns.iter().enumerate() {
                let lu = lus
                    .get(name)
                    .with_context(|| format!("lun {name:?} is not defined"))?;
                let index = u16::try_from(i).ok().and_then(Lun::from_index);
                let Some(lun) = index else {
                    bail!("target {}: too many LUNs", t.iqn);
                };
                scsi.insert(lun, lu.lu());
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
        let (server, listeners) = TargetServer::bind(&iscsi.listen, sc, nodes).await?;
        for addr in server.local_addrs() {
            for t in &iscsi.target {
                // The operator's first line: what to connect to.
                println!("iSCSI target {} on {addr}", t.iqn);
                for i in 0..t.luns.len() {
                    println!("  iscsi://{addr}/{}/{i}", t.iqn);
                }
            }
        }
        let s2 = server.clone();
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move { s2.run(listeners, rx).await }));
        server_handle = Some(server);
    }

    match admin_listener {
        Ok(l) => {
            let view = Arc::new(View {
                server: server_handle.clone(),
                fc: fc.clone(),
                fcoe: fcoe.clone(),
                fcip: fcip.clone(),
                luns: lu_list,
                remotes,
                fc_remotes,
                metrics,
            });
            let rx = stop_rx.clone();
            tasks.push(tokio::spawn(admin::serve(l, view, rx)));
        }
        Err(e) => warn!(addr = %cfg.admin.listen, error = %e, "admin endpoint not available"),
    }

    wait_for_signal().await;
    info!("shutting down: asking initiators to log out");
    let _ = stop_tx.send(true);
    if let Some(p) = &fcoe {
        p.stop().await;
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    // Everything acknowledged is already on stable storage where the
    // protocol asked for it; flush the rest of the page cache too.
    for b in &backends {
        if let Err(e) = b.flush() {
            warn!(error = %e, "final flush failed");
        }
    }
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
