//! unifab's Fibre Channel plane.
//!
//! - [`wire`]: FC-2 frame header, delimiters and CRC, BLS, ELS, CT (name
//!   server) and FCP-4 IUs — views and representations, no tokio.
//! - [`exchange`]: OX_ID/RX_ID allocation, E_D_TOV/R_A_TOV, ABTS/RRQ
//!   recovery of identifiers.
//! - [`nport`]: the sans-IO N_Port with its FCP target and initiator
//!   engines.
//! - [`fabric`]: the sans-IO software fabric (login server, name server,
//!   zoning, RSCN, routing).
//! - [`link`]: the [`FcLink`](link::FcLink) trait ports attach through.
//! - `io` (feature, default): the switch, the in-memory link, the N_Port
//!   node driver, and the scsi-core initiator over FCP.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod compose;
pub mod exchange;
pub mod fabric;
#[cfg(feature = "io")]
pub mod io;
pub mod link;
pub mod nport;
pub mod wire;

pub use wire::{FcId, OxId, RxId, WireError, Wwn};
