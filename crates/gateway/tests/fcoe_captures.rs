//! `unifab pcap-check` on the FCoE and FIP captures in ../shared/captures:
//! every standard FIP frame and every FCoE frame round-trips byte for
//! byte; the frames cut short at capture are reported as truncated; the
//! 2008-draft FIP advertisements and the pre-T11 FCoE encapsulation are
//! reported as not accepted, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use unifab_capture::check::{Protocol, Report, Verdict, pcap_check};

fn capture(name: &str) -> Report {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/captures")
        .join(name);
    pcap_check(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn not_accepted(r: &Report, p: Protocol) -> Vec<String> {
    r.of(p)
        .filter_map(|e| match &e.verdict {
            Verdict::NotAccepted { reason } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn fip_adv_every_standard_frame_round_trips() {
    let r = capture("fip-adv.cap");
    let ok: Vec<&str> = r
        .of(Protocol::Fip)
        .filter(|e| e.verdict == Verdict::Ok)
        .map(|e| e.what.as_str())
        .collect();
    assert_eq!(
        ok,
        [
            "Solicitation",
            "Solicitation",
            "FLOGI request",
            "FLOGI reply"
        ],
        "{r}"
    );
    let draft = not_accepted(&r, Protocol::Fip);
    assert_eq!(draft.len(), 4, "{r}");
    assert!(draft.iter().all(|d| d.starts_with("pre-standard FIP")));
    assert_eq!(r.ok(Protocol::Fc), 2, "the FLOGI and its accept inside FIP");
    assert_eq!(r.ok(Protocol::Fcoe), 32);
    assert!(r.failures(Protocol::Fcoe).is_empty() && r.failures(Protocol::Fc).is_empty());
    assert!(!r.unchecked.contains_key(&Protocol::Fip));
}

#[test]
fn fip_ka_keep_alives_cut_at_capture_are_truncated() {
    let r = capture("fip-ka.cap");
    assert_eq!(r.frames, 45);
    assert_eq!(r.truncated(Protocol::Fip), 23, "{r}");
    let ok: Vec<&str> = r
        .of(Protocol::Fip)
        .filter(|e| e.verdict == Verdict::Ok)
        .map(|e| e.what.as_str())
        .collect();
    assert_eq!(ok, ["Clear Virtual Links"], "{r}");
    let draft = not_accepted(&r, Protocol::Fip);
    assert_eq!(draft.len(), 21);
    assert!(draft.iter().all(|d| d.starts_with("pre-standard FIP")));
}

#[test]
fn fcoe_t11_every_frame_round_trips() {
    let r = capture("fcoe-t11.pcap");
    assert_eq!(r.ok(Protocol::Fcoe), 69, "{r}");
    assert!(r.failures(Protocol::Fcoe).is_empty());
    let short = capture("fcoe-t11-short.cap");
    assert_eq!(short.truncated(Protocol::Fcoe), 14, "{short}");
    assert!(short.failures(Protocol::Fcoe).is_empty(), "{short}");
}

#[test]
fn pre_t11_fcoe_is_rejected_cleanly() {
    let r = capture("fcoe1.cap");
    assert_eq!(r.ok(Protocol::Fcoe), 0, "{r}");
    let rejected = not_accepted(&r, Protocol::Fcoe);
    assert!(rejected.len() >= 100, "{r}");
    assert!(
        rejected
            .iter()
            .all(|x| x.contains("not a standard FCoE frame")
                || x.contains("shorter than")
                || x.contains("CRC")),
        "{rejected:?}"
    );
}

/// The same verdicts through the `unifab pcap-check` command: its summary
/// lines, and an exit status that is non-zero exactly when a frame was
/// not accepted (the draft FIP frames, the pre-T11 encapsulation).
#[test]
fn the_command_reports_fcoe_and_fip_and_exits_by_verdict() {
    let run = |name: &str| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/captures")
            .join(name);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
            .arg("pcap-check")
            .arg(path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, out) = run("fcoe-t11.pcap");
    assert!(
        ok && out.contains("Fcoe: 69 ok, 0 failed, 0 truncated"),
        "{out}"
    );
    let (ok, out) = run("fip-adv.cap");
    assert!(!ok, "draft FIP frames are reported as failures:\n{out}");
    assert!(out.contains("Fip: 4 ok, 4 failed, 0 truncated"), "{out}");
    assert!(out.contains("Fcoe: 32 ok, 0 failed, 0 truncated"), "{out}");
    assert!(out.contains("pre-standard FIP"), "{out}");
    let (ok, out) = run("fip-ka.cap");
    assert!(
        !ok && out.contains("Fip: 1 ok, 21 failed, 23 truncated"),
        "{out}"
    );
    let (ok, out) = run("fcoe1.cap");
    assert!(
        !ok && out.contains("Fcoe: 0 ok, 168 failed, 0 truncated"),
        "{out}"
    );
}

/// Writes fuzz seeds from the captures into `fuzz/corpus/fip_frame/` (the
/// FIP payload of every untruncated FIP frame) and `fuzz/corpus/fcoe_frame/`
/// (the FCoE encapsulation of every untruncated FCoE frame), the inputs
/// those targets take. Run by hand before fuzzing:
/// `cargo test -p unifab --test fcoe_captures -- --ignored write_fcoe_fuzz_seeds`.
#[test]
#[ignore = "writes fuzz seeds into fuzz/corpus; run by hand before fuzzing"]
fn write_fcoe_fuzz_seeds() {
    use unifab_capture::net::{ETHERTYPE_FCOE, ETHERTYPE_FIP, LinkPayload, link_payload};
    use unifab_capture::pcap::read_frames;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let (mut fip, mut fcoe) = (0, 0);
    for name in [
        "fcoe-t11.pcap",
        "fip-adv.cap",
        "fip-ka.cap",
        "fcoe-drop-rddata.cap",
        "fcoe-t11-short.cap",
        "fcoe1.cap",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/captures")
            .join(name);
        let file = std::fs::read(path).unwrap();
        for fr in read_frames(&file).unwrap() {
            if fr.is_truncated() {
                continue;
            }
            let LinkPayload::Ether { ethertype, payload } = link_payload(&fr) else {
                continue;
            };
            let target = match ethertype {
                ETHERTYPE_FIP => {
                    fip += 1;
                    "fip_frame"
                }
                ETHERTYPE_FCOE => {
                    fcoe += 1;
                    "fcoe_frame"
                }
                _ => continue,
            };
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{name}-{}", fr.number)), payload).unwrap();
        }
    }
    println!("{fip} FIP seeds, {fcoe} FCoE seeds");
    assert!(
        fip > 10 && fcoe > 50,
        "only {fip} FIP and {fcoe} FCoE seeds"
    );
}
