//! Extended link services (FC-LS-3 §4, §6): FLOGI, FDISC and PLOGI with
//! their service parameters, LS_ACC, LS_RJT, LOGO, PRLI and PRLO with the
//! FCP service parameter page, ADISC, RSCN, SCR, RRQ, ECHO, REC and RLS.
//!
//! An ELS payload starts with its command code. What an LS_ACC carries
//! depends on the request it answers, so [`ElsRepr::parse`] takes that
//! request's code when it is known ([`ReplyTracker`](super::ReplyTracker)
//! remembers it per exchange); without it an LS_ACC stays opaque.
//!
//! Reserved fields are ignored on parse and written as zero.

use std::fmt;

use bytes::Bytes;
use nom::Parser;
use nom::number::complete::{be_u8, be_u32};

use super::be;
use super::header::FcType;
use super::{FcId, OxId, RxId, WireError, Wwn, check_len};

/// An ELS command code (the first payload byte). Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ElsCode(pub u8);

#[allow(missing_docs)]
impl ElsCode {
    pub const LS_RJT: ElsCode = ElsCode(0x01);
    pub const LS_ACC: ElsCode = ElsCode(0x02);
    pub const PLOGI: ElsCode = ElsCode(0x03);
    pub const FLOGI: ElsCode = ElsCode(0x04);
    pub const LOGO: ElsCode = ElsCode(0x05);
    pub const RTV: ElsCode = ElsCode(0x0e);
    pub const RLS: ElsCode = ElsCode(0x0f);
    pub const ECHO: ElsCode = ElsCode(0x10);
    pub const RRQ: ElsCode = ElsCode(0x12);
    pub const REC: ElsCode = ElsCode(0x13);
    pub const SRR: ElsCode = ElsCode(0x14);
    pub const PRLI: ElsCode = ElsCode(0x20);
    pub const PRLO: ElsCode = ElsCode(0x21);
    pub const PDISC: ElsCode = ElsCode(0x50);
    pub const FDISC: ElsCode = ElsCode(0x51);
    pub const ADISC: ElsCode = ElsCode(0x52);
    pub const RSCN: ElsCode = ElsCode(0x61);
    pub const SCR: ElsCode = ElsCode(0x62);
    pub const RNID: ElsCode = ElsCode(0x78);

    /// The standard's name, for defined codes.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            ElsCode::LS_RJT => "LS_RJT",
            ElsCode::LS_ACC => "LS_ACC",
            ElsCode::PLOGI => "PLOGI",
            ElsCode::FLOGI => "FLOGI",
            ElsCode::LOGO => "LOGO",
            ElsCode::RTV => "RTV",
            ElsCode::RLS => "RLS",
            ElsCode::ECHO => "ECHO",
            ElsCode::RRQ => "RRQ",
            ElsCode::REC => "REC",
            ElsCode::SRR => "SRR",
            ElsCode::PRLI => "PRLI",
            ElsCode::PRLO => "PRLO",
            ElsCode::PDISC => "PDISC",
            ElsCode::FDISC => "FDISC",
            ElsCode::ADISC => "ADISC",
            ElsCode::RSCN => "RSCN",
            ElsCode::SCR => "SCR",
            ElsCode::RNID => "RNID",
            _ => return None,
        })
    }
}

impl fmt::Debug for ElsCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "ElsCode({:#04x})", self.0),
        }
    }
}

/// LS_RJT reason codes (FC-LS-3 Table 133). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LsRjtReason(pub u8);

#[allow(missing_docs)]
impl LsRjtReason {
    pub const INVALID_COMMAND_CODE: LsRjtReason = LsRjtReason(0x01);
    pub const LOGICAL_ERROR: LsRjtReason = LsRjtReason(0x03);
    pub const LOGICAL_BUSY: LsRjtReason = LsRjtReason(0x05);
    pub const PROTOCOL_ERROR: LsRjtReason = LsRjtReason(0x07);
    pub const UNABLE_TO_PERFORM: LsRjtReason = LsRjtReason(0x09);
    pub const COMMAND_NOT_SUPPORTED: LsRjtReason = LsRjtReason(0x0b);
    pub const COMMAND_IN_PROGRESS: LsRjtReason = LsRjtReason(0x0e);
    pub const FIP_ERROR: LsRjtReason = LsRjtReason(0x20);
    pub const VENDOR_UNIQUE: LsRjtReason = LsRjtReason(0xff);
}

/// LS_RJT reason explanations (FC-LS-3 Table 134). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LsRjtExplanation(pub u8);

#[allow(missing_docs)]
impl LsRjtExplanation {
    pub const NONE: LsRjtExplanation = LsRjtExplanation(0x00);
    pub const SERVICE_PARAM_ERROR_OPTIONS: LsRjtExplanation = LsRjtExplanation(0x01);
    pub const SERVICE_PARAM_ERROR_INITIATOR_CONTROL: LsRjtExplanation = LsRjtExplanation(0x03);
    pub const SERVICE_PARAM_ERROR_RECIPIENT_CONTROL: LsRjtExplanation = LsRjtExplanation(0x05);
    pub const SERVICE_PARAM_ERROR_RX_SIZE: LsRjtExplanation = LsRjtExplanation(0x07);
    pub const INVALID_NODE_NAME: LsRjtExplanation = LsRjtExplanation(0x0d);
    pub const INVALID_PORT_NAME: LsRjtExplanation = LsRjtExplanation(0x0e);
    pub const INVALID_S_ID: LsRjtExplanation = LsRjtExplanation(0x15);
    pub const INVALID_OX_ID_RX_ID: LsRjtExplanation = LsRjtExplanation(0x17);
    pub const REQUEST_IN_PROGRESS: LsRjtExplanation = LsRjtExplanation(0x19);
    pub const N_PORT_LOGIN_REQUIRED: LsRjtExplanation = LsRjtExplanation(0x1e);
    pub const INSUFFICIENT_RESOURCES: LsRjtExplanation = LsRjtExplanation(0x29);
    pub const UNABLE_TO_SUPPLY_DATA: LsRjtExplanation = LsRjtExplanation(0x2a);
    pub const REQUEST_NOT_SUPPORTED: LsRjtExplanation = LsRjtExplanation(0x2c);
    pub const INVALID_PAYLOAD_LENGTH: LsRjtExplanation = LsRjtExplanation(0x2d);
    pub const INVALID_PORT_ID: LsRjtExplanation = LsRjtExplanation(0x1f);
}

