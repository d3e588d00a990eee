//! The open image: the librados cluster handle, the pool's I/O context
//! and the librbd image, and the completions that carry asynchronous
//! results back into Rust futures.

use std::ffi::{CString, c_char, c_int, c_void};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::RbdOptions;
use super::ffi::*;
use crate::backend::{AllocationRun, BackendError, BackendIoStats, IoFuture};

/// Ceph's `EBLOCKLISTED` (`ESHUTDOWN` on Linux): the cluster has
/// blocklisted this client.
const EBLOCKLISTED: i32 = libc::ESHUTDOWN;
/// Most iovecs one `rbd_aio_writev` takes (`IOV_MAX`).
const IOV_MAX: usize = 1024;
/// How long an operation on an image this client holds exclusively may
/// wait in librbd before the image asks whether it still holds the lock
/// (and again after each such period).
const STALL_CHECK: Duration = Duration::from_secs(5);

/// The handles of one open image, closed in reverse order on drop.
pub(super) struct Image {
    cluster: RadosT,
    ioctx: RadosIoctxT,
    image: RbdImageT,
    /// The cluster blocklisted this client: every later operation fails.
    /// Each open image (each librados client) has its own.
    fenced: AtomicBool,
    name: String,
    watch: Mutex<Option<(u64, *mut WatchFn)>>,
    counters: Arc<Counters>,
    /// The client's `rbd cache` is on: completed writes may sit in this
    /// process until a flush.
    pub(super) cache: bool,
    /// This client took the image's exclusive lock (`rbd_lock_acquire`):
    /// losing it is being fenced.
    exclusive: bool,
    /// An operation is asking librbd whether the lock is still held
    /// (one question at a time, however many operations wait).
    checking: AtomicBool,
}

/// What operators see of the image's operations. The completions hold
/// these, not the image: the last reference to an image must never drop
/// on librbd's callback thread (closing it there would wait for itself).
#[derive(Default)]
struct Counters {
    in_flight: AtomicU64,
    completed: AtomicU64,
    latency_us: AtomicU64,
}

type WatchFn = Box<dyn Fn() + Send + Sync>;

// SAFETY: librados' cluster and I/O context handles and librbd's image
// handle may be used from any thread, concurrently (librbd serialises
// what needs it inside its ImageCtx; ceph-iscsi's tcmu-runner and QEMU's
// rbd driver both submit from several threads). The watch callback's box
// is only touched under the mutex and on drop.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

fn cstring(what: &str, s: &str) -> Result<CString, BackendError> {
    CString::new(s).map_err(|_| BackendError::Io(io::Error::other(format!("{what} contains NUL"))))
}

fn os_error(r: isize) -> io::Error {
    io::Error::from_raw_os_error(i32::try_from(-r).unwrap_or(libc::EIO))
}

