//! The FC-2 frame header (FC-FS-4 §9): a 24-byte zero-copy view and its
//! owned representation. Every field and every F_CTL bit is reachable;
//! the representation keeps all 24 bytes, so parse followed by emit is the
//! identity for any header.

use std::fmt;

use super::be;
use super::{FcId, OxId, RxId, WireError};

/// Length of the frame header in bytes.
pub const HEADER_LEN: usize = 24;

/// Field offsets (FC-FS-4 Table 30). Names are the standard's.
#[allow(missing_docs)]
pub mod field {
    pub const R_CTL: usize = 0;
    pub const D_ID: usize = 1;
    pub const CS_CTL: usize = 4;
    pub const S_ID: usize = 5;
    pub const TYPE: usize = 8;
    pub const F_CTL: usize = 9;
    pub const SEQ_ID: usize = 12;
    pub const DF_CTL: usize = 13;
    pub const SEQ_CNT: usize = 14;
    pub const OX_ID: usize = 16;
    pub const RX_ID: usize = 18;
    pub const PARAMETER: usize = 20;
}

/// R_CTL: routing (high nibble) and information category (low nibble).
/// Open: every value parses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RCtl(pub u8);

#[allow(missing_docs)]
impl RCtl {
    // Device data (routing 0h) with FC-4 information categories.
    pub const UNCATEGORIZED: RCtl = RCtl(0x00);
    /// Solicited data: FCP_DATA.
    pub const SOLICITED_DATA: RCtl = RCtl(0x01);
    /// Unsolicited control: CT requests (FC-GS), SW_ILS requests.
    pub const UNSOLICITED_CONTROL: RCtl = RCtl(0x02);
    /// Solicited control: CT replies, SW_ILS replies.
    pub const SOLICITED_CONTROL: RCtl = RCtl(0x03);
    pub const UNSOLICITED_DATA: RCtl = RCtl(0x04);
    /// Data descriptor: FCP_XFER_RDY.
    pub const DATA_DESCRIPTOR: RCtl = RCtl(0x05);
    /// Unsolicited command: FCP_CMND.
    pub const UNSOLICITED_COMMAND: RCtl = RCtl(0x06);
    /// Command status: FCP_RSP.
    pub const COMMAND_STATUS: RCtl = RCtl(0x07);
    pub const FCP_DATA: RCtl = RCtl::SOLICITED_DATA;
    pub const FCP_XFER_RDY: RCtl = RCtl::DATA_DESCRIPTOR;
    pub const FCP_CMND: RCtl = RCtl::UNSOLICITED_COMMAND;
    pub const FCP_RSP: RCtl = RCtl::COMMAND_STATUS;
    pub const CT_REQUEST: RCtl = RCtl::UNSOLICITED_CONTROL;
    pub const CT_REPLY: RCtl = RCtl::SOLICITED_CONTROL;
    /// Extended link service request.
    pub const ELS_REQUEST: RCtl = RCtl(0x22);
    /// Extended link service reply.
    pub const ELS_REPLY: RCtl = RCtl(0x23);
    /// FC-4 link service request (FCP: SRR).
    pub const FC4_LS_REQUEST: RCtl = RCtl(0x32);
    /// FC-4 link service reply.
    pub const FC4_LS_REPLY: RCtl = RCtl(0x33);
    // Basic link services (routing 8h).
    pub const BA_NOP: RCtl = RCtl(0x80);
    pub const ABTS: RCtl = RCtl(0x81);
    pub const RMC: RCtl = RCtl(0x82);
    pub const BA_ACC: RCtl = RCtl(0x84);
    pub const BA_RJT: RCtl = RCtl(0x85);
    pub const PRMT: RCtl = RCtl(0x86);
    // Link control (routing Ch).
    pub const ACK_1: RCtl = RCtl(0xc0);
    pub const ACK_0: RCtl = RCtl(0xc1);
    pub const P_RJT: RCtl = RCtl(0xc2);
    pub const F_RJT: RCtl = RCtl(0xc3);
    pub const P_BSY: RCtl = RCtl(0xc4);
    pub const F_BSY_DATA: RCtl = RCtl(0xc5);
    pub const F_BSY_LC: RCtl = RCtl(0xc6);
    pub const LCR: RCtl = RCtl(0xc7);
    pub const NTY: RCtl = RCtl(0xc8);
    pub const END: RCtl = RCtl(0xc9);

