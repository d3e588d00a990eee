//! Sans-IO login state machines for both roles (RFC 7143 §6.3, §7.1,
//! §11.12–11.13).
//!
//! - [`TargetLogin`]: takes each Login Request (header repr + data
//!   segment), consults a [`LoginPolicy`] supplied by the session layer and
//!   returns the Login Response(s) to send ([`TargetStep`]); on success a
//!   [`LoginOutcome`].
//! - [`InitiatorLogin`]: the mirror: builds the requests, answers CHAP, checks
//!   the target's answers and reports redirects.
//!
//! Neither touches a socket or a clock; login timeouts are the driver's.
//!
//! Stages: SecurityNegotiation (0) → LoginOperationalNegotiation (1) →
//! FullFeaturePhase (3); either of the first two may be skipped (an
//! initiator that needs no authentication may start in stage 1, and the
//! security stage may transit straight to 3). Text longer than one PDU
//! travels with the C bit in either direction; the partner answers each
//! partial PDU with an empty one. During login both sides use 8192 bytes as
//! the data segment limit (RFC 7143 §13.12).
//!
//! Digests negotiated here take effect with the first PDU after the final
//! Login Response, in both directions.

use std::collections::VecDeque;

use bytes::Bytes;
use rand::CryptoRng;
use thiserror::Error;

use crate::chap::{
    ChapConfig, ChapCredentials, ChapError, ChapKeys, InitiatorChap, TargetChap, TargetSecrets,
};
use crate::negotiate::{
    ConnectionParams, Digest, NegotiationError, NegotiationLimits, Negotiator, Pair, Phase, Role,
    SessionParams, SessionType,
};
use crate::text::{TextAccumulator, TextError, TextParams, TextWriter, list_items, parse_number};
use crate::wire::{Digests, LoginRequest, LoginResponse, Stage};

/// The data segment limit during login (RFC 7143 §13.12 default).
pub const LOGIN_MAX_DATA_SEGMENT: usize = 8192;

/// A Login Response status: Status-Class in the high byte, Status-Detail in
/// the low byte (RFC 7143 §11.13.5). Open: any value is representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginStatus(pub u16);

impl LoginStatus {
    /// Login is proceeding.
    pub const SUCCESS: LoginStatus = LoginStatus(0x0000);
    /// The target moved temporarily (redirect).
    pub const TARGET_MOVED_TEMPORARILY: LoginStatus = LoginStatus(0x0101);
    /// The target moved permanently (redirect).
    pub const TARGET_MOVED_PERMANENTLY: LoginStatus = LoginStatus(0x0102);
    /// Miscellaneous initiator error.
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus(0x0200);
    /// Authentication failed.
    pub const AUTHENTICATION_FAILURE: LoginStatus = LoginStatus(0x0201);
    /// The initiator is not allowed access to this target.
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus(0x0202);
    /// No such target.
    pub const NOT_FOUND: LoginStatus = LoginStatus(0x0203);
    /// The target was removed.
    pub const TARGET_REMOVED: LoginStatus = LoginStatus(0x0204);
    /// Version not supported.
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus(0x0205);
    /// Too many connections in the session.
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus(0x0206);
    /// A required parameter is missing.
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus(0x0207);
    /// This connection cannot join the session.
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus(0x0208);
    /// The session type is not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus(0x0209);
    /// The session (TSIH) does not exist.
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus(0x020a);
    /// A request that is not valid during login.
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus(0x020b);
    /// Target hardware or software error.
    pub const TARGET_ERROR: LoginStatus = LoginStatus(0x0300);
    /// Service unavailable.
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus(0x0301);
    /// Out of resources.
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus(0x0302);

    /// Build from class and detail.
    pub const fn new(class: u8, detail: u8) -> Self {
        LoginStatus(((class as u16) << 8) | detail as u16)
    }

