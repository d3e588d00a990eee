//! SANITIZE (SBC-4 §4.11): OVERWRITE, BLOCK ERASE, CRYPTO ERASE and EXIT
//! FAILURE MODE, run on a thread of their own at the configured rate.

use super::*;

/// SANITIZE service actions (SBC-4 Table 83).
pub(super) const SANITIZE_OVERWRITE: u8 = 0x01;
pub(super) const SANITIZE_BLOCK_ERASE: u8 = 0x02;
pub(super) const SANITIZE_CRYPTO_ERASE: u8 = 0x03;
pub(super) const SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1f;

/// What a SANITIZE does to the medium.
#[derive(Debug)]
pub(super) enum SanitizeJob {
    /// Every block becomes this image.
    Overwrite(Vec<u8>),
    /// Deallocate (or zero) every block.
    Erase,
}

impl Inner {
    /// SANITIZE: checks the request, starts the operation on its own
    /// thread and, without IMMED, waits for it (or for the task's abort).
    pub(super) async fn sanitize(
        self: &Arc<Self>,
        task: &Task,
        immed: bool,
        service_action: u8,
        param_len: u16,
    ) -> TaskResult {
        let job = match service_action {
            SANITIZE_EXIT_FAILURE_MODE => {
                if param_len != 0 {
                    return bad_cdb(7, None);
                }
                self.sanitize_failed.store(false, Ordering::Release);
                return TaskResult::good();
            }
            SANITIZE_OVERWRITE => {
                let bs = self.bs as usize;
                let len = usize::from(param_len);
                if len <= 4 || len > bs + 4 {
                    return bad_cdb(7, None);
                }
                let p = gather(&task.data_out, 0, len);
                if p.len() < len {
                    return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                }
                let invert = p[0] & 0x80 != 0;
                let test = (p[0] >> 5) & 3;
                let count = p[0] & 0x1f;
                if test != 0 {
                    return bad_param(0, Some(6));
                }
                if count == 0 {
                    return bad_param(0, Some(4));
                }
                let ipl = usize::from(u16::from_be_bytes([p[2], p[3]]));
                if ipl == 0 || ipl > bs || ipl + 4 != len {
                    return bad_param(2, None);
                }
                let pattern = &p[4..len];
                // The last pass leaves the pattern inverted when passes
                // alternate and their number is even.
                let flip = invert && count.is_multiple_of(2);
                let block: Vec<u8> = pattern
                    .iter()
                    .cycle()
                    .take(bs)
                    .map(|b| if flip { !b } else { *b })
                    .collect();
                SanitizeJob::Overwrite(block)
            }
            SANITIZE_BLOCK_ERASE | SANITIZE_CRYPTO_ERASE => {
                if param_len != 0 {
                    return bad_cdb(7, None);
                }
                SanitizeJob::Erase
            }
            _ => return bad_cdb(1, Some(4)),
        };
        if self.write_protected.load(Ordering::Acquire) {
            return write_protected();
        }
        if self.sanitizing.swap(true, Ordering::AcqRel) {
            return check(
                SenseKey::NOT_READY,
                asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
            );
        }
        let me = self.clone();
        let fence = Fence::of(&self.alua, task);
        let answer_fence = fence.clone();
        let work = move || {
            let ok = match me.sanitize_run(&job, &fence) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(error = %e, "SANITIZE failed");
                    false
                }
            };
            me.sanitize_failed.store(!ok, Ordering::Release);
            me.sanitizing.store(false, Ordering::Release);
        };
        #[cfg(feature = "tokio")]
        {
            if std::thread::Builder::new()
                .name("unifab-sanitize".into())
                .spawn(work)
                .is_err()
            {
                self.sanitizing.store(false, Ordering::Release);
                return check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
            }
            if immed {
                return TaskResult::good();
            }
            while self.sanitizing.load(Ordering::Acquire) {
                // An aborted SANITIZE task ends; the operation goes on.
                if !self.tasks.contains(&task.nexus, task.tag) {
                    return TaskResult::aborted();
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        #[cfg(not(feature = "tokio"))]
        {
            let _ = immed;
            work();
        }
        if self.sanitize_failed.load(Ordering::Acquire) {
            // Stopped by the fence: the port's state is the answer.
            if let Err(e) = self.fence(&answer_fence) {
                return backend_failed(&e, true, self.shift);
            }
            check(SenseKey::MEDIUM_ERROR, asc::SANITIZE_COMMAND_FAILED)
        } else {
            TaskResult::good()
        }
    }

    /// The sanitize operation itself (on the sanitize thread); it stops
    /// where the fence of the SANITIZE command that started it says the
    /// port may no longer write.
    pub(super) fn sanitize_run(
        &self,
        job: &SanitizeJob,
        fence: &Fence,
    ) -> Result<(), BackendError> {
        let size = self.blocks() << self.shift;
        match job {
            SanitizeJob::Erase => {
                let _g = self.exclusive()?;
                self.fence(fence)?;
                if self.thin {
                    self.backend.discard(0, size)?;
                } else {
                    self.backend.write_zeroes(0, size)?;
                }
                self.backend.flush()
            }
            SanitizeJob::Overwrite(block) => {
                let per = ((1usize << 20) / block.len()).max(1);
                let chunk = Bytes::from(block.repeat(per));
                let rate = self.cfg.sanitize_rate;
                let started = std::time::Instant::now();
                let mut pos = 0u64;
                while pos < size {
                    let n = (size - pos).min(chunk.len() as u64) as usize;
                    {
                        let _g = self.write_lock.read().unwrap_or_else(|p| p.into_inner());
                        self.fence(fence)?;
                        self.backend.write_at(pos, &[chunk.slice(..n)], false)?;
                    }
                    pos += n as u64;
                    if rate != 0 {
                        let due = std::time::Duration::from_secs_f64(pos as f64 / rate as f64);
                        if let Some(wait) = due.checked_sub(started.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
                self.backend.flush()
            }
        }
    }
}
