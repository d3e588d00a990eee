//! The read-only view of a remote LU ([`RemoteLuConfig::read_only`]).
//!
//! The gateway cannot know what an unknown command does at the remote, so
//! protection is an allow-list: a command goes out only if SPC-4 or SBC-3
//! defines it as one that reads or reports and changes no state another
//! host of the remote could see. Everything else ends at the gateway with
//! CHECK CONDITION, DATA PROTECT, WRITE PROTECTED (27h/00h), the answer of a
//! write-protected disk, and never reaches the remote. That covers every
//! write, WRITE SAME, UNMAP, COMPARE AND WRITE, ORWRITE, FORMAT UNIT,
//! SANITIZE, the copy commands that write, and also:
//!
//! - MODE SELECT and LOG SELECT: they change pages every host of the
//!   remote shares (a host could set SWP in the Control page and write
//!   protect the remote for its owner);
//! - PERSISTENT RESERVE OUT, RESERVE and RELEASE: a reservation, or a
//!   preemption, taken through a read-only view would fence the remote's
//!   writers;
//! - START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL: they change the
//!   power condition and the medium for every host;
//! - WRITE BUFFER, SEND DIAGNOSTIC, SECURITY PROTOCOL OUT, MAINTENANCE OUT
//!   (SET TARGET PORT GROUPS and the like) and every vendor-specific
//!   opcode;
//! - LOG SENSE with SP set (it saves the log parameters).
//!
//! MODE SENSE answers have the WP bit (bit 7 of the device-specific
//! parameter) set, so a host sees the LU as write-protected (SBC-3
//! §6.5.1) before it tries to write.
//!
//! [`RemoteLuConfig::read_only`]: super::RemoteLuConfig::read_only

use bytes::{Bytes, BytesMut};

use crate::task::{Status, TaskResult};

/// Whether a write-protected remote LU may send `cdb` to the remote.
pub(super) fn allowed(cdb: &[u8]) -> bool {
    let Some(&opcode) = cdb.first() else {
        return false;
    };
    match opcode {
        // TEST UNIT READY, REQUEST SENSE, READ(6), INQUIRY.
        0x00 | 0x03 | 0x08 | 0x12 => true,
        // MODE SENSE(6), RECEIVE DIAGNOSTIC RESULTS.
        0x1a | 0x1c => true,
        // READ CAPACITY(10), READ(10), VERIFY(10), PRE-FETCH(10),
        // SYNCHRONIZE CACHE(10), READ DEFECT DATA(10), READ BUFFER(10),
        // READ LONG(10).
        0x25 | 0x28 | 0x2f | 0x34 | 0x35 | 0x37 | 0x3c | 0x3e => true,
        // LOG SENSE, unless SP (save parameters) is set.
        0x4d => cdb.get(1).is_some_and(|b| b & 0x01 == 0),
        // MODE SENSE(10), PERSISTENT RESERVE IN.
        0x5a | 0x5e => true,
        // Variable length: READ(32) and VERIFY(32) only.
        0x7f => matches!(
            cdb.get(8..10).map(|s| u16::from_be_bytes([s[0], s[1]])),
            Some(0x0009 | 0x000a)
        ),
        // Third-party copy OUT: POPULATE TOKEN (it reads this LU) and COPY
        // OPERATION ABORT; not EXTENDED COPY or WRITE USING TOKEN.
        0x83 => matches!(cdb.get(1).map(|b| b & 0x1f), Some(0x10 | 0x1c)),
        // RECEIVE COPY RESULTS / third-party copy IN (all report).
        0x84 => true,
        // READ(16), VERIFY(16), PRE-FETCH(16), SYNCHRONIZE CACHE(16),
        // READ BUFFER(16), SERVICE ACTION IN(16) (READ CAPACITY(16), GET
        // LBA STATUS, REPORT REFERRALS, READ LONG(16), …).
        0x88 | 0x8f | 0x90 | 0x91 | 0x9b | 0x9e => true,
        // REPORT LUNS, SECURITY PROTOCOL IN, MAINTENANCE IN (REPORT TARGET
        // PORT GROUPS, REPORT SUPPORTED OPERATION CODES, …).
        0xa0 | 0xa2 | 0xa3 => true,
        // READ(12), SERVICE ACTION IN(12), VERIFY(12), READ DEFECT DATA(12).
        0xa8 | 0xab | 0xaf | 0xb7 => true,
        _ => false,
    }
}

