//! Operational parameter negotiation (RFC 7143 §6.2, §13; RFC 7144
//! `iSCSIProtocolLevel`; RFC 4850 `X#NodeArchitecture`).
//!
//! One engine, [`Negotiator`], serves both roles: it answers the peer's
//! offers (target answering an initiator, or an initiator answering the keys
//! a target offers), makes offers of its own and checks the answers it gets
//! back. The result is a typed [`SessionParams`] (session-wide) and
//! [`ConnectionParams`] (per connection).
//!
//! The key table [`KEYS`] holds, for every key of RFC 7143 §12–13, its value
//! type and range, default, who may send it, where it may be used, its scope
//! and its result function.
//!
//! Decisions where the RFC leaves room (documented so they can be revisited):
//! - A numerical or list offer that is out of range or malformed is answered
//!   `Reject`. §6.2 leaves the parameter at its default; here it settles as
//!   if we had offered our own value and been answered the default (the
//!   smaller or larger number, the Boolean our value decides, the default
//!   of a list only if it is among ours, else no agreement), so that a
//!   peer's bad offer cannot leave the session outside our limits. Our own
//!   offers left unanswered, or answered `Reject`, `Irrelevant` or
//!   `NotUnderstood`, settle the same way.
//! - A key the negotiator does not know is answered `NotUnderstood`, X- and
//!   X# extension keys included (except `X#NodeArchitecture`, recorded).
//! - A key sent by the wrong party, an initialize-only key in full feature
//!   phase, or a full-feature-only key during login, is answered `Reject`.
//! - A leading-only key on a non-leading connection is answered `Irrelevant`
//!   (the session-wide value stands), as is a key irrelevant to a discovery
//!   session.
//! - The obsolete marker keys (OFMarker, IFMarker, OFMarkInt, IFMarkInt) are
//!   answered `Reject` (RFC 7143 §13.25: SHOULD for the markers, MUST for
//!   the intervals; never `NotUnderstood`).
//! - A key negotiated twice in one negotiation (login, or one text exchange
//!   in full feature phase) is a protocol error: [`NegotiationError::Duplicate`]
//!   (Login Status 0x0200).
//! - As responder we always answer, even when the offer alone decides a
//!   Boolean result; as originator we accept a missing answer only in that
//!   case.
//! - FirstBurstLength is clamped to the negotiated MaxBurstLength.

use std::fmt;

use thiserror::Error;

use crate::text::{
    self, KeyValue, Special, TextParams, bool_str, list_items, parse_bool, parse_number,
};

/// Which side of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The iSCSI initiator.
    Initiator,
    /// The iSCSI target.
    Target,
}

/// Where a text exchange takes place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Login, security negotiation stage (CSG 0).
    Security,
    /// Login, operational negotiation stage (CSG 1).
    Operational,
    /// Text negotiation in full feature phase.
    FullFeature,
}

/// Where a key may be used (RFC 7143 §13 "Use").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyUse {
    /// IO: during login only.
    InitializeOnly,
    /// LO: during login of the leading connection only.
    LeadingOnly,
    /// ALL: during login and full feature phase.
    All,
    /// FFPO: in full feature phase only.
    FullFeatureOnly,
}

/// Who may send a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Senders {
    /// Only the initiator.
    Initiator,
    /// Only the target.
    Target,
    /// Both.
    Both,
}

impl Senders {
    fn allows(self, role: Role) -> bool {
        matches!(
            (self, role),
            (Senders::Both, _)
                | (Senders::Initiator, Role::Initiator)
                | (Senders::Target, Role::Target)
        )
    }
}

/// Scope of a negotiated value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// SW: the whole session.
    Session,
    /// CO: one connection.
    Connection,
}

/// How the outcome is computed from offer and answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultFn {
    /// The smaller number.
    Min,
    /// The larger number.
    Max,
    /// Boolean AND.
    And,
    /// Boolean OR.
    Or,
    /// The first value of the offered list the responder supports.
    ListFirstMatch,
    /// Not negotiated: each side declares its own value.
    Declarative,
    /// Obsolete key, answered `Reject`.
    Obsolete,
}

/// Type and legal range of a key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// `Yes` or `No`.
    Bool,
    /// A number in `min..=max`.
    Number {
        /// Smallest legal value.
        min: u64,
        /// Largest legal value.
        max: u64,
    },
    /// A list of values from a known set.
    List(&'static [&'static str]),
    /// An iSCSI name (`iqn.`, `eui.`, `naa.`).
    IscsiName,
    /// Free UTF-8 text (aliases).
    Text,
    /// `domainname[:port][,portal-group-tag]`.
    Address,
    /// `All`, an iSCSI name, or empty (SendTargets).
    SendTargets,
    /// One of the given values.
    Enum(&'static [&'static str]),
    /// Anything (obsolete, extension or security keys handled elsewhere).
    Opaque,
}

