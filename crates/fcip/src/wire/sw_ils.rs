//! Switch Internal Link Services (FC-SW-4 §6, §8, §10): what two E_Ports
//! (here: VE_Ports over FCIP) say to each other in class F frames with
//! TYPE 0x22, R_CTL 02 (request) / 03 (reply), between FFFFFD and FFFFFD
//! (or the domain controllers FFFCxx).
//!
//! Layouts follow FC-SW-4; Wireshark's `fcswils` dissector agrees on all
//! of them except ELP, which it reads four bytes late (see FCIP.md).
//! A reply (SW_ACC) is parsed with the request code it answers, since its
//! body follows the request's format.

use bytes::{BufMut, Bytes, BytesMut};
use unifab_fc::wire::{FcId, Wwn};

use super::{WireError, be};

/// The SW_ILS command code (first byte of the payload). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SwIlsCode(pub u8);

#[allow(missing_docs)]
impl SwIlsCode {
    pub const SW_RJT: SwIlsCode = SwIlsCode(0x01);
    pub const SW_ACC: SwIlsCode = SwIlsCode(0x02);
    pub const ELP: SwIlsCode = SwIlsCode(0x10);
    pub const EFP: SwIlsCode = SwIlsCode(0x11);
    pub const DIA: SwIlsCode = SwIlsCode(0x12);
    pub const RDI: SwIlsCode = SwIlsCode(0x13);
    pub const HLO: SwIlsCode = SwIlsCode(0x14);
    pub const LSU: SwIlsCode = SwIlsCode(0x15);
    pub const LSA: SwIlsCode = SwIlsCode(0x16);
    pub const BF: SwIlsCode = SwIlsCode(0x17);
    pub const RCF: SwIlsCode = SwIlsCode(0x18);
    pub const SW_RSCN: SwIlsCode = SwIlsCode(0x1b);
    pub const MR: SwIlsCode = SwIlsCode(0x22);
    pub const ESC: SwIlsCode = SwIlsCode(0x30);
    pub const AUTH_ILS: SwIlsCode = SwIlsCode(0x40);

    /// The code's name, if known.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::SW_RJT => "SW_RJT",
            Self::SW_ACC => "SW_ACC",
            Self::ELP => "ELP",
            Self::EFP => "EFP",
            Self::DIA => "DIA",
            Self::RDI => "RDI",
            Self::HLO => "HLO",
            Self::LSU => "LSU",
            Self::LSA => "LSA",
            Self::BF => "BF",
            Self::RCF => "RCF",
            Self::SW_RSCN => "SW_RSCN",
            Self::MR => "MR",
            Self::ESC => "ESC",
            Self::AUTH_ILS => "AUTH_ILS",
            _ => return None,
        })
    }
}

/// SW_RJT reason codes. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SwRjtReason(pub u8);

#[allow(missing_docs)]
impl SwRjtReason {
    pub const INVALID_COMMAND: SwRjtReason = SwRjtReason(0x01);
    pub const INVALID_REVISION: SwRjtReason = SwRjtReason(0x02);
    pub const LOGICAL_ERROR: SwRjtReason = SwRjtReason(0x03);
    pub const INVALID_SIZE: SwRjtReason = SwRjtReason(0x04);
    pub const LOGICAL_BUSY: SwRjtReason = SwRjtReason(0x05);
    pub const PROTOCOL_ERROR: SwRjtReason = SwRjtReason(0x07);
    pub const UNABLE_TO_PERFORM: SwRjtReason = SwRjtReason(0x09);
    pub const NOT_SUPPORTED: SwRjtReason = SwRjtReason(0x0b);
}

/// SW_RJT reason explanations. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SwRjtExplanation(pub u8);

#[allow(missing_docs)]
impl SwRjtExplanation {
    pub const NONE: SwRjtExplanation = SwRjtExplanation(0x00);
    pub const CLASS_F_PARAM: SwRjtExplanation = SwRjtExplanation(0x01);
    pub const INVALID_PORT_NAME: SwRjtExplanation = SwRjtExplanation(0x0d);
    pub const INVALID_SWITCH_NAME: SwRjtExplanation = SwRjtExplanation(0x0e);
    pub const TOV_MISMATCH: SwRjtExplanation = SwRjtExplanation(0x0f);
    pub const INVALID_DOMAIN_LIST: SwRjtExplanation = SwRjtExplanation(0x10);
    pub const IN_PROGRESS: SwRjtExplanation = SwRjtExplanation(0x19);
    pub const DOMAIN_UNAVAILABLE: SwRjtExplanation = SwRjtExplanation(0x2a);
    pub const NO_PROTOCOL: SwRjtExplanation = SwRjtExplanation(0x2c);
    pub const E_PORT_ISOLATED: SwRjtExplanation = SwRjtExplanation(0x30);
}

/// Exchange Link Parameters (also the body of its SW_ACC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elp {
    /// Revision.
    pub revision: u8,
    /// Flags.
    pub flags: u16,
    /// BB_SC_N.
    pub bb_sc_n: u8,
    /// R_A_TOV in ms.
    pub r_a_tov: u32,
    /// E_D_TOV in ms.
    pub e_d_tov: u32,
    /// Requester E_Port name.
    pub port_name: Wwn,
    /// Requester switch name.
    pub switch_name: Wwn,
    /// Class F service parameters (16 bytes).
    pub class_f: [u8; 16],
    /// Class 1, 2 and 3 service parameters (4 bytes each).
    pub classes: [[u8; 4]; 3],
    /// Reserved bytes 60–79.
    pub reserved: [u8; 20],
    /// ISL flow control mode.
    pub flow_control_mode: u16,
    /// Flow control parameters (BB_Credit and compatibility parameters).
    pub flow_control: Bytes,
}

