//! The FC-GS common transport (CT_IU, FC-GS-7 §4.3) and the name server
//! (directory service, subtype 02h) requests and accepts unifab speaks:
//!
//! - registrations: RPN_ID, RNN_ID, RFT_ID, RFF_ID, RSPN_ID, RSNN_NN, DA_ID;
//! - queries: GA_NXT, GID_FT, GPN_FT, GPN_ID, GNN_ID, GFF_ID, GFT_ID,
//!   GID_PN, GSPN_ID, GSNN_NN.
//!
//! An accept's body depends on the request it answers: [`CtIu::parse`]
//! takes that request's command code when known.

use std::fmt;

use bytes::Bytes;
use nom::number::complete::{be_u8, be_u32, be_u64};

use super::be;
use super::header::FcType;
use super::{FcId, WireError, Wwn, check_len};

/// Length of the basic CT_IU preamble.
pub const PREAMBLE_LEN: usize = 16;

/// GS_Type (FC-GS-7 Table 3). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GsType(pub u8);

#[allow(missing_docs)]
impl GsType {
    pub const ALIAS: GsType = GsType(0xf8);
    pub const MANAGEMENT: GsType = GsType(0xfa);
    pub const TIME: GsType = GsType(0xfb);
    pub const DIRECTORY: GsType = GsType(0xfc);
}

/// GS_Subtype. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GsSubtype(pub u8);

#[allow(missing_docs)]
impl GsSubtype {
    /// Directory service: the name server.
    pub const NAME_SERVER: GsSubtype = GsSubtype(0x02);
}

/// A CT command/response code. Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CtCommand(pub u16);

#[allow(missing_docs)]
impl CtCommand {
    pub const FS_RJT: CtCommand = CtCommand(0x8001);
    pub const FS_ACC: CtCommand = CtCommand(0x8002);
    pub const GA_NXT: CtCommand = CtCommand(0x0100);
    pub const GPN_ID: CtCommand = CtCommand(0x0112);
    pub const GNN_ID: CtCommand = CtCommand(0x0113);
    pub const GFT_ID: CtCommand = CtCommand(0x0117);
    pub const GSPN_ID: CtCommand = CtCommand(0x0118);
    pub const GFF_ID: CtCommand = CtCommand(0x011f);
    pub const GID_PN: CtCommand = CtCommand(0x0121);
    pub const GSNN_NN: CtCommand = CtCommand(0x0139);
    pub const GID_FT: CtCommand = CtCommand(0x0171);
    pub const GPN_FT: CtCommand = CtCommand(0x0172);
    pub const RPN_ID: CtCommand = CtCommand(0x0212);
    pub const RNN_ID: CtCommand = CtCommand(0x0213);
    pub const RFT_ID: CtCommand = CtCommand(0x0217);
    pub const RSPN_ID: CtCommand = CtCommand(0x0218);
    pub const RFF_ID: CtCommand = CtCommand(0x021f);
    pub const RSNN_NN: CtCommand = CtCommand(0x0239);
    pub const DA_ID: CtCommand = CtCommand(0x0300);

    /// The standard's name, for the codes unifab knows.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            CtCommand::FS_RJT => "FS_RJT",
            CtCommand::FS_ACC => "FS_ACC",
            CtCommand::GA_NXT => "GA_NXT",
            CtCommand::GPN_ID => "GPN_ID",
            CtCommand::GNN_ID => "GNN_ID",
            CtCommand::GFT_ID => "GFT_ID",
            CtCommand::GSPN_ID => "GSPN_ID",
            CtCommand::GFF_ID => "GFF_ID",
            CtCommand::GID_PN => "GID_PN",
            CtCommand::GSNN_NN => "GSNN_NN",
            CtCommand::GID_FT => "GID_FT",
            CtCommand::GPN_FT => "GPN_FT",
            CtCommand::RPN_ID => "RPN_ID",
            CtCommand::RNN_ID => "RNN_ID",
            CtCommand::RFT_ID => "RFT_ID",
            CtCommand::RSPN_ID => "RSPN_ID",
            CtCommand::RFF_ID => "RFF_ID",
            CtCommand::RSNN_NN => "RSNN_NN",
            CtCommand::DA_ID => "DA_ID",
            _ => return None,
        })
    }
}

impl fmt::Debug for CtCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CtCommand({:#06x})", self.0),
        }
    }
}

/// CT reject reason codes (FC-GS-7 Table 8). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtReason(pub u8);

#[allow(missing_docs)]
impl CtReason {
    pub const INVALID_COMMAND_CODE: CtReason = CtReason(0x01);
    pub const INVALID_VERSION_LEVEL: CtReason = CtReason(0x02);
    pub const LOGICAL_ERROR: CtReason = CtReason(0x03);
    pub const INVALID_IU_SIZE: CtReason = CtReason(0x04);
    pub const LOGICAL_BUSY: CtReason = CtReason(0x05);
    pub const PROTOCOL_ERROR: CtReason = CtReason(0x07);
    pub const UNABLE_TO_PERFORM: CtReason = CtReason(0x09);
    pub const COMMAND_NOT_SUPPORTED: CtReason = CtReason(0x0b);
    pub const SERVER_NOT_AVAILABLE: CtReason = CtReason(0x0d);
    pub const VENDOR_UNIQUE: CtReason = CtReason(0xff);
}

