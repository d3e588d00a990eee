//! The directory (name) server at FFFFFC (FC-GS-7 §5.2): the database of
//! logged-in ports and their registrations, and the answers to name server
//! CT requests. Every query answer is filtered by zoning: a port never
//! learns of a port it is not zoned with.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::wire::ct::{
    CtBody, CtIu, CtReason, Fc4Features, Fc4Types, NS_OBJECT_LEN, NsAccept, NsObject, NsReason,
    NsRequest, PREAMBLE_LEN, PortEntry,
};
use crate::wire::{FcId, MAX_PAYLOAD, Wwn};

/// Port type of an N_Port in name server objects.
pub const PORT_TYPE_N_PORT: u8 = 0x01;
/// Class of service bit for class 3.
pub const CLASS_3: u32 = 0x08;

/// One name server entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsEntry {
    /// Address.
    pub fc_id: FcId,
    /// Port name.
    pub port_name: Wwn,
    /// Node name.
    pub node_name: Wwn,
    /// Port type.
    pub port_type: u8,
    /// Classes of service.
    pub class_of_service: u32,
    /// Registered FC-4 types.
    pub fc4_types: Fc4Types,
    /// Registered FC-4 features.
    pub fc4_features: Fc4Features,
    /// Symbolic port name.
    pub symbolic_port_name: Bytes,
    /// Symbolic node name.
    pub symbolic_node_name: Bytes,
    /// The fabric port the N_Port is attached to.
    pub fabric_port_name: Wwn,
}

/// A registration that changed what other ports may learn about `fc_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed(pub FcId);

/// The name server database.
#[derive(Debug, Clone, Default)]
pub struct NameServer {
    entries: BTreeMap<FcId, NsEntry>,
}

fn reject(req: &CtIu, explanation: NsReason) -> CtIu {
    CtIu {
        preamble: req
            .preamble
            .reject(CtReason::UNABLE_TO_PERFORM, explanation),
        body: CtBody::Reject,
    }
}

fn accept(req: &CtIu, a: NsAccept) -> CtIu {
    CtIu {
        preamble: req.preamble.accept(),
        body: CtBody::Accept(a),
    }
}

impl NameServer {
    /// Enters a port at fabric login.
    pub fn register_login(
        &mut self,
        fc_id: FcId,
        port_name: Wwn,
        node_name: Wwn,
        fabric_port_name: Wwn,
    ) {
        self.entries.insert(
            fc_id,
            NsEntry {
                fc_id,
                port_name,
                node_name,
                port_type: PORT_TYPE_N_PORT,
                class_of_service: CLASS_3,
                fc4_types: Fc4Types::default(),
                fc4_features: Fc4Features::default(),
                symbolic_port_name: Bytes::new(),
                symbolic_node_name: Bytes::new(),
                fabric_port_name,
            },
        );
    }

    /// Enters (or replaces) a whole entry: a port of another switch,
    /// learned from that switch's name server.
    pub fn insert(&mut self, entry: NsEntry) {
        self.entries.insert(entry.fc_id, entry);
    }

    /// Removes a port (logout, link down).
    pub fn remove(&mut self, fc_id: FcId) -> Option<NsEntry> {
        self.entries.remove(&fc_id)
    }

    /// The entry of a port.
    pub fn get(&self, fc_id: FcId) -> Option<&NsEntry> {
        self.entries.get(&fc_id)
    }

    /// Every entry, by address.
    pub fn entries(&self) -> impl Iterator<Item = &NsEntry> {
        self.entries.values()
    }