impl Elp {
    /// The ELP unifab's VE_Ports send: revision 3, class F and class 3
    /// valid with 2112-byte frames, R_RDY flow control parameters.
    pub fn unifab(port_name: Wwn, switch_name: Wwn, r_a_tov: u32, e_d_tov: u32) -> Elp {
        let mut class_f = [0u8; 16];
        class_f[0] = 0x80; // valid
        class_f[6..8].copy_from_slice(&2112u16.to_be_bytes()); // receive data field size
        class_f[8..10].copy_from_slice(&1u16.to_be_bytes()); // concurrent sequences
        class_f[12..14].copy_from_slice(&1u16.to_be_bytes()); // open sequences per exchange
        let mut c3 = [0u8; 4];
        c3[0] = 0x80;
        c3[2..4].copy_from_slice(&2112u16.to_be_bytes());
        let mut fc = BytesMut::with_capacity(20);
        fc.put_u32(16); // BB_Credit
        fc.put_bytes(0, 16);
        Elp {
            revision: 3,
            flags: 0,
            bb_sc_n: 0,
            r_a_tov,
            e_d_tov,
            port_name,
            switch_name,
            class_f,
            classes: [[0; 4], [0; 4], c3],
            reserved: [0; 20],
            flow_control_mode: 2,
            flow_control: fc.freeze(),
        }
    }
}

/// Exchange Switch Capabilities: the requester's protocols, or the one
/// the responder accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Esc {
    /// Switch vendor identifier (8 ASCII bytes).
    pub vendor_id: [u8; 8],
    /// Protocol descriptors: vendor id and protocol (2 = FSPF).
    pub protocols: Vec<([u8; 8], u16)>,
}

/// FSPF's protocol id in ESC.
pub const PROTOCOL_FSPF: u16 = 2;

/// One EFP list record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EfpRecord {
    /// 1 = domain ID record, 2 = multicast ID record.
    pub kind: u8,
    /// Domain ID (or multicast group).
    pub domain: u8,
    /// Switch name (domain records).
    pub switch_name: Wwn,
}

/// Exchange Fabric Parameters (also the body of its SW_ACC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Efp {
    /// Principal switch priority.
    pub principal_priority: u8,
    /// Principal switch name.
    pub principal_name: Wwn,
    /// Domain ID list.
    pub records: Vec<EfpRecord>,
}

/// The 20-byte FSPF header of HLO, LSU and LSA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FspfHeader {
    /// FSPF version (2).
    pub version: u8,
    /// Backbone area number.
    pub ar_number: u8,
    /// Authentication type.
    pub auth_type: u8,
    /// Originating domain.
    pub domain: u8,
    /// Authentication (8 bytes).
    pub auth: u64,
}

/// Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hlo {
    /// FSPF header.
    pub header: FspfHeader,
    /// Options.
    pub options: u32,
    /// Hello interval (s).
    pub hello_interval: u32,
    /// Dead interval (s).
    pub dead_interval: u32,
    /// The neighbour's domain, or 0xFF… if not yet known (low byte used).
    pub recipient_domain: u32,
    /// Originating port index.
    pub port_index: u32,
}

/// A Link State Record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LsrHeader {
    /// LSR type (1 = switch link record).
    pub lsr_type: u8,
    /// Age (s).
    pub age: u16,
    /// Options.
    pub options: u32,
    /// Link state id (the domain, in its low byte).
    pub link_state_id: u32,
    /// Advertising domain (low byte).
    pub advertising_domain: u32,
    /// Incarnation number.
    pub incarnation: u32,
    /// Checksum.
    pub checksum: u16,
    /// Record length in bytes (header, link count and descriptors).
    pub length: u16,
}

/// A link descriptor of a switch link record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkDescriptor {
    /// Link id (the neighbour domain, in its low byte).
    pub link_id: u32,
    /// Output port index.
    pub output_port: u32,
    /// Neighbour port index.
    pub neighbor_port: u32,
    /// Link type (1 = point to point).
    pub link_type: u8,
    /// Cost.
    pub cost: u16,
}

/// A switch link record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lsr {
    /// Header.
    pub header: LsrHeader,
    /// Links.
    pub links: Vec<LinkDescriptor>,
}

impl Lsr {
    /// The record's length on the wire.
    pub fn wire_len(&self) -> usize {
        28 + 16 * self.links.len()
    }
}

/// Link State Update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lsu {
    /// FSPF header.
    pub header: FspfHeader,
    /// Flags.
    pub flags: u8,
    /// Records.
    pub records: Vec<Lsr>,
}

/// Link State Acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lsa {
    /// FSPF header.
    pub header: FspfHeader,
    /// Flags.
    pub flags: u8,
    /// Headers of the records acknowledged.
    pub headers: Vec<LsrHeader>,
}

