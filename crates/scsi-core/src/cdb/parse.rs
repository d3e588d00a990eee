//! Decoding: CDB bytes to a [`Command`], strictly (every reserved or
//! unimplemented bit refused with a field pointer).

use super::*;

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
}
