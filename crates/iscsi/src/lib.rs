//! iSCSI.

pub mod negotiate;
pub mod text;
