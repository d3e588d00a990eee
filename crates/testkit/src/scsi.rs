//! SCSI tasks for tests: the front-end host nexus and the task builder the
//! protocol crates' tests share (over [`Task::new`]).

use bytes::Bytes;
use unifab_scsi_core::{Cdb, ItNexus, Lun, Task};

/// The target port name the tests' front-end nexuses use.
pub const GATEWAY_PORT: &str = "iqn.2026-11.io.unifab:gw,t,0x1";

/// A front-end host's I_T nexus: `iqn.2026-11.io.unifab:host` with an
/// ISID ending in `isid`, through [`GATEWAY_PORT`]. Different `isid`s are
/// different initiator ports.
pub fn host_nexus(isid: u8) -> ItNexus {
    ItNexus::iscsi(
        "iqn.2026-11.io.unifab:host",
        [0x40, 0, 0, 0, 0, isid],
        GATEWAY_PORT,
    )
}

/// A SIMPLE task for LUN 0 of `nexus`: the CDB bytes, the data-out (all of
/// it, also the expected length) if any, and the expected data-in length.
pub fn task(
    nexus: &ItNexus,
    tag: u64,
    cdb: &[u8],
    data_out: Option<Bytes>,
    data_in_len: u32,
) -> Task {
    let t = Task::new(
        nexus.clone(),
        Lun(0),
        tag,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    )
    .with_data_in(data_in_len);
    match data_out {
        Some(d) => t.with_data(d),
        None => t,
    }
}
