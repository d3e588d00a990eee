//! The tokio driver of the iSCSI initiator.
//!
//! [`IscsiInitiator`] is one session to one target: a background task
//! connects, logs in (None, CHAP or mutual CHAP), runs the sans-IO
//! [`Session`] on the connection and, when the connection ends, logs in
//! again with the same ISID (session reinstatement) after a backoff,
//! re-sending what is safe to re-send. It implements
//! [`unifab_scsi_core::Initiator`], so a [`RemoteLu`](unifab_scsi_core::RemoteLu)
//! can sit on it, and it is usable on its own:
//!
//! ```no_run
//! use bytes::Bytes;
//! use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiator};
//! use unifab_scsi_core::initiator::{Initiator, Request};
//! use unifab_scsi_core::Lun;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = InitiatorConfig::new("iqn.2026-11.io.example:host");
//! let ini = IscsiInitiator::start(cfg, "192.0.2.10:3260", "iqn.2001-04.com.example:disk");
//! // READ CAPACITY(10) of LUN 0.
//! let cdb = Bytes::from_static(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
//! let result = ini.submit(Request::new(Lun(0), cdb, 8)).outcome.await?;
//! println!("status {:?}, {} bytes", result.status, result.data_in_total());
//! ini.close();
//! # Ok(()) }
//! ```
//!
//! One task per session; inside it a reader and a writer run concurrently
//! on the connection. The session sits behind a mutex that is never held
//! across an `.await`; outcomes are delivered through oneshot channels
//! after the lock is released. PDUs go out with vectored writes (header,
//! then the caller's data slices as they are); Data-In stays as slices of
//! the receive buffer.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

use unifab_scsi_core::initiator::{
    Initiator, InitiatorError, InitiatorFactory, Outcome, Request, Submitted,
};
use unifab_scsi_core::{BoxFuture, ItNexus, Lun, TmfFunction, TmfResponse, TransportId};

use super::session::{ConnectionError, Event, OutPdu, Session, SessionConfig, StartSn};
use crate::chap::{ChapAlgorithm, ChapConfig, ChapCredentials};
use crate::ffp::FfpParams;
use crate::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginError, LoginOutcome, LoginStatus,
};
use crate::negotiate::{Digest, NegotiationLimits, Role};
use crate::sock::{ReadOutcome, RecvAlloc, make_room, read_some};
use crate::text::{TextAccumulator, TextParams};
use crate::wire::{
    BHS_LEN, Check, Digests, Framer, LogoutReason, LogoutRequest, Pdu, PduFrame, TextRequest,
    WireError, digest, encode_header, encode_pdu, frame::padding,
};

/// How an initiator logs in and behaves.
#[derive(Debug, Clone)]
pub struct InitiatorConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias.
    pub initiator_alias: Option<String>,
    /// ISID of the session; a reconnect reuses it (session reinstatement).
    /// Two sessions to one target must not share InitiatorName and ISID:
    /// the second login ends the first.
    pub isid: [u8; 6],
    /// Our CHAP name and secret (CHAP is offered when set).
    pub chap: Option<ChapCredentials>,
    /// The target's CHAP name and secret: with it the target must prove
    /// itself too (mutual CHAP).
    pub mutual_chap: Option<ChapCredentials>,
    /// CHAP algorithms and challenge length.
    pub chap_config: ChapConfig,
    /// What we offer at login (digests, data segment and burst lengths,
    /// ImmediateData, InitialR2T, …).
    pub limits: NegotiationLimits,
    /// Command timeout, NOP keep-alive, queue bound, re-send attempts.
    pub session: SessionConfig,
    /// A TCP connect plus login may take this long.
    pub login_timeout: Duration,
    /// First wait before logging in again after a failure (doubles up to
    /// `reconnect_max`).
    pub reconnect_min: Duration,
    /// Longest wait between login attempts.
    pub reconnect_max: Duration,
    /// Busy polling at low queue depth (zero: off, the default). While at
    /// most `busy_poll_depth` commands are held and a command went out or
    /// a PDU came in less than this long ago, the connection's reader
    /// polls its socket instead of sleeping until the kernel wakes it: the
    /// reply is picked up without a thread wake-up (tens of µs on a
    /// virtual machine), at the price of a core kept busy during
    /// low-depth I/O. At higher depths replies come in batches and the
    /// reader never waits long, so it does not spin.
    pub busy_poll: Duration,
    /// See `busy_poll`.
    pub busy_poll_depth: usize,
}

impl InitiatorConfig {
    /// Defaults for an initiator named `initiator_name`: no CHAP, digests
    /// accepted but not preferred, ImmediateData=Yes, InitialR2T=No,
    /// 256 KiB receive segments, 1 MiB bursts, 256 KiB first burst.
    /// The ISID is derived from the name ([`stable_isid`]).
    pub fn new(initiator_name: impl Into<String>) -> InitiatorConfig {
        let initiator_name = initiator_name.into();
        InitiatorConfig {
            isid: stable_isid(&[&initiator_name]),
            initiator_name,
            initiator_alias: None,
            chap: None,
            mutual_chap: None,
            chap_config: ChapConfig::default(),
            limits: NegotiationLimits {
                initial_r2t: false,
                immediate_data: true,
                max_recv_data_segment_length: 262_144,
                max_burst_length: 1 << 20,
                first_burst_length: 262_144,
                ..NegotiationLimits::default()
            },
            session: SessionConfig::default(),
            login_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(2),
            busy_poll: Duration::ZERO,
            busy_poll_depth: 1,
        }
    }

    /// Offer (or insist on) CRC32C header and data digests.
    pub fn digests(mut self, header: &[Digest], data: &[Digest]) -> Self {
        self.limits.header_digests = header.to_vec();
        self.limits.data_digests = data.to_vec();
        self
    }
}

/// A completion channel kept in the sans-IO session.
#[derive(Debug)]
enum Waiter {
    Cmd(oneshot::Sender<Outcome>),
    Tmf(oneshot::Sender<Result<TmfResponse, InitiatorError>>),
}

/// The session and, while a connection is up, what writes to it.
#[derive(Debug)]
struct Core {
    session: Session<Waiter>,
    out: Option<Outbox>,
}

impl std::ops::Deref for Core {
    type Target = Session<Waiter>;
    fn deref(&self) -> &Session<Waiter> {
        &self.session
    }
}

impl std::ops::DerefMut for Core {
    fn deref_mut(&mut self) -> &mut Session<Waiter> {
        &mut self.session
    }
}

