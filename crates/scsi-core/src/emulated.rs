//! An emulated SBC-3 direct-access logical unit over a [`BlockBackend`].
//!
//! [`EmulatedLu`] implements [`LogicalUnit`]: SPC-4 and SBC-3 commands,
//! unit attentions per I_T nexus, RESERVE/RELEASE and persistent
//! reservations, mode pages, VPD pages and a bounded [`TaskSet`].
//!
//! This file holds the LU's state, its construction and the command gate
//! (unit attentions, reservations, medium and sanitize state) every task
//! passes before the opcode switch (`dispatch`). The handlers live by
//! command set, as LIO's `target_core_{spc,sbc,pr,ua,tmr,xcopy}.c` do:
//! `spc` (INQUIRY, VPD, mode pages, REPORT SUPPORTED OPERATION CODES,
//! PERSISTENT RESERVE OUT), `sbc` (reads, writes, COMPARE AND WRITE, WRITE
//! SAME, UNMAP, GET LBA STATUS), `sanitize`, `copy` and [`xcopy`]
//! (EXTENDED COPY), `ua` (unit attentions and the nexus registry) and
//! `tmf` (task management and nexus loss).
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_utils::CachePadded;
use crossbeam_utils::sync::{ShardedLock, ShardedLockWriteGuard};

use bytes::{Bytes, BytesMut};

use crate::backend::{BackendError, BlockBackend, WritePath};
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
    /// A thin LU's soft threshold, armed at start: when the space its
    /// backend can still allocate falls below this many bytes, every I_T
    /// nexus hears THIN PROVISIONING SOFT THRESHOLD REACHED (see
    /// `emulated::lbp`; MODE SELECT of page 1Ch/02h changes it). `None`:
    /// no threshold until a host sets one.
    pub soft_threshold: Option<u64>,
    /// How often, at most, writes compare the provisioning resources with
    /// an enabled threshold (each check asks the file system).
    pub threshold_check_interval: std::time::Duration,
    /// Target port groups and their access states ([`crate::alua`]).
    pub alua: crate::alua::AluaConfig,
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
            soft_threshold: None,
            threshold_check_interval: std::time::Duration::from_millis(50),
            alua: crate::alua::AluaConfig::default(),
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
    /// The target port groups are inconsistent.
    #[error(transparent)]
    Alua(#[from] crate::alua::AluaConfigError),
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
    /// Logical block provisioning threshold ([`lbp`]).
    lbp: lbp::LbpState,
    /// The version of the shared reservation state `pr` and `reserve6`
    /// hold (a cluster's store; 0 without one).
    shared_version: u64,
}

/// Aligned to two cache lines so that the `Arc`'s reference counts, which
/// every command changes, share no cache line with the fields every
/// command reads.
#[derive(Debug)]
#[repr(align(128))]
struct Inner {
    /// Operators' counters (`unifab_lu_*` at `/metrics`).
    stats: crate::stats::LuStats,
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
    /// THRESHOLD EXPONENT (VPD B2h): threshold sets of 2^texp blocks.
    texp: u8,
    /// A provisioning threshold is enabled (writes check it).
    lbp_on: AtomicBool,
    /// When the resources were last compared with the threshold: ns since
    /// `lbp_epoch`, plus one (0: never). Claimed by compare-and-swap, so
    /// one writer checks and the others go on.
    lbp_checked: AtomicU64,
    lbp_epoch: std::time::Instant,
    /// Bytes written since the last check, per thread shard (no cache
    /// line shared by every host's writes).
    lbp_written: Box<[CachePadded<AtomicU64>]>,
    state: Mutex<LuState>,
    /// Nexus ids registered in `state.ua` with no unit attention queued:
    /// their commands skip the LU lock while no reservation exists. An
    /// attention established for any nexus empties it (rare: resets,
    /// nexus loss, capacity and mode changes); a nexus goes back in once
    /// its queue is drained. Changed only under the LU lock. Sharded by
    /// thread: the read, once per command, touches only its own thread's
    /// shard, so hosts on different cores share no cache line.
    clear: ShardedLock<crate::idmap::IdSet<u64>>,
    /// A RESERVE or persistent reservation/registration exists.
    reserved: AtomicBool,
    /// The operator's write protection (`read_only` in the configuration,
    /// changed live by [`EmulatedLu::set_read_only`]).
    read_only: AtomicBool,
    /// SWP or read-only.
    write_protected: AtomicBool,
    wce: AtomicBool,
    /// A flush failed: no later flush may report success (see
    /// [`Inner::flush_refused`]).
    flush_failed: AtomicBool,
    /// Shared by writers, exclusive for COMPARE AND WRITE and ORWRITE;
    /// sharded by thread like `clear`.
    write_lock: ShardedLock<()>,
    tasks: TaskSet,
    /// Where the reservation state lives when several gateways front
    /// this LU ([`shared`]); unset, this process alone decides.
    shared: std::sync::OnceLock<Arc<dyn crate::pr::ReservationStore>>,
    /// Where SET TARGET PORT GROUPS goes when several gateways front this
    /// LU; unset, it applies here.
    alua_shared: std::sync::OnceLock<Arc<dyn crate::alua::AluaStore>>,
    /// Target port groups' access states.
    alua: crate::alua::Alua,
}

