//! Emitting: a [`Command`] back to its CDB bytes.

use super::*;

fn emit_byte1(io: &BlockIo) -> u8 {
    ((io.protect & 7) << 5)
        | flag(io.dpo, 4)
        | flag(io.fua, 3)
        | flag(io.rarc, 2)
        | flag(io.fua_nv, 1)
        | ((io.bytchk & 3) << 1)
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

impl Command {
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
