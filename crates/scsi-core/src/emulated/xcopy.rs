//! EXTENDED COPY (LID1) parameter lists (SPC-4 §6.4) for the emulated LU's
//! copy manager: block-to-block segments between copy target devices that
//! are this LU, named by identification descriptor CSCDs (E4h) carrying
//! its NAA designator.
//!
//! [`CopyPlan::parse`] checks a parameter list and turns it into segments;
//! every refusal carries the sense data SPC-4 gives it.

use crate::sense::{Asc, Sense, SenseKey, asc};

/// Most CSCD descriptors in one parameter list.
pub const MAX_CSCD_DESCRIPTORS: u16 = 2;
/// Most segment descriptors in one parameter list.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 1;
/// Most bytes of CSCD and segment descriptors in one parameter list.
pub const MAX_DESCRIPTOR_LIST_LENGTH: u32 = 1024;
/// Most bytes one segment descriptor may copy.
pub const MAX_SEGMENT_LENGTH: u32 = 16 << 20;

/// Identification descriptor CSCD type code.
pub const CSCD_IDENTIFICATION: u8 = 0xe4;
/// Block device to block device segment type code.
pub const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;

/// Length of the parameter list header.
const HEADER_LEN: usize = 16;
/// Length of an E0h..E9h CSCD descriptor.
const CSCD_LEN: usize = 32;
/// Length of a block-to-block segment descriptor.
const B2B_LEN: usize = 28;

/// `TOO MANY TARGET DESCRIPTORS` (26h/06h).
const TOO_MANY_TARGET_DESCRIPTORS: Asc = Asc(0x26, 0x06);
/// `UNSUPPORTED TARGET DESCRIPTOR TYPE CODE` (26h/07h).
const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE: Asc = Asc(0x26, 0x07);
/// `TOO MANY SEGMENT DESCRIPTORS` (26h/08h).
const TOO_MANY_SEGMENT_DESCRIPTORS: Asc = Asc(0x26, 0x08);
/// `UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE` (26h/09h).
const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE: Asc = Asc(0x26, 0x09);
/// `COPY TARGET DEVICE NOT REACHABLE` (0Dh/02h).
pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Asc = Asc(0x0d, 0x02);

/// One block-to-block segment, in logical blocks of the LU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Source CSCD index.
    pub src: u16,
    /// Destination CSCD index.
    pub dst: u16,
    /// Blocks to copy.
    pub blocks: u32,
    /// First source block.
    pub src_lba: u64,
    /// First destination block.
    pub dst_lba: u64,
}

/// A checked EXTENDED COPY parameter list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyPlan {
    /// LIST IDENTIFIER.
    pub list_id: u8,
    /// LIST ID USAGE (00b: hold the results for RECEIVE COPY RESULTS).
    pub list_id_usage: u8,
    /// How many CSCD descriptors the list has (all name this LU).
    pub cscds: u16,
    /// The segments, in order.
    pub segments: Vec<Segment>,
}

fn param(asc: Asc, byte: usize) -> Sense {
    Sense::illegal_field(asc, false, u16::try_from(byte).unwrap_or(u16::MAX), None)
}

fn illegal(asc: Asc) -> Sense {
    Sense::new(SenseKey::ILLEGAL_REQUEST, asc)
}

fn be16(p: &[u8], at: usize) -> u16 {
    match p.get(at..at + 2) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => 0,
    }
}

fn be32(p: &[u8], at: usize) -> u32 {
    match p.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
        _ => 0,
    }
}

fn be64(p: &[u8], at: usize) -> u64 {
    (u64::from(be32(p, at)) << 32) | u64::from(be32(p, at + 4))
}

