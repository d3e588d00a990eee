#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Round trips over the real captures in `../shared/captures` (relative to
//! the repository root). A missing capture fails the test, naming the path.

use std::path::PathBuf;

use unifab_capture::check::{Protocol, Report, Verdict, pcap_check};

fn capture(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("../shared/captures").join(name);
    assert!(p.is_file(), "capture {name} not found at {}", p.display());
    p
}

fn check(name: &str) -> Report {
    pcap_check(capture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn strict(name: &str, min_pdus: usize) -> Report {
    let r = check(name);
    let failures = r.failures(Protocol::Iscsi);
    assert!(
        failures.is_empty(),
        "{name}: {} PDUs failed:\n{r}",
        failures.len()
    );
    assert_eq!(r.truncated(Protocol::Iscsi), 0, "{name}:\n{r}");
    assert!(r.gaps.is_empty(), "{name}: gaps {:?}", r.gaps);
    assert!(
        r.ok(Protocol::Iscsi) >= min_pdus,
        "{name}: only {} PDUs ok",
        r.ok(Protocol::Iscsi)
    );
    r
}

#[test]
fn iscsi_tapel_round_trips() {
    let r = strict("iscsi-tapel.pcap", 160);
    // Login, SCSI commands, Data-In and responses are all present.
    for op in [
        "Login Request",
        "Login Response",
        "SCSI Command",
        "SCSI Response",
        "SCSI Data-In",
    ] {
        assert!(
            r.of(Protocol::Iscsi).any(|e| e.what == op),
            "no {op} in tapel:\n{r}"
        );
    }
}

#[test]
fn scsi_osd_round_trips_with_digests() {
    let r = strict("scsi-osd-example-001.pcap", 150);
    for op in [
        "Ready To Transfer",
        "SCSI Data-Out",
        "Text Request",
        "Text Response",
        "NOP-Out",
        "NOP-In",
    ] {
        assert!(
            r.of(Protocol::Iscsi).any(|e| e.what == op),
            "no {op} in osd:\n{r}"
        );
    }
}

#[test]
fn cdrom_whole_pdus_round_trip_and_gaps_reported() {
    let r = check("iscsi-scsi-data-cdrom.pcap");
    let failures = r.failures(Protocol::Iscsi);
    assert!(failures.is_empty(), "{} PDUs failed:\n{r}", failures.len());
    assert!(r.ok(Protocol::Iscsi) > 100, "{r}");
    assert!(!r.gaps.is_empty(), "the cdrom capture has missing segments");
    assert!(r.gaps.iter().all(|g| g.missing > 0));
}

#[test]
fn missing_capture_is_an_error() {
    let err = pcap_check("/nonexistent/none.pcap").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/none.pcap"));
}

#[test]
fn report_lists_failures_by_frame() {
    let r = Report {
        frames: 3,
        entries: vec![unifab_capture::check::Entry {
            frame: 2,
            protocol: Protocol::Iscsi,
            what: "SCSI Command".into(),
            verdict: Verdict::Mismatch { offset: 7 },
        }],
        ..Report::default()
    };
    assert_eq!(r.failures(Protocol::Iscsi).len(), 1);
    assert!(
        r.to_string()
            .contains("frame 2: Iscsi SCSI Command: mismatch at byte 7")
    );
}

/// Writes fuzz seeds from the strict captures into `fuzz/corpus/<target>/`.
/// Run by `scripts/fuzz-seeds.sh`.
#[test]
#[ignore = "seed generator, run by scripts/fuzz-seeds.sh"]
fn write_fuzz_seeds() {
    use unifab_capture::check::{CheckOptions, iscsi_pdus};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pdu_dir = root.join("fuzz/corpus/iscsi_pdu");
    let text_dir = root.join("fuzz/corpus/iscsi_text");
    let cdb_dir = root.join("fuzz/corpus/cdb");
    std::fs::create_dir_all(&pdu_dir).unwrap();
    std::fs::create_dir_all(&text_dir).unwrap();
    std::fs::create_dir_all(&cdb_dir).unwrap();
    // The session targets replay a connection's full-feature-phase PDUs
    // of one direction: `R`, the digest selector, the PDUs back to back.
    let target_dir = root.join("fuzz/corpus/iscsi_target_session");
    let initiator_dir = root.join("fuzz/corpus/iscsi_initiator_session");
    // The login targets replay a connection's Login Responses (initiator
    // login) or Requests (target login): `R`, then the PDUs back to back.
    let login_dir = root.join("fuzz/corpus/iscsi_initiator_login");
    let target_login_dir = root.join("fuzz/corpus/iscsi_target_login");
    for d in [&target_dir, &initiator_dir, &login_dir, &target_login_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut logins = 0;
    let mut replays = 0;
    let mut cdbs = 0;
    let mut n = 0;
    for name in ["iscsi-tapel.pcap", "scsi-osd-example-001.pcap"] {
        let file = std::fs::read(capture(name)).unwrap();
        let mut streams: std::collections::BTreeMap<_, Vec<u8>> = Default::default();
        let mut login_streams: std::collections::BTreeMap<_, Vec<u8>> = Default::default();
        for (flow, p) in iscsi_pdus(&file, &CheckOptions::default()).unwrap() {
            let op = p.bytes[0] & 0x3f;
            if matches!(op, 0x03 | 0x23) {
                let s = login_streams
                    .entry((flow, op))
                    .or_insert_with(|| vec![b'R']);
                s.extend_from_slice(&p.bytes);
            }
            if !matches!(op, 0x03 | 0x23) {
                let sel = u8::from(p.digests.header) | (u8::from(p.digests.data) << 1);
                let s = streams
                    .entry((flow, op >= 0x20))
                    .or_insert_with(|| vec![b'R', sel]);
                s.extend_from_slice(&p.bytes);
            }
            let sel = u8::from(p.digests.header) | (u8::from(p.digests.data) << 1);
            let mut seed = vec![sel];
            seed.extend_from_slice(&p.bytes);
            std::fs::write(
                pdu_dir.join(format!("{name}-{:06}-{}", p.frame, p.offset)),
                &seed,
            )
            .unwrap();
            let op = p.bytes[0] & 0x3f;
            if op == 0x01 {
                // A SCSI Command: the cdb target's input is a length byte,
                // the CDB (its length from the opcode's group code), then
                // the immediate data as data-out.
                let cdb = &p.bytes[32..48];
                let len: u8 = match cdb[0] >> 5 {
                    0 => 6,
                    1 | 2 => 10,
                    4 => 16,
                    5 => 12,
                    _ => 16,
                };
                let ahs = usize::from(p.bytes[4]) * 4;
                let dsl = usize::from(p.bytes[5]) << 16
                    | usize::from(p.bytes[6]) << 8
                    | usize::from(p.bytes[7]);
                let at = 48 + ahs + if p.digests.header { 4 } else { 0 };
                let mut seed = vec![len];
                seed.extend_from_slice(&cdb[..usize::from(len)]);
                seed.extend_from_slice(&p.bytes[at..(at + dsl.min(4096)).min(p.bytes.len())]);
                std::fs::write(cdb_dir.join(format!("{name}-{:06}", p.frame)), &seed).unwrap();
                cdbs += 1;
            }
            if matches!(op, 0x03 | 0x04 | 0x23 | 0x24) {
                let ahs = usize::from(p.bytes[4]) * 4;
                let dsl = usize::from(p.bytes[5]) << 16
                    | usize::from(p.bytes[6]) << 8
                    | usize::from(p.bytes[7]);
                let at = 48 + ahs + if p.digests.header { 4 } else { 0 };
                if dsl > 0 {
                    std::fs::write(
                        text_dir.join(format!("{name}-{:06}", p.frame)),
                        &p.bytes[at..at + dsl],
                    )
                    .unwrap();
                }
            }
            n += 1;
        }
        for (i, ((_, from_target), seed)) in streams.iter().enumerate() {
            if seed.len() > 2 {
                let dir = if *from_target {
                    &initiator_dir
                } else {
                    &target_dir
                };
                std::fs::write(dir.join(format!("{name}-{i}")), seed).unwrap();
                replays += 1;
            }
        }
        for (i, ((_, op), seed)) in login_streams.iter().enumerate() {
            let dir = if *op == 0x23 {
                &login_dir
            } else {
                &target_login_dir
            };
            std::fs::write(dir.join(format!("{name}-{i}")), seed).unwrap();
            logins += 1;
        }
    }
    assert!(n > 300, "only {n} seeds");
    assert!(replays >= 4, "only {replays} session replay seeds");
    assert!(logins >= 4, "only {logins} login replay seeds");
    assert!(cdbs > 50, "only {cdbs} CDB seeds");
}

mod login_transcripts {
    //! The captured initiators' Login Requests replayed into unifab's target
    //! login state machine, with limits set like the captured target (IET),
    //! and the answers compared with IET's, key by key.

    use super::capture;
    use unifab_capture::check::{CheckOptions, iscsi_pdus};
    use unifab_capture::tcp::FlowKey;
    use unifab_iscsi::chap::{TargetSecrets, TestRng};
    use unifab_iscsi::login::{
        AdmitRequest, AuthPolicy, LoginPolicy, LoginStatus, TargetConfig, TargetLogin,
        TargetLoginConfig, TargetLookup, TargetStep,
    };
    use unifab_iscsi::negotiate::{Digest, NegotiationLimits, SessionParams, SessionType};
    use unifab_iscsi::text::TextParams;
    use unifab_iscsi::wire::{Bhs, LoginRequest, LoginResponse, Pdu};

    /// IET as configured in each capture: the osd one required CRC32C
    /// digests in normal sessions (it chose CRC32C from `None,CRC32C`).
    struct Iet {
        require_digests: bool,
    }

    fn iet_limits() -> NegotiationLimits {
        NegotiationLimits {
            max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: false,
            default_time2wait: 2,
            default_time2retain: 20,
            ..NegotiationLimits::default()
        }
    }

    impl LoginPolicy for Iet {
        fn lookup_target(&mut self, st: SessionType, _name: Option<&str>) -> TargetLookup {
            let mut limits = iet_limits();
            if self.require_digests && st == SessionType::Normal {
                limits.header_digests = vec![Digest::Crc32c];
                limits.data_digests = vec![Digest::Crc32c];
            }
            TargetLookup::Found(TargetConfig {
                alias: None,
                portal_group_tag: 1,
                auth: AuthPolicy::None,
                limits,
            })
        }
        fn authorize(&mut self, _i: &str, _t: Option<&str>) -> bool {
            true
        }
        fn chap_secrets(&mut self, _t: Option<&str>, _n: &str) -> Option<TargetSecrets> {
            None
        }
        fn existing_session(
            &mut self,
            _i: &str,
            _isid: [u8; 6],
            _t: u16,
        ) -> Result<SessionParams, LoginStatus> {
            Err(LoginStatus::SESSION_DOES_NOT_EXIST)
        }
        fn admit(&mut self, _r: &AdmitRequest<'_>) -> Result<u16, LoginStatus> {
            Ok(0x0100)
        }
    }

    type Exchange = Vec<(LoginRequest, Vec<u8>, LoginResponse, Vec<u8>)>;

    /// The login exchanges of each connection, requests paired with responses.
    fn logins(name: &str) -> Vec<Exchange> {
        let file = std::fs::read(capture(name)).unwrap();
        let pdus = iscsi_pdus(&file, &CheckOptions::default()).unwrap();
        let mut conns: Vec<(FlowKey, Exchange)> = Vec::new();
        let split = |b: &[u8]| -> (Pdu, Vec<u8>) {
            let bhs = Bhs::new_checked(&b[..48]).unwrap();
            let dsl = bhs.data_segment_length() as usize;
            (Pdu::parse(&bhs).unwrap(), b[48..48 + dsl].to_vec())
        };
        let reqs: Vec<(FlowKey, LoginRequest, Vec<u8>)> = pdus
            .iter()
            .filter_map(|(k, p)| match split(&p.bytes) {
                (Pdu::LoginRequest(r), d) => Some((*k, r, d)),
                _ => None,
            })
            .collect();
        let resps: Vec<(FlowKey, LoginResponse, Vec<u8>)> = pdus
            .iter()
            .filter_map(|(k, p)| match split(&p.bytes) {
                (Pdu::LoginResponse(r), d) => Some((*k, r, d)),
                _ => None,
            })
            .collect();
        for (k, rq, rd) in reqs {
            let back = FlowKey {
                src: k.dst,
                dst: k.src,
            };
            let n = conns
                .iter()
                .find(|(c, _)| *c == k)
                .map_or(0, |(_, e)| e.len());
            let Some((_, rs, sd)) = resps.iter().filter(|(b, _, _)| *b == back).nth(n) else {
                continue;
            };
            match conns.iter_mut().find(|(c, _)| *c == k) {
                Some((_, e)) => e.push((rq, rd, *rs, sd.clone())),
                None => conns.push((k, vec![(rq, rd, *rs, sd.clone())])),
            }
        }
        conns.into_iter().map(|(_, e)| e).collect()
    }

    /// Replays one connection's requests; returns our responses.
    fn replay(
        ex: &Exchange,
        require_digests: bool,
    ) -> Vec<(
        LoginResponse,
        Vec<u8>,
        Option<unifab_iscsi::login::LoginOutcome>,
    )> {
        let mut t = TargetLogin::new(TargetLoginConfig::default());
        let mut rng = TestRng::new(9);
        let mut out = Vec::new();
        for (rq, rd, _, _) in ex {
            match t.handle(rq, rd, &mut Iet { require_digests }, &mut rng) {
                TargetStep::Continue(p) => out.push((p.header, p.data.to_vec(), None)),
                TargetStep::Complete(p, o) => {
                    // We may finish sooner than IET did (it made offers of
                    // its own that cost a round trip).
                    out.push((p.header, p.data.to_vec(), Some(o)));
                    break;
                }
                TargetStep::Failed(p, e) => panic!("login refused: {e} {:?}", p.header),
            }
        }
        out
    }

    /// Compare our answers with IET's. RFC 7143 §13.25 makes us answer the
    /// obsolete marker keys `Reject` where the 2005 IET answered `No`; the
    /// MaxConnections offer IET made in a discovery session (answered
    /// `Irrelevant` by the initiator) we do not make; TargetPortalGroupTag we
    /// also send in discovery sessions; FirstBurstLength we call Irrelevant
    /// when no unsolicited data is allowed.
    fn same_answers(ours: &[u8], theirs: &[u8]) {
        let ours = TextParams::parse(ours).unwrap();
        let theirs = TextParams::parse(theirs).unwrap();
        for kv in theirs.iter() {
            let mine = ours.get(kv.key);
            match kv.key {
                "IFMarker" | "OFMarker" => assert_eq!(mine, Some("Reject")),
                "MaxConnections" if mine.is_none() => {}
                // Irrelevant with InitialR2T=Yes and ImmediateData=No
                // (RFC 7143 §13.14); IET answered a number in 2005.
                "FirstBurstLength" if mine == Some("Irrelevant") => {}
                _ => assert_eq!(mine, Some(kv.value), "{}", kv.key),
            }
        }
        for kv in ours.iter() {
            assert!(
                theirs.get(kv.key).is_some()
                    || matches!(kv.key, "TargetPortalGroupTag" | "MaxRecvDataSegmentLength"),
                "we sent {kv} that IET did not"
            );
        }
    }

    #[test]
    fn tapel_single_pdu_login() {
        let conns = logins("iscsi-tapel.pcap");
        assert_eq!(conns.len(), 1);
        let ex = &conns[0];
        assert_eq!(
            ex.len(),
            1,
            "open-iscsi logs in with one operational-stage request"
        );
        let ours = replay(ex, false);
        let (h, d, o) = &ours[0];
        let theirs = &ex[0].2;
        assert_eq!(
            (h.transit, h.csg, h.nsg),
            (theirs.transit, theirs.csg, theirs.nsg)
        );
        assert_eq!((h.isid, h.itt), (theirs.isid, theirs.itt));
        assert_eq!(h.status_class, 0);
        // Exact bytes of our answer.
        let expected = "TargetPortalGroupTag=1\0HeaderDigest=None\0DataDigest=None\0\
            MaxRecvDataSegmentLength=8192\0DefaultTime2Wait=2\0DefaultTime2Retain=0\0IFMarker=Reject\0\
            OFMarker=Reject\0ErrorRecoveryLevel=0\0InitialR2T=Yes\0ImmediateData=No\0\
            MaxBurstLength=262144\0FirstBurstLength=Irrelevant\0MaxOutstandingR2T=1\0MaxConnections=1\0\
            DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0X-com.cisco.PingTimeout=NotUnderstood\0\
            X-com.cisco.sendAsyncText=NotUnderstood\0X-com.cisco.protocol=NotUnderstood\0";
        assert_eq!(String::from_utf8_lossy(d), expected);
        same_answers(d, &ex[0].3);
        let o = o.as_ref().expect("login completes");
        assert_eq!(o.initiator_name, "iqn.1987-05.com.cisco:01.7b3a5abcb1c2");
        assert_eq!(o.initiator_alias.as_deref(), Some("fc3-i386.localdomain"));
        assert_eq!(
            o.target_name.as_deref(),
            Some("iqn.2001-04.com.example:ex-st")
        );
        assert_eq!(o.connection.initiator_max_recv_data_segment_length, 65536);
        assert!(!o.session.immediate_data && o.session.initial_r2t);
    }

    #[test]
    fn osd_discovery_then_normal_with_digests() {
        let conns = logins("scsi-osd-example-001.pcap");
        assert_eq!(conns.len(), 2, "a discovery and a normal session");
        let mut kinds = Vec::new();
        for ex in &conns {
            let ours = replay(ex, true);
            for ((h, d, o), (_, _, th, td)) in ours.iter().zip(ex) {
                if o.is_some() {
                    assert!(h.transit && h.nsg.0 == 3);
                } else {
                    assert_eq!((h.transit, h.csg, h.nsg), (th.transit, th.csg, th.nsg));
                }
                assert_eq!(h.status_class, 0);
                same_answers(d, td);
            }
            let o = ours
                .last()
                .and_then(|(_, _, o)| o.clone())
                .expect("login completes");
            kinds.push(o.session_type);
            if o.session_type == SessionType::Normal {
                assert_eq!(o.connection.header_digest, Digest::Crc32c);
                assert_eq!(o.connection.data_digest, Digest::Crc32c);
                assert!(o.digests.header && o.digests.data);
            }
        }
        kinds.sort_by_key(|k| *k == SessionType::Normal);
        assert_eq!(kinds, [SessionType::Discovery, SessionType::Normal]);
    }
}
