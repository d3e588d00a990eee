//! Third-party copy (SPC-4 §6.4, §6.19): EXTENDED COPY (LID1) and RECEIVE
//! COPY RESULTS.

use super::field::*;
use super::*;

/// Decodes `cdb` if its operation code `op` is one of this set's;
/// `Ok(None)` if it is not.
#[inline]
pub(super) fn parse(op: u8, cdb: &[u8]) -> Result<Option<Command>, CdbError> {
    use opcode::*;
    let cmd = match op {
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
        _ => return None,
    };
    Some(len)
}
