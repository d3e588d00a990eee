//! Ethernet links (feature `io`): what an FCoE port sends and receives
//! frames through. A link is split into a receive half ([`EthRx`]) and a
//! transmit half ([`EthTx`]) so that one driver task can wait for frames
//! while it sends.
//!
//! - [`memory`]: an in-memory segment for deterministic tests.
//! - [`af_packet`]: an AF_PACKET socket (pnet) with a classic BPF filter
//!   that takes only FCoE and FIP frames the host did not send.
//! - `af_xdp` (feature `af-xdp`): AF_XDP through xsk-rs, with unifab's
//!   own XDP program redirecting only FCoE and FIP to the socket.

pub mod af_packet;
#[cfg(feature = "af-xdp")]
pub mod af_xdp;
pub mod memory;

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;

use bytes::Bytes;

use crate::out::EthOut;
use crate::wire::{MacAddr, WireError};

/// A boxed future borrowing the link.
pub type LinkFuture<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// The receive half of a link.
pub trait EthRx: Send + 'static {
    /// Waits until frames arrive and appends every frame already there (at
    /// least one) to `out`. Cancel-safe: a frame is taken only when it is
    /// appended.
    fn recv<'a>(&'a mut self, out: &'a mut Vec<Bytes>) -> LinkFuture<'a>;
}

/// The transmit half of a link.
pub trait EthTx: Send + 'static {
    /// Queues a frame of at most `len` bytes, laid out by `fill` into the
    /// link's transmit buffer (it returns the length it wrote). A link
    /// with no room drops the frame and says so.
    fn send(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<usize, WireError>,
    ) -> io::Result<()>;

    /// Hands queued frames to the wire.
    fn flush(&mut self) -> io::Result<()>;
}

/// An opened link.
pub struct EthLink {
    /// Receive half.
    pub rx: Box<dyn EthRx>,
    /// Transmit half.
    pub tx: Box<dyn EthTx>,
    /// The interface's MAC address.
    pub mac: MacAddr,
    /// What it is ("af_packet:veth0", …).
    pub name: String,
}

impl fmt::Debug for EthLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EthLink")
            .field("mac", &self.mac)
            .field("name", &self.name)
            .finish()
    }
}

/// Sends one queued frame of a state machine through `tx`.
pub fn send_out(tx: &mut dyn EthTx, frame: &EthOut) -> io::Result<()> {
    tx.send(frame.buffer_len(), &mut |buf| frame.emit(buf))
}

fn wire_err(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// Whether an Ethernet frame carries FCoE or FIP (with or without one
/// 802.1Q tag): what every link lets through.
pub fn is_fcoe_or_fip(frame: &[u8]) -> bool {
    let et = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    match et(12) {
        Some(0x8906 | 0x8914) => true,
        Some(0x8100) => matches!(et(16), Some(0x8906 | 0x8914)),
        _ => false,
    }
}