impl Image {
    /// Connects and opens (or creates) the image.
    pub(super) fn open(opts: &RbdOptions) -> Result<Image, BackendError> {
        let conf = opts.conf_path();
        let conf_c = cstring("ceph_conf", &conf.to_string_lossy())?;
        let id = cstring("ceph_id", &format!("client.{}", opts.ceph_id))?;
        let cluster_name = cstring("cluster", "ceph")?;
        let pool = cstring("pool", &opts.pool)?;
        let name = cstring("image", &opts.image)?;
        let mut img = Image {
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
            fenced: AtomicBool::new(false),
            name: format!("{}/{}", opts.pool, opts.image),
            watch: Mutex::new(None),
            counters: Arc::default(),
            cache: true,
            exclusive: false,
            checking: AtomicBool::new(false),
        };
        let fail = |what: &str, r: c_int| {
            BackendError::Io(io::Error::new(
                os_error(r as isize).kind(),
                format!("rbd {}: {what}: {}", img_name(opts), os_error(r as isize)),
            ))
        };
        // SAFETY: out-pointer to a handle this struct owns; the strings
        // live across the call.
        let r = unsafe { rados_create2(&mut img.cluster, cluster_name.as_ptr(), id.as_ptr(), 0) };
        if r < 0 {
            img.cluster = ptr::null_mut();
            return Err(fail("rados_create2", r));
        }
        // SAFETY: a created, unconnected cluster handle; a C string.
        let r = unsafe { rados_conf_read_file(img.cluster, conf_c.as_ptr()) };
        if r < 0 {
            return Err(fail(&format!("reading {}", conf.display()), r));
        }
        let secs = |d: std::time::Duration| d.as_secs().max(u64::from(!d.is_zero())).to_string();
        for (k, v) in [
            ("rados_osd_op_timeout", secs(opts.op_timeout)),
            ("rados_mon_op_timeout", secs(opts.op_timeout)),
            ("client_mount_timeout", secs(opts.connect_timeout)),
            // A discard must read back as zeroes (the LU reports LBPRZ):
            // librbd's default skips the parts of a discard that do not
            // cover whole objects, leaving their old data.
            ("rbd_skip_partial_discard", "false".to_owned()),
            // Writes from the gateway's own buffers, not a copy of them.
            // librbd's default copies every write because a caller might
            // change a buffer while it is in flight; unifab's write
            // buffers are immutable (`Bytes`) and owned by the operation
            // until its completion runs (`Keep`), and librbd delays that
            // completion until it has released the last reference to them
            // (its `UserBufferDeleter`). Where a writeback cache is on,
            // librbd copies anyway.
            ("rbd_disable_zero_copy_writes", "false".to_owned()),
        ] {
            let (k, v) = (cstring("option", k)?, cstring("value", &v)?);
            // SAFETY: unconnected handle; C strings.
            let r = unsafe { rados_conf_set(img.cluster, k.as_ptr(), v.as_ptr()) };
            if r < 0 {
                return Err(fail("rados_conf_set", r));
            }
        }
        let key = cstring("option", "rbd_cache")?;
        let mut buf = [0u8; 16];
        // SAFETY: unconnected handle; `buf` is writable for its length.
        let r = unsafe {
            rados_conf_get(
                img.cluster,
                key.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
            )
        };
        if r >= 0 {
            let v = buf.split(|&b| b == 0).next().unwrap_or(&[]);
            img.cache = !matches!(v, b"false" | b"0");
        }
        // SAFETY: a configured handle.
        let r = unsafe { rados_connect(img.cluster) };
        if r < 0 {
            return Err(BackendError::Unreachable(io::Error::new(
                os_error(r as isize).kind(),
                format!(
                    "rbd {}: connecting with {}: {}",
                    img_name(opts),
                    conf.display(),
                    os_error(r as isize)
                ),
            )));
        }
        // SAFETY: a connected handle; out-pointer this struct owns.
        let r = unsafe { rados_ioctx_create(img.cluster, pool.as_ptr(), &mut img.ioctx) };
        if r < 0 {
            img.ioctx = ptr::null_mut();
            return Err(fail("opening the pool", r));
        }
        // SAFETY: a valid I/O context; out-pointer this struct owns; no snapshot.
        let mut r = unsafe { rbd_open(img.ioctx, name.as_ptr(), &mut img.image, ptr::null()) };
        if r == -libc::ENOENT
            && let Some(size) = opts.size
        {
            if opts.read_only {
                return Err(fail("the image is missing and the LU is read-only", r));
            }
            let mut order: c_int = 0;
            // SAFETY: a valid I/O context; order 0 is librbd's default.
            let c = unsafe { rbd_create(img.ioctx, name.as_ptr(), size, &mut order) };
            if c < 0 {
                return Err(fail("creating the image", c));
            }
            tracing::info!(image = %img.name, size, "created rbd image");
            // SAFETY: as above.
            r = unsafe { rbd_open(img.ioctx, name.as_ptr(), &mut img.image, ptr::null()) };
        }
        if r < 0 {
            img.image = ptr::null_mut();
            return Err(if r == -libc::ENOENT {
                fail("no such image, and no size was given to create it", r)
            } else {
                fail("opening the image", r)
            });
        }
        if opts.exclusive && !opts.read_only {
            img.lock(opts)?;
            img.exclusive = true;
        }
        Ok(img)
    }

