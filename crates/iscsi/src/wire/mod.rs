//! The iSCSI wire format (RFC 7143 §11): zero-copy BHS views, owned PDU
//! header representations, AHS, CRC32C digests, and stream framing.
//!
//! Usable without tokio (`default-features = false`).

pub mod ahs;
pub mod bhs;
pub mod digest;
pub mod frame;
pub mod pdu;

pub use ahs::{Ahs, AhsType};
pub use bhs::{BHS_LEN, Bhs, Opcode};
pub use frame::{Check, Digests, Framer, HeaderBlock, PduFrame, encode_header, encode_pdu};
pub use pdu::*;

use bytes::Bytes;

/// Errors of the wire layer. Each maps to the answer the protocol gives
/// (see [`WireError::reject_reason`]).
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
    /// An opcode RFC 7143 does not define.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Byte 0 bit 7 is set.
    #[error("reserved bit 7 of byte 0 is set")]
    ReservedBitSet,
    /// DataSegmentLength above the declared MaxRecvDataSegmentLength.
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    DataSegmentTooLong {
        /// Announced length.
        len: u32,
        /// Our limit.
        max: u32,
    },
    /// Header digest mismatch: the connection must be dropped.
    #[error("header digest mismatch: computed {expected:#010x}, received {got:#010x}")]
    HeaderDigest {
        /// Computed.
        expected: u32,
        /// Received.
        got: u32,
    },
    /// Data digest mismatch: the PDU was consumed; Reject it.
    #[error("data digest mismatch: computed {expected:#010x}, received {got:#010x}")]
    DataDigest {
        /// The header of the PDU, for the Reject's data segment.
        bhs: Bytes,
        /// Computed.
        expected: u32,
        /// Received.
        got: u32,
    },
    /// A malformed AHS.
    #[error("bad AHS: {0}")]
    BadAhs(&'static str),
    /// A field holds a value the RFC forbids.
    #[error("invalid PDU field: {0}")]
    InvalidField(&'static str),
}

impl WireError {
    /// The Reject reason for this error, or `None` where the connection
    /// must be dropped instead (lost framing: header digest, over-long
    /// segment, truncation).
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            WireError::UnknownOpcode(_) => Some(RejectReason::COMMAND_NOT_SUPPORTED),
            WireError::DataDigest { .. } => Some(RejectReason::DATA_DIGEST_ERROR),
            WireError::BadAhs(_) | WireError::InvalidField(_) | WireError::ReservedBitSet => {
                Some(RejectReason::INVALID_PDU_FIELD)
            }
            WireError::Truncated { .. }
            | WireError::DataSegmentTooLong { .. }
            | WireError::HeaderDigest { .. } => None,
        }
    }
}