/// An emulated direct-access block device.
#[derive(Debug, Clone)]
pub struct EmulatedLu {
    inner: Arc<Inner>,
    /// References to `inner`, one per thread shard, each with a reference
    /// count on cache lines of its own: the future of every command holds
    /// one, and taking it from `inner` itself would make every host on the
    /// LU change one shared counter twice per command.
    refs: Arc<[Arc<CachePadded<Arc<Inner>>>]>,
}

/// Thread shards of [`EmulatedLu::refs`].
const REF_SHARDS: usize = 16;

/// This thread's shard (the counters' numbering, folded onto
/// [`REF_SHARDS`]).
fn thread_shard() -> usize {
    crate::stats::thread_shard() % REF_SHARDS
}

/// FNV-1a, for the stable NAA designator.
pub(crate) fn fnv1a(s: &str) -> u64 {
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
pub(crate) fn bad_cdb(byte: u16, bit: Option<u8>) -> TaskResult {
    TaskResult::check_condition(Sense::illegal_field(
        asc::INVALID_FIELD_IN_CDB,
        true,
        byte,
        bit,
    ))
}
pub(crate) fn bad_param(byte: u16, bit: Option<u8>) -> TaskResult {
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
/// The sense for a backend error: DATA PROTECT, SPACE ALLOCATION FAILED
/// WRITE PROTECT for a write the medium has no space for (SBC-3 §4.7.3.6:
/// a thin LU that ran out); DATA PROTECT, WRITE PROTECTED for a read-only
/// medium; else MEDIUM ERROR, WRITE ERROR or UNRECOVERED READ ERROR. The
/// INFORMATION field holds the first failing LBA (VALID set) when the
/// backend named the failing byte and the LBA fits the fixed format.
fn backend_failed(e: &BackendError, write: bool, shift: u32) -> TaskResult {
    tracing::warn!(error = %e, write, "backend I/O failed");
    let sense = match e {
        BackendError::ReadOnly => return write_protected(),
        BackendError::ForeignBuffer => {
            return check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
        }
        // The host retries these (as for a remote LU's lost transport).
        BackendError::Unreachable(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            return check(
                SenseKey::ABORTED_COMMAND,
                asc::LOGICAL_UNIT_COMMUNICATION_TIME_OUT,
            );
        }
        BackendError::Unreachable(_) => {
            return check(
                SenseKey::ABORTED_COMMAND,
                asc::LOGICAL_UNIT_COMMUNICATION_FAILURE,
            );
        }
        BackendError::Fenced(_) => {
            return check(
                SenseKey::NOT_READY,
                asc::LOGICAL_UNIT_NOT_READY_MANUAL_INTERVENTION_REQUIRED,
            );
        }
        BackendError::PortUnavailable => {
            return check(
                SenseKey::NOT_READY,
                asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE,
            );
        }
        _ if write && e.is_out_of_space() => Sense::new(
            SenseKey::DATA_PROTECT,
            asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ),
        _ if write => Sense::new(SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR),
        _ => Sense::new(SenseKey::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR),
    };
    let lba = e.offset().and_then(|o| u32::try_from(o >> shift).ok());
    TaskResult::check_condition(match lba {
        Some(lba) => sense.with_information(lba),
        None => sense,
    })
}

/// Truncates parameter data to the allocation length.
pub(crate) fn data_in(mut v: Vec<u8>, alloc_len: usize) -> TaskResult {
    v.truncate(alloc_len);
    TaskResult::with_data(Bytes::from(v))
}

/// Pads `s` with spaces (or truncates) to `n` ASCII bytes.
pub(crate) fn ascii_field(out: &mut Vec<u8>, s: &str, n: usize) {
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
/// A command that changes the medium, as [`Inner::fence`] sees it: the
/// target port group it arrived through, its CDB (ALUA's states refuse
/// by operation code) and the fence epoch it was admitted in.
#[derive(Debug, Clone)]
struct Fence {
    group: u16,
    cdb: Bytes,
    epoch: u64,
}

impl Fence {
    /// Taken as a command's handler starts, in the same poll as its
    /// arrival checks (no wait between them).
    fn of(alua: &crate::alua::Alua, task: &Task) -> Fence {
        let group = task.nexus.target().port_group;
        let epoch = alua.fence_epoch();
        // Fenced already (between the arrival check and here): never
        // lets the command through, even once the port is back.
        let epoch = if alua.refuses(group, task.cdb.as_bytes()).is_some() {
            0
        } else {
            epoch
        };
        Fence {
            group,
            cdb: task.cdb.bytes().clone(),
            epoch,
        }
    }
}

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

/// `data` without its first `n` bytes (no slice left when `n` covers
/// them all).
fn skip_bytes(data: Vec<Bytes>, n: usize) -> Vec<Bytes> {
    if n == 0 {
        return data;
    }
    let mut left = n;
    data.into_iter()
        .filter_map(|s| {
            if left >= s.len() {
                left -= s.len();
                None
            } else {
                let rest = s.slice(left..);
                left = 0;
                Some(rest)
            }
        })
        .collect()
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
            | Command::SetTargetPortGroups { .. }
            | Command::PersistentReserveIn { .. }
            | Command::PersistentReserveOut { .. }
            | Command::Reserve { .. }
            | Command::Release { .. }
            | Command::ModeSense { .. }
            | Command::ModeSelect { .. }
            | Command::LogSense { .. }
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
        | Command::LogSense { .. }
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
    /// An implicit ALUA transition: target port group `group` enters
    /// `state`, and every I_T nexus hears ASYMMETRIC ACCESS STATE CHANGED.
    /// False if nothing changed (or the group is not configured).
    pub fn set_alua_state(&self, group: u16, state: crate::alua::AccessState) -> bool {
        let inner = &self.inner;
        let mut st = inner.lock();
        if !inner.alua.transition(group, state) {
            return false;
        }
        inner.ua_where(
            &mut st,
            |_| true,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
            false,
        );
        true
    }

    /// Explicit transitions (STATUS CODE 01h) that SET TARGET PORT GROUPS
    /// decided, here or through another gateway of a cluster: every I_T
    /// nexus but `except` (the one that asked) hears ASYMMETRIC ACCESS
    /// STATE CHANGED. Returns whether a state changed.
    pub fn set_alua_states_explicit(
        &self,
        to: &[(u16, crate::alua::AccessState)],
        except: Option<&crate::pr::PortKey>,
    ) -> bool {
        let inner = &self.inner;
        let mut st = inner.lock();
        if !inner.alua.set_explicit(to) {
            return false;
        }
        inner.ua_where(
            &mut st,
            |k| Some(k) != except,
            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
            false,
        );
        true
    }

    /// Keeps SET TARGET PORT GROUPS for this LU in `store` (a cluster's):
    /// a checked request goes there, and every member applies it. Set
    /// once; `false` if a store was already set.
    pub fn share_alua(&self, store: Arc<dyn crate::alua::AluaStore>) -> bool {
        self.inner.alua_shared.set(store).is_ok()
    }

    /// The medium's backend.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.inner.backend
    }

    /// Every configured target port group and its access state.
    pub fn alua_states(&self) -> Vec<(u16, crate::alua::AccessState)> {
        self.inner.alua.states()
    }

    /// Target port groups' state changes so far.
    pub fn alua_transitions(&self) -> u64 {
        self.inner.alua.transitions()
    }

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
        config.alua.validate()?;
        let alua = crate::alua::Alua::new(&config.alua);
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
        let texp = lbp::threshold_exponent(bs.trailing_zeros());
        let lbp_state = if thin {
            lbp::LbpState::configured(config.soft_threshold, u64::from(bs) << texp)
        } else {
            lbp::LbpState::default()
        };
        let reserved = pr.is_active();
        let ro = config.read_only || caps.read_only;
        let wce = config.write_cache;
        let inner = Arc::new(Inner {
            stats: crate::stats::LuStats::new(),
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
            texp,
            lbp_on: AtomicBool::new(lbp_state.threshold.enabled),
            lbp_checked: AtomicU64::new(0),
            lbp_epoch: std::time::Instant::now(),
            lbp_written: (0..REF_SHARDS)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            state: Mutex::new(LuState {
                ua: HashMap::new(),
                reserve6: None,
                pr,
                wce,
                swp: false,
                prevent: HashSet::new(),
                copy_results: VecDeque::new(),
                lbp: lbp_state,
                shared_version: 0,
            }),
            clear: ShardedLock::new(crate::idmap::IdSet::default()),
            reserved: AtomicBool::new(reserved),
            read_only: AtomicBool::new(config.read_only),
            write_protected: AtomicBool::new(ro),
            wce: AtomicBool::new(wce),
            flush_failed: AtomicBool::new(false),
            write_lock: ShardedLock::new(()),
            tasks: TaskSet::new(config.task_set_depth),
            shared: std::sync::OnceLock::new(),
            alua_shared: std::sync::OnceLock::new(),
            alua,
            backend,
            cfg: config,
        });
        let refs = (0..REF_SHARDS)
            .map(|_| Arc::new(CachePadded::new(inner.clone())))
            .collect();
        Ok(EmulatedLu { inner, refs })
    }

    /// The NAA designator (VPD 0x83) as a 64-bit value.
    pub fn naa(&self) -> u64 {
        self.inner.naa
    }

    /// The task set (for inspection and tests).
    pub fn task_set(&self) -> &TaskSet {
        &self.inner.tasks
    }

    /// Grows the LU to `new_size` bytes (whole blocks; a remainder is not
    /// addressable) while hosts use it: the backend grows first, then the
    /// capacity, and every I_T nexus hears CAPACITY DATA HAS CHANGED
    /// (SBC-3 §4.5). A smaller size is refused ([`BackendError::Shrink`]):
    /// blocks a host may hold data in are never cut off under it.
    pub fn grow(&self, new_size: u64) -> Result<(), BackendError> {
        self.inner.backend.grow(new_size)?;
        self.refresh_capacity();
        Ok(())
    }

    /// Sets or lifts the operator's write protection while hosts use the
    /// LU: from now on writes get DATA PROTECT, WRITE PROTECTED (or are
    /// accepted again), and every I_T nexus hears MODE PARAMETERS CHANGED,
    /// as the WP bit of the mode parameter header changed. Lifting it is
    /// refused on a backend opened read-only ([`BackendError::ReadOnly`]).
    pub fn set_read_only(&self, read_only: bool) -> Result<(), BackendError> {
        let backend_ro = self.inner.backend.caps().read_only;
        if !read_only && backend_ro {
            return Err(BackendError::ReadOnly);
        }
        let mut st = self.inner.lock();
        if self.inner.read_only.swap(read_only, Ordering::AcqRel) == read_only {
            return Ok(());
        }
        let wp = read_only || backend_ro || st.swp;
        if self.inner.write_protected.swap(wp, Ordering::AcqRel) != wp {
            self.inner
                .ua_where(&mut st, |_| true, asc::MODE_PARAMETERS_CHANGED, false);
        }
        Ok(())
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
    /// After a failed flush, every later SYNCHRONIZE CACHE and FUA (or
    /// write-through) write fails too: MEDIUM ERROR, WRITE ERROR. Writes
    /// acknowledged into the cache before the failure may be gone (the
    /// kernel drops dirty pages whose write-back failed, and reports the
    /// error to one fsync only), so a later flush that succeeded would tell
    /// the host they are stable when they may not be. The LU stays so until
    /// it is opened again (a restart of the gateway, or the LU removed and
    /// added), after the operator has looked at the medium.
    fn flush_refused(&self) -> Option<TaskResult> {
        self.flush_failed
            .load(Ordering::Acquire)
            .then(|| check(SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR))
    }

    /// Records a failed flush (or durable write): not one the medium
    /// refused for want of space or at a known block, which loses nothing
    /// already acknowledged.
    fn note_flush_failure(&self, e: &BackendError) {
        // Out of space, a known block, write protection: the medium
        // refused this write and lost nothing else. Not issued at all
        // (its port turned Unavailable first): nothing was flushed.
        if e.is_out_of_space()
            || e.offset().is_some()
            || matches!(e, BackendError::ReadOnly | BackendError::PortUnavailable)
        {
            return;
        }
        // A storage cluster that did not answer in time, or that fenced
        // this client off, failed the operation itself; without a write
        // cache in this process no acknowledged write was waiting on it
        // (a fenced LU serves nothing until its storage is opened again,
        // and then flushes may succeed: nothing was lost).
        if matches!(e, BackendError::Unreachable(_) | BackendError::Fenced(_))
            && !self.backend.caps().volatile_cache
        {
            return;
        }
        if !self.flush_failed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                lu = %self.cfg.name,
                error = %e,
                "flush failed: every later flush of this LU fails until it is opened again"
            );
        }
    }

    /// Whether the command `f` describes may still change the medium
    /// through its port. Checked right before each change is handed to
    /// the backend — after any wait for the write lock or an I/O thread,
    /// and between the pieces of a long one (WRITE SAME, UNMAP's ranges,
    /// EXTENDED COPY, SANITIZE) — so a command that arrived while its port
    /// was active changes nothing once the port is Unavailable: a cluster
    /// member past its local deadline, fencing itself, while another
    /// gateway takes the LU over. One atomic load while every group is
    /// active. Nor once the port is active again: a command admitted
    /// before its port was fenced never changes the medium after
    /// ([`crate::alua::Alua::fenced_since`]; one more atomic load while no group has
    /// been fenced since it was admitted).
    fn fence(&self, f: &Fence) -> Result<(), BackendError> {
        if self.alua.refuses(f.group, &f.cdb).is_some() || self.alua.fenced_since(f.group, f.epoch)
        {
            return Err(BackendError::PortUnavailable);
        }
        Ok(())
    }

    /// Takes the write lock exclusively and waits for every asynchronous
    /// write submitted before it ([`BlockBackend::quiesce`]): until the
    /// guard drops, nothing else writes the medium.
    fn exclusive(&self) -> Result<ShardedLockWriteGuard<'_, ()>, BackendError> {
        let g = self.write_lock.write().unwrap_or_else(|p| p.into_inner());
        self.backend.quiesce()?;
        Ok(g)
    }

    fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    /// Where plain writes run: nowhere while write-protected; else the
    /// backend's aio, else as `io_mode` and (when adaptive) the backend
    /// decide, as [`Inner::io`] and the no-wait write in `sbc.rs` do.
    fn write_path(&self) -> WritePath {
        if self.write_protected.load(Ordering::Acquire) {
            return WritePath::ReadOnly;
        }
        if self.backend.aio().is_some() {
            return WritePath::Async;
        }
        match self.cfg.io_mode {
            IoMode::Inline => WritePath::Inline,
            IoMode::Blocking => WritePath::IoThreads,
            IoMode::Adaptive => self.backend.write_path(),
        }
    }

    async fn io<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> Option<T> {
        #[cfg(feature = "tokio")]
        if (self.cfg.io_mode == IoMode::Blocking
            || (self.cfg.io_mode == IoMode::Adaptive && !self.backend.never_blocks()))
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let me = self.clone();
            return handle.spawn_blocking(move || f(&me)).await.ok();
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
        let fast = !self.reserved.load(Ordering::Acquire)
            && self
                .clear
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
            } else if !exempt && let Some(code) = self.take_ua(&mut st, &key) {
                return check(SenseKey::UNIT_ATTENTION, code);
            }
            if st.ua.get(&key).is_some_and(VecDeque::is_empty) {
                self.mark_clear(task.nexus.id());
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
        // After unit attentions (an initiator hears ASYMMETRIC ACCESS
        // STATE CHANGED first), before the command: what the state of the
        // arriving port's group lets through.
        if let Some(code) = self
            .alua
            .refuses(task.nexus.target().port_group, task.cdb.as_bytes())
        {
            return check(SenseKey::NOT_READY, code);
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
}

/// A task in the LU's task set, with the reference that keeps the LU
/// alive; dropping it completes the task.
struct Entered {
    inner: Arc<CachePadded<Arc<Inner>>>,
    ticket: Option<crate::task_set::Ticket>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.inner.tasks.leave(t);
        }
    }
}

