//! `unifab pcap-check` under arbitrary capture files.
//!
//! The whole checker runs on the input as a capture file: the pcap and
//! pcapng readers, the Ethernet / IP / TCP decoders, TCP reassembly, the
//! iSCSI PDU splitter, FCIP stream decoding, and the FC, FCoE and FIP
//! checkers behind them. A capture comes from someone else's gear, so none
//! of this may panic, and what it reports must hang together:
//!
//! - the report counts the frames the reader found;
//! - every entry and every gap names one of those frames, in frame order;
//! - the check is deterministic: a second run gives the same report.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unifab_capture::check::{CheckOptions, check_bytes};
use unifab_capture::pcap::read_frames;

fuzz_target!(|data: &[u8]| {
    let opts = CheckOptions::default();
    let Ok(report) = check_bytes(data, &opts) else {
        // A file the reader refuses is refused by the checker too.
        assert!(read_frames(data).is_err());
        return;
    };
    let frames = read_frames(data).expect("the checker read this file");
    assert_eq!(report.frames, frames.len() as u64);
    let in_file = |what: &str, n: u64| {
        assert!(
            (1..=report.frames).contains(&n),
            "{what} at frame {n} of {}",
            report.frames
        );
    };
    for e in &report.entries {
        in_file("entry", e.frame);
    }
    assert!(report.entries.windows(2).all(|w| w[0].frame <= w[1].frame));
    for g in &report.gaps {
        in_file("gap", g.frame);
        assert!(g.missing > 0, "{g:?}");
    }
    let _ = report.to_string();
    assert_eq!(check_bytes(data, &opts).ok(), Some(report));
});
