//! tokio drivers: circuits over TCP, the tunnel (a VE_Port of an
//! `unifab-fc` switch), the FCIP listener, and the inter-switch
//! controller.
//!
//! A *tunnel* is one FCIP link to one peer switch, made of *circuits*
//! (TCP connections, each to its own address with its own weight).
//!
//! - RFC mode (`LinkMode::Rfc`): plain RFC 3821. Class F (SW_ILS, the
//!   controller's traffic) runs on a connection of its own (to the first
//!   circuit's address, Connection Usage Flags SOFf); each circuit is one
//!   class 3 connection. The frames of one exchange always take the same
//!   connection (chosen by weight), so FC's in-order delivery holds.
//!   Keep-alive: an FSPF HLO on class F every `keepalive`; class F
//!   silent for `dead_after` takes the link down.
//!   While the link is up, class 3 frames take a fast path: the fabric's
//!   call writes a frame to its circuit's socket, and the circuit's reader
//!   gives what it decodes to the fabric, without a hand-off to the
//!   tunnel's task (order kept; see `fast.rs`).
//! - Enhanced mode (`LinkMode::Enhanced`, both ends unifab): every
//!   circuit carries numbered batches (class F first); heartbeats on every
//!   circuit every `keepalive`; a circuit silent for `dead_after` is dead
//!   and its unacknowledged batches are resent on the others — unless
//!   every circuit is silent at once: then none is dead until one is
//!   heard again, or until K_A_TOV (the link goes down). Compression
//!   and FastWrite apply here. The mode is agreed, never forced: the
//!   connector announces it in the special frame's entity identifier and
//!   the acceptor answers with a hello batch; no hello, no tunnel (with
//!   an error saying to configure `rfc`).
//!
//! Nagle is off on every connection. Connectors retry with exponential
//! backoff (100 ms doubling to 5 s).
//!
//! Lifetime: a [`Tunnel`] runs until [`Tunnel::stop`] (the link goes
//! down as on the loss of its last circuit, the port leaves the switch,
//! the connections close and the connectors stop), a [`Listener`] until
//! [`Listener::stop`]. Dropping the handles does not stop them.

pub mod controller;
mod fast;
pub mod listener;
pub mod tls;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use unifab_fc::wire::Wwn;

pub use controller::InterSwitch;
pub use listener::Listener;
pub use tunnel::{CircuitStats, Tunnel, TunnelStats};

use crate::proto::compress;

/// RFC 3821 or unifab enhanced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkMode {
    /// Plain RFC 3821.
    #[default]
    Rfc,
    /// unifab enhanced mode (both ends unifab).
    Enhanced,
}

/// One circuit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitConfig {
    /// Where to connect (`None`: this side accepts).
    pub peer: Option<SocketAddr>,
    /// Local address to bind before connecting.
    pub local: Option<SocketAddr>,
    /// Relative share of traffic.
    pub weight: u32,
}

/// One tunnel.
#[derive(Debug, Clone)]
pub struct TunnelConfig {
    /// Operator name (`fcip0`); also the fabric port's name.
    pub name: String,
    /// Tunnel number, carried in the entity identifier.
    pub number: u32,
    /// The peer switch's name.
    pub peer_wwn: Wwn,
    /// Circuits.
    pub circuits: Vec<CircuitConfig>,
    /// Mode.
    pub mode: LinkMode,
    /// Compression (enhanced mode).
    pub compression: compress::Mode,
    /// FastWrite (enhanced mode, both ends must want it).
    pub fastwrite: bool,
    /// Tape pipelining (with FastWrite, both ends must want it):
    /// `proto::tape`.
    pub tape_pipelining: bool,
    /// Heartbeat / hello interval.
    pub keepalive: Duration,
    /// Silence after which a circuit (or the class F connection) is dead.
    pub dead_after: Duration,
    /// K_A_TOV announced in the special frame (ms); in enhanced mode also
    /// how long every circuit may be silent at once before the link is
    /// taken down.
    pub k_a_tov: u32,
    /// Unacknowledged bytes a tunnel may have in flight (enhanced). It
    /// also bounds what this end holds for the peer: batches waiting for
    /// an earlier one may take twice this (plus two batches); beyond that
    /// the circuit they came on is closed. Configure both ends alike.
    pub window_bytes: usize,
    /// Writes (batches, or frames in RFC mode) each circuit's socket writer
    /// may have queued. When every circuit that carries data is this far
    /// behind, the tunnel stops taking frames from the fabric
    /// (backpressure, as an E_Port withholding credit) instead of dropping
    /// them; a write for a circuit that is behind waits in a backlog of at
    /// most 8 MiB per circuit; in enhanced mode a batch that finds no room
    /// is kept and sent on a circuit with room, or later. At least 1.
    pub writer_queue: usize,
    /// TLS 1.3 on every circuit.
    pub tls: Option<Arc<tls::TlsSettings>>,
}

/// The most circuits a tunnel may have (Brocade's extension platforms
/// allow up to 12 a tunnel; the slots are the special frame's usage code).
pub const MAX_CIRCUITS: usize = 16;

impl TunnelConfig {
    /// Whether this side connects (its circuits name peers).
    pub fn connects(&self) -> bool {
        self.circuits.iter().any(|c| c.peer.is_some())
    }

    /// Defaults for a tunnel to `peer_wwn` with `circuits`.
    pub fn new(
        name: &str,
        number: u32,
        peer_wwn: Wwn,
        circuits: Vec<CircuitConfig>,
    ) -> TunnelConfig {
        TunnelConfig {
            name: name.to_string(),
            number,
            peer_wwn,
            circuits,
            mode: LinkMode::Rfc,
            compression: compress::Mode::None,
            fastwrite: false,
            tape_pipelining: false,
            keepalive: Duration::from_millis(20),
            dead_after: Duration::from_millis(80),
            k_a_tov: 10_000,
            window_bytes: 64 << 20,
            writer_queue: 16_384,
            tls: None,
        }
    }
}

/// TCP_INFO's smoothed round trip time of a socket, in µs.
pub(crate) fn tcp_rtt_us(fd: i32) -> Option<u32> {
    // SAFETY: getsockopt writes at most `len` bytes into `info`, a plain
    // C struct; `fd` may be stale, in which case the call fails.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (r == 0).then_some(info.tcpi_rtt)
    }
}
