//! Block backends: where an emulated logical unit keeps its bytes.
//!
//! A [`BlockBackend`] is byte-addressed and synchronous (blocking); the
//! emulated LU calls it inline or from tokio's blocking pool. Two
//! implementations ship: [`MemoryBackend`] (sparse, chunked RAM) and
//! [`FileBackend`] (a sparse regular file with positioned I/O, `fdatasync`
//! durability, hole punching and `SEEK_DATA`/`SEEK_HOLE` allocation status).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// Errors of a block backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A read handed back a buffer other than the one it was given (a
    /// backend bug): its bytes are not used.
    #[error("the backend returned a buffer other than the one it was given")]
    ForeignBuffer,
    /// The byte range is not inside the backend.
    #[error("range {offset}+{len} outside backend of {size} bytes")]
    OutOfRange {
        /// Start offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Backend size.
        size: u64,
    },
    /// Another process (or open) already serves this file.
    #[error("{0} is locked by another user")]
    Locked(PathBuf),
    /// The file is missing and no size was given to create it.
    #[error("{0} does not exist and no size was given")]
    NoSize(PathBuf),
    /// The existing file is smaller than the configured size and cannot
    /// be used without losing the configured capacity.
    #[error("{path} holds {actual} bytes, larger than the configured {configured}")]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Its size.
        actual: u64,
        /// The configured size.
        configured: u64,
    },
    /// The backend was opened read-only.
    #[error("backend is read-only")]
    ReadOnly,
    /// A backend only grows: shrinking would cut off blocks a host may
    /// hold data in.
    #[error("cannot shrink a backend of {size} bytes to {requested}")]
    Shrink {
        /// Its size.
        size: u64,
        /// The size asked for.
        requested: u64,
    },
    /// The backend cannot change its size.
    #[error("this backend cannot change its size")]
    FixedSize,
    /// An operating-system error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The storage behind the backend (a Ceph cluster) did not answer or
    /// cannot be reached now; nothing is known lost, and the host should
    /// retry (ABORTED COMMAND, LOGICAL UNIT COMMUNICATION FAILURE or
    /// TIME-OUT, never a medium error).
    #[error("the storage cannot be reached: {0}")]
    Unreachable(io::Error),
    /// The storage has fenced this gateway off (Ceph blocklisted its
    /// client): the LU stops serving until the operator opens it again.
    #[error("fenced off by the storage: {0}")]
    Fenced(String),
    /// Not issued: the target port the command came through turned
    /// Unavailable (a cluster member fencing itself) before the I/O was
    /// handed to the storage.
    #[error("not issued: the target port is unavailable")]
    PortUnavailable,
    /// An error at a known byte: the first byte that could not be read or
    /// written (the LU reports its LBA in the sense data).
    #[error("at byte {offset}: {source}")]
    At {
        /// The first failing byte.
        offset: u64,
        /// What failed.
        source: io::Error,
    },
}

impl BackendError {
    /// The first failing byte, when the backend knows it.
    pub fn offset(&self) -> Option<u64> {
        match self {
            BackendError::At { offset, .. } => Some(*offset),
            _ => None,
        }
    }

    /// The medium (file system, thin pool) has no space left.
    pub fn is_out_of_space(&self) -> bool {
        match self {
            BackendError::Io(e) | BackendError::At { source: e, .. } => {
                e.raw_os_error() == Some(libc::ENOSPC)
                    || e.raw_os_error() == Some(libc::EDQUOT)
                    || e.kind() == io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

/// The LBA mapping resources behind a thin backend (SBC-3 §4.7.3.7): what
/// the medium can still allocate and what this LU holds, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provisioning {
    /// Bytes that can still be allocated (a file: the file system's space
    /// available to the process). Shared with whatever else uses the pool.
    pub available: u64,
    /// Bytes allocated to this backend (a file: its allocated blocks).
    pub used: u64,
}

/// What a backend can do beyond reading and writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BackendCaps {
    /// `discard` deallocates storage.
    pub discard: bool,
    /// Discarded ranges read back as zeroes (LBPRZ).
    pub discard_zeroes: bool,
    /// `allocation` reports real mapped/deallocated state.
    pub allocation_status: bool,
    /// Writes are volatile until `flush` (a write cache exists).
    pub volatile_cache: bool,
    /// The backend refuses writes.
    pub read_only: bool,
}

/// Operations a backend has in flight and has completed, for operators
/// (`unifab show luns`, `unifab_lu_backend_*` metrics); a backend that
/// sends I/O over a network (RBD) keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackendIoStats {
    /// Operations submitted and not yet completed.
    pub in_flight: u64,
    /// Operations completed.
    pub completed: u64,
    /// Sum of their latencies (submission to completion), in microseconds.
    pub latency_us_total: u64,
}

/// Where a LU's plain writes (not FUA, not WRITE AND VERIFY) run, for
/// operators (`unifab show luns`, the `unifab_lu_write_path` metric): on
/// a disk file system it decides what a write costs, and it can change
/// while the LU runs (a file system that stops taking no-wait writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WritePath {
    /// On the connection's own task: the medium cannot wait for a device
    /// (memory, tmpfs), or the LU was configured `io_mode = "inline"`.
    Inline,
    /// On the connection's task with `pwritev2(RWF_NOWAIT)`; what would
    /// wait (a page to allocate, a lock, writeback throttling) goes to the
    /// I/O threads (XFS).
    NoWait,
    /// The file system takes `RWF_NOWAIT` but has lately written nothing
    /// that way (btrfs: every write to a copy-on-write file needs new
    /// extents): writes go to the I/O threads, one in 64 tries again.
    NoWaitBackingOff,
    /// Every write on the I/O threads (tokio's blocking pool), two thread
    /// hand-offs each: the file system refuses `RWF_NOWAIT` for buffered
    /// writes (ext4), or `io_mode = "blocking"`.
    IoThreads,
    /// Submitted to remote storage asynchronously (RBD's aio).
    Async,
}

impl WritePath {
    /// The name `show luns` and the metric's `path` label carry.
    pub fn name(self) -> &'static str {
        match self {
            WritePath::Inline => "inline",
            WritePath::NoWait => "no-wait",
            WritePath::NoWaitBackingOff => "no-wait backing off",
            WritePath::IoThreads => "io threads",
            WritePath::Async => "async",
        }
    }

    /// Every path, in the order the metric lists them.
    pub const ALL: [WritePath; 5] = [
        WritePath::Inline,
        WritePath::NoWait,
        WritePath::NoWaitBackingOff,
        WritePath::IoThreads,
        WritePath::Async,
    ];
}

/// A run of equal allocation state starting at the queried offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AllocationRun {
    /// True if storage is allocated (mapped), false for a hole.
    pub mapped: bool,
    /// Bytes from the queried offset with this state (at least 1 when the
    /// offset is inside the backend, clamped to the queried length).
    pub len: u64,
}

