//! Test helpers for unifab (not published): a raw iSCSI test initiator that
//! can send malformed PDUs, launchers for the real peers, and the FC rig
//! (a memory-LU target port, a discovering initiator port, a `RemoteLu`
//! over FCP) the fc, fcoe and fcip tests share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod fc;
pub mod lines;
pub mod medium;
pub mod peers;
pub mod raw_iscsi;
pub mod relay;
pub mod scsi;
pub mod tshark;
pub mod veth;
pub mod wan;
