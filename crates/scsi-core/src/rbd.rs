//! A Ceph RBD image as a block backend, through librbd's C API (cargo
//! feature `rbd`; the build finds `librbd.so` and `librados.so`, see
//! `build.rs`). Without librbd the crate still builds, and
//! [`RbdBackend::open`] says the build has none.
//!
//! READ, WRITE and SYNCHRONIZE CACHE go through [`AsyncBackend`]:
//! `rbd_aio_read2`, `rbd_aio_writev` and `rbd_aio_flush`, whose completion
//! callback (on librbd's own thread) wakes the waiting future. No thread
//! waits per command. The rest of SBC (UNMAP, WRITE SAME, COMPARE AND
//! WRITE, GET LBA STATUS …) uses librbd's blocking calls from tokio's
//! blocking pool, as a file does.
//!
//! Durability: a write is durable on the OSDs when librbd completes it
//! unless the client's `rbd cache` holds it (then the backend reports a
//! volatile cache); FUA and SYNCHRONIZE CACHE flush either way.
//!
//! Errors: a timed-out or lost cluster connection is
//! [`BackendError::Unreachable`] (the host retries); `EBLOCKLISTED` fences
//! the LU ([`BackendError::Fenced`]: every later command fails until the
//! LU is opened again), and the gateway logs it once.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(unifab_rbd)]
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::backend::{
    AllocationRun, AsyncBackend, BackendCaps, BackendError, BackendIoStats, BlockBackend, IoFuture,
};

#[cfg(unifab_rbd)]
mod ffi;
#[cfg(unifab_rbd)]
mod image;

/// Where an RBD image is and how to reach its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdOptions {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The cluster's ceph.conf (None: `$CEPH_CONF`, else
    /// `/etc/ceph/ceph.conf`). The keyring is the one it names.
    pub ceph_conf: Option<PathBuf>,
    /// The client's id (`admin`: client.admin).
    pub ceph_id: String,
    /// Creates a missing image of this many bytes; without it a missing
    /// image is an error.
    pub size: Option<u64>,
    /// How long an operation may wait for the cluster before it fails
    /// with [`BackendError::Unreachable`] (librados' `rados_osd_op_timeout`
    /// and `rados_mon_op_timeout`). Zero: wait for ever.
    pub op_timeout: Duration,
    /// How long opening may wait for the monitors (`client_mount_timeout`).
    pub connect_timeout: Duration,
    /// Refuses writes.
    pub read_only: bool,
    /// Holds the image's exclusive lock for as long as it is open
    /// (`rbd_lock_acquire`): no other client writes it meanwhile, and a
    /// second gateway that is not in one cluster with this one refuses to
    /// open it instead of interleaving writes. A writable image only.
    pub exclusive: bool,
    /// How long opening waits for another client's exclusive lock (a dead
    /// gateway's lock is broken once its watch expires).
    pub lock_timeout: Duration,
}

impl RbdOptions {
    /// Options for `POOL/IMAGE` with the defaults.
    pub fn parse(spec: &str) -> Result<RbdOptions, String> {
        let (pool, image) = spec
            .split_once('/')
            .ok_or_else(|| format!("{spec:?} is not POOL/IMAGE"))?;
        let ok = |s: &str| !s.is_empty() && !s.contains(['/', '@', '\0']);
        if !ok(pool) || !ok(image) {
            return Err(format!(
                "{spec:?} is not POOL/IMAGE (both non-empty, without '/', '@' or NUL)"
            ));
        }
        Ok(RbdOptions {
            pool: pool.to_owned(),
            image: image.to_owned(),
            ceph_conf: None,
            ceph_id: "admin".to_owned(),
            size: None,
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            read_only: false,
            exclusive: true,
            lock_timeout: Duration::from_secs(45),
        })
    }

