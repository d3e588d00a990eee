//! The tunnel driver: one task owns the tunnel's state (E_Port engine,
//! enhanced stream, compression, FastWrite, circuits) and is fed by the
//! fabric (frames leaving through the VE_Port), by one reader task per
//! connection, by the connector loops and the listener, and by a timer.
//!
//! This file holds the tunnel's handle ([`Tunnel`]) and its statistics.
//! The link's protocol state (the E_Port engine, the enhanced stream's
//! windows and acks, compression, FastWrite, which circuit carries what)
//! is the sans-IO [`crate::proto::link::Link`]; the actor in `tunnel/`
//! drives it: `actor` (the task, its events and statistics), `wires` (the
//! link's `LinkIo`: writes, the fabric port, the controller), `circuit` (a
//! circuit's connection and its reader and writer tasks) and `connect`
//! (the special frame exchange and the reconnect loop);
//! `crate::wire::framing` puts a frame on the wire for the tunnel and RFC
//! mode's fast path alike.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, info, warn};
use unifab_fc::fabric::zoning::ZoneSet;
use unifab_fc::io::FabricPort;
use unifab_fc::link::{FcLink, LinkError};
use unifab_fc::wire::Wwn;
use unifab_fc::wire::frame::Frame;

use super::controller::{InterSwitch, LinkHandle};
use super::fast::{FastCircuit, FastPath, FastRx};
use super::{CircuitConfig, LinkMode, MAX_CIRCUITS, TunnelConfig, tcp_rtt_us};
use crate::codec::{Decoder, DecoderConfig, Item};
use crate::proto::eport::{LocalSwitch, ZoneDb};
use crate::proto::fastwrite::{DEFAULT_MAX_BYTES, DEFAULT_TABLE};
use crate::proto::handshake::check_echo;
use crate::proto::link::{Event, Link, LinkConfig, LinkIo};
use crate::wire::encap::EncapFlags;
use crate::wire::enhanced::{self, BatchHeader, BatchKind, Hello};
use crate::wire::frame::{FcipFrame, FcipFrameRepr};
use crate::wire::framing::encode;
use crate::wire::fsf::{Capabilities, EntityId, SpecialFrameRepr, UsageFlags};
use crate::wire::sw_ils::SwIlsRepr;

/// A byte stream a circuit runs over (TCP, or TLS over TCP).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// An established connection, after the special frame exchange.
pub struct Conn {
    /// The stream.
    pub stream: Box<dyn Stream>,
    /// The peer.
    pub peer: SocketAddr,
    /// The socket (for TCP_INFO).
    pub fd: i32,
    /// The peer's special frame (or ours, echoed).
    pub fsf: SpecialFrameRepr,
    /// Bytes read past the handshake.
    pub leftover: Bytes,
    /// What the peer offers: from its special frame (acceptor) or its
    /// hello (connector); `None` for a plain RFC 3821 peer.
    pub peer_caps: Option<Capabilities>,
    /// A second handle on the socket when the stream is plain TCP (no
    /// TLS): the tunnel writes through it itself while the circuit's writer
    /// task has nothing queued, saving a task hand-off per write.
    pub direct: Option<socket2::Socket>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish()
    }
}

/// Counters of one circuit (or of the RFC class F connection).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CircuitStats {
    /// Slot: 0 the RFC class F connection, 1… the circuits.
    pub slot: usize,
    /// `up`, `down`, `connecting`.
    pub state: String,
    /// Peer address.
    pub peer: String,
    /// Seconds up.
    pub uptime_s: f64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Send rate over the last second, MB/s.
    pub tx_mbps: f64,
    /// Receive rate over the last second, MB/s.
    pub rx_mbps: f64,
    /// Batches resent from this circuit after it died.
    pub retransmits: u64,
    /// TCP's smoothed RTT, µs.
    pub rtt_us: u32,
    /// Times the circuit went down.
    pub failures: u64,
    /// Connection attempts that failed (refused, unreachable, timed out,
    /// a handshake the peer broke off).
    pub connect_failures: u64,
    /// Why the circuit last failed (to connect, or went down); empty if
    /// it never has.
    pub last_error: String,
    /// When `last_error` happened.
    pub last_error_at: Option<Instant>,
    /// Weight.
    pub weight: u32,
}

