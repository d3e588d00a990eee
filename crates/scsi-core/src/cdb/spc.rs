//! SPC-4's primary commands: TEST UNIT READY, REQUEST SENSE, INQUIRY,
//! MODE SELECT and MODE SENSE (6 and 10), LOG SENSE, SEND DIAGNOSTIC,
//! REPORT LUNS,
//! and the MAINTENANCE IN reports (target port groups, supported
//! operation codes and task management functions).

use super::field::*;
use super::*;

/// Decodes `cdb` if its operation code `op` is one of this set's;
/// `Ok(None)` if it is not.
#[inline]
pub(super) fn parse(op: u8, cdb: &[u8]) -> Result<Option<Command>, CdbError> {
    use opcode::*;
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
        LOG_SENSE => {
            let b: [u8; 10] = take(cdb)?;
            // PPC (obsolete) and SP (saving is not supported) refused.
            reserved(b[1], 0xff, 1)?;
            zero(&b[4..5], 4)?;
            Command::LogSense {
                pc: b[2] >> 6,
                page_code: b[2] & 0x3f,
                subpage: b[3],
                param_pointer: be16([b[5], b[6]]),
                alloc_len: be16([b[7], b[8]]),
                control: control(b[9], 9)?,
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
        MAINTENANCE_OUT => {
            let b: [u8; 12] = take(cdb)?;
            let sa = u16::from(b[1] & 0x1f);
            if sa != service_action::SET_TARGET_PORT_GROUPS {
                return Err(CdbError::InvalidServiceAction {
                    opcode: op,
                    service_action: sa,
                });
            }
            reserved(b[1], 0xe0, 1)?;
            zero(&b[2..6], 2)?;
            reserved(b[10], 0xff, 10)?;
            Command::SetTargetPortGroups {
                param_len: be32([b[6], b[7], b[8], b[9]]),
                control: control(b[11], 11)?,
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
        Command::LogSense {
            pc,
            page_code,
            subpage,
            param_pointer,
            alloc_len,
            control,
        } => {
            b[0] = LOG_SENSE;
            b[2] = (pc << 6) | (page_code & 0x3f);
            b[3] = subpage;
            b[5..7].copy_from_slice(&param_pointer.to_be_bytes());
            b[7..9].copy_from_slice(&alloc_len.to_be_bytes());
            b[9] = control;
            10
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
        Command::SetTargetPortGroups { param_len, control } => {
            b[0] = MAINTENANCE_OUT;
            b[1] = service_action::SET_TARGET_PORT_GROUPS as u8;
            b[6..10].copy_from_slice(&param_len.to_be_bytes());
            b[11] = control;
            12
        }
        _ => return None,
    };
    Some(len)
}
