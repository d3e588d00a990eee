//! The initiator's login (`login::InitiatorLogin`) against a hostile
//! target: the input picks the initiator's configuration (no CHAP, CHAP,
//! mutual CHAP; discovery or normal; a new session or a connection added
//! to one; the limits it negotiates within) and a random seed, then up to
//! 16 Login Responses: their flags, stages, status, version, TSIH, ITT and
//! ISID (mostly echoed), and a data segment of raw bytes or of keys from a
//! vocabulary with values from a vocabulary, raw bytes or, for CHAP_R, the
//! right answer to the initiator's challenge.
//!
//! An input that starts with `R` replays the Login Responses of a captured
//! connection instead (`scripts/fuzz-seeds.sh` writes one per connection),
//! to a login without CHAP, with the responses' ITT and ISID set to ours.
//!
//! Checked, beside "no panic":
//! - every Login Request encodes, frames and parses back to itself, with at
//!   most 8192 bytes of text (the login-phase MaxRecvDataSegmentLength,
//!   RFC 7143 §13.12), and echoes the configured ISID, TSIH, ITT and CID;
//! - a completed login with mutual CHAP means the target answered the
//!   initiator's challenge with the right CHAP_R for the target's secret
//!   (it proved the secret);
//! - a completed login's parameters are within what the initiator offered:
//!   session type, digests from its lists, MaxBurstLength, FirstBurstLength
//!   (never above MaxBurstLength), InitialR2T (OR), ImmediateData (AND),
//!   MaxOutstandingR2T, MaxConnections, ErrorRecoveryLevel, its own
//!   MaxRecvDataSegmentLength, the target's within 512..=2^24-1, and a TSIH
//!   (the one given, for an added connection).
#![no_main]

#[path = "common/iscsi.rs"]
mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use unifab_iscsi::chap::{ChapAlgorithm, ChapConfig, ChapCredentials, TestRng, compute_response};
use unifab_iscsi::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginOutcome, LoginPdu,
};
use unifab_iscsi::negotiate::{Digest, NegotiationLimits, SessionType};
use unifab_iscsi::text::{TextParams, parse_binary, parse_number};
use unifab_iscsi::wire::{LoginRequest, LoginResponse, Pdu, Stage};

use bytes::BytesMut;

use common::{Next, check_emitted, data, next_pdu, replay_framer, tracing};

const ITT: u32 = 0x0a0b_0c0d;
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0, 1];
const OUR_SECRET: &[u8] = b"initiator-secret-12";
const TARGET_SECRET: &[u8] = b"target-secret-123456";

const KEYS: [&str; 30] = [
    "AuthMethod",
    "CHAP_A",
    "CHAP_I",
    "CHAP_C",
    "CHAP_N",
    "CHAP_R",
    "HeaderDigest",
    "DataDigest",
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxRecvDataSegmentLength",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
    "ErrorRecoveryLevel",
    "TargetAlias",
    "TargetPortalGroupTag",
    "TargetAddress",
    "SessionType",
    "TargetName",
    "iSCSIProtocolLevel",
    "TaskReporting",
    "OFMarker",
    "X-vendor.key",
    "SendTargets",
];

const VALUES: [&str; 24] = [
    "None",
    "CHAP",
    "CHAP,None",
    "5",
    "7",
    "5,7",
    "6",
    "CRC32C",
    "None,CRC32C",
    "Yes",
    "No",
    "0",
    "1",
    "2",
    "512",
    "8192",
    "65536",
    "262144",
    "16777215",
    "16777216",
    "Reject",
    "Irrelevant",
    "NotUnderstood",
    "0x00112233445566778899aabbccddeeff",
];

/// What the initiator sent for CHAP: its CHAP_I and CHAP_C (mutual).
#[derive(Debug, Default)]
struct Sent {
    chap_i: Option<u8>,
    chap_c: Option<Vec<u8>>,
}

