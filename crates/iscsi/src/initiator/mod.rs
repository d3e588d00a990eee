//! The iSCSI initiator (RFC 7143): discovery, login, and full-feature-phase
//! sessions that carry SCSI commands to a remote target.
//!
//! - [`session`]: the sans-IO session (pipelining within the CmdSN window,
//!   immediate/unsolicited/solicited data, Data-In checks, task management,
//!   NOP keep-alive, command timeouts, re-sending after reconnection).
//! - [`url`]: `iscsi://[user%secret@]host[:port]/iqn/lun` addresses.
//! - [`io`] (feature `io`): the tokio driver, [`io::IscsiInitiator`], which
//!   implements [`unifab_scsi_core::Initiator`]; SendTargets discovery.

pub mod session;
pub mod url;

#[cfg(feature = "io")]
pub mod io;

pub use crate::ffp::FfpParams;
pub use session::{ConnectionError, Event, OutPdu, Session, SessionConfig, StartSn};
pub use url::{IscsiUrl, UrlError};
