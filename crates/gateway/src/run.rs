//! `unifab run`: start-up and shutdown only. It starts the planes
//! ([`crate::plane`]: the LUs, FC, FCoE, FCIP and the iSCSI portal) from a
//! validated [`Config`] and the admin endpoint over them, serves until
//! SIGINT/SIGTERM, then shuts down gracefully (every initiator is asked to
//! log out; in-flight tasks finish; backends are flushed).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use unifab_scsi_core::LogicalUnit;

use crate::admin;
use crate::config::{Backend, Config};
use crate::plane::remote::GatewayLu;
use crate::reload::{Live, LiveParts};

/// The admin socket's file name under `[admin] data_dir`.
pub const ADMIN_SOCKET: &str = "admin.sock";

/// Serves `cfg` until a termination signal.
pub async fn run(cfg: Config) -> anyhow::Result<ExitCode> {
    run_from(cfg, None).await
}

/// [`run`] for a configuration read from `path`: SIGHUP reloads it
/// ([`crate::reload`]): what can change live does, what cannot is logged
/// as needing a restart, an invalid file changes nothing. The process
/// never dies of SIGHUP.
pub async fn run_from(cfg: Config, path: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    // Held until `run` returns: the request lasts as long as the gateway.
    let cpu_latency = cfg.tuning.apply().map_err(anyhow::Error::msg)?;
    if let Some(held) = &cpu_latency {
        info!(
            requested_us = held.requested_us(),
            device = %held.device().display(),
            "holding a CPU wake-up latency request (system-wide)"
        );
    }
    match crate::tuning::raise_fd_limit() {
        Ok(l) => {
            let connections = cfg.iscsi.as_ref().map_or(0, |i| {
                i.max_connections.unwrap_or(
                    unifab_iscsi::target::server::ServerConfig::default().max_connections,
                )
            });
            let needed = crate::tuning::fds_needed(connections);
            if l.now < needed {
                warn!(
                    limit = l.now,
                    hard = l.hard,
                    needed,
                    connections,
                    "the file descriptor limit is below what the connection limit needs: logins past it are refused (raise LimitNOFILE= or ulimit -Hn, or lower iscsi.max_connections)"
                );
            } else if l.now != l.was {
                info!(
                    from = l.was,
                    to = l.now,
                    "file descriptor limit raised to the hard limit"
                );
            }
        }
        Err(e) => warn!(error = %e, "file descriptor limit not raised"),
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
            let (remote, sessions) = crate::plane::remote::build_remote(lu)?;
            info!(lu = %lu.name, remote = %remote.config().backend, "remote logical unit configured");
            remotes.push((lu.name.clone(), remote.config().backend.clone(), sessions));
            crate::plane::remote::spawn_probe(lu.name.clone(), remote.clone());
            lus.insert(lu.name.clone(), GatewayLu::Remote(remote.clone()));
            lu_list.push((lu.name.clone(), GatewayLu::Remote(remote)));
            continue;
        }
        if lu.is_tape() {
            let (tape, backend) = crate::plane::lu::build_tape(lu)?;
            backends.push((lu.name.clone(), backend));
            let (_, objects) = tape.position();
            info!(lu = %lu.name, backend = %tape.describe().backend, objects, "tape drive ready");
            lus.insert(lu.name.clone(), GatewayLu::Tape(tape.clone()));
            lu_list.push((lu.name.clone(), GatewayLu::Tape(tape)));
            continue;
        }
        let (built, backend) = crate::plane::lu::build_lu(lu, &data_dir, cfg.cluster.is_some())?;
        backends.push((lu.name.clone(), backend));
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
    let mut fcoe_opened = crate::plane::fcoe::open(&cfg, initiator_node)?;
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
            crate::plane::fcip::FcipPlane::start(f, plane.switch()).await?,
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
    let mut server_handle = None;
    // Bound before the portal is printed: whoever reads that line (an
    // operator, a script, a test) can run `unifab show` at once (the
    // connection waits in the backlog until the endpoint serves).
    let admin_listener = tokio::net::TcpListener::bind(cfg.admin.listen).await;
    let socket = cfg.admin.data_dir.join(ADMIN_SOCKET);
    let admin_socket = admin::bind_unix(&socket);
    let mut tasks = Vec::new();

    let mut maps = crate::plane::iscsi::LunMaps::new();
    if let Some(iscsi) = &cfg.iscsi {
        let (server, listeners, m) =
            crate::plane::iscsi::bind(iscsi, |name| lus.get(name).map(GatewayLu::lu)).await?;
        maps = m;
        let s2 = server.clone();
        let rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move { s2.run(listeners, rx).await }));
        server_handle = Some(server);
    }
    let lu_list = Arc::new(std::sync::RwLock::new(lu_list));
    let remotes: crate::reload::IscsiRemotes = Arc::new(std::sync::RwLock::new(remotes));
    let fc_remotes: crate::reload::FcRemotes = Arc::new(std::sync::RwLock::new(fc_remotes));
    let running: crate::reload::Running = Arc::new(std::sync::RwLock::new(cfg.clone()));
    let backends = Arc::new(std::sync::RwLock::new(backends));
    let live = Arc::new(tokio::sync::Mutex::new(Live::new(LiveParts {
        running: cfg.clone(),
        path: path.clone(),
        lus: lus.clone(),
        lu_list: lu_list.clone(),
        backends: backends.clone(),
        maps,
        server: server_handle.clone(),
        published: running.clone(),
        fc: fc.clone(),
        fcip: fcip.clone(),
        fcoe: fcoe.clone(),
        remotes: remotes.clone(),
        fc_remotes: fc_remotes.clone(),
    })));

    // [cluster]: membership, and the fencing of this gateway's port on
    // every LU with target port groups.
    let cluster = match &cfg.cluster {
        Some(c) => {
            let group = cfg.iscsi.as_ref().and_then(|i| i.port_group).unwrap_or(1);
            // Every clustered LU with its groups' configured states.
            let clustered: Vec<Arc<crate::cluster::AluaLu>> = cfg
                .lu
                .iter()
                .filter_map(|l| {
                    let a = l.alua.as_ref()?.to_core(&l.name).ok()?;
                    let states: Vec<_> = a.groups.iter().map(|g| (g.id, g.state)).collect();
                    match lus.get(&l.name)? {
                        GatewayLu::Emulated(e) => Some(Arc::new(crate::cluster::AluaLu {
                            name: l.name.clone(),
                            lu: e.clone(),
                            desired: std::sync::Mutex::new(states.clone()),
                            configured: states,
                        })),
                        _ => None,
                    }
                })
                .collect();
            let announced = admin_listener
                .as_ref()
                .ok()
                .and_then(|l| l.local_addr().ok())
                .map_or_else(|| cfg.admin.listen.to_string(), |a| a.to_string());
            let me = crate::cluster::Announce {
                admin: announced,
                port_group: group,
                relative_port: cfg
                    .iscsi
                    .as_ref()
                    .and_then(|i| i.relative_port)
                    .unwrap_or(1),
            };
            let (c, _task) = crate::cluster::Cluster::start(c, me, clustered, stop_rx.clone())
                .map_err(anyhow::Error::msg)?;
            Some(Arc::new(c))
        }
        None => None,
    };
    let view = Arc::new(crate::admin::view::View {
        cluster,
        server: server_handle.clone(),
        fc: fc.clone(),
        fcoe: fcoe.clone(),
        fcip: fcip.clone(),
        luns: lu_list,
        remotes,
        fc_remotes,
        running,
        load: crate::admin::view::Load {
            started: std::time::Instant::now(),
            rates: std::sync::Mutex::new(crate::admin::rates::Rates::new(
                cfg.admin
                    .load_interval
                    .iter()
                    .map(|s| Duration::from_secs(*s))
                    .collect(),
            )),
        },
    });
    // Load rates: every interface sampled six times in the shortest
    // window (at most every 10 s, at least every 100 ms; the windows are
    // read each time, as a reload may change them).
    {
        let v = view.clone();
        let mut rx = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                v.sample();
                let shortest = v
                    .load
                    .rates
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .windows()
                    .first()
                    .copied()
                    .unwrap_or(Duration::from_secs(60));
                let every =
                    (shortest / 6).clamp(Duration::from_millis(100), Duration::from_secs(10));
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    _ = rx.changed() => break,
                }
            }
        }));
    }
    match admin_socket {
        Ok(u) => {
            info!(socket = %socket.display(), "admin socket listening (unifab reload)");
            tasks.push(tokio::spawn(admin::serve_unix(
                u,
                view.clone(),
                live.clone(),
                stop_rx.clone(),
            )));
        }
        Err(e) if cfg.admin.required => {
            return Err(anyhow::anyhow!(
                "admin socket {}: {e} (set [admin] data_dir, or required = false to start without it)",
                socket.display()
            ));
        }
        Err(e) => {
            warn!(socket = %socket.display(), error = %e, "admin socket not available (admin.required = false): no reload but by SIGHUP")
        }
    }
    let token: admin::AdminToken = Arc::new(std::sync::RwLock::new(
        cfg.admin.token.as_deref().map(Arc::from),
    ));
    let mut admin_tcp = None;
    match admin_listener {
        Ok(l) => {
            let rx = stop_rx.clone();
            let h = tokio::spawn(admin::serve(l, view.clone(), token.clone(), rx));
            admin_tcp = Some(h.abort_handle());
            tasks.push(h);
        }
        Err(e) if cfg.admin.required => {
            return Err(anyhow::anyhow!(
                "admin endpoint {}: {e} (another gateway running? set [admin] listen, or required = false to start without it)",
                cfg.admin.listen
            ));
        }
        Err(e) => {
            warn!(addr = %cfg.admin.listen, error = %e, "admin endpoint not available (admin.required = false): running without it")
        }
    }
    let serve = {
        let (view, token, stop) = (view.clone(), token.clone(), stop_rx.clone());
        Box::new(move |l: tokio::net::TcpListener| {
            let view: Arc<dyn admin::AdminView> = view.clone();
            tokio::spawn(admin::serve(l, view, token.clone(), stop.clone())).abort_handle()
        })
    };
    live.lock().await.attach_admin(crate::reload::AdminParts {
        view,
        token,
        tcp: admin_tcp,
        serve,
    });

    // systemd (Type=notify): started. Nothing happens without
    // NOTIFY_SOCKET.
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    wait_for_signal(&live).await;
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
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
    let backends: Vec<_> = backends
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, b)| b.clone())
        .collect();
    for b in &backends {
        if let Err(e) = b.flush() {
            warn!(error = %e, "final flush failed");
        }
    }
    let _ = std::fs::remove_file(&socket);
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// SIGHUP: reloads ([`crate::reload`]).
async fn reread(live: &tokio::sync::Mutex<Live>) {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Reloading]);
    let _ready = scopeguard_ready();
    let mut live = live.lock().await;
    match live.reload().await {
        Ok(plan) => crate::reload::log_plan(&plan, true),
        Err(e) => warn!(error = %e, "reload refused; the running configuration is unchanged"),
    }
}

/// Tells systemd the reload is over when dropped.
fn scopeguard_ready() -> impl Drop {
    struct Ready;
    impl Drop for Ready {
        fn drop(&mut self) {
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
        }
    }
    Ready
}

async fn wait_for_signal(live: &tokio::sync::Mutex<Live>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut hup) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(t), Ok(h)) => (t, h),
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return,
                _ = term.recv() => return,
                _ = hup.recv() => reread(live).await,
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