/// One device entry of an SW_RSCN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RscnDevice {
    /// 0 no information, 1 online, 2 offline.
    pub state: u8,
    /// Port id.
    pub port_id: FcId,
    /// Port name.
    pub port_name: Wwn,
    /// Node name.
    pub node_name: Wwn,
}

/// Inter-switch RSCN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwRscn {
    /// Event type (high nibble) and address format (low nibble).
    pub event_format: u8,
    /// Affected port, area, domain or fabric.
    pub affected: FcId,
    /// Detection function (1 fabric, 2 N_Port).
    pub detection: u32,
    /// Device entries.
    pub devices: Vec<RscnDevice>,
}

/// A zone member in a merge request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneMemberObj {
    /// Member type: 1 WWN, 2 domain/port, 3 FC address, 4 alias, …
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Identifier bytes.
    pub id: Bytes,
}

/// A zoning object (zone set, zone or alias) in a merge request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneObject {
    /// 1 zone set, 2 zone, 3 alias.
    pub kind: u8,
    /// Protocol.
    pub protocol: u8,
    /// Name as carried (padding included).
    pub name: Bytes,
    /// Members.
    pub members: Vec<ZoneMemberObj>,
}

impl ZoneObject {
    /// The name without its NUL padding.
    pub fn name_str(&self) -> String {
        name_str(&self.name)
    }
}

/// The name of a zone name field, without NUL padding.
pub fn name_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A name padded with NULs to a multiple of four bytes.
pub fn padded_name(s: &str) -> Bytes {
    let mut v = s.as_bytes().to_vec();
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    Bytes::from(v)
}

/// Merge Request: the sender's active zone set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mr {
    /// Active zone set name (padded) and its zones; `None` when zoning is
    /// not active.
    pub active: Option<(Bytes, Vec<ZoneObject>)>,
    /// The full zone set (object count and objects) as carried; unifab
    /// merges active zone sets only and sends this empty.
    pub full: Bytes,
}

/// Status of an MR / zoning reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneStatus {
    /// 0 successful, 1 busy, 2 failed.
    pub status: u8,
    /// Reason (0x0A cannot merge).
    pub reason: u8,
    /// Vendor unique.
    pub vendor: u8,
}

/// The body of an SW_ACC, by the request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwAcc {
    /// No body (4 bytes).
    Plain,
    /// ELP accept.
    Elp(Elp),
    /// EFP accept.
    Efp(Efp),
    /// ESC accept: vendor id and the accepted protocol.
    Esc(Esc),
    /// MR / zone server accept.
    Zone(ZoneStatus),
    /// Anything else.
    Opaque(Bytes),
}

/// An SW_ILS payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwIlsRepr {
    /// SW_RJT.
    Rjt {
        /// Reason.
        reason: SwRjtReason,
        /// Explanation.
        explanation: SwRjtExplanation,
        /// Vendor unique.
        vendor: u8,
    },
    /// SW_ACC.
    Acc(SwAcc),
    /// ELP.
    Elp(Elp),
    /// ESC.
    Esc(Esc),
    /// EFP.
    Efp(Efp),
    /// HLO.
    Hlo(Hlo),
    /// LSU.
    Lsu(Lsu),
    /// LSA.
    Lsa(Lsa),
    /// SW_RSCN.
    Rscn(SwRscn),
    /// MR.
    Mr(Mr),
    /// Any other command (DIA, RDI, BF, RCF, …) kept as bytes.
    Other(SwIlsCode, Bytes),
}

fn need(b: &[u8], n: usize) -> Result<(), WireError> {
    Ok(super::check_len(b, n)?)
}

fn wwn_at(b: &[u8], at: usize) -> Wwn {
    Wwn(be::u64_at(b, at))
}

fn fcid_at(b: &[u8], at: usize) -> FcId {
    FcId::new(u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]]))
}

fn zero(b: &[u8], what: &'static str) -> Result<(), WireError> {
    if b.iter().all(|&x| x == 0) {
        Ok(())
    } else {
        Err(WireError::InvalidField(what))
    }
}

fn parse_elp(b: &[u8]) -> Result<Elp, WireError> {
    need(b, 84)?;
    zero(&b[1..4], "ELP reserved")?;
    let plen = usize::from(be::u16_at(b, 82));
    if b.len() != 84 + plen {
        return Err(WireError::BadLength {
            what: "ELP flow control parameters",
            len: plen,
        });
    }
    let mut class_f = [0u8; 16];
    class_f.copy_from_slice(&b[32..48]);
    let mut classes = [[0u8; 4]; 3];
    for (i, c) in classes.iter_mut().enumerate() {
        c.copy_from_slice(&b[48 + 4 * i..52 + 4 * i]);
    }
    let mut reserved = [0u8; 20];
    reserved.copy_from_slice(&b[60..80]);
    Ok(Elp {
        revision: b[4],
        flags: be::u16_at(b, 5),
        bb_sc_n: b[7],
        r_a_tov: be::u32_at(b, 8),
        e_d_tov: be::u32_at(b, 12),
        port_name: wwn_at(b, 16),
        switch_name: wwn_at(b, 24),
        class_f,
        classes,
        reserved,
        flow_control_mode: be::u16_at(b, 80),
        flow_control: Bytes::copy_from_slice(&b[84..]),
    })
}

