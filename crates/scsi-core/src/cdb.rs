//! Typed command descriptor blocks: decoding and emitting every command the
//! emulated device server accepts (SPC-4, SBC-3).
//!
//! [`Command::parse`] turns CDB bytes into a [`Command`]; [`Command::emit`]
//! writes the same bytes back. Parsing is strict: a bit that SPC-4/SBC-3
//! reserves, or that unifab does not implement (NACA, LINK, RELADR, ...), is
//! refused with a [`CdbError::InvalidField`] pointing at it, so that every CDB
//! that parses re-emits to exactly its first [`Command::buffer_len`] bytes.
//! Bytes after the command's length (transports pad CDBs, iSCSI to 16 bytes)
//! are ignored.
//!
//! A [`CdbError`] converts with one `From` into the sense SPC-4 gives for it.
//!
//! This file holds the types ([`Command`], [`BlockIo`], [`CdbError`], the
//! operation codes). Each command set decodes and emits its own commands,
//! side by side: `sbc` (block commands), `spc` (primary commands), `pr`
//! (reservations), `copy` (third-party copy); `field` holds the helpers
//! they share. A new command set (SSC for tape) is a new file and one line
//! in [`Command::parse`] and [`Command::encode`].

use crate::sense::{Sense, asc};

/// Operation codes (SPC-4 Annex D). Open: unknown codes are plain `u8`.
#[allow(missing_docs)]
pub mod opcode {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const FORMAT_UNIT: u8 = 0x04;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const LOG_SENSE: u8 = 0x4d;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const SEND_DIAGNOSTIC: u8 = 0x1d;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const SANITIZE: u8 = 0x48;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const ORWRITE_16: u8 = 0x8b;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9c;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const MAINTENANCE_OUT: u8 = 0xa4;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;
}

/// Service actions of SERVICE ACTION IN(16) and MAINTENANCE IN.
#[allow(missing_docs)]
pub mod service_action {
    pub const READ_CAPACITY_16: u16 = 0x10;
    pub const GET_LBA_STATUS: u16 = 0x12;
    pub const REPORT_TARGET_PORT_GROUPS: u16 = 0x0a;
    pub const REPORT_SUPPORTED_OPERATION_CODES: u16 = 0x0c;
    pub const REPORT_SUPPORTED_TMFS: u16 = 0x0d;
    /// MAINTENANCE OUT.
    pub const SET_TARGET_PORT_GROUPS: u16 = 0x0a;
}

/// Why a CDB was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CdbError {
    /// No bytes at all.
    #[error("empty CDB")]
    Empty,
    /// The operation code is not one this device server implements.
    #[error("unsupported operation code {opcode:#04x}")]
    InvalidOpcode {
        /// The operation code.
        opcode: u8,
    },
    /// The operation code is known but the service action is not.
    #[error("unsupported service action {service_action:#x} of {opcode:#04x}")]
    InvalidServiceAction {
        /// The operation code.
        opcode: u8,
        /// The service action.
        service_action: u16,
    },
    /// Fewer bytes than the operation code's CDB length.
    #[error("CDB truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// The CDB length of the operation code.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// A reserved, obsolete or unsupported field is set.
    #[error("invalid field in CDB at byte {byte} bit {bit:?}")]
    InvalidField {
        /// Byte offset in the CDB.
        byte: u16,
        /// Bit in that byte, if one bit is to blame.
        bit: Option<u8>,
    },
    /// The caller's buffer cannot hold the emitted CDB.
    #[error("buffer of {got} bytes cannot hold a {needed}-byte CDB")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes offered.
        got: usize,
    },
}