    /// Routing bits (R_CTL bits 7–4).
    pub const fn routing(self) -> u8 {
        self.0 >> 4
    }

    /// Information category (R_CTL bits 3–0).
    pub const fn information(self) -> u8 {
        self.0 & 0x0f
    }

    /// A basic link service frame (routing 8h).
    pub const fn is_bls(self) -> bool {
        self.routing() == 0x8
    }

    /// A link control frame (routing Ch).
    pub const fn is_link_control(self) -> bool {
        self.routing() == 0xc
    }
}

impl fmt::Debug for RCtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RCtl({:#04x})", self.0)
    }
}

/// TYPE: the data structure type (FC-FS-4 Table 36). Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FcType(pub u8);

#[allow(missing_docs)]
impl FcType {
    pub const BLS: FcType = FcType(0x00);
    pub const ELS: FcType = FcType(0x01);
    pub const LLC_SNAP: FcType = FcType(0x04);
    pub const IP: FcType = FcType(0x05);
    pub const FCP: FcType = FcType(0x08);
    pub const GPP: FcType = FcType(0x09);
    pub const SB_TO_CU: FcType = FcType(0x1b);
    pub const SB_FROM_CU: FcType = FcType(0x1c);
    /// FC-GS common transport.
    pub const CT: FcType = FcType(0x20);
    /// Switch internal link services (FC-SW).
    pub const SW_ILS: FcType = FcType(0x22);
    pub const AL: FcType = FcType(0x23);
    pub const SNMP: FcType = FcType(0x24);
    pub const NVME: FcType = FcType(0x28);
}

impl fmt::Debug for FcType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FcType({:#04x})", self.0)
    }
}

/// F_CTL, the 24-bit frame control field (FC-FS-4 Table 37).
/// Every bit has a constant; obsolete bits are kept so that any value
/// round-trips.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FCtl(pub u32);

impl FCtl {
    /// Bit 23, Exchange Context: set when the sender is the exchange responder.
    pub const EXCHANGE_CONTEXT: u32 = 1 << 23;
    /// Bit 22, Sequence Context: set when the sender is the sequence recipient.
    pub const SEQUENCE_CONTEXT: u32 = 1 << 22;
    /// Bit 21, First_Sequence of the exchange.
    pub const FIRST_SEQUENCE: u32 = 1 << 21;
    /// Bit 20, Last_Sequence of the exchange.
    pub const LAST_SEQUENCE: u32 = 1 << 20;
    /// Bit 19, End_Sequence: last frame of the sequence.
    pub const END_SEQUENCE: u32 = 1 << 19;
    /// Bit 18, End_Connection (class 1, obsolete).
    pub const END_CONNECTION: u32 = 1 << 18;
    /// Bit 17, CS_CTL/Priority enable: byte 4 holds a priority.
    pub const PRIORITY_ENABLE: u32 = 1 << 17;
    /// Bit 16, Sequence Initiative transferred.
    pub const SEQUENCE_INITIATIVE: u32 = 1 << 16;
    /// Bit 15, X_ID reassigned (obsolete).
    pub const X_ID_REASSIGNED: u32 = 1 << 15;
    /// Bit 14, Invalidate X_ID (obsolete).
    pub const INVALIDATE_X_ID: u32 = 1 << 14;
    /// Bits 13–12, ACK_Form.
    pub const ACK_FORM_MASK: u32 = 0b11 << 12;
    /// Bit 11, data compression (obsolete).
    pub const DATA_COMPRESSION: u32 = 1 << 11;
    /// Bit 10, data encryption (obsolete).
    pub const DATA_ENCRYPTION: u32 = 1 << 10;
    /// Bit 9, Retransmitted Sequence.
    pub const RETRANSMITTED_SEQUENCE: u32 = 1 << 9;
    /// Bit 8, Unidirectional Transmit (class 1) / reserved.
    pub const UNIDIRECTIONAL_TRANSMIT: u32 = 1 << 8;
    /// Bits 7–6, Continue Sequence Condition.
    pub const CONTINUE_SEQUENCE_MASK: u32 = 0b11 << 6;
    /// Bits 5–4, Abort Sequence Condition (in the first frame of an
    /// exchange: the exchange error policy).
    pub const ABORT_SEQUENCE_MASK: u32 = 0b11 << 4;
    /// Bit 3, Relative Offset present: the Parameter field holds it.
    pub const RELATIVE_OFFSET: u32 = 1 << 3;
    /// Bit 2, Exchange Reassembly (reserved).
    pub const EXCHANGE_REASSEMBLY: u32 = 1 << 2;
    /// Bits 1–0, Fill Data Bytes at the end of the payload.
    pub const FILL_BYTES_MASK: u32 = 0b11;

