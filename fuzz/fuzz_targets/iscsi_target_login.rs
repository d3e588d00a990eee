//! The target's login (`login::TargetLogin`) against a hostile initiator,
//! with a policy like an operator's: one target without authentication,
//! one that requires CHAP, one that requires mutual CHAP, an initiator ACL
//! on all three (one allowed InitiatorName), discovery with CHAP or none.
//!
//! The input picks the configuration and a seed, then up to 16 Login
//! Requests. Two in three are what an initiator would send next (its name,
//! allowed or not; a session type and TargetName; AuthMethod offers; CHAP_A;
//! CHAP_N and CHAP_R, the right answer to the target's challenge or, one
//! time in four, a wrong one, with its own challenge for mutual CHAP;
//! operational offers); the rest have random flags, stages and text.
//!
//! An input that starts with `R` replays the Login Requests of a captured
//! connection instead (`scripts/fuzz-seeds.sh` writes one per connection).
//!
//! Checked, beside "no panic":
//! - every Login Response encodes, frames and parses back to itself, with
//!   at most 8192 bytes of text, the request's ISID and ITT, and a failure
//!   status on failure;
//! - **a completed login to a target requiring CHAP means the initiator
//!   sent the right CHAP_R for its secret to the target's challenge**, and
//!   for mutual CHAP the target proved its own secret in turn;
//! - a completed normal session is for a configured target and the
//!   allowed initiator, and the final response has T=1, NSG=3 and a TSIH.
#![no_main]

#[path = "common/iscsi.rs"]
mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use unifab_iscsi::chap::{
    ChapAlgorithm, ChapCredentials, TargetSecrets, TestRng, compute_response,
};
use unifab_iscsi::login::{
    AdmitRequest, AuthPolicy, LoginPdu, LoginPolicy, LoginStatus, TargetConfig, TargetLogin,
    TargetLoginConfig, TargetLookup, TargetStep,
};
use unifab_iscsi::negotiate::{NegotiationLimits, SessionParams, SessionType};
use unifab_iscsi::text::{TextParams, parse_binary, parse_number};
use unifab_iscsi::wire::{LoginRequest, LoginResponse, Pdu, Stage};

use bytes::BytesMut;

use common::{Next, check_emitted, data, next_pdu, replay_framer, tracing};

const ALLOWED: &str = "iqn.2026-11.fuzz:allowed";
const OPEN: &str = "iqn.2026-11.fuzz:open";
const CHAP: &str = "iqn.2026-11.fuzz:chap";
const MUTUAL: &str = "iqn.2026-11.fuzz:mutual";
const INITIATOR_SECRET: &[u8] = b"initiator-secret-12";
const TARGET_SECRET: &[u8] = b"target-secret-123456";
const ISID: [u8; 6] = [0x80, 0, 0, 0, 0, 1];
const ITT: u32 = 77;

struct Policy {
    discovery_auth: AuthPolicy,
    /// Replaying a capture: every target name is served, without
    /// authentication, to every initiator.
    replay: bool,
}

impl LoginPolicy for Policy {
    fn lookup_target(&mut self, st: SessionType, name: Option<&str>) -> TargetLookup {
        let auth = match (st, name) {
            _ if self.replay => AuthPolicy::None,
            (SessionType::Discovery, _) => self.discovery_auth,
            (_, Some(OPEN)) => AuthPolicy::None,
            (_, Some(CHAP)) => AuthPolicy::Chap { mutual: false },
            (_, Some(MUTUAL)) => AuthPolicy::Chap { mutual: true },
            _ => return TargetLookup::Refused(LoginStatus::NOT_FOUND),
        };
        TargetLookup::Found(TargetConfig {
            alias: None,
            portal_group_tag: 1,
            auth,
            limits: NegotiationLimits::default(),
        })
    }

    fn authorize(&mut self, initiator: &str, target: Option<&str>) -> bool {
        self.replay || target.is_none() || initiator == ALLOWED
    }