/// Counters of a tunnel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TunnelStats {
    /// Name.
    pub name: String,
    /// Peer switch.
    pub peer_wwn: String,
    /// Configured mode.
    pub mode: String,
    /// `up (domain N)`, `down`, `isolated: why`.
    pub state: String,
    /// Compression mode.
    pub compression: String,
    /// Bytes before compression.
    pub raw_bytes: u64,
    /// Bytes after compression.
    pub wire_bytes: u64,
    /// FastWrite agreed.
    pub fastwrite: bool,
    /// Writes accelerated.
    pub fastwrite_writes: u64,
    /// Tape pipelining agreed.
    pub tape_pipelining: bool,
    /// What tape pipelining did.
    pub tape: crate::proto::tape::TapeStats,
    /// Batches received twice and dropped.
    pub duplicates: u64,
    /// Frames the fabric handed over while the tunnel could not take them.
    pub dropped: u64,
    /// RFC mode: class 3 frames sent and received on the fast path,
    /// written to a circuit by the fabric's call or given to the fabric by
    /// the circuit's reader, without the tunnel's task.
    pub fast_tx: u64,
    /// See `fast_tx`.
    pub fast_rx: u64,
    /// Enhanced mode: acks sent on their own, because no batch toward the
    /// peer carried them within the ack delay (heartbeats not counted).
    pub standalone_acks: u64,
    /// Resynchronisations of the decoders.
    pub resyncs: u64,
    /// Failovers: circuits lost while another stayed up, so that the
    /// tunnel carried on over the rest (enhanced mode resends the lost
    /// circuit's unacknowledged batches on them).
    pub failovers: u64,
    /// Circuits.
    pub circuits: Vec<CircuitStats>,
}

enum Ev {
    Up(usize, Conn, Option<oneshot::Sender<()>>),
    Rx(usize, u64, Item),
    Closed(usize, u64, String),
    /// A connection attempt for a circuit failed, and why.
    ConnectFailed(usize, String),
    /// `Tunnel::set_circuits`: answered once applied, or why not.
    SetCircuits(Vec<CircuitConfig>, oneshot::Sender<Result<(), String>>),
    /// `Tunnel::stop`: answered once the tunnel is down and closed.
    Stop(oneshot::Sender<()>),
}

/// The VE_Port's link: frames the fabric sends out through the tunnel.
#[derive(Debug)]
struct TunnelLink {
    tx: mpsc::Sender<Frame>,
    name: String,
    fast: Arc<FastPath>,
}

impl FcLink for TunnelLink {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        self.fast.transmit(frame, &self.tx)
    }

    fn transmit_batch(&self, frames: &mut Vec<Frame>) -> usize {
        self.fast.transmit_batch(frames, &self.tx)
    }

    fn describe(&self) -> String {
        format!("fcip:{}", self.name)
    }
}

/// A running tunnel. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Tunnel {
    cfg: Arc<TunnelConfig>,
    ev: mpsc::Sender<Ev>,
    /// True once the tunnel has stopped.
    stopped: tokio::sync::watch::Receiver<bool>,
    stats: Arc<Mutex<TunnelStats>>,
    dropped: Arc<AtomicU64>,
    /// The byte and fast-path counters, read live by `stats`.
    fast: Arc<FastPath>,
}

impl Tunnel {
    /// Starts a tunnel on the controller's switch (inside a runtime).
    pub fn start(cfg: TunnelConfig, ctl: InterSwitch) -> Tunnel {
        let cfg = Arc::new(cfg);
        let (fab_tx, fab_rx) = mpsc::channel(65_536);
        let (ev_tx, ev_rx) = mpsc::channel(4096);
        let (ctl_tx, ctl_rx) = mpsc::channel(1024);
        let dropped = Arc::new(AtomicU64::new(0));
        let fast = Arc::new(FastPath::new(cfg.circuits.len(), dropped.clone()));
        let link = TunnelLink {
            tx: fab_tx,
            name: cfg.name.clone(),
            fast: fast.clone(),
        };
        let port = ctl.switch().attach_e_port(&cfg.name, Arc::new(link));
        let stats = Arc::new(Mutex::new(TunnelStats {
            name: cfg.name.clone(),
            peer_wwn: cfg.peer_wwn.to_string(),
            mode: match cfg.mode {
                LinkMode::Rfc => "rfc".into(),
                LinkMode::Enhanced => "enhanced".into(),
            },
            state: "down".into(),
            compression: format!("{:?}", cfg.compression).to_lowercase(),
            ..TunnelStats::default()
        }));
        let mut actor = Actor::new(
            cfg.clone(),
            port,
            ctl,
            ev_tx.clone(),
            ctl_tx,
            stats.clone(),
            fast.clone(),
        );
        let stop_rx = actor.stop.subscribe();
        let t = Tunnel {
            dropped,
            fast,
            cfg: cfg.clone(),
            ev: ev_tx.clone(),
            stopped: stop_rx.clone(),
            stats,
        };
        actor.publish();
        for slot in slots(&cfg) {
            actor.spawn_connector(slot);
        }
        tokio::spawn(actor.run(fab_rx, ev_rx, ctl_rx));
        t
    }

    /// The configuration.
    pub fn config(&self) -> &TunnelConfig {
        &self.cfg
    }

