//! An emulated SBC-3 direct-access logical unit over a [`BlockBackend`].
//!
//! [`EmulatedLu`] implements [`LogicalUnit`]: SPC-4 and SBC-3 commands,
//! unit attentions per I_T nexus, RESERVE/RELEASE and persistent
//! reservations, mode pages, VPD pages and a bounded [`TaskSet`].
//!
//! Decisions recorded here (where the standards leave room):
//!
//! - Data-out shorter or longer than the command's transfer length (the
//!   initiator's expected length disagrees with the CDB): only the whole
//!   blocks received are written, the status is GOOD, and
//!   [`TaskResult::residual`] reports the difference so the transport can
//!   set its over/underflow bits (libiscsi's residual tests expect this).
//! - Data-in is always truncated to the allocation length; read data is
//!   the command's full length and the transport reports the residual.
//! - A LOGICAL UNIT RESET or TARGET RESET establishes its unit attention for
//!   every I_T nexus except the one that requested it (that initiator
//!   already knows), and releases a RESERVE(6/10) reservation.
//! - COMPARE AND WRITE refuses a data-out length other than twice the
//!   blocks it names (INVALID FIELD IN CDB); ORWRITE and COMPARE AND WRITE
//!   hold an exclusive write lock, plain writes a shared one, so both are
//!   atomic against other writers.
//! - On a fixed LU (the default) START STOP UNIT and PREVENT ALLOW MEDIUM
//!   REMOVAL succeed and change nothing. On a removable LU
//!   ([`EmulatedLuConfig::removable`], INQUIRY RMB=1) START STOP UNIT with
//!   LOEJ ejects and loads the medium; while it is ejected every command
//!   that needs the medium gets NOT READY, MEDIUM NOT PRESENT. PREVENT is
//!   held per I_T nexus; while any nexus holds it, eject and load are
//!   refused (ILLEGAL REQUEST, MEDIUM REMOVAL PREVENTED). A nexus's
//!   prevention ends with PREVENT=0, its loss (logout, connection drop),
//!   and every prevention ends with a LOGICAL UNIT RESET or TARGET RESET
//!   (SPC-4 §6.13; SBC-3 §5.7).
//! - SANITIZE (OVERWRITE, BLOCK ERASE, CRYPTO ERASE, EXIT FAILURE MODE)
//!   runs on a thread of its own. While it runs, every command but
//!   INQUIRY, REPORT LUNS and REQUEST SENSE gets NOT READY, SANITIZE IN
//!   PROGRESS; it goes on through ABORT TASK, resets and nexus loss (SBC-4
//!   §4.11). BLOCK ERASE and CRYPTO ERASE deallocate the medium (it reads
//!   back as zeros); OVERWRITE writes the final pass's pattern (the
//!   pattern, or its inverse after an even number of inverted passes) at
//!   most [`EmulatedLuConfig::sanitize_rate`] bytes a second, so a
//!   sanitize does not starve other LUs on the same storage. A failed
//!   sanitize leaves the medium in failure mode (MEDIUM ERROR, SANITIZE
//!   COMMAND FAILED) until a sanitize succeeds or EXIT FAILURE MODE.
//! - EXTENDED COPY (LID1) copies block-to-block segments within this LU
//!   (identification CSCDs naming its NAA designator; [`xcopy`] has the
//!   limits); a list with LIST ID USAGE 00b keeps its result for RECEIVE
//!   COPY RESULTS COPY STATUS on the same I_T nexus (the last
//!   [`COPY_RESULTS_KEPT`] lists) until that nexus is lost or the LU is
//!   reset.
//! - WRITE ATOMIC(16) holds the exclusive write lock, like COMPARE AND
//!   WRITE, so no other write interleaves with it; it has no alignment or
//!   granularity restriction and no atomic boundary support.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::{Bytes, BytesMut};

use crate::backend::{BackendError, BlockBackend};
use crate::cdb::{BlockIo, CdbSize, Command, opcode};
use crate::lu::{BoxFuture, LogicalUnit, LuDescription, TmfFunction, TmfRequest, TmfResponse};
use crate::pr::{Access, PortKey, PrRefusal, PrState, UaTarget};
use crate::sense::{Asc, Sense, SenseKey, asc};
use crate::task::{ItNexus, Residual, Status, Task, TaskResult, TransportId};
use crate::task_set::TaskSet;

/// How backend I/O runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// On the polling thread (memory backends, tests).
    Inline,
    /// On tokio's blocking pool when a runtime is present.
    Blocking,
    /// Inline when the backend cannot wait for a device (RAM, tmpfs);
    /// otherwise reads that hit the page cache are done inline
    /// (`RWF_NOWAIT`) and everything else goes to the blocking pool. A
    /// thread hand-off costs more than a cached 4 KiB read, so this is the
    /// default.
    #[default]
    Adaptive,
}

/// Configuration of an [`EmulatedLu`].
#[derive(Debug, Clone)]
pub struct EmulatedLuConfig {
    /// Operator-visible name; also the identity seed if `identity` is empty.
    pub name: String,
    /// Logical block length: 512 or 4096.
    pub block_size: u32,
    /// Physical block length reported by READ CAPACITY(16) (LOGICAL BLOCKS
    /// PER PHYSICAL BLOCK EXPONENT): a power-of-two multiple of
    /// `block_size`, at most 2^15 logical blocks. `None`: the logical
    /// block length.
    pub physical_block_size: Option<u32>,
    /// Removable medium (INQUIRY RMB=1): START STOP UNIT LOEJ ejects and
    /// loads it, PREVENT ALLOW MEDIUM REMOVAL guards it.
    pub removable: bool,
    /// T10 vendor identification (≤ 8 ASCII characters).
    pub vendor: String,
    /// Product identification (≤ 16).
    pub product: String,
    /// Product revision level (≤ 4).
    pub revision: String,
    /// Unit serial number (VPD 0x80); empty: derived from the identity.
    pub serial: String,
    /// Stable identity from which the NAA designator is derived; empty:
    /// `name` is used. The same identity gives the same NAA after restart.
    pub identity: String,
    /// Where APTPL persistent reservation state is kept; `None`: APTPL is
    /// not supported.
    pub pr_path: Option<PathBuf>,
    /// Maximum transfer length in logical blocks (VPD 0xB0).
    pub max_transfer_blocks: u32,
    /// Write cache enabled at start (caching page WCE); with WCE=0 every
    /// write is write-through (FUA).
    pub write_cache: bool,
    /// Refuse all writes (DATA PROTECT).
    pub read_only: bool,
    /// Most bytes a second a SANITIZE OVERWRITE writes; 0: no limit.
    pub sanitize_rate: u64,
    /// Backend I/O mode.
    pub io_mode: IoMode,
    /// Task set depth (TASK SET FULL beyond).
    pub task_set_depth: usize,
}

impl Default for EmulatedLuConfig {
    fn default() -> Self {
        EmulatedLuConfig {
            name: "lu0".into(),
            block_size: 512,
            physical_block_size: None,
            removable: false,
            vendor: "UNIFAB".into(),
            product: "EMULATED DISK".into(),
            revision: "0001".into(),
            serial: String::new(),
            identity: String::new(),
            pr_path: None,
            max_transfer_blocks: 16384,
            write_cache: true,
            read_only: false,
            sanitize_rate: DEFAULT_SANITIZE_RATE,
            io_mode: IoMode::default(),
            task_set_depth: 256,
        }
    }
}

/// Why an [`EmulatedLu`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LuError {
    /// Only 512 and 4096 are supported.
    #[error("unsupported block size {0}")]
    BlockSize(u32),
    /// The physical block length is not a power-of-two multiple of the
    /// logical block length (at most 2^15 logical blocks).
    #[error("unsupported physical block size {0}")]
    PhysicalBlockSize(u32),
    /// The backend holds no whole block.
    #[error("backend of {0} bytes holds no block")]
    TooSmall(u64),
    /// The APTPL file exists but cannot be understood.
    #[error("persistent reservation file {0} is corrupt")]
    CorruptPr(PathBuf),
    /// Reading the APTPL file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Default [`EmulatedLuConfig::sanitize_rate`]: 128 MiB/s.
pub const DEFAULT_SANITIZE_RATE: u64 = 128 << 20;

/// Held EXTENDED COPY results kept for RECEIVE COPY RESULTS.
pub const COPY_RESULTS_KEPT: usize = 16;

