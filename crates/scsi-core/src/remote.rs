//! A remote logical unit: every command goes out through an
//! [`Initiator`] and the remote's answer comes back unchanged. This is how
//! unifab bridges transports (DESIGN.md, "The SCSI plane").
//!
//! What [`RemoteLu`] does, and does not do:
//!
//! - **CDBs unchanged.** The CDB, task attribute, priority, data-out and the
//!   expected lengths go to the remote as received; status, sense, data-in
//!   and the residual come back as the remote produced them. The only
//!   exceptions are identity (below) and a read-only view. The LUN is the
//!   remote's.
//! - **Read-only view.** With [`RemoteLuConfig::read_only`] only commands
//!   that read or report go out; the rest (writes, UNMAP, MODE SELECT,
//!   reservations, vendor-specific opcodes, …) end at once with DATA
//!   PROTECT, WRITE PROTECTED, and MODE SENSE answers carry the WP bit. The
//!   allow-list and the reasons are in the `protect` module. CLEAR TASK
//!   SET, LOGICAL UNIT RESET and TARGET RESET reset the view, not the
//!   remote: the view's own tasks are aborted there (as ABORT TASK SET
//!   does), and the view keeps and reports the unit attentions the
//!   function establishes for its hosts.
//! - **Ordering.** [`LogicalUnit::execute`] submits synchronously, so the
//!   remote task manager receives commands in the order the front end
//!   handed them over (the ordering contract of [`LogicalUnit`]); ORDERED
//!   and HEAD OF QUEUE are the remote's to enforce.
//! - **One remote nexus per local one.** With a per-nexus
//!   [`InitiatorFactory`] each front-end initiator port gets its own remote
//!   I_T nexus, so reservations, registrations, unit attentions and task
//!   sets stay per initiator, as if the host were attached directly.
//!   Reinstated front-end sessions (same ports) keep their remote nexus; the
//!   last nexus loss of a port closes it, which the remote sees as I_T nexus
//!   loss. On a shared remote nexus the remote reports a unit attention
//!   once, on whichever host's command comes next; the gateway then holds
//!   it for every other host that has used the LU, and does the same for a
//!   CLEAR TASK SET or reset one host makes, which the remote reports to
//!   none of them.
//! - **Task management propagates.** ABORT TASK goes out by the remote tag;
//!   ABORT TASK SET and I_T NEXUS RESET go out as ABORT TASK SET on a
//!   per-nexus initiator (as one ABORT TASK per task on a shared one);
//!   CLEAR TASK SET, LOGICAL UNIT RESET, TARGET RESET (as LOGICAL UNIT
//!   RESET: the remote's other LUs are not ours to reset) and CLEAR ACA go
//!   out as they are, and the tasks other nexuses had on the LU are aborted
//!   at the remote too. QUERY TASK and QUERY TASK SET are answered from the
//!   tasks in flight; QUERY ASYNCHRONOUS EVENT goes to the remote. Every
//!   response comes after the tasks it affects have ended.
//! - **Failures.** A transport failure ends the task with the sense of
//!   [`InitiatorError::task_result`]: ABORTED COMMAND, which hosts retry.
//!   Never GOOD, never data the remote did not send.
//!
//! # Identity
//!
//! A host tells devices apart by the designators of VPD page 0x83 and the
//! serial number of VPD page 0x80. With [`Identity::Passthrough`] both come
//! from the remote unchanged: the right choice for an array, whose LUs carry
//! world-unique NAA names, and it lets a host that also reaches the array
//! directly see one device over two paths. With [`Identity::Derived`] (the
//! gateway's default) unifab replaces the logical-unit designators of page
//! 0x83 with its own NAA (locally assigned, 3h) and T10 vendor ID, and the
//! serial number of page 0x80, all derived from a seed (by default the
//! remote target name and LUN): stable across restarts, different for every
//! remote LU, even when two remotes report the same identity (two tgtd
//! instances with default settings do). Target-port designators stay the
//! remote's, matching REPORT TARGET PORT GROUPS, which passes through. To
//! build those pages, unifab asks the remote with an allocation length of
//! 4096 and answers the host within its own allocation length. Standard
//! INQUIRY data (vendor, product) passes through in both modes.
//!
//! EXTENDED COPY (LID1) names its copy targets by these designators, so
//! with a derived identity the identification CSCD descriptors that carry
//! the derived NAA are rewritten to the remote's own NAA (learnt from the
//! remote's page 0x83, which a host reads before it can name the LU)
//! before the command goes on; the remote's copy manager then finds
//! itself.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::initiator::{Initiator, InitiatorError, InitiatorFactory, Request};
use crate::lu::{BoxFuture, LogicalUnit, LuDescription, TmfFunction, TmfRequest, TmfResponse};
use crate::sense::{Asc, Sense, SenseKey, asc};
use crate::task::{ItNexus, Lun, Status, Task, TaskResult, TransportId};
use crate::task_set::{AbortWait, TaskSet};

