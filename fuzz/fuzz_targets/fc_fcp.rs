//! FCP IUs under arbitrary input, and the FCP target engine fed arbitrary
//! FCP frames from a logged-in initiator.
//!
//! 1. FCP_CMND, FCP_XFER_RDY and FCP_RSP parse without panicking; what
//!    parses re-emits and parses back to the same repr.
//! 2. An N_Port (target role) logged into a fabric with an initiator
//!    logged in to it takes a stream of frames cut from the input (FCP_CMND,
//!    FCP_DATA, ABTS, ELS, whatever R_CTL the input says) and the LU
//!    answers built from the input; nothing panics, and every frame it
//!    sends is a valid frame that round-trips.
#![no_main]

use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::compose::{self, Route};
use unifab_fc::nport::{NPort, NPortConfig, NPortEvent};
use unifab_fc::wire::els::{
    ElsRepr, FcpServiceParams, LoginParams, LsAcc, ProcessLogin, ServiceParamPage, page_flags,
};
use unifab_fc::wire::fcp::{FcpCmndRepr, FcpRspRepr, XferRdy, XferRdyRepr};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, FrameRepr, OxId, RxId, Wwn};
use unifab_scsi_core::{Status, TaskResult, TmfResponse};

const ME: FcId = FcId::from_parts(1, 1, 0);
const PEER: FcId = FcId::from_parts(1, 2, 0);

fn drain(p: &mut NPort) {
    while let Some(f) = p.poll_transmit() {
        let mut v = Vec::new();
        f.write_to(&mut v);
        let b = Bytes::from(v);
        let r = FrameRepr::parse(&b, None).expect("the port sends valid frames");
        assert_eq!(r.to_bytes().expect("re-emits"), &b[..]);
    }
}

fn logged_in(now: Instant) -> NPort {
    let mut cfg = NPortConfig::new(Wwn(0x2100_0000_0000_0001), Wwn(0x2000_0000_0000_0001));
    cfg.target = true;
    cfg.max_burst = 4096;
    let mut p = NPort::new(cfg);
    p.link_up(now);
    let flogi = p.poll_transmit().expect("FLOGI");
    let params = LoginParams::n_port(
        Wwn(0x1000_0000_0000_0001),
        Wwn(0x1000_0000_0000_0001),
        2048,
        2000,
    );
    let acc = compose::els(
        Route {
            s_id: FcId::LOGIN_SERVER,
            d_id: ME,
            ox_id: flogi.header.ox_id,
            rx_id: RxId(1),
        },
        &ElsRepr::LsAcc(LsAcc::Login(params)),
    )
    .expect("ACC");
    p.handle_frame(now, acc);
    drain(&mut p);
    let peer = LoginParams::n_port(
        Wwn(0x2100_0000_0000_0002),
        Wwn(0x2000_0000_0000_0002),
        1024,
        2000,
    );
    p.handle_frame(
        now,
        compose::els(
            Route::request(PEER, ME, OxId(0x7000)),
            &ElsRepr::Plogi(peer),
        )
        .expect("PLOGI"),
    );
    let prli = ProcessLogin {
        pages: vec![ServiceParamPage::fcp(
            page_flags::ESTABLISH_IMAGE_PAIR,
            FcpServiceParams::INITIATOR_FUNCTION,
        )],
    };
    p.handle_frame(
        now,
        compose::els(Route::request(PEER, ME, OxId(0x7001)), &ElsRepr::Prli(prli)).expect("PRLI"),
    );
    drain(&mut p);
    while p.poll_event().is_some() {}
    p
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let b = Bytes::copy_from_slice(rest);
    match sel % 3 {
        0 => {
            if let Ok(c) = FcpCmndRepr::parse(&b) {
                let mut v = vec![0u8; c.buffer_len()];
                c.emit(&mut v).expect("emits");
                assert_eq!(FcpCmndRepr::parse(&Bytes::from(v)).expect("parses"), c);
            }
        }
        1 => {
            if let Ok(r) = FcpRspRepr::parse(&b) {
                let v = r.to_bytes().expect("emits");
                assert_eq!(FcpRspRepr::parse(&v).expect("parses"), r);
            }
        }
        _ => {
            if let Ok(x) = XferRdy::new_checked(&b[..]) {
                let r = XferRdyRepr::parse(&x);
                // Bytes 8–11 are reserved and written as zero.
                assert_eq!(&r.to_bytes()[..8], &b[..8]);
            }
        }
    }

    // The target engine under a stream of frames: each chunk is
    // [r_ctl selector, ox_id, f_ctl bits, parameter (4), length, payload].
    let mut now = Instant::now();
    let mut p = logged_in(now);
    let mut rest = rest;
    let r_ctls = [
        RCtl::FCP_CMND,
        RCtl::FCP_DATA,
        RCtl::ABTS,
        RCtl::ELS_REQUEST,
        RCtl::FCP_XFER_RDY,
        RCtl::FCP_RSP,
        RCtl::FC4_LS_REQUEST,
        RCtl::BA_ACC,
    ];
    while rest.len() >= 8 {
        let r_ctl = r_ctls[usize::from(rest[0]) % r_ctls.len()];
        let ox = OxId(u16::from(rest[1] % 8));
        let f_ctl = FCtl(u32::from(rest[2]) << 16 | 0x08);
        let parameter = u32::from_be_bytes([rest[3], rest[4], rest[5], rest[6]]) % 70_000;
        let n = (usize::from(rest[7]) * 16).min(rest.len() - 8);
        let payload = Bytes::copy_from_slice(&rest[8..8 + n]);
        rest = &rest[8 + n..];
        let fc_type = match r_ctl {
            RCtl::ELS_REQUEST => FcType::ELS,
            RCtl::ABTS | RCtl::BA_ACC => FcType::BLS,
            _ => FcType::FCP,
        };
        let h = FcHeaderRepr {
            r_ctl,
            d_id: ME,
            s_id: PEER,
            fc_type,
            f_ctl,
            ox_id: ox,
            rx_id: RxId::UNASSIGNED,
            parameter,
            ..FcHeaderRepr::default()
        };
        p.handle_frame(now, Frame::new(h, payload.clone()));
        while let Some(ev) = p.poll_event() {
            match ev {
                NPortEvent::Execute { id, task } => {
                    let mut r = TaskResult::with_data(
                        payload.slice(..payload.len().min(task.data_in_len as usize + 64)),
                    );
                    if payload.first().is_some_and(|b| b & 1 == 1) {
                        r.status = Status::CHECK_CONDITION;
                        r.sense = Some(payload.slice(..payload.len().min(18)));
                    }
                    if payload.first().is_some_and(|b| b & 2 == 2) {
                        r = TaskResult::aborted();
                    }
                    p.complete_task(now, id, r);
                }
                NPortEvent::TaskManagement { id, .. } => {
                    p.complete_tmf(now, id, TmfResponse::FunctionComplete);
                }
                _ => {}
            }
        }
        drain(&mut p);
        now += Duration::from_millis(u64::from(parameter % 50_000));
        p.handle_timeout(now);
        drain(&mut p);
    }
});
