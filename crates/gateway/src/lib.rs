//! The unifab gateway: configuration, wiring of front ends, logical units
//! and the operator interface. The `unifab` binary is a thin shell over it.

pub mod admin;
pub mod config;
pub mod run;
pub mod show;
