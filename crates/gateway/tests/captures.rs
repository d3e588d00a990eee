//! Round trips over the real captures in `../shared/captures` (relative to
//! the repository root). A missing capture fails the test, naming the path.

use std::path::PathBuf;

use unifab::pcap_check::{Protocol, Report, Verdict, pcap_check};

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
        entries: vec![unifab::pcap_check::Entry {
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
    use unifab::pcap_check::{CheckOptions, iscsi_pdus};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let pdu_dir = root.join("fuzz/corpus/iscsi_pdu");
    let text_dir = root.join("fuzz/corpus/iscsi_text");
    std::fs::create_dir_all(&pdu_dir).unwrap();
    std::fs::create_dir_all(&text_dir).unwrap();
    let mut n = 0;
    for name in ["iscsi-tapel.pcap", "scsi-osd-example-001.pcap"] {
        let file = std::fs::read(capture(name)).unwrap();
        for p in iscsi_pdus(&file, &CheckOptions::default()).unwrap() {
            let sel = u8::from(p.digests.header) | (u8::from(p.digests.data) << 1);
            let mut seed = vec![sel];
            seed.extend_from_slice(&p.bytes);
            std::fs::write(
                pdu_dir.join(format!("{name}-{:06}-{}", p.frame, p.offset)),
                &seed,
            )
            .unwrap();
            let op = p.bytes[0] & 0x3f;
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
    }
    assert!(n > 300, "only {n} seeds");
}
