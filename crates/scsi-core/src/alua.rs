//! Asymmetric logical unit access (SPC-4 §5.16): target port groups, their
//! access states, REPORT and SET TARGET PORT GROUPS, and which commands
//! each state lets through.
//!
//! A LU's [`Alua`] holds one access state per target port group. The
//! groups and their ports come from the configuration ([`AluaConfig`]);
//! a LU configured with none has the one group of the port a command
//! arrives through, Active/Optimized, as a single-path target presents
//! itself. States change *explicitly* (SET TARGET PORT GROUPS, when
//! `explicit` is on: TPGS = 11b) or *implicitly* ([`Alua::transition`],
//! the gateway's own decision: TPGS includes 01b either way). The caller
//! establishes ASYMMETRIC ACCESS STATE CHANGED for the I_T nexuses a
//! change concerns.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sense::{Asc, Sense, SenseKey, asc};

/// Where a cluster of gateways keeps a LU's SET TARGET PORT GROUPS: a
/// checked request is handed over, and the store has every member apply
/// it (as explicit transitions) before the future resolves.
pub trait AluaStore: Send + Sync + std::fmt::Debug {
    /// Applies `to` on every member; `requester` (the I_T nexus that
    /// asked) hears no unit attention.
    fn set(
        &self,
        to: Vec<(u16, AccessState)>,
        requester: crate::pr::PortKey,
    ) -> crate::lu::BoxFuture<'static, Result<(), String>>;
}

/// A target port group's asymmetric access state (SPC-4 table 150).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    /// Active/Optimized.
    ActiveOptimized,
    /// Active/Non-optimized.
    ActiveNonOptimized,
    /// Standby.
    Standby,
    /// Unavailable.
    Unavailable,
    /// Offline.
    Offline,
    /// Transitioning between states.
    Transitioning,
}

impl AccessState {
    /// The ASYMMETRIC ACCESS STATE code.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Offline => 0xe,
            AccessState::Transitioning => 0xf,
        }
    }

    /// The state a code names.
    pub fn from_code(c: u8) -> Option<AccessState> {
        Some(match c {
            0x0 => AccessState::ActiveOptimized,
            0x1 => AccessState::ActiveNonOptimized,
            0x2 => AccessState::Standby,
            0x3 => AccessState::Unavailable,
            0xe => AccessState::Offline,
            0xf => AccessState::Transitioning,
            _ => return None,
        })
    }

    /// Active/Optimized or Active/Non-optimized: every command runs.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized
        )
    }

    /// The name operators use (`active/optimized`, …).
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active/optimized",
            AccessState::ActiveNonOptimized => "active/non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Offline => "offline",
            AccessState::Transitioning => "transitioning",
        }
    }

    /// Parses [`AccessState::name`].
    pub fn parse(s: &str) -> Option<AccessState> {
        [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
            AccessState::Standby,
            AccessState::Unavailable,
            AccessState::Offline,
            AccessState::Transitioning,
        ]
        .into_iter()
        .find(|a| a.name() == s)
    }
}

/// One target port group of a LU's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGroup {
    /// TARGET PORT GROUP (non-zero).
    pub id: u16,
    /// The state at start.
    pub state: AccessState,
    /// PREF: a preferred group for the LU.
    pub preferred: bool,
    /// Relative target port identifiers in the group (unique across
    /// groups).
    pub ports: Vec<u16>,
}

/// A LU's ALUA configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AluaConfig {
    /// The groups; empty: the arriving port's group alone,
    /// Active/Optimized.
    pub groups: Vec<PortGroup>,
    /// SET TARGET PORT GROUPS is honoured (TPGS = 11b).
    pub explicit: bool,
    /// IMPLICIT TRANSITION TIME, seconds (RTPG extended format).
    pub transition_secs: u8,
}

impl Default for AluaConfig {
    fn default() -> Self {
        AluaConfig {
            groups: Vec::new(),
            explicit: true,
            transition_secs: 10,
        }
    }
}