impl From<CdbError> for Sense {
    fn from(e: CdbError) -> Sense {
        match e {
            CdbError::Empty | CdbError::InvalidOpcode { .. } => {
                Sense::illegal_field(asc::INVALID_COMMAND_OPERATION_CODE, true, 0, None)
            }
            CdbError::InvalidServiceAction { .. } => {
                Sense::illegal_field(asc::INVALID_FIELD_IN_CDB, true, 1, Some(4))
            }
            CdbError::Truncated { got, .. } => Sense::illegal_field(
                asc::INVALID_FIELD_IN_CDB,
                true,
                u16::try_from(got).unwrap_or(u16::MAX),
                None,
            ),
            CdbError::InvalidField { byte, bit } => {
                Sense::illegal_field(asc::INVALID_FIELD_IN_CDB, true, byte, bit)
            }
            CdbError::BufferTooSmall { .. } => Sense::new(
                crate::SenseKey::HARDWARE_ERROR,
                asc::INTERNAL_TARGET_FAILURE,
            ),
        }
    }
}

/// Which of a command family's CDB forms was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdbSize {
    /// 6-byte CDB.
    Six,
    /// 10-byte CDB.
    Ten,
    /// 12-byte CDB.
    Twelve,
    /// 16-byte CDB.
    Sixteen,
}

impl CdbSize {
    /// Length in bytes.
    pub const fn len(self) -> usize {
        match self {
            CdbSize::Six => 6,
            CdbSize::Ten => 10,
            CdbSize::Twelve => 12,
            CdbSize::Sixteen => 16,
        }
    }

    /// Always false (a CDB form is never empty); for clippy's `len` rule.
    pub const fn is_empty(self) -> bool {
        false
    }
}

/// The fields shared by the block-addressed data commands (READ, WRITE,
/// WRITE AND VERIFY, VERIFY, ORWRITE, COMPARE AND WRITE).
///
/// A field the command does not define is always zero/false after parse
/// (parse refuses the bit), and must be so for emit to produce a valid CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockIo {
    /// CDB form.
    pub size: CdbSize,
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks (READ(6)/WRITE(6): 1..=256, the wire's 0
    /// meaning 256).
    pub blocks: u32,
    /// RDPROTECT / WRPROTECT / VRPROTECT / ORPROTECT.
    pub protect: u8,
    /// Disable page out.
    pub dpo: bool,
    /// Force unit access.
    pub fua: bool,
    /// FUA_NV (write commands).
    pub fua_nv: bool,
    /// RARC (read commands).
    pub rarc: bool,
    /// BYTCHK (VERIFY: 0, 1 or 3; WRITE AND VERIFY: 0 or 1).
    pub bytchk: u8,
    /// Group number.
    pub group: u8,
    /// Control byte (vendor bits only; NACA and LINK are refused).
    pub control: u8,
}