/// Byte-addressed block storage.
pub trait BlockBackend: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset` into `buf`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError>;
    /// Writes the slices, in order, starting at `offset`. With `fua` the
    /// data is durable when this returns.
    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError>;
    /// Makes every completed write durable (`fdatasync`).
    fn flush(&self) -> Result<(), BackendError>;
    /// Deallocates a range; it reads back as zeroes if
    /// [`BackendCaps::discard_zeroes`].
    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError>;
    /// Writes zeroes over a range.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError>;
    /// Allocation state of the run starting at `offset` (inside the
    /// backend), at most `len` long (clamped to the end).
    fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError>;
    /// Capabilities.
    fn caps(&self) -> BackendCaps;
    /// Grows the backend to `new_size` bytes (the new blocks read as
    /// zeros); a smaller size is refused. Default: [`BackendError::FixedSize`].
    fn grow(&self, new_size: u64) -> Result<(), BackendError> {
        let _ = new_size;
        Err(BackendError::FixedSize)
    }
    /// `"memory"` or `"file:/path"`, for operators.
    fn describe(&self) -> String;

    /// The LBA mapping resources, for a thin backend that can tell
    /// ([`Provisioning`]); `None` (the default) if it cannot.
    fn provisioning(&self) -> Option<Provisioning> {
        None
    }

    /// True when no operation can wait for a storage device (RAM, tmpfs):
    /// callers may then run I/O inline on an async worker thread.
    fn never_blocks(&self) -> bool {
        false
    }

    /// Where plain writes run when the LU leaves it to the backend
    /// (`io_mode = "adaptive"`, the default), as it stands now
    /// ([`WritePath`]). The default follows [`BlockBackend::never_blocks`]
    /// and [`BlockBackend::aio`]; a backend that takes no-wait writes says
    /// how that is going.
    fn write_path(&self) -> WritePath {
        if self.aio().is_some() {
            WritePath::Async
        } else if self.never_blocks() {
            WritePath::Inline
        } else {
            WritePath::IoThreads
        }
    }

    /// True when the backend completes commands one at a time, each after
    /// a network round trip (RBD): a transport then sends each answer as
    /// its command completes instead of holding it for a batch (iSCSI's
    /// response coalescing), which would add the wait for the batch's
    /// last completion to every command and save the host nothing.
    fn answer_promptly(&self) -> bool {
        false
    }

    /// [`BlockBackend::read_at`] into memory that need not be initialised:
    /// reads `buf.len()` bytes at `offset` and returns `buf` itself, now
    /// initialised. A large read then need not zero its buffer first. The
    /// default zero-fills `buf` and calls `read_at`; the file and memory
    /// backends write into it directly.
    ///
    /// Callers check that the slice returned is `buf`, whole; anything
    /// else is a backend error, never trusted.
    fn read_at_uninit<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        let init = zero_fill(buf);
        self.read_at(offset, init)?;
        Ok(init)
    }

    /// Reads as much as can be read without waiting for a device
    /// (`preadv2(RWF_NOWAIT)`: page-cache hits) into the start of `buf`,
    /// and returns that prefix of `buf`, initialised. The caller reads the
    /// rest with [`BlockBackend::read_at_uninit`] on a thread that may
    /// block. The default reads nothing. Callers check that the slice
    /// returned is a prefix of `buf` (or empty).
    fn read_at_nowait<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        let _ = (offset, buf);
        Ok(&mut [])
    }

    /// Writes as much of `data` at `offset` as can be written without
    /// waiting for anything (`pwritev2(RWF_NOWAIT)` on a file system that
    /// takes buffered writes that way: XFS, not ext4), and
    /// returns how many bytes it wrote, from the start of `data`. Never
    /// durable on its own (a FUA write does not come here). The caller
    /// writes the rest with [`BlockBackend::write_at`] on a thread that may
    /// block, which also reports any error properly; `Err` only for a range
    /// outside the medium. The default writes nothing.
    fn write_at_nowait(&self, offset: u64, data: &[Bytes]) -> Result<usize, BackendError> {
        let _ = (offset, data);
        Ok(0)
    }

    /// The bytes at `offset..offset + len` as a shared buffer without
    /// copying them (a slice of a mapping of the medium), when the backend
    /// can do that without waiting for a device. `None`: use
    /// [`BlockBackend::read_at`].
    ///
    /// The slice shows the medium as it is when the transport sends it,
    /// which for overlapping unordered commands SAM allows.
    fn read_shared(&self, offset: u64, len: usize) -> Option<Result<Bytes, BackendError>> {
        let _ = (offset, len);
        None
    }

    /// Operations in flight and completed, with their latency, for a
    /// backend that counts them; `None` (the default) otherwise.
    fn io_stats(&self) -> Option<BackendIoStats> {
        None
    }

    /// True while the storage has fenced this gateway's client off
    /// ([`BackendError::Fenced`]): nothing is served until
    /// [`BlockBackend::reconnect`] opens it as a new client. False (the
    /// default) for a storage that cannot fence.
    fn fenced(&self) -> bool {
        false
    }

    /// The backend's asynchronous interface, when it has one
    /// ([`AsyncBackend`]); `None` (the default): the blocking calls.
    fn aio(&self) -> Option<&dyn AsyncBackend> {
        None
    }

    /// The names by which a shared storage knows this gateway's clients,
    /// where the storage can fence clients off itself (RBD: the librados
    /// client's addresses, which `ceph osd blocklist add` takes). In a
    /// cluster each gateway announces them, and the others fence them off
    /// ([`BlockBackend::fence_clients`]) when it leaves. Empty (the
    /// default): the storage has nothing to fence.
    fn storage_clients(&self) -> Vec<String> {
        Vec::new()
    }

    /// Fences the storage's clients named (another gateway's, as its
    /// [`BlockBackend::storage_clients`] gave them) off the storage: once
    /// this returns, no operation of theirs lands any more. Blocks. The
    /// default refuses: the storage cannot.
    fn fence_clients(&self, clients: &[String]) -> Result<(), BackendError> {
        Err(BackendError::Io(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "{} cannot fence other clients off ({})",
                self.describe(),
                clients.join(", ")
            ),
        )))
    }

    /// Opens the storage afresh as a new client (whose
    /// [`BlockBackend::storage_clients`] are new), after another gateway
    /// may have fenced this one's off: a fenced backend serves again.
    /// Operations still in flight finish on the old client first. Blocks.
    /// The default has nothing to do.
    fn reconnect(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Waits until every operation submitted through [`BlockBackend::aio`]
    /// has completed. The LU calls it (on a thread that may block) after
    /// taking its write lock exclusively, so a COMPARE AND WRITE sees no
    /// write still in flight. The default has nothing to wait for.
    fn quiesce(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// What an asynchronous backend operation resolves to.
pub type IoFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, BackendError>> + Send>>;

/// Submission without a thread, for a backend whose library completes I/O
/// by callback (librbd): the emulated LU awaits these for READ, WRITE and
/// SYNCHRONIZE CACHE instead of sending [`BlockBackend`]'s blocking calls
/// to tokio's blocking pool, so a thousand commands in flight are a
/// thousand small futures, not a thousand threads.
///
/// Each method submits the operation before it returns (the LU relies on
/// that to order a write under its write lock); the future only waits for
/// the completion. Dropping the future does not cancel the operation, and
/// the backend keeps the buffers alive until the library is done with
/// them.
pub trait AsyncBackend: Send + Sync {
    /// Reads `len` bytes at `offset`.
    fn read(&self, offset: u64, len: usize) -> IoFuture<Bytes>;
    /// Writes the slices, in order, at `offset`; with `fua` the data is
    /// durable when the future resolves.
    fn write(&self, offset: u64, data: Vec<Bytes>, fua: bool) -> IoFuture<()>;
    /// Makes every write that completed before the call durable.
    fn flush(&self) -> IoFuture<()>;
    /// Writes `pattern` (one logical block) over `offset..offset + len`
    /// (a whole number of blocks): WRITE SAME by the storage itself, the
    /// block sent once rather than `len` bytes. `None` (the default): the
    /// LU writes the blocks itself.
    fn write_same(&self, offset: u64, len: u64, pattern: Bytes) -> Option<IoFuture<()>> {
        let _ = (offset, len, pattern);
        None
    }
    /// Deallocates a range (as [`BlockBackend::discard`]); `None` (the
    /// default): the LU calls the blocking one.
    fn discard(&self, offset: u64, len: u64) -> Option<IoFuture<()>> {
        let _ = (offset, len);
        None
    }
    /// COMPARE AND WRITE done by the storage itself, atomically against
    /// every other writer of the medium (other gateways included): if the
    /// bytes at `offset` equal `compare`, writes `write` there
    /// (`Ok(None)`), else writes nothing (`Ok(Some(i))`, `i` the first
    /// byte that differs). `None` (the default): the storage cannot do it
    /// for this range, and the LU compares and writes under its own lock.
    fn compare_and_write(
        &self,
        offset: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Option<IoFuture<Option<u64>>> {
        let _ = (offset, compare, write, fua);
        None
    }
}

/// Writes zeroes over `buf` and returns it as initialised bytes.
pub fn zero_fill(buf: &mut [MaybeUninit<u8>]) -> &mut [u8] {
    for b in buf.iter_mut() {
        b.write(0);
    }
    // SAFETY: every element was written just above; `MaybeUninit<u8>` and
    // `u8` have the same layout.
    unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(buf) as *mut [u8]) }
}

/// A shared mapping of a whole file (writable unless the LU is read-only).
struct Mapping {
    ptr: *const u8,
    len: usize,
    writable: bool,
    /// One bit per page of the file: the page was seen in the page cache
    /// or written through the mapping, so a read there needs no `mincore`.
    /// Cleared where this backend punches or zeroes a range (the only way
    /// holes come back while the LU runs). A mapping exists only for files
    /// in RAM, so the bitmap costs 1/32768 of RAM the LU already uses.
    resident: Box<[AtomicU64]>,
}

/// The page size the mapping's residency is kept in.
const PAGE: usize = 4096;

// SAFETY: the mapping is read-only and never unmapped while referenced;
// reading shared memory from several threads is sound (writers go through
// pwrite, and torn reads are what concurrent SCSI commands allow anyway).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Whether every page of `[off, off + len)` is in the page cache, so
    /// touching it faults nothing in: pages known resident cost no system
    /// call; otherwise `mincore` answers, and its yes is remembered. Ranges
    /// of more than 1 MiB are not checked (answered `false`).
    fn resident(&self, off: usize, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = off.checked_add(len).filter(|e| *e <= self.len) else {
            return false;
        };
        let pages = off / PAGE..end.div_ceil(PAGE);
        if pages.clone().all(|p| self.known(p)) {
            return true;
        }
        if !self.mincore(off, end) {
            return false;
        }
        self.learn(
            pages.start as u64 * PAGE as u64,
            pages.len() as u64 * PAGE as u64,
        );
        true
    }

    fn known(&self, page: usize) -> bool {
        self.resident
            .get(page / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
    }

    /// Sets (`learn`) or clears (`forget`) the bits of the pages
    /// `[off, off + len)` touches.
    fn mark(&self, off: u64, len: u64, set: bool) {
        if len == 0 {
            return;
        }
        let page = PAGE as u64;
        let first = off / page;
        let last = off.saturating_add(len - 1) / page;
        let bits = self.resident.len() as u64 * 64;
        for p in first..=last.min(bits.saturating_sub(1)) {
            let Some(w) = self.resident.get((p / 64) as usize) else {
                break;
            };
            let bit = 1u64 << (p % 64);
            if set {
                w.fetch_or(bit, Ordering::AcqRel);
            } else {
                w.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    fn learn(&self, off: u64, len: u64) {
        self.mark(off, len, true);
    }

    /// Forgets the pages `[off, off + len)` touches (before a hole is
    /// punched there).
    fn forget(&self, off: u64, len: u64) {
        self.mark(off, len, false);
    }

    /// `mincore` over `[off, end)` (at most 256 pages): all resident?
    fn mincore(&self, off: usize, end: usize) -> bool {
        const MAX_PAGES: usize = 256;
        let start = off & !(PAGE - 1);
        let pages = (end - start).div_ceil(PAGE);
        if pages > MAX_PAGES {
            return false;
        }
        let mut vec = [0u8; MAX_PAGES];
        // SAFETY: `start` is page-aligned and inside our mapping (the
        // mapping starts page-aligned); the range `start..start + pages *
        // PAGE` may pass the mapping's end only within its last page, which
        // mincore accepts; `vec` holds one byte per page.
        let r = unsafe {
            libc::mincore(
                self.ptr.add(start).cast_mut().cast(),
                pages * PAGE,
                vec.as_mut_ptr().cast(),
            )
        };
        r == 0 && vec.iter().take(pages).all(|b| b & 1 == 1)
    }

    fn new(file: &File, len: u64, writable: bool) -> Option<Mapping> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).ok().filter(|l| *l > 0)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of our own file; the result is
        // checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Mapping {
            ptr: p.cast::<u8>().cast_const(),
            len,
            writable,
            resident: (0..len.div_ceil(PAGE).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    /// Copies `data` into the mapping at `offset` when every page it touches
    /// is known resident (else false, and nothing is written: a store into
    /// a hole of a full tmpfs raises SIGBUS); the caller checked the range
    /// against the file size (= the mapping length).
    fn write(&self, offset: usize, data: &[Bytes]) -> bool {
        if !self.writable {
            return false;
        }
        let len = data.iter().map(Bytes::len).sum::<usize>();
        let Some(end) = offset.checked_add(len).filter(|e| *e <= self.len) else {
            return false;
        };
        if len > 0 && !(offset / PAGE..end.div_ceil(PAGE)).all(|p| self.known(p)) {
            return false;
        }
        let mut at = offset;
        for s in data {
            let Some(end) = at.checked_add(s.len()).filter(|e| *e <= self.len) else {
                return false;
            };
            // SAFETY: `at..end` lies inside the writable mapping; `s` is a
            // separate heap buffer, so the regions do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), self.ptr.cast_mut().add(at), s.len());
            }
            at = end;
        }
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped, once.
        unsafe {
            libc::munmap(self.ptr.cast_mut().cast(), self.len);
        }
    }
}

