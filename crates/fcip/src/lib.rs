//! FCIP for unifab: Fibre Channel over TCP/IP (RFC 3821, with the
//! encapsulation of RFC 3643), joining the software FC fabrics of two or
//! more unifab gateways (or an RFC 3821 peer) through VE_Ports.
//!
//! - [`wire`]: encapsulation header, SOF/EOF words, the FCIP Special
//!   Frame, SW_ILS (ELP, ESC, EFP, HLO, LSU, LSA, SW_RSCN, MR), and the
//!   unifab enhanced-mode batch frames. No tokio.
//! - [`codec`]: finding frames in a TCP byte stream with RFC 3821's
//!   receive checks and resynchronisation.
//! - [`proto`]: sans-IO state machines: the special frame exchange, the
//!   enhanced-mode stream (sequence numbers, acks, failover,
//!   compression), FastWrite, the VE_Port bring-up and FSPF.
//! - `io` (feature, default): tokio drivers for circuits, tunnels and
//!   the inter-switch controller.
//!
//! Security: RFC 3821 secures FCIP with IPsec, which lives in the kernel
//! and is not available to a userspace gateway; unifab offers TLS 1.3
//! (rustls) between two unifab gateways instead, with mutual
//! certificates or a pre-shared key (see `io::tls`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod codec;
#[cfg(feature = "io")]
pub mod io;
pub mod proto;
pub mod wire;
