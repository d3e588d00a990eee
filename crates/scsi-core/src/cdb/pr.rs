//! Reservations: RESERVE and RELEASE (6 and 10, SPC-2), PERSISTENT
//! RESERVE IN and OUT (SPC-4 §6.15, §6.16).

use super::field::*;
use super::*;

/// Decodes `cdb` if its operation code `op` is one of this set's;
/// `Ok(None)` if it is not.
#[inline]
pub(super) fn parse(op: u8, cdb: &[u8]) -> Result<Option<Command>, CdbError> {
    use opcode::*;
    let cmd = match op {
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
        Command::Reserve { ten, control } | Command::Release { ten, control } => {
            let reserve = matches!(cmd, Command::Reserve { .. });
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
        _ => return None,
    };
    Some(len)
}