fn hex(b: &[u8]) -> String {
    let mut s = String::from("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// The right CHAP_R for the target's secret, for the algorithm the
/// target's CHAP_A chose (MD5 if it named none).
fn right_answer(sent: &Sent, alg: ChapAlgorithm) -> Option<String> {
    let r = compute_response(alg, sent.chap_i?, TARGET_SECRET, sent.chap_c.as_ref()?)?;
    Some(hex(&r))
}

fn text(u: &mut Unstructured<'_>, sent: &Sent, alg: ChapAlgorithm) -> Result<Vec<u8>> {
    if u.ratio(1, 8)? {
        let len = u.int_in_range(0..=8193)?;
        return data(u, len);
    }
    let mut t = Vec::new();
    for _ in 0..u.int_in_range(0..=8)? {
        let key = *u.choose(&KEYS)?;
        let value = match (key, u.int_in_range(0..=3)?) {
            ("CHAP_R", 0 | 1) => right_answer(sent, alg).unwrap_or_default(),
            ("CHAP_I", 0) => "7".to_string(),
            ("CHAP_C", 0) => hex(&[0x5a; 16]),
            ("CHAP_N", 0 | 1) => "target".to_string(),
            (_, 3) => {
                let len = u.int_in_range(0..=40)?;
                String::from_utf8_lossy(&data(u, len)?).replace('\0', "")
            }
            _ => u.choose(&VALUES)?.to_string(),
        };
        t.extend_from_slice(key.as_bytes());
        t.push(b'=');
        t.extend_from_slice(value.as_bytes());
        t.push(0);
    }
    Ok(t)
}

/// What a compliant target answers to `last`: the stage it asked for, the
/// CHAP steps (with the right CHAP_R for mutual CHAP, or a bent one), and
/// an answer to every offered key within the offer. The fuzzer still picks
/// the challenge, the target's MaxRecvDataSegmentLength and whether to bend.
fn compliant(
    u: &mut Unstructured<'_>,
    last: &LoginPdu<LoginRequest>,
    sent: &Sent,
    alg: &mut ChapAlgorithm,
) -> Result<(bool, Stage, Vec<u8>)> {
    let mut t = Vec::new();
    let mut push = |k: &str, v: &str| {
        t.extend_from_slice(k.as_bytes());
        t.push(b'=');
        t.extend_from_slice(v.as_bytes());
        t.push(0);
    };
    let Ok(params) = TextParams::parse(&last.data) else {
        return Ok((false, Stage(0), Vec::new()));
    };
    let h = last.header;
    if h.csg == Stage::SECURITY_NEGOTIATION {
        if params.get("AuthMethod") == Some("CHAP") {
            push("AuthMethod", "CHAP");
            return Ok((false, Stage(0), t));
        }
        if let Some(a) = params.get("CHAP_A") {
            let first = a.split(',').next().unwrap_or("5");
            *alg = ChapAlgorithm(first.parse().unwrap_or(5));
            push("CHAP_A", first);
            push("CHAP_I", &u.arbitrary::<u8>()?.to_string());
            let mut c = vec![0u8; u.int_in_range(16..=32)?];
            u.fill_buffer(&mut c)?;
            push("CHAP_C", &hex(&c));
            return Ok((false, Stage(0), t));
        }
        if params.get("CHAP_R").is_some() {
            if params.get("CHAP_C").is_some() {
                push("CHAP_N", "target");
                let right = right_answer(sent, *alg).unwrap_or_default();
                if u.ratio(7, 8)? {
                    push("CHAP_R", &right);
                } else {
                    push("CHAP_R", &right.replace('a', "b"));
                }
            }
            return Ok((true, Stage::LOGIN_OPERATIONAL_NEGOTIATION, t));
        }
        if params.get("AuthMethod").is_some() {
            push("AuthMethod", "None");
        }
        return Ok((h.transit, h.nsg, t));
    }
    for kv in params.iter() {
        match kv.key {
            "MaxRecvDataSegmentLength" => {}
            "HeaderDigest" | "DataDigest" | "TaskReporting" => {
                push(kv.key, kv.value.split(',').next().unwrap_or(kv.value));
            }
            k if u.ratio(1, 16)? => push(k, u.choose(&VALUES)?),
            k => push(k, kv.value),
        }
    }
    push(
        "MaxRecvDataSegmentLength",
        &u.choose(&[512u32, 8192, 262_144])?.to_string(),
    );
    Ok((true, Stage::FULL_FEATURE_PHASE, t))
}

/// A completed login's parameters are within what the initiator offered.
fn check_outcome(o: &LoginOutcome, cfg: &InitiatorLoginConfig) {
    let limits = &cfg.limits;
    let discovery = cfg.target_name.is_none();
    let tsih = cfg.tsih;
    let s = o.session;
    let c = o.connection;
    let want = if discovery {
        SessionType::Discovery
    } else {
        SessionType::Normal
    };
    assert_eq!(s.session_type, want);
    assert!(limits.header_digests.contains(&c.header_digest));
    assert!(limits.data_digests.contains(&c.data_digest));
    // Session-wide keys are negotiated on the leading connection
    // only (an added one takes the session's, here none given).
    if !discovery && tsih == 0 {
        assert!(s.max_burst_length <= limits.max_burst_length);
        // FirstBurstLength matters only with unsolicited data
        // (RFC 7143 §13.14: Irrelevant otherwise).
        if !s.initial_r2t || s.immediate_data {
            assert!(s.first_burst_length <= limits.first_burst_length);
        }
        assert!(s.first_burst_length <= s.max_burst_length);
        assert!(s.initial_r2t || !limits.initial_r2t);
        assert!(!s.immediate_data || limits.immediate_data);
        assert!(
            (1..=limits.max_outstanding_r2t).contains(&s.max_outstanding_r2t),
            "MaxOutstandingR2T {}",
            s.max_outstanding_r2t
        );
        assert!((1..=limits.max_connections).contains(&s.max_connections));
    }
    assert!(s.error_recovery_level <= limits.error_recovery_level);
    assert_eq!(
        c.initiator_max_recv_data_segment_length,
        limits.max_recv_data_segment_length
    );
    assert!(
        (512..=16_777_215).contains(&c.target_max_recv_data_segment_length),
        "target MaxRecvDataSegmentLength {}",
        c.target_max_recv_data_segment_length
    );
    assert_ne!(o.tsih, 0);
    if tsih != 0 {
        assert_eq!(o.tsih, tsih);
    }
}

/// A normal session's leading login without CHAP, on default limits: the
/// replay's configuration, and what `run` fuzzes from.
fn base_config() -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        initiator_name: "iqn.2026-11.fuzz:initiator".into(),
        initiator_alias: None,
        target_name: Some("iqn.2026-11.fuzz:target".into()),
        isid: ISID,
        tsih: 0,
        cid: 0,
        itt: ITT,
        cmd_sn: 1,
        exp_stat_sn: 0,
        chap: None,
        chap_config: ChapConfig::default(),
        limits: NegotiationLimits::default(),
        session: None,
    }
}