/// Every key the negotiator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Key {
    /// HeaderDigest (§13.1).
    HeaderDigest,
    /// DataDigest (§13.1).
    DataDigest,
    /// MaxConnections (§13.2).
    MaxConnections,
    /// SendTargets (§13.3).
    SendTargets,
    /// TargetName (§13.4).
    TargetName,
    /// InitiatorName (§13.5).
    InitiatorName,
    /// TargetAlias (§13.6).
    TargetAlias,
    /// InitiatorAlias (§13.7).
    InitiatorAlias,
    /// TargetAddress (§13.8).
    TargetAddress,
    /// TargetPortalGroupTag (§13.9).
    TargetPortalGroupTag,
    /// InitialR2T (§13.10).
    InitialR2T,
    /// ImmediateData (§13.11).
    ImmediateData,
    /// MaxRecvDataSegmentLength (§13.12).
    MaxRecvDataSegmentLength,
    /// MaxBurstLength (§13.13).
    MaxBurstLength,
    /// FirstBurstLength (§13.14).
    FirstBurstLength,
    /// DefaultTime2Wait (§13.15).
    DefaultTime2Wait,
    /// DefaultTime2Retain (§13.16).
    DefaultTime2Retain,
    /// MaxOutstandingR2T (§13.17).
    MaxOutstandingR2T,
    /// DataPDUInOrder (§13.18).
    DataPduInOrder,
    /// DataSequenceInOrder (§13.19).
    DataSequenceInOrder,
    /// ErrorRecoveryLevel (§13.20).
    ErrorRecoveryLevel,
    /// SessionType (§13.21).
    SessionType,
    /// TaskReporting (§13.23).
    TaskReporting,
    /// iSCSIProtocolLevel (§13.24, RFC 7144).
    IscsiProtocolLevel,
    /// X#NodeArchitecture (§13.26, RFC 4850).
    NodeArchitecture,
    /// OFMarker (RFC 3720, obsolete).
    OfMarker,
    /// IFMarker (RFC 3720, obsolete).
    IfMarker,
    /// OFMarkInt (RFC 3720, obsolete).
    OfMarkInt,
    /// IFMarkInt (RFC 3720, obsolete).
    IfMarkInt,
    /// AuthMethod (§12.1).
    AuthMethod,
    /// CHAP_A (§12.1.3).
    ChapA,
    /// CHAP_I.
    ChapI,
    /// CHAP_C.
    ChapC,
    /// CHAP_N.
    ChapN,
    /// CHAP_R.
    ChapR,
}

/// The definition of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    /// The key.
    pub key: Key,
    /// Its name on the wire.
    pub name: &'static str,
    /// Value type and range.
    pub kind: ValueKind,
    /// Default value (empty when none).
    pub default: &'static str,
    /// Where it may be used.
    pub usage: KeyUse,
    /// Who may send it.
    pub senders: Senders,
    /// Session- or connection-wide.
    pub scope: Scope,
    /// Result function.
    pub result: ResultFn,
    /// Answered `Irrelevant` in a discovery session.
    pub irrelevant_in_discovery: bool,
    /// A security key (security negotiation stage only).
    pub security: bool,
}

const LIMIT_24: u64 = (1 << 24) - 1;
const DIGESTS: &[&str] = &["None", "CRC32C"];
const AUTH_METHODS: &[&str] = &["None", "CHAP", "SRP", "KRB5", "SPKM1", "SPKM2"];
const TASK_REPORTING: &[&str] = &["RFC3720", "ResponseFence", "FastAbort"];

#[allow(clippy::too_many_arguments)]
const fn def(
    key: Key,
    name: &'static str,
    kind: ValueKind,
    default: &'static str,
    usage: KeyUse,
    senders: Senders,
    scope: Scope,
    result: ResultFn,
    irrelevant_in_discovery: bool,
) -> KeyDef {
    KeyDef {
        key,
        name,
        kind,
        default,
        usage,
        senders,
        scope,
        result,
        irrelevant_in_discovery,
        security: false,
    }
}

const fn sec(key: Key, name: &'static str, kind: ValueKind, result: ResultFn) -> KeyDef {
    KeyDef {
        key,
        name,
        kind,
        default: "",
        usage: KeyUse::InitializeOnly,
        senders: Senders::Both,
        scope: Scope::Connection,
        result,
        irrelevant_in_discovery: false,
        security: true,
    }
}

use KeyUse::{All, FullFeatureOnly, InitializeOnly, LeadingOnly};
use ResultFn::{And, Declarative, ListFirstMatch, Max, Min, Obsolete, Or};
use Scope::{Connection as Co, Session as Sw};
use ValueKind::{Bool, Number};

