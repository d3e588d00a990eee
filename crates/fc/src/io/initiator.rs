//! The scsi-core [`Initiator`] over FCP, and its [`InitiatorFactory`], so a
//! `RemoteLu` can sit on top of FCP (`fc://WWPN/LUN` backends).
//!
//! With one remote nexus per front-end nexus (the default), each
//! front-end initiator port gets an NPIV N_Port of its own (FDISC on the
//! node's initiator port) whose WWPN is derived from the front-end port's
//! name ([`virtual_port_name`]): stable across restarts, so persistent
//! reservations keep their owners; the remote target sees one FC
//! initiator per front-end initiator, as if the hosts were attached
//! directly.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::oneshot;
use unifab_scsi_core::initiator::{
    Initiator, InitiatorError, InitiatorFactory, Outcome, Request, Submitted,
};
use unifab_scsi_core::{BoxFuture, ItNexus, Lun, TmfFunction, TmfResponse, TransportId};

use super::node::{Control, FcNode};
use crate::nport::CommandId;
use crate::wire::Wwn;

/// The WWPN of the NPIV port carrying the tasks of the front-end initiator
/// port `front`: NAA 3 (locally assigned) with 60 bits of an FNV-1a hash
/// of the parent's WWPN and the front-end port's name.
pub fn virtual_port_name(parent: Wwn, front: &TransportId) -> Wwn {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let name = front.port_name();
    for b in parent.0.to_be_bytes().iter().chain(name.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Wwn((3 << 60) | (h & 0x0fff_ffff_ffff_ffff))
}

/// How the NPIV port of a front-end initiator port is named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NpivNames {
    /// Name it from the host alone (an iSCSI initiator's name, not its
    /// ISID): every session of a host shares one NPIV port, whose WWPN
    /// is known before the host logs in, so it can be zoned in advance.
    /// Otherwise ([`virtual_port_name`]) each front-end port (iSCSI: name
    /// and ISID) gets a port of its own.
    pub per_host: bool,
    /// WWPNs set per host (iSCSI name in lower case), over either rule.
    pub fixed: std::collections::HashMap<String, Wwn>,
}

impl NpivNames {
    /// The WWPN of the NPIV port under `parent` for front-end port `front`.
    pub fn name(&self, parent: Wwn, front: &TransportId) -> Wwn {
        let host = match front {
            TransportId::Iscsi { name, .. } => Some(name.to_ascii_lowercase()),
            TransportId::Fcp { .. } => None,
        };
        if let Some(w) = host.as_ref().and_then(|h| self.fixed.get(h)) {
            return *w;
        }
        match host {
            Some(name) if self.per_host => {
                virtual_port_name(parent, &TransportId::Iscsi { name, isid: None })
            }
            _ => virtual_port_name(parent, front),
        }
    }
}

/// The WWPN of physical initiator port `k` (1…) that carries NPIV ports
/// beside `primary` ([`super::node::FcNode::add_npiv_carrier`]): NAA 3
/// with 60 bits of an FNV-1a hash of the primary's WWPN and `k`, stable
/// across restarts.
pub fn carrier_port_name(primary: Wwn, k: u32) -> Wwn {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in primary
        .0
        .to_be_bytes()
        .iter()
        .chain(b"npiv carrier")
        .chain(k.to_be_bytes().iter())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Wwn((3 << 60) | (h & 0x0fff_ffff_ffff_ffff))
}

/// One I_T nexus over FCP: a local N_Port and a remote target port.
#[derive(Debug)]
pub struct FcpInitiator {
    node: FcNode,
    local: Wwn,
    target: Wwn,
    virtual_port: bool,
    closed: AtomicBool,
}

/// Abandons the command if its future is dropped before its answer.
struct AbandonGuard {
    node: FcNode,
    local: Wwn,
    id: CommandId,
    armed: bool,
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.node.run(Control::Abandon {
                local: self.local,
                id: self.id,
            });
        }
    }
}