/// The connection's send side. Whoever holds the lock and finds the socket
/// idle writes what the session has to send at once, without waiting
/// (`try_write_vectored`): a command usually leaves from the submitting
/// thread, and R2T data from the reader, with no task hand-off. When the
/// socket is full, the writer task takes over (`busy`) and the others only
/// queue behind it, keeping the byte order.
#[derive(Debug)]
struct Outbox {
    wr: Arc<OwnedWriteHalf>,
    digests: Digests,
    arena: BytesMut,
    /// Encoded, not yet written, in order.
    pending: VecDeque<Bytes>,
    /// The writer task is writing; others append to `pending` only.
    busy: bool,
    /// The writer task was asked to flush.
    scheduled: bool,
    /// A write failed: the connection is over.
    failed: bool,
    /// Why the connection was failed here, when no write failed.
    fail_reason: Option<&'static str>,
    /// Bytes of answers to the target's pings (NOP-Out echoes) queued
    /// since the socket last took everything.
    echo_backlog: usize,
}

impl Outbox {
    /// The send side of a new connection: nothing queued.
    fn new(wr: OwnedWriteHalf, digests: Digests) -> Outbox {
        Outbox {
            wr: Arc::new(wr),
            digests,
            arena: BytesMut::with_capacity(16384),
            pending: VecDeque::new(),
            busy: false,
            scheduled: false,
            failed: false,
            fail_reason: None,
            echo_backlog: 0,
        }
    }
}

const IOV_MAX: usize = 64;

/// The most a target's pings may make us queue while it reads nothing we
/// send: each NOP-In with a Target Transfer Tag must be answered with its
/// data, so a target that pings without reading would otherwise grow the
/// queue without bound (and each NOP-In resets the idle timer that would
/// make us ping it and find it dead).
pub(crate) const MAX_ECHO_BACKLOG: usize = 1 << 20;

/// Up to this many outstanding commands, a submitted command is written by
/// the submitting thread at once; beyond, the writer task batches.
const DIRECT_SEND_MAX: usize = 2;

impl Core {
    /// Asks the writer task to send what is queued (once per batch): true
    /// when it has to be woken.
    fn schedule_write(&mut self) -> bool {
        match self.out.as_mut() {
            Some(o) if !o.scheduled && !o.busy => {
                o.scheduled = true;
                true
            }
            _ => false,
        }
    }

    /// Encodes what the session has to send and writes what the socket
    /// takes now. True when the writer task must be woken (socket full or
    /// failed).
    fn flush(&mut self) -> bool {
        let Some(o) = self.out.as_mut() else {
            return false;
        };
        while let Some(pdu) = self.session.poll_transmit() {
            if o.busy && matches!(&pdu.pdu, Pdu::NopOut(n) if n.itt == crate::ffp::RESERVED_TAG) {
                o.echo_backlog += BHS_LEN + pdu.data.len();
                if o.echo_backlog > MAX_ECHO_BACKLOG {
                    if !o.failed {
                        warn!(
                            queued = o.echo_backlog,
                            "the target pings but does not read what we send; dropping the connection"
                        );
                        o.failed = true;
                        o.fail_reason = Some("the target pings but does not read what we send");
                    }
                    continue;
                }
            }
            encode_out(&pdu, o.digests, &mut o.arena, &mut o.pending);
        }
        if o.arena.capacity() < 1024 {
            o.arena = BytesMut::with_capacity(16384);
        }
        if o.failed {
            return true;
        }
        if o.busy || o.pending.is_empty() {
            return o.busy;
        }
        loop {
            let mut iov = [io::IoSlice::new(&[]); IOV_MAX];
            let mut n = 0;
            for (slot, c) in iov.iter_mut().zip(o.pending.iter()) {
                *slot = io::IoSlice::new(c);
                n += 1;
            }
            match o.wr.try_write_vectored(&iov[..n]) {
                Ok(written) => {
                    advance(&mut o.pending, written);
                    if o.pending.is_empty() {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    o.busy = true;
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    o.failed = true;
                    return true;
                }
            }
        }
    }
}

/// Drops `n` written bytes from the front of `chunks`.
fn advance(chunks: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = chunks.front_mut() else {
            return;
        };
        if n >= front.len() {
            n -= front.len();
            chunks.pop_front();
        } else {
            let _ = front.split_to(n);
            return;
        }
    }
}

#[derive(Debug)]
struct Shared {
    session: Mutex<Core>,
    /// The writer task must take over.
    tx_wake: Notify,
    /// State changes for the driver (close).
    driver_wake: Notify,
    remote: String,
    connected: AtomicBool,
    logins: AtomicU64,
    connected_notify: Notify,
    /// The last failure, and when it happened.
    last_error: Mutex<Option<(String, Instant)>>,
    digests: Mutex<Option<Digests>>,
    /// `InitiatorConfig::busy_poll` and `busy_poll_depth`.
    busy_poll: Duration,
    busy_poll_depth: usize,
    /// Nanoseconds from `born` to the last command submitted, session
    /// call or PDU received (for busy polling).
    active_at: AtomicU64,
    born: Instant,
    /// Nanoseconds from `born` to the last change of `connected`.
    changed_at: AtomicU64,
    /// InitiatorName and ISID the session logs in with.
    initiator_name: String,
    isid: [u8; 6],
}

impl Shared {
    fn set_connected(&self, up: bool) {
        let ns = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.changed_at.store(ns, Ordering::Relaxed);
        self.connected.store(up, Ordering::Release);
    }

    fn touch(&self) {
        if !self.busy_poll.is_zero() {
            let ns = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.active_at.store(ns, Ordering::Relaxed);
        }
    }