/// A window of a [`Mapping`] that a `Bytes` owns.
struct MappedSlice {
    map: std::sync::Arc<Mapping>,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for MappedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `off + len <= map.len` was checked when the slice was
        // made, and the mapping lives as long as `self.map`.
        unsafe { std::slice::from_raw_parts(self.map.ptr.add(self.off), self.len) }
    }
}

fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::OutOfRange { offset, len, size }),
    }
}

fn total_len(data: &[Bytes]) -> u64 {
    data.iter().map(|b| b.len() as u64).sum()
}

/// Chunk size of [`MemoryBackend`].
const CHUNK: usize = 64 * 1024;

/// Sparse in-memory storage in 64 KiB chunks: a chunk is allocated on
/// first write and freed when a discard covers it whole.
pub struct MemoryBackend {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("size", &self.size)
            .finish()
    }
}

impl MemoryBackend {
    /// An all-zero (all-deallocated) backend of `size` bytes.
    pub fn new(size: u64) -> MemoryBackend {
        let n = size.div_ceil(CHUNK as u64) as usize;
        let mut chunks = Vec::with_capacity(n);
        chunks.resize_with(n, || RwLock::new(None));
        MemoryBackend { size, chunks }
    }

    /// Calls `f(chunk_index, offset_in_chunk, len)` for each chunk piece of
    /// the range, which the caller has checked.
    fn pieces(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, usize) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let idx = (pos / CHUNK as u64) as usize;
            let within = (pos % CHUNK as u64) as usize;
            let n = ((CHUNK - within) as u64).min(end - pos) as usize;
            f(idx, within, n)?;
            pos += n as u64;
        }
        Ok(())
    }

    fn out_of_range(&self, offset: u64, len: usize) -> BackendError {
        BackendError::OutOfRange {
            offset,
            len: len as u64,
            size: self.size,
        }
    }

    /// Walks `offset..offset + len` chunk by chunk, calling
    /// `piece(at, n, bytes)` with `at` counting from `offset`: `bytes` are
    /// the `n` bytes of a written chunk, `None` a piece of a hole. The
    /// pieces cover exactly `0..len`, in order.
    fn read_pieces(
        &self,
        offset: u64,
        len: usize,
        mut piece: impl FnMut(usize, usize, Option<&[u8]>) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        check_range(offset, len as u64, self.size)?;
        let mut done = 0usize;
        Self::pieces(offset, len as u64, |idx, within, n| {
            let guard = self.chunk(idx)?.read().unwrap_or_else(|p| p.into_inner());
            piece(
                done,
                n,
                guard.as_ref().and_then(|c| c.get(within..within + n)),
            )?;
            done += n;
            Ok(())
        })?;
        if done != len {
            return Err(self.out_of_range(offset, len));
        }
        Ok(())
    }

    fn chunk(&self, idx: usize) -> Result<&RwLock<Option<Box<[u8]>>>, BackendError> {
        self.chunks.get(idx).ok_or(BackendError::OutOfRange {
            offset: idx as u64 * CHUNK as u64,
            len: 0,
            size: self.size,
        })
    }

    fn fill(&self, offset: u64, len: u64, zero_and_free: bool) -> Result<(), BackendError> {
        check_range(offset, len, self.size)?;
        Self::pieces(offset, len, |idx, within, n| {
            let mut guard = self.chunk(idx)?.write().unwrap_or_else(|p| p.into_inner());
            if zero_and_free && within == 0 && n == CHUNK {
                *guard = None;
            } else if let Some(c) = guard.as_mut()
                && let Some(dst) = c.get_mut(within..within + n)
            {
                dst.fill(0);
            }
            Ok(())
        })
    }
}

