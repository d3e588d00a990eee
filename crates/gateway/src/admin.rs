//! The operator endpoint: a small HTTP/1.1 server on loopback answering
//! `GET /show/<what>` with JSON (what `unifab show …` prints) and
//! `GET /metrics` in the Prometheus text format.
//!
//! Requests are bounded (8 KiB, 5 s, 64 at once); anything but GET is
//! refused. With `[admin] token`, every request must carry it
//! (`Authorization: Bearer …`), or is answered 401; off loopback the
//! configuration requires one.

pub mod rates;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};
use unifab_iscsi::target::server::PortalStats;

/// The gateway-wide part of `/metrics` in the Prometheus text format: the
/// iSCSI portals' counters (`stats`, zero without a portal), the live
/// sessions, the runtime's workers.
pub fn render_metrics(stats: PortalStats, sessions: usize) -> String {
    let mut s = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        s.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    };
    counter(
        "unifab_iscsi_connections_total",
        "TCP connections accepted on iSCSI portals.",
        stats.connections,
    );
    counter(
        "unifab_iscsi_logins_total",
        "iSCSI logins that reached full-feature phase.",
        stats.logins,
    );
    counter(
        "unifab_iscsi_login_failures_total",
        "iSCSI logins refused (authentication, authorization, protocol, time-out, resources).",
        stats.login_failures,
    );
    counter(
        "unifab_scsi_commands_total",
        "SCSI commands run by iSCSI sessions.",
        stats.commands,
    );
    s.push_str(&format!(
        "# HELP unifab_iscsi_sessions iSCSI sessions in full-feature phase.\n# TYPE unifab_iscsi_sessions gauge\nunifab_iscsi_sessions {sessions}\n"
    ));
    // `[tuning] worker_threads`, or one per core.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        s.push_str(&format!(
            "# HELP unifab_runtime_workers Threads running the gateway's tasks.\n# TYPE unifab_runtime_workers gauge\nunifab_runtime_workers {}\n",
            rt.metrics().num_workers()
        ));
    }
    s
}

/// Why `/show/<what>` has nothing to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unshown {
    /// No view has that name (404).
    NoSuchView,
    /// The view exists, but the part of the gateway it shows is not
    /// configured: the section to add (409).
    NotConfigured(&'static str),
}

/// The views `/show/<what>` knows.
pub const VIEWS: &[&str] = &[
    "sessions",
    "luns",
    "remotes",
    "targets",
    "flogi",
    "fcns",
    "zones",
    "fcoe",
    "fcip",
    "interface",
];

/// A label value in the Prometheus text format: backslash, double quote
/// and line feed escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The per-LU families (`unifab_lu_*`, label `lu`): commands, bytes read
/// and written, commands not ended GOOD, and the latency histogram.
pub fn render_lu_metrics(lus: &[(String, unifab_scsi_core::stats::LuStatsSnapshot)]) -> String {
    use unifab_scsi_core::stats::LATENCY_BOUNDS_US;
    let mut s = String::new();
    type Get = fn(&unifab_scsi_core::stats::LuStatsSnapshot) -> u64;
    let counters: [(&str, &str, Get); 4] = [
        ("unifab_lu_commands_total", "Commands the LU ended.", |t| {
            t.commands
        }),
        (
            "unifab_lu_read_bytes_total",
            "Data-in bytes the LU returned.",
            |t| t.read_bytes,
        ),
        (
            "unifab_lu_written_bytes_total",
            "Data-out bytes of commands that ended GOOD.",
            |t| t.written_bytes,
        ),
        (
            "unifab_lu_errors_total",
            "Commands that ended with a status other than GOOD, or aborted.",
            |t| t.errors,
        ),
    ];
    for (name, help, get) in counters {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (lu, t) in lus {
            s.push_str(&format!("{name}{{lu=\"{}\"}} {}\n", label(lu), get(t)));
        }
    }
    let name = "unifab_lu_latency_seconds";
    s.push_str(&format!(
        "# HELP {name} Time from a command's arrival at the LU to its end.\n# TYPE {name} histogram\n"
    ));
    for (lu, t) in lus {
        let lu = label(lu);
        let mut cumulative = 0;
        for (i, n) in t.buckets.iter().enumerate() {
            cumulative += n;
            let le = match LATENCY_BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            s.push_str(&format!(
                "{name}_bucket{{lu=\"{lu}\",le=\"{le}\"}} {cumulative}\n"
            ));
        }
        s.push_str(&format!(
            "{name}_sum{{lu=\"{lu}\"}} {}\n",
            t.latency_ns as f64 / 1e9
        ));
        s.push_str(&format!("{name}_count{{lu=\"{lu}\"}} {}\n", t.commands));
    }
    s
}