/// How a remote LU presents its identity (VPD pages 0x80 and 0x83).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The remote's pages, unchanged.
    Passthrough,
    /// Logical-unit designators and serial number derived from `seed`.
    Derived {
        /// Any stable string; the same seed gives the same identity.
        seed: String,
    },
}

/// Settings of a [`RemoteLu`].
#[derive(Debug, Clone)]
pub struct RemoteLuConfig {
    /// Operator-visible name.
    pub name: String,
    /// The remote as an operator reads it, without secrets
    /// (`iscsi://host:port/iqn/lun`), for `unifab show luns`.
    pub backend: String,
    /// The LUN at the remote target.
    pub remote_lun: Lun,
    /// VPD identity handling.
    pub identity: Identity,
    /// Most tasks in flight at once (TASK SET FULL beyond).
    pub task_set_depth: usize,
    /// A read-only view: only commands that read or report go to the
    /// remote; the rest end with DATA PROTECT, WRITE PROTECTED, and MODE
    /// SENSE answers carry WP (module documentation, "Read-only view").
    pub read_only: bool,
}

/// A logical unit whose device server is elsewhere. See the
/// [module documentation](self).
#[derive(Debug, Clone)]
pub struct RemoteLu {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Operators' counters (`unifab_lu_*` at `/metrics`).
    stats: crate::stats::LuStats,
    cfg: RemoteLuConfig,
    factory: Arc<dyn InitiatorFactory>,
    tasks: TaskSet,
    state: Mutex<State>,
    block_size: AtomicU32,
    blocks: AtomicU64,
    naa: u64,
    serial: String,
    /// The remote's own logical-unit NAA (from its VPD page 0x83; 0 until
    /// seen).
    remote_naa: AtomicU64,
    failures: FailureLog,
    /// Unit attentions queued in `State::by_port` (the gateway's own, see
    /// [`PortEntry::ua`]): commands skip the lock while it is 0.
    local_ua: AtomicUsize,
}

/// Forwarded commands that failed in transport, for the operator's log:
/// the first of a burst is logged at once, the rest of the same second
/// are counted and reported with the next one logged (an outage fails
/// every command in flight; the log should say so, not repeat it
/// thousands of times).
#[derive(Debug, Default)]
struct FailureLog {
    last: Mutex<Option<std::time::Instant>>,
    suppressed: AtomicU64,
}

impl FailureLog {
    fn record(&self, cfg: &RemoteLuConfig, opcode: u8, e: &InitiatorError) {
        if matches!(e, InitiatorError::Aborted) {
            return;
        }
        let now = std::time::Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1)) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        drop(last);
        let more = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            lu = %cfg.name,
            remote = %cfg.backend,
            opcode = format_args!("{opcode:#04x}"),
            error = %e,
            earlier_unlogged = more,
            "forwarded command failed"
        );
    }
}

/// A front-end initiator port and target port pair: one remote nexus.
type PortKey = (TransportId, TransportId);

fn port_key(nexus: &ItNexus) -> PortKey {
    (nexus.initiator().clone(), nexus.target().id.clone())
}

/// The unit attention a CLEAR TASK SET, LOGICAL UNIT RESET or TARGET RESET
/// establishes for the nexuses it affects (SAM-5, "Task management
/// functions").
fn ua_of(function: TmfFunction) -> Asc {
    match function {
        TmfFunction::ClearTaskSet => asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR,
        TmfFunction::TargetReset => asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
        _ => asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    }
}

