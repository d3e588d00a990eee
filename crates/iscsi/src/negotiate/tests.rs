//! Tests of the negotiation engine: every key of RFC 7143 §12–13 in both
//! roles, the result functions, and the error paths.

use super::*;
use crate::text::TextWriter;

fn text(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut w = TextWriter::new();
    for (k, v) in pairs {
        w.push(k, v).unwrap();
    }
    w.into_bytes()
}

fn answer(n: &mut Negotiator, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let data = text(pairs);
    let p = TextParams::parse(&data).unwrap();
    n.receive(&p, Phase::Operational)
        .unwrap()
        .answers
        .into_iter()
        .map(|a| (a.key, a.value))
        .collect()
}

fn target() -> Negotiator {
    Negotiator::new(Role::Target, NegotiationLimits::default(), true)
}

#[test]
fn table_complete() {
    let all = [
        Key::HeaderDigest,
        Key::DataDigest,
        Key::MaxConnections,
        Key::SendTargets,
        Key::TargetName,
        Key::InitiatorName,
        Key::TargetAlias,
        Key::InitiatorAlias,
        Key::TargetAddress,
        Key::TargetPortalGroupTag,
        Key::InitialR2T,
        Key::ImmediateData,
        Key::MaxRecvDataSegmentLength,
        Key::MaxBurstLength,
        Key::FirstBurstLength,
        Key::DefaultTime2Wait,
        Key::DefaultTime2Retain,
        Key::MaxOutstandingR2T,
        Key::DataPduInOrder,
        Key::DataSequenceInOrder,
        Key::ErrorRecoveryLevel,
        Key::SessionType,
        Key::TaskReporting,
        Key::IscsiProtocolLevel,
        Key::NodeArchitecture,
        Key::OfMarker,
        Key::IfMarker,
        Key::OfMarkInt,
        Key::IfMarkInt,
        Key::AuthMethod,
        Key::ChapA,
        Key::ChapI,
        Key::ChapC,
        Key::ChapN,
        Key::ChapR,
    ];
    assert_eq!(all.len(), KEYS.len());
    for k in all {
        assert_eq!(k.def().key, k);
        assert_eq!(Key::from_name(k.name()), Some(k));
    }
}

#[test]
fn result_functions() {
    let mut t = target();
    let a = answer(
        &mut t,
        &[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "Foo,None"),
            ("MaxConnections", "4"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "16776192"),
            ("FirstBurstLength", "262144"),
            ("DefaultTime2Wait", "0"),
            ("DefaultTime2Retain", "0"),
            ("MaxOutstandingR2T", "8"),
            ("DataPDUInOrder", "No"),
            ("DataSequenceInOrder", "No"),
            ("ErrorRecoveryLevel", "2"),
            ("TaskReporting", "FastAbort,RFC3720"),
            ("iSCSIProtocolLevel", "31"),
            ("MaxRecvDataSegmentLength", "65536"),
        ],
    );
    let get = |k: &str| a.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
    assert_eq!(get("HeaderDigest"), Some("CRC32C")); // first of the offer we support
    assert_eq!(get("DataDigest"), Some("None"));
    assert_eq!(get("MaxConnections"), Some("1")); // min
    assert_eq!(get("InitialR2T"), Some("Yes")); // OR
    assert_eq!(get("ImmediateData"), Some("Yes")); // AND
    assert_eq!(get("MaxBurstLength"), Some("1048576")); // min
    assert_eq!(get("FirstBurstLength"), Some("65536")); // min
    assert_eq!(get("DefaultTime2Wait"), Some("2")); // max
    assert_eq!(get("DefaultTime2Retain"), Some("0")); // min
    assert_eq!(get("MaxOutstandingR2T"), Some("1"));
    assert_eq!(get("DataPDUInOrder"), Some("Yes")); // OR
    assert_eq!(get("DataSequenceInOrder"), Some("Yes"));
    assert_eq!(get("ErrorRecoveryLevel"), Some("0"));
    assert_eq!(get("TaskReporting"), Some("RFC3720")); // list first match
    assert_eq!(get("iSCSIProtocolLevel"), Some("2"));
    assert_eq!(get("MaxRecvDataSegmentLength"), Some("262144")); // declarative
    let (s, c) = t.finish().unwrap();
    assert_eq!(s.max_burst_length, 1 << 20);
    assert_eq!(s.default_time2retain, 0);
    assert!(s.initial_r2t && s.immediate_data);
    assert_eq!(c.initiator_max_recv_data_segment_length, 65536);
    assert_eq!(c.target_max_recv_data_segment_length, 262_144);
    assert_eq!(c.max_send_data_segment_length(Role::Target), 65536);
}