/// LS_RJT payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LsRjt {
    /// Reason code.
    pub reason: LsRjtReason,
    /// Reason explanation.
    pub explanation: LsRjtExplanation,
    /// Vendor unique.
    pub vendor: u8,
}

impl LsRjt {
    /// An LS_RJT with no vendor byte.
    pub const fn new(reason: LsRjtReason, explanation: LsRjtExplanation) -> LsRjt {
        LsRjt {
            reason,
            explanation,
            vendor: 0,
        }
    }
}

impl From<&WireError> for LsRjt {
    /// The single place that decides how a malformed ELS is answered.
    fn from(e: &WireError) -> LsRjt {
        match e {
            WireError::Truncated { .. } | WireError::BadLength { .. } => LsRjt::new(
                LsRjtReason::PROTOCOL_ERROR,
                LsRjtExplanation::INVALID_PAYLOAD_LENGTH,
            ),
            WireError::PayloadTooLong(_) => LsRjt::new(
                LsRjtReason::UNABLE_TO_PERFORM,
                LsRjtExplanation::INSUFFICIENT_RESOURCES,
            ),
            _ => LsRjt::new(LsRjtReason::PROTOCOL_ERROR, LsRjtExplanation::NONE),
        }
    }
}

/// Common service parameter feature bits (word 1, bits 31–16). The
/// meaning of bits 15 and 13 differs between requests and FLOGI LS_ACC;
/// both names are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CommonFeatures(pub u16);

#[allow(missing_docs)]
impl CommonFeatures {
    /// PLOGI: continuously increasing relative offset.
    pub const CONTINUOUSLY_INCREASING_OFFSET: u16 = 0x8000;
    /// FLOGI/FDISC request: multiple N_Port_ID (NPIV) support.
    pub const NPIV_SUPPORT: u16 = 0x8000;
    /// FLOGI LS_ACC: clean address.
    pub const CLEAN_ADDRESS: u16 = 0x8000;
    pub const RANDOM_RELATIVE_OFFSET: u16 = 0x4000;
    pub const VALID_VENDOR_VERSION: u16 = 0x2000;
    /// FLOGI LS_ACC: the fabric assigns multiple N_Port_IDs (NPIV).
    pub const NPIV_ASSIGNED: u16 = 0x2000;
    /// The sender is an F_Port (LS_ACC from the fabric).
    pub const F_PORT: u16 = 0x1000;
    pub const ALTERNATE_BB_CREDIT: u16 = 0x0800;
    /// E_D_TOV is in nanoseconds.
    pub const E_D_TOV_RESOLUTION: u16 = 0x0400;
    pub const MULTICAST: u16 = 0x0200;
    pub const BROADCAST: u16 = 0x0100;
    pub const HUNT_GROUP: u16 = 0x0080;
    pub const DEDICATED_SIMPLEX: u16 = 0x0040;
    pub const SECURITY: u16 = 0x0020;
    pub const CLOCK_SYNC: u16 = 0x0010;
    pub const R_T_TOV: u16 = 0x0008;
    pub const DYNAMIC_HALF_DUPLEX: u16 = 0x0004;
    pub const SEQ_CNT: u16 = 0x0002;
    /// 256-byte payload.
    pub const PAYLOAD_256: u16 = 0x0001;

    /// True when every bit of `mask` is set.
    pub const fn contains(self, mask: u16) -> bool {
        self.0 & mask == mask
    }
}

/// Common service parameters (FC-LS-3 §6.6.2), 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CommonServiceParams {
    /// FC-PH version, highest (high byte) and lowest (low byte).
    pub fc_ph_version: u16,
    /// Buffer-to-buffer credit.
    pub bb_credit: u16,
    /// Feature bits.
    pub features: CommonFeatures,
    /// BB_SC_N (4 bits).
    pub bb_sc_n: u8,
    /// Receive data field size (12 bits).
    pub rx_data_field_size: u16,
    /// Word 2: total concurrent sequences (high 16) and relative offset by
    /// information category (low 16) in N_Port parameters; R_A_TOV in a
    /// FLOGI LS_ACC.
    pub word2: u32,
    /// E_D_TOV (milliseconds, or ns with E_D_TOV resolution).
    pub e_d_tov: u32,
}

impl CommonServiceParams {
    /// Total concurrent sequences (N_Port parameters).
    pub const fn total_concurrent_sequences(&self) -> u16 {
        (self.word2 >> 16) as u16
    }

    /// Relative offset by information category (N_Port parameters).
    pub const fn relative_offset_by_category(&self) -> u16 {
        self.word2 as u16
    }

    /// R_A_TOV in milliseconds (FLOGI LS_ACC).
    pub const fn r_a_tov(&self) -> u32 {
        self.word2
    }

    fn parse(b: &[u8]) -> CommonServiceParams {
        let bb = be::u16_at(b, 6);
        CommonServiceParams {
            fc_ph_version: be::u16_at(b, 0),
            bb_credit: be::u16_at(b, 2),
            features: CommonFeatures(be::u16_at(b, 4)),
            bb_sc_n: (bb >> 12) as u8,
            rx_data_field_size: bb & 0x0fff,
            word2: be::u32_at(b, 8),
            e_d_tov: be::u32_at(b, 12),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        be::put_u16(b, 0, self.fc_ph_version);
        be::put_u16(b, 2, self.bb_credit);
        be::put_u16(b, 4, self.features.0);
        be::put_u16(
            b,
            6,
            (u16::from(self.bb_sc_n & 0x0f) << 12) | (self.rx_data_field_size & 0x0fff),
        );
        be::put_u32(b, 8, self.word2);
        be::put_u32(b, 12, self.e_d_tov);
    }
}

/// Class service parameters (FC-LS-3 §6.6.4), 16 bytes each for classes
/// 1 to 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassServiceParams {
    /// Service options ([`ClassServiceParams::VALID`], …).
    pub service_options: u16,
    /// Initiator control.
    pub initiator_control: u16,
    /// Recipient control.
    pub recipient_control: u16,
    /// Receive data field size.
    pub rx_data_field_size: u16,
    /// Total concurrent sequences.
    pub concurrent_sequences: u16,
    /// End-to-end credit.
    pub end_to_end_credit: u16,
    /// Open sequences per exchange.
    pub open_sequences_per_exchange: u8,
}

