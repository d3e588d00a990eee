//! Inter-switch hooks: what a fabric needs so that E_Ports (VE_Ports of
//! FCIP tunnels) can join it to other switches' fabrics.
//!
//! The protocol work (ELP/ESC/EFP, FSPF, zone merge, SW_RSCN, the
//! distributed name server queries) is done by whoever drives the E_Ports
//! (`unifab-fcip`); the fabric only
//!
//! - routes frames for other domains by a route table it is given
//!   ([`Fabric::set_route`]), and accepts frames from other domains on
//!   E_Ports (no fabric login there);
//! - answers name server queries addressed to its domain controller
//!   (FFFCxx, xx = its domain) from another switch, unfiltered by zoning
//!   and with its own ports only, as FC-GS's distributed name server
//!   wants;
//! - holds the name server entries learned from other switches
//!   ([`Fabric::set_remote_entries`]): local ports find them with GID_FT,
//!   zoning sees them, and local ports registered for RSCN hear when they
//!   come and go;
//! - records which local ports changed so SW_RSCNs can be sent
//!   ([`Fabric::take_local_changes`]).

use std::collections::BTreeMap;

use bytes::Bytes;
use tracing::warn;

use super::name_server::NsEntry;
use super::{Fabric, PortCounters, PortIndex, PortState};
use crate::compose::{self, Route};
use crate::wire::ct::{CtBody, CtIu, CtReason, GsSubtype, GsType, NsReason};
use crate::wire::frame::Frame;
use crate::wire::header::{FcType, RCtl};
use crate::wire::{FcId, Wwn};

/// Name server entries learned from other switches that a fabric keeps,
/// for all of them together. A peer switch answers our GA_NXT walk with
/// as many ports as it likes, and FSPF can make up to 239 domains
/// reachable: without a bound, one peer could fill memory with made-up
/// ports. 16,384 is far beyond the FC SANs this gateway joins (the largest
/// switch products support a few thousand devices per fabric).
pub const MAX_REMOTE_ENTRIES: usize = 16_384;

/// The domain controller address of `domain` (FFFCxx).
pub const fn domain_controller(domain: u8) -> FcId {
    FcId::new(0xff_fc00 | domain as u32)
}

/// The domain of a domain controller address, if `id` is one.
pub fn controller_domain(id: FcId) -> Option<u8> {
    let v = id.get();
    (v & 0xff_ff00 == 0xff_fc00 && (1..=239).contains(&(v as u8))).then_some(v as u8)
}

/// The inter-switch part of the fabric's state.
#[derive(Debug, Default)]
pub(crate) struct IslState {
    routes: BTreeMap<u8, PortIndex>,
    remote: BTreeMap<FcId, NsEntry>,
    changes: Vec<FcId>,
}

impl IslState {
    pub(crate) fn route(&self, domain: u8) -> Option<PortIndex> {
        self.routes.get(&domain).copied()
    }

    pub(crate) fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    pub(crate) fn note_change(&mut self, id: FcId) {
        if !self.changes.contains(&id) {
            self.changes.push(id);
        }
    }

    pub(crate) fn remote_entries(&self) -> impl Iterator<Item = &NsEntry> {
        self.remote.values()
    }
}

impl Fabric {
    /// Attaches an E_Port (a VE_Port of a tunnel) named `name`.
    pub fn attach_e_port(&mut self, name: &str) -> PortIndex {
        let p = self.attach(name);
        if let Some(Some(st)) = self.ports.get_mut(p.0) {
            st.e_port = true;
        }
        p
    }

    /// Whether `port` is an E_Port.
    pub fn is_e_port(&self, port: PortIndex) -> bool {
        matches!(
            self.ports.get(port.0),
            Some(Some(PortState { e_port: true, .. }))
        )
    }

    /// Sets (or, with `None`, removes) the port frames for `domain` leave by.
    pub fn set_route(&mut self, domain: u8, port: Option<PortIndex>) {
        if domain == self.cfg.domain {
            return;
        }
        match port {
            Some(p) => {
                self.isl.routes.insert(domain, p);
            }
            None => {
                self.isl.routes.remove(&domain);
            }
        }
    }