    /// The ceph.conf this resolves to.
    pub fn conf_path(&self) -> PathBuf {
        self.ceph_conf
            .clone()
            .or_else(|| std::env::var_os("CEPH_CONF").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/etc/ceph/ceph.conf"))
    }
}

/// What the image's header watch calls, kept to watch a reopened image.
#[cfg(unifab_rbd)]
type OnChange = Arc<dyn Fn() + Send + Sync>;

/// An RBD image.
pub struct RbdBackend {
    opts: RbdOptions,
    size: AtomicU64,
    /// The open image, one librados client; [`BlockBackend::reconnect`]
    /// replaces it (operations in flight keep the one they started on).
    /// Every command reads it: a lock whose readers take no shared cache
    /// line.
    #[cfg(unifab_rbd)]
    img: crossbeam_utils::sync::ShardedLock<Arc<image::Image>>,
    /// What [`RbdBackend::watch`] registered, and serialises reconnects.
    #[cfg(unifab_rbd)]
    on_change: Mutex<Option<OnChange>>,
}

impl fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdBackend")
            .field("pool", &self.opts.pool)
            .field("image", &self.opts.image)
            .field("size", &self.size.load(Ordering::Relaxed))
            .finish()
    }
}

impl RbdBackend {
    /// True when this build can open RBD images (it found librbd).
    pub const AVAILABLE: bool = cfg!(unifab_rbd);

    /// Connects to the cluster and opens (or, with a size, creates) the
    /// image. Blocks up to `connect_timeout` for the monitors.
    pub fn open(opts: RbdOptions) -> Result<RbdBackend, BackendError> {
        #[cfg(unifab_rbd)]
        {
            let img = image::Image::open(&opts)?;
            let size = img.get_size()?;
            if let Some(want) = opts.size
                && size < want
            {
                return Err(BackendError::Io(std::io::Error::other(format!(
                    "rbd image {}/{} holds {size} bytes, less than the configured {want}",
                    opts.pool, opts.image
                ))));
            }
            Ok(RbdBackend {
                opts,
                size: AtomicU64::new(size),
                img: crossbeam_utils::sync::ShardedLock::new(Arc::new(img)),
                on_change: Mutex::new(None),
            })
        }
        #[cfg(not(unifab_rbd))]
        {
            let _ = opts;
            Err(BackendError::Io(std::io::Error::other(
                "this build of unifab has no librbd (build with the rbd feature where librbd-dev and librados-dev are installed)",
            )))
        }
    }

    /// The options it was opened with.
    pub fn options(&self) -> &RbdOptions {
        &self.opts
    }

    /// The open image.
    #[cfg(unifab_rbd)]
    fn img(&self) -> Arc<image::Image> {
        self.img.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True once the cluster blocklisted this client: the LU no longer
    /// serves (until [`BlockBackend::reconnect`]).
    pub fn is_fenced(&self) -> bool {
        #[cfg(unifab_rbd)]
        return self.img().is_fenced();
        #[cfg(not(unifab_rbd))]
        false
    }

    /// Calls `f` (on librbd's thread: keep it short, and do not call back
    /// into this backend from it) whenever the image's header changes,
    /// e.g. when someone resizes it; then [`RbdBackend::refresh_size`]
    /// re-reads the size from a thread that may block.
    pub fn watch(&self, f: Box<dyn Fn() + Send + Sync>) -> Result<(), BackendError> {
        #[cfg(unifab_rbd)]
        {
            let f: OnChange = Arc::from(f);
            let mut slot = self.on_change.lock().unwrap_or_else(|p| p.into_inner());
            let g = f.clone();
            self.img().watch(Box::new(move || g()))?;
            *slot = Some(f);
            Ok(())
        }
        #[cfg(not(unifab_rbd))]
        {
            let _ = f;
            Ok(())
        }
    }

    /// Re-reads the image's size (after a resize by someone else); returns
    /// it.
    pub fn refresh_size(&self) -> Result<u64, BackendError> {
        #[cfg(unifab_rbd)]
        {
            let s = self.img().get_size()?;
            self.size.store(s, Ordering::Release);
            Ok(s)
        }
        #[cfg(not(unifab_rbd))]
        {
            Ok(self.size.load(Ordering::Acquire))
        }
    }

    /// Checks a request against fencing (`fenced`: the image's client is
    /// blocklisted), read-only and the image's size.
    fn check(&self, fenced: bool, offset: u64, len: u64, write: bool) -> Result<(), BackendError> {
        if fenced {
            return Err(BackendError::Fenced(format!(
                "client {} was blocklisted by the cluster",
                self.opts.ceph_id
            )));
        }
        if write && self.opts.read_only {
            return Err(BackendError::ReadOnly);
        }
        let size = self.size.load(Ordering::Acquire);
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BackendError::OutOfRange { offset, len, size }),
        }
    }
}

