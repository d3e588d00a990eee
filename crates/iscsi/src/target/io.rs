//! The tokio driver of the iSCSI target: TCP listeners, the login phase,
//! and the full-feature-phase loop that runs a sans-IO [`Session`].
//!
//! One tokio task per connection reads PDUs, feeds the session, runs the
//! SCSI tasks it emits (concurrently, inside the same task) and hands
//! encoded PDUs to a writer task over a bounded channel, which writes them
//! with vectored writes: header bytes and data slices go to the socket as
//! they are, never concatenated. A slow reader on the other end fills the
//! channel and so stops this side from reading more commands: memory per
//! connection stays bounded.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{debug, info, warn};

use unifab_scsi_core::{BoxFuture, ItNexus, Task, TaskResult, TmfRequest, TmfResponse};

use super::session::{Event, FfpParams, OutPdu, Session, SessionLimits};
use crate::wire::{Check, Digests, Framer, WireError, digest, encode_header, frame::padding};

/// Where a target's SCSI tasks go: a LUN map with its logical units
/// (`unifab_scsi_core::target::ScsiTarget` implements it in the gateway).
pub trait TaskRouter: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one task (REPORT LUNS and missing LUNs included).
    fn dispatch(&self, task: Task) -> BoxFuture<'static, TaskResult>;
    /// Runs a task management function.
    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse>;
    /// The nexus is gone.
    fn nexus_loss(&self, nexus: &ItNexus);
}

/// One connection's state as the operator sees it (`unifab show sessions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Target name.
    pub target: String,
    /// Initiator name.
    pub initiator: String,
    /// ISID as 12 hex digits.
    pub isid: String,
    /// TSIH.
    pub tsih: u16,
    /// Peer address.
    pub peer: String,
    /// Header and data digests.
    pub digests: String,
    /// Commands run since login.
    pub commands: u64,
}

/// The handle a live session leaves in the session table, used for
/// session reinstatement (a new login with the same initiator name and ISID
/// ends the old session, RFC 7143 §6.3.5) and target cold reset.
#[derive(Debug)]
pub(crate) struct SessionHandle {
    pub(crate) tsih: u16,
    pub(crate) kill: watch::Sender<bool>,
    pub(crate) info: Arc<Mutex<SessionInfo>>,
    /// Resolves when the session task has ended.
    pub(crate) done: watch::Receiver<bool>,
}

/// Key of the session table: (target, initiator name, ISID), names
/// compared case-insensitively as RFC 3722 normalises them.
pub(crate) type SessionKey = (String, String, [u8; 6]);

/// State shared by every connection of a server.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sessions: Mutex<HashMap<SessionKey, SessionHandle>>,
    next_tsih: AtomicU16,
    pub(crate) commands: AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            sessions: Mutex::new(HashMap::new()),
            next_tsih: AtomicU16::new(1),
            commands: AtomicU64::new(0),
        }
    }

    /// A TSIH no live session uses (never 0).
    pub(crate) fn alloc_tsih(&self) -> u16 {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let t = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 && !sessions.values().any(|h| h.tsih == t) {
                return t;
            }
        }
    }

    /// Snapshot of live sessions.
    pub(crate) fn snapshot(&self) -> Vec<SessionInfo> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<SessionInfo> = sessions
            .values()
            .map(|h| h.info.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect();
        v.sort_by(|a, b| (a.tsih, &a.initiator).cmp(&(b.tsih, &b.initiator)));
        v
    }
}

/// Answers a full-feature-phase Text Request (its whole text) with the
/// response text.
pub(crate) type TextHandler = Box<dyn FnMut(&Bytes) -> Result<Bytes, ()> + Send>;

/// Everything the full-feature-phase loop needs to run one session.
pub(crate) struct FfpSetup {
    pub(crate) nexus: ItNexus,
    pub(crate) cid: u16,
    pub(crate) params: FfpParams,
    pub(crate) limits: SessionLimits,
    pub(crate) digests: Digests,
    pub(crate) exp_cmd_sn: u32,
    pub(crate) stat_sn: u32,
    pub(crate) router: Arc<dyn TaskRouter>,
    pub(crate) kill: watch::Receiver<bool>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) info: Arc<Mutex<SessionInfo>>,
    /// Answers Text Requests in full-feature phase (SendTargets, key
    /// renegotiation).
    pub(crate) text: TextHandler,
    /// Reaction to a TARGET COLD RESET.
    pub(crate) cold_reset: Box<dyn Fn() + Send>,
}

/// What a connection writer gets: a batch of slices to write in order.
type Batch = Vec<Bytes>;

