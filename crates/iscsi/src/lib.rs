//! iSCSI.

pub mod text;
