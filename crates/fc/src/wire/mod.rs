//! The Fibre Channel wire format: FC-2 frame header (FC-FS-4), frame
//! delimiters and CRC, basic and extended link services (FC-LS-3), the
//! common transport and name server (FC-GS-7), and the FCP-4 information
//! units.
//!
//! Fixed layouts are zero-copy views (`FcHeader<T>`, `FcpCmnd<T>`, …) with
//! owned `…Repr` types; the variable ELS and CT payloads are parsed with
//! `nom` internally. Everything here builds without tokio
//! (`default-features = false`).

pub mod bls;
pub mod crc;
pub mod ct;
pub mod delimiter;
pub mod els;
pub mod fcp;
pub mod frame;
pub mod header;

use std::fmt;
use std::str::FromStr;

pub use bls::{BaAcc, BaRjt, BaRjtExplanation, BaRjtReason, BlsRepr};
pub use crc::{fc_crc, fc_crc_bytes};
pub use ct::{CtCommand, CtIu, CtPreamble, CtReject, GsSubtype, GsType, NsReason};
pub use delimiter::{Eof, Sof};
pub use els::{ElsCode, ElsRepr, LsRjt, LsRjtExplanation, LsRjtReason};
pub use fcp::{FcpCmnd, FcpCmndRepr, FcpRsp, FcpRspRepr, XferRdy, XferRdyRepr};
pub use frame::{FcFrame, FrameRepr, PayloadRepr, ReplyTracker};
pub use header::{FCtl, FcHeader, FcHeaderRepr, FcType, HEADER_LEN, RCtl};

/// Largest FC frame payload (data field) in bytes (FC-FS-4 §8.1).
pub const MAX_PAYLOAD: usize = 2112;

/// Errors of the FC wire layer.
///
/// What a peer gets back for each is decided in one place each:
/// `From<&WireError>` for [`LsRjt`], [`CtReject`] and [`BaRjt`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// A length field disagrees with the structure or with the bytes present.
    #[error("bad length in {what}: {len}")]
    BadLength {
        /// Which length.
        what: &'static str,
        /// The value found.
        len: usize,
    },
    /// A field holds a value the standard forbids.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// The frame CRC does not match its contents.
    #[error("CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    Crc {
        /// CRC over the header and payload.
        computed: u32,
        /// CRC carried by the frame.
        received: u32,
    },
    /// A payload larger than an FC frame can carry.
    #[error("payload of {0} bytes exceeds the FC maximum of 2112")]
    PayloadTooLong(usize),
}

/// A buffer shorter than a header or field needs. Every wire layer of the
/// FC family (this crate, `unifab-fcoe`, `unifab-fcip`) checks lengths with
/// [`check_len`] and converts this into its own error's `Truncated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// Bytes needed.
    pub needed: usize,
    /// Bytes present.
    pub got: usize,
}

impl From<Truncated> for WireError {
    fn from(t: Truncated) -> WireError {
        WireError::Truncated {
            needed: t.needed,
            got: t.got,
        }
    }
}