    /// Answers a name server request from `requester`. `visible(a, b)`
    /// says whether zoning lets `a` see `b`. Returns the answer and, for
    /// a registration that changed another port's view, the changed port.
    pub fn handle(
        &mut self,
        requester: FcId,
        iu: &CtIu,
        visible: impl Fn(FcId, FcId) -> bool,
    ) -> (CtIu, Option<Changed>) {
        let CtBody::Request(req) = &iu.body else {
            return (
                CtIu {
                    preamble: iu
                        .preamble
                        .reject(CtReason::COMMAND_NOT_SUPPORTED, NsReason::NONE),
                    body: CtBody::Reject,
                },
                None,
            );
        };
        let seen = |id: FcId| visible(requester, id);
        let lookup = |id: FcId| self.entries.get(&id).filter(|_| seen(id));
        match req {
            NsRequest::GidFt(scope) | NsRequest::GpnFt(scope) => {
                let names = matches!(req, NsRequest::GpnFt(_));
                let cap = (MAX_PAYLOAD - PREAMBLE_LEN) / if names { 16 } else { 4 };
                let mut list: Vec<PortEntry> = self
                    .entries
                    .values()
                    .filter(|e| e.fc4_types.contains(scope.fc_type))
                    .filter(|e| scope.domain == 0 || e.fc_id.domain() == scope.domain)
                    .filter(|e| scope.area == 0 || e.fc_id.area() == scope.area)
                    .filter(|e| seen(e.fc_id))
                    .take(cap)
                    .map(|e| PortEntry {
                        last: false,
                        port_id: e.fc_id,
                        port_name: e.port_name,
                    })
                    .collect();
                match list.last_mut() {
                    None => (reject(iu, NsReason::FC4_TYPES_NOT_REGISTERED), None),
                    Some(l) => {
                        l.last = true;
                        let a = if names {
                            NsAccept::PortNames(list)
                        } else {
                            NsAccept::PortIds(list)
                        };
                        (accept(iu, a), None)
                    }
                }
            }
            NsRequest::GpnId(id) => match lookup(*id) {
                Some(e) => (accept(iu, NsAccept::Name(e.port_name)), None),
                None => (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None),
            },
            NsRequest::GnnId(id) => match lookup(*id) {
                Some(e) => (accept(iu, NsAccept::Name(e.node_name)), None),
                None => (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None),
            },
            NsRequest::GftId(id) => match lookup(*id) {
                Some(e) if e.fc4_types != Fc4Types::default() => {
                    (accept(iu, NsAccept::Types(e.fc4_types)), None)
                }
                Some(_) => (reject(iu, NsReason::FC4_TYPES_NOT_REGISTERED), None),
                None => (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None),
            },
            NsRequest::GffId(id) => match lookup(*id) {
                Some(e) if e.fc4_features != Fc4Features::default() => (
                    accept(iu, NsAccept::Features(Box::new(e.fc4_features))),
                    None,
                ),
                Some(_) => (reject(iu, NsReason::FC4_FEATURES_NOT_REGISTERED), None),
                None => (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None),
            },
            NsRequest::GspnId(id) => match lookup(*id) {
                Some(e) if !e.symbolic_port_name.is_empty() => (
                    accept(iu, NsAccept::SymbolicName(e.symbolic_port_name.clone())),
                    None,
                ),
                Some(_) => (
                    reject(iu, NsReason::SYMBOLIC_PORT_NAME_NOT_REGISTERED),
                    None,
                ),
                None => (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None),
            },
            NsRequest::GidPn(w) => {
                match self
                    .entries
                    .values()
                    .find(|e| e.port_name == *w && seen(e.fc_id))
                {
                    Some(e) => (accept(iu, NsAccept::PortId(e.fc_id)), None),
                    None => (reject(iu, NsReason::PORT_NAME_NOT_REGISTERED), None),
                }
            }
            NsRequest::GsnnNn(w) => {
                match self
                    .entries
                    .values()
                    .find(|e| e.node_name == *w && seen(e.fc_id))
                {
                    Some(e) if !e.symbolic_node_name.is_empty() => (
                        accept(iu, NsAccept::SymbolicName(e.symbolic_node_name.clone())),
                        None,
                    ),
                    Some(_) => (
                        reject(iu, NsReason::SYMBOLIC_NODE_NAME_NOT_REGISTERED),
                        None,
                    ),
                    None => (reject(iu, NsReason::NODE_NAME_NOT_REGISTERED), None),
                }
            }
            NsRequest::GaNxt(id) => {
                let next = self
                    .entries
                    .range(FcId::new(id.get().saturating_add(1))..)
                    .map(|(_, e)| e)
                    .chain(self.entries.values())
                    .find(|e| seen(e.fc_id));
                match next {
                    Some(e) => (
                        accept(
                            iu,
                            NsAccept::Object(Box::new(NsObject {
                                port_type: e.port_type,
                                port_id: e.fc_id,
                                port_name: e.port_name,
                                symbolic_port_name: e.symbolic_port_name.clone(),
                                node_name: e.node_name,
                                symbolic_node_name: e.symbolic_node_name.clone(),
                                initial_process_associator: 0,
                                ip_address_node: [0; 16],
                                class_of_service: e.class_of_service,
                                fc4_types: e.fc4_types,
                                ip_address_port: [0; 16],
                                fabric_port_name: e.fabric_port_name,
                                hard_address: FcId::UNIDENTIFIED,
                            })),
                        ),
                        None,
                    ),
                    None => (reject(iu, NsReason::DATABASE_EMPTY), None),
                }
            }
            // Registrations: a port registers only for itself.
            NsRequest::RpnId { port_id, .. }
            | NsRequest::RnnId { port_id, .. }
            | NsRequest::RftId { port_id, .. }
            | NsRequest::RffId { port_id, .. }
            | NsRequest::RspnId { port_id, .. }
            | NsRequest::DaId(port_id)
                if *port_id != requester =>
            {
                (reject(iu, NsReason::ACCESS_DENIED), None)
            }
            _ => self.register(requester, iu, req),
        }
    }

