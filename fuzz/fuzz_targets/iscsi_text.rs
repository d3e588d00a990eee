//! iSCSI text: parse → canonical emit → parse is the identity on pairs;
//! value helpers and the negotiator never panic; and the bytes, cut into
//! Login Request PDUs, drive the target login state machine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unifab_iscsi::chap::{ChapCredentials, TargetSecrets, TestRng};
use unifab_iscsi::login::{
    AdmitRequest, AuthPolicy, LoginPolicy, LoginStatus, TargetConfig, TargetLogin,
    TargetLoginConfig, TargetLookup,
};
use unifab_iscsi::negotiate::{
    NegotiationLimits, Negotiator, Phase, Role, SessionParams, SessionType,
};
use unifab_iscsi::text::{TextParams, TextWriter, parse_binary, parse_bool, parse_number};
use unifab_iscsi::wire::{LoginRequest, Stage};

struct Policy;

impl LoginPolicy for Policy {
    fn lookup_target(&mut self, _st: SessionType, name: Option<&str>) -> TargetLookup {
        let auth = if name.is_some_and(|n| n.ends_with("chap")) {
            AuthPolicy::Chap { mutual: false }
        } else {
            AuthPolicy::ChapOrNone
        };
        TargetLookup::Found(TargetConfig {
            alias: None,
            portal_group_tag: 1,
            auth,
            limits: NegotiationLimits::default(),
        })
    }
    fn authorize(&mut self, _i: &str, _t: Option<&str>) -> bool {
        true
    }
    fn chap_secrets(&mut self, _t: Option<&str>, _n: &str) -> Option<TargetSecrets> {
        Some(TargetSecrets {
            initiator_secret: b"initiator-secret".to_vec(),
            mutual: Some(ChapCredentials::new("t", b"target-secret-x".to_vec())),
            require_mutual: false,
        })
    }
    fn existing_session(
        &mut self,
        _i: &str,
        _isid: [u8; 6],
        _tsih: u16,
    ) -> Result<SessionParams, LoginStatus> {
        Ok(SessionParams::default())
    }
    fn admit(&mut self, _r: &AdmitRequest<'_>) -> Result<u16, LoginStatus> {
        Ok(1)
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = TextParams::parse(data) {
        let mut w = TextWriter::with_limit(usize::MAX);
        t.emit(&mut w).expect("parsed text re-emits");
        let again = TextParams::parse(w.as_bytes()).expect("canonical text parses");
        assert_eq!(t.pairs(), again.pairs());
        for kv in t.iter() {
            let _ = parse_number(kv.value);
            let _ = parse_binary(kv.value);
            let _ = parse_bool(kv.value);
        }
        for phase in [Phase::Security, Phase::Operational, Phase::FullFeature] {
            for role in [Role::Target, Role::Initiator] {
                let mut n = Negotiator::new(role, NegotiationLimits::default(), true);
                if role == Role::Initiator {
                    n.initiator_offers();
                }
                let _ = n.receive(&t, phase);
                if let Ok((s, _)) = n.finish() {
                    assert!(s.first_burst_length <= s.max_burst_length);
                }
            }
        }
    }
    // Login: the first byte picks flags, the rest is cut into 3 requests.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut login = TargetLogin::new(TargetLoginConfig::default());
    let mut rng = TestRng::new(u64::from(flags));
    let third = rest.len() / 3 + 1;
    for (k, chunk) in rest.chunks(third).enumerate() {
        let bits = flags.rotate_left(k as u32 * 3);
        let req = LoginRequest {
            transit: bits & 1 != 0,
            continue_flag: bits & 2 != 0,
            csg: Stage((bits >> 2) & 3),
            nsg: Stage((bits >> 4) & 3),
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        };
        let _ = login.handle(&req, chunk, &mut Policy, &mut rng);
        if login.is_finished() {
            break;
        }
    }
});
