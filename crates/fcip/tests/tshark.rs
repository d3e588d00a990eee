//! tshark, an independent decoder, reads what unifab's FCIP layer emits
//! in RFC mode: the special frame and its echo, the VE_Port bring-up
//! (ELP, ESC, EFP, MR and their accepts, from two real E_Port engines
//! talking to each other), FSPF (HLO, LSU, LSA), SW_RSCN, and FCP data
//! frames. The capture is written one FCIP frame per TCP segment on port
//! 3225 (tshark mis-decodes several frames in one segment, see FCIP.md).
//! No malformed, short or error-severity items; the special frame's
//! fields read back as sent (destination WWN and K_A_TOV as Wireshark
//! 4.0 shows them: two bytes late).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use unifab_testkit::tshark::{PcapWriter, Tshark};

use bytes::Bytes;
use unifab_fc::wire::fcp::XferRdyRepr;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{FcHeaderRepr, FcId, OxId, RxId, Wwn};
use unifab_fcip::proto::eport::{EPort, LocalSwitch, Output, ZoneDb, sw_ils_frame};
use unifab_fcip::proto::fspf::{DEFAULT_COST, Fspf};
use unifab_fcip::wire::encap::EncapFlags;
use unifab_fcip::wire::frame::FcipFrameRepr;
use unifab_fcip::wire::fsf::{Capabilities, EntityId, SpecialFrameRepr, UsageFlags};
use unifab_fcip::wire::sw_ils::{FspfHeader, Hlo, Lsa, Lsu, RscnDevice, SwIlsRepr, SwRscn};

struct Capture {
    /// (from A, bytes)
    segs: Vec<(bool, Vec<u8>)>,
}

impl Capture {
    fn push(&mut self, from_a: bool, b: Vec<u8>) {
        self.segs.push((from_a, b));
    }

    fn frame(&mut self, from_a: bool, f: Frame) {
        let pad = (4 - f.payload.len() % 4) % 4;
        let mut f = f;
        if pad != 0 {
            let mut p = f.payload.to_vec();
            p.resize(p.len() + pad, 0);
            f.payload = Bytes::from(p);
            f.header.f_ctl = f.header.f_ctl.with_fill_bytes(pad as u8);
        }
        self.push(from_a, FcipFrameRepr::new(f).to_bytes().unwrap());
    }

    /// Ethernet/IPv4/TCP, 10.0.0.1:40000 (A) ↔ 10.0.0.2:3225 (B).
    fn pcap(&self) -> Vec<u8> {
        let mut w = PcapWriter::new(PcapWriter::ETHERNET);
        let (mut seq_a, mut seq_b) = (1000u32, 5000u32);
        for (from_a, data) in &self.segs {
            let (src, dst, sp, dp) = if *from_a {
                ([10, 0, 0, 1], [10, 0, 0, 2], 40000u16, 3225u16)
            } else {
                ([10, 0, 0, 2], [10, 0, 0, 1], 3225, 40000)
            };
            let (seq, ack) = if *from_a {
                (seq_a, seq_b)
            } else {
                (seq_b, seq_a)
            };
            let mut p = Vec::new();
            p.extend_from_slice(&[0, 1, 2, 3, 4, if *from_a { 5 } else { 6 }]);
            p.extend_from_slice(&[0, 1, 2, 3, 4, if *from_a { 6 } else { 5 }]);
            p.extend_from_slice(&0x0800u16.to_be_bytes());
            let total = 20 + 20 + data.len();
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&(total as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
            ip.extend_from_slice(&src);
            ip.extend_from_slice(&dst);
            let sum = checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            p.extend_from_slice(&ip);
            let mut tcp = Vec::new();
            tcp.extend_from_slice(&sp.to_be_bytes());
            tcp.extend_from_slice(&dp.to_be_bytes());
            tcp.extend_from_slice(&seq.to_be_bytes());
            tcp.extend_from_slice(&ack.to_be_bytes());
            tcp.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&src);
            pseudo.extend_from_slice(&dst);
            pseudo.extend_from_slice(&[0, 6]);
            pseudo.extend_from_slice(&((20 + data.len()) as u16).to_be_bytes());
            pseudo.extend_from_slice(&tcp);
            pseudo.extend_from_slice(data);
            let sum = checksum(&pseudo);
            tcp[16..18].copy_from_slice(&sum.to_be_bytes());
            p.extend_from_slice(&tcp);
            p.extend_from_slice(data);
            if *from_a {
                seq_a = seq_a.wrapping_add(data.len() as u32);
            } else {
                seq_b = seq_b.wrapping_add(data.len() as u32);
            }
            w.push(&p);
        }
        w.bytes().to_vec()
    }
}

