//! Per-batch compression. Every batch is compressed on its own (no
//! dictionary shared across batches or circuits), so any batch can be
//! resent on any circuit. A batch that does not shrink is sent raw, so
//! incompressible data costs nothing on the wire.
//!
//! `auto` picks per batch from what it measures: the rate the link
//! drains (bytes acknowledged per second, fed by the sender) and the CPU
//! time each codec costs per byte here. It sends raw when the link is
//! faster than compression could feed it, LZ4 when the link is the
//! bottleneck, and zstd when even LZ4's output would keep the link busy
//! (zstd's better ratio then pays). Data that did not compress lately is
//! only re-tried every 16th batch; otherwise every 16th batch re-measures
//! a codec not chosen (LZ4 and zstd in turn), and the CPU cost is sampled
//! so that a preempted batch does not count as a dear one.

use std::time::Instant;

use bytes::Bytes;

use crate::wire::enhanced::Codec;

/// The configured mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Never compress.
    #[default]
    None,
    /// LZ4 (fast).
    Lz4,
    /// Zstandard level 3.
    Zstd,
    /// Chosen by link rate and CPU cost.
    Auto,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "none" => Mode::None,
            "lz4" => Mode::Lz4,
            "zstd" => Mode::Zstd,
            "auto" => Mode::Auto,
            o => return Err(format!("compression {o:?}: none, lz4, zstd or auto")),
        })
    }
}

/// Decompression failed: the peer sent a corrupt batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// The body did not decompress to the announced length.
    #[error("batch does not decompress ({0})")]
    Corrupt(&'static str),
    /// Unknown codec.
    #[error("unknown codec {0}")]
    UnknownCodec(u8),
}

/// Compresses batches and keeps the figures `auto` decides by.
#[derive(Debug)]
pub struct Compressor {
    mode: Mode,
    /// Link drain rate estimate, bytes/s (0 = unknown).
    link_rate: f64,
    /// CPU cost per input byte, seconds, per codec (LZ4, zstd).
    cost: [f64; 2],
    /// Ratio (wire/raw) seen lately per codec.
    ratio: [f64; 2],
    skip: u32,
    /// Totals for statistics.
    pub raw_bytes: u64,
    /// Bytes after compression.
    pub wire_bytes: u64,
    /// CPU seconds spent compressing.
    pub cpu_seconds: f64,
}

