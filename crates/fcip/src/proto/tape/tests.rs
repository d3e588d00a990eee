use super::*;
use unifab_fc::wire::fcp::{FcpTaskAttr, FcpTmf};
use unifab_scsi_core::Lun;

const HOST: FcId = FcId::new(0x010100);
const DRIVE: FcId = FcId::new(0x020100);

fn cmnd(ox: u16, cdb: &[u8], dl: u32, write: bool) -> Frame {
    let mut c16 = [0u8; 16];
    c16[..cdb.len()].copy_from_slice(cdb);
    let c = FcpCmndRepr {
        lun: Lun::ZERO,
        crn: 0,
        priority: 0,
        task_attribute: FcpTaskAttr::SIMPLE,
        tmf: FcpTmf(0),
        rddata: !write && dl > 0,
        wrdata: write,
        cdb: Bytes::copy_from_slice(&c16),
        fcp_dl: dl,
        bidirectional_read_dl: None,
    };
    let h = FcHeaderRepr {
        r_ctl: RCtl::FCP_CMND,
        d_id: DRIVE,
        s_id: HOST,
        fc_type: FcType::FCP,
        f_ctl: FCtl::request(),
        ox_id: OxId(ox),
        rx_id: RxId::UNASSIGNED,
        ..FcHeaderRepr::default()
    };
    let mut b = vec![0u8; c.buffer_len()];
    c.emit(&mut b).unwrap();
    Frame::new(h, Bytes::from(b))
}

fn write6(ox: u16, len: u32) -> Frame {
    let l = len.to_be_bytes();
    cmnd(ox, &[0x0a, 0, l[1], l[2], l[3], 0], len, true)
}

fn data(ox: u16, rx: RxId, len: usize) -> Frame {
    let h = FcHeaderRepr {
        r_ctl: RCtl::FCP_DATA,
        d_id: DRIVE,
        s_id: HOST,
        fc_type: FcType::FCP,
        f_ctl: FCtl(FCtl::RELATIVE_OFFSET),
        ox_id: OxId(ox),
        rx_id: rx,
        ..FcHeaderRepr::default()
    };
    Frame::new(h, Bytes::from(vec![0xab; len]))
}

fn from_drive(ox: u16, r: RCtl, payload: Bytes) -> Frame {
    let h = FcHeaderRepr {
        r_ctl: r,
        d_id: HOST,
        s_id: DRIVE,
        fc_type: FcType::FCP,
        ox_id: OxId(ox),
        rx_id: RxId(0x99),
        ..FcHeaderRepr::default()
    };
    Frame::new(h, payload)
}

fn status(ox: u16, st: u8, sense: &[u8]) -> Frame {
    let r = FcpRspRepr {
        scsi_status: st,
        sense: Bytes::copy_from_slice(sense),
        ..FcpRspRepr::default()
    };
    from_drive(ox, RCtl::FCP_RSP, r.to_bytes().unwrap())
}

/// A host side that has seen the drive's INQUIRY (type 01h).
fn learned() -> TapeHost {
    let mut h = TapeHost::new(4, 1 << 20, 1 << 20);
    let inq = cmnd(1, &[0x12, 0, 0, 0, 36, 0], 36, false);
    assert!(h.outbound(inq).is_err(), "INQUIRY crosses as usual");
    let mut d = from_drive(1, RCtl::FCP_DATA, Bytes::from(vec![0x01, 0x80, 6, 2]));
    d.header.parameter = 0;
    assert!(h.inbound(d, 0).is_err());
    assert!(h.inbound(status(1, GOOD, &[]), 0).is_err());
    assert_eq!(h.tapes(), 1);
    h
}

fn fabric(acts: &[HostAction]) -> Vec<&Frame> {
    acts.iter()
        .filter_map(|a| match a {
            HostAction::Fabric(f) => Some(f),
            _ => None,
        })
        .collect()
}

fn tunnel(acts: &[HostAction]) -> Vec<(&Frame, u8)> {
    acts.iter()
        .filter_map(|a| match a {
            HostAction::Tunnel(f, fl) => Some((f, *fl)),
            _ => None,
        })
        .collect()
}

fn rsp_status(f: &Frame) -> u8 {
    assert_eq!(f.header.r_ctl, RCtl::FCP_RSP);
    FcpRspRepr::parse(&f.payload).unwrap().scsi_status
}

