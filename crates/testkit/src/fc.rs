//! The FC rig the protocol crates' tests share: an FCP target N_Port that
//! serves a memory LU, an initiator N_Port that finds targets through the
//! name server, a `RemoteLu` over FCP, and a bounded wait. The fc, fcoe and
//! fcip tests build their fabrics (one switch, an FCoE hop, a chain of FCIP
//! tunnels) from these.
//!
//! unifab-fc's own integration tests use this too: cargo links one
//! `unifab_fc` library for the test and for the testkit, so the types
//! agree (a unit test inside unifab-fc could not: there the crate under
//! test is another copy).

use std::sync::Arc;
use std::time::Duration;

use unifab_fc::io::{FcNode, FcpInitiatorFactory};
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_scsi_core::remote::Identity;
use unifab_scsi_core::{
    EmulatedLu, EmulatedLuConfig, Lun, MemoryBackend, RemoteLu, RemoteLuConfig, ScsiTarget,
};

/// The node name the rig gives a port: the port name with NAA 2 (`20:…`)
/// in place of its first byte.
pub fn node_name(port: Wwn) -> Wwn {
    Wwn(0x2000_0000_0000_0000 | (port.0 & 0x0000_ffff_ffff_ffff))
}

/// Adds to `node`, as port `name`, an FCP target N_Port `wwpn` whose LUN 0
/// is a memory LU of `bytes`.
pub fn memory_target(node: &FcNode, name: &str, wwpn: Wwn, bytes: u64) {
    let scsi = ScsiTarget::new();
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(bytes)),
    )
    .expect("a memory LU");
    scsi.insert(Lun(0), Arc::new(lu));
    let mut t = NPortConfig::new(wwpn, node_name(wwpn));
    t.target = true;
    node.add_port(name, t, Some(scsi)).expect("the target port");
}

/// An initiator N_Port's configuration that discovers targets through the
/// name server.
pub fn initiator_port(wwpn: Wwn) -> NPortConfig {
    let mut i = NPortConfig::new(wwpn, node_name(wwpn));
    i.initiator = true;
    i.discover = true;
    i
}

/// A `RemoteLu` named `name` for LUN 0 of `target`, reached from the
/// initiator port `initiator` of `node` (an NPIV port per front-end nexus
/// when `per_nexus`).
pub fn remote_lu(
    node: &FcNode,
    initiator: Wwn,
    target: Wwn,
    per_nexus: bool,
    name: &str,
    task_set_depth: usize,
) -> RemoteLu {
    RemoteLu::new(
        RemoteLuConfig {
            name: name.into(),
            backend: format!("fc://{target}/0"),
            remote_lun: Lun(0),
            identity: Identity::Passthrough,
            task_set_depth,
            read_only: false,
        },
        Arc::new(FcpInitiatorFactory::new(
            node.clone(),
            initiator,
            target,
            per_nexus,
        )),
    )
}

/// Polls `f` every 10 ms for at most `timeout`: whether it became true.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