/// Name server reject explanations (FC-GS-7 Table 163). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NsReason(pub u8);

#[allow(missing_docs)]
impl NsReason {
    pub const NONE: NsReason = NsReason(0x00);
    pub const PORT_ID_NOT_REGISTERED: NsReason = NsReason(0x01);
    pub const PORT_NAME_NOT_REGISTERED: NsReason = NsReason(0x02);
    pub const NODE_NAME_NOT_REGISTERED: NsReason = NsReason(0x03);
    pub const CLASS_OF_SERVICE_NOT_REGISTERED: NsReason = NsReason(0x04);
    pub const FC4_TYPES_NOT_REGISTERED: NsReason = NsReason(0x07);
    pub const SYMBOLIC_PORT_NAME_NOT_REGISTERED: NsReason = NsReason(0x08);
    pub const SYMBOLIC_NODE_NAME_NOT_REGISTERED: NsReason = NsReason(0x09);
    pub const PORT_TYPE_NOT_REGISTERED: NsReason = NsReason(0x0a);
    pub const FC4_FEATURES_NOT_REGISTERED: NsReason = NsReason(0x0f);
    pub const ACCESS_DENIED: NsReason = NsReason(0x10);
    pub const UNACCEPTABLE_PORT_ID: NsReason = NsReason(0x11);
    pub const DATABASE_EMPTY: NsReason = NsReason(0x12);
    pub const NO_OBJECT_IN_SCOPE: NsReason = NsReason(0x13);
}

/// The CT_IU preamble (FC-GS-7 Table 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtPreamble {
    /// Revision (01h).
    pub revision: u8,
    /// IN_ID: the original requester's N_Port_ID (usually 0).
    pub in_id: FcId,
    /// GS_Type.
    pub gs_type: GsType,
    /// GS_Subtype.
    pub gs_subtype: GsSubtype,
    /// Options.
    pub options: u8,
    /// Command (request) or response code (FS_ACC / FS_RJT).
    pub command: CtCommand,
    /// Maximum size of the accept (request) or residual (response), in
    /// words; 0 = no limit.
    pub max_residual_size: u16,
    /// Fragment ID.
    pub fragment_id: u8,
    /// Reject reason code.
    pub reason: CtReason,
    /// Reject explanation.
    pub explanation: NsReason,
    /// Vendor unique.
    pub vendor: u8,
}

impl CtPreamble {
    /// A name server request preamble.
    pub fn name_server(command: CtCommand) -> CtPreamble {
        CtPreamble {
            revision: 1,
            gs_type: GsType::DIRECTORY,
            gs_subtype: GsSubtype::NAME_SERVER,
            command,
            ..CtPreamble::default()
        }
    }

    /// The preamble of an accept to this request.
    pub fn accept(&self) -> CtPreamble {
        CtPreamble {
            command: CtCommand::FS_ACC,
            max_residual_size: 0,
            reason: CtReason(0),
            explanation: NsReason(0),
            vendor: 0,
            ..*self
        }
    }

    /// The preamble of a reject to this request.
    pub fn reject(&self, reason: CtReason, explanation: NsReason) -> CtPreamble {
        CtPreamble {
            command: CtCommand::FS_RJT,
            max_residual_size: 0,
            reason,
            explanation,
            vendor: 0,
            ..*self
        }
    }

    fn parse(p: &[u8]) -> Result<CtPreamble, WireError> {
        check_len(p, PREAMBLE_LEN)?;
        Ok(CtPreamble {
            revision: p[0],
            in_id: FcId::new(be::u24_at(p, 1)),
            gs_type: GsType(p[4]),
            gs_subtype: GsSubtype(p[5]),
            options: p[6],
            command: CtCommand(be::u16_at(p, 8)),
            max_residual_size: be::u16_at(p, 10),
            fragment_id: p[12],
            reason: CtReason(p[13]),
            explanation: NsReason(p[14]),
            vendor: p[15],
        })
    }

    fn emit(&self, p: &mut [u8]) {
        p[0] = self.revision;
        be::put_u24(p, 1, self.in_id.get());
        p[4] = self.gs_type.0;
        p[5] = self.gs_subtype.0;
        p[6] = self.options;
        p[7] = 0;
        be::put_u16(p, 8, self.command.0);
        be::put_u16(p, 10, self.max_residual_size);
        p[12] = self.fragment_id;
        p[13] = self.reason.0;
        p[14] = self.explanation.0;
        p[15] = self.vendor;
    }
}

/// A CT reject as the single place that decides how a malformed request
/// is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtReject {
    /// Reason.
    pub reason: CtReason,
    /// Explanation.
    pub explanation: NsReason,
}

impl From<&WireError> for CtReject {
    fn from(e: &WireError) -> CtReject {
        match e {
            WireError::Truncated { .. } | WireError::BadLength { .. } => CtReject {
                reason: CtReason::INVALID_IU_SIZE,
                explanation: NsReason::NONE,
            },
            _ => CtReject {
                reason: CtReason::PROTOCOL_ERROR,
                explanation: NsReason::NONE,
            },
        }
    }
}

