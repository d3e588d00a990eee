//! Sense data (SPC-4 §4.5).

use bytes::Bytes;

/// SPC-4 sense key (Table 28). Open newtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SenseKey(pub u8);

impl SenseKey {
    /// NO SENSE.
    pub const NO_SENSE: SenseKey = SenseKey(0x0);
    /// RECOVERED ERROR.
    pub const RECOVERED_ERROR: SenseKey = SenseKey(0x1);
    /// NOT READY.
    pub const NOT_READY: SenseKey = SenseKey(0x2);
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: SenseKey = SenseKey(0x3);
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: SenseKey = SenseKey(0x4);
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: SenseKey = SenseKey(0x5);
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: SenseKey = SenseKey(0x6);
    /// DATA PROTECT.
    pub const DATA_PROTECT: SenseKey = SenseKey(0x7);
    /// BLANK CHECK.
    pub const BLANK_CHECK: SenseKey = SenseKey(0x8);
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: SenseKey = SenseKey(0xb);
    /// COPY ABORTED.
    pub const COPY_ABORTED: SenseKey = SenseKey(0xa);
    /// MISCOMPARE.
    pub const MISCOMPARE: SenseKey = SenseKey(0xe);
}

/// An additional sense code and qualifier pair (SPC-4 Table 29).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Asc(pub u8, pub u8);

/// Establishes unit attention `code` in a queue of pending ones, as every
/// LU here keeps them: a reset-family code (`reset`) replaces what was
/// queued, a code already pending is not queued twice, and at most `cap`
/// are kept. Returns (removed, added), for a caller that counts them.
pub(crate) fn establish_ua(
    q: &mut std::collections::VecDeque<Asc>,
    code: Asc,
    reset: bool,
    cap: usize,
) -> (usize, usize) {
    let removed = if reset {
        let n = q.len();
        q.clear();
        n
    } else {
        0
    };
    if q.contains(&code) || q.len() >= cap {
        return (removed, 0);
    }
    q.push_back(code);
    (removed, 1)
}

/// Decoded sense: what a device server says about a CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Sense key.
    pub key: SenseKey,
    /// ASC and ASCQ.
    pub asc: Asc,
    /// INFORMATION field (e.g. the LBA of a miscompare or medium error),
    /// sets VALID when present.
    pub information: Option<u32>,
    /// Sense-key specific bytes 15..18 with SKSV (bit 7 of byte 15) set by
    /// the constructor that fills them.
    pub key_specific: Option<[u8; 3]>,
    /// ILI bit.
    pub ili: bool,
}

impl Sense {
    /// Length of fixed-format sense as emitted (SPC-4 §4.5.3), 18 bytes.
    pub const FIXED_LEN: usize = 18;

    /// Sense with no information or sense-key specific field.
    pub const fn new(key: SenseKey, asc: Asc) -> Sense {
        Sense {
            key,
            asc,
            information: None,
            key_specific: None,
            ili: false,
        }
    }

    /// ILLEGAL REQUEST with a field pointer into the CDB (`c_d = true`) or
    /// the parameter list, at `byte` and optionally `bit` (SPC-4 §4.5.2.4.2).
    pub fn illegal_field(asc: Asc, in_cdb: bool, byte: u16, bit: Option<u8>) -> Sense {
        let mut b0 = 0x80u8; // SKSV
        if in_cdb {
            b0 |= 0x40; // C/D
        }
        if let Some(bit) = bit {
            b0 |= 0x08 | (bit & 0x07); // BPV + bit pointer
        }
        let [hi, lo] = byte.to_be_bytes();
        Sense {
            key: SenseKey::ILLEGAL_REQUEST,
            asc,
            information: None,
            key_specific: Some([b0, hi, lo]),
            ili: false,
        }
    }

    /// Sets the INFORMATION field.
    pub const fn with_information(mut self, information: u32) -> Sense {
        self.information = Some(information);
        self
    }

