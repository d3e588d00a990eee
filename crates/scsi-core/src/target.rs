//! The SCSI target device: the one door every transport's target enters
//! the SCSI core through ([`Dispatch`]), and the LUN map that implements it
//! ([`ScsiTarget`]).
//!
//! [`ScsiTarget::dispatch`] answers REPORT LUNS itself (every SELECT
//! REPORT, REPORT LUNS well-known LUN included), INQUIRY and REQUEST SENSE
//! to a LUN that does not exist, and LOGICAL UNIT NOT SUPPORTED for any
//! other command to one; everything else goes to the LU. When the map
//! changes, every I_T nexus that has used the target gets REPORTED LUNS
//! DATA HAS CHANGED (cleared by REPORT LUNS, reported by REQUEST SENSE,
//! not by INQUIRY).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use bytes::Bytes;

use crate::cdb::{Command, opcode};
use crate::lu::{BoxFuture, LogicalUnit, TmfFunction, TmfRequest, TmfResponse};
use crate::sense::{Sense, SenseKey, asc};
use crate::task::{ItNexus, Lun, Task, TaskResult};

/// The one door into the SCSI core: what a transport's target (the iSCSI
/// session loop, the FCP target port) hands its tasks, task management
/// functions and nexus losses to.
///
/// SAM-5 calls this role the task router of a SCSI target device: it
/// routes each command to the logical unit its LUN names and answers the
/// target-level commands itself. [`ScsiTarget`] is the implementation a
/// gateway serves; a transport may be given any other (an iSCSI discovery
/// session's, which has no logical units, or a test's).
pub trait Dispatch: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one task (REPORT LUNS and missing LUNs included). The LU's
    /// `execute` is called before this returns (the ordering contract of
    /// [`LogicalUnit::execute`]).
    fn dispatch(&self, task: Task) -> BoxFuture<'static, TaskResult>;
    /// Runs a task management function; resolves when every affected
    /// task has ended.
    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse>;
    /// The I_T nexus is gone (logout, connection loss, session end).
    fn nexus_loss(&self, nexus: &ItNexus);

    /// The I_T nexus is about to end in order (a logout): what its end
    /// releases beyond this process is released before the future
    /// resolves, so that the initiator, once it hears the logout
    /// answered, finds it released through any other target port.
    /// [`Dispatch::nexus_loss`] follows. By default nothing to wait for.
    fn nexus_closing(&self, _nexus: &ItNexus) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Whether the answers of commands to `lun` should go out as each
    /// completes ([`LogicalUnit::answer_promptly`]). Default: false.
    fn answer_promptly(&self, _lun: Lun) -> bool {
        false
    }
}

/// The REPORT LUNS well-known logical unit (SPC-4 §8.2).
pub const REPORT_LUNS_WLUN: Lun = Lun(0xc101_0000_0000_0000);

/// A LUN map with the target-level commands and task management routing.
#[derive(Debug, Clone, Default)]
pub struct ScsiTarget {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    luns: RwLock<BTreeMap<Lun, Arc<dyn LogicalUnit>>>,
    /// Some mapped LU answers promptly ([`LogicalUnit::answer_promptly`]):
    /// without one, [`Dispatch::answer_promptly`] costs a load, not a
    /// second look-up per command.
    any_prompt: std::sync::atomic::AtomicBool,
    /// Every I_T nexus that has used the target. Read-locked per command:
    /// the hosts of one target do not serialize on it.
    nexuses: RwLock<Nexuses>,
}

/// The I_T nexuses that have used the target, and which of them have a
/// REPORTED LUNS DATA HAS CHANGED unit attention pending.
#[derive(Debug, Default)]
struct Nexuses {
    /// Nexus id -> the unit attention is pending.
    pending: crate::idmap::IdMap<u64, bool>,
    /// How many are pending.
    count: usize,
}

fn fixed_sense(key: SenseKey, code: crate::sense::Asc) -> Bytes {
    Sense::new(key, code).to_fixed_bytes()
}

impl ScsiTarget {
    /// An empty target.
    pub fn new() -> ScsiTarget {
        ScsiTarget::default()
    }

    fn nexuses(&self) -> RwLockWriteGuard<'_, Nexuses> {
        self.inner
            .nexuses
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn map_changed(&self) {
        let mut n = self.nexuses();
        for pending in n.pending.values_mut() {
            *pending = true;
        }
        n.count = n.pending.len();
    }