/// The FC-4 TYPEs bitmap (32 bytes): type `t` is bit `t mod 32` of
/// big-endian word `t / 32`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fc4Types(pub [u8; 32]);

impl Fc4Types {
    fn at(t: FcType) -> (usize, u8) {
        let t = usize::from(t.0);
        let (word, bit) = (t / 32, t % 32);
        (word * 4 + 3 - bit / 8, 1 << (bit % 8))
    }

    /// Sets type `t`.
    pub fn insert(&mut self, t: FcType) {
        let (i, m) = Self::at(t);
        self.0[i] |= m;
    }

    /// Is type `t` set?
    pub fn contains(&self, t: FcType) -> bool {
        let (i, m) = Self::at(t);
        self.0[i] & m != 0
    }

    /// A bitmap with one type.
    pub fn of(t: FcType) -> Fc4Types {
        let mut s = Fc4Types::default();
        s.insert(t);
        s
    }
}

impl fmt::Debug for Fc4Types {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: Vec<u8> = (0..=255u8).filter(|t| self.contains(FcType(*t))).collect();
        write!(f, "Fc4Types({set:02x?})")
    }
}

/// FC-4 features (128 bytes): four bits per FC-4 type, type `t` in bits
/// `4*(t mod 8)` of big-endian word `t / 8`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fc4Features(pub [u8; 128]);

impl Default for Fc4Features {
    fn default() -> Self {
        Fc4Features([0; 128])
    }
}

/// FCP's FC-4 feature bits.
#[allow(missing_docs)]
pub mod fcp_features {
    pub const TARGET: u8 = 0x1;
    pub const INITIATOR: u8 = 0x2;
}

impl Fc4Features {
    fn at(t: FcType) -> (usize, u32) {
        let t = usize::from(t.0);
        let (word, shift) = (t / 8, (t % 8) * 4);
        (word * 4 + 3 - shift / 8, (shift % 8) as u32)
    }

    /// The feature bits of type `t`.
    pub fn get(&self, t: FcType) -> u8 {
        let (i, s) = Self::at(t);
        (self.0[i] >> s) & 0x0f
    }

    /// Sets the feature bits of type `t`.
    pub fn set(&mut self, t: FcType, v: u8) {
        let (i, s) = Self::at(t);
        self.0[i] = (self.0[i] & !(0x0f << s)) | ((v & 0x0f) << s);
    }
}

impl fmt::Debug for Fc4Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set: Vec<(u8, u8)> = (0..=255u8)
            .filter_map(|t| {
                let v = self.get(FcType(t));
                (v != 0).then_some((t, v))
            })
            .collect();
        write!(f, "Fc4Features({set:02x?})")
    }
}

/// Port scope of GID_FT / GPN_FT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FtScope {
    /// Domain ID scope (0 = whole fabric).
    pub domain: u8,
    /// Area ID scope (0 = whole domain).
    pub area: u8,
    /// The FC-4 TYPE asked about.
    pub fc_type: FcType,
}

/// A name server request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsRequest {
    /// GA_NXT: the object after this port ID.
    GaNxt(FcId),
    /// GPN_ID.
    GpnId(FcId),
    /// GNN_ID.
    GnnId(FcId),
    /// GFT_ID.
    GftId(FcId),
    /// GSPN_ID.
    GspnId(FcId),
    /// GFF_ID.
    GffId(FcId),
    /// GID_PN.
    GidPn(Wwn),
    /// GSNN_NN.
    GsnnNn(Wwn),
    /// GID_FT.
    GidFt(FtScope),
    /// GPN_FT.
    GpnFt(FtScope),
    /// RPN_ID.
    RpnId {
        /// Port.
        port_id: FcId,
        /// Port name.
        port_name: Wwn,
    },
    /// RNN_ID.
    RnnId {
        /// Port.
        port_id: FcId,
        /// Node name.
        node_name: Wwn,
    },
    /// RFT_ID.
    RftId {
        /// Port.
        port_id: FcId,
        /// FC-4 types.
        types: Fc4Types,
    },
    /// RFF_ID.
    RffId {
        /// Port.
        port_id: FcId,
        /// FC-4 feature bits for `fc_type`.
        features: u8,
        /// The FC-4 type they apply to.
        fc_type: FcType,
    },
    /// RSPN_ID.
    RspnId {
        /// Port.
        port_id: FcId,
        /// Symbolic port name (at most 255 bytes).
        name: Bytes,
    },
    /// RSNN_NN.
    RsnnNn {
        /// Node name.
        node_name: Wwn,
        /// Symbolic node name (at most 255 bytes).
        name: Bytes,
    },
    /// DA_ID: deregister everything of a port.
    DaId(FcId),
}