    /// Takes the image's exclusive lock, waiting up to `lock_timeout` for
    /// another client to give it up: librbd breaks a dead client's lock
    /// (and blocklists it) once that client's watch has expired; a live
    /// one keeps it, and opening fails naming the image.
    fn lock(&self, opts: &RbdOptions) -> Result<(), BackendError> {
        let deadline = Instant::now() + opts.lock_timeout;
        let mut logged = false;
        loop {
            // SAFETY: an open image.
            let r = unsafe { rbd_lock_acquire(self.image, RBD_LOCK_MODE_EXCLUSIVE) };
            if r == 0 {
                return Ok(());
            }
            let busy = r == -libc::EROFS || r == -libc::EBUSY || r == -libc::EAGAIN;
            if !busy || Instant::now() >= deadline {
                return Err(BackendError::Io(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "rbd {}: another client holds the image's exclusive lock ({}); \
                         is another gateway serving it?",
                        self.name,
                        os_error(r as isize)
                    ),
                )));
            }
            if !logged {
                tracing::warn!(
                    image = %self.name,
                    "another client holds the image's exclusive lock: waiting for it (a dead client's lock is broken when its watch expires)"
                );
                logged = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    /// Maps a librbd error: fencing, an unreachable cluster, or an I/O
    /// error.
    fn error(&self, r: isize) -> BackendError {
        let e = os_error(r);
        match i32::try_from(-r).unwrap_or(libc::EIO) {
            EBLOCKLISTED => {
                self.fence("the cluster blocklisted this client");
                BackendError::Fenced(format!("rbd {}: {e}", self.name))
            }
            libc::ETIMEDOUT
            | libc::ENOTCONN
            | libc::ECONNREFUSED
            | libc::ECONNRESET
            | libc::EHOSTUNREACH => BackendError::Unreachable(e),
            // With the exclusive lock taken, librbd refuses a write with
            // EROFS while it does not hold it (between losing the lock and
            // noticing why): not a read-only medium, and a retry may pass.
            libc::EROFS if self.exclusive => BackendError::Unreachable(io::Error::new(
                e.kind(),
                format!(
                    "rbd {}: the image's exclusive lock is not held: {e}",
                    self.name
                ),
            )),
            libc::EROFS => BackendError::ReadOnly,
            _ => BackendError::Io(e),
        }
    }

    /// Counts into `other`'s counters (a reopened image goes on with the
    /// figures of the one it replaces: metrics are counters that never go
    /// down).
    pub(super) fn share_counters(&mut self, other: &Image) {
        self.counters = other.counters.clone();
    }

    /// True once the cluster blocklisted this client.
    pub(super) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// The addresses of this image's librados client, as the cluster
    /// blocklists them (`rados_getaddrs`: `[v2:IP:PORT/NONCE,…]`, one per
    /// messenger protocol).
    pub(super) fn client_addrs(&self) -> Result<Vec<String>, BackendError> {
        let mut out: *mut c_char = ptr::null_mut();
        // SAFETY: a connected handle; librados strdup()s the answer into
        // `out`, freed below.
        let r = unsafe { rados_getaddrs(self.cluster, &mut out) };
        if r < 0 || out.is_null() {
            return Err(self.error(r.min(-libc::EIO) as isize));
        }
        // SAFETY: a NUL-terminated string librados allocated with malloc.
        let text = unsafe { std::ffi::CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by strdup in librados, freed once.
        unsafe { libc::free(out.cast::<c_void>()) };
        Ok(parse_addrs(&text))
    }

    /// Blocklists another client (`addr` as [`Image::client_addrs`] gave
    /// it) for the cluster's default time (`mon_osd_blocklist_default_expire`,
    /// an hour), then waits for the OSD map that says so: once this
    /// returns, no OSD that this client talks to accepts an operation
    /// from the one blocklisted (librados' `blocklist_add`, as librbd
    /// breaks a dead client's lock).
    pub(super) fn blocklist(&self, addr: &str) -> Result<(), BackendError> {
        let c = cstring("client address", addr)?;
        // SAFETY: a connected handle; librados only reads the string.
        let r = unsafe { rados_blocklist_add(self.cluster, c.as_ptr().cast_mut(), 0) };
        // SAFETY: a connected handle. (librados' blocklist_add waits for
        // the map too; this says so whatever release it is.)
        let r = if r < 0 {
            r
        } else {
            unsafe { rados_wait_for_latest_osdmap(self.cluster) }
        };
        if r < 0 {
            return Err(match self.error(r as isize) {
                BackendError::Io(e) => BackendError::Io(io::Error::new(
                    e.kind(),
                    format!("rbd {}: blocklisting {addr}: {e}", self.name),
                )),
                other => other,
            });
        }
        Ok(())
    }

    fn ok(&self, r: isize) -> Result<(), BackendError> {
        if r < 0 { Err(self.error(r)) } else { Ok(()) }
    }

    /// Waits for an operation's completion. On an image this client holds
    /// exclusively, an operation that waits [`STALL_CHECK`] makes the
    /// image ask whether it still holds the lock: librbd 16 queues a write
    /// that meets the lock being torn down after a blocklist and never
    /// completes it, so without asking, the command would hang for ever
    /// and the LU would never learn it is fenced. Fenced, the operation
    /// resolves to `EBLOCKLISTED` at once; librbd keeps its buffers
    /// (they stay with the operation until its callback runs, if ever)
    /// and the LU stops serving until it is opened again, as a new client
    /// whose lock acquisition blocklists this one again, so the queued
    /// write can never land under the new owner. An operation that is only
    /// slow (an OSD down: librados fails it after `op_timeout`) is left to
    /// finish. An operation librbd refused for want of the lock (EROFS)
    /// asks the same question. Polled on a tokio runtime (the LU's), like
    /// every future of this backend.
    async fn settle(self: &Arc<Self>, mut wait: Wait) -> (isize, Keep) {
        if !self.exclusive {
            return wait.await;
        }
        loop {
            if let Ok(done) = tokio::time::timeout(STALL_CHECK, &mut wait).await {
                // Refused for want of the lock: fenced if it is gone for
                // good, else a retryable error (`Image::error`).
                if done.0 == -(libc::EROFS as isize) && self.lock_lost().await {
                    return (-(EBLOCKLISTED as isize), done.1);
                }
                return done;
            }
            if self.lock_lost().await {
                return (-(EBLOCKLISTED as isize), Keep::None);
            }
        }
    }

    /// Asks librbd (on a thread that may block: it asserts the lock at the
    /// OSD, bounded by `op_timeout`) whether this client still holds the
    /// image's exclusive lock; marks the image fenced when it does not.
    /// False when it does, when the answer is an error other than a
    /// blocklist (the cluster unreachable), and while another operation's
    /// question is out.
    async fn lock_lost(self: &Arc<Self>) -> bool {
        if self.is_fenced() {
            return true;
        }
        if self.checking.swap(true, Ordering::AcqRel) {
            return false;
        }
        tracing::warn!(
            image = %self.name,
            "an operation waited {} s in librbd, or was refused for want of the exclusive lock: asking whether this client still holds it",
            STALL_CHECK.as_secs()
        );
        let me = self.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let mut owner: c_int = 0;
            // SAFETY: an open image (the Arc keeps it open); out-pointer
            // to a local.
            let r = unsafe { rbd_is_exclusive_lock_owner(me.image, &mut owner) };
            me.checking.store(false, Ordering::Release);
            (r, owner)
        })
        .await;
        match answer {
            Ok((r, _)) if r == -EBLOCKLISTED => {
                let _ = self.error(r as isize);
                true
            }
            Ok((0, 0)) => {
                self.fence("this client no longer holds the image's exclusive lock");
                true
            }
            _ => false,
        }
    }