/// Checks that `buf` holds at least `needed` bytes.
#[inline]
pub fn check_len(buf: &[u8], needed: usize) -> Result<(), Truncated> {
    if buf.len() < needed {
        Err(Truncated {
            needed,
            got: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Big-endian field access for the FC family's wire layers, over slices
/// whose length the caller has checked ([`check_len`] or `new_checked`).
///
/// # Panics
///
/// Each function panics if the field does not lie inside the slice; a
/// view's getters call them only after its constructor checked the length.
pub mod be {
    /// The 16-bit field at `at`.
    #[inline]
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    /// The 24-bit field at `at` (FC_IDs, F_CTL).
    #[inline]
    pub fn u24_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
    }
    /// The 32-bit field at `at`.
    #[inline]
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    /// The 64-bit field at `at` (WWNs).
    #[inline]
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(a)
    }
    /// Writes a 16-bit field at `at`.
    #[inline]
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    /// Writes a 24-bit field at `at` (the low 24 bits of `v`).
    #[inline]
    pub fn put_u24(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    /// Writes a 32-bit field at `at`.
    #[inline]
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    /// Writes a 64-bit field at `at`.
    #[inline]
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}

/// A 24-bit Fibre Channel address identifier (N_Port_ID / FC_ID):
/// domain, area, port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FcId(u32);

impl FcId {
    /// 00.00.00: an N_Port before fabric login.
    pub const UNIDENTIFIED: FcId = FcId(0);
    /// FFFFFF: broadcast alias.
    pub const BROADCAST: FcId = FcId(0xff_ffff);
    /// FFFFFE: the fabric login server (F_Port controller).
    pub const LOGIN_SERVER: FcId = FcId(0xff_fffe);
    /// FFFFFD: the fabric controller (SCR, RSCN).
    pub const FABRIC_CONTROLLER: FcId = FcId(0xff_fffd);
    /// FFFFFC: the directory (name) server.
    pub const NAME_SERVER: FcId = FcId(0xff_fffc);
    /// FFFFFB: the time server.
    pub const TIME_SERVER: FcId = FcId(0xff_fffb);
    /// FFFFFA: the management server.
    pub const MANAGEMENT_SERVER: FcId = FcId(0xff_fffa);

    /// From the low 24 bits of `v` (the high byte is ignored).
    pub const fn new(v: u32) -> FcId {
        FcId(v & 0xff_ffff)
    }

    /// From domain, area and port.
    pub const fn from_parts(domain: u8, area: u8, port: u8) -> FcId {
        FcId(((domain as u32) << 16) | ((area as u32) << 8) | port as u32)
    }

    /// The 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Domain (bits 23–16).
    pub const fn domain(self) -> u8 {
        (self.0 >> 16) as u8
    }

    /// Area (bits 15–8).
    pub const fn area(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// Port (bits 7–0).
    pub const fn port(self) -> u8 {
        self.0 as u8
    }

    /// A well-known address (FFFFF0–FFFFFF).
    pub const fn is_well_known(self) -> bool {
        self.0 >= 0xff_fff0
    }

    /// The three wire bytes.
    pub fn to_bytes(self) -> [u8; 3] {
        let b = self.0.to_be_bytes();
        [b[1], b[2], b[3]]
    }
}

impl fmt::Debug for FcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FcId({:#08x})", self.0)
    }
}

impl fmt::Display for FcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A parse error for [`FcId`] and [`Wwn`] text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {text:?}")]
pub struct NameParseError {
    what: &'static str,
    text: String,
}

impl FromStr for FcId {
    type Err = NameParseError;
    /// `0x010203`, `010203` or `01.02.03`.
    fn from_str(s: &str) -> Result<FcId, NameParseError> {
        let err = || NameParseError {
            what: "FC_ID",
            text: s.to_string(),
        };
        let t = s.trim();
        let hex: String = if t.contains('.') {
            let parts: Vec<&str> = t.split('.').collect();
            if parts.len() != 3 || parts.iter().any(|p| p.len() != 2) {
                return Err(err());
            }
            parts.concat()
        } else {
            t.trim_start_matches("0x")
                .trim_start_matches("0X")
                .to_string()
        };
        if hex.is_empty() || hex.len() > 6 {
            return Err(err());
        }
        u32::from_str_radix(&hex, 16).map(FcId).map_err(|_| err())
    }
}

/// A world-wide name (port or node name, 64 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Wwn(pub u64);

impl Wwn {
    /// The NAA (network address authority) nibble.
    pub const fn naa(self) -> u8 {
        (self.0 >> 60) as u8
    }

    /// The eight wire bytes.
    pub const fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }
}

impl fmt::Debug for Wwn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Wwn({self})")
    }
}

impl fmt::Display for Wwn {
    /// `20:00:00:25:b5:00:00:01`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0.to_be_bytes();
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        )
    }
}

impl FromStr for Wwn {
    type Err = NameParseError;
    /// `20:00:00:25:b5:00:00:01`, `20000025b5000001` or `0x20000025b5000001`.
    fn from_str(s: &str) -> Result<Wwn, NameParseError> {
        let err = || NameParseError {
            what: "WWN",
            text: s.to_string(),
        };
        let t = s.trim();
        let hex: String = if t.contains(':') {
            let parts: Vec<&str> = t.split(':').collect();
            if parts.len() != 8 || parts.iter().any(|p| p.len() != 2) {
                return Err(err());
            }
            parts.concat()
        } else {
            t.trim_start_matches("0x")
                .trim_start_matches("0X")
                .to_string()
        };
        if hex.len() != 16 {
            return Err(err());
        }
        u64::from_str_radix(&hex, 16).map(Wwn).map_err(|_| err())
    }
}

/// An exchange originator's identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct OxId(pub u16);

/// An exchange responder's identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RxId(pub u16);

impl OxId {
    /// FFFFh: not assigned.
    pub const UNASSIGNED: OxId = OxId(0xffff);
}

impl RxId {
    /// FFFFh: not yet assigned by the responder.
    pub const UNASSIGNED: RxId = RxId(0xffff);
}

impl fmt::Debug for OxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OxId({:#06x})", self.0)
    }
}

impl fmt::Debug for RxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RxId({:#06x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        let w: Wwn = "20:00:00:25:b5:00:00:01".parse().unwrap();
        assert_eq!(w, Wwn(0x2000_0025_b500_0001));
        assert_eq!(w.to_string(), "20:00:00:25:b5:00:00:01");
        assert_eq!("0x20000025b5000001".parse::<Wwn>().unwrap(), w);
        assert_eq!(w.naa(), 2);
        assert!("20:00".parse::<Wwn>().is_err());
        assert!("zz:00:00:25:b5:00:00:01".parse::<Wwn>().is_err());
        let id: FcId = "0x010203".parse().unwrap();
        assert_eq!(id, FcId::from_parts(1, 2, 3));
        assert_eq!("01.02.03".parse::<FcId>().unwrap(), id);
        assert_eq!(id.to_string(), "0x010203");
        assert_eq!((id.domain(), id.area(), id.port()), (1, 2, 3));
        assert!("0x1000000".parse::<FcId>().is_err());
        assert!(FcId::NAME_SERVER.is_well_known());
        assert!(!id.is_well_known());
        assert_eq!(FcId::new(0xab01_0203), id);
    }
}