impl LogicalUnit for EmulatedLu {
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        // Counted in the command's own future: no wrapper around it.
        let (start, data_in_len, data_out_len) = (
            std::time::Instant::now(),
            task.data_in_len,
            task.data_out_len,
        );
        let ticket = match self.inner.tasks.enter(&task.nexus, task.tag, task.attr) {
            Ok(t) => t,
            Err(_) => {
                let r = TaskResult::status(Status::TASK_SET_FULL);
                self.inner
                    .stats
                    .record(&r, data_in_len, data_out_len, start.elapsed());
                return Box::pin(std::future::ready(r));
            }
        };
        // Made before the future so that dropping the future unpolled
        // still completes the task.
        let entered = Entered {
            inner: self.refs[thread_shard()].clone(),
            ticket: Some(ticket),
        };
        Box::pin(async move {
            let entered = entered;
            let inner: &Arc<Inner> = &entered.inner;
            let result = match entered.ticket.as_ref() {
                None => TaskResult::aborted(),
                Some(ticket) if inner.tasks.ready(ticket).await.is_err() => TaskResult::aborted(),
                Some(ticket) => {
                    let result = inner.run(task).await;
                    if inner.tasks.is_aborted(ticket) {
                        TaskResult::aborted()
                    } else {
                        result
                    }
                }
            };
            inner
                .stats
                .record(&result, data_in_len, data_out_len, start.elapsed());
            // The ticket goes with `entered`, as the future ends.
            result
        })
    }

    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        self.inner.task_management(request)
    }

    fn nexus_loss(&self, nexus: &ItNexus) {
        self.inner.nexus_loss(nexus);
    }

    fn nexus_closing(&self, nexus: &ItNexus) -> BoxFuture<'static, ()> {
        self.inner.nexus_closing(nexus)
    }

    fn describe(&self) -> LuDescription {
        LuDescription {
            name: self.inner.cfg.name.clone(),
            backend: self.inner.backend.describe(),
            block_size: self.inner.bs as u32,
            blocks: self.inner.blocks(),
            write_protected: self.inner.write_protected.load(Ordering::Acquire),
            backend_io: self.inner.backend.io_stats(),
            write_path: Some(self.inner.write_path()),
            fenced: self.inner.backend.fenced(),
        }
    }

    fn stats(&self) -> Option<&crate::stats::LuStats> {
        Some(&self.inner.stats)
    }

    fn answer_promptly(&self) -> bool {
        self.inner.backend.answer_promptly()
    }
}

mod copy;
mod dispatch;
mod lbp;
mod sanitize;
mod sbc;
mod shared;
mod spc;
mod tmf;
pub(crate) mod ua;
pub mod xcopy;

use sbc::copy_within;
use spc::report_opcodes;
pub(crate) use spc::sense_bytes;

#[cfg(test)]
mod alua_tests;
#[cfg(test)]
mod shared_tests;
#[cfg(test)]
mod tests;
