//! The Basic Header Segment (RFC 7143 §11.2.1): a zero-copy view.
//!
//! [`Bhs`] wraps any `AsRef<[u8]>` of at least 48 bytes. After
//! [`Bhs::new_checked`] no getter can panic. Field names follow RFC 7143;
//! which getters are meaningful depends on the opcode (§11.3 – §11.18), as
//! with the PDU-specific layouts listed in [`field`].

use std::fmt;

use super::WireError;

/// The length of a BHS in bytes.
pub const BHS_LEN: usize = 48;

/// Field offsets (RFC 7143 §11). Names are the RFC's.
#[allow(missing_docs)]
pub mod field {
    use std::ops::Range;
    pub type Field = Range<usize>;

    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const BYTE2: usize = 2;
    pub const BYTE3: usize = 3;
    pub const TOTAL_AHS_LENGTH: usize = 4;
    pub const DATA_SEGMENT_LENGTH: Field = 5..8;
    pub const LUN: Field = 8..16;
    pub const ISID: Field = 8..14;
    pub const TSIH: Field = 14..16;
    pub const INITIATOR_TASK_TAG: Field = 16..20;
    /// Target Transfer Tag / Referenced Task Tag / SNACK Tag / CID (+ rsvd).
    pub const WORD5: Field = 20..24;
    pub const CID: Field = 20..22;
    /// CmdSN (initiator PDUs) / StatSN (target PDUs).
    pub const WORD6: Field = 24..28;
    /// ExpStatSN (initiator PDUs) / ExpCmdSN (target PDUs).
    pub const WORD7: Field = 28..32;
    /// MaxCmdSN (target PDUs) / RefCmdSN (TMF request).
    pub const WORD8: Field = 32..36;
    /// DataSN / R2TSN / ExpDataSN / Status-Class+Detail / AsyncEvent…
    pub const WORD9: Field = 36..40;
    /// Buffer Offset / BegRun / Bidi residual / Time2Wait+Time2Retain.
    pub const WORD10: Field = 40..44;
    /// Residual Count / Desired Data Transfer Length / RunLength.
    pub const WORD11: Field = 44..48;
    pub const CDB: Field = 32..48;
}

/// A PDU opcode (RFC 7143 §11.2.1.2). Open: unknown values parse and are
/// answered with a Reject.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

#[allow(missing_docs)]
impl Opcode {
    pub const NOP_OUT: Opcode = Opcode(0x00);
    pub const SCSI_COMMAND: Opcode = Opcode(0x01);
    pub const TASK_MGMT_REQUEST: Opcode = Opcode(0x02);
    pub const LOGIN_REQUEST: Opcode = Opcode(0x03);
    pub const TEXT_REQUEST: Opcode = Opcode(0x04);
    pub const SCSI_DATA_OUT: Opcode = Opcode(0x05);
    pub const LOGOUT_REQUEST: Opcode = Opcode(0x06);
    pub const SNACK_REQUEST: Opcode = Opcode(0x10);
    pub const NOP_IN: Opcode = Opcode(0x20);
    pub const SCSI_RESPONSE: Opcode = Opcode(0x21);
    pub const TASK_MGMT_RESPONSE: Opcode = Opcode(0x22);
    pub const LOGIN_RESPONSE: Opcode = Opcode(0x23);
    pub const TEXT_RESPONSE: Opcode = Opcode(0x24);
    pub const SCSI_DATA_IN: Opcode = Opcode(0x25);
    pub const LOGOUT_RESPONSE: Opcode = Opcode(0x26);
    pub const R2T: Opcode = Opcode(0x31);
    pub const ASYNC_MESSAGE: Opcode = Opcode(0x32);
    pub const REJECT: Opcode = Opcode(0x3f);

    /// True for opcodes an initiator sends (0x00–0x1f).
    pub fn is_initiator(self) -> bool {
        self.0 < 0x20
    }

    /// The RFC's name, if this is a defined opcode.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Opcode::NOP_OUT => "NOP-Out",
            Opcode::SCSI_COMMAND => "SCSI Command",
            Opcode::TASK_MGMT_REQUEST => "Task Management Function Request",
            Opcode::LOGIN_REQUEST => "Login Request",
            Opcode::TEXT_REQUEST => "Text Request",
            Opcode::SCSI_DATA_OUT => "SCSI Data-Out",
            Opcode::LOGOUT_REQUEST => "Logout Request",
            Opcode::SNACK_REQUEST => "SNACK Request",
            Opcode::NOP_IN => "NOP-In",
            Opcode::SCSI_RESPONSE => "SCSI Response",
            Opcode::TASK_MGMT_RESPONSE => "Task Management Function Response",
            Opcode::LOGIN_RESPONSE => "Login Response",
            Opcode::TEXT_RESPONSE => "Text Response",
            Opcode::SCSI_DATA_IN => "SCSI Data-In",
            Opcode::LOGOUT_RESPONSE => "Logout Response",
            Opcode::R2T => "Ready To Transfer",
            Opcode::ASYNC_MESSAGE => "Asynchronous Message",
            Opcode::REJECT => "Reject",
            _ => return None,
        })
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