    /// Fixed-format sense data, response code 70h (current error).
    pub fn to_fixed(&self) -> [u8; Sense::FIXED_LEN] {
        let mut b = [0u8; Sense::FIXED_LEN];
        b[0] = 0x70;
        if let Some(info) = self.information {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&info.to_be_bytes());
        }
        b[2] = self.key.0 & 0x0f;
        if self.ili {
            b[2] |= 0x20;
        }
        b[7] = (Sense::FIXED_LEN - 8) as u8;
        b[12] = self.asc.0;
        b[13] = self.asc.1;
        if let Some(ks) = self.key_specific {
            b[15..18].copy_from_slice(&ks);
        }
        b
    }

    /// Fixed-format sense as a shared buffer.
    pub fn to_fixed_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.to_fixed())
    }

    /// Parses the key, ASC and ASCQ from fixed (70h/71h) or descriptor
    /// (72h/73h) sense data; `None` if it is neither or too short.
    pub fn parse(data: &[u8]) -> Option<Sense> {
        let code = data.first()? & 0x7f;
        match code {
            0x70 | 0x71 => {
                let key = SenseKey(data.get(2)? & 0x0f);
                let asc = Asc(*data.get(12).unwrap_or(&0), *data.get(13).unwrap_or(&0));
                let information = if data[0] & 0x80 != 0 {
                    let info = data.get(3..7)?;
                    Some(u32::from_be_bytes([info[0], info[1], info[2], info[3]]))
                } else {
                    None
                };
                let key_specific = data
                    .get(15..18)
                    .filter(|ks| ks[0] & 0x80 != 0)
                    .map(|ks| [ks[0], ks[1], ks[2]]);
                Some(Sense {
                    key,
                    asc,
                    information,
                    key_specific,
                    ili: data[2] & 0x20 != 0,
                })
            }
            0x72 | 0x73 => {
                let key = SenseKey(data.get(1)? & 0x0f);
                let asc = Asc(*data.get(2)?, *data.get(3)?);
                Some(Sense::new(key, asc))
            }
            _ => None,
        }
    }
}

