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
    /// None: the LU is write-protected (`read_only`, switched so live, or
    /// the control mode page's SWP), and every write fails with DATA
    /// PROTECT.
    ReadOnly,
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
            WritePath::ReadOnly => "read-only",
        }
    }

    /// Every path, in the order the metric lists them.
    pub const ALL: [WritePath; 6] = [
        WritePath::Inline,
        WritePath::NoWait,
        WritePath::NoWaitBackingOff,
        WritePath::IoThreads,
        WritePath::Async,
        WritePath::ReadOnly,
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

fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BackendError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BackendError::OutOfRange { offset, len, size }),
    }
}

fn total_len(data: &[Bytes]) -> u64 {
    data.iter().map(|b| b.len() as u64).sum()
}

mod file;
mod memory;

pub use file::{FileBackend, FileOptions};
pub use memory::MemoryBackend;

#[cfg(test)]
mod tests;