/// Most unit attentions queued per I_T nexus.
const UA_QUEUE: usize = 8;
/// Initiator ports (I_T nexuses) a LU keeps unit attention state for.
/// State for a nexus outlives its connection (SAM-5: a nexus that comes
/// back hears I_T NEXUS LOSS OCCURRED), so without a bound every new ISID
/// or WWPN would add an entry for good. Past it, an entry with nothing
/// queued goes first (else any other): that initiator, if it returns,
/// hears POWER ON, RESET OR BUS DEVICE RESET OCCURRED, which it handles
/// as it would after a reset.
pub const MAX_NEXUSES: usize = 4096;
/// MAXIMUM COMPARE AND WRITE LENGTH.
const MAX_CAW_BLOCKS: u32 = 255;
/// MAXIMUM WRITE SAME LENGTH.
const MAX_WRITE_SAME_BLOCKS: u64 = 65535;
/// MAXIMUM UNMAP LBA COUNT.
const MAX_UNMAP_BLOCKS: u64 = 1 << 20;
/// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
const MAX_UNMAP_DESCRIPTORS: usize = 256;

/// SANITIZE service actions (SBC-4 Table 83).
const SANITIZE_OVERWRITE: u8 = 0x01;
const SANITIZE_BLOCK_ERASE: u8 = 0x02;
const SANITIZE_CRYPTO_ERASE: u8 = 0x03;
const SANITIZE_EXIT_FAILURE_MODE: u8 = 0x1f;

/// What a SANITIZE does to the medium.
#[derive(Debug)]
enum SanitizeJob {
    /// Every block becomes this image.
    Overwrite(Vec<u8>),
    /// Deallocate (or zero) every block.
    Erase,
}

#[derive(Debug)]
struct LuState {
    /// Every I_T nexus identity seen, with its pending unit attentions.
    ua: HashMap<PortKey, VecDeque<Asc>>,
    reserve6: Option<PortKey>,
    pr: PrState,
    wce: bool,
    swp: bool,
    /// I_T nexuses holding PREVENT MEDIUM REMOVAL.
    prevent: HashSet<PortKey>,
    /// Held EXTENDED COPY results: nexus, list identifier, status.
    copy_results: VecDeque<(PortKey, u8, xcopy::CopyStatus)>,
}

#[derive(Debug)]
struct Inner {
    cfg: EmulatedLuConfig,
    backend: Arc<dyn BlockBackend>,
    bs: u64,
    shift: u32,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT.
    lbppbe: u8,
    /// A removable medium that is ejected.
    ejected: AtomicBool,
    /// A SANITIZE operation is running.
    sanitizing: AtomicBool,
    /// The last SANITIZE failed (sanitize failure mode).
    sanitize_failed: AtomicBool,
    blocks: AtomicU64,
    naa: u64,
    serial: String,
    thin: bool,
    state: Mutex<LuState>,
    /// Nexus ids already registered in `state.ua` (fast-path check).
    seen: RwLock<crate::idmap::IdSet<u64>>,
    /// Pending unit attentions over all nexuses (fast-path check).
    ua_total: AtomicUsize,
    /// A RESERVE or persistent reservation/registration exists.
    reserved: AtomicBool,
    /// SWP or read-only.
    write_protected: AtomicBool,
    wce: AtomicBool,
    /// Shared by writers, exclusive for COMPARE AND WRITE and ORWRITE.
    write_lock: RwLock<()>,
    tasks: TaskSet,
}

/// An emulated direct-access block device.
#[derive(Debug, Clone)]
pub struct EmulatedLu {
    inner: Arc<Inner>,
}

/// FNV-1a, for the stable NAA designator.
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn check(key: SenseKey, asc: Asc) -> TaskResult {
    TaskResult::check_condition(Sense::new(key, asc))
}
fn illegal(asc: Asc) -> TaskResult {
    check(SenseKey::ILLEGAL_REQUEST, asc)
}
fn bad_cdb(byte: u16, bit: Option<u8>) -> TaskResult {
    TaskResult::check_condition(Sense::illegal_field(
        asc::INVALID_FIELD_IN_CDB,
        true,
        byte,
        bit,
    ))
}
fn bad_param(byte: u16, bit: Option<u8>) -> TaskResult {
    TaskResult::check_condition(Sense::illegal_field(
        asc::INVALID_FIELD_IN_PARAMETER_LIST,
        false,
        byte,
        bit,
    ))
}
fn lba_out_of_range() -> TaskResult {
    illegal(asc::LBA_OUT_OF_RANGE)
}
/// CHECK CONDITION, DATA PROTECT, WRITE PROTECTED (also a read-only
/// remote LU's refusal).
pub(crate) fn write_protected() -> TaskResult {
    check(SenseKey::DATA_PROTECT, asc::WRITE_PROTECTED)
}
fn backend_failed(e: &BackendError, write: bool) -> TaskResult {
    tracing::warn!(error = %e, "backend I/O failed");
    match e {
        BackendError::ReadOnly => write_protected(),
        BackendError::ForeignBuffer => {
            check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE)
        }
        _ if write => check(SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR),
        _ => check(SenseKey::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR),
    }
}

/// Truncates parameter data to the allocation length.
fn data_in(mut v: Vec<u8>, alloc_len: usize) -> TaskResult {
    v.truncate(alloc_len);
    TaskResult::with_data(Bytes::from(v))
}

/// Pads `s` with spaces (or truncates) to `n` ASCII bytes.
fn ascii_field(out: &mut Vec<u8>, s: &str, n: usize) {
    let mut bytes: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..0x7f).contains(&b) { b } else { b' ' })
        .take(n)
        .collect();
    bytes.resize(n, b' ');
    out.extend_from_slice(&bytes);
}

/// Copies `n` bytes of data-out starting at byte `skip` into a new buffer.
fn gather(data: &[Bytes], skip: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut pos = 0usize;
    for s in data {
        let end = pos + s.len();
        if end > skip && out.len() < n {
            let from = skip.saturating_sub(pos);
            let want = n - out.len();
            let to = (from + want).min(s.len());
            if let Some(piece) = s.get(from..to) {
                out.extend_from_slice(piece);
            }
        }
        pos = end;
    }
    out
}

/// The first `n` bytes of data-out as slices, without copying; the input
/// vector itself when it is exactly `n` bytes.
fn first_bytes(data: Vec<Bytes>, n: usize) -> Vec<Bytes> {
    let total: usize = data.iter().map(Bytes::len).sum();
    if total == n {
        return data;
    }
    let mut out = Vec::with_capacity(data.len());
    let mut left = n;
    for s in data {
        if left == 0 {
            break;
        }
        let take = s.len().min(left);
        out.push(s.slice(..take));
        left -= take;
    }
    out
}

/// Whether `cmd` needs the medium: on a removable LU with the medium
/// ejected it gets NOT READY, MEDIUM NOT PRESENT. Commands about the
/// device server itself (INQUIRY, REPORT LUNS, sense, mode and
/// reservation data, START STOP UNIT, PREVENT ALLOW) do not.
fn needs_medium(cmd: &Command) -> bool {
    !matches!(
        cmd,
        Command::Inquiry { .. }
            | Command::RequestSense { .. }
            | Command::ReportLuns { .. }
            | Command::ReportSupportedOpcodes { .. }
            | Command::ReportSupportedTmfs { .. }
            | Command::ReportTargetPortGroups { .. }
            | Command::PersistentReserveIn { .. }
            | Command::PersistentReserveOut { .. }
            | Command::Reserve { .. }
            | Command::Release { .. }
            | Command::ModeSense { .. }
            | Command::ModeSelect { .. }
            | Command::StartStopUnit { .. }
            | Command::PreventAllow { .. }
            | Command::SendDiagnostic { .. }
            | Command::ReceiveCopyResults { .. }
    )
}

/// Command classes for RESERVE(6) and persistent reservation conflicts.
fn access_of(cmd: &Command) -> Access {
    match cmd {
        Command::Inquiry { .. }
        | Command::RequestSense { .. }
        | Command::ReportLuns { .. }
        | Command::ReportSupportedOpcodes { .. }
        | Command::ReportSupportedTmfs { .. }
        | Command::ReportTargetPortGroups { .. }
        | Command::PersistentReserveIn { .. }
        | Command::PersistentReserveOut { .. }
        | Command::TestUnitReady { .. }
        | Command::ReadCapacity10 { .. }
        | Command::ReadCapacity16 { .. } => Access::Always,
        Command::Read(_)
        | Command::Verify(_)
        | Command::PreFetch { .. }
        | Command::GetLbaStatus { .. }
        | Command::ModeSense { .. }
        | Command::ReceiveCopyResults { .. }
        | Command::ReadDefectData { .. } => Access::Read,
        _ => Access::Write,
    }
}

