//! The FCoE Initialization Protocol (FC-BB-6 §7.8): VLAN discovery,
//! FCF discovery, fabric login through FIP, keep-alives, Clear Virtual
//! Links, and the VN2VN probes and claims — a 10-byte header and a list
//! of type-length-value descriptors counted in 32-bit words.
//!
//! Every descriptor FC-BB-6 defines has a typed variant with the length
//! its type requires; a descriptor of the wrong length is refused
//! ([`WireError::DescriptorLength`]), which is how an FCF answers a
//! malformed request (it drops it and counts it). Types unifab does not
//! know (vendor-specific 241–254, later additions) are kept opaque, so
//! they still round-trip. Bytes after the descriptor list (Ethernet
//! padding, or the padding a solicited advertisement carries up to the
//! maximum FCoE size) are kept as [`FipRepr::padding`].

use std::fmt;

use bytes::Bytes;
use nom::IResult;
use nom::Parser;
use nom::bytes::complete::take;
use nom::number::complete::{be_u8, be_u16, be_u32, be_u64};
use unifab_fc::{FcId, Wwn};

use super::be::{put_u16, u16_at};
use super::{FcMap, MacAddr, WireError, check_len};

/// Length of the fixed FIP header.
pub const FIP_HEADER_LEN: usize = 10;
/// The FIP version this module speaks.
pub const FIP_VERSION: u8 = 1;

/// A FIP protocol code. Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FipOp(pub u16);

impl FipOp {
    /// Discovery (solicitation, advertisement).
    pub const DISCOVERY: FipOp = FipOp(0x0001);
    /// Virtual link instantiation (FLOGI, FDISC, LOGO, ELP).
    pub const LINK_SERVICE: FipOp = FipOp(0x0002);
    /// Keep-alive and Clear Virtual Links.
    pub const CONTROL: FipOp = FipOp(0x0003);
    /// VLAN discovery.
    pub const VLAN: FipOp = FipOp(0x0004);
    /// VN2VN (probes, claims, beacons).
    pub const VN2VN: FipOp = FipOp(0x0005);

    /// A vendor-specific protocol code (FFF8h–FFFEh).
    pub fn is_vendor(self) -> bool {
        (0xfff8..=0xfffe).contains(&self.0)
    }
}

impl fmt::Debug for FipOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FipOp::DISCOVERY => f.write_str("Discovery"),
            FipOp::LINK_SERVICE => f.write_str("LinkService"),
            FipOp::CONTROL => f.write_str("Control"),
            FipOp::VLAN => f.write_str("Vlan"),
            FipOp::VN2VN => f.write_str("Vn2Vn"),
            FipOp(v) => write!(f, "FipOp({v:#06x})"),
        }
    }
}

/// A FIP subcode (meaningful with its protocol code). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FipSubcode(pub u8);

#[allow(missing_docs)]
impl FipSubcode {
    /// Discovery: solicitation; link service: request; control:
    /// keep-alive; VLAN: request; VN2VN: probe request.
    pub const ONE: FipSubcode = FipSubcode(1);
    /// Discovery: advertisement; link service: reply; control: Clear
    /// Virtual Links; VLAN: notification; VN2VN: probe reply.
    pub const TWO: FipSubcode = FipSubcode(2);
    pub const SOLICITATION: FipSubcode = FipSubcode(1);
    pub const ADVERTISEMENT: FipSubcode = FipSubcode(2);
    pub const LS_REQUEST: FipSubcode = FipSubcode(1);
    pub const LS_REPLY: FipSubcode = FipSubcode(2);
    pub const KEEP_ALIVE: FipSubcode = FipSubcode(1);
    pub const CLEAR_VIRTUAL_LINKS: FipSubcode = FipSubcode(2);
    pub const VLAN_REQUEST: FipSubcode = FipSubcode(1);
    pub const VLAN_NOTIFICATION: FipSubcode = FipSubcode(2);
    pub const VN2VN_VLAN_NOTIFICATION: FipSubcode = FipSubcode(3);
    pub const PROBE_REQUEST: FipSubcode = FipSubcode(1);
    pub const PROBE_REPLY: FipSubcode = FipSubcode(2);
    pub const CLAIM_NOTIFICATION: FipSubcode = FipSubcode(3);
    pub const CLAIM_RESPONSE: FipSubcode = FipSubcode(4);
    pub const BEACON: FipSubcode = FipSubcode(5);
}