/// The key table (RFC 7143 §12.1, §13; RFC 7144; RFC 4850).
pub static KEYS: &[KeyDef] = &[
    def(
        Key::HeaderDigest,
        "HeaderDigest",
        ValueKind::List(DIGESTS),
        "None",
        InitializeOnly,
        Senders::Both,
        Co,
        ListFirstMatch,
        false,
    ),
    def(
        Key::DataDigest,
        "DataDigest",
        ValueKind::List(DIGESTS),
        "None",
        InitializeOnly,
        Senders::Both,
        Co,
        ListFirstMatch,
        false,
    ),
    def(
        Key::MaxConnections,
        "MaxConnections",
        Number { min: 1, max: 65535 },
        "1",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        true,
    ),
    def(
        Key::SendTargets,
        "SendTargets",
        ValueKind::SendTargets,
        "",
        FullFeatureOnly,
        Senders::Initiator,
        Sw,
        Declarative,
        false,
    ),
    // TargetName: IO by initiator, FFPO by target (in SendTargets answers).
    def(
        Key::TargetName,
        "TargetName",
        ValueKind::IscsiName,
        "",
        All,
        Senders::Both,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::InitiatorName,
        "InitiatorName",
        ValueKind::IscsiName,
        "",
        InitializeOnly,
        Senders::Initiator,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::TargetAlias,
        "TargetAlias",
        ValueKind::Text,
        "",
        All,
        Senders::Target,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::InitiatorAlias,
        "InitiatorAlias",
        ValueKind::Text,
        "",
        All,
        Senders::Initiator,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::TargetAddress,
        "TargetAddress",
        ValueKind::Address,
        "",
        All,
        Senders::Target,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::TargetPortalGroupTag,
        "TargetPortalGroupTag",
        Number { min: 0, max: 65535 },
        "",
        InitializeOnly,
        Senders::Target,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::InitialR2T,
        "InitialR2T",
        Bool,
        "Yes",
        LeadingOnly,
        Senders::Both,
        Sw,
        Or,
        true,
    ),
    def(
        Key::ImmediateData,
        "ImmediateData",
        Bool,
        "Yes",
        LeadingOnly,
        Senders::Both,
        Sw,
        And,
        true,
    ),
    def(
        Key::MaxRecvDataSegmentLength,
        "MaxRecvDataSegmentLength",
        Number {
            min: 512,
            max: LIMIT_24,
        },
        "8192",
        All,
        Senders::Both,
        Co,
        Declarative,
        false,
    ),
    def(
        Key::MaxBurstLength,
        "MaxBurstLength",
        Number {
            min: 512,
            max: LIMIT_24,
        },
        "262144",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        true,
    ),
    def(
        Key::FirstBurstLength,
        "FirstBurstLength",
        Number {
            min: 512,
            max: LIMIT_24,
        },
        "65536",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        true,
    ),
    def(
        Key::DefaultTime2Wait,
        "DefaultTime2Wait",
        Number { min: 0, max: 3600 },
        "2",
        LeadingOnly,
        Senders::Both,
        Sw,
        Max,
        false,
    ),
    def(
        Key::DefaultTime2Retain,
        "DefaultTime2Retain",
        Number { min: 0, max: 3600 },
        "20",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        false,
    ),
    def(
        Key::MaxOutstandingR2T,
        "MaxOutstandingR2T",
        Number { min: 1, max: 65535 },
        "1",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        true,
    ),
    def(
        Key::DataPduInOrder,
        "DataPDUInOrder",
        Bool,
        "Yes",
        LeadingOnly,
        Senders::Both,
        Sw,
        Or,
        true,
    ),
    def(
        Key::DataSequenceInOrder,
        "DataSequenceInOrder",
        Bool,
        "Yes",
        LeadingOnly,
        Senders::Both,
        Sw,
        Or,
        true,
    ),
    def(
        Key::ErrorRecoveryLevel,
        "ErrorRecoveryLevel",
        Number { min: 0, max: 2 },
        "0",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        false,
    ),
    def(
        Key::SessionType,
        "SessionType",
        ValueKind::Enum(&["Discovery", "Normal"]),
        "Normal",
        LeadingOnly,
        Senders::Initiator,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::TaskReporting,
        "TaskReporting",
        ValueKind::List(TASK_REPORTING),
        "RFC3720",
        LeadingOnly,
        Senders::Both,
        Sw,
        ListFirstMatch,
        true,
    ),
    def(
        Key::IscsiProtocolLevel,
        "iSCSIProtocolLevel",
        Number { min: 0, max: 31 },
        "0",
        LeadingOnly,
        Senders::Both,
        Sw,
        Min,
        true,
    ),
    def(
        Key::NodeArchitecture,
        "X#NodeArchitecture",
        ValueKind::Opaque,
        "",
        LeadingOnly,
        Senders::Both,
        Sw,
        Declarative,
        false,
    ),
    def(
        Key::OfMarker,
        "OFMarker",
        ValueKind::Opaque,
        "No",
        InitializeOnly,
        Senders::Both,
        Co,
        Obsolete,
        false,
    ),
    def(
        Key::IfMarker,
        "IFMarker",
        ValueKind::Opaque,
        "No",
        InitializeOnly,
        Senders::Both,
        Co,
        Obsolete,
        false,
    ),
    def(
        Key::OfMarkInt,
        "OFMarkInt",
        ValueKind::Opaque,
        "",
        InitializeOnly,
        Senders::Both,
        Co,
        Obsolete,
        false,
    ),
    def(
        Key::IfMarkInt,
        "IFMarkInt",
        ValueKind::Opaque,
        "",
        InitializeOnly,
        Senders::Both,
        Co,
        Obsolete,
        false,
    ),
    sec(
        Key::AuthMethod,
        "AuthMethod",
        ValueKind::List(AUTH_METHODS),
        ListFirstMatch,
    ),
    sec(Key::ChapA, "CHAP_A", ValueKind::Opaque, ListFirstMatch),
    sec(Key::ChapI, "CHAP_I", ValueKind::Opaque, Declarative),
    sec(Key::ChapC, "CHAP_C", ValueKind::Opaque, Declarative),
    sec(Key::ChapN, "CHAP_N", ValueKind::Opaque, Declarative),
    sec(Key::ChapR, "CHAP_R", ValueKind::Opaque, Declarative),
];

impl Key {
    /// The definition of this key.
    pub fn def(self) -> &'static KeyDef {
        // The table holds every variant; fall back to the first entry only
        // if the table were ever out of step (covered by a test).
        KEYS.iter().find(|d| d.key == self).unwrap_or(&KEYS[0])
    }

    /// The key's name on the wire.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    /// Look a key up by its wire name.
    pub fn from_name(name: &str) -> Option<Key> {
        KEYS.iter().find(|d| d.name == name).map(|d| d.key)
    }

    fn index(self) -> usize {
        KEYS.iter().position(|d| d.key == self).unwrap_or(0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A digest (RFC 7143 §13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Digest {
    /// No digest.
    #[default]
    None,
    /// CRC32C.
    Crc32c,
}

impl Digest {
    /// Its name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }

    /// Parse a name.
    pub fn from_name(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }

    /// Bytes it adds after a header or data segment.
    pub const fn wire_len(self) -> usize {
        match self {
            Digest::None => 0,
            Digest::Crc32c => 4,
        }
    }

    /// True for [`Digest::None`].
    pub const fn is_none(self) -> bool {
        matches!(self, Digest::None)
    }
}

/// TaskReporting values (RFC 7143 §13.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TaskReporting {
    /// RFC3720 semantics.
    #[default]
    Rfc3720,
    /// ResponseFence.
    ResponseFence,
    /// FastAbort.
    FastAbort,
}

impl TaskReporting {
    /// Its name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskReporting::Rfc3720 => "RFC3720",
            TaskReporting::ResponseFence => "ResponseFence",
            TaskReporting::FastAbort => "FastAbort",
        }
    }

    /// Parse a name.
    pub fn from_name(s: &str) -> Option<TaskReporting> {
        match s {
            "RFC3720" => Some(TaskReporting::Rfc3720),
            "ResponseFence" => Some(TaskReporting::ResponseFence),
            "FastAbort" => Some(TaskReporting::FastAbort),
            _ => None,
        }
    }
}