impl ClassServiceParams {
    /// The class is supported.
    pub const VALID: u16 = 0x8000;
    /// Intermix.
    pub const INTERMIX: u16 = 0x4000;
    /// Sequential (in-order) delivery.
    pub const SEQUENTIAL_DELIVERY: u16 = 0x0800;
    /// Camp-on.
    pub const CAMP_ON: u16 = 0x0200;
    /// Priority.
    pub const PRIORITY: u16 = 0x0080;

    /// The class 3 parameters unifab's N_Ports send.
    pub const fn class3(rx_size: u16) -> ClassServiceParams {
        ClassServiceParams {
            service_options: Self::VALID | Self::SEQUENTIAL_DELIVERY,
            initiator_control: 0,
            recipient_control: 0,
            rx_data_field_size: rx_size,
            concurrent_sequences: 255,
            end_to_end_credit: 0,
            open_sequences_per_exchange: 1,
        }
    }

    /// The class is supported.
    pub const fn is_valid(&self) -> bool {
        self.service_options & Self::VALID != 0
    }

    fn parse(b: &[u8]) -> ClassServiceParams {
        ClassServiceParams {
            service_options: be::u16_at(b, 0),
            initiator_control: be::u16_at(b, 2),
            recipient_control: be::u16_at(b, 4),
            rx_data_field_size: be::u16_at(b, 6),
            concurrent_sequences: be::u16_at(b, 8),
            end_to_end_credit: be::u16_at(b, 10),
            open_sequences_per_exchange: b[13],
        }
    }

    fn emit(&self, b: &mut [u8]) {
        be::put_u16(b, 0, self.service_options);
        be::put_u16(b, 2, self.initiator_control);
        be::put_u16(b, 4, self.recipient_control);
        be::put_u16(b, 6, self.rx_data_field_size);
        be::put_u16(b, 8, self.concurrent_sequences);
        be::put_u16(b, 10, self.end_to_end_credit);
        b[12] = 0;
        b[13] = self.open_sequences_per_exchange;
        b[14] = 0;
        b[15] = 0;
    }
}

/// FLOGI, FDISC and PLOGI payloads and their LS_ACC (FC-LS-3 §4.2.14,
/// §4.2.20, §4.2.27): 116 bytes with the command word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginParams {
    /// Common service parameters.
    pub common: CommonServiceParams,
    /// N_Port (or F_Port) name.
    pub port_name: Wwn,
    /// Node (or fabric) name.
    pub node_name: Wwn,
    /// Class 1 to 4 service parameters.
    pub classes: [ClassServiceParams; 4],
    /// Vendor version level.
    pub vendor_version: [u8; 16],
}

/// Length of a login payload with its command word.
pub const LOGIN_PAYLOAD_LEN: usize = 116;

impl LoginParams {
    /// An N_Port's parameters: class 3, FC-PH 0x2020, the given receive
    /// data field size, E_D_TOV in ms.
    pub fn n_port(port_name: Wwn, node_name: Wwn, rx_size: u16, e_d_tov: u32) -> LoginParams {
        LoginParams {
            common: CommonServiceParams {
                fc_ph_version: 0x2020,
                bb_credit: 16,
                features: CommonFeatures(CommonFeatures::CONTINUOUSLY_INCREASING_OFFSET),
                bb_sc_n: 0,
                rx_data_field_size: rx_size,
                word2: (255 << 16) | 0x1f,
                e_d_tov,
            },
            port_name,
            node_name,
            classes: [
                ClassServiceParams::default(),
                ClassServiceParams::default(),
                ClassServiceParams::class3(rx_size),
                ClassServiceParams::default(),
            ],
            vendor_version: [0; 16],
        }
    }

    /// Class 3 parameters.
    pub fn class3(&self) -> &ClassServiceParams {
        &self.classes[2]
    }

    fn parse(p: &[u8]) -> Result<LoginParams, WireError> {
        check_len(p, LOGIN_PAYLOAD_LEN)?;
        let mut classes = [ClassServiceParams::default(); 4];
        for (i, c) in classes.iter_mut().enumerate() {
            let at = 36 + 16 * i;
            *c = ClassServiceParams::parse(&p[at..at + 16]);
        }
        let mut vendor_version = [0u8; 16];
        vendor_version.copy_from_slice(&p[100..116]);
        Ok(LoginParams {
            common: CommonServiceParams::parse(&p[4..20]),
            port_name: Wwn(be::u64_at(p, 20)),
            node_name: Wwn(be::u64_at(p, 28)),
            classes,
            vendor_version,
        })
    }

    fn emit(&self, p: &mut [u8]) {
        self.common.emit(&mut p[4..20]);
        be::put_u64(p, 20, self.port_name.0);
        be::put_u64(p, 28, self.node_name.0);
        for (i, c) in self.classes.iter().enumerate() {
            let at = 36 + 16 * i;
            c.emit(&mut p[at..at + 16]);
        }
        p[100..116].copy_from_slice(&self.vendor_version);
    }
}

/// LOGO payload (FC-LS-3 §4.2.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Logo {
    /// The N_Port_ID logging out.
    pub n_port_id: FcId,
    /// Its port name.
    pub port_name: Wwn,
}

/// FCP service parameter bits (FCP-4 Table 10 word 3). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FcpServiceParams(pub u32);

#[allow(missing_docs)]
impl FcpServiceParams {
    pub const TASK_RETRY_ID: u32 = 0x0200;
    pub const RETRY: u32 = 0x0100;
    pub const CONFIRMED_COMPLETION: u32 = 0x0080;
    pub const DATA_OVERLAY: u32 = 0x0040;
    pub const INITIATOR_FUNCTION: u32 = 0x0020;
    pub const TARGET_FUNCTION: u32 = 0x0010;
    pub const CMD_DATA_MIXED: u32 = 0x0008;
    pub const DATA_RSP_MIXED: u32 = 0x0004;
    pub const READ_XFER_RDY_DISABLED: u32 = 0x0002;
    pub const WRITE_XFER_RDY_DISABLED: u32 = 0x0001;

    /// True when every bit of `mask` is set.
    pub const fn contains(self, mask: u32) -> bool {
        self.0 & mask == mask
    }
}