/// The FIP flags word.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FipFlags(pub u16);

impl FipFlags {
    /// FP: fabric-provided MAC addresses.
    pub const FP: u16 = 0x8000;
    /// SP: server-provided MAC addresses.
    pub const SP: u16 = 0x4000;
    /// REC (recorded) / P2P (point-to-point VN2VN).
    pub const REC_P2P: u16 = 0x0008;
    /// A: the FCF is available for logins.
    pub const A: u16 = 0x0004;
    /// S: the advertisement answers a solicitation.
    pub const S: u16 = 0x0002;
    /// F: the sender is an FCF.
    pub const F: u16 = 0x0001;

    /// Whether `bit` is set.
    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

impl fmt::Debug for FipFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        for (b, n) in [
            (Self::FP, "FP"),
            (Self::SP, "SP"),
            (Self::REC_P2P, "REC"),
            (Self::A, "A"),
            (Self::S, "S"),
            (Self::F, "F"),
        ] {
            if self.has(b) {
                names.push(n);
            }
        }
        write!(f, "FipFlags({:#06x} {})", self.0, names.join("|"))
    }
}

/// A descriptor type. Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DescriptorType(pub u8);

#[allow(missing_docs)]
impl DescriptorType {
    pub const PRIORITY: DescriptorType = DescriptorType(1);
    pub const MAC_ADDRESS: DescriptorType = DescriptorType(2);
    pub const FC_MAP: DescriptorType = DescriptorType(3);
    pub const NAME_IDENTIFIER: DescriptorType = DescriptorType(4);
    pub const FABRIC: DescriptorType = DescriptorType(5);
    pub const MAX_FCOE_SIZE: DescriptorType = DescriptorType(6);
    pub const FLOGI: DescriptorType = DescriptorType(7);
    pub const FDISC: DescriptorType = DescriptorType(8);
    pub const LOGO: DescriptorType = DescriptorType(9);
    pub const ELP: DescriptorType = DescriptorType(10);
    pub const VX_PORT_ID: DescriptorType = DescriptorType(11);
    pub const FKA_ADV_PERIOD: DescriptorType = DescriptorType(12);
    pub const VENDOR_ID: DescriptorType = DescriptorType(13);
    pub const VLAN: DescriptorType = DescriptorType(14);
    pub const FC4_ATTRIBUTES: DescriptorType = DescriptorType(15);

    /// Types 128 and above may be ignored by a receiver that does not
    /// know them; lower ones may not.
    pub fn is_critical(self) -> bool {
        self.0 < 128
    }
}

impl fmt::Debug for DescriptorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DescriptorType({})", self.0)
    }
}

/// One FIP descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descriptor {
    /// Type 1: FCF priority (lower is preferred).
    Priority(u8),
    /// Type 2: a MAC address (the FCF's, the ENode's, a granted VN_Port's).
    MacAddress(MacAddr),
    /// Type 3: the FC-MAP.
    FcMap(FcMap),
    /// Type 4: a switch or node name.
    NameIdentifier(Wwn),
    /// Type 5: the fabric (VF_ID, FC-MAP, fabric name).
    Fabric {
        /// Virtual fabric identifier.
        vf_id: u16,
        /// FC-MAP.
        fc_map: FcMap,
        /// Fabric name.
        fabric_name: Wwn,
    },
    /// Type 6: the largest FCoE frame the sender can receive (bytes).
    MaxFcoeSize(u16),
    /// Type 7: an FLOGI request or reply (FC header + payload).
    Flogi(Bytes),
    /// Type 8: an FDISC request or reply.
    Fdisc(Bytes),
    /// Type 9: a LOGO request or reply.
    Logo(Bytes),
    /// Type 10: an ELP request or reply.
    Elp(Bytes),
    /// Type 11: a VN_Port's (or VF/VE_Port's) identification.
    VxPortId {
        /// The port's MAC.
        mac: MacAddr,
        /// Its address identifier.
        fc_id: FcId,
        /// Its port name.
        port_name: Wwn,
    },
    /// Type 12: the FCF's keep-alive/advertisement period.
    FkaAdvPeriod {
        /// D bit: VN_Ports need not send keep-alives.
        no_vn_keep_alives: bool,
        /// Period in milliseconds.
        period_ms: u32,
    },
    /// Type 13: vendor identification.
    VendorId([u8; 8]),
    /// Type 14: a VLAN identifier.
    Vlan(u16),
    /// Type 15: FC-4 attributes (VN2VN; an FC-GS RFF_ID-style body), kept opaque.
    Fc4Attributes(Bytes),
    /// Another type, kept opaque (the bytes after type and length).
    Other {
        /// The type.
        ty: DescriptorType,
        /// Its value.
        value: Bytes,
    },
}

