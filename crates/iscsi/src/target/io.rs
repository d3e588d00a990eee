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

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use unifab_scsi_core::{Dispatch, ItNexus, Keyed, TaskResult, TmfResponse};

use super::session::{Coalescing, Event, OutPdu, Session, SessionLimits};
use crate::ffp::FfpParams;
use crate::sock::Receiver;
use crate::wire::{
    Check, Digests, Framer, Pdu, PduFrame, WireError, digest, encode_header, frame::padding,
};

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
    /// Flipped to ask the initiator to log out (Async Message, logout
    /// requested): its target was removed or its ACL entry withdrawn.
    pub(crate) logout: watch::Sender<bool>,
    /// A second descriptor of the session's socket, to look for an end of
    /// stream its task has not read yet ([`Shared::end_dead_sessions`]).
    /// Made by the accept loop, which refuses a connection it cannot make
    /// one for.
    pub(crate) probe: socket2::Socket,
}

/// Whether the peer closed or reset the connection behind `probe`: its
/// next byte is an end of stream (or the socket failed). Data not yet read
/// means alive; nothing to read means alive. Reads nothing (MSG_PEEK).
fn peer_gone(probe: &socket2::Socket) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    // Never waits, whatever the descriptor's mode.
    match probe.recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Key of the session table: (target, initiator name, ISID), names
/// compared case-insensitively as RFC 3722 normalises them.
pub(crate) type SessionKey = (String, String, [u8; 6]);

/// State shared by every connection of a server.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sessions: Mutex<HashMap<SessionKey, SessionHandle>>,
    next_tsih: AtomicU16,
    /// Commands of the sessions that have ended.
    pub(crate) commands: AtomicU64,
    /// The most [`Shared::commands_total`] has returned: what it returns
    /// never goes down, though a session a reinstatement replaced is in
    /// neither the table nor `commands` until it ends.
    commands_reported: AtomicU64,
    /// TCP connections accepted on the portals.
    pub(crate) connections: AtomicU64,
    /// Logins that reached full feature phase.
    pub(crate) logins: AtomicU64,
    /// Logins refused: authentication, authorization, a protocol error, a
    /// login that timed out, and connections refused for want of
    /// resources.
    pub(crate) login_failures: AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            sessions: Mutex::new(HashMap::new()),
            next_tsih: AtomicU16::new(1),
            commands: AtomicU64::new(0),
            commands_reported: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            logins: AtomicU64::new(0),
            login_failures: AtomicU64::new(0),
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

    /// Ends the sessions of `target` whose peer has already closed or
    /// reset the connection though their task has not yet read it, and
    /// returns what resolves when each has ended (its tasks aborted and its
    /// nexus loss reported to the LUs). A login calls this before it
    /// answers, so that a host that drops a connection and logs in again
    /// at once is not refused for state its old nexus held (PREVENT MEDIUM
    /// REMOVAL, a RESERVE) only because the old connection's end had not
    /// been read yet.
    pub(crate) fn end_dead_sessions(&self, target: &str) -> Vec<watch::Receiver<bool>> {
        let t = target.to_ascii_lowercase();
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .iter()
            .filter(|(k, h)| k.0 == t && peer_gone(&h.probe))
            .map(|(_, h)| {
                let _ = h.kill.send(true);
                h.done.clone()
            })
            .collect()
    }

    /// Commands run since start: those of ended sessions and of live ones.
    pub(crate) fn commands_total(&self) -> u64 {
        let now = {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let live: u64 = sessions
                .values()
                .map(|h| h.info.lock().unwrap_or_else(|e| e.into_inner()).commands)
                .sum();
            self.commands.load(Ordering::Relaxed) + live
        };
        self.commands_reported
            .fetch_max(now, Ordering::Relaxed)
            .max(now)
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
pub(crate) type TextHandler = Box<dyn FnMut(&Bytes) -> Option<Bytes> + Send>;

/// Everything the full-feature-phase loop needs to run one session.
pub(crate) struct FfpSetup {
    pub(crate) nexus: ItNexus,
    pub(crate) cid: u16,
    pub(crate) params: FfpParams,
    pub(crate) limits: SessionLimits,
    pub(crate) digests: Digests,
    pub(crate) exp_cmd_sn: u32,
    pub(crate) stat_sn: u32,
    pub(crate) scsi: Arc<dyn Dispatch>,
    pub(crate) kill: watch::Receiver<bool>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// This session alone is asked to log out (as at shutdown); a closed
    /// channel never asks.
    pub(crate) logout: watch::Receiver<bool>,
    pub(crate) info: Arc<Mutex<SessionInfo>>,
    /// Answers Text Requests in full-feature phase (SendTargets, key
    /// renegotiation).
    pub(crate) text: TextHandler,
    /// Reaction to a TARGET COLD RESET.
    pub(crate) cold_reset: Box<dyn Fn() + Send>,
}

/// Output queued for the socket: slices written in order, and their total.
#[derive(Debug, Default)]
struct OutQueue {
    chunks: std::collections::VecDeque<Bytes>,
    bytes: usize,
}

impl OutQueue {
    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.bytes += b.len();
            self.chunks.push_back(b);
        }
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Writes as much as the socket takes now, with vectored writes.
    /// `Ok(true)`: everything was written; `Ok(false)`: the socket is full.
    fn flush(&mut self, stream: &TcpStream) -> io::Result<bool> {
        const MAX_IOV: usize = 64;
        while !self.chunks.is_empty() {
            let n = {
                let iov: Vec<io::IoSlice<'_>> = self
                    .chunks
                    .iter()
                    .take(MAX_IOV)
                    .map(|b| io::IoSlice::new(b))
                    .collect();
                match stream.try_write_vectored(&iov) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) => return Err(e),
                }
            };
            self.bytes -= n;
            let mut left = n;
            while left > 0 {
                let Some(front) = self.chunks.front_mut() else {
                    break;
                };
                if front.len() <= left {
                    left -= front.len();
                    self.chunks.pop_front();
                } else {
                    let _ = front.split_to(left);
                    left = 0;
                }
            }
        }
        Ok(true)
    }
}

