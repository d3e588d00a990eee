//! A backend that fails on purpose: [`FaultyBackend`] wraps another
//! [`BlockBackend`] and injects the faults a gateway meets in the field, the
//! way LIO's and SPDK's error-injection devices and the kernel's dm-error
//! and dm-flakey targets do for their test suites.
//!
//! Every fault is deterministic and switched at runtime through the
//! [`Faults`] handle the test (or operator tool) keeps:
//!
//! - EIO on chosen byte ranges, for reads or for writes
//!   ([`Faults::fail_reads`], [`Faults::fail_writes`]); the error names the
//!   first failing byte ([`BackendError::At`]), so the LU reports the
//!   failing LBA in the sense data's INFORMATION field;
//! - ENOSPC once a number of bytes has been written ([`Faults::space`]), as
//!   a full thin-provisioned file or file system answers; what is left is
//!   reported as the available provisioning resource;
//! - a failing flush ([`Faults::fail_flush`]): `flush` and FUA writes fail;
//! - added latency on every operation ([`Faults::delay`]);
//! - a stall ([`Faults::stall`]): every operation waits until the stall is
//!   lifted, as a backend behind a hung device or a lost network does.
//!
//! Discard and zeroing pass through unchanged; allocation status too.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use crate::backend::{AllocationRun, BackendCaps, BackendError, BlockBackend, Provisioning};

#[derive(Debug, Default)]
struct Plan {
    reads: Vec<Range<u64>>,
    writes: Vec<Range<u64>>,
    /// Bytes that may still be written; `None`: no limit.
    space: Option<u64>,
    flush: bool,
    delay: Duration,
    stalled: bool,
    /// Operations waiting in a stall.
    waiting: usize,
}

/// The switches of a [`FaultyBackend`]; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    plan: Arc<(Mutex<Plan>, Condvar)>,
    /// Operations that met an injected fault.
    injected: Arc<AtomicU64>,
}

impl Faults {
    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every operation from now on waits (on the thread that runs it)
    /// until `stall(false)`.
    pub fn stall(&self, stalled: bool) {
        self.plan().stalled = stalled;
        self.plan.1.notify_all();
    }

    /// Operations waiting in a stall now.
    pub fn stalled_operations(&self) -> usize {
        self.plan().waiting
    }

    /// Reads touching `bytes` fail with EIO (added to earlier ranges).
    pub fn fail_reads(&self, bytes: Range<u64>) {
        self.plan().reads.push(bytes);
    }

    /// Writes touching `bytes` fail with EIO (added to earlier ranges).
    pub fn fail_writes(&self, bytes: Range<u64>) {
        self.plan().writes.push(bytes);
    }

    /// At most `bytes` more bytes are written; a write that does not fit
    /// fails with ENOSPC and writes nothing. `None` lifts the limit.
    pub fn space(&self, bytes: Option<u64>) {
        self.plan().space = bytes;
    }

    /// `flush`, and every FUA write, fail with EIO while `fail` holds.
    pub fn fail_flush(&self, fail: bool) {
        self.plan().flush = fail;
    }

    /// Every operation first sleeps `delay` (on the thread that runs it).
    pub fn delay(&self, delay: Duration) {
        self.plan().delay = delay;
    }

    /// Removes every fault, delay and stall.
    pub fn clear(&self) {
        let mut plan = self.plan();
        let waiting = plan.waiting;
        *plan = Plan {
            waiting,
            ..Plan::default()
        };
        drop(plan);
        self.plan.1.notify_all();
    }

    /// How many operations met an injected fault so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Acquire)
    }

    fn count(&self) {
        self.injected.fetch_add(1, Ordering::AcqRel);
    }
}

/// The first byte of `op` inside one of `ranges`.
fn first_hit(ranges: &[Range<u64>], op: Range<u64>) -> Option<u64> {
    ranges
        .iter()
        .filter(|r| r.start < op.end && op.start < r.end)
        .map(|r| r.start.max(op.start))
        .min()
}

fn eio(offset: u64) -> BackendError {
    BackendError::At {
        offset,
        source: io::Error::from_raw_os_error(libc::EIO),
    }
}

/// A backend that injects faults into another; see the module
/// documentation.
pub struct FaultyBackend {
    inner: Arc<dyn BlockBackend>,
    faults: Faults,
}

impl fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl FaultyBackend {
    /// Wraps `inner`; no fault is armed until the handle arms one.
    pub fn new(inner: Arc<dyn BlockBackend>) -> (FaultyBackend, Faults) {
        let faults = Faults::default();
        (
            FaultyBackend {
                inner,
                faults: faults.clone(),
            },
            faults,
        )
    }

