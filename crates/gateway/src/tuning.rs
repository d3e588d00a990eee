//! Host tuning the gateway holds while it runs (`[tuning]`).
//!
//! # CPU wake-up latency
//!
//! A command crossing the gateway wakes a thread at least twice (the
//! host's command, the far side's answer), and every hop through a socket
//! or between tasks can wake an idle core. An idle core sleeps in the
//! deepest idle state the kernel's cpuidle governor allows; leaving it
//! costs that state's exit latency. On a virtual machine the deepest state
//! is usually `HLT`, which exits to the hypervisor: waking such a vCPU
//! takes 20–50 µs, more than the gateway's own work on a 4 KiB command.
//!
//! Linux lets a process cap that latency with a PM QoS request: it writes
//! the largest wake-up latency it accepts, in µs, to `/dev/cpu_dma_latency`
//! and the request stays in force while the descriptor is open. The
//! governor then picks only idle states that exit within the cap; at `0`
//! an idle core polls instead of halting, and a wake-up is a store to a
//! flag rather than an interrupt. This is what tuned's
//! `latency-performance` profile does.
//!
//! The request is **system-wide**: it applies to every core and every
//! process for as long as the gateway runs, and it costs power (on a VM,
//! host CPU time: an idle vCPU spins rather than yield its core). It is
//! off unless configured:
//!
//! ```toml
//! [tuning]
//! cpu_latency_us = 0
//! ```
//!
//! Opening the device needs root. If the request cannot be made the
//! gateway refuses to start rather than run without the tuning it was
//! configured with.
//!
//! # Runtime threads
//!
//! `worker_threads` sets how many threads run the gateway's tasks (tokio's
//! worker threads; blocking file I/O has threads of its own). The default
//! is one per core. A gateway that shares a small machine with busy
//! neighbours (its hosts, the target it bridges to) can do better with
//! fewer: a connection's tasks then stay on one thread instead of waking
//! each other across threads. On this project's 2-vCPU test machine, the
//! iSCSI bridge beside tgtd and `qemu-img bench` did 4 % more 4 KiB reads
//! at QD32 with `worker_threads = 1` in one alternated A/B, and the same
//! in another (docs/bridge.md).
//!
//! ```toml
//! [tuning]
//! worker_threads = 1
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The PM QoS device for CPU wake-up latency.
pub const CPU_LATENCY_DEVICE: &str = "/dev/cpu_dma_latency";

/// The largest request the kernel takes: it reads the value as an `s32`
/// and refuses a negative one.
pub const MAX_CPU_LATENCY_US: u32 = i32::MAX as u32;

/// `[tuning]`: host settings held for the gateway's lifetime.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TuningSection {
    /// Hold a CPU wake-up latency request of this many µs (`0`: idle
    /// cores poll). Absent: no request.
    #[serde(default)]
    pub cpu_latency_us: Option<u32>,
    /// Threads that run the gateway's tasks (1 to [`MAX_WORKER_THREADS`]).
    /// Absent: one per core.
    #[serde(default)]
    pub worker_threads: Option<usize>,
}

/// The most `worker_threads` taken.
pub const MAX_WORKER_THREADS: usize = 1024;

impl TuningSection {
    /// Checks the values' ranges.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(us) = self.cpu_latency_us.filter(|us| *us > MAX_CPU_LATENCY_US) {
            return Err(format!(
                "tuning.cpu_latency_us {us} is above the kernel's limit {MAX_CPU_LATENCY_US}"
            ));
        }
        match self.worker_threads {
            Some(n) if !(1..=MAX_WORKER_THREADS).contains(&n) => Err(format!(
                "tuning.worker_threads {n} must be 1 to {MAX_WORKER_THREADS}"
            )),
            _ => Ok(()),
        }
    }

    /// Makes the configured requests. Keep what it returns for as long as
    /// they should hold.
    pub fn apply(&self) -> Result<Option<CpuLatency>, String> {
        self.cpu_latency_us
            .map(|us| {
                CpuLatency::hold(us).map_err(|e| format!("tuning.cpu_latency_us = {us}: {e}"))
            })
            .transpose()
    }
}

/// A held CPU wake-up latency request; dropping it withdraws the request.
#[derive(Debug)]
pub struct CpuLatency {
    _file: File,
    path: PathBuf,
    us: u32,
}

impl CpuLatency {
    /// Asks the kernel to keep every core's wake-up latency within `us` µs.
    pub fn hold(us: u32) -> io::Result<CpuLatency> {
        CpuLatency::hold_at(Path::new(CPU_LATENCY_DEVICE), us)
    }