fn emit_elp(code: SwIlsCode, e: &Elp, out: &mut BytesMut) {
    out.put_u8(code.0);
    out.put_bytes(0, 3);
    out.put_u8(e.revision);
    out.put_u16(e.flags);
    out.put_u8(e.bb_sc_n);
    out.put_u32(e.r_a_tov);
    out.put_u32(e.e_d_tov);
    out.put_u64(e.port_name.0);
    out.put_u64(e.switch_name.0);
    out.put_slice(&e.class_f);
    for c in &e.classes {
        out.put_slice(c);
    }
    out.put_slice(&e.reserved);
    out.put_u16(e.flow_control_mode);
    out.put_u16(u16::try_from(e.flow_control.len()).unwrap_or(0));
    out.put_slice(&e.flow_control);
}

fn parse_efp(b: &[u8]) -> Result<Efp, WireError> {
    need(b, 16)?;
    let reclen = usize::from(b[1]);
    let plen = usize::from(be::u16_at(b, 2));
    if reclen != 16 || plen != b.len() || (plen - 16) % 16 != 0 {
        return Err(WireError::BadLength {
            what: "EFP payload",
            len: plen,
        });
    }
    zero(&b[4..7], "EFP reserved")?;
    let mut records = Vec::new();
    for r in b[16..].chunks_exact(16) {
        zero(&r[2..8], "EFP record reserved")?;
        records.push(EfpRecord {
            kind: r[0],
            domain: r[1],
            switch_name: wwn_at(r, 8),
        });
    }
    Ok(Efp {
        principal_priority: b[7],
        principal_name: wwn_at(b, 8),
        records,
    })
}

fn emit_efp(code: SwIlsCode, e: &Efp, out: &mut BytesMut) {
    out.put_u8(code.0);
    out.put_u8(16);
    out.put_u16(u16::try_from(16 + 16 * e.records.len()).unwrap_or(0));
    out.put_bytes(0, 3);
    out.put_u8(e.principal_priority);
    out.put_u64(e.principal_name.0);
    for r in &e.records {
        out.put_u8(r.kind);
        out.put_u8(r.domain);
        out.put_bytes(0, 6);
        out.put_u64(r.switch_name.0);
    }
}

fn parse_esc(b: &[u8], accept: bool) -> Result<Esc, WireError> {
    let mut vendor_id = [0u8; 8];
    if accept {
        need(b, 24)?;
        if b.len() != 24 {
            return Err(WireError::BadLength {
                what: "ESC accept",
                len: b.len(),
            });
        }
        zero(&b[1..4], "ESC reserved")?;
        zero(&b[20..22], "ESC reserved")?;
        vendor_id.copy_from_slice(&b[4..12]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[12..20]);
        return Ok(Esc {
            vendor_id,
            protocols: vec![(v, be::u16_at(b, 22))],
        });
    }
    need(b, 12)?;
    zero(&b[1..2], "ESC reserved")?;
    let plen = usize::from(be::u16_at(b, 2));
    if plen != b.len() || (plen - 12) % 12 != 0 {
        return Err(WireError::BadLength {
            what: "ESC payload",
            len: plen,
        });
    }
    vendor_id.copy_from_slice(&b[4..12]);
    let mut protocols = Vec::new();
    for d in b[12..].chunks_exact(12) {
        zero(&d[8..10], "ESC descriptor reserved")?;
        let mut v = [0u8; 8];
        v.copy_from_slice(&d[..8]);
        protocols.push((v, be::u16_at(d, 10)));
    }
    Ok(Esc {
        vendor_id,
        protocols,
    })
}

fn emit_esc(e: &Esc, accept: bool, out: &mut BytesMut) {
    if accept {
        out.put_u8(SwIlsCode::SW_ACC.0);
        out.put_bytes(0, 3);
        out.put_slice(&e.vendor_id);
        let (v, p) = e.protocols.first().copied().unwrap_or(([0; 8], 0));
        out.put_slice(&v);
        out.put_u16(0);
        out.put_u16(p);
        return;
    }
    out.put_u8(SwIlsCode::ESC.0);
    out.put_u8(0);
    out.put_u16(u16::try_from(12 + 12 * e.protocols.len()).unwrap_or(0));
    out.put_slice(&e.vendor_id);
    for (v, p) in &e.protocols {
        out.put_slice(v);
        out.put_u16(0);
        out.put_u16(*p);
    }
}

fn parse_fspf(b: &[u8]) -> Result<FspfHeader, WireError> {
    need(b, 20)?;
    zero(&b[1..4], "FSPF reserved")?;
    zero(&b[7..11], "FSPF reserved")?;
    Ok(FspfHeader {
        version: b[4],
        ar_number: b[5],
        auth_type: b[6],
        domain: b[11],
        auth: be::u64_at(b, 12),
    })
}

fn emit_fspf(code: SwIlsCode, h: &FspfHeader, out: &mut BytesMut) {
    out.put_u8(code.0);
    out.put_bytes(0, 3);
    out.put_u8(h.version);
    out.put_u8(h.ar_number);
    out.put_u8(h.auth_type);
    out.put_bytes(0, 4);
    out.put_u8(h.domain);
    out.put_u64(h.auth);
}