    /// Notes that `nexus` sent a command with operation code `op`, and
    /// whether REPORTED LUNS DATA HAS CHANGED was pending for it. Every
    /// command but INQUIRY clears it (REQUEST SENSE and REPORT LUNS by
    /// reporting it, the others by being refused with it).
    fn take_map_changed(&self, nexus: &ItNexus, op: Option<u8>) -> bool {
        let id = nexus.id();
        {
            // The usual case, under a read lock: a known nexus, nothing pending.
            let n = self.inner.nexuses.read().unwrap_or_else(|p| p.into_inner());
            if n.count == 0 && n.pending.contains_key(&id) {
                return false;
            }
        }
        let mut n = self.nexuses();
        let pending = n.pending.entry(id).or_insert(false);
        let was = *pending;
        if was && op != Some(opcode::INQUIRY) {
            *pending = false;
            n.count = n.count.saturating_sub(1);
        }
        was
    }

    /// Maps `lu` at `lun`, returning the LU it replaces.
    pub fn insert(&self, lun: Lun, lu: Arc<dyn LogicalUnit>) -> Option<Arc<dyn LogicalUnit>> {
        let mut luns = self.inner.luns.write().unwrap_or_else(|p| p.into_inner());
        let old = luns.insert(lun, lu);
        self.note_prompt(&luns);
        drop(luns);
        self.map_changed();
        old
    }