impl AbandonGuard {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl FcpInitiator {
    /// An initiator from local port `local` to target port `target` of
    /// `node`.
    pub fn new(node: FcNode, local: Wwn, target: Wwn) -> FcpInitiator {
        FcpInitiator {
            node,
            local,
            target,
            virtual_port: false,
            closed: AtomicBool::new(false),
        }
    }

    /// The local N_Port.
    pub fn local(&self) -> Wwn {
        self.local
    }
}

impl Initiator for FcpInitiator {
    fn submit(&self, request: Request) -> Submitted {
        if self.closed.load(Ordering::Acquire) {
            return Submitted::failed(InitiatorError::Closed);
        }
        let id = self.node.next_id();
        let (reply, rx) = oneshot::channel();
        let sent = self.node.run(Control::Submit {
            local: self.local,
            target: self.target,
            id,
            request,
            reply,
        });
        if let Err(e) = sent {
            return Submitted::failed(e);
        }
        // Driven to its end already (a target port of the same node with
        // an answer at hand): nothing left to wait for or to abandon.
        let mut rx = rx;
        if let Ok(outcome) = rx.try_recv() {
            return Submitted {
                tag: id.0,
                outcome: Box::pin(std::future::ready(outcome)),
            };
        }
        let mut guard = AbandonGuard {
            node: self.node.clone(),
            local: self.local,
            id,
            armed: true,
        };
        Submitted {
            tag: id.0,
            outcome: Box::pin(async move {
                let r: Outcome = rx.await.unwrap_or(Err(InitiatorError::Disconnected));
                guard.disarm();
                r
            }),
        }
    }

    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        if self.closed.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Err(InitiatorError::Closed)));
        }
        let id = self.node.next_id();
        let (reply, rx) = oneshot::channel();
        let sent = self.node.run(Control::Tmf {
            local: self.local,
            target: self.target,
            id,
            lun,
            function,
            reply,
        });
        if let Err(e) = sent {
            return Box::pin(std::future::ready(Err(e)));
        }
        Box::pin(async move { rx.await.unwrap_or(Err(InitiatorError::Disconnected)) })
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.virtual_port {
            let _ = self.node.run(Control::ReleaseVirtual { wwpn: self.local });
        }
    }

    fn remote(&self) -> String {
        format!("fc://{}", self.target)
    }
}

/// Opens [`FcpInitiator`]s from the node's initiator port `parent` to the
/// target port `target`.
#[derive(Debug)]
pub struct FcpInitiatorFactory {
    node: FcNode,
    parent: Wwn,
    target: Wwn,
    per_nexus: bool,
    names: NpivNames,
    shared: Mutex<Option<Arc<FcpInitiator>>>,
}

impl FcpInitiatorFactory {
    /// A factory; with `per_nexus` every front-end initiator port gets an
    /// NPIV port of its own.
    pub fn new(node: FcNode, parent: Wwn, target: Wwn, per_nexus: bool) -> FcpInitiatorFactory {
        FcpInitiatorFactory {
            node,
            parent,
            target,
            per_nexus,
            names: NpivNames::default(),
            shared: Mutex::new(None),
        }
    }

    /// Names the NPIV ports by `names` instead of one per front-end port.
    pub fn with_names(mut self, names: NpivNames) -> FcpInitiatorFactory {
        self.names = names;
        self
    }
}

impl InitiatorFactory for FcpInitiatorFactory {
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        match nexus {
            Some(n) if self.per_nexus => {
                let wwpn = self.names.name(self.parent, n.initiator());
                self.node.run(Control::AcquireVirtual {
                    parent: self.parent,
                    wwpn,
                })?;
                Ok(Arc::new(FcpInitiator {
                    node: self.node.clone(),
                    local: wwpn,
                    target: self.target,
                    virtual_port: true,
                    closed: AtomicBool::new(false),
                }))
            }
            _ => {
                let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                let i = s.get_or_insert_with(|| {
                    Arc::new(FcpInitiator::new(
                        self.node.clone(),
                        self.parent,
                        self.target,
                    ))
                });
                Ok(i.clone())
            }
        }
    }

    fn per_nexus(&self) -> bool {
        self.per_nexus
    }
}
