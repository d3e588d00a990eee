//! The FC frame encapsulation header (RFC 3643 §3.1, with the FCIP values
//! of RFC 3821 §5.6.1): 28 bytes in front of every encapsulated frame.
//!
//! | offset | field |
//! |---|---|
//! | 0–3 | Protocol#, Version, ~Protocol#, ~Version |
//! | 4–7 | the same four bytes again |
//! | 8–11 | pFlags, reserved, ~pFlags, ~reserved |
//! | 12–13 | Flags (6 bits) and Frame Length (10 bits, in words) |
//! | 14–15 | ones' complement of 12–13 |
//! | 16–23 | timestamp, seconds and fraction (SNTP format) |
//! | 24–27 | header CRC (valid when the CRCV flag is set) |
//!
//! The header CRC is the FC CRC-32 (same polynomial and bit order as the
//! frame CRC) over bytes 0–23, sent most significant byte first like every
//! other header field.

use super::{WireError, be};

/// Length of the encapsulation header.
pub const ENCAP_LEN: usize = 28;
/// Smallest valid Frame Length in words (RFC 3821 §5.6.2.2: more than 15).
pub const MIN_FRAME_WORDS: u16 = 16;
/// Largest valid Frame Length in words (less than 545).
pub const MAX_FRAME_WORDS: u16 = 544;

mod field {
    pub const PROTOCOL: usize = 0;
    pub const VERSION: usize = 1;
    pub const NPROTOCOL: usize = 2;
    pub const NVERSION: usize = 3;
    pub const WORD1: core::ops::Range<usize> = 4..8;
    pub const PFLAGS: usize = 8;
    pub const RESERVED: usize = 9;
    pub const NPFLAGS: usize = 10;
    pub const NRESERVED: usize = 11;
    pub const FLAGS_LEN: usize = 12;
    pub const NFLAGS_LEN: usize = 14;
    pub const TS_SEC: usize = 16;
    pub const TS_FRAC: usize = 20;
    pub const CRC: usize = 24;
}

/// Protocol# of the encapsulation (RFC 3643 §3.1). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Protocol(pub u8);

impl Protocol {
    /// FCIP.
    pub const FCIP: Protocol = Protocol(1);
    /// iFCP.
    pub const IFCP: Protocol = Protocol(2);
}

/// The encapsulation version FCIP uses.
pub const VERSION: u8 = 1;

/// pFlags (RFC 3821 §5.6.1). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PFlags(pub u8);

impl PFlags {
    /// Ch: the special frame was changed by the acceptor.
    pub const CH: u8 = 0x80;
    /// SF: this is an FCIP Special Frame.
    pub const SF: u8 = 0x01;

    /// Ch set.
    pub fn changed(self) -> bool {
        self.0 & Self::CH != 0
    }

    /// SF set.
    pub fn special(self) -> bool {
        self.0 & Self::SF != 0
    }
}

/// The 6-bit Flags field. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EncapFlags(pub u8);

impl EncapFlags {
    /// CRCV: the header CRC field is valid.
    pub const CRCV: u8 = 0x01;

    /// CRCV set.
    pub fn crc_valid(self) -> bool {
        self.0 & Self::CRCV != 0
    }
}

/// A zero-copy view of an encapsulation header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncapHeader<T: AsRef<[u8]>> {
    buffer: T,
}

/// The header CRC over bytes 0–23 of a header.
pub fn header_crc(bytes: &[u8; 24]) -> u32 {
    crc32fast::hash(bytes)
}