    /// Marks the image fenced (logged once).
    fn fence(&self, why: &str) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(
                image = %self.name,
                "{why}: the LU stops serving until it is opened again"
            );
        }
    }

    pub(super) fn get_size(&self) -> Result<u64, BackendError> {
        let mut size = 0u64;
        // SAFETY: an open image; out-pointer to a local.
        let r = unsafe { rbd_get_size(self.image, &mut size) };
        self.ok(r as isize).map(|()| size)
    }

    pub(super) fn resize(&self, size: u64) -> Result<(), BackendError> {
        // SAFETY: an open image.
        self.ok(unsafe { rbd_resize(self.image, size) } as isize)
    }

    pub(super) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: `buf` is writable for its length during the call.
        let r = unsafe {
            rbd_read2(
                self.image,
                offset,
                buf.len(),
                buf.as_mut_ptr().cast::<c_char>(),
                OP_FLAG_NONE,
            )
        };
        self.ok(r)?;
        if r as usize != buf.len() {
            return Err(BackendError::Io(io::Error::other(format!(
                "rbd {}: short read: {r} of {} bytes",
                self.name,
                buf.len()
            ))));
        }
        Ok(())
    }

    pub(super) fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        // SAFETY: `data` is readable for its length during the call.
        let r = unsafe {
            rbd_write2(
                self.image,
                offset,
                data.len(),
                data.as_ptr().cast::<c_char>(),
                OP_FLAG_NONE,
            )
        };
        self.ok(r)?;
        if r as usize != data.len() {
            return Err(BackendError::Io(io::Error::other(format!(
                "rbd {}: short write: {r} of {} bytes",
                self.name,
                data.len()
            ))));
        }
        Ok(())
    }

    pub(super) fn flush(&self) -> Result<(), BackendError> {
        // SAFETY: an open image.
        self.ok(unsafe { rbd_flush(self.image) } as isize)
    }

    pub(super) fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        // librbd takes a discard's length as an int's worth at most in its
        // return value: discard in pieces of 1 GiB.
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(1 << 30);
            // SAFETY: an open image.
            self.ok(unsafe { rbd_discard(self.image, at, n) } as isize)?;
            at += n;
        }
        Ok(())
    }

    pub(super) fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(1 << 30);
            // SAFETY: an open image; no flags.
            self.ok(unsafe { rbd_write_zeroes(self.image, at, n as usize, 0, OP_FLAG_NONE) })?;
            at += n;
        }
        Ok(())
    }

    /// The run of equal allocation state at `offset`, from
    /// `rbd_diff_iterate2` against the image's creation (extents that
    /// exist are mapped; what it does not report is a hole).
    pub(super) fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError> {
        struct Walk {
            at: u64,
            /// The first reported extent: (start, end, exists), grown while
            /// later ones continue it with the same state.
            run: Option<(u64, u64, bool)>,
        }
        unsafe extern "C" fn each(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the `Walk` below, alive for the whole call
            // of rbd_diff_iterate2, which calls back on its own thread.
            let w = unsafe { &mut *arg.cast::<Walk>() };
            let (start, end, ex) = (off, off + len as u64, exists != 0);
            match &mut w.run {
                None => w.run = Some((start, end, ex)),
                Some((_, e, x)) if *e == start && *x == ex => *e = end,
                // A gap or a change of state ends the run: stop iterating.
                Some(_) => return -libc::ECANCELED,
            }
            0
        }
        let mut walk = Walk {
            at: offset,
            run: None,
        };
        // SAFETY: an open image; the callback and its argument live across
        // the call; no snapshot (NULL: since the image's creation).
        let r = unsafe {
            rbd_diff_iterate2(
                self.image,
                ptr::null(),
                offset,
                len,
                1,
                0,
                Some(each),
                (&mut walk as *mut Walk).cast::<c_void>(),
            )
        };
        if r < 0 && r != -libc::ECANCELED {
            return Err(self.error(r as isize));
        }
        let end = offset + len;
        Ok(match walk.run {
            // Nothing allocated in the range.
            None => AllocationRun { mapped: false, len },
            // A hole before the first extent.
            Some((start, _, _)) if start > walk.at => AllocationRun {
                mapped: false,
                len: start - walk.at,
            },
            Some((_, e, exists)) => AllocationRun {
                mapped: exists,
                len: e.min(end) - walk.at,
            },
        })
    }

    /// Registers `f` for header updates.
    pub(super) fn watch(&self, f: WatchFn) -> Result<(), BackendError> {
        unsafe extern "C" fn fire(arg: *mut c_void) {
            // SAFETY: `arg` is the boxed closure registered below; it lives
            // until rbd_update_unwatch has returned (drop).
            let f = unsafe { &*arg.cast::<WatchFn>() };
            f();
        }
        let mut slot = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let raw = Box::into_raw(Box::new(f));
        let mut handle = 0u64;
        // SAFETY: an open image; `raw` stays valid until unwatched.
        let r =
            unsafe { rbd_update_watch(self.image, &mut handle, Some(fire), raw.cast::<c_void>()) };
        if r < 0 {
            // SAFETY: librbd did not keep it.
            drop(unsafe { Box::from_raw(raw) });
            return Err(self.error(r as isize));
        }
        *slot = Some((handle, raw));
        Ok(())
    }

    pub(super) fn stats(&self) -> BackendIoStats {
        let c = &self.counters;
        BackendIoStats {
            in_flight: c.in_flight.load(Ordering::Relaxed),
            completed: c.completed.load(Ordering::Relaxed),
            latency_us_total: c.latency_us.load(Ordering::Relaxed),
        }
    }

    /// Submits one asynchronous operation: `start` is given the completion
    /// and returns librbd's submission result. `keep` (the buffers) stays
    /// with the completion until librbd calls back.
    fn submit(
        self: &Arc<Self>,
        keep: Keep,
        start: impl FnOnce(RbdCompletionT) -> c_int,
    ) -> Result<Wait, BackendError> {
        let op = Arc::new(Op {
            state: Mutex::new(OpState {
                ret: None,
                waker: None,
                keep,
            }),
            counters: self.counters.clone(),
            started: Instant::now(),
        });
        let arg = Arc::into_raw(op.clone()).cast_mut().cast::<c_void>();
        let mut c: RbdCompletionT = ptr::null_mut();
        // SAFETY: `arg` is a leaked Arc<Op> that `complete` takes back.
        let r = unsafe { rbd_aio_create_completion(arg, Some(complete), &mut c) };
        if r < 0 {
            // SAFETY: librbd did not take it.
            drop(unsafe { Arc::from_raw(arg.cast::<Op>()) });
            return Err(self.error(r as isize));
        }
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let r = start(c);
        if r < 0 {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            // SAFETY: the operation was refused: the completion will not be
            // called; release it and take the Arc back.
            unsafe { rbd_aio_release(c) };
            drop(unsafe { Arc::from_raw(arg.cast::<Op>()) });
            return Err(self.error(r as isize));
        }
        Ok(Wait(op))
    }

    pub(super) fn aio_read(self: &Arc<Self>, offset: u64, len: usize) -> IoFuture<Bytes> {
        let mut buf = BytesMut::with_capacity(len);
        let at = buf.spare_capacity_mut().as_mut_ptr().cast::<c_char>();
        let image = self.image;
        // SAFETY: `at` points into `buf`'s heap allocation, which moves
        // into the operation and lives until librbd completes it.
        let wait = self.submit(Keep::Read(buf), |c| unsafe {
            rbd_aio_read2(image, offset, len, at, c, OP_FLAG_NONE)
        });
        let me = self.clone();
        Box::pin(async move {
            let (r, keep) = me.settle(wait?).await;
            me.ok(r)?;
            let Keep::Read(mut buf) = keep else {
                return Err(BackendError::ForeignBuffer);
            };
            if r as usize != len || buf.capacity() < len {
                return Err(BackendError::Io(io::Error::other(format!(
                    "rbd {}: short read: {r} of {len} bytes",
                    me.name
                ))));
            }
            // SAFETY: librbd wrote `len` bytes into the spare capacity.
            unsafe { buf.set_len(len) };
            Ok(buf.freeze())
        })
    }

    pub(super) fn aio_write(
        self: &Arc<Self>,
        offset: u64,
        data: Vec<Bytes>,
        fua: bool,
    ) -> IoFuture<()> {
        let data = if data.len() > IOV_MAX {
            let mut one = BytesMut::with_capacity(data.iter().map(Bytes::len).sum());
            data.iter().for_each(|b| one.extend_from_slice(b));
            vec![one.freeze()]
        } else {
            data
        };
        let iov: Vec<libc::iovec> = data
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| libc::iovec {
                iov_base: b.as_ptr().cast_mut().cast::<c_void>(),
                iov_len: b.len(),
            })
            .collect();
        let me = self.clone();
        if iov.is_empty() {
            return Box::pin(async move { if fua { me.aio_flush().await } else { Ok(()) } });
        }
        let (at, n) = (iov.as_ptr(), iov.len() as c_int);
        let image = self.image;
        // SAFETY: the iovecs and the bytes they point at move into the
        // operation (heap allocations that do not move) and live until
        // librbd completes it.
        let wait = self.submit(Keep::Write(data, iov), |c| unsafe {
            rbd_aio_writev(image, at, n, offset, c)
        });
        Box::pin(async move {
            // A write's completion value is 0 (or its length) on success.
            let (r, _keep) = me.settle(wait?).await;
            me.ok(r)?;
            if fua {
                me.aio_flush().await?;
            }
            Ok(())
        })
    }

    pub(super) fn aio_compare_and_write(
        self: &Arc<Self>,
        offset: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> IoFuture<Option<u64>> {
        let len = write.len();
        let mut mismatch = Box::new(u64::MAX);
        let (cmp, buf, at) = (
            compare.as_ptr().cast::<c_char>(),
            write.as_ptr().cast::<c_char>(),
            &mut *mismatch as *mut u64,
        );
        let image = self.image;
        // SAFETY: both buffers and the mismatch word move into the
        // operation (heap allocations that do not move) and live until
        // librbd completes it.
        let wait = self.submit(Keep::Compare(compare, write, mismatch), |c| unsafe {
            rbd_aio_compare_and_write(image, offset, len, cmp, buf, c, at, OP_FLAG_NONE) as c_int
        });
        let me = self.clone();
        Box::pin(async move {
            let (r, keep) = me.settle(wait?).await;
            if r == -(libc::EILSEQ as isize) {
                let Keep::Compare(_, _, at) = keep else {
                    return Err(BackendError::ForeignBuffer);
                };
                // librbd gives the first differing byte as an image offset;
                // relative to the range is what SBC reports.
                let at = *at;
                let rel = if (offset..offset + len as u64).contains(&at) {
                    at - offset
                } else if at < len as u64 {
                    at
                } else {
                    0
                };
                return Ok(Some(rel));
            }
            me.ok(r)?;
            if fua {
                me.aio_flush().await?;
            }
            Ok(None)
        })
    }

    pub(super) fn aio_write_same(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        pattern: Bytes,
    ) -> IoFuture<()> {
        let (at, n) = (pattern.as_ptr().cast::<c_char>(), pattern.len());
        let image = self.image;
        // SAFETY: the pattern moves into the operation (its heap bytes do
        // not move) and lives until librbd completes it.
        let wait = self.submit(Keep::Pattern(pattern), |c| unsafe {
            rbd_aio_writesame(image, offset, len, at, n, c, OP_FLAG_NONE)
        });
        let me = self.clone();
        Box::pin(async move {
            let (r, _) = me.settle(wait?).await;
            me.ok(r)
        })
    }

    pub(super) fn aio_discard(self: &Arc<Self>, offset: u64, len: u64) -> IoFuture<()> {
        let image = self.image;
        // SAFETY: an open image; no buffer.
        let wait = self.submit(Keep::None, |c| unsafe {
            rbd_aio_discard(image, offset, len, c)
        });
        let me = self.clone();
        Box::pin(async move {
            let (r, _) = me.settle(wait?).await;
            me.ok(r)
        })
    }

    pub(super) fn aio_flush(self: &Arc<Self>) -> IoFuture<()> {
        let image = self.image;
        // SAFETY: an open image.
        let wait = self.submit(Keep::None, |c| unsafe { rbd_aio_flush(image, c) });
        let me = self.clone();
        Box::pin(async move {
            let (r, _) = me.settle(wait?).await;
            me.ok(r)
        })
    }
}