/// Checks a Login Request and notes its CHAP keys.
fn check_request(p: &LoginPdu<LoginRequest>, cfg: &InitiatorLoginConfig, sent: &mut Sent) {
    let h = p.header;
    let len = check_emitted(&Pdu::LoginRequest(h), &[], &[p.data.clone()]);
    assert!(len <= 8192, "{len} bytes of login text in one PDU");
    assert_eq!(
        (h.isid, h.tsih, h.itt, h.cid),
        (cfg.isid, cfg.tsih, cfg.itt, cfg.cid),
        "a Login Request with other identifiers"
    );
    if let Ok(params) = TextParams::parse(&p.data) {
        if let Some(i) = params.get("CHAP_I").and_then(|v| parse_number(v).ok()) {
            sent.chap_i = u8::try_from(i).ok();
        }
        if let Some(c) = params.get("CHAP_C").and_then(|v| parse_binary(v).ok()) {
            sent.chap_c = Some(c);
        }
    }
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let chap_mode = u.int_in_range(0..=2)?;
    let discovery = u.ratio(1, 4)?;
    let tsih: u16 = if u.ratio(1, 4)? {
        u.int_in_range(1..=9)?
    } else {
        0
    };
    let digests = [
        vec![Digest::None],
        vec![Digest::Crc32c],
        vec![Digest::None, Digest::Crc32c],
        vec![Digest::Crc32c, Digest::None],
    ];
    let max_burst_length = *u.choose(&[512, 8192, 262_144, 1 << 20, 16_777_215])?;
    let limits = NegotiationLimits {
        header_digests: u.choose(&digests)?.clone(),
        data_digests: u.choose(&digests)?.clone(),
        max_connections: u.int_in_range(1..=4)?,
        initial_r2t: u.arbitrary()?,
        immediate_data: u.arbitrary()?,
        max_recv_data_segment_length: *u.choose(&[512, 8192, 262_144, 16_777_215])?,
        max_burst_length,
        first_burst_length: (*u.choose(&[512, 8192, 65_536, 262_144])?).min(max_burst_length),
        max_outstanding_r2t: u.int_in_range(1..=8)?,
        ..NegotiationLimits::default()
    };
    let algorithms = u
        .choose(&[
            vec![ChapAlgorithm::SHA256, ChapAlgorithm::MD5],
            vec![ChapAlgorithm::MD5],
            vec![ChapAlgorithm::SHA256],
        ])?
        .clone();
    let cfg = InitiatorLoginConfig {
        target_name: (!discovery).then(|| "iqn.2026-11.fuzz:target".to_string()),
        tsih,
        cid: u.int_in_range(0..=3)?,
        cmd_sn: u.arbitrary()?,
        chap: match chap_mode {
            0 => None,
            1 => Some((ChapCredentials::new("initiator", OUR_SECRET), None)),
            _ => Some((
                ChapCredentials::new("initiator", OUR_SECRET),
                Some(ChapCredentials::new("target", TARGET_SECRET)),
            )),
        },
        chap_config: ChapConfig {
            algorithms,
            challenge_len: u.int_in_range(16..=64)?,
            ..ChapConfig::default()
        },
        limits: limits.clone(),
        ..base_config()
    };
    if tracing() {
        eprintln!("config: chap {chap_mode} discovery {discovery} tsih {tsih} {limits:?}");
    }
    let mut rng = TestRng::new(u.arbitrary()?);
    let Ok(mut login) = InitiatorLogin::new(cfg.clone()) else {
        return Ok(());
    };
    let Ok(first) = login.start() else {
        return Ok(());
    };
    let mut sent = Sent::default();
    check_request(&first, &cfg, &mut sent);
    let mut last = first;
    let mut alg = ChapAlgorithm::MD5;
    // The target has sent the right CHAP_R.
    let mut proved = false;
    for _ in 0..16 {
        if u.is_empty() {
            break;
        }
        let stage = last.header.csg;
        let (transit, nsg, t) = if u.ratio(2, 3)? {
            compliant(u, &last, &sent, &mut alg)?
        } else {
            let transit = u.ratio(1, 2)?;
            let nsg = match u.int_in_range(0..=4)? {
                0 | 1 => Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                2 | 3 => Stage::FULL_FEATURE_PHASE,
                _ => Stage(u.int_in_range(0..=3)?),
            };
            (transit, nsg, text(u, &sent, alg)?)
        };
        let csg = if u.ratio(15, 16)? {
            stage
        } else {
            Stage(u.int_in_range(0..=3)?)
        };
        let resp = LoginResponse {
            transit,
            continue_flag: u.ratio(1, 8)?,
            csg,
            nsg: if transit { nsg } else { Stage(0) },
            version_max: 0,
            version_active: if u.ratio(15, 16)? { 0 } else { u.arbitrary()? },
            isid: if u.ratio(15, 16)? {
                ISID
            } else {
                u.arbitrary()?
            },
            tsih: if u.ratio(7, 8)? {
                if tsih != 0 { tsih } else { 0x1234 }
            } else {
                u.arbitrary()?
            },
            itt: if u.ratio(15, 16)? {
                ITT
            } else {
                u.arbitrary()?
            },
            stat_sn: u.arbitrary()?,
            exp_cmd_sn: cfg.cmd_sn,
            max_cmd_sn: cfg.cmd_sn.wrapping_add(u.int_in_range(0..=32)?),
            status_class: if u.ratio(7, 8)? {
                0
            } else {
                u.int_in_range(0..=3)?
            },
            status_detail: if u.ratio(7, 8)? { 0 } else { u.arbitrary()? },
        };
        if let Ok(p) = TextParams::parse(&t)
            && let Some(a) = p.get("CHAP_A").and_then(|v| parse_number(v).ok())
        {
            alg = ChapAlgorithm(u8::try_from(a).unwrap_or(0));
        }
        let right = right_answer(&sent, alg);
        proved |= right.is_some()
            && TextParams::parse(&t)
                .ok()
                .and_then(|p| p.get("CHAP_R").map(str::to_string))
                .is_some_and(|r| Some(r.to_ascii_lowercase()) == right);
        if tracing() {
            eprintln!("response {resp:?} {:?}", String::from_utf8_lossy(&t));
        }
        match login.handle(&resp, &t, &mut rng) {
            InitiatorStep::Send(req) => {
                if tracing() {
                    eprintln!(
                        "  request {:?} {:?}",
                        req.header,
                        String::from_utf8_lossy(&req.data)
                    );
                }
                check_request(&req, &cfg, &mut sent);
                last = req;
            }
            InitiatorStep::Complete(o) => {
                if tracing() {
                    eprintln!("  complete {o:?}");
                }
                if chap_mode == 2 {
                    assert!(
                        sent.chap_c.is_some() && proved,
                        "logged in to a target that never proved the secret"
                    );
                }
                check_outcome(&o, &cfg);
                break;
            }
            InitiatorStep::Failed(e) => {
                if tracing() {
                    eprintln!("  failed {e}");
                }
                break;
            }
        }
    }
    Ok(())
}