fn parse_lsr_header(b: &[u8]) -> Result<LsrHeader, WireError> {
    need(b, 24)?;
    zero(&b[1..2], "LSR reserved")?;
    Ok(LsrHeader {
        lsr_type: b[0],
        age: be::u16_at(b, 2),
        options: be::u32_at(b, 4),
        link_state_id: be::u32_at(b, 8),
        advertising_domain: be::u32_at(b, 12),
        incarnation: be::u32_at(b, 16),
        checksum: be::u16_at(b, 20),
        length: be::u16_at(b, 22),
    })
}

fn emit_lsr_header(h: &LsrHeader, out: &mut BytesMut) {
    out.put_u8(h.lsr_type);
    out.put_u8(0);
    out.put_u16(h.age);
    out.put_u32(h.options);
    out.put_u32(h.link_state_id);
    out.put_u32(h.advertising_domain);
    out.put_u32(h.incarnation);
    out.put_u16(h.checksum);
    out.put_u16(h.length);
}

fn parse_lsu(b: &[u8]) -> Result<Lsu, WireError> {
    let header = parse_fspf(b)?;
    need(b, 28)?;
    zero(&b[20..23], "LSU reserved")?;
    let n = be::u32_at(b, 24) as usize;
    let mut at = 28;
    let mut records = Vec::new();
    for _ in 0..n {
        let rest = b.get(at..).unwrap_or(&[]);
        let h = parse_lsr_header(rest)?;
        need(rest, 28)?;
        zero(&rest[24..26], "LSR reserved")?;
        let nl = usize::from(be::u16_at(rest, 26));
        need(rest, 28 + 16 * nl)?;
        let mut links = Vec::with_capacity(nl);
        for d in rest[28..28 + 16 * nl].chunks_exact(16) {
            zero(&d[13..14], "link descriptor reserved")?;
            links.push(LinkDescriptor {
                link_id: be::u32_at(d, 0),
                output_port: be::u32_at(d, 4),
                neighbor_port: be::u32_at(d, 8),
                link_type: d[12],
                cost: be::u16_at(d, 14),
            });
        }
        at += 28 + 16 * nl;
        records.push(Lsr { header: h, links });
    }
    if at != b.len() {
        return Err(WireError::BadLength {
            what: "LSU payload",
            len: b.len(),
        });
    }
    Ok(Lsu {
        header,
        flags: b[23],
        records,
    })
}

fn parse_lsa(b: &[u8]) -> Result<Lsa, WireError> {
    let header = parse_fspf(b)?;
    need(b, 28)?;
    zero(&b[20..23], "LSA reserved")?;
    let n = be::u32_at(b, 24) as usize;
    if b.len() != 28 + 24 * n.min(1 << 16) {
        return Err(WireError::BadLength {
            what: "LSA payload",
            len: b.len(),
        });
    }
    let headers = b[28..]
        .chunks_exact(24)
        .map(parse_lsr_header)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Lsa {
        header,
        flags: b[23],
        headers,
    })
}

fn parse_rscn(b: &[u8]) -> Result<SwRscn, WireError> {
    need(b, 16)?;
    zero(&b[1..4], "SW_RSCN reserved")?;
    let n = be::u32_at(b, 12) as usize;
    if b.len() != 16 + 20 * n.min(1 << 16) {
        return Err(WireError::BadLength {
            what: "SW_RSCN payload",
            len: b.len(),
        });
    }
    let devices = b[16..]
        .chunks_exact(20)
        .map(|d| RscnDevice {
            state: d[0],
            port_id: fcid_at(d, 1),
            port_name: wwn_at(d, 4),
            node_name: wwn_at(d, 12),
        })
        .collect();
    Ok(SwRscn {
        event_format: b[4],
        affected: fcid_at(b, 5),
        detection: be::u32_at(b, 8),
        devices,
    })
}

/// Parses a name field (length byte, 3 reserved, name) at `b`.
fn parse_name(b: &[u8]) -> Result<(Bytes, usize), WireError> {
    need(b, 4)?;
    let n = usize::from(b[0]);
    zero(&b[1..4], "zone name reserved")?;
    need(b, 4 + n)?;
    Ok((Bytes::copy_from_slice(&b[4..4 + n]), 4 + n))
}

fn emit_name(name: &[u8], out: &mut BytesMut) {
    out.put_u8(u8::try_from(name.len()).unwrap_or(0));
    out.put_bytes(0, 3);
    out.put_slice(name);
}

fn parse_zone_object(b: &[u8], depth: u8) -> Result<(ZoneObject, usize), WireError> {
    need(b, 4)?;
    zero(&b[2..4], "zone object reserved")?;
    let (name, nlen) = parse_name(&b[4..])?;
    let mut at = 4 + nlen;
    need(b, at + 4)?;
    let count = be::u32_at(b, at) as usize;
    at += 4;
    let mut members = Vec::new();
    for _ in 0..count {
        if b[0] == 1 {
            // A zone set's members are zone objects: not nested further.
            if depth > 0 {
                return Err(WireError::InvalidField("nested zone set"));
            }
            return Err(WireError::InvalidField(
                "zone set inside an active zone set",
            ));
        }
        let m = b.get(at..).unwrap_or(&[]);
        need(m, 4)?;
        let idlen = usize::from(m[3]);
        need(m, 4 + idlen)?;
        zero(&m[1..2], "zone member reserved")?;
        members.push(ZoneMemberObj {
            kind: m[0],
            flags: m[2],
            id: Bytes::copy_from_slice(&m[4..4 + idlen]),
        });
        at += 4 + idlen;
    }
    Ok((
        ZoneObject {
            kind: b[0],
            protocol: b[1],
            name,
            members,
        },
        at,
    ))
}

