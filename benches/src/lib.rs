//! Benchmarks live in benches/benches; this library holds what they share:
//! [`pages`], a deterministic generator of database-like 8 KiB pages (the
//! compression benchmarks' data set), and [`CpuLatencyRequest`].
#![forbid(unsafe_code)]

pub mod pages;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};

/// A held CPU wake-up latency request (Linux PM QoS,
/// `/dev/cpu_dma_latency`): the request the gateway makes for `[tuning]
/// cpu_latency_us`, made here for benchmarks that run the protocol crates
/// without the gateway. It stays in force, system-wide, until dropped.
#[derive(Debug)]
pub struct CpuLatencyRequest {
    _device: File,
    us: u32,
}

impl CpuLatencyRequest {
    /// Asks the kernel to keep every core's wake-up latency within `us` µs
    /// (needs root). The device takes the value as one native-endian `s32`.
    pub fn hold(us: u32) -> io::Result<CpuLatencyRequest> {
        let value = i32::try_from(us)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "above i32::MAX µs"))?;
        let mut device = OpenOptions::new()
            .write(true)
            .open("/dev/cpu_dma_latency")?;
        // Four bytes in one write: a short one would be read as a hex string.
        let n = device.write(&value.to_ne_bytes())?;
        if n != 4 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
        }
        Ok(CpuLatencyRequest {
            _device: device,
            us,
        })
    }

    /// The latency asked for, in µs.
    pub fn requested_us(&self) -> u32 {
        self.us
    }
}