/// Encodes one PDU into slices: the header (and its digest) from `arena`,
/// the data slices as they are, padding and data digest.
fn encode_out(out: &OutPdu, digests: Digests, arena: &mut BytesMut, q: &mut OutQueue) {
    let data_len = out.data.len();
    let hb = match encode_header(&out.pdu, &[], data_len as u32, digests.header) {
        Ok(h) => h,
        Err(e) => {
            // Our own PDUs are built within limits; refuse loudly if not.
            warn!(error = %e, pdu = ?out.pdu, "could not encode PDU");
            return;
        }
    };
    if arena.capacity() - arena.len() < 64 {
        *arena = BytesMut::with_capacity(8192);
    }
    arena.extend_from_slice(hb.bhs_bytes());
    q.push(arena.split().freeze());
    if data_len == 0 {
        return;
    }
    for s in out.data.slices() {
        q.push(s.clone());
    }
    let pad = padding(data_len);
    if !pad.is_empty() {
        q.push(Bytes::from_static(pad));
    }
    if digests.data {
        let crc = digest::data_digest(out.data.slices().iter().map(|b| &b[..]));
        arena.extend_from_slice(&digest::to_wire(crc));
        q.push(arena.split().freeze());
    }
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

/// Output beyond which the connection stops reading new PDUs until the
/// peer has taken some: a peer that does not read cannot make us buffer.
const OUT_QUEUE_LIMIT: usize = 8 << 20;

/// Hands one PDU, or what decoding it found, to the session. `Err`: the
/// connection ends, for the reason given.
fn deliver(
    session: &mut Session,
    now: Instant,
    decoded: Result<PduFrame, WireError>,
) -> Result<(), String> {
    match decoded {
        Ok(frame) => session.handle_frame(now, frame).map_err(|e| format!("{e}")),
        Err(WireError::DataDigest { bhs, .. }) => session
            .handle_digest_error(now, bhs)
            .map_err(|e| format!("{e}")),
        // Framing is lost (header digest, over-long segment, reserved
        // bit): RFC 7143 §7.8, drop the connection.
        Err(e) => Err(format!("{e}")),
    }
}

/// Response coalescing on one connection ([`Coalescing`]): counts the
/// answers queued since the last write and decides whether to write them
/// yet.
#[derive(Debug)]
struct Holder {
    cfg: Coalescing,
    /// Commands answered (SCSI Response, or Data-In with status) in what
    /// is queued.
    answers: u32,
    /// Everything queued is part of an answer.
    only_answers: bool,
    /// When the first of them was queued, while holding.
    since: Option<Instant>,
    /// An answer that must not wait was queued ([`Holder::prompt`]).
    prompt: bool,
}

impl Holder {
    fn new(cfg: Coalescing) -> Holder {
        Holder {
            cfg,
            answers: 0,
            only_answers: true,
            since: None,
            prompt: false,
        }
    }

    /// The answer of a command whose LU answers promptly
    /// ([`unifab_scsi_core::Dispatch::answer_promptly`]) is queued: what is
    /// queued goes out now.
    fn prompt(&mut self) {
        self.prompt = true;
    }

    /// A PDU was queued for the socket.
    fn queued(&mut self, pdu: &Pdu) {
        match pdu {
            Pdu::ScsiResponse(_) => self.answers += 1,
            Pdu::DataIn(d) => self.answers += u32::from(d.status_present),
            _ => self.only_answers = false,
        }
    }

    /// Whether to keep what is queued back for now, with `in_progress`
    /// commands still running. When not, what is queued goes out and the
    /// count starts again.
    fn hold(&mut self, now: Instant, may_hold: bool, in_progress: usize) -> bool {
        let batch = self.cfg.responses;
        let hold = batch > 0
            && may_hold
            && !self.prompt
            && self.only_answers
            && self.answers > 0
            && self.answers < batch
            && in_progress >= batch as usize
            && now.duration_since(*self.since.get_or_insert(now)) < self.cfg.max_delay;
        if !hold {
            self.answers = 0;
            self.only_answers = true;
            self.since = None;
            self.prompt = false;
        }
        hold
    }

    /// When what is held must go out.
    fn deadline(&self) -> Option<Instant> {
        self.since.map(|t| t + self.cfg.max_delay)
    }
}

/// Runs a session in full-feature phase until it ends. `rbuf` holds any
/// bytes already read past the login.
///
/// One task does everything for the connection: it reads when the socket
/// is readable, runs the tasks the session emits (their futures are polled
/// here, concurrently), and writes queued PDUs with non-blocking vectored
/// writes whenever there is output and the socket takes it, unless it is
/// holding answers back ([`Coalescing`]). No thread hand-off sits on the
/// per-command path.
pub(crate) async fn run_ffp(
    stream: TcpStream,
    rbuf: BytesMut,
    mut setup: FfpSetup,
) -> io::Result<()> {
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
    let scsi = setup.scsi.clone();
    let mut running: FuturesUnordered<Keyed<u32, TaskResult>> = FuturesUnordered::new();
    let mut tmfs: FuturesUnordered<Keyed<u32, TmfResponse>> = FuturesUnordered::new();
    let mut arena = BytesMut::with_capacity(8192);
    let mut out = OutQueue::default();
    let mut shutting_down: Option<Instant> = None;
    let mut close_after_flush = false;
    let mut eof = false;
    let mut end_reason = String::new();
    let mut holder = Holder::new(setup.limits.coalescing);
    let mut holding = false;
    // Commands in progress whose answers go out as they complete (their
    // LU answers promptly): they count for no batch, and their answers
    // are never held.
    let mut prompt: HashSet<u32> = HashSet::new();

    // Bytes read during login beyond the final Login Request.
    let mut pending_input = !rbuf.is_empty();
    let mut rx = Receiver::new(framer, rbuf);

    'outer: loop {
        if pending_input {
            pending_input = false;
            let now = Instant::now();
            while let Some(decoded) = rx.next() {
                if let Err(reason) = deliver(&mut session, now, decoded) {
                    end_reason = reason;
                    break 'outer;
                }
            }
            // Do not keep a large buffer around for an idle session.
            rx.shrink_when_empty(64 * 1024);
        }
        // Hand out work.
        while let Some(ev) = session.poll_event() {
            match ev {
                Event::Execute { itt, task } => {
                    setup
                        .info
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .commands += 1;
                    if scsi.answer_promptly(task.lun) {
                        prompt.insert(itt);
                    }
                    let fut = scsi.dispatch(task);
                    running.push(Keyed::new(itt, fut));
                }
                Event::TaskManagement { itt, request } => {
                    let fut = scsi.task_management(request);
                    tmfs.push(Keyed::new(itt, fut));
                }
                Event::Text { itt, data } => {
                    let answer = (setup.text)(&data).unwrap_or_default();
                    session.text_response(itt, answer);
                }
                Event::TargetColdReset => {
                    (setup.cold_reset)();
                }
                Event::Close(reason) => {
                    if matches!(reason, crate::target::CloseReason::Logout) {
                        // Before the logout is answered: what the nexus's
                        // end releases beyond this process (a cluster's
                        // RESERVE(6)) is released.
                        scsi.nexus_closing(&setup.nexus).await;
                    }
                    end_reason = format!("{reason:?}");
                    close_after_flush = true;
                }
            }
        }
        // Tasks that finish on their first poll (RAM-backed reads and
        // writes) complete here, before anything is written, so their
        // responses share one vectored write.
        while let Some(Some((itt, result))) = futures_util::FutureExt::now_or_never(running.next())
        {
            if !prompt.is_empty() && prompt.remove(&itt) {
                holder.prompt();
            }
            session.complete_task(itt, result);
        }
        let now = Instant::now();
        // Bytes the socket did not take last time go out with the rest.
        let stalled = !out.is_empty() && !holding;
        while let Some(out_pdu) = session.poll_transmit() {
            holder.queued(&out_pdu.pdu);
            encode_out(&out_pdu, setup.digests, &mut arena, &mut out);
        }
        let may_hold = !stalled && !eof && !close_after_flush && shutting_down.is_none();
        holding = holder.hold(now, may_hold, running.len().saturating_sub(prompt.len()));
        let flushed = if holding {
            Ok(false)
        } else {
            out.flush(&stream)
        };
        match flushed {
            Ok(_) => {}
            Err(e) => {
                end_reason = format!("write failed: {e}");
                break 'outer;
            }
        }
        if close_after_flush && out.is_empty() {
            break 'outer;
        }
        if eof && running.is_empty() && tmfs.is_empty() {
            end_reason = "peer closed the connection".into();
            break 'outer;
        }

        let timeout = session
            .poll_timeout()
            .into_iter()
            .chain(shutting_down)
            .chain(holder.deadline().filter(|_| holding))
            .min();
        let sleep = async move {
            match timeout {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        let want_write = !out.is_empty() && !holding;
        let can_read = !eof && !close_after_flush && out.bytes < OUT_QUEUE_LIMIT;

        tokio::select! {
            biased;
            Some((itt, result)) = running.next(), if !running.is_empty() => {
                if !prompt.is_empty() && prompt.remove(&itt) {
                    holder.prompt();
                }
                session.complete_task(itt, result);
            }
            Some((itt, response)) = tmfs.next(), if !tmfs.is_empty() => {
                session.complete_tmf(itt, response);
            }
            r = stream.writable(), if want_write => {
                if let Err(e) = r {
                    end_reason = format!("socket: {e}");
                    break 'outer;
                }
            }
            r = stream.readable(), if can_read => {
                if let Err(e) = r {
                    end_reason = format!("socket: {e}");
                    break 'outer;
                }
                // Drain the socket (up to a limit) before the PDUs are
                // handled, so the answers to every command that arrived
                // together leave in one vectored write: at queue depth the
                // initiator's commands arrive one segment at a time, and
                // answering each before the next read costs a write per
                // command.
                match rx.read_ready(&stream) {
                    Ok(reads) => {
                        eof |= reads.eof;
                        pending_input |= reads.got;
                    }
                    Err(e) => {
                        end_reason = format!("read failed: {e}");
                        break 'outer;
                    }
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
            Ok(()) = setup.logout.changed(), if shutting_down.is_none() => {
                session.request_logout(2);
                shutting_down = Some(Instant::now() + Duration::from_secs(5));
            }
        }
    }

    debug!(nexus = ?setup.nexus, reason = %end_reason, "connection ends");
    session.abort_all();
    // Let in-flight tasks finish: they hold LU resources (and a write in
    // progress must reach the backend or not, not half).
    while running.next().await.is_some() {}
    while tmfs.next().await.is_some() {}
    // Last words (a Logout Response, a Reject) go out if the peer takes
    // them within a second.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while !out.is_empty() {
            if stream.writable().await.is_err() || out.flush(&stream).is_err() {
                break;
            }
        }
    })
    .await;
    let mut stream = stream;
    let _ = stream.shutdown().await;
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
    /// with its probe descriptor ([`SessionHandle::probe`]) and a
    /// connection-limit permit.
    ///
    /// Every descriptor a connection needs is taken here, in one task, so
    /// that running out shows up here: a connection whose probe cannot be
    /// made is refused on its own socket.
    pub(crate) async fn accept_loop<F>(
        self,
        shared: Arc<Shared>,
        limit: Arc<Semaphore>,
        mut shutdown: watch::Receiver<bool>,
        mut control: tokio::sync::mpsc::UnboundedReceiver<PortalCmd>,
        serve: F,
    ) where
        F: Fn(TcpStream, socket2::Socket, SocketAddr, tokio::sync::OwnedSemaphorePermit)
            + Send
            + Sync
            + 'static,
    {
        let serve = Arc::new(serve);
        let mut tasks = Vec::new();
        let mut stops: HashMap<SocketAddr, watch::Sender<bool>> = HashMap::new();
        let server_down = shutdown.clone();
        let start = |l: TcpListener,
                     tasks: &mut Vec<tokio::task::JoinHandle<()>>,
                     stops: &mut HashMap<SocketAddr, watch::Sender<bool>>| {
            let (tx, rx) = watch::channel(false);
            if let Ok(a) = l.local_addr() {
                stops.insert(a, tx);
            }
            tasks.push(tokio::spawn(acceptor(
                l,
                shared.clone(),
                limit.clone(),
                serve.clone(),
                server_down.clone(),
                rx,
            )));
        };
        for l in self.listeners {
            start(l, &mut tasks, &mut stops);
        }
        loop {
            tokio::select! {
                cmd = control.recv() => match cmd {
                    Some(PortalCmd::Add(l)) => start(l, &mut tasks, &mut stops),
                    Some(PortalCmd::Remove(a)) => {
                        if let Some(stop) = stops.remove(&a) {
                            stop.send_replace(true);
                        }
                    }
                    None => {
                        let _ = shutdown.changed().await;
                        break;
                    }
                },
                _ = shutdown.changed() => break,
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// A change of the portals while the server runs.
#[derive(Debug)]
pub(crate) enum PortalCmd {
    /// Accept on this listener too.
    Add(TcpListener),
    /// Stop accepting on the listener bound to this address (its sessions
    /// go on).
    Remove(SocketAddr),
}

/// Accepts on one listener until the server shuts down or the portal is
/// removed (`stop`).
async fn acceptor<F>(
    l: TcpListener,
    shared: Arc<Shared>,
    limit: Arc<Semaphore>,
    serve: Arc<F>,
    mut shutdown: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) where
    F: Fn(TcpStream, socket2::Socket, SocketAddr, tokio::sync::OwnedSemaphorePermit)
        + Send
        + Sync
        + 'static,
{
    // A descriptor held in reserve: when the process runs out
    // (EMFILE, ENFILE), accept fails at once for as long as a
    // connection waits in the kernel's queue. Closing the
    // reserve lets that connection in to be refused (a Login
    // Response, Out of resources) instead of spinning on it or
    // leaving the initiator waiting.
    let mut reserve = open_reserve();
    let mut exhausted = Exhausted::default();
    loop {
        if reserve.is_none() {
            reserve = open_reserve();
        }
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, peer)) => {
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    admit(s, peer, &limit, &shared, &mut exhausted, &*serve);
                }
                Err(e) if is_out_of_fds(&e) => {
                    exhausted.note(&e);
                    if reserve.take().is_some() {
                        if let Ok((s, _)) = l.accept().await {
                            exhausted.refused += 1;
                            shared.connections.fetch_add(1, Ordering::Relaxed);
                            shared.login_failures.fetch_add(1, Ordering::Relaxed);
                            tokio::spawn(refuse_login(s));
                        }
                    } else {
                        // The reserve is lent to a refusal:
                        // wait for it rather than spin.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
            () = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
    }
}

/// Hands an accepted connection to `serve` with a connection-limit permit
/// and its probe descriptor, or refuses it (Out of resources) when either
/// is not to be had.
fn admit<F>(
    s: TcpStream,
    peer: SocketAddr,
    limit: &Arc<Semaphore>,
    shared: &Shared,
    exhausted: &mut Exhausted,
    serve: &F,
) where
    F: Fn(TcpStream, socket2::Socket, SocketAddr, tokio::sync::OwnedSemaphorePermit),
{
    let Ok(permit) = limit.clone().try_acquire_owned() else {
        warn!(%peer, "connection limit reached; login refused (out of resources)");
        shared.login_failures.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(refuse_login(s));
        return;
    };
    match probe_of(&s) {
        Ok(probe) => serve(s, probe, peer, permit),
        Err(e) => {
            if is_out_of_fds(&e) {
                exhausted.note(&e);
                exhausted.refused += 1;
            } else {
                warn!(%peer, error = %e, "cannot duplicate the connection's descriptor; login refused (out of resources)");
            }
            shared.login_failures.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse_login(s));
        }
    }
}

/// Whether an accept failed for want of file descriptors.
fn is_out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A second descriptor of an accepted connection's socket.
fn probe_of(s: &TcpStream) -> io::Result<socket2::Socket> {
    use std::os::fd::AsFd;
    Ok(socket2::Socket::from(s.as_fd().try_clone_to_owned()?))
}

/// A descriptor to give back when the process runs out.
fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Running out of descriptors, logged once and then every 10 s with the
/// count of refusals, not once per failed accept.
#[derive(Default)]
struct Exhausted {
    logged: Option<Instant>,
    refused: u64,
}

impl Exhausted {
    fn note(&mut self, e: &io::Error) {
        if self
            .logged
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        self.logged = Some(Instant::now());
        tracing::error!(
            error = %e,
            refused_so_far = self.refused,
            "out of file descriptors: new logins are refused (Out of resources) until connections close; raise the limit (LimitNOFILE= or ulimit -n)"
        );
    }
}

/// Answers a connection that cannot be served: its Login Request gets a
/// Login Response with status Out of resources (RFC 7143 §11.13.5, 0302h)
/// and the connection closes. Anything else, or nothing within 2 s, and it
/// closes without a word.
pub(crate) async fn refuse_login(mut s: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut bhs = [0u8; crate::wire::BHS_LEN];
        s.read_exact(&mut bhs).await.ok()?;
        let Ok(Pdu::LoginRequest(req)) =
            crate::wire::Bhs::new_checked(&bhs[..]).and_then(|h| Pdu::parse(&h))
        else {
            return None;
        };
        let rsp = Pdu::LoginResponse(crate::wire::pdu::LoginResponse {
            transit: false,
            continue_flag: false,
            csg: req.csg,
            nsg: req.nsg,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: 0,
            itt: req.itt,
            stat_sn: 0,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn,
            status_class: 0x03,
            status_detail: 0x02,
        });
        let bytes = crate::wire::encode_pdu(&rsp, &[], &[], Digests::default()).ok()?;
        s.write_all(&bytes).await.ok()?;
        s.shutdown().await.ok()
    })
    .await;
}

#[cfg(test)]
mod coalescing_tests {
    use super::*;
    use crate::wire::pdu::{DataIn, R2t, ScsiResponse};

    fn holder(responses: u32, max_delay_ms: u64) -> Holder {
        Holder::new(Coalescing {
            responses,
            max_delay: Duration::from_millis(max_delay_ms),
        })
    }

    fn answer() -> Pdu {
        Pdu::ScsiResponse(ScsiResponse::default())
    }

    fn data_in(status: bool) -> Pdu {
        Pdu::DataIn(DataIn {
            status_present: status,
            ..DataIn::default()
        })
    }

    #[test]
    fn answers_are_held_until_a_batch_is_ready() {
        let t0 = Instant::now();
        let mut h = holder(4, 1000);
        for i in 0..3 {
            h.queued(&answer());
            assert!(h.hold(t0, true, 20), "answer {i} of a batch of 4 is held");
        }
        // Data-In without status is part of an answer, not one.
        h.queued(&data_in(false));
        assert!(h.hold(t0, true, 20));
        h.queued(&data_in(true));
        assert!(!h.hold(t0, true, 20), "the fourth answer sends the batch");
        // The count starts again.
        h.queued(&answer());
        assert!(h.hold(t0, true, 20));
    }

    #[test]
    fn nothing_is_held_past_the_delay() {
        let t0 = Instant::now();
        let mut h = holder(16, 1);
        h.queued(&answer());
        assert!(h.hold(t0, true, 20));
        assert_eq!(h.deadline(), Some(t0 + Duration::from_millis(1)));
        h.queued(&answer());
        assert!(h.hold(t0 + Duration::from_micros(999), true, 20));
        assert!(!h.hold(t0 + Duration::from_millis(1), true, 20));
        assert_eq!(h.deadline(), None);
    }

    #[test]
    fn a_prompt_answer_sends_what_is_held_and_holds_nothing_itself() {
        let t0 = Instant::now();
        let mut h = holder(4, 1000);
        h.queued(&answer());
        assert!(h.hold(t0, true, 20));
        h.prompt();
        h.queued(&answer());
        assert!(!h.hold(t0, true, 20), "a prompt answer must not wait");
        h.queued(&answer());
        assert!(h.hold(t0, true, 20), "a new batch after it went");
    }

    #[test]
    fn anything_but_an_answer_sends_at_once() {
        let t0 = Instant::now();
        let mut h = holder(16, 1000);
        h.queued(&answer());
        assert!(h.hold(t0, true, 20));
        h.queued(&Pdu::R2t(R2t::default()));
        assert!(!h.hold(t0, true, 20), "an R2T must not wait");
        h.queued(&answer());
        assert!(h.hold(t0, true, 20), "a new batch after the R2T went");
    }

    #[test]
    fn shallow_queues_off_and_closing_connections_are_never_held() {
        let t0 = Instant::now();
        let mut h = holder(16, 1000);
        h.queued(&answer());
        assert!(!h.hold(t0, true, 15), "15 in progress: fewer than a batch");
        h.queued(&answer());
        assert!(!h.hold(t0, false, 20), "the connection is closing");
        assert!(!h.hold(t0, true, 20), "nothing queued: nothing to hold");
        let mut off = Holder::new(Coalescing::OFF);
        off.queued(&answer());
        assert!(!off.hold(t0, true, 1000));
    }
}

#[cfg(test)]
mod session_table_tests {
    use super::*;

    /// A session whose peer has closed is ended by the next login's sweep;
    /// a live one, and one with unread data before its end, are not.
    #[test]
    fn a_login_ends_sessions_whose_peer_is_gone_and_only_those() {
        use std::io::Write;
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared::new();
        let mut clients = Vec::new();
        let mut kills = Vec::new();
        for isid in 0..3u8 {
            let client = TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().unwrap();
            let (kill, killed) = watch::channel(false);
            let (_done_tx, done) = watch::channel(false);
            shared.sessions.lock().unwrap().insert(
                ("t".into(), "i".into(), [0, 0, 0, 0, 0, isid]),
                SessionHandle {
                    tsih: u16::from(isid) + 1,
                    kill,
                    info: Arc::new(Mutex::new(SessionInfo {
                        target: "t".into(),
                        initiator: "i".into(),
                        isid: String::new(),
                        tsih: u16::from(isid) + 1,
                        peer: String::new(),
                        digests: String::new(),
                        commands: 0,
                    })),
                    done,
                    logout: watch::channel(false).0,
                    probe: socket2::Socket::from(std::os::fd::OwnedFd::from(server)),
                },
            );
            clients.push(client);
            kills.push(killed);
        }
        // Session 0's peer closes; session 1's peer sends a byte and then
        // closes (its task has data to read first); session 2 stays.
        let mut c1 = clients.remove(1);
        c1.write_all(&[0]).unwrap();
        drop(c1);
        drop(clients.remove(0));
        // Loopback delivers the FIN before close returns.
        assert_eq!(shared.end_dead_sessions("T").len(), 1);
        assert!(*kills[0].borrow());
        assert!(!*kills[1].borrow());
        assert!(!*kills[2].borrow());
        assert!(shared.end_dead_sessions("other").is_empty());
    }
}