impl CopyPlan {
    /// Checks parameter list `p` (exactly the PARAMETER LIST LENGTH bytes
    /// the initiator sent) for a LU whose NAA designator is `naa` and whose
    /// logical block length is `block_size`.
    ///
    /// # Errors
    /// The sense data to return: PARAMETER LIST LENGTH ERROR for lists
    /// shorter than their lengths say or longer than the limits, TOO MANY
    /// TARGET/SEGMENT DESCRIPTORS, UNSUPPORTED TARGET/SEGMENT DESCRIPTOR
    /// TYPE CODE, INVALID FIELD IN PARAMETER LIST, and COPY ABORTED /
    /// COPY TARGET DEVICE NOT REACHABLE for a CSCD that is not this LU or
    /// a segment naming a CSCD the list does not have.
    pub fn parse(p: &[u8], naa: u64, block_size: u32) -> Result<CopyPlan, Sense> {
        if p.len() < HEADER_LEN {
            return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
        }
        let list_id = p[0];
        let list_id_usage = (p[1] >> 3) & 3;
        if list_id_usage == 1 {
            return Err(param(asc::INVALID_FIELD_IN_PARAMETER_LIST, 1));
        }
        let cscd_len = usize::from(be16(p, 2));
        let seg_len = be32(p, 8) as usize;
        let inline_len = be32(p, 12) as usize;
        if inline_len != 0 {
            return Err(param(asc::INVALID_FIELD_IN_PARAMETER_LIST, 12));
        }
        let total = cscd_len as u64 + seg_len as u64;
        if total > u64::from(MAX_DESCRIPTOR_LIST_LENGTH) {
            return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
        }
        let Some(cscd_bytes) = p.get(HEADER_LEN..HEADER_LEN + cscd_len) else {
            return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
        };
        let seg_start = HEADER_LEN + cscd_len;
        let Some(seg_bytes) = p.get(seg_start..seg_start + seg_len) else {
            return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
        };
        // CSCD descriptors: 32 bytes each.
        if cscd_len % CSCD_LEN != 0 {
            return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
        }
        let cscds = cscd_len / CSCD_LEN;
        if cscds > usize::from(MAX_CSCD_DESCRIPTORS) {
            return Err(illegal(TOO_MANY_TARGET_DESCRIPTORS));
        }
        for (i, d) in cscd_bytes.chunks_exact(CSCD_LEN).enumerate() {
            let at = HEADER_LEN + i * CSCD_LEN;
            if d[0] != CSCD_IDENTIFICATION {
                return Err(param(UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE, at));
            }
            // Byte 1: LU ID TYPE (ignored in SPC-4), NUL (obsolete),
            // PERIPHERAL DEVICE TYPE: a block device.
            if d[1] & 0x1f != 0 {
                return Err(param(UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE, at + 1));
            }
            // Designation descriptor at 4: binary NAA, logical unit.
            let code_set = d[4] & 0x0f;
            let assoc = (d[5] >> 4) & 3;
            let kind = d[5] & 0x0f;
            let len = usize::from(d[7]);
            let ours = code_set == 1
                && assoc == 0
                && kind == 3
                && len == 8
                && d.get(8..16) == Some(&naa.to_be_bytes()[..]);
            if !ours {
                return Err(Sense::new(
                    SenseKey::COPY_ABORTED,
                    COPY_TARGET_DEVICE_NOT_REACHABLE,
                ));
            }
            // Block device type-specific parameters: DISK BLOCK LENGTH.
            let disk_block = be32(d, 28) & 0x00ff_ffff;
            if disk_block != block_size {
                return Err(param(asc::INVALID_FIELD_IN_PARAMETER_LIST, at + 29));
            }
        }
        // Segment descriptors: variable length, a 4-byte header each.
        let mut segments = Vec::new();
        let mut at = 0usize;
        while at < seg_bytes.len() {
            let abs = seg_start + at;
            let Some(hdr) = seg_bytes.get(at..at + 4) else {
                return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
            };
            let desc_len = 4 + usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
            if segments.len() >= usize::from(MAX_SEGMENT_DESCRIPTORS) {
                return Err(illegal(TOO_MANY_SEGMENT_DESCRIPTORS));
            }
            if hdr[0] != SEGMENT_BLOCK_TO_BLOCK {
                return Err(param(UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE, abs));
            }
            if desc_len != B2B_LEN {
                return Err(param(asc::INVALID_FIELD_IN_PARAMETER_LIST, abs + 2));
            }
            let Some(d) = seg_bytes.get(at..at + B2B_LEN) else {
                return Err(illegal(asc::PARAMETER_LIST_LENGTH_ERROR));
            };
            // CAT (byte 1 bit 0) asks to keep residue: nothing to keep
            // for whole blocks; DC picks the unit of NUMBER OF BLOCKS,
            // the same here (source and destination are this LU).
            let seg = Segment {
                src: be16(d, 4),
                dst: be16(d, 6),
                blocks: u32::from(be16(d, 10)),
                src_lba: be64(d, 12),
                dst_lba: be64(d, 20),
            };
            if usize::from(seg.src) >= cscds || usize::from(seg.dst) >= cscds {
                return Err(Sense::new(
                    SenseKey::COPY_ABORTED,
                    COPY_TARGET_DEVICE_NOT_REACHABLE,
                ));
            }
            if u64::from(seg.blocks) * u64::from(block_size) > u64::from(MAX_SEGMENT_LENGTH) {
                return Err(param(asc::INVALID_FIELD_IN_PARAMETER_LIST, abs + 10));
            }
            segments.push(seg);
            at += desc_len;
        }
        Ok(CopyPlan {
            list_id,
            list_id_usage,
            cscds: cscds as u16,
            segments,
        })
    }
}