/// Sends one monitor command (Ceph's JSON form, e.g.
/// `{"prefix": "osd blocklist", "blocklistop": "add", "addr": "…"}`) as
/// `client.<ceph_id>` of the cluster `ceph_conf` names, with `input` as
/// its input buffer, and returns its output (`-o`). For tooling and
/// fencing, where the Python `ceph` command is not at hand.
pub fn mon_command(
    ceph_conf: &std::path::Path,
    ceph_id: &str,
    command: &str,
    input: &[u8],
) -> Result<Vec<u8>, BackendError> {
    #[cfg(unifab_rbd)]
    return image::mon_command(ceph_conf, ceph_id, command, input);
    #[cfg(not(unifab_rbd))]
    {
        let _ = (ceph_conf, ceph_id, command, input);
        Err(BackendError::Io(std::io::Error::other(
            "this build of unifab has no librados",
        )))
    }
}

fn ready<T: Send + 'static>(r: Result<T, BackendError>) -> IoFuture<T> {
    Box::pin(std::future::ready(r))
}

#[cfg(unifab_rbd)]
impl AsyncBackend for RbdBackend {
    fn read(&self, offset: u64, len: usize) -> IoFuture<Bytes> {
        let img = self.img();
        if let Err(e) = self.check(img.is_fenced(), offset, len as u64, false) {
            return ready(Err(e));
        }
        img.aio_read(offset, len)
    }

    fn write(&self, offset: u64, data: Vec<Bytes>, fua: bool) -> IoFuture<()> {
        let img = self.img();
        let len: usize = data.iter().map(Bytes::len).sum();
        if let Err(e) = self.check(img.is_fenced(), offset, len as u64, true) {
            return ready(Err(e));
        }
        img.aio_write(offset, data, fua)
    }

    fn flush(&self) -> IoFuture<()> {
        let img = self.img();
        if let Err(e) = self.check(img.is_fenced(), 0, 0, false) {
            return ready(Err(e));
        }
        img.aio_flush()
    }

    /// `rbd_aio_writesame`: the OSDs replicate the block.
    fn write_same(&self, offset: u64, len: u64, pattern: Bytes) -> Option<IoFuture<()>> {
        let img = self.img();
        if pattern.is_empty() || !len.is_multiple_of(pattern.len() as u64) {
            return None;
        }
        let len = usize::try_from(len).ok()?;
        if let Err(e) = self.check(img.is_fenced(), offset, len as u64, true) {
            return Some(ready(Err(e)));
        }
        Some(img.aio_write_same(offset, len, pattern))
    }

    fn discard(&self, offset: u64, len: u64) -> Option<IoFuture<()>> {
        let img = self.img();
        if let Err(e) = self.check(img.is_fenced(), offset, len, true) {
            return Some(ready(Err(e)));
        }
        Some(img.aio_discard(offset, len))
    }