#[test]
fn digest_preference_crc() {
    let mut limits = NegotiationLimits::default();
    limits.header_digests = vec![Digest::Crc32c];
    let mut t = Negotiator::new(Role::Target, limits, true);
    let a = answer(
        &mut t,
        &[("HeaderDigest", "None,CRC32C"), ("DataDigest", "None")],
    );
    assert_eq!(a[0], ("HeaderDigest".into(), "CRC32C".into()));
    assert_eq!(a[1], ("DataDigest".into(), "None".into()));
    assert_eq!(t.connection_params().header_digest, Digest::Crc32c);
    let mut limits = NegotiationLimits::default();
    limits.header_digests = vec![Digest::Crc32c];
    // Required, and the initiator offers only None: no agreement (the
    // default None is not ours), not a session without the digest.
    let mut t = Negotiator::new(Role::Target, limits, true);
    let data = text(&[("HeaderDigest", "None")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(matches!(
        t.receive(&p, Phase::Operational),
        Err(NegotiationError::NoAgreement {
            key: "HeaderDigest"
        })
    ));
}

#[test]
fn and_or_truth_tables() {
    for (offer, local, and, or) in [
        ("Yes", true, "Yes", "Yes"),
        ("Yes", false, "No", "Yes"),
        ("No", true, "No", "Yes"),
        ("No", false, "No", "No"),
    ] {
        let mut limits = NegotiationLimits::default();
        limits.immediate_data = local;
        limits.initial_r2t = local;
        let mut t = Negotiator::new(Role::Target, limits, true);
        let a = answer(&mut t, &[("ImmediateData", offer), ("InitialR2T", offer)]);
        assert_eq!(a[0].1, and, "AND {offer} {local}");
        assert_eq!(a[1].1, or, "OR {offer} {local}");
    }
}

#[test]
fn reject_irrelevant_not_understood() {
    let mut t = target();
    let a = answer(
        &mut t,
        &[
            ("MaxBurstLength", "100"),
            ("ErrorRecoveryLevel", "3"),
            ("ImmediateData", "maybe"),
            ("X-com.cisco.PingTimeout", "5"),
            ("X#Other", "1"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
            ("OFMarkInt", "2048~65535"),
            ("IFMarkInt", "2048~65535"),
            ("X#NodeArchitecture", "unifab/1"),
            ("TargetPortalGroupTag", "1"),
        ],
    );
    let v: Vec<&str> = a.iter().map(|(_, v)| v.as_str()).collect();
    // TargetPortalGroupTag is an identity key, left to the caller.
    assert_eq!(
        v,
        [
            "Reject",
            "Reject",
            "Reject",
            "NotUnderstood",
            "NotUnderstood",
            "Reject",
            "Reject",
            "Reject",
            "Reject"
        ]
    );
    assert_eq!(t.peer_node_architecture(), Some("unifab/1"));
    assert_eq!(t.session_params().max_burst_length, 262_144);
}

#[test]
fn discovery_irrelevant() {
    let mut t = target();
    t.set_session_type(SessionType::Discovery);
    let a = answer(
        &mut t,
        &[
            ("MaxConnections", "1"),
            ("InitialR2T", "No"),
            ("DefaultTime2Wait", "0"),
        ],
    );
    assert_eq!(a[0].1, "Irrelevant");
    assert_eq!(a[1].1, "Irrelevant");
    assert_eq!(a[2].1, "2");
}

#[test]
fn non_leading_and_phases() {
    let mut t = Negotiator::new(Role::Target, NegotiationLimits::default(), false);
    let a = answer(
        &mut t,
        &[("MaxBurstLength", "512"), ("HeaderDigest", "None")],
    );
    assert_eq!(a[0].1, "Irrelevant");
    assert_eq!(a[1].1, "None");
    let mut t = target();
    let data = text(&[
        ("ErrorRecoveryLevel", "0"),
        ("MaxRecvDataSegmentLength", "4096"),
    ]);
    let p = TextParams::parse(&data).unwrap();
    let r = t.receive(&p, Phase::FullFeature).unwrap();
    assert_eq!(r.answers[0].value, "Reject");
    assert_eq!(r.answers[1].value, "262144");
}

#[test]
fn duplicates_are_errors() {
    let mut t = target();
    let data = text(&[("MaxBurstLength", "512"), ("MaxBurstLength", "512")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(matches!(
        t.receive(&p, Phase::Operational),
        Err(NegotiationError::Duplicate { .. })
    ));
    let mut t = target();
    answer(&mut t, &[("MaxBurstLength", "512")]);
    let data = text(&[("MaxBurstLength", "1024")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(matches!(
        t.receive(&p, Phase::Operational),
        Err(NegotiationError::Duplicate { .. })
    ));
}

#[test]
fn first_burst_irrelevant_without_unsolicited_data() {
    let mut limits = NegotiationLimits::default();
    limits.immediate_data = false;
    let mut t = Negotiator::new(Role::Target, limits, true);
    let a = answer(
        &mut t,
        &[
            ("FirstBurstLength", "262144"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "Yes"),
        ],
    );
    assert_eq!(a[0], ("FirstBurstLength".into(), "Irrelevant".into()));
    let mut t = target();
    let a = answer(
        &mut t,
        &[("FirstBurstLength", "262144"), ("ImmediateData", "Yes")],
    );
    assert_eq!(a[0], ("FirstBurstLength".into(), "65536".into()));
}

#[test]
fn first_burst_clamped() {
    let mut limits = NegotiationLimits::default();
    limits.max_burst_length = 16384;
    limits.first_burst_length = 1 << 20;
    let mut t = Negotiator::new(Role::Target, limits, true);
    let a = answer(
        &mut t,
        &[("FirstBurstLength", "262144"), ("MaxBurstLength", "32768")],
    );
    assert_eq!(a[0], ("FirstBurstLength".into(), "16384".into()));
    assert_eq!(a[1], ("MaxBurstLength".into(), "16384".into()));
}

#[test]
fn target_offers_what_defaults_cannot_give() {
    let mut limits = NegotiationLimits::default();
    limits.max_burst_length = 65536;
    limits.first_burst_length = 8192;
    limits.immediate_data = false;
    limits.header_digests = vec![Digest::Crc32c];
    let mut t = Negotiator::new(Role::Target, limits, true);
    answer(&mut t, &[("MaxBurstLength", "65536")]);
    let offers: Vec<String> = t.target_offers().iter().map(ToString::to_string).collect();
    assert_eq!(
        offers,
        [
            "MaxRecvDataSegmentLength=262144",
            "HeaderDigest=CRC32C",
            "ImmediateData=No",
            "FirstBurstLength=8192"
        ]
    );
    assert_eq!(t.pending().count(), 3);
}

#[test]
fn initiator_checks_answers() {
    let mut i = Negotiator::new(Role::Initiator, NegotiationLimits::default(), true);
    let offers = i.initiator_offers();
    assert!(
        offers
            .iter()
            .any(|p| p.key == "MaxBurstLength" && p.value == "1048576")
    );
    // Legal answers.
    let a = answer(
        &mut i,
        &[
            ("MaxBurstLength", "262144"),
            ("HeaderDigest", "CRC32C"),
            ("InitialR2T", "Yes"),
            ("MaxRecvDataSegmentLength", "8192"),
        ],
    );
    assert!(a.is_empty());
    let (s, c) = i.finish().unwrap();
    assert_eq!(s.max_burst_length, 262_144);
    assert_eq!(c.header_digest, Digest::Crc32c);
    assert_eq!(c.target_max_recv_data_segment_length, 8192);
    // Illegal: min answered above our offer.
    let mut i = Negotiator::new(Role::Initiator, NegotiationLimits::default(), true);
    i.initiator_offers();
    let data = text(&[("MaxBurstLength", "2097152")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(matches!(
        i.receive(&p, Phase::Operational),
        Err(NegotiationError::IllegalAnswer { .. })
    ));
    // Illegal: list answer not among offered values.
    let mut limits = NegotiationLimits::default();
    limits.header_digests = vec![Digest::None];
    let mut i = Negotiator::new(Role::Initiator, limits, true);
    i.initiator_offers();
    let data = text(&[("HeaderDigest", "CRC32C")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(i.receive(&p, Phase::Operational).is_err());
    // Illegal: OR offered Yes, answered No.
    let mut i = Negotiator::new(Role::Initiator, NegotiationLimits::default(), true);
    i.initiator_offers();
    let data = text(&[("InitialR2T", "No")]);
    let p = TextParams::parse(&data).unwrap();
    assert!(i.receive(&p, Phase::Operational).is_err());
}

#[test]
fn initiator_answers_target_offers() {
    let mut limits = NegotiationLimits::default();
    limits.max_burst_length = 8192;
    let mut i = Negotiator::new(Role::Initiator, limits, true);
    i.set_session_type(SessionType::Discovery);
    let offers = i.initiator_offers();
    assert!(!offers.iter().any(|p| p.key == "MaxConnections"));
    // The osd capture: a target offers an irrelevant key in discovery.
    let a = answer(&mut i, &[("MaxConnections", "1")]);
    assert_eq!(
        a,
        [("MaxConnections".to_string(), "Irrelevant".to_string())]
    );
}

#[test]
fn unanswered_boolean_decided_by_offer() {
    let mut limits = NegotiationLimits::default();
    limits.immediate_data = false;
    let mut i = Negotiator::new(Role::Initiator, limits, true);
    i.initiator_offers();
    assert!(i.pending().any(|k| k == Key::ImmediateData));
    let (s, _) = i.finish().unwrap();
    assert!(!s.immediate_data);
    assert!(s.initial_r2t);
}

/// An offer left unanswered, or answered Reject / NotUnderstood, settles
/// as if the peer had answered the default: never outside what we
/// offered, and no agreement where the default is not among our values.
#[test]
fn unanswered_or_refused_offers_stay_within_ours() {
    let mut limits = NegotiationLimits::default();
    limits.max_burst_length = 512;
    limits.first_burst_length = 512;
    limits.max_outstanding_r2t = 4;
    let mut i = Negotiator::new(Role::Initiator, limits.clone(), true);
    i.initiator_offers();
    // MaxBurstLength refused, the rest not answered at all.
    answer(&mut i, &[("MaxBurstLength", "Reject")]);
    let (s, c) = i.finish().unwrap();
    assert_eq!(s.max_burst_length, 512, "not the default 262144");
    assert_eq!(s.first_burst_length, 512);
    assert_eq!(
        s.max_outstanding_r2t, 1,
        "the smaller of 4 and the default 1"
    );
    assert_eq!(c.header_digest, Digest::None, "None was offered");

    // Digests required: the default None is not ours.
    limits.header_digests = vec![Digest::Crc32c];
    let mut i = Negotiator::new(Role::Initiator, limits.clone(), true);
    i.initiator_offers();
    assert!(matches!(
        i.finish(),
        Err(NegotiationError::NoAgreement {
            key: "HeaderDigest"
        })
    ));
    let mut i = Negotiator::new(Role::Initiator, limits, true);
    i.initiator_offers();
    let p = TextParams::parse(b"HeaderDigest=NotUnderstood\0").unwrap();
    assert!(matches!(
        i.receive(&p, Phase::Operational),
        Err(NegotiationError::NoAgreement {
            key: "HeaderDigest"
        })
    ));
}
