//! The two login state machines driven against each other, every PDU going
//! through the wire layer's encode and parse on the way.

use std::collections::HashMap;

use super::*;
use crate::chap::{ChapAlgorithm, TestRng};
use crate::wire::{Bhs, Pdu, encode_pdu};

const INAME: &str = "iqn.2026-01.test:initiator";
const TNAME: &str = "iqn.2026-01.test:target0";

#[derive(Debug, Default)]
struct Policy {
    targets: HashMap<String, TargetConfig>,
    discovery: Option<TargetConfig>,
    acl_deny: Vec<String>,
    secrets: HashMap<String, TargetSecrets>,
    next_tsih: u16,
    sessions: HashMap<u16, SessionParams>,
    admitted: Vec<(String, u16)>,
}

impl LoginPolicy for Policy {
    fn lookup_target(&mut self, st: SessionType, name: Option<&str>) -> TargetLookup {
        let found = match (st, name) {
            (SessionType::Discovery, _) => self.discovery.clone(),
            (SessionType::Normal, Some(n)) => self.targets.get(n).cloned(),
            _ => None,
        };
        match found {
            Some(c) => TargetLookup::Found(c),
            None if name == Some("iqn.2026-01.test:moved") => TargetLookup::Redirect {
                address: "192.0.2.7:3260,1".into(),
                permanent: false,
            },
            None if st == SessionType::Discovery => {
                TargetLookup::Refused(LoginStatus::SESSION_TYPE_NOT_SUPPORTED)
            }
            None => TargetLookup::Refused(LoginStatus::NOT_FOUND),
        }
    }
    fn authorize(&mut self, initiator: &str, _target: Option<&str>) -> bool {
        !self.acl_deny.iter().any(|d| d == initiator)
    }
    fn chap_secrets(&mut self, _target: Option<&str>, chap_name: &str) -> Option<TargetSecrets> {
        self.secrets.get(chap_name).cloned()
    }
    fn existing_session(
        &mut self,
        _i: &str,
        _isid: [u8; 6],
        tsih: u16,
    ) -> Result<SessionParams, LoginStatus> {
        self.sessions
            .get(&tsih)
            .copied()
            .ok_or(LoginStatus::SESSION_DOES_NOT_EXIST)
    }
    fn admit(&mut self, r: &AdmitRequest<'_>) -> Result<u16, LoginStatus> {
        let tsih = if r.tsih != 0 {
            r.tsih
        } else {
            self.next_tsih += 1;
            self.next_tsih
        };
        self.sessions.insert(tsih, *r.session);
        self.admitted.push((r.initiator_name.to_string(), tsih));
        Ok(tsih)
    }
}

fn target_cfg(auth: AuthPolicy) -> TargetConfig {
    TargetConfig {
        alias: Some("disk0".into()),
        portal_group_tag: 1,
        auth,
        limits: NegotiationLimits::default(),
    }
}

fn policy(auth: AuthPolicy) -> Policy {
    let mut p = Policy::default();
    p.targets.insert(TNAME.into(), target_cfg(auth));
    p.discovery = Some(target_cfg(AuthPolicy::None));
    p.next_tsih = 0x10;
    p
}

fn icfg(target: Option<&str>) -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        initiator_name: INAME.into(),
        initiator_alias: Some("host1".into()),
        target_name: target.map(str::to_string),
        isid: [0x80, 0, 0x02, 0x3d, 0, 0x01],
        tsih: 0,
        cid: 0,
        itt: 0x1000,
        cmd_sn: 1,
        exp_stat_sn: 0,
        chap: None,
        chap_config: ChapConfig::default(),
        limits: NegotiationLimits::default(),
        session: None,
    }
}

#[derive(Debug)]
struct Run {
    initiator: Result<LoginOutcome, LoginError>,
    target: Result<LoginOutcome, (LoginStatus, LoginError)>,
    requests: Vec<LoginRequest>,
    responses: Vec<LoginResponse>,
}

/// Encode through the wire layer and parse back.
fn wire_req(p: &LoginPdu<LoginRequest>) -> (LoginRequest, Vec<u8>) {
    let bytes = encode_pdu(
        &Pdu::LoginRequest(p.header),
        &[],
        &p.data,
        Digests::default(),
    )
    .unwrap();
    let bhs = Bhs::new_checked(&bytes[..48]).unwrap();
    let dsl = bhs.data_segment_length() as usize;
    let Pdu::LoginRequest(h) = Pdu::parse(&bhs).unwrap() else {
        panic!("not a login request")
    };
    (h, bytes[48..48 + dsl].to_vec())
}