impl Descriptor {
    /// The descriptor's type.
    pub fn ty(&self) -> DescriptorType {
        match self {
            Descriptor::Priority(_) => DescriptorType::PRIORITY,
            Descriptor::MacAddress(_) => DescriptorType::MAC_ADDRESS,
            Descriptor::FcMap(_) => DescriptorType::FC_MAP,
            Descriptor::NameIdentifier(_) => DescriptorType::NAME_IDENTIFIER,
            Descriptor::Fabric { .. } => DescriptorType::FABRIC,
            Descriptor::MaxFcoeSize(_) => DescriptorType::MAX_FCOE_SIZE,
            Descriptor::Flogi(_) => DescriptorType::FLOGI,
            Descriptor::Fdisc(_) => DescriptorType::FDISC,
            Descriptor::Logo(_) => DescriptorType::LOGO,
            Descriptor::Elp(_) => DescriptorType::ELP,
            Descriptor::VxPortId { .. } => DescriptorType::VX_PORT_ID,
            Descriptor::FkaAdvPeriod { .. } => DescriptorType::FKA_ADV_PERIOD,
            Descriptor::VendorId(_) => DescriptorType::VENDOR_ID,
            Descriptor::Vlan(_) => DescriptorType::VLAN,
            Descriptor::Fc4Attributes(_) => DescriptorType::FC4_ATTRIBUTES,
            Descriptor::Other { ty, .. } => *ty,
        }
    }

    /// The encapsulated FC frame of an FLOGI/FDISC/LOGO/ELP descriptor.
    pub fn fc_frame(&self) -> Option<&Bytes> {
        match self {
            Descriptor::Flogi(b)
            | Descriptor::Fdisc(b)
            | Descriptor::Logo(b)
            | Descriptor::Elp(b) => Some(b),
            _ => None,
        }
    }

    /// Length in bytes (type and length included).
    pub fn buffer_len(&self) -> usize {
        match self {
            Descriptor::Priority(_) | Descriptor::MaxFcoeSize(_) | Descriptor::Vlan(_) => 4,
            Descriptor::MacAddress(_) | Descriptor::FcMap(_) | Descriptor::FkaAdvPeriod { .. } => 8,
            Descriptor::NameIdentifier(_) | Descriptor::VendorId(_) => 12,
            Descriptor::Fabric { .. } => 16,
            Descriptor::VxPortId { .. } => 20,
            Descriptor::Flogi(b)
            | Descriptor::Fdisc(b)
            | Descriptor::Logo(b)
            | Descriptor::Elp(b) => (4 + b.len()).next_multiple_of(4),
            Descriptor::Fc4Attributes(v) | Descriptor::Other { value: v, .. } => {
                (2 + v.len()).next_multiple_of(4)
            }
        }
    }

