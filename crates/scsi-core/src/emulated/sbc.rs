//! SBC-3 block commands: the LBA range and transfer checks, READ, WRITE
//! (and WRITE AND VERIFY, WRITE ATOMIC), VERIFY, ORWRITE, COMPARE AND WRITE,
//! WRITE SAME, UNMAP and GET LBA STATUS.

use super::*;

impl Inner {
    /// LBA range check: `Some(error)` if `lba + blocks` passes the end.
    pub(super) fn range(&self, lba: u64, blocks: u64) -> Option<TaskResult> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => None,
            _ => Some(lba_out_of_range()),
        }
    }

    /// Common checks of block I/O commands.
    pub(super) fn io_checks(&self, io: &BlockIo, write: bool, max: u64) -> Option<TaskResult> {
        if io.protect != 0 {
            return Some(bad_cdb(1, Some(7)));
        }
        if write && self.write_protected.load(Ordering::Acquire) {
            return Some(write_protected());
        }
        if let Some(r) = self.range(io.lba, u64::from(io.blocks)) {
            return Some(r);
        }
        if u64::from(io.blocks) > max {
            let byte = match io.size {
                CdbSize::Six => 4,
                CdbSize::Ten => 7,
                CdbSize::Twelve => 6,
                CdbSize::Sixteen => 10,
            };
            return Some(bad_cdb(byte, None));
        }
        None
    }

    pub(super) fn out_residual(&self, task: &Task, wanted: u64) -> Option<Residual> {
        let got = u64::from(task.data_out_len);
        match wanted.cmp(&got) {
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => Some(Residual::Overflow(
                u32::try_from(wanted - got).unwrap_or(u32::MAX),
            )),
            std::cmp::Ordering::Less => Some(Residual::Underflow(
                u32::try_from(got - wanted).unwrap_or(u32::MAX),
            )),
        }
    }

    pub(super) async fn read(self: &Arc<Self>, io: BlockIo) -> TaskResult {
        if let Some(r) = self.io_checks(&io, false, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        let len = (u64::from(io.blocks) << self.shift) as usize;
        if len == 0 {
            return TaskResult::good();
        }
        let off = io.lba << self.shift;
        if let Some(aio) = self.backend.aio() {
            return match aio.read(off, len).await {
                Ok(b) if b.len() == len => TaskResult::with_data(b),
                Ok(_) => backend_failed(&BackendError::ForeignBuffer, false, self.shift),
                Err(e) => backend_failed(&e, false, self.shift),
            };
        }
        if self.cfg.io_mode != IoMode::Blocking {
            match self.backend.read_shared(off, len) {
                Some(Ok(b)) => return TaskResult::with_data(b),
                Some(Err(e)) => return backend_failed(&e, false, self.shift),
                None => {}
            }
        }
        // Read into the buffer's spare capacity, not a zeroed buffer: the
        // read writes every byte, and zeroing a 1 MiB buffer first cost a
        // memset as long as the copy. `len` is set once the backend has
        // shown (by handing back the slice it was given, initialised) that
        // every byte was written.
        let mut buf = BytesMut::with_capacity(len);
        let mut done = 0usize;
        if self.cfg.io_mode == IoMode::Adaptive && !self.backend.never_blocks() {
            let spare = &mut buf.spare_capacity_mut()[..len];
            let at = spare.as_ptr().cast::<u8>();
            match self.backend.read_at_nowait(off, spare) {
                Ok([]) => {}
                Ok(head) if head.as_ptr() == at && head.len() <= len => done = head.len(),
                Ok(_) => return backend_failed(&BackendError::ForeignBuffer, false, self.shift),
                Err(e) => return backend_failed(&e, false, self.shift),
            }
            if done == len {
                // SAFETY: the backend returned all of `spare` initialised.
                unsafe { buf.set_len(len) };
                return TaskResult::with_data(buf.freeze());
            }
        }
        let res = self
            .io(move |me| {
                let spare = &mut buf.spare_capacity_mut()[done..len];
                let (at, want) = (spare.as_ptr().cast::<u8>(), spare.len());
                let got = me.backend.read_at_uninit(off + done as u64, spare)?;
                if got.as_ptr() != at || got.len() != want {
                    return Err(BackendError::ForeignBuffer);
                }
                // SAFETY: bytes 0..done came back initialised from
                // read_at_nowait and done..len from read_at_uninit, both
                // checked to be this buffer's.
                unsafe { buf.set_len(len) };
                Ok(buf.freeze())
            })
            .await;
        match res {
            Some(Ok(b)) => TaskResult::with_data(b),
            Some(Err(e)) => backend_failed(&e, false, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    /// MAXIMUM ATOMIC TRANSFER LENGTH (VPD 0xB0).
    pub(super) fn max_atomic_blocks(&self) -> u32 {
        self.cfg.max_transfer_blocks.min(u32::from(u16::MAX))
    }

    pub(super) async fn write(
        self: &Arc<Self>,
        io: BlockIo,
        task: &mut Task,
        verify: bool,
    ) -> TaskResult {
        if let Some(r) = self.io_checks(&io, true, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        self.write_locked(io, task, verify, false).await
    }

    /// Writes the whole blocks of data-out; `exclusive` holds the write
    /// lock exclusively (no other write interleaves).
    pub(super) async fn write_locked(
        self: &Arc<Self>,
        io: BlockIo,
        task: &mut Task,
        verify: bool,
        exclusive: bool,
    ) -> TaskResult {
        let wanted = u64::from(io.blocks) << self.shift;
        let residual = self.out_residual(task, wanted);
        let have = task.data_out_total() as u64;
        let n = (wanted.min(have) >> self.shift) << self.shift;
        let mut result = TaskResult::good();
        result.residual = residual;
        if n == 0 {
            return result;
        }
        let fua = io.fua || !self.wce.load(Ordering::Acquire);
        if fua && let Some(refused) = self.flush_refused() {
            return refused;
        }
        // A port made Unavailable since the command arrived: the write is
        // not handed to the backend ([`Inner::fence`]).
        let fence = Fence::of(&self.alua, task);
        let data = first_bytes(std::mem::take(&mut task.data_out), n as usize);
        let off = io.lba << self.shift;
        let aio = self.backend.aio().filter(|_| !exclusive && !verify);
        let res = if let Some(aio) = aio {
            // Submitted under the shared write lock, so an exclusive writer
            // that takes it next finds this write in the backend's queue
            // (and waits for it in `quiesce`).
            let done = {
                let _shared = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.fence(&fence) {
                    return backend_failed(&e, true, self.shift);
                }
                aio.write(off, data, fua)
            };
            Some(done.await.map(|()| None))
        } else {
            // What the backend takes without waiting (`RWF_NOWAIT` on XFS)
            // is written here, as a page-cache read is read here:
            // no hand-off to a thread and back. The rest goes to the thread.
            let (off, data) = if !fua
                && !verify
                && !exclusive
                && self.cfg.io_mode == IoMode::Adaptive
                && !self.backend.never_blocks()
            {
                match self.write_nowait(&fence, off, data) {
                    Ok(rest) => rest,
                    Err(e) => return backend_failed(&e, true, self.shift),
                }
            } else {
                (off, data)
            };
            if data.is_empty() {
                self.check_threshold(&task.nexus, n);
                return result;
            }
            self.io(move |me| {
                let _shared =
                    (!exclusive).then(|| me.write_lock.read().unwrap_or_else(|p| p.into_inner()));
                let _exclusive = if exclusive {
                    Some(me.exclusive()?)
                } else {
                    None
                };
                me.fence(&fence)?;
                me.backend.write_at(off, &data, fua)?;
                if verify {
                    let mut back = vec![0u8; n as usize];
                    me.backend.read_at(off, &mut back)?;
                    let mut pos = 0usize;
                    for s in &data {
                        if back.get(pos..pos + s.len()) != Some(&s[..]) {
                            return Ok(Some(pos));
                        }
                        pos += s.len();
                    }
                }
                Ok::<_, BackendError>(None)
            })
            .await
        };
        self.check_threshold(&task.nexus, n);
        match res {
            Some(Ok(None)) => result,
            Some(Ok(Some(at))) => TaskResult::check_condition(
                Sense::new(
                    SenseKey::MISCOMPARE,
                    asc::MISCOMPARE_DURING_VERIFY_OPERATION,
                )
                .with_information(at as u32),
            ),
            Some(Err(e)) => {
                if fua {
                    self.note_flush_failure(&e);
                }
                backend_failed(&e, true, self.shift)
            }
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    /// Hands a plain write to the backend's no-wait path under the shared
    /// write lock (not waited for: an exclusive writer holding it sends
    /// the whole write to the thread) and returns what is left of it: its
    /// offset and slices, none when the backend took it all.
    fn write_nowait(
        &self,
        fence: &Fence,
        off: u64,
        data: Vec<Bytes>,
    ) -> Result<(u64, Vec<Bytes>), BackendError> {
        let Ok(_shared) = self.write_lock.try_read() else {
            return Ok((off, data));
        };
        self.fence(fence)?;
        let n = self.backend.write_at_nowait(off, &data)?;
        Ok((off + n as u64, skip_bytes(data, n)))
    }

    pub(super) async fn verify(self: &Arc<Self>, io: BlockIo, task: &Task) -> TaskResult {
        if let Some(r) = self.io_checks(&io, false, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        if io.bytchk == 0 || io.blocks == 0 {
            return TaskResult::good();
        }
        let len = (u64::from(io.blocks) << self.shift) as usize;
        let bs = self.bs as usize;
        let expected_out = if io.bytchk == 3 { bs } else { len };
        let residual = self.out_residual(task, expected_out as u64);
        let data = gather(&task.data_out, 0, expected_out);
        let off = io.lba << self.shift;
        let res = self
            .io(move |me| {
                let mut medium = vec![0u8; len];
                me.backend.read_at(off, &mut medium)?;
                for (i, m) in medium.iter().enumerate() {
                    let d = if io.bytchk == 3 {
                        data.get(i % bs)
                    } else {
                        data.get(i)
                    };
                    match d {
                        Some(d) if d == m => {}
                        Some(_) => return Ok(Some(i)),
                        None => break,
                    }
                }
                Ok::<_, BackendError>(None)
            })
            .await;
        match res {
            Some(Ok(None)) => TaskResult {
                residual,
                ..TaskResult::good()
            },
            Some(Ok(Some(at))) => TaskResult::check_condition(
                Sense::new(
                    SenseKey::MISCOMPARE,
                    asc::MISCOMPARE_DURING_VERIFY_OPERATION,
                )
                .with_information(at as u32),
            ),
            Some(Err(e)) => backend_failed(&e, false, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    pub(super) async fn orwrite(self: &Arc<Self>, io: BlockIo, task: &Task) -> TaskResult {
        if let Some(r) = self.io_checks(&io, true, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        let wanted = u64::from(io.blocks) << self.shift;
        let residual = self.out_residual(task, wanted);
        let have = task.data_out_total() as u64;
        let n = ((wanted.min(have) >> self.shift) << self.shift) as usize;
        if n == 0 {
            return TaskResult {
                residual,
                ..TaskResult::good()
            };
        }
        let data = gather(&task.data_out, 0, n);
        let fua = io.fua || !self.wce.load(Ordering::Acquire);
        let off = io.lba << self.shift;
        let fence = Fence::of(&self.alua, task);
        let res = self
            .io(move |me| {
                let _g = me.exclusive()?;
                me.fence(&fence)?;
                let mut medium = vec![0u8; n];
                me.backend.read_at(off, &mut medium)?;
                for (m, d) in medium.iter_mut().zip(data.iter()) {
                    *m |= *d;
                }
                me.backend.write_at(off, &[Bytes::from(medium)], fua)
            })
            .await;
        match res {
            Some(Ok(())) => TaskResult {
                residual,
                ..TaskResult::good()
            },
            Some(Err(e)) => backend_failed(&e, true, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    pub(super) async fn compare_and_write(
        self: &Arc<Self>,
        io: BlockIo,
        task: &Task,
    ) -> TaskResult {
        if let Some(r) = self.io_checks(&io, true, u64::from(MAX_CAW_BLOCKS)) {
            return r;
        }
        let half = (u64::from(io.blocks) << self.shift) as usize;
        if u64::from(task.data_out_len) != 2 * half as u64 || task.data_out_total() < 2 * half {
            return bad_cdb(13, None);
        }
        if half == 0 {
            return TaskResult::good();
        }
        let verify = gather(&task.data_out, 0, half);
        let write = gather(&task.data_out, half, half);
        let fua = io.fua || !self.wce.load(Ordering::Acquire);
        let off = io.lba << self.shift;
        let fence = Fence::of(&self.alua, task);
        if let Some(aio) = self.backend.aio() {
            let (v, w) = (Bytes::from(verify.clone()), Bytes::from(write.clone()));
            // Submitted under the shared write lock, as a write is: an
            // exclusive read-modify-write of this gateway (ORWRITE) waits
            // for it in `quiesce` rather than interleaving with it.
            let submitted = {
                let _g = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.fence(&fence) {
                    return backend_failed(&e, true, self.shift);
                }
                aio.compare_and_write(off, v, w, fua)
            };
            if let Some(done) = submitted {
                match done.await {
                    Ok(None) => return TaskResult::good(),
                    Ok(Some(at)) => {
                        return TaskResult::check_condition(
                            Sense::new(
                                SenseKey::MISCOMPARE,
                                asc::MISCOMPARE_DURING_VERIFY_OPERATION,
                            )
                            .with_information(at as u32),
                        );
                    }
                    // The storage could not do it for this range after all
                    // (librbd: one that spans two objects): under the lock.
                    Err(BackendError::Io(e)) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    Err(e) => return backend_failed(&e, true, self.shift),
                }
            }
        }
        let res = self
            .io(move |me| {
                let _g = me.exclusive()?;
                me.fence(&fence)?;
                let mut medium = vec![0u8; half];
                me.backend.read_at(off, &mut medium)?;
                if let Some(at) = medium.iter().zip(verify.iter()).position(|(a, b)| a != b) {
                    return Ok(Some(at));
                }
                me.backend.write_at(off, &[Bytes::from(write)], fua)?;
                Ok::<_, BackendError>(None)
            })
            .await;
        match res {
            Some(Ok(None)) => TaskResult::good(),
            Some(Ok(Some(at))) => TaskResult::check_condition(
                Sense::new(
                    SenseKey::MISCOMPARE,
                    asc::MISCOMPARE_DURING_VERIFY_OPERATION,
                )
                .with_information(at as u32),
            ),
            Some(Err(e)) => backend_failed(&e, true, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_same(
        self: &Arc<Self>,
        task: &Task,
        size: CdbSize,
        wrprotect: u8,
        anchor: bool,
        unmap: bool,
        ndob: bool,
        lba: u64,
        blocks: u32,
    ) -> TaskResult {
        if wrprotect != 0 {
            return bad_cdb(1, Some(7));
        }
        if anchor {
            return bad_cdb(1, Some(4));
        }
        if unmap && !self.thin {
            return bad_cdb(1, Some(3));
        }
        if self.write_protected.load(Ordering::Acquire) {
            return write_protected();
        }
        let total = self.blocks();
        if lba > total {
            return lba_out_of_range();
        }
        let count = if blocks == 0 {
            total - lba
        } else {
            u64::from(blocks)
        };
        if count > MAX_WRITE_SAME_BLOCKS {
            let byte = if size == CdbSize::Sixteen { 10 } else { 7 };
            return bad_cdb(byte, None);
        }
        if let Some(r) = self.range(lba, count) {
            return r;
        }
        let bs = self.bs as usize;
        let pattern = if ndob {
            vec![0u8; bs]
        } else {
            if task.data_out_len as usize != bs || task.data_out_total() < bs {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            }
            gather(&task.data_out, 0, bs)
        };
        if count == 0 {
            return TaskResult::good();
        }
        let zero = pattern.iter().all(|&b| b == 0);
        let fua = !self.wce.load(Ordering::Acquire);
        let off = lba << self.shift;
        let len = count << self.shift;
        let fence = Fence::of(&self.alua, task);
        if !unmap
            && !zero
            && let Some(aio) = self.backend.aio()
        {
            let submitted = {
                let _g = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.fence(&fence) {
                    return backend_failed(&e, true, self.shift);
                }
                aio.write_same(off, len, Bytes::from(pattern.clone()))
            };
            if let Some(done) = submitted {
                let mut res = done.await;
                if res.is_ok() && fua {
                    res = aio.flush().await;
                }
                return match res {
                    Ok(()) => TaskResult::good(),
                    Err(e) => backend_failed(&e, true, self.shift),
                };
            }
        }
        let res = self
            .io(move |me| {
                let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
                me.fence(&fence)?;
                // UNMAP=1 deallocates whatever the data block holds: with
                // LBPRZ=1 the blocks then read back as zeros (SBC-3 §4.7.3.4;
                // libiscsi's WriteSame*.UnmapUntilEnd checks exactly this).
                if unmap {
                    me.backend.discard(off, len)?;
                } else if zero {
                    me.backend.write_zeroes(off, len)?;
                } else {
                    let per = (1usize << 20) / bs;
                    let mut chunk = Vec::with_capacity(per * bs);
                    for _ in 0..per.min(count as usize) {
                        chunk.extend_from_slice(&pattern);
                    }
                    let chunk = Bytes::from(chunk);
                    let mut pos = off;
                    let end = off + len;
                    while pos < end {
                        let n = (end - pos).min(chunk.len() as u64) as usize;
                        me.fence(&fence)?;
                        me.backend.write_at(pos, &[chunk.slice(..n)], false)?;
                        pos += n as u64;
                    }
                }
                if fua {
                    me.backend.flush()?;
                }
                Ok::<_, BackendError>(())
            })
            .await;
        match res {
            Some(Ok(())) => TaskResult::good(),
            Some(Err(e)) => backend_failed(&e, true, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    pub(super) async fn unmap(
        self: &Arc<Self>,
        task: &Task,
        anchor: bool,
        param_len: u16,
    ) -> TaskResult {
        if !self.thin {
            return illegal(asc::INVALID_COMMAND_OPERATION_CODE);
        }
        if anchor {
            return bad_cdb(1, Some(0));
        }
        if self.write_protected.load(Ordering::Acquire) {
            return write_protected();
        }
        if param_len == 0 {
            return TaskResult::good();
        }
        let p = gather(&task.data_out, 0, usize::from(param_len));
        if p.len() < 8 || p.len() < usize::from(param_len) {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let bd_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
        let descs = p.get(8..8 + bd_len.min(p.len() - 8)).unwrap_or(&[]);
        if descs.len() / 16 > MAX_UNMAP_DESCRIPTORS {
            return bad_param(2, None);
        }
        let mut ranges = Vec::with_capacity(descs.len() / 16);
        let mut sum = 0u64;
        for (i, d) in descs.chunks_exact(16).enumerate() {
            let lba = u64::from_be_bytes(<[u8; 8]>::try_from(&d[0..8]).unwrap_or([0; 8]));
            let n = u64::from(u32::from_be_bytes(
                <[u8; 4]>::try_from(&d[8..12]).unwrap_or([0; 4]),
            ));
            if self.range(lba, n).is_some() {
                return lba_out_of_range();
            }
            sum += n;
            if n > MAX_UNMAP_BLOCKS || sum > MAX_UNMAP_BLOCKS {
                return bad_param((8 + i * 16 + 8) as u16, None);
            }
            if n > 0 {
                ranges.push((lba << self.shift, n << self.shift));
            }
        }
        if ranges.is_empty() {
            return TaskResult::good();
        }
        let fence = Fence::of(&self.alua, task);
        if let Some(aio) = self.backend.aio() {
            // Every range submitted under the shared write lock, then all
            // awaited: the first error (if any) is the command's.
            let pending: Option<Vec<_>> = {
                let _g = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = self.fence(&fence) {
                    return backend_failed(&e, true, self.shift);
                }
                ranges
                    .iter()
                    .map(|&(off, len)| aio.discard(off, len))
                    .collect()
            };
            if let Some(pending) = pending {
                let mut first_err = None;
                for p in pending {
                    if let Err(e) = p.await {
                        first_err.get_or_insert(e);
                    }
                }
                return match first_err {
                    None => TaskResult::good(),
                    Some(e) => backend_failed(&e, true, self.shift),
                };
            }
        }
        let res = self
            .io(move |me| {
                let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
                for (off, len) in ranges {
                    me.fence(&fence)?;
                    me.backend.discard(off, len)?;
                }
                Ok::<_, BackendError>(())
            })
            .await;
        match res {
            Some(Ok(())) => TaskResult::good(),
            Some(Err(e)) => backend_failed(&e, true, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    pub(super) async fn get_lba_status(self: &Arc<Self>, lba: u64, alloc_len: u32) -> TaskResult {
        let total = self.blocks();
        if lba >= total {
            return lba_out_of_range();
        }
        let max_desc = ((alloc_len.saturating_sub(8)) / 16).clamp(1, 64) as usize;
        let shift = self.shift;
        let bs = self.bs;
        let res = self
            .io(move |me| {
                let mut out = Vec::with_capacity(8 + 16 * max_desc);
                out.extend_from_slice(&[0; 8]);
                let mut at = lba;
                let mut n = 0;
                while at < total && n < max_desc {
                    let run = me.backend.allocation(at << shift, (total - at) << shift)?;
                    let blocks = if run.mapped {
                        run.len.div_ceil(bs)
                    } else {
                        (run.len / bs).max(1)
                    }
                    .min(total - at)
                    .min(u64::from(u32::MAX));
                    out.extend_from_slice(&at.to_be_bytes());
                    out.extend_from_slice(&(blocks as u32).to_be_bytes());
                    out.push(if run.mapped { 0 } else { 1 });
                    out.extend_from_slice(&[0; 3]);
                    at += blocks;
                    n += 1;
                }
                let len = (out.len() - 4) as u32;
                if let Some(h) = out.get_mut(0..4) {
                    h.copy_from_slice(&len.to_be_bytes());
                }
                Ok::<_, BackendError>(out)
            })
            .await;
        match res {
            Some(Ok(v)) => data_in(v, alloc_len as usize),
            Some(Err(e)) => backend_failed(&e, false, self.shift),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }
}

/// Copies `len` bytes at `src` to `dst` on `backend` in 1 MiB pieces,
/// backwards when the destination overlaps the source from above; `may_write`
/// is asked before each piece is written (the fence).
pub(super) fn copy_within(
    backend: &dyn BlockBackend,
    src: u64,
    dst: u64,
    len: u64,
    may_write: &dyn Fn() -> Result<(), BackendError>,
) -> Result<(), BackendError> {
    const PIECE: u64 = 1 << 20;
    let backwards = dst > src && dst < src + len;
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut done = 0u64;
    while done < len {
        let n = PIECE.min(len - done);
        let at = if backwards { len - done - n } else { done };
        let piece = buf.get_mut(..n as usize).unwrap_or_default();
        backend.read_at(src + at, piece)?;
        may_write()?;
        backend.write_at(dst + at, &[Bytes::copy_from_slice(piece)], false)?;
        done += n;
    }
    Ok(())
}