#[test]
fn a_disk_is_not_pipelined() {
    let mut h = TapeHost::new(4, 1 << 20, 1 << 20);
    let inq = cmnd(1, &[0x12, 0, 0, 0, 36, 0], 36, false);
    assert!(h.outbound(inq).is_err());
    assert!(
        h.inbound(
            from_drive(1, RCtl::FCP_DATA, Bytes::from(vec![0x00, 0, 6, 2])),
            0
        )
        .is_err()
    );
    assert_eq!(h.tapes(), 0);
    assert!(h.outbound(write6(2, 4096)).is_err());
}

#[test]
fn writes_are_answered_by_proxy_and_the_drive_statuses_stay_in_the_tunnel() {
    let mut h = learned();
    let acts = h.outbound(write6(10, 4096)).unwrap();
    let [(c, fl)] = tunnel(&acts)[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(fl, RECORD_TAPE | RECORD_FASTWRITE);
    assert_eq!(c.header.ox_id, OxId(10));
    let [x] = fabric(&acts)[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(x.header.r_ctl, RCtl::FCP_XFER_RDY);
    assert_eq!((x.header.s_id, x.header.d_id), (DRIVE, HOST));
    let rx = x.header.rx_id;
    // Half the data: no status yet; all of it: GOOD from the proxy.
    let acts = h.outbound(data(10, rx, 2048)).unwrap();
    assert!(fabric(&acts).is_empty());
    let acts = h.outbound(data(10, rx, 2048)).unwrap();
    let [s] = fabric(&acts)[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(rsp_status(s), GOOD);
    assert_eq!(s.header.rx_id, rx);
    // A WRITE FILEMARKS with IMMED: GOOD at once.
    let acts = h
        .outbound(cmnd(11, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    assert_eq!(tunnel(&acts)[0].1, RECORD_TAPE);
    assert_eq!(rsp_status(fabric(&acts)[0]), GOOD);
    assert_eq!(h.outstanding(), 2);
    // The drive's XFER_RDY and statuses are swallowed.
    assert_eq!(
        h.inbound(from_drive(10, RCtl::FCP_XFER_RDY, Bytes::new()), 0),
        Ok(Inbound::default())
    );
    assert_eq!(h.inbound(status(10, GOOD, &[]), 0), Ok(Inbound::default()));
    assert_eq!(h.inbound(status(11, GOOD, &[]), 0), Ok(Inbound::default()));
    assert_eq!(h.outstanding(), 0);
    assert_eq!((h.stats.accelerated, h.stats.proxy_status), (2, 2));
}

#[test]
fn a_full_pipeline_withholds_and_a_sync_point_waits_for_the_drive() {
    let mut h = learned();
    for ox in 20..24 {
        let acts = h
            .outbound(cmnd(ox, &[0x10, 1, 0, 0, 1, 0], 0, false))
            .unwrap();
        assert_eq!(fabric(&acts).len(), 1, "answered");
    }
    // The fifth waits (no answer, nothing sent).
    let acts = h
        .outbound(cmnd(24, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    assert!(acts.is_empty(), "{acts:?}");
    // REWIND, a sync point, behind it.
    let acts = h
        .outbound(cmnd(25, &[0x01, 0, 0, 0, 0, 0], 0, false))
        .unwrap();
    assert!(acts.is_empty());
    assert_eq!(h.stats.withheld, 2);
    // One status from the drive lets the fifth go (answered by proxy).
    let got = h.inbound(status(20, GOOD, &[]), 0).unwrap();
    assert_eq!(got.to_tunnel.len(), 1);
    assert_eq!(got.to_tunnel[0].0.header.ox_id, OxId(24));
    assert_eq!(rsp_status(&got.to_fabric[0]), GOOD);
    // REWIND goes only when all five are answered by the drive.
    for ox in 21..24 {
        let got = h.inbound(status(ox, GOOD, &[]), 0).unwrap();
        assert!(got.to_tunnel.is_empty());
    }
    let got = h.inbound(status(24, GOOD, &[]), 0).unwrap();
    let [(rw, fl)] = &got.to_tunnel[..] else {
        panic!("{got:?}")
    };
    assert_eq!((rw.header.ox_id, *fl), (OxId(25), 0));
    assert!(got.to_fabric.is_empty(), "the drive answers REWIND itself");
    // Its status passes untouched.
    assert!(h.inbound(status(25, GOOD, &[]), 0).is_err());
}

#[test]
fn a_drive_error_is_one_deferred_error_and_nothing_after_it_is_written() {
    let mut h = learned();
    let mut t = TapeTarget::new();
    let mut at_drive = Vec::new();
    let mut sent = Vec::new();
    for ox in 30..34 {
        let acts = h
            .outbound(cmnd(ox, &[0x10, 1, 0, 0, 1, 0], 0, false))
            .unwrap();
        for (f, fl) in tunnel(&acts) {
            assert_ne!(fl & RECORD_TAPE, 0);
            sent.push(f.clone());
        }
    }
    // The fourth is still on the WAN when the drive fails the second.
    let in_flight = sent.pop().unwrap();
    for f in sent {
        if let Ok(Some(f)) = t.command(f) {
            at_drive.push(f.header.ox_id.0);
        }
    }
    // One at a time at the drive.
    assert_eq!(at_drive, vec![30]);
    assert_eq!(t.queued(), 2);
    let out = t.outbound(status(30, GOOD, &[]));
    assert_eq!(out.to_fabric[0].header.ox_id, OxId(31));
    // 31 fails at the drive (end of medium): 32 is never sent.
    let sense = [0x70, 0, 0x0d, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0];
    let out = t.outbound(status(31, CHECK_CONDITION, &sense));
    assert!(out.to_fabric.is_empty());
    assert_eq!(out.forget, vec![(HOST, OxId(32))]);
    assert_eq!(out.up.len(), 2);
    assert_eq!(rsp_status(&out.up[1]), TASK_ABORTED);
    assert_eq!(t.discarded, 1);
    // One more the host side accelerated before it heard: discarded too.
    let Err(late) = t.command(in_flight) else {
        panic!("a command after the failure reached the drive")
    };
    assert_eq!(rsp_status(&late), TASK_ABORTED);
    // A command that was not accelerated ends that.
    assert_eq!(
        t.plain(&cmnd(37, &[0x00, 0, 0, 0, 0, 0], 0, false)),
        Outbound::default()
    );
    assert!(matches!(
        t.command(cmnd(38, &[0x10, 1, 0, 0, 1, 0], 0, false)),
        Ok(Some(_))
    ));
    // The host side: statuses swallowed, the error kept.
    h.inbound(status(30, GOOD, &[]), 0).unwrap();
    for f in out.up.into_iter().chain([late]) {
        assert_eq!(h.inbound(f, 0), Ok(Inbound::default()));
    }
    // The next command gets it, once, as 71h; it is not sent.
    let acts = h
        .outbound(cmnd(34, &[0x00, 0, 0, 0, 0, 0], 0, false))
        .unwrap();
    assert!(tunnel(&acts).is_empty());
    let [r] = fabric(&acts)[..] else {
        panic!("{acts:?}")
    };
    let rsp = FcpRspRepr::parse(&r.payload).unwrap();
    assert_eq!(rsp.scsi_status, CHECK_CONDITION);
    assert_eq!((rsp.sense[0] & 0x7f, rsp.sense[2] & 0x0f), (0x71, 0x0d));
    assert_eq!(h.stats.deferred_errors, 1);
    // Then everything crosses again.
    assert!(
        h.outbound(cmnd(35, &[0x00, 0, 0, 0, 0, 0], 0, false))
            .is_err()
    );
    let acts = h
        .outbound(cmnd(36, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    assert_eq!(rsp_status(fabric(&acts)[0]), GOOD);
}

#[test]
fn a_reused_exchange_waits_for_the_drive_to_end_the_old_one() {
    let mut h = learned();
    h.outbound(cmnd(40, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    // The host got GOOD and uses OX_ID 40 again at once.
    let acts = h
        .outbound(cmnd(40, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    assert!(acts.is_empty());
    let got = h.inbound(status(40, GOOD, &[]), 0).unwrap();
    assert_eq!(
        got.to_tunnel.len(),
        1,
        "the second goes once the first ended"
    );
}

#[test]
fn the_drive_side_refuses_past_its_bound() {
    let mut t = TapeTarget::new();
    assert!(matches!(t.command(write6(1, 512)), Ok(Some(_))));
    for ox in 2..2 + MAX_QUEUED as u16 {
        assert!(matches!(t.command(write6(ox, 512)), Ok(None)));
    }
    let Err(full) = t.command(write6(999, 512)) else {
        panic!()
    };
    assert_eq!(rsp_status(&full), TASK_SET_FULL);
    t.clear();
    assert_eq!(t.queued(), 0);
}

#[test]
fn a_drive_that_never_answers_is_swept_into_a_deferred_error() {
    let mut h = learned();
    h.outbound(cmnd(50, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    // REWIND waits for it.
    assert!(
        h.outbound(cmnd(51, &[0x01, 0, 0, 0, 0, 0], 0, false))
            .unwrap()
            .is_empty()
    );
    // Touched since it began: the first sweep keeps it.
    assert_eq!(h.sweep(), Inbound::default());
    assert_eq!(h.outstanding(), 1);
    // Nothing came back: the second ends it; REWIND gets the deferred
    // error (ABORTED COMMAND, LOGICAL UNIT COMMUNICATION TIME-OUT).
    let got = h.sweep();
    assert_eq!(h.outstanding(), 0);
    assert!(got.to_tunnel.is_empty());
    let [r] = &got.to_fabric[..] else {
        panic!("{got:?}")
    };
    let rsp = FcpRspRepr::parse(&r.payload).unwrap();
    assert_eq!(r.header.ox_id, OxId(51));
    assert_eq!(
        (rsp.sense[0], rsp.sense[2], rsp.sense[12], rsp.sense[13]),
        (0x71, 0x0b, 0x08, 0x01)
    );
    // And the pipeline works again.
    let acts = h
        .outbound(cmnd(52, &[0x10, 1, 0, 0, 1, 0], 0, false))
        .unwrap();
    assert_eq!(rsp_status(fabric(&acts)[0]), GOOD);
}

fn tmf(ox: u16, code: u8) -> Frame {
    let c = FcpCmndRepr {
        lun: Lun::ZERO,
        crn: 0,
        priority: 0,
        task_attribute: FcpTaskAttr::SIMPLE,
        tmf: FcpTmf(code),
        rddata: false,
        wrdata: false,
        cdb: Bytes::from_static(&[0; 16]),
        fcp_dl: 0,
        bidirectional_read_dl: None,
    };
    let mut f = cmnd(ox, &[0; 6], 0, false);
    let mut b = vec![0u8; c.buffer_len()];
    c.emit(&mut b).unwrap();
    f.payload = Bytes::from(b);
    f
}

#[test]
fn a_reset_at_the_drive_ends_the_pipeline_with_a_deferred_error() {
    let mut h = learned();
    let mut t = TapeTarget::new();
    for ox in 60..63 {
        let acts = h
            .outbound(cmnd(ox, &[0x10, 1, 0, 0, 1, 0], 0, false))
            .unwrap();
        for (f, _) in tunnel(&acts) {
            let _ = t.command(f.clone());
        }
    }
    // REWIND waits behind them at the host side.
    assert!(
        h.outbound(cmnd(63, &[0x01, 0, 0, 0, 0, 0], 0, false))
            .unwrap()
            .is_empty()
    );
    // LOGICAL UNIT RESET passes the host side and reaches the drive side:
    // the two queued are answered ABORTED COMMAND at once.
    let reset = tmf(70, 0x10);
    assert!(h.outbound(reset.clone()).is_err());
    let o = t.plain(&reset);
    assert_eq!(o.up.len(), 2);
    assert_eq!(o.forget.len(), 2);
    // The drive answers the reset; it never answers the command it ended
    // (60): the drive side does, now.
    let o2 = t.outbound(status(70, GOOD, &[]));
    assert_eq!(o2.up.len(), 2, "{o2:?}");
    assert_eq!(o2.up[1].header.ox_id, OxId(60));
    assert_eq!(rsp_status(&o2.up[1]), CHECK_CONDITION);
    // At the host side: the reset's own response passes; the three
    // ABORTED COMMANDs are swallowed, and REWIND gets the deferred error.
    let mut got = Vec::new();
    for f in o.up.into_iter().chain(o2.up) {
        match h.inbound(f, 0) {
            Ok(i) => got.extend(i.to_fabric),
            Err(f) => got.push(f),
        }
    }
    // (REWIND hears it as soon as the first ABORTED COMMAND comes back.)
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].header.ox_id, OxId(63));
    assert_eq!(got[1].header.ox_id, OxId(70));
    let rsp = FcpRspRepr::parse(&got[0].payload).unwrap();
    assert_eq!((rsp.sense[0], rsp.sense[2]), (0x71, 0x0b));
    assert_eq!(h.outstanding(), 0);
}
