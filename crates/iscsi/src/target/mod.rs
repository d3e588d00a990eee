//! The iSCSI target: full-feature-phase sessions (sans-IO) and, with the
//! `io` feature, the tokio driver that serves them over TCP.

#[cfg(feature = "io")]
pub mod io;
#[cfg(feature = "io")]
pub mod server;
pub mod session;

pub use crate::ffp::{DataSegment, FfpParams};
pub use session::{CloseReason, Coalescing, Event, OutPdu, Session, SessionError, SessionLimits};

#[cfg(test)]
mod session_tests;
