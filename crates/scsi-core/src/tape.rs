//! An emulated sequential-access logical unit (SSC-3): a tape drive with
//! its cartridge loaded, over a [`BlockBackend`] holding a unifab tape
//! image ([`medium`]).
//!
//! [`TapeLu`] implements [`LogicalUnit`]. Its tasks run one at a time in
//! the order the transport handed them over (a tape has one position, so
//! every command is ORDERED whatever its task attribute); the task set
//! still bounds them and task management aborts them.
//!
//! Commands: TEST UNIT READY, INQUIRY (peripheral type 01h, RMB; VPD 00h,
//! 80h, 83h), REQUEST SENSE, REPORT LUNS, READ BLOCK LIMITS, READ(6) and
//! WRITE(6) in fixed and variable block mode, WRITE FILEMARKS(6), SPACE(6)
//! and SPACE(16) over blocks, filemarks and to end-of-data, REWIND, READ
//! POSITION (short, long and extended forms), LOCATE(10/16), ERASE, LOAD
//! UNLOAD, PREVENT ALLOW MEDIUM REMOVAL, MODE SENSE/SELECT(6/10) with the
//! block descriptor and the control, data compression, device
//! configuration and medium partition pages, REPORT DENSITY SUPPORT,
//! RESERVE/RELEASE(6/10) and PERSISTENT RESERVE IN/OUT.
//!
//! Decisions recorded here (where SSC-3 leaves room):
//!
//! - Buffered mode 1 (the default, as drives ship): a WRITE(6) returns GOOD
//!   once its record is in the backend's cache. WRITE FILEMARKS without
//!   IMMED, REWIND and ERASE without IMMED, and LOAD UNLOAD are sync points:
//!   everything written before them is on stable storage before their
//!   GOOD. In buffered mode 0 every WRITE(6) and filemark is written
//!   through (FUA) before its status.
//! - With IMMED, the flush runs after GOOD; if it fails, the initiator
//!   that sent the command hears it once, as a deferred error (response
//!   code 71h, MEDIUM ERROR, WRITE ERROR) on its next command, and every
//!   later sync point fails too (as the disk LU's failed flush does): a
//!   flush that failed is never reported as succeeded later.
//! - Early warning: a write that ends in the early-warning zone completes
//!   and returns CHECK CONDITION, NO SENSE, EOM, END-OF-PARTITION/MEDIUM
//!   DETECTED. A write that does not fit before the physical end writes
//!   nothing of the block that does not fit: VOLUME OVERFLOW, EOM, with
//!   the residue (bytes in variable mode, blocks in fixed mode) in
//!   INFORMATION.
//! - Variable-mode reads: a shorter block sets ILI with the positive
//!   residue unless SILI is one; a longer block returns the requested
//!   bytes and sets ILI with the negative residue, unless SILI is one and
//!   the mode block length is zero (SSC-3 READ(6), the second of the two choices it gives for SILI). Fixed-mode
//!   reads of a block whose length is not the mode block length stop
//!   after it with ILI and the blocks not read. SILI with FIXED is refused.
//! - One partition, no setmarks, no compression (the data compression page
//!   reports DCC = 0). The density code is 80h ("UNIFAB"), the block
//!   lengths 1 to [`TapeLuConfig::max_block`]; a mode block length of 0
//!   selects variable mode.
//! - Reservations: under a Write Exclusive reservation, READ(6), READ
//!   POSITION, READ BLOCK LIMITS, MODE SENSE and REPORT DENSITY SUPPORT are
//!   allowed to other initiators; every command that moves the medium or
//!   writes is not (the position is shared state).

pub mod medium;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::backend::{BackendError, BlockBackend};
use crate::cdb::Command;
use crate::emulated::{ascii_field, bad_cdb, bad_param, data_in, fnv1a};
use crate::lu::{BoxFuture, LogicalUnit, LuDescription, TmfFunction, TmfRequest, TmfResponse};
use crate::pr::{Access, PortKey, PrRefusal, PrState};
use crate::sense::{Asc, Sense, SenseKey, asc};
use crate::task::{ItNexus, Status, Task, TaskAttr, TaskResult, TransportId};
use crate::task_set::TaskSet;

pub use medium::{Medium, MediumError, Object};

/// The density code this drive reports and writes.
pub const DENSITY_CODE: u8 = 0x80;
/// Most unit attentions queued per I_T nexus.
const UA_QUEUE: usize = 8;
/// Initiator ports a tape keeps unit attention state for.
const MAX_NEXUSES: usize = 1024;

/// SSC additional sense codes.
mod ssc_asc {
    use crate::sense::Asc;
    pub const FILEMARK_DETECTED: Asc = Asc(0x00, 0x01);
    pub const END_OF_PARTITION_MEDIUM_DETECTED: Asc = Asc(0x00, 0x02);
    pub const BEGINNING_OF_PARTITION_MEDIUM_DETECTED: Asc = Asc(0x00, 0x04);
    pub const END_OF_DATA_DETECTED: Asc = Asc(0x00, 0x05);
    pub const NOT_READY_TO_READY_CHANGE: Asc = Asc(0x28, 0x00);
}
use ssc_asc::*;

/// VOLUME OVERFLOW.
const VOLUME_OVERFLOW: SenseKey = SenseKey(0x0d);

/// Configuration of a [`TapeLu`].
#[derive(Debug, Clone)]
pub struct TapeLuConfig {
    /// Operator-visible name; the identity seed if `identity` is empty.
    pub name: String,
    /// T10 vendor identification (≤ 8 ASCII characters).
    pub vendor: String,
    /// Product identification (≤ 16).
    pub product: String,
    /// Product revision level (≤ 4).
    pub revision: String,
    /// Unit serial number (VPD 80h); empty: derived from the identity.
    pub serial: String,
    /// Stable identity the NAA designator is derived from.
    pub identity: String,
    /// The cartridge is write-protected.
    pub read_only: bool,
    /// Early-warning zone in bytes, used when a blank image is formatted.
    pub early_warning: u64,
    /// Largest logical block (READ BLOCK LIMITS), at most 8 MiB.
    pub max_block: u32,
    /// Most logical objects an image may hold (its index takes 8 bytes
    /// each in memory).
    pub max_objects: usize,
    /// Task set depth (TASK SET FULL beyond).
    pub task_set_depth: usize,
}

impl Default for TapeLuConfig {
    fn default() -> Self {
        TapeLuConfig {
            name: "tape0".into(),
            vendor: "UNIFAB".into(),
            product: "VIRTUAL TAPE".into(),
            revision: "0001".into(),
            serial: String::new(),
            identity: String::new(),
            read_only: false,
            early_warning: 1 << 20,
            max_block: 1 << 20,
            max_objects: 4 << 20,
            task_set_depth: 64,
        }
    }
}