#[derive(Debug)]
struct PortEntry {
    initiator: Arc<dyn Initiator>,
    users: usize,
    /// Unit attentions the gateway holds for the port, oldest first, at
    /// most [`LOCAL_UA_QUEUE`]: a read-only view's own (its task
    /// management stays at the gateway), and on a shared remote nexus
    /// those the remote reported to another host, or a reset another host
    /// made (the remote sees one initiator, so it tells only the host
    /// whose command comes next).
    ua: VecDeque<Asc>,
}

/// Most unit attentions the gateway queues for one port.
const LOCAL_UA_QUEUE: usize = 4;

use crate::idmap::IdMap;

#[derive(Debug, Default)]
struct State {
    /// Front-end nexus id → its port key and initiator.
    by_nexus: IdMap<u64, (PortKey, Arc<dyn Initiator>)>,
    by_port: HashMap<PortKey, PortEntry>,
    /// (nexus id, tag) → the initiator and remote tag carrying the task.
    tags: IdMap<(u64, u64), (Arc<dyn Initiator>, u64)>,
    control: Option<Arc<dyn Initiator>>,
}

const IDENTITY_ALLOC: u32 = 4096;

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl RemoteLu {
    /// A remote LU whose tasks go through initiators from `factory`.
    pub fn new(cfg: RemoteLuConfig, factory: Arc<dyn InitiatorFactory>) -> RemoteLu {
        let seed = match &cfg.identity {
            Identity::Derived { seed } => seed.clone(),
            Identity::Passthrough => cfg.backend.clone(),
        };
        let hash = fnv1a(&seed);
        RemoteLu {
            inner: Arc::new(Inner {
                stats: crate::stats::LuStats::new(),
                tasks: TaskSet::new(cfg.task_set_depth),
                cfg,
                factory,
                state: Mutex::new(State::default()),
                block_size: AtomicU32::new(0),
                blocks: AtomicU64::new(0),
                naa: (0x3u64 << 60) | (hash & 0x0fff_ffff_ffff_ffff),
                serial: format!("{hash:016x}"),
                remote_naa: AtomicU64::new(0),
                failures: FailureLog::default(),
                local_ua: AtomicUsize::new(0),
            }),
        }
    }

    /// The NAA name a derived identity reports (unused in passthrough).
    pub fn naa(&self) -> u64 {
        self.inner.naa
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteLuConfig {
        &self.inner.cfg
    }

    /// Asks the remote for its capacity (READ CAPACITY(16), else (10)) on
    /// the gateway's own nexus, retrying through unit attentions, and keeps
    /// it for [`LogicalUnit::describe`]. Returns (block length, blocks);
    /// (0, 0) for a remote that has no READ CAPACITY (a tape drive).
    pub fn probe(&self) -> BoxFuture<'static, Result<(u32, u64), InitiatorError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let init = inner.control()?;
            let lun = inner.cfg.remote_lun;
            let mut last = InitiatorError::Protocol("no usable READ CAPACITY answer");
            for attempt in 0..8 {
                let sixteen = attempt % 2 == 0;
                let cdb: Bytes = if sixteen {
                    Bytes::from_static(&[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0])
                } else {
                    Bytes::from_static(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0])
                };
                let r = init
                    .submit(Request::new(lun, cdb.clone(), if sixteen { 32 } else { 8 }))
                    .outcome
                    .await;
                match r {
                    Ok(res) if res.status == Status::GOOD => {
                        inner.snoop_capacity(cdb[0], &res);
                        let bs = inner.block_size.load(Ordering::Relaxed);
                        if bs != 0 {
                            return Ok((bs, inner.blocks.load(Ordering::Relaxed)));
                        }
                    }
                    // Not a direct-access device (a tape): reachable, and
                    // without a capacity to keep.
                    Ok(res)
                        if res
                            .sense
                            .as_deref()
                            .and_then(Sense::parse)
                            .is_some_and(|s| {
                                s.key == SenseKey::ILLEGAL_REQUEST
                                    && s.asc == asc::INVALID_COMMAND_OPERATION_CODE
                            })
                            && !sixteen =>
                    {
                        return Ok((0, 0));
                    }
                    Ok(_) => {}
                    Err(e) => last = e,
                }
            }
            Err(last)
        })
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn control(&self) -> Result<Arc<dyn Initiator>, InitiatorError> {
        let mut st = self.lock();
        if let Some(c) = &st.control {
            return Ok(c.clone());
        }
        let c = self.factory.open(None)?;
        st.control = Some(c.clone());
        Ok(c)
    }

    fn initiator_for(&self, nexus: &ItNexus) -> Result<Arc<dyn Initiator>, InitiatorError> {
        let mut st = self.lock();
        if let Some((_, i)) = st.by_nexus.get(&nexus.id()) {
            return Ok(i.clone());
        }
        let key = port_key(nexus);
        let init = match st.by_port.get_mut(&key) {
            Some(e) => {
                e.users += 1;
                e.initiator.clone()
            }
            None => {
                let i = self.factory.open(Some(nexus))?;
                st.by_port.insert(
                    key.clone(),
                    PortEntry {
                        initiator: i.clone(),
                        users: 1,
                        ua: VecDeque::new(),
                    },
                );
                i
            }
        };
        st.by_nexus.insert(nexus.id(), (key, init.clone()));
        Ok(init)
    }

    /// Keeps the capacity the remote reports in READ CAPACITY answers.
    fn snoop_capacity(&self, opcode: u8, res: &TaskResult) {
        if res.status != Status::GOOD {
            return;
        }
        let mut b = [0u8; 12];
        let mut n = 0;
        for s in &res.data_in {
            for &x in s.iter() {
                if n == b.len() {
                    break;
                }
                b[n] = x;
                n += 1;
            }
        }
        let (last, bs) = match opcode {
            0x25 if n >= 8 => (
                u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            ),
            0x9e if n >= 12 => (
                u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
                u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            ),
            _ => return,
        };
        if bs == 0 || (opcode == 0x25 && last == 0xffff_ffff) {
            return;
        }
        self.block_size.store(bs, Ordering::Relaxed);
        self.blocks.store(last.saturating_add(1), Ordering::Relaxed);
    }

    /// Queues `code` for every port that `pred` selects, of those that have
    /// sent a command through this LU; a reset-family code (29h) replaces
    /// what was queued, as it makes the rest moot.
    fn queue_local_ua(&self, pred: impl Fn(&PortKey) -> bool, code: Asc) {
        let mut st = self.lock();
        for (key, e) in &mut st.by_port {
            if !pred(key) {
                continue;
            }
            let reset = code.0 == 0x29;
            let (removed, added) =
                crate::sense::establish_ua(&mut e.ua, code, reset, LOCAL_UA_QUEUE);
            self.local_ua.fetch_sub(removed, Ordering::AcqRel);
            self.local_ua.fetch_add(added, Ordering::AcqRel);
        }
    }

    /// A unit attention the gateway holds for the task's port, reported as
    /// SPC-4 §5.14 asks: INQUIRY and REPORT LUNS leave it pending,
    /// REQUEST SENSE returns it as its parameter data, any other command
    /// ends with CHECK CONDITION, UNIT ATTENTION.
    fn local_unit_attention(&self, task: &Task) -> Option<TaskResult> {
        if self.local_ua.load(Ordering::Acquire) == 0 {
            return None;
        }
        let cdb = task.cdb.as_bytes();
        let opcode = *cdb.first()?;
        if matches!(opcode, 0x12 | 0xa0) {
            return None;
        }
        let code = {
            let mut st = self.lock();
            let key = port_key(&task.nexus);
            let code = st.by_port.get_mut(&key)?.ua.pop_front()?;
            self.local_ua.fetch_sub(1, Ordering::AcqRel);
            code
        };
        let sense = Sense::new(SenseKey::UNIT_ATTENTION, code);
        if opcode == 0x03 {
            let desc = cdb.get(1).is_some_and(|b| b & 1 == 1);
            let mut data = crate::emulated::sense_bytes(&sense, desc);
            data.truncate(usize::from(cdb.get(4).copied().unwrap_or(0)));
            return Some(TaskResult::with_data(Bytes::from(data)));
        }
        Some(TaskResult::check_condition(sense))
    }

    /// Does the gateway hold a unit attention for `nexus`'s port?
    fn local_ua_pending(&self, nexus: &ItNexus) -> bool {
        self.local_ua.load(Ordering::Acquire) != 0
            && self
                .lock()
                .by_port
                .get(&port_key(nexus))
                .is_some_and(|e| !e.ua.is_empty())
    }

    /// On a shared remote nexus, a unit attention the remote reported on
    /// one host's command is for every host: the others get it from the
    /// gateway.
    fn share_unit_attention(&self, nexus_id: u64, res: &TaskResult) {
        if res.status != Status::CHECK_CONDITION {
            return;
        }
        let Some(s) = res.sense.as_deref().and_then(Sense::parse) else {
            return;
        };
        if s.key != SenseKey::UNIT_ATTENTION {
            return;
        }
        let Some(me) = self.lock().by_nexus.get(&nexus_id).map(|(k, _)| k.clone()) else {
            return;
        };
        self.queue_local_ua(|k| *k != me, s.asc);
    }

    /// Marks tasks aborted and sends the function to the remote.
    fn forward_tmf(
        &self,
        init: &Arc<dyn Initiator>,
        function: TmfFunction,
    ) -> BoxFuture<'static, TmfResponse> {
        let f = init.task_management(self.cfg.remote_lun, function);
        Box::pin(async move {
            match f.await {
                Ok(r) => r,
                Err(e) => e.tmf_response(),
            }
        })
    }

    /// Tasks in flight of `pred` nexuses, grouped by the initiator that
    /// carries them, as (initiator, remote tags).
    fn in_flight(
        &self,
        pred: impl Fn(u64, &Arc<dyn Initiator>) -> bool,
    ) -> Vec<(Arc<dyn Initiator>, Vec<u64>)> {
        let st = self.lock();
        let mut out: Vec<(Arc<dyn Initiator>, Vec<u64>)> = Vec::new();
        for ((nexus_id, _), (init, rtag)) in &st.tags {
            if !pred(*nexus_id, init) {
                continue;
            }
            match out.iter_mut().find(|(i, _)| Arc::ptr_eq(i, init)) {
                Some((_, tags)) => tags.push(*rtag),
                None => out.push((init.clone(), vec![*rtag])),
            }
        }
        out
    }

    /// Aborts at the remote every task of the nexuses `pred` selects: ABORT
    /// TASK SET where an initiator is theirs alone, else one ABORT TASK each.
    async fn abort_remote(&self, pred: impl Fn(u64, &Arc<dyn Initiator>) -> bool) {
        let per_nexus = self.factory.per_nexus();
        for (init, tags) in self.in_flight(pred) {
            if per_nexus {
                let _ = self.forward_tmf(&init, TmfFunction::AbortTaskSet).await;
            } else {
                for tag in tags {
                    let _ = self
                        .forward_tmf(&init, TmfFunction::AbortTask { tag })
                        .await;
                }
            }
        }
    }

    /// The host's INQUIRY for a page whose identity we derive: (page,
    /// allocation length).
    fn identity_page(&self, cdb: &[u8]) -> Option<(u8, u16)> {
        if !matches!(self.cfg.identity, Identity::Derived { .. }) {
            return None;
        }
        match cdb {
            [0x12, evpd, page @ (0x80 | 0x83), hi, lo, ..] if evpd & 1 == 1 => {
                Some((*page, u16::from_be_bytes([*hi, *lo])))
            }
            _ => None,
        }
    }

    /// Rebuilds VPD page 0x80 or 0x83 with the derived identity, cut to the
    /// host's allocation length.
    fn derive_page(&self, page: u8, alloc: u16, res: TaskResult) -> TaskResult {
        if res.status != Status::GOOD || res.aborted {
            return res;
        }
        let mut data = Vec::with_capacity(res.data_in_total());
        for s in &res.data_in {
            data.extend_from_slice(s);
        }
        let Some(header) = data.get(..4) else {
            return res;
        };
        let mut v = Vec::with_capacity(128);
        v.extend_from_slice(&[header[0], page, 0, 0]);
        match page {
            0x80 => v.extend_from_slice(self.serial.as_bytes()),
            _ => {
                // NAA, logical unit, binary.
                v.extend_from_slice(&[0x01, 0x03, 0, 8]);
                v.extend_from_slice(&self.naa.to_be_bytes());
                // T10 vendor ID, logical unit, ASCII: "UNIFAB  " + serial.
                v.extend_from_slice(&[0x02, 0x01, 0, 24]);
                v.extend_from_slice(b"UNIFAB  ");
                v.extend_from_slice(self.serial.as_bytes());
                // The remote's designators of other associations (target
                // port, target device), unchanged.
                let page_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
                let end = (4 + page_len).min(data.len());
                let mut at = 4;
                while let Some(d) = data.get(at..at + 4) {
                    let len = 4 + usize::from(d[3]);
                    if at + len > end {
                        break;
                    }
                    let association = (d[1] >> 4) & 0x3;
                    if association == 0
                        && d[1] & 0x0f == 3
                        && d[3] == 8
                        && let Some(&naa) = data
                            .get(at + 4..at + 12)
                            .and_then(|b| <&[u8; 8]>::try_from(b).ok())
                    {
                        self.remote_naa
                            .store(u64::from_be_bytes(naa), Ordering::Relaxed);
                    }
                    if association != 0 {
                        v.extend_from_slice(&data[at..at + len]);
                    }
                    at += len;
                }
            }
        }
        let len = u16::try_from(v.len() - 4).unwrap_or(u16::MAX);
        v[2..4].copy_from_slice(&len.to_be_bytes());
        v.truncate(usize::from(alloc));
        TaskResult::with_data(Bytes::from(v))
    }
}

