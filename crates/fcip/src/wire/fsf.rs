//! The FCIP Special Frame (RFC 3821 §7.1): the first 76 bytes each side
//! of a new TCP connection sends, naming the link endpoints and what the
//! connection will carry.
//!
//! | offset | field |
//! |---|---|
//! | 0–27 | encapsulation header, SF = 1, Frame Length 19 |
//! | 28–31 | `00 00 FF FF` |
//! | 32–39 | Source FC Fabric Entity WWN |
//! | 40–47 | Source FC/FCIP Entity Identifier |
//! | 48–55 | Connection Nonce |
//! | 56 | Connection Usage Flags |
//! | 57 | reserved |
//! | 58–59 | Connection Usage Code |
//! | 60–67 | Destination FC Fabric Entity WWN |
//! | 68–71 | K_A_TOV (ms) |
//! | 72–75 | `00 00 FF FF` |
//!
//! unifab's extension: an Entity Identifier whose first two bytes are
//! `75 66` ("uf") is a unifab entity and carries its capabilities in
//! byte 3 ([`Capabilities`]); a plain RFC entity puts anything there and
//! is treated as plain RFC 3821.

use unifab_fc::wire::Wwn;

use super::encap::{ENCAP_LEN, EncapFlags, EncapHeader, EncapRepr, PFlags};
use super::{WireError, be};

/// Length of the special frame.
pub const SPECIAL_FRAME_LEN: usize = 76;
/// Its Frame Length in words.
pub const SPECIAL_FRAME_WORDS: u16 = 19;
const MARKER: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

mod field {
    pub const MARK1: usize = 28;
    pub const SRC_WWN: usize = 32;
    pub const ENTITY: usize = 40;
    pub const NONCE: usize = 48;
    pub const USAGE_FLAGS: usize = 56;
    pub const RESERVED: usize = 57;
    pub const USAGE_CODE: usize = 58;
    pub const DST_WWN: usize = 60;
    pub const KA_TOV: usize = 68;
    pub const MARK2: usize = 72;
}

/// Connection Usage Flags: which SOF classes the connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UsageFlags(pub u8);

impl UsageFlags {
    /// SOFf (class F).
    pub const CLASS_F: u8 = 0x80;
    /// SOFi2/SOFn2.
    pub const CLASS_2: u8 = 0x40;
    /// SOFi3/SOFn3.
    pub const CLASS_3: u8 = 0x20;
    /// SOFi4/SOFn4/SOFc4.
    pub const CLASS_4: u8 = 0x10;

    /// Class F only.
    pub const fn class_f() -> UsageFlags {
        UsageFlags(Self::CLASS_F)
    }
    /// Class 3 only.
    pub const fn class_3() -> UsageFlags {
        UsageFlags(Self::CLASS_3)
    }
}

/// An FC/FCIP Entity Identifier (8 bytes, meaning chosen by the entity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EntityId(pub u64);

/// Capabilities a unifab entity announces in its Entity Identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(pub u8);

impl Capabilities {
    /// unifab enhanced mode (batches, acks, lossless failover).
    pub const ENHANCED: u8 = 0x01;
    /// FastWrite.
    pub const FASTWRITE: u8 = 0x02;
    /// LZ4 batches.
    pub const LZ4: u8 = 0x04;
    /// Zstandard batches.
    pub const ZSTD: u8 = 0x08;
    /// Tape pipelining (with FastWrite).
    pub const TAPE: u8 = 0x10;
    /// Tape read-ahead (with tape pipelining).
    pub const READ_AHEAD: u8 = 0x20;

    /// Whether every bit of `bits` is set.
    pub fn has(self, bits: u8) -> bool {
        self.0 & bits == bits
    }
}

const UNIFAB_MAGIC: u16 = 0x7566;

impl EntityId {
    /// A unifab entity: magic, version 1, capabilities, tunnel number.
    pub fn unifab(caps: Capabilities, tunnel: u32) -> EntityId {
        EntityId(
            (u64::from(UNIFAB_MAGIC) << 48)
                | (1u64 << 40)
                | (u64::from(caps.0) << 32)
                | u64::from(tunnel),
        )
    }

    /// The capabilities, if this is a unifab entity.
    pub fn unifab_capabilities(self) -> Option<Capabilities> {
        ((self.0 >> 48) as u16 == UNIFAB_MAGIC && (self.0 >> 40) as u8 == 1)
            .then_some(Capabilities((self.0 >> 32) as u8))
    }

    /// The tunnel number of a unifab entity (the low four bytes).
    pub fn tunnel(self) -> u32 {
        self.0 as u32
    }
}

