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

/// Copies the first `N` bytes of `cdb`, or says it is too short.
fn take<const N: usize>(cdb: &[u8]) -> Result<[u8; N], CdbError> {
    cdb.get(..N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(CdbError::Truncated {
            needed: N,
            got: cdb.len(),
        })
}

/// Refuses any bit of `mask` set in `value` (byte `byte` of the CDB).
fn reserved(value: u8, mask: u8, byte: usize) -> Result<(), CdbError> {
    let bad = value & mask;
    if bad == 0 {
        return Ok(());
    }
    let bit = 7 - bad.leading_zeros() as u8;
    Err(CdbError::InvalidField {
        byte: byte as u16,
        bit: Some(bit),
    })
}

/// Refuses a non-zero byte range.
fn zero(bytes: &[u8], first: usize) -> Result<(), CdbError> {
    for (i, b) in bytes.iter().enumerate() {
        reserved(*b, 0xff, first + i)?;
    }
    Ok(())
}

/// The control byte: vendor bits kept, NACA/LINK/reserved refused.
fn control(value: u8, byte: usize) -> Result<u8, CdbError> {
    reserved(value, 0x3f, byte)?;
    Ok(value)
}

fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}
fn be32(b: [u8; 4]) -> u32 {
    u32::from_be_bytes(b)
}
fn be64(b: [u8; 8]) -> u64 {
    u64::from_be_bytes(b)
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

fn parse_byte1(kind: IoKind, b1: u8, io: &mut BlockIo) -> Result<(), CdbError> {
    reserved(b1, !(0xe0 | kind.byte1_mask()), 1)?;
    io.protect = b1 >> 5;
    io.dpo = bit(b1, 4);
    match kind {
        IoKind::Read => {
            io.fua = bit(b1, 3);
            io.rarc = bit(b1, 2);
        }
        IoKind::Write | IoKind::OrWrite | IoKind::CompareAndWrite => {
            io.fua = bit(b1, 3);
            io.fua_nv = bit(b1, 1);
        }
        IoKind::WriteAndVerify => io.bytchk = (b1 >> 1) & 1,
        IoKind::Verify => {
            io.bytchk = (b1 >> 1) & 3;
            if io.bytchk == 2 {
                return Err(CdbError::InvalidField {
                    byte: 1,
                    bit: Some(2),
                });
            }
        }
    }
    Ok(())
}

fn emit_byte1(io: &BlockIo) -> u8 {
    ((io.protect & 7) << 5)
        | flag(io.dpo, 4)
        | flag(io.fua, 3)
        | flag(io.rarc, 2)
        | flag(io.fua_nv, 1)
        | ((io.bytchk & 3) << 1)
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

fn parse_io(kind: IoKind, size: CdbSize, cdb: &[u8]) -> Result<BlockIo, CdbError> {
    let mut io = new_io(size);
    match size {
        CdbSize::Six => {
            let b: [u8; 6] = take(cdb)?;
            reserved(b[1], 0xe0, 1)?;
            io.lba = u64::from(be32([0, b[1] & 0x1f, b[2], b[3]]));
            io.blocks = if b[4] == 0 { 256 } else { u32::from(b[4]) };
            io.control = control(b[5], 5)?;
        }
        CdbSize::Ten => {
            let b: [u8; 10] = take(cdb)?;
            parse_byte1(kind, b[1], &mut io)?;
            io.lba = u64::from(be32([b[2], b[3], b[4], b[5]]));
            reserved(b[6], 0xe0, 6)?;
            io.group = b[6] & 0x1f;
            io.blocks = u32::from(be16([b[7], b[8]]));
            io.control = control(b[9], 9)?;
        }
        CdbSize::Twelve => {
            let b: [u8; 12] = take(cdb)?;
            parse_byte1(kind, b[1], &mut io)?;
            io.lba = u64::from(be32([b[2], b[3], b[4], b[5]]));
            io.blocks = be32([b[6], b[7], b[8], b[9]]);
            reserved(b[10], 0xe0, 10)?;
            io.group = b[10] & 0x1f;
            io.control = control(b[11], 11)?;
        }
        CdbSize::Sixteen => {
            let b: [u8; 16] = take(cdb)?;
            parse_byte1(kind, b[1], &mut io)?;
            io.lba = be64([b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]);
            if kind == IoKind::CompareAndWrite {
                zero(&b[10..13], 10)?;
                io.blocks = u32::from(b[13]);
            } else {
                io.blocks = be32([b[10], b[11], b[12], b[13]]);
            }
            reserved(b[14], 0xe0, 14)?;
            io.group = b[14] & 0x1f;
            io.control = control(b[15], 15)?;
        }
    }
    Ok(io)
}

fn emit_io(op: u8, cas: bool, io: &BlockIo, b: &mut [u8; 16]) -> usize {
    b[0] = op;
    match io.size {
        CdbSize::Six => {
            let lba = (io.lba as u32).to_be_bytes();
            b[1] = lba[1] & 0x1f;
            b[2] = lba[2];
            b[3] = lba[3];
            b[4] = if io.blocks >= 256 { 0 } else { io.blocks as u8 };
            b[5] = io.control;
        }
        CdbSize::Ten => {
            b[1] = emit_byte1(io);
            b[2..6].copy_from_slice(&(io.lba as u32).to_be_bytes());
            b[6] = io.group & 0x1f;
            b[7..9].copy_from_slice(&(io.blocks as u16).to_be_bytes());
            b[9] = io.control;
        }
        CdbSize::Twelve => {
            b[1] = emit_byte1(io);
            b[2..6].copy_from_slice(&(io.lba as u32).to_be_bytes());
            b[6..10].copy_from_slice(&io.blocks.to_be_bytes());
            b[10] = io.group & 0x1f;
            b[11] = io.control;
        }
        CdbSize::Sixteen => {
            b[1] = emit_byte1(io);
            b[2..10].copy_from_slice(&io.lba.to_be_bytes());
            if cas {
                b[13] = io.blocks as u8;
            } else {
                b[10..14].copy_from_slice(&io.blocks.to_be_bytes());
            }
            b[14] = io.group & 0x1f;
            b[15] = io.control;
        }
    }
    io.size.len()
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
        use opcode::*;
        let op = *cdb.first().ok_or(CdbError::Empty)?;
        let cmd = match op {
            TEST_UNIT_READY => {
                let b: [u8; 6] = take(cdb)?;
                zero(&b[1..5], 1)?;
                Command::TestUnitReady {
                    control: control(b[5], 5)?,
                }
            }
            REQUEST_SENSE => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0xfe, 1)?;
                zero(&b[2..4], 2)?;
                Command::RequestSense {
                    desc: bit(b[1], 0),
                    alloc_len: b[4],
                    control: control(b[5], 5)?,
                }
            }
            FORMAT_UNIT => {
                let b: [u8; 6] = take(cdb)?;
                zero(&b[3..5], 3)?;
                Command::FormatUnit {
                    fmtpinfo: b[1] >> 6,
                    longlist: bit(b[1], 5),
                    fmtdata: bit(b[1], 4),
                    cmplst: bit(b[1], 3),
                    defect_list_format: b[1] & 7,
                    vendor: b[2],
                    control: control(b[5], 5)?,
                }
            }
            INQUIRY => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0xfe, 1)?;
                Command::Inquiry {
                    evpd: bit(b[1], 0),
                    page_code: b[2],
                    alloc_len: be16([b[3], b[4]]),
                    control: control(b[5], 5)?,
                }
            }
            MODE_SELECT_6 => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0xee, 1)?;
                zero(&b[2..4], 2)?;
                Command::ModeSelect {
                    ten: false,
                    pf: bit(b[1], 4),
                    sp: bit(b[1], 0),
                    param_len: u16::from(b[4]),
                    control: control(b[5], 5)?,
                }
            }
            MODE_SELECT_10 => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xee, 1)?;
                zero(&b[2..7], 2)?;
                Command::ModeSelect {
                    ten: true,
                    pf: bit(b[1], 4),
                    sp: bit(b[1], 0),
                    param_len: be16([b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            MODE_SENSE_6 => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0xf7, 1)?;
                Command::ModeSense {
                    ten: false,
                    llbaa: false,
                    dbd: bit(b[1], 3),
                    pc: b[2] >> 6,
                    page_code: b[2] & 0x3f,
                    subpage: b[3],
                    alloc_len: u16::from(b[4]),
                    control: control(b[5], 5)?,
                }
            }
            MODE_SENSE_10 => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xe7, 1)?;
                zero(&b[4..7], 4)?;
                Command::ModeSense {
                    ten: true,
                    llbaa: bit(b[1], 4),
                    dbd: bit(b[1], 3),
                    pc: b[2] >> 6,
                    page_code: b[2] & 0x3f,
                    subpage: b[3],
                    alloc_len: be16([b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            RESERVE_6 | RELEASE_6 => {
                let b: [u8; 6] = take(cdb)?;
                zero(&b[1..5], 1)?;
                let control = control(b[5], 5)?;
                if op == RESERVE_6 {
                    Command::Reserve {
                        ten: false,
                        control,
                    }
                } else {
                    Command::Release {
                        ten: false,
                        control,
                    }
                }
            }
            RESERVE_10 | RELEASE_10 => {
                let b: [u8; 10] = take(cdb)?;
                zero(&b[1..9], 1)?;
                let control = control(b[9], 9)?;
                if op == RESERVE_10 {
                    Command::Reserve { ten: true, control }
                } else {
                    Command::Release { ten: true, control }
                }
            }
            START_STOP_UNIT => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0xfe, 1)?;
                reserved(b[2], 0xff, 2)?;
                reserved(b[3], 0xf0, 3)?;
                reserved(b[4], 0x08, 4)?;
                Command::StartStopUnit {
                    immed: bit(b[1], 0),
                    power_condition_modifier: b[3] & 0x0f,
                    power_condition: b[4] >> 4,
                    no_flush: bit(b[4], 2),
                    loej: bit(b[4], 1),
                    start: bit(b[4], 0),
                    control: control(b[5], 5)?,
                }
            }
            SEND_DIAGNOSTIC => {
                let b: [u8; 6] = take(cdb)?;
                reserved(b[1], 0x08, 1)?;
                reserved(b[2], 0xff, 2)?;
                Command::SendDiagnostic {
                    self_test_code: b[1] >> 5,
                    pf: bit(b[1], 4),
                    self_test: bit(b[1], 2),
                    devoffl: bit(b[1], 1),
                    unitoffl: bit(b[1], 0),
                    param_len: be16([b[3], b[4]]),
                    control: control(b[5], 5)?,
                }
            }
            PREVENT_ALLOW_MEDIUM_REMOVAL => {
                let b: [u8; 6] = take(cdb)?;
                zero(&b[1..4], 1)?;
                reserved(b[4], 0xfc, 4)?;
                Command::PreventAllow {
                    prevent: b[4] & 3,
                    control: control(b[5], 5)?,
                }
            }
            READ_CAPACITY_10 => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xff, 1)?;
                zero(&b[6..8], 6)?;
                reserved(b[8], 0xfe, 8)?;
                let lba = be32([b[2], b[3], b[4], b[5]]);
                let pmi = bit(b[8], 0);
                if !pmi && lba != 0 {
                    return Err(CdbError::InvalidField { byte: 2, bit: None });
                }
                Command::ReadCapacity10 {
                    lba,
                    pmi,
                    control: control(b[9], 9)?,
                }
            }
            READ_6 => Command::Read(parse_io(IoKind::Read, CdbSize::Six, cdb)?),
            READ_10 => Command::Read(parse_io(IoKind::Read, CdbSize::Ten, cdb)?),
            READ_12 => Command::Read(parse_io(IoKind::Read, CdbSize::Twelve, cdb)?),
            READ_16 => Command::Read(parse_io(IoKind::Read, CdbSize::Sixteen, cdb)?),
            WRITE_6 => Command::Write(parse_io(IoKind::Write, CdbSize::Six, cdb)?),
            WRITE_10 => Command::Write(parse_io(IoKind::Write, CdbSize::Ten, cdb)?),
            WRITE_12 => Command::Write(parse_io(IoKind::Write, CdbSize::Twelve, cdb)?),
            WRITE_16 => Command::Write(parse_io(IoKind::Write, CdbSize::Sixteen, cdb)?),
            WRITE_AND_VERIFY_10 => {
                Command::WriteAndVerify(parse_io(IoKind::WriteAndVerify, CdbSize::Ten, cdb)?)
            }
            WRITE_AND_VERIFY_12 => {
                Command::WriteAndVerify(parse_io(IoKind::WriteAndVerify, CdbSize::Twelve, cdb)?)
            }
            WRITE_AND_VERIFY_16 => {
                Command::WriteAndVerify(parse_io(IoKind::WriteAndVerify, CdbSize::Sixteen, cdb)?)
            }
            VERIFY_10 => Command::Verify(parse_io(IoKind::Verify, CdbSize::Ten, cdb)?),
            VERIFY_12 => Command::Verify(parse_io(IoKind::Verify, CdbSize::Twelve, cdb)?),
            VERIFY_16 => Command::Verify(parse_io(IoKind::Verify, CdbSize::Sixteen, cdb)?),
            ORWRITE_16 => Command::OrWrite(parse_io(IoKind::OrWrite, CdbSize::Sixteen, cdb)?),
            COMPARE_AND_WRITE => {
                Command::CompareAndWrite(parse_io(IoKind::CompareAndWrite, CdbSize::Sixteen, cdb)?)
            }
            PRE_FETCH_10 | SYNCHRONIZE_CACHE_10 => {
                let b: [u8; 10] = take(cdb)?;
                let sync = op == SYNCHRONIZE_CACHE_10;
                reserved(b[1], if sync { 0xf9 } else { 0xfd }, 1)?;
                reserved(b[6], 0xe0, 6)?;
                let (lba, blocks) = (
                    u64::from(be32([b[2], b[3], b[4], b[5]])),
                    u32::from(be16([b[7], b[8]])),
                );
                let (group, control) = (b[6] & 0x1f, control(b[9], 9)?);
                if sync {
                    Command::SynchronizeCache {
                        size: CdbSize::Ten,
                        sync_nv: bit(b[1], 2),
                        immed: bit(b[1], 1),
                        lba,
                        blocks,
                        group,
                        control,
                    }
                } else {
                    Command::PreFetch {
                        size: CdbSize::Ten,
                        immed: bit(b[1], 1),
                        lba,
                        blocks,
                        group,
                        control,
                    }
                }
            }
            PRE_FETCH_16 | SYNCHRONIZE_CACHE_16 => {
                let b: [u8; 16] = take(cdb)?;
                let sync = op == SYNCHRONIZE_CACHE_16;
                reserved(b[1], if sync { 0xf9 } else { 0xfd }, 1)?;
                reserved(b[14], 0xe0, 14)?;
                let lba = be64([b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]);
                let blocks = be32([b[10], b[11], b[12], b[13]]);
                let (group, control) = (b[14] & 0x1f, control(b[15], 15)?);
                if sync {
                    Command::SynchronizeCache {
                        size: CdbSize::Sixteen,
                        sync_nv: bit(b[1], 2),
                        immed: bit(b[1], 1),
                        lba,
                        blocks,
                        group,
                        control,
                    }
                } else {
                    Command::PreFetch {
                        size: CdbSize::Sixteen,
                        immed: bit(b[1], 1),
                        lba,
                        blocks,
                        group,
                        control,
                    }
                }
            }
            WRITE_SAME_10 => {
                let b: [u8; 10] = take(cdb)?;
                // LBDATA/PBDATA (obsolete) refused.
                reserved(b[1], 0x07, 1)?;
                reserved(b[6], 0xe0, 6)?;
                Command::WriteSame {
                    size: CdbSize::Ten,
                    wrprotect: b[1] >> 5,
                    anchor: bit(b[1], 4),
                    unmap: bit(b[1], 3),
                    ndob: false,
                    lba: u64::from(be32([b[2], b[3], b[4], b[5]])),
                    blocks: u32::from(be16([b[7], b[8]])),
                    group: b[6] & 0x1f,
                    control: control(b[9], 9)?,
                }
            }
            WRITE_SAME_16 => {
                let b: [u8; 16] = take(cdb)?;
                reserved(b[1], 0x06, 1)?;
                reserved(b[14], 0xe0, 14)?;
                Command::WriteSame {
                    size: CdbSize::Sixteen,
                    wrprotect: b[1] >> 5,
                    anchor: bit(b[1], 4),
                    unmap: bit(b[1], 3),
                    ndob: bit(b[1], 0),
                    lba: be64([b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]),
                    blocks: be32([b[10], b[11], b[12], b[13]]),
                    group: b[14] & 0x1f,
                    control: control(b[15], 15)?,
                }
            }
            WRITE_ATOMIC_16 => {
                let b: [u8; 16] = take(cdb)?;
                reserved(b[1], 0x07, 1)?;
                reserved(b[14], 0xe0, 14)?;
                Command::WriteAtomic16 {
                    wrprotect: b[1] >> 5,
                    dpo: bit(b[1], 4),
                    fua: bit(b[1], 3),
                    lba: be64([b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]),
                    boundary: be16([b[10], b[11]]),
                    blocks: be16([b[12], b[13]]),
                    group: b[14] & 0x1f,
                    control: control(b[15], 15)?,
                }
            }
            EXTENDED_COPY => {
                let b: [u8; 16] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                zero(&b[2..10], 2)?;
                reserved(b[14], 0xff, 14)?;
                Command::ExtendedCopy {
                    service_action: b[1] & 0x1f,
                    param_len: be32([b[10], b[11], b[12], b[13]]),
                    control: control(b[15], 15)?,
                }
            }
            RECEIVE_COPY_RESULTS => {
                let b: [u8; 16] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                zero(&b[3..10], 3)?;
                reserved(b[14], 0xff, 14)?;
                Command::ReceiveCopyResults {
                    service_action: b[1] & 0x1f,
                    list_id: b[2],
                    alloc_len: be32([b[10], b[11], b[12], b[13]]),
                    control: control(b[15], 15)?,
                }
            }
            SANITIZE => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0x40, 1)?;
                zero(&b[2..7], 2)?;
                Command::Sanitize {
                    immed: bit(b[1], 7),
                    ause: bit(b[1], 5),
                    service_action: b[1] & 0x1f,
                    param_len: be16([b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            UNMAP => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xfe, 1)?;
                zero(&b[2..6], 2)?;
                reserved(b[6], 0xe0, 6)?;
                Command::Unmap {
                    anchor: bit(b[1], 0),
                    group: b[6] & 0x1f,
                    param_len: be16([b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            READ_DEFECT_DATA_10 => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xff, 1)?;
                reserved(b[2], 0xe0, 2)?;
                zero(&b[3..7], 3)?;
                Command::ReadDefectData {
                    twelve: false,
                    req_plist: bit(b[2], 4),
                    req_glist: bit(b[2], 3),
                    format: b[2] & 7,
                    address_descriptor_index: 0,
                    alloc_len: u32::from(be16([b[7], b[8]])),
                    control: control(b[9], 9)?,
                }
            }
            READ_DEFECT_DATA_12 => {
                let b: [u8; 12] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                reserved(b[10], 0xff, 10)?;
                Command::ReadDefectData {
                    twelve: true,
                    req_plist: bit(b[1], 4),
                    req_glist: bit(b[1], 3),
                    format: b[1] & 7,
                    address_descriptor_index: be32([b[2], b[3], b[4], b[5]]),
                    alloc_len: be32([b[6], b[7], b[8], b[9]]),
                    control: control(b[11], 11)?,
                }
            }
            PERSISTENT_RESERVE_IN => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                zero(&b[2..7], 2)?;
                Command::PersistentReserveIn {
                    service_action: b[1] & 0x1f,
                    alloc_len: be16([b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            PERSISTENT_RESERVE_OUT => {
                let b: [u8; 10] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                zero(&b[3..5], 3)?;
                Command::PersistentReserveOut {
                    service_action: b[1] & 0x1f,
                    scope: b[2] >> 4,
                    pr_type: b[2] & 0x0f,
                    param_len: be32([b[5], b[6], b[7], b[8]]),
                    control: control(b[9], 9)?,
                }
            }
            SERVICE_ACTION_IN_16 => {
                let b: [u8; 16] = take(cdb)?;
                reserved(b[1], 0xe0, 1)?;
                let sa = u16::from(b[1] & 0x1f);
                let lba = be64([b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9]]);
                let alloc_len = be32([b[10], b[11], b[12], b[13]]);
                match sa {
                    service_action::READ_CAPACITY_16 => {
                        reserved(b[14], 0xfe, 14)?;
                        let pmi = bit(b[14], 0);
                        if !pmi && lba != 0 {
                            return Err(CdbError::InvalidField { byte: 2, bit: None });
                        }
                        Command::ReadCapacity16 {
                            lba,
                            alloc_len,
                            pmi,
                            control: control(b[15], 15)?,
                        }
                    }
                    service_action::GET_LBA_STATUS => {
                        reserved(b[14], 0xff, 14)?;
                        Command::GetLbaStatus {
                            lba,
                            alloc_len,
                            control: control(b[15], 15)?,
                        }
                    }
                    _ => {
                        return Err(CdbError::InvalidServiceAction {
                            opcode: op,
                            service_action: sa,
                        });
                    }
                }
            }
            REPORT_LUNS => {
                let b: [u8; 12] = take(cdb)?;
                reserved(b[1], 0xff, 1)?;
                zero(&b[3..6], 3)?;
                reserved(b[10], 0xff, 10)?;
                Command::ReportLuns {
                    select_report: b[2],
                    alloc_len: be32([b[6], b[7], b[8], b[9]]),
                    control: control(b[11], 11)?,
                }
            }
            MAINTENANCE_IN => {
                let b: [u8; 12] = take(cdb)?;
                let sa = u16::from(b[1] & 0x1f);
                let alloc_len = be32([b[6], b[7], b[8], b[9]]);
                match sa {
                    service_action::REPORT_TARGET_PORT_GROUPS => {
                        zero(&b[2..6], 2)?;
                        reserved(b[10], 0xff, 10)?;
                        Command::ReportTargetPortGroups {
                            format: b[1] >> 5,
                            alloc_len,
                            control: control(b[11], 11)?,
                        }
                    }
                    service_action::REPORT_SUPPORTED_OPERATION_CODES => {
                        reserved(b[1], 0xe0, 1)?;
                        reserved(b[2], 0x78, 2)?;
                        reserved(b[10], 0xff, 10)?;
                        Command::ReportSupportedOpcodes {
                            rctd: bit(b[2], 7),
                            options: b[2] & 7,
                            opcode: b[3],
                            service_action: be16([b[4], b[5]]),
                            alloc_len,
                            control: control(b[11], 11)?,
                        }
                    }
                    service_action::REPORT_SUPPORTED_TMFS => {
                        reserved(b[1], 0xe0, 1)?;
                        reserved(b[2], 0x7f, 2)?;
                        zero(&b[3..6], 3)?;
                        reserved(b[10], 0xff, 10)?;
                        Command::ReportSupportedTmfs {
                            repd: bit(b[2], 7),
                            alloc_len,
                            control: control(b[11], 11)?,
                        }
                    }
                    _ => {
                        return Err(CdbError::InvalidServiceAction {
                            opcode: op,
                            service_action: sa,
                        });
                    }
                }
            }
            _ => return Err(CdbError::InvalidOpcode { opcode: op }),
        };
        Ok(cmd)
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

    /// The emitted CDB as a small value.
    pub fn encode(&self) -> EncodedCdb {
        use opcode::*;
        let mut b = [0u8; 16];
        let len = match *self {
            Command::TestUnitReady { control } => {
                b[0] = TEST_UNIT_READY;
                b[5] = control;
                6
            }
            Command::RequestSense {
                desc,
                alloc_len,
                control,
            } => {
                b[0] = REQUEST_SENSE;
                b[1] = flag(desc, 0);
                b[4] = alloc_len;
                b[5] = control;
                6
            }
            Command::FormatUnit {
                fmtpinfo,
                longlist,
                fmtdata,
                cmplst,
                defect_list_format,
                vendor,
                control,
            } => {
                b[0] = FORMAT_UNIT;
                b[1] = ((fmtpinfo & 3) << 6)
                    | flag(longlist, 5)
                    | flag(fmtdata, 4)
                    | flag(cmplst, 3)
                    | (defect_list_format & 7);
                b[2] = vendor;
                b[5] = control;
                6
            }
            Command::Inquiry {
                evpd,
                page_code,
                alloc_len,
                control,
            } => {
                b[0] = INQUIRY;
                b[1] = flag(evpd, 0);
                b[2] = page_code;
                b[3..5].copy_from_slice(&alloc_len.to_be_bytes());
                b[5] = control;
                6
            }
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
                control,
            } => {
                b[1] = flag(pf, 4) | flag(sp, 0);
                if ten {
                    b[0] = MODE_SELECT_10;
                    b[7..9].copy_from_slice(&param_len.to_be_bytes());
                    b[9] = control;
                    10
                } else {
                    b[0] = MODE_SELECT_6;
                    b[4] = param_len as u8;
                    b[5] = control;
                    6
                }
            }
            Command::ModeSense {
                ten,
                llbaa,
                dbd,
                pc,
                page_code,
                subpage,
                alloc_len,
                control,
            } => {
                b[1] = flag(llbaa, 4) | flag(dbd, 3);
                b[2] = ((pc & 3) << 6) | (page_code & 0x3f);
                b[3] = subpage;
                if ten {
                    b[0] = MODE_SENSE_10;
                    b[7..9].copy_from_slice(&alloc_len.to_be_bytes());
                    b[9] = control;
                    10
                } else {
                    b[0] = MODE_SENSE_6;
                    b[4] = alloc_len as u8;
                    b[5] = control;
                    6
                }
            }
            Command::Reserve { ten, control } | Command::Release { ten, control } => {
                let reserve = matches!(self, Command::Reserve { .. });
                if ten {
                    b[0] = if reserve { RESERVE_10 } else { RELEASE_10 };
                    b[9] = control;
                    10
                } else {
                    b[0] = if reserve { RESERVE_6 } else { RELEASE_6 };
                    b[5] = control;
                    6
                }
            }
            Command::StartStopUnit {
                immed,
                power_condition_modifier,
                power_condition,
                no_flush,
                loej,
                start,
                control,
            } => {
                b[0] = START_STOP_UNIT;
                b[1] = flag(immed, 0);
                b[3] = power_condition_modifier & 0x0f;
                b[4] = ((power_condition & 0x0f) << 4)
                    | flag(no_flush, 2)
                    | flag(loej, 1)
                    | flag(start, 0);
                b[5] = control;
                6
            }
            Command::SendDiagnostic {
                self_test_code,
                pf,
                self_test,
                devoffl,
                unitoffl,
                param_len,
                control,
            } => {
                b[0] = SEND_DIAGNOSTIC;
                b[1] = ((self_test_code & 7) << 5)
                    | flag(pf, 4)
                    | flag(self_test, 2)
                    | flag(devoffl, 1)
                    | flag(unitoffl, 0);
                b[3..5].copy_from_slice(&param_len.to_be_bytes());
                b[5] = control;
                6
            }
            Command::PreventAllow { prevent, control } => {
                b[0] = PREVENT_ALLOW_MEDIUM_REMOVAL;
                b[4] = prevent & 3;
                b[5] = control;
                6
            }
            Command::ReadCapacity10 { lba, pmi, control } => {
                b[0] = READ_CAPACITY_10;
                b[2..6].copy_from_slice(&lba.to_be_bytes());
                b[8] = flag(pmi, 0);
                b[9] = control;
                10
            }
            Command::ReadCapacity16 {
                lba,
                alloc_len,
                pmi,
                control,
            } => {
                b[0] = SERVICE_ACTION_IN_16;
                b[1] = service_action::READ_CAPACITY_16 as u8;
                b[2..10].copy_from_slice(&lba.to_be_bytes());
                b[10..14].copy_from_slice(&alloc_len.to_be_bytes());
                b[14] = flag(pmi, 0);
                b[15] = control;
                16
            }
            Command::Read(ref io) => {
                let op = match io.size {
                    CdbSize::Six => READ_6,
                    CdbSize::Ten => READ_10,
                    CdbSize::Twelve => READ_12,
                    CdbSize::Sixteen => READ_16,
                };
                emit_io(op, false, io, &mut b)
            }
            Command::Write(ref io) => {
                let op = match io.size {
                    CdbSize::Six => WRITE_6,
                    CdbSize::Ten => WRITE_10,
                    CdbSize::Twelve => WRITE_12,
                    CdbSize::Sixteen => WRITE_16,
                };
                emit_io(op, false, io, &mut b)
            }
            Command::WriteAndVerify(ref io) => {
                let op = match io.size {
                    CdbSize::Six | CdbSize::Ten => WRITE_AND_VERIFY_10,
                    CdbSize::Twelve => WRITE_AND_VERIFY_12,
                    CdbSize::Sixteen => WRITE_AND_VERIFY_16,
                };
                emit_io(op, false, io, &mut b)
            }
            Command::Verify(ref io) => {
                let op = match io.size {
                    CdbSize::Six | CdbSize::Ten => VERIFY_10,
                    CdbSize::Twelve => VERIFY_12,
                    CdbSize::Sixteen => VERIFY_16,
                };
                emit_io(op, false, io, &mut b)
            }
            Command::OrWrite(ref io) => {
                let io = BlockIo {
                    size: CdbSize::Sixteen,
                    ..*io
                };
                emit_io(ORWRITE_16, false, &io, &mut b)
            }
            Command::CompareAndWrite(ref io) => {
                let io = BlockIo {
                    size: CdbSize::Sixteen,
                    ..*io
                };
                emit_io(COMPARE_AND_WRITE, true, &io, &mut b)
            }
            Command::PreFetch {
                size,
                immed,
                lba,
                blocks,
                group,
                control,
            } => emit_cache(
                &mut b,
                size,
                (PRE_FETCH_10, PRE_FETCH_16),
                flag(immed, 1),
                lba,
                blocks,
                group,
                control,
            ),
            Command::SynchronizeCache {
                size,
                sync_nv,
                immed,
                lba,
                blocks,
                group,
                control,
            } => emit_cache(
                &mut b,
                size,
                (SYNCHRONIZE_CACHE_10, SYNCHRONIZE_CACHE_16),
                flag(sync_nv, 2) | flag(immed, 1),
                lba,
                blocks,
                group,
                control,
            ),
            Command::WriteAtomic16 {
                wrprotect,
                dpo,
                fua,
                lba,
                boundary,
                blocks,
                group,
                control,
            } => {
                b[0] = WRITE_ATOMIC_16;
                b[1] = ((wrprotect & 7) << 5) | flag(dpo, 4) | flag(fua, 3);
                b[2..10].copy_from_slice(&lba.to_be_bytes());
                b[10..12].copy_from_slice(&boundary.to_be_bytes());
                b[12..14].copy_from_slice(&blocks.to_be_bytes());
                b[14] = group & 0x1f;
                b[15] = control;
                16
            }
            Command::ExtendedCopy {
                service_action,
                param_len,
                control,
            } => {
                b[0] = EXTENDED_COPY;
                b[1] = service_action & 0x1f;
                b[10..14].copy_from_slice(&param_len.to_be_bytes());
                b[15] = control;
                16
            }
            Command::ReceiveCopyResults {
                service_action,
                list_id,
                alloc_len,
                control,
            } => {
                b[0] = RECEIVE_COPY_RESULTS;
                b[1] = service_action & 0x1f;
                b[2] = list_id;
                b[10..14].copy_from_slice(&alloc_len.to_be_bytes());
                b[15] = control;
                16
            }
            Command::Sanitize {
                immed,
                ause,
                service_action,
                param_len,
                control,
            } => {
                b[0] = SANITIZE;
                b[1] = flag(immed, 7) | flag(ause, 5) | (service_action & 0x1f);
                b[7..9].copy_from_slice(&param_len.to_be_bytes());
                b[9] = control;
                10
            }
            Command::WriteSame {
                size,
                wrprotect,
                anchor,
                unmap,
                ndob,
                lba,
                blocks,
                group,
                control,
            } => {
                let b1 = ((wrprotect & 7) << 5) | flag(anchor, 4) | flag(unmap, 3);
                if size == CdbSize::Sixteen {
                    b[0] = WRITE_SAME_16;
                    b[1] = b1 | flag(ndob, 0);
                    b[2..10].copy_from_slice(&lba.to_be_bytes());
                    b[10..14].copy_from_slice(&blocks.to_be_bytes());
                    b[14] = group & 0x1f;
                    b[15] = control;
                    16
                } else {
                    b[0] = WRITE_SAME_10;
                    b[1] = b1;
                    b[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
                    b[6] = group & 0x1f;
                    b[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
                    b[9] = control;
                    10
                }
            }
            Command::Unmap {
                anchor,
                group,
                param_len,
                control,
            } => {
                b[0] = UNMAP;
                b[1] = flag(anchor, 0);
                b[6] = group & 0x1f;
                b[7..9].copy_from_slice(&param_len.to_be_bytes());
                b[9] = control;
                10
            }
            Command::ReadDefectData {
                twelve,
                req_plist,
                req_glist,
                format,
                address_descriptor_index,
                alloc_len,
                control,
            } => {
                let flags = flag(req_plist, 4) | flag(req_glist, 3) | (format & 7);
                if twelve {
                    b[0] = READ_DEFECT_DATA_12;
                    b[1] = flags;
                    b[2..6].copy_from_slice(&address_descriptor_index.to_be_bytes());
                    b[6..10].copy_from_slice(&alloc_len.to_be_bytes());
                    b[11] = control;
                    12
                } else {
                    b[0] = READ_DEFECT_DATA_10;
                    b[2] = flags;
                    b[7..9].copy_from_slice(&(alloc_len as u16).to_be_bytes());
                    b[9] = control;
                    10
                }
            }
            Command::PersistentReserveIn {
                service_action,
                alloc_len,
                control,
            } => {
                b[0] = PERSISTENT_RESERVE_IN;
                b[1] = service_action & 0x1f;
                b[7..9].copy_from_slice(&alloc_len.to_be_bytes());
                b[9] = control;
                10
            }
            Command::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                param_len,
                control,
            } => {
                b[0] = PERSISTENT_RESERVE_OUT;
                b[1] = service_action & 0x1f;
                b[2] = ((scope & 0x0f) << 4) | (pr_type & 0x0f);
                b[5..9].copy_from_slice(&param_len.to_be_bytes());
                b[9] = control;
                10
            }
            Command::GetLbaStatus {
                lba,
                alloc_len,
                control,
            } => {
                b[0] = SERVICE_ACTION_IN_16;
                b[1] = service_action::GET_LBA_STATUS as u8;
                b[2..10].copy_from_slice(&lba.to_be_bytes());
                b[10..14].copy_from_slice(&alloc_len.to_be_bytes());
                b[15] = control;
                16
            }
            Command::ReportLuns {
                select_report,
                alloc_len,
                control,
            } => {
                b[0] = REPORT_LUNS;
                b[2] = select_report;
                b[6..10].copy_from_slice(&alloc_len.to_be_bytes());
                b[11] = control;
                12
            }
            Command::ReportTargetPortGroups {
                format,
                alloc_len,
                control,
            } => {
                b[0] = MAINTENANCE_IN;
                b[1] = ((format & 7) << 5) | service_action::REPORT_TARGET_PORT_GROUPS as u8;
                b[6..10].copy_from_slice(&alloc_len.to_be_bytes());
                b[11] = control;
                12
            }
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                service_action,
                alloc_len,
                control,
            } => {
                b[0] = MAINTENANCE_IN;
                b[1] = self::service_action::REPORT_SUPPORTED_OPERATION_CODES as u8;
                b[2] = flag(rctd, 7) | (options & 7);
                b[3] = opcode;
                b[4..6].copy_from_slice(&service_action.to_be_bytes());
                b[6..10].copy_from_slice(&alloc_len.to_be_bytes());
                b[11] = control;
                12
            }
            Command::ReportSupportedTmfs {
                repd,
                alloc_len,
                control,
            } => {
                b[0] = MAINTENANCE_IN;
                b[1] = service_action::REPORT_SUPPORTED_TMFS as u8;
                b[2] = flag(repd, 7);
                b[6..10].copy_from_slice(&alloc_len.to_be_bytes());
                b[11] = control;
                12
            }
        };
        EncodedCdb {
            bytes: b,
            len: len as u8,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn emit_cache(
    b: &mut [u8; 16],
    size: CdbSize,
    ops: (u8, u8),
    b1: u8,
    lba: u64,
    blocks: u32,
    group: u8,
    control: u8,
) -> usize {
    b[1] = b1;
    if size == CdbSize::Sixteen {
        b[0] = ops.1;
        b[2..10].copy_from_slice(&lba.to_be_bytes());
        b[10..14].copy_from_slice(&blocks.to_be_bytes());
        b[14] = group & 0x1f;
        b[15] = control;
        16
    } else {
        b[0] = ops.0;
        b[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        b[6] = group & 0x1f;
        b[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
        b[9] = control;
        10
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SenseKey;
    use proptest::prelude::*;

    #[test]
    fn read10_fields() {
        let cdb = [0x28, 0x18, 0, 0, 0x12, 0x34, 0x05, 0, 8, 0];
        let c = Command::parse(&cdb).unwrap();
        let Command::Read(io) = c else {
            panic!("{c:?}")
        };
        assert_eq!(io.lba, 0x1234);
        assert_eq!(io.blocks, 8);
        assert!(io.dpo && io.fua && !io.rarc);
        assert_eq!(io.group, 5);
        let mut out = [0u8; 16];
        assert_eq!(c.emit(&mut out), Ok(10));
        assert_eq!(&out[..10], &cdb);
    }

    #[test]
    fn read6_zero_means_256() {
        let c = Command::parse(&[0x08, 0x01, 0x02, 0x03, 0, 0]).unwrap();
        let Command::Read(io) = c else { panic!() };
        assert_eq!((io.lba, io.blocks), (0x10203, 256));
        assert_eq!(c.encode().as_ref(), &[0x08, 0x01, 0x02, 0x03, 0, 0]);
    }

    #[test]
    fn padded_cdb_is_accepted() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x00;
        assert_eq!(
            Command::parse(&cdb),
            Ok(Command::TestUnitReady { control: 0 })
        );
    }

    #[test]
    fn refusals_carry_field_pointers() {
        assert_eq!(Command::parse(&[]), Err(CdbError::Empty));
        assert_eq!(
            Command::parse(&[0xff, 0, 0, 0, 0, 0]),
            Err(CdbError::InvalidOpcode { opcode: 0xff })
        );
        assert_eq!(
            Command::parse(&[0x28, 0, 0]),
            Err(CdbError::Truncated { needed: 10, got: 3 })
        );
        // READ(10) obsolete bit 1 of byte 1.
        assert_eq!(
            Command::parse(&[0x28, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]),
            Err(CdbError::InvalidField {
                byte: 1,
                bit: Some(1)
            })
        );
        // NACA in the control byte.
        assert_eq!(
            Command::parse(&[0x00, 0, 0, 0, 0, 0x04]),
            Err(CdbError::InvalidField {
                byte: 5,
                bit: Some(2)
            })
        );
        // Unknown SERVICE ACTION IN(16) service action.
        let mut sai = [0u8; 16];
        sai[0] = 0x9e;
        sai[1] = 0x1f;
        assert_eq!(
            Command::parse(&sai),
            Err(CdbError::InvalidServiceAction {
                opcode: 0x9e,
                service_action: 0x1f
            })
        );
        // VERIFY BYTCHK=10b is reserved.
        assert_eq!(
            Command::parse(&[0x2f, 0x04, 0, 0, 0, 0, 0, 0, 1, 0]),
            Err(CdbError::InvalidField {
                byte: 1,
                bit: Some(2)
            })
        );
    }

    #[test]
    fn errors_map_to_sense() {
        let s: Sense = CdbError::InvalidOpcode { opcode: 0xff }.into();
        assert_eq!(s.key, SenseKey::ILLEGAL_REQUEST);
        assert_eq!(s.asc, asc::INVALID_COMMAND_OPERATION_CODE);
        let s: Sense = CdbError::InvalidField {
            byte: 1,
            bit: Some(3),
        }
        .into();
        assert_eq!(s.asc, asc::INVALID_FIELD_IN_CDB);
        assert_eq!(s.key_specific, Some([0xcb, 0, 1]));
        let s: Sense = CdbError::InvalidServiceAction {
            opcode: 0xa3,
            service_action: 0x1f,
        }
        .into();
        // libiscsi reads field pointer 1 as "not implemented".
        assert_eq!(s.key_specific.map(|k| (k[1], k[2])), Some((0, 1)));
    }

    #[test]
    fn emit_into_small_buffer_fails() {
        let c = Command::TestUnitReady { control: 0 };
        let mut small = [0u8; 3];
        assert_eq!(
            c.emit(&mut small),
            Err(CdbError::BufferTooSmall { needed: 6, got: 3 })
        );
    }

    /// Every operation code the parser knows, with the length it needs.
    const KNOWN: &[(u8, usize)] = &[
        (0x00, 6),
        (0x03, 6),
        (0x04, 6),
        (0x08, 6),
        (0x0a, 6),
        (0x12, 6),
        (0x15, 6),
        (0x16, 6),
        (0x17, 6),
        (0x1a, 6),
        (0x1b, 6),
        (0x1d, 6),
        (0x1e, 6),
        (0x25, 10),
        (0x28, 10),
        (0x2a, 10),
        (0x2e, 10),
        (0x2f, 10),
        (0x34, 10),
        (0x35, 10),
        (0x37, 10),
        (0x41, 10),
        (0x42, 10),
        (0x48, 10),
        (0x55, 10),
        (0x56, 10),
        (0x57, 10),
        (0x5a, 10),
        (0x5e, 10),
        (0x5f, 10),
        (0x83, 16),
        (0x84, 16),
        (0x88, 16),
        (0x89, 16),
        (0x8a, 16),
        (0x8b, 16),
        (0x8e, 16),
        (0x8f, 16),
        (0x90, 16),
        (0x91, 16),
        (0x93, 16),
        (0x9c, 16),
        (0x9e, 16),
        (0xa0, 12),
        (0xa3, 12),
        (0xa8, 12),
        (0xaa, 12),
        (0xae, 12),
        (0xaf, 12),
        (0xb7, 12),
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// parse -> emit is the identity on the command's bytes, for every
        /// command: random bytes after a known opcode either are refused or
        /// re-emit unchanged.
        #[test]
        fn parse_emit_identity(idx in 0..KNOWN.len(), body in proptest::collection::vec(any::<u8>(), 15), sparse in any::<u16>()) {
            let (op, len) = KNOWN[idx];
            let mut cdb = vec![op];
            // Clear most bytes half the time so that valid CDBs are common.
            for (i, b) in body.iter().enumerate() {
                cdb.push(if sparse & (1 << i) != 0 { 0 } else { *b });
            }
            if op == 0x9e { cdb[1] = if sparse & 1 == 0 { 0x10 } else { 0x12 }; }
            if op == 0xa3 { cdb[1] = [0x0a, 0x0c, 0x0d][usize::from(sparse % 3)] | (cdb[1] & 0xe0); }
            if let Ok(c) = Command::parse(&cdb) {
                prop_assert_eq!(c.buffer_len(), len);
                let e = c.encode();
                prop_assert_eq!(e.as_ref(), &cdb[..len]);
                prop_assert_eq!(Command::parse(e.as_ref()), Ok(c));
            }
        }

        /// Any bytes: parse never panics, and what parses round-trips.
        #[test]
        fn arbitrary_bytes(cdb in proptest::collection::vec(any::<u8>(), 0..20)) {
            if let Ok(c) = Command::parse(&cdb) {
                let n = c.buffer_len();
                let e = c.encode();
                prop_assert_eq!(e.as_ref(), &cdb[..n]);
            }
        }
    }

    #[test]
    fn every_known_opcode_parses_when_zeroed() {
        for &(op, len) in KNOWN {
            let mut cdb = vec![0u8; len];
            cdb[0] = op;
            if op == 0x9e {
                cdb[1] = 0x10;
            }
            if op == 0xa3 {
                cdb[1] = 0x0c;
            }
            let c = Command::parse(&cdb).unwrap_or_else(|e| panic!("{op:#x}: {e}"));
            assert_eq!(c.encode().as_ref(), &cdb[..], "{op:#x}");
            assert_eq!(c.opcode(), op);
            assert_eq!(cdb_length_of(op), Some(len));
        }
    }
}
