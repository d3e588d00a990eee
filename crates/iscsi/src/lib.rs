//! unifab's iSCSI (RFC 7143).
//!
//! - [`wire`]: PDU views and representations, digests, framing.
//! - [`ffp`]: what both roles share in full feature phase (negotiated
//!   parameters, serial numbers, tags, data segments).
//! - [`target`]: the target: a sans-IO session, and with the `io` feature
//!   the tokio server.
//! - [`initiator`]: the initiator: a sans-IO session, and with the `io`
//!   feature the tokio driver (`initiator::io::IscsiInitiator`, an
//!   `unifab_scsi_core::Initiator`), SendTargets discovery and
//!   `iscsi://` URLs.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod ffp;
pub mod initiator;
#[cfg(feature = "io")]
mod sock;
pub mod target;
pub mod wire;

pub mod chap;
pub mod login;
pub mod negotiate;
pub mod sendtargets;
pub mod text;
