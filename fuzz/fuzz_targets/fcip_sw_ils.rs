//! SW_ILS payloads (and the E_Port engine, and enhanced-mode batches)
//! under arbitrary input. The first byte names the request an SW_ACC
//! answers (0: unknown).
//!
//! `SwIlsRepr::parse` never panics; what parses re-emits bytes that parse
//! to the same repr and re-emit the same bytes (fixed point); every error
//! has an SW_RJT. An E_Port in either role takes the input as a request
//! and as a reply without panicking, and everything it sends parses. The
//! batch record splitter and reassembly never panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FcType, RCtl};
use unifab_fc::wire::{Eof, FcHeaderRepr, FcId, OxId, RxId, Sof, Wwn};
use unifab_fcip::proto::eport::{EPort, LocalSwitch, Output, ZoneDb};
use unifab_fcip::wire::enhanced::{Reassembly, records};
use unifab_fcip::wire::sw_ils::{SwIlsCode, SwIlsRepr};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let answering = (sel != 0).then_some(SwIlsCode(sel));
    let b = Bytes::copy_from_slice(rest);
    match SwIlsRepr::parse(&b, answering) {
        Ok(r) => {
            let out = r.to_bytes();
            let again = SwIlsRepr::parse(&out, answering).expect("re-emitted SW_ILS parses");
            assert_eq!(again, r);
            assert_eq!(again.to_bytes(), out);
        }
        Err(e) => {
            let _ = SwIlsRepr::reject_for(&e);
        }
    }
    for originator in [true, false] {
        let mut p = EPort::new(
            LocalSwitch {
                domain: 1,
                switch_name: Wwn(1),
                port_name: Wwn(2),
                domains: vec![(1, Wwn(1))],
                zoning: ZoneDb::default(),
                r_a_tov: 10_000,
                e_d_tov: 2_000,
            },
            originator,
        );
        p.start();
        let mut ox = OxId(0x100);
        while let Some(o) = p.poll() {
            if let Output::Send(f) = o {
                ox = f.header.ox_id;
            }
        }
        for r_ctl in [0x02u8, 0x03] {
            let h = FcHeaderRepr {
                r_ctl: RCtl(r_ctl),
                d_id: FcId::FABRIC_CONTROLLER,
                s_id: FcId::FABRIC_CONTROLLER,
                fc_type: FcType::SW_ILS,
                ox_id: ox,
                rx_id: RxId(1),
                ..FcHeaderRepr::default()
            };
            p.handle(&Frame {
                sof: Sof::F,
                header: h,
                payload: b.clone(),
                eof: Eof::T,
            });
            while let Some(o) = p.poll() {
                if let Output::Send(f) = o {
                    SwIlsRepr::parse(&f.payload, None).expect("the E_Port sends what parses");
                }
            }
        }
    }
    let _ = records(&b);
    let mut r = Reassembly::default();
    for (i, c) in rest.chunks(600).enumerate() {
        let h = FcHeaderRepr {
            seq_cnt: i as u16,
            ..FcHeaderRepr::default()
        };
        let _ = r.push(&Frame {
            sof: Sof::N3,
            header: h,
            payload: Bytes::copy_from_slice(c),
            eof: Eof::N,
        });
    }
});