/// The interface families (`show interface`'s counters, all counters):
/// fabric ports (`unifab_fabric_port_*`, label `port`), FCoE ports
/// (`unifab_fcoe_port_*`, labels `interface` and `mode`) and FCIP circuits
/// (`unifab_fcip_circuit_*`, label `circuit`). Every family's HELP and TYPE
/// lines are there even when no such port is.
pub fn render_interface_metrics(ifs: &[view::Interface]) -> String {
    /// (kind prefix, family prefix, label, counters with their help)
    type Family<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);
    let families: [Family<'_>; 3] = [
        (
            "fabric port",
            "unifab_fabric_port",
            "port",
            &[
                ("rx_frames", "Frames the switch received on the port."),
                ("tx_frames", "Frames the switch sent on the port."),
                ("rx_bytes", "Payload bytes received on the port."),
                ("tx_bytes", "Payload bytes sent on the port."),
                (
                    "discards",
                    "Frames dropped: zoning, no such address, spoofed S_ID.",
                ),
            ],
        ),
        (
            "fcoe",
            "unifab_fcoe_port",
            "interface",
            &[
                ("rx_frames", "FCoE frames received."),
                ("tx_frames", "FCoE frames sent."),
                (
                    "spoofed",
                    "FCoE frames from a MAC address that did not log in (FCF).",
                ),
                (
                    "keep_alive_misses",
                    "VN_Ports whose keep-alives stopped (FCF).",
                ),
                ("discards", "FCoE frames dropped (ENode)."),
            ],
        ),
        (
            "fcip circuit",
            "unifab_fcip_circuit",
            "circuit",
            &[
                ("rx_bytes", "Bytes received on the circuit."),
                ("tx_bytes", "Bytes sent on the circuit."),
                (
                    "retransmits",
                    "Batches resent from the circuit after it died.",
                ),
                ("failures", "Times the circuit went down."),
            ],
        ),
    ];
    let mut s = String::new();
    for (kind, prefix, label_name, counters) in families {
        for (counter, help) in counters {
            let name = format!("{prefix}_{counter}_total");
            s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for i in ifs.iter().filter(|i| i.kind.starts_with(kind)) {
                let Some((_, v)) = i.counters.iter().find(|(c, _)| c == counter) else {
                    continue;
                };
                let mode = i
                    .kind
                    .strip_prefix("fcoe (")
                    .and_then(|m| m.strip_suffix(')'))
                    .map(|m| format!(",mode=\"{m}\""))
                    .unwrap_or_default();
                s.push_str(&format!(
                    "{name}{{{label_name}=\"{}\"{mode}}} {v}\n",
                    label(&i.name)
                ));
            }
        }
    }
    s
}

/// What the admin endpoint can show; implemented by the running gateway.
pub trait AdminView: Send + Sync + 'static {
    /// JSON for `/show/<what>`, or why there is none.
    fn show(&self, what: &str) -> Result<String, Unshown>;
    /// Prometheus text for `/metrics`.
    fn metrics(&self) -> String;
}

/// Serves the admin endpoint until `shutdown` flips.
pub async fn serve(
    listener: TcpListener,
    view: Arc<dyn AdminView>,
    token: Option<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let token: Option<Arc<str>> = token.map(Arc::from);
    let limit = Arc::new(Semaphore::new(64));
    if let Ok(a) = listener.local_addr() {
        info!(addr = %a, "admin endpoint listening");
    }
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, peer)) = r else { continue };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    warn!(%peer, "admin endpoint busy");
                    continue;
                };
                let view = view.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = tokio::time::timeout(Duration::from_secs(5), handle(stream, peer, view, token, None)).await {
                        debug!(%peer, error = %e, "admin request timed out");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// The reload a request on the admin socket may ask for.
pub type Reloader = Arc<tokio::sync::Mutex<crate::reload::Live>>;

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: impl std::fmt::Display,
    view: Arc<dyn AdminView>,
    token: Option<Arc<str>>,
    reloader: Option<Reloader>,
) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if buf.len() > 8192 {
            let _ = respond(&mut stream, 431, "text/plain", "request too large\n").await;
            return;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let mut parts = text.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if let Some(t) = &token
        && !bearer(&text).is_some_and(|given| same(given.as_bytes(), t.as_bytes()))
    {
        warn!(%peer, %path, "admin request without the right token refused");
        let _ = respond(&mut stream, 401, "text/plain", "a token is required (Authorization: Bearer …; unifab show --token or UNIFAB_ADMIN_TOKEN)\n").await;
        return;
    }
    if method == "POST" {
        let Some(reloader) = reloader else {
            let _ = respond(
                &mut stream,
                405,
                "text/plain",
                "only GET here: changes go through the admin socket (unifab reload)\n",
            )
            .await;
            return;
        };
        let dry_run = match path {
            "/reload" => false,
            "/reload?dry_run=1" => true,
            _ => {
                let _ = respond(
                    &mut stream,
                    404,
                    "text/plain",
                    "POST /reload or /reload?dry_run=1\n",
                )
                .await;
                return;
            }
        };
        let mut live = reloader.lock().await;
        let result = if dry_run {
            live.plan().map(|(p, _)| p)
        } else {
            live.reload()
        };
        drop(live);
        match result {
            Ok(plan) => {
                crate::reload::log_plan(&plan, !dry_run);
                info!(%peer, dry_run, "reload requested on the admin socket");
                let head = if dry_run {
                    "plan (dry run, nothing changed):"
                } else {
                    "applied:"
                };
                let _ = respond(&mut stream, 200, "text/plain", &format!("{head}\n{plan}")).await;
            }
            Err(e) => {
                warn!(%peer, error = %e, "reload refused; the running configuration is unchanged");
                let body = format!("nothing changed: {e}\n");
                let _ = respond(&mut stream, 422, "text/plain", &body).await;
            }
        }
        return;
    }
    if method != "GET" {
        let _ = respond(&mut stream, 405, "text/plain", "only GET and POST\n").await;
        return;
    }
    if path == "/metrics" {
        let body = view.metrics();
        let _ = respond(&mut stream, 200, "text/plain; version=0.0.4", &body).await;
    } else if let Some(what) = path.strip_prefix("/show/") {
        match view.show(what) {
            Ok(json) => {
                let _ = respond(&mut stream, 200, "application/json", &json).await;
            }
            Err(Unshown::NoSuchView) => {
                let body = format!(
                    "no such view {what:?}; views: {}, metrics\n",
                    VIEWS.join(", ")
                );
                let _ = respond(&mut stream, 404, "text/plain", &body).await;
            }
            Err(Unshown::NotConfigured(section)) => {
                let body = format!("{what}: this gateway has no {section} configured\n");
                let _ = respond(&mut stream, 409, "text/plain", &body).await;
            }
        }
    } else {
        let _ = respond(
            &mut stream,
            404,
            "text/plain",
            "try /show/sessions, /show/luns, /metrics\n",
        )
        .await;
    }
}