    /// Status-Class.
    pub const fn class(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// Status-Detail.
    pub const fn detail(self) -> u8 {
        (self.0 & 0xff) as u8
    }
}

impl From<&TextError> for LoginStatus {
    fn from(e: &TextError) -> Self {
        let a = crate::text::TextErrorAnswer::from(e);
        LoginStatus::new(a.status_class, a.status_detail)
    }
}

impl From<&NegotiationError> for LoginStatus {
    fn from(e: &NegotiationError) -> Self {
        let (c, d) = e.login_status();
        LoginStatus::new(c, d)
    }
}

impl From<&ChapError> for LoginStatus {
    fn from(e: &ChapError) -> Self {
        let (c, d) = e.login_status();
        LoginStatus::new(c, d)
    }
}

impl From<&LoginError> for LoginStatus {
    /// The one place where a login failure becomes the status to send.
    fn from(e: &LoginError) -> Self {
        match e {
            LoginError::Text(t) => t.into(),
            LoginError::Negotiation(n) => n.into(),
            LoginError::Chap(c) => c.into(),
            LoginError::Refused(s) => *s,
            LoginError::Protocol(_) => LoginStatus::INITIATOR_ERROR,
            LoginError::MissingParameter(_) => LoginStatus::MISSING_PARAMETER,
            LoginError::UnsupportedVersion => LoginStatus::UNSUPPORTED_VERSION,
            LoginError::AuthenticationRequired => LoginStatus::AUTHENTICATION_FAILURE,
            LoginError::TargetRejected(s) => *s,
            LoginError::Redirected {
                permanent: true, ..
            } => LoginStatus::TARGET_MOVED_PERMANENTLY,
            LoginError::Redirected { .. } => LoginStatus::TARGET_MOVED_TEMPORARILY,
        }
    }
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LoginError {
    /// Malformed text.
    #[error("text: {0}")]
    Text(#[from] TextError),
    /// Negotiation failed.
    #[error("negotiation: {0}")]
    Negotiation(#[from] NegotiationError),
    /// CHAP failed.
    #[error("chap: {0}")]
    Chap(#[from] ChapError),
    /// The policy refused with this status.
    #[error("refused with status {0:?}")]
    Refused(LoginStatus),
    /// A protocol rule was broken (stage, flags, tags).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A required key is missing.
    #[error("missing {0}")]
    MissingParameter(&'static str),
    /// No version in common.
    #[error("unsupported version")]
    UnsupportedVersion,
    /// The initiator tried to skip authentication the target requires.
    #[error("authentication required")]
    AuthenticationRequired,
    /// (Initiator) the target answered with a failure status.
    #[error("target refused with status {0:?}")]
    TargetRejected(LoginStatus),
    /// (Initiator) the target redirected us.
    #[error("redirected to {address}")]
    Redirected {
        /// TargetAddress to retry at.
        address: String,
        /// Permanent (0x0102) or temporary (0x0101).
        permanent: bool,
    },
}

/// How a target (or the discovery service) wants initiators authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthPolicy {
    /// No authentication (AuthMethod=None).
    #[default]
    None,
    /// CHAP required; `mutual` requires the initiator to authenticate us too.
    Chap {
        /// Require mutual CHAP.
        mutual: bool,
    },
    /// CHAP if the initiator offers it first, otherwise None.
    ChapOrNone,
}

/// What the session layer tells the login about a target it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// TargetAlias to declare, if any.
    pub alias: Option<String>,
    /// This portal group's tag.
    pub portal_group_tag: u16,
    /// Authentication policy.
    pub auth: AuthPolicy,
    /// Local negotiation limits for sessions to this target.
    pub limits: NegotiationLimits,
}

/// The answer of [`LoginPolicy::lookup_target`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetLookup {
    /// The target is here.
    Found(TargetConfig),
    /// The target lives elsewhere: answer with a redirect (0x0101/0x0102)
    /// carrying `TargetAddress=address`.
    Redirect {
        /// `host[:port][,tpgt]`.
        address: String,
        /// 0x0102 when true, else 0x0101.
        permanent: bool,
    },
    /// No such target (0x0203), or the status to refuse with.
    Refused(LoginStatus),
}

/// What the final step asks of the session layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitRequest<'a> {
    /// InitiatorName.
    pub initiator_name: &'a str,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH in the request: 0 for a new session (or reinstatement by ISID
    /// match), otherwise the session the connection joins.
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// Session type.
    pub session_type: SessionType,
    /// TargetName (None for discovery).
    pub target_name: Option<&'a str>,
    /// Negotiated session parameters.
    pub session: &'a SessionParams,
    /// Negotiated connection parameters.
    pub connection: &'a ConnectionParams,
}

/// The policy a session layer supplies to [`TargetLogin`].
pub trait LoginPolicy {
    /// A normal session's target by TargetName, or `None` for a discovery
    /// session (`target_name` is then `None`).
    fn lookup_target(
        &mut self,
        session_type: SessionType,
        target_name: Option<&str>,
    ) -> TargetLookup;

    /// Is `initiator_name` allowed to reach this target (None: discovery)?
    /// Called after authentication. `false` refuses with 0x0202.
    fn authorize(&mut self, initiator_name: &str, target_name: Option<&str>) -> bool;

    /// CHAP secrets for the CHAP_N the initiator sent, for this target
    /// (None: discovery). `None` = unknown name (0x0201).
    fn chap_secrets(&mut self, target_name: Option<&str>, chap_name: &str)
    -> Option<TargetSecrets>;

    /// For a connection joining an existing session (TSIH ≠ 0): the
    /// session's parameters, or the status to refuse with (0x020a session
    /// does not exist, 0x0206 too many connections, 0x0208 …).
    fn existing_session(
        &mut self,
        initiator_name: &str,
        isid: [u8; 6],
        tsih: u16,
    ) -> Result<SessionParams, LoginStatus>;

    /// The final step, before the final Login Response goes out: create the
    /// session (new TSIH), reinstate one (same InitiatorName + ISID, TSIH 0)
    /// or add the connection (TSIH ≠ 0). Returns the TSIH, or the status to
    /// refuse with.
    fn admit(&mut self, request: &AdmitRequest<'_>) -> Result<u16, LoginStatus>;
}

/// One Login Response (or Request) to send: header repr and data segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginPdu<H> {
    /// The header.
    pub header: H,
    /// The data segment (text).
    pub data: Bytes,
}

/// What a login produced when it succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias, if declared.
    pub initiator_alias: Option<String>,
    /// TargetName (None for a discovery session).
    pub target_name: Option<String>,
    /// TargetAlias, if declared.
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag.
    pub portal_group_tag: Option<u16>,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH of the session.
    pub tsih: u16,
    /// CID of this connection.
    pub cid: u16,
    /// Discovery or normal.
    pub session_type: SessionType,
    /// True for the session's first connection.
    pub leading: bool,
    /// CHAP name the initiator authenticated with, if CHAP was used.
    pub chap_name: Option<String>,
    /// Session-wide parameters.
    pub session: SessionParams,
    /// This connection's parameters.
    pub connection: ConnectionParams,
    /// Digests to switch on for every PDU after the final Login Response
    /// (both directions).
    pub digests: Digests,
    /// Next StatSN the target sends on this connection.
    pub next_stat_sn: u32,
    /// ExpCmdSN after login.
    pub exp_cmd_sn: u32,
}

fn digests(c: &ConnectionParams) -> Digests {
    Digests {
        header: c.header_digest == Digest::Crc32c,
        data: c.data_digest == Digest::Crc32c,
    }
}

fn write_pairs(w: &mut TextWriter, pairs: &[Pair]) -> Result<(), TextError> {
    for p in pairs {
        w.push(&p.key, &p.value)?;
    }
    Ok(())
}

/// Text to send, split into PDU-sized pieces with the C bit.
#[derive(Debug, Clone, Default)]
struct Outgoing {
    chunks: VecDeque<Bytes>,
}

impl Outgoing {
    fn load(&mut self, text: Vec<u8>) {
        let all = Bytes::from(text);
        let mut off = 0;
        self.chunks.clear();
        while off < all.len() {
            let end = (off + LOGIN_MAX_DATA_SEGMENT).min(all.len());
            self.chunks.push_back(all.slice(off..end));
            off = end;
        }
    }