    fn chap_secrets(&mut self, _target: Option<&str>, name: &str) -> Option<TargetSecrets> {
        (name == "user").then(|| TargetSecrets {
            initiator_secret: INITIATOR_SECRET.to_vec(),
            mutual: Some(ChapCredentials::new("target", TARGET_SECRET)),
            require_mutual: false,
        })
    }

    fn existing_session(
        &mut self,
        _initiator: &str,
        _isid: [u8; 6],
        _tsih: u16,
    ) -> Result<SessionParams, LoginStatus> {
        Err(LoginStatus::SESSION_DOES_NOT_EXIST)
    }

    fn admit(&mut self, _request: &AdmitRequest<'_>) -> Result<u16, LoginStatus> {
        Ok(7)
    }
}

/// The initiator's side of the exchange, as far as the harness follows it.
#[derive(Debug, Default)]
struct Initiator {
    /// The target's CHAP challenge: algorithm, identifier, challenge.
    challenge: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    /// Our own challenge for mutual CHAP: identifier and challenge.
    ours: Option<(u8, Vec<u8>)>,
    /// We sent the right CHAP_R to the target's challenge.
    proved: bool,
    /// The target sent the right CHAP_R to ours.
    target_proved: bool,
    /// The operational offers went out.
    sent_offers: bool,
}

