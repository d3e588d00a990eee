//! Packet captures of SAN traffic, read offline.
//!
//! - [`pcap`]: pcap and pcapng files.
//! - [`net`]: link, IPv4/IPv6 and TCP decoding of a captured frame.
//! - [`tcp`]: TCP stream reassembly per direction, with gaps.
//! - [`iscsi`]: iSCSI PDU boundaries in a reassembled stream.
//! - [`fc`], [`fip`], [`fcip`]: the FC, FCoE, FIP and FCIP checkers.
//! - [`check`]: the round-trip checker behind `unifab pcap-check`: every
//!   frame of a protocol unifab implements is parsed with that protocol's
//!   wire layer, re-emitted, and compared byte for byte.
//!
//! The crate uses only the wire layers of the protocol crates (no tokio),
//! so a fuzz target or another tool can check captures without the
//! gateway.
//!
//! ```no_run
//! let report = unifab_capture::check::pcap_check("trace.pcap")?;
//! println!("{report}");
//! # Ok::<(), unifab_capture::check::CheckError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod fc;
pub mod fcip;
pub mod fip;
pub mod iscsi;
pub mod net;
pub mod pcap;
pub mod tcp;

pub use check::{CheckError, CheckOptions, Report, check_bytes, pcap_check};