    fn register(&mut self, requester: FcId, iu: &CtIu, req: &NsRequest) -> (CtIu, Option<Changed>) {
        let Some(e) = self.entries.get_mut(&requester) else {
            return (reject(iu, NsReason::PORT_ID_NOT_REGISTERED), None);
        };
        let changed = match req {
            NsRequest::RpnId { port_name, .. } => {
                if *port_name != e.port_name {
                    return (reject(iu, NsReason::ACCESS_DENIED), None);
                }
                None
            }
            NsRequest::RnnId { node_name, .. } => {
                e.node_name = *node_name;
                None
            }
            NsRequest::RftId { types, .. } => {
                let c = e.fc4_types != *types;
                e.fc4_types = *types;
                c.then_some(Changed(requester))
            }
            NsRequest::RffId {
                features, fc_type, ..
            } => {
                let c = e.fc4_features.get(*fc_type) != *features;
                e.fc4_features.set(*fc_type, *features);
                c.then_some(Changed(requester))
            }
            NsRequest::RspnId { name, .. } => {
                // Copied: the request's bytes are a slice of the buffer
                // the frame arrived in, which a kept slice would pin for
                // as long as the port stays registered.
                e.symbolic_port_name = Bytes::copy_from_slice(name);
                None
            }
            NsRequest::RsnnNn { node_name, name } => {
                if *node_name != e.node_name {
                    return (reject(iu, NsReason::NODE_NAME_NOT_REGISTERED), None);
                }
                // Every port of the node carries the node's name.
                let n = *node_name;
                let name = Bytes::copy_from_slice(name);
                for other in self.entries.values_mut().filter(|o| o.node_name == n) {
                    other.symbolic_node_name = name.clone();
                }
                None
            }
            NsRequest::DaId(_) => {
                e.fc4_types = Fc4Types::default();
                e.fc4_features = Fc4Features::default();
                e.symbolic_port_name = Bytes::new();
                Some(Changed(requester))
            }
            _ => None,
        };
        (accept(iu, NsAccept::Empty), changed)
    }
}