    /// Whether the reader should poll rather than sleep now.
    fn spinning(&self) -> bool {
        let since = Duration::from_nanos(
            u64::try_from(self.born.elapsed().as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_sub(self.active_at.load(Ordering::Relaxed)),
        );
        since < self.busy_poll
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the session, sends what it produced, then delivers its
    /// outcomes outside the lock.
    fn with<R>(&self, f: impl FnOnce(&mut Session<Waiter>) -> R) -> R {
        let mut events = Vec::new();
        self.touch();
        let (r, wake) = {
            let mut s = self.lock();
            let r = f(&mut s.session);
            while let Some(e) = s.poll_event() {
                events.push(e);
            }
            (r, s.flush())
        };
        deliver(events);
        if wake {
            self.tx_wake.notify_one();
        }
        r
    }

    fn set_error(&self, e: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some((e, Instant::now()));
    }
}

fn deliver(events: Vec<Event<Waiter>>) {
    for e in events {
        match e {
            Event::Command {
                token: Waiter::Cmd(tx),
                outcome,
            } => {
                let _ = tx.send(outcome);
            }
            Event::Tmf {
                token: Waiter::Tmf(tx),
                result,
            } => {
                let _ = tx.send(result);
            }
            _ => {}
        }
    }
}

/// One iSCSI session to one target, reconnecting as needed. Cheap to
/// clone; the session ends when [`Initiator::close`] is called (or every
/// handle is dropped).
#[derive(Debug, Clone)]
pub struct IscsiInitiator {
    shared: Arc<Shared>,
    _guard: Arc<DropGuard>,
}

#[derive(Debug)]
struct DropGuard(Arc<Shared>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let now = Instant::now();
        self.0.with(|s| s.close(now));
        self.0.driver_wake.notify_one();
    }
}

impl IscsiInitiator {
    /// Starts a session to `target` at `portal` (`host:port`). Returns at
    /// once; the login happens in the background and commands queue until
    /// it succeeds (or their timeout passes). Must be called inside a tokio
    /// runtime.
    pub fn start(cfg: InitiatorConfig, portal: &str, target: &str) -> IscsiInitiator {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            session: Mutex::new(Core {
                session: Session::new(cfg.session.clone(), now),
                out: None,
            }),
            tx_wake: Notify::new(),
            driver_wake: Notify::new(),
            remote: format!("iscsi://{portal}/{target}"),
            connected: AtomicBool::new(false),
            logins: AtomicU64::new(0),
            connected_notify: Notify::new(),
            last_error: Mutex::new(None),
            digests: Mutex::new(None),
            busy_poll: cfg.busy_poll,
            busy_poll_depth: cfg.busy_poll_depth,
            active_at: AtomicU64::new(0),
            born: now,
            changed_at: AtomicU64::new(0),
            initiator_name: cfg.initiator_name.clone(),
            isid: cfg.isid,
        });
        tokio::spawn(drive(
            shared.clone(),
            Arc::new(cfg),
            portal.to_string(),
            target.to_string(),
        ));
        IscsiInitiator {
            _guard: Arc::new(DropGuard(shared.clone())),
            shared,
        }
    }

    /// Waits until the session is in full feature phase, or fails with the
    /// last login error after `timeout`.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<(), InitiatorError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.connected_notify.notified();
            if self.is_connected() {
                return Ok(());
            }
            if self.shared.lock().is_closed() {
                return Err(InitiatorError::Closed);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let reason = self
                    .last_error()
                    .unwrap_or_else(|| format!("no login within {timeout:?}"));
                return Err(InitiatorError::Unreachable { reason });
            }
        }
    }

    /// True while a connection is in full feature phase.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    /// How many logins succeeded so far (1 + reconnections).
    pub fn logins(&self) -> u64 {
        self.shared.logins.load(Ordering::Relaxed)
    }

    /// Why the last connection or login attempt failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(e, _)| e.clone())
    }

    /// The digests the last login negotiated (`None` before the first).
    pub fn digests(&self) -> Option<Digests> {
        *self
            .shared
            .digests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Commands queued or outstanding.
    pub fn commands(&self) -> usize {
        self.shared.lock().command_count()
    }

    /// A snapshot of the session for an operator (`unifab show remotes`).
    pub fn status(&self) -> SessionStatus {
        SessionStatus::of(&self.shared)
    }
}

/// What an operator sees of one initiator session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStatus {
    /// `iscsi://PORTAL/TARGET`.
    pub remote: String,
    /// The InitiatorName it logs in with.
    pub initiator_name: String,
    /// Its ISID.
    pub isid: [u8; 6],
    /// In full feature phase now.
    pub connected: bool,
    /// How long it has been in that state (since it was started, if it
    /// never logged in).
    pub for_how_long: Duration,
    /// Logins so far (1 + reconnections).
    pub logins: u64,
    /// The digests the last login negotiated.
    pub digests: Option<Digests>,
    /// Commands queued or outstanding.
    pub commands: usize,
    /// Why the last connection or login attempt failed, if one did. It is
    /// kept after a later login succeeds.
    pub last_error: Option<String>,
    /// How long ago that failure was.
    pub last_error_age: Option<Duration>,
    /// Closed for good.
    pub closed: bool,
}

impl SessionStatus {
    fn of(shared: &Shared) -> SessionStatus {
        let changed = Duration::from_nanos(shared.changed_at.load(Ordering::Relaxed));
        let (commands, closed) = {
            let core = shared.lock();
            (core.command_count(), core.is_closed())
        };
        let (last_error, last_error_age) = shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(e, at)| (e.clone(), at.elapsed()))
            .unzip();
        SessionStatus {
            remote: shared.remote.clone(),
            initiator_name: shared.initiator_name.clone(),
            isid: shared.isid,
            connected: shared.connected.load(Ordering::Acquire),
            for_how_long: shared.born.elapsed().saturating_sub(changed),
            logins: shared.logins.load(Ordering::Relaxed),
            digests: *shared.digests.lock().unwrap_or_else(|p| p.into_inner()),
            commands,
            last_error,
            last_error_age,
            closed,
        }
    }
}

/// The future of a submitted command; dropping it abandons the command.
struct OutcomeFuture {
    rx: oneshot::Receiver<Outcome>,
    shared: Arc<Shared>,
    tag: u64,
    done: bool,
}