/// Additional sense codes used by unifab (SPC-4 Annex F / Table 29 names).
#[allow(missing_docs)]
pub mod asc {
    use super::Asc;
    pub const NO_ADDITIONAL_SENSE: Asc = Asc(0x00, 0x00);
    pub const LOGICAL_UNIT_NOT_READY_CAUSE_NOT_REPORTABLE: Asc = Asc(0x04, 0x00);
    pub const LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS: Asc = Asc(0x04, 0x1b);
    pub const LOGICAL_UNIT_NOT_READY_MANUAL_INTERVENTION_REQUIRED: Asc = Asc(0x04, 0x03);
    pub const LOGICAL_UNIT_NOT_ACCESSIBLE_ASYMMETRIC_ACCESS_STATE_TRANSITION: Asc = Asc(0x04, 0x0a);
    pub const LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE: Asc = Asc(0x04, 0x0b);
    pub const LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE: Asc = Asc(0x04, 0x0c);
    pub const LOGICAL_UNIT_NOT_READY_OFFLINE: Asc = Asc(0x04, 0x12);
    pub const LOGICAL_UNIT_COMMUNICATION_FAILURE: Asc = Asc(0x08, 0x00);
    pub const LOGICAL_UNIT_COMMUNICATION_TIME_OUT: Asc = Asc(0x08, 0x01);
    pub const WRITE_ERROR: Asc = Asc(0x0c, 0x00);
    pub const UNRECOVERED_READ_ERROR: Asc = Asc(0x11, 0x00);
    pub const MISCOMPARE_DURING_VERIFY_OPERATION: Asc = Asc(0x1d, 0x00);
    pub const PARAMETER_LIST_LENGTH_ERROR: Asc = Asc(0x1a, 0x00);
    pub const INVALID_COMMAND_OPERATION_CODE: Asc = Asc(0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Asc = Asc(0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Asc = Asc(0x24, 0x00);
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Asc = Asc(0x25, 0x00);
    pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: Asc = Asc(0x27, 0x07);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Asc = Asc(0x26, 0x00);
    pub const PARAMETER_NOT_SUPPORTED: Asc = Asc(0x26, 0x01);
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: Asc = Asc(0x26, 0x04);
    pub const WRITE_PROTECTED: Asc = Asc(0x27, 0x00);
    pub const POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED: Asc = Asc(0x29, 0x00);
    pub const POWER_ON_OCCURRED: Asc = Asc(0x29, 0x01);
    pub const BUS_DEVICE_RESET_FUNCTION_OCCURRED: Asc = Asc(0x29, 0x03);
    pub const I_T_NEXUS_LOSS_OCCURRED: Asc = Asc(0x29, 0x07);
    pub const PARAMETERS_CHANGED: Asc = Asc(0x2a, 0x00);
    pub const MODE_PARAMETERS_CHANGED: Asc = Asc(0x2a, 0x01);
    /// A logical block provisioning soft threshold was reached (SBC-3
    /// §4.7.3.7; UNIT ATTENTION).
    pub const THIN_PROVISIONING_SOFT_THRESHOLD_REACHED: Asc = Asc(0x38, 0x07);
    pub const RESERVATIONS_PREEMPTED: Asc = Asc(0x2a, 0x03);
    pub const RESERVATIONS_RELEASED: Asc = Asc(0x2a, 0x04);
    pub const REGISTRATIONS_PREEMPTED: Asc = Asc(0x2a, 0x05);
    pub const CAPACITY_DATA_HAS_CHANGED: Asc = Asc(0x2a, 0x09);
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Asc = Asc(0x2a, 0x06);
    pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Asc = Asc(0x2f, 0x00);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Asc = Asc(0x39, 0x00);
    pub const MEDIUM_NOT_PRESENT: Asc = Asc(0x3a, 0x00);
    pub const REPORTED_LUNS_DATA_HAS_CHANGED: Asc = Asc(0x3f, 0x0e);
    pub const INTERNAL_TARGET_FAILURE: Asc = Asc(0x44, 0x00);
    pub const INVALID_MESSAGE_ERROR: Asc = Asc(0x49, 0x00);
    pub const COMMAND_PHASE_ERROR: Asc = Asc(0x4a, 0x00);
    pub const DATA_PHASE_ERROR: Asc = Asc(0x4b, 0x00);
    pub const INITIATOR_DETECTED_ERROR_MESSAGE_RECEIVED: Asc = Asc(0x48, 0x00);
    pub const OVERLAPPED_COMMANDS_ATTEMPTED: Asc = Asc(0x4e, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: Asc = Asc(0x53, 0x02);
    pub const SANITIZE_COMMAND_FAILED: Asc = Asc(0x31, 0x03);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Asc = Asc(0x55, 0x04);
    pub const INSUFFICIENT_RESOURCES: Asc = Asc(0x55, 0x03);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_round_trip() {
        let s = Sense::illegal_field(asc::INVALID_FIELD_IN_CDB, true, 2, Some(1));
        let b = s.to_fixed();
        assert_eq!(b[0], 0x70);
        assert_eq!(b[2], 0x05);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x24, 0x00));
        assert_eq!(&b[15..18], &[0xc9, 0x00, 0x02]);
        assert_eq!(Sense::parse(&b), Some(s));

        let m = Sense::new(
            SenseKey::MISCOMPARE,
            asc::MISCOMPARE_DURING_VERIFY_OPERATION,
        )
        .with_information(7);
        let b = m.to_fixed();
        assert_eq!(b[0], 0xf0);
        assert_eq!(&b[3..7], &[0, 0, 0, 7]);
        assert_eq!(Sense::parse(&b), Some(m));
    }

    #[test]
    fn parse_rejects_garbage() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70]), None);
        assert_eq!(Sense::parse(&[0x12, 0, 0, 0]), None);
        let d = Sense::parse(&[0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0]);
        assert_eq!(
            d.map(|s| (s.key, s.asc)),
            Some((SenseKey::UNIT_ATTENTION, Asc(0x29, 0)))
        );
    }
}