/// The admin socket: `data_dir/admin.sock`, mode 0600, for changes
/// (`POST /reload`, `unifab reload`) and the same views as the TCP
/// endpoint. A peer whose user is neither root nor the gateway's own is
/// refused (403) even if the file's mode let it connect.
pub async fn serve_unix(
    listener: tokio::net::UnixListener,
    view: Arc<dyn AdminView>,
    reloader: Reloader,
    mut shutdown: watch::Receiver<bool>,
) {
    let me = nix::unistd::geteuid().as_raw();
    let limit = Arc::new(Semaphore::new(16));
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((mut stream, _)) = r else { continue };
                let uid = stream.peer_cred().map(|c| c.uid()).ok();
                if !uid.is_some_and(|u| u == 0 || u == me) {
                    warn!(?uid, "admin socket: a peer of another user refused");
                    tokio::spawn(async move {
                        // The request is read (bounded) before the answer,
                        // so that the client gets it rather than a reset.
                        let _ = tokio::time::timeout(Duration::from_secs(2), async {
                            let mut buf = [0u8; 1024];
                            let mut seen = Vec::new();
                            while let Ok(n @ 1..) = stream.read(&mut buf).await {
                                seen.extend_from_slice(&buf[..n]);
                                if seen.len() > 8192 || seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                    break;
                                }
                            }
                        })
                        .await;
                        let _ = respond(&mut stream, 403, "text/plain", "only root or the gateway's user may use the admin socket\n").await;
                    });
                    continue;
                }
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    continue;
                };
                let (view, reloader) = (view.clone(), reloader.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let peer = format!("uid {}", uid.unwrap_or(u32::MAX));
                    // A reload builds LUs (files, their locks): it gets
                    // longer than a view.
                    let _ = tokio::time::timeout(Duration::from_secs(60), handle(stream, peer, view, None, Some(reloader))).await;
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// Binds the admin socket at `path`: a stale socket file is replaced, the
/// new one made mode 0600 before anyone is served.
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            // Bound only if no gateway answers on it.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "{} is in use (another gateway with this data_dir?)",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
    }
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Client side for `unifab reload`: sends `POST path` on the admin socket
/// and returns the body, or the error the gateway gave.
pub async fn post_unix(socket: &std::path::Path, path: &str) -> Result<String, String> {
    let mut s = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "cannot reach the gateway's admin socket {}: {e} (is `unifab run` running with this data_dir? see --socket)",
            socket.display()
        )
    })?;
    s.write_all(
        format!("POST {path} HTTP/1.1\r\nHost: unifab\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(90), s.read_to_end(&mut out))
        .await
        .map_err(|_| "the admin socket did not answer in 90 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "malformed HTTP answer".to_string())?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{}: {}",
            head.lines().next().unwrap_or(""),
            body.trim()
        ));
    }
    Ok(body.to_string())
}

/// The bearer token of a request's `Authorization` header.
fn bearer(request: &str) -> Option<&str> {
    request.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let value = value.trim();
        let (scheme, token) = value.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then_some(token.trim())
    })
}

/// Compares two secrets in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn respond<S: AsyncWrite + Unpin>(
    stream: &mut S,
    code: u16,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Content",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Client side for `unifab show`: fetches `path` from a running gateway.
pub async fn fetch(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<String, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot reach the gateway's admin endpoint at {addr}: {e} (is `unifab run` running? see --admin)"))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .map_err(|_| "the admin endpoint did not answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "malformed HTTP answer".to_string())?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{}: {}",
            head.lines().next().unwrap_or(""),
            body.trim()
        ));
    }
    Ok(body.to_string())
}