/// See [`super::mon_command`].
pub(super) fn mon_command(
    conf: &std::path::Path,
    ceph_id: &str,
    command: &str,
    input: &[u8],
) -> Result<Vec<u8>, BackendError> {
    struct Cluster(RadosT);
    impl Drop for Cluster {
        fn drop(&mut self) {
            if !self.0.is_null() {
                // SAFETY: created by rados_create2, shut down once.
                unsafe { rados_shutdown(self.0) };
            }
        }
    }
    let conf_c = cstring("ceph_conf", &conf.to_string_lossy())?;
    let id = cstring("ceph_id", &format!("client.{ceph_id}"))?;
    let name = cstring("cluster", "ceph")?;
    let cmd = cstring("command", command)?;
    let err = |what: &str, r: c_int| {
        BackendError::Io(io::Error::new(
            os_error(r as isize).kind(),
            format!("{what}: {}", os_error(r as isize)),
        ))
    };
    let mut c = Cluster(ptr::null_mut());
    // SAFETY: out-pointer to a handle `c` owns; C strings.
    let r = unsafe { rados_create2(&mut c.0, name.as_ptr(), id.as_ptr(), 0) };
    if r < 0 {
        c.0 = ptr::null_mut();
        return Err(err("rados_create2", r));
    }
    // SAFETY: an unconnected handle; a C string.
    let r = unsafe { rados_conf_read_file(c.0, conf_c.as_ptr()) };
    if r < 0 {
        return Err(err(&format!("reading {}", conf.display()), r));
    }
    for (k, v) in [
        ("client_mount_timeout", "15"),
        ("rados_mon_op_timeout", "30"),
    ] {
        let (k, v) = (cstring("option", k)?, cstring("value", v)?);
        // SAFETY: an unconnected handle; C strings.
        unsafe { rados_conf_set(c.0, k.as_ptr(), v.as_ptr()) };
    }
    // SAFETY: a configured handle.
    let r = unsafe { rados_connect(c.0) };
    if r < 0 {
        return Err(BackendError::Unreachable(os_error(r as isize)));
    }
    let cmds = [cmd.as_ptr()];
    let (mut out, mut out_len, mut outs, mut outs_len) =
        (ptr::null_mut(), 0usize, ptr::null_mut(), 0usize);
    // SAFETY: a connected handle; one C string; `input` readable for its
    // length; librados allocates the outputs, freed below.
    let r = unsafe {
        rados_mon_command(
            c.0,
            cmds.as_ptr(),
            1,
            input.as_ptr().cast::<c_char>(),
            input.len(),
            &mut out,
            &mut out_len,
            &mut outs,
            &mut outs_len,
        )
    };
    let take = |p: *mut c_char, n: usize| -> Vec<u8> {
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: librados returned `n` bytes at `p`, freed once here.
        let v = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec();
        unsafe { rados_buffer_free(p) };
        v
    };
    let (out, status) = (take(out, out_len), take(outs, outs_len));
    if r < 0 {
        return Err(BackendError::Io(io::Error::new(
            os_error(r as isize).kind(),
            format!(
                "{command}: {}: {}",
                os_error(r as isize),
                String::from_utf8_lossy(&status)
            ),
        )));
    }
    Ok(out)
}

