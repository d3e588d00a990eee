//! `unifab bench URL`: a verifying load generator over unifab's iSCSI
//! initiator.
//!
//! Every 512-byte sector the bench writes describes itself: a magic, its
//! own LBA, a generation number, the run's seed and a CRC32C over the rest,
//! followed by pseudo-random bytes. Every read is checked: the CRC, the LBA
//! (data landed where it belongs) and, for every chunk written in this run,
//! the generation of the last acknowledged write (no stale data). A chunk
//! is never read or written while another command on it is in flight, so
//! the expected content is always known.
//!
//! Modes (`--rw`):
//! - `wr` (default): write every chunk of the region once, then read every
//!   chunk once, verifying (in `--pattern` order: sequential, or a random
//!   permutation);
//! - `write`, `read`, `rw` (mixed, `--read-pct`): for `--time` seconds or
//!   `--ops` commands. `read` alone checks what an earlier run wrote
//!   (self-describing sectors; unwritten sectors are counted, not failed).
//!
//! Failed commands are retried as a host would (unit attention, ABORTED
//! COMMAND, NOT READY, BUSY, TASK SET FULL, transport errors) for up to
//! `--retry-time`; any other error, or a miscompare, fails the run
//! (exit status 1).

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};

use unifab_iscsi::initiator::IscsiUrl;
use unifab_iscsi::initiator::io::IscsiInitiator;
use unifab_iscsi::negotiate::Digest;
use unifab_scsi_core::initiator::{Initiator, InitiatorError, Request};
use unifab_scsi_core::sense::{Sense, SenseKey};
use unifab_scsi_core::{Lun, Status, TaskResult};

use super::parse_seconds;
use super::{TOOL_INITIATOR_NAME, command, tool_session};

const SECTOR: usize = 512;
const MAGIC: &[u8; 8] = b"UNIFABv1";

/// What the bench does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Write the region once, then read it back verifying.
    Wr,
    /// Writes only.
    Write,
    /// Reads only (verifying self-describing sectors).
    Read,
    /// Mixed reads and writes.
    Rw,
}

/// The order of chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Uniformly random chunks (a permutation in `wr` mode).
    Random,
    /// Ascending chunks, wrapping at the end of the region.
    Sequential,
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::config::parse_size(s)
}

/// Options of `unifab bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// `iscsi://[user%secret@]host[:port]/iqn/lun`
    pub url: String,
    /// wr | write | read | rw
    #[arg(long, value_enum, default_value = "wr")]
    pub rw: Rw,
    /// random | sequential
    #[arg(long, value_enum, default_value = "random")]
    pub pattern: Pattern,
    /// Block size of each command (a multiple of the LU's block size).
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub bs: u64,
    /// Commands in flight.
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Region length (default: the whole LU, at most 1 GiB).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Region start, bytes.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Seconds to run (write, read, rw; default 10).
    #[arg(long, value_parser = parse_seconds)]
    pub time: Option<f64>,
    /// Commands to run (write, read, rw), instead of --time.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Share of reads in rw mode, percent.
    #[arg(long, default_value_t = 50)]
    pub read_pct: u8,
    /// Seed of the data and the random pattern (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Our InitiatorName.
    #[arg(long, default_value = TOOL_INITIATOR_NAME)]
    pub initiator_name: String,
    /// The target's CHAP credentials for mutual CHAP, as USER%SECRET.
    #[arg(long)]
    pub mutual_chap: Option<String>,
    /// Offer CRC32C header and data digests first.
    #[arg(long)]
    pub digests: bool,
    /// Seconds a command may take (the initiator's command timeout).
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    pub command_timeout: f64,
    /// Seconds to keep retrying a command that fails with a retryable
    /// error.
    #[arg(long, default_value_t = 120.0, value_parser = parse_seconds)]
    pub retry_time: f64,
    /// Seconds without a connection to the target after which the
    /// commands waiting for one fail at once, instead of each waiting out
    /// its command timeout (the initiator's `replacement_timeout`, as
    /// open-iscsi's). Default: none.
    #[arg(long, value_parser = parse_seconds)]
    pub replacement_timeout: Option<f64>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
    /// After a write, read or rw run: read back every chunk this run wrote
    /// and verify it (the check after a fault).
    #[arg(long)]
    pub final_verify: bool,
}