    /// A request's first frame: originator, sequence initiator, first
    /// sequence, end of sequence, sequence initiative transferred.
    pub const fn request() -> FCtl {
        FCtl(Self::FIRST_SEQUENCE | Self::END_SEQUENCE | Self::SEQUENCE_INITIATIVE)
    }

    /// A single-frame reply that ends the exchange: responder, last
    /// sequence, end of sequence.
    pub const fn last_reply() -> FCtl {
        FCtl(Self::EXCHANGE_CONTEXT | Self::LAST_SEQUENCE | Self::END_SEQUENCE)
    }

    /// The raw 24 bits.
    pub const fn bits(self) -> u32 {
        self.0 & 0xff_ffff
    }

    /// True when every bit of `mask` is set.
    pub const fn contains(self, mask: u32) -> bool {
        self.0 & mask == mask
    }

    /// With `mask` set or cleared.
    #[must_use]
    pub const fn with(self, mask: u32, on: bool) -> FCtl {
        if on {
            FCtl(self.0 | mask)
        } else {
            FCtl(self.0 & !mask)
        }
    }

    /// The sender is the exchange responder.
    pub const fn exchange_responder(self) -> bool {
        self.contains(Self::EXCHANGE_CONTEXT)
    }

    /// The sender is the sequence recipient.
    pub const fn sequence_recipient(self) -> bool {
        self.contains(Self::SEQUENCE_CONTEXT)
    }

    /// First sequence of the exchange.
    pub const fn first_sequence(self) -> bool {
        self.contains(Self::FIRST_SEQUENCE)
    }

    /// Last sequence of the exchange.
    pub const fn last_sequence(self) -> bool {
        self.contains(Self::LAST_SEQUENCE)
    }

    /// Last frame of the sequence.
    pub const fn end_sequence(self) -> bool {
        self.contains(Self::END_SEQUENCE)
    }

    /// Sequence initiative transferred to the recipient.
    pub const fn sequence_initiative(self) -> bool {
        self.contains(Self::SEQUENCE_INITIATIVE)
    }

    /// The parameter field is a relative offset.
    pub const fn relative_offset_present(self) -> bool {
        self.contains(Self::RELATIVE_OFFSET)
    }

    /// Retransmitted sequence.
    pub const fn retransmitted(self) -> bool {
        self.contains(Self::RETRANSMITTED_SEQUENCE)
    }

    /// CS_CTL/Priority enable.
    pub const fn priority_enable(self) -> bool {
        self.contains(Self::PRIORITY_ENABLE)
    }

    /// ACK_Form (0: no assistance, 1: ACK_1, 2: reserved, 3: ACK_0).
    pub const fn ack_form(self) -> u8 {
        ((self.0 & Self::ACK_FORM_MASK) >> 12) as u8
    }

    /// Continue Sequence Condition.
    pub const fn continue_sequence_condition(self) -> u8 {
        ((self.0 & Self::CONTINUE_SEQUENCE_MASK) >> 6) as u8
    }

    /// Abort Sequence Condition / exchange error policy.
    pub const fn abort_sequence_condition(self) -> u8 {
        ((self.0 & Self::ABORT_SEQUENCE_MASK) >> 4) as u8
    }