impl BlockBackend for MemoryBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn never_blocks(&self) -> bool {
        true
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        // SAFETY: `read_at_uninit` below writes only initialised bytes, so
        // `buf` stays initialised; `u8` and `MaybeUninit<u8>` share a layout.
        let buf = unsafe { &mut *(std::ptr::from_mut::<[u8]>(buf) as *mut [MaybeUninit<u8>]) };
        self.read_at_uninit(offset, buf).map(|_| ())
    }

    fn read_at_uninit<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        let len = buf.len();
        self.read_pieces(offset, len, |at, n, src| {
            let dst = buf
                .get_mut(at..at + n)
                .ok_or_else(|| self.out_of_range(offset, len))?;
            match src {
                Some(src) if src.len() == n => {
                    // SAFETY: both are `n` bytes long and cannot overlap
                    // (`dst` is the caller's buffer, `src` a chunk's).
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), n);
                    }
                }
                Some(_) => return Err(self.out_of_range(offset, len)),
                None => {
                    zero_fill(dst);
                }
            }
            Ok(())
        })?;
        // SAFETY: `read_pieces` handed out pieces covering exactly
        // 0..buf.len(), and each was written above (a piece of `n` bytes
        // is copied from `n` bytes of data, or zeroed).
        Ok(unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(buf) as *mut [u8]) })
    }

    fn write_at(&self, offset: u64, data: &[Bytes], _fua: bool) -> Result<(), BackendError> {
        let total = total_len(data);
        check_range(offset, total, self.size)?;
        // One lock per chunk, however many segments land in it (a 1 MiB
        // FCP write arrives as ~500 frame payloads): each lock's atomic
        // waits for the copies before it to drain, so locking per segment
        // cost more than the copies.
        let mut segs = data.iter().filter(|b| !b.is_empty());
        let mut cur: &[u8] = &[];
        Self::pieces(offset, total, |idx, within, n| {
            let mut guard = self.chunk(idx)?.write().unwrap_or_else(|p| p.into_inner());
            let chunk = guard.get_or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            let mut dst = chunk.get_mut(within..within + n).unwrap_or_default();
            while !dst.is_empty() {
                if cur.is_empty() {
                    match segs.next() {
                        Some(b) => cur = b,
                        None => break,
                    }
                }
                let k = dst.len().min(cur.len());
                let (d, rest) = dst.split_at_mut(k);
                d.copy_from_slice(&cur[..k]);
                dst = rest;
                cur = &cur[k..];
            }
            Ok(())
        })
    }

    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.fill(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.fill(offset, len, false)
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError> {
        check_range(offset, 1, self.size)?;
        let len = len.max(1).min(self.size - offset);
        let mut mapped = None;
        let mut run = 0u64;
        let _ = Self::pieces(offset, len, |idx, _within, n| {
            let here = self
                .chunk(idx)?
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
            match mapped {
                None => mapped = Some(here),
                Some(m) if m != here => {
                    return Err(BackendError::OutOfRange {
                        offset: 0,
                        len: 0,
                        size: 0,
                    });
                }
                Some(_) => {}
            }
            run += n as u64;
            Ok(())
        });
        Ok(AllocationRun {
            mapped: mapped.unwrap_or(false),
            len: run,
        })
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            discard: true,
            discard_zeroes: true,
            allocation_status: true,
            volatile_cache: false,
            read_only: false,
        }
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }

    /// The LU's own size is the pool: used is the allocated chunks, the
    /// rest available. (Walks the chunk table: asked at most every
    /// threshold check interval, and by LOG SENSE.)
    fn provisioning(&self) -> Option<Provisioning> {
        let chunks = self
            .chunks
            .iter()
            .filter(|c| c.read().map_or(true, |g| g.is_some()))
            .count() as u64;
        let used = (chunks * CHUNK as u64).min(self.size);
        Some(Provisioning {
            available: self.size - used,
            used,
        })
    }
}

/// Options of [`FileBackend::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileOptions {
    /// Open read-only (writes fail with [`BackendError::ReadOnly`]).
    pub read_only: bool,
    /// Hold a shared `flock` instead of an exclusive one: several
    /// processes that coordinate among themselves (a cluster of gateways
    /// fencing each other) may open the file together, and none that
    /// wants it alone can while they do.
    pub shared: bool,
}

/// A sparse regular file.
///
/// Reads and writes are positioned (`pread`, `pwritev`); a FUA write uses
/// `pwritev2(RWF_DSYNC)` (falling back to `pwritev` + `fdatasync`);
/// `flush` is `fdatasync`; `discard` punches a hole
/// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`); allocation status comes
/// from `SEEK_DATA`/`SEEK_HOLE`. The file is held with an exclusive
/// `flock`, so a second opener (another process, or another open in this
/// one) gets [`BackendError::Locked`] — unless every opener asks for a
/// shared one ([`FileOptions::shared`]).
pub struct FileBackend {
    file: File,
    path: PathBuf,
    /// Bytes; grows with [`BlockBackend::grow`].
    size: AtomicU64,
    read_only: bool,
    syncs: AtomicU64,
    /// The file lives in RAM (tmpfs/ramfs): no operation waits for a device.
    in_ram: bool,
    /// `preadv2(RWF_NOWAIT)` works on this file system.
    nowait_reads: std::sync::atomic::AtomicBool,
    /// `pwritev2(RWF_NOWAIT)` works on this file system (XFS; ext4
    /// answers `EOPNOTSUPP` for buffered writes).
    nowait_writes: std::sync::atomic::AtomicBool,
    /// How often it has lately written nothing ([`NowaitMisses`]).
    nowait_misses: NowaitMisses,
    /// For files in RAM: a shared mapping reads are served from, so a
    /// 1 MiB read costs no copy in user space (the only copy is into the
    /// socket).
    map: Option<std::sync::Arc<Mapping>>,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("path", &self.path)
            .field("size", &self.len())
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// When to try a no-wait write. A file system can take `RWF_NOWAIT` and
/// still write nothing that way, every time: btrfs answers `EAGAIN` for a
/// copy-on-write file, whose every write needs new extents. After
/// [`NowaitMisses::GIVE_UP`] attempts in a row that wrote nothing, only
/// one write in [`NowaitMisses::RETRY_EVERY`] tries, so such a file costs
/// a failed system call per 64 writes, and a file system that only
/// throttled for a while (XFS under writeback pressure) gets the fast path
/// back at its first success.
#[derive(Debug, Default)]
struct NowaitMisses(std::sync::atomic::AtomicU32);

impl NowaitMisses {
    const GIVE_UP: u32 = 16;
    const RETRY_EVERY: u32 = 64;

