//! unifab's SCSI core: one transport-neutral task model, the logical-unit
//! interface every transport hands tasks to, and SPC-4/SBC-3 emulation over
//! block backends.
//!
//! - [`task`]: [`Task`], [`TaskResult`], [`Lun`], [`ItNexus`], [`Status`].
//! - [`lu`]: the [`LogicalUnit`] trait and task management.
//! - [`sense`]: sense data.
//! - [`cdb`]: typed CDB parse/emit ([`Command`]).
//! - [`backend`]: [`BlockBackend`], [`MemoryBackend`], [`FileBackend`].
//! - [`emulated`]: [`EmulatedLu`], the SPC-4/SBC-3 device server.
//! - [`pr`]: persistent reservations.
//! - [`task_set`]: [`TaskSet`], ordering and task management.
//! - [`target`]: [`Dispatch`], the one door every transport enters by, and
//!   [`ScsiTarget`], the LUN map behind it.
//! - [`initiator`]: the [`Initiator`] interface transports implement to reach
//!   remote targets.
//! - [`remote`]: [`RemoteLu`], a LU forwarded through an initiator.
//! - [`tape`]: [`tape::TapeLu`], the SSC-3 sequential-access device server
//!   over a tape image.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod alua;
pub mod backend;
pub mod cdb;
pub mod emulated;
pub mod faulty;
pub mod gather;
pub mod idmap;
pub mod initiator;
pub mod lu;
pub mod multipath;
pub mod pr;
#[cfg(feature = "rbd")]
pub mod rbd;
pub mod remote;
pub mod sense;
pub mod stats;
pub mod tape;
pub mod target;
pub mod task;
pub mod task_set;

pub use backend::{BackendError, BlockBackend, FileBackend, FileOptions, MemoryBackend};
pub use cdb::{CdbError, Command};
pub use emulated::{EmulatedLu, EmulatedLuConfig, IoMode, LuError};
pub use faulty::{Faults, FaultyBackend};
pub use initiator::{Initiator, InitiatorError, InitiatorFactory};
pub use lu::{BoxFuture, Keyed, LogicalUnit, LuDescription, TmfFunction, TmfRequest, TmfResponse};
pub use remote::{RemoteLu, RemoteLuConfig};
pub use sense::{Asc, Sense, SenseKey};
pub use target::{Dispatch, ScsiTarget};
pub use task::{
    Cdb, DataDirection, ItNexus, Lun, Residual, Status, TargetPort, Task, TaskAttr, TaskResult,
    TransportId,
};
pub use task_set::TaskSet;