/// Sense as a tape gives it: the fixed format with FILEMARK, EOM and ILI.
#[derive(Debug, Clone, Copy)]
struct TapeSense {
    key: SenseKey,
    asc: Asc,
    info: Option<i64>,
    filemark: bool,
    eom: bool,
    ili: bool,
}

impl TapeSense {
    fn new(key: SenseKey, asc: Asc) -> TapeSense {
        TapeSense {
            key,
            asc,
            info: None,
            filemark: false,
            eom: false,
            ili: false,
        }
    }

    /// INFORMATION (a residue, possibly negative: two's complement).
    fn info(mut self, v: i64) -> TapeSense {
        self.info = Some(v);
        self
    }

    fn eom(mut self, eom: bool) -> TapeSense {
        self.eom = eom;
        self
    }

    fn bytes(&self, deferred: bool) -> [u8; Sense::FIXED_LEN] {
        let mut s = Sense::new(self.key, self.asc);
        if let Some(i) = self.info {
            let v = i.clamp(i64::from(i32::MIN), i64::from(u32::MAX));
            s = s.with_information(if v < 0 { v as i32 as u32 } else { v as u32 });
        }
        s.ili = self.ili;
        let mut b = s.to_fixed();
        if self.filemark {
            b[2] |= 0x80;
        }
        if self.eom {
            b[2] |= 0x40;
        }
        if deferred {
            b[0] = (b[0] & 0x80) | 0x71;
        }
        b
    }

    fn result(self) -> TaskResult {
        self.with_data(Vec::new())
    }

    fn with_data(self, data: Vec<Bytes>) -> TaskResult {
        TaskResult {
            status: Status::CHECK_CONDITION,
            sense: Some(Bytes::copy_from_slice(&self.bytes(false))),
            data_in: data,
            ..TaskResult::default()
        }
    }
}

fn check(key: SenseKey, asc: Asc) -> TaskResult {
    TapeSense::new(key, asc).result()
}

fn be16(c: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([c[at], c[at + 1]])
}

fn be24(c: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, c[at], c[at + 1], c[at + 2]])
}

fn be32(c: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]])
}

fn be64(c: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&c[at..at + 8]);
    u64::from_be_bytes(a)
}

/// A signed 24-bit count (SPACE(6)).
fn signed24(c: &[u8], at: usize) -> i64 {
    let v = be24(c, at);
    if v & 0x80_0000 != 0 {
        i64::from(v) - (1 << 24)
    } else {
        i64::from(v)
    }
}

/// The CDB length of an operation code's group (SPC-4 §4.2.5.1).
fn cdb_len(op: u8) -> usize {
    match op >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 0,
    }
}

#[derive(Debug)]
struct TapeState {
    medium: Medium,
    /// The logical position: the object the next read would return.
    pos: usize,
    loaded: bool,
    /// Mode block length; 0: variable block mode.
    block_len: u32,
    /// BUFFERED MODE of the mode parameter header (0 or 1).
    buffered: u8,
    ua: HashMap<PortKey, VecDeque<Asc>>,
    /// Deferred errors, each for the nexus whose command caused it.
    deferred: Vec<(PortKey, TapeSense)>,
    reserve6: Option<PortKey>,
    pr: PrState,
    prevent: HashSet<PortKey>,
    /// A flush failed: no later sync point may succeed.
    flush_failed: bool,
}

#[derive(Debug)]
struct Inner {
    cfg: TapeLuConfig,
    naa: u64,
    serial: String,
    tasks: TaskSet,
    stats: crate::stats::LuStats,
    state: Mutex<TapeState>,
}

/// An emulated tape drive (SSC-3) with its cartridge.
#[derive(Debug, Clone)]
pub struct TapeLu {
    inner: Arc<Inner>,
}

impl TapeLu {
    /// Opens the tape image in `backend` (formatting a blank one).
    pub fn new(
        config: TapeLuConfig,
        backend: Arc<dyn BlockBackend>,
    ) -> Result<TapeLu, MediumError> {
        let medium = Medium::open(backend, config.early_warning, config.max_objects)?;
        let seed = if config.identity.is_empty() {
            config.name.clone()
        } else {
            config.identity.clone()
        };
        let hash = fnv1a(&seed);
        let serial = if config.serial.is_empty() {
            format!("{hash:016x}")
        } else {
            config.serial.clone()
        };
        let config = TapeLuConfig {
            max_block: config.max_block.clamp(1, 8 << 20),
            ..config
        };
        Ok(TapeLu {
            inner: Arc::new(Inner {
                naa: (0x3u64 << 60) | (hash & 0x0fff_ffff_ffff_ffff),
                serial,
                tasks: TaskSet::new(config.task_set_depth),
                stats: crate::stats::LuStats::new(),
                state: Mutex::new(TapeState {
                    medium,
                    pos: 0,
                    loaded: true,
                    block_len: 0,
                    buffered: 1,
                    ua: HashMap::new(),
                    deferred: Vec::new(),
                    reserve6: None,
                    pr: PrState::new(),
                    prevent: HashSet::new(),
                    flush_failed: false,
                }),
                cfg: config,
            }),
        })
    }

    /// The NAA designator (VPD 83h).
    pub fn naa(&self) -> u64 {
        self.inner.naa
    }

    /// The logical position and the number of logical objects on the
    /// medium (for `unifab show luns` and tests).
    pub fn position(&self) -> (usize, usize) {
        let st = self.inner.lock();
        (st.pos, st.medium.len())
    }
}

/// Who may run a command under a reservation.
fn access_of(op: u8) -> Access {
    match op {
        0x12 | 0x03 | 0xa0 | 0x5e | 0x5f | 0x00 => Access::Always,
        0x08 | 0x34 | 0x05 | 0x1a | 0x5a | 0x44 => Access::Read,
        _ => Access::Write,
    }
}