// ---- latency histogram ----------------------------------------------------

/// Log-linear latency histogram: 32 buckets per power of two from 1 µs
/// (about 3 % resolution), nanosecond input.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    sum: u128,
}

const SUB: u64 = 32;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; 60 * SUB as usize],
            total: 0,
            max: 0,
            sum: 0,
        }
    }
}

impl Histogram {
    fn index(ns: u64) -> usize {
        if ns < SUB * 2 {
            return ns as usize;
        }
        let e = 63 - u64::from(ns.leading_zeros()); // ≥ 6
        let sub = (ns >> (e - 5)) & (SUB - 1);
        ((e - 4) * SUB + sub) as usize
    }

    fn lower_bound(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB * 2 {
            return i;
        }
        let e = i / SUB + 4;
        if e >= 64 {
            return u64::MAX;
        }
        let sub = i % SUB;
        (1 << e) | (sub << (e - 5))
    }

    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = Self::index(ns).min(self.counts.len() - 1);
        self.counts[i] += 1;
        self.total += 1;
        self.max = self.max.max(ns);
        self.sum += u128::from(ns);
    }

    /// How many were recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0..=1), in nanoseconds (bucket midpoint).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let want = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                let lo = Self::lower_bound(i);
                let hi = Self::lower_bound(i + 1);
                return (lo / 2 + hi / 2).min(self.max);
            }
        }
        self.max
    }

    /// Mean, nanoseconds.
    pub fn mean(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            (self.sum / u128::from(self.total)) as u64
        }
    }

    /// Largest, nanoseconds.
    pub fn max(&self) -> u64 {
        self.max
    }
}

// ---- self-describing sectors ----------------------------------------------

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Fills `out` (a multiple of 512 bytes) with the sectors of `lba`
/// (512-byte units) onward, generation `generation`.
pub fn fill(out: &mut [u8], lba: u64, generation: u32, seed: u64) {
    for (i, s) in out.chunks_exact_mut(SECTOR).enumerate() {
        let l = lba + i as u64;
        s[..8].copy_from_slice(MAGIC);
        s[8..16].copy_from_slice(&l.to_be_bytes());
        s[16..20].copy_from_slice(&generation.to_be_bytes());
        s[20..24].copy_from_slice(&(seed as u32).to_be_bytes());
        let mut x =
            seed ^ l.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (u64::from(generation) << 32) | 1;
        for w in s[28..].chunks_exact_mut(4) {
            x = xorshift(x);
            w.copy_from_slice(&(x as u32).to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&s[..24]), &s[28..]);
        s[24..28].copy_from_slice(&crc.to_be_bytes());
    }
}

/// What one sector holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectorCheck {
    /// A valid bench sector for this LBA, with this generation and seed.
    Valid {
        /// Generation.
        generation: u32,
        /// Low 32 bits of the seed.
        seed: u32,
    },
    /// Never written by a bench (no magic).
    Unwritten,
    /// Corrupt: bad CRC, or another LBA's sector.
    Bad(&'static str),
}

/// Checks one sector read from `lba`.
pub fn check(s: &[u8], lba: u64) -> SectorCheck {
    if s.len() != SECTOR || &s[..8] != MAGIC {
        return SectorCheck::Unwritten;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&s[..24]), &s[28..]);
    if s[24..28] != crc.to_be_bytes() {
        return SectorCheck::Bad("CRC mismatch");
    }
    if s[8..16] != lba.to_be_bytes() {
        return SectorCheck::Bad("sector of another LBA");
    }
    SectorCheck::Valid {
        generation: u32::from_be_bytes([s[16], s[17], s[18], s[19]]),
        seed: u32::from_be_bytes([s[20], s[21], s[22], s[23]]),
    }
}

// ---- the run ----------------------------------------------------------------

/// Results of one direction.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DirStats {
    /// Commands completed.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Commands per second.
    pub iops: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
    /// Latency, microseconds: p50, p90, p99, p99.9, max, mean.
    pub lat_us: Latency,
}

/// Latency summary in microseconds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    fn of(h: &Histogram) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            p50: us(h.quantile(0.5)),
            p90: us(h.quantile(0.9)),
            p99: us(h.quantile(0.99)),
            p999: us(h.quantile(0.999)),
            max: us(h.max()),
            mean: us(h.mean()),
        }
    }
}