/// An EXTENDED COPY (LID1) parameter list with every identification CSCD
/// descriptor (E4h) that names NAA `from` (binary, logical unit, 8 bytes)
/// naming `to` instead; `None` when no descriptor names `from` (the list
/// then goes on unchanged). The list is a few hundred bytes of control
/// data, so it is copied.
fn rewrite_cscd_naa(data_out: &[Bytes], from: u64, to: u64) -> Option<Vec<u8>> {
    let total: usize = data_out.iter().map(Bytes::len).sum();
    if total > 64 * 1024 {
        return None;
    }
    let mut p = Vec::with_capacity(total);
    for s in data_out {
        p.extend_from_slice(s);
    }
    let cscd_len = usize::from(u16::from_be_bytes([*p.get(2)?, *p.get(3)?]));
    let mut changed = false;
    let mut at = 16;
    while at + 32 <= (16 + cscd_len).min(p.len()) {
        let d = &mut p[at..at + 32];
        let names_from = d[0] == 0xe4
            && d[4] & 0x0f == 1
            && d[5] & 0x3f == 0x03
            && d[7] == 8
            && d[8..16] == from.to_be_bytes();
        if names_from {
            d[8..16].copy_from_slice(&to.to_be_bytes());
            changed = true;
        }
        at += 32;
    }
    changed.then_some(p)
}