impl std::future::Future for OutcomeFuture {
    type Output = Outcome;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Outcome> {
        match std::pin::Pin::new(&mut self.rx).poll(cx) {
            std::task::Poll::Ready(r) => {
                self.done = true;
                std::task::Poll::Ready(r.unwrap_or(Err(InitiatorError::Closed)))
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Drop for OutcomeFuture {
    fn drop(&mut self) {
        if !self.done {
            let now = Instant::now();
            let tag = self.tag;
            self.shared.with(|s| s.abandon(now, tag));
        }
    }
}

impl Initiator for IscsiInitiator {
    fn submit(&self, request: Request) -> Submitted {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        self.shared.touch();
        let r = {
            let mut s = self.shared.lock();
            s.submit(now, request, Waiter::Cmd(tx)).map(|tag| {
                // Alone on the wire: send now, from this thread (latency).
                // Under load: let the writer gather what the front end
                // hands over in the same turn into one write (syscalls).
                let wake = if s.outstanding() <= DIRECT_SEND_MAX {
                    s.flush()
                } else {
                    s.schedule_write()
                };
                (tag, wake)
            })
        };
        match r {
            Ok((tag, wake)) => {
                if wake {
                    self.shared.tx_wake.notify_one();
                }
                Submitted {
                    tag,
                    outcome: Box::pin(OutcomeFuture {
                        rx,
                        shared: self.shared.clone(),
                        tag,
                        done: false,
                    }),
                }
            }
            Err((e, _)) => Submitted::failed(e),
        }
    }

    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        self.shared
            .with(|s| s.task_management(now, lun, function, Waiter::Tmf(tx)));
        Box::pin(async move { rx.await.unwrap_or(Err(InitiatorError::Closed)) })
    }

    fn close(&self) {
        let now = Instant::now();
        self.shared.with(|s| s.close(now));
        self.shared.driver_wake.notify_one();
    }

    fn remote(&self) -> String {
        self.shared.remote.clone()
    }
}

// ---- the driver -------------------------------------------------------

/// Why a login attempt failed.
#[derive(Debug)]
struct LoginFailure {
    permanent: bool,
    reason: String,
    redirect: Option<String>,
}

impl LoginFailure {
    fn transient(reason: impl Into<String>) -> LoginFailure {
        LoginFailure {
            permanent: false,
            reason: reason.into(),
            redirect: None,
        }
    }
}

/// What a Login Response status means, for messages.
pub fn login_status_text(s: LoginStatus) -> &'static str {
    match s {
        LoginStatus::TARGET_MOVED_TEMPORARILY => "target moved temporarily",
        LoginStatus::TARGET_MOVED_PERMANENTLY => "target moved permanently",
        LoginStatus::INITIATOR_ERROR => "initiator error",
        LoginStatus::AUTHENTICATION_FAILURE => "authentication failure",
        LoginStatus::AUTHORIZATION_FAILURE => {
            "authorization failure (not allowed to access this target)"
        }
        LoginStatus::NOT_FOUND => "no such target",
        LoginStatus::TARGET_REMOVED => "target removed",
        LoginStatus::UNSUPPORTED_VERSION => "unsupported version",
        LoginStatus::TOO_MANY_CONNECTIONS => "too many connections",
        LoginStatus::MISSING_PARAMETER => "missing parameter",
        LoginStatus::CANT_INCLUDE_IN_SESSION => "cannot include in session",
        LoginStatus::SESSION_TYPE_NOT_SUPPORTED => "session type not supported",
        LoginStatus::SESSION_DOES_NOT_EXIST => "session does not exist",
        LoginStatus::INVALID_DURING_LOGIN => "invalid request during login",
        LoginStatus::TARGET_ERROR => "target error",
        LoginStatus::SERVICE_UNAVAILABLE => "service unavailable",
        LoginStatus::OUT_OF_RESOURCES => "out of resources",
        _ => "unknown status",
    }
}

impl From<LoginError> for LoginFailure {
    fn from(e: LoginError) -> LoginFailure {
        let reason = match &e {
            LoginError::TargetRejected(s) => format!(
                "the target refused the login: {} (status {:#06x})",
                login_status_text(*s),
                s.0
            ),
            other => format!("login failed: {other}"),
        };
        match e {
            LoginError::Redirected { address, .. } => LoginFailure {
                permanent: false,
                reason,
                redirect: Some(address),
            },
            // The target is busy or broken: try again later.
            LoginError::TargetRejected(s) if s.class() == 3 => LoginFailure::transient(reason),
            LoginError::TargetRejected(LoginStatus::TOO_MANY_CONNECTIONS) => {
                LoginFailure::transient(reason)
            }
            _ => LoginFailure {
                permanent: true,
                reason,
                redirect: None,
            },
        }
    }
}

/// A logged-in connection.
struct Connected {
    stream: TcpStream,
    rbuf: BytesMut,
    outcome: LoginOutcome,
    max_cmd_sn: u32,
}

/// Turns `host[:port][,tpgt]` (a TargetAddress) into `host:port`.
pub fn address_of(target_address: &str) -> String {
    let a = target_address
        .split(',')
        .next()
        .unwrap_or(target_address)
        .trim();
    if a.starts_with('[') {
        // [v6] or [v6]:port
        if a.ends_with(']') {
            format!("{a}:3260")
        } else {
            a.to_string()
        }
    } else if a.matches(':').count() > 1 {
        format!("[{a}]:3260")
    } else if a.contains(':') {
        a.to_string()
    } else {
        format!("{a}:3260")
    }
}

async fn send_login(stream: &mut TcpStream, pdu: &Pdu, data: &[u8]) -> Result<(), LoginFailure> {
    let wire = encode_pdu(pdu, &[], data, Digests::default())
        .map_err(|e| LoginFailure::transient(e.to_string()))?;
    stream
        .write_all(&wire)
        .await
        .map_err(|e| LoginFailure::transient(format!("write: {e}")))
}

async fn recv_frame(
    stream: &mut TcpStream,
    rbuf: &mut BytesMut,
    framer: &Framer,
) -> Result<PduFrame, LoginFailure> {
    loop {
        match framer.decode(rbuf) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(LoginFailure::transient(format!("framing: {e}"))),
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(8192);
        }
        match stream.read_buf(rbuf).await {
            Ok(0) => return Err(LoginFailure::transient("the target closed the connection")),
            Ok(_) => {}
            Err(e) => return Err(LoginFailure::transient(format!("read: {e}"))),
        }
    }
}

/// [`connect_and_login`], and once more offering only CHAP_A=5 (MD5) if a
/// CHAP login that offered more failed for good. tgtd 1.0.85 takes
/// CHAP_A=7 for SHA-1 (the IANA registry's 7 is SHA-256, 6 is SHA-1), so a
/// login that lets it pick 7 cannot succeed; MD5 is what every target
/// implements. On success `cfg` keeps the algorithms that worked, so later
/// reconnects go straight to them.
async fn login_with_fallback(
    cfg: &mut InitiatorConfig,
    addr: &str,
    target: Option<&str>,
) -> Result<Connected, LoginFailure> {
    match connect_and_login(cfg, addr, target).await {
        Err(f)
            if f.permanent
                && cfg.chap.is_some()
                && cfg.chap_config.algorithms.len() > 1
                && cfg.chap_config.algorithms.contains(&ChapAlgorithm::MD5) =>
        {
            let mut md5 = cfg.clone();
            md5.chap_config.algorithms = vec![ChapAlgorithm::MD5];
            debug!(reason = %f.reason, "CHAP login failed; trying again with MD5 only");
            let r = connect_and_login(&md5, addr, target).await;
            if r.is_ok() {
                *cfg = md5;
            }
            r
        }
        other => other,
    }
}

/// TCP connect and login. `target` `None` opens a discovery session.
async fn connect_and_login(
    cfg: &InitiatorConfig,
    addr: &str,
    target: Option<&str>,
) -> Result<Connected, LoginFailure> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| LoginFailure::transient(format!("connect {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let mut sm = InitiatorLogin::new(InitiatorLoginConfig {
        initiator_name: cfg.initiator_name.clone(),
        initiator_alias: cfg.initiator_alias.clone(),
        target_name: target.map(str::to_string),
        isid: cfg.isid,
        tsih: 0,
        cid: 0,
        itt: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
        chap: cfg.chap.clone().map(|c| (c, cfg.mutual_chap.clone())),
        chap_config: cfg.chap_config.clone(),
        limits: cfg.limits.clone(),
        session: None,
    })?;
    let first = sm.start()?;
    send_login(&mut stream, &Pdu::LoginRequest(first.header), &first.data).await?;
    let framer = Framer::default();
    let mut rbuf = BytesMut::with_capacity(16384);
    let mut rng: rand::rngs::StdRng = rand::make_rng();
    loop {
        let frame = recv_frame(&mut stream, &mut rbuf, &framer).await?;
        let Ok(Pdu::LoginResponse(rsp)) = frame.parse() else {
            return Err(LoginFailure::transient("expected a Login Response"));
        };
        if rsp.status_class >= 2 {
            // A refusal counts whatever else the header holds (tgtd zeroes
            // the ISID in its failure responses).
            return Err(LoginError::TargetRejected(LoginStatus::new(
                rsp.status_class,
                rsp.status_detail,
            ))
            .into());
        }
        match sm.handle(&rsp, &frame.data, &mut rng) {
            InitiatorStep::Send(p) => {
                send_login(&mut stream, &Pdu::LoginRequest(p.header), &p.data).await?;
            }
            InitiatorStep::Complete(outcome) => {
                return Ok(Connected {
                    stream,
                    rbuf,
                    outcome,
                    max_cmd_sn: rsp.max_cmd_sn,
                });
            }
            InitiatorStep::Failed(e) => return Err(e.into()),
        }
    }
}