impl NsRequest {
    /// The command code.
    pub fn command(&self) -> CtCommand {
        match self {
            NsRequest::GaNxt(_) => CtCommand::GA_NXT,
            NsRequest::GpnId(_) => CtCommand::GPN_ID,
            NsRequest::GnnId(_) => CtCommand::GNN_ID,
            NsRequest::GftId(_) => CtCommand::GFT_ID,
            NsRequest::GspnId(_) => CtCommand::GSPN_ID,
            NsRequest::GffId(_) => CtCommand::GFF_ID,
            NsRequest::GidPn(_) => CtCommand::GID_PN,
            NsRequest::GsnnNn(_) => CtCommand::GSNN_NN,
            NsRequest::GidFt(_) => CtCommand::GID_FT,
            NsRequest::GpnFt(_) => CtCommand::GPN_FT,
            NsRequest::RpnId { .. } => CtCommand::RPN_ID,
            NsRequest::RnnId { .. } => CtCommand::RNN_ID,
            NsRequest::RftId { .. } => CtCommand::RFT_ID,
            NsRequest::RffId { .. } => CtCommand::RFF_ID,
            NsRequest::RspnId { .. } => CtCommand::RSPN_ID,
            NsRequest::RsnnNn { .. } => CtCommand::RSNN_NN,
            NsRequest::DaId(_) => CtCommand::DA_ID,
        }
    }
}

/// One entry of a GID_FT / GPN_FT accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PortEntry {
    /// Control byte bit 7: the last entry.
    pub last: bool,
    /// Port ID.
    pub port_id: FcId,
    /// Port name (GPN_FT only).
    pub port_name: Wwn,
}

/// The GA_NXT accept object (620 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsObject {
    /// Port type (01h N_Port, 7Fh Nx_Port, …).
    pub port_type: u8,
    /// Port ID.
    pub port_id: FcId,
    /// Port name.
    pub port_name: Wwn,
    /// Symbolic port name.
    pub symbolic_port_name: Bytes,
    /// Node name.
    pub node_name: Wwn,
    /// Symbolic node name.
    pub symbolic_node_name: Bytes,
    /// Initial process associator.
    pub initial_process_associator: u64,
    /// IP address (node).
    pub ip_address_node: [u8; 16],
    /// Class of service bits.
    pub class_of_service: u32,
    /// FC-4 types.
    pub fc4_types: Fc4Types,
    /// IP address (port).
    pub ip_address_port: [u8; 16],
    /// Fabric port name.
    pub fabric_port_name: Wwn,
    /// Hard address.
    pub hard_address: FcId,
}

/// GA_NXT accept object length.
pub const NS_OBJECT_LEN: usize = 620;

/// A name server accept body, by the request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsAccept {
    /// Registrations and DA_ID: nothing after the preamble.
    Empty,
    /// GID_FT.
    PortIds(Vec<PortEntry>),
    /// GPN_FT.
    PortNames(Vec<PortEntry>),
    /// GPN_ID or GNN_ID.
    Name(Wwn),
    /// GID_PN.
    PortId(FcId),
    /// GSPN_ID or GSNN_NN.
    SymbolicName(Bytes),
    /// GFT_ID.
    Types(Fc4Types),
    /// GFF_ID.
    Features(Box<Fc4Features>),
    /// GA_NXT.
    Object(Box<NsObject>),
}

/// The body of a CT_IU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtBody {
    /// A name server request.
    Request(NsRequest),
    /// An accept whose request is known.
    Accept(NsAccept),
    /// A reject (reason in the preamble); nothing follows.
    Reject,
    /// Anything else: a service or command unifab does not decode, or an
    /// accept whose request is unknown.
    Opaque(Bytes),
}

/// A whole CT_IU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtIu {
    /// The preamble.
    pub preamble: CtPreamble,
    /// The body.
    pub body: CtBody,
}

type NomErr<'a> = nom::error::Error<&'a [u8]>;

fn nom_err(_: nom::Err<NomErr<'_>>) -> WireError {
    WireError::InvalidField("malformed CT body")
}

fn port_id(b: &[u8]) -> Result<FcId, WireError> {
    check_len(b, 4)?;
    Ok(FcId::new(be::u24_at(b, 1)))
}

fn wwn(b: &[u8]) -> Result<Wwn, WireError> {
    check_len(b, 8)?;
    Ok(Wwn(be::u64_at(b, 0)))
}

/// A symbolic name field: a length byte and that many bytes.
fn sym_name(body: &Bytes, at: usize) -> Result<Bytes, WireError> {
    check_len(body, at + 1)?;
    let n = usize::from(body[at]);
    check_len(body, at + 1 + n)?;
    Ok(body.slice(at + 1..at + 1 + n))
}

fn sym_name_field_len(name: &Bytes) -> usize {
    // Length byte + name. A frame carrying it is padded to a word with
    // fill bytes (F_CTL), which are not part of the CT_IU.
    1 + name.len().min(255)
}

fn put_sym_name(b: &mut [u8], at: usize, name: &Bytes) {
    let n = name.len().min(255);
    b[at] = n as u8;
    b[at + 1..at + 1 + n].copy_from_slice(&name[..n]);
}

fn parse_entries(body: &[u8], with_names: bool) -> Result<Vec<PortEntry>, WireError> {
    let entry = |i| -> nom::IResult<&[u8], PortEntry, NomErr<'_>> {
        let (i, control) = be_u8(i)?;
        let (i, id) = nom::bytes::complete::take(3usize)(i)?;
        let (i, port_name) = if with_names {
            let (i, _) = be_u32(i)?;
            let (i, n) = be_u64(i)?;
            (i, n)
        } else {
            (i, 0)
        };
        Ok((
            i,
            PortEntry {
                last: control & 0x80 != 0,
                port_id: FcId::from_parts(id[0], id[1], id[2]),
                port_name: Wwn(port_name),
            },
        ))
    };
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let (r, e) = entry(rest).map_err(nom_err)?;
        rest = r;
        out.push(e);
        if e.last {
            return Ok(out);
        }
        if out.len() > super::MAX_PAYLOAD / 4 {
            return Err(WireError::InvalidField("port list without a last entry"));
        }
    }
}

