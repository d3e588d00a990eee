//! unifab's Fibre Channel plane.
//!
//! - [`wire`]: FC-2 frame header, delimiters and CRC, BLS, ELS, CT (name
//!   server) and FCP-4 IUs — views and representations, no tokio.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod wire;

pub use wire::{FcId, OxId, RxId, WireError, Wwn};