impl<T: AsRef<[u8]>> EncapHeader<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> EncapHeader<T> {
        EncapHeader { buffer }
    }

    /// Wraps a buffer of at least 28 bytes. Only the length is checked:
    /// [`EncapHeader::check`] applies RFC 3821's receive checks.
    pub fn new_checked(buffer: T) -> Result<EncapHeader<T>, WireError> {
        super::check_len(buffer.as_ref(), ENCAP_LEN)?;
        Ok(EncapHeader { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Protocol#.
    pub fn protocol(&self) -> Protocol {
        Protocol(self.b()[field::PROTOCOL])
    }
    /// Version.
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }
    /// The complement of Protocol# as received.
    pub fn protocol_complement(&self) -> u8 {
        self.b()[field::NPROTOCOL]
    }
    /// The complement of Version as received.
    pub fn version_complement(&self) -> u8 {
        self.b()[field::NVERSION]
    }
    /// Word 1 (the repeat of word 0).
    pub fn word1(&self) -> u32 {
        be::u32_at(self.b(), field::WORD1.start)
    }
    /// Word 0.
    pub fn word0(&self) -> u32 {
        be::u32_at(self.b(), 0)
    }
    /// pFlags.
    pub fn pflags(&self) -> PFlags {
        PFlags(self.b()[field::PFLAGS])
    }
    /// The reserved byte after pFlags.
    pub fn reserved(&self) -> u8 {
        self.b()[field::RESERVED]
    }
    /// ~pFlags as received.
    pub fn pflags_complement(&self) -> u8 {
        self.b()[field::NPFLAGS]
    }
    /// ~reserved as received.
    pub fn reserved_complement(&self) -> u8 {
        self.b()[field::NRESERVED]
    }
    /// Flags (6 bits).
    pub fn flags(&self) -> EncapFlags {
        EncapFlags(self.b()[field::FLAGS_LEN] >> 2)
    }
    /// Frame Length in 32-bit words (10 bits).
    pub fn frame_len(&self) -> u16 {
        be::u16_at(self.b(), field::FLAGS_LEN) & 0x3ff
    }
    /// Bytes 12–13 as one word.
    pub fn flags_len_word(&self) -> u16 {
        be::u16_at(self.b(), field::FLAGS_LEN)
    }
    /// Bytes 14–15 (the complement of 12–13) as received.
    pub fn flags_len_complement(&self) -> u16 {
        be::u16_at(self.b(), field::NFLAGS_LEN)
    }
    /// Timestamp, integer seconds since 1900.
    pub fn timestamp_seconds(&self) -> u32 {
        be::u32_at(self.b(), field::TS_SEC)
    }
    /// Timestamp fraction.
    pub fn timestamp_fraction(&self) -> u32 {
        be::u32_at(self.b(), field::TS_FRAC)
    }
    /// Header CRC field.
    pub fn crc(&self) -> u32 {
        be::u32_at(self.b(), field::CRC)
    }

    /// The CRC the header should carry.
    pub fn computed_crc(&self) -> u32 {
        let mut w = [0u8; 24];
        w.copy_from_slice(&self.b()[..24]);
        header_crc(&w)
    }

    /// RFC 3821 §5.6.2.2 receive checks on the header alone: Protocol#
    /// and Version with their complements, the repeated word, pFlags and
    /// reserved with their complements, the Flags/Frame Length
    /// complement, the length range (16–544 words), and the header CRC
    /// when CRCV is set.
    pub fn check(&self) -> Result<(), WireError> {
        let b = self.b();
        if self.protocol() != Protocol::FCIP || self.version() != VERSION {
            return Err(WireError::BadProtocol {
                protocol: self.protocol().0,
                version: self.version(),
            });
        }
        if b[field::NPROTOCOL] != !b[field::PROTOCOL] || b[field::NVERSION] != !b[field::VERSION] {
            return Err(WireError::Complement("Protocol#/Version"));
        }
        if self.word1() != self.word0() {
            return Err(WireError::Complement("repeated word 0"));
        }
        if b[field::NPFLAGS] != !b[field::PFLAGS] || b[field::NRESERVED] != !b[field::RESERVED] {
            return Err(WireError::Complement("pFlags/reserved"));
        }
        if b[field::RESERVED] != 0 {
            return Err(WireError::InvalidField("reserved byte 9 is not zero"));
        }
        if self.flags_len_complement() != !self.flags_len_word() {
            return Err(WireError::Complement("Flags/Frame Length"));
        }
        let n = self.frame_len();
        if !(MIN_FRAME_WORDS..=MAX_FRAME_WORDS).contains(&n) {
            return Err(WireError::FrameLength(n));
        }
        if self.flags().crc_valid() && self.crc() != self.computed_crc() {
            return Err(WireError::HeaderCrc {
                computed: self.computed_crc(),
                received: self.crc(),
            });
        }
        if !self.flags().crc_valid() && self.crc() != 0 {
            return Err(WireError::InvalidField("header CRC set without CRCV"));
        }
        Ok(())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EncapHeader<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets Protocol# and Version, their complements and the repeat.
    pub fn set_protocol(&mut self, p: Protocol, version: u8) {
        let w = [p.0, version, !p.0, !version];
        self.m()[0..4].copy_from_slice(&w);
        self.m()[4..8].copy_from_slice(&w);
    }

    /// Sets pFlags, the reserved byte (0) and their complements.
    pub fn set_pflags(&mut self, f: PFlags) {
        let m = self.m();
        m[field::PFLAGS] = f.0;
        m[field::RESERVED] = 0;
        m[field::NPFLAGS] = !f.0;
        m[field::NRESERVED] = 0xff;
    }

    /// Sets Flags and Frame Length with their complement.
    pub fn set_flags_len(&mut self, flags: EncapFlags, words: u16) {
        let w = (u16::from(flags.0 & 0x3f) << 10) | (words & 0x3ff);
        be::put_u16(self.m(), field::FLAGS_LEN, w);
        be::put_u16(self.m(), field::NFLAGS_LEN, !w);
    }

    /// Sets the timestamp.
    pub fn set_timestamp(&mut self, seconds: u32, fraction: u32) {
        be::put_u32(self.m(), field::TS_SEC, seconds);
        be::put_u32(self.m(), field::TS_FRAC, fraction);
    }

    /// Sets the CRC field: the computed CRC with CRCV, else 0.
    pub fn fill_crc(&mut self) {
        let v = if self.flags().crc_valid() {
            self.computed_crc()
        } else {
            0
        };
        be::put_u32(self.m(), field::CRC, v);
    }
}

/// The meaning of an encapsulation header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncapRepr {
    /// pFlags (Ch, SF).
    pub pflags: PFlags,
    /// Flags (CRCV).
    pub flags: EncapFlags,
    /// Frame Length in words.
    pub frame_len: u16,
    /// Timestamp seconds (0 when not synchronised).
    pub timestamp_seconds: u32,
    /// Timestamp fraction.
    pub timestamp_fraction: u32,
}

impl EncapRepr {
    /// A header for a frame of `bytes` bytes (a multiple of 4).
    pub fn for_len(bytes: usize) -> EncapRepr {
        EncapRepr {
            frame_len: u16::try_from(bytes / 4).unwrap_or(u16::MAX),
            ..EncapRepr::default()
        }
    }

    /// Parses a header after [`EncapHeader::check`].
    pub fn parse<T: AsRef<[u8]>>(h: &EncapHeader<T>) -> Result<EncapRepr, WireError> {
        h.check()?;
        Ok(EncapRepr {
            pflags: h.pflags(),
            flags: h.flags(),
            frame_len: h.frame_len(),
            timestamp_seconds: h.timestamp_seconds(),
            timestamp_fraction: h.timestamp_fraction(),
        })
    }

    /// Always [`ENCAP_LEN`].
    pub const fn buffer_len(&self) -> usize {
        ENCAP_LEN
    }

    /// Writes the header (complements and CRC included).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut EncapHeader<T>) {
        h.set_protocol(Protocol::FCIP, VERSION);
        h.set_pflags(self.pflags);
        h.set_flags_len(self.flags, self.frame_len);
        h.set_timestamp(self.timestamp_seconds, self.timestamp_fraction);
        h.fill_crc();
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; ENCAP_LEN] {
        let mut b = [0u8; ENCAP_LEN];
        self.emit(&mut EncapHeader::new_unchecked(&mut b[..]));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of frame 26 of fcip_trace.cap (an ELP, 42 words).
    const ELP_HDR: [u8; 28] = [
        0x01, 0x01, 0xfe, 0xfe, 0x01, 0x01, 0xfe, 0xfe, 0x00, 0x00, 0xff, 0xff, 0x00, 0x2a, 0xff,
        0xd5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn deconstruct_and_construct() {
        let h = EncapHeader::new_checked(&ELP_HDR[..]).unwrap();
        assert_eq!(h.protocol(), Protocol::FCIP);
        assert_eq!(h.frame_len(), 42);
        assert!(!h.flags().crc_valid());
        h.check().unwrap();
        let r = EncapRepr::parse(&h).unwrap();
        assert_eq!(r.to_bytes(), ELP_HDR);
    }

    #[test]
    fn crc_is_checked_when_valid() {
        let r = EncapRepr {
            flags: EncapFlags(EncapFlags::CRCV),
            ..EncapRepr::for_len(80)
        };
        let mut b = r.to_bytes();
        let h = EncapHeader::new_checked(&b[..]).unwrap();
        h.check().unwrap();
        assert_ne!(h.crc(), 0);
        b[18] ^= 1; // timestamp bit
        let e = EncapHeader::new_checked(&b[..])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(matches!(e, WireError::HeaderCrc { .. }), "{e}");
    }

    #[test]
    fn every_check_fires() {
        let cases: &[(usize, u8)] = &[(0, 2), (2, 0), (5, 2), (10, 0), (11, 0), (14, 0), (9, 1)];
        for &(at, v) in cases {
            let mut b = ELP_HDR;
            b[at] = v;
            let r = EncapHeader::new_checked(&b[..]).unwrap().check();
            assert!(r.is_err(), "byte {at} = {v:#x} passed");
        }
        // Lengths out of range (with a matching complement).
        for words in [15u16, 545, 0] {
            let mut b = ELP_HDR;
            EncapHeader::new_unchecked(&mut b[..]).set_flags_len(EncapFlags(0), words);
            let e = EncapHeader::new_checked(&b[..])
                .unwrap()
                .check()
                .unwrap_err();
            assert_eq!(e, WireError::FrameLength(words));
        }
    }

    #[test]
    fn truncated() {
        for n in 0..ENCAP_LEN {
            assert!(EncapHeader::new_checked(&ELP_HDR[..n]).is_err());
        }
    }
}