/// SessionType (RFC 7143 §13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionType {
    /// A discovery session: SendTargets only.
    Discovery,
    /// A normal session.
    #[default]
    Normal,
}

impl SessionType {
    /// Its name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            SessionType::Discovery => "Discovery",
            SessionType::Normal => "Normal",
        }
    }

    /// Parse a name.
    pub fn from_name(s: &str) -> Option<SessionType> {
        match s {
            "Discovery" => Some(SessionType::Discovery),
            "Normal" => Some(SessionType::Normal),
            _ => None,
        }
    }
}

/// Session-wide operational parameters after negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionParams {
    /// Discovery or normal.
    pub session_type: SessionType,
    /// MaxConnections.
    pub max_connections: u16,
    /// InitialR2T: unsolicited data needs an R2T first when true.
    pub initial_r2t: bool,
    /// ImmediateData: data may ride with the SCSI Command PDU.
    pub immediate_data: bool,
    /// MaxBurstLength, bytes.
    pub max_burst_length: u32,
    /// FirstBurstLength, bytes (≤ max_burst_length).
    pub first_burst_length: u32,
    /// DefaultTime2Wait, seconds.
    pub default_time2wait: u16,
    /// DefaultTime2Retain, seconds.
    pub default_time2retain: u16,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u16,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel (0..=2).
    pub error_recovery_level: u8,
    /// TaskReporting.
    pub task_reporting: TaskReporting,
    /// iSCSIProtocolLevel (0 = RFC 3720, 1 = RFC 7143, 2 = RFC 7144).
    pub protocol_level: u8,
}

impl Default for SessionParams {
    /// The RFC 7143 defaults.
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: TaskReporting::Rfc3720,
            protocol_level: 0,
        }
    }
}

/// Per-connection parameters after negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionParams {
    /// HeaderDigest in use from the first PDU after the final Login Response.
    pub header_digest: Digest,
    /// DataDigest in use from the first PDU after the final Login Response.
    pub data_digest: Digest,
    /// MaxRecvDataSegmentLength the initiator declared: the largest data
    /// segment the target may send it.
    pub initiator_max_recv_data_segment_length: u32,
    /// MaxRecvDataSegmentLength the target declared: the largest data
    /// segment the initiator may send it.
    pub target_max_recv_data_segment_length: u32,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            header_digest: Digest::None,
            data_digest: Digest::None,
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
        }
    }
}

impl ConnectionParams {
    /// The largest data segment `role` may send on this connection.
    pub fn max_send_data_segment_length(&self, role: Role) -> u32 {
        match role {
            Role::Initiator => self.target_max_recv_data_segment_length,
            Role::Target => self.initiator_max_recv_data_segment_length,
        }
    }

    /// The largest data segment `role` accepts on this connection.
    pub fn max_recv_data_segment_length(&self, role: Role) -> u32 {
        match role {
            Role::Initiator => self.initiator_max_recv_data_segment_length,
            Role::Target => self.target_max_recv_data_segment_length,
        }
    }
}

/// Local limits and preferences, given to the negotiator by the session layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiationLimits {
    /// Acceptable header digests, most preferred first.
    pub header_digests: Vec<Digest>,
    /// Acceptable data digests, most preferred first.
    pub data_digests: Vec<Digest>,
    /// Largest MaxConnections we accept.
    pub max_connections: u16,
    /// Our InitialR2T preference.
    pub initial_r2t: bool,
    /// Our ImmediateData preference.
    pub immediate_data: bool,
    /// The MaxRecvDataSegmentLength we declare.
    pub max_recv_data_segment_length: u32,
    /// Largest MaxBurstLength we accept.
    pub max_burst_length: u32,
    /// Largest FirstBurstLength we accept.
    pub first_burst_length: u32,
    /// Our DefaultTime2Wait.
    pub default_time2wait: u16,
    /// Our DefaultTime2Retain.
    pub default_time2retain: u16,
    /// Largest MaxOutstandingR2T we accept.
    pub max_outstanding_r2t: u16,
    /// Our DataPDUInOrder preference (No = we can take data out of order).
    pub data_pdu_in_order: bool,
    /// Our DataSequenceInOrder preference.
    pub data_sequence_in_order: bool,
    /// Highest ErrorRecoveryLevel we implement.
    pub error_recovery_level: u8,
    /// TaskReporting values we support, most preferred first.
    pub task_reporting: Vec<TaskReporting>,
    /// Highest iSCSIProtocolLevel we implement (2 = RFC 7144 task
    /// management functions supported).
    pub protocol_level: u8,
}

impl Default for NegotiationLimits {
    fn default() -> Self {
        NegotiationLimits {
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::None, Digest::Crc32c],
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: vec![TaskReporting::Rfc3720],
            protocol_level: 2,
        }
    }
}

/// Errors of the negotiation layer: each ends the login (or is a Reject in
/// full feature phase).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NegotiationError {
    /// A key was sent twice in one negotiation (RFC 7143 §6.2).
    #[error("key {key} negotiated more than once")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// The peer answered one of our offers with a value outside what the
    /// result function allows.
    #[error("illegal answer {value:?} for {key}")]
    IllegalAnswer {
        /// The key.
        key: &'static str,
        /// The answer received.
        value: String,
    },
    /// A value a session cannot run without could not be agreed.
    #[error("no acceptable value for {key}")]
    NoAgreement {
        /// The key.
        key: &'static str,
    },
    /// The text itself was malformed.
    #[error(transparent)]
    Text(#[from] text::TextError),
}

impl NegotiationError {
    /// The Login Status (class, detail) to answer with: all are initiator
    /// errors (0x0200).
    pub fn login_status(&self) -> (u8, u8) {
        (0x02, 0x00)
    }