impl Initiator {
    /// Notes whether a response's CHAP_R answers our challenge rightly.
    fn check_target_proof(&mut self, text: &[u8]) {
        let r = TextParams::parse(text)
            .ok()
            .and_then(|p| p.get("CHAP_R").map(str::to_string));
        if let (Some(r), Some((alg, _, _)), Some((id, c))) = (r, &self.challenge, &self.ours) {
            let right = compute_response(*alg, *id, TARGET_SECRET, c).map(|x| hex(&x));
            self.target_proved = right.is_some_and(|x| x.eq_ignore_ascii_case(&r));
        }
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::from("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn push(t: &mut Vec<u8>, k: &str, v: &str) {
    t.extend_from_slice(k.as_bytes());
    t.push(b'=');
    t.extend_from_slice(v.as_bytes());
    t.push(0);
}

/// The request a compliant initiator sends after `resp` (None: the first).
fn compliant(
    u: &mut Unstructured<'_>,
    resp: Option<(&LoginResponse, &[u8])>,
    me: &mut Initiator,
) -> Result<(bool, Stage, Stage, Vec<u8>)> {
    let mut t = Vec::new();
    let Some((resp, text)) = resp else {
        let name = if u.ratio(3, 4)? {
            ALLOWED
        } else {
            "iqn.2026-11.fuzz:other"
        };
        push(&mut t, "InitiatorName", name);
        match u.int_in_range(0..=4usize)? {
            0 => push(&mut t, "SessionType", "Discovery"),
            k => {
                push(&mut t, "SessionType", "Normal");
                let target = [OPEN, CHAP, MUTUAL, "iqn.2026-11.fuzz:none"][k - 1];
                push(&mut t, "TargetName", target);
            }
        }
        let auth = *u.choose(&["CHAP,None", "CHAP", "None"])?;
        push(&mut t, "AuthMethod", auth);
        return Ok(if auth == "None" {
            (
                true,
                Stage::SECURITY_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                t,
            )
        } else {
            (false, Stage::SECURITY_NEGOTIATION, Stage(0), t)
        });
    };
    let params = TextParams::parse(text).ok();
    let get = |k: &str| params.as_ref().and_then(|p| p.get(k));
    if resp.csg == Stage::SECURITY_NEGOTIATION && !(resp.transit && resp.nsg.0 > 0) {
        if get("AuthMethod") == Some("CHAP") {
            push(&mut t, "CHAP_A", *u.choose(&["5", "7", "7,5", "6"])?);
            return Ok((false, Stage::SECURITY_NEGOTIATION, Stage(0), t));
        }
        if let (Some(a), Some(i), Some(c)) = (get("CHAP_A"), get("CHAP_I"), get("CHAP_C")) {
            let alg = ChapAlgorithm(
                parse_number(a)
                    .ok()
                    .and_then(|n| u8::try_from(n).ok())
                    .unwrap_or(0),
            );
            let id = parse_number(i)
                .ok()
                .and_then(|n| u8::try_from(n).ok())
                .unwrap_or(0);
            let challenge = parse_binary(c).unwrap_or_default();
            me.challenge = Some((alg, id, challenge.clone()));
            let right = compute_response(alg, id, INITIATOR_SECRET, &challenge);
            push(
                &mut t,
                "CHAP_N",
                if u.ratio(15, 16)? { "user" } else { "nobody" },
            );
            match right {
                Some(r) if u.ratio(3, 4)? => {
                    me.proved = true;
                    push(&mut t, "CHAP_R", &hex(&r));
                }
                _ => {
                    me.proved = false;
                    let mut r = vec![0u8; 16];
                    u.fill_buffer(&mut r)?;
                    push(&mut t, "CHAP_R", &hex(&r));
                }
            }
            if u.arbitrary()? {
                let id: u8 = u.arbitrary()?;
                let mut c = vec![0u8; u.int_in_range(16..=32)?];
                u.fill_buffer(&mut c)?;
                push(&mut t, "CHAP_I", &id.to_string());
                push(&mut t, "CHAP_C", &hex(&c));
                me.ours = Some((id, c));
            }
            return Ok((
                true,
                Stage::SECURITY_NEGOTIATION,
                Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                t,
            ));
        }
        return Ok((
            true,
            Stage::SECURITY_NEGOTIATION,
            Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            t,
        ));
    }
    if !me.sent_offers {
        me.sent_offers = true;
        for (k, v) in [
            ("HeaderDigest", "None,CRC32C"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "1048576"),
            ("FirstBurstLength", "262144"),
            ("MaxConnections", "1"),
            ("ErrorRecoveryLevel", "0"),
        ] {
            push(&mut t, k, v);
        }
    }
    Ok((
        true,
        Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        Stage::FULL_FEATURE_PHASE,
        t,
    ))
}

fn check_response(p: &LoginPdu<LoginResponse>, failed: bool) {
    let h = p.header;
    let len = check_emitted(&Pdu::LoginResponse(h), &[], &[p.data.clone()]);
    assert!(len <= 8192, "{len} bytes of login text in one PDU");
    assert_eq!(
        (h.isid, h.itt),
        (ISID, ITT),
        "a Login Response with other identifiers"
    );
    assert_eq!(
        failed,
        h.status_class != 0,
        "status {h:?} for failed={failed}"
    );
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut policy = Policy {
        replay: false,
        discovery_auth: *u.choose(&[
            AuthPolicy::None,
            AuthPolicy::ChapOrNone,
            AuthPolicy::Chap { mutual: false },
        ])?,
    };
    let mut login = TargetLogin::new(TargetLoginConfig::default());
    let mut rng = TestRng::new(u.arbitrary()?);
    let mut me = Initiator::default();
    let mut last: Option<LoginPdu<LoginResponse>> = None;
    for _ in 0..16 {
        if u.is_empty() {
            break;
        }
        let (transit, csg, nsg, text) = if u.ratio(2, 3)? {
            compliant(u, last.as_ref().map(|p| (&p.header, &p.data[..])), &mut me)?
        } else {
            let bits: u8 = u.arbitrary()?;
            let text = if u.arbitrary()? {
                let len = u.int_in_range(0..=300)?;
                data(u, len)?
            } else {
                let mut t = Vec::new();
                for _ in 0..u.int_in_range(0..=4)? {
                    let k = *u.choose(&[
                        "InitiatorName",
                        "TargetName",
                        "SessionType",
                        "AuthMethod",
                        "CHAP_A",
                        "CHAP_N",
                        "CHAP_R",
                        "CHAP_I",
                        "CHAP_C",
                        "HeaderDigest",
                    ])?;
                    let v = *u.choose(&[
                        ALLOWED,
                        OPEN,
                        CHAP,
                        MUTUAL,
                        "Normal",
                        "Discovery",
                        "CHAP",
                        "None",
                        "5",
                        "user",
                        "0x00",
                        "CRC32C",
                    ])?;
                    push(&mut t, k, v);
                }
                t
            };
            (
                bits & 1 != 0,
                Stage((bits >> 2) & 3),
                Stage((bits >> 4) & 3),
                text,
            )
        };
        let req = LoginRequest {
            transit,
            continue_flag: false,
            csg,
            nsg: if transit { nsg } else { Stage(0) },
            version_max: 0,
            version_min: 0,
            isid: ISID,
            tsih: 0,
            itt: ITT,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        };
        let step = login.handle(&req, &text, &mut policy, &mut rng);
        if tracing() {
            eprintln!(
                "request {req:?} {:?}\n  -> {step:?}",
                String::from_utf8_lossy(&text)
            );
        }
        match step {
            TargetStep::Continue(p) => {
                check_response(&p, false);
                me.check_target_proof(&p.data);
                last = Some(p);
            }
            TargetStep::Complete(p, o) => {
                check_response(&p, false);
                if tracing() {
                    eprintln!("complete: {:?} {:?}", o.target_name, o.chap_name);
                }
                let h = p.header;
                assert!(
                    h.transit && h.nsg == Stage::FULL_FEATURE_PHASE && h.tsih != 0,
                    "{h:?}"
                );
                match o.target_name.as_deref() {
                    None => assert_eq!(o.session_type, SessionType::Discovery),
                    Some(t) => {
                        assert!([OPEN, CHAP, MUTUAL].contains(&t), "a session to {t}");
                        assert_eq!(o.initiator_name, ALLOWED, "the ACL let another in");
                        if t != OPEN {
                            assert!(me.proved, "logged in to {t} without the initiator's secret");
                        }
                        if t == MUTUAL {
                            assert!(me.target_proved, "mutual CHAP without the target's proof");
                        }
                    }
                }
                if o.target_name.is_none()
                    && policy.discovery_auth == (AuthPolicy::Chap { mutual: false })
                {
                    assert!(me.proved, "discovery without the initiator's secret");
                }
                break;
            }
            TargetStep::Failed(p, _) => {
                check_response(&p, true);
                break;
            }
        }
    }
    Ok(())
}

/// Replays the Login Requests of a captured connection (`R`, then the PDUs
/// back to back; login has no digests) with their ISID and ITT set to
/// ours, to a policy that serves any target without authentication: only
/// the responses are checked.
fn replay(stream: &[u8]) {
    let mut policy = Policy {
        discovery_auth: AuthPolicy::None,
        replay: true,
    };
    let mut login = TargetLogin::new(TargetLoginConfig::default());
    let mut rng = TestRng::new(1);
    let framer = replay_framer(0, 8192);
    let mut buf = BytesMut::from(stream);
    while let Next::Pdu(frame, _) = next_pdu(&framer, &mut buf) {
        let Ok(Pdu::LoginRequest(mut req)) = frame.parse() else {
            continue;
        };
        req.isid = ISID;
        req.itt = ITT;
        let step = login.handle(&req, &frame.data, &mut policy, &mut rng);
        if tracing() {
            eprintln!(
                "replay {:?}\n  -> {step:?}",
                String::from_utf8_lossy(&frame.data)
            );
        }
        match step {
            TargetStep::Continue(p) => check_response(&p, false),
            TargetStep::Complete(p, _) => {
                check_response(&p, false);
                break;
            }
            TargetStep::Failed(p, _) => {
                check_response(&p, true);
                break;
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    match input {
        [b'R', stream @ ..] => replay(stream),
        _ => {
            let _ = run(&mut Unstructured::new(input));
        }
    }
});
