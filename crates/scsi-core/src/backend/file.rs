//! [`FileBackend`]: a LU in a file or block device, and the shared
//! mapping it reads files in RAM through.

use super::*;

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

    /// `fallocate(mode)` over `[offset, offset + len)` (checked against
    /// the size; read-only refused), writing zeroes instead where the file
    /// system refuses the mode with one of the errors in `fallback`.
    fn zero_range(
        &self,
        mode: libc::c_int,
        offset: u64,
        len: u64,
        fallback: &[libc::c_int],
    ) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::ReadOnly);
        }
        check_range(offset, len, self.len())?;
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(mode, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error().is_some_and(|c| fallback.contains(&c)) => {
                self.zero_by_writing(offset, len)
            }
            Err(e) => Err(e.into()),
        }
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
        if self.read_only {
            WritePath::ReadOnly
        } else if self.in_ram {
            WritePath::Inline
        } else if !self.nowait_writes.load(Ordering::Relaxed) {
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
        self.zero_range(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
            &[libc::EOPNOTSUPP],
        )
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.zero_range(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
            &[libc::EOPNOTSUPP, libc::EINVAL],
        )
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
