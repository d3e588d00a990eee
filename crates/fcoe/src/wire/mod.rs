//! The FCoE wire format (FC-BB-6): Ethernet II with an optional 802.1Q
//! tag, the FCoE encapsulation of FC frames, and the FCoE Initialization
//! Protocol (FIP) with every operation and descriptor.
//!
//! Fixed layouts are zero-copy views (`EthernetFrame<T>`, `FcoeFrame<T>`,
//! `FipHeader<T>`) with owned `…Repr` types; FIP descriptor lists are
//! parsed with `nom` internally. Everything here builds without tokio.

pub mod ethernet;
pub mod fcoe;
pub mod fip;
pub mod mac;

pub use ethernet::{EtherType, EthernetFrame, EthernetRepr, VlanTag};
pub use fcoe::{BABY_JUMBO, FCOE_HEADER_LEN, FCOE_TRAILER_LEN, FcoeFrame, FcoeRepr};
pub use fip::{Descriptor, DescriptorType, FipFlags, FipHeader, FipOp, FipRepr, FipSubcode};
pub use mac::{FcMap, MacAddr};

/// Smallest Ethernet frame without its FCS (IEEE 802.3: 64 bytes with it).
pub const MIN_ETHERNET_FRAME: usize = 60;

/// Errors of the FCoE wire layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// An FCoE frame of a version unifab does not speak (the pre-T11
    /// encapsulation has its own EtherType use and a 2-byte header).
    #[error("FCoE version {0} (only version 0 is standard)")]
    FcoeVersion(u8),
    /// A FIP frame of a version other than 1.
    #[error("FIP version {0} (only version 1 is standard)")]
    FipVersion(u8),
    /// A SOF or EOF code FC-BB-6 does not define.
    #[error("invalid delimiter {0:#04x}")]
    Delimiter(u8),
    /// The FC CRC does not match the frame.
    #[error("FC CRC {received:#010x}, computed {computed:#010x}")]
    Crc {
        /// Computed over header and payload.
        computed: u32,
        /// Carried in the trailer.
        received: u32,
    },
    /// A FIP descriptor whose length word is wrong for its type.
    #[error("FIP descriptor type {ty} with length {words} words (expected {expected})")]
    DescriptorLength {
        /// Descriptor type.
        ty: u8,
        /// Length found, in 32-bit words.
        words: u8,
        /// What the type needs.
        expected: &'static str,
    },
    /// The descriptor list length disagrees with the descriptors.
    #[error("FIP descriptor list of {declared} words does not end on a descriptor")]
    DescriptorList {
        /// Declared length in words.
        declared: usize,
    },
    /// The frame is larger than the link allows (a baby jumbo of 2,500 bytes).
    #[error("frame of {0} bytes exceeds the 2,500-byte baby jumbo")]
    TooLong(usize),
    /// An FC frame (header and data field) that is not whole words:
    /// FC-FS-4 §9.5 pads the data field with fill bytes, counted in F_CTL.
    #[error("FC frame of {0} bytes is not whole words (the data field must be padded with fill)")]
    Unaligned(usize),
    /// The FC frame inside is malformed.
    #[error("FC frame: {0}")]
    Fc(#[from] unifab_fc::WireError),
}

// The length check and the big-endian field access are the FC family's
// one copy, in `unifab-fc`.
pub(crate) use unifab_fc::wire::{be, check_len};

impl From<unifab_fc::wire::Truncated> for WireError {
    fn from(t: unifab_fc::wire::Truncated) -> WireError {
        WireError::Truncated {
            needed: t.needed,
            got: t.got,
        }
    }
}
