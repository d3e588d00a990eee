//! Ethernet II headers with an optional IEEE 802.1Q tag.
//!
//! There is no 802.1Q driver under unifab: FCoE ports tag and untag in
//! software, so the tag is part of the frame this module reads and
//! writes. Priority 3 is FCoE's customary class (IEEE 802.1Q Annex I,
//! DCB practice) and the default of [`VlanTag::fcoe`].

use std::fmt;

use super::be::{put_u16, u16_at};
use super::{MacAddr, WireError, check_len};

/// An EtherType. Open: any value parses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// ARP.
    pub const ARP: EtherType = EtherType(0x0806);
    /// An IEEE 802.1Q tag follows.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// Fibre Channel over Ethernet.
    pub const FCOE: EtherType = EtherType(0x8906);
    /// FCoE Initialization Protocol.
    pub const FIP: EtherType = EtherType(0x8914);
}

impl fmt::Debug for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EtherType::FCOE => f.write_str("FCoE"),
            EtherType::FIP => f.write_str("FIP"),
            EtherType::VLAN => f.write_str("802.1Q"),
            EtherType::IPV4 => f.write_str("IPv4"),
            EtherType::IPV6 => f.write_str("IPv6"),
            EtherType(v) => write!(f, "EtherType({v:#06x})"),
        }
    }
}

/// An 802.1Q tag control: priority code point, drop eligibility, VLAN ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point (0–7).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (0–4095; 0 is a priority-only tag).
    pub vid: u16,
}

impl VlanTag {
    /// The tag FCoE frames carry on `vid`: priority 3, not drop eligible.
    pub fn fcoe(vid: u16) -> VlanTag {
        VlanTag {
            pcp: 3,
            dei: false,
            vid: vid & 0x0fff,
        }
    }

    /// The 16-bit tag control information.
    pub fn tci(self) -> u16 {
        (u16::from(self.pcp & 7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }

    /// From the 16-bit tag control information.
    pub fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const TYPE: usize = 12;
    pub const TCI: usize = 14;
    pub const INNER_TYPE: usize = 16;
}

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of a header with one 802.1Q tag.
pub const TAGGED_HEADER_LEN: usize = 18;

/// A zero-copy view of an Ethernet II frame (no FCS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a frame after checking that its header (with the tag, if the
    /// EtherType says one follows) is there.
    pub fn new_checked(buffer: T) -> Result<EthernetFrame<T>, WireError> {
        let b = buffer.as_ref();
        check_len(b, HEADER_LEN)?;
        if EtherType(u16_at(b, field::TYPE)) == EtherType::VLAN {
            check_len(b, TAGGED_HEADER_LEN)?;
        }
        Ok(EthernetFrame { buffer })
    }

    /// Wraps without checking (emit paths, where the caller sized the buffer).
    pub fn new_unchecked(buffer: T) -> EthernetFrame<T> {
        EthernetFrame { buffer }
    }

    /// Destination address.
    pub fn dst_addr(&self) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        MacAddr(a)
    }

    /// Source address.
    pub fn src_addr(&self) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        MacAddr(a)
    }

    /// The 802.1Q tag, if the frame carries one.
    pub fn vlan(&self) -> Option<VlanTag> {
        let b = self.buffer.as_ref();
        (EtherType(u16_at(b, field::TYPE)) == EtherType::VLAN)
            .then(|| VlanTag::from_tci(u16_at(b, field::TCI)))
    }

    /// The EtherType of the payload (after the tag, if any).
    pub fn ethertype(&self) -> EtherType {
        let b = self.buffer.as_ref();
        match self.vlan() {
            Some(_) => EtherType(u16_at(b, field::INNER_TYPE)),
            None => EtherType(u16_at(b, field::TYPE)),
        }
    }

    /// Header length: 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        if self.vlan().is_some() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// What follows the header (padding included).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// An Ethernet II header's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination.
    pub dst: MacAddr,
    /// Source.
    pub src: MacAddr,
    /// The 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// The payload's EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> EthernetRepr {
        EthernetRepr {
            dst: frame.dst_addr(),
            src: frame.src_addr(),
            vlan: frame.vlan(),
            ethertype: frame.ethertype(),
        }
    }

    /// Header length.
    pub fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        check_len(buf, self.header_len())?;
        buf[field::DST].copy_from_slice(&self.dst.0);
        buf[field::SRC].copy_from_slice(&self.src.0);
        match self.vlan {
            Some(t) => {
                put_u16(buf, field::TYPE, EtherType::VLAN.0);
                put_u16(buf, field::TCI, t.tci());
                put_u16(buf, field::INNER_TYPE, self.ethertype.0);
            }
            None => put_u16(buf, field::TYPE, self.ethertype.0),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_and_untagged() {
        let repr = EthernetRepr {
            dst: MacAddr::ALL_FCF_MACS,
            src: MacAddr([0, 0x17, 0xa4, 0x3e, 0x34, 0x8c]),
            vlan: Some(VlanTag::fcoe(100)),
            ethertype: EtherType::FIP,
        };
        let mut b = [0u8; 20];
        repr.emit(&mut b).unwrap();
        assert_eq!(&b[12..18], &[0x81, 0x00, 0x60, 0x64, 0x89, 0x14]);
        let v = EthernetFrame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&v), repr);
        assert_eq!(v.payload().len(), 2);
        let untagged = EthernetRepr { vlan: None, ..repr };
        untagged.emit(&mut b).unwrap();
        let v = EthernetFrame::new_checked(&b[..14]).unwrap();
        assert_eq!(EthernetRepr::parse(&v), untagged);
        assert_eq!(v.header_len(), 14);
        for n in 0..14 {
            assert!(EthernetFrame::new_checked(&b[..n]).is_err());
        }
        repr.emit(&mut b).unwrap();
        assert!(EthernetFrame::new_checked(&b[..17]).is_err());
        assert!(untagged.emit(&mut b[..13]).is_err());
        assert_eq!(VlanTag::from_tci(0x6064), VlanTag::fcoe(100));
        assert_eq!(VlanTag::fcoe(100).tci(), 0x6064);
    }
}