    /// Writes the descriptor at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        if n > 255 * 4 {
            return Err(WireError::DescriptorLength {
                ty: self.ty().0,
                words: 255,
                expected: "at most 255 words",
            });
        }
        check_len(buf, n)?;
        let b = &mut buf[..n];
        b.fill(0);
        b[0] = self.ty().0;
        b[1] = (n / 4) as u8;
        match self {
            Descriptor::Priority(p) => b[3] = *p,
            Descriptor::MacAddress(m) => b[2..8].copy_from_slice(&m.0),
            Descriptor::FcMap(m) => b[5..8].copy_from_slice(&m.to_bytes()),
            Descriptor::NameIdentifier(w) => b[4..12].copy_from_slice(&w.to_bytes()),
            Descriptor::Fabric {
                vf_id,
                fc_map,
                fabric_name,
            } => {
                put_u16(b, 2, *vf_id);
                b[5..8].copy_from_slice(&fc_map.to_bytes());
                b[8..16].copy_from_slice(&fabric_name.to_bytes());
            }
            Descriptor::MaxFcoeSize(s) => put_u16(b, 2, *s),
            Descriptor::Flogi(f)
            | Descriptor::Fdisc(f)
            | Descriptor::Logo(f)
            | Descriptor::Elp(f) => {
                b[4..4 + f.len()].copy_from_slice(f);
            }
            Descriptor::VxPortId {
                mac,
                fc_id,
                port_name,
            } => {
                b[2..8].copy_from_slice(&mac.0);
                b[9..12].copy_from_slice(&fc_id.to_bytes());
                b[12..20].copy_from_slice(&port_name.to_bytes());
            }
            Descriptor::FkaAdvPeriod {
                no_vn_keep_alives,
                period_ms,
            } => {
                b[3] = u8::from(*no_vn_keep_alives);
                b[4..8].copy_from_slice(&period_ms.to_be_bytes());
            }
            Descriptor::VendorId(v) => b[4..12].copy_from_slice(v),
            Descriptor::Vlan(v) => put_u16(b, 2, *v & 0x0fff),
            Descriptor::Fc4Attributes(v) | Descriptor::Other { value: v, .. } => {
                b[2..2 + v.len()].copy_from_slice(v);
            }
        }
        Ok(())
    }

    /// Parses one whole descriptor (`d` is exactly its bytes; `all` is
    /// the buffer `d` lies in, so FC frames are sliced, not copied).
    fn parse(d: &[u8], all: &Bytes) -> Result<Descriptor, WireError> {
        let ty = DescriptorType(d[0]);
        let words = d[1];
        let bad = |expected: &'static str| WireError::DescriptorLength {
            ty: ty.0,
            words,
            expected,
        };
        let fixed = |w: u8, expected: &'static str| {
            if words == w {
                Ok(())
            } else {
                Err(bad(expected))
            }
        };
        let slice = |from: usize| all.slice_ref(&d[from..]);
        let r: IResult<&[u8], Descriptor> = match ty {
            DescriptorType::PRIORITY => {
                fixed(1, "1")?;
                (be_u8, be_u8)
                    .map(|(_, p)| Descriptor::Priority(p))
                    .parse(&d[2..])
            }
            DescriptorType::MAC_ADDRESS => {
                fixed(2, "2")?;
                take(6usize)
                    .map(|m: &[u8]| {
                        let mut a = [0u8; 6];
                        a.copy_from_slice(m);
                        Descriptor::MacAddress(MacAddr(a))
                    })
                    .parse(&d[2..])
            }
            DescriptorType::FC_MAP => {
                fixed(2, "2")?;
                (take(3usize), take(3usize))
                    .map(|(_, m): (&[u8], &[u8])| {
                        Descriptor::FcMap(FcMap::from_bytes([m[0], m[1], m[2]]))
                    })
                    .parse(&d[2..])
            }
            DescriptorType::NAME_IDENTIFIER => {
                fixed(3, "3")?;
                (be_u16, be_u64)
                    .map(|(_, w)| Descriptor::NameIdentifier(Wwn(w)))
                    .parse(&d[2..])
            }
            DescriptorType::FABRIC => {
                fixed(4, "4")?;
                (be_u16, be_u8, take(3usize), be_u64)
                    .map(
                        |(vf_id, _, m, n): (u16, u8, &[u8], u64)| Descriptor::Fabric {
                            vf_id,
                            fc_map: FcMap::from_bytes([m[0], m[1], m[2]]),
                            fabric_name: Wwn(n),
                        },
                    )
                    .parse(&d[2..])
            }
            DescriptorType::MAX_FCOE_SIZE => {
                fixed(1, "1")?;
                be_u16.map(Descriptor::MaxFcoeSize).parse(&d[2..])
            }
            DescriptorType::FLOGI
            | DescriptorType::FDISC
            | DescriptorType::LOGO
            | DescriptorType::ELP => {
                // Two reserved bytes, then at least an FC header.
                if words < 7 {
                    return Err(bad("at least 7 (an FC header)"));
                }
                let f = slice(4);
                return Ok(match ty {
                    DescriptorType::FLOGI => Descriptor::Flogi(f),
                    DescriptorType::FDISC => Descriptor::Fdisc(f),
                    DescriptorType::LOGO => Descriptor::Logo(f),
                    _ => Descriptor::Elp(f),
                });
            }
            DescriptorType::VX_PORT_ID => {
                fixed(5, "5")?;
                (take(6usize), be_u32, be_u64)
                    .map(|(m, id, w): (&[u8], u32, u64)| {
                        let mut a = [0u8; 6];
                        a.copy_from_slice(m);
                        Descriptor::VxPortId {
                            mac: MacAddr(a),
                            fc_id: FcId::new(id),
                            port_name: Wwn(w),
                        }
                    })
                    .parse(&d[2..])
            }
            DescriptorType::FKA_ADV_PERIOD => {
                fixed(2, "2")?;
                (be_u8, be_u8, be_u32)
                    .map(|(_, fl, p)| Descriptor::FkaAdvPeriod {
                        no_vn_keep_alives: fl & 1 != 0,
                        period_ms: p,
                    })
                    .parse(&d[2..])
            }
            DescriptorType::VENDOR_ID => {
                fixed(3, "3")?;
                (be_u16, take(8usize))
                    .map(|(_, v): (u16, &[u8])| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(v);
                        Descriptor::VendorId(a)
                    })
                    .parse(&d[2..])
            }
            DescriptorType::VLAN => {
                fixed(1, "1")?;
                be_u16.map(|v| Descriptor::Vlan(v & 0x0fff)).parse(&d[2..])
            }
            DescriptorType::FC4_ATTRIBUTES => return Ok(Descriptor::Fc4Attributes(slice(2))),
            _ => {
                return Ok(Descriptor::Other {
                    ty,
                    value: slice(2),
                });
            }
        };
        r.map(|(_, v)| v).map_err(|_| bad("the type's layout"))
    }
}