    /// The route table: domain → port.
    pub fn routes(&self) -> Vec<(u8, PortIndex)> {
        self.isl.routes.iter().map(|(d, p)| (*d, *p)).collect()
    }

    /// Replaces what the fabric knows of `domain`'s ports. Local ports
    /// registered for RSCN that may see a port that appeared, changed or
    /// went get an RSCN for it.
    ///
    /// At most [`MAX_REMOTE_ENTRIES`] entries are kept for all other
    /// domains together; a domain whose entries would pass it keeps as
    /// many as fit (the lowest port IDs), and the rest are left out with a
    /// warning. Symbolic names are copied, so an entry never keeps the
    /// buffer its name server's answer arrived in alive.
    pub fn set_remote_entries(&mut self, domain: u8, mut entries: Vec<NsEntry>) {
        if domain == self.cfg.domain {
            return;
        }
        let others = self
            .isl
            .remote
            .keys()
            .filter(|id| id.domain() != domain)
            .count();
        let room = MAX_REMOTE_ENTRIES.saturating_sub(others);
        entries.retain(|e| e.fc_id.domain() == domain);
        if entries.len() > room {
            entries.sort_by_key(|e| e.fc_id);
            warn!(
                domain,
                ports = entries.len(),
                kept = room,
                "remote name server entries past the limit of {MAX_REMOTE_ENTRIES} left out"
            );
            entries.truncate(room);
        }
        for e in &mut entries {
            e.symbolic_port_name = Bytes::copy_from_slice(&e.symbolic_port_name);
            e.symbolic_node_name = Bytes::copy_from_slice(&e.symbolic_node_name);
        }
        let before: BTreeMap<FcId, NsEntry> = self
            .isl
            .remote
            .iter()
            .filter(|(id, _)| id.domain() == domain)
            .map(|(id, e)| (*id, e.clone()))
            .collect();
        let after: BTreeMap<FcId, NsEntry> = entries
            .into_iter()
            .filter(|e| e.fc_id.domain() == domain)
            .map(|e| (e.fc_id, e))
            .collect();
        let mut changed = Vec::new();
        for (id, e) in &before {
            if after.get(id) != Some(e) {
                changed.push(*id);
            }
        }
        for id in after.keys() {
            if !before.contains_key(id) {
                changed.push(*id);
            }
        }
        // RSCNs about ports that go are computed while they are still known.
        let gone: Vec<FcId> = before
            .keys()
            .filter(|id| !after.contains_key(id))
            .copied()
            .collect();
        for id in &gone {
            self.rscn_for(*id, 0);
        }
        for id in before.keys() {
            self.isl.remote.remove(id);
            self.ns.remove(*id);
        }
        for (id, e) in after {
            self.ns.insert(e.clone());
            self.isl.remote.insert(id, e);
        }
        self.recompute_membership();
        for id in changed.into_iter().filter(|id| !gone.contains(id)) {
            self.rscn_for(id, 0);
        }
    }

    /// Name server entries learned from other switches.
    pub fn remote_entries(&self) -> Vec<NsEntry> {
        self.isl.remote.values().cloned().collect()
    }

    /// Local ports whose login or registrations changed since the last
    /// call (to announce with SW_RSCN).
    pub fn take_local_changes(&mut self) -> Vec<FcId> {
        std::mem::take(&mut self.isl.changes)
    }

    /// Whether [`Fabric::take_local_changes`] has something.
    pub fn has_local_changes(&self) -> bool {
        self.isl.has_changes()
    }

    /// This switch's own name server entries.
    pub fn local_entries(&self) -> Vec<NsEntry> {
        let d = self.cfg.domain;
        self.ns
            .entries()
            .filter(|e| e.fc_id.domain() == d)
            .cloned()
            .collect()
    }

    pub(crate) fn isl_port_gone(&mut self, port: PortIndex) {
        self.isl.routes.retain(|_, p| *p != port);
    }

