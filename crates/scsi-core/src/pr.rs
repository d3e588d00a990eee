//! Persistent reservations (SPC-4 §5.12): a sans-IO state machine.
//!
//! [`PrState::prout`] applies one PERSISTENT RESERVE OUT service action
//! for an I_T nexus and returns what the logical unit must do next (unit
//! attentions, task aborts, persistence); [`PrState::prin`] builds the
//! PERSISTENT RESERVE IN parameter data; [`PrState::conflicts`] decides
//! RESERVATION CONFLICT for other commands.

use std::io::Write;
use std::path::Path;

use crate::sense::{Asc, Sense, asc};
use crate::task::{ItNexus, TransportId};

pub mod shared;
pub use shared::{HISTORY, PastEffects, ReservationStore, SharedReservations};

/// Reservation types (SPC-4 Table 170).
#[allow(missing_docs)]
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 6;
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 7;
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 8;
}

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
}
fn all_registrants(t: u8) -> bool {
    matches!(t, 7 | 8)
}
fn registrants_type(t: u8) -> bool {
    matches!(t, 5..=8)
}
fn exclusive_access(t: u8) -> bool {
    matches!(t, 3 | 6 | 8)
}

/// An I_T nexus identity: initiator port and target port names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortKey {
    /// Initiator port.
    pub initiator: TransportId,
    /// Target port.
    pub target: TransportId,
}

impl PortKey {
    /// `INITIATOR TARGET` as text (a cluster's store keeps it).
    pub fn to_text(&self) -> String {
        format!("{} {}", tid_text(&self.initiator), tid_text(&self.target))
    }

    /// Parses [`PortKey::to_text`].
    pub fn from_text(s: &str) -> Option<PortKey> {
        let (i, t) = s.split_once(' ')?;
        Some(PortKey {
            initiator: tid_parse(i)?,
            target: tid_parse(t)?,
        })
    }

    /// The identity of a nexus.
    pub fn of(nexus: &ItNexus) -> PortKey {
        PortKey {
            initiator: nexus.initiator().clone(),
            target: nexus.target().id.clone(),
        }
    }
}

/// Which I_T nexuses a unit attention is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UaTarget {
    /// The initiator port.
    pub initiator: TransportId,
    /// One target port, or every target port (ALL_TG_PT registrations).
    pub target: Option<TransportId>,
}

impl UaTarget {
    /// True if `key` is one of the nexuses meant.
    pub fn matches(&self, key: &PortKey) -> bool {
        self.initiator == key.initiator && self.target.as_ref().is_none_or(|t| *t == key.target)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    key: u64,
    initiator: TransportId,
    target: TransportId,
    rel_port: u16,
    all_tg_pt: bool,
}

impl Registration {
    fn matches(&self, nexus: &PortKey) -> bool {
        self.initiator == nexus.initiator && (self.all_tg_pt || self.target == nexus.target)
    }
    fn ua_target(&self) -> UaTarget {
        UaTarget {
            initiator: self.initiator.clone(),
            target: if self.all_tg_pt {
                None
            } else {
                Some(self.target.clone())
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    /// Index-free identity of the holder's registration.
    holder: PortKey,
    pr_type: u8,
}

/// Command classes for reservation conflicts (SPC-4 §5.12.1 tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Allowed under every reservation.
    Always,
    /// Reads the medium or its state: conflicts under EXCLUSIVE ACCESS types.
    Read,
    /// Changes the medium or the LU: conflicts under every type.
    Write,
}

/// Why a PERSISTENT RESERVE OUT was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrRefusal {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

/// What a successful PERSISTENT RESERVE OUT asks of the logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrEffects {
    /// Unit attentions to establish.
    pub unit_attentions: Vec<(UaTarget, Asc)>,
    /// Nexuses whose tasks PREEMPT AND ABORT aborts.
    pub abort: Vec<UaTarget>,
    /// The state must be written to the APTPL file (or it be removed).
    pub persist: bool,
}

/// Persistent reservation state of one logical unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrState {
    generation: u32,
    regs: Vec<Registration>,
    reservation: Option<Reservation>,
    aptpl: bool,
}

fn field(byte: u16, bit: Option<u8>) -> PrRefusal {
    PrRefusal::Check(Sense::illegal_field(
        asc::INVALID_FIELD_IN_PARAMETER_LIST,
        false,
        byte,
        bit,
    ))
}
fn cdb_field(byte: u16, bit: Option<u8>) -> PrRefusal {
    PrRefusal::Check(Sense::illegal_field(
        asc::INVALID_FIELD_IN_CDB,
        true,
        byte,
        bit,
    ))
}
/// Registrations one logical unit keeps at most. Each I_T nexus may
/// register itself, and with SPEC_I_PT a REGISTER names any number of
/// other initiator ports; unregistering only removes the caller's own
/// registration, so without a limit a peer could register, unregister and
/// register a new list again and again, growing the state (and the APTPL
/// file) without bound. Past it, a registration is refused with
/// INSUFFICIENT REGISTRATION RESOURCES, as SPC-4 (§5.14.7) provides, and
/// nothing changes. A cluster of 64 hosts with 8 paths each needs 512.
pub const MAX_REGISTRATIONS: usize = 1024;

fn no_room() -> PrRefusal {
    PrRefusal::Check(Sense::new(
        crate::SenseKey::ILLEGAL_REQUEST,
        asc::INSUFFICIENT_REGISTRATION_RESOURCES,
    ))
}

fn param_len_error() -> PrRefusal {
    PrRefusal::Check(Sense::new(
        crate::SenseKey::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    ))
}

fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| <[u8; 8]>::try_from(s).ok())
        .map_or(0, u64::from_be_bytes)
}
fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map_or(0, u32::from_be_bytes)
}
fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| <[u8; 2]>::try_from(s).ok())
        .map_or(0, u16::from_be_bytes)
}

