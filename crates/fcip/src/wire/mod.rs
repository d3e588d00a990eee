//! The FCIP wire format: the RFC 3643 encapsulation header, whole
//! encapsulated frames with their SOF/EOF words, the RFC 3821 special
//! frame, the switch internal link services a VE_Port speaks, and the
//! unifab enhanced-mode batch frames. Views and representations; no tokio.

pub mod encap;
pub mod enhanced;
pub mod frame;
pub mod framing;
pub mod fsf;
pub mod sw_ils;

pub use encap::{ENCAP_LEN, EncapFlags, EncapHeader, EncapRepr, PFlags, Protocol};
pub use frame::{FcipFrame, FcipFrameRepr};
pub use fsf::{Capabilities, EntityId, SpecialFrame, SpecialFrameRepr, UsageFlags};
pub use sw_ils::{SwIlsCode, SwIlsRepr};

/// Errors of the FCIP wire layer.
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
    /// Protocol# or Version is not FCIP's.
    #[error("not FCIP: protocol {protocol}, version {version}")]
    BadProtocol {
        /// Protocol#.
        protocol: u8,
        /// Version.
        version: u8,
    },
    /// A field and its ones' complement (or a repeated word) disagree.
    #[error("complement mismatch in {0}")]
    Complement(&'static str),
    /// Frame Length outside 16–544 words, or not what the frame holds.
    #[error("invalid frame length: {0} words")]
    FrameLength(u16),
    /// The header CRC does not match (CRCV set).
    #[error("header CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    HeaderCrc {
        /// Computed.
        computed: u32,
        /// Received.
        received: u32,
    },
    /// The FC CRC does not match.
    #[error("FC CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    FcCrc {
        /// Computed.
        computed: u32,
        /// Received.
        received: u32,
    },
    /// A malformed or undefined SOF/EOF word.
    #[error("invalid {0} word")]
    Delimiter(&'static str),
    /// A length field disagrees with the structure.
    #[error("bad length in {what}: {len}")]
    BadLength {
        /// Which length.
        what: &'static str,
        /// The value found.
        len: usize,
    },
    /// A field holds a value the standard forbids.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// The FC frame inside did not parse.
    #[error("FC frame: {0}")]
    Fc(unifab_fc::WireError),
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
