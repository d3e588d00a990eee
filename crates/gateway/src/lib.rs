//! The unifab gateway: configuration, wiring of front ends, logical units
//! and the operator interface. The `unifab` binary is a thin shell over it.
//! Capture reading and the pcap round-trip checker live in `unifab-capture`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod bench;
pub mod config;
pub mod discover;
pub mod fcip;
pub mod fcoe;
pub mod plane;
pub mod remote;
pub mod run;
pub mod show;
pub mod tuning;