impl RemoteLu {
    /// Closes every initiator the LU holds, so that its sessions to the
    /// remote log out (a LU the configuration no longer has). Commands
    /// still running end as the initiators' contract says; later ones
    /// open new initiators, so the LU must be out of every LUN map first.
    pub fn close(&self) {
        let initiators: Vec<Arc<dyn Initiator>> = {
            let mut st = self.inner.lock();
            st.by_nexus.clear();
            let mut v: Vec<Arc<dyn Initiator>> =
                st.by_port.drain().map(|(_, e)| e.initiator).collect();
            v.extend(st.control.take());
            v
        };
        self.inner.local_ua.store(0, Ordering::Release);
        for i in initiators {
            i.close();
        }
    }

    /// The command forwarded to the remote (what [`LogicalUnit::execute`]
    /// counts).
    fn forward(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let inner = &self.inner;
        let handle = match inner.tasks.register(&task.nexus, task.tag, task.attr) {
            Ok(h) => h,
            Err(_) => {
                return Box::pin(std::future::ready(TaskResult::status(
                    Status::TASK_SET_FULL,
                )));
            }
        };
        let opcode = task.cdb.opcode().unwrap_or(0);
        let read_only = inner.cfg.read_only;
        // A unit attention the gateway holds comes first, as on any LU;
        // then a read-only view's refusal.
        let early = inner.local_unit_attention(&task).or_else(|| {
            (read_only && !protect::allowed(task.cdb.as_bytes())).then(protect::refused)
        });
        if let Some(r) = early {
            drop(handle);
            return Box::pin(std::future::ready(r));
        }
        let shared = !inner.factory.per_nexus();
        let init = match inner.initiator_for(&task.nexus) {
            Ok(i) => i,
            Err(e) => {
                inner.failures.record(&inner.cfg, opcode, &e);
                return Box::pin(std::future::ready(e.task_result()));
            }
        };
        let key = (task.nexus.id(), task.tag);
        let derive = inner.identity_page(task.cdb.as_bytes());
        let mut request = Request::from_task(task, inner.cfg.remote_lun);
        if derive.is_some() {
            // Ask for the whole page; the host gets its allocation length.
            let mut cdb = request.cdb.as_bytes().to_vec();
            cdb[3..5].copy_from_slice(&(IDENTITY_ALLOC as u16).to_be_bytes());
            request.cdb = crate::task::Cdb::new(Bytes::from(cdb));
            request.data_in_len = IDENTITY_ALLOC;
        }
        if opcode == 0x83 && matches!(inner.cfg.identity, Identity::Derived { .. }) {
            let remote = inner.remote_naa.load(Ordering::Relaxed);
            if remote != 0
                && let Some(list) = rewrite_cscd_naa(&request.data_out, inner.naa, remote)
            {
                request.data_out = vec![Bytes::from(list)];
            }
        }
        let submitted = init.submit(request);
        inner.lock().tags.insert(key, (init.clone(), submitted.tag));
        let inner = self.inner.clone();
        Box::pin(async move {
            let outcome = submitted.outcome.await;
            inner.lock().tags.remove(&key);
            let aborted = handle.is_aborted();
            let result = match outcome {
                _ if aborted => TaskResult::aborted(),
                Ok(res) => {
                    if matches!(opcode, 0x25 | 0x9e) {
                        inner.snoop_capacity(opcode, &res);
                    }
                    if shared {
                        inner.share_unit_attention(key.0, &res);
                    }
                    match derive {
                        Some((page, alloc)) => inner.derive_page(page, alloc, res),
                        None if read_only && matches!(opcode, 0x1a | 0x5a) => {
                            protect::mark_write_protected(opcode, res)
                        }
                        None => res,
                    }
                }
                Err(e) => {
                    inner.failures.record(&inner.cfg, opcode, &e);
                    e.task_result()
                }
            };
            drop(handle);
            result
        })
    }
}

