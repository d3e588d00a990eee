//! The running planes: what `unifab run` starts from a validated
//! [`crate::config::Config`], one file per plane. Nothing here parses or
//! validates configuration; [`crate::config`] never depends on this module.

pub mod fc;
pub mod fcip;
pub mod fcoe;
pub mod iscsi;
pub mod lu;
pub mod remote;