/// Encodes one PDU into slices: the header (and its digest) from `arena`,
/// the data slices as they are, padding and data digest.
fn encode_out(out: &OutPdu, digests: Digests, arena: &mut BytesMut, chunks: &mut Vec<Bytes>) {
    let data_len = out.data.len();
    let hb = match encode_header(&out.pdu, &[], data_len as u32, digests.header) {
        Ok(h) => h,
        Err(e) => {
            // Our own PDUs are built within limits; refuse loudly if not.
            warn!(error = %e, pdu = ?out.pdu, "could not encode PDU");
            return;
        }
    };
    arena.extend_from_slice(hb.bhs_bytes());
    chunks.push(arena.split().freeze());
    if data_len == 0 {
        return;
    }
    for s in out.data.slices() {
        chunks.push(s.clone());
    }
    let pad = padding(data_len);
    if !pad.is_empty() {
        chunks.push(Bytes::from_static(pad));
    }
    if digests.data {
        let crc = digest::data_digest(out.data.slices().iter().map(|b| &b[..]));
        arena.extend_from_slice(&digest::to_wire(crc));
        chunks.push(arena.split().freeze());
    }
}

/// Writes every slice, in order, with vectored writes.
async fn write_all_slices(w: &mut OwnedWriteHalf, mut chunks: &mut [Bytes]) -> io::Result<()> {
    const MAX_IOV: usize = 256;
    while !chunks.is_empty() {
        let n = {
            let iov: Vec<io::IoSlice<'_>> = chunks
                .iter()
                .take(MAX_IOV)
                .map(|b| io::IoSlice::new(b))
                .collect();
            w.write_vectored(&iov).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut left = n;
        let mut skip = 0;
        for c in chunks.iter_mut() {
            if left >= c.len() {
                left -= c.len();
                skip += 1;
            } else {
                let _ = c.split_to(left);
                break;
            }
        }
        chunks = &mut chunks[skip..];
    }
    Ok(())
}

/// The writer task: drains batches until the channel closes.
async fn writer(mut w: OwnedWriteHalf, mut rx: mpsc::Receiver<Batch>) -> io::Result<()> {
    while let Some(mut batch) = rx.recv().await {
        // Coalesce whatever else is already queued into one write.
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
            if batch.len() >= 512 {
                break;
            }
        }
        write_all_slices(&mut w, &mut batch).await?;
    }
    let _ = w.shutdown().await;
    Ok(())
}

/// Reads until at least one whole PDU is buffered; reserves the full PDU
/// length up front so a large Data-Out lands in one allocation (it is then
/// split off and frozen without copying).
pub(crate) async fn fill(
    rd: &mut (impl AsyncReadExt + Unpin),
    buf: &mut BytesMut,
    framer: &Framer,
) -> Result<bool, WireError> {
    loop {
        match framer.check(buf)? {
            Check::Complete(_) => return Ok(true),
            Check::Incomplete(need) => {
                if buf.capacity() < need {
                    buf.reserve(need.max(8192) - buf.len());
                }
            }
        }
        match rd.read_buf(buf).await {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(_) => return Ok(false),
        }
    }
}

