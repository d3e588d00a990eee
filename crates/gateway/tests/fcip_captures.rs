//! `unifab pcap-check` on FCIP: the 2002 pre-RFC trace of class F switch
//! traffic (`fcip_trace.cap`, TCP 3225) is reassembled and checked frame
//! by frame — encapsulation header and its checks, SOF/EOF words, FC CRC,
//! the FC frame, SW_ILS parsed and re-emitted (ELP, ESC, EFP, DIA, RDI,
//! HLO, LSU, LSA, MR and their accepts) — and everything unifab does not
//! accept is reported with its frame number.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use unifab::pcap_check::{Protocol, Verdict, pcap_check};

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