impl LogicalUnit for RemoteLu {
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        // Counted around the forwarded command (a remote LU's cost is the
        // remote's; one more future here is noise beside it).
        let (start, data_in_len, data_out_len) = (
            std::time::Instant::now(),
            task.data_in_len,
            task.data_out_len,
        );
        let run = self.forward(task);
        let inner = self.inner.clone();
        Box::pin(async move {
            let result = run.await;
            inner
                .stats
                .record(&result, data_in_len, data_out_len, start.elapsed());
            result
        })
    }

    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        let inner = self.inner.clone();
        let nexus = request.nexus;
        let nid = nexus.id();
        match request.function {
            TmfFunction::AbortTask { tag } => {
                let wait = inner.tasks.abort_matching(|n, t| *n == nexus && t == tag);
                if wait.count() == 0 {
                    return Box::pin(std::future::ready(TmfResponse::FunctionComplete));
                }
                let remote = inner.lock().tags.get(&(nid, tag)).cloned();
                Box::pin(async move {
                    let r = match remote {
                        Some((init, rtag)) => {
                            inner
                                .forward_tmf(&init, TmfFunction::AbortTask { tag: rtag })
                                .await
                        }
                        None => TmfResponse::FunctionComplete,
                    };
                    wait.await;
                    r
                })
            }
            TmfFunction::AbortTaskSet | TmfFunction::ItNexusReset => {
                let wait = inner.tasks.abort_matching(|n, _| *n == nexus);
                Box::pin(async move {
                    inner.abort_remote(|id, _| id == nid).await;
                    wait.await;
                    TmfResponse::FunctionComplete
                })
            }
            TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset
            | TmfFunction::TargetReset
                if inner.cfg.read_only =>
            {
                // A read-only view resets itself, never the remote (whose
                // owner's tasks, reservations and unit attentions are not
                // the view's to touch): the view's own tasks are aborted
                // at the remote, and the view keeps the unit attentions a
                // reset of its own LU establishes.
                let wait = inner.tasks.abort_matching(|_, _| true);
                let me = port_key(&nexus);
                // LOGICAL UNIT RESET: every port, the requester's included,
                // as the emulated LU does (SAM-5 §6.3.2).
                let all = request.function == TmfFunction::LogicalUnitReset;
                inner.queue_local_ua(|k| all || *k != me, ua_of(request.function));
                Box::pin(async move {
                    inner.abort_remote(|_, _| true).await;
                    wait.await;
                    TmfResponse::FunctionComplete
                })
            }
            TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset
            | TmfFunction::TargetReset => {
                let function = match request.function {
                    TmfFunction::ClearTaskSet => TmfFunction::ClearTaskSet,
                    _ => TmfFunction::LogicalUnitReset,
                };
                let wait: AbortWait = inner.tasks.abort_matching(|_, _| true);
                let init = inner.initiator_for(&nexus);
                let me = port_key(&nexus);
                Box::pin(async move {
                    let r = match init {
                        Ok(init) => {
                            let r = inner.forward_tmf(&init, function).await;
                            if inner.factory.per_nexus() {
                                // Tasks other remote nexuses hold on the LU.
                                inner.abort_remote(|_, i| !Arc::ptr_eq(i, &init)).await;
                            } else if r == TmfResponse::FunctionComplete {
                                // One remote nexus for every host: the
                                // remote tells none of the others.
                                inner.queue_local_ua(|k| *k != me, ua_of(request.function));
                            }
                            r
                        }
                        Err(e) => e.tmf_response(),
                    };
                    wait.await;
                    r
                })
            }
            TmfFunction::ClearAca => match inner.initiator_for(&nexus) {
                Ok(init) => inner.forward_tmf(&init, TmfFunction::ClearAca),
                Err(e) => Box::pin(std::future::ready(e.tmf_response())),
            },
            TmfFunction::QueryTask { tag } => {
                let r = if inner.tasks.contains(&nexus, tag) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                Box::pin(std::future::ready(r))
            }
            TmfFunction::QueryTaskSet => {
                let r = if inner.tasks.has_tasks_of(&nexus) {
                    TmfResponse::FunctionSucceeded
                } else {
                    TmfResponse::FunctionComplete
                };
                Box::pin(std::future::ready(r))
            }
            TmfFunction::QueryAsyncEvent if inner.local_ua_pending(&nexus) => {
                Box::pin(std::future::ready(TmfResponse::FunctionSucceeded))
            }
            TmfFunction::QueryAsyncEvent => match inner.initiator_for(&nexus) {
                Ok(init) => inner.forward_tmf(&init, TmfFunction::QueryAsyncEvent),
                Err(e) => Box::pin(std::future::ready(e.tmf_response())),
            },
        }
    }

    fn nexus_loss(&self, nexus: &ItNexus) {
        let closing = {
            let mut st = self.inner.lock();
            let Some((key, _)) = st.by_nexus.remove(&nexus.id()) else {
                return;
            };
            let last = match st.by_port.get_mut(&key) {
                Some(e) => {
                    e.users = e.users.saturating_sub(1);
                    e.users == 0
                }
                None => false,
            };
            if last {
                st.by_port.remove(&key).map(|e| {
                    self.inner.local_ua.fetch_sub(e.ua.len(), Ordering::AcqRel);
                    e.initiator
                })
            } else {
                None
            }
        };
        // A shared initiator serves other nexuses: only a per-nexus one is
        // closed (the remote then sees its own I_T nexus loss).
        if let Some(init) = closing
            && self.inner.factory.per_nexus()
        {
            init.close();
        }
    }

    fn describe(&self) -> LuDescription {
        LuDescription {
            name: self.inner.cfg.name.clone(),
            backend: self.inner.cfg.backend.clone(),
            block_size: self.inner.block_size.load(Ordering::Relaxed),
            blocks: self.inner.blocks.load(Ordering::Relaxed),
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

mod protect;
#[cfg(test)]
mod tests;