/// Waits for `fut` while running the session's timers; `None` if the
/// session closed first.
async fn with_timers<F: std::future::Future>(shared: &Shared, fut: F) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        if shared.lock().is_closed() {
            return None;
        }
        let next = shared
            .lock()
            .poll_timeout()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1))
            .min(Instant::now() + Duration::from_secs(1));
        tokio::select! {
            r = &mut fut => return Some(r),
            _ = tokio::time::sleep_until(next.into()) => {
                let now = Instant::now();
                shared.with(|s| { let _ = s.handle_timeout(now); });
            }
            _ = shared.driver_wake.notified() => {}
        }
    }
}

async fn drive(shared: Arc<Shared>, cfg: Arc<InitiatorConfig>, portal: String, target: String) {
    let mut cfg = (*cfg).clone();
    let mut backoff = cfg.reconnect_min;
    let mut redirect: Option<String> = None;
    loop {
        if shared.lock().is_closed() {
            break;
        }
        let addr = redirect.take().unwrap_or_else(|| portal.clone());
        let login_timeout = cfg.login_timeout;
        let attempt = tokio::time::timeout(
            login_timeout,
            login_with_fallback(&mut cfg, &addr, Some(&target)),
        );
        let Some(result) = with_timers(&shared, attempt).await else {
            break;
        };
        let result = result.unwrap_or_else(|_| Err(LoginFailure::transient("login timed out")));
        let wait = match result {
            Ok(c) => {
                backoff = cfg.reconnect_min;
                let n = shared.logins.fetch_add(1, Ordering::Relaxed) + 1;
                info!(remote = %shared.remote, logins = n, digests = %c.outcome.digests, "iSCSI session in full feature phase");
                *shared.digests.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.outcome.digests);
                let now = Instant::now();
                let params = FfpParams::from_login(&c.outcome, Role::Initiator);
                let sn = StartSn {
                    cmd_sn: c.outcome.exp_cmd_sn,
                    max_cmd_sn: c.max_cmd_sn,
                    exp_stat_sn: c.outcome.next_stat_sn,
                };
                shared.with(|s| s.connected(now, params, sn));
                shared.set_connected(true);
                shared.connected_notify.notify_waiters();
                let end = run_connection(&shared, c).await;
                shared.set_connected(false);
                let now = Instant::now();
                shared.with(|s| s.connection_lost(now));
                match end {
                    ConnectionEnd::Session(ConnectionError::LoggedOut) => {
                        debug!(remote = %shared.remote, "logged out");
                        Duration::ZERO
                    }
                    ConnectionEnd::Session(ConnectionError::DropRequested { time2wait }) => {
                        shared.set_error("the target dropped the connection".into());
                        Duration::from_secs(u64::from(time2wait))
                    }
                    other => {
                        let msg = other.to_string();
                        warn!(remote = %shared.remote, reason = %msg, "iSCSI connection lost; logging in again");
                        shared.set_error(msg);
                        Duration::ZERO
                    }
                }
            }
            Err(f) => {
                debug!(remote = %shared.remote, reason = %f.reason, permanent = f.permanent, "login failed");
                shared.with(|s| s.login_failed(f.permanent, &f.reason));
                shared.set_error(f.reason.clone());
                if let Some(r) = f.redirect {
                    redirect = Some(address_of(&r));
                    Duration::ZERO
                } else {
                    let w = backoff;
                    backoff = (backoff * 2).min(cfg.reconnect_max);
                    w
                }
            }
        };
        if shared.lock().is_closed() {
            break;
        }
        if !wait.is_zero() {
            let sleep = tokio::time::sleep(wait);
            if with_timers(&shared, sleep).await.is_none() {
                break;
            }
        }
    }
    shared.set_connected(false);
    shared.connected_notify.notify_waiters();
    debug!(remote = %shared.remote, "initiator session ended");
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnd {
    #[error("{0}")]
    Session(ConnectionError),
    #[error("framing: {0}")]
    Wire(WireError),
    #[error("the target closed the connection")]
    Eof,
    #[error("I/O: {0}")]
    Io(io::Error),
}

async fn run_connection(shared: &Shared, c: Connected) -> ConnectionEnd {
    let Connected {
        stream,
        mut rbuf,
        outcome,
        ..
    } = c;
    let digests = outcome.digests;
    let framer = Framer {
        digests,
        max_data_segment_length: outcome.connection.initiator_max_recv_data_segment_length,
    };
    let (mut rd, wr) = stream.into_split();
    let wake = {
        let mut core = shared.lock();
        core.out = Some(Outbox::new(wr, digests));
        // What waited for this connection (commands sent again) goes now.
        core.flush()
    };
    if wake {
        shared.tx_wake.notify_one();
    }
    let stop = Notify::new();
    let stopped = AtomicBool::new(false);
    let halt = || {
        stopped.store(true, Ordering::Release);
        stop.notify_waiters();
    };
    let reader = async {
        let end = read_loop(shared, &mut rd, &mut rbuf, &framer, &stop, &stopped).await;
        halt();
        end
    };
    let writer = async {
        let end = write_loop(shared, &stop, &stopped).await;
        halt();
        end
    };
    let (r, w) = tokio::join!(reader, writer);
    // The send side goes with the connection (nothing more is written).
    shared.lock().out = None;
    match (r, w) {
        (Some(e), _) => e,
        (None, Some(e)) => e,
        (None, None) => ConnectionEnd::Eof,
    }
}