/// Encodes a TransportID (SPC-4 §7.6.4): FC format 00b, iSCSI format 00b
/// (device name) or 01b (port name with ISID).
pub fn encode_transport_id(id: &TransportId, out: &mut Vec<u8>) {
    match id {
        TransportId::Fcp { wwpn } => {
            out.push(0x00);
            out.extend_from_slice(&[0; 7]);
            out.extend_from_slice(&wwpn.to_be_bytes());
            out.extend_from_slice(&[0; 8]);
        }
        TransportId::Iscsi { name, isid } => {
            let mut s = name.clone();
            let fmt = match isid {
                Some(i) => {
                    s.push_str(",i,0x");
                    for b in i {
                        s.push_str(&format!("{b:02x}"));
                    }
                    0x40
                }
                None => 0x00,
            };
            let mut len = s.len() + 1;
            len = len.div_ceil(4) * 4;
            len = len.max(20);
            out.push(fmt | 0x05);
            out.push(0);
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
            out.resize(out.len() + (len - s.len()), 0);
        }
    }
}

/// Decodes one TransportID at the start of `b`, returning it and its
/// length; `None` if malformed or of an unsupported protocol.
pub fn decode_transport_id(b: &[u8]) -> Option<(TransportId, usize)> {
    let first = *b.first()?;
    match (first >> 6, first & 0x0f) {
        (0, 0x0) => {
            let wwpn = b.get(8..16)?;
            let wwpn = u64::from_be_bytes(<[u8; 8]>::try_from(wwpn).ok()?);
            Some((TransportId::Fcp { wwpn }, 24))
        }
        (fmt @ (0 | 1), 0x5) => {
            let len = usize::from(be16(b, 2));
            let body = b.get(4..4 + len)?;
            let end = body.iter().position(|&c| c == 0).unwrap_or(body.len());
            let text = std::str::from_utf8(body.get(..end)?).ok()?;
            let id = if fmt == 1 {
                let (name, rest) = text
                    .split_once(",i,0x")
                    .or_else(|| text.split_once(",I,0X"))?;
                if rest.len() != 12 {
                    return None;
                }
                let mut isid = [0u8; 6];
                for (i, v) in isid.iter_mut().enumerate() {
                    *v = u8::from_str_radix(rest.get(2 * i..2 * i + 2)?, 16).ok()?;
                }
                TransportId::Iscsi {
                    name: name.to_string(),
                    isid: Some(isid),
                }
            } else {
                TransportId::Iscsi {
                    name: text.to_string(),
                    isid: None,
                }
            };
            Some((id, 4 + len))
        }
        _ => None,
    }
}

/// A TransportID given without an ISID names every port of the device.
fn tid_matches(given: &TransportId, port: &TransportId) -> bool {
    match (given, port) {
        (TransportId::Iscsi { isid: None, .. }, _) => given.same_device(port),
        _ => given == port,
    }
}

impl PrState {
    /// Empty state (no registrations).
    pub fn new() -> PrState {
        PrState::default()
    }

    /// PRgeneration.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// True if any registration or reservation exists.
    pub fn is_active(&self) -> bool {
        !self.regs.is_empty() || self.reservation.is_some()
    }

    /// True if a persistent reservation exists.
    pub fn is_reserved(&self) -> bool {
        self.reservation.is_some()
    }