    /// Whether this write should try. While no-wait writes succeed this
    /// only reads the count: no atomic write per write on a LU that many
    /// cores share.
    fn attempt(&self) -> bool {
        if self.0.load(Ordering::Relaxed) < Self::GIVE_UP {
            return true;
        }
        // Given up: every write counts, and one in RETRY_EVERY tries.
        self.0
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(Self::RETRY_EVERY)
    }

    /// Whether the attempts have been given up for now.
    fn backing_off(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= Self::GIVE_UP
    }

    /// What a write that tried did: wrote something, or nothing.
    fn record(&self, wrote: bool) {
        let m = self.0.load(Ordering::Relaxed);
        if wrote {
            if m != 0 {
                self.0.store(0, Ordering::Relaxed);
            }
        } else if m < Self::GIVE_UP {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Most iovecs handed to one `pwritev` call.
const IOV_BATCH: usize = 64;

impl FileBackend {
    /// Opens (or with `size`, creates as a sparse file) the backing file.
    ///
    /// With `size` and an existing smaller file, the file is extended
    /// sparsely; an existing larger file is refused
    /// ([`BackendError::SizeMismatch`]) rather than truncated. Without
    /// `size`, the file's own length is the LU's size.
    pub fn open(
        path: impl AsRef<Path>,
        size: Option<u64>,
        options: FileOptions,
    ) -> Result<FileBackend, BackendError> {
        let path = path.as_ref().to_path_buf();
        let exists = path.exists();
        if !exists && size.is_none() {
            return Err(BackendError::NoSize(path));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!options.read_only)
            .create(!options.read_only && size.is_some())
            .truncate(false)
            .open(&path)?;
        let mode = if options.shared {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a valid, owned file descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(BackendError::Locked(path));
            }
            return Err(err.into());
        }
        let actual = file.metadata()?.len();
        let size = match size {
            Some(want) if actual < want => {
                if options.read_only {
                    return Err(BackendError::SizeMismatch {
                        path,
                        actual,
                        configured: want,
                    });
                }
                file.set_len(want)?;
                want
            }
            Some(want) if actual > want => {
                return Err(BackendError::SizeMismatch {
                    path,
                    actual,
                    configured: want,
                });
            }
            Some(want) => want,
            None => actual,
        };
        let in_ram = file_in_ram(&file);
        let map = if in_ram {
            Mapping::new(&file, size, !options.read_only).map(std::sync::Arc::new)
        } else {
            None
        };
        Ok(FileBackend {
            map,
            file,
            path,
            size: AtomicU64::new(size),
            read_only: options.read_only,
            syncs: AtomicU64::new(0),
            in_ram,
            nowait_reads: std::sync::atomic::AtomicBool::new(!in_ram),
            nowait_writes: std::sync::atomic::AtomicBool::new(!in_ram),
            nowait_misses: NowaitMisses::default(),
        })
    }

    /// Size in bytes now.
    fn len(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// How many durability operations (`fdatasync`, or a `RWF_DSYNC`
    /// write) have completed: the proof that FUA and SYNCHRONIZE CACHE
    /// reached stable storage.
    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fdatasync(&self) -> Result<(), BackendError> {
        self.file.sync_data()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One `pwritev`/`pwritev2` call over up to [`IOV_BATCH`] slices
    /// starting at slice `first`, byte `skip` of it.
    fn write_batch(
        &self,
        offset: u64,
        data: &[Bytes],
        first: usize,
        skip: usize,
        flags: libc::c_int,
    ) -> io::Result<usize> {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [empty; IOV_BATCH];
        let mut n = 0;
        for (i, slice) in data.iter().skip(first).take(IOV_BATCH).enumerate() {
            let s = if i == 0 {
                slice.get(skip..).unwrap_or(&[])
            } else {
                &slice[..]
            };
            if let Some(v) = iov.get_mut(i) {
                v.iov_base = s.as_ptr() as *mut libc::c_void;
                v.iov_len = s.len();
                n = i + 1;
            }
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        let fd = self.file.as_raw_fd();
        // SAFETY: the iovecs point into `data`, which outlives the call;
        // the kernel only reads them.
        let rc = unsafe {
            if flags != 0 {
                libc::pwritev2(fd, iov.as_ptr(), n as libc::c_int, off, flags)
            } else {
                libc::pwritev(fd, iov.as_ptr(), n as libc::c_int, off)
            }
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// Writes every slice with `pwritev2`; a failure names the first byte
    /// not written ([`BackendError::At`]). Pages written become known
    /// resident in the mapping.
    fn write_all(&self, offset: u64, data: &[Bytes], dsync: bool) -> Result<(), BackendError> {
        self.write_io(offset, data, if dsync { libc::RWF_DSYNC } else { 0 })
            .map_err(|(at, source)| BackendError::At { offset: at, source })?;
        if let Some(map) = &self.map {
            map.learn(offset, total_len(data));
        }
        Ok(())
    }

    /// Writes every slice with `pwritev2(flags)` until done or an error,
    /// which comes with the position of the first byte not written.
    fn write_io(
        &self,
        offset: u64,
        data: &[Bytes],
        flags: libc::c_int,
    ) -> Result<(), (u64, io::Error)> {
        let mut first = 0usize;
        let mut skip = 0usize;
        let mut pos = offset;
        while first < data.len() {
            // Skip exhausted or empty slices.
            if data.get(first).is_some_and(|s| skip >= s.len()) {
                first += 1;
                skip = 0;
                continue;
            }
            let mut written = match self.write_batch(pos, data, first, skip, flags) {
                Ok(0) => return Err((pos, io::Error::from(io::ErrorKind::WriteZero))),
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err((pos, e)),
            };
            pos += written as u64;
            while written > 0 {
                let left = data.get(first).map_or(0, |s| s.len() - skip);
                if written >= left {
                    written -= left;
                    first += 1;
                    skip = 0;
                } else {
                    skip += written;
                    written = 0;
                }
            }
        }
        Ok(())
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // A punched or zeroed range may hold holes again: reads there ask
        // mincore until they find it resident.
        if let Some(map) = &self.map {
            map.forget(offset, len);
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        let l = libc::off_t::try_from(len)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: fallocate on an owned descriptor with checked arguments.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, l) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: lseek on an owned descriptor; positioned I/O elsewhere
        // never depends on the file offset.
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), off, whence) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(rc as u64))
    }

    fn zero_by_writing(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        const Z: usize = 256 * 1024;
        let zeros = Bytes::from(vec![0u8; Z.min(len as usize).max(1)]);
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = (end - pos).min(zeros.len() as u64) as usize;
            self.write_all(pos, &[zeros.slice(..n)], false)?;
            pos += n as u64;
        }
        Ok(())
    }
}

impl FileBackend {
    /// Reads into `buf` from `offset` with `preadv2(flags)` until it is
    /// full. Returns the prefix of `buf` the kernel wrote, and why it
    /// stopped short if it did (end of file: `UnexpectedEof`, as
    /// `read_exact_at`).
    fn pread_into<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
        flags: libc::c_int,
    ) -> (&'a mut [u8], Option<io::Error>) {
        let mut done = 0usize;
        let stop = loop {
            if done == buf.len() {
                break None;
            }
            let rest = &mut buf[done..];
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                break Some(io::ErrorKind::InvalidInput.into());
            };
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: `iov` points into `buf`, which outlives the call; the
            // kernel writes at most `iov_len` bytes there.
            let n = unsafe { libc::preadv2(self.file.as_raw_fd(), &iov, 1, at, flags) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            if n == 0 {
                break Some(io::ErrorKind::UnexpectedEof.into());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                break Some(e);
            }
        };
        let head = &mut buf[..done];
        // SAFETY: the kernel wrote bytes 0..done (each successful preadv2
        // filled the next `n`).
        let head = unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(head) as *mut [u8]) };
        (head, stop)
    }
}

impl BlockBackend for FileBackend {
    fn size(&self) -> u64 {
        self.len()
    }