    /// A connection the listener accepted for this tunnel.
    pub fn accepted(&self, conn: Conn) {
        let slot = usize::from(conn.fsf.usage_code);
        match self.ev.try_send(Ev::Up(slot, conn, None)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                warn!(tunnel = %self.cfg.name, "tunnel busy: accepted connection dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                info!(tunnel = %self.cfg.name, "tunnel stopped: accepted connection closed");
            }
        }
    }

    /// Changes the tunnel's circuits while it runs, in enhanced mode (whose
    /// batches any circuit may carry, and which resends a lost circuit's
    /// unacknowledged batches on the others): circuits appended to the
    /// list are connected (or accepted), circuits cut from its end are
    /// closed and their batches resent on the rest, and the weights of
    /// the others change in place. Circuits are numbered by their place
    /// in the list on both ends (the special frame's usage code), so a
    /// circuit in the middle cannot go without renumbering the rest, and a
    /// kept circuit keeps its addresses: both are refused, as is RFC
    /// mode, whose exchanges are pinned to their circuits. Nothing changes
    /// when it is refused.
    pub async fn set_circuits(&self, circuits: Vec<CircuitConfig>) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.ev
            .send(Ev::SetCircuits(circuits, tx))
            .await
            .map_err(|_| "the tunnel has stopped".to_string())?;
        rx.await.map_err(|_| "the tunnel has stopped".to_string())?
    }

    /// Stops the tunnel, and returns once it has stopped: the VE_Port goes
    /// down (the fabric sees the inter-switch link go, exactly as when the
    /// last circuit is lost: routes through it are withdrawn and exchanges
    /// in flight across it fail), it is taken off the switch, every
    /// circuit's connection is closed and no new one is made or accepted.
    /// Frames still queued toward the peer are dropped. A stopped tunnel
    /// stays stopped; stopping it again returns at once.
    pub async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.ev.send(Ev::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Whether the tunnel has stopped.
    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow() || self.ev.is_closed()
    }

    /// Counters.
    pub fn stats(&self) -> TunnelStats {
        let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        st.dropped = self.dropped.load(Ordering::Relaxed);
        st.fast_tx = self.fast.fast_tx.load(Ordering::Relaxed);
        st.fast_rx = self.fast.fast_rx.load(Ordering::Relaxed);
        for c in &mut st.circuits {
            if let Some(b) = self.fast.bytes.get(c.slot) {
                c.tx_bytes = b.tx.load(Ordering::Relaxed);
                c.rx_bytes = b.rx.load(Ordering::Relaxed);
            }
        }
        st
    }
}

mod actor;
mod circuit;
mod connect;
mod wires;

use actor::{Actor, set_state};
use circuit::{Circuit, reader, writer};
#[cfg(test)]
use circuit::{consume, io_slices, owned};
use connect::{connect_loop, slots};
pub use connect::{direct_handle, entity_id, hello_bytes, prepare};
use wires::Wires;

#[cfg(test)]
mod tests {
    use super::*;

    /// Partial vectored writes: whole slices are passed, a partly written
    /// one keeps only its tail, and the bytes left are exactly the rest.
    /// What the reader hands on is a copy in its own buffer, never a
    /// slice of the read buffer.
    #[test]
    fn frames_leave_the_reader_in_their_own_buffers() {
        let read = Bytes::from(vec![7u8; 64 * 1024]);
        let within = |b: &Bytes| {
            let (p, r) = (b.as_ptr() as usize, read.as_ptr() as usize);
            p >= r && p < r + read.len()
        };
        for item in [
            Item::Frame(read.slice(100..2_248)),
            Item::Special(read.slice(3_000..3_076)),
        ] {
            let (Item::Frame(before) | Item::Special(before)) = item.clone();
            let (Item::Frame(after) | Item::Special(after)) = owned(item);
            assert_eq!(after, before);
            assert!(within(&before) && !within(&after));
        }
    }

    #[test]
    fn consume_keeps_exactly_the_unwritten_bytes() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut bufs = vec![
            Bytes::copy_from_slice(&all[..10]),
            Bytes::copy_from_slice(&all[10..11]),
            Bytes::copy_from_slice(&all[11..100]),
            Bytes::copy_from_slice(&all[100..]),
        ];
        let mut start = 0;
        let mut written = Vec::new();
        for n in [3, 7, 1, 50, 0, 100, 95] {
            let left: Vec<u8> = bufs[start..].iter().flat_map(|b| b.to_vec()).collect();
            written.extend_from_slice(&left[..n]);
            consume(&mut bufs, &mut start, n);
            let rest: Vec<u8> = bufs[start..].iter().flat_map(|b| b.to_vec()).collect();
            assert_eq!(rest, left[n..], "after writing {n}");
        }
        assert_eq!(start, bufs.len());
        assert_eq!(written, all);
        assert_eq!(io_slices(&bufs[..], 2).len(), 2);
    }
}