    /// The Reject reason in full feature phase: Protocol Error.
    pub fn reject_reason(&self) -> u8 {
        0x04
    }
}

/// One answer or offer to send: owned key and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// Key.
    pub key: String,
    /// Value.
    pub value: String,
}

impl Pair {
    /// A pair.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Pair {
            key: key.into(),
            value: value.into(),
        }
    }
}

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyState {
    /// Not touched in this negotiation.
    Idle,
    /// We offered this value and wait for the answer.
    Offered(String),
    /// Settled.
    Done,
}

/// What [`Negotiator::receive`] produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received<'a> {
    /// Answers to the peer's offers, in the order of the offers.
    pub answers: Vec<Pair>,
    /// Pairs the negotiator does not own (security keys, SendTargets,
    /// identity keys: InitiatorName, TargetName, SessionType, aliases,
    /// TargetAddress, TargetPortalGroupTag), for the caller.
    pub others: Vec<KeyValue<'a>>,
}

/// The negotiation engine of one connection (RFC 7143 §6.2).
#[derive(Debug, Clone)]
pub struct Negotiator {
    role: Role,
    limits: NegotiationLimits,
    leading: bool,
    session: SessionParams,
    conn: ConnectionParams,
    state: Vec<KeyState>,
    declared_mrdsl: bool,
    peer_node_architecture: Option<String>,
}

fn answer_special(key: &str, s: Special) -> Pair {
    Pair::new(key, s.as_str())
}

impl Negotiator {
    /// A negotiator for one connection. `leading` is false for a connection
    /// added to an existing session; then `session` should be the session's
    /// parameters (leading-only keys are not renegotiated).
    pub fn new(role: Role, limits: NegotiationLimits, leading: bool) -> Self {
        Negotiator {
            role,
            limits,
            leading,
            session: SessionParams::default(),
            conn: ConnectionParams::default(),
            state: vec![KeyState::Idle; KEYS.len()],
            declared_mrdsl: false,
            peer_node_architecture: None,
        }
    }

    /// Start a non-leading connection from the session's parameters.
    pub fn with_session(mut self, session: SessionParams) -> Self {
        self.session = session;
        self
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The local limits.
    pub fn limits(&self) -> &NegotiationLimits {
        &self.limits
    }

    /// Set the session type (from the initiator's SessionType key).
    pub fn set_session_type(&mut self, t: SessionType) {
        self.session.session_type = t;
    }

    /// Is this the leading connection?
    pub fn leading(&self) -> bool {
        self.leading
    }

    /// The peer's X#NodeArchitecture declaration, if any.
    pub fn peer_node_architecture(&self) -> Option<&str> {
        self.peer_node_architecture.as_deref()
    }

    /// Session parameters negotiated so far.
    pub fn session_params(&self) -> SessionParams {
        self.session
    }

    /// Connection parameters negotiated so far.
    pub fn connection_params(&self) -> ConnectionParams {
        self.conn
    }

    /// Keys we offered that have not been answered yet.
    pub fn pending(&self) -> impl Iterator<Item = Key> + '_ {
        KEYS.iter()
            .zip(&self.state)
            .filter(|(_, s)| matches!(s, KeyState::Offered(_)))
            .map(|(d, _)| d.key)
    }

    /// Start a new text negotiation in full feature phase: keys may be
    /// negotiated again.
    pub fn reset_for_text_negotiation(&mut self) {
        for s in &mut self.state {
            *s = KeyState::Idle;
        }
        self.declared_mrdsl = false;
    }

    fn state(&self, k: Key) -> &KeyState {
        self.state.get(k.index()).unwrap_or(&KeyState::Done)
    }

    fn set_state(&mut self, k: Key, s: KeyState) {
        if let Some(slot) = self.state.get_mut(k.index()) {
            *slot = s;
        }
    }

    fn is_discovery(&self) -> bool {
        self.session.session_type == SessionType::Discovery
    }