impl NsAccept {
    fn parse(req: CtCommand, body: &Bytes) -> Result<Option<NsAccept>, WireError> {
        Ok(Some(match req {
            CtCommand::RPN_ID
            | CtCommand::RNN_ID
            | CtCommand::RFT_ID
            | CtCommand::RFF_ID
            | CtCommand::RSPN_ID
            | CtCommand::RSNN_NN
            | CtCommand::DA_ID => NsAccept::Empty,
            CtCommand::GID_FT => NsAccept::PortIds(parse_entries(body, false)?),
            CtCommand::GPN_FT => NsAccept::PortNames(parse_entries(body, true)?),
            CtCommand::GPN_ID | CtCommand::GNN_ID => NsAccept::Name(wwn(body)?),
            CtCommand::GID_PN => NsAccept::PortId(port_id(body)?),
            CtCommand::GSPN_ID | CtCommand::GSNN_NN => NsAccept::SymbolicName(sym_name(body, 0)?),
            CtCommand::GFT_ID => {
                check_len(body, 32)?;
                let mut t = [0u8; 32];
                t.copy_from_slice(&body[..32]);
                NsAccept::Types(Fc4Types(t))
            }
            CtCommand::GFF_ID => {
                check_len(body, 128)?;
                let mut t = [0u8; 128];
                t.copy_from_slice(&body[..128]);
                NsAccept::Features(Box::new(Fc4Features(t)))
            }
            CtCommand::GA_NXT => {
                check_len(body, NS_OBJECT_LEN)?;
                let b = &body[..];
                let mut ipn = [0u8; 16];
                ipn.copy_from_slice(&b[540..556]);
                let mut types = [0u8; 32];
                types.copy_from_slice(&b[560..592]);
                let mut ipp = [0u8; 16];
                ipp.copy_from_slice(&b[592..608]);
                let spn_len = usize::from(b[12]);
                let snn_len = usize::from(b[276]);
                NsAccept::Object(Box::new(NsObject {
                    port_type: b[0],
                    port_id: FcId::new(be::u24_at(b, 1)),
                    port_name: Wwn(be::u64_at(b, 4)),
                    symbolic_port_name: body.slice(13..13 + spn_len),
                    node_name: Wwn(be::u64_at(b, 268)),
                    symbolic_node_name: body.slice(277..277 + snn_len),
                    initial_process_associator: be::u64_at(b, 532),
                    ip_address_node: ipn,
                    class_of_service: be::u32_at(b, 556),
                    fc4_types: Fc4Types(types),
                    ip_address_port: ipp,
                    fabric_port_name: Wwn(be::u64_at(b, 608)),
                    hard_address: FcId::new(be::u24_at(b, 617)),
                }))
            }
            _ => return Ok(None),
        }))
    }

    fn buffer_len(&self) -> usize {
        match self {
            NsAccept::Empty => 0,
            NsAccept::PortIds(v) => 4 * v.len(),
            NsAccept::PortNames(v) => 16 * v.len(),
            NsAccept::Name(_) => 8,
            NsAccept::PortId(_) => 4,
            NsAccept::SymbolicName(n) => sym_name_field_len(n),
            NsAccept::Types(_) => 32,
            NsAccept::Features(_) => 128,
            NsAccept::Object(_) => NS_OBJECT_LEN,
        }
    }

    fn emit(&self, b: &mut [u8]) {
        match self {
            NsAccept::Empty => {}
            NsAccept::PortIds(v) | NsAccept::PortNames(v) => {
                let stride = if matches!(self, NsAccept::PortIds(_)) {
                    4
                } else {
                    16
                };
                for (k, e) in v.iter().enumerate() {
                    let at = k * stride;
                    b[at] = if e.last { 0x80 } else { 0 };
                    be::put_u24(b, at + 1, e.port_id.get());
                    if stride == 16 {
                        be::put_u64(b, at + 8, e.port_name.0);
                    }
                }
            }
            NsAccept::Name(w) => be::put_u64(b, 0, w.0),
            NsAccept::PortId(id) => be::put_u24(b, 1, id.get()),
            NsAccept::SymbolicName(n) => put_sym_name(b, 0, n),
            NsAccept::Types(t) => b[..32].copy_from_slice(&t.0),
            NsAccept::Features(f) => b[..128].copy_from_slice(&f.0),
            NsAccept::Object(o) => {
                b[0] = o.port_type;
                be::put_u24(b, 1, o.port_id.get());
                be::put_u64(b, 4, o.port_name.0);
                put_sym_name(b, 12, &o.symbolic_port_name);
                be::put_u64(b, 268, o.node_name.0);
                put_sym_name(b, 276, &o.symbolic_node_name);
                be::put_u64(b, 532, o.initial_process_associator);
                b[540..556].copy_from_slice(&o.ip_address_node);
                be::put_u32(b, 556, o.class_of_service);
                b[560..592].copy_from_slice(&o.fc4_types.0);
                b[592..608].copy_from_slice(&o.ip_address_port);
                be::put_u64(b, 608, o.fabric_port_name.0);
                be::put_u24(b, 617, o.hard_address.get());
            }
        }
    }
}