    /// [`CpuLatency::hold`] through another PM QoS device (or, in tests, a
    /// plain file: the request is the value as a native-endian `s32`).
    pub fn hold_at(path: &Path, us: u32) -> io::Result<CpuLatency> {
        let value = i32::try_from(us).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{us} µs is above the kernel's limit {MAX_CPU_LATENCY_US}"),
            )
        })?;
        let mut file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(naming(path))?;
        // The device takes exactly four bytes as one binary value; a short
        // write would be read as a hex string, so write it whole or fail.
        let n = file.write(&value.to_ne_bytes()).map_err(naming(path))?;
        if n != 4 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{}: wrote {n} of 4 bytes", path.display()),
            ));
        }
        Ok(CpuLatency {
            _file: file,
            path: path.to_path_buf(),
            us,
        })
    }

    /// The latency this request asks for, in µs.
    pub fn requested_us(&self) -> u32 {
        self.us
    }

    /// The device this request was made through.
    pub fn device(&self) -> &Path {
        &self.path
    }
}

/// The latency in force now: the smallest of every process's requests (or
/// the kernel's default, 2,000 s, when there are none), in µs.
pub fn effective_cpu_latency_us() -> io::Result<u32> {
    effective_at(Path::new(CPU_LATENCY_DEVICE))
}

/// Prefixes an I/O error with the device it came from.
fn naming(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn effective_at(path: &Path) -> io::Result<u32> {
    let mut raw = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(naming(path))?;
    u32::try_from(i32::from_ne_bytes(raw)).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: negative latency", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("unifab-tuning-{}-{name}", std::process::id()));
        std::fs::write(&p, b"").unwrap();
        p
    }

    #[test]
    fn a_request_is_one_native_endian_s32() {
        let p = temp("s32");
        let held = CpuLatency::hold_at(&p, 75).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), 75i32.to_ne_bytes());
        assert_eq!(held.requested_us(), 75);
        assert_eq!(effective_at(&p).unwrap(), 75);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_value_the_kernel_would_read_as_negative_is_refused() {
        let p = temp("neg");
        let e = CpuLatency::hold_at(&p, MAX_CPU_LATENCY_US + 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(std::fs::read(&p).unwrap().is_empty(), "nothing written");
        let cfg = TuningSection {
            cpu_latency_us: Some(MAX_CPU_LATENCY_US + 1),
            worker_threads: None,
        };
        assert!(cfg.validate().unwrap_err().contains("cpu_latency_us"));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_missing_device_names_itself_in_the_error() {
        let p = std::env::temp_dir().join("unifab-tuning-no-such-device");
        let e = CpuLatency::hold_at(&p, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains("unifab-tuning-no-such-device"),
            "{e}"
        );
    }

    #[test]
    fn no_section_makes_no_request() {
        assert!(TuningSection::default().apply().unwrap().is_none());
    }

    /// The real device: root only (it is mode 0600), as CI runs.
    #[test]
    fn the_kernel_keeps_a_held_request_in_force() {
        if !Path::new(CPU_LATENCY_DEVICE).exists() {
            panic!("{CPU_LATENCY_DEVICE} is missing: this kernel has no PM QoS device");
        }
        let held = CpuLatency::hold(3).unwrap_or_else(|e| {
            panic!("holding a CPU latency request needs root (CI runs as root): {e}")
        });
        // A configured limit read back from the kernel, not a timing.
        let in_force = effective_cpu_latency_us().unwrap();
        assert!(
            in_force <= 3,
            "the kernel's CPU latency limit is {in_force} µs while a 3 µs request is held"
        );
        drop(held);
    }
}

/// The file descriptor limit, raised at start-up.
///
/// Every iSCSI connection, FCIP circuit and file LU holds a descriptor, and
/// a distribution's default soft limit (1,024) is below the connection
/// limit's default (1,024 connections, each also needing room for files
/// and listeners). A daemon may raise its soft limit to the hard limit
/// without privilege, as Go's runtime and systemd's services do; the
/// gateway does so once, and says so when the result is still below what
/// its connection limit needs. Running out anyway is survived: the portal
/// refuses new logins with Out of resources and logs it (see
/// `unifab_iscsi::target::io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit before.
    pub was: u64,
    /// The soft limit now.
    pub now: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft file descriptor limit to the hard one.
pub fn raise_fd_limit() -> std::io::Result<FdLimit> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    let (now, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    Ok(FdLimit {
        was: soft,
        now,
        hard,
    })
}

/// Descriptors a gateway with `connections` iSCSI connections needs: two
/// per connection (its socket, and the second handle on it with which the
/// portal notices a peer that has gone before the connection's task reads
/// the end of stream), and room for listeners, LU files, admin and logs.
pub fn fds_needed(connections: usize) -> u64 {
    2 * connections as u64 + 64
}
