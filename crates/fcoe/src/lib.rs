//! unifab's Fibre Channel over Ethernet.
//!
//! - [`wire`]: Ethernet II with an optional 802.1Q tag, the FCoE
//!   encapsulation, FIP with every operation and descriptor, FPMA/SPMA
//!   MAC addresses — views and representations, no tokio.
//! - [`fcf`]: the sans-IO Fibre Channel Forwarder: VLAN discovery,
//!   advertisements, fabric login through FIP onto a software fabric,
//!   keep-alive supervision, Clear Virtual Links, source-MAC checks.
//! - [`enode`]: the sans-IO ENode: VLAN discovery, FCF selection, FIP
//!   FLOGI/FDISC for the N_Ports above it, keep-alives, recovery.
//! - `link` and `io` (feature `io`, default): the Ethernet links
//!   (in-memory, AF_PACKET, and AF_XDP with feature `af-xdp`) and the
//!   tokio drivers attaching an FCF to a `unifab_fc` switch and N_Ports to
//!   a remote FCF through an ENode.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod enode;
pub mod fcf;
#[cfg(feature = "io")]
pub mod io;
#[cfg(feature = "io")]
pub mod link;
pub mod out;
pub mod wire;