    /// Handle one received text (all PDUs of one request or response
    /// joined). Pairs that answer our offers settle them; the others are
    /// offers (or declarations) from the peer and get answers.
    pub fn receive<'a>(
        &mut self,
        params: &TextParams<'a>,
        phase: Phase,
    ) -> Result<Received<'a>, NegotiationError> {
        if let Some(k) = params.first_duplicate()
            && !matches!(k, "TargetName" | "TargetAddress" | "TargetAlias")
        {
            return Err(NegotiationError::Duplicate { key: k.to_string() });
        }
        let mut out = Received::default();
        for kv in params {
            self.receive_one(kv, phase, &mut out)?;
        }
        // FirstBurstLength is irrelevant when InitialR2T=Yes and
        // ImmediateData=No (RFC 7143 §13.14): no unsolicited data at all.
        if self.session.initial_r2t
            && !self.session.immediate_data
            && let Some(a) = out.answers.iter_mut().find(|a| a.key == "FirstBurstLength")
        {
            a.value = Special::Irrelevant.as_str().to_string();
            // Both sides then keep the default (clamped below).
            self.session.first_burst_length = SessionParams::default().first_burst_length;
        }
        // FirstBurstLength ≤ MaxBurstLength (RFC 7143 §13.14).
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
            let fbl = self.session.first_burst_length.to_string();
            if let Some(a) = out
                .answers
                .iter_mut()
                .find(|a| a.key == "FirstBurstLength" && a.value != "Irrelevant")
            {
                a.value = fbl;
            }
        }
        Ok(out)
    }

    fn receive_one<'a>(
        &mut self,
        kv: &KeyValue<'a>,
        phase: Phase,
        out: &mut Received<'a>,
    ) -> Result<(), NegotiationError> {
        let Some(key) = Key::from_name(kv.key) else {
            // Unknown key, including X- and X# extensions.
            if kv.special().is_none() {
                out.answers
                    .push(answer_special(kv.key, Special::NotUnderstood));
            }
            return Ok(());
        };
        let d = key.def();
        // Keys handled by the caller.
        if d.security
            || matches!(
                key,
                Key::SendTargets
                    | Key::TargetName
                    | Key::InitiatorName
                    | Key::SessionType
                    | Key::InitiatorAlias
                    | Key::TargetAlias
                    | Key::TargetAddress
                    | Key::TargetPortalGroupTag
            )
        {
            out.others.push(*kv);
            return Ok(());
        }
        let peer = match self.role {
            Role::Initiator => Role::Target,
            Role::Target => Role::Initiator,
        };
        // An answer to our offer?
        if let KeyState::Offered(ours) = self.state(key).clone() {
            self.settle_answer(key, &ours, kv.value)?;
            self.set_state(key, KeyState::Done);
            return Ok(());
        }
        if *self.state(key) == KeyState::Done {
            return Err(NegotiationError::Duplicate {
                key: kv.key.to_string(),
            });
        }
        self.set_state(key, KeyState::Done);
        if let Some(s) = kv.special() {
            // A special value offered unprompted: nothing to answer; the
            // key settles within our values as after a Reject (below).
            let _ = s;
            return self.settle_refused_offer(key);
        }
        let answer = |v: &str| Pair::new(d.name, v);
        if !d.senders.allows(peer) {
            out.answers.push(answer("Reject"));
            return Ok(());
        }
        match (d.usage, phase) {
            (KeyUse::FullFeatureOnly, Phase::Security | Phase::Operational)
            | (KeyUse::InitializeOnly | KeyUse::LeadingOnly, Phase::FullFeature) => {
                out.answers.push(answer("Reject"));
                return Ok(());
            }
            _ => {}
        }
        if d.result == ResultFn::Obsolete {
            out.answers.push(answer("Reject"));
            return Ok(());
        }
        if d.usage == KeyUse::LeadingOnly && !self.leading {
            out.answers.push(answer("Irrelevant"));
            return Ok(());
        }
        if d.irrelevant_in_discovery && self.is_discovery() {
            out.answers.push(answer("Irrelevant"));
            return Ok(());
        }
        match self.respond(key, kv.value) {
            Some(v) => {
                if d.result != ResultFn::Declarative
                    || key == Key::MaxRecvDataSegmentLength && !self.declared_mrdsl
                {
                    out.answers.push(Pair::new(d.name, v));
                }
                if key == Key::MaxRecvDataSegmentLength {
                    self.declared_mrdsl = true;
                }
            }
            None => {
                out.answers.push(answer("Reject"));
                self.settle_refused_offer(key)?;
            }
        }
        Ok(())
    }

    /// A peer's offer we could not take (malformed, out of range, or a
    /// special value): the key settles as if we had offered our own value
    /// and been answered the default, so that it stays within our limits
    /// (or there is no agreement), rather than at a default we may not
    /// support, a digest we require, say, left at None.
    fn settle_refused_offer(&mut self, key: Key) -> Result<(), NegotiationError> {
        match self.local_value(key) {
            Some(ours) => self.settle_unanswered(key, &ours),
            None => Ok(()),
        }
    }

    /// Compute our answer to the peer's offer `value` for `key`, and record
    /// the outcome. `None` means `Reject` (malformed or out of range).
    fn respond(&mut self, key: Key, value: &str) -> Option<String> {
        let d = key.def();
        let lim = &self.limits;
        match key {
            Key::HeaderDigest | Key::DataDigest => {
                let ours = if key == Key::HeaderDigest {
                    &lim.header_digests
                } else {
                    &lim.data_digests
                };
                let pick = list_items(value)
                    .filter_map(Digest::from_name)
                    .find(|d| ours.contains(d))?;
                if key == Key::HeaderDigest {
                    self.conn.header_digest = pick;
                } else {
                    self.conn.data_digest = pick;
                }
                Some(pick.as_str().to_string())
            }
            Key::TaskReporting => {
                let pick = list_items(value)
                    .filter_map(TaskReporting::from_name)
                    .find(|t| lim.task_reporting.contains(t))?;
                self.session.task_reporting = pick;
                Some(pick.as_str().to_string())
            }
            Key::InitialR2T
            | Key::ImmediateData
            | Key::DataPduInOrder
            | Key::DataSequenceInOrder => {
                let offer = parse_bool(value).ok()?;
                let local = match key {
                    Key::InitialR2T => lim.initial_r2t,
                    Key::ImmediateData => lim.immediate_data,
                    Key::DataPduInOrder => lim.data_pdu_in_order,
                    _ => lim.data_sequence_in_order,
                };
                let r = if d.result == ResultFn::And {
                    offer && local
                } else {
                    offer || local
                };
                self.set_bool(key, r);
                Some(bool_str(r).to_string())
            }
            Key::MaxRecvDataSegmentLength => {
                let n = self.number_in_range(d, value)?;
                let n = u32::try_from(n).ok()?;
                match self.role {
                    Role::Target => self.conn.initiator_max_recv_data_segment_length = n,
                    Role::Initiator => self.conn.target_max_recv_data_segment_length = n,
                }
                // Our answer is our own declaration.
                Some(self.limits.max_recv_data_segment_length.to_string())
            }
            Key::NodeArchitecture => {
                self.peer_node_architecture = Some(value.to_string());
                Some(String::new())
            }
            _ => {
                let offer = self.number_in_range(d, value)?;
                let local: u64 = match key {
                    Key::MaxConnections => lim.max_connections.into(),
                    Key::MaxBurstLength => lim.max_burst_length.into(),
                    Key::FirstBurstLength => lim.first_burst_length.into(),
                    Key::DefaultTime2Wait => lim.default_time2wait.into(),
                    Key::DefaultTime2Retain => lim.default_time2retain.into(),
                    Key::MaxOutstandingR2T => lim.max_outstanding_r2t.into(),
                    Key::ErrorRecoveryLevel => lim.error_recovery_level.into(),
                    Key::IscsiProtocolLevel => lim.protocol_level.into(),
                    _ => return None,
                };
                let r = match d.result {
                    ResultFn::Min => offer.min(local),
                    ResultFn::Max => offer.max(local),
                    _ => return None,
                };
                self.set_number(key, r);
                Some(r.to_string())
            }
        }
    }

    fn number_in_range(&self, d: &KeyDef, value: &str) -> Option<u64> {
        let n = parse_number(value).ok()?;
        match d.kind {
            ValueKind::Number { min, max } if (min..=max).contains(&n) => Some(n),
            _ => None,
        }
    }

    fn set_bool(&mut self, key: Key, v: bool) {
        match key {
            Key::InitialR2T => self.session.initial_r2t = v,
            Key::ImmediateData => self.session.immediate_data = v,
            Key::DataPduInOrder => self.session.data_pdu_in_order = v,
            Key::DataSequenceInOrder => self.session.data_sequence_in_order = v,
            _ => {}
        }
    }

    fn set_number(&mut self, key: Key, v: u64) {
        let v16 = u16::try_from(v).unwrap_or(u16::MAX);
        let v32 = u32::try_from(v).unwrap_or(u32::MAX);
        match key {
            Key::MaxConnections => self.session.max_connections = v16,
            Key::MaxBurstLength => self.session.max_burst_length = v32,
            Key::FirstBurstLength => self.session.first_burst_length = v32,
            Key::DefaultTime2Wait => self.session.default_time2wait = v16,
            Key::DefaultTime2Retain => self.session.default_time2retain = v16,
            Key::MaxOutstandingR2T => self.session.max_outstanding_r2t = v16,
            Key::ErrorRecoveryLevel => {
                self.session.error_recovery_level = u8::try_from(v).unwrap_or(0)
            }
            Key::IscsiProtocolLevel => self.session.protocol_level = u8::try_from(v).unwrap_or(0),
            _ => {}
        }
    }

    /// Check the peer's answer to our offer and record the outcome.
    fn settle_answer(
        &mut self,
        key: Key,
        ours: &str,
        answer: &str,
    ) -> Result<(), NegotiationError> {
        let d = key.def();
        let illegal = || NegotiationError::IllegalAnswer {
            key: d.name,
            value: answer.to_string(),
        };
        if let Some(s) = Special::from_value(answer) {
            // Reject / Irrelevant / NotUnderstood: as if the peer had
            // answered the key's default (see `settle_unanswered`).
            let _ = s;
            return self.settle_unanswered(key, ours);
        }
        match d.result {
            ResultFn::Declarative => {
                if key == Key::MaxRecvDataSegmentLength {
                    let n = self.number_in_range(d, answer).ok_or_else(illegal)?;
                    let n = u32::try_from(n).map_err(|_| illegal())?;
                    match self.role {
                        Role::Target => self.conn.initiator_max_recv_data_segment_length = n,
                        Role::Initiator => self.conn.target_max_recv_data_segment_length = n,
                    }
                    self.declared_mrdsl = true;
                }
                Ok(())
            }
            ResultFn::ListFirstMatch => {
                if !list_items(ours).any(|o| o == answer) {
                    return Err(illegal());
                }
                match key {
                    Key::HeaderDigest => {
                        self.conn.header_digest = Digest::from_name(answer).ok_or_else(illegal)?
                    }
                    Key::DataDigest => {
                        self.conn.data_digest = Digest::from_name(answer).ok_or_else(illegal)?
                    }
                    Key::TaskReporting => {
                        self.session.task_reporting =
                            TaskReporting::from_name(answer).ok_or_else(illegal)?
                    }
                    _ => {}
                }
                Ok(())
            }
            ResultFn::And | ResultFn::Or => {
                let offer = parse_bool(ours).map_err(|_| illegal())?;
                let a = parse_bool(answer).map_err(|_| illegal())?;
                // AND: an offer of No forces No; OR: an offer of Yes forces Yes.
                if d.result == ResultFn::And && !offer && a
                    || d.result == ResultFn::Or && offer && !a
                {
                    return Err(illegal());
                }
                self.set_bool(key, a);
                Ok(())
            }
            ResultFn::Min | ResultFn::Max => {
                let offer = parse_number(ours).map_err(|_| illegal())?;
                let a = self.number_in_range(d, answer).ok_or_else(illegal)?;
                if d.result == ResultFn::Min && a > offer || d.result == ResultFn::Max && a < offer
                {
                    return Err(illegal());
                }
                self.set_number(key, a);
                Ok(())
            }
            ResultFn::Obsolete => Ok(()),
        }
    }

    /// An offer the peer did not answer (or answered Reject, Irrelevant or
    /// NotUnderstood) settles as if the peer had answered the key's default
    /// value: a Boolean the offer alone decides keeps the offer, a number
    /// is the smaller (Min) or larger (Max) of the offer and the default,
    /// and a list keeps the default only if we offered it. A peer cannot so
    /// leave the session on a value outside what we offered (no digest where
    /// we require CRC32C, bursts beyond our MaxBurstLength): where the
    /// default is not among our values there is no agreement.
    fn settle_unanswered(&mut self, key: Key, ours: &str) -> Result<(), NegotiationError> {
        let d = key.def();
        match d.result {
            ResultFn::And | ResultFn::Or => {
                if let Ok(offer) = parse_bool(ours)
                    && (d.result == ResultFn::And && !offer || d.result == ResultFn::Or && offer)
                {
                    self.set_bool(key, offer);
                }
            }
            ResultFn::Min | ResultFn::Max => {
                if let (Ok(offer), Ok(default)) = (parse_number(ours), parse_number(d.default)) {
                    self.set_number(
                        key,
                        if d.result == ResultFn::Min {
                            offer.min(default)
                        } else {
                            offer.max(default)
                        },
                    );
                }
            }
            ResultFn::ListFirstMatch => {
                if !d.default.is_empty() && !list_items(ours).any(|o| o == d.default) {
                    return Err(NegotiationError::NoAgreement { key: d.name });
                }
            }
            ResultFn::Declarative | ResultFn::Obsolete => {}
        }
        Ok(())
    }

    /// Close the negotiation: offers never answered are settled as if the
    /// peer had answered the default (`settle_unanswered`), which fails
    /// where the default is not among the values we offered. Returns the
    /// final parameters.
    pub fn finish(&mut self) -> Result<(SessionParams, ConnectionParams), NegotiationError> {
        let pending: Vec<(Key, String)> = KEYS
            .iter()
            .zip(&self.state)
            .filter_map(|(d, s)| match s {
                KeyState::Offered(v) => Some((d.key, v.clone())),
                _ => None,
            })
            .collect();
        for (k, v) in pending {
            self.set_state(k, KeyState::Done);
            self.settle_unanswered(k, &v)?;
        }
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
        }
        match self.role {
            Role::Target => {
                self.conn.target_max_recv_data_segment_length =
                    self.limits.max_recv_data_segment_length
            }
            Role::Initiator => {
                self.conn.initiator_max_recv_data_segment_length =
                    self.limits.max_recv_data_segment_length
            }
        }
        Ok((self.session, self.conn))
    }

    fn offer(&mut self, key: Key, value: String, out: &mut Vec<Pair>) {
        let d = key.def();
        // A declaration of ours leaves the key open for the peer's own
        // declaration; a negotiated key waits for the answer.
        if d.result != ResultFn::Declarative {
            self.set_state(key, KeyState::Offered(value.clone()));
        }
        out.push(Pair::new(d.name, value));
    }

    fn local_value(&self, key: Key) -> Option<String> {
        let l = &self.limits;
        let list = |v: &[Digest]| v.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(",");
        Some(match key {
            Key::HeaderDigest => list(&l.header_digests),
            Key::DataDigest => list(&l.data_digests),
            Key::MaxConnections => l.max_connections.to_string(),
            Key::InitialR2T => bool_str(l.initial_r2t).into(),
            Key::ImmediateData => bool_str(l.immediate_data).into(),
            Key::MaxRecvDataSegmentLength => l.max_recv_data_segment_length.to_string(),
            Key::MaxBurstLength => l.max_burst_length.to_string(),
            Key::FirstBurstLength => l.first_burst_length.min(l.max_burst_length).to_string(),
            Key::DefaultTime2Wait => l.default_time2wait.to_string(),
            Key::DefaultTime2Retain => l.default_time2retain.to_string(),
            Key::MaxOutstandingR2T => l.max_outstanding_r2t.to_string(),
            Key::DataPduInOrder => bool_str(l.data_pdu_in_order).into(),
            Key::DataSequenceInOrder => bool_str(l.data_sequence_in_order).into(),
            Key::ErrorRecoveryLevel => l.error_recovery_level.to_string(),
            Key::TaskReporting => l
                .task_reporting
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(","),
            Key::IscsiProtocolLevel => l.protocol_level.to_string(),
            _ => return None,
        })
    }

    fn offerable(&self, key: Key) -> bool {
        let d = key.def();
        *self.state(key) == KeyState::Idle
            && (self.leading || d.usage != KeyUse::LeadingOnly)
            && !(d.irrelevant_in_discovery && self.is_discovery())
    }

    /// The initiator's operational offers: every key that applies to this
    /// connection and session type, with our preferred values.
    pub fn initiator_offers(&mut self) -> Vec<Pair> {
        const ORDER: &[Key] = &[
            Key::HeaderDigest,
            Key::DataDigest,
            Key::MaxRecvDataSegmentLength,
            Key::DefaultTime2Wait,
            Key::DefaultTime2Retain,
            Key::ErrorRecoveryLevel,
            Key::InitialR2T,
            Key::ImmediateData,
            Key::MaxBurstLength,
            Key::FirstBurstLength,
            Key::MaxOutstandingR2T,
            Key::MaxConnections,
            Key::DataPduInOrder,
            Key::DataSequenceInOrder,
            Key::TaskReporting,
            Key::IscsiProtocolLevel,
        ];
        let mut out = Vec::new();
        for &k in ORDER {
            if k == Key::MaxRecvDataSegmentLength && self.declared_mrdsl {
                continue;
            }
            if self.offerable(k)
                && let Some(v) = self.local_value(k)
            {
                if k == Key::MaxRecvDataSegmentLength {
                    self.declared_mrdsl = true;
                }
                self.offer(k, v, &mut out);
            }
        }
        out
    }

    /// The target's own offers, made after answering the initiator's first
    /// operational request: its MaxRecvDataSegmentLength declaration, and
    /// any key the initiator did not offer whose default our limits cannot
    /// accept (for instance MaxBurstLength below 262144, or a required
    /// CRC32C digest).
    pub fn target_offers(&mut self) -> Vec<Pair> {
        let mut out = Vec::new();
        if !self.declared_mrdsl {
            self.declared_mrdsl = true;
            out.push(Pair::new(
                "MaxRecvDataSegmentLength",
                self.limits.max_recv_data_segment_length.to_string(),
            ));
        }
        let candidates: Vec<Key> = KEYS
            .iter()
            .filter(|d| {
                !d.security
                    && !d.default.is_empty()
                    && !matches!(d.result, ResultFn::Declarative | ResultFn::Obsolete)
                    && d.usage != KeyUse::FullFeatureOnly
            })
            .map(|d| d.key)
            .collect();
        for k in candidates {
            if !self.offerable(k) {
                continue;
            }
            // Would we change the default if it were offered to us?
            let mut probe = self.clone();
            let default = k.def().default;
            let acceptable = probe.respond(k, default).is_some_and(|v| v == default);
            if !acceptable && let Some(v) = self.local_value(k) {
                self.offer(k, v, &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::field_reassign_with_default
)]
mod tests;