/// RECEIVE COPY RESULTS OPERATING PARAMETERS data (SPC-4 §6.18.4).
pub fn operating_parameters() -> Vec<u8> {
    let implemented = [SEGMENT_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];
    let mut v = vec![0u8; 44];
    v[4] = 0x01; // SNLID: list identifiers are supported.
    v[8..10].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    v[10..12].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    v[12..16].copy_from_slice(&MAX_DESCRIPTOR_LIST_LENGTH.to_be_bytes());
    v[16..20].copy_from_slice(&MAX_SEGMENT_LENGTH.to_be_bytes());
    // No inline data, no held data, no stream devices.
    v[34..36].copy_from_slice(&1u16.to_be_bytes()); // TOTAL CONCURRENT COPIES
    v[36] = 1; // MAXIMUM CONCURRENT COPIES
    v[37] = 9; // DATA SEGMENT GRANULARITY: 512 bytes (log2)
    v[43] = implemented.len() as u8;
    v.extend_from_slice(&implemented);
    let n = (v.len() - 4) as u32;
    v[0..4].copy_from_slice(&n.to_be_bytes());
    v
}

/// The result of a held copy, for RECEIVE COPY RESULTS COPY STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyStatus {
    /// The copy completed without error.
    pub ok: bool,
    /// Segments processed.
    pub segments: u16,
    /// Bytes copied.
    pub bytes: u64,
}

impl CopyStatus {
    /// COPY STATUS data (SPC-4 §6.18.2): 12 bytes.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = vec![0u8; 12];
        v[0..4].copy_from_slice(&8u32.to_be_bytes());
        // COPY MANAGER STATUS: 01h completed without errors, 02h with.
        v[4] = if self.ok { 0x01 } else { 0x02 };
        v[5..7].copy_from_slice(&self.segments.to_be_bytes());
        // TRANSFER COUNT UNITS 01h: kibibytes, so 32 bits reach 4 TiB.
        v[7] = 0x01;
        let kib = u32::try_from(self.bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        v[8..12].copy_from_slice(&kib.to_be_bytes());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAA: u64 = 0x3123_4567_89ab_cdef;

    fn cscd(naa: u64, kind: u8) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = kind;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = 8;
        d[8..16].copy_from_slice(&naa.to_be_bytes());
        d[29..32].copy_from_slice(&[0, 2, 0]);
        d
    }