mod field {
    pub const VERSION: usize = 0;
    pub const OP: usize = 2;
    pub const SUBCODE: usize = 5;
    pub const DESC_LEN: usize = 6;
    pub const FLAGS: usize = 8;
}

/// A zero-copy view of a FIP frame (the bytes after the EtherType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FipHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FipHeader<T> {
    /// Wraps a FIP frame after checking the header and that the declared
    /// descriptor list is present.
    pub fn new_checked(buffer: T) -> Result<FipHeader<T>, WireError> {
        let b = buffer.as_ref();
        check_len(b, FIP_HEADER_LEN)?;
        let v = FipHeader { buffer };
        check_len(v.buffer.as_ref(), FIP_HEADER_LEN + v.desc_list_len() * 4)?;
        Ok(v)
    }

    /// Version (high nibble).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] >> 4
    }

    /// Protocol code.
    pub fn op(&self) -> FipOp {
        FipOp(u16_at(self.buffer.as_ref(), field::OP))
    }

    /// Subcode.
    pub fn subcode(&self) -> FipSubcode {
        FipSubcode(self.buffer.as_ref()[field::SUBCODE])
    }

    /// Descriptor list length in 32-bit words.
    pub fn desc_list_len(&self) -> usize {
        usize::from(u16_at(self.buffer.as_ref(), field::DESC_LEN))
    }

    /// Flags.
    pub fn flags(&self) -> FipFlags {
        FipFlags(u16_at(self.buffer.as_ref(), field::FLAGS))
    }

    /// The descriptor list.
    pub fn descriptors(&self) -> &[u8] {
        &self.buffer.as_ref()[FIP_HEADER_LEN..FIP_HEADER_LEN + self.desc_list_len() * 4]
    }

    /// Bytes after the descriptor list.
    pub fn padding(&self) -> &[u8] {
        &self.buffer.as_ref()[FIP_HEADER_LEN + self.desc_list_len() * 4..]
    }
}

/// A FIP frame's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FipRepr {
    /// Protocol code.
    pub op: FipOp,
    /// Subcode.
    pub subcode: FipSubcode,
    /// Flags.
    pub flags: FipFlags,
    /// Descriptors, in order.
    pub descriptors: Vec<Descriptor>,
    /// Bytes after the descriptor list.
    pub padding: Bytes,
}

