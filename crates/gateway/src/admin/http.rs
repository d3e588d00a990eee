//! The admin endpoint's HTTP/1.1 (hyper): the server on loopback TCP and
//! on the admin socket, and the CLI's client.
//!
//! Requests are bounded: a 16 KiB head, 5 s to send it, a connection
//! served for at most 10 s (60 s on the admin socket), 64 connections at
//! once (16 on the socket). The limit cuts a client that idles or
//! dawdles, never one waiting for its answer: a reload that builds LUs
//! (an RBD image waits up to `ceph_lock_timeout` for a lock, per LU) is
//! answered when it ends, however long it takes. With `[admin]
//! token`, every request must carry it (`Authorization: Bearer …`) or is
//! answered 401; off loopback the configuration requires one. Only the
//! admin socket takes `POST /reload`; the TCP endpoint answers GET alone.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use super::{AdminView, Unshown, VIEWS};

/// The token the TCP endpoint asks for (`[admin] token`; a reload
/// changes it for the connections that follow).
pub type AdminToken = Arc<std::sync::RwLock<Option<Arc<str>>>>;

/// The reload a request on the admin socket may ask for.
pub type Reloader = Arc<tokio::sync::Mutex<crate::reload::Live>>;

/// What a connection may do.
#[derive(Clone)]
struct Rights {
    view: Arc<dyn AdminView>,
    token: Option<Arc<str>>,
    /// Changes: on the admin socket only.
    reloader: Option<Reloader>,
    peer: Arc<str>,
}

fn reply(code: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    if let Ok(v) = ctype.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    reply(code, "text/plain", body.into())
}

/// Compares two secrets in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn route(req: Request<Incoming>, r: Rights) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    if let Some(t) = &r.token {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, tok)| tok.trim());
        if !given.is_some_and(|g| same(g.as_bytes(), t.as_bytes())) {
            warn!(peer = %r.peer, %path, "admin request without the right token refused");
            return text(
                StatusCode::UNAUTHORIZED,
                "a token is required (Authorization: Bearer …; unifab show --token or UNIFAB_ADMIN_TOKEN)\n",
            );
        }
    }
    match *req.method() {
        Method::POST => post(&path, query.as_deref(), &r).await,
        Method::GET => get(&path, &r),
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "only GET and POST\n"),
    }
}

fn get(path: &str, r: &Rights) -> Response<Full<Bytes>> {
    if path == "/metrics" {
        return reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            r.view.metrics(),
        );
    }
    let Some(what) = path.strip_prefix("/show/") else {
        return text(
            StatusCode::NOT_FOUND,
            "try /show/sessions, /show/luns, /metrics\n",
        );
    };
    match r.view.show(what) {
        Ok(json) => reply(StatusCode::OK, "application/json", json),
        Err(Unshown::NoSuchView) => text(
            StatusCode::NOT_FOUND,
            format!(
                "no such view {what:?}; views: {}, metrics\n",
                VIEWS.join(", ")
            ),
        ),
        Err(Unshown::NotConfigured(section)) => text(
            StatusCode::CONFLICT,
            format!("{what}: this gateway has no {section} configured\n"),
        ),
    }
}

async fn post(path: &str, query: Option<&str>, r: &Rights) -> Response<Full<Bytes>> {
    let Some(reloader) = &r.reloader else {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET here: changes go through the admin socket (unifab reload)\n",
        );
    };
    let dry_run = match (path, query) {
        ("/reload", None) => false,
        ("/reload", Some("dry_run=1")) => true,
        _ => return text(StatusCode::NOT_FOUND, "POST /reload or /reload?dry_run=1\n"),
    };
    // The reload runs in a task of its own, which the connection only
    // waits for: a reload is applied step by step (a tunnel drained, an
    // FCF's links cleared, an image reopened), and dropping it between two
    // steps, as the connection's time limit or a vanished client would,
    // would leave the running configuration half changed. It logs its own
    // outcome, which is all an operator gets should the answer not reach
    // them.
    let live = reloader.clone().lock_owned().await;
    let peer = r.peer.clone();
    let task = tokio::spawn(async move {
        let mut live = live;
        let result = if dry_run {
            live.plan().map(|(p, _)| p)
        } else {
            live.reload().await
        };
        drop(live);
        match &result {
            Ok(plan) => {
                crate::reload::log_plan(plan, !dry_run);
                info!(%peer, dry_run, "reload requested on the admin socket");
            }
            Err(e) => {
                warn!(%peer, error = %e, "reload refused; the running configuration is unchanged");
            }
        }
        result
    });
    match task.await {
        Ok(Ok(plan)) => {
            let head = if dry_run {
                "plan (dry run, nothing changed):"
            } else {
                "applied:"
            };
            text(StatusCode::OK, format!("{head}\n{plan}"))
        }
        Ok(Err(e)) => text(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("nothing changed: {e}\n"),
        ),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the reload failed: {e}; see the gateway's log\n"),
        ),
    }
}