fn wire_resp(p: &LoginPdu<LoginResponse>) -> (LoginResponse, Vec<u8>) {
    let bytes = encode_pdu(
        &Pdu::LoginResponse(p.header),
        &[],
        &p.data,
        Digests::default(),
    )
    .unwrap();
    let bhs = Bhs::new_checked(&bytes[..48]).unwrap();
    let dsl = bhs.data_segment_length() as usize;
    let Pdu::LoginResponse(h) = Pdu::parse(&bhs).unwrap() else {
        panic!("not a login response")
    };
    (h, bytes[48..48 + dsl].to_vec())
}

fn drive(icfg: InitiatorLoginConfig, policy: &mut Policy, tcfg: TargetLoginConfig) -> Run {
    let mut rng = TestRng::new(42);
    let mut i = InitiatorLogin::new(icfg).unwrap();
    let mut t = TargetLogin::new(tcfg);
    let mut req = i.start().unwrap();
    let mut requests = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..64 {
        let (rh, rd) = wire_req(&req);
        requests.push(rh);
        let (resp, t_done) = match t.handle(&rh, &rd, policy, &mut rng) {
            TargetStep::Continue(p) => (p, None),
            TargetStep::Complete(p, o) => (p, Some(Ok(o))),
            TargetStep::Failed(p, e) => {
                let s = LoginStatus::new(p.header.status_class, p.header.status_detail);
                (p, Some(Err((s, e))))
            }
        };
        let (sh, sd) = wire_resp(&resp);
        responses.push(sh);
        match i.handle(&sh, &sd, &mut rng) {
            InitiatorStep::Send(p) => {
                assert!(t_done.is_none(), "target finished but initiator goes on");
                req = p;
            }
            InitiatorStep::Complete(o) => {
                return Run {
                    initiator: Ok(o),
                    target: t_done.expect("target not finished"),
                    requests,
                    responses,
                };
            }
            InitiatorStep::Failed(e) => {
                return Run {
                    initiator: Err(e),
                    target: t_done.unwrap_or(Err((
                        LoginStatus::SUCCESS,
                        LoginError::Protocol("initiator gave up"),
                    ))),
                    requests,
                    responses,
                };
            }
        }
    }
    panic!("login did not finish in 64 exchanges");
}

fn chap_icfg(secret: &[u8], mutual: Option<&[u8]>, alg: ChapAlgorithm) -> InitiatorLoginConfig {
    let mut c = icfg(Some(TNAME));
    c.chap = Some((
        ChapCredentials::new("user1", secret.to_vec()),
        mutual.map(|m| ChapCredentials::new("tgt-user", m.to_vec())),
    ));
    c.chap_config.algorithms = vec![alg];
    c
}

fn chap_policy(mutual_required: bool) -> Policy {
    let mut p = policy(AuthPolicy::Chap {
        mutual: mutual_required,
    });
    p.secrets.insert(
        "user1".into(),
        TargetSecrets {
            initiator_secret: b"initiator-secret-1".to_vec(),
            mutual: Some(ChapCredentials::new(
                "tgt-user",
                b"target-secret-22".to_vec(),
            )),
            require_mutual: false,
        },
    );
    p
}