    /// Extends the file sparsely (`ftruncate`) and then the LU's view of
    /// it. A file in RAM keeps its mapping of the old length: the blocks
    /// past it are read and written with `preadv2`/`pwritev2`.
    fn grow(&self, new_size: u64) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        let now = self.len();
        if new_size < now {
            return Err(BackendError::Shrink {
                size: now,
                requested: new_size,
            });
        }
        if new_size > now {
            self.file.set_len(new_size)?;
            self.size.store(new_size, Ordering::Release);
        }
        Ok(())
    }

    fn never_blocks(&self) -> bool {
        self.in_ram
    }

    fn write_path(&self) -> WritePath {
        if self.in_ram {
            WritePath::Inline
        } else if self.read_only || !self.nowait_writes.load(Ordering::Relaxed) {
            WritePath::IoThreads
        } else if self.nowait_misses.backing_off() {
            WritePath::NoWaitBackingOff
        } else {
            WritePath::NoWait
        }
    }

    fn read_shared(&self, offset: u64, len: usize) -> Option<Result<Bytes, BackendError>> {
        let map = self.map.as_ref()?;
        if let Err(e) = check_range(offset, len as u64, self.len()) {
            return Some(Err(e));
        }
        // A read fault on a hole of a shared tmpfs mapping allocates the
        // page, so reading an unmapped LBA would map it (and a host reading
        // the whole LU would fill a thin LU). Ranges that are not wholly
        // in the page cache (holes, or pages swapped out) go through pread,
        // which reads holes as zeros in place. `mincore` answers for the
        // range alone; `SEEK_HOLE` scans on to the next hole, which on a
        // fully allocated tmpfs file is its end (a 4 KiB read cost ~0.5 ms).
        let off = usize::try_from(offset).ok()?;
        if !map.resident(off, len) {
            return None;
        }
        Some(Ok(Bytes::from_owner(MappedSlice {
            map: map.clone(),
            off,
            len,
        })))
    }

    fn read_at_nowait<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        check_range(offset, buf.len() as u64, self.len())?;
        if !self.nowait_reads.load(Ordering::Relaxed) {
            return Ok(&mut []);
        }
        let (head, stop) = self.pread_into(offset, buf, libc::RWF_NOWAIT);
        if let Some(e) = stop
            && matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOSYS)
            )
        {
            // Not on this file system: stop trying.
            self.nowait_reads.store(false, Ordering::Relaxed);
        }
        // EAGAIN (not cached), EOF or another error: the blocking path
        // finishes (and reports errors properly).
        Ok(head)
    }

    fn write_at_nowait(&self, offset: u64, data: &[Bytes]) -> Result<usize, BackendError> {
        let len = total_len(data);
        check_range(offset, len, self.len())?;
        if self.read_only
            || len == 0
            || !self.nowait_writes.load(Ordering::Relaxed)
            || !self.nowait_misses.attempt()
        {
            return Ok(0);
        }
        let done = match self.write_io(offset, data, libc::RWF_NOWAIT) {
            Ok(()) => len,
            Err((at, e)) => {
                if at == offset
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ENOSYS)
                    )
                {
                    // Not on this file system: stop trying.
                    self.nowait_writes.store(false, Ordering::Relaxed);
                }
                // EAGAIN (it would have waited: a page to allocate, a lock,
                // writeback throttling), or an error the blocking path
                // meets again and reports (ENOSPC, EIO) with its LBA.
                at - offset
            }
        };
        self.nowait_misses.record(done > 0);
        if let Some(map) = &self.map {
            map.learn(offset, done);
        }
        Ok(done as usize)
    }

    fn read_at_uninit<'a>(
        &self,
        offset: u64,
        buf: &'a mut [MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        check_range(offset, buf.len() as u64, self.len())?;
        match self.pread_into(offset, buf, 0) {
            (all, None) => Ok(all),
            (_, Some(e)) => Err(e.into()),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        check_range(offset, buf.len() as u64, self.len())?;
        self.file.read_exact_at(buf, offset)?;
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, total_len(data), self.len())?;
        // A file in RAM is written through its mapping where every page is
        // known resident: a memcpy, not a syscall per write. A page that may
        // be a hole is written with pwrite, which answers ENOSPC when the
        // file system is full, where a store into the mapping would raise
        // SIGBUS and kill the gateway; the page is known resident after.
        // FUA still ends in fdatasync below.
        if let (Some(map), Ok(at)) = (&self.map, usize::try_from(offset))
            && map.write(at, data)
        {
            if fua {
                return self.fdatasync();
            }
            return Ok(());
        }
        if fua {
            match self.write_all(offset, data, true) {
                Ok(()) => {
                    self.syncs.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(BackendError::At { source, .. })
                    if matches!(
                        source.raw_os_error(),
                        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
                    ) => {}
                Err(e) => return Err(e),
            }
            self.write_all(offset, data, false)?;
            return self.fdatasync();
        }
        self.write_all(offset, data, false)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.read_only {
            return Ok(());
        }
        self.fdatasync()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, len, self.len())?;
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.zero_by_writing(offset, len)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, len, self.len())?;
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
                ) =>
            {
                self.zero_by_writing(offset, len)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError> {
        let size = self.len();
        check_range(offset, 1, size)?;
        let len = len.max(1).min(size - offset);
        let end = offset + len;
        let (mapped, run_end) = match self.seek(offset, libc::SEEK_DATA)? {
            None => (false, end),
            Some(data) if data > offset => (false, data.min(end)),
            Some(_) => {
                let hole = self.seek(offset, libc::SEEK_HOLE)?.unwrap_or(size);
                (true, hole.min(end))
            }
        };
        Ok(AllocationRun {
            mapped,
            len: run_end.saturating_sub(offset).max(1),
        })
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            // The file can deallocate; a read-only one refuses the call
            // (like every write), but stays a thin-provisioned medium.
            discard: true,
            discard_zeroes: true,
            allocation_status: true,
            volatile_cache: true,
            read_only: self.read_only,
        }
    }

    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }

    /// Available: the file system's free blocks for an unprivileged
    /// process (`f_bavail`, what a write of the file may still allocate);
    /// used: the file's allocated blocks.
    fn provisioning(&self) -> Option<Provisioning> {
        let fd = self.file.as_raw_fd();
        let mut vfs = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `fd` is this backend's open file for the whole call, and
        // `vfs` is a valid out-pointer `fstatvfs` fills on success.
        if unsafe { libc::fstatvfs(fd, vfs.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: `fstatvfs` returned 0, so it initialised `vfs`.
        let vfs = unsafe { vfs.assume_init() };
        let used = self.file.metadata().ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        })?;
        // The field types are narrower than u64 on some targets.
        #[allow(clippy::useless_conversion)]
        let available = u64::from(vfs.f_bavail).saturating_mul(u64::from(vfs.f_frsize));
        Some(Provisioning { available, used })
    }
}

/// True when `file` lives on tmpfs or ramfs (`fstatfs` magic numbers).
fn file_in_ram(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes a `statfs` into the pointer we own.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    let magic = st.f_type;
    magic == TMPFS_MAGIC || magic == RAMFS_MAGIC
}