    fn note_prompt(&self, luns: &BTreeMap<Lun, Arc<dyn LogicalUnit>>) {
        self.inner.any_prompt.store(
            luns.values().any(|lu| lu.answer_promptly()),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Unmaps `lun`.
    pub fn remove(&self, lun: Lun) -> Option<Arc<dyn LogicalUnit>> {
        let mut luns = self.inner.luns.write().unwrap_or_else(|p| p.into_inner());
        let old = luns.remove(&lun);
        self.note_prompt(&luns);
        drop(luns);
        if old.is_some() {
            self.map_changed();
        }
        old
    }

    /// The LU at `lun`.
    pub fn get(&self, lun: Lun) -> Option<Arc<dyn LogicalUnit>> {
        self.inner
            .luns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lun)
            .cloned()
    }

    /// Every mapped LU, in LUN order.
    fn lus(&self) -> Vec<Arc<dyn LogicalUnit>> {
        self.inner
            .luns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Mapped LUNs in order.
    pub fn luns(&self) -> Vec<Lun> {
        self.inner
            .luns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    fn missing_lun(&self, task: &Task) -> TaskResult {
        match Command::parse(task.cdb.as_bytes()) {
            Ok(Command::Inquiry {
                evpd: false,
                page_code: 0,
                alloc_len,
                ..
            }) => {
                let mut v = vec![0u8; 36];
                v[0] = 0x7f; // peripheral qualifier 011b, device type 1Fh
                v[2] = 0x06;
                v[3] = 0x02;
                v[4] = 31;
                v.truncate(usize::from(alloc_len));
                TaskResult::with_data(Bytes::from(v))
            }
            Ok(Command::RequestSense { alloc_len, .. }) => {
                let s = fixed_sense(SenseKey::ILLEGAL_REQUEST, asc::LOGICAL_UNIT_NOT_SUPPORTED);
                TaskResult::with_data(s.slice(..usize::from(alloc_len).min(s.len())))
            }
            _ => TaskResult::check_condition(Sense::new(
                SenseKey::ILLEGAL_REQUEST,
                asc::LOGICAL_UNIT_NOT_SUPPORTED,
            )),
        }
    }

    fn report_luns(&self, task: &Task) -> TaskResult {
        let (select, alloc) = match Command::parse(task.cdb.as_bytes()) {
            Ok(Command::ReportLuns {
                select_report,
                alloc_len,
                ..
            }) => (select_report, alloc_len),
            Ok(_) => {
                return TaskResult::check_condition(Sense::new(
                    SenseKey::ILLEGAL_REQUEST,
                    asc::INVALID_COMMAND_OPERATION_CODE,
                ));
            }
            Err(e) => return TaskResult::check_condition(Sense::from(e)),
        };
        if alloc < 16 {
            return TaskResult::check_condition(Sense::illegal_field(
                asc::INVALID_FIELD_IN_CDB,
                true,
                6,
                None,
            ));
        }
        let luns = self.luns();
        let list: Vec<Lun> = match select {
            // Logical units (no well-known LUNs).
            0x00 | 0x11 => luns,
            // Well-known LUNs only.
            0x01 => vec![REPORT_LUNS_WLUN],
            // Everything.
            0x02 => {
                let mut l = luns;
                l.push(REPORT_LUNS_WLUN);
                l
            }
            // Administrative LUNs / subsidiary of a LUN: none here.
            0x10 | 0x12 => Vec::new(),
            _ => {
                return TaskResult::check_condition(Sense::illegal_field(
                    asc::INVALID_FIELD_IN_CDB,
                    true,
                    2,
                    None,
                ));
            }
        };
        let mut v = Vec::with_capacity(8 + 8 * list.len());
        v.extend_from_slice(&((list.len() * 8) as u32).to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        for l in list {
            v.extend_from_slice(&l.to_bytes());
        }
        v.truncate(alloc as usize);
        TaskResult::with_data(Bytes::from(v))
    }
}

impl Dispatch for ScsiTarget {
    /// Runs a task: target-level commands here, the rest on its LU. The
    /// LU's `execute` is called before this returns (ordering contract).
    fn dispatch(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let op = task.cdb.opcode();
        let changed = self.take_map_changed(&task.nexus, op);
        if op == Some(opcode::REPORT_LUNS) {
            return Box::pin(std::future::ready(self.report_luns(&task)));
        }
        let lu = if task.lun == REPORT_LUNS_WLUN {
            None
        } else {
            self.get(task.lun)
        };
        if changed && op == Some(opcode::REQUEST_SENSE) {
            let alloc = match Command::parse(task.cdb.as_bytes()) {
                Ok(Command::RequestSense { alloc_len, .. }) => usize::from(alloc_len),
                _ => 0,
            };
            let s = fixed_sense(
                SenseKey::UNIT_ATTENTION,
                asc::REPORTED_LUNS_DATA_HAS_CHANGED,
            );
            return Box::pin(std::future::ready(TaskResult::with_data(
                s.slice(..alloc.min(s.len())),
            )));
        }
        if changed && op != Some(opcode::INQUIRY) {
            return Box::pin(std::future::ready(TaskResult::check_condition(Sense::new(
                SenseKey::UNIT_ATTENTION,
                asc::REPORTED_LUNS_DATA_HAS_CHANGED,
            ))));
        }
        match lu {
            Some(lu) => lu.execute(task),
            None => Box::pin(std::future::ready(self.missing_lun(&task))),
        }
    }

    /// Routes a task management function: LU-addressed functions to their
    /// LU (INCORRECT LOGICAL UNIT NUMBER if unmapped), TARGET RESET and
    /// I_T NEXUS RESET to every LU. Resolves when all affected tasks ended.
    fn task_management(&self, req: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        match req.function {
            TmfFunction::TargetReset | TmfFunction::ItNexusReset => {
                let lus = self.lus();
                let futures: Vec<_> = lus
                    .iter()
                    .map(|lu| lu.task_management(req.clone()))
                    .collect();
                Box::pin(async move {
                    let mut worst = TmfResponse::FunctionComplete;
                    for f in futures {
                        let r = f.await;
                        if r != TmfResponse::FunctionComplete {
                            worst = r;
                        }
                    }
                    worst
                })
            }
            _ => match self.get(req.lun) {
                Some(lu) => lu.task_management(req),
                None => Box::pin(std::future::ready(TmfResponse::IncorrectLun)),
            },
        }
    }

    fn answer_promptly(&self, lun: Lun) -> bool {
        if !self
            .inner
            .any_prompt
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return false;
        }
        // Per command: under the read lock, without cloning the LU's Arc.
        self.inner
            .luns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&lun)
            .is_some_and(|lu| lu.answer_promptly())
    }

    fn nexus_closing(&self, nexus: &ItNexus) -> BoxFuture<'static, ()> {
        let lus = self.lus();
        let futures: Vec<_> = lus.iter().map(|lu| lu.nexus_closing(nexus)).collect();
        Box::pin(async move {
            for f in futures {
                f.await;
            }
        })
    }

    /// The nexus is gone: every LU hears of it.
    fn nexus_loss(&self, nexus: &ItNexus) {
        {
            let mut n = self.nexuses();
            if n.pending.remove(&nexus.id()) == Some(true) {
                n.count = n.count.saturating_sub(1);
            }
        }
        let lus = self.lus();
        for lu in lus {
            lu.nexus_loss(nexus);
        }
    }
}