    /// Next piece and whether more follow (C bit).
    fn next(&mut self) -> (Bytes, bool) {
        let c = self.chunks.pop_front().unwrap_or_default();
        (c, !self.chunks.is_empty())
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// Configuration of the target side of login.
#[derive(Debug, Clone)]
pub struct TargetLoginConfig {
    /// StatSN of the first Login Response.
    pub initial_stat_sn: u32,
    /// Commands the initiator may have outstanding (MaxCmdSN − ExpCmdSN + 1).
    pub cmd_window: u32,
    /// Bound on one request's text across C-bit PDUs.
    pub max_text_len: usize,
    /// CHAP settings.
    pub chap: ChapConfig,
}

impl Default for TargetLoginConfig {
    fn default() -> Self {
        TargetLoginConfig {
            initial_stat_sn: 1,
            cmd_window: 32,
            max_text_len: crate::text::DEFAULT_MAX_TEXT_LEN,
            chap: ChapConfig::default(),
        }
    }
}

/// What the target does after a Login Request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum TargetStep {
    /// Send this response; the login goes on.
    Continue(LoginPdu<LoginResponse>),
    /// Send this final response; the connection enters full feature phase
    /// (switch digests on after it is written).
    Complete(LoginPdu<LoginResponse>, LoginOutcome),
    /// Send this response (a failure status, or a redirect) and close the
    /// connection.
    Failed(LoginPdu<LoginResponse>, LoginError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TargetState {
    /// Waiting for the first request.
    Initial,
    /// In a stage.
    Stage(Stage),
    /// Finished (success or failure).
    Finished,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// AuthMethod not negotiated yet.
    Pending,
    /// AuthMethod=None agreed.
    NoneAgreed,
    /// CHAP in progress.
    Chap,
    /// Authenticated.
    Done,
}

/// The target side of one connection's login.
#[derive(Debug)]
pub struct TargetLogin {
    config: TargetLoginConfig,
    state: TargetState,
    stat_sn: u32,
    itt: u32,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    cmd_sn: u32,
    incoming: TextAccumulator,
    outgoing: Outgoing,
    /// Stage/transit of the response being sent in pieces.
    out_transit: Option<(bool, Stage, Stage)>,
    initiator_name: Option<String>,
    initiator_alias: Option<String>,
    target_name: Option<String>,
    session_type: SessionType,
    target: Option<TargetConfig>,
    negotiator: Option<Negotiator>,
    auth: Auth,
    chap: Option<TargetChap>,
    chap_name: Option<String>,
    authorized: bool,
    identity_sent: bool,
    pending_outcome: Option<LoginOutcome>,
    offered_in_operational: bool,
}

impl TargetLogin {
    /// A login on a new connection.
    pub fn new(config: TargetLoginConfig) -> Self {
        let stat_sn = config.initial_stat_sn;
        let max = config.max_text_len;
        TargetLogin {
            config,
            state: TargetState::Initial,
            stat_sn,
            itt: 0,
            isid: [0; 6],
            tsih: 0,
            cid: 0,
            cmd_sn: 0,
            incoming: TextAccumulator::new(max),
            outgoing: Outgoing::default(),
            out_transit: None,
            initiator_name: None,
            initiator_alias: None,
            target_name: None,
            session_type: SessionType::Normal,
            target: None,
            negotiator: None,
            auth: Auth::Pending,
            chap: None,
            chap_name: None,
            authorized: false,
            identity_sent: false,
            pending_outcome: None,
            offered_in_operational: false,
        }
    }

    /// Is the login over (success or failure)?
    pub fn is_finished(&self) -> bool {
        self.state == TargetState::Finished
    }

    fn response(
        &mut self,
        transit: bool,
        cont: bool,
        csg: Stage,
        nsg: Stage,
        status: LoginStatus,
        data: Bytes,
    ) -> LoginPdu<LoginResponse> {
        let header = LoginResponse {
            transit,
            continue_flag: cont,
            csg,
            nsg: if transit { nsg } else { Stage(0) },
            version_max: 0,
            version_active: 0,
            isid: self.isid,
            tsih: self.tsih,
            itt: self.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.cmd_sn,
            max_cmd_sn: self.cmd_sn.wrapping_add(self.config.cmd_window.max(1) - 1),
            status_class: status.class(),
            status_detail: status.detail(),
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        LoginPdu { header, data }
    }

    fn fail(&mut self, csg: Stage, err: LoginError) -> TargetStep {
        let status = LoginStatus::from(&err);
        let data = match &err {
            LoginError::Redirected { address, .. } => {
                let mut w = TextWriter::new();
                // An address too long for a value cannot be sent; send none.
                let _ = w.push("TargetAddress", address);
                Bytes::from(w.into_bytes())
            }
            _ => Bytes::new(),
        };
        self.state = TargetState::Finished;
        self.tsih = 0;
        let pdu = self.response(false, false, csg, Stage(0), status, data);
        TargetStep::Failed(pdu, err)
    }

    /// Handle one Login Request with its data segment (digests and padding
    /// already removed by the framer).
    pub fn handle<R: CryptoRng + ?Sized>(
        &mut self,
        req: &LoginRequest,
        data: &[u8],
        policy: &mut dyn LoginPolicy,
        rng: &mut R,
    ) -> TargetStep {
        let csg = req.csg;
        if self.state == TargetState::Finished {
            return self.fail(csg, LoginError::Protocol("login already finished"));
        }
        if self.state == TargetState::Initial {
            self.itt = req.itt;
            self.isid = req.isid;
            self.tsih = req.tsih;
            self.cid = req.cid;
            self.cmd_sn = req.cmd_sn;
            if req.version_min > 0 {
                return self.fail(csg, LoginError::UnsupportedVersion);
            }
            if !matches!(
                csg,
                Stage::SECURITY_NEGOTIATION | Stage::LOGIN_OPERATIONAL_NEGOTIATION
            ) {
                return self.fail(
                    csg,
                    LoginError::Protocol("first request must be in stage 0 or 1"),
                );
            }
            self.state = TargetState::Stage(csg);
        } else if req.isid != self.isid || req.tsih != self.tsih || req.cid != self.cid {
            return self.fail(
                csg,
                LoginError::Protocol("ISID, TSIH or CID changed during login"),
            );
        } else {
            // A new ITT is allowed for each request; echo it.
            self.itt = req.itt;
            self.cmd_sn = req.cmd_sn;
        }
        let TargetState::Stage(stage) = self.state else {
            return self.fail(csg, LoginError::Protocol("bad state"));
        };
        if csg != stage {
            return self.fail(
                csg,
                LoginError::Protocol("CSG does not match the current stage"),
            );
        }
        if req.transit && req.continue_flag {
            return self.fail(csg, LoginError::Protocol("T and C both set"));
        }
        if req.transit
            && !(req.nsg.0 > csg.0
                && matches!(
                    req.nsg,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION | Stage::FULL_FEATURE_PHASE
                ))
        {
            return self.fail(csg, LoginError::Protocol("invalid NSG"));
        }
        // Our own text still going out in pieces: the initiator answers each
        // piece with an empty request.
        if !self.outgoing.is_empty() {
            if !data.is_empty() {
                return self.fail(
                    csg,
                    LoginError::Protocol("text while the target's answer continues"),
                );
            }
            let (chunk, more) = self.outgoing.next();
            let (t, c, n) = self.out_transit.unwrap_or((false, csg, Stage(0)));
            let (t, n) = if more { (false, Stage(0)) } else { (t, n) };
            if !more && let Some(mut o) = self.pending_outcome.take() {
                // The last piece is the final response: it carries the TSIH.
                self.tsih = o.tsih;
                let pdu = self.response(t, false, c, n, LoginStatus::SUCCESS, chunk);
                o.next_stat_sn = self.stat_sn;
                self.state = TargetState::Finished;
                return TargetStep::Complete(pdu, o);
            }
            let pdu = self.response(t, more, c, n, LoginStatus::SUCCESS, chunk);
            if !more && t {
                self.state = TargetState::Stage(n);
            }
            return TargetStep::Continue(pdu);
        }
        if let Err(e) = self.incoming.push(data) {
            return self.fail(csg, e.into());
        }
        if req.continue_flag {
            // More text follows: acknowledge with an empty response.
            let pdu = self.response(
                false,
                false,
                csg,
                Stage(0),
                LoginStatus::SUCCESS,
                Bytes::new(),
            );
            return TargetStep::Continue(pdu);
        }
        let text = self.incoming.take();
        match self.process(req, &text, policy, rng) {
            Ok(step) => step,
            Err(e) => self.fail(csg, e),
        }
    }

    fn process<R: CryptoRng + ?Sized>(
        &mut self,
        req: &LoginRequest,
        text: &[u8],
        policy: &mut dyn LoginPolicy,
        rng: &mut R,
    ) -> Result<TargetStep, LoginError> {
        let csg = req.csg;
        let params = TextParams::parse_bounded(text, self.config.max_text_len)?;
        let mut out: Vec<Pair> = Vec::new();

        // Identity keys: only in the first request (they are IO/LO and may
        // not be renegotiated).
        let first = self.initiator_name.is_none();
        if first {
            self.identify(&params, policy)?;
        } else if params
            .iter()
            .any(|kv| matches!(kv.key, "InitiatorName" | "SessionType" | "TargetName"))
        {
            return Err(NegotiationError::Duplicate {
                key: "InitiatorName/SessionType/TargetName".into(),
            }
            .into());
        }

        let Some(neg) = self.negotiator.as_mut() else {
            return Err(LoginError::Protocol("no negotiator"));
        };
        let phase = if csg == Stage::SECURITY_NEGOTIATION {
            Phase::Security
        } else {
            Phase::Operational
        };
        let received = neg.receive(&params, phase)?;
        let mut answers = received.answers;

        // Security keys.
        let mut chap_keys = ChapKeys::default();
        let mut auth_method = None;
        for kv in &received.others {
            match kv.key {
                "AuthMethod" => auth_method = Some(kv.value),
                "CHAP_A" => chap_keys.a = Some(kv.value),
                "CHAP_I" => chap_keys.i = Some(kv.value),
                "CHAP_C" => chap_keys.c = Some(kv.value),
                "CHAP_N" => chap_keys.n = Some(kv.value),
                "CHAP_R" => chap_keys.r = Some(kv.value),
                "InitiatorAlias" => self.initiator_alias = Some(kv.value.to_string()),
                "InitiatorName" | "SessionType" | "TargetName" => {}
                // Target-only and FFP-only keys from the initiator.
                other => answers.push(Pair::new(other, "Reject")),
            }
        }
        if (auth_method.is_some() || !chap_keys.is_empty()) && csg != Stage::SECURITY_NEGOTIATION {
            return Err(LoginError::Protocol(
                "security keys outside the security stage",
            ));
        }
        if let Some(am) = auth_method {
            if self.auth != Auth::Pending {
                return Err(NegotiationError::Duplicate {
                    key: "AuthMethod".into(),
                }
                .into());
            }
            let auth = self.target.as_ref().map(|t| t.auth).unwrap_or_default();
            let pick = list_items(am).find(|m| {
                matches!(
                    (auth, *m),
                    (AuthPolicy::None, "None")
                        | (AuthPolicy::Chap { .. }, "CHAP")
                        | (AuthPolicy::ChapOrNone, "CHAP" | "None")
                )
            });
            match pick {
                Some("CHAP") => {
                    self.auth = Auth::Chap;
                    self.chap = Some(TargetChap::new(self.config.chap.clone()));
                    answers.push(Pair::new("AuthMethod", "CHAP"));
                }
                Some(_) => {
                    self.auth = Auth::NoneAgreed;
                    answers.push(Pair::new("AuthMethod", "None"));
                }
                None => {
                    // Nothing acceptable: the login cannot succeed.
                    return Err(LoginError::AuthenticationRequired);
                }
            }
        }
        if !chap_keys.is_empty() {
            let Some(chap) = self.chap.as_mut() else {
                return Err(LoginError::Protocol("CHAP keys without AuthMethod=CHAP"));
            };
            if let Some(a) = chap_keys.a {
                answers.extend(chap.on_algorithms(a, rng)?);
            } else {
                let require_mutual = matches!(
                    self.target.as_ref().map(|t| t.auth),
                    Some(AuthPolicy::Chap { mutual: true })
                );
                let tname = self.target_name.clone();
                let name = chap_keys.n.map(str::to_string);
                let mutual = chap.on_response(&chap_keys, |n| {
                    policy.chap_secrets(tname.as_deref(), n).map(|mut s| {
                        s.require_mutual |= require_mutual;
                        s
                    })
                })?;
                answers.extend(mutual);
                self.auth = Auth::Done;
                self.chap_name = name;
            }
        }

        // TargetPortalGroupTag and TargetAlias go in the first response.
        if !self.identity_sent
            && let Some(t) = &self.target
        {
            self.identity_sent = true;
            out.push(Pair::new(
                "TargetPortalGroupTag",
                t.portal_group_tag.to_string(),
            ));
            if let Some(a) = &t.alias {
                out.push(Pair::new("TargetAlias", a.clone()));
            }
        }
        out.extend(answers);

        // Transition.
        let mut transit = false;
        let mut nsg = Stage(0);
        if csg == Stage::SECURITY_NEGOTIATION {
            let auth_ok = matches!(self.auth, Auth::NoneAgreed | Auth::Done);
            if req.transit {
                if !auth_ok {
                    if self.auth == Auth::Pending && self.needs_auth() {
                        return Err(LoginError::AuthenticationRequired);
                    }
                    if self.auth == Auth::Pending {
                        // No AuthMethod offered and none required.
                        self.auth = Auth::NoneAgreed;
                    }
                }
                if matches!(self.auth, Auth::NoneAgreed | Auth::Done) {
                    transit = true;
                    nsg = req.nsg;
                }
            }
        } else if req.transit {
            if !self.offered_in_operational {
                self.offered_in_operational = true;
                if let Some(neg) = self.negotiator.as_mut() {
                    out.extend(neg.target_offers());
                }
            }
            let pending = self
                .negotiator
                .as_ref()
                .is_some_and(|n| n.pending().next().is_some());
            if !pending {
                transit = true;
                nsg = req.nsg;
            }
        } else if !self.offered_in_operational {
            self.offered_in_operational = true;
            if let Some(neg) = self.negotiator.as_mut() {
                out.extend(neg.target_offers());
            }
        }

        if transit && !self.authorized {
            if self.needs_auth() && self.auth != Auth::Done {
                return Err(LoginError::AuthenticationRequired);
            }
            let (Some(iname), tname) = (self.initiator_name.clone(), self.target_name.clone())
            else {
                return Err(LoginError::MissingParameter("InitiatorName"));
            };
            if !policy.authorize(&iname, tname.as_deref()) {
                return Err(LoginError::Refused(LoginStatus::AUTHORIZATION_FAILURE));
            }
            self.authorized = true;
        }

        let mut outcome = None;
        if transit && nsg == Stage::FULL_FEATURE_PHASE {
            let Some(neg) = self.negotiator.as_mut() else {
                return Err(LoginError::Protocol("no negotiator"));
            };
            let (session, connection) = neg.finish()?;
            let iname = self.initiator_name.clone().unwrap_or_default();
            let tsih = policy.admit(&AdmitRequest {
                initiator_name: &iname,
                isid: self.isid,
                tsih: self.tsih,
                cid: self.cid,
                session_type: self.session_type,
                target_name: self.target_name.as_deref(),
                session: &session,
                connection: &connection,
            });
            let tsih = tsih.map_err(LoginError::Refused)?;
            let leading = self.tsih == 0;
            outcome = Some(LoginOutcome {
                initiator_name: iname,
                initiator_alias: self.initiator_alias.clone(),
                target_name: self.target_name.clone(),
                target_alias: self.target.as_ref().and_then(|t| t.alias.clone()),
                portal_group_tag: self.target.as_ref().map(|t| t.portal_group_tag),
                isid: self.isid,
                tsih,
                cid: self.cid,
                session_type: self.session_type,
                leading,
                chap_name: self.chap_name.clone(),
                session,
                connection,
                digests: digests(&connection),
                next_stat_sn: 0,
                exp_cmd_sn: self.cmd_sn,
            });
        }

        let mut w = TextWriter::with_limit(self.config.max_text_len);
        write_pairs(&mut w, &out)?;
        self.outgoing.load(w.into_bytes());
        let (chunk, more) = self.outgoing.next();
        if more {
            // Send the rest piece by piece; transit with the last piece.
            self.out_transit = Some((transit, csg, nsg));
            // Completion waits for the last piece.
            self.pending_outcome = outcome;
            let pdu = self.response(false, true, csg, Stage(0), LoginStatus::SUCCESS, chunk);
            return Ok(TargetStep::Continue(pdu));
        }
        if let Some(o) = &outcome {
            self.tsih = o.tsih;
        }
        let pdu = self.response(transit, false, csg, nsg, LoginStatus::SUCCESS, chunk);
        if let Some(mut o) = outcome {
            o.next_stat_sn = self.stat_sn;
            self.state = TargetState::Finished;
            return Ok(TargetStep::Complete(pdu, o));
        }
        if transit {
            self.state = TargetState::Stage(nsg);
        }
        Ok(TargetStep::Continue(pdu))
    }

    fn needs_auth(&self) -> bool {
        matches!(
            self.target.as_ref().map(|t| t.auth),
            Some(AuthPolicy::Chap { .. })
        )
    }

    /// First request: who is the initiator, which target, which session.
    fn identify(
        &mut self,
        params: &TextParams<'_>,
        policy: &mut dyn LoginPolicy,
    ) -> Result<(), LoginError> {
        let iname = params
            .get("InitiatorName")
            .ok_or(LoginError::MissingParameter("InitiatorName"))?;
        if iname.is_empty() {
            return Err(LoginError::MissingParameter("InitiatorName"));
        }
        let st = match params.get("SessionType") {
            None => SessionType::Normal,
            Some(v) => SessionType::from_name(v)
                .ok_or(LoginError::Refused(LoginStatus::SESSION_TYPE_NOT_SUPPORTED))?,
        };
        let tname = params.get("TargetName");
        if st == SessionType::Normal && tname.is_none() {
            return Err(LoginError::MissingParameter("TargetName"));
        }
        let tname = if st == SessionType::Discovery {
            None
        } else {
            tname
        };
        let cfg = match policy.lookup_target(st, tname) {
            TargetLookup::Found(c) => c,
            TargetLookup::Redirect { address, permanent } => {
                return Err(LoginError::Redirected { address, permanent });
            }
            TargetLookup::Refused(s) => return Err(LoginError::Refused(s)),
        };
        let leading = self.tsih == 0;
        let mut neg = Negotiator::new(Role::Target, cfg.limits.clone(), leading);
        if !leading {
            if st == SessionType::Discovery {
                return Err(LoginError::Refused(LoginStatus::CANT_INCLUDE_IN_SESSION));
            }
            let s = policy
                .existing_session(iname, self.isid, self.tsih)
                .map_err(LoginError::Refused)?;
            neg = neg.with_session(s);
        }
        neg.set_session_type(st);
        self.initiator_name = Some(iname.to_string());
        self.target_name = tname.map(str::to_string);
        self.session_type = st;
        self.target = Some(cfg);
        self.negotiator = Some(neg);
        Ok(())
    }
}

/// Configuration of the initiator side of login.
#[derive(Debug, Clone)]
pub struct InitiatorLoginConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias.
    pub initiator_alias: Option<String>,
    /// TargetName; `None` opens a discovery session.
    pub target_name: Option<String>,
    /// ISID.
    pub isid: [u8; 6],
    /// 0 for a new session, else the session to add this connection to.
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// ITT of the login requests.
    pub itt: u32,
    /// CmdSN of the login requests.
    pub cmd_sn: u32,
    /// ExpStatSN to send first (0 on a new connection).
    pub exp_stat_sn: u32,
    /// Our CHAP name/secret, and the target's for mutual CHAP.
    pub chap: Option<(ChapCredentials, Option<ChapCredentials>)>,
    /// CHAP settings.
    pub chap_config: ChapConfig,
    /// Negotiation limits.
    pub limits: NegotiationLimits,
    /// For a connection added to a session: the session's parameters.
    pub session: Option<SessionParams>,
}

/// What the initiator does after a Login Response.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum InitiatorStep {
    /// Send this request.
    Send(LoginPdu<LoginRequest>),
    /// Logged in: switch digests on for every PDU from now on.
    Complete(LoginOutcome),
    /// The login failed (including a redirect: [`LoginError::Redirected`]).
    Failed(LoginError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IState {
    Start,
    /// Security stage: waiting for the AuthMethod answer.
    AuthMethod,
    /// CHAP_A sent.
    ChapA,
    /// CHAP response sent.
    ChapR,
    /// Operational stage, offers sent.
    Operational,
    Finished,
}

/// The initiator side of one connection's login.
#[derive(Debug)]
pub struct InitiatorLogin {
    config: InitiatorLoginConfig,
    state: IState,
    stage: Stage,
    negotiator: Negotiator,
    chap: Option<InitiatorChap>,
    incoming: TextAccumulator,
    outgoing: Outgoing,
    out_flags: (bool, Stage, Stage),
    exp_stat_sn: u32,
    target_alias: Option<String>,
    portal_group_tag: Option<u16>,
    sent_offers: bool,
}

impl InitiatorLogin {
    /// A login; fails only on unusable CHAP credentials.
    pub fn new(config: InitiatorLoginConfig) -> Result<Self, LoginError> {
        let leading = config.tsih == 0;
        let mut negotiator = Negotiator::new(Role::Initiator, config.limits.clone(), leading);
        if let Some(s) = config.session {
            negotiator = negotiator.with_session(s);
        }
        negotiator.set_session_type(if config.target_name.is_some() {
            SessionType::Normal
        } else {
            SessionType::Discovery
        });
        let chap = match &config.chap {
            Some((mine, target)) => Some(InitiatorChap::new(
                config.chap_config.clone(),
                mine.clone(),
                target.clone(),
            )?),
            None => None,
        };
        let exp_stat_sn = config.exp_stat_sn;
        Ok(InitiatorLogin {
            config,
            state: IState::Start,
            stage: Stage::SECURITY_NEGOTIATION,
            negotiator,
            chap,
            incoming: TextAccumulator::default(),
            outgoing: Outgoing::default(),
            out_flags: (false, Stage(0), Stage(0)),
            exp_stat_sn,
            target_alias: None,
            portal_group_tag: None,
            sent_offers: false,
        })
    }

    fn request(
        &self,
        transit: bool,
        cont: bool,
        csg: Stage,
        nsg: Stage,
        data: Bytes,
    ) -> LoginPdu<LoginRequest> {
        LoginPdu {
            header: LoginRequest {
                transit,
                continue_flag: cont,
                csg,
                nsg: if transit { nsg } else { Stage(0) },
                version_max: 0,
                version_min: 0,
                isid: self.config.isid,
                tsih: self.config.tsih,
                itt: self.config.itt,
                cid: self.config.cid,
                cmd_sn: self.config.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            },
            data,
        }
    }

    fn send(
        &mut self,
        pairs: &[Pair],
        transit: bool,
        csg: Stage,
        nsg: Stage,
    ) -> Result<InitiatorStep, LoginError> {
        let mut w = TextWriter::new();
        write_pairs(&mut w, pairs)?;
        self.outgoing.load(w.into_bytes());
        self.out_flags = (transit, csg, nsg);
        Ok(self.next_piece())
    }

    fn next_piece(&mut self) -> InitiatorStep {
        let (chunk, more) = self.outgoing.next();
        let (t, c, n) = self.out_flags;
        InitiatorStep::Send(self.request(t && !more, more, c, n, chunk))
    }

    /// The first Login Request.
    pub fn start(&mut self) -> Result<LoginPdu<LoginRequest>, LoginError> {
        let mut pairs = vec![Pair::new(
            "InitiatorName",
            self.config.initiator_name.clone(),
        )];
        if let Some(a) = &self.config.initiator_alias {
            pairs.push(Pair::new("InitiatorAlias", a.clone()));
        }
        match &self.config.target_name {
            Some(t) => {
                pairs.push(Pair::new("TargetName", t.clone()));
                pairs.push(Pair::new("SessionType", "Normal"));
            }
            None => pairs.push(Pair::new("SessionType", "Discovery")),
        }
        let (transit, nsg) = if self.chap.is_some() {
            pairs.push(Pair::new("AuthMethod", "CHAP"));
            (false, Stage(0))
        } else {
            pairs.push(Pair::new("AuthMethod", "None"));
            (true, Stage::LOGIN_OPERATIONAL_NEGOTIATION)
        };
        self.state = IState::AuthMethod;
        match self.send(&pairs, transit, Stage::SECURITY_NEGOTIATION, nsg)? {
            InitiatorStep::Send(p) => Ok(p),
            _ => Err(LoginError::Protocol("no request")),
        }
    }

    /// Handle one Login Response with its data segment.
    pub fn handle<R: CryptoRng + ?Sized>(
        &mut self,
        resp: &LoginResponse,
        data: &[u8],
        rng: &mut R,
    ) -> InitiatorStep {
        match self.handle_inner(resp, data, rng) {
            Ok(s) => s,
            Err(e) => {
                self.state = IState::Finished;
                InitiatorStep::Failed(e)
            }
        }
    }

    fn handle_inner<R: CryptoRng + ?Sized>(
        &mut self,
        resp: &LoginResponse,
        data: &[u8],
        rng: &mut R,
    ) -> Result<InitiatorStep, LoginError> {
        if self.state == IState::Finished || self.state == IState::Start {
            return Err(LoginError::Protocol("unexpected Login Response"));
        }
        if resp.itt != self.config.itt || resp.isid != self.config.isid {
            return Err(LoginError::Protocol("ITT or ISID mismatch"));
        }
        let status = LoginStatus::new(resp.status_class, resp.status_detail);
        if status.class() == 1 {
            let params = TextParams::parse(data)?;
            let address = params.get("TargetAddress").unwrap_or_default().to_string();
            return Err(LoginError::Redirected {
                address,
                permanent: status == LoginStatus::TARGET_MOVED_PERMANENTLY,
            });
        }
        if status != LoginStatus::SUCCESS {
            return Err(LoginError::TargetRejected(status));
        }
        if resp.version_active != 0 {
            return Err(LoginError::UnsupportedVersion);
        }
        self.exp_stat_sn = resp.stat_sn.wrapping_add(1);
        if resp.csg != self.stage {
            return Err(LoginError::Protocol("response CSG differs from ours"));
        }
        if !self.outgoing.is_empty() {
            // The target acknowledged a piece of our text.
            return Ok(self.next_piece());
        }
        self.incoming.push(data)?;
        if resp.continue_flag {
            // Ask for the rest with an empty request.
            return Ok(InitiatorStep::Send(self.request(
                false,
                false,
                self.stage,
                Stage(0),
                Bytes::new(),
            )));
        }
        let text = self.incoming.take();
        let params = TextParams::parse(&text)?;
        let phase = if self.stage == Stage::SECURITY_NEGOTIATION {
            Phase::Security
        } else {
            Phase::Operational
        };
        let received = self.negotiator.receive(&params, phase)?;
        let mut answers = received.answers;
        let mut chap_keys = ChapKeys::default();
        let mut auth_method = None;
        for kv in &received.others {
            match kv.key {
                "AuthMethod" => auth_method = Some(kv.value),
                "CHAP_A" => chap_keys.a = Some(kv.value),
                "CHAP_I" => chap_keys.i = Some(kv.value),
                "CHAP_C" => chap_keys.c = Some(kv.value),
                "CHAP_N" => chap_keys.n = Some(kv.value),
                "CHAP_R" => chap_keys.r = Some(kv.value),
                "TargetAlias" => self.target_alias = Some(kv.value.to_string()),
                "TargetPortalGroupTag" => {
                    let n = parse_number(kv.value)
                        .ok()
                        .and_then(|n| u16::try_from(n).ok());
                    self.portal_group_tag =
                        Some(n.ok_or(LoginError::Protocol("bad TargetPortalGroupTag"))?);
                }
                "TargetAddress" => {}
                _ => answers.push(Pair::new(kv.key, "Reject")),
            }
        }

        // Transit?
        let transit_to = resp.transit.then_some(resp.nsg);
        if let Some(n) = transit_to
            && !(n.0 > self.stage.0
                && matches!(
                    n,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION | Stage::FULL_FEATURE_PHASE
                ))
        {
            return Err(LoginError::Protocol("invalid NSG from target"));
        }
        // The target may move on only where we asked to (RFC 7143 §11.13.1:
        // not with T=1 when our request had T=0, and to no later stage than
        // our NSG). A target that went from the security stage straight to
        // full feature phase would skip our operational offers, and the
        // session would run on defaults we never accepted: no digests when
        // we require them, bursts and segments beyond our limits.
        let (asked_transit, _, asked_nsg) = self.out_flags;
        if let Some(n) = transit_to
            && (!asked_transit || n.0 > asked_nsg.0)
        {
            return Err(LoginError::Protocol(
                "target moved to a login stage we did not ask for",
            ));
        }

        match self.state {
            IState::AuthMethod => {
                if let Some(chap) = self.chap.as_mut() {
                    match auth_method {
                        Some("CHAP") => {
                            let a = chap.algorithms();
                            answers.push(a);
                            self.state = IState::ChapA;
                            return self.send(
                                &answers,
                                false,
                                Stage::SECURITY_NEGOTIATION,
                                Stage(0),
                            );
                        }
                        _ => return Err(LoginError::Chap(ChapError::Unexpected)),
                    }
                }
                if auth_method.is_some_and(|m| m != "None") {
                    return Err(LoginError::Protocol(
                        "target chose an AuthMethod we did not offer",
                    ));
                }
                if transit_to.is_none() {
                    // Target not ready to leave the security stage: ask again.
                    return self.send(
                        &answers,
                        true,
                        Stage::SECURITY_NEGOTIATION,
                        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    );
                }
            }
            IState::ChapA => {
                let Some(chap) = self.chap.as_mut() else {
                    return Err(LoginError::Protocol("no CHAP"));
                };
                answers.extend(chap.on_challenge(&chap_keys, rng)?);
                self.state = IState::ChapR;
                return self.send(
                    &answers,
                    true,
                    Stage::SECURITY_NEGOTIATION,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                );
            }
            IState::ChapR => {
                let Some(chap) = self.chap.as_mut() else {
                    return Err(LoginError::Protocol("no CHAP"));
                };
                if chap.awaiting_mutual() {
                    chap.on_mutual_response(&chap_keys)?;
                }
                if transit_to.is_none() {
                    return self.send(
                        &answers,
                        true,
                        Stage::SECURITY_NEGOTIATION,
                        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    );
                }
            }
            IState::Operational => {}
            IState::Start | IState::Finished => return Err(LoginError::Protocol("bad state")),
        }

        let Some(next) = transit_to else {
            // Operational stage without transit: answer the target's offers.
            if self.state == IState::Operational {
                return self.send(
                    &answers,
                    true,
                    Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                    Stage::FULL_FEATURE_PHASE,
                );
            }
            return Err(LoginError::Protocol("target did not transit"));
        };
        if next == Stage::FULL_FEATURE_PHASE {
            if !answers.is_empty() {
                return Err(LoginError::Protocol(
                    "target offered keys in its final response",
                ));
            }
            let (session, connection) = self.negotiator.finish()?;
            if self.config.tsih == 0 && resp.tsih == 0 {
                return Err(LoginError::Protocol("final response without TSIH"));
            }
            if self.config.tsih != 0 && resp.tsih != self.config.tsih {
                return Err(LoginError::Protocol("TSIH changed"));
            }
            self.state = IState::Finished;
            return Ok(InitiatorStep::Complete(LoginOutcome {
                initiator_name: self.config.initiator_name.clone(),
                initiator_alias: self.config.initiator_alias.clone(),
                target_name: self.config.target_name.clone(),
                target_alias: self.target_alias.clone(),
                portal_group_tag: self.portal_group_tag,
                isid: self.config.isid,
                tsih: resp.tsih,
                cid: self.config.cid,
                session_type: session.session_type,
                leading: self.config.tsih == 0,
                chap_name: self.config.chap.as_ref().map(|(c, _)| c.name.clone()),
                session,
                connection,
                digests: digests(&connection),
                next_stat_sn: resp.stat_sn.wrapping_add(1),
                exp_cmd_sn: resp.exp_cmd_sn,
            }));
        }
        // Entered the operational stage.
        self.stage = Stage::LOGIN_OPERATIONAL_NEGOTIATION;
        self.state = IState::Operational;
        if !self.sent_offers {
            self.sent_offers = true;
            answers.extend(self.negotiator.initiator_offers());
        }
        self.send(
            &answers,
            true,
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Stage::FULL_FEATURE_PHASE,
        )
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::field_reassign_with_default
)]
mod tests;