    /// A frame to domain controller `dom` (`controller_domain` of its
    /// D_ID): `true` if handled, `false` if dropped (no route).
    pub(crate) fn isl_route(
        &mut self,
        port: PortIndex,
        e_port: bool,
        dom: u8,
        frame: Frame,
    ) -> bool {
        let h = frame.header;
        if dom != self.cfg.domain {
            return match self.isl.route(dom) {
                Some(p) if p != port => {
                    self.out.push_back((p, frame));
                    true
                }
                _ => false,
            };
        }
        // To this switch's domain controller: only name server queries
        // from another switch are answered here.
        let from_switch = controller_domain(h.s_id).is_some_and(|d| d != self.cfg.domain);
        if !(e_port && from_switch && h.fc_type == FcType::CT && h.r_ctl == RCtl::CT_REQUEST) {
            return false;
        }
        let rx = self.alloc_rx();
        let route = Route::reply_to(&h, rx);
        let reply = match CtIu::parse(&frame.payload, None) {
            Ok(iu)
                if iu.preamble.gs_type == GsType::DIRECTORY
                    && iu.preamble.gs_subtype == GsSubtype::NAME_SERVER
                    && matches!(iu.body, CtBody::Request(ref r) if !is_registration(r)) =>
            {
                let local = self.cfg.domain;
                self.ns.handle(h.s_id, &iu, |_, b| b.domain() == local).0
            }
            Ok(iu) => CtIu {
                preamble: iu
                    .preamble
                    .reject(CtReason::COMMAND_NOT_SUPPORTED, NsReason::NONE),
                body: CtBody::Reject,
            },
            Err(_) => {
                self.count(port, |c: &mut PortCounters| c.malformed += 1);
                return false;
            }
        };
        let Ok(f) = compose::ct(route, &reply, true) else {
            return false;
        };
        let back = self.isl.route(h.s_id.get() as u8).unwrap_or(port);
        self.out.push_back((back, f));
        true
    }

    /// The switch name.
    pub fn switch_name(&self) -> Wwn {
        self.cfg.switch_name
    }
}

