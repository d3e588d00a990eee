//! Several paths to one remote LU (an HA array's controllers, or several
//! unifab gateways of a cluster), used the way a host's multipath layer
//! uses them (SPC-4 §5.16 asymmetric access):
//!
//! - **Which path.** Each path's state is learnt through the path itself,
//!   on the gateway's own nexus (the factory's control initiator, so that
//!   no host's unit attention is consumed; with a shared remote nexus the
//!   hosts share it too, and a unit attention the questions meet is held
//!   and given as the answer to the next command, one each, so the hosts
//!   hear it): its TARGET PORT GROUP from INQUIRY VPD page 83h,
//!   then that group's state from REPORT TARGET PORT GROUPS. Commands go to the first path
//!   in the order Active/Optimized, Active/Non-optimized, not yet known,
//!   Transitioning, Standby, Unavailable, Offline; among equals, paths
//!   that have not failed first, then the order configured. The states
//!   are learnt again after ASYMMETRIC ACCESS STATE CHANGED, an ALUA
//!   refusal or a transport failure, by the next command.
//! - **Retries on another path.** A command refused with LOGICAL UNIT NOT
//!   ACCESSIBLE (asymmetric access state transition, target port in
//!   standby or unavailable state: 04h/0Ah–0Ch; it did not run) goes to
//!   the next path. So does a command whose path failed at the transport
//!   before it was sent (unreachable, closed), and, after a connection
//!   loss or a timeout, one that may run twice
//!   ([`crate::initiator::is_idempotent`]); any other command fails with
//!   the transport's sense, as on one path. When every path refused, the
//!   last answer is the command's.
//! - **Order.** Commands retried on another path may reach the remote
//!   after commands submitted later; task management goes to the path in
//!   use.
//!
//! [`MultipathFactory::paths`] reports each path's state (`unifab show
//! remotes`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::alua::AccessState;
use crate::initiator::{
    Initiator, InitiatorError, InitiatorFactory, Outcome, Request, Submitted, is_idempotent,
};
use crate::lu::{BoxFuture, TmfFunction, TmfResponse};
use crate::sense::{Sense, SenseKey};
use crate::task::{ItNexus, Lun, Status, TaskResult};

/// One initiator per path, in the order configured.
type Paths = Arc<[Arc<dyn Initiator>]>;

/// One path as [`MultipathFactory::paths`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathState {
    /// The path as an operator reads it (its portal).
    pub name: String,
    /// Its target port group, once learnt.
    pub group: Option<u16>,
    /// That group's access state, once learnt.
    pub state: Option<AccessState>,
    /// Commands that failed on it at the transport or were refused by its
    /// access state (each then tried on the next path).
    pub failures: u64,
    /// Its last failure.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    paths: Mutex<Vec<PathState>>,
    /// The states must be learnt again before the next command.
    stale: AtomicBool,
    /// The hosts share the remote nexus, and so the probes' unit
    /// attentions are theirs.
    shared_nexus: bool,
    /// Unit attentions the probes took on the shared nexus, each handed to
    /// the next command as its answer (one each, oldest first): a host
    /// hears what it would have heard had no probe asked first.
    held: Mutex<std::collections::VecDeque<TaskResult>>,
}

/// Most unit attentions held for the hosts at once (SPC lets a device
/// report fewer than it had; the oldest are kept).
const MAX_HELD: usize = 16;