/// The summary `--json` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// The LU (without secrets).
    pub url: String,
    /// Mode.
    pub rw: Rw,
    /// Pattern.
    pub pattern: Pattern,
    /// Block size.
    pub bs: u64,
    /// Queue depth.
    pub qd: usize,
    /// Region bytes.
    pub region: u64,
    /// Seconds of the run (both phases).
    pub seconds: f64,
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// Bytes checked by reads.
    pub verified_bytes: u64,
    /// Sectors read that no bench had written.
    pub unwritten_sectors: u64,
    /// Sectors that did not hold what was last written there.
    pub miscompares: u64,
    /// Retries after retryable errors.
    pub retries: u64,
    /// Retryable errors by kind.
    pub retry_reasons: Vec<(String, u64)>,
    /// Errors that are not retryable, or retries that ran out.
    pub errors: u64,
    /// The first few problems, for the log.
    pub problems: Vec<String>,
    /// Logins of the bench's session (1 + reconnections).
    pub logins: u64,
    /// Digests in use on the last connection: `None`, `header`, `data` or
    /// `header+data`.
    pub digests: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

#[derive(Debug)]
struct Done {
    chunk: u64,
    dir: Dir,
    generation: u32,
    latency: Duration,
    result: Result<TaskResult, String>,
    retries: Vec<String>,
}

/// Is this answer one a host retries? Returns the reason.
fn retryable(r: &Result<TaskResult, InitiatorError>) -> Option<String> {
    match r {
        Err(InitiatorError::InvalidRequest(_)) => None,
        Err(e) => Some(format!("transport: {e}")),
        Ok(t) if t.status == Status::GOOD => None,
        Ok(t) if t.status == Status::BUSY || t.status == Status::TASK_SET_FULL => {
            Some(format!("status {:?}", t.status))
        }
        Ok(t) if t.status == Status::CHECK_CONDITION => {
            let s = t.sense.as_deref().and_then(Sense::parse)?;
            match s.key {
                SenseKey::UNIT_ATTENTION => {
                    Some(format!("unit attention {:02x}/{:02x}", s.asc.0, s.asc.1))
                }
                SenseKey::ABORTED_COMMAND => {
                    Some(format!("aborted command {:02x}/{:02x}", s.asc.0, s.asc.1))
                }
                SenseKey::NOT_READY => Some(format!("not ready {:02x}/{:02x}", s.asc.0, s.asc.1)),
                _ => None,
            }
        }
        Ok(_) => None,
    }
}

fn rw16(opcode: u8, lba: u64, blocks: u32) -> Bytes {
    let mut cdb = [0u8; 16];
    cdb[0] = opcode;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    Bytes::copy_from_slice(&cdb)
}

struct Plan {
    lun: Lun,
    block_size: u64,
    first_chunk_lba: u64,
    bs: u64,
    seed: u64,
    retry_time: Duration,
}

impl Plan {
    /// The device LBA of a chunk.
    fn lba(&self, chunk: u64) -> u64 {
        self.first_chunk_lba + chunk * (self.bs / self.block_size)
    }
    /// The 512-byte sector number of a chunk's first byte.
    fn sector(&self, chunk: u64) -> u64 {
        self.lba(chunk) * (self.block_size / SECTOR as u64)
    }
}