impl NsRequest {
    fn parse(cmd: CtCommand, body: &Bytes) -> Result<Option<NsRequest>, WireError> {
        let b = &body[..];
        let scope = |b: &[u8]| -> Result<FtScope, WireError> {
            check_len(b, 4)?;
            Ok(FtScope {
                domain: b[1],
                area: b[2],
                fc_type: FcType(b[3]),
            })
        };
        Ok(Some(match cmd {
            CtCommand::GA_NXT => NsRequest::GaNxt(port_id(b)?),
            CtCommand::GPN_ID => NsRequest::GpnId(port_id(b)?),
            CtCommand::GNN_ID => NsRequest::GnnId(port_id(b)?),
            CtCommand::GFT_ID => NsRequest::GftId(port_id(b)?),
            CtCommand::GSPN_ID => NsRequest::GspnId(port_id(b)?),
            CtCommand::GFF_ID => NsRequest::GffId(port_id(b)?),
            CtCommand::DA_ID => NsRequest::DaId(port_id(b)?),
            CtCommand::GID_PN => NsRequest::GidPn(wwn(b)?),
            CtCommand::GSNN_NN => NsRequest::GsnnNn(wwn(b)?),
            CtCommand::GID_FT => NsRequest::GidFt(scope(b)?),
            CtCommand::GPN_FT => NsRequest::GpnFt(scope(b)?),
            CtCommand::RPN_ID | CtCommand::RNN_ID => {
                check_len(b, 12)?;
                let id = port_id(b)?;
                let name = Wwn(be::u64_at(b, 4));
                if cmd == CtCommand::RPN_ID {
                    NsRequest::RpnId {
                        port_id: id,
                        port_name: name,
                    }
                } else {
                    NsRequest::RnnId {
                        port_id: id,
                        node_name: name,
                    }
                }
            }
            CtCommand::RFT_ID => {
                check_len(b, 36)?;
                let mut t = [0u8; 32];
                t.copy_from_slice(&b[4..36]);
                NsRequest::RftId {
                    port_id: port_id(b)?,
                    types: Fc4Types(t),
                }
            }
            CtCommand::RFF_ID => {
                check_len(b, 8)?;
                NsRequest::RffId {
                    port_id: port_id(b)?,
                    features: b[6],
                    fc_type: FcType(b[7]),
                }
            }
            CtCommand::RSPN_ID => NsRequest::RspnId {
                port_id: port_id(b)?,
                name: sym_name(body, 4)?,
            },
            CtCommand::RSNN_NN => NsRequest::RsnnNn {
                node_name: wwn(b)?,
                name: sym_name(body, 8)?,
            },
            _ => return Ok(None),
        }))
    }

    fn buffer_len(&self) -> usize {
        match self {
            NsRequest::GaNxt(_)
            | NsRequest::GpnId(_)
            | NsRequest::GnnId(_)
            | NsRequest::GftId(_)
            | NsRequest::GspnId(_)
            | NsRequest::GffId(_)
            | NsRequest::DaId(_)
            | NsRequest::GidFt(_)
            | NsRequest::GpnFt(_) => 4,
            NsRequest::GidPn(_) | NsRequest::GsnnNn(_) => 8,
            NsRequest::RpnId { .. } | NsRequest::RnnId { .. } => 12,
            NsRequest::RftId { .. } => 36,
            NsRequest::RffId { .. } => 8,
            NsRequest::RspnId { name, .. } => 4 + sym_name_field_len(name),
            NsRequest::RsnnNn { name, .. } => 8 + sym_name_field_len(name),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        match self {
            NsRequest::GaNxt(id)
            | NsRequest::GpnId(id)
            | NsRequest::GnnId(id)
            | NsRequest::GftId(id)
            | NsRequest::GspnId(id)
            | NsRequest::GffId(id)
            | NsRequest::DaId(id) => be::put_u24(b, 1, id.get()),
            NsRequest::GidPn(w) | NsRequest::GsnnNn(w) => be::put_u64(b, 0, w.0),
            NsRequest::GidFt(s) | NsRequest::GpnFt(s) => {
                b[1] = s.domain;
                b[2] = s.area;
                b[3] = s.fc_type.0;
            }
            NsRequest::RpnId {
                port_id,
                port_name: name,
            }
            | NsRequest::RnnId {
                port_id,
                node_name: name,
            } => {
                be::put_u24(b, 1, port_id.get());
                be::put_u64(b, 4, name.0);
            }
            NsRequest::RftId { port_id, types } => {
                be::put_u24(b, 1, port_id.get());
                b[4..36].copy_from_slice(&types.0);
            }
            NsRequest::RffId {
                port_id,
                features,
                fc_type,
            } => {
                be::put_u24(b, 1, port_id.get());
                b[6] = *features;
                b[7] = fc_type.0;
            }
            NsRequest::RspnId { port_id, name } => {
                be::put_u24(b, 1, port_id.get());
                put_sym_name(b, 4, name);
            }
            NsRequest::RsnnNn { node_name, name } => {
                be::put_u64(b, 0, node_name.0);
                put_sym_name(b, 8, name);
            }
        }
    }
}

impl CtIu {
    /// A name server request.
    pub fn request(req: NsRequest) -> CtIu {
        CtIu {
            preamble: CtPreamble::name_server(req.command()),
            body: CtBody::Request(req),
        }
    }