/// PRLI/PRLO service parameter page flags.
#[allow(missing_docs)]
pub mod page_flags {
    pub const ORIGINATOR_PA_VALID: u8 = 0x80;
    pub const RESPONDER_PA_VALID: u8 = 0x40;
    pub const ESTABLISH_IMAGE_PAIR: u8 = 0x20;
    /// Low nibble of an LS_ACC page: the response code.
    pub const RESPONSE_CODE_MASK: u8 = 0x0f;
}

/// PRLI/PRLO accept page response codes (FC-LS-3 Table 124). Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PrliResponse(pub u8);

#[allow(missing_docs)]
impl PrliResponse {
    pub const EXECUTED: PrliResponse = PrliResponse(1);
    pub const NO_RESOURCES: PrliResponse = PrliResponse(2);
    pub const INITIALIZATION_NOT_COMPLETE: PrliResponse = PrliResponse(3);
    pub const NO_SUCH_IMAGE_PAIR: PrliResponse = PrliResponse(4);
    pub const PREDEFINED_CONFIG: PrliResponse = PrliResponse(5);
    pub const CONDITIONALLY_EXECUTED: PrliResponse = PrliResponse(6);
    pub const MULTIPLE_PAGES_NOT_SUPPORTED: PrliResponse = PrliResponse(7);
    pub const INVALID_SERVICE_PARAMS: PrliResponse = PrliResponse(8);
}

/// A PRLI/PRLO service parameter page (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceParamPage {
    /// FC-4 TYPE (08h for FCP).
    pub fc_type: FcType,
    /// Type code extension.
    pub type_extension: u8,
    /// Flags ([`page_flags`]) and, in an LS_ACC, the response code.
    pub flags: u8,
    /// Originator process associator.
    pub originator_pa: u32,
    /// Responder process associator.
    pub responder_pa: u32,
    /// Service parameters (PRLI; zero in PRLO).
    pub service_params: u32,
}

impl ServiceParamPage {
    /// An FCP page.
    pub fn fcp(flags: u8, params: u32) -> ServiceParamPage {
        ServiceParamPage {
            fc_type: FcType::FCP,
            type_extension: 0,
            flags,
            originator_pa: 0,
            responder_pa: 0,
            service_params: params,
        }
    }

    /// The response code of an accept page.
    pub fn response(&self) -> PrliResponse {
        PrliResponse(self.flags & page_flags::RESPONSE_CODE_MASK)
    }

    /// The FCP service parameters.
    pub fn fcp_params(&self) -> FcpServiceParams {
        FcpServiceParams(self.service_params)
    }
}

/// PRLI or PRLO payload (request or accept): service parameter pages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ProcessLogin {
    /// The pages.
    pub pages: Vec<ServiceParamPage>,
}

type NomErr<'a> = nom::error::Error<&'a [u8]>;

fn nom_err(_: nom::Err<NomErr<'_>>) -> WireError {
    WireError::InvalidField("malformed list")
}

fn parse_page(i: &[u8]) -> nom::IResult<&[u8], ServiceParamPage, NomErr<'_>> {
    let (i, (fc_type, type_extension, flags, _rsvd, originator_pa, responder_pa, params)) =
        (be_u8, be_u8, be_u8, be_u8, be_u32, be_u32, be_u32).parse(i)?;
    Ok((
        i,
        ServiceParamPage {
            fc_type: FcType(fc_type),
            type_extension,
            flags,
            originator_pa,
            responder_pa,
            service_params: params,
        },
    ))
}

impl ProcessLogin {
    fn parse(p: &[u8]) -> Result<ProcessLogin, WireError> {
        check_len(p, 4)?;
        let page_len = usize::from(p[1]);
        let payload_len = usize::from(be::u16_at(p, 2));
        if page_len != 16 {
            return Err(WireError::BadLength {
                what: "PRLI page length",
                len: page_len,
            });
        }
        if payload_len < 4 || (payload_len - 4) % 16 != 0 || payload_len > p.len() {
            return Err(WireError::BadLength {
                what: "PRLI payload length",
                len: payload_len,
            });
        }
        let n = (payload_len - 4) / 16;
        let (_, pages) = nom::multi::count(parse_page, n)
            .parse(&p[4..payload_len])
            .map_err(nom_err)?;
        Ok(ProcessLogin { pages })
    }

    fn buffer_len(&self) -> usize {
        4 + 16 * self.pages.len()
    }

    fn emit(&self, p: &mut [u8]) {
        p[1] = 16;
        be::put_u16(p, 2, self.buffer_len() as u16);
        for (k, pg) in self.pages.iter().enumerate() {
            let b = &mut p[4 + 16 * k..4 + 16 * (k + 1)];
            b[0] = pg.fc_type.0;
            b[1] = pg.type_extension;
            b[2] = pg.flags;
            b[3] = 0;
            be::put_u32(b, 4, pg.originator_pa);
            be::put_u32(b, 8, pg.responder_pa);
            be::put_u32(b, 12, pg.service_params);
        }
    }
}

/// ADISC payload and its LS_ACC (FC-LS-3 §4.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Adisc {
    /// Hard address of the sender.
    pub hard_address: FcId,
    /// Port name.
    pub port_name: Wwn,
    /// Node name.
    pub node_name: Wwn,
    /// N_Port_ID.
    pub n_port_id: FcId,
}

/// RSCN address formats (FC-LS-3 Table 122).
#[allow(missing_docs)]
pub mod rscn_format {
    pub const PORT: u8 = 0;
    pub const AREA: u8 = 1;
    pub const DOMAIN: u8 = 2;
    pub const FABRIC: u8 = 3;
}

/// An RSCN affected-address page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RscnPage {
    /// RSCN event qualifier (4 bits).
    pub event_qualifier: u8,
    /// Address format ([`rscn_format`], 2 bits).
    pub address_format: u8,
    /// The affected N_Port_ID, area, domain or fabric.
    pub affected: FcId,
}

/// RSCN payload (FC-LS-3 §4.2.31).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Rscn {
    /// Affected address pages.
    pub pages: Vec<RscnPage>,
}

/// SCR registration functions (FC-LS-3 Table 148).
#[allow(missing_docs)]
pub mod scr_function {
    pub const FABRIC_DETECTED: u8 = 1;
    pub const N_PORT_DETECTED: u8 = 2;
    pub const FULL: u8 = 3;
    pub const CLEAR: u8 = 255;
}