fn emit_zone_object(z: &ZoneObject, out: &mut BytesMut) {
    out.put_u8(z.kind);
    out.put_u8(z.protocol);
    out.put_u16(0);
    emit_name(&z.name, out);
    out.put_u32(u32::try_from(z.members.len()).unwrap_or(0));
    for m in &z.members {
        out.put_u8(m.kind);
        out.put_u8(0);
        out.put_u8(m.flags);
        out.put_u8(u8::try_from(m.id.len()).unwrap_or(0));
        out.put_slice(&m.id);
    }
}

fn parse_mr(b: &[u8]) -> Result<Mr, WireError> {
    need(b, 8)?;
    zero(&b[1..2], "MR reserved")?;
    let zlen = usize::from(be::u16_at(b, 2));
    let (active, at) = if zlen == 0 {
        (None, 4)
    } else {
        let (name, nlen) = parse_name(&b[4..])?;
        let mut at = 4 + nlen;
        need(b, at + 4)?;
        let count = be::u32_at(b, at) as usize;
        at += 4;
        let mut zones = Vec::new();
        for _ in 0..count {
            let (z, n) = parse_zone_object(b.get(at..).unwrap_or(&[]), 0)?;
            zones.push(z);
            at += n;
        }
        if at - 4 != zlen {
            return Err(WireError::BadLength {
                what: "MR active zone set",
                len: zlen,
            });
        }
        (Some((name, zones)), at)
    };
    need(b, at + 4)?;
    let full_len = be::u32_at(b, at) as usize;
    if b.len() != at + 4 + full_len.min(b.len()) {
        return Err(WireError::BadLength {
            what: "MR full zone set",
            len: full_len,
        });
    }
    Ok(Mr {
        active,
        full: Bytes::copy_from_slice(&b[at + 4..]),
    })
}

fn emit_mr(m: &Mr, out: &mut BytesMut) {
    out.put_u8(SwIlsCode::MR.0);
    out.put_u8(0);
    match &m.active {
        None => out.put_u16(0),
        Some((name, zones)) => {
            let mut body = BytesMut::new();
            emit_name(name, &mut body);
            body.put_u32(u32::try_from(zones.len()).unwrap_or(0));
            for z in zones {
                emit_zone_object(z, &mut body);
            }
            out.put_u16(u16::try_from(body.len()).unwrap_or(0));
            out.put_slice(&body);
        }
    }
    out.put_u32(u32::try_from(m.full.len()).unwrap_or(0));
    out.put_slice(&m.full);
}

impl SwIlsRepr {
    /// The command code carried in byte 0.
    pub fn code(&self) -> SwIlsCode {
        match self {
            SwIlsRepr::Rjt { .. } => SwIlsCode::SW_RJT,
            SwIlsRepr::Acc(_) => SwIlsCode::SW_ACC,
            SwIlsRepr::Elp(_) => SwIlsCode::ELP,
            SwIlsRepr::Esc(_) => SwIlsCode::ESC,
            SwIlsRepr::Efp(_) => SwIlsCode::EFP,
            SwIlsRepr::Hlo(_) => SwIlsCode::HLO,
            SwIlsRepr::Lsu(_) => SwIlsCode::LSU,
            SwIlsRepr::Lsa(_) => SwIlsCode::LSA,
            SwIlsRepr::Rscn(_) => SwIlsCode::SW_RSCN,
            SwIlsRepr::Mr(_) => SwIlsCode::MR,
            SwIlsRepr::Other(c, _) => *c,
        }
    }

    /// Parses a payload. A reply (SW_ACC) needs the code of the request it
    /// answers (`answering`); without it the accept is [`SwAcc::Opaque`].
    pub fn parse(b: &Bytes, answering: Option<SwIlsCode>) -> Result<SwIlsRepr, WireError> {
        need(b, 4)?;
        if b.len() > unifab_fc::wire::MAX_PAYLOAD {
            return Err(WireError::BadLength {
                what: "SW_ILS payload",
                len: b.len(),
            });
        }
        let code = SwIlsCode(b[0]);
        Ok(match code {
            SwIlsCode::SW_RJT => {
                if b.len() != 8 {
                    return Err(WireError::BadLength {
                        what: "SW_RJT",
                        len: b.len(),
                    });
                }
                zero(&b[1..5], "SW_RJT reserved")?;
                SwIlsRepr::Rjt {
                    reason: SwRjtReason(b[5]),
                    explanation: SwRjtExplanation(b[6]),
                    vendor: b[7],
                }
            }
            SwIlsCode::SW_ACC => SwIlsRepr::Acc(match answering {
                Some(SwIlsCode::ELP) => SwAcc::Elp(parse_elp(b)?),
                Some(SwIlsCode::EFP) => SwAcc::Efp(parse_efp(b)?),
                Some(SwIlsCode::ESC) => SwAcc::Esc(parse_esc(b, true)?),
                Some(SwIlsCode::MR) if b.len() == 8 => {
                    zero(&b[1..5], "MR accept reserved")?;
                    SwAcc::Zone(ZoneStatus {
                        status: b[5],
                        reason: b[6],
                        vendor: b[7],
                    })
                }
                _ if b.len() == 4 && b[1..4] == [0, 0, 0] => SwAcc::Plain,
                _ => SwAcc::Opaque(b.clone()),
            }),
            SwIlsCode::ELP => SwIlsRepr::Elp(parse_elp(b)?),
            SwIlsCode::EFP => SwIlsRepr::Efp(parse_efp(b)?),
            SwIlsCode::ESC => SwIlsRepr::Esc(parse_esc(b, false)?),
            SwIlsCode::HLO => {
                let header = parse_fspf(b)?;
                if b.len() != 40 {
                    return Err(WireError::BadLength {
                        what: "HLO",
                        len: b.len(),
                    });
                }
                SwIlsRepr::Hlo(Hlo {
                    header,
                    options: be::u32_at(b, 20),
                    hello_interval: be::u32_at(b, 24),
                    dead_interval: be::u32_at(b, 28),
                    recipient_domain: be::u32_at(b, 32),
                    port_index: be::u32_at(b, 36),
                })
            }
            SwIlsCode::LSU => SwIlsRepr::Lsu(parse_lsu(b)?),
            SwIlsCode::LSA => SwIlsRepr::Lsa(parse_lsa(b)?),
            SwIlsCode::SW_RSCN => SwIlsRepr::Rscn(parse_rscn(b)?),
            SwIlsCode::MR => SwIlsRepr::Mr(parse_mr(b)?),
            other => SwIlsRepr::Other(other, b.clone()),
        })
    }