    /// Parses a CT_IU. `answering` is the command of the request an
    /// FS_ACC answers, when known.
    pub fn parse(payload: &Bytes, answering: Option<CtCommand>) -> Result<CtIu, WireError> {
        if payload.len() > super::MAX_PAYLOAD {
            return Err(WireError::PayloadTooLong(payload.len()));
        }
        let preamble = CtPreamble::parse(payload)?;
        let body = payload.slice(PREAMBLE_LEN..);
        let ns =
            preamble.gs_type == GsType::DIRECTORY && preamble.gs_subtype == GsSubtype::NAME_SERVER;
        let body = match preamble.command {
            CtCommand::FS_RJT => CtBody::Reject,
            CtCommand::FS_ACC => match answering {
                Some(req) if ns => match NsAccept::parse(req, &body)? {
                    Some(a) => CtBody::Accept(a),
                    None => CtBody::Opaque(body),
                },
                _ => CtBody::Opaque(body),
            },
            cmd if ns => match NsRequest::parse(cmd, &body)? {
                Some(r) => CtBody::Request(r),
                None => CtBody::Opaque(body),
            },
            _ => CtBody::Opaque(body),
        };
        Ok(CtIu { preamble, body })
    }

    /// Length in bytes.
    pub fn buffer_len(&self) -> usize {
        PREAMBLE_LEN
            + match &self.body {
                CtBody::Request(r) => r.buffer_len(),
                CtBody::Accept(a) => a.buffer_len(),
                CtBody::Reject => 0,
                CtBody::Opaque(b) => b.len(),
            }
    }

    /// Writes the CT_IU into `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        check_len(buf, n)?;
        if n > super::MAX_PAYLOAD {
            return Err(WireError::PayloadTooLong(n));
        }
        let p = &mut buf[..n];
        p.fill(0);
        self.preamble.emit(p);
        let b = &mut p[PREAMBLE_LEN..];
        match &self.body {
            CtBody::Request(r) => r.emit(b),
            CtBody::Accept(a) => a.emit(b),
            CtBody::Reject => {}
            CtBody::Opaque(o) => b.copy_from_slice(o),
        }
        Ok(())
    }