    /// `rbd_aio_compare_and_write`: atomic at the OSD, so against other
    /// gateways on the image too. librbd refuses (EINVAL) a range that
    /// spans two objects; the LU then does it under its own lock.
    fn compare_and_write(
        &self,
        offset: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Option<IoFuture<Option<u64>>> {
        let img = self.img();
        if compare.len() != write.len() {
            return None;
        }
        if let Err(e) = self.check(img.is_fenced(), offset, write.len() as u64, true) {
            return Some(ready(Err(e)));
        }
        Some(img.aio_compare_and_write(offset, compare, write, fua))
    }
}

#[cfg(not(unifab_rbd))]
impl AsyncBackend for RbdBackend {
    fn read(&self, _offset: u64, _len: usize) -> IoFuture<Bytes> {
        ready(Err(BackendError::FixedSize))
    }
    fn write(&self, _offset: u64, _data: Vec<Bytes>, _fua: bool) -> IoFuture<()> {
        ready(Err(BackendError::FixedSize))
    }
    fn flush(&self) -> IoFuture<()> {
        ready(Err(BackendError::FixedSize))
    }
}

impl BlockBackend for RbdBackend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.check(self.is_fenced(), offset, buf.len() as u64, false)?;
        #[cfg(unifab_rbd)]
        return self.img().read(offset, buf);
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError> {
        let len: u64 = data.iter().map(|b| b.len() as u64).sum();
        self.check(self.is_fenced(), offset, len, true)?;
        #[cfg(unifab_rbd)]
        {
            let mut at = offset;
            for piece in data {
                self.img().write(at, piece)?;
                at += piece.len() as u64;
            }
            if fua {
                self.img().flush()?;
            }
            Ok(())
        }
        #[cfg(not(unifab_rbd))]
        {
            let _ = fua;
            Err(BackendError::FixedSize)
        }
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.check(self.is_fenced(), 0, 0, false)?;
        #[cfg(unifab_rbd)]
        return self.img().flush();
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check(self.is_fenced(), offset, len, true)?;
        #[cfg(unifab_rbd)]
        return self.img().discard(offset, len);
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check(self.is_fenced(), offset, len, true)?;
        #[cfg(unifab_rbd)]
        return self.img().write_zeroes(offset, len);
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError> {
        let size = self.size();
        let len = len.min(size.saturating_sub(offset));
        self.check(self.is_fenced(), offset, len, false)?;
        #[cfg(unifab_rbd)]
        return self.img().allocation(offset, len);
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            discard: true,
            discard_zeroes: true,
            allocation_status: true,
            #[cfg(unifab_rbd)]
            volatile_cache: self.img().cache,
            #[cfg(not(unifab_rbd))]
            volatile_cache: true,
            read_only: self.opts.read_only,
        }
    }