/// A decoded CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Command {
    /// TEST UNIT READY.
    TestUnitReady {
        /// Control byte.
        control: u8,
    },
    /// LOG SENSE (SPC-4 §6.6). SP and the obsolete PPC are refused.
    LogSense {
        /// PC: page control (0 threshold, 1 cumulative, 2 default
        /// threshold, 3 default cumulative values).
        pc: u8,
        /// PAGE CODE.
        page_code: u8,
        /// SUBPAGE CODE.
        subpage: u8,
        /// PARAMETER POINTER: the first parameter code wanted.
        param_pointer: u16,
        /// Allocation length.
        alloc_len: u16,
        /// Control byte.
        control: u8,
    },
    /// REQUEST SENSE.
    RequestSense {
        /// DESC: descriptor format wanted.
        desc: bool,
        /// Allocation length.
        alloc_len: u8,
        /// Control byte.
        control: u8,
    },
    /// FORMAT UNIT.
    FormatUnit {
        /// FMTPINFO.
        fmtpinfo: u8,
        /// LONGLIST.
        longlist: bool,
        /// FMTDATA: a parameter list follows.
        fmtdata: bool,
        /// CMPLST.
        cmplst: bool,
        /// DEFECT LIST FORMAT.
        defect_list_format: u8,
        /// Vendor specific byte 2.
        vendor: u8,
        /// Control byte.
        control: u8,
    },
    /// INQUIRY.
    Inquiry {
        /// EVPD.
        evpd: bool,
        /// PAGE CODE.
        page_code: u8,
        /// Allocation length.
        alloc_len: u16,
        /// Control byte.
        control: u8,
    },
    /// MODE SELECT(6) / MODE SELECT(10).
    ModeSelect {
        /// The 10-byte form.
        ten: bool,
        /// PF.
        pf: bool,
        /// SP (save pages).
        sp: bool,
        /// Parameter list length.
        param_len: u16,
        /// Control byte.
        control: u8,
    },
    /// MODE SENSE(6) / MODE SENSE(10).
    ModeSense {
        /// The 10-byte form.
        ten: bool,
        /// LLBAA (10-byte form only).
        llbaa: bool,
        /// DBD: no block descriptors.
        dbd: bool,
        /// PC: 0 current, 1 changeable, 2 default, 3 saved.
        pc: u8,
        /// PAGE CODE.
        page_code: u8,
        /// SUBPAGE CODE.
        subpage: u8,
        /// Allocation length.
        alloc_len: u16,
        /// Control byte.
        control: u8,
    },
    /// RESERVE(6) / RESERVE(10), logical unit reservations only.
    Reserve {
        /// The 10-byte form.
        ten: bool,
        /// Control byte.
        control: u8,
    },
    /// RELEASE(6) / RELEASE(10).
    Release {
        /// The 10-byte form.
        ten: bool,
        /// Control byte.
        control: u8,
    },
    /// START STOP UNIT.
    StartStopUnit {
        /// IMMED.
        immed: bool,
        /// POWER CONDITION MODIFIER.
        power_condition_modifier: u8,
        /// POWER CONDITION.
        power_condition: u8,
        /// NO_FLUSH.
        no_flush: bool,
        /// LOEJ.
        loej: bool,
        /// START.
        start: bool,
        /// Control byte.
        control: u8,
    },
    /// SEND DIAGNOSTIC.
    SendDiagnostic {
        /// SELF-TEST CODE.
        self_test_code: u8,
        /// PF.
        pf: bool,
        /// SELFTEST.
        self_test: bool,
        /// DEVOFFL.
        devoffl: bool,
        /// UNITOFFL.
        unitoffl: bool,
        /// Parameter list length.
        param_len: u16,
        /// Control byte.
        control: u8,
    },
    /// PREVENT ALLOW MEDIUM REMOVAL.
    PreventAllow {
        /// PREVENT (2 bits).
        prevent: u8,
        /// Control byte.
        control: u8,
    },
    /// READ CAPACITY(10).
    ReadCapacity10 {
        /// LOGICAL BLOCK ADDRESS (obsolete; zero unless PMI).
        lba: u32,
        /// PMI (obsolete).
        pmi: bool,
        /// Control byte.
        control: u8,
    },
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// LOGICAL BLOCK ADDRESS (obsolete).
        lba: u64,
        /// Allocation length.
        alloc_len: u32,
        /// PMI (obsolete).
        pmi: bool,
        /// Control byte.
        control: u8,
    },
    /// READ(6/10/12/16).
    Read(BlockIo),
    /// WRITE(6/10/12/16).
    Write(BlockIo),
    /// WRITE AND VERIFY(10/12/16).
    WriteAndVerify(BlockIo),
    /// VERIFY(10/12/16).
    Verify(BlockIo),
    /// ORWRITE(16).
    OrWrite(BlockIo),
    /// COMPARE AND WRITE.
    CompareAndWrite(BlockIo),
    /// PRE-FETCH(10/16).
    PreFetch {
        /// CDB form (10 or 16).
        size: CdbSize,
        /// IMMED.
        immed: bool,
        /// First logical block.
        lba: u64,
        /// Number of logical blocks.
        blocks: u32,
        /// Group number.
        group: u8,
        /// Control byte.
        control: u8,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache {
        /// CDB form (10 or 16).
        size: CdbSize,
        /// SYNC_NV (obsolete in SBC-3, accepted).
        sync_nv: bool,
        /// IMMED.
        immed: bool,
        /// First logical block.
        lba: u64,
        /// Number of logical blocks (0: to the end).
        blocks: u32,
        /// Group number.
        group: u8,
        /// Control byte.
        control: u8,
    },
    /// WRITE SAME(10/16).
    WriteSame {
        /// CDB form (10 or 16).
        size: CdbSize,
        /// WRPROTECT.
        wrprotect: u8,
        /// ANCHOR.
        anchor: bool,
        /// UNMAP.
        unmap: bool,
        /// NDOB (16 only): no data-out buffer, write zeroes.
        ndob: bool,
        /// First logical block.
        lba: u64,
        /// Number of logical blocks (0: to the end of the medium).
        blocks: u32,
        /// Group number.
        group: u8,
        /// Control byte.
        control: u8,
    },
    /// WRITE ATOMIC(16) (SBC-4).
    WriteAtomic16 {
        /// WRPROTECT.
        wrprotect: u8,
        /// DPO.
        dpo: bool,
        /// FUA.
        fua: bool,
        /// First logical block.
        lba: u64,
        /// ATOMIC BOUNDARY.
        boundary: u16,
        /// TRANSFER LENGTH in logical blocks.
        blocks: u16,
        /// Group number.
        group: u8,
        /// Control byte.
        control: u8,
    },
    /// SANITIZE (SBC-4).
    Sanitize {
        /// IMMED.
        immed: bool,
        /// AUSE: allow unrestricted sanitize exit.
        ause: bool,
        /// SERVICE ACTION (5 bits): 01h OVERWRITE, 02h BLOCK ERASE, 03h
        /// CRYPTO ERASE, 1Fh EXIT FAILURE MODE.
        service_action: u8,
        /// Parameter list length.
        param_len: u16,
        /// Control byte.
        control: u8,
    },
    /// THIRD-PARTY COPY OUT (83h): EXTENDED COPY(LID1) is service
    /// action 00h.
    ExtendedCopy {
        /// SERVICE ACTION (5 bits).
        service_action: u8,
        /// Parameter list length.
        param_len: u32,
        /// Control byte.
        control: u8,
    },
    /// THIRD-PARTY COPY IN (84h): RECEIVE COPY RESULTS (LID1 service
    /// actions: 00h COPY STATUS, 03h OPERATING PARAMETERS).
    ReceiveCopyResults {
        /// SERVICE ACTION (5 bits).
        service_action: u8,
        /// LIST IDENTIFIER.
        list_id: u8,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// UNMAP.
    Unmap {
        /// ANCHOR.
        anchor: bool,
        /// Group number.
        group: u8,
        /// Parameter list length.
        param_len: u16,
        /// Control byte.
        control: u8,
    },
    /// READ DEFECT DATA(10/12).
    ReadDefectData {
        /// The 12-byte form.
        twelve: bool,
        /// REQ_PLIST.
        req_plist: bool,
        /// REQ_GLIST.
        req_glist: bool,
        /// DEFECT LIST FORMAT.
        format: u8,
        /// ADDRESS DESCRIPTOR INDEX (12-byte form).
        address_descriptor_index: u32,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        /// SERVICE ACTION (5 bits).
        service_action: u8,
        /// Allocation length.
        alloc_len: u16,
        /// Control byte.
        control: u8,
    },
    /// PERSISTENT RESERVE OUT.
    PersistentReserveOut {
        /// SERVICE ACTION (5 bits).
        service_action: u8,
        /// SCOPE (4 bits).
        scope: u8,
        /// TYPE (4 bits).
        pr_type: u8,
        /// Parameter list length.
        param_len: u32,
        /// Control byte.
        control: u8,
    },
    /// GET LBA STATUS.
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT.
        select_report: u8,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// REPORT TARGET PORT GROUPS.
    ReportTargetPortGroups {
        /// PARAMETER DATA FORMAT (3 bits).
        format: u8,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// SET TARGET PORT GROUPS.
    SetTargetPortGroups {
        /// Parameter list length.
        param_len: u32,
        /// Control byte.
        control: u8,
    },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportSupportedOpcodes {
        /// RCTD: return timeouts descriptors.
        rctd: bool,
        /// REPORTING OPTIONS (3 bits).
        options: u8,
        /// REQUESTED OPERATION CODE.
        opcode: u8,
        /// REQUESTED SERVICE ACTION.
        service_action: u16,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    ReportSupportedTmfs {
        /// REPD: extended parameter data.
        repd: bool,
        /// Allocation length.
        alloc_len: u32,
        /// Control byte.
        control: u8,
    },
}

const fn bit(v: u8, n: u8) -> bool {
    v & (1 << n) != 0
}
const fn flag(set: bool, n: u8) -> u8 {
    if set { 1 << n } else { 0 }
}

/// Which block command a [`BlockIo`] belongs to, for per-command bit rules.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IoKind {
    Read,
    Write,
    WriteAndVerify,
    Verify,
    OrWrite,
    CompareAndWrite,
}

impl IoKind {
    /// Bits of byte 1 the command defines (besides the PROTECT field).
    fn byte1_mask(self) -> u8 {
        match self {
            IoKind::Read => 0x1c,                    // DPO FUA RARC
            IoKind::Write | IoKind::OrWrite => 0x1a, // DPO FUA FUA_NV
            IoKind::WriteAndVerify => 0x12,          // DPO BYTCHK(1 bit)
            IoKind::Verify => 0x16,                  // DPO BYTCHK(2 bits)
            IoKind::CompareAndWrite => 0x1a,         // DPO FUA FUA_NV
        }
    }
}

fn new_io(size: CdbSize) -> BlockIo {
    BlockIo {
        size,
        lba: 0,
        blocks: 0,
        protect: 0,
        dpo: false,
        fua: false,
        fua_nv: false,
        rarc: false,
        bytchk: 0,
        group: 0,
        control: 0,
    }
}

/// An emitted CDB: up to 16 bytes, used like a slice.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct EncodedCdb {
    bytes: [u8; 16],
    len: u8,
}

impl AsRef<[u8]> for EncodedCdb {
    fn as_ref(&self) -> &[u8] {
        self.bytes
            .get(..usize::from(self.len))
            .unwrap_or(&self.bytes)
    }
}

impl std::fmt::Debug for EncodedCdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncodedCdb({:02x?})", self.as_ref())
    }
}