/// SCR payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scr {
    /// Registration function ([`scr_function`]).
    pub function: u8,
}

/// RRQ or REC payload: an exchange named by originator, OX_ID and RX_ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExchangeRef {
    /// The exchange originator's N_Port_ID.
    pub originator: FcId,
    /// OX_ID.
    pub ox_id: OxId,
    /// RX_ID.
    pub rx_id: RxId,
}

/// REC LS_ACC (FC-LS-3 §4.2.24).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RecAcc {
    /// OX_ID.
    pub ox_id: OxId,
    /// RX_ID.
    pub rx_id: RxId,
    /// Originator address identifier.
    pub originator: FcId,
    /// Responder address identifier.
    pub responder: FcId,
    /// FC4VALUE: for FCP, the data transfer count.
    pub fc4_value: u32,
    /// E_STAT, the exchange status.
    pub e_stat: u32,
}

/// Link error status block (FC-LS-3 §4.2.29, RLS LS_ACC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lesb {
    /// Link failure count.
    pub link_failure: u32,
    /// Loss-of-synchronization count.
    pub loss_of_sync: u32,
    /// Loss-of-signal count.
    pub loss_of_signal: u32,
    /// Primitive sequence protocol error count.
    pub primitive_sequence_error: u32,
    /// Invalid transmission word count.
    pub invalid_transmission_word: u32,
    /// Invalid CRC count.
    pub invalid_crc: u32,
}

/// SRR, the FCP sequence retransmission request (FCP-4 §11.3), an FC-4
/// link service carried with R_CTL 32h and TYPE 08h in the ELS format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Srr {
    /// OX_ID of the exchange to recover.
    pub ox_id: OxId,
    /// RX_ID of the exchange to recover.
    pub rx_id: RxId,
    /// Relative offset to retransmit from.
    pub relative_offset: u32,
    /// R_CTL of the IU to retransmit.
    pub r_ctl: u8,
}

/// The body of an LS_ACC, by the request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LsAcc {
    /// Just the accept word (LOGO, SCR, RRQ, RSCN, …).
    Plain,
    /// FLOGI/FDISC/PLOGI accept: service parameters.
    Login(LoginParams),
    /// PRLI or PRLO accept: pages with response codes.
    ProcessLogin(ProcessLogin),
    /// ADISC accept.
    Adisc(Adisc),
    /// ECHO accept: the echoed data.
    Echo(Bytes),
    /// REC accept.
    Rec(RecAcc),
    /// RLS accept.
    Rls(Lesb),
    /// Unknown request: every byte after the command code (so the
    /// request-specific bytes 1–3 of the accept word survive too).
    Opaque(Bytes),
}

/// An ELS payload's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElsRepr {
    /// LS_RJT.
    LsRjt(LsRjt),
    /// LS_ACC.
    LsAcc(LsAcc),
    /// PLOGI.
    Plogi(LoginParams),
    /// FLOGI.
    Flogi(LoginParams),
    /// FDISC.
    Fdisc(LoginParams),
    /// LOGO.
    Logo(Logo),
    /// PRLI.
    Prli(ProcessLogin),
    /// PRLO.
    Prlo(ProcessLogin),
    /// ADISC.
    Adisc(Adisc),
    /// RSCN.
    Rscn(Rscn),
    /// SCR.
    Scr(Scr),
    /// RRQ.
    Rrq(ExchangeRef),
    /// ECHO with its data.
    Echo(Bytes),
    /// REC.
    Rec(ExchangeRef),
    /// RLS for an N_Port_ID.
    Rls(FcId),
    /// SRR (FCP link service).
    Srr(Srr),
    /// Any other command: the whole payload, command word included.
    Other(Bytes),
}

fn parse_exchange_ref(p: &[u8]) -> Result<ExchangeRef, WireError> {
    check_len(p, 12)?;
    Ok(ExchangeRef {
        originator: FcId::new(be::u24_at(p, 5)),
        ox_id: OxId(be::u16_at(p, 8)),
        rx_id: RxId(be::u16_at(p, 10)),
    })
}

fn emit_exchange_ref(r: &ExchangeRef, p: &mut [u8]) {
    p[4] = 0;
    be::put_u24(p, 5, r.originator.get());
    be::put_u16(p, 8, r.ox_id.0);
    be::put_u16(p, 10, r.rx_id.0);
}

fn parse_adisc(p: &[u8]) -> Result<Adisc, WireError> {
    check_len(p, 28)?;
    Ok(Adisc {
        hard_address: FcId::new(be::u24_at(p, 5)),
        port_name: Wwn(be::u64_at(p, 8)),
        node_name: Wwn(be::u64_at(p, 16)),
        n_port_id: FcId::new(be::u24_at(p, 25)),
    })
}

fn emit_adisc(a: &Adisc, p: &mut [u8]) {
    p[4] = 0;
    be::put_u24(p, 5, a.hard_address.get());
    be::put_u64(p, 8, a.port_name.0);
    be::put_u64(p, 16, a.node_name.0);
    p[24] = 0;
    be::put_u24(p, 25, a.n_port_id.get());
}

fn parse_rscn(p: &[u8]) -> Result<Rscn, WireError> {
    check_len(p, 4)?;
    let page_len = usize::from(p[1]);
    let payload_len = usize::from(be::u16_at(p, 2));
    if page_len != 4 {
        return Err(WireError::BadLength {
            what: "RSCN page length",
            len: page_len,
        });
    }
    if payload_len < 4 || payload_len % 4 != 0 || payload_len > p.len() {
        return Err(WireError::BadLength {
            what: "RSCN payload length",
            len: payload_len,
        });
    }
    let n = (payload_len - 4) / 4;
    let page = |i| -> nom::IResult<&[u8], RscnPage, NomErr<'_>> {
        let (i, (flags, a, b, c)) = (be_u8, be_u8, be_u8, be_u8).parse(i)?;
        Ok((
            i,
            RscnPage {
                event_qualifier: (flags >> 2) & 0x0f,
                address_format: flags & 0x03,
                affected: FcId::from_parts(a, b, c),
            },
        ))
    };
    let (_, pages) = nom::multi::count(page, n)
        .parse(&p[4..payload_len])
        .map_err(nom_err)?;
    Ok(Rscn { pages })
}

