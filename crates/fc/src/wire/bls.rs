//! Basic link services (FC-LS-3 §5): ABTS, BA_ACC, BA_RJT (and the
//! payload-less NOP, RMC, PRMT). A BLS frame is identified by R_CTL; its
//! payload is fixed.

use bytes::Bytes;

use super::be;
use super::header::RCtl;
use super::{OxId, RxId, WireError, check_len};

/// BA_RJT reason codes (FC-LS-3 Table 14). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BaRjtReason(pub u8);

#[allow(missing_docs)]
impl BaRjtReason {
    pub const INVALID_COMMAND_CODE: BaRjtReason = BaRjtReason(0x01);
    pub const LOGICAL_ERROR: BaRjtReason = BaRjtReason(0x03);
    pub const LOGICAL_BUSY: BaRjtReason = BaRjtReason(0x05);
    pub const PROTOCOL_ERROR: BaRjtReason = BaRjtReason(0x07);
    pub const UNABLE_TO_PERFORM: BaRjtReason = BaRjtReason(0x09);
    pub const VENDOR_UNIQUE: BaRjtReason = BaRjtReason(0xff);
}

/// BA_RJT reason explanations (FC-LS-3 Table 15). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BaRjtExplanation(pub u8);

#[allow(missing_docs)]
impl BaRjtExplanation {
    pub const NONE: BaRjtExplanation = BaRjtExplanation(0x00);
    pub const INVALID_OX_ID_RX_ID: BaRjtExplanation = BaRjtExplanation(0x03);
    pub const SEQUENCE_ABORTED_NO_INFO: BaRjtExplanation = BaRjtExplanation(0x05);
}

/// BA_ACC payload (FC-LS-3 §5.2.2), 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BaAcc {
    /// SEQ_ID validity: 80h when `last_seq_id` is meaningful, else 00h.
    pub seq_id_validity: u8,
    /// SEQ_ID of the last deliverable sequence.
    pub last_seq_id: u8,
    /// OX_ID of the aborted exchange.
    pub ox_id: OxId,
    /// RX_ID of the aborted exchange.
    pub rx_id: RxId,
    /// Low SEQ_CNT.
    pub low_seq_cnt: u16,
    /// High SEQ_CNT.
    pub high_seq_cnt: u16,
}

/// BA_RJT payload (FC-LS-3 §5.2.3), 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BaRjt {
    /// Reason.
    pub reason: BaRjtReason,
    /// Explanation.
    pub explanation: BaRjtExplanation,
    /// Vendor unique.
    pub vendor: u8,
}

impl From<&WireError> for BaRjt {
    /// A malformed BLS request gets a protocol-error BA_RJT.
    fn from(_: &WireError) -> BaRjt {
        BaRjt {
            reason: BaRjtReason::PROTOCOL_ERROR,
            explanation: BaRjtExplanation::NONE,
            vendor: 0,
        }
    }
}

/// A basic link service frame's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlsRepr {
    /// ABTS (abort sequence/exchange). The header's Parameter bit 0 says
    /// which: 0 = abort the exchange, 1 = abort sequences. The payload is
    /// empty (or ignored).
    Abts,
    /// BA_ACC.
    BaAcc(BaAcc),
    /// BA_RJT.
    BaRjt(BaRjt),
    /// NOP, RMC, PRMT or another BLS code: payload kept.
    Other {
        /// R_CTL.
        r_ctl: RCtl,
        /// The payload.
        payload: Bytes,
    },
}