#[test]
fn no_auth_normal_session() {
    let mut p = policy(AuthPolicy::None);
    let r = drive(icfg(Some(TNAME)), &mut p, TargetLoginConfig::default());
    let io = r.initiator.unwrap();
    let to = r.target.unwrap();
    assert_eq!(io.tsih, 0x11);
    assert_eq!(to.tsih, 0x11);
    assert_eq!(io.session, to.session);
    assert_eq!(io.connection, to.connection);
    assert_eq!(io.session.session_type, SessionType::Normal);
    assert_eq!(to.initiator_name, INAME);
    assert_eq!(to.initiator_alias.as_deref(), Some("host1"));
    assert_eq!(to.target_name.as_deref(), Some(TNAME));
    assert_eq!(io.target_alias.as_deref(), Some("disk0"));
    assert_eq!(io.portal_group_tag, Some(1));
    assert!(to.leading);
    assert_eq!(to.chap_name, None);
    // Stages: 0 → 1 → 3 with the T bit.
    assert_eq!(r.requests[0].csg, Stage::SECURITY_NEGOTIATION);
    assert!(r.requests[0].transit);
    assert_eq!(r.responses.last().unwrap().nsg, Stage::FULL_FEATURE_PHASE);
    assert!(r.responses.last().unwrap().transit);
    // StatSN counts up from the configured start, once per response.
    let sns: Vec<u32> = r.responses.iter().map(|h| h.stat_sn).collect();
    assert_eq!(sns, (1..=sns.len() as u32).collect::<Vec<_>>());
    assert_eq!(to.next_stat_sn, sns.len() as u32 + 1);
    assert_eq!(p.admitted, [(INAME.to_string(), 0x11)]);
    // Defaults both sides chose: 1 MiB burst limit, MRDSL declared per side.
    assert_eq!(io.session.max_burst_length, 1 << 20);
    assert_eq!(
        io.connection.initiator_max_recv_data_segment_length,
        262_144
    );
    assert_eq!(io.connection.target_max_recv_data_segment_length, 262_144);
}

#[test]
fn chap_md5_sha256_and_mutual() {
    for (alg, mutual) in [
        (ChapAlgorithm::MD5, false),
        (ChapAlgorithm::SHA256, false),
        (ChapAlgorithm::SHA256, true),
        (ChapAlgorithm::MD5, true),
    ] {
        let mut p = chap_policy(mutual);
        let m = mutual.then_some(&b"target-secret-22"[..]);
        let r = drive(
            chap_icfg(b"initiator-secret-1", m, alg),
            &mut p,
            TargetLoginConfig::default(),
        );
        let to = r.target.unwrap();
        r.initiator.unwrap();
        assert_eq!(to.chap_name.as_deref(), Some("user1"));
        // AuthMethod, CHAP_A, CHAP_N/R, operational.
        assert_eq!(r.requests.len(), 4, "{alg:?} mutual={mutual}");
    }
}

#[test]
fn chap_wrong_secret() {
    let mut p = chap_policy(false);
    let r = drive(
        chap_icfg(b"not-the-secret-1", None, ChapAlgorithm::SHA256),
        &mut p,
        TargetLoginConfig::default(),
    );
    let (status, err) = r.target.unwrap_err();
    assert_eq!(status, LoginStatus::AUTHENTICATION_FAILURE);
    assert_eq!(err, LoginError::Chap(ChapError::BadResponse));
    assert_eq!(
        r.initiator.unwrap_err(),
        LoginError::TargetRejected(LoginStatus::AUTHENTICATION_FAILURE)
    );
    assert!(p.admitted.is_empty());
}

#[test]
fn mutual_wrong_target_secret() {
    let mut p = chap_policy(true);
    let r = drive(
        chap_icfg(
            b"initiator-secret-1",
            Some(b"other-target-secret"),
            ChapAlgorithm::MD5,
        ),
        &mut p,
        TargetLoginConfig::default(),
    );
    assert_eq!(
        r.initiator.unwrap_err(),
        LoginError::Chap(ChapError::BadResponse)
    );
}