impl Command {
    /// Decodes a CDB. Bytes beyond the command's length are ignored.
    pub fn parse(cdb: &[u8]) -> Result<Command, CdbError> {
        let op = *cdb.first().ok_or(CdbError::Empty)?;
        // The sets in turn, the block commands first (the data path);
        // called directly so that their matches inline into one.
        if let Some(c) = sbc::parse(op, cdb)? {
            return Ok(c);
        }
        if let Some(c) = spc::parse(op, cdb)? {
            return Ok(c);
        }
        if let Some(c) = pr::parse(op, cdb)? {
            return Ok(c);
        }
        if let Some(c) = copy::parse(op, cdb)? {
            return Ok(c);
        }
        Err(CdbError::InvalidOpcode { opcode: op })
    }

    /// The emitted CDB as a small value.
    pub fn encode(&self) -> EncodedCdb {
        let mut b = [0u8; 16];
        // Every command belongs to one set (checked for each variant by
        // `every_command_encodes_in_the_set_that_decodes_it`): none leaves
        // an empty CDB.
        let len = sbc::encode(self, &mut b)
            .or_else(|| spc::encode(self, &mut b))
            .or_else(|| pr::encode(self, &mut b))
            .or_else(|| copy::encode(self, &mut b))
            .unwrap_or(0);
        EncodedCdb {
            bytes: b,
            len: len as u8,
        }
    }

    /// The operation code.
    pub fn opcode(&self) -> u8 {
        let e = self.encode();
        e.bytes[0]
    }

    /// Length of the CDB this command emits.
    pub fn buffer_len(&self) -> usize {
        usize::from(self.encode().len)
    }

    /// Writes the CDB into `buf`, returning its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, CdbError> {
        let e = self.encode();
        let len = usize::from(e.len);
        let got = buf.len();
        let dst = buf
            .get_mut(..len)
            .ok_or(CdbError::BufferTooSmall { needed: len, got })?;
        dst.copy_from_slice(e.as_ref());
        Ok(len)
    }
}

/// CDB length implied by the operation code's group (SPC-4 §4.2.5.1), for
/// operation codes whose group fixes it.
pub fn cdb_length_of(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

mod copy;
mod field;
mod pr;
mod sbc;
mod spc;

#[cfg(test)]
mod tests;