/// A zero-copy view of a special frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SpecialFrame<T> {
    /// Wraps exactly 76 bytes whose header passes its checks, has SF set
    /// and Frame Length 19, and whose two marker words are `00 00 FF FF`.
    pub fn new_checked(buffer: T) -> Result<SpecialFrame<T>, WireError> {
        let b = buffer.as_ref();
        super::check_len(b, SPECIAL_FRAME_LEN)?;
        if b.len() != SPECIAL_FRAME_LEN {
            return Err(WireError::FrameLength(
                u16::try_from(b.len() / 4).unwrap_or(0),
            ));
        }
        let h = EncapHeader::new_unchecked(&b[..ENCAP_LEN]);
        h.check()?;
        if !h.pflags().special() {
            return Err(WireError::InvalidField("SF flag not set"));
        }
        if h.frame_len() != SPECIAL_FRAME_WORDS {
            return Err(WireError::FrameLength(h.frame_len()));
        }
        if b[field::MARK1..field::MARK1 + 4] != MARKER || b[field::MARK2..] != MARKER {
            return Err(WireError::InvalidField("special frame marker words"));
        }
        Ok(SpecialFrame { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The encapsulation header.
    pub fn encap(&self) -> EncapHeader<&[u8]> {
        EncapHeader::new_unchecked(&self.b()[..ENCAP_LEN])
    }
    /// Source FC Fabric Entity WWN.
    pub fn source_wwn(&self) -> Wwn {
        Wwn(be::u64_at(self.b(), field::SRC_WWN))
    }
    /// Source FC/FCIP Entity Identifier.
    pub fn entity_id(&self) -> EntityId {
        EntityId(be::u64_at(self.b(), field::ENTITY))
    }
    /// Connection Nonce.
    pub fn nonce(&self) -> u64 {
        be::u64_at(self.b(), field::NONCE)
    }
    /// Connection Usage Flags.
    pub fn usage_flags(&self) -> UsageFlags {
        UsageFlags(self.b()[field::USAGE_FLAGS])
    }
    /// The reserved byte 57.
    pub fn reserved(&self) -> u8 {
        self.b()[field::RESERVED]
    }
    /// Connection Usage Code.
    pub fn usage_code(&self) -> u16 {
        be::u16_at(self.b(), field::USAGE_CODE)
    }
    /// Destination FC Fabric Entity WWN.
    pub fn destination_wwn(&self) -> Wwn {
        Wwn(be::u64_at(self.b(), field::DST_WWN))
    }
    /// K_A_TOV in milliseconds.
    pub fn k_a_tov(&self) -> u32 {
        be::u32_at(self.b(), field::KA_TOV)
    }
    /// Bytes 28–71, which an echo must return unchanged.
    pub fn echoed_part(&self) -> &[u8] {
        &self.b()[field::MARK1..field::MARK2]
    }
}

/// The meaning of a special frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecialFrameRepr {
    /// Ch: the acceptor changed the frame.
    pub changed: bool,
    /// Source fabric entity (switch) name.
    pub source_wwn: Wwn,
    /// Source entity identifier.
    pub entity_id: EntityId,
    /// Connection nonce.
    pub nonce: u64,
    /// What the connection carries.
    pub usage_flags: UsageFlags,
    /// Connection Usage Code (meaning left to the entities).
    pub usage_code: u16,
    /// Destination fabric entity name (0: "who are you?").
    pub destination_wwn: Wwn,
    /// K_A_TOV in milliseconds.
    pub k_a_tov: u32,
    /// The encapsulation header's Flags (CRCV: its CRC is valid).
    pub flags: EncapFlags,
    /// The encapsulation header's time stamp, seconds (0: not synchronised).
    pub timestamp_seconds: u32,
    /// The encapsulation header's time stamp, fraction.
    pub timestamp_fraction: u32,
}

impl SpecialFrameRepr {
    /// Parses a checked view. A non-zero reserved byte is tolerated and
    /// not kept; emit writes 0.
    pub fn parse<T: AsRef<[u8]>>(f: &SpecialFrame<T>) -> SpecialFrameRepr {
        SpecialFrameRepr {
            changed: f.encap().pflags().changed(),
            source_wwn: f.source_wwn(),
            entity_id: f.entity_id(),
            nonce: f.nonce(),
            usage_flags: f.usage_flags(),
            usage_code: f.usage_code(),
            destination_wwn: f.destination_wwn(),
            k_a_tov: f.k_a_tov(),
            flags: f.encap().flags(),
            timestamp_seconds: f.encap().timestamp_seconds(),
            timestamp_fraction: f.encap().timestamp_fraction(),
        }
    }

    /// Always 76.
    pub const fn buffer_len(&self) -> usize {
        SPECIAL_FRAME_LEN
    }

    /// Writes the frame into 76 bytes.
    pub fn emit(&self, buf: &mut [u8; SPECIAL_FRAME_LEN]) {
        let mut pf = PFlags::SF;
        if self.changed {
            pf |= PFlags::CH;
        }
        let e = EncapRepr {
            pflags: PFlags(pf),
            flags: self.flags,
            frame_len: SPECIAL_FRAME_WORDS,
            timestamp_seconds: self.timestamp_seconds,
            timestamp_fraction: self.timestamp_fraction,
        };
        e.emit(&mut EncapHeader::new_unchecked(&mut buf[..ENCAP_LEN]));
        buf[field::MARK1..field::MARK1 + 4].copy_from_slice(&MARKER);
        be::put_u64(buf, field::SRC_WWN, self.source_wwn.0);
        be::put_u64(buf, field::ENTITY, self.entity_id.0);
        be::put_u64(buf, field::NONCE, self.nonce);
        buf[field::USAGE_FLAGS] = self.usage_flags.0;
        buf[field::RESERVED] = 0;
        be::put_u16(buf, field::USAGE_CODE, self.usage_code);
        be::put_u64(buf, field::DST_WWN, self.destination_wwn.0);
        be::put_u32(buf, field::KA_TOV, self.k_a_tov);
        buf[field::MARK2..].copy_from_slice(&MARKER);
    }

    /// The frame as bytes.
    pub fn to_bytes(&self) -> [u8; SPECIAL_FRAME_LEN] {
        let mut b = [0u8; SPECIAL_FRAME_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SpecialFrameRepr {
        SpecialFrameRepr {
            changed: false,
            source_wwn: Wwn(0x1000_0000_c900_0001),
            entity_id: EntityId::unifab(Capabilities(Capabilities::ENHANCED), 7),
            nonce: 0x0123_4567_89ab_cdef,
            usage_flags: UsageFlags::class_f(),
            usage_code: 0,
            destination_wwn: Wwn(0x1000_0000_c900_0002),
            k_a_tov: 10_000,
            ..SpecialFrameRepr::default()
        }
    }

    /// Found by the fcip_fsf fuzz target: a special frame with a time
    /// stamp (and one with a valid header CRC) re-emits byte for byte.
    #[test]
    fn time_stamp_and_header_crc_are_kept() {
        let mut r = sample();
        r.timestamp_seconds = 0x2800_0000;
        r.timestamp_fraction = 0x8000_0001;
        let b = r.to_bytes();
        assert_eq!(&b[16..24], &[0x28, 0, 0, 0, 0x80, 0, 0, 1]);
        let back = SpecialFrameRepr::parse(&SpecialFrame::new_checked(&b[..]).unwrap());
        assert_eq!(back, r);
        assert_eq!(back.to_bytes(), b);
        r.flags = EncapFlags(EncapFlags::CRCV);
        let b = r.to_bytes();
        assert_eq!(b[12] & 0xfc, 4, "CRCV set in the flags");
        let v = SpecialFrame::new_checked(&b[..]).unwrap();
        assert!(v.encap().flags().crc_valid());
        let back = SpecialFrameRepr::parse(&v);
        assert_eq!(back, r);
        assert_eq!(back.to_bytes(), b);
    }

    #[test]
    fn round_trip_and_fields() {
        let r = sample();
        let b = r.to_bytes();
        assert_eq!(
            &b[0..12],
            &[1, 1, 0xfe, 0xfe, 1, 1, 0xfe, 0xfe, 1, 0, 0xfe, 0xff]
        );
        assert_eq!(&b[12..16], &[0x00, 19, 0xff, !19]);
        let v = SpecialFrame::new_checked(&b[..]).unwrap();
        assert_eq!(v.nonce(), r.nonce);
        assert_eq!(v.k_a_tov(), 10_000);
        assert_eq!(SpecialFrameRepr::parse(&v), r);
        assert_eq!(
            r.entity_id.unifab_capabilities(),
            Some(Capabilities(Capabilities::ENHANCED))
        );
        assert_eq!(r.entity_id.tunnel(), 7);
        assert_eq!(EntityId(42).unifab_capabilities(), None);
        let mut ch = r;
        ch.changed = true;
        let cb = ch.to_bytes();
        assert_eq!(cb[8], 0x81);
        assert_eq!(
            SpecialFrameRepr::parse(&SpecialFrame::new_checked(&cb[..]).unwrap()),
            ch
        );
    }

    #[test]
    fn refuses_what_is_not_a_special_frame() {
        let b = sample().to_bytes();
        for n in 0..SPECIAL_FRAME_LEN {
            assert!(SpecialFrame::new_checked(&b[..n]).is_err());
        }
        for at in [0usize, 8, 13, 28, 31, 72, 75] {
            let mut x = b;
            x[at] ^= 0x10;
            assert!(SpecialFrame::new_checked(&x[..]).is_err(), "byte {at}");
        }
    }
}