/// The answer to a command [`allowed`] refuses: a write-protected
/// emulated LU's.
pub(super) use crate::emulated::write_protected as refused;

/// Sets WP in the mode parameter header of a GOOD MODE SENSE answer
/// (`opcode` 0x1a or 0x5a). An answer too short to hold the header (an
/// allocation length below 3 or 4) is left as it is.
pub(super) fn mark_write_protected(opcode: u8, mut res: TaskResult) -> TaskResult {
    if res.status != Status::GOOD {
        return res;
    }
    // Device-specific parameter: byte 2 of the 6-byte header, byte 3 of the
    // 8-byte one.
    let at = if opcode == 0x1a { 2 } else { 3 };
    let mut skip = at;
    for chunk in res.data_in.iter_mut() {
        if skip < chunk.len() {
            let mut b = BytesMut::from(&chunk[..]);
            b[skip] |= 0x80;
            *chunk = Bytes::from(b);
            break;
        }
        skip -= chunk.len();
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_reports_pass_and_everything_else_is_refused() {
        let pass: &[&[u8]] = &[
            &[0x00],
            &[0x12, 0x01, 0x83],
            &[0x28],
            &[0x88],
            &[0x2f],
            &[0x1a],
            &[0x5a],
            &[0x4d, 0x00],
            &[0x9e, 0x10],
            &[0xa3, 0x0c],
            &[0x5e],
            &[0x83, 0x10],
            &[0x7f, 0, 0, 0, 0, 0, 0, 0x18, 0x00, 0x09],
            &[0x7f, 0, 0, 0, 0, 0, 0, 0x18, 0x00, 0x0a],
        ];
        for cdb in pass {
            assert!(allowed(cdb), "{cdb:02x?} should pass");
        }
        let refuse: &[&[u8]] = &[
            &[],
            &[0x0a],
            &[0x2a],
            &[0x8a],
            &[0xaa],
            &[0x2e],
            &[0x41],
            &[0x93],
            &[0x42],
            &[0x89],
            &[0x8b],
            &[0x04],
            &[0x48],
            &[0x15],
            &[0x55],
            &[0x4c],
            &[0x5f],
            &[0x16],
            &[0x56],
            &[0x1b],
            &[0x1e],
            &[0x3b],
            &[0x1d],
            &[0xb5],
            &[0xa4],
            &[0x3f],
            &[0x07],
            &[0x83, 0x00],
            &[0x83, 0x11],
            &[0x4d, 0x01],
            &[0x4d],
            &[0x7f, 0, 0, 0, 0, 0, 0, 0x18, 0x00, 0x0b],
            &[0x7f, 0, 0, 0, 0, 0, 0, 0x18, 0x00, 0x0d],
            &[0x7f],
            &[0xc0],
            &[0xff],
        ];
        for cdb in refuse {
            assert!(!allowed(cdb), "{cdb:02x?} should be refused");
        }
    }

    #[test]
    fn mode_sense_answers_carry_wp() {
        let six = TaskResult::with_data(Bytes::from_static(&[3, 0, 0x10, 0]));
        let r = mark_write_protected(0x1a, six);
        assert_eq!(&r.data_in[0][..], &[3, 0, 0x90, 0]);

        // Split over chunks: the header's byte 3 is in the second.
        let mut ten = TaskResult::good();
        ten.data_in = vec![
            Bytes::from_static(&[0, 6]),
            Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
        ];
        let r = mark_write_protected(0x5a, ten);
        assert_eq!(&r.data_in[0][..], &[0, 6]);
        assert_eq!(&r.data_in[1][..], &[0, 0x80, 0, 0, 0, 0]);

        // Too short, or not GOOD: unchanged.
        let short = mark_write_protected(0x1a, TaskResult::with_data(Bytes::from_static(&[3, 0])));
        assert_eq!(&short.data_in[0][..], &[3, 0]);
        let check = mark_write_protected(0x1a, refused());
        assert!(check.data_in.is_empty());
        assert_eq!(check.status, Status::CHECK_CONDITION);
    }
}