#[test]
fn mutual_required_but_not_offered() {
    let mut p = chap_policy(true);
    let r = drive(
        chap_icfg(b"initiator-secret-1", None, ChapAlgorithm::MD5),
        &mut p,
        TargetLoginConfig::default(),
    );
    assert_eq!(r.target.unwrap_err().0, LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn chap_required_but_initiator_has_none() {
    let mut p = chap_policy(false);
    let r = drive(icfg(Some(TNAME)), &mut p, TargetLoginConfig::default());
    assert_eq!(r.target.unwrap_err().0, LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn acl_refusal() {
    let mut p = policy(AuthPolicy::None);
    p.acl_deny.push(INAME.into());
    let r = drive(icfg(Some(TNAME)), &mut p, TargetLoginConfig::default());
    assert_eq!(r.target.unwrap_err().0, LoginStatus::AUTHORIZATION_FAILURE);
    assert_eq!(
        r.initiator.unwrap_err(),
        LoginError::TargetRejected(LoginStatus::AUTHORIZATION_FAILURE)
    );
}

#[test]
fn unknown_target() {
    let mut p = policy(AuthPolicy::None);
    let r = drive(
        icfg(Some("iqn.2026-01.test:nope")),
        &mut p,
        TargetLoginConfig::default(),
    );
    assert_eq!(r.target.unwrap_err().0, LoginStatus::NOT_FOUND);
    assert_eq!(r.responses.len(), 1);
    assert_eq!(r.responses[0].status_class, 2);
    assert_eq!(r.responses[0].status_detail, 3);
}

#[test]
fn redirect_reported() {
    let mut p = policy(AuthPolicy::None);
    let r = drive(
        icfg(Some("iqn.2026-01.test:moved")),
        &mut p,
        TargetLoginConfig::default(),
    );
    assert_eq!(
        r.target.unwrap_err().0,
        LoginStatus::TARGET_MOVED_TEMPORARILY
    );
    assert_eq!(
        r.initiator.unwrap_err(),
        LoginError::Redirected {
            address: "192.0.2.7:3260,1".into(),
            permanent: false
        }
    );
}

#[test]
fn discovery_session() {
    let mut p = policy(AuthPolicy::None);
    let r = drive(icfg(None), &mut p, TargetLoginConfig::default());
    let to = r.target.unwrap();
    let io = r.initiator.unwrap();
    assert_eq!(to.session_type, SessionType::Discovery);
    assert_eq!(io.session_type, SessionType::Discovery);
    assert_eq!(to.target_name, None);
    // Irrelevant keys keep their defaults.
    assert_eq!(to.session.max_burst_length, 262_144);
    let mut p = policy(AuthPolicy::None);
    p.discovery = None;
    let r = drive(icfg(None), &mut p, TargetLoginConfig::default());
    assert_eq!(
        r.target.unwrap_err().0,
        LoginStatus::SESSION_TYPE_NOT_SUPPORTED
    );
}

#[test]
fn digests_negotiated() {
    let mut p = policy(AuthPolicy::None);
    let mut ic = icfg(Some(TNAME));
    ic.limits.header_digests = vec![Digest::Crc32c, Digest::None];
    ic.limits.data_digests = vec![Digest::Crc32c];
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    let io = r.initiator.unwrap();
    let to = r.target.unwrap();
    assert_eq!(
        io.digests,
        Digests {
            header: true,
            data: true
        }
    );
    assert_eq!(
        to.digests,
        Digests {
            header: true,
            data: true
        }
    );
    // Target requires digests the initiator refuses: the login fails
    // (initiator error, 0x0200) rather than run without them.
    let mut p = policy(AuthPolicy::None);
    p.targets.get_mut(TNAME).unwrap().limits.header_digests = vec![Digest::Crc32c];
    let mut ic = icfg(Some(TNAME));
    ic.limits.header_digests = vec![Digest::None];
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    let (status, e) = r.target.unwrap_err();
    assert_eq!(status, LoginStatus::new(0x02, 0x00));
    assert!(
        matches!(
            e,
            LoginError::Negotiation(NegotiationError::NoAgreement {
                key: "HeaderDigest"
            })
        ),
        "{e:?}"
    );
    assert!(r.initiator.is_err());
    // And the other way round: the initiator requires them, the target
    // only does None.
    let mut p = policy(AuthPolicy::None);
    p.targets.get_mut(TNAME).unwrap().limits.data_digests = vec![Digest::None];
    let mut ic = icfg(Some(TNAME));
    ic.limits.data_digests = vec![Digest::Crc32c];
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    assert!(
        matches!(
            r.initiator,
            Err(LoginError::Negotiation(NegotiationError::NoAgreement {
                key: "DataDigest"
            }))
        ),
        "{:?}",
        r.initiator
    );
}

#[test]
fn limits_meet_in_the_middle() {
    let mut p = policy(AuthPolicy::None);
    {
        let l = &mut p.targets.get_mut(TNAME).unwrap().limits;
        l.max_burst_length = 65536;
        l.first_burst_length = 16384;
        l.immediate_data = false;
        l.max_recv_data_segment_length = 16384;
        l.default_time2wait = 5;
        l.max_connections = 4;
        l.max_outstanding_r2t = 4;
    }
    let mut ic = icfg(Some(TNAME));
    ic.limits.initial_r2t = false;
    ic.limits.max_outstanding_r2t = 2;
    ic.limits.max_connections = 8;
    ic.limits.default_time2wait = 1;
    ic.limits.max_recv_data_segment_length = 32768;
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    let s = r.target.unwrap();
    let i = r.initiator.unwrap();
    assert_eq!(s.session, i.session);
    assert_eq!(s.session.max_burst_length, 65536);
    // InitialR2T=Yes, ImmediateData=No: FirstBurstLength is Irrelevant and
    // both sides keep the default.
    assert_eq!(s.session.first_burst_length, 65536);
    assert!(!s.session.immediate_data);
    assert!(s.session.initial_r2t);
    assert_eq!(s.session.default_time2wait, 5);
    assert_eq!(s.session.max_connections, 4);
    assert_eq!(s.session.max_outstanding_r2t, 2);
    assert_eq!(s.connection.initiator_max_recv_data_segment_length, 32768);
    assert_eq!(s.connection.target_max_recv_data_segment_length, 16384);
    assert_eq!(i.connection, s.connection);
}

#[test]
fn add_connection_to_session() {
    let mut p = policy(AuthPolicy::None);
    let first = drive(icfg(Some(TNAME)), &mut p, TargetLoginConfig::default())
        .target
        .unwrap();
    let mut ic = icfg(Some(TNAME));
    ic.tsih = first.tsih;
    ic.cid = 1;
    ic.session = Some(first.session);
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    let second = r.target.unwrap();
    assert!(!second.leading);
    assert_eq!(second.tsih, first.tsih);
    assert_eq!(second.cid, 1);
    // Unknown TSIH.
    let mut ic = icfg(Some(TNAME));
    ic.tsih = 0x7777;
    let r = drive(ic, &mut p, TargetLoginConfig::default());
    assert_eq!(r.target.unwrap_err().0, LoginStatus::SESSION_DOES_NOT_EXIST);
}

fn request(csg: Stage, nsg: Stage, transit: bool, cont: bool) -> LoginRequest {
    LoginRequest {
        transit,
        continue_flag: cont,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x40, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: 7,
        cid: 0,
        cmd_sn: 10,
        exp_stat_sn: 0,
    }
}

fn status(step: &TargetStep) -> LoginStatus {
    let h = match step {
        TargetStep::Continue(p) | TargetStep::Complete(p, _) | TargetStep::Failed(p, _) => {
            &p.header
        }
    };
    LoginStatus::new(h.status_class, h.status_detail)
}

#[test]
fn protocol_violations() {
    let mut rng = TestRng::new(1);
    let text = format!("InitiatorName={INAME}\0TargetName={TNAME}\0");
    let cases: Vec<(LoginRequest, &[u8], LoginStatus)> = vec![
        // Version.
        (
            {
                let mut r = request(Stage(1), Stage(3), true, false);
                r.version_min = 1;
                r
            },
            text.as_bytes(),
            LoginStatus::UNSUPPORTED_VERSION,
        ),
        // First request in FFP.
        (
            request(Stage(3), Stage(3), false, false),
            text.as_bytes(),
            LoginStatus::INITIATOR_ERROR,
        ),
        // T and C both set.
        (
            request(Stage(1), Stage(3), true, true),
            text.as_bytes(),
            LoginStatus::INITIATOR_ERROR,
        ),
        // NSG 2 is reserved.
        (
            request(Stage(1), Stage(2), true, false),
            text.as_bytes(),
            LoginStatus::INITIATOR_ERROR,
        ),
        // Missing InitiatorName.
        (
            request(Stage(1), Stage(3), true, false),
            b"TargetName=x\0",
            LoginStatus::MISSING_PARAMETER,
        ),
        // Missing TargetName in a normal session.
        (
            request(Stage(1), Stage(3), true, false),
            b"InitiatorName=iqn.x\0",
            LoginStatus::MISSING_PARAMETER,
        ),
        // Malformed text.
        (
            request(Stage(1), Stage(3), true, false),
            b"InitiatorName",
            LoginStatus::INITIATOR_ERROR,
        ),
        // Duplicate key.
        (
            request(Stage(1), Stage(3), true, false),
            format!("{text}MaxBurstLength=512\0MaxBurstLength=512\0")
                .as_bytes()
                .to_vec()
                .leak(),
            LoginStatus::INITIATOR_ERROR,
        ),
        // Unknown session type.
        (
            request(Stage(1), Stage(3), true, false),
            format!("{text}SessionType=Other\0")
                .as_bytes()
                .to_vec()
                .leak(),
            LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
        ),
    ];
    for (i, (req, data, want)) in cases.into_iter().enumerate() {
        let mut p = policy(AuthPolicy::None);
        let mut t = TargetLogin::new(TargetLoginConfig::default());
        let step = t.handle(&req, data, &mut p, &mut rng);
        assert!(matches!(step, TargetStep::Failed(..)), "case {i}: {step:?}");
        assert_eq!(status(&step), want, "case {i}");
        assert!(t.is_finished());
    }
}

#[test]
fn skip_security_and_single_request() {
    // Like open-iscsi without auth: everything in one CSG=1 request.
    let mut rng = TestRng::new(1);
    let mut p = policy(AuthPolicy::None);
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let text = format!(
        "InitiatorName={INAME}\0TargetName={TNAME}\0SessionType=Normal\0HeaderDigest=None\0DataDigest=None\0\
         MaxRecvDataSegmentLength=65536\0IFMarker=No\0OFMarker=No\0X-com.cisco.protocol=draft20\0"
    );
    let step = t.handle(
        &request(Stage(1), Stage(3), true, false),
        text.as_bytes(),
        &mut p,
        &mut rng,
    );
    let TargetStep::Complete(pdu, o) = step else {
        panic!("{step:?}")
    };
    assert!(pdu.header.transit);
    assert_eq!(pdu.header.tsih, o.tsih);
    assert_eq!(pdu.header.stat_sn, 1);
    assert_eq!(pdu.header.exp_cmd_sn, 10);
    assert_eq!(pdu.header.max_cmd_sn, 10 + 31);
    let answer = TextParams::parse(&pdu.data).unwrap();
    assert_eq!(answer.get("TargetPortalGroupTag"), Some("1"));
    assert_eq!(answer.get("IFMarker"), Some("Reject"));
    assert_eq!(answer.get("X-com.cisco.protocol"), Some("NotUnderstood"));
    assert_eq!(answer.get("MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(o.connection.initiator_max_recv_data_segment_length, 65536);
    // Skipping security when CHAP is required fails.
    let mut p = chap_policy(false);
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let step = t.handle(
        &request(Stage(1), Stage(3), true, false),
        text.as_bytes(),
        &mut p,
        &mut rng,
    );
    assert_eq!(status(&step), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn multi_pdu_text_both_directions() {
    // A request text of ~20 KB of unknown keys, sent in 8 KiB pieces with the
    // C bit; the target's NotUnderstood answers are as long and come back in
    // pieces too.
    let mut rng = TestRng::new(1);
    let mut p = policy(AuthPolicy::None);
    let mut t = TargetLogin::new(TargetLoginConfig::default());
    let mut text = format!("InitiatorName={INAME}\0TargetName={TNAME}\0").into_bytes();
    for n in 0..400 {
        text.extend_from_slice(format!("X-org.example.k{n:05}=value-{n:020}\0").as_bytes());
    }
    let pieces: Vec<&[u8]> = text.chunks(LOGIN_MAX_DATA_SEGMENT).collect();
    assert!(pieces.len() >= 3);
    let mut acc = TextAccumulator::default();
    for (k, piece) in pieces.iter().enumerate() {
        let last = k + 1 == pieces.len();
        let step = t.handle(
            &request(Stage(1), Stage(3), last, !last),
            piece,
            &mut p,
            &mut rng,
        );
        let TargetStep::Continue(pdu) = step else {
            panic!("{step:?}")
        };
        if !last {
            assert!(pdu.data.is_empty() && !pdu.header.transit && !pdu.header.continue_flag);
        } else {
            // First piece of the answer, C set.
            assert!(pdu.header.continue_flag && !pdu.header.transit);
            assert_eq!(pdu.data.len(), LOGIN_MAX_DATA_SEGMENT);
            acc.push(&pdu.data).unwrap();
        }
    }
    let mut done = None;
    for _ in 0..10 {
        let step = t.handle(
            &request(Stage(1), Stage(3), false, false),
            &[],
            &mut p,
            &mut rng,
        );
        match step {
            TargetStep::Continue(pdu) => {
                assert!(pdu.header.continue_flag && pdu.header.tsih == 0);
                acc.push(&pdu.data).unwrap();
            }
            TargetStep::Complete(pdu, o) => {
                assert!(pdu.header.transit && !pdu.header.continue_flag);
                assert_eq!(pdu.header.tsih, o.tsih);
                acc.push(&pdu.data).unwrap();
                done = Some(o);
                break;
            }
            TargetStep::Failed(_, e) => panic!("{e}"),
        }
    }
    let o = done.expect("login completes with the last piece");
    assert_eq!(o.tsih, 0x11);
    let all = acc.take();
    let answer = TextParams::parse(&all).unwrap();
    let nu = answer
        .iter()
        .filter(|kv| kv.key.starts_with("X-org.example.k") && kv.value == "NotUnderstood")
        .count();
    assert_eq!(nu, 400);
    assert_eq!(answer.get("TargetPortalGroupTag"), Some("1"));
}

#[test]
fn text_bound_enforced() {
    let mut rng = TestRng::new(1);
    let mut p = policy(AuthPolicy::None);
    let mut cfg = TargetLoginConfig::default();
    cfg.max_text_len = 10_000;
    let mut t = TargetLogin::new(cfg);
    let chunk = vec![b'a'; 8000];
    assert!(matches!(
        t.handle(
            &request(Stage(1), Stage(3), false, true),
            &chunk,
            &mut p,
            &mut rng
        ),
        TargetStep::Continue(_)
    ));
    let step = t.handle(
        &request(Stage(1), Stage(3), false, true),
        &chunk,
        &mut p,
        &mut rng,
    );
    assert_eq!(status(&step), LoginStatus::INITIATOR_ERROR);
}

/// A Login Response to the initiator, echoing what it must.
fn response_to(req: &LoginPdu<LoginRequest>, transit: bool, nsg: Stage) -> LoginResponse {
    LoginResponse {
        transit,
        continue_flag: false,
        csg: req.header.csg,
        nsg: if transit { nsg } else { Stage(0) },
        version_max: 0,
        version_active: 0,
        isid: req.header.isid,
        tsih: 0x11,
        itt: req.header.itt,
        stat_sn: 1,
        exp_cmd_sn: req.header.cmd_sn,
        max_cmd_sn: req.header.cmd_sn,
        status_class: 0,
        status_detail: 0,
    }
}

/// A target may move on only where the initiator asked to: one that goes
/// from the security stage straight to full feature phase would have the
/// session run on defaults the initiator never accepted (here: no digests
/// where it requires CRC32C).
#[test]
fn a_target_that_skips_a_stage_we_asked_for_fails_the_login() {
    let mut rng = TestRng::new(7);
    let mut cfg = icfg(Some(TNAME));
    cfg.limits.header_digests = vec![Digest::Crc32c];
    let mut i = InitiatorLogin::new(cfg).unwrap();
    let req = i.start().unwrap();
    assert!(req.header.transit);
    assert_eq!(req.header.nsg, Stage::LOGIN_OPERATIONAL_NEGOTIATION);
    let resp = response_to(&req, true, Stage::FULL_FEATURE_PHASE);
    match i.handle(&resp, b"", &mut rng) {
        InitiatorStep::Failed(LoginError::Protocol(m)) => {
            assert!(m.contains("did not ask for"), "{m}");
        }
        other => panic!("{other:?}"),
    }

    // With CHAP: the request naming the algorithms has T=0, so the
    // target may not answer it with T=1.
    let mut i =
        InitiatorLogin::new(chap_icfg(b"initiator-secret-1", None, ChapAlgorithm::MD5)).unwrap();
    let req = i.start().unwrap();
    assert!(!req.header.transit);
    let resp = response_to(&req, false, Stage(0));
    let InitiatorStep::Send(chap_a) = i.handle(&resp, b"AuthMethod=CHAP\0", &mut rng) else {
        panic!("no CHAP_A request");
    };
    assert!(!chap_a.header.transit);
    let resp = response_to(&chap_a, true, Stage::LOGIN_OPERATIONAL_NEGOTIATION);
    let challenge = b"CHAP_A=5\0CHAP_I=1\0CHAP_C=0x00112233445566778899aabbccddeeff\0";
    assert!(
        matches!(
            i.handle(&resp, challenge, &mut rng),
            InitiatorStep::Failed(LoginError::Protocol(_))
        ),
        "a T=1 answer to a T=0 request was taken"
    );
}