fn parse_lesb(p: &[u8]) -> Result<Lesb, WireError> {
    check_len(p, 28)?;
    let (_, (a, b, c, d, e, f)) = (be_u32, be_u32, be_u32, be_u32, be_u32, be_u32)
        .parse(&p[4..28])
        .map_err(nom_err)?;
    Ok(Lesb {
        link_failure: a,
        loss_of_sync: b,
        loss_of_signal: c,
        primitive_sequence_error: d,
        invalid_transmission_word: e,
        invalid_crc: f,
    })
}

impl ElsRepr {
    /// Parses an ELS payload. `answering` is the code of the request an
    /// LS_ACC answers, when known.
    pub fn parse(payload: &Bytes, answering: Option<ElsCode>) -> Result<ElsRepr, WireError> {
        let p = &payload[..];
        check_len(p, 4)?;
        if p.len() > super::MAX_PAYLOAD {
            return Err(WireError::PayloadTooLong(p.len()));
        }
        let code = ElsCode(p[0]);
        Ok(match code {
            ElsCode::LS_RJT => {
                check_len(p, 8)?;
                ElsRepr::LsRjt(LsRjt {
                    reason: LsRjtReason(p[5]),
                    explanation: LsRjtExplanation(p[6]),
                    vendor: p[7],
                })
            }
            ElsCode::LS_ACC => ElsRepr::LsAcc(match answering {
                Some(ElsCode::PLOGI | ElsCode::FLOGI | ElsCode::FDISC) => {
                    LsAcc::Login(LoginParams::parse(p)?)
                }
                Some(ElsCode::PRLI | ElsCode::PRLO) => LsAcc::ProcessLogin(ProcessLogin::parse(p)?),
                Some(ElsCode::ADISC) => LsAcc::Adisc(parse_adisc(p)?),
                Some(ElsCode::ECHO) => LsAcc::Echo(payload.slice(4..)),
                Some(ElsCode::REC) => {
                    check_len(p, 24)?;
                    LsAcc::Rec(RecAcc {
                        ox_id: OxId(be::u16_at(p, 4)),
                        rx_id: RxId(be::u16_at(p, 6)),
                        originator: FcId::new(be::u24_at(p, 9)),
                        responder: FcId::new(be::u24_at(p, 13)),
                        fc4_value: be::u32_at(p, 16),
                        e_stat: be::u32_at(p, 20),
                    })
                }
                Some(ElsCode::RLS) => LsAcc::Rls(parse_lesb(p)?),
                Some(
                    ElsCode::LOGO
                    | ElsCode::SCR
                    | ElsCode::RRQ
                    | ElsCode::RSCN
                    | ElsCode::SRR
                    | ElsCode::LS_ACC,
                ) => LsAcc::Plain,
                _ => LsAcc::Opaque(payload.slice(1..)),
            }),
            ElsCode::PLOGI => ElsRepr::Plogi(LoginParams::parse(p)?),
            ElsCode::FLOGI => ElsRepr::Flogi(LoginParams::parse(p)?),
            ElsCode::FDISC => ElsRepr::Fdisc(LoginParams::parse(p)?),
            ElsCode::LOGO => {
                check_len(p, 16)?;
                ElsRepr::Logo(Logo {
                    n_port_id: FcId::new(be::u24_at(p, 5)),
                    port_name: Wwn(be::u64_at(p, 8)),
                })
            }
            ElsCode::PRLI => ElsRepr::Prli(ProcessLogin::parse(p)?),
            ElsCode::PRLO => ElsRepr::Prlo(ProcessLogin::parse(p)?),
            ElsCode::ADISC => ElsRepr::Adisc(parse_adisc(p)?),
            ElsCode::RSCN => ElsRepr::Rscn(parse_rscn(p)?),
            ElsCode::SCR => {
                check_len(p, 8)?;
                ElsRepr::Scr(Scr { function: p[7] })
            }
            ElsCode::RRQ => ElsRepr::Rrq(parse_exchange_ref(p)?),
            ElsCode::REC => ElsRepr::Rec(parse_exchange_ref(p)?),
            ElsCode::ECHO => ElsRepr::Echo(payload.slice(4..)),
            ElsCode::RLS => {
                check_len(p, 8)?;
                ElsRepr::Rls(FcId::new(be::u24_at(p, 5)))
            }
            ElsCode::SRR => {
                check_len(p, 16)?;
                ElsRepr::Srr(Srr {
                    ox_id: OxId(be::u16_at(p, 4)),
                    rx_id: RxId(be::u16_at(p, 6)),
                    relative_offset: be::u32_at(p, 8),
                    r_ctl: p[12],
                })
            }
            _ => ElsRepr::Other(payload.clone()),
        })
    }

    /// The command code of this payload.
    pub fn code(&self) -> ElsCode {
        match self {
            ElsRepr::LsRjt(_) => ElsCode::LS_RJT,
            ElsRepr::LsAcc(_) => ElsCode::LS_ACC,
            ElsRepr::Plogi(_) => ElsCode::PLOGI,
            ElsRepr::Flogi(_) => ElsCode::FLOGI,
            ElsRepr::Fdisc(_) => ElsCode::FDISC,
            ElsRepr::Logo(_) => ElsCode::LOGO,
            ElsRepr::Prli(_) => ElsCode::PRLI,
            ElsRepr::Prlo(_) => ElsCode::PRLO,
            ElsRepr::Adisc(_) => ElsCode::ADISC,
            ElsRepr::Rscn(_) => ElsCode::RSCN,
            ElsRepr::Scr(_) => ElsCode::SCR,
            ElsRepr::Rrq(_) => ElsCode::RRQ,
            ElsRepr::Echo(_) => ElsCode::ECHO,
            ElsRepr::Rec(_) => ElsCode::REC,
            ElsRepr::Rls(_) => ElsCode::RLS,
            ElsRepr::Srr(_) => ElsCode::SRR,
            ElsRepr::Other(p) => ElsCode(p.first().copied().unwrap_or(0)),
        }
    }

    /// True for a reply (LS_ACC / LS_RJT), sent with R_CTL 23h.
    pub fn is_reply(&self) -> bool {
        matches!(self, ElsRepr::LsAcc(_) | ElsRepr::LsRjt(_))
    }