/// A zero-copy view of a Basic Header Segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bhs<T: AsRef<[u8]>> {
    buffer: T,
}

#[inline]
fn be32(b: &[u8], at: field::Field) -> u32 {
    let s = &b[at];
    u32::from_be_bytes([s[0], s[1], s[2], s[3]])
}

#[inline]
fn put32(b: &mut [u8], at: field::Field, v: u32) {
    b[at].copy_from_slice(&v.to_be_bytes());
}

impl<T: AsRef<[u8]>> Bhs<T> {
    /// Wraps a buffer without checking its length.
    ///
    /// Getters panic if the buffer is shorter than [`BHS_LEN`]; use
    /// [`Bhs::new_checked`] for anything that came from a peer.
    pub const fn new_unchecked(buffer: T) -> Bhs<T> {
        Bhs { buffer }
    }

    /// Wraps a buffer of at least [`BHS_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Bhs<T>, WireError> {
        let got = buffer.as_ref().len();
        if got < BHS_LEN {
            return Err(WireError::Truncated {
                needed: BHS_LEN,
                got,
            });
        }
        Ok(Bhs { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 48 header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..BHS_LEN]
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Opcode (6 bits).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE] & 0x3f)
    }

    /// The I (immediate delivery) bit.
    pub fn immediate(&self) -> bool {
        self.b()[field::OPCODE] & 0x40 != 0
    }

    /// Byte 0 bit 7, which must be zero.
    pub fn reserved_bit7(&self) -> bool {
        self.b()[field::OPCODE] & 0x80 != 0
    }

    /// Byte 1, the opcode-specific flags (F bit = 0x80).
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }

    /// The F (final) bit.
    pub fn final_flag(&self) -> bool {
        self.flags() & 0x80 != 0
    }

    /// Byte 2 (Response, Reason, Version-max, …).
    pub fn byte2(&self) -> u8 {
        self.b()[field::BYTE2]
    }

    /// Byte 3 (Status, Version-min/active, …).
    pub fn byte3(&self) -> u8 {
        self.b()[field::BYTE3]
    }

    /// TotalAHSLength, in 4-byte words.
    pub fn total_ahs_length(&self) -> u8 {
        self.b()[field::TOTAL_AHS_LENGTH]
    }

    /// DataSegmentLength, in bytes, excluding padding.
    pub fn data_segment_length(&self) -> u32 {
        let s = &self.b()[field::DATA_SEGMENT_LENGTH];
        u32::from_be_bytes([0, s[0], s[1], s[2]])
    }

    /// The 8-byte LUN field.
    pub fn lun(&self) -> u64 {
        let s = &self.b()[field::LUN];
        u64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    }

    /// ISID (login PDUs).
    pub fn isid(&self) -> [u8; 6] {
        let s = &self.b()[field::ISID];
        [s[0], s[1], s[2], s[3], s[4], s[5]]
    }

    /// TSIH (login PDUs).
    pub fn tsih(&self) -> u16 {
        let s = &self.b()[field::TSIH];
        u16::from_be_bytes([s[0], s[1]])
    }

    /// Initiator Task Tag.
    pub fn initiator_task_tag(&self) -> u32 {
        be32(self.b(), field::INITIATOR_TASK_TAG)
    }

    /// Word 5: Target Transfer Tag, Referenced Task Tag, SNACK Tag,
    /// Expected Data Transfer Length (SCSI Command).
    pub fn word5(&self) -> u32 {
        be32(self.b(), field::WORD5)
    }

    /// CID (login, logout).
    pub fn cid(&self) -> u16 {
        let s = &self.b()[field::CID];
        u16::from_be_bytes([s[0], s[1]])
    }

    /// Word 6: CmdSN (initiator PDUs) or StatSN (target PDUs).
    pub fn word6(&self) -> u32 {
        be32(self.b(), field::WORD6)
    }

    /// Word 7: ExpStatSN (initiator PDUs) or ExpCmdSN (target PDUs).
    pub fn word7(&self) -> u32 {
        be32(self.b(), field::WORD7)
    }

    /// Word 8: MaxCmdSN (target PDUs), RefCmdSN (TMF request).
    pub fn word8(&self) -> u32 {
        be32(self.b(), field::WORD8)
    }

    /// Word 9: DataSN, R2TSN, ExpDataSN, AsyncEvent…
    pub fn word9(&self) -> u32 {
        be32(self.b(), field::WORD9)
    }

    /// Word 10: Buffer Offset, BegRun, Bidirectional Read Residual Count.
    pub fn word10(&self) -> u32 {
        be32(self.b(), field::WORD10)
    }

    /// Word 11: Residual Count, Desired Data Transfer Length, RunLength.
    pub fn word11(&self) -> u32 {
        be32(self.b(), field::WORD11)
    }

    /// The 16 CDB bytes of a SCSI Command PDU.
    pub fn cdb(&self) -> &[u8] {
        &self.b()[field::CDB]
    }

    /// CmdSN of an initiator PDU.
    pub fn cmd_sn(&self) -> u32 {
        self.word6()
    }

    /// ExpStatSN of an initiator PDU.
    pub fn exp_stat_sn(&self) -> u32 {
        self.word7()
    }

    /// Target Transfer Tag (NOP, Data-Out, Text, SNACK, R2T, Data-In).
    pub fn target_transfer_tag(&self) -> u32 {
        self.word5()
    }

    /// Length of AHS in bytes.
    pub fn ahs_len(&self) -> usize {
        usize::from(self.total_ahs_length()) * 4
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bhs<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets opcode and the I bit.
    pub fn set_opcode(&mut self, opcode: Opcode, immediate: bool) {
        self.bm()[field::OPCODE] = (opcode.0 & 0x3f) | if immediate { 0x40 } else { 0 };
    }

    /// Sets byte 1.
    pub fn set_flags(&mut self, flags: u8) {
        self.bm()[field::FLAGS] = flags;
    }

    /// Sets byte 2.
    pub fn set_byte2(&mut self, v: u8) {
        self.bm()[field::BYTE2] = v;
    }

    /// Sets byte 3.
    pub fn set_byte3(&mut self, v: u8) {
        self.bm()[field::BYTE3] = v;
    }

    /// Sets TotalAHSLength (words).
    pub fn set_total_ahs_length(&mut self, words: u8) {
        self.bm()[field::TOTAL_AHS_LENGTH] = words;
    }

    /// Sets DataSegmentLength; values above 2^24 − 1 are truncated to 24
    /// bits, so callers bound it first.
    pub fn set_data_segment_length(&mut self, len: u32) {
        let b = len.to_be_bytes();
        self.bm()[field::DATA_SEGMENT_LENGTH].copy_from_slice(&b[1..4]);
    }

    /// Sets the LUN field.
    pub fn set_lun(&mut self, lun: u64) {
        self.bm()[field::LUN].copy_from_slice(&lun.to_be_bytes());
    }

    /// Sets ISID.
    pub fn set_isid(&mut self, isid: [u8; 6]) {
        self.bm()[field::ISID].copy_from_slice(&isid);
    }

    /// Sets TSIH.
    pub fn set_tsih(&mut self, tsih: u16) {
        self.bm()[field::TSIH].copy_from_slice(&tsih.to_be_bytes());
    }

    /// Sets the Initiator Task Tag.
    pub fn set_initiator_task_tag(&mut self, itt: u32) {
        put32(self.bm(), field::INITIATOR_TASK_TAG, itt);
    }

    /// Sets word 5.
    pub fn set_word5(&mut self, v: u32) {
        put32(self.bm(), field::WORD5, v);
    }

    /// Sets CID (bytes 20–21).
    pub fn set_cid(&mut self, cid: u16) {
        self.bm()[field::CID].copy_from_slice(&cid.to_be_bytes());
    }

    /// Sets word 6.
    pub fn set_word6(&mut self, v: u32) {
        put32(self.bm(), field::WORD6, v);
    }

    /// Sets word 7.
    pub fn set_word7(&mut self, v: u32) {
        put32(self.bm(), field::WORD7, v);
    }

    /// Sets word 8.
    pub fn set_word8(&mut self, v: u32) {
        put32(self.bm(), field::WORD8, v);
    }

    /// Sets word 9.
    pub fn set_word9(&mut self, v: u32) {
        put32(self.bm(), field::WORD9, v);
    }

    /// Sets word 10.
    pub fn set_word10(&mut self, v: u32) {
        put32(self.bm(), field::WORD10, v);
    }

    /// Sets word 11.
    pub fn set_word11(&mut self, v: u32) {
        put32(self.bm(), field::WORD11, v);
    }

    /// Writes the 16 CDB bytes.
    pub fn set_cdb(&mut self, cdb: &[u8; 16]) {
        self.bm()[field::CDB].copy_from_slice(cdb);
    }

    /// Mutable access to all 48 bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bm()[..BHS_LEN]
    }
}
