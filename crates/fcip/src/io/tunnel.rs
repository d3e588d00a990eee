//! The tunnel driver: one task owns the tunnel's state (E_Port engine,
//! enhanced stream, compression, FastWrite, circuits) and is fed by the
//! fabric (frames leaving through the VE_Port), by one reader task per
//! connection, by the connector loops and the listener, and by a timer.

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
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::FcType;
use unifab_fc::wire::{FcId, OxId, RxId, Sof, Wwn};

use super::controller::{InterSwitch, LinkHandle};
use super::fast::{FastCircuit, FastPath, FastRx, rfc_pick};
use super::{LinkMode, TunnelConfig, tcp_rtt_us};
use crate::codec::{Decoder, DecoderConfig, Item};
use crate::proto::compress::{Compressor, decompress};
use crate::proto::eport::{EPort, LocalSwitch, Output, ZoneDb};
use crate::proto::fastwrite::{
    DEFAULT_MAX_BYTES, DEFAULT_TABLE, HostAction, HostSide, SWEEP_EVERY, TargetSide,
};
use crate::proto::handshake::check_echo;
use crate::proto::stream::{ReceiveWindow, SendWindow};
use crate::wire::encap::EncapFlags;
use crate::wire::enhanced::{
    self, BatchHeader, BatchKind, Codec, Hello, Reassembly, put_record, records,
};
use crate::wire::frame::{FcipFrame, FcipFrameRepr};
use crate::wire::fsf::{Capabilities, EntityId, SpecialFrameRepr, UsageFlags};
use crate::wire::sw_ils::{FspfHeader, Hlo, SwIlsRepr};

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
    /// Circuits.
    pub circuits: Vec<CircuitStats>,
}

/// How long a standalone ack waits for a batch toward the peer to carry it.
const ACK_DELAY: Duration = Duration::from_millis(1);
/// Data batches received before an ack goes out at once.
const ACK_EVERY: u32 = 16;

enum Ev {
    Up(usize, Conn, Option<oneshot::Sender<()>>),
    Rx(usize, u64, Item),
    Closed(usize, u64, String),
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
        let t_local = ctl.switch().with_fabric(|f| f.switch_name());
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
        tokio::spawn(actor.run(fab_rx, ev_rx, ctl_rx));
        if cfg.connects() {
            let local = t_local;
            for slot in slots(&cfg) {
                tokio::spawn(connect_loop(
                    cfg.clone(),
                    slot,
                    local,
                    ev_tx.clone(),
                    t.stats.clone(),
                    stop_rx.clone(),
                ));
            }
        }
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

/// The connection slots a tunnel uses.
fn slots(cfg: &TunnelConfig) -> Vec<usize> {
    let n = cfg.circuits.len();
    match cfg.mode {
        LinkMode::Rfc => (0..=n).collect(),
        LinkMode::Enhanced => (1..=n).collect(),
    }
}

fn capabilities(cfg: &TunnelConfig) -> Capabilities {
    let mut c = Capabilities::ENHANCED | Capabilities::LZ4 | Capabilities::ZSTD;
    if cfg.fastwrite {
        c |= Capabilities::FASTWRITE;
    }
    Capabilities(c)
}

/// The entity identifier this side announces.
pub fn entity_id(cfg: &TunnelConfig) -> EntityId {
    match cfg.mode {
        LinkMode::Rfc => EntityId(u64::from(cfg.number)),
        LinkMode::Enhanced => EntityId::unifab(capabilities(cfg), cfg.number),
    }
}

fn hello(cfg: &TunnelConfig) -> Hello {
    Hello {
        capabilities: capabilities(cfg).0,
        fastwrite: cfg.fastwrite,
        fastwrite_table: DEFAULT_TABLE as u16,
        fastwrite_max_bytes: DEFAULT_MAX_BYTES,
    }
}

/// The encoded frames of a hello batch.
pub fn hello_bytes(cfg: &TunnelConfig) -> Vec<u8> {
    let body = Bytes::copy_from_slice(&hello(cfg).to_bytes());
    let h = BatchHeader {
        kind: BatchKind::HELLO.0,
        raw_len: body.len() as u32,
        wire_len: body.len() as u32,
        ..BatchHeader::default()
    };
    let mut out = Vec::new();
    for f in enhanced::fragments(&h, &body) {
        if let Ok(b) = FcipFrameRepr::new(f).to_bytes() {
            out.extend(b);
        }
    }
    out
}

/// A duplicate of the socket's descriptor, for writes that bypass the
/// writer task (the socket stays non-blocking: the flag is shared).
pub fn direct_handle(s: &TcpStream) -> Option<socket2::Socket> {
    use std::os::fd::AsFd;
    s.as_fd()
        .try_clone_to_owned()
        .ok()
        .map(socket2::Socket::from)
}

/// Sets TCP_NODELAY and returns the raw fd.
pub fn prepare(s: &TcpStream) -> i32 {
    let _ = s.set_nodelay(true);
    use std::os::fd::AsRawFd;
    s.as_raw_fd()
}

async fn read_exact_timeout(
    s: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    t: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(t, s.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Err(_) => Err("timed out".into()),
    }
}

/// Connects slot `slot` once: TCP (and TLS), special frame, echo, and in
/// enhanced mode the peer's hello.
async fn connect_once(cfg: &TunnelConfig, slot: usize, local_wwn: Wwn) -> Result<Conn, String> {
    let c = &cfg.circuits[slot.saturating_sub(1).min(cfg.circuits.len() - 1)];
    let peer = c.peer.ok_or("circuit has no peer address")?;
    let sock = if peer.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| e.to_string())?;
    if let Some(l) = c.local {
        sock.bind(l).map_err(|e| format!("bind {l}: {e}"))?;
    }
    let tcp = tokio::time::timeout(Duration::from_secs(5), sock.connect(peer))
        .await
        .map_err(|_| format!("connect {peer}: timed out"))?
        .map_err(|e| format!("connect {peer}: {e}"))?;
    let fd = prepare(&tcp);
    let direct = if cfg.tls.is_none() {
        direct_handle(&tcp)
    } else {
        None
    };
    let mut stream: Box<dyn Stream> = match &cfg.tls {
        Some(t) => t.connect(tcp).await?,
        None => Box::new(tcp),
    };
    let usage = match (cfg.mode, slot) {
        (LinkMode::Rfc, 0) => UsageFlags::class_f(),
        (LinkMode::Rfc, _) => UsageFlags::class_3(),
        (LinkMode::Enhanced, _) => UsageFlags(UsageFlags::CLASS_F | UsageFlags::CLASS_3),
    };
    let fsf = SpecialFrameRepr {
        changed: false,
        source_wwn: local_wwn,
        entity_id: entity_id(cfg),
        nonce: rand::random(),
        usage_flags: usage,
        usage_code: slot as u16,
        destination_wwn: cfg.peer_wwn,
        k_a_tov: cfg.k_a_tov,
        flags: EncapFlags(0),
        timestamp_seconds: 0,
        timestamp_fraction: 0,
    };
    let sent = fsf.to_bytes();
    stream.write_all(&sent).await.map_err(|e| e.to_string())?;
    let mut echo = [0u8; 76];
    read_exact_timeout(&mut stream, &mut echo, Duration::from_secs(10)).await?;
    check_echo(&sent, &echo).map_err(|e| e.to_string())?;
    let mut leftover = Bytes::new();
    let mut peer_caps = None;
    if cfg.mode == LinkMode::Enhanced {
        // The acceptor's hello must follow at once.
        let mut dec = Decoder::new(DecoderConfig::default());
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut buf = vec![0u8; 4096];
        let got = loop {
            match dec.decode() {
                Ok(Some(Item::Frame(b))) => break Some(b),
                Ok(Some(Item::Special(_))) | Err(_) => break None,
                Ok(None) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => dec.extend(&buf[..n]),
                _ => break None,
            }
        };
        let hello = got
            .as_ref()
            .and_then(|b| FcipFrame::new_checked(b.clone()).ok())
            .and_then(|f| f.to_fc_frame().ok())
            .filter(|f| enhanced::is_fragment(&f.header))
            .and_then(|f| {
                let h = BatchHeader::parse(&f.payload).ok()?;
                let body = f.payload.get(enhanced::BATCH_HEADER_LEN..)?;
                (h.kind == BatchKind::HELLO.0).then(|| Hello::parse(body).ok())?
            });
        if let Some(h) = hello {
            let mut caps = h.capabilities;
            if !h.fastwrite {
                caps &= !Capabilities::FASTWRITE;
            }
            peer_caps = Some(Capabilities(caps));
        } else {
            return Err(format!(
                "{peer} did not answer with unifab enhanced mode (an RFC 3821 peer?): configure mode = \"rfc\" for this tunnel"
            ));
        }
        // Anything after the hello belongs to the stream.
        let mut rest = BytesMut::new();
        if let Some(h) = got {
            rest.extend_from_slice(&h);
        }
        rest.extend_from_slice(&dec.buffer_mut().split());
        leftover = rest.freeze();
    }
    Ok(Conn {
        stream,
        peer,
        fd,
        fsf,
        leftover,
        peer_caps,
        direct,
    })
}