/// Runs a session in full-feature phase until it ends. `rbuf` holds any
/// bytes already read past the login.
pub(crate) async fn run_ffp(
    stream: TcpStream,
    mut rbuf: BytesMut,
    mut setup: FfpSetup,
) -> io::Result<()> {
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Batch>(32);
    let writer = tokio::spawn(writer(wr, rx));

    let framer = Framer {
        digests: setup.digests,
        max_data_segment_length: setup.params.max_recv_data_segment_length,
    };
    let mut session = Session::new(
        setup.nexus.clone(),
        setup.cid,
        setup.params,
        setup.limits,
        setup.exp_cmd_sn,
        setup.stat_sn,
        Instant::now(),
    );
    let router = setup.router.clone();
    let mut running: FuturesUnordered<BoxFuture<'static, (u32, TaskResult)>> =
        FuturesUnordered::new();
    let mut tmfs: FuturesUnordered<BoxFuture<'static, (u32, TmfResponse)>> =
        FuturesUnordered::new();
    let mut arena = BytesMut::with_capacity(4096);
    let mut shutting_down: Option<Instant> = None;
    let mut close_after_flush = false;
    let mut end_reason = String::new();

    'outer: loop {
        // Hand out work and send what is queued.
        while let Some(ev) = session.poll_event() {
            match ev {
                Event::Execute { itt, task } => {
                    setup
                        .info
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .commands += 1;
                    let fut = router.dispatch(task);
                    running.push(Box::pin(async move { (itt, fut.await) }));
                }
                Event::TaskManagement { itt, request } => {
                    let fut = router.task_management(request);
                    tmfs.push(Box::pin(async move { (itt, fut.await) }));
                }
                Event::Text {
                    itt,
                    ttt: _,
                    data,
                    continues,
                } => {
                    if continues {
                        // Multi-PDU text requests are answered empty until
                        // the final one (RFC 7143 §10.11.2).
                        let ttt = session.text_ttt();
                        session.text_response(itt, ttt, Bytes::new(), true);
                    } else {
                        match (setup.text)(&data) {
                            Ok(answer) => {
                                session.text_response(itt, 0, answer, false);
                            }
                            Err(()) => {
                                session.text_response(itt, 0, Bytes::new(), false);
                            }
                        }
                    }
                }
                Event::TargetColdReset => {
                    (setup.cold_reset)();
                }
                Event::Close(reason) => {
                    end_reason = format!("{reason:?}");
                    close_after_flush = true;
                }
            }
        }
        if session.transmit_queue_len() > 0 {
            let mut batch = Vec::with_capacity(session.transmit_queue_len() * 3);
            while let Some(out) = session.poll_transmit() {
                encode_out(&out, setup.digests, &mut arena, &mut batch);
            }
            if arena.capacity() < 1024 {
                arena = BytesMut::with_capacity(4096);
            }
            if tx.send(batch).await.is_err() {
                end_reason = "writer failed".into();
                break 'outer;
            }
        }
        if close_after_flush {
            break 'outer;
        }

        let timeout = session
            .poll_timeout()
            .into_iter()
            .chain(shutting_down)
            .min();
        let sleep = async move {
            match timeout {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending::<()>().await,
            }
        };

        tokio::select! {
            biased;
            Some((itt, result)) = running.next(), if !running.is_empty() => {
                session.complete_task(itt, result);
                // Collect every other task that is already done.
                while let Some(Some((itt, result))) = futures_util::FutureExt::now_or_never(running.next()) {
                    session.complete_task(itt, result);
                }
            }
            Some((itt, response)) = tmfs.next(), if !tmfs.is_empty() => {
                session.complete_tmf(itt, response);
            }
            ok = fill(&mut rd, &mut rbuf, &framer) => {
                match ok {
                    Ok(true) => {}
                    Ok(false) => { end_reason = "peer closed the connection".into(); break 'outer; }
                    Err(e) => {
                        end_reason = format!("framing error: {e}");
                        break 'outer;
                    }
                }
                let now = Instant::now();
                loop {
                    match framer.decode(&mut rbuf) {
                        Ok(Some(frame)) => {
                            if let Err(e) = session.handle_frame(now, frame) {
                                end_reason = format!("{e}");
                                break 'outer;
                            }
                        }
                        Ok(None) => break,
                        Err(WireError::DataDigest { bhs, .. }) => {
                            if let Err(e) = session.handle_digest_error(now, bhs) {
                                end_reason = format!("{e}");
                                break 'outer;
                            }
                        }
                        Err(e) => {
                            // Framing is lost: RFC 7143 §7.8 (header digest)
                            // and §7.2 (protocol error): drop the connection.
                            end_reason = format!("{e}");
                            break 'outer;
                        }
                    }
                }
                // Do not keep a large buffer around for an idle session.
                if rbuf.is_empty() && rbuf.capacity() > 64 * 1024 {
                    rbuf = BytesMut::new();
                }
            }
            _ = sleep => {
                let now = Instant::now();
                if shutting_down.is_some_and(|t| now >= t) {
                    end_reason = "shutdown".into();
                    break 'outer;
                }
                session.handle_timeout(now);
            }
            _ = setup.kill.changed() => {
                end_reason = "session reinstated or reset".into();
                break 'outer;
            }
            _ = setup.shutdown.changed(), if shutting_down.is_none() => {
                // Ask the initiator to log out within 2 s; close at 5 s.
                session.request_logout(2);
                shutting_down = Some(Instant::now() + Duration::from_secs(5));
            }
        }
    }

    debug!(nexus = ?setup.nexus, reason = %end_reason, "connection ends");
    session.abort_all();
    drop(tx);
    // Let in-flight tasks finish: they hold LU resources (and a write in
    // progress must reach the backend or not, not half).
    while running.next().await.is_some() {}
    while tmfs.next().await.is_some() {}
    let _ = writer.await;
    Ok(())
}

/// A listening iSCSI target server.
#[derive(Debug)]
pub struct Listeners {
    listeners: Vec<TcpListener>,
}

impl Listeners {
    /// Binds every address (SO_REUSEADDR is set by tokio on Unix).
    pub async fn bind(addrs: &[SocketAddr]) -> io::Result<Listeners> {
        let mut listeners = Vec::new();
        for a in addrs {
            let l = TcpListener::bind(a)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {a}: {e}")))?;
            info!(addr = %l.local_addr()?, "iSCSI portal listening");
            listeners.push(l);
        }
        Ok(Listeners { listeners })
    }

    /// The bound addresses (with the real port when 0 was asked).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Accepts connections until `shutdown` flips, handing each to `serve`
    /// with a connection-limit permit.
    pub(crate) async fn accept_loop<F>(
        self,
        limit: Arc<Semaphore>,
        mut shutdown: watch::Receiver<bool>,
        serve: F,
    ) where
        F: Fn(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit) + Send + Sync + 'static,
    {
        let serve = Arc::new(serve);
        let mut tasks = Vec::new();
        for l in self.listeners {
            let limit = limit.clone();
            let serve = serve.clone();
            let mut shutdown = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        r = l.accept() => match r {
                            Ok((s, peer)) => match limit.clone().try_acquire_owned() {
                                Ok(permit) => serve(s, peer, permit),
                                Err(_) => {
                                    warn!(%peer, "connection limit reached; refusing");
                                    drop(s);
                                }
                            },
                            Err(e) => {
                                warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        },
                        _ = shutdown.changed() => break,
                    }
                }
            }));
        }
        let _ = shutdown.changed().await;
        for t in tasks {
            let _ = t.await;
        }
    }
}
