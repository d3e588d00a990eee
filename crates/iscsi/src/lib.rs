//! iSCSI.

pub mod chap;
pub mod negotiate;
pub mod text;