impl BlsRepr {
    /// Parses a BLS payload given the frame's R_CTL.
    pub fn parse(r_ctl: RCtl, payload: &Bytes) -> Result<BlsRepr, WireError> {
        let p = &payload[..];
        match r_ctl {
            RCtl::ABTS => Ok(BlsRepr::Abts),
            RCtl::BA_ACC => {
                check_len(p, 12)?;
                Ok(BlsRepr::BaAcc(BaAcc {
                    seq_id_validity: p[0],
                    last_seq_id: p[1],
                    ox_id: OxId(be::u16_at(p, 4)),
                    rx_id: RxId(be::u16_at(p, 6)),
                    low_seq_cnt: be::u16_at(p, 8),
                    high_seq_cnt: be::u16_at(p, 10),
                }))
            }
            RCtl::BA_RJT => {
                check_len(p, 4)?;
                Ok(BlsRepr::BaRjt(BaRjt {
                    reason: BaRjtReason(p[1]),
                    explanation: BaRjtExplanation(p[2]),
                    vendor: p[3],
                }))
            }
            other if other.is_bls() => Ok(BlsRepr::Other {
                r_ctl: other,
                payload: payload.clone(),
            }),
            _ => Err(WireError::InvalidField("R_CTL is not a basic link service")),
        }
    }

    /// The R_CTL this frame is sent with.
    pub fn r_ctl(&self) -> RCtl {
        match self {
            BlsRepr::Abts => RCtl::ABTS,
            BlsRepr::BaAcc(_) => RCtl::BA_ACC,
            BlsRepr::BaRjt(_) => RCtl::BA_RJT,
            BlsRepr::Other { r_ctl, .. } => *r_ctl,
        }
    }

    /// Payload length.
    pub fn buffer_len(&self) -> usize {
        match self {
            BlsRepr::Abts => 0,
            BlsRepr::BaAcc(_) => 12,
            BlsRepr::BaRjt(_) => 4,
            BlsRepr::Other { payload, .. } => payload.len(),
        }
    }

    /// Writes the payload into `buf` (at least [`BlsRepr::buffer_len`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, self.buffer_len())?;
        match self {
            BlsRepr::Abts => {}
            BlsRepr::BaAcc(a) => {
                buf[0] = a.seq_id_validity;
                buf[1] = a.last_seq_id;
                buf[2] = 0;
                buf[3] = 0;
                be::put_u16(buf, 4, a.ox_id.0);
                be::put_u16(buf, 6, a.rx_id.0);
                be::put_u16(buf, 8, a.low_seq_cnt);
                be::put_u16(buf, 10, a.high_seq_cnt);
            }
            BlsRepr::BaRjt(r) => {
                buf[0] = 0;
                buf[1] = r.reason.0;
                buf[2] = r.explanation.0;
                buf[3] = r.vendor;
            }
            BlsRepr::Other { payload, .. } => buf[..payload.len()].copy_from_slice(payload),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ba_acc_and_rjt_round_trip() {
        let acc = BlsRepr::BaAcc(BaAcc {
            seq_id_validity: 0x80,
            last_seq_id: 3,
            ox_id: OxId(0x1234),
            rx_id: RxId(0x5678),
            low_seq_cnt: 0,
            high_seq_cnt: 0xffff,
        });
        let mut b = vec![0u8; acc.buffer_len()];
        acc.emit(&mut b).unwrap();
        assert_eq!(b, [0x80, 3, 0, 0, 0x12, 0x34, 0x56, 0x78, 0, 0, 0xff, 0xff]);
        assert_eq!(BlsRepr::parse(RCtl::BA_ACC, &Bytes::from(b)).unwrap(), acc);
        let rjt = BlsRepr::BaRjt(BaRjt {
            reason: BaRjtReason::LOGICAL_ERROR,
            explanation: BaRjtExplanation::INVALID_OX_ID_RX_ID,
            vendor: 0,
        });
        let mut b = vec![0u8; 4];
        rjt.emit(&mut b).unwrap();
        assert_eq!(b, [0, 3, 3, 0]);
        assert_eq!(BlsRepr::parse(RCtl::BA_RJT, &Bytes::from(b)).unwrap(), rjt);
        for n in 0..12 {
            assert!(BlsRepr::parse(RCtl::BA_ACC, &Bytes::from(vec![0; n])).is_err());
        }
        assert!(BlsRepr::parse(RCtl::ELS_REQUEST, &Bytes::new()).is_err());
        assert_eq!(
            BlsRepr::parse(RCtl::ABTS, &Bytes::new()).unwrap(),
            BlsRepr::Abts
        );
    }
}