const _: () = assert!(PREAMBLE_LEN + NS_OBJECT_LEN <= MAX_PAYLOAD);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FcId;
    use crate::wire::ct::{FtScope, fcp_features};
    use crate::wire::header::FcType;

    fn body(iu: &CtIu) -> &CtBody {
        &iu.body
    }

    #[test]
    fn registration_and_zoned_queries() {
        let mut ns = NameServer::default();
        let (a, b, c) = (
            FcId::new(0x010100),
            FcId::new(0x010200),
            FcId::new(0x010300),
        );
        ns.register_login(a, Wwn(0xa), Wwn(0x1a), Wwn(0xf1));
        ns.register_login(b, Wwn(0xb), Wwn(0x1b), Wwn(0xf2));
        ns.register_login(c, Wwn(0xc), Wwn(0x1c), Wwn(0xf3));
        let all = |_: FcId, _: FcId| true;
        for id in [a, b, c] {
            let (r, ch) = ns.handle(
                id,
                &CtIu::request(NsRequest::RftId {
                    port_id: id,
                    types: Fc4Types::of(FcType::FCP),
                }),
                all,
            );
            assert_eq!(body(&r), &CtBody::Accept(NsAccept::Empty));
            assert_eq!(ch, Some(Changed(id)));
        }
        // Registering for another port is refused.
        let (r, _) = ns.handle(
            a,
            &CtIu::request(NsRequest::RffId {
                port_id: b,
                features: fcp_features::TARGET,
                fc_type: FcType::FCP,
            }),
            all,
        );
        assert_eq!(r.preamble.explanation, NsReason::ACCESS_DENIED);
        // Zoning: a sees c but not b.
        let zoned = |x: FcId, y: FcId| x == y || !(x == a && y == b || x == b && y == a);
        let gid = CtIu::request(NsRequest::GidFt(FtScope {
            domain: 0,
            area: 0,
            fc_type: FcType::FCP,
        }));
        let (r, _) = ns.handle(a, &gid, zoned);
        let CtBody::Accept(NsAccept::PortIds(ids)) = &r.body else {
            panic!("{r:?}")
        };
        let ids: Vec<FcId> = ids.iter().map(|e| e.port_id).collect();
        assert_eq!(ids, vec![a, c]);
        let (r, _) = ns.handle(a, &CtIu::request(NsRequest::GpnId(b)), zoned);
        assert_eq!(r.preamble.explanation, NsReason::PORT_ID_NOT_REGISTERED);
        let (r, _) = ns.handle(a, &CtIu::request(NsRequest::GidPn(Wwn(0xc))), zoned);
        assert_eq!(r.body, CtBody::Accept(NsAccept::PortId(c)));
        let (r, _) = ns.handle(a, &CtIu::request(NsRequest::GaNxt(a)), zoned);
        let CtBody::Accept(NsAccept::Object(o)) = &r.body else {
            panic!()
        };
        assert_eq!(o.port_id, c, "GA_NXT skips the zoned-out b");
        let (r, _) = ns.handle(a, &CtIu::request(NsRequest::GaNxt(c)), zoned);
        let CtBody::Accept(NsAccept::Object(o)) = &r.body else {
            panic!()
        };
        assert_eq!(o.port_id, a, "GA_NXT wraps");
        // Symbolic names.
        let (r, _) = ns.handle(c, &CtIu::request(NsRequest::GspnId(c)), all);
        assert_eq!(
            r.preamble.explanation,
            NsReason::SYMBOLIC_PORT_NAME_NOT_REGISTERED
        );
        ns.handle(
            c,
            &CtIu::request(NsRequest::RspnId {
                port_id: c,
                name: Bytes::from_static(b"target"),
            }),
            all,
        );
        let (r, _) = ns.handle(a, &CtIu::request(NsRequest::GspnId(c)), all);
        assert_eq!(
            r.body,
            CtBody::Accept(NsAccept::SymbolicName(Bytes::from_static(b"target")))
        );
        // DA_ID clears types: c no longer answers GID_FT.
        ns.handle(c, &CtIu::request(NsRequest::DaId(c)), all);
        let (r, _) = ns.handle(a, &gid, zoned);
        let CtBody::Accept(NsAccept::PortIds(ids)) = &r.body else {
            panic!()
        };
        assert_eq!(ids.len(), 1);
        ns.remove(a);
        let (r, _) = ns.handle(b, &gid, |x, y| x == y);
        assert!(matches!(r.body, CtBody::Accept(_)), "b sees itself");
    }
}