    /// Waits out a stall and sleeps the configured delay; returns the
    /// plan's lock afterwards.
    fn enter(&self) -> MutexGuard<'_, Plan> {
        let mut plan = self.faults.plan();
        if plan.stalled {
            plan.waiting += 1;
            while plan.stalled {
                plan = self
                    .faults
                    .plan
                    .1
                    .wait(plan)
                    .unwrap_or_else(|p| p.into_inner());
            }
            plan.waiting -= 1;
        }
        let delay = plan.delay;
        if !delay.is_zero() {
            drop(plan);
            std::thread::sleep(delay);
            plan = self.faults.plan();
        }
        plan
    }

    fn check_write(&self, offset: u64, len: u64, fua: bool) -> Result<(), BackendError> {
        let mut plan = self.enter();
        if let Some(at) = first_hit(&plan.writes, offset..offset.saturating_add(len)) {
            self.faults.count();
            return Err(eio(at));
        }
        if fua && plan.flush {
            self.faults.count();
            return Err(BackendError::Io(io::Error::from_raw_os_error(libc::EIO)));
        }
        if let Some(space) = plan.space.as_mut() {
            if len > *space {
                self.faults.count();
                return Err(BackendError::At {
                    offset: offset + *space,
                    source: io::Error::from_raw_os_error(libc::ENOSPC),
                });
            }
            *space -= len;
        }
        Ok(())
    }
}

impl BlockBackend for FaultyBackend {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        let plan = self.enter();
        if let Some(at) = first_hit(&plan.reads, offset..offset + buf.len() as u64) {
            self.faults.count();
            return Err(eio(at));
        }
        drop(plan);
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError> {
        let len = data.iter().map(|d| d.len() as u64).sum();
        self.check_write(offset, len, fua)?;
        self.inner.write_at(offset, data, fua)
    }

    fn flush(&self) -> Result<(), BackendError> {
        if self.enter().flush {
            self.faults.count();
            return Err(BackendError::Io(io::Error::from_raw_os_error(libc::EIO)));
        }
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        drop(self.enter());
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_write(offset, len, false)?;
        self.inner.write_zeroes(offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<AllocationRun, BackendError> {
        self.inner.allocation(offset, len)
    }

    fn caps(&self) -> BackendCaps {
        self.inner.caps()
    }

    fn grow(&self, new_size: u64) -> Result<(), BackendError> {
        self.inner.grow(new_size)
    }

    fn describe(&self) -> String {
        format!("faulty:{}", self.inner.describe())
    }

    /// With a space limit ([`Faults::space`]) armed, what is left of it is
    /// the space available (the wrapped backend's allocation as used):
    /// tests drive the LU's provisioning thresholds with it.
    fn provisioning(&self) -> Option<Provisioning> {
        let space = self.faults.plan().space;
        match space {
            Some(available) => Some(Provisioning {
                available,
                used: self.inner.provisioning().map_or(0, |p| p.used),
            }),
            None => self.inner.provisioning(),
        }
    }

    // `never_blocks` stays false (the default): an injected delay must run
    // on a thread that may block, never on an async worker.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;

    fn faulty() -> (FaultyBackend, Faults) {
        FaultyBackend::new(Arc::new(MemoryBackend::new(1 << 20)))
    }

    fn raw(e: &BackendError) -> Option<i32> {
        match e {
            BackendError::At { source, .. } | BackendError::Io(source) => source.raw_os_error(),
            _ => None,
        }
    }

    #[test]
    fn read_and_write_errors_name_the_first_failing_byte() {
        let (b, f) = faulty();
        let mut buf = [0u8; 4096];
        b.read_at(0, &mut buf).unwrap();
        f.fail_reads(10_000..10_512);
        let e = b.read_at(8192, &mut buf).unwrap_err();
        assert!(
            matches!(e, BackendError::At { offset: 10_000, .. }),
            "{e:?}"
        );
        assert_eq!(raw(&e), Some(libc::EIO));
        b.read_at(0, &mut buf).unwrap();
        f.fail_writes(4096..8192);
        let e = b
            .write_at(0, &[Bytes::from(vec![1; 8192])], false)
            .unwrap_err();
        assert!(matches!(e, BackendError::At { offset: 4096, .. }), "{e:?}");
        assert_eq!(f.injected(), 2);
        f.clear();
        b.write_at(0, &[Bytes::from(vec![1; 8192])], false).unwrap();
    }

    #[test]
    fn space_runs_out_and_a_failing_flush_fails_fua_writes() {
        let (b, f) = faulty();
        f.space(Some(6144));
        b.write_at(0, &[Bytes::from(vec![2; 4096])], false).unwrap();
        let e = b
            .write_at(4096, &[Bytes::from(vec![2; 4096])], false)
            .unwrap_err();
        assert!(matches!(e, BackendError::At { offset: 6144, .. }), "{e:?}");
        assert_eq!(raw(&e), Some(libc::ENOSPC));
        // Nothing of the refused write reached the medium.
        let mut back = [9u8; 4096];
        b.read_at(4096, &mut back).unwrap();
        assert_eq!(back, [0u8; 4096]);
        f.space(None);
        f.fail_flush(true);
        assert!(b.flush().is_err());
        assert!(b.write_at(0, &[Bytes::from(vec![3; 512])], true).is_err());
        b.write_at(0, &[Bytes::from(vec![3; 512])], false).unwrap();
        f.fail_flush(false);
        b.flush().unwrap();
    }
}
