//! Every FC frame of the real FCoE captures parses and re-emits byte for
//! byte, its CRC checks, and replies are decoded against their requests.
//! (The captures live in ../shared/captures and are never copied here.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use bytes::Bytes;
use unifab_fc::wire::crc::check_crc;
use unifab_fc::wire::ct::CtBody;
use unifab_fc::wire::els::{ElsRepr, LsAcc};
use unifab_fc::wire::{FrameRepr, PayloadRepr, ReplyTracker};

fn capture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/captures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (shared/ must sit beside the repository)",
            path.display()
        )
    })
}

/// (frame number, captured bytes, original length) of a little-endian
/// microsecond pcap.
fn records(file: &[u8]) -> Vec<(usize, &[u8], usize)> {
    assert_eq!(&file[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let incl = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap()) as usize;
        let orig = u32::from_le_bytes(file[at + 12..at + 16].try_into().unwrap()) as usize;
        at += 16;
        out.push((out.len() + 1, &file[at..at + incl], orig));
        at += incl;
    }
    out
}

/// The FC frames (header + payload + CRC) of an Ethernet capture: FCoE
/// frames, and FLOGI descriptors inside FIP link-service frames (which
/// carry no CRC).
fn fc_frames(file: &[u8]) -> Vec<(usize, Vec<u8>, bool)> {
    let mut out = Vec::new();
    for (n, pkt, orig) in records(file) {
        if pkt.len() != orig || pkt.len() < 14 {
            continue;
        }
        let ethertype = u16::from_be_bytes([pkt[12], pkt[13]]);
        if ethertype == 0x8906 {
            // 14-byte FCoE header (version, reserved, SOF), then the FC
            // frame with CRC, then EOF and 3 reserved bytes.
            out.push((n, pkt[28..pkt.len() - 4].to_vec(), true));
        } else if ethertype == 0x8914 {
            let fip = &pkt[14..];
            let op = u16::from_be_bytes([fip[2], fip[3]]);
            if op != 2 {
                continue;
            }
            let mut d = &fip[10..];
            while d.len() >= 2 {
                let (ty, words) = (d[0], usize::from(d[1]));
                if words == 0 || words * 4 > d.len() {
                    break;
                }
                if ty == 7 {
                    out.push((n, d[4..words * 4].to_vec(), false));
                }
                d = &d[words * 4..];
            }
        }
    }
    out
}

fn check_file(name: &str, expected_frames: usize) -> Vec<(usize, FrameRepr)> {
    let file = capture(name);
    let mut tracker = ReplyTracker::new();
    let mut parsed = Vec::new();
    let frames = fc_frames(&file);
    assert_eq!(frames.len(), expected_frames, "{name}");
    for (n, bytes, with_crc) in frames {
        let body = if with_crc {
            check_crc(&bytes).unwrap_or_else(|e| panic!("{name} frame {n}: {e}"));
            &bytes[..bytes.len() - 4]
        } else {
            &bytes[..]
        };
        let b = Bytes::copy_from_slice(body);
        let r = FrameRepr::parse(&b, Some(&mut tracker))
            .unwrap_or_else(|e| panic!("{name} frame {n}: {e}"));
        assert_eq!(
            r.to_bytes().unwrap(),
            body,
            "{name} frame {n} ({})",
            r.payload.kind()
        );
        parsed.push((n, r));
    }
    parsed
}

#[test]
fn fcoe_t11_round_trips_byte_for_byte() {
    let frames = check_file("fcoe-t11.pcap", 69);
    // Replies are decoded against their requests, not left opaque.
    let opaque: Vec<usize> = frames
        .iter()
        .filter(|(_, r)| {
            matches!(
                &r.payload,
                PayloadRepr::Els(ElsRepr::LsAcc(LsAcc::Opaque(_)))
            ) || matches!(&r.payload, PayloadRepr::Ct(c) if matches!(c.body, CtBody::Opaque(_)))
                || matches!(&r.payload, PayloadRepr::Raw(_))
        })
        .map(|(n, _)| *n)
        .collect();
    assert!(opaque.is_empty(), "frames left undecoded: {opaque:?}");
    let kinds: std::collections::BTreeSet<String> =
        frames.iter().map(|(_, r)| r.payload.kind()).collect();
    for k in [
        "ELS FLOGI",
        "ELS PLOGI",
        "ELS PRLI",
        "ELS ADISC",
        "ELS SCR",
        "CT GID_FT",
        "FCP_CMND",
        "FCP_DATA",
        "FCP_RSP",
    ] {
        assert!(kinds.contains(k), "{k} missing from {kinds:?}");
    }
}

#[test]
fn fip_adv_fc_frames_round_trip_byte_for_byte() {
    let frames = check_file("fip-adv.cap", 34);
    assert!(matches!(
        frames[0].1.payload,
        PayloadRepr::Els(ElsRepr::Flogi(_))
    ));
    assert!(matches!(
        frames[1].1.payload,
        PayloadRepr::Els(ElsRepr::LsAcc(LsAcc::Login(_)))
    ));
}