/// Keeps one circuit connected: connects, hands the connection to the
/// tunnel, waits for it to close, and connects again (with backoff after a
/// failure), until the tunnel stops.
async fn connect_loop(
    cfg: Arc<TunnelConfig>,
    slot: usize,
    local_wwn: Wwn,
    ev: mpsc::Sender<Ev>,
    stats: Arc<Mutex<TunnelStats>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // A stopped tunnel (or one whose task has ended: the sender is
        // gone) makes no more connections.
        let attempt = tokio::select! {
            r = connect_once(&cfg, slot, local_wwn) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match attempt {
            Ok(conn) => {
                backoff = Duration::from_millis(100);
                let (done_tx, done_rx) = oneshot::channel();
                if ev.send(Ev::Up(slot, conn, Some(done_tx))).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = done_rx => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
            Err(e) => {
                debug!(tunnel = %cfg.name, slot, error = %e, "circuit connect failed");
                if e.contains("configure mode") {
                    warn!(tunnel = %cfg.name, slot, error = %e, "tunnel refused");
                    if let Ok(mut s) = stats.lock() {
                        s.state = format!("down: {e}");
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        if ev.is_closed() {
            return;
        }
    }
}

struct Circuit {
    epoch: u64,
    writer: mpsc::Sender<Vec<Bytes>>,
    /// The connection's reader and writer tasks, aborted when the circuit
    /// goes: between them they hold the socket, which must not outlive the
    /// circuit (a black-holed peer never closes it, and a writer stuck on
    /// a full send buffer never finishes).
    tasks: [tokio::task::AbortHandle; 2],
    done: Option<oneshot::Sender<()>>,
    fd: i32,
    last_rx: Instant,
    since: Instant,
    reasm: Reassembly,
    peer: SocketAddr,
    /// Writes that found the writer's queue full, in order; handed over
    /// as one when it has room. At most `BACKLOG_MAX` bytes: beyond it the
    /// write is refused (RFC mode drops and counts the frames; enhanced
    /// mode keeps the batch and sends it on another circuit or later).
    backlog: Vec<Bytes>,
    backlog_bytes: usize,
    /// See `Conn::direct`.
    direct: Option<socket2::Socket>,
    /// Writes handed to the writer task and not yet written by it, plus
    /// one while the backlog is not empty: the tunnel (and RFC mode's fast
    /// path) writes directly only while this is zero, so bytes never
    /// overtake one another.
    queued: Arc<AtomicUsize>,
    /// Frames the reader handed to the tunnel's task and the task has not
    /// yet handled (RFC mode's fast path waits for none).
    unhandled: Arc<AtomicUsize>,
}

/// Bytes a circuit's backlog may hold (bounded memory per peer).
const BACKLOG_MAX: usize = 8 << 20;

impl Drop for Circuit {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Circuit {
    fn has_room(&self, headroom: usize) -> bool {
        self.backlog.is_empty() && self.writer.capacity() >= headroom
    }

    /// Hands the backlog to the writer if it has room.
    fn flush(&mut self) {
        if self.backlog.is_empty() || self.writer.capacity() == 0 {
            return;
        }
        let backlog = std::mem::take(&mut self.backlog);
        match self.hand_over(backlog) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {
                self.backlog_bytes = 0;
                // The backlog's own count, after the hand-over's: `queued`
                // never reads zero while its bytes are still unwritten.
                self.queued.fetch_sub(1, Ordering::AcqRel);
            }
            Err(mpsc::error::TrySendError::Full(b)) => self.backlog = b,
        }
    }

    /// Gives one write to the writer task, counted in `queued` while the
    /// writer holds it.
    fn hand_over(&self, bufs: Vec<Bytes>) -> Result<(), mpsc::error::TrySendError<Vec<Bytes>>> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let r = self.writer.try_send(bufs);
        if r.is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Queues a write of `n` bytes: to the socket at once when nothing is
    /// ahead of it, else to the writer, or behind the backlog. Err: the
    /// writer is closed, or the backlog is full.
    fn queue(&mut self, mut bufs: Vec<Bytes>, n: usize) -> Result<(), ()> {
        // `queued` counts a non-empty backlog too.
        if self.queued.load(Ordering::Acquire) == 0 {
            if let Some(f) = &self.direct {
                // What the socket did not take (or all of it, on an error,
                // which the writer then reports) goes through the writer.
                if write_now(f, &mut bufs) {
                    return Ok(());
                }
            }
        }
        if self.backlog.is_empty() {
            return match self.hand_over(bufs) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
                Err(mpsc::error::TrySendError::Full(b)) => {
                    self.backlog = b;
                    self.backlog_bytes = n;
                    self.queued.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                }
            };
        }
        if self.backlog_bytes + n > BACKLOG_MAX {
            return Err(());
        }
        self.backlog.extend(bufs);
        self.backlog_bytes += n;
        Ok(())
    }
}

struct Actor {
    cfg: Arc<TunnelConfig>,
    port: FabricPort,
    port_no: u32,
    ctl: InterSwitch,
    ev: mpsc::Sender<Ev>,
    ctl_tx: mpsc::Sender<Frame>,
    stats: Arc<Mutex<TunnelStats>>,
    dropped: Arc<AtomicU64>,
    /// RFC mode's fast path (see `super::fast`).
    fast: Arc<FastPath>,
    circuits: HashMap<usize, Circuit>,
    counters: HashMap<usize, CircuitStats>,
    epoch: u64,
    eport: Option<EPort>,
    up: Option<u8>,
    isolated: Option<String>,
    enhanced: bool,
    /// Enhanced mode: every circuit was silent at the last tick (see
    /// `enhanced_dead`).
    all_silent: bool,
    send: SendWindow,
    recv: ReceiveWindow<HeldBatch>,
    comp: Compressor,
    host: Option<HostSide>,
    target: Option<TargetSide>,
    rr: usize,
    /// A data batch arrived and the peer has not yet been sent the ack
    /// for it: the circuit it came on.
    ack_due: Option<usize>,
    /// When the standalone ack for `ack_due` goes out, unless a batch
    /// toward the peer (which carries the ack) goes first.
    ack_at: Option<Instant>,
    /// Data batches received since the peer was last sent an ack.
    unacked_rx: u32,
    last_rate: Instant,
    /// When FastWrite's target side last swept idle exchanges.
    last_sweep: Instant,
    last_bytes: HashMap<usize, (u64, u64)>,
    local_wwn: Wwn,
    /// Signalled by a circuit writer each time it takes writes off its
    /// queue: the tunnel waits on it while every writer is full.
    room: Arc<Notify>,
    /// Enhanced mode: data batches in the send window that found no writer
    /// with room and wait to be sent.
    unsent: bool,
    /// Set when the tunnel stops: the connector loops end.
    stop: tokio::sync::watch::Sender<bool>,
}

/// A data batch as received, held in the receive window until it is in
/// order.
#[derive(Debug)]
struct HeldBatch {
    /// The circuit it came on.
    slot: usize,
    codec: Codec,
    raw_len: usize,
    body: Bytes,
}

/// The receive window: batches held waiting for an earlier one are
/// bounded by `peer_bound`. A peer configured with a larger window than
/// that, or one that withholds a batch and sends on, has its circuit
/// closed.
fn receive_window(cfg: &TunnelConfig) -> ReceiveWindow<HeldBatch> {
    ReceiveWindow::new(1 << 20, peer_bound(cfg))
}

/// What a peer may make this end hold, either way: twice the window plus
/// two batches (a sender may pass its window by one round of batches).
fn peer_bound(cfg: &TunnelConfig) -> usize {
    cfg.window_bytes
        .saturating_mul(2)
        .saturating_add(2 * enhanced::MAX_BATCH_BODY)
}

/// Writes a circuit writer must have room for before the tunnel takes
/// more frames from the fabric: one `outbound` call makes at most a few
/// batches (512 frames of ≤ 2 KiB each in ≤ 256 KiB batches), RFC mode
/// one write per circuit.
const WRITER_HEADROOM: usize = 8;

impl Actor {
    fn new(
        cfg: Arc<TunnelConfig>,
        port: FabricPort,
        ctl: InterSwitch,
        ev: mpsc::Sender<Ev>,
        ctl_tx: mpsc::Sender<Frame>,
        stats: Arc<Mutex<TunnelStats>>,
        fast: Arc<FastPath>,
    ) -> Actor {
        let local_wwn = ctl.switch().with_fabric(|f| f.switch_name());
        let port_no = port.index().0 as u32 + 1;
        let mut counters = HashMap::new();
        for s in slots(&cfg) {
            counters.insert(
                s,
                CircuitStats {
                    slot: s,
                    state: "down".into(),
                    weight: cfg
                        .circuits
                        .get(s.saturating_sub(1))
                        .map_or(0, |c| c.weight),
                    ..CircuitStats::default()
                },
            );
        }
        Actor {
            comp: Compressor::new(cfg.compression),
            send: SendWindow::new(cfg.window_bytes),
            recv: receive_window(&cfg),
            cfg,
            port,
            port_no,
            ctl,
            ev,
            ctl_tx,
            stats,
            dropped: fast.dropped.clone(),
            fast,
            circuits: HashMap::new(),
            counters,
            epoch: 0,
            eport: None,
            up: None,
            isolated: None,
            enhanced: false,
            all_silent: false,
            host: None,
            target: None,
            rr: 0,
            ack_due: None,
            ack_at: None,
            unacked_rx: 0,
            last_rate: Instant::now(),
            last_sweep: Instant::now(),
            last_bytes: HashMap::new(),
            local_wwn,
            room: Arc::new(Notify::new()),
            unsent: false,
            stop: tokio::sync::watch::channel(false).0,
        }
    }

    async fn run(
        mut self,
        mut fab: mpsc::Receiver<Frame>,
        mut ev: mpsc::Receiver<Ev>,
        mut ctl: mpsc::Receiver<Frame>,
    ) {
        let tick = (self.cfg.keepalive / 2).max(Duration::from_millis(5));
        let mut timer = tokio::time::interval(tick);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ack_sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_sleep);
        let room = self.room.clone();
        loop {
            tokio::select! {
                biased;
                () = &mut ack_sleep, if self.ack_at.is_some() => {
                    self.ack_at = None;
                    if let Some(slot) = self.ack_due.take() {
                        self.send_standalone_ack(slot);
                    }
                },
                e = ev.recv() => match e {
                    Some(e) => if self.on_event(e).is_break() {
                        return;
                    },
                    None => return,
                },
                () = room.notified(), if self.waiting_for_room() => {
                    self.flush_backlogs();
                    self.send_unsent();
                },
                f = ctl.recv() => if let Some(f) = f { self.send_class_f(f) },
                f = fab.recv(), if self.fabric_ready() => match f {
                    Some(f) => {
                        let mut batch = vec![f];
                        while batch.len() < 512 {
                            match fab.try_recv() {
                                Ok(f) => batch.push(f),
                                Err(_) => break,
                            }
                        }
                        let n = batch.len();
                        self.outbound(batch);
                        self.fast.handled(n);
                    }
                    None => return,
                },
                _ = timer.tick() => self.on_tick(),
            }
            // Delayed ack: the reply to what just arrived usually goes
            // back within the delay and carries the ack; a standalone one
            // would arrive first and cost the peer a wake-up of its own.
            // Bulk one-way traffic is acked every ACK_EVERY batches.
            if let Some(slot) = self.ack_due {
                if self.unacked_rx >= ACK_EVERY {
                    self.send_standalone_ack(slot);
                } else if self.ack_at.is_none() {
                    let at = Instant::now() + ACK_DELAY;
                    self.ack_at = Some(at);
                    ack_sleep.as_mut().reset(at.into());
                }
            }
        }
    }

    fn fabric_ready(&self) -> bool {
        (!self.enhanced || self.send.has_room()) && self.writers_ready()
    }

    /// Whether the writers can take what the next frames from the fabric
    /// make: while at least one circuit that carries data keeps up. In
    /// enhanced mode batches go to whichever has room; in RFC mode an
    /// exchange's circuit is fixed, and frames for a circuit that is behind
    /// wait in its backlog (bounded: a stalled connection cannot hold up the
    /// exchanges of the others, nor take unbounded memory).
    fn writers_ready(&self) -> bool {
        let headroom = WRITER_HEADROOM.min(self.writer_queue());
        let data_slots = self.enhanced || self.circuits.keys().any(|s| *s != 0);
        let mut carriers = self
            .circuits
            .iter()
            .filter(|(s, _)| !data_slots || **s != 0)
            .map(|(_, c)| c)
            .peekable();
        carriers.peek().is_none() || carriers.any(|c| c.has_room(headroom))
    }

    fn waiting_for_room(&self) -> bool {
        self.unsent
            || !self.writers_ready()
            || self.circuits.values().any(|c| !c.backlog.is_empty())
    }

    fn flush_backlogs(&mut self) {
        for c in self.circuits.values_mut() {
            c.flush();
        }
    }

    fn writer_queue(&self) -> usize {
        self.cfg.writer_queue.max(1)
    }

    /// Enhanced mode: sends the batches that found every writer full.
    fn send_unsent(&mut self) {
        if !self.unsent || !self.enhanced {
            self.unsent = false;
            return;
        }
        let open: Vec<usize> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.has_room(1))
            .map(|(s, _)| *s)
            .collect();
        if open.is_empty() {
            // Still waiting: a writer's progress or a new circuit calls
            // again.
            return;
        }
        let alive: Vec<usize> = self.circuits.keys().copied().collect();
        let moved = {
            let mut rr = self.rr;
            let r = self.send.orphans(&alive, |_| {
                rr += 1;
                open.get(rr % open.len()).copied()
            });
            self.rr = rr;
            r
        };
        // Every waiting batch was assigned; one whose write fails again
        // sets `unsent` again.
        self.unsent = false;
        for (c, h, b) in moved {
            self.write_batch(c, h, b);
        }
    }

    fn class_f_slot(&self) -> Option<usize> {
        if self.enhanced {
            None
        } else {
            self.circuits.contains_key(&0).then_some(0)
        }
    }

    fn link_ready(&self) -> bool {
        if self.cfg.mode == LinkMode::Rfc {
            self.circuits.contains_key(&0)
        } else {
            !self.circuits.is_empty()
        }
    }

    /// Break: the tunnel has stopped.
    fn on_event(&mut self, e: Ev) -> ControlFlow<()> {
        match e {
            Ev::Up(slot, conn, done) => self.circuit_up(slot, conn, done),
            Ev::Rx(slot, epoch, item) => {
                if self.circuits.get(&slot).is_some_and(|c| c.epoch == epoch) {
                    self.on_rx(slot, item);
                    // Handled (if the circuit went with it, so did its
                    // reader and the count).
                    if let Some(c) = self.circuits.get(&slot).filter(|c| c.epoch == epoch) {
                        c.unhandled.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
            Ev::Closed(slot, epoch, why) => {
                if self.circuits.get(&slot).is_some_and(|c| c.epoch == epoch) {
                    self.circuit_down(slot, &why);
                }
            }
            Ev::Stop(done) => {
                self.shut_down();
                let _ = done.send(());
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// `Tunnel::stop`: the link goes down first (so that losing the
    /// circuits resends nothing), then the circuits close, the connectors
    /// stop and the port leaves the switch.
    fn shut_down(&mut self) {
        self.link_down("stopped");
        self.stop.send_replace(true);
        let n = self.circuits.len();
        // Dropping a circuit aborts its reader and writer, which closes
        // the socket (the fast path's handle on it goes too); its
        // connector, told to stop, does not reconnect.
        for s in self.circuits.keys() {
            self.fast.remove(*s);
        }
        self.circuits.clear();
        self.port.detach();
        self.isolated = None;
        self.set_state("stopped".into());
        for c in self.counters.values_mut() {
            c.state = "down".into();
        }
        self.publish();
        info!(tunnel = %self.cfg.name, circuits = n, "tunnel stopped");
    }

    fn circuit_up(&mut self, slot: usize, conn: Conn, done: Option<oneshot::Sender<()>>) {
        let valid = match self.cfg.mode {
            LinkMode::Rfc => slot <= self.cfg.circuits.len(),
            LinkMode::Enhanced => (1..=self.cfg.circuits.len()).contains(&slot),
        };
        if !valid {
            warn!(tunnel = %self.cfg.name, slot, "connection for an unknown circuit refused");
            return;
        }
        if self.circuits.contains_key(&slot) {
            self.circuit_down(slot, "replaced by a new connection");
        }
        self.epoch += 1;
        let epoch = self.epoch;
        let (wtx, wrx) = mpsc::channel::<Vec<Bytes>>(self.writer_queue());
        let (rd, wr) = tokio::io::split(conn.stream);
        let queued = Arc::new(AtomicUsize::new(0));
        let w = tokio::spawn(writer(
            wr,
            wrx,
            self.ev.clone(),
            slot,
            epoch,
            self.room.clone(),
            queued.clone(),
        ));
        let unhandled = Arc::new(AtomicUsize::new(0));
        let mut fast_rx = None;
        if self.cfg.mode == LinkMode::Rfc && slot >= 1 {
            self.fast.add(FastCircuit {
                slot,
                weight: self.cfg.circuits[slot - 1].weight,
                sock: conn.direct.as_ref().and_then(|d| d.try_clone().ok()),
                writer: wtx.clone(),
                queued: queued.clone(),
            });
            fast_rx = Some(FastRx {
                fast: self.fast.clone(),
                port: self.port.clone(),
                slot,
                unhandled: unhandled.clone(),
            });
        }
        let r = tokio::spawn(reader(
            rd,
            conn.leftover,
            self.ev.clone(),
            slot,
            epoch,
            unhandled.clone(),
            fast_rx,
        ));
        let now = Instant::now();
        self.circuits.insert(
            slot,
            Circuit {
                epoch,
                writer: wtx,
                tasks: [w.abort_handle(), r.abort_handle()],
                done,
                fd: conn.fd,
                last_rx: now,
                since: now,
                reasm: Reassembly::default(),
                peer: conn.peer,
                backlog: Vec::new(),
                backlog_bytes: 0,
                direct: conn.direct,
                queued,
                unhandled,
            },
        );
        if let Some(c) = self.counters.get_mut(&slot) {
            c.state = "up".into();
            c.peer = conn.peer.to_string();
        }
        info!(tunnel = %self.cfg.name, slot, peer = %conn.peer, "circuit up");
        self.publish();
        let peer_enhanced = conn
            .peer_caps
            .is_some_and(|c| c.has(Capabilities::ENHANCED));
        if self.eport.is_none() && self.link_ready() {
            self.enhanced = self.cfg.mode == LinkMode::Enhanced && peer_enhanced;
            self.link_start(conn.peer_caps);
        } else if self.enhanced {
            // Batches orphaned while no circuit was up go out now.
            self.unsent = true;
            self.send_unsent();
        }
    }

    fn link_start(&mut self, peer_caps: Option<Capabilities>) {
        let fastwrite = self.enhanced
            && self.cfg.fastwrite
            && peer_caps.is_some_and(|c| c.has(Capabilities::FASTWRITE));
        if fastwrite {
            self.host = Some(HostSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
            self.target = Some(TargetSide::new(DEFAULT_TABLE, DEFAULT_MAX_BYTES));
        }
        let zoning = self.ctl.switch().with_fabric(|f| {
            let z = f.zoning();
            ZoneDb {
                active: z
                    .active()
                    .map(|a| (a.to_string(), z.active_zones().to_vec())),
            }
        });
        let t = unifab_fc::exchange::Timeouts::default();
        let local = LocalSwitch {
            domain: self.ctl.domain(),
            switch_name: self.local_wwn,
            port_name: Wwn((self.local_wwn.0 & !0xffff) | 0x8000 | u64::from(self.port_no)),
            domains: self.ctl.known_domains(),
            zoning,
            r_a_tov: t.r_a_tov.as_millis() as u32,
            e_d_tov: t.e_d_tov.as_millis() as u32,
        };
        let mut e = EPort::new(local, self.cfg.connects());
        e.start();
        self.eport = Some(e);
        self.isolated = None;
        self.set_state("negotiating".into());
        self.drain_eport();
    }

    fn set_state(&self, s: String) {
        if let Ok(mut st) = self.stats.lock() {
            st.state = s;
            st.fastwrite = self.host.is_some();
        }
    }

    fn link_down(&mut self, why: &str) {
        if self.eport.take().is_some() {
            warn!(tunnel = %self.cfg.name, reason = why, "link down");
        }
        self.fast.set_open(false);
        if self.up.take().is_some() {
            self.ctl.link_down(self.port_no);
        }
        if let Some(h) = &mut self.host {
            h.clear();
        }
        if let Some(t) = &mut self.target {
            t.clear();
        }
        self.host = None;
        self.target = None;
        self.send = SendWindow::new(self.cfg.window_bytes);
        self.recv = receive_window(&self.cfg);
        if self.isolated.is_none() {
            self.set_state(format!("down: {why}"));
        }
    }

    fn circuit_down(&mut self, slot: usize, why: &str) {
        let Some(mut c) = self.circuits.remove(&slot) else {
            return;
        };
        self.fast.remove(slot);
        if let Some(d) = c.done.take() {
            let _ = d.send(());
        }
        if let Some(s) = self.counters.get_mut(&slot) {
            s.state = "down".into();
            s.failures += 1;
        }
        warn!(tunnel = %self.cfg.name, slot, peer = %c.peer, reason = why, "circuit down");
        self.publish();
        if !self.link_ready() {
            self.link_down(why);
            // RFC: data connections go with the class F one.
            if self.cfg.mode == LinkMode::Rfc {
                let rest: Vec<usize> = self.circuits.keys().copied().collect();
                for s in rest {
                    self.circuit_down(s, "class F connection lost");
                }
            }
            return;
        }
        if self.enhanced {
            let live: Vec<usize> = self.circuits.keys().copied().collect();
            let mut rr = self.rr;
            let moved = self.send.fail_circuit(slot, |_| {
                rr += 1;
                live.get(rr % live.len()).copied()
            });
            self.rr = rr;
            if let Some(s) = self.counters.get_mut(&slot) {
                s.retransmits += moved.len() as u64;
            }
            for (c, h, b) in moved {
                self.write_batch(c, h, b);
            }
        }
    }

    /// Enhanced mode: which of the circuits past the dead interval
    /// (`silent`) are declared dead. Losing one circuit of several costs a
    /// resend on a survivor; losing the last takes the link down and fails
    /// every exchange in flight, and the two ends must not each keep a
    /// circuit the other closed. So:
    ///
    /// - a circuit is dead only if another was heard half a dead interval
    ///   after it fell silent: circuits cut together go quiet a tick apart,
    ///   and the first past the interval must not be closed while the
    ///   others, as silent but a tick younger, still count as alive (seen
    ///   once in CI: the two ends each closed a different one);
    /// - when every circuit is silent, none is dead until one is heard from
    ///   again or all have been silent for K_A_TOV: all falling silent
    ///   together is as likely a starved host (this one or the peer) as an
    ///   outage of every path, and neither end can tell which will come
    ///   back first;
    /// - the first circuit back after that gives the others a whole dead
    ///   interval from now to be heard from too, since each end may hear a
    ///   different one first.
    fn enhanced_dead(&mut self, mut silent: Vec<usize>, now: Instant) -> Vec<usize> {
        if silent.is_empty() {
            // Nothing past the interval: not every circuit is silent.
            self.all_silent = false;
            return silent;
        }
        if silent.len() < self.circuits.len() {
            let margin = self.cfg.dead_after / 2;
            silent.retain(|s| {
                let Some(quiet_since) = self.circuits.get(s).map(|c| c.last_rx) else {
                    return false;
                };
                self.circuits
                    .iter()
                    .any(|(o, c)| o != s && c.last_rx > quiet_since + margin)
            });
            if std::mem::take(&mut self.all_silent) {
                for s in silent.drain(..) {
                    if let Some(c) = self.circuits.get_mut(&s) {
                        c.last_rx = now;
                    }
                }
            }
            return silent;
        }
        // Every circuit is past the interval.
        let newest = self
            .circuits
            .values()
            .map(|c| now.duration_since(c.last_rx))
            .min()
            .unwrap_or_default();
        if newest <= Duration::from_millis(u64::from(self.cfg.k_a_tov)) {
            self.all_silent = true;
            Vec::new()
        } else {
            self.all_silent = false;
            silent
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let mut dead: Vec<usize> = self
            .circuits
            .iter()
            .filter(|(s, c)| {
                let watched = self.enhanced || **s == 0;
                watched && now.duration_since(c.last_rx) > self.cfg.dead_after
            })
            .map(|(s, _)| *s)
            .collect();
        if self.enhanced {
            dead = self.enhanced_dead(dead, now);
        }
        for s in dead {
            self.circuit_down(s, "keep-alive timeout (nothing received)");
        }
        self.flush_backlogs();
        self.send_unsent();
        // Heartbeats.
        if self.enhanced {
            let slots: Vec<usize> = self.circuits.keys().copied().collect();
            for s in slots {
                self.send_control(s);
            }
        } else if self.circuits.contains_key(&0) && self.up.is_some() {
            let hlo = SwIlsRepr::Hlo(Hlo {
                header: FspfHeader {
                    version: 2,
                    domain: self.ctl.domain(),
                    ..FspfHeader::default()
                },
                options: 0,
                hello_interval: self.cfg.keepalive.as_secs().max(1) as u32,
                dead_interval: self.cfg.dead_after.as_secs().max(1) as u32,
                recipient_domain: self.up.map_or(0xffff_ffff, u32::from),
                port_index: self.port_no,
            });
            let fc = FcId::FABRIC_CONTROLLER;
            let f = crate::proto::eport::sw_ils_frame(
                &hlo,
                false,
                OxId(0x7200),
                RxId::UNASSIGNED,
                fc,
                fc,
            );
            self.write_or_drop(0, vec![(f, 0)]);
        }
        if now.duration_since(self.last_rate) >= Duration::from_secs(1) {
            self.update_stats(now);
        }
        if now.duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.last_sweep = now;
            if let Some(t) = &mut self.target {
                let n = t.sweep();
                if n > 0 {
                    warn!(tunnel = %self.cfg.name, exchanges = n, "FastWrite: idle accelerated writes dropped with their held data");
                }
            }
        }
    }

    /// Publishes the counters (rates only once a second).
    fn publish(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_rate) >= Duration::from_secs(1) {
            self.update_stats(now);
            return;
        }
        let mut out: Vec<CircuitStats> = self.counters.values().cloned().collect();
        out.sort_by_key(|c| c.slot);
        for c in &mut out {
            if let Some(k) = self.circuits.get(&c.slot) {
                c.uptime_s = now.duration_since(k.since).as_secs_f64();
            }
        }
        if let Ok(mut st) = self.stats.lock() {
            st.circuits = out;
        }
    }

    fn update_stats(&mut self, now: Instant) {
        let dt = now.duration_since(self.last_rate).as_secs_f64();
        self.last_rate = now;
        let mut out = Vec::new();
        let mut slots: Vec<usize> = self.counters.keys().copied().collect();
        slots.sort_unstable();
        for s in slots {
            let Some(c) = self.counters.get_mut(&s) else {
                continue;
            };
            if let Some(b) = self.fast.bytes.get(s) {
                c.tx_bytes = b.tx.load(Ordering::Relaxed);
                c.rx_bytes = b.rx.load(Ordering::Relaxed);
            }
            let (ptx, prx) = self.last_bytes.get(&s).copied().unwrap_or((0, 0));
            c.tx_mbps = (c.tx_bytes - ptx) as f64 / dt / 1e6;
            c.rx_mbps = (c.rx_bytes - prx) as f64 / dt / 1e6;
            self.last_bytes.insert(s, (c.tx_bytes, c.rx_bytes));
            if let Some(k) = self.circuits.get(&s) {
                c.uptime_s = now.duration_since(k.since).as_secs_f64();
                c.rtt_us = tcp_rtt_us(k.fd).unwrap_or(0);
            } else {
                c.uptime_s = 0.0;
            }
            out.push(c.clone());
        }
        if self.enhanced && self.send.acked() > 0 {
            let rate: f64 = out.iter().map(|c| c.tx_mbps * 1e6).sum();
            self.comp.set_link_rate(rate);
        }
        if let Ok(mut st) = self.stats.lock() {
            st.circuits = out;
            st.raw_bytes = self.comp.raw_bytes;
            st.wire_bytes = self.comp.wire_bytes;
            st.duplicates = self.recv.duplicates;
            st.dropped = self.dropped.load(Ordering::Relaxed);
            st.fastwrite_writes = self.host.as_ref().map_or(0, |h| h.accelerated);
        }
    }

    // ---- receive side ----

    fn on_rx(&mut self, slot: usize, item: Item) {
        let Some(c) = self.circuits.get_mut(&slot) else {
            return;
        };
        c.last_rx = Instant::now();
        let Item::Frame(bytes) = item else {
            self.circuit_down(slot, "special frame after the handshake");
            return;
        };
        self.fast.count_rx(slot, bytes.len());
        let frame = match FcipFrame::new_checked(bytes).and_then(|f| f.to_fc_frame()) {
            Ok(f) => f,
            Err(e) => {
                self.circuit_down(slot, &format!("bad frame: {e}"));
                return;
            }
        };
        if self.enhanced || enhanced::is_fragment(&frame.header) {
            if !self.enhanced {
                // A batch on an RFC link: the peer is confused.
                return;
            }
            let done = match c.reasm.push(&frame) {
                Ok(d) => d,
                Err(e) => {
                    self.circuit_down(slot, &format!("bad batch: {e}"));
                    return;
                }
            };
            if let Some((h, body)) = done {
                self.on_batch(slot, h, body);
            }
            return;
        }
        self.dispatch(strip_data_fill(frame), 0);
    }

    fn on_batch(&mut self, slot: usize, h: BatchHeader, body: Bytes) {
        self.send.on_ack(h.ack);
        match BatchKind(h.kind) {
            BatchKind::DATA => {
                // Held as it came (compressed) while it waits for an
                // earlier batch; decompressed once in order.
                let len = body.len();
                let held = HeldBatch {
                    slot,
                    codec: h.codec,
                    raw_len: h.raw_len as usize,
                    body,
                };
                match self.recv.accept(h.seq, held, len) {
                    Ok(ready) => {
                        for held in ready {
                            let b = match decompress(held.codec, held.body, held.raw_len) {
                                Ok(b) => b,
                                Err(e) => {
                                    // Its frames are lost (FCP recovers the
                                    // exchanges); the circuit that carried
                                    // it is not to be trusted.
                                    self.circuit_down(held.slot, &format!("bad batch: {e}"));
                                    continue;
                                }
                            };
                            match records(&b) {
                                Ok(fs) => {
                                    for (mut f, fl) in fs {
                                        // Not a slice of the batch (up to
                                        // 4 MiB decompressed), which the
                                        // frame would keep alive for as
                                        // long as its exchange holds it.
                                        f.payload = Bytes::copy_from_slice(&f.payload);
                                        self.dispatch(f, fl);
                                    }
                                }
                                Err(e) => {
                                    warn!(tunnel = %self.cfg.name, error = %e, "bad batch records")
                                }
                            }
                        }
                        self.ack_due = Some(slot);
                        self.unacked_rx = self.unacked_rx.saturating_add(1);
                    }
                    Err(e) => self.circuit_down(slot, &e.to_string()),
                }
            }
            BatchKind::CONTROL | BatchKind::HELLO => {}
            _ => {}
        }
    }

    /// A frame from the peer.
    fn dispatch(&mut self, f: Frame, flags: u8) {
        let d = f.header.d_id;
        tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %d, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "rx");
        if d == FcId::FABRIC_CONTROLLER && f.header.fc_type == FcType::SW_ILS {
            if let Some(e) = &mut self.eport {
                e.handle(&f);
            }
            self.drain_eport();
            return;
        }
        if self.up.is_none() {
            return; // no data before the link is up
        }
        if unifab_fc::fabric::isl::controller_domain(d) == Some(self.ctl.domain())
            && f.header.r_ctl != unifab_fc::wire::RCtl::CT_REQUEST
        {
            // Replies to the controller's queries, SW_RSCN; name server
            // queries go to the fabric, which answers them.
            self.ctl.deliver(f);
            return;
        }
        let f = match &mut self.host {
            Some(h) => match h.inbound(f) {
                Some(f) => f,
                None => return,
            },
            None => f,
        };
        let out = match &mut self.target {
            Some(t) => t.inbound(f, flags),
            None => vec![f],
        };
        for f in out {
            let _ = self.port.transmit(f);
        }
    }

    fn drain_eport(&mut self) {
        loop {
            let Some(o) = self.eport.as_mut().and_then(|e| e.poll()) else {
                return;
            };
            match o {
                Output::Send(f) => self.send_class_f(f),
                Output::ApplyZoning(z) => self.apply_zoning(z),
                Output::Up {
                    domain,
                    switch_name,
                    peer_domains,
                } => {
                    info!(tunnel = %self.cfg.name, domain, switch = %switch_name, enhanced = self.enhanced, fastwrite = self.host.is_some(), "VE_Port up");
                    self.up = Some(domain);
                    // RFC mode: class 3 frames may bypass this task now.
                    self.fast.set_open(!self.enhanced);
                    self.set_state(format!("up (domain {domain}, {switch_name})"));
                    self.ctl.link_up(
                        self.port_no,
                        LinkHandle {
                            tx: self.ctl_tx.clone(),
                            neighbor: domain,
                        },
                        &peer_domains,
                    );
                }
                Output::Isolated(why) => {
                    tracing::error!(tunnel = %self.cfg.name, reason = %why, "VE_Port isolated");
                    self.isolated = Some(why.clone());
                    self.set_state(format!("isolated: {why}"));
                    self.fast.set_open(false);
                    if self.up.take().is_some() {
                        self.ctl.link_down(self.port_no);
                    }
                }
                Output::Controller(r, _) => self.ctl.on_fspf(self.port_no, r),
            }
        }
    }

    fn apply_zoning(&self, z: ZoneDb) {
        let Some((name, zones)) = z.active else {
            return;
        };
        self.ctl.switch().with_fabric(|f| {
            if f.zoning().active() == Some(name.as_str())
                && f.zoning().active_zones().len() == zones.len()
            {
                return;
            }
            let names: Vec<String> = zones.iter().map(|z| z.name.clone()).collect();
            for zone in zones {
                f.define_zone(zone);
            }
            f.define_zone_set(ZoneSet {
                name: name.clone(),
                zones: names,
            });
            if let Err(e) = f.activate_zone_set(&name) {
                warn!(error = %e, "merged zone set not activated");
            }
        });
    }

    // ---- send side ----

    fn outbound(&mut self, frames: Vec<Frame>) {
        if self.up.is_none() {
            self.dropped
                .fetch_add(frames.len() as u64, Ordering::Relaxed);
            return;
        }
        let mut out: Vec<(Frame, u8)> = Vec::with_capacity(frames.len());
        for f in frames {
            tracing::trace!(tunnel = %self.cfg.name, s_id = %f.header.s_id, d_id = %f.header.d_id, r_ctl = f.header.r_ctl.0, fc_type = f.header.fc_type.0, ox = f.header.ox_id.0, "tx");
            let f = match &mut self.target {
                Some(t) => {
                    let (up, fed) = t.outbound(f);
                    for d in fed {
                        let _ = self.port.transmit(d);
                    }
                    match up {
                        Some(f) => f,
                        None => continue,
                    }
                }
                None => f,
            };
            match &mut self.host {
                Some(h) => {
                    for a in h.outbound(f) {
                        match a {
                            HostAction::Tunnel(f, fl) => out.push((f, fl)),
                            HostAction::Fabric(p) => {
                                let _ = self.port.transmit(p);
                            }
                        }
                    }
                }
                None => out.push((f, 0)),
            }
        }
        if out.is_empty() {
            return;
        }
        if self.enhanced {
            self.send_batches(out);
        } else {
            self.send_rfc(out);
        }
    }

    fn send_class_f(&mut self, f: Frame) {
        if self.enhanced {
            // Class F is not held back by the window (the link's own
            // traffic must flow), but a peer that never acknowledges
            // cannot make it grow without bound either: past `peer_bound`
            // (twice the window plus two batches) unacknowledged, class F
            // is dropped and counted like any frame the tunnel cannot
            // take.
            if self.send.in_flight() > peer_bound(&self.cfg) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                debug!(tunnel = %self.cfg.name, in_flight = self.send.in_flight(), "class F dropped: the peer acknowledges nothing");
                return;
            }
            self.send_batches(vec![(f, 0)]);
        } else if let Some(s) = self.class_f_slot() {
            self.write_or_drop(s, vec![(f, 0)]);
        }
    }

    /// RFC mode: class F on slot 0, class 3 by exchange over the data slots.
    fn send_rfc(&mut self, frames: Vec<(Frame, u8)>) {
        let data: Vec<(usize, u32)> = (1..=self.cfg.circuits.len())
            .filter(|s| self.circuits.contains_key(s))
            .map(|s| (s, self.cfg.circuits[s - 1].weight.max(1)))
            .collect();
        let mut per: HashMap<usize, Vec<(Frame, u8)>> = HashMap::new();
        for (f, fl) in frames {
            let slot = if f.sof == Sof::F {
                0
            } else {
                // The same choice as the fast path's.
                rfc_pick(&f.header, &data).unwrap_or(0)
            };
            per.entry(slot).or_default().push((f, fl));
        }
        for (s, fs) in per {
            self.write_or_drop(s, fs);
        }
    }

    /// Queues `frames` on circuit `slot`'s writer, or counts them as
    /// dropped when the circuit is gone or too far behind.
    fn write_or_drop(&mut self, slot: usize, frames: Vec<(Frame, u8)>) {
        let n = frames.len() as u64;
        if !self.write_frames(slot, frames) {
            self.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Queues `frames` on circuit `slot`'s writer (behind its backlog, if
    /// it has one). False when the circuit is gone, its writer closed or
    /// its backlog full: nothing was queued. A frame too long for FCIP's length field (a
    /// local port breaking FC-FS's payload limit) is dropped, counted and
    /// logged.
    fn write_frames(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool {
        if !self.circuits.contains_key(&slot) {
            return false;
        }
        let mut bufs = Vec::with_capacity(frames.len() * 3);
        let mut n = 0;
        for (f, _) in frames {
            match encode(f) {
                Ok((three, len)) => {
                    n += len;
                    bufs.extend(three);
                }
                Err((f, e)) => {
                    warn!(tunnel = %self.cfg.name, slot, error = %e, s_id = %f.header.s_id, d_id = %f.header.d_id, "frame not sent: it does not fit FCIP's length field");
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if bufs.is_empty() {
            return true;
        }
        let Some(c) = self.circuits.get_mut(&slot) else {
            return false;
        };
        // Err: closed (its down event is on its way) or backlog full.
        if c.queue(bufs, n).is_err() {
            return false;
        }
        self.fast.count_tx(slot, n);
        true
    }

    /// A circuit with room in its writer, by weight.
    fn pick_slot(&mut self) -> Option<usize> {
        let mut live: Vec<(usize, u32)> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.has_room(1))
            .map(|(s, _)| {
                (
                    *s,
                    self.cfg.circuits.get(s - 1).map_or(1, |c| c.weight.max(1)),
                )
            })
            .collect();
        if live.is_empty() {
            return None;
        }
        live.sort_unstable();
        let total: u32 = live.iter().map(|(_, w)| w).sum();
        self.rr = self.rr.wrapping_add(1);
        let mut x = (self.rr as u32) % total;
        for (s, w) in &live {
            if x < *w {
                return Some(*s);
            }
            x -= w;
        }
        live.first().map(|l| l.0)
    }

    /// Enhanced mode: frames into numbered batches of at most ~256 KiB.
    fn send_batches(&mut self, frames: Vec<(Frame, u8)>) {
        let mut body = BytesMut::with_capacity(64 * 1024);
        let mut it = frames.into_iter().peekable();
        while it.peek().is_some() {
            body.clear();
            while let Some((f, fl)) = it.peek() {
                if !body.is_empty() && body.len() + f.len() > 256 * 1024 {
                    break;
                }
                put_record(&mut body, f, *fl);
                it.next();
            }
            let raw = body.split().freeze();
            let raw_len = raw.len();
            let (codec, wire) = self.comp.compress(raw);
            let Some(slot) = self.pick_slot() else {
                // No circuit with room: keep it for when one has some.
                self.send.push(codec, raw_len, wire, usize::MAX);
                self.unsent = true;
                continue;
            };
            let h = self.send.push(codec, raw_len, wire.clone(), slot);
            self.write_batch(slot, h, wire);
        }
    }

    fn write_batch(&mut self, slot: usize, mut h: BatchHeader, body: Bytes) {
        h.ack = self.recv.ack();
        self.acked_now();
        let frames: Vec<(Frame, u8)> = enhanced::fragments(&h, &body)
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        if !self.write_frames(slot, frames) && BatchKind(h.kind) == BatchKind::DATA {
            // Still in the send window: sent again once a writer has room
            // (or by a survivor, if this circuit is going down).
            self.send.unassign(&h);
            self.unsent = true;
        }
    }

    fn send_standalone_ack(&mut self, slot: usize) {
        self.send_control(slot);
        if let Ok(mut st) = self.stats.lock() {
            st.standalone_acks += 1;
        }
    }

    /// A batch carrying the current ack is going out: no standalone ack
    /// is owed.
    fn acked_now(&mut self) {
        self.ack_due = None;
        self.ack_at = None;
        self.unacked_rx = 0;
    }

    fn send_control(&mut self, slot: usize) {
        if !self.circuits.contains_key(&slot) {
            return;
        }
        let h = BatchHeader {
            kind: BatchKind::CONTROL.0,
            codec: Codec::NONE,
            ack: self.recv.ack(),
            ..BatchHeader::default()
        };
        self.acked_now();
        let frames: Vec<(Frame, u8)> = enhanced::fragments(&h, &Bytes::new())
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        self.write_or_drop(slot, frames);
    }
}

/// A frame as FCIP puts it on a connection: encapsulation header and SOF,
/// the frame (its payload not copied), CRC and EOF; and their length. Err:
/// the frame is too long for FCIP's length field (given back).
fn encode(f: Frame) -> Result<([Bytes; 3], usize), (Frame, crate::wire::WireError)> {
    let w = Wire::new(f)?;
    let n = w.len();
    Ok((
        [
            Bytes::copy_from_slice(&w.head),
            w.payload,
            Bytes::copy_from_slice(&w.tail),
        ],
        n,
    ))
}

/// A frame encoded for a connection, its header and trailer in place (no
/// allocation): encapsulation header, SOF and FC header; the payload;
/// CRC and EOF.
pub(super) struct Wire {
    pub head: [u8; crate::wire::ENCAP_LEN + 4 + unifab_fc::wire::header::HEADER_LEN],
    pub payload: Bytes,
    pub tail: [u8; 8],
}

impl Wire {
    /// Encodes `f`; Err: too long for FCIP's length field (given back).
    pub fn new(f: Frame) -> Result<Wire, (Frame, crate::wire::WireError)> {
        let r = FcipFrameRepr::new(word_aligned(f));
        match r.head_tail() {
            Ok((head, tail)) => Ok(Wire {
                head,
                payload: r.frame.payload,
                tail,
            }),
            Err(e) => Err((r.frame, e)),
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len() + self.tail.len()
    }

    /// The three parts, in order.
    pub fn parts(&self) -> [&[u8]; 3] {
        [&self.head, &self.payload, &self.tail]
    }
}

/// FCIP carries whole words: a payload that is not is padded with fill
/// bytes, counted in F_CTL as FC-FS wants.
fn word_aligned(mut f: Frame) -> Frame {
    let fill = (4 - f.payload.len() % 4) % 4;
    if fill != 0 {
        let mut p = BytesMut::with_capacity(f.payload.len() + fill);
        p.extend_from_slice(&f.payload);
        p.extend_from_slice(&[0u8; 3][..fill]);
        f.payload = p.freeze();
        f.header.f_ctl = f.header.f_ctl.with_fill_bytes(fill as u8);
    }
    f
}

/// Fill bytes of solicited data are not data: they are dropped again on
/// receive so the payload is exactly what the sender's FCP layer sent.
pub(super) fn strip_data_fill(mut f: Frame) -> Frame {
    let fill = usize::from(f.header.f_ctl.fill_bytes());
    if fill != 0
        && f.header.fc_type == FcType::FCP
        && f.header.r_ctl == unifab_fc::wire::RCtl::FCP_DATA
        && f.payload.len() >= fill
    {
        f.payload = f.payload.slice(..f.payload.len() - fill);
        f.header.f_ctl = f.header.f_ctl.with_fill_bytes(0);
    }
    f
}

async fn writer(
    mut w: tokio::io::WriteHalf<Box<dyn Stream>>,
    mut rx: mpsc::Receiver<Vec<Bytes>>,
    ev: mpsc::Sender<Ev>,
    slot: usize,
    epoch: u64,
    room: Arc<Notify>,
    queued: Arc<AtomicUsize>,
) {
    let mut pending: Vec<Bytes> = Vec::new();
    while let Some(bufs) = rx.recv().await {
        pending.extend(bufs);
        let mut taken = 1;
        while let Ok(more) = rx.try_recv() {
            pending.extend(more);
            taken += 1;
            if pending.len() > 1024 {
                break;
            }
        }
        room.notify_one();
        if let Err(e) = write_all_vectored(&mut w, &mut pending).await {
            let _ = ev
                .send(Ev::Closed(slot, epoch, format!("write: {e}")))
                .await;
            return;
        }
        if let Err(e) = w.flush().await {
            let _ = ev
                .send(Ev::Closed(slot, epoch, format!("flush: {e}")))
                .await;
            return;
        }
        // Written: the tunnel may write directly again once nothing else
        // is queued.
        queued.fetch_sub(taken, Ordering::AcqRel);
    }
    let _ = w.shutdown().await;
}

/// Writes `bufs` to the socket now, as far as it takes them without
/// blocking; true when all went. What is left stays in `bufs` (a partly
/// written slice is cut to its unwritten tail).
fn write_now(f: &socket2::Socket, bufs: &mut Vec<Bytes>) -> bool {
    let mut start = 0;
    while start < bufs.len() {
        // A closed peer is an error here, never a SIGPIPE.
        let n = match f
            .send_vectored_with_flags(&io_slices(&bufs[start..], 1024), libc::MSG_NOSIGNAL)
        {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        consume(bufs, &mut start, n);
    }
    bufs.drain(..start);
    bufs.is_empty()
}

/// At most `max` slices of `bufs`, for one vectored write.
fn io_slices(bufs: &[Bytes], max: usize) -> Vec<IoSlice<'_>> {
    bufs.iter().take(max).map(|b| IoSlice::new(b)).collect()
}

/// `n` bytes of `bufs[*start..]` were written: moves `start` past the
/// whole slices and cuts a partly written one to its tail.
fn consume(bufs: &mut [Bytes], start: &mut usize, mut n: usize) {
    while *start < bufs.len() && n >= bufs[*start].len() {
        n -= bufs[*start].len();
        *start += 1;
    }
    if n > 0 {
        let b = bufs[*start].slice(n..);
        bufs[*start] = b;
    }
}

async fn write_all_vectored(
    w: &mut (impl AsyncWrite + Unpin),
    bufs: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut start = 0;
    while start < bufs.len() {
        let n = w.write_vectored(&io_slices(&bufs[start..], 64)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        consume(bufs, &mut start, n);
    }
    bufs.clear();
    Ok(())
}

/// `item` in a buffer of its own. The decoder hands out slices of the
/// reader's buffer (64 KiB and more per read), and a frame is kept for
/// as long as its exchange needs it (an FCP target holds a write's data
/// until the command runs, its command longer): a slice would keep the
/// whole buffer alive, so a peer sending small frames among large ones
/// that are dropped at once could make each kept byte cost many times
/// its size. A copy of one frame (at most 2,148 bytes) costs little next
/// to the socket read that brought it; the decoder's buffer is then
/// free again for the next read.
fn owned(item: Item) -> Item {
    match item {
        Item::Frame(b) => Item::Frame(Bytes::copy_from_slice(&b)),
        Item::Special(b) => Item::Special(Bytes::copy_from_slice(&b)),
    }
}

async fn reader(
    mut r: tokio::io::ReadHalf<Box<dyn Stream>>,
    leftover: Bytes,
    ev: mpsc::Sender<Ev>,
    slot: usize,
    epoch: u64,
    unhandled: Arc<AtomicUsize>,
    fast: Option<FastRx>,
) {
    let mut dec = Decoder::new(DecoderConfig::default());
    dec.extend(&leftover);
    loop {
        loop {
            match dec.decode() {
                Ok(Some(item)) => {
                    let item = owned(item);
                    let item = match &fast {
                        Some(f) => match f.deliver(item) {
                            Some(item) => item,
                            None => continue,
                        },
                        None => item,
                    };
                    unhandled.fetch_add(1, Ordering::AcqRel);
                    if ev.send(Ev::Rx(slot, epoch, item)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = ev.send(Ev::Closed(slot, epoch, e.to_string())).await;
                    return;
                }
            }
        }
        let buf = dec.buffer_mut();
        buf.reserve(64 * 1024);
        match r.read_buf(buf).await {
            Ok(0) => {
                let _ = ev
                    .send(Ev::Closed(slot, epoch, "closed by the peer".into()))
                    .await;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = ev.send(Ev::Closed(slot, epoch, format!("read: {e}"))).await;
                return;
            }
        }
    }
}

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

    /// Enhanced mode: class F is not held back by the window, but a peer
    /// that acknowledges nothing cannot make it pile up without bound.
    /// Up to `peer_bound` unacknowledged bytes it is kept (to be sent once
    /// a circuit has room); past it, each class F frame is dropped and
    /// counted; an acknowledgement makes room again.
    #[tokio::test]
    async fn class_f_past_the_peer_bound_is_dropped_and_counted() {
        use unifab_fc::fabric::FabricConfig;
        use unifab_fc::io::Switch;
        use unifab_fc::wire::Eof;
        use unifab_fc::wire::header::FcHeaderRepr;

        let peer = Wwn(0x1000_0000_0000_00b1);
        let switch = Switch::new(FabricConfig {
            domain: 1,
            switch_name: Wwn(0x1000_0000_0000_00a1),
            ..FabricConfig::default()
        });
        let ctl = InterSwitch::start(switch);
        let mut cfg = TunnelConfig::new(
            "to-b",
            0,
            peer,
            vec![super::super::CircuitConfig {
                peer: None,
                local: None,
                weight: 1,
            }],
        );
        cfg.mode = LinkMode::Enhanced;
        cfg.window_bytes = 64 << 10;
        let cfg = Arc::new(cfg);
        let (fab_tx, _fab_rx) = mpsc::channel(16);
        let (ev_tx, _ev_rx) = mpsc::channel(16);
        let (ctl_tx, _ctl_rx) = mpsc::channel(16);
        let fast = Arc::new(FastPath::new(1, Arc::new(AtomicU64::new(0))));
        let link = TunnelLink {
            tx: fab_tx,
            name: cfg.name.clone(),
            fast: fast.clone(),
        };
        let port = ctl.switch().attach_e_port(&cfg.name, Arc::new(link));
        let stats = Arc::new(Mutex::new(TunnelStats::default()));
        let mut a = Actor::new(cfg.clone(), port, ctl, ev_tx, ctl_tx, stats, fast);
        // Enhanced mode negotiated, and no circuit takes anything: the
        // peer acknowledges nothing.
        a.enhanced = true;
        let class_f = || Frame {
            sof: Sof::F,
            header: FcHeaderRepr {
                fc_type: FcType::SW_ILS,
                ..FcHeaderRepr::default()
            },
            payload: Bytes::from(vec![0u8; 2048]),
            eof: Eof::T,
        };
        let bound = peer_bound(&cfg);
        let dropped = |a: &Actor| a.dropped.load(Ordering::Relaxed);
        let mut kept = 0;
        while a.send.in_flight() <= bound {
            a.send_class_f(class_f());
            kept += 1;
            assert_eq!(dropped(&a), 0, "dropped within the bound");
        }
        // Past the window (64 KiB) by far: class F is not held by it.
        assert!(kept > 1000, "{kept} frames kept");
        let held = a.send.in_flight();
        assert!(held <= bound + 2 * 1024 + 64, "{held} > {bound}");
        for n in 1..=100 {
            a.send_class_f(class_f());
            assert_eq!(dropped(&a), n);
        }
        assert_eq!(a.send.in_flight(), held, "nothing more kept");
        // The peer acknowledges everything: class F is kept again.
        let all = a.send.acked() + a.send.outstanding() as u64;
        assert_eq!(a.send.on_ack(all), held);
        a.send_class_f(class_f());
        assert_eq!(dropped(&a), 100);
        assert!(a.send.in_flight() > 0);
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
