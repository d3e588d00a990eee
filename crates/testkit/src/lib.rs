//! Test helpers for unifab (not published): a raw iSCSI test initiator that
//! can send malformed PDUs, and launchers for the real peers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod medium;
pub mod peers;
pub mod raw_iscsi;
pub mod relay;
pub mod scsi;
pub mod tshark;
pub mod veth;
pub mod wan;
