//! SBC-3's block commands: the READ, WRITE, VERIFY, WRITE AND VERIFY,
//! ORWRITE, COMPARE AND WRITE, WRITE SAME and WRITE ATOMIC families,
//! PRE-FETCH, SYNCHRONIZE CACHE, UNMAP, READ CAPACITY (10 and 16), GET LBA
//! STATUS, READ DEFECT DATA, FORMAT UNIT, SANITIZE, START STOP UNIT and
//! PREVENT ALLOW MEDIUM REMOVAL.

use super::field::*;
use super::*;

/// Decodes `cdb` if its operation code `op` is one of this set's;
/// `Ok(None)` if it is not.
#[inline]
pub(super) fn parse(op: u8, cdb: &[u8]) -> Result<Option<Command>, CdbError> {
    use opcode::*;
    let cmd = match op {
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
        _ => return Ok(None),
    };
    Ok(Some(cmd))
}

/// Emits `cmd` into `b` if it is one of this set's commands: the
/// length; `None` if it is not.
#[inline]
pub(super) fn encode(cmd: &Command, b: &mut [u8; 16]) -> Option<usize> {
    use opcode::*;
    let len = match *cmd {
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
            emit_io(op, false, io, b)
        }
        Command::Write(ref io) => {
            let op = match io.size {
                CdbSize::Six => WRITE_6,
                CdbSize::Ten => WRITE_10,
                CdbSize::Twelve => WRITE_12,
                CdbSize::Sixteen => WRITE_16,
            };
            emit_io(op, false, io, b)
        }
        Command::WriteAndVerify(ref io) => {
            let op = match io.size {
                CdbSize::Six | CdbSize::Ten => WRITE_AND_VERIFY_10,
                CdbSize::Twelve => WRITE_AND_VERIFY_12,
                CdbSize::Sixteen => WRITE_AND_VERIFY_16,
            };
            emit_io(op, false, io, b)
        }
        Command::Verify(ref io) => {
            let op = match io.size {
                CdbSize::Six | CdbSize::Ten => VERIFY_10,
                CdbSize::Twelve => VERIFY_12,
                CdbSize::Sixteen => VERIFY_16,
            };
            emit_io(op, false, io, b)
        }
        Command::OrWrite(ref io) => {
            let io = BlockIo {
                size: CdbSize::Sixteen,
                ..*io
            };
            emit_io(ORWRITE_16, false, &io, b)
        }
        Command::CompareAndWrite(ref io) => {
            let io = BlockIo {
                size: CdbSize::Sixteen,
                ..*io
            };
            emit_io(COMPARE_AND_WRITE, true, &io, b)
        }
        Command::PreFetch {
            size,
            immed,
            lba,
            blocks,
            group,
            control,
        } => emit_cache(
            b,
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
            b,
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
        _ => return None,
    };
    Some(len)
}