    /// Encodes the payload.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(128);
        match self {
            SwIlsRepr::Rjt {
                reason,
                explanation,
                vendor,
            } => {
                out.put_u8(SwIlsCode::SW_RJT.0);
                out.put_bytes(0, 4);
                out.put_u8(reason.0);
                out.put_u8(explanation.0);
                out.put_u8(*vendor);
            }
            SwIlsRepr::Acc(a) => match a {
                SwAcc::Plain => {
                    out.put_u8(SwIlsCode::SW_ACC.0);
                    out.put_bytes(0, 3);
                }
                SwAcc::Elp(e) => emit_elp(SwIlsCode::SW_ACC, e, &mut out),
                SwAcc::Efp(e) => emit_efp(SwIlsCode::SW_ACC, e, &mut out),
                SwAcc::Esc(e) => emit_esc(e, true, &mut out),
                SwAcc::Zone(z) => {
                    out.put_u8(SwIlsCode::SW_ACC.0);
                    out.put_bytes(0, 4);
                    out.put_u8(z.status);
                    out.put_u8(z.reason);
                    out.put_u8(z.vendor);
                }
                SwAcc::Opaque(b) => out.put_slice(b),
            },
            SwIlsRepr::Elp(e) => emit_elp(SwIlsCode::ELP, e, &mut out),
            SwIlsRepr::Esc(e) => emit_esc(e, false, &mut out),
            SwIlsRepr::Efp(e) => emit_efp(SwIlsCode::EFP, e, &mut out),
            SwIlsRepr::Hlo(h) => {
                emit_fspf(SwIlsCode::HLO, &h.header, &mut out);
                out.put_u32(h.options);
                out.put_u32(h.hello_interval);
                out.put_u32(h.dead_interval);
                out.put_u32(h.recipient_domain);
                out.put_u32(h.port_index);
            }
            SwIlsRepr::Lsu(l) => {
                emit_fspf(SwIlsCode::LSU, &l.header, &mut out);
                out.put_bytes(0, 3);
                out.put_u8(l.flags);
                out.put_u32(u32::try_from(l.records.len()).unwrap_or(0));
                for r in &l.records {
                    emit_lsr_header(&r.header, &mut out);
                    out.put_u16(0);
                    out.put_u16(u16::try_from(r.links.len()).unwrap_or(0));
                    for d in &r.links {
                        out.put_u32(d.link_id);
                        out.put_u32(d.output_port);
                        out.put_u32(d.neighbor_port);
                        out.put_u8(d.link_type);
                        out.put_u8(0);
                        out.put_u16(d.cost);
                    }
                }
            }
            SwIlsRepr::Lsa(l) => {
                emit_fspf(SwIlsCode::LSA, &l.header, &mut out);
                out.put_bytes(0, 3);
                out.put_u8(l.flags);
                out.put_u32(u32::try_from(l.headers.len()).unwrap_or(0));
                for h in &l.headers {
                    emit_lsr_header(h, &mut out);
                }
            }
            SwIlsRepr::Rscn(r) => {
                out.put_u8(SwIlsCode::SW_RSCN.0);
                out.put_bytes(0, 3);
                out.put_u8(r.event_format);
                out.put_slice(&r.affected.to_bytes());
                out.put_u32(r.detection);
                out.put_u32(u32::try_from(r.devices.len()).unwrap_or(0));
                for d in &r.devices {
                    out.put_u8(d.state);
                    out.put_slice(&d.port_id.to_bytes());
                    out.put_u64(d.port_name.0);
                    out.put_u64(d.node_name.0);
                }
            }
            SwIlsRepr::Mr(m) => emit_mr(m, &mut out),
            SwIlsRepr::Other(_, b) => out.put_slice(b),
        }
        out.freeze()
    }

    /// The SW_RJT a malformed request gets.
    pub fn reject_for(e: &WireError) -> SwIlsRepr {
        let (reason, explanation) = match e {
            WireError::Truncated { .. } | WireError::BadLength { .. } => {
                (SwRjtReason::INVALID_SIZE, SwRjtExplanation::NONE)
            }
            _ => (SwRjtReason::PROTOCOL_ERROR, SwRjtExplanation::NONE),
        };
        SwIlsRepr::Rjt {
            reason,
            explanation,
            vendor: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(r: &SwIlsRepr, answering: Option<SwIlsCode>) {
        let b = r.to_bytes();
        let p = SwIlsRepr::parse(&b, answering).unwrap();
        assert_eq!(&p, r);
        assert_eq!(p.to_bytes(), b);
        for n in 0..b.len() {
            let t = b.slice(..n);
            if let Ok(x) = SwIlsRepr::parse(&t, answering) {
                // Only an opaque body may parse from a prefix.
                assert!(
                    matches!(
                        x,
                        SwIlsRepr::Other(..) | SwIlsRepr::Acc(SwAcc::Opaque(_) | SwAcc::Plain)
                    ),
                    "prefix {n} of {r:?} parsed as {x:?}"
                );
            }
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let elp = Elp::unifab(
            Wwn(0x2000_0000_0000_0001),
            Wwn(0x1000_0000_0000_0001),
            10_000,
            2_000,
        );
        assert_eq!(SwIlsRepr::Elp(elp.clone()).to_bytes().len(), 104);
        rt(&SwIlsRepr::Elp(elp.clone()), None);
        rt(&SwIlsRepr::Acc(SwAcc::Elp(elp)), Some(SwIlsCode::ELP));
        let esc = Esc {
            vendor_id: *b"UNIFAB  ",
            protocols: vec![(*b"T11     ", PROTOCOL_FSPF)],
        };
        rt(&SwIlsRepr::Esc(esc.clone()), None);
        rt(&SwIlsRepr::Acc(SwAcc::Esc(esc)), Some(SwIlsCode::ESC));
        let efp = Efp {
            principal_priority: 0xfe,
            principal_name: Wwn(1),
            records: vec![
                EfpRecord {
                    kind: 1,
                    domain: 1,
                    switch_name: Wwn(1),
                },
                EfpRecord {
                    kind: 1,
                    domain: 2,
                    switch_name: Wwn(2),
                },
            ],
        };
        rt(&SwIlsRepr::Efp(efp.clone()), None);
        rt(&SwIlsRepr::Acc(SwAcc::Efp(efp)), Some(SwIlsCode::EFP));
        let hdr = FspfHeader {
            version: 2,
            domain: 3,
            ..FspfHeader::default()
        };
        rt(
            &SwIlsRepr::Hlo(Hlo {
                header: hdr,
                options: 0,
                hello_interval: 20,
                dead_interval: 80,
                recipient_domain: 0xffff_ffff,
                port_index: 1,
            }),
            None,
        );
        let lsr = Lsr {
            header: LsrHeader {
                lsr_type: 1,
                link_state_id: 3,
                advertising_domain: 3,
                incarnation: 0x8000_0001,
                length: 44,
                ..LsrHeader::default()
            },
            links: vec![LinkDescriptor {
                link_id: 4,
                output_port: 1,
                neighbor_port: 2,
                link_type: 1,
                cost: 500,
            }],
        };
        rt(
            &SwIlsRepr::Lsu(Lsu {
                header: hdr,
                flags: 0,
                records: vec![lsr.clone()],
            }),
            None,
        );
        rt(
            &SwIlsRepr::Lsa(Lsa {
                header: hdr,
                flags: 0,
                headers: vec![lsr.header],
            }),
            None,
        );
        rt(
            &SwIlsRepr::Rscn(SwRscn {
                event_format: 0,
                affected: FcId::new(0x010200),
                detection: 1,
                devices: vec![RscnDevice {
                    state: 1,
                    port_id: FcId::new(0x010200),
                    port_name: Wwn(5),
                    node_name: Wwn(6),
                }],
            }),
            None,
        );
        rt(
            &SwIlsRepr::Mr(Mr {
                active: None,
                full: Bytes::from_static(&[0, 0, 0, 0]),
            }),
            None,
        );
        rt(
            &SwIlsRepr::Mr(Mr {
                active: Some((
                    padded_name("cfg"),
                    vec![ZoneObject {
                        kind: 2,
                        protocol: 0,
                        name: padded_name("zone_a"),
                        members: vec![ZoneMemberObj {
                            kind: 1,
                            flags: 0,
                            id: Bytes::copy_from_slice(&7u64.to_be_bytes()),
                        }],
                    }],
                )),
                full: Bytes::new(),
            }),
            None,
        );
        rt(
            &SwIlsRepr::Acc(SwAcc::Zone(ZoneStatus {
                status: 2,
                reason: 0x0a,
                vendor: 0,
            })),
            Some(SwIlsCode::MR),
        );
        rt(
            &SwIlsRepr::Rjt {
                reason: SwRjtReason::UNABLE_TO_PERFORM,
                explanation: SwRjtExplanation::DOMAIN_UNAVAILABLE,
                vendor: 0,
            },
            None,
        );
        rt(&SwIlsRepr::Acc(SwAcc::Plain), None);
    }
}