impl FipRepr {
    /// A message with no padding.
    pub fn new(
        op: FipOp,
        subcode: FipSubcode,
        flags: u16,
        descriptors: Vec<Descriptor>,
    ) -> FipRepr {
        FipRepr {
            op,
            subcode,
            flags: FipFlags(flags),
            descriptors,
            padding: Bytes::new(),
        }
    }

    /// Parses the bytes after the EtherType (version 1 only).
    pub fn parse(bytes: &Bytes) -> Result<FipRepr, WireError> {
        let v = FipHeader::new_checked(&bytes[..])?;
        if v.version() != FIP_VERSION {
            return Err(WireError::FipVersion(v.version()));
        }
        let declared = v.desc_list_len();
        let mut list = v.descriptors();
        let mut descriptors = Vec::new();
        while !list.is_empty() {
            if list.len() < 4 {
                return Err(WireError::DescriptorList { declared });
            }
            let words = list[1];
            if words == 0 {
                return Err(WireError::DescriptorLength {
                    ty: list[0],
                    words,
                    expected: "at least 1",
                });
            }
            let n = usize::from(words) * 4;
            let Some(d) = list.get(..n) else {
                return Err(WireError::DescriptorList { declared });
            };
            descriptors.push(Descriptor::parse(d, bytes)?);
            list = &list[n..];
        }
        let padding = bytes.slice_ref(v.padding());
        Ok(FipRepr {
            op: v.op(),
            subcode: v.subcode(),
            flags: v.flags(),
            descriptors,
            padding,
        })
    }

    /// Length of the descriptor list in bytes.
    pub fn descriptors_len(&self) -> usize {
        self.descriptors.iter().map(Descriptor::buffer_len).sum()
    }

    /// Whole length (header, descriptors, padding).
    pub fn buffer_len(&self) -> usize {
        FIP_HEADER_LEN + self.descriptors_len() + self.padding.len()
    }