/// Replays the Login Responses of a captured connection (`R`, then the
/// PDUs back to back, no digests: login has none) to a login without CHAP,
/// with their ITT and ISID set to ours.
fn replay(stream: &[u8]) {
    let cfg = base_config();
    let Ok(mut login) = InitiatorLogin::new(cfg.clone()) else {
        return;
    };
    let Ok(first) = login.start() else { return };
    let mut sent = Sent::default();
    check_request(&first, &cfg, &mut sent);
    let framer = replay_framer(0, 8192);
    let mut buf = BytesMut::from(stream);
    let mut rng = TestRng::new(1);
    while let Next::Pdu(frame, _) = next_pdu(&framer, &mut buf) {
        let Ok(Pdu::LoginResponse(mut resp)) = frame.parse() else {
            continue;
        };
        resp.itt = ITT;
        resp.isid = ISID;
        let step = login.handle(&resp, &frame.data, &mut rng);
        if tracing() {
            eprintln!(
                "replay {:?} -> {step:?}",
                String::from_utf8_lossy(&frame.data)
            );
        }
        match step {
            InitiatorStep::Send(req) => check_request(&req, &cfg, &mut sent),
            InitiatorStep::Complete(o) => {
                check_outcome(&o, &cfg);
                break;
            }
            InitiatorStep::Failed(_) => break,
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
