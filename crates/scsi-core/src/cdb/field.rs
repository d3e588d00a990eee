//! Field helpers shared by the command sets: strict decoding (every
//! reserved or unimplemented bit refused with a field pointer) and the
//! block I/O layouts common to several commands.

use super::*;

/// Copies the first `N` bytes of `cdb`, or says it is too short.
#[inline]
pub(super) fn take<const N: usize>(cdb: &[u8]) -> Result<[u8; N], CdbError> {
    cdb.get(..N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(CdbError::Truncated {
            needed: N,
            got: cdb.len(),
        })
}

/// Refuses any bit of `mask` set in `value` (byte `byte` of the CDB).
#[inline]
pub(super) fn reserved(value: u8, mask: u8, byte: usize) -> Result<(), CdbError> {
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
#[inline]
pub(super) fn zero(bytes: &[u8], first: usize) -> Result<(), CdbError> {
    for (i, b) in bytes.iter().enumerate() {
        reserved(*b, 0xff, first + i)?;
    }
    Ok(())
}

/// The control byte: vendor bits kept, NACA/LINK/reserved refused.
#[inline]
pub(super) fn control(value: u8, byte: usize) -> Result<u8, CdbError> {
    reserved(value, 0x3f, byte)?;
    Ok(value)
}

#[inline]
pub(super) fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}
#[inline]
pub(super) fn be32(b: [u8; 4]) -> u32 {
    u32::from_be_bytes(b)
}
#[inline]
pub(super) fn be64(b: [u8; 8]) -> u64 {
    u64::from_be_bytes(b)
}

#[inline]
pub(super) fn parse_byte1(kind: IoKind, b1: u8, io: &mut BlockIo) -> Result<(), CdbError> {
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

#[inline]
pub(super) fn parse_io(kind: IoKind, size: CdbSize, cdb: &[u8]) -> Result<BlockIo, CdbError> {
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

#[inline]
pub(super) fn emit_byte1(io: &BlockIo) -> u8 {
    ((io.protect & 7) << 5)
        | flag(io.dpo, 4)
        | flag(io.fua, 3)
        | flag(io.rarc, 2)
        | flag(io.fua_nv, 1)
        | ((io.bytchk & 3) << 1)
}

#[inline]
pub(super) fn emit_io(op: u8, cas: bool, io: &BlockIo, b: &mut [u8; 16]) -> usize {
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

#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn emit_cache(
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