async fn read_loop(
    shared: &Shared,
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    rbuf: &mut BytesMut,
    framer: &Framer,
    stop: &Notify,
    stopped: &AtomicBool,
) -> Option<ConnectionEnd> {
    let mut events: Vec<Event<Waiter>> = Vec::new();
    // The largest PDU the target may send: header, digests, our
    // MaxRecvDataSegmentLength and its padding.
    let max_pdu = BHS_LEN + 8 + framer.max_data_segment_length as usize + 3;
    let mut last_pdu = 0usize;
    // The allocation the PDUs split off `rbuf` share: Data-In too small to
    // be worth pinning it is copied before the session holds it
    // (`RecvAlloc`).
    let mut alloc = RecvAlloc::default();
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
        let stop_wait = stop.notified();
        if stopped.load(Ordering::Acquire) {
            return None;
        }
        // Whole PDUs already buffered are handled before reading more.
        let ready = match framer.check(rbuf) {
            Ok(Check::Complete(_)) => true,
            Ok(Check::Incomplete(need)) => {
                // Room for the whole PDU before reading on, so its data
                // lands in place: growing the buffer later would copy what
                // was already read. Between PDUs, room for the largest one.
                let spare = rbuf.capacity() - rbuf.len();
                let want = if rbuf.len() < BHS_LEN {
                    // Expect a PDU like the last one (large reads come in
                    // runs of MaxRecvDataSegmentLength Data-Ins).
                    last_pdu.clamp(65536, max_pdu)
                } else {
                    need.saturating_sub(rbuf.len())
                };
                if spare < want {
                    // Not `reserve`: it may copy the PDUs already split
                    // off as well (`make_room`).
                    let cap = rbuf.len() + want.max(65536);
                    make_room(rbuf, cap);
                }
                false
            }
            Err(e) => return Some(ConnectionEnd::Wire(e)),
        };
        if !ready {
            // One timer for the connection, moved only when it must fire
            // earlier (or has fired): no timer churn per PDU.
            let now = Instant::now();
            let (want, low_depth) = {
                let core = shared.lock();
                let want = core
                    .poll_timeout()
                    .unwrap_or(now + Duration::from_millis(500))
                    .min(now + Duration::from_millis(500));
                (want, core.session.command_count() <= shared.busy_poll_depth)
            };
            let cur = sleep.deadline().into_std();
            if want < cur || cur <= now {
                sleep.as_mut().reset(want.into());
            }
            if low_depth && !shared.busy_poll.is_zero() && want > now {
                match poll_read(shared, rd, rbuf, stopped).await {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Some(e),
                }
            }
            tokio::select! {
                r = rd.readable() => {
                    if let Err(e) = r {
                        return Some(ConnectionEnd::Io(e));
                    }
                    // One recv per wake-up when it drains the socket
                    // (`read_some`); nothing read (a stale readiness):
                    // wait again.
                    match read_some(rd.as_ref(), rbuf, usize::MAX) {
                        Ok(ReadOutcome::Eof) => return Some(ConnectionEnd::Eof),
                        Ok(ReadOutcome::Data { .. } | ReadOutcome::Empty) => {}
                        Err(e) => return Some(ConnectionEnd::Io(e)),
                    }
                },
                _ = &mut sleep => {
                    let now = Instant::now();
                    let (r, wake) = {
                        let mut s = shared.lock();
                        let r = s.handle_timeout(now);
                        while let Some(e) = s.poll_event() { events.push(e); }
                        (r, s.flush())
                    };
                    deliver(std::mem::take(&mut events));
                    if wake {
                        shared.tx_wake.notify_one();
                    }
                    if let Err(e) = r {
                        return Some(ConnectionEnd::Session(e));
                    }
                    continue;
                }
                _ = stop_wait => return None,
            }
        }
        let now = Instant::now();
        shared.touch();
        let mut failed = None;
        // Only reads happened since the last reserve: the unread bytes are
        // all in the allocation `rbuf` points into now.
        alloc.note(rbuf);
        let wake = {
            let mut s = shared.lock();
            loop {
                match framer.decode(rbuf) {
                    Ok(Some(mut frame)) => {
                        last_pdu = BHS_LEN + frame.ahs.len() + frame.data.len();
                        frame.data = alloc.keepable(frame.data);
                        if let Err(e) = s.handle_frame(now, frame) {
                            failed = Some(ConnectionEnd::Session(e));
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(WireError::DataDigest { bhs, .. }) => {
                        if let Err(e) = s.handle_digest_error(now, &bhs) {
                            failed = Some(ConnectionEnd::Session(e));
                            break;
                        }
                    }
                    Err(e) => {
                        failed = Some(ConnectionEnd::Wire(e));
                        break;
                    }
                }
            }
            while let Some(e) = s.poll_event() {
                events.push(e);
            }
            let wake = s.flush();
            // The writer may be stuck waiting for a socket the target does
            // not read: a failure declared here ends the connection from
            // this side.
            if let Some(why) = s.out.as_ref().and_then(|o| o.fail_reason) {
                failed.get_or_insert(ConnectionEnd::Io(io::Error::other(why)));
            }
            wake
        };
        deliver(std::mem::take(&mut events));
        if wake {
            shared.tx_wake.notify_one();
        }
        if failed.is_some() {
            return failed;
        }
        // Do not keep a large buffer around for an idle session.
        if rbuf.is_empty() && rbuf.capacity() > (4 << 20) {
            *rbuf = BytesMut::new();
        }
    }
}

/// Busy polling (`InitiatorConfig::busy_poll`): reads the socket without
/// waiting for readiness, yielding to the runtime between tries, while the
/// session was active within the busy-poll time. `Ok(true)`: bytes came
/// in (the caller decodes them); `Ok(false)`: nothing, wait as usual.
async fn poll_read(
    shared: &Shared,
    rd: &tokio::net::tcp::OwnedReadHalf,
    rbuf: &mut BytesMut,
    stopped: &AtomicBool,
) -> Result<bool, ConnectionEnd> {
    use std::io::Read as _;
    // The readiness tokio keeps is only updated when a thread sleeps in
    // the kernel's poll; reading the socket itself (non-blocking) is what
    // avoids that sleep.
    let sock = socket2::SockRef::from(rd.as_ref());
    let start = rbuf.len();
    let room = (rbuf.capacity() - start).clamp(4096, 65536);
    rbuf.resize(start + room, 0);
    let got = loop {
        match (&*sock).read(&mut rbuf[start..]) {
            Ok(0) => break Err(ConnectionEnd::Eof),
            Ok(n) => break Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(ConnectionEnd::Io(e)),
        }
        if stopped.load(Ordering::Acquire) || !shared.spinning() {
            break Ok(0);
        }
        tokio::task::yield_now().await;
    };
    match got {
        Ok(n) => {
            rbuf.truncate(start + n);
            Ok(n > 0)
        }
        Err(e) => {
            rbuf.truncate(start);
            Err(e)
        }
    }
}

/// Encodes one PDU into slices: header (+ AHS and header digest), the data
/// slices as they are, padding, data digest.
fn encode_out(out: &OutPdu, digests: Digests, arena: &mut BytesMut, chunks: &mut VecDeque<Bytes>) {
    let len = out.data.len();
    let hb = match encode_header(&out.pdu, &out.ahs, len as u32, digests.header) {
        Ok(h) => h,
        Err(e) => {
            warn!(error = %e, pdu = ?out.pdu, "could not encode PDU");
            return;
        }
    };
    arena.extend_from_slice(hb.bhs_bytes());
    chunks.push_back(arena.split().freeze());
    if let Some(a) = hb.ahs() {
        chunks.push_back(a.clone());
    }
    if len == 0 {
        return;
    }
    chunks.extend(out.data.slices().iter().cloned());
    let pad = padding(len);
    if !pad.is_empty() {
        chunks.push_back(Bytes::from_static(pad));
    }
    if digests.data {
        let crc = digest::data_digest(out.data.slices().iter().map(|b| &b[..]));
        arena.extend_from_slice(&digest::to_wire(crc));
        chunks.push_back(arena.split().freeze());
    }
}

/// Writes every chunk, in order, waiting for the socket as needed.
async fn write_all_shared(w: &OwnedWriteHalf, chunks: &mut VecDeque<Bytes>) -> io::Result<()> {
    while !chunks.is_empty() {
        w.writable().await?;
        let mut iov = [io::IoSlice::new(&[]); IOV_MAX];
        let mut n = 0;
        for (slot, c) in iov.iter_mut().zip(chunks.iter()) {
            *slot = io::IoSlice::new(c);
            n += 1;
        }
        match w.try_write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => advance(chunks, written),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Takes over writing while the socket is full: drains what queued behind
/// it, then hands writing back to whoever holds the lock.
async fn write_loop(shared: &Shared, stop: &Notify, stopped: &AtomicBool) -> Option<ConnectionEnd> {
    loop {
        let stop_wait = stop.notified();
        let wake = shared.tx_wake.notified();
        if stopped.load(Ordering::Acquire) {
            return None;
        }
        let job = {
            let mut core = shared.lock();
            if let Some(o) = core.out.as_mut() {
                o.scheduled = false;
            }
            // Encode what the session queued; write it now if the socket is
            // ours, else it joins the pending chunks below.
            core.flush();
            match core.out.as_mut() {
                None => return None,
                Some(o) if o.failed => {
                    let why = o.fail_reason.unwrap_or("a write failed");
                    return Some(ConnectionEnd::Io(io::Error::other(why)));
                }
                Some(o) if o.busy => {
                    if o.pending.is_empty() {
                        o.busy = false;
                        o.echo_backlog = 0;
                        None
                    } else {
                        Some((o.wr.clone(), std::mem::take(&mut o.pending)))
                    }
                }
                Some(_) => None,
            }
        };
        let Some((wr, mut chunks)) = job else {
            tokio::select! {
                _ = wake => {}
                _ = stop_wait => return None,
            }
            continue;
        };
        tokio::select! {
            r = write_all_shared(&wr, &mut chunks) => {
                if let Err(e) = r {
                    if let Some(o) = shared.lock().out.as_mut() {
                        o.failed = true;
                    }
                    return Some(ConnectionEnd::Io(e));
                }
            }
            _ = stop_wait => return None,
        }
        // Loop: more may have queued behind; `busy` clears once nothing has.
    }
}

// ---- discovery ----------------------------------------------------------

/// A target a SendTargets answer named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// TargetName.
    pub name: String,
    /// Its TargetAddress values (`host:port,tpgt`); empty means the portal
    /// that was asked.
    pub addresses: Vec<String>,
}

/// Parses a SendTargets answer (RFC 7143 Appendix C): each TargetName
/// starts a target, TargetAddress values that follow belong to it.
pub fn parse_send_targets(text: &[u8]) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let params = TextParams::parse_bounded(text, 1 << 20)
        .map_err(|_| InitiatorError::Protocol("malformed SendTargets answer"))?;
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for kv in params.iter() {
        match kv.key {
            "TargetName" => out.push(DiscoveredTarget {
                name: kv.value.to_string(),
                addresses: Vec::new(),
            }),
            "TargetAddress" => match out.last_mut() {
                Some(t) => t.addresses.push(kv.value.to_string()),
                None => return Err(InitiatorError::Protocol("TargetAddress before TargetName")),
            },
            _ => {}
        }
    }
    Ok(out)
}

/// Opens a discovery session at `portal` (`host:port`), asks
/// `SendTargets=All`, logs out and returns the targets.
pub async fn discover(
    cfg: &InitiatorConfig,
    portal: &str,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let work = async {
        let mut cfg = cfg.clone();
        let c = match login_with_fallback(&mut cfg, portal, None).await {
            Ok(c) => c,
            // Targets often require CHAP for their nodes but not for
            // discovery (tgtd has no discovery account by default): ask
            // again without it.
            Err(f) if f.permanent && cfg.chap.is_some() => {
                cfg.chap = None;
                cfg.mutual_chap = None;
                connect_and_login(&cfg, portal, None)
                    .await
                    .map_err(|_| InitiatorError::Unreachable { reason: f.reason })?
            }
            Err(f) => return Err(InitiatorError::Unreachable { reason: f.reason }),
        };
        send_targets(c).await
    };
    tokio::time::timeout(cfg.login_timeout + cfg.session.command_timeout, work)
        .await
        .map_err(|_| InitiatorError::Timeout {
            after: cfg.login_timeout + cfg.session.command_timeout,
        })?
}

async fn send_targets(c: Connected) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let Connected {
        mut stream,
        mut rbuf,
        outcome,
        ..
    } = c;
    let digests = outcome.digests;
    let framer = Framer {
        digests,
        max_data_segment_length: outcome.connection.initiator_max_recv_data_segment_length,
    };
    let io_err = |e: io::Error| InitiatorError::Unreachable {
        reason: e.to_string(),
    };
    let mut cmd_sn = outcome.exp_cmd_sn;
    let mut exp_stat_sn = outcome.next_stat_sn;
    let mut text = TextAccumulator::new(1 << 20);
    let mut ttt = crate::ffp::RESERVED_TAG;
    let mut body: &[u8] = b"SendTargets=All\0";
    loop {
        let req = Pdu::TextRequest(TextRequest {
            immediate: false,
            final_flag: true,
            continue_flag: false,
            lun: 0,
            itt: 1,
            ttt,
            cmd_sn,
            exp_stat_sn,
        });
        let wire = encode_pdu(&req, &[], body, digests)
            .map_err(|_| InitiatorError::Protocol("cannot encode Text Request"))?;
        stream.write_all(&wire).await.map_err(io_err)?;
        cmd_sn = cmd_sn.wrapping_add(1);
        body = b"";
        let frame = loop {
            let f = recv_frame(&mut stream, &mut rbuf, &framer)
                .await
                .map_err(|f| InitiatorError::Unreachable { reason: f.reason })?;
            match f.parse() {
                Ok(Pdu::TextResponse(_)) => break f,
                Ok(Pdu::NopIn(_)) | Ok(Pdu::AsyncMessage(_)) => continue,
                Ok(Pdu::Reject(_)) => return Err(InitiatorError::Rejected { reason: 0 }),
                _ => return Err(InitiatorError::Protocol("expected a Text Response")),
            }
        };
        let Ok(Pdu::TextResponse(rsp)) = frame.parse() else {
            return Err(InitiatorError::Protocol("expected a Text Response"));
        };
        exp_stat_sn = rsp.stat_sn.wrapping_add(1);
        text.push(&frame.data)
            .map_err(|_| InitiatorError::Protocol("SendTargets answer too long"))?;
        if !rsp.continue_flag {
            break;
        }
        ttt = rsp.ttt;
    }
    let logout = Pdu::LogoutRequest(LogoutRequest {
        immediate: true,
        reason: LogoutReason::CLOSE_SESSION,
        itt: 2,
        cid: 0,
        cmd_sn,
        exp_stat_sn,
    });
    if let Ok(wire) = encode_pdu(&logout, &[], &[], digests) {
        let _ = stream.write_all(&wire).await;
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            recv_frame(&mut stream, &mut rbuf, &framer),
        )
        .await;
    }
    parse_send_targets(text.as_bytes())
}