/// Why an [`AluaConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AluaConfigError {
    /// Group 0 is reserved.
    #[error("target port group 0 is reserved")]
    ZeroGroup,
    /// A group appears twice.
    #[error("target port group {0} appears twice")]
    DuplicateGroup(u16),
    /// A port appears twice, or is 0.
    #[error("relative target port {0} is 0 or in two groups")]
    BadPort(u16),
    /// Transitioning and Offline are states a group passes through, not
    /// ones it starts in.
    #[error("target port group {0} cannot start {1}")]
    StartState(u16, &'static str),
}

impl AluaConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), AluaConfigError> {
        let mut groups = std::collections::HashSet::new();
        let mut ports = std::collections::HashSet::new();
        for g in &self.groups {
            if g.id == 0 {
                return Err(AluaConfigError::ZeroGroup);
            }
            if !groups.insert(g.id) {
                return Err(AluaConfigError::DuplicateGroup(g.id));
            }
            if matches!(g.state, AccessState::Transitioning | AccessState::Offline) {
                return Err(AluaConfigError::StartState(g.id, g.state.name()));
            }
            for p in &g.ports {
                if *p == 0 || !ports.insert(*p) {
                    return Err(AluaConfigError::BadPort(*p));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct GroupState {
    cfg: PortGroup,
    state: AccessState,
    /// STATUS CODE: 0 none, 1 altered by SET TARGET PORT GROUPS, 2 by
    /// implicit behaviour.
    status: u8,
    /// The [`Alua::fences`] count when this group last entered a state
    /// that refuses media access (0: never since start).
    fenced_at: u64,
}

/// A LU's ALUA state.
#[derive(Debug)]
pub struct Alua {
    explicit: bool,
    transition_secs: u8,
    groups: RwLock<Vec<GroupState>>,
    /// Some group is in a state that refuses commands: commands look up
    /// their group's state (else they skip it).
    restricted: AtomicBool,
    /// State changes, explicit and implicit.
    transitions: std::sync::atomic::AtomicU64,
    /// Entries of any group into a state that refuses media access
    /// (Standby, Unavailable, Offline): the fence epoch a command records
    /// when it is admitted ([`Alua::fence_epoch`], [`Alua::fenced_since`]).
    fences: std::sync::atomic::AtomicU64,
}

/// What a state lets through: the commands SPC-4 §5.16.2.4 lists for it.
fn allowed(state: AccessState, cdb: &[u8]) -> bool {
    let op = cdb.first().copied().unwrap_or(0xff);
    let sa = cdb.get(1).map_or(0, |b| b & 0x1f);
    // READ BUFFER / WRITE BUFFER echo buffer modes (0Ah, 0Bh).
    let echo =
        matches!(op, 0x3b | 0x3c) && matches!(cdb.get(1).map(|b| b & 0x1f), Some(0x0a | 0x0b));
    let always = matches!(op, 0x12 | 0xa0 | 0x03) || (op == 0xa3 && sa == 0x0a) || echo;
    match state {
        AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => true,
        AccessState::Transitioning => always,
        AccessState::Unavailable | AccessState::Offline => always || (op == 0xa4 && sa == 0x0a),
        AccessState::Standby => {
            always
                || (op == 0xa4 && sa == 0x0a)
                || matches!(
                    op,
                    0x4c | 0x4d | 0x15 | 0x55 | 0x1a | 0x5a | 0x1c | 0x1d | 0x5e | 0x5f
                )
        }
    }
}

/// The sense for a command a state refuses.
fn refusal(state: AccessState) -> Asc {
    match state {
        AccessState::Standby => asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
        AccessState::Unavailable => {
            asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE
        }
        AccessState::Offline => asc::LOGICAL_UNIT_NOT_READY_OFFLINE,
        _ => asc::LOGICAL_UNIT_NOT_ACCESSIBLE_ASYMMETRIC_ACCESS_STATE_TRANSITION,
    }
}

impl Alua {
    /// The state `cfg` starts in (validated by the caller).
    pub fn new(cfg: &AluaConfig) -> Alua {
        let groups: Vec<GroupState> = cfg
            .groups
            .iter()
            .map(|g| GroupState {
                cfg: g.clone(),
                state: g.state,
                status: 0,
                fenced_at: 0,
            })
            .collect();
        let restricted = groups.iter().any(|g| !g.state.is_active());
        Alua {
            explicit: cfg.explicit,
            transition_secs: cfg.transition_secs,
            groups: RwLock::new(groups),
            restricted: AtomicBool::new(restricted),
            transitions: std::sync::atomic::AtomicU64::new(0),
            fences: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// TPGS for the standard INQUIRY data: 01b implicit, 11b with
    /// explicit too.
    pub fn tpgs(&self) -> u8 {
        if self.explicit { 0b11 } else { 0b01 }
    }

    /// SET TARGET PORT GROUPS is honoured.
    pub fn explicit(&self) -> bool {
        self.explicit
    }

    /// The state of target port group `group` (a group the configuration
    /// does not name is Active/Optimized).
    pub fn state(&self, group: u16) -> AccessState {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|g| g.cfg.id == group)
            .map_or(AccessState::ActiveOptimized, |g| g.state)
    }

    /// Groups' state changes so far (each group that changed counts one).
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }

    /// Every configured group and its state.
    pub fn states(&self) -> Vec<(u16, AccessState)> {
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|g| (g.cfg.id, g.state))
            .collect()
    }

    /// The sense for `cdb` arriving through a port of `group`, if the
    /// group's state refuses it (NOT READY, LOGICAL UNIT NOT ACCESSIBLE
    /// …). Costs one atomic load while every group is active.
    pub fn refuses(&self, group: u16, cdb: &[u8]) -> Option<Asc> {
        if !self.restricted.load(Ordering::Acquire) {
            return None;
        }
        let s = self.state(group);
        (!allowed(s, cdb)).then(|| refusal(s))
    }

    /// The fence epoch now: a command admitted now records it, and
    /// [`Alua::fenced_since`] later tells whether its group has been fenced
    /// since. One atomic load.
    pub fn fence_epoch(&self) -> u64 {
        self.fences.load(Ordering::Acquire)
    }

    /// Whether `group` has entered a state that refuses media access since
    /// `epoch` ([`Alua::fence_epoch`]) — whatever its state now: a command
    /// admitted before a cluster member fenced itself must not change the
    /// medium after the member is back. One atomic load while no group
    /// has been fenced since.
    pub fn fenced_since(&self, group: u16, epoch: u64) -> bool {
        if self.fences.load(Ordering::Acquire) == epoch {
            return false;
        }
        self.groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|g| g.cfg.id == group)
            .is_some_and(|g| g.fenced_at > epoch)
    }

    /// An implicit transition of `group` to `state`; true if it changed
    /// (the caller then establishes ASYMMETRIC ACCESS STATE CHANGED for
    /// every I_T nexus). Unknown groups are ignored.
    pub fn transition(&self, group: u16, state: AccessState) -> bool {
        self.change(&[(group, state)], 2)
    }

    fn change(&self, to: &[(u16, AccessState)], status: u8) -> bool {
        let mut gs = self.groups.write().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        for (id, state) in to {
            if let Some(g) = gs.iter_mut().find(|g| g.cfg.id == *id)
                && g.state != *state
            {
                g.state = *state;
                g.status = status;
                changed = true;
                self.transitions.fetch_add(1, Ordering::Relaxed);
                // Transitioning is a passage between two states, not a
                // fence: the commands in flight across it are the state's
                // either side.
                if !state.is_active() && *state != AccessState::Transitioning {
                    g.fenced_at = self.fences.fetch_add(1, Ordering::AcqRel) + 1;
                }
            }
        }
        self.restricted
            .store(gs.iter().any(|g| !g.state.is_active()), Ordering::Release);
        changed
    }

    /// REPORT TARGET PORT GROUPS parameter data (SPC-4 §6.36): the
    /// configured groups, or the arriving port's (`group`, `port`) alone.
    /// `extended`: the extended header with IMPLICIT TRANSITION TIME.
    pub fn report(&self, group: u16, port: u16, extended: bool) -> Vec<u8> {
        let gs = self.groups.read().unwrap_or_else(|p| p.into_inner());
        let mut v = vec![0u8; 4];
        if extended {
            v.extend_from_slice(&[0x10, self.transition_secs, 0, 0]);
        }
        // T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP (Offline is never entered).
        let sup = 0x80 | 0x08 | 0x04 | 0x02 | 0x01;
        let mut desc = |pref: bool, state: AccessState, id: u16, status: u8, ports: &[u16]| {
            v.push(if pref { 0x80 } else { 0 } | state.code());
            v.push(sup);
            v.extend_from_slice(&id.to_be_bytes());
            v.push(0);
            v.push(status);
            v.push(0);
            v.push(ports.len().min(255) as u8);
            for p in ports.iter().take(255) {
                v.extend_from_slice(&[0, 0]);
                v.extend_from_slice(&p.to_be_bytes());
            }
        };
        if gs.is_empty() {
            desc(false, AccessState::ActiveOptimized, group, 0, &[port]);
        } else {
            for g in gs.iter() {
                desc(g.cfg.preferred, g.state, g.cfg.id, g.status, &g.cfg.ports);
            }
        }
        let len = (v.len() - if extended { 8 } else { 4 }) as u32;
        v[0..4].copy_from_slice(&len.to_be_bytes());
        v
    }

    /// SET TARGET PORT GROUPS with parameter list `p` (SPC-4 §6.43):
    /// every descriptor checked before any is applied. Returns whether a
    /// state changed (the caller then establishes ASYMMETRIC ACCESS STATE
    /// CHANGED for every other I_T nexus).
    pub fn set(&self, p: &[u8]) -> Result<bool, Sense> {
        let to = self.parse_set(p)?;
        Ok(self.change(&to, 1))
    }

    /// Explicit transitions decided elsewhere (SET TARGET PORT GROUPS
    /// through another gateway of a cluster): STATUS CODE 01h. Returns
    /// whether a state changed.
    pub fn set_explicit(&self, to: &[(u16, AccessState)]) -> bool {
        self.change(to, 1)
    }

    /// Checks SET TARGET PORT GROUPS parameter list `p` and returns the
    /// transitions it asks for, applying none.
    pub fn parse_set(&self, p: &[u8]) -> Result<Vec<(u16, AccessState)>, Sense> {
        if !self.explicit {
            // The service action is not supported.
            return Err(Sense::illegal_field(
                asc::INVALID_FIELD_IN_CDB,
                true,
                1,
                Some(4),
            ));
        }
        if p.len() < 4 || !(p.len() - 4).is_multiple_of(4) {
            return Err(Sense::new(
                SenseKey::ILLEGAL_REQUEST,
                asc::PARAMETER_LIST_LENGTH_ERROR,
            ));
        }
        let known: Vec<u16> = self
            .groups
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|g| g.cfg.id)
            .collect();
        let mut to = Vec::new();
        for (i, d) in p[4..].chunks_exact(4).enumerate() {
            let at = (4 + i * 4) as u16;
            let state = match AccessState::from_code(d[0] & 0x0f) {
                Some(
                    s @ (AccessState::ActiveOptimized
                    | AccessState::ActiveNonOptimized
                    | AccessState::Standby
                    | AccessState::Unavailable),
                ) => s,
                _ => {
                    return Err(Sense::illegal_field(
                        asc::INVALID_FIELD_IN_PARAMETER_LIST,
                        false,
                        at,
                        Some(3),
                    ));
                }
            };
            let id = u16::from_be_bytes([d[2], d[3]]);
            if !known.contains(&id) || to.iter().any(|(g, _)| *g == id) {
                return Err(Sense::illegal_field(
                    asc::INVALID_FIELD_IN_PARAMETER_LIST,
                    false,
                    at + 2,
                    None,
                ));
            }
            to.push((id, state));
        }
        Ok(to)
    }
}

#[cfg(test)]
mod tests;
