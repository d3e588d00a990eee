//! [`MemoryBackend`]: sparse storage in RAM.

use super::*;

/// Chunk size of [`MemoryBackend`].
pub(super) const CHUNK: usize = 64 * 1024;

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
