//! What both roles share in full feature phase (RFC 7143 §4.2, §13): the
//! operational parameters a login settled ([`FfpParams`]), serial number
//! arithmetic for CmdSN and StatSN, the reserved tag, and the data segment
//! of an outgoing PDU. The target's and the initiator's sessions build on
//! this module and never import each other.

use bytes::Bytes;

use crate::login::LoginOutcome;
use crate::negotiate::Role;

/// The reserved tag value (ITT or TTT) meaning "none".
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Serial number arithmetic (RFC 1982 with SERIAL_BITS = 32), as
/// RFC 7143 §4.2.2.1 requires for CmdSN and StatSN.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a <= b` in serial number arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Operational parameters of a session and connection, as negotiated at
/// login (RFC 7143 §13), from our side of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FfpParams {
    /// Our MaxRecvDataSegmentLength: the largest data segment we accept.
    pub max_recv_data_segment_length: u32,
    /// The peer's MaxRecvDataSegmentLength: the largest data segment we
    /// send.
    pub max_xmit_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// FirstBurstLength.
    pub first_burst_length: u32,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel (only 0 is offered).
    pub error_recovery_level: u8,
    /// DefaultTime2Wait, for the Logout Response.
    pub default_time2wait: u16,
    /// DefaultTime2Retain, for the Logout Response.
    pub default_time2retain: u16,
    /// iSCSIProtocolLevel (2: the RFC 7144 task management functions).
    pub protocol_level: u8,
}

impl Default for FfpParams {
    /// The RFC 7143 defaults (and no iSCSIProtocolLevel negotiated).
    fn default() -> Self {
        FfpParams {
            max_recv_data_segment_length: 8192,
            max_xmit_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            default_time2wait: 2,
            default_time2retain: 20,
            protocol_level: 0,
        }
    }
}

impl FfpParams {
    /// The parameters a login produced, seen from `role`'s side: each
    /// side's MaxRecvDataSegmentLength is what it accepts and what the
    /// other side may send.
    pub fn from_login(o: &LoginOutcome, role: Role) -> FfpParams {
        let c = &o.connection;
        let (ours, theirs) = match role {
            Role::Target => (
                c.target_max_recv_data_segment_length,
                c.initiator_max_recv_data_segment_length,
            ),
            Role::Initiator => (
                c.initiator_max_recv_data_segment_length,
                c.target_max_recv_data_segment_length,
            ),
        };
        let s = &o.session;
        FfpParams {
            max_recv_data_segment_length: ours,
            max_xmit_data_segment_length: theirs,
            max_burst_length: s.max_burst_length,
            first_burst_length: s.first_burst_length,
            initial_r2t: s.initial_r2t,
            immediate_data: s.immediate_data,
            max_outstanding_r2t: u32::from(s.max_outstanding_r2t),
            data_pdu_in_order: s.data_pdu_in_order,
            data_sequence_in_order: s.data_sequence_in_order,
            error_recovery_level: s.error_recovery_level,
            default_time2wait: s.default_time2wait,
            default_time2retain: s.default_time2retain,
            protocol_level: s.protocol_level,
        }
    }

    /// The same parameters seen from the other side of the connection.
    pub fn mirrored(self) -> FfpParams {
        FfpParams {
            max_recv_data_segment_length: self.max_xmit_data_segment_length,
            max_xmit_data_segment_length: self.max_recv_data_segment_length,
            ..self
        }
    }
}

/// Payload of an outgoing PDU: zero, one or several slices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DataSegment {
    /// No data segment.
    #[default]
    None,
    /// One slice.
    One(Bytes),
    /// Several slices, sent back to back (Data-In spanning LU buffers).
    Many(Vec<Bytes>),
}

impl DataSegment {
    /// Total length.
    pub fn len(&self) -> usize {
        match self {
            DataSegment::None => 0,
            DataSegment::One(b) => b.len(),
            DataSegment::Many(v) => v.iter().map(Bytes::len).sum(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slices.
    pub fn slices(&self) -> &[Bytes] {
        match self {
            DataSegment::None => &[],
            DataSegment::One(b) => std::slice::from_ref(b),
            DataSegment::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_wrap() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0));
        assert!(!sn_lt(0, u32::MAX));
        assert!(sn_lt(0xffff_fffe, 1));
        assert!(!sn_lt(1, 0xffff_fffe));
        assert!(sn_le(5, 5));
        assert!(!sn_lt(5, 5));
    }

    #[test]
    fn mirrored_swaps_the_two_segment_lengths_only() {
        let p = FfpParams {
            max_recv_data_segment_length: 1 << 20,
            max_xmit_data_segment_length: 8192,
            ..FfpParams::default()
        };
        let m = p.mirrored();
        assert_eq!(m.max_recv_data_segment_length, 8192);
        assert_eq!(m.max_xmit_data_segment_length, 1 << 20);
        assert_eq!(m.mirrored(), p);
    }
}