// ---- the factory -------------------------------------------------------

/// The initiator name a front-end initiator port is given at the remote in
/// per-nexus mode: its iSCSI name unchanged, or for an FC port `naa.` and
/// its 16 hex digit WWPN.
pub fn upstream_name(port: &TransportId) -> String {
    match port {
        TransportId::Iscsi { name, .. } => name.clone(),
        TransportId::Fcp { wwpn } => format!("naa.{wwpn:016x}"),
    }
}

/// A stable ISID: type "random" (10b) with the 40 bits below from a hash
/// of `parts`. The gateway derives its sessions' ISIDs from the front-end
/// initiator port and the remote LU, so a reconnecting port reinstates its
/// own remote session and no other (two LUs of one remote target, or the
/// host's own direct session, never share an ISID).
pub fn stable_isid(parts: &[&str]) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let b = h.to_be_bytes();
    [0x80, b[1], b[2], b[3], b[4], b[5]]
}

/// The ISID of a front-end initiator port's session for the remote LU
/// `salt` names.
pub fn upstream_isid(port: &TransportId, salt: &str) -> [u8; 6] {
    stable_isid(&[&port.port_name(), salt, "unifab"])
}

/// A fresh random ISID (type 10b), for a tool's one-off session.
pub fn random_isid() -> [u8; 6] {
    use rand::RngExt;
    let r: u64 = rand::rng().random();
    let b = r.to_be_bytes();
    [0x80, b[1], b[2], b[3], b[4], b[5]]
}