/// Commands that need no loaded medium.
fn needs_medium(op: u8) -> bool {
    !matches!(
        op,
        0x12 | 0x03
            | 0xa0
            | 0x5e
            | 0x5f
            | 0x16
            | 0x17
            | 0x56
            | 0x57
            | 0x15
            | 0x55
            | 0x1a
            | 0x5a
            | 0x1b
            | 0x1e
            | 0x05
            | 0x44
    )
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, TapeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ua_where(st: &mut TapeState, pred: impl Fn(&PortKey) -> bool, code: Asc, reset: bool) {
        for (k, q) in st.ua.iter_mut() {
            if pred(k) {
                crate::sense::establish_ua(q, code, reset, UA_QUEUE);
            }
        }
    }

    /// Runs one task, start to end, under the state lock.
    fn run(self: &Arc<Self>, task: &Task) -> TaskResult {
        let c = task.cdb.as_bytes();
        let Some(&op) = c.first() else {
            return check(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_COMMAND_OPERATION_CODE,
            );
        };
        let n = cdb_len(op);
        if n == 0 || c.len() < n {
            return check(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_COMMAND_OPERATION_CODE,
            );
        }
        let c = &c[..n];
        let mut st = self.lock();
        let key = crate::emulated::ua::enter_nexus(&mut st.ua, &task.nexus, MAX_NEXUSES);
        // Unit attentions, then deferred errors, then reservations.
        if op == 0x03 {
            return self.request_sense(&mut st, &key, c);
        }
        if !matches!(op, 0x12 | 0xa0)
            && let Some(code) = st.ua.get_mut(&key).and_then(VecDeque::pop_front)
        {
            return check(SenseKey::UNIT_ATTENTION, code);
        }
        if op != 0x12
            && let Some(i) = st.deferred.iter().position(|(k, _)| *k == key)
        {
            let (_, s) = st.deferred.remove(i);
            return TaskResult {
                status: Status::CHECK_CONDITION,
                sense: Some(Bytes::copy_from_slice(&s.bytes(true))),
                ..TaskResult::default()
            };
        }
        let access = access_of(op);
        if let Some(holder) = &st.reserve6
            && *holder != key
            && !matches!(op, 0x12 | 0xa0 | 0x17 | 0x57 | 0x03)
        {
            return TaskResult::status(Status::RESERVATION_CONFLICT);
        }
        if st.pr.conflicts(&key, access) {
            return TaskResult::status(Status::RESERVATION_CONFLICT);
        }
        if c[n - 1] & 0x07 != 0 {
            // NACA, FLAG and LINK are not supported.
            return bad_cdb(n as u16 - 1, None);
        }
        if !st.loaded && needs_medium(op) {
            return check(SenseKey::NOT_READY, asc::MEDIUM_NOT_PRESENT);
        }
        if self.cfg.read_only && matches!(op, 0x0a | 0x10 | 0x19) {
            return check(SenseKey::DATA_PROTECT, asc::WRITE_PROTECTED);
        }
        match op {
            0x00 => TaskResult::good(),
            0x01 => self.rewind(&mut st, &key, c),
            0x05 => self.read_block_limits(c),
            0x08 => self.read6(&mut st, c),
            0x0a => self.write6(&mut st, task, c),
            0x10 => self.write_filemarks(&mut st, &key, c),
            0x11 => {
                if c[1] & 0xf0 != 0 {
                    return bad_cdb(1, None);
                }
                self.space(&mut st, c[1] & 0x0f, signed24(c, 2))
            }
            0x91 => {
                if c[1] & 0xf0 != 0 || c[2] != 0 || c[3] != 0 {
                    return bad_cdb(1, None);
                }
                if be16(c, 12) != 0 {
                    // The parameter-data form is not supported.
                    return bad_cdb(12, None);
                }
                self.space(&mut st, c[1] & 0x0f, be64(c, 4) as i64)
            }
            0x12 => self.inquiry(task, c),
            0x15 | 0x55 => self.mode_select(&mut st, &key, task, c),
            0x1a | 0x5a => self.mode_sense(&st, c),
            0x16 | 0x56 => {
                if c[1] & 0x1f != 0 || (op == 0x56 && c[1] != 0) {
                    return bad_cdb(1, None);
                }
                if st.pr.is_active() {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
                match &st.reserve6 {
                    Some(h) if *h != key => TaskResult::status(Status::RESERVATION_CONFLICT),
                    _ => {
                        st.reserve6 = Some(key);
                        TaskResult::good()
                    }
                }
            }
            0x17 | 0x57 => {
                if st.reserve6.as_ref() == Some(&key) {
                    st.reserve6 = None;
                }
                TaskResult::good()
            }
            0x19 => self.erase(&mut st, &key, c),
            0x1b => self.load_unload(&mut st, &key, c),
            0x1e => match c[4] & 0x03 {
                0 => {
                    st.prevent.remove(&key);
                    TaskResult::good()
                }
                1 => {
                    st.prevent.insert(key);
                    TaskResult::good()
                }
                _ => bad_cdb(4, Some(1)),
            },
            0x2b => {
                if c[1] & 0xf8 != 0 {
                    return bad_cdb(1, None);
                }
                if c[1] & 0x02 != 0 && c[8] != 0 {
                    return bad_cdb(8, None);
                }
                self.locate(&mut st, u64::from(be32(c, 3)), 0)
            }
            0x92 => {
                let dest = (c[1] >> 3) & 0x07;
                if c[1] & 0xc4 != 0 || c[2] & 0xfe != 0 {
                    return bad_cdb(1, None);
                }
                if c[2] & 0x01 != 0 {
                    // Implicit block address mode is not supported.
                    return bad_cdb(2, Some(0));
                }
                if c[1] & 0x02 != 0 && c[3] != 0 {
                    return bad_cdb(3, None);
                }
                if !matches!(dest, 0 | 1 | 3) {
                    return bad_cdb(1, Some(3));
                }
                self.locate(&mut st, be64(c, 4), dest)
            }
            0x34 => self.read_position(&st, c),
            0x44 => self.report_density(&st, c),
            0x5e | 0x5f => self.persistent_reserve(&mut st, task),
            0xa0 => {
                let alloc = be32(c, 6) as usize;
                if alloc < 16 {
                    return bad_cdb(6, None);
                }
                if !matches!(c[2], 0 | 2) {
                    return bad_cdb(2, None);
                }
                let mut v = Vec::with_capacity(16);
                v.extend_from_slice(&8u32.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&task.lun.to_bytes());
                data_in(v, alloc)
            }
            _ => check(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_COMMAND_OPERATION_CODE,
            ),
        }
    }

    fn request_sense(&self, st: &mut TapeState, key: &PortKey, c: &[u8]) -> TaskResult {
        if c[1] & 0x01 != 0 {
            // Descriptor format is not supported: fixed format only.
            return bad_cdb(1, Some(0));
        }
        let alloc = usize::from(c[4]);
        let bytes = if let Some(code) = st.ua.get_mut(key).and_then(VecDeque::pop_front) {
            TapeSense::new(SenseKey::UNIT_ATTENTION, code).bytes(false)
        } else if let Some(i) = st.deferred.iter().position(|(k, _)| k == key) {
            st.deferred.remove(i).1.bytes(true)
        } else {
            let eom = st.loaded && st.pos >= st.medium.len() && st.medium.past_early_warning();
            TapeSense::new(SenseKey::NO_SENSE, asc::NO_ADDITIONAL_SENSE)
                .eom(eom)
                .bytes(false)
        };
        data_in(bytes.to_vec(), alloc)
    }

    /// A sync point: everything written is on stable storage, or the
    /// sense that says it is not.
    fn sync(&self, st: &mut TapeState) -> Result<(), TapeSense> {
        let failed = TapeSense::new(SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR);
        if st.flush_failed {
            return Err(failed);
        }
        match st.medium.sync() {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::error!(lu = %self.cfg.name, error = %e, "tape flush failed: every later sync point fails until the LU is opened again");
                st.flush_failed = true;
                Err(failed)
            }
        }
    }

    /// A sync point of a command with IMMED: GOOD now, the flush after it
    /// (on the blocking pool, once this command has let the state go), a
    /// failure a deferred error for `key`. Without a runtime it flushes
    /// here, before the status, with the same outcome for a failure.
    fn sync_later(self: &Arc<Self>, st: &mut TapeState, key: &PortKey) {
        #[cfg(feature = "tokio")]
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let me = self.clone();
            let key = key.clone();
            drop(h.spawn_blocking(move || {
                let mut st = me.lock();
                if let Err(s) = me.sync(&mut st) {
                    st.deferred.push((key, s));
                }
            }));
            return;
        }
        if let Err(s) = self.sync(st) {
            st.deferred.push((key.clone(), s));
        }
    }

    /// A command's sync point: with IMMED the flush follows GOOD
    /// ([`Inner::sync_later`]); without, GOOD only once it is done.
    fn sync_point(
        self: &Arc<Self>,
        st: &mut TapeState,
        key: &PortKey,
        immed: bool,
    ) -> Result<(), TapeSense> {
        if immed {
            self.sync_later(st, key);
            Ok(())
        } else {
            self.sync(st)
        }
    }

    fn rewind(self: &Arc<Self>, st: &mut TapeState, key: &PortKey, c: &[u8]) -> TaskResult {
        if c[1] & 0xfe != 0 || c[2] != 0 || c[3] != 0 || c[4] != 0 {
            return bad_cdb(1, None);
        }
        st.pos = 0;
        match self.sync_point(st, key, c[1] & 0x01 != 0) {
            Ok(()) => TaskResult::good(),
            Err(s) => s.result(),
        }
    }

    fn read_block_limits(&self, c: &[u8]) -> TaskResult {
        if c[1] & 0xfe != 0 {
            return bad_cdb(1, None);
        }
        if c[1] & 0x01 != 0 {
            // MLOI: the maximum logical object identifier.
            let mut v = vec![0u8; 20];
            v[12..20].copy_from_slice(&(self.cfg.max_objects as u64 - 1).to_be_bytes());
            return TaskResult::with_data(Bytes::from(v));
        }
        let mut v = vec![0u8; 6];
        v[1..4].copy_from_slice(&self.cfg.max_block.to_be_bytes()[1..]);
        v[4..6].copy_from_slice(&1u16.to_be_bytes());
        TaskResult::with_data(Bytes::from(v))
    }

    fn eod(st: &TapeState, residue: i64) -> TaskResult {
        TapeSense::new(SenseKey::BLANK_CHECK, END_OF_DATA_DETECTED)
            .info(residue)
            .eom(st.medium.past_early_warning())
            .result()
    }

    fn read6(&self, st: &mut TapeState, c: &[u8]) -> TaskResult {
        let (sili, fixed) = (c[1] & 0x02 != 0, c[1] & 0x01 != 0);
        if c[1] & 0xfc != 0 {
            return bad_cdb(1, None);
        }
        if sili && fixed {
            return bad_cdb(1, Some(1));
        }
        let len = be24(c, 2);
        if len == 0 {
            return TaskResult::good();
        }
        let read = |st: &TapeState, i: usize| {
            st.medium.read(i).map_err(|e| {
                tracing::warn!(error = %e, "tape read failed");
                check(SenseKey::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR)
            })
        };
        if !fixed {
            return match st.medium.object(st.pos) {
                None => Self::eod(st, i64::from(len)),
                Some(Object::Filemark) => {
                    st.pos += 1;
                    let mut s =
                        TapeSense::new(SenseKey::NO_SENSE, FILEMARK_DETECTED).info(i64::from(len));
                    s.filemark = true;
                    s.result()
                }
                Some(Object::Block(b)) => {
                    let mut data = match read(st, st.pos) {
                        Ok(d) => d,
                        Err(r) => return r,
                    };
                    st.pos += 1;
                    if b == len {
                        return TaskResult::with_data(data);
                    }
                    data.truncate(len as usize);
                    let quiet = sili && (b < len || st.block_len == 0);
                    if quiet {
                        return TaskResult::with_data(data);
                    }
                    let mut s = TapeSense::new(SenseKey::NO_SENSE, asc::NO_ADDITIONAL_SENSE)
                        .info(i64::from(len) - i64::from(b));
                    s.ili = true;
                    s.with_data(vec![data])
                }
            };
        }
        let bl = st.block_len;
        if bl == 0 {
            return bad_cdb(1, Some(0));
        }
        if u64::from(len) * u64::from(bl) > u64::from(self.cfg.max_block).max(8 << 20) {
            return bad_cdb(2, None);
        }
        let mut out = Vec::with_capacity(len as usize);
        for k in 0..len {
            let residue = i64::from(len - k);
            match st.medium.object(st.pos) {
                None => {
                    let mut r = Self::eod(st, residue);
                    r.data_in = out;
                    return r;
                }
                Some(Object::Filemark) => {
                    st.pos += 1;
                    let mut s = TapeSense::new(SenseKey::NO_SENSE, FILEMARK_DETECTED).info(residue);
                    s.filemark = true;
                    return s.with_data(out);
                }
                Some(Object::Block(b)) if b != bl => {
                    st.pos += 1;
                    let mut s =
                        TapeSense::new(SenseKey::NO_SENSE, asc::NO_ADDITIONAL_SENSE).info(residue);
                    s.ili = true;
                    return s.with_data(out);
                }
                Some(Object::Block(_)) => match read(st, st.pos) {
                    Ok(d) => {
                        out.push(d);
                        st.pos += 1;
                    }
                    Err(mut r) => {
                        r.data_in = out;
                        return r;
                    }
                },
            }
        }
        TaskResult {
            data_in: out,
            ..TaskResult::default()
        }
    }

    /// The sense after a write that ended in the early-warning zone.
    fn early_warning(st: &TapeState) -> Option<TaskResult> {
        st.medium.past_early_warning().then(|| {
            TapeSense::new(SenseKey::NO_SENSE, END_OF_PARTITION_MEDIUM_DETECTED)
                .eom(true)
                .result()
        })
    }

    fn overflow(residue: i64) -> TaskResult {
        TapeSense::new(VOLUME_OVERFLOW, END_OF_PARTITION_MEDIUM_DETECTED)
            .info(residue)
            .eom(true)
            .result()
    }

    fn write_failed(&self, e: &BackendError) -> TaskResult {
        tracing::warn!(lu = %self.cfg.name, error = %e, "tape write failed");
        if e.is_out_of_space() {
            return Self::overflow(0);
        }
        check(SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR)
    }

    fn write6(&self, st: &mut TapeState, task: &Task, c: &[u8]) -> TaskResult {
        if c[1] & 0xfe != 0 {
            return bad_cdb(1, None);
        }
        let fixed = c[1] & 0x01 != 0;
        let len = be24(c, 2);
        if len == 0 {
            return TaskResult::good();
        }
        let (count, bl) = if fixed {
            if st.block_len == 0 {
                return bad_cdb(1, Some(0));
            }
            (len, st.block_len)
        } else {
            if len > self.cfg.max_block {
                return bad_cdb(2, None);
            }
            (1, len)
        };
        let total = u64::from(count) * u64::from(bl);
        if total > u64::from(self.cfg.max_block).max(8 << 20) {
            return bad_cdb(2, None);
        }
        let got = task.data_out_total() as u64;
        if got < total {
            // The initiator sent less than the command says: nothing is
            // written (a tape block cannot be written in part).
            return check(SenseKey::ABORTED_COMMAND, asc::DATA_PHASE_ERROR);
        }
        let fua = st.buffered == 0;
        let mut slices = task.data_out.clone().into_iter();
        let mut carry: Option<Bytes> = None;
        for k in 0..count {
            let block = take(&mut slices, &mut carry, bl as usize);
            if !st.medium.fits(st.pos, u64::from(bl)) {
                let residue = if fixed { count - k } else { len };
                return Self::overflow(i64::from(residue));
            }
            match st.medium.write_block(st.pos, &block, fua) {
                Ok(p) => st.pos = p,
                Err(medium::AppendError::Overflow) => {
                    let residue = if fixed { count - k } else { len };
                    return Self::overflow(i64::from(residue));
                }
                Err(medium::AppendError::Backend(e)) => return self.write_failed(&e),
            }
        }
        Self::early_warning(st).unwrap_or_default()
    }

    fn write_filemarks(
        self: &Arc<Self>,
        st: &mut TapeState,
        key: &PortKey,
        c: &[u8],
    ) -> TaskResult {
        if c[1] & 0xfc != 0 {
            return bad_cdb(1, None);
        }
        if c[1] & 0x02 != 0 {
            // WSMK: setmarks are not supported.
            return bad_cdb(1, Some(1));
        }
        let immed = c[1] & 0x01 != 0;
        let count = be24(c, 2);
        for k in 0..count {
            match st.medium.write_filemark(st.pos) {
                Ok(p) => st.pos = p,
                Err(medium::AppendError::Overflow) => {
                    return Self::overflow(i64::from(count - k));
                }
                Err(medium::AppendError::Backend(e)) => return self.write_failed(&e),
            }
        }
        if let Err(s) = self.sync_point(st, key, immed) {
            return s.result();
        }
        if count > 0 {
            return Self::early_warning(st).unwrap_or_default();
        }
        TaskResult::good()
    }

    /// SPACE: `code` 0 blocks, 1 filemarks, 3 end-of-data.
    fn space(&self, st: &mut TapeState, code: u8, count: i64) -> TaskResult {
        let len = st.medium.len();
        match code {
            0 | 1 => {}
            3 => {
                st.pos = len;
                return TaskResult::good();
            }
            _ => return bad_cdb(1, Some(3)),
        }
        if count == 0 {
            return TaskResult::good();
        }
        let want = count.unsigned_abs();
        let mut done = 0u64;
        if count > 0 {
            while done < want {
                match st.medium.object(st.pos) {
                    None => return Self::eod(st, (want - done) as i64),
                    Some(Object::Filemark) => {
                        st.pos += 1;
                        if code == 0 {
                            let mut s = TapeSense::new(SenseKey::NO_SENSE, FILEMARK_DETECTED)
                                .info((want - done) as i64);
                            s.filemark = true;
                            return s.result();
                        }
                        done += 1;
                    }
                    Some(Object::Block(_)) => {
                        st.pos += 1;
                        if code == 0 {
                            done += 1;
                        }
                    }
                }
            }
        } else {
            while done < want {
                if st.pos == 0 {
                    return TapeSense::new(
                        SenseKey::NO_SENSE,
                        BEGINNING_OF_PARTITION_MEDIUM_DETECTED,
                    )
                    .info((want - done) as i64)
                    .eom(true)
                    .result();
                }
                let prev = st.pos - 1;
                match st.medium.object(prev) {
                    Some(Object::Filemark) => {
                        st.pos = prev;
                        if code == 0 {
                            let mut s = TapeSense::new(SenseKey::NO_SENSE, FILEMARK_DETECTED)
                                .info((want - done) as i64);
                            s.filemark = true;
                            return s.result();
                        }
                        done += 1;
                    }
                    _ => {
                        st.pos = prev;
                        if code == 0 {
                            done += 1;
                        }
                    }
                }
            }
        }
        TaskResult::good()
    }

    /// LOCATE to logical object `id` (`dest` 0), the start of file `id`
    /// (1) or end-of-data (3). Written records are already in the
    /// backend, so IMMED changes nothing: the command ends when the
    /// position is set.
    fn locate(&self, st: &mut TapeState, id: u64, dest: u8) -> TaskResult {
        let len = st.medium.len();
        let target = match dest {
            0 => usize::try_from(id).unwrap_or(usize::MAX),
            1 => match st.medium.after_filemark(id) {
                Some(p) => p,
                None => {
                    st.pos = len;
                    return Self::eod(st, 0);
                }
            },
            _ => len,
        };
        if target > len {
            st.pos = len;
            return Self::eod(st, 0);
        }
        st.pos = target;
        TaskResult::good()
    }

    fn read_position(&self, st: &TapeState, c: &[u8]) -> TaskResult {
        let sa = c[1] & 0x1f;
        if c[1] & 0xe0 != 0 {
            return bad_cdb(1, None);
        }
        let pos = st.pos as u64;
        let bop = pos == 0;
        let eop = st.pos >= st.medium.len() && st.medium.past_early_warning();
        let flags = (u8::from(bop) << 7) | (u8::from(eop) << 6);
        match sa {
            0 | 1 => {
                if be16(c, 7) != 0 {
                    return bad_cdb(7, None);
                }
                let mut v = vec![0u8; 20];
                match u32::try_from(pos) {
                    Ok(p) => {
                        v[0] = flags;
                        v[4..8].copy_from_slice(&p.to_be_bytes());
                        v[8..12].copy_from_slice(&p.to_be_bytes());
                    }
                    // The position does not fit: PERR.
                    Err(_) => v[0] = flags | 0x02,
                }
                TaskResult::with_data(Bytes::from(v))
            }
            6 => {
                if be16(c, 7) != 0 {
                    return bad_cdb(7, None);
                }
                let mut v = vec![0u8; 32];
                v[0] = flags;
                v[8..16].copy_from_slice(&pos.to_be_bytes());
                v[16..24].copy_from_slice(&st.medium.files_before(st.pos).to_be_bytes());
                TaskResult::with_data(Bytes::from(v))
            }
            8 => {
                let mut v = vec![0u8; 32];
                v[0] = flags;
                v[2..4].copy_from_slice(&0x1cu16.to_be_bytes());
                v[8..16].copy_from_slice(&pos.to_be_bytes());
                v[16..24].copy_from_slice(&pos.to_be_bytes());
                data_in(v, usize::from(be16(c, 7)))
            }
            _ => bad_cdb(1, Some(4)),
        }
    }

    fn report_density(&self, st: &TapeState, c: &[u8]) -> TaskResult {
        if c[1] & 0xfc != 0 {
            return bad_cdb(1, None);
        }
        if c[1] & 0x02 != 0 {
            // MEDIUM TYPE reports are not supported.
            return bad_cdb(1, Some(1));
        }
        let media = c[1] & 0x01 != 0;
        if media && !st.loaded {
            return check(SenseKey::NOT_READY, asc::MEDIUM_NOT_PRESENT);
        }
        let mut v = vec![0u8; 4];
        let mut d = vec![0u8; 52];
        d[0] = DENSITY_CODE;
        d[1] = DENSITY_CODE;
        d[2] = 0x80 | 0x20; // WRTOK, DEFLT
        d[10..12].copy_from_slice(&1u16.to_be_bytes()); // tracks
        let mb = st.medium.capacity() / 1_000_000;
        d[12..16].copy_from_slice(&(mb.min(u64::from(u32::MAX)) as u32).to_be_bytes());
        let mut t = Vec::new();
        ascii_field(&mut t, "UNIFAB", 8);
        ascii_field(&mut t, "UFTAPE1", 8);
        ascii_field(&mut t, "unifab tape image v1", 20);
        d[16..52].copy_from_slice(&t);
        v.extend_from_slice(&d);
        let n = (v.len() - 2) as u16;
        v[0..2].copy_from_slice(&n.to_be_bytes());
        data_in(v, usize::from(be16(c, 7)))
    }

    fn erase(self: &Arc<Self>, st: &mut TapeState, key: &PortKey, c: &[u8]) -> TaskResult {
        if c[1] & 0xfc != 0 {
            return bad_cdb(1, None);
        }
        if let Err(e) = st.medium.erase(st.pos) {
            return self.write_failed(&e);
        }
        match self.sync_point(st, key, c[1] & 0x02 != 0) {
            Ok(()) => TaskResult::good(),
            Err(s) => s.result(),
        }
    }

    fn load_unload(self: &Arc<Self>, st: &mut TapeState, key: &PortKey, c: &[u8]) -> TaskResult {
        if c[1] & 0xfe != 0 || c[4] & 0xf0 != 0 {
            return bad_cdb(1, None);
        }
        let (hold, eot, load) = (c[4] & 0x08 != 0, c[4] & 0x04 != 0, c[4] & 0x01 != 0);
        if load && eot {
            return bad_cdb(4, Some(2));
        }
        if load {
            if !st.loaded {
                st.loaded = true;
                Self::ua_where(st, |k| k != key, NOT_READY_TO_READY_CHANGE, false);
            }
            st.pos = 0;
            return TaskResult::good();
        }
        if !st.prevent.is_empty() {
            return check(SenseKey::ILLEGAL_REQUEST, asc::MEDIUM_REMOVAL_PREVENTED);
        }
        if let Err(s) = self.sync(st) {
            return s.result();
        }
        st.pos = if eot { st.medium.len() } else { 0 };
        if !hold {
            st.loaded = false;
        }
        TaskResult::good()
    }

    /// The mode pages, current values.
    fn pages(&self, st: &TapeState) -> Vec<(u8, Vec<u8>)> {
        let mut control = vec![0u8; 12];
        control[0] = 0x0a;
        control[1] = 0x0a;
        let mut compression = vec![0u8; 16];
        compression[0] = 0x0f;
        compression[1] = 0x0e;
        let mut config = vec![0u8; 16];
        config[0] = 0x10;
        config[1] = 0x0e;
        config[10] = 0x18; // EEG, SEW
        let mut partition = vec![0u8; 10];
        partition[0] = 0x11;
        partition[1] = 0x08;
        partition[4] = 0x10; // PSUM = 10b: megabytes
        partition[5] = 0x03; // format and partition recognition
        let mb = (st.medium.capacity() / 1_000_000).min(0xffff) as u16;
        partition[8..10].copy_from_slice(&mb.to_be_bytes());
        vec![
            (0x0a, control),
            (0x0f, compression),
            (0x10, config),
            (0x11, partition),
        ]
    }

    fn mode_sense(&self, st: &TapeState, c: &[u8]) -> TaskResult {
        let ten = c[0] == 0x5a;
        let dbd = c[1] & 0x08 != 0;
        let (pc, page, sub) = (c[2] >> 6, c[2] & 0x3f, c[3]);
        let alloc = if ten {
            usize::from(be16(c, 7))
        } else {
            usize::from(c[4])
        };
        if pc == 3 {
            return check(
                SenseKey::ILLEGAL_REQUEST,
                asc::SAVING_PARAMETERS_NOT_SUPPORTED,
            );
        }
        if sub != 0 && !(page == 0x3f && sub == 0xff) {
            return bad_cdb(3, None);
        }
        let all = self.pages(st);
        let chosen: Vec<Vec<u8>> = if page == 0x3f {
            all.into_iter().map(|(_, p)| p).collect()
        } else {
            match all.into_iter().find(|(code, _)| *code == page) {
                Some((_, p)) => vec![p],
                None => return bad_cdb(2, Some(5)),
            }
        };
        let chosen: Vec<Vec<u8>> = if pc == 1 {
            // Nothing in the pages is changeable.
            chosen
                .into_iter()
                .map(|p| {
                    let mut m = vec![0u8; p.len()];
                    m[0] = p[0];
                    m[1] = p[1];
                    m
                })
                .collect()
        } else {
            chosen
        };
        let wp = u8::from(self.cfg.read_only) << 7;
        let dsp = wp | (st.buffered << 4);
        let bd: Vec<u8> = if dbd {
            Vec::new()
        } else {
            let mut b = vec![0u8; 8];
            b[0] = if pc == 1 { 0xff } else { DENSITY_CODE };
            let bl = if pc == 1 { 0xff_ffff } else { st.block_len };
            b[5..8].copy_from_slice(&bl.to_be_bytes()[1..]);
            b
        };
        let mut v = if ten {
            let mut h = vec![0u8; 8];
            h[3] = dsp;
            h[6..8].copy_from_slice(&(bd.len() as u16).to_be_bytes());
            h
        } else {
            vec![0, 0, dsp, bd.len() as u8]
        };
        v.extend_from_slice(&bd);
        for p in chosen {
            v.extend_from_slice(&p);
        }
        if ten {
            let n = (v.len() - 2) as u16;
            v[0..2].copy_from_slice(&n.to_be_bytes());
        } else {
            v[0] = (v.len() - 1).min(255) as u8;
        }
        data_in(v, alloc)
    }

    fn mode_select(&self, st: &mut TapeState, key: &PortKey, task: &Task, c: &[u8]) -> TaskResult {
        let ten = c[0] == 0x55;
        if c[1] & 0x01 != 0 {
            // SP: saving pages is not supported.
            return bad_cdb(1, Some(0));
        }
        if c[1] & 0xee != 0 {
            return bad_cdb(1, None);
        }
        let len = if ten {
            usize::from(be16(c, 7))
        } else {
            usize::from(c[4])
        };
        let p = gather(&task.data_out, len);
        if p.len() < len {
            return check(SenseKey::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        if len == 0 {
            return TaskResult::good();
        }
        let hlen = if ten { 8 } else { 4 };
        if p.len() < hlen {
            return check(SenseKey::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let (dsp_at, bdl) = if ten {
            (3usize, usize::from(be16(&p, 6)))
        } else {
            (2usize, usize::from(p[3]))
        };
        let buffered = (p[dsp_at] >> 4) & 0x07;
        if buffered > 1 {
            return bad_param(dsp_at as u16, Some(4));
        }
        if bdl != 0 && bdl != 8 {
            return bad_param(if ten { 6 } else { 3 } as u16, None);
        }
        if p.len() < hlen + bdl {
            return check(SenseKey::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let mut block_len = st.block_len;
        if bdl == 8 {
            let d = &p[hlen..hlen + 8];
            if d[0] != 0 && d[0] != DENSITY_CODE {
                return bad_param(hlen as u16, None);
            }
            let bl = be24(d, 5);
            if bl > self.cfg.max_block {
                return bad_param(hlen as u16 + 5, None);
            }
            block_len = bl;
        }
        // Pages: each must equal what MODE SENSE reports (nothing in
        // them is changeable).
        let current = self.pages(st);
        let mut at = hlen + bdl;
        while at < p.len() {
            if p.len() < at + 2 {
                return check(SenseKey::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR);
            }
            let code = p[at] & 0x3f;
            let plen = usize::from(p[at + 1]) + 2;
            let Some((_, cur)) = current.iter().find(|(c, _)| *c == code) else {
                return bad_param(at as u16, Some(5));
            };
            if p.len() < at + plen || plen != cur.len() {
                return bad_param(at as u16 + 1, None);
            }
            if let Some(i) = (2..plen).find(|&i| p[at + i] != cur[i]) {
                return bad_param((at + i) as u16, None);
            }
            at += plen;
        }
        let changed = block_len != st.block_len || buffered != st.buffered;
        st.block_len = block_len;
        st.buffered = buffered;
        if changed {
            Self::ua_where(st, |k| k != key, asc::MODE_PARAMETERS_CHANGED, false);
        }
        TaskResult::good()
    }

    fn inquiry(&self, task: &Task, c: &[u8]) -> TaskResult {
        let (evpd, page, alloc) = (c[1] & 0x01 != 0, c[2], usize::from(be16(c, 3)));
        if c[1] & 0xfe != 0 {
            return bad_cdb(1, None);
        }
        if !evpd {
            if page != 0 {
                return bad_cdb(2, None);
            }
            let mut v = vec![0x01, 0x80, 0x06, 0x12, 31, 0, 0, 0x02];
            ascii_field(&mut v, &self.cfg.vendor, 8);
            ascii_field(&mut v, &self.cfg.product, 16);
            ascii_field(&mut v, &self.cfg.revision, 4);
            return data_in(v, alloc);
        }
        let mut v = vec![0x01, page, 0, 0];
        match page {
            0x00 => v.extend_from_slice(&[0x00, 0x80, 0x83]),
            0x80 => v.extend_from_slice(self.serial.as_bytes()),
            0x83 => {
                let t = task.nexus.target();
                let proto = t.id.protocol_identifier() << 4;
                v.extend_from_slice(&[0x01, 0x03, 0, 8]);
                v.extend_from_slice(&self.naa.to_be_bytes());
                v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x04, 0, 4, 0, 0]);
                v.extend_from_slice(&t.relative_port_id.to_be_bytes());
                if let TransportId::Fcp { wwpn } = &t.id {
                    v.extend_from_slice(&[proto | 0x01, 0x80 | 0x10 | 0x03, 0, 8]);
                    v.extend_from_slice(&wwpn.to_be_bytes());
                }
            }
            _ => return bad_cdb(2, None),
        }
        let n = (v.len() - 4) as u16;
        v[2..4].copy_from_slice(&n.to_be_bytes());
        data_in(v, alloc)
    }

    fn persistent_reserve(&self, st: &mut TapeState, task: &Task) -> TaskResult {
        match Command::parse(task.cdb.as_bytes()) {
            Ok(Command::PersistentReserveIn {
                service_action,
                alloc_len,
                ..
            }) => match st.pr.prin(service_action, false) {
                Some(v) => data_in(v, usize::from(alloc_len)),
                None => bad_cdb(1, Some(4)),
            },
            Ok(Command::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                param_len,
                ..
            }) => {
                if let Some(h) = &st.reserve6
                    && *h != PortKey::of(&task.nexus)
                {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
                let params = gather(&task.data_out, param_len.min(64 * 1024) as usize);
                match st.pr.prout(
                    &task.nexus,
                    service_action,
                    scope,
                    pr_type,
                    param_len,
                    &params,
                    false,
                ) {
                    Ok(fx) => {
                        for (target, code) in &fx.unit_attentions {
                            Self::ua_where(st, |k| target.matches(k), *code, false);
                        }
                        // Tasks run one at a time: none of another nexus is
                        // running to abort (PREEMPT AND ABORT).
                        TaskResult::good()
                    }
                    Err(PrRefusal::Conflict) => TaskResult::status(Status::RESERVATION_CONFLICT),
                    Err(PrRefusal::Check(s)) => TaskResult::check_condition(s),
                }
            }
            Ok(_) => check(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_COMMAND_OPERATION_CODE,
            ),
            Err(e) => TaskResult::check_condition(Sense::from(e)),
        }
    }
}

/// Takes the next `n` bytes of data-out as slices (no copy).
fn take(it: &mut impl Iterator<Item = Bytes>, carry: &mut Option<Bytes>, n: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut left = n;
    while left > 0 {
        let mut b = match carry.take().or_else(|| it.next()) {
            Some(b) => b,
            None => break,
        };
        if b.len() > left {
            *carry = Some(b.split_off(left));
        }
        left -= b.len();
        out.push(b);
    }
    out
}

/// The first `n` bytes of data-out, copied.
fn gather(data: &[Bytes], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    for s in data {
        let want = n - out.len();
        if want == 0 {
            break;
        }
        out.extend_from_slice(&s[..want.min(s.len())]);
    }
    out
}

/// A task in the task set; dropping it completes the task.
struct Entered {
    inner: Arc<Inner>,
    ticket: Option<crate::task_set::Ticket>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.inner.tasks.leave(t);
        }
    }
}

impl LogicalUnit for TapeLu {
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let start = std::time::Instant::now();
        let (din, dout) = (task.data_in_len, task.data_out_len);
        // A tape has one position: every task waits for those before it.
        let ticket = match self
            .inner
            .tasks
            .enter(&task.nexus, task.tag, TaskAttr::Ordered)
        {
            Ok(t) => t,
            Err(_) => {
                let r = TaskResult::status(Status::TASK_SET_FULL);
                self.inner.stats.record(&r, din, dout, start.elapsed());
                return Box::pin(std::future::ready(r));
            }
        };
        let entered = Entered {
            inner: self.inner.clone(),
            ticket: Some(ticket),
        };
        Box::pin(async move {
            let entered = entered;
            let inner = entered.inner.clone();
            let result = match entered.ticket.as_ref() {
                None => TaskResult::aborted(),
                Some(t) if inner.tasks.ready(t).await.is_err() => TaskResult::aborted(),
                Some(t) => {
                    let r = run_blocking(&inner, task).await;
                    if inner.tasks.is_aborted(t) {
                        TaskResult::aborted()
                    } else {
                        r
                    }
                }
            };
            inner.stats.record(&result, din, dout, start.elapsed());
            result
        })
    }

    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        let inner = self.inner.clone();
        let nexus = request.nexus.clone();
        let wait = match request.function {
            TmfFunction::AbortTask { tag } => {
                let n = nexus.clone();
                inner.tasks.abort_matching(move |x, t| *x == n && t == tag)
            }
            TmfFunction::AbortTaskSet | TmfFunction::ItNexusReset => {
                let n = nexus.clone();
                inner.tasks.abort_matching(move |x, _| *x == n)
            }
            TmfFunction::ClearTaskSet => {
                let w = inner.tasks.abort_matching(|_, _| true);
                let me = PortKey::of(&nexus);
                let mut st = inner.lock();
                Inner::ua_where(
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
                let w = inner.tasks.abort_matching(|_, _| true);
                let code = if request.function == TmfFunction::TargetReset {
                    asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED
                } else {
                    asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED
                };
                let mut st = inner.lock();
                st.reserve6 = None;
                st.prevent.clear();
                // A reset rewinds: the position after it is the beginning.
                st.pos = 0;
                Inner::ua_where(&mut st, |_| true, code, true);
                w
            }
            TmfFunction::QueryTask { tag } => {
                let r = if inner.tasks.contains(&nexus, tag) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryTaskSet => {
                let r = if inner.tasks.has_tasks_of(&nexus) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                return Box::pin(std::future::ready(r));
            }
            TmfFunction::QueryAsyncEvent => {
                let st = inner.lock();
                let me = PortKey::of(&nexus);
                let pending = st.ua.get(&me).is_some_and(|q| !q.is_empty())
                    || st.deferred.iter().any(|(k, _)| *k == me);
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
        let n = nexus.clone();
        drop(self.inner.tasks.abort_matching(move |x, _| *x == n));
        let key = PortKey::of(nexus);
        let mut st = self.inner.lock();
        if st.reserve6.as_ref() == Some(&key) {
            st.reserve6 = None;
        }
        st.prevent.remove(&key);
        if let Some(q) = st.ua.get_mut(&key) {
            crate::sense::establish_ua(q, asc::I_T_NEXUS_LOSS_OCCURRED, true, UA_QUEUE);
        }
    }

    fn describe(&self) -> LuDescription {
        let st = self.inner.lock();
        LuDescription {
            name: self.inner.cfg.name.clone(),
            backend: format!("tape:{}", st.medium.backend().describe()),
            block_size: st.block_len,
            blocks: st.medium.len() as u64,
            write_protected: self.inner.cfg.read_only,
            backend_io: None,
            write_path: None,
            fenced: false,
        }
    }

    fn stats(&self) -> Option<&crate::stats::LuStats> {
        Some(&self.inner.stats)
    }
}

/// Runs the task on tokio's blocking pool where there is a runtime (the
/// medium is a file), else here.
async fn run_blocking(inner: &Arc<Inner>, task: Task) -> TaskResult {
    #[cfg(feature = "tokio")]
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        let me = inner.clone();
        return h
            .spawn_blocking(move || me.run(&task))
            .await
            .unwrap_or_else(|_| check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE));
    }
    inner.run(&task)
}

#[cfg(test)]
mod tests;