    /// APTPL is in effect.
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }

    /// The persistent reservation, if one is held: its TYPE, the holder's
    /// I_T nexus and the holder's reservation key, and how many
    /// registrations there are.
    pub fn holder(&self) -> Option<(u8, PortKey, u64, usize)> {
        let r = self.reservation.as_ref()?;
        let key = self.reg_of(&r.holder).map_or(0, |i| self.regs[i].key);
        Some((r.pr_type, r.holder.clone(), key, self.regs.len()))
    }

    /// Registrations held.
    pub fn registrations(&self) -> usize {
        self.regs.len()
    }

    fn reg_of(&self, nexus: &PortKey) -> Option<usize> {
        self.regs.iter().position(|r| r.matches(nexus))
    }

    fn is_holder(&self, nexus: &PortKey) -> bool {
        match &self.reservation {
            None => false,
            Some(r) if all_registrants(r.pr_type) => self.reg_of(nexus).is_some(),
            Some(r) => r.holder == *nexus,
        }
    }

    /// Would a command of this class from `nexus` meet RESERVATION CONFLICT?
    pub fn conflicts(&self, nexus: &PortKey, access: Access) -> bool {
        let Some(res) = &self.reservation else {
            return false;
        };
        if access == Access::Always || self.is_holder(nexus) {
            return false;
        }
        if registrants_type(res.pr_type) && self.reg_of(nexus).is_some() {
            return false;
        }
        match access {
            Access::Always => false,
            Access::Read => exclusive_access(res.pr_type),
            Access::Write => true,
        }
    }

    /// Removes registration `idx`; releases the reservation if it held it.
    fn unregister(&mut self, idx: usize, fx: &mut PrEffects) {
        if idx >= self.regs.len() {
            return;
        }
        let reg = self.regs.remove(idx);
        let Some(res) = self.reservation.clone() else {
            return;
        };
        let releases = if all_registrants(res.pr_type) {
            self.regs.is_empty()
        } else {
            res.holder.initiator == reg.initiator
                && (reg.all_tg_pt || res.holder.target == reg.target)
        };
        if releases {
            self.reservation = None;
            if registrants_type(res.pr_type) {
                for r in &self.regs {
                    fx.unit_attentions
                        .push((r.ua_target(), asc::RESERVATIONS_RELEASED));
                }
            }
        }
    }

    /// Applies PERSISTENT RESERVE OUT.
    #[allow(clippy::too_many_arguments)]
    pub fn prout(
        &mut self,
        nexus: &ItNexus,
        service_action: u8,
        scope: u8,
        pr_type: u8,
        param_len: u32,
        params: &[u8],
        aptpl_capable: bool,
    ) -> Result<PrEffects, PrRefusal> {
        let me = PortKey::of(nexus);
        let mut fx = PrEffects::default();
        if service_action > 7 {
            return Err(cdb_field(1, Some(4)));
        }
        if params.len() < param_len as usize {
            return Err(param_len_error());
        }
        let params = params.get(..param_len as usize).unwrap_or(params);
        if service_action == 7 {
            return self.register_and_move(&me, nexus, scope, pr_type, params, aptpl_capable);
        }
        if params.len() < 24 {
            return Err(param_len_error());
        }
        let rk = be64(params, 0);
        let sark = be64(params, 8);
        let flags = params.get(20).copied().unwrap_or(0);
        let (spec_i_pt, all_tg_pt, aptpl) =
            (flags & 0x08 != 0, flags & 0x04 != 0, flags & 0x01 != 0);
        if flags & 0xf2 != 0 {
            return Err(field(20, None));
        }
        if !spec_i_pt && params.len() != 24 {
            return Err(param_len_error());
        }
        if aptpl && !aptpl_capable {
            return Err(field(20, Some(0)));
        }
        let mine = self.reg_of(&me);
        match service_action {
            // REGISTER / REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                let ignore = service_action == 6;
                if spec_i_pt && (ignore || mine.is_some()) {
                    return Err(field(20, Some(3)));
                }
                if !ignore {
                    let current = mine.and_then(|i| self.regs.get(i)).map_or(0, |r| r.key);
                    if rk != current {
                        return Err(PrRefusal::Conflict);
                    }
                }
                match mine {
                    None if sark == 0 => return Ok(fx),
                    None => {
                        let mut new = vec![Registration {
                            key: sark,
                            initiator: me.initiator.clone(),
                            target: me.target.clone(),
                            rel_port: nexus.target().relative_port_id,
                            all_tg_pt,
                        }];
                        if spec_i_pt {
                            let len = be32(params, 24) as usize;
                            let list = params.get(28..28 + len).ok_or_else(param_len_error)?;
                            let mut at = 0;
                            while at < list.len() {
                                let (tid, n) = list
                                    .get(at..)
                                    .and_then(decode_transport_id)
                                    .ok_or_else(|| field((28 + at) as u16, None))?;
                                if tid_matches(&tid, &me.initiator) {
                                    return Err(field((28 + at) as u16, None));
                                }
                                if !new.iter().any(|r| r.initiator == tid) {
                                    if self.regs.len() + new.len() >= MAX_REGISTRATIONS {
                                        return Err(no_room());
                                    }
                                    new.push(Registration {
                                        key: sark,
                                        initiator: tid,
                                        target: me.target.clone(),
                                        rel_port: nexus.target().relative_port_id,
                                        all_tg_pt,
                                    });
                                }
                                at += n;
                            }
                        }
                        if self.regs.len() + new.len() > MAX_REGISTRATIONS {
                            return Err(no_room());
                        }
                        for r in &new {
                            if self.regs.iter().any(|x| {
                                x.initiator == r.initiator && (x.target == r.target || x.all_tg_pt)
                            }) && r.initiator != me.initiator
                            {
                                return Err(field(24, None));
                            }
                        }
                        self.regs.extend(new);
                    }
                    Some(i) if sark == 0 => self.unregister(i, &mut fx),
                    Some(i) => {
                        if let Some(r) = self.regs.get_mut(i) {
                            r.key = sark;
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
                self.aptpl = aptpl;
                fx.persist = true;
                Ok(fx)
            }
            // RESERVE
            1 => {
                let reg = mine
                    .and_then(|i| self.regs.get(i))
                    .ok_or(PrRefusal::Conflict)?;
                if reg.key != rk {
                    return Err(PrRefusal::Conflict);
                }
                if scope != 0 {
                    return Err(cdb_field(2, Some(7)));
                }
                if !valid_type(pr_type) {
                    return Err(cdb_field(2, Some(3)));
                }
                match &self.reservation {
                    Some(r) if self.is_holder(&me) => {
                        if r.pr_type != pr_type {
                            return Err(PrRefusal::Conflict);
                        }
                    }
                    Some(_) => return Err(PrRefusal::Conflict),
                    None => {
                        self.reservation = Some(Reservation {
                            holder: me,
                            pr_type,
                        });
                        fx.persist = true;
                    }
                }
                Ok(fx)
            }
            // RELEASE
            2 => {
                let reg = mine
                    .and_then(|i| self.regs.get(i))
                    .ok_or(PrRefusal::Conflict)?;
                if reg.key != rk {
                    return Err(PrRefusal::Conflict);
                }
                let Some(res) = self.reservation.clone() else {
                    return Ok(fx);
                };
                if !self.is_holder(&me) {
                    return Ok(fx);
                }
                if scope != 0 || res.pr_type != pr_type {
                    return Err(PrRefusal::Check(Sense::new(
                        crate::SenseKey::ILLEGAL_REQUEST,
                        asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
                    )));
                }
                self.reservation = None;
                if registrants_type(res.pr_type) {
                    for r in &self.regs {
                        if !r.matches(&me) {
                            fx.unit_attentions
                                .push((r.ua_target(), asc::RESERVATIONS_RELEASED));
                        }
                    }
                }
                fx.persist = true;
                Ok(fx)
            }
            // CLEAR
            3 => {
                let reg = mine
                    .and_then(|i| self.regs.get(i))
                    .ok_or(PrRefusal::Conflict)?;
                if reg.key != rk {
                    return Err(PrRefusal::Conflict);
                }
                for r in &self.regs {
                    if !r.matches(&me) {
                        fx.unit_attentions
                            .push((r.ua_target(), asc::RESERVATIONS_PREEMPTED));
                    }
                }
                self.regs.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
                fx.persist = true;
                Ok(fx)
            }
            // PREEMPT / PREEMPT AND ABORT
            4 | 5 => {
                let abort = service_action == 5;
                let reg = mine
                    .and_then(|i| self.regs.get(i))
                    .ok_or(PrRefusal::Conflict)?;
                if reg.key != rk {
                    return Err(PrRefusal::Conflict);
                }
                let res = self.reservation.clone();
                let preempting_holder = match &res {
                    Some(r) if all_registrants(r.pr_type) => sark == 0,
                    Some(r) => self
                        .reg_of(&r.holder)
                        .and_then(|i| self.regs.get(i))
                        .is_some_and(|h| h.key == sark),
                    None => false,
                };
                if preempting_holder {
                    if scope != 0 {
                        return Err(cdb_field(2, Some(7)));
                    }
                    if !valid_type(pr_type) {
                        return Err(cdb_field(2, Some(3)));
                    }
                } else if sark == 0 {
                    return Err(field(8, None));
                }
                let removed: Vec<Registration> = self
                    .regs
                    .iter()
                    .filter(|r| {
                        !r.matches(&me)
                            && (r.key == sark
                                || (preempting_holder
                                    && res.as_ref().is_some_and(|x| all_registrants(x.pr_type))))
                    })
                    .cloned()
                    .collect();
                if removed.is_empty() && !preempting_holder {
                    return Err(PrRefusal::Conflict);
                }
                self.regs.retain(|r| !removed.contains(r));
                for r in &removed {
                    fx.unit_attentions
                        .push((r.ua_target(), asc::REGISTRATIONS_PREEMPTED));
                    if abort {
                        fx.abort.push(r.ua_target());
                    }
                }
                if preempting_holder {
                    let changed = res.as_ref().is_some_and(|r| r.pr_type != pr_type);
                    self.reservation = Some(Reservation {
                        holder: me.clone(),
                        pr_type,
                    });
                    if changed {
                        for r in &self.regs {
                            if !r.matches(&me) {
                                fx.unit_attentions
                                    .push((r.ua_target(), asc::RESERVATIONS_RELEASED));
                            }
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
                fx.persist = true;
                Ok(fx)
            }
            _ => Err(cdb_field(1, Some(4))),
        }
    }

    fn register_and_move(
        &mut self,
        me: &PortKey,
        nexus: &ItNexus,
        scope: u8,
        pr_type: u8,
        params: &[u8],
        aptpl_capable: bool,
    ) -> Result<PrEffects, PrRefusal> {
        let mut fx = PrEffects::default();
        if params.len() < 24 {
            return Err(param_len_error());
        }
        let rk = be64(params, 0);
        let sark = be64(params, 8);
        let flags = params.get(17).copied().unwrap_or(0);
        let (unreg, aptpl) = (flags & 0x02 != 0, flags & 0x01 != 0);
        let rel_port = be16(params, 18);
        let tid_len = be32(params, 20) as usize;
        let mine = self.reg_of(me).ok_or(PrRefusal::Conflict)?;
        if self.regs.get(mine).map(|r| r.key) != Some(rk) {
            return Err(PrRefusal::Conflict);
        }
        let Some(res) = self.reservation.clone() else {
            return Err(PrRefusal::Conflict);
        };
        if all_registrants(res.pr_type) || res.holder != *me {
            return Err(PrRefusal::Conflict);
        }
        if aptpl && !aptpl_capable {
            return Err(field(17, Some(0)));
        }
        if sark == 0 {
            return Err(field(8, None));
        }
        if scope != 0 || !valid_type(pr_type) {
            return Err(cdb_field(2, None));
        }
        let list = params.get(24..24 + tid_len).ok_or_else(param_len_error)?;
        let (dest, _) = decode_transport_id(list).ok_or_else(|| field(24, None))?;
        if dest == me.initiator || matches!(dest, TransportId::Iscsi { isid: None, .. }) {
            return Err(field(24, None));
        }
        // The destination nexus goes through the target port with the
        // given relative id; unifab only knows the requester's port, so
        // that id must name it.
        if rel_port != nexus.target().relative_port_id {
            return Err(field(18, None));
        }
        let dest_key = PortKey {
            initiator: dest.clone(),
            target: me.target.clone(),
        };
        // A new registration for the destination needs room, unless the
        // requester's own goes (UNREG) in the same step.
        if self.reg_of(&dest_key).is_none() && !unreg && self.regs.len() >= MAX_REGISTRATIONS {
            return Err(no_room());
        }
        match self.reg_of(&dest_key) {
            Some(i) => {
                if let Some(r) = self.regs.get_mut(i) {
                    r.key = sark;
                }
            }
            None => self.regs.push(Registration {
                key: sark,
                initiator: dest,
                target: me.target.clone(),
                rel_port,
                all_tg_pt: false,
            }),
        }
        self.reservation = Some(Reservation {
            holder: dest_key,
            pr_type,
        });
        if unreg && let Some(i) = self.reg_of(me) {
            self.regs.remove(i);
        }
        self.generation = self.generation.wrapping_add(1);
        self.aptpl = aptpl;
        fx.persist = true;
        Ok(fx)
    }

    /// PERSISTENT RESERVE IN parameter data (untruncated); `None` for an
    /// unsupported service action.
    pub fn prin(&self, service_action: u8, aptpl_capable: bool) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(64);
        match service_action {
            0 => {
                out.extend_from_slice(&self.generation.to_be_bytes());
                out.extend_from_slice(&((self.regs.len() * 8) as u32).to_be_bytes());
                for r in &self.regs {
                    out.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            1 => {
                out.extend_from_slice(&self.generation.to_be_bytes());
                match &self.reservation {
                    None => out.extend_from_slice(&0u32.to_be_bytes()),
                    Some(res) => {
                        out.extend_from_slice(&16u32.to_be_bytes());
                        let key = if all_registrants(res.pr_type) {
                            0
                        } else {
                            self.reg_of(&res.holder)
                                .and_then(|i| self.regs.get(i))
                                .map_or(0, |r| r.key)
                        };
                        out.extend_from_slice(&key.to_be_bytes());
                        out.extend_from_slice(&[0; 4]);
                        out.push(0);
                        out.push(res.pr_type & 0x0f);
                        out.extend_from_slice(&[0; 2]);
                    }
                }
            }
            2 => {
                out.extend_from_slice(&8u16.to_be_bytes());
                // CRH=0, SIP_C, ATP_C, PTPL_C
                out.push(0x08 | 0x04 | u8::from(aptpl_capable));
                // TMV, ALLOW COMMANDS = 001b (per the conflict tables), PTPL_A
                out.push(0x80 | (1 << 4) | u8::from(self.aptpl));
                // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX | EX_AC_AR
                out.push(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
                out.push(0x01);
                out.extend_from_slice(&[0; 2]);
            }
            3 => {
                let mut body = Vec::new();
                for r in &self.regs {
                    let holder = match &self.reservation {
                        Some(res) if all_registrants(res.pr_type) => true,
                        Some(res) => r.matches(&res.holder),
                        None => false,
                    };
                    body.extend_from_slice(&r.key.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    body.push(u8::from(r.all_tg_pt) << 1 | u8::from(holder));
                    body.push(if holder {
                        self.reservation.as_ref().map_or(0, |x| x.pr_type & 0x0f)
                    } else {
                        0
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&r.rel_port.to_be_bytes());
                    let mut tid = Vec::new();
                    encode_transport_id(&r.initiator, &mut tid);
                    body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    body.extend_from_slice(&tid);
                }
                out.extend_from_slice(&self.generation.to_be_bytes());
                out.extend_from_slice(&(body.len() as u32).to_be_bytes());
                out.extend_from_slice(&body);
            }
            _ => return None,
        }
        Some(out)
    }

    /// Releases everything a LOGICAL UNIT RESET leaves in place: nothing
    /// (persistent reservations survive resets). Provided for symmetry.
    pub fn on_reset(&mut self) {}

    #[cfg(test)]
    pub(crate) fn set_aptpl_for_test(&mut self, on: bool) {
        self.aptpl = on;
    }

    /// Serializes the state (the APTPL file, a cluster's store).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "unifab-pr 1\ngeneration {}\naptpl {}\n",
            self.generation,
            u8::from(self.aptpl)
        );
        for r in &self.regs {
            s.push_str(&format!(
                "reg {:016x} {} {} {} {}\n",
                r.key,
                u8::from(r.all_tg_pt),
                r.rel_port,
                tid_text(&r.initiator),
                tid_text(&r.target)
            ));
        }
        if let Some(res) = &self.reservation {
            s.push_str(&format!(
                "res {} {} {}\n",
                res.pr_type,
                tid_text(&res.holder.initiator),
                tid_text(&res.holder.target)
            ));
        }
        s
    }

    /// Parses [`PrState::to_text`] output; APTPL is on for loaded state.
    pub fn from_text(text: &str) -> Option<PrState> {
        let mut lines = text.lines();
        if lines.next()? != "unifab-pr 1" {
            return None;
        }
        let mut st = PrState {
            aptpl: true,
            ..PrState::default()
        };
        for line in lines {
            let mut w = line.split(' ');
            match w.next()? {
                "generation" => st.generation = w.next()?.parse().ok()?,
                "aptpl" => st.aptpl = w.next()? == "1",
                "reg" => st.regs.push(Registration {
                    key: u64::from_str_radix(w.next()?, 16).ok()?,
                    all_tg_pt: w.next()? == "1",
                    rel_port: w.next()?.parse().ok()?,
                    initiator: tid_parse(w.next()?)?,
                    target: tid_parse(w.next()?)?,
                }),
                "res" => {
                    st.reservation = Some(Reservation {
                        pr_type: w.next()?.parse().ok()?,
                        holder: PortKey {
                            initiator: tid_parse(w.next()?)?,
                            target: tid_parse(w.next()?)?,
                        },
                    })
                }
                "" => {}
                _ => return None,
            }
        }
        Some(st)
    }

    /// Writes the APTPL file atomically (temp file, fsync, rename, fsync
    /// of the directory), or removes it when APTPL is off.
    pub fn persist(&self, path: &Path) -> std::io::Result<()> {
        if !self.aptpl {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let tmp = path.with_extension("tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.to_text().as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// `fc:WWPN`, `iscsi:HEXNAME` or `iscsi:HEXNAME:ISID`.
fn tid_text(t: &TransportId) -> String {
    match t {
        TransportId::Fcp { wwpn } => format!("fc:{wwpn:016x}"),
        TransportId::Iscsi { name, isid: None } => format!("iscsi:{}", hex(name.as_bytes())),
        TransportId::Iscsi {
            name,
            isid: Some(i),
        } => format!("iscsi:{}:{}", hex(name.as_bytes()), hex(i)),
    }
}
fn tid_parse(s: &str) -> Option<TransportId> {
    let mut p = s.split(':');
    match p.next()? {
        "fc" => Some(TransportId::Fcp {
            wwpn: u64::from_str_radix(p.next()?, 16).ok()?,
        }),
        "iscsi" => {
            let name = String::from_utf8(unhex(p.next()?)?).ok()?;
            let isid = match p.next() {
                None => None,
                Some(h) => Some(<[u8; 6]>::try_from(unhex(h)?).ok()?),
            };
            Some(TransportId::Iscsi { name, isid })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TargetPort;

    fn nexus(init: &str) -> ItNexus {
        ItNexus::new(
            TransportId::Iscsi {
                name: init.into(),
                isid: Some([0x40, 0, 0, 0, 0, 1]),
            },
            TargetPort {
                id: TransportId::Iscsi {
                    name: "iqn.t,t,0x1".into(),
                    isid: None,
                },
                relative_port_id: 1,
                port_group: 1,
            },
        )
    }

    fn params(rk: u64, sark: u64, flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&rk.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        p[20] = flags;
        p
    }

    fn out(
        st: &mut PrState,
        n: &ItNexus,
        sa: u8,
        ty: u8,
        p: &[u8],
    ) -> Result<PrEffects, PrRefusal> {
        st.prout(n, sa, 0, ty, p.len() as u32, p, true)
    }

    #[test]
    fn register_reserve_release_and_generation() {
        let mut st = PrState::new();
        let a = nexus("a");
        out(&mut st, &a, 6, 0, &params(0, 0xaa, 0)).unwrap();
        assert_eq!(st.generation(), 1);
        // Re-register with the wrong key conflicts.
        assert_eq!(
            out(&mut st, &a, 0, 0, &params(0, 0xab, 0)),
            Err(PrRefusal::Conflict)
        );
        out(&mut st, &a, 1, 3, &params(0xaa, 0, 0)).unwrap();
        assert_eq!(st.generation(), 1, "RESERVE does not bump");
        let rr = st.prin(1, true).unwrap();
        assert_eq!(&rr[8..16], &0xaau64.to_be_bytes());
        assert_eq!(rr[21], 3);
        // Wrong type on RELEASE.
        assert!(matches!(
            out(&mut st, &a, 2, 1, &params(0xaa, 0, 0)),
            Err(PrRefusal::Check(s)) if s.asc == asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION
        ));
        out(&mut st, &a, 2, 3, &params(0xaa, 0, 0)).unwrap();
        assert!(!st.is_reserved());
        // Unregister.
        out(&mut st, &a, 0, 0, &params(0xaa, 0, 0)).unwrap();
        assert!(!st.is_active());
        assert_eq!(st.generation(), 2);
    }

    #[test]
    fn access_per_type() {
        // (type, reg can read, reg can write, unreg can read, unreg can write)
        let table = [
            (3, false, false, false, false),
            (1, true, false, true, false),
            (6, true, true, false, false),
            (5, true, true, true, false),
            (8, true, true, false, false),
            (7, true, true, true, false),
        ];
        for (ty, rr, rw, ur, uw) in table {
            let mut st = PrState::new();
            let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
            out(&mut st, &a, 6, 0, &params(0, 1, 0)).unwrap();
            out(&mut st, &b, 6, 0, &params(0, 2, 0)).unwrap();
            out(&mut st, &a, 1, ty, &params(1, 0, 0)).unwrap();
            let (kb, kc) = (PortKey::of(&b), PortKey::of(&c));
            assert_eq!(!st.conflicts(&kb, Access::Read), rr, "type {ty}");
            assert_eq!(!st.conflicts(&kb, Access::Write), rw, "type {ty}");
            assert_eq!(!st.conflicts(&kc, Access::Read), ur, "type {ty}");
            assert_eq!(!st.conflicts(&kc, Access::Write), uw, "type {ty}");
            assert!(!st.conflicts(&PortKey::of(&a), Access::Write));
            assert!(!st.conflicts(&kc, Access::Always));
        }
    }

    #[test]
    fn unregistering_holder_releases_unless_all_registrants() {
        for (ty, shared) in [(3, false), (5, false), (7, true), (8, true)] {
            let mut st = PrState::new();
            let (a, b) = (nexus("a"), nexus("b"));
            out(&mut st, &a, 6, 0, &params(0, 1, 0)).unwrap();
            out(&mut st, &b, 6, 0, &params(0, 2, 0)).unwrap();
            out(&mut st, &a, 1, ty, &params(1, 0, 0)).unwrap();
            let fx = out(&mut st, &a, 0, 0, &params(1, 0, 0)).unwrap();
            assert_eq!(st.is_reserved(), shared, "type {ty}");
            let ua = fx
                .unit_attentions
                .iter()
                .any(|(t, a)| t.matches(&PortKey::of(&b)) && *a == asc::RESERVATIONS_RELEASED);
            assert_eq!(ua, ty == 5, "type {ty}");
        }
    }

    #[test]
    fn preempt_removes_registration_and_signals() {
        let mut st = PrState::new();
        let (a, b) = (nexus("a"), nexus("b"));
        out(&mut st, &a, 6, 0, &params(0, 1, 0)).unwrap();
        out(&mut st, &b, 6, 0, &params(0, 2, 0)).unwrap();
        let g = st.generation();
        let fx = out(&mut st, &b, 5, 3, &params(2, 1, 0)).unwrap();
        assert_eq!(st.generation(), g + 1);
        assert_eq!(st.prin(0, true).unwrap().len(), 16);
        assert!(
            fx.unit_attentions
                .iter()
                .any(|(t, x)| t.matches(&PortKey::of(&a)) && *x == asc::REGISTRATIONS_PREEMPTED)
        );
        assert_eq!(fx.abort.len(), 1);
        // Preempting a key nobody holds conflicts; SARK 0 without a
        // reservation is an invalid field.
        assert_eq!(
            out(&mut st, &b, 4, 3, &params(2, 9, 0)),
            Err(PrRefusal::Conflict)
        );
        assert!(matches!(
            out(&mut st, &b, 4, 3, &params(2, 0, 0)),
            Err(PrRefusal::Check(_))
        ));
        // Preempting the holder takes over its reservation.
        out(&mut st, &a, 6, 0, &params(0, 1, 0)).unwrap();
        out(&mut st, &a, 1, 1, &params(1, 0, 0)).unwrap();
        out(&mut st, &b, 4, 3, &params(2, 1, 0)).unwrap();
        let rr = st.prin(1, true).unwrap();
        assert_eq!(&rr[8..16], &2u64.to_be_bytes());
        assert_eq!(rr[21], 3);
    }

    #[test]
    fn clear_and_read_full_status() {
        let mut st = PrState::new();
        let (a, b) = (nexus("a"), nexus("b"));
        out(&mut st, &a, 6, 0, &params(0, 1, 0x04)).unwrap();
        out(&mut st, &b, 6, 0, &params(0, 2, 0)).unwrap();
        out(&mut st, &a, 1, 1, &params(1, 0, 0)).unwrap();
        let fs = st.prin(3, true).unwrap();
        let len = u32::from_be_bytes([fs[4], fs[5], fs[6], fs[7]]) as usize;
        assert_eq!(fs.len(), 8 + len);
        // First descriptor: key 1, ALL_TG_PT and R_HOLDER, type 1.
        assert_eq!(&fs[8..16], &1u64.to_be_bytes());
        assert_eq!(fs[20], 0x03);
        assert_eq!(fs[21], 1);
        let (tid, _) = decode_transport_id(&fs[32..]).unwrap();
        assert_eq!(&tid, a.initiator());
        let fx = out(&mut st, &a, 3, 0, &params(1, 0, 0)).unwrap();
        assert!(!st.is_active());
        assert_eq!(fx.unit_attentions.len(), 1);
    }

    #[test]
    fn spec_i_pt_and_register_and_move() {
        let mut st = PrState::new();
        let (a, b) = (nexus("a"), nexus("b"));
        let mut p = params(0, 7, 0x08);
        let mut tid = Vec::new();
        encode_transport_id(b.initiator(), &mut tid);
        p.extend_from_slice(&(tid.len() as u32).to_be_bytes());
        p.extend_from_slice(&tid);
        out(&mut st, &a, 0, 0, &p).unwrap();
        assert_eq!(st.prin(0, true).unwrap().len(), 8 + 16);
        // b is registered through SPEC_I_PT and may reserve.
        out(&mut st, &b, 1, 1, &params(7, 0, 0)).unwrap();
        // b moves its reservation to c.
        let c = nexus("c");
        let mut m = vec![0u8; 24];
        m[0..8].copy_from_slice(&7u64.to_be_bytes());
        m[8..16].copy_from_slice(&9u64.to_be_bytes());
        m[17] = 0x02; // UNREG
        m[18..20].copy_from_slice(&1u16.to_be_bytes());
        let mut tid = Vec::new();
        encode_transport_id(c.initiator(), &mut tid);
        m[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
        m.extend_from_slice(&tid);
        out(&mut st, &b, 7, 1, &m).unwrap();
        assert!(st.is_holder(&PortKey::of(&c)));
        assert!(st.reg_of(&PortKey::of(&b)).is_none());
    }

    /// Registrations are bounded: a SPEC_I_PT list, or a REGISTER AND
    /// MOVE, that would pass `MAX_REGISTRATIONS` is refused with
    /// INSUFFICIENT REGISTRATION RESOURCES and changes nothing; once one
    /// goes, there is room again.
    #[test]
    fn registrations_are_bounded() {
        fn tids(names: impl Iterator<Item = String>) -> Vec<u8> {
            let mut tid = Vec::new();
            for n in names {
                encode_transport_id(nexus(&n).initiator(), &mut tid);
            }
            tid
        }
        fn spec(key: u64, tid: &[u8]) -> Vec<u8> {
            let mut p = params(0, key, 0x08);
            p.extend_from_slice(&(tid.len() as u32).to_be_bytes());
            p.extend_from_slice(tid);
            p
        }
        let no_room = |r: Result<PrEffects, PrRefusal>| {
            matches!(r, Err(PrRefusal::Check(s))
                if s.key == crate::SenseKey::ILLEGAL_REQUEST
                    && s.asc == asc::INSUFFICIENT_REGISTRATION_RESOURCES)
        };
        let mut st = PrState::new();
        // a registers itself and MAX - 2 others: one slot left.
        let a = nexus("a");
        let others = tids((0..MAX_REGISTRATIONS - 2).map(|i| format!("x{i}")));
        out(&mut st, &a, 0, 0, &spec(1, &others)).unwrap();
        assert_eq!(st.regs.len(), MAX_REGISTRATIONS - 1);
        let before = st.clone();

        // b with two more does not fit, and nothing changes.
        let b = nexus("b");
        let two = tids(["y0".to_string()].into_iter());
        assert!(no_room(out(&mut st, &b, 0, 0, &spec(2, &two))));
        assert_eq!(st, before);
        // A list far past the limit is refused the same way.
        let many = tids((0..3 * MAX_REGISTRATIONS).map(|i| format!("z{i}")));
        assert!(no_room(out(&mut st, &b, 0, 0, &spec(2, &many))));
        assert_eq!(st, before);
        // b alone fits: the last slot.
        out(&mut st, &b, 0, 0, &params(0, 2, 0)).unwrap();
        assert_eq!(st.regs.len(), MAX_REGISTRATIONS);
        let c = nexus("c");
        assert!(no_room(out(&mut st, &c, 6, 0, &params(0, 3, 0))));

        // b reserves and moves its reservation to c: no room for c's
        // registration while b keeps its own, room when b's goes.
        out(&mut st, &b, 1, 1, &params(2, 0, 0)).unwrap();
        let mut m = vec![0u8; 24];
        m[0..8].copy_from_slice(&2u64.to_be_bytes());
        m[8..16].copy_from_slice(&9u64.to_be_bytes());
        m[18..20].copy_from_slice(&1u16.to_be_bytes());
        let tid = tids(["c".to_string()].into_iter());
        m[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
        m.extend_from_slice(&tid);
        let full = st.clone();
        assert!(no_room(out(&mut st, &b, 7, 1, &m)));
        assert_eq!(st, full);
        m[17] = 0x02; // UNREG
        out(&mut st, &b, 7, 1, &m).unwrap();
        assert!(st.is_holder(&PortKey::of(&c)));
        assert_eq!(st.regs.len(), MAX_REGISTRATIONS);

        // Unregistering frees a slot for someone else.
        out(&mut st, &a, 0, 0, &params(1, 0, 0)).unwrap();
        out(&mut st, &nexus("d"), 6, 0, &params(0, 4, 0)).unwrap();
        assert_eq!(st.regs.len(), MAX_REGISTRATIONS);
    }

    #[test]
    fn text_round_trip_and_persist() {
        let mut st = PrState::new();
        let a = nexus("a");
        out(&mut st, &a, 6, 0, &params(0, 5, 0x01)).unwrap();
        out(&mut st, &a, 1, 6, &params(5, 0, 0)).unwrap();
        assert!(st.aptpl());
        let back = PrState::from_text(&st.to_text()).unwrap();
        assert_eq!(back, st);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pr");
        st.persist(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(PrState::from_text(&text).unwrap(), st);
        // APTPL off removes the file.
        out(&mut st, &a, 0, 0, &params(5, 6, 0)).unwrap();
        st.persist(&path).unwrap();
        assert!(!path.exists());
        assert!(PrState::from_text("garbage").is_none());
    }

    #[test]
    fn transport_id_codec() {
        for t in [
            TransportId::Fcp {
                wwpn: 0x2000_0025_b500_0001,
            },
            TransportId::Iscsi {
                name: "iqn.2026-11.io.unifab:h".into(),
                isid: Some([0x40, 0, 1, 0x37, 0, 0]),
            },
            TransportId::Iscsi {
                name: "iqn.x".into(),
                isid: None,
            },
        ] {
            let mut b = Vec::new();
            encode_transport_id(&t, &mut b);
            assert_eq!(b.len() % 4, 0);
            let (d, n) = decode_transport_id(&b).unwrap();
            assert_eq!((d, n), (t, b.len()));
        }
        assert!(decode_transport_id(&[0x05, 0, 0, 9, b'a']).is_none());
        assert!(decode_transport_id(&[]).is_none());
    }
}