/// Serves one connection with `rights` for at most `limit`.
async fn serve_conn<S>(io: S, rights: Rights, limit: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = rights.peer.clone();
    let busy = Arc::new(AtomicUsize::new(0));
    let answering = busy.clone();
    let svc = hyper::service::service_fn(move |req| {
        let rights = rights.clone();
        // Counted from the moment hyper takes the request, before its
        // future first runs, until that future is dropped.
        let counted = Answering::new(answering.clone());
        async move {
            let _counted = counted;
            Ok::<_, Infallible>(route(req, rights).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(5))
        .max_buf_size(16 * 1024)
        .serve_connection(TokioIo::new(io), svc);
    match cut_when_idle(conn, &busy, limit, ANSWER_GRACE).await {
        Some(Err(e)) => debug!(%peer, error = %e, "admin connection ended with an error"),
        None => debug!(%peer, "admin connection timed out"),
        Some(Ok(())) => {}
    }
}

/// Counts a request being answered on a connection while it lives.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn new(busy: Arc<AtomicUsize>) -> Answering {
        busy.fetch_add(1, Ordering::AcqRel);
        Answering(busy)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a connection whose request was answered after its limit has
/// to send the answer before it is cut.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// Drives `conn` to its end (`Some`), or cuts it (`None`) once `limit` has
/// passed with no request being answered (`busy` counts those). A request
/// still being answered at the limit keeps the connection: it is checked
/// again every `grace` ([`ANSWER_GRACE`]), so the answer has that long to
/// go out.
async fn cut_when_idle<F: std::future::Future>(
    conn: F,
    busy: &AtomicUsize,
    limit: Duration,
    grace: Duration,
) -> Option<F::Output> {
    tokio::pin!(conn);
    let mut deadline = tokio::time::Instant::now() + limit;
    loop {
        tokio::select! {
            r = &mut conn => return Some(r),
            () = tokio::time::sleep_until(deadline) => {
                if busy.load(Ordering::Acquire) == 0 {
                    return None;
                }
                deadline = tokio::time::Instant::now() + grace;
            }
        }
    }
}

/// Serves the admin endpoint until `shutdown` flips.
pub async fn serve(
    listener: TcpListener,
    view: Arc<dyn AdminView>,
    token: AdminToken,
    mut shutdown: watch::Receiver<bool>,
) {
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
                let rights = Rights {
                    view: view.clone(),
                    token: token.read().unwrap_or_else(|e| e.into_inner()).clone(),
                    reloader: None,
                    peer: Arc::from(peer.to_string()),
                };
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_conn(stream, rights, Duration::from_secs(10)).await;
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// The admin socket: `data_dir/admin.sock`, mode 0600, for changes
/// (`POST /reload`, `unifab reload`) and the same views as the TCP
/// endpoint. A peer whose user is neither root nor the gateway's own is
/// refused (403) even if the file's mode let it connect.
pub async fn serve_unix(
    listener: UnixListener,
    view: Arc<dyn AdminView>,
    reloader: Reloader,
    mut shutdown: watch::Receiver<bool>,
) {
    let me = nix::unistd::geteuid().as_raw();
    let limit = Arc::new(Semaphore::new(16));
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                let uid = stream.peer_cred().map(|c| c.uid()).ok();
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    continue;
                };
                if !uid.is_some_and(|u| u == 0 || u == me) {
                    warn!(?uid, "admin socket: a peer of another user refused");
                    tokio::spawn(async move {
                        let _permit = permit;
                        let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                            Ok::<_, Infallible>(text(
                                StatusCode::FORBIDDEN,
                                "only root or the gateway's user may use the admin socket\n",
                            ))
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc);
                        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
                    });
                    continue;
                }
                let rights = Rights {
                    view: view.clone(),
                    token: None,
                    reloader: Some(reloader.clone()),
                    peer: Arc::from(format!("uid {}", uid.unwrap_or(u32::MAX))),
                };
                tokio::spawn(async move {
                    let _permit = permit;
                    // A reload builds LUs (files, their locks): it gets
                    // longer than a view.
                    serve_conn(stream, rights, Duration::from_secs(60)).await;
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// Binds the admin socket at `path`: a stale socket file is replaced, the
/// new one made mode 0600 before anyone is served.
pub fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        // Replaced only if no gateway answers on it.
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
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Sends one request over `io` and returns the body of a 200, or
/// `STATUS: body`.
async fn request<S>(
    io: S,
    method: Method,
    path: &str,
    host: &str,
    token: Option<&str>,
) -> Result<String, RequestError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let transport = |e: hyper::Error| RequestError::Transport(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(transport)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, host);
    if let Some(t) = token {
        req = req.header(AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| RequestError::Transport(e.to_string()))?;
    let res = sender.send_request(req).await.map_err(transport)?;
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(transport)?
        .to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if status != StatusCode::OK {
        return Err(RequestError::Answered(format!(
            "HTTP/1.1 {status}: {}",
            body.trim()
        )));
    }
    Ok(body)
}

/// Why a request to the admin endpoint got no 200.
enum RequestError {
    /// No answer: the connection failed or closed first.
    Transport(String),
    /// The gateway answered with another status (and says why).
    Answered(String),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Transport(e) | RequestError::Answered(e) => f.write_str(e),
        }
    }
}

/// Client side for `unifab show`: fetches `path` from a running gateway.
pub async fn fetch(addr: SocketAddr, path: &str, token: Option<&str>) -> Result<String, String> {
    let s = TcpStream::connect(addr).await.map_err(|e| {
        format!("cannot reach the gateway's admin endpoint at {addr}: {e} (is `unifab run` running? see --admin)")
    })?;
    tokio::time::timeout(
        Duration::from_secs(10),
        request(s, Method::GET, path, &addr.to_string(), token),
    )
    .await
    .map_err(|_| "the admin endpoint did not answer in 10 s".to_string())?
    .map_err(|e| e.to_string())
}

/// Client side for `unifab reload`: sends `POST path` on the admin socket
/// and returns the body, or the error the gateway gave, waiting up to
/// `wait` for it (a reload is answered when it ends).
pub async fn post_unix(socket: &Path, path: &str, wait: Duration) -> Result<String, String> {
    let s = UnixStream::connect(socket).await.map_err(|e| {
        format!(
            "cannot reach the gateway's admin socket {}: {e} (is `unifab run` running with this data_dir? see --socket)",
            socket.display()
        )
    })?;
    tokio::time::timeout(wait, request(s, Method::POST, path, "unifab", None))
        .await
        .map_err(|_| {
            format!(
                "the admin socket did not answer in {} s (--timeout; a reload still running goes on to its end, and the gateway logs its outcome)",
                wait.as_secs()
            )
        })?
        .map_err(|e| match e {
            RequestError::Transport(e) => format!(
                "no answer: {e} (a reload still running goes on to its end, and the gateway logs its outcome)"
            ),
            RequestError::Answered(e) => e,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const LIMIT: Duration = Duration::from_millis(50);
    const GRACE: Duration = Duration::from_millis(50);

    /// A connection that idles past its limit is cut; one answering a
    /// request (a long reload) is not, and ends when its answer is done.
    #[tokio::test]
    async fn a_connection_is_cut_when_idle_never_while_it_answers() {
        let busy = AtomicUsize::new(0);
        let idle = cut_when_idle(std::future::pending::<()>(), &busy, LIMIT, GRACE).await;
        assert_eq!(idle, None, "an idle connection is cut");

        let busy = Arc::new(AtomicUsize::new(0));
        let answering = Answering::new(busy.clone());
        let reload = async move {
            // Six limits long, answering all the while.
            tokio::time::sleep(LIMIT * 6).await;
            drop(answering);
            "answered"
        };
        let r = cut_when_idle(reload, &busy, LIMIT, GRACE).await;
        assert_eq!(r, Some("answered"), "cut while it answered");
        assert_eq!(busy.load(Ordering::Acquire), 0);
    }

    /// After a long answer the connection is cut once it idles again,
    /// never before the answer ended.
    #[tokio::test]
    async fn after_a_long_answer_an_idle_connection_is_cut() {
        let busy = Arc::new(AtomicUsize::new(0));
        let answering = Answering::new(busy.clone());
        let ended = Arc::new(std::sync::Mutex::new(None));
        let at = ended.clone();
        let conn = async move {
            tokio::time::sleep(LIMIT * 4).await;
            *at.lock().unwrap() = Some(tokio::time::Instant::now());
            drop(answering);
            // Keep-alive: the client sends nothing more.
            std::future::pending::<()>().await;
        };
        let r = cut_when_idle(conn, &busy, LIMIT, GRACE).await;
        assert_eq!(r, None, "an idle keep-alive connection is cut in the end");
        assert!(
            ended.lock().unwrap().is_some(),
            "cut before the answer ended"
        );
    }
}