impl Compressor {
    /// A compressor in `mode`.
    pub fn new(mode: Mode) -> Compressor {
        Compressor {
            mode,
            link_rate: 0.0,
            cost: [2e-9, 8e-9],
            ratio: [0.5, 0.4],
            skip: 0,
            raw_bytes: 0,
            wire_bytes: 0,
            cpu_seconds: 0.0,
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Feeds the measured link drain rate (bytes per second).
    pub fn set_link_rate(&mut self, bytes_per_second: f64) {
        if bytes_per_second.is_finite() && bytes_per_second > 0.0 {
            self.link_rate = if self.link_rate == 0.0 {
                bytes_per_second
            } else {
                0.8 * self.link_rate + 0.2 * bytes_per_second
            };
        }
    }

    fn choose(&mut self) -> Codec {
        match self.mode {
            Mode::None => Codec::NONE,
            Mode::Lz4 => Codec::LZ4,
            Mode::Zstd => Codec::ZSTD,
            Mode::Auto => {
                if self.ratio[0] > 0.97 && self.ratio[1] > 0.97 {
                    // Incompressible lately: probe now and then.
                    self.skip += 1;
                    if !self.skip.is_multiple_of(16) {
                        return Codec::NONE;
                    }
                    Codec::LZ4
                } else if self.link_rate == 0.0 {
                    Codec::LZ4
                } else {
                    // Seconds per raw byte for each choice: the slower of
                    // compressing it and sending what comes out.
                    let send = |ratio: f64| ratio / self.link_rate;
                    let none = send(1.0);
                    let lz4 = self.cost[0].max(send(self.ratio[0]));
                    let zstd = self.cost[1].max(send(self.ratio[1]));
                    let best = if none <= lz4 && none <= zstd {
                        Codec::NONE
                    } else if lz4 <= zstd {
                        Codec::LZ4
                    } else {
                        Codec::ZSTD
                    };
                    // The figures of a codec not chosen go stale (the data
                    // or the host's load changes): every 16th batch tries
                    // the next codec in turn, so each is re-measured at
                    // least every 48 batches.
                    self.skip += 1;
                    if self.skip.is_multiple_of(16) {
                        match (self.skip / 16) % 3 {
                            0 => Codec::LZ4,
                            1 => Codec::ZSTD,
                            _ => best,
                        }
                    } else {
                        best
                    }
                }
            }
        }
    }

    /// Compresses `raw`, returning the codec actually used (NONE when it
    /// did not shrink) and the body.
    pub fn compress(&mut self, raw: Bytes) -> (Codec, Bytes) {
        let codec = self.choose();
        self.raw_bytes += raw.len() as u64;
        if codec == Codec::NONE || raw.len() < 64 {
            self.wire_bytes += raw.len() as u64;
            return (Codec::NONE, raw);
        }
        let t = Instant::now();
        let out = match codec {
            Codec::LZ4 => Some(lz4_flex::block::compress(&raw)),
            _ => zstd::bulk::compress(&raw, 3).ok(),
        };
        let dt = t.elapsed().as_secs_f64();
        self.cpu_seconds += dt;
        let i = usize::from(codec == Codec::ZSTD);
        // Wall-clock time: a batch during which the thread was preempted
        // looks many times dearer than it was. A sample counts for at most
        // twice the current estimate, so preemption spikes cannot push
        // `auto` off compression, while a real rise still comes through
        // (doubling per batch at most).
        let per_byte = (dt / raw.len() as f64).min(2.0 * self.cost[i]);
        self.cost[i] = 0.9 * self.cost[i] + 0.1 * per_byte;
        match out {
            Some(c) if c.len() < raw.len() => {
                self.ratio[i] = 0.8 * self.ratio[i] + 0.2 * (c.len() as f64 / raw.len() as f64);
                self.wire_bytes += c.len() as u64;
                (codec, Bytes::from(c))
            }
            _ => {
                self.ratio[i] = 0.8 * self.ratio[i] + 0.2;
                self.wire_bytes += raw.len() as u64;
                (Codec::NONE, raw)
            }
        }
    }
}

/// Decompresses a body to exactly `raw_len` bytes.
pub fn decompress(codec: Codec, body: Bytes, raw_len: usize) -> Result<Bytes, CompressError> {
    match codec {
        Codec::NONE => {
            if body.len() == raw_len {
                Ok(body)
            } else {
                Err(CompressError::Corrupt("length"))
            }
        }
        Codec::LZ4 => {
            let v = lz4_flex::block::decompress(&body, raw_len)
                .map_err(|_| CompressError::Corrupt("lz4"))?;
            if v.len() == raw_len {
                Ok(Bytes::from(v))
            } else {
                Err(CompressError::Corrupt("lz4 length"))
            }
        }
        Codec::ZSTD => {
            let v = zstd::bulk::decompress(&body, raw_len)
                .map_err(|_| CompressError::Corrupt("zstd"))?;
            if v.len() == raw_len {
                Ok(Bytes::from(v))
            } else {
                Err(CompressError::Corrupt("zstd length"))
            }
        }
        Codec(c) => Err(CompressError::UnknownCodec(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_compresses_for_a_slow_link_and_re_measures_the_others() {
        let mut c = Compressor::new(Mode::Auto);
        c.set_link_rate(125e6); // 1 Gb/s: raw costs 8 ns a byte on the wire
        c.cost = [2e-9, 9e-9];
        c.ratio = [0.36, 0.23];
        let picks: Vec<Codec> = (0..48).map(|_| c.choose()).collect();
        assert!(!picks.contains(&Codec::NONE), "{picks:?}");
        assert!(picks.iter().filter(|p| **p == Codec::LZ4).count() >= 44);
        assert!(picks.contains(&Codec::ZSTD), "zstd is re-measured");
        // A 10 GB/s link: compressing only slows it down; LZ4 and zstd
        // are still tried now and then.
        for _ in 0..30 {
            c.set_link_rate(1e10);
        }
        let picks: Vec<Codec> = (0..48).map(|_| c.choose()).collect();
        assert!(
            picks.iter().filter(|p| **p == Codec::NONE).count() >= 44,
            "{picks:?}"
        );
        assert!(picks.contains(&Codec::LZ4) && picks.contains(&Codec::ZSTD));
    }

    #[test]
    fn a_preempted_batch_does_not_make_a_codec_look_dear() {
        let mut c = Compressor::new(Mode::Lz4);
        // An estimate far below what any real batch costs: every sample
        // is "slow" against it, as a preempted one is against a fair one.
        c.cost = [1e-12, 9e-9];
        let before = c.cost[0];
        let page = Bytes::from("row 42 | amount 17.50 | status OK | ".repeat(2000));
        let _ = c.compress(page);
        assert!(
            c.cost[0] <= before * 1.1 + 1e-12,
            "{} vs {before}",
            c.cost[0]
        );
    }

    #[test]
    fn every_codec_round_trips_and_random_stays_raw() {
        let text = Bytes::from("hello fibre channel ".repeat(500));
        for m in [Mode::None, Mode::Lz4, Mode::Zstd, Mode::Auto] {
            let mut c = Compressor::new(m);
            let (codec, body) = c.compress(text.clone());
            if m != Mode::None {
                assert!(body.len() < text.len() / 4, "{m:?}");
            }
            assert_eq!(decompress(codec, body, text.len()).unwrap(), text);
        }
        let mut x = 1u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let random = Bytes::from(random);
        let mut c = Compressor::new(Mode::Zstd);
        let (codec, body) = c.compress(random.clone());
        assert_eq!(codec, Codec::NONE);
        assert_eq!(body, random);
        assert!(decompress(Codec::LZ4, Bytes::from_static(b"\xff\xff"), 100).is_err());
        assert!(decompress(Codec(9), Bytes::new(), 0).is_err());
    }
}