#[cfg(test)]
mod tests {
    /// Sixteen writes in a row that wrote nothing no-wait, and only one in
    /// 64 tries after that; the first that writes something brings every
    /// write back.
    #[test]
    fn no_wait_writes_back_off_while_they_write_nothing() {
        let m = NowaitMisses::default();
        for i in 0..NowaitMisses::GIVE_UP {
            assert!(!m.backing_off(), "miss {i} of {}", NowaitMisses::GIVE_UP);
            assert!(m.attempt(), "attempt {i} of the first run");
            m.record(false);
        }
        assert!(
            m.backing_off(),
            "given up after {} misses",
            NowaitMisses::GIVE_UP
        );
        let tried = (0..256)
            .filter(|_| {
                let t = m.attempt();
                if t {
                    m.record(false);
                }
                t
            })
            .count();
        assert_eq!(tried, 4, "one in 64 of 256 writes tries");
        // Tries until one comes, which succeeds.
        while !m.attempt() {}
        m.record(true);
        assert!(!m.backing_off(), "a success ends the backing off");
        for i in 0..NowaitMisses::GIVE_UP {
            assert!(m.attempt(), "attempt {i} after a success");
        }
    }
    use super::*;

    /// Where writes run, as a backend tells it: memory and a file in
    /// RAM are written inline, a backend that can wait on the I/O threads
    /// (the defaults). Disk file systems: `tests/loop_fs_nowait.rs`.
    #[test]
    fn backends_say_where_their_writes_run() {
        assert_eq!(MemoryBackend::new(1 << 20).write_path(), WritePath::Inline);
        let (faulty, _) =
            crate::FaultyBackend::new(std::sync::Arc::new(MemoryBackend::new(1 << 20)));
        assert!(!faulty.never_blocks());
        assert_eq!(faulty.write_path(), WritePath::IoThreads, "it may wait");
        let shm = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let ram = FileBackend::open(shm.path().join("lu"), Some(1 << 20), FileOptions::default())
            .expect("file LU in RAM");
        assert!(ram.never_blocks(), "/dev/shm is tmpfs");
        assert_eq!(ram.write_path(), WritePath::Inline);
    }

    fn b(v: &[u8]) -> Bytes {
        Bytes::copy_from_slice(v)
    }

    /// A buffer whose bytes hold 0xaa: what a read into it leaves
    /// unwritten shows.
    fn stale(len: usize) -> Vec<MaybeUninit<u8>> {
        vec![MaybeUninit::new(0xaa); len]
    }

    /// `read_at_uninit` hands back the very buffer it was given, every byte
    /// of it written, with what `read_at` reads: data, and zeroes over
    /// holes.
    fn uninit_matches_read_at(be: &dyn BlockBackend, offset: u64, len: usize) {
        let mut want = vec![0x55u8; len];
        be.read_at(offset, &mut want).unwrap();
        let mut buf = stale(len);
        let at = buf.as_ptr().cast::<u8>();
        let got = be.read_at_uninit(offset, &mut buf).unwrap();
        assert_eq!(got.as_ptr(), at, "{}: not the buffer given", be.describe());
        assert_eq!(got, &want[..], "{}", be.describe());
        assert!(matches!(
            be.read_at_uninit(be.size() - 1, &mut stale(2)),
            Err(BackendError::OutOfRange { .. })
        ));
    }

    #[test]
    fn uninit_reads_write_every_byte_they_hand_back() {
        // Memory: data straddling two chunks, then a hole to the end of
        // the read (the buffer's 0xaa must not show through).
        let m = MemoryBackend::new(4 * CHUNK as u64);
        let off = CHUNK as u64 - 100;
        m.write_at(off, &[b(&[7u8; 300])], false).unwrap();
        uninit_matches_read_at(&m, off - 50, 2 * CHUNK);
        uninit_matches_read_at(&m, 3 * CHUNK as u64, CHUNK);
        // A file: data then a hole.
        let dir = tempfile::tempdir().unwrap();
        let f = FileBackend::open(
            dir.path().join("lu.img"),
            Some(1 << 20),
            FileOptions::default(),
        )
        .unwrap();
        f.write_at(4096, &[b(&[9u8; 8192])], false).unwrap();
        uninit_matches_read_at(&f, 0, 64 * 1024);
        // The no-wait read hands back a prefix of the buffer, and only
        // bytes the file holds.
        let mut buf = stale(16 * 1024);
        let at = buf.as_ptr().cast::<u8>();
        let head = f.read_at_nowait(4096, &mut buf).unwrap();
        assert!(head.is_empty() || head.as_ptr() == at);
        assert!(head.len() <= 16 * 1024);
        for (i, &x) in head.iter().enumerate() {
            assert_eq!(x, if i < 8192 { 9 } else { 0 }, "byte {i}");
        }
    }

