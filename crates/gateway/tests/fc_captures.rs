#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `unifab pcap-check` on the real FCoE captures in `../shared/captures`:
//! every FC frame of fcoe-t11.pcap and fip-adv.cap round-trips byte for
//! byte; the cut captures are reported frame by frame as truncated; the
//! pre-T11 encapsulation is refused cleanly. A missing capture fails the
//! test, naming the path.

use std::path::PathBuf;
use std::process::Command;

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

#[test]
fn fcoe_t11_every_frame_round_trips() {
    let r = check("fcoe-t11.pcap");
    assert_eq!(r.frames, 69);
    assert_eq!(r.ok(Protocol::Fcoe), 69, "{r}");
    assert!(r.failures(Protocol::Fcoe).is_empty(), "{r}");
    for what in [
        "ELS FLOGI",
        "ELS PLOGI",
        "ELS PRLI",
        "ELS ADISC",
        "ELS SCR",
        "ELS LS_ACC",
        "CT RNN_ID",
        "CT RSNN_NN",
        "CT RFT_ID",
        "CT RFF_ID",
        "CT GID_FT",
        "CT GSNN_NN",
        "CT GSPN_ID",
        "CT FS_ACC",
        "CT FS_RJT",
        "FCP_CMND",
        "FCP_DATA",
        "FCP_RSP",
    ] {
        assert!(
            r.of(Protocol::Fcoe).any(|e| e.what == what),
            "no {what} in fcoe-t11:\n{r}"
        );
    }
}

#[test]
fn fip_adv_every_fc_frame_round_trips() {
    let r = check("fip-adv.cap");
    assert_eq!(r.frames, 40);
    // 32 FCoE frames, and the FLOGI and its accept carried in FIP.
    assert_eq!(r.ok(Protocol::Fcoe), 32, "{r}");
    assert_eq!(r.ok(Protocol::Fc), 2, "{r}");
    assert!(r.failures(Protocol::Fcoe).is_empty() && r.failures(Protocol::Fc).is_empty());
    assert!(r.of(Protocol::Fc).any(|e| e.what == "ELS FLOGI (in FIP)"));
    assert!(r.of(Protocol::Fcoe).any(|e| e.what == "CT GPN_FT"));
}

#[test]
fn cut_captures_are_reported_as_truncated_frame_by_frame() {
    for (name, cut) in [("fcoe-t11-short.cap", 14), ("fcoe-drop-rddata.cap", 51)] {
        let r = check(name);
        let truncated: Vec<u64> = r
            .of(Protocol::Fcoe)
            .filter(|e| e.verdict == Verdict::Truncated)
            .map(|e| e.frame)
            .collect();
        assert_eq!(truncated.len(), cut, "{name}:\n{r}");
        // Whatever was captured whole round-trips.
        assert!(r.failures(Protocol::Fcoe).is_empty(), "{name}:\n{r}");
        assert_eq!(
            r.ok(Protocol::Fcoe) + truncated.len(),
            r.frames as usize,
            "{name}: every frame has a verdict"
        );
    }
    // The report names them frame by frame.
    let text = check("fcoe-t11-short.cap").to_string();
    assert!(
        text.contains("frame 7: Fcoe FCoE frame: truncated"),
        "{text}"
    );
    // SRR and REC with their accepts, from the recovery capture.
    let r = check("fcoe-drop-rddata.cap");
    assert!(
        r.of(Protocol::Fcoe)
            .any(|e| e.what == "ELS SRR" && e.verdict == Verdict::Ok)
    );
    assert!(
        r.of(Protocol::Fcoe)
            .any(|e| e.what == "ELS REC" && e.verdict == Verdict::Ok)
    );
}

#[test]
fn pre_t11_fcoe_is_refused_cleanly() {
    let r = check("fcoe1.cap");
    assert!(r.ok(Protocol::Fcoe) == 0, "{r}");
    assert!(
        r.of(Protocol::Fcoe)
            .all(|e| matches!(e.verdict, Verdict::NotAccepted { .. } | Verdict::Truncated)),
        "{r}"
    );
}

#[test]
fn the_command_reports_and_exits_by_verdict() {
    let run = |name: &str| {
        Command::new(env!("CARGO_BIN_EXE_unifab"))
            .arg("pcap-check")
            .arg(capture(name))
            .output()
            .unwrap()
    };
    let ok = run("fcoe-t11.pcap");
    assert!(ok.status.success());
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(out.contains("Fcoe: 69 ok, 0 failed, 0 truncated"), "{out}");
    let short = run("fcoe-t11-short.cap");
    assert!(short.status.success(), "truncation is not a failure");
    let out = String::from_utf8_lossy(&short.stdout);
    assert!(out.contains("Fcoe: 6 ok, 0 failed, 14 truncated"), "{out}");
}

/// Writes fuzz seeds from the FC frames of the captures into
/// `fuzz/corpus/fc_*/` (run by hand before fuzzing:
/// `cargo test -p unifab --test fc_captures -- --ignored write_fc_fuzz_seeds`).
#[test]
#[ignore = "writes fuzz seeds into fuzz/corpus; run by hand before fuzzing"]
fn write_fc_fuzz_seeds() {
    use unifab_capture::net::{ETHERTYPE_FCOE, LinkPayload, link_payload};
    use unifab_capture::pcap::read_frames;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut n = 0;
    for name in [
        "fcoe-t11.pcap",
        "fip-adv.cap",
        "fcoe-drop-rddata.cap",
        "fcoe-t11-short.cap",
    ] {
        let file = std::fs::read(capture(name)).unwrap();
        let mut stream = Vec::new();
        for fr in read_frames(&file).unwrap() {
            if fr.is_truncated() {
                continue;
            }
            let LinkPayload::Ether {
                ethertype: ETHERTYPE_FCOE,
                payload,
            } = link_payload(&fr)
            else {
                continue;
            };
            if payload.len() < 14 + 24 + 8 {
                continue;
            }
            let fc = &payload[14..payload.len() - 8];
            stream.extend_from_slice(&(fc.len() as u16).to_be_bytes());
            stream.extend_from_slice(fc);
            let (r_ctl, ty, body) = (fc[0], fc[8], &fc[24..]);
            let (target, seed): (&str, Vec<u8>) = match (ty, r_ctl) {
                (0x01, _) => ("fc_els", [&[0u8][..], body].concat()),
                (0x20, _) => ("fc_ct", [&[0u8, 0][..], body].concat()),
                (0x08, 0x06) => ("fc_fcp", [&[0u8][..], body].concat()),
                (0x08, 0x07) => ("fc_fcp", [&[1u8][..], body].concat()),
                (0x08, 0x05) => ("fc_fcp", [&[2u8][..], body].concat()),
                _ => continue,
            };
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            n += 1;
            std::fs::write(dir.join(format!("{name}-{}", fr.number)), seed).unwrap();
        }
        let dir = root.join("fc_header");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), stream).unwrap();
    }
    assert!(n > 50, "only {n} seeds");
}
