//! The unifab gateway: configuration, wiring of front ends, logical units
//! and the operator interface. The `unifab` binary is a thin shell over it.
//! Also capture reading and the pcap round-trip checker.
#![warn(missing_docs)]

pub mod admin;
pub mod bench;
pub mod capture;
pub mod config;
pub mod discover;
pub mod fc;
pub mod fcip;
pub mod fcoe;
pub mod pcap_check;
pub mod remote;
pub mod run;
pub mod show;
pub mod tuning;