/// Opens [`IscsiInitiator`]s to one remote target for a
/// [`RemoteLu`](unifab_scsi_core::RemoteLu).
///
/// Per nexus (the default), each front-end initiator port gets its own
/// session, logged in under that port's name ([`upstream_name`]; with
/// [`IscsiInitiatorFactory::fixed_name`] under one configured name) with
/// a stable ISID of its own ([`upstream_isid`]). Shared, every port's
/// tasks go through one session under the configured name. Either way the
/// gateway's own commands (capacity probes) use the shared session.
#[derive(Debug)]
pub struct IscsiInitiatorFactory {
    base: InitiatorConfig,
    portal: String,
    target: String,
    salt: String,
    per_nexus: bool,
    fixed_name: bool,
    shared: Mutex<Option<IscsiInitiator>>,
    /// Every session it opened that someone still holds (for
    /// [`IscsiInitiatorFactory::sessions`]); pruned at each open.
    opened: Mutex<Vec<std::sync::Weak<DropGuard>>>,
}

impl IscsiInitiatorFactory {
    /// A factory for `target` at `portal` with `base` settings (its name
    /// serves the shared and control sessions). `salt` names the remote LU
    /// (e.g. its configured name): it goes into every ISID, so factories
    /// for different LUs of one target never reinstate each other's
    /// sessions. The shared session's ISID is derived from it as well.
    pub fn new(
        base: InitiatorConfig,
        portal: &str,
        target: &str,
        salt: &str,
        per_nexus: bool,
    ) -> Self {
        let mut base = base;
        base.isid = stable_isid(&[&base.initiator_name, salt, "unifab-control"]);
        IscsiInitiatorFactory {
            base,
            portal: portal.to_string(),
            target: target.to_string(),
            salt: salt.to_string(),
            per_nexus,
            fixed_name: false,
            shared: Mutex::new(None),
            opened: Mutex::new(Vec::new()),
        }
    }

    /// The sessions it opened that are still in use, oldest first.
    pub fn sessions(&self) -> Vec<SessionStatus> {
        let live: Vec<Arc<DropGuard>> = {
            let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
            opened.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        live.iter()
            .map(|g| SessionStatus::of(&g.0))
            .filter(|s| !s.closed)
            .collect()
    }

    fn remember(&self, i: &IscsiInitiator) {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        opened.retain(|w| w.strong_count() > 0);
        opened.push(Arc::downgrade(&i._guard));
    }

    /// Per-nexus sessions all log in under the configured name (ACLs that
    /// know only the gateway), told apart by their ISIDs.
    pub fn fixed_name(mut self, fixed: bool) -> Self {
        self.fixed_name = fixed;
        self
    }
}

impl InitiatorFactory for IscsiInitiatorFactory {
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        match nexus {
            Some(n) if self.per_nexus => {
                let mut cfg = self.base.clone();
                if !self.fixed_name {
                    cfg.initiator_name = upstream_name(n.initiator());
                }
                cfg.isid = upstream_isid(n.initiator(), &self.salt);
                let i = IscsiInitiator::start(cfg, &self.portal, &self.target);
                self.remember(&i);
                Ok(Arc::new(i))
            }
            _ => {
                let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let i = s.get_or_insert_with(|| {
                    let i = IscsiInitiator::start(self.base.clone(), &self.portal, &self.target);
                    self.remember(&i);
                    i
                });
                Ok(Arc::new(i.clone()))
            }
        }
    }

    fn per_nexus(&self) -> bool {
        self.per_nexus
    }
}

#[cfg(test)]
mod tests;