    fn grow(&self, new_size: u64) -> Result<(), BackendError> {
        self.check(self.is_fenced(), 0, 0, true)?;
        let size = self.refresh_size()?;
        if new_size < size {
            return Err(BackendError::Shrink {
                size,
                requested: new_size,
            });
        }
        if new_size == size {
            return Ok(());
        }
        #[cfg(unifab_rbd)]
        {
            self.img().resize(new_size)?;
            self.size.store(new_size, Ordering::Release);
            Ok(())
        }
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn describe(&self) -> String {
        format!("rbd:{}/{}", self.opts.pool, self.opts.image)
    }

    fn aio(&self) -> Option<&dyn AsyncBackend> {
        Some(self)
    }

    /// librbd completes commands one by one, each after a round trip to
    /// the OSDs: holding answers for a batch cost 4 KiB writes a quarter
    /// of their rate on 16 cores and gained nothing on 2
    /// (docs/measurements/2026-11-28-rbd-prompt-answers.md).
    fn answer_promptly(&self) -> bool {
        true
    }

    fn fenced(&self) -> bool {
        self.is_fenced()
    }

    fn io_stats(&self) -> Option<BackendIoStats> {
        #[cfg(unifab_rbd)]
        return Some(self.img().stats());
        #[cfg(not(unifab_rbd))]
        None
    }

    fn storage_clients(&self) -> Vec<String> {
        #[cfg(unifab_rbd)]
        match self.img().client_addrs() {
            Ok(a) => return a,
            Err(e) => {
                tracing::warn!(image = %self.describe(), error = %e,
                    "rbd: cannot tell this client's addresses: the cluster's other gateways cannot fence it");
            }
        }
        Vec::new()
    }

    /// Blocklists each client, then waits for the OSD map that says so
    /// (see `docs/alua.md`, fencing a departed gateway's RBD clients).
    fn fence_clients(&self, clients: &[String]) -> Result<(), BackendError> {
        #[cfg(unifab_rbd)]
        {
            let img = self.img();
            for c in clients {
                img.blocklist(c)?;
            }
            Ok(())
        }
        #[cfg(not(unifab_rbd))]
        {
            let _ = clients;
            Err(BackendError::FixedSize)
        }
    }

    /// Opens the image as a new librados client (a new address the
    /// cluster has not blocklisted), watches it as the old one was
    /// watched, lets every write in flight on the old client finish (or
    /// fail: a blocklisted client's do) before the new one serves, and
    /// closes the old one. With the exclusive lock, only once the old
    /// client is fenced: a live one would keep the lock from the new one,
    /// while a blocklisted one loses its watch, and librbd breaks the lock
    /// of a client without one (the new client waits up to
    /// `lock_timeout` for that; a lock another live client took meanwhile
    /// is kept, and this fails saying so, the image still fenced).
    fn reconnect(&self) -> Result<(), BackendError> {
        #[cfg(unifab_rbd)]
        {
            let watch = self.on_change.lock().unwrap_or_else(|p| p.into_inner());
            let old = self.img();
            if self.opts.exclusive && !self.opts.read_only && !old.is_fenced() {
                return Err(BackendError::Io(std::io::Error::other(format!(
                    "{} holds the image's exclusive lock and is not fenced: it reopens only with a restart",
                    self.describe()
                ))));
            }
            let mut opts = self.opts.clone();
            opts.size = None;
            let mut new = image::Image::open(&opts)?;
            new.share_counters(&old);
            let new = Arc::new(new);
            if let Some(f) = watch.as_ref() {
                let f = f.clone();
                new.watch(Box::new(move || f()))?;
            }
            let size = new.get_size()?;
            // A live old client pushes out what it still holds. A fenced
            // one is not asked: librbd may hold writes it parked when the
            // blocklist landed, which a flush would wait for for ever, and
            // none of them can land (the new client's lock blocklisted it
            // again).
            if !old.is_fenced() {
                let _ = old.flush();
            }
            self.size.store(size, Ordering::Release);
            *self.img.write().unwrap_or_else(|p| p.into_inner()) = new;
            tracing::info!(image = %self.describe(), fenced_before = old.is_fenced(),
                "rbd: the image is open as a new client");
            // The old client closes with its last operation; closing may
            // wait for the cluster, so not on this thread.
            let _ = std::thread::Builder::new()
                .name("rbd-close".into())
                .spawn(move || drop(old));
            Ok(())
        }
        #[cfg(not(unifab_rbd))]
        Err(BackendError::FixedSize)
    }

    fn quiesce(&self) -> Result<(), BackendError> {
        // rbd_flush returns when every write submitted before it has
        // completed (and is durable): what an exclusive writer needs.
        BlockBackend::flush(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_pool_slash_image() {
        let o = RbdOptions::parse("rbd/vol0").unwrap();
        assert_eq!((o.pool.as_str(), o.image.as_str()), ("rbd", "vol0"));
        assert_eq!(o.ceph_id, "admin");
        for bad in ["", "rbd", "/vol", "rbd/", "a/b/c", "rbd/img@snap"] {
            assert!(RbdOptions::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_conf_path_falls_back_to_etc_ceph() {
        let mut o = RbdOptions::parse("p/i").unwrap();
        o.ceph_conf = Some(PathBuf::from("/tmp/x.conf"));
        assert_eq!(o.conf_path(), PathBuf::from("/tmp/x.conf"));
    }
}
