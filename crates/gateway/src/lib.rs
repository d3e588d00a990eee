//! The unifab gateway: configuration, wiring of front ends, logical units
//! and the operator interface. The `unifab` binary is a thin shell over it.
//! Capture reading and the pcap round-trip checker live in `unifab-capture`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod cli;
pub mod config;
pub mod plane;
pub mod run;
pub mod tuning;
