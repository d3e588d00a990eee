//! The FCIP listener (TCP 3225 by default): accepts connections, runs the
//! acceptor's side of the special frame exchange and hands each
//! connection to the tunnel configured for the peer switch. A peer no
//! tunnel is configured for, a replayed nonce, a special frame for
//! another switch, or failed TLS gets the connection closed; other
//! tunnels are untouched. At most [`MAX_HANDSHAKES`] connections may be in
//! the exchange at once (each may take up to 90 s to send its special
//! frame): beyond that a new connection is closed at once and counted as
//! refused, so a flood of idle connections holds bounded memory.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{info, warn};
use unifab_fc::wire::Wwn;

use super::LinkMode;
use super::tls::TlsSettings;
use super::tunnel::{Conn, Stream, Tunnel, direct_handle, hello_bytes, prepare};
use crate::proto::handshake::{Accepted, Acceptor};
use crate::wire::fsf::Capabilities;

/// Refusals counted by the listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections handed to tunnels.
    pub accepted: u64,
    /// Connections refused, with the last reason.
    pub refused: u64,
    /// The last refusal.
    pub last_refusal: String,
}

/// Connections that may be in the special frame exchange at once.
pub const MAX_HANDSHAKES: usize = 64;

/// The listener. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Listener {
    addr: SocketAddr,
    stats: Arc<Mutex<ListenerStats>>,
    task: tokio::task::AbortHandle,
    /// The tunnels it hands connections to.
    tunnels: Arc<std::sync::RwLock<Vec<Tunnel>>>,
}

impl Listener {
    /// Binds `addr` and serves `tunnels` (inside a runtime). With `tls`,
    /// every connection starts with a TLS 1.3 handshake.
    pub async fn start(
        addr: SocketAddr,
        local_wwn: Wwn,
        tunnels: Vec<Tunnel>,
        tls: Option<Arc<TlsSettings>>,
    ) -> std::io::Result<Listener> {
        let l = TcpListener::bind(addr).await?;
        let addr = l.local_addr()?;
        let stats = Arc::new(Mutex::new(ListenerStats::default()));
        let acceptor = Arc::new(Mutex::new(Acceptor::new(local_wwn)));
        let st = stats.clone();
        let tunnels = Arc::new(std::sync::RwLock::new(tunnels));
        let served = tunnels.clone();
        let task = tokio::spawn(async move {
            // The exchanges in progress: aborted with the listener.
            let mut handshakes = tokio::task::JoinSet::new();
            loop {
                let accepted = tokio::select! {
                    a = l.accept() => a,
                    Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
                };
                let Ok((tcp, peer)) = accepted else {
                    // Out of descriptors, most likely: let some go.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                if handshakes.len() >= MAX_HANDSHAKES {
                    // Counted before the peer sees the close, so that what
                    // the counters say never lags behind what it saw.
                    refused(
                        &st,
                        peer,
                        &format!("{MAX_HANDSHAKES} special frame exchanges already in progress"),
                    );
                    drop(tcp);
                    continue;
                }
                let tunnels = served.read().unwrap_or_else(|p| p.into_inner()).clone();
                let (acceptor, st, tls) = (acceptor.clone(), st.clone(), tls.clone());
                handshakes.spawn(async move {
                    match handshake(tcp, peer, &tunnels, &acceptor, tls).await {
                        Ok(()) => {
                            if let Ok(mut s) = st.lock() {
                                s.accepted += 1;
                            }
                        }
                        Err(why) => refused(&st, peer, &why),
                    }
                });
            }
        })
        .abort_handle();
        info!(%addr, "FCIP listener");
        Ok(Listener {
            addr,
            stats,
            task,
            tunnels,
        })
    }

    /// The tunnels connections are handed to from now on (tunnels added
    /// or stopped while it listens).
    pub fn set_tunnels(&self, tunnels: Vec<Tunnel>) {
        *self.tunnels.write().unwrap_or_else(|p| p.into_inner()) = tunnels;
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening: the socket is closed and exchanges in progress
    /// are abandoned (their connections closed). Connections already
    /// handed to tunnels are the tunnels' (see [`Tunnel::stop`]).
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Counters.
    pub fn stats(&self) -> ListenerStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Logs and counts a refused connection.
fn refused(stats: &Mutex<ListenerStats>, peer: SocketAddr, why: &str) {
    warn!(%peer, reason = %why, "FCIP connection refused");
    if let Ok(mut s) = stats.lock() {
        s.refused += 1;
        s.last_refusal = format!("{peer}: {why}");
    }
}

async fn handshake(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    tunnels: &[Tunnel],
    acceptor: &Mutex<Acceptor>,
    tls: Option<Arc<TlsSettings>>,
) -> Result<(), String> {
    let fd = prepare(&tcp);
    let direct = if tls.is_none() {
        direct_handle(&tcp)
    } else {
        None
    };
    let mut stream: Box<dyn Stream> = match tls {
        Some(t) => t.accept(tcp).await?,
        None => Box::new(tcp),
    };
    let mut fsf = [0u8; 76];
    match tokio::time::timeout(Duration::from_secs(90), stream.read_exact(&mut fsf)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("reading the special frame: {e}")),
        Err(_) => return Err("no special frame within 90 s".into()),
    }
    let decided = {
        let mut a = acceptor.lock().unwrap_or_else(|p| p.into_inner());
        a.accept(peer.ip(), &fsf, |r| {
            tunnels.iter().any(|t| t.config().peer_wwn == r.source_wwn)
        })
    };
    match decided.map_err(|e| e.to_string())? {
        Accepted::Identify(echo) => {
            let _ = stream.write_all(&echo).await;
            let _ = stream.shutdown().await;
            Err("special frame without a destination: answered with our name and closed".into())
        }
        Accepted::Join { repr, echo } => {
            let Some(t) = tunnels
                .iter()
                .find(|t| t.config().peer_wwn == repr.source_wwn)
            else {
                return Err("no tunnel".into());
            };
            stream.write_all(&echo).await.map_err(|e| e.to_string())?;
            let enhanced = t.config().mode == LinkMode::Enhanced
                && repr
                    .entity_id
                    .unifab_capabilities()
                    .is_some_and(|c| c.has(Capabilities::ENHANCED));
            if enhanced {
                stream
                    .write_all(&hello_bytes(t.config()))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let peer_caps = repr.entity_id.unifab_capabilities();
            t.accepted(Conn {
                stream,
                peer,
                fd,
                fsf: repr,
                leftover: bytes::Bytes::new(),
                peer_caps,
                direct,
            });
            Ok(())
        }
    }
}
