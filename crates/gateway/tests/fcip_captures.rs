//! `unifab pcap-check` on FCIP: the 2002 pre-RFC trace of class F switch
//! traffic (`fcip_trace.cap`, TCP 3225) is reassembled and checked frame
//! by frame — encapsulation header and its checks, SOF/EOF words, FC CRC,
//! the FC frame, SW_ILS parsed and re-emitted (ELP, ESC, EFP, DIA, RDI,
//! HLO, LSU, LSA, MR and their accepts) — and everything unifab does not
//! accept is reported with its frame number.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use unifab_capture::check::{Protocol, Verdict, pcap_check};

const TRACE: &str = "../../../shared/captures/fcip_trace.cap";

#[test]
fn fcip_trace_parses_frame_by_frame() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    let report = pcap_check(&path).expect("the capture reads");
    let fcip: Vec<_> = report.of(Protocol::Fcip).collect();
    // 117 FCIP frames (captures/README.md), one entry each.
    assert_eq!(fcip.len(), 117, "{report}");
    let not_ok: Vec<String> = fcip
        .iter()
        .filter(|e| e.verdict != Verdict::Ok)
        .map(|e| format!("frame {}: {} {:?}", e.frame, e.what, e.verdict))
        .collect();
    assert!(not_ok.is_empty(), "not accepted:\n{}", not_ok.join("\n"));
    for what in [
        "ELP",
        "ESC",
        "EFP",
        "DIA",
        "RDI",
        "HLO",
        "LSU",
        "LSA",
        "MR",
        "SW_ACC (ELP)",
        "SW_ACC (EFP)",
        "SW_ACC (MR)",
    ] {
        assert!(
            fcip.iter().any(|e| e.what == format!("FCIP SW_ILS {what}")),
            "no {what} checked"
        );
    }
    assert!(report.gaps.iter().all(|g| g.protocol != Protocol::Fcip));
    assert_eq!(report.unchecked.get(&Protocol::Fcip), None);
}

/// Writes the FCIP fuzz seeds (run by `scripts/fuzz-seeds.sh`; ignored in
/// normal runs) into `fuzz/corpus/`:
///
/// - `fcip_encap/`: every encapsulated frame of `fcip_trace.cap`, as
///   reassembled from TCP;
/// - `fcip_sw_ils/`: every SW_ILS payload of the trace behind its selector
///   byte (0 for a request; for a reply, the code of the request it
///   answers, matched by OX_ID);
/// - `fcip_fsf/`: the trace holds no special frame (pre-RFC), so special
///   frames as unifab sends them (class F and data, who-are-you and
///   addressed, each alone and followed by its echo), plus the trace's
///   frames (their encapsulation headers differ from a special frame's
///   only in the flags and length).
#[test]
#[ignore = "writes fuzz seeds: scripts/fuzz-seeds.sh"]
fn write_fcip_fuzz_seeds() {
    use bytes::Bytes;
    use unifab_capture::check::{CheckOptions, fcip_frames};
    use unifab_fc::wire::Wwn;
    use unifab_fc::wire::header::FcType;
    use unifab_fcip::wire::frame::FcipFrameRepr;
    use unifab_fcip::wire::fsf::{EntityId, SpecialFrameRepr, UsageFlags};

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let corpus = root.join("fuzz/corpus");
    let dirs = ["fcip_encap", "fcip_sw_ils", "fcip_fsf"].map(|d| corpus.join(d));
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let [encap_dir, sw_ils_dir, fsf_dir] = dirs;
    let file = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE)).unwrap();
    let frames = fcip_frames(&file, &CheckOptions::default()).unwrap();
    assert_eq!(frames.len(), 117, "the trace's FCIP frames");
    let mut requests = std::collections::HashMap::new();
    let (mut n_encap, mut n_sw_ils) = (0, 0);
    for (i, (frame, _, bytes)) in frames.iter().enumerate() {
        std::fs::write(encap_dir.join(format!("trace-{frame:04}-{i:03}")), bytes).unwrap();
        std::fs::write(fsf_dir.join(format!("trace-{frame:04}-{i:03}")), bytes).unwrap();
        n_encap += 1;
        let Ok(r) = FcipFrameRepr::parse(&Bytes::copy_from_slice(bytes)) else {
            continue;
        };
        if r.frame.header.fc_type != FcType::SW_ILS {
            continue;
        }
        let p = &r.frame.payload;
        let Some(&code) = p.first() else { continue };
        let sel = if code == 0x02 || code == 0x01 {
            requests.get(&r.frame.header.ox_id).copied().unwrap_or(0)
        } else {
            requests.insert(r.frame.header.ox_id, code);
            0
        };
        let mut seed = vec![sel];
        seed.extend_from_slice(p);
        std::fs::write(sw_ils_dir.join(format!("trace-{frame:04}-{i:03}")), seed).unwrap();
        n_sw_ils += 1;
    }
    let mut n_fsf = 0;
    for (k, (flags, dest)) in [
        (UsageFlags::CLASS_F, 0u64),
        (UsageFlags::CLASS_F, 0x1000_0000_c900_0002),
        (UsageFlags::CLASS_3, 0x1000_0000_c900_0002),
    ]
    .into_iter()
    .enumerate()
    {
        let sent = SpecialFrameRepr {
            changed: false,
            source_wwn: Wwn(0x1000_0000_c900_0001),
            entity_id: EntityId(7),
            nonce: 0x0123_4567_89ab_cdef + k as u64,
            usage_flags: UsageFlags(flags),
            usage_code: 0,
            destination_wwn: Wwn(dest),
            k_a_tov: 10_000,
            ..SpecialFrameRepr::default()
        };
        let echo = SpecialFrameRepr {
            changed: dest == 0,
            destination_wwn: Wwn(0x1000_0000_c900_0002),
            ..sent
        };
        let a = sent.to_bytes();
        std::fs::write(fsf_dir.join(format!("unifab-{k}")), a).unwrap();
        let mut both = a.to_vec();
        both.extend_from_slice(&echo.to_bytes());
        std::fs::write(fsf_dir.join(format!("unifab-{k}-echo")), both).unwrap();
        n_fsf += 2;
    }
    println!("seeds: {n_encap} fcip_encap, {n_sw_ils} fcip_sw_ils, {n_fsf} + {n_encap} fcip_fsf");
    assert!(n_sw_ils > 0);
}