impl EmulatedLu {
    /// Builds the LU. Loads APTPL state from `config.pr_path` if present.
    pub fn new(
        config: EmulatedLuConfig,
        backend: Arc<dyn BlockBackend>,
    ) -> Result<EmulatedLu, LuError> {
        let bs = config.block_size;
        if bs != 512 && bs != 4096 {
            return Err(LuError::BlockSize(bs));
        }
        let lbppbe = match config.physical_block_size {
            None => 0,
            Some(p) if p >= bs && p % bs == 0 && (p / bs).is_power_of_two() => {
                let e = (p / bs).trailing_zeros();
                if e > 15 {
                    return Err(LuError::PhysicalBlockSize(p));
                }
                e as u8
            }
            Some(p) => return Err(LuError::PhysicalBlockSize(p)),
        };
        let blocks = backend.size() / u64::from(bs);
        if blocks == 0 {
            return Err(LuError::TooSmall(backend.size()));
        }
        let pr = match &config.pr_path {
            Some(p) if p.exists() => {
                let text = std::fs::read_to_string(p)?;
                PrState::from_text(&text).ok_or_else(|| LuError::CorruptPr(p.clone()))?
            }
            _ => PrState::new(),
        };
        let seed = if config.identity.is_empty() {
            config.name.clone()
        } else {
            config.identity.clone()
        };
        let hash = fnv1a(&seed);
        // NAA 3h (locally assigned), 60 bits from the identity.
        let naa = (0x3u64 << 60) | (hash & 0x0fff_ffff_ffff_ffff);
        let serial = if config.serial.is_empty() {
            format!("{hash:016x}")
        } else {
            config.serial.clone()
        };
        let caps = backend.caps();
        let thin = caps.discard && caps.discard_zeroes;
        let reserved = pr.is_active();
        let ro = config.read_only || caps.read_only;
        let wce = config.write_cache;
        Ok(EmulatedLu {
            inner: Arc::new(Inner {
                bs: u64::from(bs),
                shift: bs.trailing_zeros(),
                lbppbe,
                ejected: AtomicBool::new(false),
                sanitizing: AtomicBool::new(false),
                sanitize_failed: AtomicBool::new(false),
                blocks: AtomicU64::new(blocks),
                naa,
                serial,
                thin,
                state: Mutex::new(LuState {
                    ua: HashMap::new(),
                    reserve6: None,
                    pr,
                    wce,
                    swp: false,
                    prevent: HashSet::new(),
                    copy_results: VecDeque::new(),
                }),
                seen: RwLock::new(crate::idmap::IdSet::default()),
                ua_total: AtomicUsize::new(0),
                reserved: AtomicBool::new(reserved),
                write_protected: AtomicBool::new(ro),
                wce: AtomicBool::new(wce),
                write_lock: RwLock::new(()),
                tasks: TaskSet::new(config.task_set_depth),
                backend,
                cfg: config,
            }),
        })
    }

    /// The NAA designator (VPD 0x83) as a 64-bit value.
    pub fn naa(&self) -> u64 {
        self.inner.naa
    }

    /// The task set (for inspection and tests).
    pub fn task_set(&self) -> &TaskSet {
        &self.inner.tasks
    }