    /// Payload length in bytes.
    pub fn buffer_len(&self) -> usize {
        match self {
            ElsRepr::LsRjt(_) => 8,
            ElsRepr::LsAcc(a) => match a {
                LsAcc::Plain => 4,
                LsAcc::Login(_) => LOGIN_PAYLOAD_LEN,
                LsAcc::ProcessLogin(p) => p.buffer_len(),
                LsAcc::Adisc(_) => 28,
                LsAcc::Echo(d) => 4 + d.len(),
                LsAcc::Opaque(d) => 1 + d.len(),
                LsAcc::Rec(_) => 24,
                LsAcc::Rls(_) => 28,
            },
            ElsRepr::Plogi(_) | ElsRepr::Flogi(_) | ElsRepr::Fdisc(_) => LOGIN_PAYLOAD_LEN,
            ElsRepr::Logo(_) => 16,
            ElsRepr::Prli(p) | ElsRepr::Prlo(p) => p.buffer_len(),
            ElsRepr::Adisc(_) => 28,
            ElsRepr::Rscn(r) => 4 + 4 * r.pages.len(),
            ElsRepr::Scr(_) | ElsRepr::Rls(_) => 8,
            ElsRepr::Rrq(_) | ElsRepr::Rec(_) => 12,
            ElsRepr::Srr(_) => 16,
            ElsRepr::Echo(d) => 4 + d.len(),
            ElsRepr::Other(p) => p.len(),
        }
    }

