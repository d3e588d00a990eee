//! The unifab gateway library: capture reading and the pcap round-trip checker.
#![warn(missing_docs)]

pub mod capture;
pub mod pcap_check;