fn is_registration(r: &crate::wire::ct::NsRequest) -> bool {
    use crate::wire::ct::CtCommand;
    let c = r.command();
    c.0 >= CtCommand::RPN_ID.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::FabricConfig;
    use crate::wire::FcHeaderRepr;
    use bytes::Bytes;
    use std::time::Instant;

    fn frame(s: u32, d: u32) -> Frame {
        Frame::new(
            FcHeaderRepr {
                s_id: FcId::new(s),
                d_id: FcId::new(d),
                fc_type: FcType::FCP,
                ..FcHeaderRepr::default()
            },
            Bytes::from_static(&[0; 4]),
        )
    }

    fn entry(id: u32, wwn: u64) -> NsEntry {
        NsEntry {
            fc_id: FcId::new(id),
            port_name: Wwn(wwn),
            node_name: Wwn(wwn + 1),
            port_type: 1,
            class_of_service: 8,
            fc4_types: Default::default(),
            fc4_features: Default::default(),
            symbolic_port_name: Bytes::new(),
            symbolic_node_name: Bytes::new(),
            fabric_port_name: Wwn(0),
        }
    }

    /// A transit switch (domain 2) between domains 1 and 3.
    #[test]
    fn transit_routing_and_remote_entries() {
        let mut f = Fabric::new(FabricConfig {
            domain: 2,
            ..FabricConfig::default()
        });
        let e1 = f.attach_e_port("to-1");
        let e3 = f.attach_e_port("to-3");
        assert!(f.is_e_port(e1) && f.is_e_port(e3));
        f.set_route(1, Some(e1));
        f.set_route(3, Some(e3));
        f.set_route(2, Some(e1)); // own domain: ignored
        assert_eq!(f.routes(), vec![(1, e1), (3, e3)]);
        let now = Instant::now();
        f.handle_frame(now, e1, frame(0x010100, 0x030100));
        assert_eq!(f.poll_transmit().map(|(p, _)| p), Some(e3));
        // Domain controllers are routed by their low byte.
        f.handle_frame(now, e3, frame(0xfffc03, 0xfffc01));
        assert_eq!(f.poll_transmit().map(|(p, _)| p), Some(e1));
        // A frame claiming this switch's domain from an E_Port is dropped,
        // and nothing goes back out of the port it came in on.
        f.handle_frame(now, e1, frame(0x020100, 0x030100));
        f.handle_frame(now, e1, frame(0x030100, 0x010100));
        assert_eq!(f.poll_transmit(), None);
        let c = f.counters(e1).unwrap();
        assert_eq!((c.source_drops, c.unroutable_drops), (1, 1));
        // Remote entries are held per domain, replaced and withdrawn.
        f.set_remote_entries(3, vec![entry(0x030100, 0x21), entry(0x010100, 0x22)]);
        assert_eq!(
            f.remote_entries().len(),
            1,
            "entries of other domains are ignored"
        );
        assert!(f.name_server().iter().any(|e| e.port_name == Wwn(0x21)));
        f.set_remote_entries(3, Vec::new());
        assert!(f.name_server().is_empty());
        // Local changes are reported once.
        assert!(!f.has_local_changes());
        f.detach(e3);
        assert_eq!(f.routes(), vec![(1, e1)]);
        assert_eq!(controller_domain(domain_controller(7)), Some(7));
        assert_eq!(controller_domain(FcId::NAME_SERVER), None);
    }

    /// Remote entries are bounded for all domains together: a domain that
    /// would pass the bound keeps its lowest port IDs that fit, a domain's
    /// own earlier entries do not count against its update, and names are
    /// kept as copies, not as slices of the answer they came in.
    #[test]
    fn remote_entries_are_bounded_and_own_their_names() {
        let mut f = Fabric::new(FabricConfig {
            domain: 2,
            ..FabricConfig::default()
        });
        let ids = |d: u32, n: usize| (0..n as u32).map(move |i| (d << 16) | (i + 1));
        let answer = Bytes::from(vec![b'n'; 64 * 1024]);
        let mut three: Vec<NsEntry> = ids(3, 10_000).map(|id| entry(id, u64::from(id))).collect();
        three[0].symbolic_port_name = answer.slice(100..110);
        three[0].symbolic_node_name = answer.slice(200..204);
        f.set_remote_entries(3, three);
        assert_eq!(f.remote_entries().len(), 10_000);
        let kept = f
            .remote_entries()
            .into_iter()
            .find(|e| e.fc_id == FcId::new(0x03_00_01))
            .unwrap();
        assert_eq!(&kept.symbolic_port_name[..], b"nnnnnnnnnn");
        assert_eq!(kept.symbolic_node_name.len(), 4);
        let in_answer = |b: &Bytes| {
            let p = b.as_ptr() as usize;
            let a = answer.as_ptr() as usize;
            p >= a && p < a + answer.len()
        };
        assert!(!in_answer(&kept.symbolic_port_name));
        assert!(!in_answer(&kept.symbolic_node_name));

        // Domain 4 offers 10,000 more, in reverse order: 6,384 fit.
        let mut four: Vec<NsEntry> = ids(4, 10_000).map(|id| entry(id, u64::from(id))).collect();
        four.reverse();
        f.set_remote_entries(4, four);
        let all = f.remote_entries();
        assert_eq!(all.len(), MAX_REMOTE_ENTRIES);
        let of_four: Vec<u32> = all
            .iter()
            .filter(|e| e.fc_id.domain() == 4)
            .map(|e| e.fc_id.get())
            .collect();
        assert_eq!(of_four.len(), MAX_REMOTE_ENTRIES - 10_000);
        assert_eq!(of_four.iter().max(), Some(&(0x04_0000 | 6_384)));
        assert_eq!(f.name_server().len(), MAX_REMOTE_ENTRIES);

        // Domain 3 shrinks and then grows back: its own old entries never
        // stand in its way, domain 4's do.
        f.set_remote_entries(3, ids(3, 5).map(|id| entry(id, u64::from(id))).collect());
        assert_eq!(f.remote_entries().len(), 5 + 6_384);
        f.set_remote_entries(
            3,
            ids(3, 12_000).map(|id| entry(id, u64::from(id))).collect(),
        );
        assert_eq!(f.remote_entries().len(), MAX_REMOTE_ENTRIES);
        assert_eq!(
            f.remote_entries()
                .iter()
                .filter(|e| e.fc_id.domain() == 3)
                .count(),
            10_000
        );
    }
}