/// `[v2:127.0.0.1:0/123,v1:127.0.0.1:0/123]` (or one address without
/// brackets) as its addresses.
fn parse_addrs(text: &str) -> Vec<String> {
    let t = text.trim();
    let t = t.strip_prefix('[').unwrap_or(t);
    let t = t.strip_suffix(']').unwrap_or(t);
    t.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

fn img_name(opts: &RbdOptions) -> String {
    format!("{}/{}", opts.pool, opts.image)
}

impl Drop for Image {
    fn drop(&mut self) {
        let watch = self
            .watch
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // SAFETY: each handle is closed once, in reverse order of opening,
        // and only if it was opened. An operation whose future is still
        // waiting holds an Arc of this image; one a fenced image gave up
        // on may still be in librbd, and rbd_close completes it (its
        // buffers live in its `Op` until then).
        unsafe {
            if !self.image.is_null() {
                if let Some((handle, raw)) = watch {
                    rbd_update_unwatch(self.image, handle);
                    drop(Box::from_raw(raw));
                }
                rbd_close(self.image);
            }
            if !self.ioctx.is_null() {
                rados_ioctx_destroy(self.ioctx);
            }
            if !self.cluster.is_null() {
                rados_shutdown(self.cluster);
            }
        }
    }
}

/// The buffers an operation keeps until librbd is done with them.
enum Keep {
    None,
    Read(BytesMut),
    Write(
        #[allow(dead_code)] Vec<Bytes>,
        #[allow(dead_code)] Vec<libc::iovec>,
    ),
    /// WRITE SAME's block.
    Pattern(#[allow(dead_code)] Bytes),
    /// COMPARE AND WRITE's two buffers and the word librbd writes the
    /// first differing offset into.
    Compare(
        #[allow(dead_code)] Bytes,
        #[allow(dead_code)] Bytes,
        Box<u64>,
    ),
}

// SAFETY: the iovecs point into the `Bytes` kept beside them, which are
// Send; nothing else holds them.
unsafe impl Send for Keep {}

struct OpState {
    ret: Option<isize>,
    waker: Option<Waker>,
    keep: Keep,
}

/// One asynchronous operation, shared by its future and (as a raw Arc) by
/// its librbd completion.
struct Op {
    state: Mutex<OpState>,
    counters: Arc<Counters>,
    started: Instant,
}

impl Op {
    fn lock(&self) -> MutexGuard<'_, OpState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// librbd's completion callback: records the result and wakes the future.
unsafe extern "C" fn complete(c: RbdCompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the Arc<Op> leaked in `submit` for this completion,
    // which librbd calls exactly once.
    let op = unsafe { Arc::from_raw(arg.cast::<Op>()) };
    // SAFETY: `c` is this callback's completion; released once, here.
    let r = unsafe { rbd_aio_get_return_value(c) };
    unsafe { rbd_aio_release(c) };
    let us = u64::try_from(op.started.elapsed().as_micros()).unwrap_or(u64::MAX);
    op.counters.latency_us.fetch_add(us, Ordering::Relaxed);
    op.counters.completed.fetch_add(1, Ordering::Relaxed);
    op.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    let waker = {
        let mut st = op.lock();
        st.ret = Some(r);
        st.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

/// Waits for an operation's completion.
struct Wait(Arc<Op>);

impl Future for Wait {
    type Output = (isize, Keep);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.0.lock();
        match st.ret {
            Some(r) => Poll::Ready((r, std::mem::replace(&mut st.keep, Keep::None))),
            None => {
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_addrs;

    #[test]
    fn a_clients_addresses_are_each_protocols_address() {
        assert_eq!(
            parse_addrs("[v2:127.0.0.1:0/3412,v1:127.0.0.1:0/3412]"),
            ["v2:127.0.0.1:0/3412", "v1:127.0.0.1:0/3412"]
        );
        assert_eq!(parse_addrs("127.0.0.1:0/7\n"), ["127.0.0.1:0/7"]);
        assert!(parse_addrs("[]").is_empty());
    }
}