fn checksum(b: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in b.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        s += u32::from(w);
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn switch(domain: u8) -> LocalSwitch {
    let w = Wwn(0x1000_0000_c900_0000 | u64::from(domain));
    LocalSwitch {
        domain,
        switch_name: w,
        port_name: Wwn(0x2000_0000_c900_0000 | u64::from(domain)),
        domains: vec![(domain, w)],
        zoning: ZoneDb::default(),
        r_a_tov: 10_000,
        e_d_tov: 2_000,
    }
}

const FSF: SpecialFrameRepr = SpecialFrameRepr {
    changed: false,
    source_wwn: Wwn(0x1000_0000_c900_0001),
    entity_id: EntityId(0x0000_0000_0000_0007),
    nonce: 0x0123_4567_89ab_cdef,
    usage_flags: UsageFlags(UsageFlags::CLASS_F),
    usage_code: 0,
    destination_wwn: Wwn(0x1000_0000_c900_0002),
    k_a_tov: 10_000,
    flags: EncapFlags(0),
    timestamp_seconds: 0,
    timestamp_fraction: 0,
};

fn fcp(r_ctl: RCtl, s: u32, d: u32, f_ctl: u32, payload: Vec<u8>) -> Frame {
    Frame::new(
        FcHeaderRepr {
            r_ctl,
            d_id: FcId::new(d),
            s_id: FcId::new(s),
            fc_type: FcType::FCP,
            f_ctl: FCtl(f_ctl),
            ox_id: OxId(0x1234),
            rx_id: RxId(0x55),
            ..FcHeaderRepr::default()
        },
        Bytes::from(payload),
    )
}

#[test]
fn tshark_decodes_an_rfc_mode_capture_without_complaint() {
    let _ = Capabilities(0);
    let mut cap = Capture { segs: Vec::new() };
    // Special frame and its echo.
    cap.push(true, FSF.to_bytes().to_vec());
    cap.push(false, FSF.to_bytes().to_vec());
    // Two VE_Port engines bring the link up.
    let mut a = EPort::new(switch(1), true);
    let mut b = EPort::new(switch(2), false);
    a.start();
    b.start();
    for _ in 0..20 {
        let mut moved = false;
        while let Some(o) = a.poll() {
            if let Output::Send(f) = o {
                moved = true;
                b.handle(&f);
                cap.frame(true, f);
            }
        }
        while let Some(o) = b.poll() {
            if let Output::Send(f) = o {
                moved = true;
                a.handle(&f);
                cap.frame(false, f);
            }
        }
        if !moved {
            break;
        }
    }
    assert!(matches!(
        a.state(),
        unifab_fcip::proto::eport::State::Up { domain: 2, .. }
    ));
    // FSPF.
    let hdr = FspfHeader {
        version: 2,
        domain: 1,
        ..FspfHeader::default()
    };
    let fc = FcId::FABRIC_CONTROLLER;
    let hlo = SwIlsRepr::Hlo(Hlo {
        header: hdr,
        options: 0,
        hello_interval: 20,
        dead_interval: 80,
        recipient_domain: 2,
        port_index: 1,
    });
    cap.frame(
        true,
        sw_ils_frame(&hlo, false, OxId(0x7200), RxId::UNASSIGNED, fc, fc),
    );
    let mut fspf = Fspf::new(1);
    let lsr = fspf.link_up(1, 2, 1, DEFAULT_COST);
    let lsu = SwIlsRepr::Lsu(Lsu {
        header: hdr,
        flags: 0,
        records: vec![lsr.clone()],
    });
    cap.frame(
        true,
        sw_ils_frame(&lsu, false, OxId(0x7000), RxId::UNASSIGNED, fc, fc),
    );
    let lsa = SwIlsRepr::Lsa(Lsa {
        header: FspfHeader { domain: 2, ..hdr },
        flags: 0,
        headers: vec![lsr.header],
    });
    cap.frame(
        false,
        sw_ils_frame(&lsa, false, OxId(0x7000), RxId::UNASSIGNED, fc, fc),
    );
    let rscn = SwIlsRepr::Rscn(SwRscn {
        event_format: 0,
        affected: FcId::new(0x010200),
        detection: 1,
        devices: vec![RscnDevice {
            state: 1,
            port_id: FcId::new(0x010200),
            port_name: Wwn(0x2100_0000_c900_0a0b),
            node_name: Wwn(0x2000_0000_c900_0a0b),
        }],
    });
    cap.frame(
        true,
        sw_ils_frame(
            &rscn,
            false,
            OxId(0x7100),
            RxId::UNASSIGNED,
            FcId::new(0xfffc01),
            FcId::new(0xfffc02),
        ),
    );
    // FCP: a 2 KiB write and its status.
    let (h, t) = (0x010200, 0x020200);
    let mut cmnd = vec![0u8; 32];
    cmnd[10] = 1; // WRDATA
    cmnd[12] = 0x2a;
    cmnd[20] = 4;
    cmnd[28..32].copy_from_slice(&2048u32.to_be_bytes());
    cap.frame(
        true,
        fcp(
            RCtl::FCP_CMND,
            h,
            t,
            FCtl::FIRST_SEQUENCE | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE,
            cmnd,
        ),
    );
    let xr = XferRdyRepr {
        data_ro: 0,
        burst_len: 2048,
    };
    cap.frame(
        false,
        fcp(
            RCtl::FCP_XFER_RDY,
            t,
            h,
            FCtl::EXCHANGE_CONTEXT | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE,
            xr.to_bytes().to_vec(),
        ),
    );
    cap.frame(
        true,
        fcp(
            RCtl::FCP_DATA,
            h,
            t,
            FCtl::RELATIVE_OFFSET | FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE,
            vec![0xa5; 2048],
        ),
    );
    cap.frame(
        false,
        fcp(
            RCtl::FCP_RSP,
            t,
            h,
            FCtl::EXCHANGE_CONTEXT | FCtl::LAST_SEQUENCE | FCtl::END_SEQUENCE,
            vec![0; 24],
        ),
    );

    let tshark = Tshark::new("fcip.pcap", &cap.pcap());
    tshark.assert_no_complaint();
    let run = |filter: &str, fields: &[&str]| tshark.run(filter, fields);
    let count = |f: &str| run(f, &[]).lines().count();
    assert_eq!(count("fcip"), cap.segs.len(), "every segment is FCIP");
    for (code, name) in [
        (0x10, "ELP"),
        (0x30, "ESC"),
        (0x11, "EFP"),
        (0x22, "MR"),
        (0x14, "HLO"),
        (0x15, "LSU"),
        (0x16, "LSA"),
        (0x1b, "SW_RSCN"),
    ] {
        assert!(
            count(&format!("swils.opcode == {code:#04x}")) >= 1,
            "{name} decoded"
        );
    }
    assert_eq!(
        count("swils.opcode == 0x02"),
        5,
        "SW_ACC of ELP, ESC, EFP and both MRs"
    );
    assert_eq!(count("fc.type == 0x08"), 4, "the FCP frames");
    // The special frame as sent (destination and K_A_TOV two bytes late).
    let fsf = run(
        "fcip.pflags.sf == 1",
        &[
            "fcip.srcwwn",
            "fcip.nonce",
            "fcip.srcid",
            "fcip.dstwwn",
            "fcip.katov",
        ],
    );
    let first = fsf.lines().next().unwrap();
    let cols: Vec<&str> = first.split('\t').collect();
    assert_eq!(cols[0], "10:00:00:00:c9:00:00:01", "{first}");
    assert!(
        cols[1].replace(':', "").ends_with("0123456789abcdef"),
        "{first}"
    );
    assert!(
        cols[2].replace(':', "").ends_with("0000000000000007"),
        "{first}"
    );
    // Bytes 62–69 and 70–73 as Wireshark reads them.
    let b = FSF.to_bytes();
    let shifted_wwn: Vec<String> = b[62..70].iter().map(|x| format!("{x:02x}")).collect();
    assert_eq!(cols[3], shifted_wwn.join(":"), "{first}");
    assert_eq!(
        cols[4],
        u32::from_be_bytes([b[70], b[71], b[72], b[73]]).to_string(),
        "{first}"
    );
}
