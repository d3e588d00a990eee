//! Check a capture: every iSCSI, FC, FCoE, FIP and FCIP frame in it is
//! parsed, re-emitted and compared byte for byte (`unifab pcap-check`).
//!
//!     cargo run -p unifab-capture --example check -- FILE.pcap
use std::process::ExitCode;

use unifab_capture::check::{Verdict, pcap_check};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: check FILE.pcap");
        return ExitCode::from(2);
    };
    let report = match pcap_check(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bad = report
        .entries
        .iter()
        .filter(|e| {
            matches!(
                e.verdict,
                Verdict::Mismatch { .. } | Verdict::NotAccepted { .. }
            )
        })
        .count();
    println!("{report}");
    println!(
        "{path}: {} units checked, {bad} not round-tripping",
        report.entries.len()
    );
    if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