    /// Fill data bytes (0–3) at the end of the payload.
    pub const fn fill_bytes(self) -> u8 {
        (self.0 & Self::FILL_BYTES_MASK) as u8
    }

    /// With the fill-bytes count set (0–3; higher bits ignored).
    #[must_use]
    pub const fn with_fill_bytes(self, n: u8) -> FCtl {
        FCtl((self.0 & !Self::FILL_BYTES_MASK) | (n as u32 & Self::FILL_BYTES_MASK))
    }
}

impl fmt::Debug for FCtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FCtl({:#08x}", self.bits())?;
        let names = [
            (Self::EXCHANGE_CONTEXT, "XCHG_RESP"),
            (Self::SEQUENCE_CONTEXT, "SEQ_RECIP"),
            (Self::FIRST_SEQUENCE, "FIRST_SEQ"),
            (Self::LAST_SEQUENCE, "LAST_SEQ"),
            (Self::END_SEQUENCE, "END_SEQ"),
            (Self::SEQUENCE_INITIATIVE, "SI"),
            (Self::RELATIVE_OFFSET, "RO"),
        ];
        for (bit, name) in names {
            if self.contains(bit) {
                write!(f, " {name}")?;
            }
        }
        write!(f, ")")
    }
}

/// A zero-copy view of an FC-2 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcHeader<T> {
    /// Wraps a buffer without checking its length; getters panic on a
    /// buffer shorter than [`HEADER_LEN`].
    pub const fn new_unchecked(buffer: T) -> FcHeader<T> {
        FcHeader { buffer }
    }

    /// Wraps a buffer of at least [`HEADER_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<FcHeader<T>, WireError> {
        super::check_len(buffer.as_ref(), HEADER_LEN)?;
        Ok(FcHeader { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// R_CTL.
    pub fn r_ctl(&self) -> RCtl {
        RCtl(self.b()[field::R_CTL])
    }

    /// D_ID.
    pub fn d_id(&self) -> FcId {
        FcId::new(be::u24_at(self.b(), field::D_ID))
    }

    /// CS_CTL, or the priority when F_CTL's priority enable bit is set.
    pub fn cs_ctl(&self) -> u8 {
        self.b()[field::CS_CTL]
    }

    /// S_ID.
    pub fn s_id(&self) -> FcId {
        FcId::new(be::u24_at(self.b(), field::S_ID))
    }

    /// TYPE.
    pub fn fc_type(&self) -> FcType {
        FcType(self.b()[field::TYPE])
    }

    /// F_CTL.
    pub fn f_ctl(&self) -> FCtl {
        FCtl(be::u24_at(self.b(), field::F_CTL))
    }

    /// SEQ_ID.
    pub fn seq_id(&self) -> u8 {
        self.b()[field::SEQ_ID]
    }

    /// DF_CTL (optional headers present).
    pub fn df_ctl(&self) -> u8 {
        self.b()[field::DF_CTL]
    }

    /// SEQ_CNT.
    pub fn seq_cnt(&self) -> u16 {
        be::u16_at(self.b(), field::SEQ_CNT)
    }

    /// OX_ID.
    pub fn ox_id(&self) -> OxId {
        OxId(be::u16_at(self.b(), field::OX_ID))
    }

    /// RX_ID.
    pub fn rx_id(&self) -> RxId {
        RxId(be::u16_at(self.b(), field::RX_ID))
    }

    /// Parameter (relative offset for data frames, else link-service
    /// specific).
    pub fn parameter(&self) -> u32 {
        be::u32_at(self.b(), field::PARAMETER)
    }

    /// The 24 header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.b()[..HEADER_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FcHeader<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets R_CTL.
    pub fn set_r_ctl(&mut self, v: RCtl) {
        self.m()[field::R_CTL] = v.0;
    }

    /// Sets D_ID.
    pub fn set_d_id(&mut self, v: FcId) {
        be::put_u24(self.m(), field::D_ID, v.get());
    }

    /// Sets CS_CTL/Priority.
    pub fn set_cs_ctl(&mut self, v: u8) {
        self.m()[field::CS_CTL] = v;
    }

    /// Sets S_ID.
    pub fn set_s_id(&mut self, v: FcId) {
        be::put_u24(self.m(), field::S_ID, v.get());
    }

    /// Sets TYPE.
    pub fn set_fc_type(&mut self, v: FcType) {
        self.m()[field::TYPE] = v.0;
    }

    /// Sets F_CTL.
    pub fn set_f_ctl(&mut self, v: FCtl) {
        be::put_u24(self.m(), field::F_CTL, v.bits());
    }

    /// Sets SEQ_ID.
    pub fn set_seq_id(&mut self, v: u8) {
        self.m()[field::SEQ_ID] = v;
    }

    /// Sets DF_CTL.
    pub fn set_df_ctl(&mut self, v: u8) {
        self.m()[field::DF_CTL] = v;
    }

    /// Sets SEQ_CNT.
    pub fn set_seq_cnt(&mut self, v: u16) {
        be::put_u16(self.m(), field::SEQ_CNT, v);
    }

    /// Sets OX_ID.
    pub fn set_ox_id(&mut self, v: OxId) {
        be::put_u16(self.m(), field::OX_ID, v.0);
    }

    /// Sets RX_ID.
    pub fn set_rx_id(&mut self, v: RxId) {
        be::put_u16(self.m(), field::RX_ID, v.0);
    }

    /// Sets the parameter field.
    pub fn set_parameter(&mut self, v: u32) {
        be::put_u32(self.m(), field::PARAMETER, v);
    }
}

/// The owned meaning of a frame header. Holds every field, so
/// `parse` → `emit` reproduces the 24 bytes exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcHeaderRepr {
    /// R_CTL.
    pub r_ctl: RCtl,
    /// Destination address.
    pub d_id: FcId,
    /// CS_CTL / priority.
    pub cs_ctl: u8,
    /// Source address.
    pub s_id: FcId,
    /// TYPE.
    pub fc_type: FcType,
    /// F_CTL.
    pub f_ctl: FCtl,
    /// SEQ_ID.
    pub seq_id: u8,
    /// DF_CTL.
    pub df_ctl: u8,
    /// SEQ_CNT.
    pub seq_cnt: u16,
    /// OX_ID.
    pub ox_id: OxId,
    /// RX_ID.
    pub rx_id: RxId,
    /// Parameter.
    pub parameter: u32,
}