    /// Writes the payload into `buf` (at least [`ElsRepr::buffer_len`]
    /// bytes; the rest is left alone).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        check_len(buf, n)?;
        if n > super::MAX_PAYLOAD {
            return Err(WireError::PayloadTooLong(n));
        }
        let p = &mut buf[..n];
        p.fill(0);
        if let ElsRepr::Other(raw) = self {
            p.copy_from_slice(raw);
            return Ok(());
        }
        p[0] = self.code().0;
        match self {
            ElsRepr::LsRjt(r) => {
                p[5] = r.reason.0;
                p[6] = r.explanation.0;
                p[7] = r.vendor;
            }
            ElsRepr::LsAcc(a) => match a {
                LsAcc::Plain => {}
                LsAcc::Login(l) => l.emit(p),
                LsAcc::ProcessLogin(pl) => pl.emit(p),
                LsAcc::Adisc(ad) => emit_adisc(ad, p),
                LsAcc::Echo(d) => p[4..].copy_from_slice(d),
                LsAcc::Opaque(d) => p[1..].copy_from_slice(d),
                LsAcc::Rec(r) => {
                    be::put_u16(p, 4, r.ox_id.0);
                    be::put_u16(p, 6, r.rx_id.0);
                    be::put_u24(p, 9, r.originator.get());
                    be::put_u24(p, 13, r.responder.get());
                    be::put_u32(p, 16, r.fc4_value);
                    be::put_u32(p, 20, r.e_stat);
                }
                LsAcc::Rls(l) => {
                    for (k, v) in [
                        l.link_failure,
                        l.loss_of_sync,
                        l.loss_of_signal,
                        l.primitive_sequence_error,
                        l.invalid_transmission_word,
                        l.invalid_crc,
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        be::put_u32(p, 4 + 4 * k, v);
                    }
                }
            },
            ElsRepr::Plogi(l) | ElsRepr::Flogi(l) | ElsRepr::Fdisc(l) => l.emit(p),
            ElsRepr::Logo(l) => {
                be::put_u24(p, 5, l.n_port_id.get());
                be::put_u64(p, 8, l.port_name.0);
            }
            ElsRepr::Prli(pl) | ElsRepr::Prlo(pl) => pl.emit(p),
            ElsRepr::Adisc(a) => emit_adisc(a, p),
            ElsRepr::Rscn(r) => {
                p[1] = 4;
                be::put_u16(p, 2, n as u16);
                for (k, pg) in r.pages.iter().enumerate() {
                    let at = 4 + 4 * k;
                    p[at] = ((pg.event_qualifier & 0x0f) << 2) | (pg.address_format & 0x03);
                    be::put_u24(p, at + 1, pg.affected.get());
                }
            }
            ElsRepr::Scr(s) => p[7] = s.function,
            ElsRepr::Rrq(r) | ElsRepr::Rec(r) => emit_exchange_ref(r, p),
            ElsRepr::Echo(d) => p[4..].copy_from_slice(d),
            ElsRepr::Rls(id) => be::put_u24(p, 5, id.get()),
            ElsRepr::Srr(s) => {
                be::put_u16(p, 4, s.ox_id.0);
                be::put_u16(p, 6, s.rx_id.0);
                be::put_u32(p, 8, s.relative_offset);
                p[12] = s.r_ctl;
            }
            ElsRepr::Other(_) => {}
        }
        Ok(())
    }

    /// The payload as a new buffer (control-path convenience).
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(Bytes::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(e: &ElsRepr, answering: Option<ElsCode>) -> Bytes {
        let b = e.to_bytes().unwrap();
        assert_eq!(&ElsRepr::parse(&b, answering).unwrap(), e, "{b:02x?}");
        // Every truncation of a fixed-size payload fails cleanly.
        for n in 0..b.len() {
            let _ = ElsRepr::parse(&b.slice(..n), answering);
        }
        b
    }

    /// fcoe-t11.pcap frame 1, the FLOGI payload.
    fn captured_flogi() -> Vec<u8> {
        let mut p = vec![0u8; 116];
        p[..12].copy_from_slice(&[4, 0, 0, 0, 0x20, 0x20, 0x00, 0x10, 0x80, 0x00, 0x08, 0x00]);
        p[20..36].copy_from_slice(&[
            0x10, 0, 0, 0, 0xc9, 0x53, 0xe1, 0x62, 0x20, 0, 0, 0, 0xc9, 0x53, 0xe1, 0x62,
        ]);
        p[49] = 1;
        p[52..66].copy_from_slice(&[0x88, 0, 0, 0, 0, 0, 0x08, 0, 0, 0xff, 0, 0x0c, 0, 1]);
        p[68..82].copy_from_slice(&[0x88, 0, 0, 0, 0, 0, 0x08, 0, 0, 0xff, 0, 0, 0, 1]);
        p
    }

    #[test]
    fn captured_flogi_deconstructs() {
        let b = Bytes::from(captured_flogi());
        let ElsRepr::Flogi(l) = ElsRepr::parse(&b, None).unwrap() else {
            panic!("not a FLOGI")
        };
        assert_eq!(l.common.bb_credit, 16);
        assert_eq!(l.common.rx_data_field_size, 2048);
        assert!(
            l.common
                .features
                .contains(CommonFeatures::CONTINUOUSLY_INCREASING_OFFSET)
        );
        assert_eq!(l.port_name, Wwn(0x1000_0000_c953_e162));
        assert_eq!(l.node_name, Wwn(0x2000_0000_c953_e162));
        assert!(!l.classes[0].is_valid());
        assert_eq!(l.classes[0].open_sequences_per_exchange, 1);
        assert!(l.classes[1].is_valid() && l.class3().is_valid());
        assert_eq!(l.classes[1].end_to_end_credit, 12);
        assert_eq!(l.class3().rx_data_field_size, 2048);
        assert_eq!(l.class3().concurrent_sequences, 255);
        assert_eq!(l.class3().open_sequences_per_exchange, 1);
        assert_eq!(ElsRepr::Flogi(l).to_bytes().unwrap(), b);
        for n in 0..116 {
            assert!(ElsRepr::parse(&b.slice(..n), None).is_err());
        }
    }

    #[test]
    fn every_request_round_trips() {
        let l = LoginParams::n_port(
            Wwn(0x2100_0000_0000_0001),
            Wwn(0x2000_0000_0000_0001),
            2048,
            2000,
        );
        round_trip(&ElsRepr::Plogi(l), None);
        round_trip(&ElsRepr::Fdisc(l), None);
        round_trip(&ElsRepr::LsAcc(LsAcc::Login(l)), Some(ElsCode::PLOGI));
        round_trip(
            &ElsRepr::Logo(Logo {
                n_port_id: FcId::new(0x010100),
                port_name: l.port_name,
            }),
            None,
        );
        let prli = ProcessLogin {
            pages: vec![ServiceParamPage::fcp(
                page_flags::ESTABLISH_IMAGE_PAIR,
                FcpServiceParams::INITIATOR_FUNCTION | FcpServiceParams::READ_XFER_RDY_DISABLED,
            )],
        };
        let b = round_trip(&ElsRepr::Prli(prli.clone()), None);
        assert_eq!(&b[..4], &[0x20, 0x10, 0x00, 0x14]);
        round_trip(&ElsRepr::Prlo(prli.clone()), None);
        round_trip(
            &ElsRepr::LsAcc(LsAcc::ProcessLogin(prli)),
            Some(ElsCode::PRLI),
        );
        let ad = Adisc {
            hard_address: FcId::new(0),
            port_name: l.port_name,
            node_name: l.node_name,
            n_port_id: FcId::new(0x010200),
        };
        round_trip(&ElsRepr::Adisc(ad), None);
        round_trip(&ElsRepr::LsAcc(LsAcc::Adisc(ad)), Some(ElsCode::ADISC));
        let b = round_trip(
            &ElsRepr::Rscn(Rscn {
                pages: vec![
                    RscnPage {
                        event_qualifier: 0,
                        address_format: rscn_format::PORT,
                        affected: FcId::new(0x010300),
                    },
                    RscnPage {
                        event_qualifier: 4,
                        address_format: rscn_format::FABRIC,
                        affected: FcId::new(0),
                    },
                ],
            }),
            None,
        );
        assert_eq!(&b[..4], &[0x61, 4, 0, 12]);
        round_trip(
            &ElsRepr::Scr(Scr {
                function: scr_function::FULL,
            }),
            None,
        );
        let x = ExchangeRef {
            originator: FcId::new(0x010100),
            ox_id: OxId(7),
            rx_id: RxId(9),
        };
        round_trip(&ElsRepr::Rrq(x), None);
        round_trip(&ElsRepr::Rec(x), None);
        round_trip(
            &ElsRepr::LsAcc(LsAcc::Rec(RecAcc {
                ox_id: OxId(7),
                rx_id: RxId(9),
                originator: FcId::new(1),
                responder: FcId::new(2),
                fc4_value: 4096,
                e_stat: 0x2000_0000,
            })),
            Some(ElsCode::REC),
        );
        round_trip(&ElsRepr::Echo(Bytes::from_static(b"ping")), None);
        round_trip(
            &ElsRepr::LsAcc(LsAcc::Echo(Bytes::from_static(b"ping"))),
            Some(ElsCode::ECHO),
        );
        round_trip(&ElsRepr::Rls(FcId::new(0x010100)), None);
        round_trip(
            &ElsRepr::Srr(Srr {
                ox_id: OxId(1),
                rx_id: RxId(2),
                relative_offset: 8192,
                r_ctl: 0x01,
            }),
            None,
        );
        round_trip(
            &ElsRepr::LsAcc(LsAcc::Rls(Lesb {
                link_failure: 1,
                loss_of_sync: 2,
                loss_of_signal: 3,
                primitive_sequence_error: 4,
                invalid_transmission_word: 5,
                invalid_crc: 6,
            })),
            Some(ElsCode::RLS),
        );
        round_trip(&ElsRepr::LsAcc(LsAcc::Plain), Some(ElsCode::LOGO));
        round_trip(
            &ElsRepr::LsRjt(LsRjt::new(
                LsRjtReason::UNABLE_TO_PERFORM,
                LsRjtExplanation::N_PORT_LOGIN_REQUIRED,
            )),
            None,
        );
        round_trip(
            &ElsRepr::Other(Bytes::from_static(&[0x78, 0, 0, 0, 0xdf, 0, 0, 0])),
            None,
        );
    }

    #[test]
    fn bad_lengths_are_refused() {
        // PRLI whose payload length is not 4 + 16n.
        let b = Bytes::from_static(&[0x20, 0x10, 0x00, 0x15, 0, 0, 0, 0]);
        assert!(matches!(
            ElsRepr::parse(&b, None),
            Err(WireError::BadLength { .. })
        ));
        let e = ElsRepr::parse(&b, None).unwrap_err();
        assert_eq!(LsRjt::from(&e).reason, LsRjtReason::PROTOCOL_ERROR);
        // RSCN with a page length other than 4.
        let b = Bytes::from_static(&[0x61, 0x08, 0x00, 0x08, 0, 1, 2, 3]);
        assert!(ElsRepr::parse(&b, None).is_err());
        assert!(ElsRepr::parse(&Bytes::from_static(&[1, 0]), None).is_err());
    }
}