    /// Re-reads the backend size; if the capacity changed, establishes
    /// CAPACITY DATA HAS CHANGED for every I_T nexus.
    pub fn refresh_capacity(&self) {
        let blocks = self.inner.backend.size() / self.inner.bs;
        if self.inner.blocks.swap(blocks, Ordering::AcqRel) != blocks {
            let mut st = self.inner.lock();
            self.inner
                .ua_where(&mut st, |_| true, asc::CAPACITY_DATA_HAS_CHANGED, false);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    /// Queues `code` for every known nexus matching `pred`; a reset-family
    /// code (29h) replaces what was queued.
    fn ua_where(&self, st: &mut LuState, pred: impl Fn(&PortKey) -> bool, code: Asc, reset: bool) {
        for (key, q) in st.ua.iter_mut() {
            if !pred(key) {
                continue;
            }
            let (removed, added) = crate::sense::establish_ua(q, code, reset, UA_QUEUE);
            self.ua_total.fetch_sub(removed, Ordering::AcqRel);
            self.ua_total.fetch_add(added, Ordering::AcqRel);
        }
    }

    fn ua_for(&self, st: &mut LuState, targets: &[(UaTarget, Asc)]) {
        for (t, code) in targets {
            self.ua_where(st, |k| t.matches(k), *code, false);
        }
    }

    fn update_reserved(&self, st: &LuState) {
        self.reserved.store(
            st.reserve6.is_some() || st.pr.is_active(),
            Ordering::Release,
        );
    }

    /// Registers the nexus (first contact: POWER ON, RESET OR BUS DEVICE
    /// RESET OCCURRED) and returns its identity.
    fn enter(&self, st: &mut LuState, nexus: &ItNexus) -> PortKey {
        let key = PortKey::of(nexus);
        if !st.ua.contains_key(&key) {
            if st.ua.len() >= MAX_NEXUSES {
                let victim = st
                    .ua
                    .iter()
                    .find(|(_, q)| q.is_empty())
                    .or_else(|| st.ua.iter().next())
                    .map(|(k, _)| k.clone());
                if let Some(q) = victim.and_then(|v| st.ua.remove(&v)) {
                    self.ua_total.fetch_sub(q.len(), Ordering::AcqRel);
                }
            }
            st.ua.insert(
                key.clone(),
                VecDeque::from([asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED]),
            );
            self.ua_total.fetch_add(1, Ordering::AcqRel);
        }
        if let Ok(mut seen) = self.seen.write() {
            seen.insert(nexus.id());
        }
        key
    }

    fn take_ua(&self, st: &mut LuState, key: &PortKey) -> Option<Asc> {
        let code = st.ua.get_mut(key)?.pop_front()?;
        self.ua_total.fetch_sub(1, Ordering::AcqRel);
        Some(code)
    }

    async fn io<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> Option<T> {
        #[cfg(feature = "tokio")]
        if self.cfg.io_mode == IoMode::Blocking
            || (self.cfg.io_mode == IoMode::Adaptive && !self.backend.never_blocks())
        {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let me = self.clone();
                return handle.spawn_blocking(move || f(&me)).await.ok();
            }
        }
        Some(f(self))
    }

    /// Runs one task (after the task set enabled it).
    async fn run(self: &Arc<Self>, mut task: Task) -> TaskResult {
        let op = task.cdb.opcode().unwrap_or(0xff);
        let exempt = matches!(
            op,
            opcode::INQUIRY | opcode::REPORT_LUNS | opcode::REQUEST_SENSE
        );
        let fast = self.ua_total.load(Ordering::Acquire) == 0
            && !self.reserved.load(Ordering::Acquire)
            && self
                .seen
                .read()
                .map(|s| s.contains(&task.nexus.id()))
                .unwrap_or(false);
        let parsed = Command::parse(task.cdb.as_bytes());
        if !fast {
            let mut st = self.lock();
            let key = self.enter(&mut st, &task.nexus);
            if op == opcode::REQUEST_SENSE {
                if let Some(code) = self.take_ua(&mut st, &key) {
                    let desc = matches!(parsed, Ok(Command::RequestSense { desc: true, .. }));
                    let alloc = match parsed {
                        Ok(Command::RequestSense { alloc_len, .. }) => usize::from(alloc_len),
                        _ => 0,
                    };
                    let s = Sense::new(SenseKey::UNIT_ATTENTION, code);
                    return data_in(sense_bytes(&s, desc), alloc);
                }
            } else if !exempt {
                if let Some(code) = self.take_ua(&mut st, &key) {
                    return check(SenseKey::UNIT_ATTENTION, code);
                }
            }
            if let Ok(cmd) = &parsed {
                let access = access_of(cmd);
                if let Some(holder) = &st.reserve6 {
                    let allowed = access == Access::Always
                        && !matches!(
                            cmd,
                            Command::PersistentReserveOut { .. }
                                | Command::PersistentReserveIn { .. }
                                | Command::TestUnitReady { .. }
                        );
                    if *holder != key && !allowed && !matches!(cmd, Command::Release { .. }) {
                        return TaskResult::status(Status::RESERVATION_CONFLICT);
                    }
                }
                if st.pr.conflicts(&key, access) {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
            }
        }
        let cmd = match parsed {
            Ok(c) => c,
            Err(e) => return TaskResult::check_condition(Sense::from(e)),
        };
        if self.sanitizing.load(Ordering::Acquire)
            && !matches!(
                cmd,
                Command::Inquiry { .. } | Command::ReportLuns { .. } | Command::RequestSense { .. }
            )
        {
            return check(
                SenseKey::NOT_READY,
                asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
            );
        }
        if self.ejected.load(Ordering::Acquire) && needs_medium(&cmd) {
            return check(SenseKey::NOT_READY, asc::MEDIUM_NOT_PRESENT);
        }
        if self.sanitize_failed.load(Ordering::Acquire)
            && needs_medium(&cmd)
            && !matches!(cmd, Command::Sanitize { .. })
        {
            return check(SenseKey::MEDIUM_ERROR, asc::SANITIZE_COMMAND_FAILED);
        }
        self.dispatch(cmd, &mut task).await
    }

    async fn dispatch(self: &Arc<Self>, cmd: Command, task: &mut Task) -> TaskResult {
        match cmd {
            Command::TestUnitReady { .. } => TaskResult::good(),
            Command::RequestSense {
                desc, alloc_len, ..
            } => {
                let s = if self.sanitizing.load(Ordering::Acquire) {
                    Sense::new(
                        SenseKey::NOT_READY,
                        asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
                    )
                } else {
                    Sense::new(SenseKey::NO_SENSE, asc::NO_ADDITIONAL_SENSE)
                };
                data_in(sense_bytes(&s, desc), usize::from(alloc_len))
            }
            Command::Inquiry {
                evpd,
                page_code,
                alloc_len,
                ..
            } => self.inquiry(&task.nexus, evpd, page_code, alloc_len),
            Command::ModeSense {
                ten,
                llbaa,
                dbd,
                pc,
                page_code,
                subpage,
                alloc_len,
                ..
            } => self.mode_sense(ten, llbaa, dbd, pc, page_code, subpage, alloc_len),
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
                ..
            } => self.mode_select(task, ten, pf, sp, param_len),
            Command::Reserve { .. } => {
                let mut st = self.lock();
                let key = PortKey::of(&task.nexus);
                if st.pr.is_active() {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
                match &st.reserve6 {
                    Some(h) if *h != key => TaskResult::status(Status::RESERVATION_CONFLICT),
                    _ => {
                        st.reserve6 = Some(key);
                        self.update_reserved(&st);
                        TaskResult::good()
                    }
                }
            }
            Command::Release { .. } => {
                let mut st = self.lock();
                if st.reserve6.as_ref() == Some(&PortKey::of(&task.nexus)) {
                    st.reserve6 = None;
                    self.update_reserved(&st);
                }
                TaskResult::good()
            }
            Command::StartStopUnit {
                power_condition,
                loej,
                start,
                ..
            } => {
                // A power condition other than START_VALID ignores LOEJ
                // and START (SBC-3 §5.25).
                if !self.cfg.removable || !loej || power_condition != 0 {
                    return TaskResult::good();
                }
                let st = self.lock();
                if !st.prevent.is_empty() {
                    return illegal(asc::MEDIUM_REMOVAL_PREVENTED);
                }
                self.ejected.store(!start, Ordering::Release);
                TaskResult::good()
            }
            Command::PreventAllow {
                prevent: p @ (0 | 1),
                ..
            } => {
                if self.cfg.removable {
                    let mut st = self.lock();
                    let key = PortKey::of(&task.nexus);
                    if p == 1 {
                        st.prevent.insert(key);
                    } else {
                        st.prevent.remove(&key);
                    }
                }
                TaskResult::good()
            }
            Command::PreventAllow { .. } => bad_cdb(4, Some(1)),
            Command::WriteAtomic16 {
                wrprotect,
                dpo,
                fua,
                lba,
                boundary,
                blocks,
                group,
                control,
            } => {
                if wrprotect != 0 {
                    return bad_cdb(1, Some(7));
                }
                if self.write_protected.load(Ordering::Acquire) {
                    return write_protected();
                }
                if let Some(r) = self.range(lba, u64::from(blocks)) {
                    return r;
                }
                if u32::from(blocks) > self.max_atomic_blocks() {
                    return bad_cdb(12, None);
                }
                // MAXIMUM ATOMIC BOUNDARY SIZE is zero: no boundaries.
                if boundary != 0 {
                    return bad_cdb(10, None);
                }
                let io = BlockIo {
                    size: CdbSize::Sixteen,
                    lba,
                    blocks: u32::from(blocks),
                    protect: 0,
                    dpo,
                    fua,
                    fua_nv: false,
                    rarc: false,
                    bytchk: 0,
                    group,
                    control,
                };
                self.write_locked(io, task, false, true).await
            }
            Command::SendDiagnostic {
                self_test_code,
                self_test,
                param_len,
                ..
            } => {
                let code_ok = if self_test {
                    self_test_code == 0
                } else {
                    matches!(self_test_code, 0 | 1 | 2 | 5 | 6)
                };
                if param_len != 0 {
                    bad_cdb(3, None)
                } else if !code_ok {
                    bad_cdb(1, Some(7))
                } else {
                    TaskResult::good()
                }
            }
            Command::FormatUnit {
                fmtpinfo, fmtdata, ..
            } => {
                if self.write_protected.load(Ordering::Acquire) {
                    return write_protected();
                }
                if fmtpinfo != 0 {
                    return bad_cdb(1, Some(7));
                }
                if fmtdata {
                    let hdr = gather(&task.data_out, 0, 4);
                    if hdr.len() < 4 {
                        return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                    }
                    if hdr.get(2..4) != Some(&[0, 0][..]) {
                        return bad_param(2, None);
                    }
                }
                TaskResult::good()
            }
            Command::ReadCapacity10 { .. } => {
                let last = self.blocks().saturating_sub(1).min(0xffff_ffff) as u32;
                let mut v = Vec::with_capacity(8);
                v.extend_from_slice(&last.to_be_bytes());
                v.extend_from_slice(&(self.bs as u32).to_be_bytes());
                TaskResult::with_data(Bytes::from(v))
            }
            Command::ReadCapacity16 { alloc_len, .. } => {
                let mut v = vec![0u8; 32];
                v[0..8].copy_from_slice(&self.blocks().saturating_sub(1).to_be_bytes());
                v[8..12].copy_from_slice(&(self.bs as u32).to_be_bytes());
                v[13] = self.lbppbe;
                if self.thin {
                    v[14] = 0x80 | 0x40; // LBPME, LBPRZ
                }
                data_in(v, alloc_len as usize)
            }
            Command::Read(io) => self.read(io).await,
            Command::Write(io) => self.write(io, task, false).await,
            Command::WriteAndVerify(io) => self.write(io, task, true).await,
            Command::Sanitize {
                immed,
                service_action,
                param_len,
                ..
            } => self.sanitize(task, immed, service_action, param_len).await,
            Command::ExtendedCopy {
                service_action,
                param_len,
                ..
            } => self.extended_copy(task, service_action, param_len).await,
            Command::ReceiveCopyResults {
                service_action,
                list_id,
                alloc_len,
                ..
            } => match service_action {
                0x03 => data_in(xcopy::operating_parameters(), alloc_len as usize),
                0x00 => {
                    let key = PortKey::of(&task.nexus);
                    let st = self.lock();
                    let found = st
                        .copy_results
                        .iter()
                        .rev()
                        .find(|(k, id, _)| *k == key && *id == list_id)
                        .map(|(_, _, s)| *s);
                    match found {
                        Some(s) => data_in(s.to_bytes(), alloc_len as usize),
                        None => bad_cdb(2, None),
                    }
                }
                _ => bad_cdb(1, Some(4)),
            },
            Command::Verify(io) => self.verify(io, task).await,
            Command::OrWrite(io) => self.orwrite(io, task).await,
            Command::CompareAndWrite(io) => self.compare_and_write(io, task).await,
            Command::PreFetch { lba, blocks, .. } => match self.range(lba, u64::from(blocks)) {
                Some(r) => r,
                None => TaskResult::good(),
            },
            Command::SynchronizeCache { lba, blocks, .. } => {
                if let Some(r) = self.range(lba, u64::from(blocks)) {
                    return r;
                }
                match self.io(|me| me.backend.flush()).await {
                    Some(Ok(())) => TaskResult::good(),
                    Some(Err(e)) => backend_failed(&e, true),
                    None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
                }
            }
            Command::WriteSame {
                size,
                wrprotect,
                anchor,
                unmap,
                ndob,
                lba,
                blocks,
                ..
            } => {
                self.write_same(task, size, wrprotect, anchor, unmap, ndob, lba, blocks)
                    .await
            }
            Command::Unmap {
                anchor, param_len, ..
            } => self.unmap(task, anchor, param_len).await,
            Command::ReadDefectData {
                twelve,
                req_plist,
                req_glist,
                format,
                alloc_len,
                ..
            } => {
                let flags = (u8::from(req_plist) << 4) | (u8::from(req_glist) << 3) | format;
                let v = if twelve {
                    vec![0, flags, 0, 0, 0, 0, 0, 0]
                } else {
                    vec![0, flags, 0, 0]
                };
                data_in(v, alloc_len as usize)
            }
            Command::PersistentReserveIn {
                service_action,
                alloc_len,
                ..
            } => {
                let st = self.lock();
                match st.pr.prin(service_action, self.cfg.pr_path.is_some()) {
                    Some(v) => data_in(v, usize::from(alloc_len)),
                    None => bad_cdb(1, Some(4)),
                }
            }
            Command::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                param_len,
                ..
            } => self.prout(task, service_action, scope, pr_type, param_len),
            Command::GetLbaStatus { lba, alloc_len, .. } => {
                self.get_lba_status(lba, alloc_len).await
            }
            Command::ReportLuns {
                select_report,
                alloc_len,
                ..
            } => {
                if alloc_len < 16 {
                    return bad_cdb(6, None);
                }
                if !matches!(select_report, 0 | 2) {
                    return bad_cdb(2, None);
                }
                let mut v = Vec::with_capacity(16);
                v.extend_from_slice(&8u32.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&task.lun.to_bytes());
                data_in(v, alloc_len as usize)
            }
            Command::ReportTargetPortGroups {
                format, alloc_len, ..
            } => {
                let t = task.nexus.target();
                let mut v = Vec::with_capacity(20);
                let ext = format == 1;
                if format > 1 {
                    return bad_cdb(1, Some(7));
                }
                v.extend_from_slice(&[0; 4]);
                if ext {
                    v.extend_from_slice(&[0x10, 0, 0, 0]);
                }
                // Active/optimized, AO_SUP; one port.
                v.extend_from_slice(&[0x80, 0x01]);
                v.extend_from_slice(&t.port_group.to_be_bytes());
                v.extend_from_slice(&[0, 0x02, 0, 1]);
                v.extend_from_slice(&[0, 0]);
                v.extend_from_slice(&t.relative_port_id.to_be_bytes());
                let len = (v.len() - if ext { 8 } else { 4 }) as u32;
                v[0..4].copy_from_slice(&len.to_be_bytes());
                data_in(v, alloc_len as usize)
            }
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                service_action,
                alloc_len,
                ..
            } => match report_opcodes(rctd, options, opcode, service_action) {
                Ok(v) => data_in(v, alloc_len as usize),
                Err(r) => r,
            },
            Command::ReportSupportedTmfs {
                repd, alloc_len, ..
            } => {
                // ATS ATSS CTSS LURS QTS TRS | QUAS QTSS ITNRS
                let mut v = vec![0xd0 | 0x08 | 0x04 | 0x02, 0x07, 0, 0];
                if repd {
                    v[3] = 0x0c;
                    v.resize(16, 0);
                }
                data_in(v, alloc_len as usize)
            }
        }
    }

