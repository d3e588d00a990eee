//! The running planes: what `unifab run` starts from a validated
//! [`crate::config::Config`], one file per plane.

pub mod fc;