impl FcHeaderRepr {
    /// Reads a header view.
    pub fn parse<T: AsRef<[u8]>>(h: &FcHeader<T>) -> FcHeaderRepr {
        FcHeaderRepr {
            r_ctl: h.r_ctl(),
            d_id: h.d_id(),
            cs_ctl: h.cs_ctl(),
            s_id: h.s_id(),
            fc_type: h.fc_type(),
            f_ctl: FCtl(h.f_ctl().bits()),
            seq_id: h.seq_id(),
            df_ctl: h.df_ctl(),
            seq_cnt: h.seq_cnt(),
            ox_id: h.ox_id(),
            rx_id: h.rx_id(),
            parameter: h.parameter(),
        }
    }

    /// Parses the first 24 bytes of `buf`.
    pub fn parse_bytes(buf: &[u8]) -> Result<FcHeaderRepr, WireError> {
        Ok(FcHeaderRepr::parse(&FcHeader::new_checked(buf)?))
    }

    /// Always [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut FcHeader<T>) {
        h.set_r_ctl(self.r_ctl);
        h.set_d_id(self.d_id);
        h.set_cs_ctl(self.cs_ctl);
        h.set_s_id(self.s_id);
        h.set_fc_type(self.fc_type);
        h.set_f_ctl(self.f_ctl);
        h.set_seq_id(self.seq_id);
        h.set_df_ctl(self.df_ctl);
        h.set_seq_cnt(self.seq_cnt);
        h.set_ox_id(self.ox_id);
        h.set_rx_id(self.rx_id);
        h.set_parameter(self.parameter);
    }

    /// The 24 wire bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut FcHeader::new_unchecked(&mut b[..]));
        b
    }

    /// The header of a reply in the same exchange: addresses swapped,
    /// OX_ID/RX_ID kept, F_CTL marking the sender as exchange responder
    /// and ending the exchange.
    pub fn reply(&self, r_ctl: RCtl, fc_type: FcType) -> FcHeaderRepr {
        FcHeaderRepr {
            r_ctl,
            d_id: self.s_id,
            cs_ctl: 0,
            s_id: self.d_id,
            fc_type,
            f_ctl: FCtl::last_reply(),
            seq_id: 0,
            df_ctl: 0,
            seq_cnt: 0,
            ox_id: self.ox_id,
            rx_id: self.rx_id,
            parameter: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FLOGI frame header of fcoe-t11.pcap frame 1.
    const FLOGI_HDR: [u8; 24] = [
        0x22, 0xff, 0xff, 0xfe, 0x00, 0x00, 0x00, 0x00, 0x01, 0x29, 0x00, 0x00, 0xee, 0x00, 0x00,
        0x00, 0x03, 0xf7, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct_captured_header() {
        let h = FcHeader::new_checked(&FLOGI_HDR[..]).unwrap();
        assert_eq!(h.r_ctl(), RCtl::ELS_REQUEST);
        assert_eq!(h.d_id(), FcId::LOGIN_SERVER);
        assert_eq!(h.s_id(), FcId::UNIDENTIFIED);
        assert_eq!(h.fc_type(), FcType::ELS);
        let f = h.f_ctl();
        assert_eq!(f.bits(), 0x29_0000);
        assert!(f.first_sequence() && f.end_sequence() && f.sequence_initiative());
        assert!(!f.exchange_responder() && !f.last_sequence());
        assert_eq!(h.seq_id(), 0xee);
        assert_eq!(h.ox_id(), OxId(0x03f7));
        assert_eq!(h.rx_id(), RxId::UNASSIGNED);
        assert_eq!(h.parameter(), 0);
        assert_eq!(FCtl::request(), f);
    }

    #[test]
    fn construct_and_round_trip() {
        let r = FcHeaderRepr::parse(&FcHeader::new_checked(&FLOGI_HDR[..]).unwrap());
        assert_eq!(r.to_bytes(), FLOGI_HDR);
        let reply = r.reply(RCtl::ELS_REPLY, FcType::ELS);
        assert_eq!(reply.d_id, FcId::UNIDENTIFIED);
        assert_eq!(reply.s_id, FcId::LOGIN_SERVER);
        assert!(reply.f_ctl.exchange_responder() && reply.f_ctl.last_sequence());
    }

    #[test]
    fn every_truncation_is_an_error() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                FcHeader::new_checked(&FLOGI_HDR[..n]).unwrap_err(),
                WireError::Truncated {
                    needed: HEADER_LEN,
                    got: n
                }
            );
        }
    }

    #[test]
    fn f_ctl_fields() {
        let f = FCtl(0x00_3000 | 0x00_00c0 | 0x00_0030 | 0x3);
        assert_eq!(f.ack_form(), 3);
        assert_eq!(f.continue_sequence_condition(), 3);
        assert_eq!(f.abort_sequence_condition(), 3);
        assert_eq!(f.fill_bytes(), 3);
        assert_eq!(f.with_fill_bytes(1).fill_bytes(), 1);
        assert!(
            FCtl(0)
                .with(FCtl::RELATIVE_OFFSET, true)
                .relative_offset_present()
        );
        assert_eq!(RCtl::ELS_REQUEST.routing(), 2);
        assert_eq!(RCtl::ELS_REQUEST.information(), 2);
        assert!(RCtl::ABTS.is_bls() && RCtl::ACK_1.is_link_control());
    }

    proptest::proptest! {
        #[test]
        fn header_bytes_round_trip(bytes in proptest::array::uniform24(proptest::num::u8::ANY)) {
            let r = FcHeaderRepr::parse_bytes(&bytes).unwrap();
            proptest::prop_assert_eq!(r.to_bytes(), bytes);
        }
    }
}