    /// LBA range check: `Some(error)` if `lba + blocks` passes the end.
    fn range(&self, lba: u64, blocks: u64) -> Option<TaskResult> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => None,
            _ => Some(lba_out_of_range()),
        }
    }

    /// Common checks of block I/O commands.
    fn io_checks(&self, io: &BlockIo, write: bool, max: u64) -> Option<TaskResult> {
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

    fn out_residual(&self, task: &Task, wanted: u64) -> Option<Residual> {
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

    async fn read(self: &Arc<Self>, io: BlockIo) -> TaskResult {
        if let Some(r) = self.io_checks(&io, false, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        let len = (u64::from(io.blocks) << self.shift) as usize;
        if len == 0 {
            return TaskResult::good();
        }
        let off = io.lba << self.shift;
        if self.cfg.io_mode != IoMode::Blocking {
            match self.backend.read_shared(off, len) {
                Some(Ok(b)) => return TaskResult::with_data(b),
                Some(Err(e)) => return backend_failed(&e, false),
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
                Ok(_) => return backend_failed(&BackendError::ForeignBuffer, false),
                Err(e) => return backend_failed(&e, false),
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
            Some(Err(e)) => backend_failed(&e, false),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    /// EXTENDED COPY (LID1): checks the parameter list, then copies each
    /// segment within this LU.
    async fn extended_copy(
        self: &Arc<Self>,
        task: &Task,
        service_action: u8,
        param_len: u32,
    ) -> TaskResult {
        if service_action != 0 {
            return bad_cdb(1, Some(4));
        }
        if param_len == 0 {
            return TaskResult::good();
        }
        if self.write_protected.load(Ordering::Acquire) {
            return write_protected();
        }
        // Longer than any list the limits allow: refused by the parser
        // from its header; no need to gather more than the limit.
        let cap = 16 + xcopy::MAX_DESCRIPTOR_LIST_LENGTH as usize + 64;
        let want = (param_len as usize).min(cap);
        let p = gather(&task.data_out, 0, want);
        if p.len() < want {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let plan = match xcopy::CopyPlan::parse(&p, self.naa, self.bs as u32) {
            Ok(plan) => plan,
            Err(sense) => return TaskResult::check_condition(sense),
        };
        let mut status = xcopy::CopyStatus {
            ok: true,
            segments: 0,
            bytes: 0,
        };
        let mut result = TaskResult::good();
        for seg in &plan.segments {
            let n = u64::from(seg.blocks);
            if self.range(seg.src_lba, n).is_some() || self.range(seg.dst_lba, n).is_some() {
                status.ok = false;
                result = check(SenseKey::COPY_ABORTED, asc::NO_ADDITIONAL_SENSE);
                break;
            }
            let len = n << self.shift;
            let (src, dst) = (seg.src_lba << self.shift, seg.dst_lba << self.shift);
            let res = self
                .io(move |me| {
                    let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
                    copy_within(me.backend.as_ref(), src, dst, len)
                })
                .await;
            match res {
                Some(Ok(())) => {
                    status.segments += 1;
                    status.bytes += len;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "EXTENDED COPY segment failed");
                    status.ok = false;
                    result = check(
                        SenseKey::COPY_ABORTED,
                        xcopy::COPY_TARGET_DEVICE_NOT_REACHABLE,
                    );
                    break;
                }
                None => {
                    status.ok = false;
                    result = check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
                    break;
                }
            }
        }
        if plan.list_id_usage == 0 {
            let key = PortKey::of(&task.nexus);
            let mut st = self.lock();
            st.copy_results
                .retain(|(k, id, _)| !(*k == key && *id == plan.list_id));
            if st.copy_results.len() >= COPY_RESULTS_KEPT {
                st.copy_results.pop_front();
            }
            st.copy_results.push_back((key, plan.list_id, status));
        }
        result
    }

    /// SANITIZE: checks the request, starts the operation on its own
    /// thread and, without IMMED, waits for it (or for the task's abort).
    async fn sanitize(
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
                let flip = invert && count % 2 == 0;
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
        let work = move || {
            let ok = match me.sanitize_run(&job) {
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
            check(SenseKey::MEDIUM_ERROR, asc::SANITIZE_COMMAND_FAILED)
        } else {
            TaskResult::good()
        }
    }

    /// The sanitize operation itself (on the sanitize thread).
    fn sanitize_run(&self, job: &SanitizeJob) -> Result<(), BackendError> {
        let size = self.blocks() << self.shift;
        match job {
            SanitizeJob::Erase => {
                let _g = self.write_lock.write().unwrap_or_else(|p| p.into_inner());
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

    /// MAXIMUM ATOMIC TRANSFER LENGTH (VPD 0xB0).
    fn max_atomic_blocks(&self) -> u32 {
        self.cfg.max_transfer_blocks.min(u32::from(u16::MAX))
    }

    async fn write(self: &Arc<Self>, io: BlockIo, task: &mut Task, verify: bool) -> TaskResult {
        if let Some(r) = self.io_checks(&io, true, u64::from(self.cfg.max_transfer_blocks)) {
            return r;
        }
        self.write_locked(io, task, verify, false).await
    }

    /// Writes the whole blocks of data-out; `exclusive` holds the write
    /// lock exclusively (no other write interleaves).
    async fn write_locked(
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
        let data = first_bytes(std::mem::take(&mut task.data_out), n as usize);
        let off = io.lba << self.shift;
        let res = self
            .io(move |me| {
                let _shared =
                    (!exclusive).then(|| me.write_lock.read().unwrap_or_else(|p| p.into_inner()));
                let _exclusive =
                    exclusive.then(|| me.write_lock.write().unwrap_or_else(|p| p.into_inner()));
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
            .await;
        match res {
            Some(Ok(None)) => result,
            Some(Ok(Some(at))) => TaskResult::check_condition(
                Sense::new(
                    SenseKey::MISCOMPARE,
                    asc::MISCOMPARE_DURING_VERIFY_OPERATION,
                )
                .with_information(at as u32),
            ),
            Some(Err(e)) => backend_failed(&e, true),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    async fn verify(self: &Arc<Self>, io: BlockIo, task: &Task) -> TaskResult {
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
            Some(Err(e)) => backend_failed(&e, false),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    async fn orwrite(self: &Arc<Self>, io: BlockIo, task: &Task) -> TaskResult {
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
        let res = self
            .io(move |me| {
                let _g = me.write_lock.write().unwrap_or_else(|p| p.into_inner());
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
            Some(Err(e)) => backend_failed(&e, true),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    async fn compare_and_write(self: &Arc<Self>, io: BlockIo, task: &Task) -> TaskResult {
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
        let res = self
            .io(move |me| {
                let _g = me.write_lock.write().unwrap_or_else(|p| p.into_inner());
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
            Some(Err(e)) => backend_failed(&e, true),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_same(
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
        let res = self
            .io(move |me| {
                let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
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
            Some(Err(e)) => backend_failed(&e, true),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    async fn unmap(self: &Arc<Self>, task: &Task, anchor: bool, param_len: u16) -> TaskResult {
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
        let res = self
            .io(move |me| {
                let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
                for (off, len) in ranges {
                    me.backend.discard(off, len)?;
                }
                Ok::<_, BackendError>(())
            })
            .await;
        match res {
            Some(Ok(())) => TaskResult::good(),
            Some(Err(e)) => backend_failed(&e, true),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    async fn get_lba_status(self: &Arc<Self>, lba: u64, alloc_len: u32) -> TaskResult {
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
            Some(Err(e)) => backend_failed(&e, false),
            None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
        }
    }

    fn prout(
        self: &Arc<Self>,
        task: &Task,
        service_action: u8,
        scope: u8,
        pr_type: u8,
        param_len: u32,
    ) -> TaskResult {
        let params = gather(&task.data_out, 0, param_len.min(64 * 1024) as usize);
        let mut st = self.lock();
        if let Some(h) = &st.reserve6 {
            if *h != PortKey::of(&task.nexus) {
                return TaskResult::status(Status::RESERVATION_CONFLICT);
            }
        }
        let before = st.pr.clone();
        match st.pr.prout(
            &task.nexus,
            service_action,
            scope,
            pr_type,
            param_len,
            &params,
            self.cfg.pr_path.is_some(),
        ) {
            Ok(fx) => {
                if fx.persist {
                    if let Some(path) = &self.cfg.pr_path {
                        if let Err(e) = st.pr.persist(path) {
                            tracing::error!(error = %e, "APTPL state not saved");
                            st.pr = before;
                            return check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
                        }
                    }
                }
                self.ua_for(&mut st, &fx.unit_attentions);
                self.update_reserved(&st);
                drop(st);
                for t in &fx.abort {
                    let t = t.clone();
                    drop(
                        self.tasks
                            .abort_matching(move |n, _| t.matches(&PortKey::of(n))),
                    );
                }
                TaskResult::good()
            }
            Err(PrRefusal::Conflict) => TaskResult::status(Status::RESERVATION_CONFLICT),
            Err(PrRefusal::Check(s)) => TaskResult::check_condition(s),
        }
    }

    fn inquiry(&self, nexus: &ItNexus, evpd: bool, page: u8, alloc_len: u16) -> TaskResult {
        let alloc = usize::from(alloc_len);
        if !evpd {
            if page != 0 {
                return bad_cdb(2, None);
            }
            let mut v = Vec::with_capacity(96);
            // Direct access, RMB, SPC-4, HiSup + format 2.
            let rmb = if self.cfg.removable { 0x80 } else { 0 };
            v.extend_from_slice(&[0x00, rmb, 0x06, 0x12, 0, 0, 0, 0x02]);
            // TPGS = 01b (implicit ALUA) for REPORT TARGET PORT GROUPS; CmdQue.
            v[5] = 0x10;
            ascii_field(&mut v, &self.cfg.vendor, 8);
            ascii_field(&mut v, &self.cfg.product, 16);
            ascii_field(&mut v, &self.cfg.revision, 4);
            v.resize(58, 0);
            // Version descriptors: SAM-5, SPC-4, SBC-3, iSCSI/FCP-4.
            for d in [0x00a0u16, 0x0460, 0x04c0, 0x0960, 0x0a40] {
                v.extend_from_slice(&d.to_be_bytes());
            }
            v.resize(96, 0);
            v[4] = (v.len() - 5) as u8;
            return data_in(v, alloc);
        }
        let mut v = vec![0x00, page, 0, 0];
        match page {
            0x00 => v.extend_from_slice(&[0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2]),
            0x8f => {
                // Third-party Copy: a Supported Commands descriptor
                // (0001h) naming EXTENDED COPY(LID1) and RECEIVE COPY
                // RESULTS' COPY STATUS and OPERATING PARAMETERS.
                let cmds: [u8; 7] = [0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
                let mut d = vec![0x00, 0x01, 0, 0, cmds.len() as u8];
                d.extend_from_slice(&cmds);
                d.resize(d.len().div_ceil(4) * 4, 0);
                let dlen = (d.len() - 4) as u16;
                d[2..4].copy_from_slice(&dlen.to_be_bytes());
                v.extend_from_slice(&d);
            }
            0x80 => v.extend_from_slice(self.serial.as_bytes()),
            0x83 => self.device_id(nexus, &mut v),
            0xb0 => {
                v.resize(64, 0);
                v[5] = MAX_CAW_BLOCKS as u8;
                let lbppb = 1u32 << self.lbppbe;
                v[6..8].copy_from_slice(&(lbppb as u16).to_be_bytes());
                v[8..12].copy_from_slice(&self.cfg.max_transfer_blocks.to_be_bytes());
                let opt = (128 * 1024 / self.bs as u32).min(self.cfg.max_transfer_blocks);
                v[12..16].copy_from_slice(&opt.to_be_bytes());
                if self.thin {
                    v[20..24].copy_from_slice(&(MAX_UNMAP_BLOCKS as u32).to_be_bytes());
                    v[24..28].copy_from_slice(&(MAX_UNMAP_DESCRIPTORS as u32).to_be_bytes());
                    v[28..32].copy_from_slice(&lbppb.to_be_bytes());
                }
                v[36..44].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
                // MAXIMUM ATOMIC TRANSFER LENGTH; ATOMIC ALIGNMENT and
                // ATOMIC TRANSFER LENGTH GRANULARITY 0 (no restriction);
                // no atomic boundaries.
                v[44..48].copy_from_slice(&self.max_atomic_blocks().to_be_bytes());
            }
            0xb1 => {
                v.resize(64, 0);
                v[4..6].copy_from_slice(&1u16.to_be_bytes()); // non-rotating
                // WABEREQ = WACEREQ = 01b: reads after a BLOCK or CRYPTO
                // ERASE succeed (the medium reads as zeros).
                v[7] = 0x50;
            }
            0xb2 => {
                v.resize(8, 0);
                if self.thin {
                    v[5] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU LBPWS LBPWS10 LBPRZ
                    v[6] = 0x02; // thin provisioned
                }
            }
            _ => return bad_cdb(2, None),
        }
        let len = (v.len() - 4) as u16;
        v[2..4].copy_from_slice(&len.to_be_bytes());
        data_in(v, alloc)
    }

    fn device_id(&self, nexus: &ItNexus, v: &mut Vec<u8>) {
        let t = nexus.target();
        let proto = t.id.protocol_identifier() << 4;
        // NAA, logical unit, binary.
        v.extend_from_slice(&[0x01, 0x03, 0, 8]);
        v.extend_from_slice(&self.naa.to_be_bytes());
        // T10 vendor ID, logical unit, ASCII.
        let mut t10 = Vec::new();
        ascii_field(&mut t10, &self.cfg.vendor, 8);
        t10.extend_from_slice(self.serial.as_bytes());
        v.extend_from_slice(&[0x02, 0x01, 0, t10.len().min(255) as u8]);
        v.extend(t10.iter().take(255));
        // Relative target port, target port, PIV.
        v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x04, 0, 4, 0, 0]);
        v.extend_from_slice(&t.relative_port_id.to_be_bytes());
        // Target port group.
        v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x05, 0, 4, 0, 0]);
        v.extend_from_slice(&t.port_group.to_be_bytes());
        // Target port name.
        match &t.id {
            TransportId::Fcp { wwpn } => {
                v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x03, 0, 8]);
                v.extend_from_slice(&wwpn.to_be_bytes());
            }
            id @ TransportId::Iscsi { .. } => {
                let name = id.port_name();
                let mut len = name.len() + 1;
                len = len.div_ceil(4) * 4;
                let len = len.min(252);
                v.extend_from_slice(&[proto | 0x03, 0x80 | 0x10 | 0x08, 0, len as u8]);
                let start = v.len();
                v.extend(name.bytes().take(len - 1));
                v.resize(start + len, 0);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn mode_sense(
        &self,
        ten: bool,
        llbaa: bool,
        dbd: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc_len: u16,
    ) -> TaskResult {
        if pc == 3 {
            return illegal(asc::SAVING_PARAMETERS_NOT_SUPPORTED);
        }
        let (wce, swp) = {
            let st = self.lock();
            (st.wce, st.swp)
        };
        let pages: &[u8] = match (page, subpage) {
            (0x3f, 0x00 | 0xff) => &[0x08, 0x0a, 0x1c],
            (0x08 | 0x0a | 0x1c, 0x00) => std::slice::from_ref(match page {
                0x08 => &0x08,
                0x0a => &0x0a,
                _ => &0x1c,
            }),
            (0x08 | 0x0a | 0x1c | 0x3f, _) => return bad_cdb(3, None),
            _ => return bad_cdb(2, Some(5)),
        };
        let mut v = Vec::with_capacity(128);
        let hdr = if ten { 8 } else { 4 };
        v.resize(hdr, 0);
        let wp = self.cfg.read_only || self.backend.caps().read_only || swp;
        let dsp = (u8::from(wp) << 7) | 0x10; // WP, DPOFUA
        let blocks = self.blocks();
        if !dbd {
            if ten && llbaa {
                v.extend_from_slice(&blocks.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&(self.bs as u32).to_be_bytes());
            } else {
                v.extend_from_slice(&(blocks.min(0xffff_ffff) as u32).to_be_bytes());
                v.push(0);
                v.extend_from_slice(&(self.bs as u32).to_be_bytes()[1..]);
            }
        }
        let bd_len = v.len() - hdr;
        for p in pages {
            v.extend_from_slice(&mode_page(*p, pc, wce, swp));
        }
        if ten {
            let n = (v.len() - 2) as u16;
            v[0..2].copy_from_slice(&n.to_be_bytes());
            v[3] = dsp;
            v[4] = u8::from(ten && llbaa && !dbd);
            v[6..8].copy_from_slice(&(bd_len as u16).to_be_bytes());
        } else {
            v[0] = (v.len() - 1).min(255) as u8;
            v[2] = dsp;
            v[3] = bd_len as u8;
        }
        data_in(v, usize::from(alloc_len))
    }

    fn mode_select(
        &self,
        task: &Task,
        ten: bool,
        pf: bool,
        sp: bool,
        param_len: u16,
    ) -> TaskResult {
        if !pf {
            return bad_cdb(1, Some(4));
        }
        if sp {
            return bad_cdb(1, Some(0));
        }
        let len = usize::from(param_len);
        let p = gather(&task.data_out, 0, len);
        if p.len() < len {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let hdr = if ten { 8 } else { 4 };
        if len == 0 {
            return TaskResult::good();
        }
        if len < hdr {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let bd_len = if ten {
            usize::from(u16::from_be_bytes([p[6], p[7]]))
        } else {
            usize::from(p[3])
        };
        let mut at = hdr;
        if bd_len != 0 {
            let Some(bd) = p.get(at..at + bd_len) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            if bd_len != 8 && bd_len != 16 {
                return bad_param((hdr - 1) as u16, None);
            }
            let block_len = u64::from(u32::from_be_bytes([
                0,
                bd[bd_len - 3],
                bd[bd_len - 2],
                bd[bd_len - 1],
            ]));
            if block_len != self.bs {
                return bad_param((at + bd_len - 3) as u16, None);
            }
            at += bd_len;
        }
        let mut st = self.lock();
        let (mut wce, mut swp) = (st.wce, st.swp);
        while at < p.len() {
            let code = p[at] & 0x3f;
            if p[at] & 0x40 != 0 {
                return bad_param(at as u16, Some(6));
            }
            let Some(&plen) = p.get(at + 1) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            let Some(body) = p.get(at..at + 2 + usize::from(plen)) else {
                return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
            };
            if !matches!(code, 0x08 | 0x0a | 0x1c) {
                return bad_param(at as u16, None);
            }
            let current = mode_page(code, 0, wce, swp);
            let mask = mode_page(code, 1, wce, swp);
            if body.len() != current.len() {
                return bad_param((at + 1) as u16, None);
            }
            for i in 2..body.len() {
                let diff = (body[i] ^ current[i]) & !mask[i];
                if diff != 0 {
                    return bad_param((at + i) as u16, Some(7 - diff.leading_zeros() as u8));
                }
            }
            match code {
                0x08 => wce = body[2] & 0x04 != 0,
                0x0a => swp = body[4] & 0x08 != 0,
                _ => {}
            }
            at += body.len();
        }
        if wce != st.wce || swp != st.swp {
            st.wce = wce;
            st.swp = swp;
            self.wce.store(wce, Ordering::Release);
            let ro = self.cfg.read_only || self.backend.caps().read_only || swp;
            self.write_protected.store(ro, Ordering::Release);
            let me = PortKey::of(&task.nexus);
            self.ua_where(&mut st, |k| *k != me, asc::MODE_PARAMETERS_CHANGED, false);
        }
        TaskResult::good()
    }
}

/// Copies `len` bytes at `src` to `dst` on `backend` in 1 MiB pieces,
/// backwards when the destination overlaps the source from above.
fn copy_within(
    backend: &dyn BlockBackend,
    src: u64,
    dst: u64,
    len: u64,
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
        backend.write_at(dst + at, &[Bytes::copy_from_slice(piece)], false)?;
        done += n;
    }
    Ok(())
}

/// A mode page for page control `pc` (0 current, 1 changeable mask,
/// 2 default).
fn mode_page(code: u8, pc: u8, wce: bool, swp: bool) -> Vec<u8> {
    let changeable = pc == 1;
    let default = pc == 2;
    match code {
        0x08 => {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 18;
            p[2] = if changeable || default {
                0x04
            } else {
                u8::from(wce) << 2
            };
            p
        }
        0x0a => {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 10;
            if changeable {
                p[4] = 0x08;
            } else {
                // QUEUE ALGORITHM MODIFIER = 1 (unrestricted reordering).
                p[3] = 0x10;
                p[4] = if swp && !default { 0x08 } else { 0 };
                // BUSY TIMEOUT PERIOD: unlimited.
                p[8..10].copy_from_slice(&0xffffu16.to_be_bytes());
            }
            p
        }
        _ => {
            let mut p = vec![0u8; 12];
            p[0] = 0x1c;
            p[1] = 10;
            p
        }
    }
}

/// Fixed or descriptor format sense bytes (REQUEST SENSE parameter data;
/// also a read-only remote LU's own unit attentions).
pub(crate) fn sense_bytes(s: &Sense, desc: bool) -> Vec<u8> {
    if !desc {
        return s.to_fixed().to_vec();
    }
    let mut v = vec![0x72, s.key.0 & 0x0f, s.asc.0, s.asc.1, 0, 0, 0, 0];
    if let Some(info) = s.information {
        v.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
        v.extend_from_slice(&u64::from(info).to_be_bytes());
    }
    v[7] = (v.len() - 8) as u8;
    v
}

/// Every command this device server implements: opcode and service action.
const SUPPORTED: &[(u8, Option<u16>)] = &[
    (0x00, None),
    (0x03, None),
    (0x04, None),
    (0x08, None),
    (0x0a, None),
    (0x12, None),
    (0x15, None),
    (0x16, None),
    (0x17, None),
    (0x1a, None),
    (0x1b, None),
    (0x1d, None),
    (0x1e, None),
    (0x25, None),
    (0x28, None),
    (0x2a, None),
    (0x2e, None),
    (0x2f, None),
    (0x34, None),
    (0x35, None),
    (0x37, None),
    (0x41, None),
    (0x42, None),
    (0x48, Some(0x01)),
    (0x48, Some(0x02)),
    (0x48, Some(0x03)),
    (0x48, Some(0x1f)),
    (0x55, None),
    (0x56, None),
    (0x57, None),
    (0x5a, None),
    (0x5e, None),
    (0x5f, None),
    (0x83, Some(0x00)),
    (0x84, Some(0x00)),
    (0x84, Some(0x03)),
    (0x88, None),
    (0x89, None),
    (0x8a, None),
    (0x8b, None),
    (0x8e, None),
    (0x8f, None),
    (0x90, None),
    (0x91, None),
    (0x93, None),
    (0x9c, None),
    (0x9e, Some(0x10)),
    (0x9e, Some(0x12)),
    (0xa0, None),
    (0xa3, Some(0x0a)),
    (0xa3, Some(0x0c)),
    (0xa3, Some(0x0d)),
    (0xa8, None),
    (0xaa, None),
    (0xae, None),
    (0xaf, None),
    (0xb7, None),
];

/// CDB usage data: for each byte, the bits the parser accepts, probed one
/// bit at a time on an otherwise zero CDB, less the fields the device
/// server refuses when non-zero (protection fields, ANCHOR).
fn usage_data(op: u8, sa: Option<u16>) -> Vec<u8> {
    let len = crate::cdb::cdb_length_of(op).unwrap_or(16);
    let mut base = vec![0u8; len];
    base[0] = op;
    if let (Some(sa), Some(b)) = (sa, base.get_mut(1)) {
        *b = sa as u8;
    }
    let mut usage = base.clone();
    for i in 1..len {
        for bit in 0..8 {
            // The service action field reads as the service action itself.
            if sa.is_some() && i == 1 && bit < 5 {
                continue;
            }
            let mut probe = base.clone();
            probe[i] ^= 1 << bit;
            if Command::parse(&probe).is_ok() {
                usage[i] |= 1 << bit;
            }
        }
    }
    let block_io = matches!(
        op,
        0x28 | 0x2a
            | 0x2e
            | 0x2f
            | 0x88
            | 0x89
            | 0x8a
            | 0x8b
            | 0x8e
            | 0x8f
            | 0xa8
            | 0xaa
            | 0xae
            | 0xaf
            | 0x41
            | 0x93
            | 0x9c
    );
    if block_io {
        usage[1] &= !0xe0;
    }
    if matches!(op, 0x41 | 0x93 | 0x42) {
        usage[1] &= if op == 0x42 { !0x01 } else { !0x10 };
    }
    if matches!(op, 0x25 | 0x9e) {
        // The obsolete PMI/LBA pair is accepted only in combination.
        for b in usage
            .iter_mut()
            .take(if op == 0x25 { 6 } else { 10 })
            .skip(2)
        {
            *b = 0;
        }
    }
    usage
}

fn timeouts(v: &mut Vec<u8>) {
    v.extend_from_slice(&0x000au16.to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&30u32.to_be_bytes());
    v.extend_from_slice(&60u32.to_be_bytes());
}

fn report_opcodes(rctd: bool, options: u8, op: u8, sa: u16) -> Result<Vec<u8>, TaskResult> {
    match options {
        0 => {
            let mut v = vec![0u8; 4];
            for (o, s) in SUPPORTED {
                v.push(*o);
                v.push(0);
                v.extend_from_slice(&s.unwrap_or(0).to_be_bytes());
                v.push(0);
                v.push((u8::from(rctd) << 1) | u8::from(s.is_some()));
                let len = usage_data(*o, *s).len() as u16;
                v.extend_from_slice(&len.to_be_bytes());
                if rctd {
                    timeouts(&mut v);
                }
            }
            let n = (v.len() - 4) as u32;
            v[0..4].copy_from_slice(&n.to_be_bytes());
            Ok(v)
        }
        1..=3 => {
            let has_sa = SUPPORTED.iter().any(|(o, s)| *o == op && s.is_some());
            let entry = match (options, has_sa) {
                (1, true) => return Err(bad_cdb(3, None)),
                (2, false) => return Err(bad_cdb(3, None)),
                (1, false) => SUPPORTED.iter().find(|(o, _)| *o == op),
                (3, false) if sa != 0 => None,
                (3, false) => SUPPORTED.iter().find(|(o, _)| *o == op),
                _ => SUPPORTED.iter().find(|(o, s)| *o == op && *s == Some(sa)),
            };
            let mut v = vec![0u8; 4];
            match entry {
                None => v[1] = 0x01,
                Some((o, s)) => {
                    v[1] = (u8::from(rctd) << 7) | 0x03;
                    let u = usage_data(*o, *s);
                    v[2..4].copy_from_slice(&(u.len() as u16).to_be_bytes());
                    v.extend_from_slice(&u);
                    if rctd {
                        timeouts(&mut v);
                    }
                }
            }
            Ok(v)
        }
        _ => Err(bad_cdb(2, Some(2))),
    }
}

impl LogicalUnit for EmulatedLu {
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let inner = self.inner.clone();
        let handle = match inner.tasks.register(&task.nexus, task.tag, task.attr) {
            Ok(h) => h,
            Err(_) => {
                return Box::pin(std::future::ready(TaskResult::status(
                    Status::TASK_SET_FULL,
                )));
            }
        };
        Box::pin(async move {
            if handle.ready().await.is_err() {
                return TaskResult::aborted();
            }
            let result = inner.run(task).await;
            if handle.is_aborted() {
                return TaskResult::aborted();
            }
            drop(handle);
            result
        })
    }

    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        let inner = self.inner.clone();
        let nexus = request.nexus.clone();
        let ts = &inner.tasks;
        let wait = match request.function {
            TmfFunction::AbortTask { tag } => {
                let n = nexus.clone();
                let w = ts.abort_matching(move |x, t| *x == n && t == tag);
                if w.count() == 0 {
                    // Nothing to abort: FUNCTION COMPLETE (RFC 7143 maps a
                    // vanished task to "task does not exist" itself).
                    return Box::pin(std::future::ready(TmfResponse::FunctionComplete));
                }
                w
            }
            TmfFunction::AbortTaskSet => {
                let n = nexus.clone();
                ts.abort_matching(move |x, _| *x == n)
            }
            TmfFunction::ClearTaskSet => {
                let w = ts.abort_matching(|_, _| true);
                let me = PortKey::of(&nexus);
                let mut st = inner.lock();
                inner.ua_where(
                    &mut st,
                    |k| *k != me,
                    asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR,
                    false,
                );
                w
            }
            TmfFunction::ClearAca => {
                return Box::pin(std::future::ready(TmfResponse::FunctionRejected));
            }
            TmfFunction::LogicalUnitReset | TmfFunction::TargetReset => {
                let w = ts.abort_matching(|_, _| true);
                let me = PortKey::of(&nexus);
                let code = if request.function == TmfFunction::TargetReset {
                    asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED
                } else {
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                };
                let mut st = inner.lock();
                st.reserve6 = None;
                st.prevent.clear();
                st.copy_results.clear();
                // LOGICAL UNIT RESET: a unit attention for every I_T nexus,
                // the requester's included (SAM-5 §6.3.2; libiscsi's
                // MultipathIO.Reset counts it on the resetting path too).
                // TARGET RESET: every nexus but the requester's, which
                // learns of the reset from the TMF response; libiscsi's
                // Reserve6.LUNReset, run right after TargetWarmReset on the
                // same session, expects its next command to succeed.
                let is_target = request.function == TmfFunction::TargetReset;
                inner.ua_where(&mut st, |k| !is_target || *k != me, code, true);
                inner.update_reserved(&st);
                w
            }
            TmfFunction::ItNexusReset => {
                let n = nexus.clone();
                let w = ts.abort_matching(move |x, _| *x == n);
                let me = PortKey::of(&nexus);
                let mut st = inner.lock();
                st.prevent.remove(&me);
                if st.reserve6.as_ref() == Some(&me) {
                    st.reserve6 = None;
                    inner.update_reserved(&st);
                }
                w
            }
            TmfFunction::QueryTask { tag } => {
                let r = if ts.contains(&nexus, tag) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryTaskSet => {
                let r = if ts.has_tasks_of(&nexus) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryAsyncEvent => {
                let st = inner.lock();
                let pending = st
                    .ua
                    .get(&PortKey::of(&nexus))
                    .is_some_and(|q| !q.is_empty());
                let r = if pending {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
        };
        Box::pin(async move {
            wait.await;
            TmfResponse::FunctionComplete
        })
    }

    fn nexus_loss(&self, nexus: &ItNexus) {
        let inner = &self.inner;
        let n = nexus.clone();
        drop(inner.tasks.abort_matching(move |x, _| *x == n));
        let me = PortKey::of(nexus);
        let mut st = inner.lock();
        st.prevent.remove(&me);
        st.copy_results.retain(|(k, _, _)| *k != me);
        if st.reserve6.as_ref() == Some(&me) {
            st.reserve6 = None;
            inner.update_reserved(&st);
        }
        if st.ua.contains_key(&me) {
            inner.ua_where(&mut st, |k| *k == me, asc::I_T_NEXUS_LOSS_OCCURRED, true);
        }
        if let Ok(mut seen) = inner.seen.write() {
            seen.remove(&nexus.id());
        }
    }

    fn describe(&self) -> LuDescription {
        LuDescription {
            name: self.inner.cfg.name.clone(),
            backend: self.inner.backend.describe(),
            block_size: self.inner.bs as u32,
            blocks: self.inner.blocks(),
            write_protected: self.inner.write_protected.load(Ordering::Acquire),
        }
    }
}

pub mod xcopy;

#[cfg(test)]
mod tests;