    /// Writes the frame (after the EtherType) into `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        check_len(buf, n)?;
        let words = self.descriptors_len() / 4;
        let words = u16::try_from(words).map_err(|_| WireError::TooLong(n))?;
        buf[..FIP_HEADER_LEN].fill(0);
        buf[field::VERSION] = FIP_VERSION << 4;
        put_u16(buf, field::OP, self.op.0);
        buf[field::SUBCODE] = self.subcode.0;
        put_u16(buf, field::DESC_LEN, words);
        put_u16(buf, field::FLAGS, self.flags.0);
        let mut at = FIP_HEADER_LEN;
        for d in &self.descriptors {
            d.emit(&mut buf[at..])?;
            at += d.buffer_len();
        }
        buf[at..at + self.padding.len()].copy_from_slice(&self.padding);
        Ok(())
    }

    /// A short name for logs and reports ("Advertisement", "FLOGI request", …).
    pub fn name(&self) -> String {
        let ls = |what: &str| {
            let d = self
                .descriptors
                .iter()
                .find_map(|d| match d {
                    Descriptor::Flogi(_) => Some("FLOGI"),
                    Descriptor::Fdisc(_) => Some("FDISC"),
                    Descriptor::Logo(_) => Some("LOGO"),
                    Descriptor::Elp(_) => Some("ELP"),
                    _ => None,
                })
                .unwrap_or("link service");
            format!("{d} {what}")
        };
        match (self.op, self.subcode.0) {
            (FipOp::DISCOVERY, 1) => "Solicitation".into(),
            (FipOp::DISCOVERY, 2) => "Advertisement".into(),
            (FipOp::LINK_SERVICE, 1) => ls("request"),
            (FipOp::LINK_SERVICE, 2) => ls("reply"),
            (FipOp::CONTROL, 1) => "Keep-Alive".into(),
            (FipOp::CONTROL, 2) => "Clear Virtual Links".into(),
            (FipOp::VLAN, 1) => "VLAN Request".into(),
            (FipOp::VLAN, 2) => "VLAN Notification".into(),
            (FipOp::VLAN, 3) => "VN2VN VLAN Notification".into(),
            (FipOp::VN2VN, 1) => "VN2VN Probe Request".into(),
            (FipOp::VN2VN, 2) => "VN2VN Probe Reply".into(),
            (FipOp::VN2VN, 3) => "VN2VN Claim Notification".into(),
            (FipOp::VN2VN, 4) => "VN2VN Claim Response".into(),
            (FipOp::VN2VN, 5) => "VN2VN Beacon".into(),
            (op, s) => format!("FIP {op:?} subcode {s}"),
        }
    }

    /// The first MAC address descriptor.
    pub fn mac(&self) -> Option<MacAddr> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::MacAddress(m) => Some(*m),
            _ => None,
        })
    }

    /// The first name identifier.
    pub fn name_identifier(&self) -> Option<Wwn> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::NameIdentifier(w) => Some(*w),
            _ => None,
        })
    }

    /// The priority descriptor.
    pub fn priority(&self) -> Option<u8> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::Priority(p) => Some(*p),
            _ => None,
        })
    }

    /// The max FCoE size descriptor.
    pub fn max_fcoe_size(&self) -> Option<u16> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::MaxFcoeSize(s) => Some(*s),
            _ => None,
        })
    }

    /// The fabric descriptor: (VF_ID, FC-MAP, fabric name).
    pub fn fabric(&self) -> Option<(u16, FcMap, Wwn)> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::Fabric {
                vf_id,
                fc_map,
                fabric_name,
            } => Some((*vf_id, *fc_map, *fabric_name)),
            _ => None,
        })
    }

    /// The FKA_ADV_PERIOD descriptor: (D bit, milliseconds).
    pub fn fka_adv_period(&self) -> Option<(bool, u32)> {
        self.descriptors.iter().find_map(|d| match d {
            Descriptor::FkaAdvPeriod {
                no_vn_keep_alives,
                period_ms,
            } => Some((*no_vn_keep_alives, *period_ms)),
            _ => None,
        })
    }

    /// Every VLAN descriptor.
    pub fn vlans(&self) -> Vec<u16> {
        self.descriptors
            .iter()
            .filter_map(|d| match d {
                Descriptor::Vlan(v) => Some(*v),
                _ => None,
            })
            .collect()
    }

    /// Every Vx_Port identification: (MAC, FC_ID, port name).
    pub fn vx_ports(&self) -> Vec<(MacAddr, FcId, Wwn)> {
        self.descriptors
            .iter()
            .filter_map(|d| match d {
                Descriptor::VxPortId {
                    mac,
                    fc_id,
                    port_name,
                } => Some((*mac, *fc_id, *port_name)),
                _ => None,
            })
            .collect()
    }

    /// The encapsulated link service (descriptor type and FC frame).
    pub fn link_service(&self) -> Option<(DescriptorType, &Bytes)> {
        self.descriptors
            .iter()
            .find_map(|d| d.fc_frame().map(|f| (d.ty(), f)))
    }

    /// Adds zero padding so that the Ethernet frame (with an `eth_header`
    /// byte header) reaches `total` bytes.
    pub fn pad_to(&mut self, eth_header: usize, total: usize) {
        let now = eth_header + FIP_HEADER_LEN + self.descriptors_len();
        self.padding = Bytes::from(vec![0u8; total.saturating_sub(now)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of frame 2 of fip-ka.cap (a VN_Port keep-alive), after
    /// the EtherType, up to the end of its descriptor list.
    const KEEP_ALIVE: [u8; 38] = [
        0x10, 0x00, 0x00, 0x03, 0x00, 0x01, 0x00, 0x07, 0x80, 0x00, 0x02, 0x02, 0x00, 0x17, 0xa4,
        0x3e, 0x34, 0x8c, 0x0b, 0x05, 0x0e, 0xfc, 0x00, 0x13, 0x04, 0x00, 0x00, 0x13, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn keep_alive_from_capture() {
        let b = Bytes::from_static(&KEEP_ALIVE);
        let r = FipRepr::parse(&b).unwrap();
        assert_eq!(r.op, FipOp::CONTROL);
        assert_eq!(r.subcode, FipSubcode::KEEP_ALIVE);
        assert_eq!(r.flags, FipFlags(FipFlags::FP));
        assert_eq!(r.mac(), Some(MacAddr([0, 0x17, 0xa4, 0x3e, 0x34, 0x8c])));
        assert_eq!(
            r.vx_ports(),
            vec![(
                MacAddr([0x0e, 0xfc, 0, 0x13, 4, 0]),
                FcId::from_parts(0x13, 4, 0),
                Wwn(0)
            )]
        );
        assert_eq!(r.name(), "Keep-Alive");
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[..], &KEEP_ALIVE[..]);
        for n in 0..KEEP_ALIVE.len() {
            assert!(FipRepr::parse(&b.slice(..n)).is_err(), "{n}");
        }
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let mut v = KEEP_ALIVE.to_vec();
        v[11] = 3; // MAC descriptor claiming 3 words
        assert!(matches!(
            FipRepr::parse(&Bytes::from(v)),
            Err(WireError::DescriptorLength {
                ty: 2,
                words: 3,
                ..
            })
        ));
        let mut v = KEEP_ALIVE.to_vec();
        v[11] = 0;
        assert!(FipRepr::parse(&Bytes::from(v)).is_err());
        let mut v = KEEP_ALIVE.to_vec();
        v[7] = 6; // list ends inside the Vx_Port descriptor
        assert!(matches!(
            FipRepr::parse(&Bytes::from(v)),
            Err(WireError::DescriptorList { declared: 6 })
        ));
        let mut v = KEEP_ALIVE.to_vec();
        v[0] = 0x20;
        assert_eq!(
            FipRepr::parse(&Bytes::from(v)),
            Err(WireError::FipVersion(2))
        );
    }

    #[test]
    fn every_descriptor_round_trips() {
        let frame = Bytes::from(vec![0x22u8; 24 + 8]);
        let r = FipRepr {
            op: FipOp::DISCOVERY,
            subcode: FipSubcode::ADVERTISEMENT,
            flags: FipFlags(FipFlags::FP | FipFlags::A | FipFlags::F),
            descriptors: vec![
                Descriptor::Priority(128),
                Descriptor::MacAddress(MacAddr([2, 0, 0, 0, 0, 1])),
                Descriptor::FcMap(FcMap::DEFAULT),
                Descriptor::NameIdentifier(Wwn(0x2000_0000_c900_0001)),
                Descriptor::Fabric {
                    vf_id: 7,
                    fc_map: FcMap::DEFAULT,
                    fabric_name: Wwn(0x1000_0000_0000_0001),
                },
                Descriptor::MaxFcoeSize(2158),
                Descriptor::Flogi(frame.clone()),
                Descriptor::Fdisc(frame.clone()),
                Descriptor::Logo(frame.clone()),
                Descriptor::Elp(frame),
                Descriptor::VxPortId {
                    mac: MacAddr([0x0e, 0xfc, 0, 1, 2, 3]),
                    fc_id: FcId::from_parts(1, 2, 3),
                    port_name: Wwn(0x2100_0000_0000_0001),
                },
                Descriptor::FkaAdvPeriod {
                    no_vn_keep_alives: true,
                    period_ms: 8000,
                },
                Descriptor::VendorId(*b"unifab\0\0"),
                Descriptor::Vlan(100),
                Descriptor::Fc4Attributes(Bytes::from_static(&[0; 34])),
                Descriptor::Other {
                    ty: DescriptorType(241),
                    value: Bytes::from_static(&[1, 2, 3, 4, 5, 6]),
                },
            ],
            padding: Bytes::from_static(&[0; 12]),
        };
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out).unwrap();
        let back = FipRepr::parse(&Bytes::from(out.clone())).unwrap();
        assert_eq!(back, r);
        let mut again = vec![0u8; back.buffer_len()];
        back.emit(&mut again).unwrap();
        assert_eq!(again, out);
        assert_eq!(
            back.fabric(),
            Some((7, FcMap::DEFAULT, Wwn(0x1000_0000_0000_0001)))
        );
        assert_eq!(back.fka_adv_period(), Some((true, 8000)));
        assert_eq!(back.vlans(), vec![100]);
        assert_eq!(back.priority(), Some(128));
        assert_eq!(back.max_fcoe_size(), Some(2158));
        assert_eq!(
            back.link_service().map(|(t, _)| t),
            Some(DescriptorType::FLOGI)
        );
        assert!(out.len() < 255 * 4);
    }
}