    fn b2b(src: u16, dst: u16, n: u16, s: u64, t: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = 0x02;
        d[3] = 24;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&n.to_be_bytes());
        d[12..20].copy_from_slice(&s.to_be_bytes());
        d[20..28].copy_from_slice(&t.to_be_bytes());
        d
    }

    fn list(cscds: &[Vec<u8>], segs: &[Vec<u8>]) -> Vec<u8> {
        let c: Vec<u8> = cscds.concat();
        let s: Vec<u8> = segs.concat();
        let mut p = vec![0u8; 16];
        p[0] = 7;
        p[2..4].copy_from_slice(&(c.len() as u16).to_be_bytes());
        p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
        p.extend(c);
        p.extend(s);
        p
    }

    fn key_asc(e: &Sense) -> (SenseKey, Asc) {
        (e.key, e.asc)
    }

    #[test]
    fn a_valid_list_parses() {
        let p = list(&[cscd(NAA, 0xe4)], &[b2b(0, 0, 16, 0, 100)]);
        let plan = CopyPlan::parse(&p, NAA, 512).unwrap();
        assert_eq!(plan.list_id, 7);
        assert_eq!(plan.cscds, 1);
        assert_eq!(
            plan.segments,
            [Segment {
                src: 0,
                dst: 0,
                blocks: 16,
                src_lba: 0,
                dst_lba: 100
            }]
        );
    }

    #[test]
    fn refusals_carry_their_sense() {
        let good = list(&[cscd(NAA, 0xe4)], &[b2b(0, 0, 16, 0, 100)]);
        for cut in [0, 15, 16 + 31, good.len() - 1] {
            let e = CopyPlan::parse(&good[..cut], NAA, 512).unwrap_err();
            assert_eq!(
                key_asc(&e),
                (SenseKey::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR),
                "{cut}"
            );
        }
        let e = CopyPlan::parse(
            &list(&vec![cscd(NAA, 0xe4); 3], &[b2b(0, 0, 1, 0, 1)]),
            NAA,
            512,
        );
        assert_eq!(key_asc(&e.unwrap_err()).1, TOO_MANY_TARGET_DESCRIPTORS);
        let e = CopyPlan::parse(
            &list(&[cscd(NAA, 0xe4)], &vec![b2b(0, 0, 1, 0, 1); 2]),
            NAA,
            512,
        );
        assert_eq!(key_asc(&e.unwrap_err()).1, TOO_MANY_SEGMENT_DESCRIPTORS);
        let e = CopyPlan::parse(&list(&[cscd(NAA, 0xe0)], &[b2b(0, 0, 1, 0, 1)]), NAA, 512);
        assert_eq!(
            key_asc(&e.unwrap_err()).1,
            UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE
        );
        let mut stream = b2b(0, 0, 1, 0, 1);
        stream[0] = 0x03;
        let e = CopyPlan::parse(&list(&[cscd(NAA, 0xe4)], &[stream]), NAA, 512);
        assert_eq!(
            key_asc(&e.unwrap_err()).1,
            UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE
        );
        for p in [
            list(&[cscd(NAA + 1, 0xe4)], &[b2b(0, 0, 1, 0, 1)]),
            list(&[cscd(NAA, 0xe4)], &[b2b(0, 1, 1, 0, 1)]),
        ] {
            let e = CopyPlan::parse(&p, NAA, 512).unwrap_err();
            assert_eq!(
                key_asc(&e),
                (SenseKey::COPY_ABORTED, COPY_TARGET_DEVICE_NOT_REACHABLE)
            );
        }
        let mut long = list(&[cscd(NAA, 0xe4)], &[b2b(0, 0, 1, 0, 1)]);
        long[8..12].copy_from_slice(&2000u32.to_be_bytes());
        long.resize(16 + 32 + 2000, 0);
        let e = CopyPlan::parse(&long, NAA, 512).unwrap_err();
        assert_eq!(key_asc(&e).1, asc::PARAMETER_LIST_LENGTH_ERROR);
        let e = CopyPlan::parse(&list(&[cscd(NAA, 0xe4)], &[b2b(0, 0, 1, 0, 1)]), NAA, 4096);
        assert_eq!(
            key_asc(&e.unwrap_err()).1,
            asc::INVALID_FIELD_IN_PARAMETER_LIST
        );
    }

    #[test]
    fn operating_parameters_and_status_layout() {
        let v = operating_parameters();
        assert_eq!(be32(&v, 0) as usize, v.len() - 4);
        assert!(v.len() >= 44);
        assert_eq!(be16(&v, 8), MAX_CSCD_DESCRIPTORS);
        assert_eq!(be16(&v, 10), MAX_SEGMENT_DESCRIPTORS);
        assert_eq!(be32(&v, 12), MAX_DESCRIPTOR_LIST_LENGTH);
        assert_eq!(&v[44..], &[0x02, 0xe4]);
        let s = CopyStatus {
            ok: true,
            segments: 1,
            bytes: 2048 * 512,
        }
        .to_bytes();
        assert_eq!(be32(&s, 0), 8);
        assert_eq!((s[4], be16(&s, 5), s[7], be32(&s, 8)), (1, 1, 1, 1024));
    }
}