impl Shared {
    /// Keeps `uas` (the probes' on the shared nexus) for the hosts, each
    /// condition once.
    fn hold(&self, uas: Vec<TaskResult>) {
        if !self.shared_nexus {
            return;
        }
        let code = |r: &TaskResult| {
            r.sense
                .as_ref()
                .and_then(|s| Sense::parse(s))
                .map(|s| (s.asc.0, s.asc.1))
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for ua in uas {
            if held.len() < MAX_HELD && !held.iter().any(|h| code(h) == code(&ua)) {
                held.push_back(ua);
            }
        }
    }

    /// The next held unit attention, if any.
    fn take_held(&self) -> Option<TaskResult> {
        if !self.shared_nexus {
            return None;
        }
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

impl Shared {
    fn fail(&self, i: usize, why: String) {
        let mut p = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = p.get_mut(i) {
            p.failures += 1;
            p.last_error = Some(why);
        }
        self.stale.store(true, Ordering::Release);
    }

    /// Path indexes in the order commands try them.
    fn order(&self) -> Vec<usize> {
        let p = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        let rank = |s: &PathState| match s.state {
            Some(AccessState::ActiveOptimized) => 0,
            Some(AccessState::ActiveNonOptimized) => 1,
            None => 2,
            Some(AccessState::Transitioning) => 3,
            Some(AccessState::Standby) => 4,
            Some(AccessState::Unavailable) => 5,
            Some(AccessState::Offline) => 6,
        };
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by_key(|&i| (rank(&p[i]), p[i].last_error.is_some(), i));
        order
    }
}

/// Opens one initiator per path for each nexus, and hands out an
/// [`Initiator`] that chooses among them (module documentation).
pub struct MultipathFactory {
    paths: Vec<(String, Arc<dyn InitiatorFactory>)>,
    shared: Arc<Shared>,
    /// Each path's control initiator, which learns the states.
    probes: Mutex<Option<Paths>>,
}

impl fmt::Debug for MultipathFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultipathFactory")
            .field(
                "paths",
                &self.paths.iter().map(|p| &p.0).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl MultipathFactory {
    /// Paths, each named (for operators) and with its own factory; the
    /// order is the preference among paths in the same state.
    pub fn new(paths: Vec<(String, Arc<dyn InitiatorFactory>)>) -> MultipathFactory {
        let states = paths
            .iter()
            .map(|(name, _)| PathState {
                name: name.clone(),
                group: None,
                state: None,
                failures: 0,
                last_error: None,
            })
            .collect();
        let shared_nexus = !paths.first().is_some_and(|(_, f)| f.per_nexus());
        MultipathFactory {
            paths,
            shared: Arc::new(Shared {
                paths: Mutex::new(states),
                stale: AtomicBool::new(true),
                shared_nexus,
                held: Mutex::new(std::collections::VecDeque::new()),
            }),
            probes: Mutex::new(None),
        }
    }

    /// Each path's state now.
    pub fn paths(&self) -> Vec<PathState> {
        self.shared
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl InitiatorFactory for MultipathFactory {
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        let mut paths = Vec::with_capacity(self.paths.len());
        for (_, f) in &self.paths {
            paths.push(f.open(nexus)?);
        }
        let probes = {
            let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            match &*p {
                Some(p) => p.clone(),
                None => {
                    let mut v = Vec::with_capacity(self.paths.len());
                    for (_, f) in &self.paths {
                        v.push(f.open(None)?);
                    }
                    let v: Paths = v.into();
                    *p = Some(v.clone());
                    v
                }
            }
        };
        Ok(Arc::new(MultipathInitiator {
            paths: paths.into(),
            probes,
            shared: self.shared.clone(),
            current: Mutex::new(0),
        }))
    }

    fn per_nexus(&self) -> bool {
        self.paths.first().is_some_and(|(_, f)| f.per_nexus())
    }
}

/// One nexus's initiators, one per path.
#[derive(Debug)]
pub struct MultipathInitiator {
    paths: Paths,
    /// The paths' control initiators (the gateway's own nexus).
    probes: Paths,
    shared: Arc<Shared>,
    /// The path the last command went to (task management goes there).
    current: Mutex<usize>,
}

/// Why an answer sends the command to the next path: NOT READY, LOGICAL
/// UNIT NOT ACCESSIBLE for an access state (the command did not run).
fn alua_refusal(r: &TaskResult) -> Option<AccessState> {
    if r.status != Status::CHECK_CONDITION {
        return None;
    }
    let s = Sense::parse(r.sense.as_ref()?)?;
    if s.key != SenseKey::NOT_READY || s.asc.0 != 0x04 {
        return None;
    }
    match s.asc.1 {
        0x0a => Some(AccessState::Transitioning),
        0x0b => Some(AccessState::Standby),
        0x0c => Some(AccessState::Unavailable),
        _ => None,
    }
}

/// ASYMMETRIC ACCESS STATE CHANGED (or any unit attention the states may
/// follow): the states are learnt again.
fn state_changed(r: &TaskResult) -> bool {
    r.status == Status::CHECK_CONDITION
        && r.sense
            .as_ref()
            .and_then(|s| Sense::parse(s))
            .is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION && s.asc.0 == 0x2a)
}

/// `cdb`'s data-in through `path`, past the unit attentions of the
/// gateway's own nexus (at most four), which go to `seen`.
async fn ask(
    path: &Arc<dyn Initiator>,
    lun: Lun,
    cdb: &[u8],
    len: u32,
    seen: &mut Vec<TaskResult>,
) -> Option<Vec<u8>> {
    for _ in 0..4 {
        let r = path
            .submit(Request::new(lun, bytes::Bytes::copy_from_slice(cdb), len))
            .outcome
            .await
            .ok()?;
        if r.status == Status::GOOD {
            return Some(r.data_in.iter().flat_map(|b| b.iter().copied()).collect());
        }
        let ua = r
            .sense
            .as_ref()
            .and_then(|s| Sense::parse(s))
            .is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION);
        if !ua {
            return None;
        }
        seen.push(r);
    }
    None
}

/// The TARGET PORT GROUP designator of VPD page 83h.
fn port_group(vpd83: &[u8]) -> Option<u16> {
    let end =
        (4 + usize::from(u16::from_be_bytes([*vpd83.get(2)?, *vpd83.get(3)?]))).min(vpd83.len());
    let mut at = 4;
    while at + 4 <= end {
        let len = usize::from(vpd83[at + 3]);
        if vpd83[at + 1] & 0x0f == 0x05 && len >= 4 && at + 8 <= end {
            return Some(u16::from_be_bytes([vpd83[at + 6], vpd83[at + 7]]));
        }
        at += 4 + len;
    }
    None
}

/// The state of `group` in REPORT TARGET PORT GROUPS data (either format).
fn group_state(rtpg: &[u8], group: u16) -> Option<AccessState> {
    let len = usize::try_from(u32::from_be_bytes(rtpg.get(..4)?.try_into().ok()?)).ok()?;
    let end = (4 + len).min(rtpg.len());
    let mut at = if rtpg.get(4)? & 0x70 == 0x10 { 8 } else { 4 };
    while at + 8 <= end {
        let d = &rtpg[at..];
        if u16::from_be_bytes([d[2], d[3]]) == group {
            return AccessState::from_code(d[0] & 0x0f);
        }
        at += 8 + 4 * usize::from(d[7]);
    }
    None
}

impl MultipathInitiator {
    /// Learns every path's group and state through the path itself; the
    /// unit attentions the questions met are held for the hosts where
    /// they share the nexus ([`Shared::hold`]).
    async fn learn(paths: &[Arc<dyn Initiator>], shared: &Shared, lun: Lun) {
        for (i, p) in paths.iter().enumerate() {
            let mut seen = Vec::new();
            let group = match ask(p, lun, &[0x12, 0x01, 0x83, 0x10, 0x00, 0], 4096, &mut seen).await
            {
                Some(v) => port_group(&v),
                None => None,
            };
            let state = match group {
                Some(g) => ask(
                    p,
                    lun,
                    &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
                    4096,
                    &mut seen,
                )
                .await
                .and_then(|v| group_state(&v, g)),
                None => None,
            };
            shared.hold(seen);
            let mut ps = shared.paths.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = ps.get_mut(i) {
                s.group = group;
                s.state = state;
                if state.is_some() {
                    s.last_error = None;
                }
            }
        }
    }
}

impl Initiator for MultipathInitiator {
    fn submit(&self, request: Request) -> Submitted {
        let (paths, shared) = (self.paths.clone(), self.shared.clone());
        let probes = self.probes.clone();
        let first = shared.order().first().copied().unwrap_or(0);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = first;
        // A unit attention a probe took from the hosts' shared nexus is
        // this command's answer (it did not run; the host retries it).
        if let Some(ua) = shared.take_held() {
            return Submitted {
                tag: u64::MAX,
                outcome: Box::pin(std::future::ready(Ok(ua))),
            };
        }
        let learn = shared.stale.swap(false, Ordering::AcqRel);
        let Some(path) = paths.get(first) else {
            return Submitted::failed(InitiatorError::Closed);
        };
        if !learn {
            // The usual case: the best path, retried elsewhere only when
            // it fails (the first attempt is submitted now, in order).
            let s = path.submit(request.clone());
            let tag = s.tag;
            let outcome = Box::pin(async move {
                let r = s.outcome.await;
                next_paths(paths, shared, request, first, r).await
            });
            return Submitted { tag, outcome };
        }
        let outcome = Box::pin(async move {
            MultipathInitiator::learn(&probes, &shared, request.lun).await;
            if let Some(ua) = shared.take_held() {
                return Ok(ua);
            }
            let first = shared.order().first().copied().unwrap_or(0);
            let r = match paths.get(first) {
                Some(p) => p.submit(request.clone()).outcome.await,
                None => Err(InitiatorError::Closed),
            };
            next_paths(paths, shared, request, first, r).await
        });
        Submitted {
            tag: u64::MAX,
            outcome,
        }
    }

    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        let i = *self.current.lock().unwrap_or_else(|e| e.into_inner());
        match self.paths.get(i) {
            Some(p) => p.task_management(lun, function),
            None => Box::pin(std::future::ready(Err(InitiatorError::Closed))),
        }
    }

    fn close(&self) {
        for p in self.paths.iter() {
            p.close();
        }
    }

    fn remote(&self) -> String {
        self.paths
            .iter()
            .map(|p| p.remote())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether `r` (from path `at`) sends `request` on to another path.
fn retry_elsewhere(shared: &Shared, at: usize, request: &Request, r: &Outcome) -> bool {
    match r {
        Ok(t) => {
            if let Some(state) = alua_refusal(t) {
                shared.fail(at, format!("refused: {}", state.name()));
                if let Some(p) = shared
                    .paths
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(at)
                {
                    p.state = Some(state);
                }
                return true;
            }
            if state_changed(t) {
                shared.stale.store(true, Ordering::Release);
            }
            false
        }
        Err(e @ (InitiatorError::Unreachable { .. } | InitiatorError::Closed)) => {
            shared.fail(at, e.to_string());
            true
        }
        Err(e @ (InitiatorError::Disconnected | InitiatorError::Timeout { .. })) => {
            shared.fail(at, e.to_string());
            is_idempotent(request.cdb.as_bytes())
        }
        Err(_) => false,
    }
}

/// Tries the paths after `tried` in order while the answer says to.
async fn next_paths(
    paths: Paths,
    shared: Arc<Shared>,
    request: Request,
    tried: usize,
    mut r: Outcome,
) -> Outcome {
    let mut done = vec![tried];
    let mut at = tried;
    while retry_elsewhere(&shared, at, &request, &r) {
        let Some(next) = shared.order().into_iter().find(|i| !done.contains(i)) else {
            return r;
        };
        done.push(next);
        at = next;
        r = match paths.get(next) {
            Some(p) => p.submit(request.clone()).outcome.await,
            None => return r,
        };
    }
    r
}

#[cfg(test)]
mod tests;