async fn io(ini: IscsiInitiator, plan: &Plan, chunk: u64, dir: Dir, generation: u32) -> Done {
    let blocks = (plan.bs / plan.block_size) as u32;
    let lba = plan.lba(chunk);
    let request = match dir {
        Dir::Write => {
            let mut buf = BytesMut::zeroed(plan.bs as usize);
            fill(&mut buf, plan.sector(chunk), generation, plan.seed);
            Request::with_data_out(plan.lun, rw16(0x8a, lba, blocks), buf.freeze())
        }
        Dir::Read => Request::new(plan.lun, rw16(0x88, lba, blocks), plan.bs as u32),
    };
    let start = Instant::now();
    let mut retries = Vec::new();
    let mut wait = Duration::from_millis(20);
    loop {
        let t = Instant::now();
        let r = ini.submit(request.clone()).outcome.await;
        match retryable(&r) {
            Some(reason) if start.elapsed() < plan.retry_time => {
                retries.push(reason);
                // Unit attentions clear at once; transport trouble takes time.
                if !retries
                    .last()
                    .is_some_and(|r| r.starts_with("unit attention"))
                {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                continue;
            }
            _ => {
                let latency = t.elapsed();
                return Done {
                    chunk,
                    dir,
                    generation,
                    latency: if retries.is_empty() {
                        latency
                    } else {
                        start.elapsed()
                    },
                    result: r.map_err(|e| e.to_string()),
                    retries,
                };
            }
        }
    }
}

/// Splitmix64: the random pattern's generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Expected content of each chunk: 0 unknown (not written by this run),
/// `u32::MAX` written with an unknown outcome, else the generation.
struct Model {
    gens: Vec<u32>,
    busy: Vec<bool>,
}

const UNKNOWN: u32 = u32::MAX;

#[derive(Default)]
struct Tally {
    read: Histogram,
    write: Histogram,
    read_ops: u64,
    write_ops: u64,
    verified: u64,
    unwritten: u64,
    miscompares: u64,
    errors: u64,
    retries: u64,
    reasons: std::collections::BTreeMap<String, u64>,
    problems: Vec<String>,
}

impl Tally {
    fn problem(&mut self, p: String) {
        if self.problems.len() < 20 {
            self.problems.push(p);
        }
    }
}

fn verify(plan: &Plan, model: &Model, t: &mut Tally, chunk: u64, res: &TaskResult) {
    let expected = model.gens[chunk as usize];
    let first = plan.sector(chunk);
    let mut sector = [0u8; SECTOR];
    let mut fill_at = 0;
    let mut index = 0u64;
    let mut bad = 0u64;
    let total: usize = res.data_in.iter().map(Bytes::len).sum();
    if total != plan.bs as usize {
        t.miscompares += 1;
        t.problem(format!(
            "chunk {chunk}: read returned {total} bytes, expected {}",
            plan.bs
        ));
        return;
    }
    let mut each = |s: &[u8], t: &mut Tally| {
        let lba = first + index;
        index += 1;
        match check(s, lba) {
            SectorCheck::Valid { generation, seed } => {
                let ok = match expected {
                    0 => true,
                    UNKNOWN => seed == plan.seed as u32,
                    g => generation == g && seed == plan.seed as u32,
                };
                if !ok {
                    bad += 1;
                    if bad == 1 {
                        t.problem(format!(
                            "sector {lba}: generation {generation} (seed {seed:#x}), expected generation {expected}: stale or foreign data"
                        ));
                    }
                }
            }
            SectorCheck::Unwritten => {
                if expected != 0 {
                    bad += 1;
                    if bad == 1 {
                        t.problem(format!(
                            "sector {lba}: not written, expected generation {expected}"
                        ));
                    }
                } else {
                    t.unwritten += 1;
                }
            }
            SectorCheck::Bad(why) => {
                bad += 1;
                if bad == 1 {
                    t.problem(format!("sector {lba}: {why}"));
                }
            }
        }
    };
    for slice in &res.data_in {
        let mut s = &slice[..];
        if fill_at > 0 {
            let n = (SECTOR - fill_at).min(s.len());
            sector[fill_at..fill_at + n].copy_from_slice(&s[..n]);
            fill_at += n;
            s = &s[n..];
            if fill_at < SECTOR {
                continue;
            }
            each(&sector, t);
        }
        let whole = s.len() / SECTOR * SECTOR;
        for c in s[..whole].chunks_exact(SECTOR) {
            each(c, t);
        }
        let rest = &s[whole..];
        sector[..rest.len()].copy_from_slice(rest);
        fill_at = rest.len();
    }
    t.miscompares += bad;
    t.verified += plan.bs;
}

/// Runs `unifab bench`.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let url: IscsiUrl = args
        .url
        .parse()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.url))?;
    let target = url.target.clone().context("the URL names no target")?;
    let lun = url.lun().context("the URL names no LUN")?;
    if args.qd == 0 || args.qd > 4096 {
        bail!("--qd must be 1..=4096");
    }
    let mut cfg = tool_session(&args.initiator_name, &url, args.mutual_chap.as_deref())?;
    cfg.session.command_timeout =
        Duration::from_secs_f64(args.command_timeout.clamp(0.1, 86_400.0));
    cfg.session.max_commands = (args.qd * 2).max(64);
    cfg.session.replacement_timeout = args.replacement_timeout.map(Duration::from_secs_f64);
    if args.digests {
        cfg = cfg.digests(
            &[Digest::Crc32c, Digest::None],
            &[Digest::Crc32c, Digest::None],
        );
    }
    let ini = IscsiInitiator::start(cfg, &url.portal(), &target);
    ini.wait_connected(Duration::from_secs(30))
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", url.redacted()))?;

    // The LU's geometry.
    let cap = command(
        &ini,
        Request::new(
            lun,
            Bytes::from_static(&[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0]),
            32,
        ),
    )
    .await?;
    let c: Vec<u8> = cap.data_in.iter().flat_map(|b| b.iter().copied()).collect();
    if cap.status != Status::GOOD || c.len() < 12 {
        bail!("READ CAPACITY(16) failed: status {:?}", cap.status);
    }
    let mut last = [0u8; 8];
    last.copy_from_slice(&c[..8]);
    let block_size = u64::from(u32::from_be_bytes([c[8], c[9], c[10], c[11]]));
    let capacity = (u64::from_be_bytes(last) + 1) * block_size;
    if block_size == 0 || block_size % SECTOR as u64 != 0 {
        bail!("block size {block_size} is not a multiple of 512");
    }
    if args.bs == 0 || !args.bs.is_multiple_of(block_size) || args.bs > 16 << 20 {
        bail!("--bs must be a multiple of the LU's block size ({block_size}) up to 16 MiB");
    }
    if !args.offset.is_multiple_of(args.bs) {
        bail!("--offset must be a multiple of --bs");
    }
    let avail = capacity.saturating_sub(args.offset);
    let region = args.size.unwrap_or(avail.min(1 << 30)).min(avail) / args.bs * args.bs;
    let chunks = region / args.bs;
    if chunks == 0 {
        bail!("the region holds no block of --bs bytes");
    }
    if chunks > 1 << 28 {
        bail!("the region has too many chunks; raise --bs or lower --size");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let plan = std::sync::Arc::new(Plan {
        lun,
        block_size,
        first_chunk_lba: args.offset / block_size,
        bs: args.bs,
        seed,
        retry_time: Duration::from_secs_f64(args.retry_time.clamp(0.0, 86_400.0)),
    });
    let mut model = Model {
        gens: vec![0; chunks as usize],
        busy: vec![false; chunks as usize],
    };
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let started = Instant::now();
    let limit_time = match (args.rw, args.ops) {
        (Rw::Wr, _) | (_, Some(_)) => None,
        _ => Some(Duration::from_secs_f64(
            args.time.unwrap_or(10.0).max(0.001),
        )),
    };

    // The work: a queue of (chunk, dir) for wr, generated on the fly else.
    let mut script: VecDeque<(u64, Dir)> = VecDeque::new();
    if args.rw == Rw::Wr {
        let mut order: Vec<u64> = (0..chunks).collect();
        if args.pattern == Pattern::Random {
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        script.extend(order.iter().map(|&c| (c, Dir::Write)));
        script.extend(order.iter().map(|&c| (c, Dir::Read)));
    }
    let total_ops = match args.rw {
        Rw::Wr => chunks * 2,
        _ => args.ops.unwrap_or(u64::MAX),
    };
    let mut issued = 0u64;
    let mut next_seq = 0u64;
    let mut generation = 0u32;
    let mut in_flight = FuturesUnordered::new();
    let tty = std::io::stderr().is_terminal();
    let mut last_print = Instant::now();
    let mut last_ops = 0u64;
    let mut last_bytes = 0u64;
    let progress_every = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    };
    let mut read_phase: Option<Instant> = None;
    let mut verifying = false;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    loop {
        // Keep the queue full.
        let time_up = limit_time.is_some_and(|l| started.elapsed() >= l);
        let mut skipped = 0;
        while in_flight.len() < args.qd && (verifying || (issued < total_ops && !time_up)) {
            let pick = if verifying {
                script.pop_front()
            } else if args.rw == Rw::Wr {
                match script.front() {
                    // The read phase starts once every write has ended.
                    Some(&(_, Dir::Read)) if read_phase.is_none() => {
                        if in_flight.is_empty() {
                            read_phase = Some(Instant::now());
                            script.pop_front()
                        } else {
                            None
                        }
                    }
                    Some(_) => script.pop_front(),
                    None => None,
                }
            } else {
                let chunk = match args.pattern {
                    Pattern::Random => rng.below(chunks),
                    Pattern::Sequential => {
                        let c = next_seq % chunks;
                        next_seq += 1;
                        c
                    }
                };
                let dir = match args.rw {
                    Rw::Write => Dir::Write,
                    Rw::Read => Dir::Read,
                    _ => {
                        if rng.below(100) < u64::from(args.read_pct) {
                            Dir::Read
                        } else {
                            Dir::Write
                        }
                    }
                };
                Some((chunk, dir))
            };
            let Some((chunk, dir)) = pick else {
                break;
            };
            if model.busy[chunk as usize] {
                // Never two commands on one chunk: pick another.
                skipped += 1;
                if skipped > 64 {
                    break;
                }
                continue;
            }
            model.busy[chunk as usize] = true;
            if dir == Dir::Write {
                generation = generation.wrapping_add(1);
                if generation == 0 || generation == UNKNOWN {
                    generation = 1;
                }
            }
            let g = if dir == Dir::Write { generation } else { 0 };
            let ini2 = ini.clone();
            let plan2 = plan.clone();
            in_flight.push(async move { io(ini2, &plan2, chunk, dir, g).await });
            issued += 1;
        }
        let done_issuing = match args.rw {
            _ if verifying => script.is_empty(),
            Rw::Wr => script.is_empty(),
            _ => time_up || issued >= total_ops,
        };
        if in_flight.is_empty() && done_issuing {
            if args.final_verify && !verifying && args.rw != Rw::Wr {
                // Read back everything this run wrote.
                verifying = true;
                script.extend(
                    (0..chunks)
                        .filter(|&c| model.gens[c as usize] != 0)
                        .map(|c| (c, Dir::Read)),
                );
                continue;
            }
            break;
        }
        tokio::select! {
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                model.busy[done.chunk as usize] = false;
                for r in &done.retries {
                    tally.retries += 1;
                    *tally.reasons.entry(r.clone()).or_default() += 1;
                }
                match (&done.result, done.dir) {
                    (Ok(r), Dir::Write) if r.status == Status::GOOD => {
                        model.gens[done.chunk as usize] = done.generation;
                        tally.write.record(done.latency);
                        tally.write_ops += 1;
                    }
                    (Ok(r), Dir::Read) if r.status == Status::GOOD => {
                        verify(&plan, &model, &mut tally, done.chunk, r);
                        tally.read.record(done.latency);
                        tally.read_ops += 1;
                    }
                    (other, dir) => {
                        if dir == Dir::Write {
                            // Old or new content: only its validity is known.
                            model.gens[done.chunk as usize] = UNKNOWN;
                        }
                        tally.errors += 1;
                        let what = match other {
                            Ok(r) => {
                                let s = r.sense.as_deref().and_then(Sense::parse);
                                format!("status {:?} sense {:?}", r.status, s.map(|s| (s.key, s.asc)))
                            }
                            Err(e) => e.clone(),
                        };
                        tally.problem(format!("{dir:?} of chunk {} failed: {what}", done.chunk));
                    }
                }
            }
            _ = ticker.tick() => {}
        }
        if !args.quiet && last_print.elapsed() >= progress_every {
            let ops = tally.read_ops + tally.write_ops;
            let bytes = ops * args.bs;
            let dt = last_print.elapsed().as_secs_f64();
            let mut both = tally.read.clone();
            for (i, c) in tally.write.counts.iter().enumerate() {
                both.counts[i] += c;
            }
            both.total += tally.write.total;
            eprint!(
                "{}[{:6.1}s] {:>9.0} IOPS {:>9.1} MB/s  p50 {:>8.1} µs  ops {}  retries {}  errors {}  miscompares {}{}",
                if tty { "\r" } else { "" },
                started.elapsed().as_secs_f64(),
                (ops - last_ops) as f64 / dt,
                (bytes - last_bytes) as f64 / dt / 1e6,
                both.quantile(0.5) as f64 / 1000.0,
                ops,
                tally.retries,
                tally.errors,
                tally.miscompares,
                if tty { "" } else { "\n" },
            );
            let _ = std::io::stderr().flush();
            last_ops = ops;
            last_bytes = bytes;
            last_print = Instant::now();
        }
        if tally.miscompares > 0 {
            // Wrong data: stop at once, it is the one result that matters.
            break;
        }
    }
    if !args.quiet && tty {
        eprintln!();
    }
    let seconds = started.elapsed().as_secs_f64();
    // In wr mode each direction has its own phase.
    let (write_secs, read_secs) = match read_phase {
        Some(r) => (
            r.duration_since(started).as_secs_f64(),
            r.elapsed().as_secs_f64(),
        ),
        None => (seconds, seconds),
    };
    let logins = ini.logins();
    let digests = match ini.digests() {
        Some(d) if d.header && d.data => "header+data",
        Some(d) if d.header => "header",
        Some(d) if d.data => "data",
        _ => "None",
    }
    .to_string();
    ini.close();
    let dir_stats = |h: &Histogram, ops: u64, secs: f64| DirStats {
        ops,
        bytes: ops * args.bs,
        iops: ops as f64 / secs.max(1e-9),
        mb_per_s: (ops * args.bs) as f64 / secs.max(1e-9) / 1e6,
        lat_us: Latency::of(h),
    };
    let summary = Summary {
        url: url.redacted(),
        rw: args.rw,
        pattern: args.pattern,
        bs: args.bs,
        qd: args.qd,
        region,
        seconds,
        read: dir_stats(&tally.read, tally.read_ops, read_secs),
        write: dir_stats(&tally.write, tally.write_ops, write_secs),
        verified_bytes: tally.verified,
        unwritten_sectors: tally.unwritten,
        miscompares: tally.miscompares,
        retries: tally.retries,
        retry_reasons: tally.reasons.into_iter().collect(),
        errors: tally.errors,
        problems: tally.problems,
        logins,
        digests,
    };
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(if summary.miscompares == 0 && summary.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_summary(s: &Summary) {
    crate::outln!(
        "unifab bench {}  {:?} {:?}  bs={} qd={} region={} MiB  {:.2} s",
        s.url,
        s.pattern,
        s.rw,
        s.bs,
        s.qd,
        s.region >> 20,
        s.seconds
    );
    for (name, d) in [("write", &s.write), ("read", &s.read)] {
        if d.ops == 0 {
            continue;
        }
        crate::outln!(
            "{name:>5}: {} ops, {:.0} IOPS, {:.1} MB/s; latency µs p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} max {:.1} mean {:.1}",
            d.ops,
            d.iops,
            d.mb_per_s,
            d.lat_us.p50,
            d.lat_us.p90,
            d.lat_us.p99,
            d.lat_us.p999,
            d.lat_us.max,
            d.lat_us.mean
        );
    }
    crate::outln!(
        "verified {} bytes: {} miscompares, {} unwritten sectors; {} retries, {} errors, {} logins, digests {}",
        s.verified_bytes,
        s.miscompares,
        s.unwritten_sectors,
        s.retries,
        s.errors,
        s.logins,
        s.digests
    );
    for (r, n) in &s.retry_reasons {
        crate::outln!("  retried {n}x: {r}");
    }
    for p in &s.problems {
        crate::outln!("  problem: {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds on the command line: what a Duration can hold, or a clear
    /// refusal (before, `--time inf` or `--command-timeout nan` panicked).
    #[test]
    fn seconds_arguments_are_checked() {
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_seconds("0"), Ok(0.0));
        for bad in ["nan", "inf", "-1", "1e30", "x", ""] {
            let e = parse_seconds(bad).unwrap_err();
            assert!(e.contains("seconds"), "{bad}: {e}");
        }
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            bench: BenchArgs,
        }
        use clap::Parser as _;
        let url = "iscsi://h/iqn.x/0";
        for flag in ["--time", "--command-timeout", "--retry-time"] {
            for v in ["nan", "inf", "1e30"] {
                let r = Line::try_parse_from(["bench", url, flag, v]);
                assert!(r.is_err(), "{flag} {v} refused");
            }
            let ok = Line::try_parse_from(["bench", url, flag, "3"]);
            assert!(ok.is_ok(), "{flag} 3 taken");
        }
    }

    #[test]
    fn sectors_describe_themselves() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 800, 7, 0xabcdef);
        for (i, s) in b.chunks(SECTOR).enumerate() {
            assert_eq!(
                check(s, 800 + i as u64),
                SectorCheck::Valid {
                    generation: 7,
                    seed: 0xabcdef
                }
            );
        }
        assert_eq!(
            check(&b[..SECTOR], 801),
            SectorCheck::Bad("sector of another LBA")
        );
        let mut c = b.clone();
        c[300] ^= 1;
        assert_eq!(check(&c[..SECTOR], 800), SectorCheck::Bad("CRC mismatch"));
        assert_eq!(check(&[0u8; SECTOR], 5), SectorCheck::Unwritten);
        // Generations differ in content, not only in the header.
        let mut d = vec![0u8; SECTOR];
        fill(&mut d, 800, 8, 0xabcdef);
        assert_ne!(d[100..], b[100..SECTOR]);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5) as f64 / 1000.0;
        let p99 = h.quantile(0.99) as f64 / 1000.0;
        assert!((p50 - 500.0).abs() / 500.0 < 0.04, "{p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.04, "{p99}");
        assert_eq!(h.max(), 1_000_000);
        assert_eq!(h.count(), 1000);
        for i in 0..(60 * SUB as usize - 1) {
            assert!(Histogram::lower_bound(i) <= Histogram::lower_bound(i + 1));
            assert_eq!(Histogram::index(Histogram::lower_bound(i)), i);
        }
    }

    #[test]
    fn verification_catches_stale_and_misplaced_data() {
        let plan = Plan {
            lun: Lun(0),
            block_size: 512,
            first_chunk_lba: 0,
            bs: 1024,
            seed: 42,
            retry_time: Duration::ZERO,
        };
        let model = Model {
            gens: vec![5, 0, UNKNOWN],
            busy: vec![false; 3],
        };
        let mut data = vec![0u8; 1024];
        fill(&mut data, 0, 5, 42);
        // Split across Data-In slices at an odd offset.
        let res = TaskResult {
            data_in: vec![
                Bytes::copy_from_slice(&data[..700]),
                Bytes::copy_from_slice(&data[700..]),
            ],
            ..TaskResult::default()
        };
        let mut t = Tally::default();
        verify(&plan, &model, &mut t, 0, &res);
        assert_eq!((t.miscompares, t.verified), (0, 1024));
        // Stale: generation 4 where 5 was acknowledged.
        fill(&mut data, 0, 4, 42);
        verify(
            &plan,
            &model,
            &mut t,
            0,
            &TaskResult::with_data(Bytes::from(data.clone())),
        );
        assert_eq!(t.miscompares, 2);
        // Misplaced: chunk 0's data read at chunk 1.
        let mut t = Tally::default();
        fill(&mut data, 0, 5, 42);
        verify(
            &plan,
            &model,
            &mut t,
            1,
            &TaskResult::with_data(Bytes::from(data.clone())),
        );
        assert_eq!(t.miscompares, 2);
        // Unknown outcome: any valid sector of this run is fine.
        let mut t = Tally::default();
        fill(&mut data, 4, 9, 42);
        verify(
            &plan,
            &model,
            &mut t,
            2,
            &TaskResult::with_data(Bytes::from(data.clone())),
        );
        assert_eq!(t.miscompares, 0);
        // Short read.
        verify(
            &plan,
            &model,
            &mut t,
            2,
            &TaskResult::with_data(Bytes::from(vec![0u8; 512])),
        );
        assert_eq!(t.miscompares, 1);
    }

    #[test]
    fn retryable_errors() {
        let ua = TaskResult::check_condition(Sense::new(
            SenseKey::UNIT_ATTENTION,
            unifab_scsi_core::Asc(0x29, 0),
        ));
        assert!(retryable(&Ok(ua)).is_some());
        assert!(retryable(&Err(InitiatorError::Disconnected)).is_some());
        assert!(
            retryable(&Ok(InitiatorError::Timeout {
                after: Duration::ZERO
            }
            .task_result()))
            .is_some()
        );
        let medium = TaskResult::check_condition(Sense::new(
            SenseKey::MEDIUM_ERROR,
            unifab_scsi_core::Asc(0x11, 0),
        ));
        assert!(retryable(&Ok(medium)).is_none());
        assert!(retryable(&Ok(TaskResult::good())).is_none());
    }
}