    /// The CT_IU as a new buffer (control-path convenience).
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(Bytes::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(iu: &CtIu, answering: Option<CtCommand>) -> Bytes {
        let b = iu.to_bytes().unwrap();
        assert_eq!(&CtIu::parse(&b, answering).unwrap(), iu, "{b:02x?}");
        for n in 0..b.len() {
            let _ = CtIu::parse(&b.slice(..n), answering);
        }
        b
    }

    #[test]
    fn captured_gid_ft_and_accept() {
        // fcoe-t11.pcap frames 10 and 16.
        let req = Bytes::from_static(&[
            1, 0, 0, 0, 0xfc, 2, 0, 0, 1, 0x71, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8,
        ]);
        let iu = CtIu::parse(&req, None).unwrap();
        assert_eq!(
            iu.body,
            CtBody::Request(NsRequest::GidFt(FtScope {
                domain: 0,
                area: 0,
                fc_type: FcType::FCP
            }))
        );
        assert_eq!(iu.to_bytes().unwrap(), req);
        let acc = Bytes::from_static(&[
            1, 0, 0, 0, 0xfc, 2, 0, 0, 0x80, 2, 0, 0, 0, 0, 0, 0, 0, 0xed, 0, 0, 0, 0xed, 1, 0,
            0x80, 0xed, 2, 0,
        ]);
        let iu = CtIu::parse(&acc, Some(CtCommand::GID_FT)).unwrap();
        let CtBody::Accept(NsAccept::PortIds(ids)) = &iu.body else {
            panic!("{iu:?}")
        };
        assert_eq!(ids.len(), 3);
        assert!(ids[2].last && !ids[0].last);
        assert_eq!(ids[1].port_id, FcId::new(0xed0100));
        assert_eq!(iu.to_bytes().unwrap(), acc);
        // Without the request, the accept stays opaque and still round-trips.
        let o = CtIu::parse(&acc, None).unwrap();
        assert!(matches!(o.body, CtBody::Opaque(_)));
        assert_eq!(o.to_bytes().unwrap(), acc);
    }

    #[test]
    fn captured_rft_id_and_reject() {
        let mut rft = vec![
            1, 0, 0, 0, 0xfc, 2, 0, 0, 2, 0x17, 0, 0, 0, 0, 0, 0, 0, 0xed, 1, 0,
        ];
        rft.extend_from_slice(&[0, 0, 1, 0]);
        rft.extend_from_slice(&[0; 28]);
        let iu = CtIu::parse(&Bytes::from(rft.clone()), None).unwrap();
        let CtBody::Request(NsRequest::RftId { port_id, types }) = &iu.body else {
            panic!()
        };
        assert_eq!(*port_id, FcId::new(0xed0100));
        assert!(types.contains(FcType::FCP) && !types.contains(FcType::IP));
        assert_eq!(iu.to_bytes().unwrap(), rft);
        let rjt = Bytes::from_static(&[1, 0, 0, 0, 0xfc, 2, 0, 0, 0x80, 1, 0, 0, 0, 9, 8, 0]);
        let iu = CtIu::parse(&rjt, Some(CtCommand::GSPN_ID)).unwrap();
        assert_eq!(iu.body, CtBody::Reject);
        assert_eq!(iu.preamble.reason, CtReason::UNABLE_TO_PERFORM);
        assert_eq!(
            iu.preamble.explanation,
            NsReason::SYMBOLIC_PORT_NAME_NOT_REGISTERED
        );
        assert_eq!(iu.to_bytes().unwrap(), rjt);
    }

    #[test]
    fn every_operation_round_trips() {
        let id = FcId::new(0x010200);
        let w = Wwn(0x2100_0000_0000_0002);
        let scope = FtScope {
            domain: 0,
            area: 0,
            fc_type: FcType::FCP,
        };
        let mut feats = Fc4Features::default();
        feats.set(FcType::FCP, fcp_features::TARGET);
        assert_eq!(feats.get(FcType::FCP), 1);
        assert_eq!(feats.0[7], 0x01);
        feats.set(FcType(9), 0xa);
        assert_eq!(feats.get(FcType(9)), 0xa);
        assert_eq!(feats.get(FcType::FCP), 1);
        for r in [
            NsRequest::GaNxt(id),
            NsRequest::GpnId(id),
            NsRequest::GnnId(id),
            NsRequest::GftId(id),
            NsRequest::GspnId(id),
            NsRequest::GffId(id),
            NsRequest::DaId(id),
            NsRequest::GidPn(w),
            NsRequest::GsnnNn(w),
            NsRequest::GidFt(scope),
            NsRequest::GpnFt(scope),
            NsRequest::RpnId {
                port_id: id,
                port_name: w,
            },
            NsRequest::RnnId {
                port_id: id,
                node_name: w,
            },
            NsRequest::RftId {
                port_id: id,
                types: Fc4Types::of(FcType::FCP),
            },
            NsRequest::RffId {
                port_id: id,
                features: fcp_features::INITIATOR,
                fc_type: FcType::FCP,
            },
            NsRequest::RspnId {
                port_id: id,
                name: Bytes::from_static(b"unifab port"),
            },
            NsRequest::RsnnNn {
                node_name: w,
                name: Bytes::from_static(b"unifab"),
            },
        ] {
            let cmd = r.command();
            let iu = CtIu::request(r);
            rt(&iu, None);
            let acc = |a| CtIu {
                preamble: iu.preamble.accept(),
                body: CtBody::Accept(a),
            };
            let answer = match cmd {
                CtCommand::GID_FT => NsAccept::PortIds(vec![
                    PortEntry {
                        last: false,
                        port_id: id,
                        port_name: Wwn(0),
                    },
                    PortEntry {
                        last: true,
                        port_id: FcId::new(0x010300),
                        port_name: Wwn(0),
                    },
                ]),
                CtCommand::GPN_FT => NsAccept::PortNames(vec![PortEntry {
                    last: true,
                    port_id: id,
                    port_name: w,
                }]),
                CtCommand::GPN_ID | CtCommand::GNN_ID => NsAccept::Name(w),
                CtCommand::GID_PN => NsAccept::PortId(id),
                CtCommand::GSPN_ID | CtCommand::GSNN_NN => {
                    NsAccept::SymbolicName(Bytes::from_static(b"name"))
                }
                CtCommand::GFT_ID => NsAccept::Types(Fc4Types::of(FcType::FCP)),
                CtCommand::GFF_ID => NsAccept::Features(Box::new(feats)),
                CtCommand::GA_NXT => NsAccept::Object(Box::new(NsObject {
                    port_type: 1,
                    port_id: id,
                    port_name: w,
                    symbolic_port_name: Bytes::from_static(b"p"),
                    node_name: Wwn(3),
                    symbolic_node_name: Bytes::from_static(b"node"),
                    initial_process_associator: 0,
                    ip_address_node: [0; 16],
                    class_of_service: 8,
                    fc4_types: Fc4Types::of(FcType::FCP),
                    ip_address_port: [0; 16],
                    fabric_port_name: Wwn(4),
                    hard_address: FcId::new(0),
                })),
                _ => NsAccept::Empty,
            };
            rt(&acc(answer), Some(cmd));
            let rjt = CtIu {
                preamble: iu.preamble.reject(
                    CtReason::UNABLE_TO_PERFORM,
                    NsReason::PORT_ID_NOT_REGISTERED,
                ),
                body: CtBody::Reject,
            };
            rt(&rjt, Some(cmd));
        }
        assert_eq!(
            CtReject::from(&WireError::Truncated { needed: 4, got: 0 }).reason,
            CtReason::INVALID_IU_SIZE
        );
    }
}