    #[test]
    fn memory_writes_of_many_segments_match_a_flat_model() {
        // Segments of odd sizes (empty ones too) straddling chunk edges, as
        // a write's frame payloads arrive.
        let size = 4 * CHUNK;
        let m = MemoryBackend::new(size as u64);
        let mut model = vec![0u8; size];
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            seed >> 8
        };
        for _ in 0..200 {
            let mut segs = Vec::new();
            let mut len = 0;
            for _ in 0..(next() % 40) {
                let n = (next() % 5000) as usize;
                let fill = next() as u8;
                segs.push(Bytes::from(vec![fill; n]));
                len += n;
            }
            if len > size {
                continue;
            }
            let off = next() as usize % (size - len + 1);
            m.write_at(off as u64, &segs, false).unwrap();
            let mut at = off;
            for seg in &segs {
                model[at..at + seg.len()].copy_from_slice(seg);
                at += seg.len();
            }
        }
        let mut all = vec![0xaau8; size];
        m.read_at(0, &mut all).unwrap();
        assert!(all == model, "the backend differs from the model");
    }

    #[test]
    fn memory_read_write_discard() {
        let m = MemoryBackend::new(3 * CHUNK as u64 + 100);
        let mut buf = vec![0xffu8; 10];
        m.read_at(5, &mut buf).unwrap();
        assert_eq!(buf, vec![0; 10]);
        assert!(!m.allocation(0, 10).unwrap().mapped);
        // A write straddling two chunks, in two slices.
        let off = CHUNK as u64 - 3;
        m.write_at(off, &[b(&[1, 2]), b(&[3, 4, 5, 6])], false)
            .unwrap();
        let mut buf = [0u8; 6];
        m.read_at(off, &mut buf).unwrap();
        assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
        assert!(m.allocation(0, 1).unwrap().mapped);
        assert_eq!(
            m.allocation(2 * CHUNK as u64, 10).unwrap(),
            AllocationRun {
                mapped: false,
                len: 10
            }
        );
        // A partial discard zeroes but keeps the chunk.
        m.discard(off, 2).unwrap();
        m.read_at(off, &mut buf).unwrap();
        assert_eq!(buf, [0, 0, 3, 4, 5, 6]);
        assert!(m.allocation(off, 1).unwrap().mapped);
        // A whole-chunk discard frees it.
        m.discard(0, CHUNK as u64).unwrap();
        assert!(!m.allocation(0, 1).unwrap().mapped);
        assert_eq!(m.allocation(0, 3 * CHUNK as u64).unwrap().len, CHUNK as u64);
        // Out of range.
        assert!(matches!(
            m.read_at(m.size() - 1, &mut [0u8; 2]),
            Err(BackendError::OutOfRange { .. })
        ));
        assert!(m.write_at(u64::MAX, &[b(&[1])], false).is_err());
    }

    #[test]
    fn file_create_sparse_punch_and_seek() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lu.img");
        let size = 16 * 1024 * 1024;
        let f = FileBackend::open(&path, Some(size), FileOptions::default()).unwrap();
        assert_eq!(f.size(), size);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        // Fresh file: one hole.
        assert_eq!(
            f.allocation(0, size).unwrap(),
            AllocationRun {
                mapped: false,
                len: size
            }
        );
        let data = Bytes::from(vec![0xa5u8; 1024 * 1024]);
        f.write_at(1024 * 1024, std::slice::from_ref(&data), false)
            .unwrap();
        let run = f.allocation(1024 * 1024, size).unwrap();
        assert!(run.mapped);
        assert!(run.len >= 1024 * 1024);
        let before = f.allocation(0, size).unwrap();
        assert_eq!(
            before,
            AllocationRun {
                mapped: false,
                len: 1024 * 1024
            }
        );
        // Punch the middle 256 KiB: it reads back zero and is a hole.
        f.discard(1024 * 1024 + 256 * 1024, 256 * 1024).unwrap();
        let mut buf = vec![1u8; 256 * 1024];
        f.read_at(1024 * 1024 + 256 * 1024, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        let hole = f.allocation(1024 * 1024 + 256 * 1024, 1024 * 1024).unwrap();
        assert!(!hole.mapped);
        assert_eq!(hole.len, 256 * 1024);
        // write_zeroes reads back zero.
        f.write_zeroes(1024 * 1024, 4096).unwrap();
        let mut z = vec![1u8; 4096];
        f.read_at(1024 * 1024, &mut z).unwrap();
        assert!(z.iter().all(|&x| x == 0));
    }

    #[test]
    fn reading_a_hole_of_a_tmpfs_file_leaves_it_a_hole() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            panic!("/dev/shm (tmpfs) is needed for this test");
        };
        let path = dir.path().join("lu.img");
        let size = 4 * 1024 * 1024;
        let f = FileBackend::open(&path, Some(size), FileOptions::default()).unwrap();
        let data = Bytes::from(vec![0x5au8; 64 * 1024]);
        f.write_at(0, std::slice::from_ref(&data), false).unwrap();
        // Data reads may come from the mapping; hole reads must not.
        if let Some(r) = f.read_shared(0, 4096) {
            assert_eq!(&r.unwrap()[..], &[0x5a; 4096][..]);
        }
        assert!(f.read_shared(1024 * 1024, 4096).is_none());
        assert!(f.read_shared(60 * 1024, 8192).is_none(), "straddles a hole");
        let mut buf = vec![1u8; 4096];
        f.read_at(1024 * 1024, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0));
        let run = f.allocation(1024 * 1024, size).unwrap();
        assert!(!run.mapped, "reading a hole allocated it");
    }

    #[test]
    fn a_page_seen_resident_reads_from_the_mapping_until_a_hole_is_punched_in_it() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            panic!("/dev/shm (tmpfs) is needed for this test");
        };
        let path = dir.path().join("lu.img");
        let size = 4 * 1024 * 1024;
        let f = FileBackend::open(&path, Some(size), FileOptions::default()).unwrap();
        assert!(f.map.is_some(), "a tmpfs file is mapped");
        // Pages 2 to 4 written through the mapping: known resident.
        let three = Bytes::from(vec![0x33u8; 3 * PAGE]);
        f.write_at(2 * PAGE as u64, std::slice::from_ref(&three), false)
            .unwrap();
        let map = f.map.as_ref().unwrap();
        assert_eq!(map.resident[0].load(Ordering::Acquire), 0b11100);
        let at = 3 * PAGE as u64;
        let r = f.read_shared(at, 4096).expect("resident").unwrap();
        assert_eq!(&r[..], &[0x33; 4096][..]);
        // UNMAP punches a hole: the page is forgotten, the hole is read
        // as zeros without being allocated again.
        f.discard(at, 4096).unwrap();
        assert_eq!(map.resident[0].load(Ordering::Acquire), 0b10100);
        assert!(f.read_shared(at, 4096).is_none(), "a hole from the mapping");
        let run = f.allocation(at, 4096).unwrap();
        assert!(!run.mapped, "reading the punched hole allocated it");
        assert!(f.read_shared(at + 4096, 4096).is_some());
    }

    #[test]
    fn file_fua_and_flush_reach_fdatasync() {
        let dir = tempfile::tempdir().unwrap();
        let f =
            FileBackend::open(dir.path().join("x"), Some(1 << 20), FileOptions::default()).unwrap();
        assert_eq!(f.sync_count(), 0);
        f.write_at(0, &[b(&[1; 512])], false).unwrap();
        assert_eq!(f.sync_count(), 0);
        f.write_at(512, &[b(&[2; 512]), b(&[3; 512])], true)
            .unwrap();
        assert_eq!(f.sync_count(), 1);
        f.flush().unwrap();
        assert_eq!(f.sync_count(), 2);
        let mut buf = [0u8; 1536];
        f.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf[..512], &[1; 512]);
        assert_eq!(&buf[512..1024], &[2; 512]);
        assert_eq!(&buf[1024..], &[3; 512]);
    }

    #[test]
    fn file_lock_and_size_rules() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("y");
        assert!(matches!(
            FileBackend::open(&path, None, FileOptions::default()),
            Err(BackendError::NoSize(_))
        ));
        let f = FileBackend::open(&path, Some(1 << 20), FileOptions::default()).unwrap();
        assert!(matches!(
            FileBackend::open(&path, Some(1 << 20), FileOptions::default()),
            Err(BackendError::Locked(_))
        ));
        drop(f);
        // Reopen without a size: the file's own size; larger size grows it.
        let f = FileBackend::open(&path, None, FileOptions::default()).unwrap();
        assert_eq!(f.size(), 1 << 20);
        drop(f);
        let f = FileBackend::open(&path, Some(2 << 20), FileOptions::default()).unwrap();
        assert_eq!(f.size(), 2 << 20);
        drop(f);
        assert!(matches!(
            FileBackend::open(&path, Some(1 << 20), FileOptions::default()),
            Err(BackendError::SizeMismatch { .. })
        ));
        let ro = FileBackend::open(
            &path,
            None,
            FileOptions {
                read_only: true,
                ..FileOptions::default()
            },
        )
        .unwrap();
        assert!(matches!(
            ro.write_at(0, &[b(&[1])], false),
            Err(BackendError::ReadOnly)
        ));
        assert!(ro.caps().read_only);
    }

    #[test]
    fn file_many_slices_batch() {
        let dir = tempfile::tempdir().unwrap();
        let f =
            FileBackend::open(dir.path().join("z"), Some(1 << 20), FileOptions::default()).unwrap();
        // More slices than one pwritev batch, some empty.
        let slices: Vec<Bytes> = (0..200u32)
            .map(|i| {
                if i % 7 == 0 {
                    Bytes::new()
                } else {
                    Bytes::from(vec![(i % 251) as u8; 100])
                }
            })
            .collect();
        f.write_at(10, &slices, true).unwrap();
        let mut want = Vec::new();
        for s in &slices {
            want.extend_from_slice(s);
        }
        let mut got = vec![0u8; want.len()];
        f.read_at(10, &mut got).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn tmpfs_files_are_read_from_a_shared_mapping() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("lu.img");
        let b = FileBackend::open(&path, Some(1 << 20), FileOptions::default()).unwrap();
        assert!(b.never_blocks(), "a /dev/shm file lives in RAM");
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        b.write_at(4096, &[Bytes::from(data.clone())], false)
            .unwrap();
        let shared = b.read_shared(4096, 8192).unwrap().unwrap();
        assert_eq!(&shared[..], &data[..]);
        let mut copy = vec![0u8; 8192];
        b.read_at(4096, &mut copy).unwrap();
        assert_eq!(copy, data);
        // Out of range is an error, not a panic.
        assert!(b.read_shared((1 << 20) - 10, 20).unwrap().is_err());
        assert!(
            b.write_at((1 << 20) - 10, &[Bytes::from(vec![1u8; 20])], false)
                .is_err()
        );
        // Writes through the mapping are seen by pread, and FUA syncs.
        let syncs = b.sync_count();
        b.write_at(
            0,
            &[Bytes::from_static(b"ab"), Bytes::from_static(b"cd")],
            true,
        )
        .unwrap();
        assert_eq!(b.sync_count(), syncs + 1);
        let mut four = [0u8; 4];
        b.read_at(0, &mut four).unwrap();
        assert_eq!(&four, b"abcd");
        // The slice outlives the backend (the mapping is reference counted).
        drop(b);
        assert_eq!(&shared[..16], &data[..16]);
    }
}
