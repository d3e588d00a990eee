//! Independent decode: one frame of every ELS, CT, BLS and FCP type this
//! crate emits, each request followed by its reply in the same exchange,
//! written to a pcap (link type 224, bare FC-2) and decoded by tshark. The
//! gate filter must match nothing:
//! `_ws.malformed || _ws.short || _ws.expert.severity >= 0x00800000`.
//! tshark (Debian package `tshark`) must be installed: the test fails,
//! saying so, when it is not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use unifab_fc::compose::{self, Route};
use unifab_fc::wire::bls::{BaAcc, BaRjt, BaRjtExplanation, BaRjtReason, BlsRepr};
use unifab_fc::wire::ct::{
    CtBody, CtIu, CtReason, Fc4Features, Fc4Types, FtScope, NsAccept, NsObject, NsReason,
    NsRequest, PortEntry, fcp_features,
};
use unifab_fc::wire::els::{
    Adisc, ElsRepr, ExchangeRef, FcpServiceParams, Lesb, LoginParams, Logo, LsAcc, LsRjt,
    LsRjtExplanation, LsRjtReason, PrliResponse, ProcessLogin, RecAcc, Rscn, RscnPage, Scr,
    ServiceParamPage, page_flags, rscn_format, scr_function,
};
use unifab_fc::wire::fcp::{FcpCmndRepr, FcpRspFlags, FcpRspRepr, FcpTmf, XferRdyRepr};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, OxId, RxId, Wwn};
use unifab_scsi_core::Lun;
use unifab_testkit::tshark::{PcapWriter, Tshark};

const H: FcId = FcId::from_parts(1, 1, 0);
const T: FcId = FcId::from_parts(1, 2, 0);

struct Writer {
    frames: Vec<Vec<u8>>,
    kinds: Vec<String>,
    next_ox: u16,
}

impl Writer {
    fn ox(&mut self) -> OxId {
        self.next_ox += 1;
        OxId(self.next_ox)
    }

    fn push(&mut self, f: Frame, kind: impl Into<String>) {
        let mut v = Vec::new();
        f.write_to(&mut v);
        self.frames.push(v);
        self.kinds.push(kind.into());
    }

    /// A request from `s` to `d` and its reply.
    fn els(&mut self, s: FcId, d: FcId, req: ElsRepr, reply: ElsRepr) {
        let ox = self.ox();
        let kind = format!("{:?}", req.code());
        self.push(
            compose::els(Route::request(s, d, ox), &req).unwrap(),
            kind.clone(),
        );
        let r = Route {
            s_id: d,
            d_id: s,
            ox_id: ox,
            rx_id: RxId(0x100 + ox.0),
        };
        self.push(compose::els(r, &reply).unwrap(), format!("{kind} reply"));
    }

    fn ct(&mut self, req: NsRequest, reply: CtBody) {
        let ox = self.ox();
        let iu = CtIu::request(req);
        let kind = format!("{:?}", iu.preamble.command);
        self.push(
            compose::ct(Route::request(H, FcId::NAME_SERVER, ox), &iu, false).unwrap(),
            kind.clone(),
        );
        let preamble = match &reply {
            CtBody::Reject => iu.preamble.reject(
                CtReason::UNABLE_TO_PERFORM,
                NsReason::PORT_ID_NOT_REGISTERED,
            ),
            _ => iu.preamble.accept(),
        };
        let r = Route {
            s_id: FcId::NAME_SERVER,
            d_id: H,
            ox_id: ox,
            rx_id: RxId(0x100 + ox.0),
        };
        self.push(
            compose::ct(
                r,
                &CtIu {
                    preamble,
                    body: reply,
                },
                true,
            )
            .unwrap(),
            format!("{kind} reply"),
        );
    }

    fn pcap(&self) -> Vec<u8> {
        let mut w = PcapWriter::new(PcapWriter::FC_2);
        for f in &self.frames {
            w.push(f);
        }
        w.bytes().to_vec()
    }
}

fn every_link_service(w: &mut Writer) {
    let login = LoginParams::n_port(
        Wwn(0x2100_0000_0000_0001),
        Wwn(0x2000_0000_0000_0001),
        2048,
        2000,
    );
    let acc = |l: LoginParams| ElsRepr::LsAcc(LsAcc::Login(l));
    let mut f_port = login;
    f_port.common.features.0 = 0x1000 | 0x2000;
    f_port.common.word2 = 10_000;
    w.els(
        FcId::UNIDENTIFIED,
        FcId::LOGIN_SERVER,
        ElsRepr::Flogi(login),
        acc(f_port),
    );
    w.els(
        FcId::UNIDENTIFIED,
        FcId::LOGIN_SERVER,
        ElsRepr::Fdisc(login),
        acc(f_port),
    );
    w.els(H, T, ElsRepr::Plogi(login), acc(login));
    let page = |flags, p| ProcessLogin {
        pages: vec![ServiceParamPage::fcp(flags, p)],
    };
    w.els(
        H,
        T,
        ElsRepr::Prli(page(
            page_flags::ESTABLISH_IMAGE_PAIR,
            FcpServiceParams::INITIATOR_FUNCTION | FcpServiceParams::READ_XFER_RDY_DISABLED,
        )),
        ElsRepr::LsAcc(LsAcc::ProcessLogin(page(
            page_flags::ESTABLISH_IMAGE_PAIR | PrliResponse::EXECUTED.0,
            FcpServiceParams::TARGET_FUNCTION | FcpServiceParams::READ_XFER_RDY_DISABLED,
        ))),
    );
    w.els(
        H,
        T,
        ElsRepr::Prlo(page(0, 0)),
        ElsRepr::LsAcc(LsAcc::ProcessLogin(page(PrliResponse::EXECUTED.0, 0))),
    );
    let ad = Adisc {
        hard_address: FcId::UNIDENTIFIED,
        port_name: login.port_name,
        node_name: login.node_name,
        n_port_id: H,
    };
    w.els(
        H,
        T,
        ElsRepr::Adisc(ad),
        ElsRepr::LsAcc(LsAcc::Adisc(Adisc { n_port_id: T, ..ad })),
    );
    w.els(
        H,
        T,
        ElsRepr::Logo(Logo {
            n_port_id: H,
            port_name: login.port_name,
        }),
        ElsRepr::LsAcc(LsAcc::Plain),
    );
    w.els(
        H,
        FcId::FABRIC_CONTROLLER,
        ElsRepr::Scr(Scr {
            function: scr_function::FULL,
        }),
        ElsRepr::LsAcc(LsAcc::Plain),
    );
    w.els(
        FcId::FABRIC_CONTROLLER,
        H,
        ElsRepr::Rscn(Rscn {
            pages: vec![RscnPage {
                event_qualifier: 0,
                address_format: rscn_format::PORT,
                affected: T,
            }],
        }),
        ElsRepr::LsAcc(LsAcc::Plain),
    );
    let x = ExchangeRef {
        originator: H,
        ox_id: OxId(0x10),
        rx_id: RxId(0x20),
    };
    w.els(H, T, ElsRepr::Rrq(x), ElsRepr::LsAcc(LsAcc::Plain));
    w.els(
        H,
        T,
        ElsRepr::Rec(x),
        ElsRepr::LsAcc(LsAcc::Rec(RecAcc {
            ox_id: x.ox_id,
            rx_id: x.rx_id,
            originator: H,
            responder: T,
            fc4_value: 4096,
            e_stat: 0x8000_0000,
        })),
    );
    w.els(
        H,
        T,
        ElsRepr::Echo(Bytes::from_static(b"unifab echo data")),
        ElsRepr::LsAcc(LsAcc::Echo(Bytes::from_static(b"unifab echo data"))),
    );
    w.els(
        H,
        T,
        ElsRepr::Rls(T),
        ElsRepr::LsAcc(LsAcc::Rls(Lesb::default())),
    );
    w.els(
        H,
        T,
        ElsRepr::Plogi(login),
        ElsRepr::LsRjt(LsRjt::new(
            LsRjtReason::UNABLE_TO_PERFORM,
            LsRjtExplanation::INSUFFICIENT_RESOURCES,
        )),
    );
}

fn every_name_server_operation(w: &mut Writer) {
    let wwn = Wwn(0x2100_0000_0000_0002);
    let scope = FtScope {
        domain: 0,
        area: 0,
        fc_type: FcType::FCP,
    };
    let mut feats = Fc4Features::default();
    feats.set(FcType::FCP, fcp_features::TARGET);
    let ok = CtBody::Accept(NsAccept::Empty);
    w.ct(
        NsRequest::RpnId {
            port_id: H,
            port_name: wwn,
        },
        ok.clone(),
    );
    w.ct(
        NsRequest::RnnId {
            port_id: H,
            node_name: wwn,
        },
        ok.clone(),
    );
    w.ct(
        NsRequest::RftId {
            port_id: H,
            types: Fc4Types::of(FcType::FCP),
        },
        ok.clone(),
    );
    w.ct(
        NsRequest::RffId {
            port_id: H,
            features: fcp_features::INITIATOR,
            fc_type: FcType::FCP,
        },
        ok.clone(),
    );
    w.ct(
        NsRequest::RspnId {
            port_id: H,
            name: Bytes::from_static(b"unifab initiator"),
        },
        ok.clone(),
    );
    w.ct(
        NsRequest::RsnnNn {
            node_name: wwn,
            name: Bytes::from_static(b"unifab"),
        },
        ok.clone(),
    );
    w.ct(NsRequest::DaId(H), ok);
    let entries = |names| {
        let v = vec![
            PortEntry {
                last: false,
                port_id: H,
                port_name: wwn,
            },
            PortEntry {
                last: true,
                port_id: T,
                port_name: Wwn(0x2100_0000_0000_0003),
            },
        ];
        if names {
            NsAccept::PortNames(v)
        } else {
            NsAccept::PortIds(v)
        }
    };
    w.ct(NsRequest::GidFt(scope), CtBody::Accept(entries(false)));
    w.ct(NsRequest::GpnFt(scope), CtBody::Accept(entries(true)));
    w.ct(NsRequest::GpnId(T), CtBody::Accept(NsAccept::Name(wwn)));
    w.ct(NsRequest::GnnId(T), CtBody::Accept(NsAccept::Name(wwn)));
    w.ct(
        NsRequest::GffId(T),
        CtBody::Accept(NsAccept::Features(Box::new(feats))),
    );
    w.ct(
        NsRequest::GftId(T),
        CtBody::Accept(NsAccept::Types(Fc4Types::of(FcType::FCP))),
    );
    w.ct(NsRequest::GidPn(wwn), CtBody::Accept(NsAccept::PortId(T)));
    w.ct(
        NsRequest::GspnId(T),
        CtBody::Accept(NsAccept::SymbolicName(Bytes::from_static(b"unifab target"))),
    );
    w.ct(
        NsRequest::GsnnNn(wwn),
        CtBody::Accept(NsAccept::SymbolicName(Bytes::from_static(b"unifab"))),
    );
    w.ct(
        NsRequest::GaNxt(H),
        CtBody::Accept(NsAccept::Object(Box::new(NsObject {
            port_type: 1,
            port_id: T,
            port_name: wwn,
            symbolic_port_name: Bytes::from_static(b"unifab target"),
            node_name: Wwn(0x2000_0000_0000_0003),
            symbolic_node_name: Bytes::from_static(b"unifab"),
            initial_process_associator: 0,
            ip_address_node: [0; 16],
            class_of_service: 8,
            fc4_types: Fc4Types::of(FcType::FCP),
            ip_address_port: [0; 16],
            fabric_port_name: Wwn(0x1000_0000_0000_0002),
            hard_address: FcId::UNIDENTIFIED,
        }))),
    );
    w.ct(NsRequest::GpnId(FcId::new(0x010900)), CtBody::Reject);
}

fn fcp_header(
    r_ctl: RCtl,
    s: FcId,
    d: FcId,
    f_ctl: u32,
    ox: OxId,
    rx: RxId,
    seq: u8,
) -> FcHeaderRepr {
    FcHeaderRepr {
        r_ctl,
        d_id: d,
        s_id: s,
        fc_type: FcType::FCP,
        f_ctl: FCtl(f_ctl),
        seq_id: seq,
        ox_id: ox,
        rx_id: rx,
        ..FcHeaderRepr::default()
    }
}

fn every_fcp_iu_and_bls(w: &mut Writer) {
    // A write: FCP_CMND, FCP_XFER_RDY, FCP_DATA, FCP_RSP with a residual.
    let ox = w.ox();
    let rx = RxId(0x300);
    let cdb = [0x2a, 0, 0, 0, 0, 0x10, 0, 0, 8, 0];
    let c = FcpCmndRepr::command(Lun(0), &cdb, 4096, false, true);
    let mut b = vec![0u8; c.buffer_len()];
    c.emit(&mut b).unwrap();
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_CMND, H, T, 0x29_0000, ox, RxId::UNASSIGNED, 1),
            Bytes::from(b),
        ),
        "FCP_CMND",
    );
    let x = XferRdyRepr {
        data_ro: 0,
        burst_len: 4096,
    };
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_XFER_RDY, T, H, 0x89_0000, ox, rx, 2),
            Bytes::copy_from_slice(&x.to_bytes()),
        ),
        "FCP_XFER_RDY",
    );
    for k in 0..2u32 {
        let f = if k == 1 { 0x09_0008 } else { 0x00_0008 };
        let mut h = fcp_header(RCtl::FCP_DATA, H, T, f, ox, rx, 3);
        h.seq_cnt = k as u16;
        h.parameter = k * 2048;
        w.push(Frame::new(h, Bytes::from(vec![0x5a; 2048])), "FCP_DATA");
    }
    let rsp = FcpRspRepr {
        flags: FcpRspFlags(FcpRspFlags::RESID_UNDER),
        resid: 512,
        ..FcpRspRepr::default()
    };
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_RSP, T, H, 0x98_0000, ox, rx, 4),
            rsp.to_bytes().unwrap(),
        ),
        "FCP_RSP",
    );
    // A read answered with CHECK CONDITION and sense.
    let ox = w.ox();
    let c = FcpCmndRepr::command(
        Lun(1 << 48),
        &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        512,
        true,
        false,
    );
    let mut b = vec![0u8; c.buffer_len()];
    c.emit(&mut b).unwrap();
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_CMND, H, T, 0x29_0000, ox, RxId::UNASSIGNED, 5),
            Bytes::from(b),
        ),
        "FCP_CMND",
    );
    let rsp = FcpRspRepr {
        scsi_status: 2,
        sense: Bytes::from_static(&[0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x21, 0, 0, 0, 0, 0]),
        flags: FcpRspFlags(FcpRspFlags::RESID_UNDER),
        resid: 512,
        ..FcpRspRepr::default()
    };
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_RSP, T, H, 0x98_0000, ox, RxId(0x301), 6),
            rsp.to_bytes().unwrap(),
        ),
        "FCP_RSP",
    );
    // A task management function and its response information.
    let ox = w.ox();
    let mut c = FcpCmndRepr::command(Lun(0), &[], 0, false, false);
    c.tmf = FcpTmf::LOGICAL_UNIT_RESET;
    let mut b = vec![0u8; c.buffer_len()];
    c.emit(&mut b).unwrap();
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_CMND, H, T, 0x29_0000, ox, RxId::UNASSIGNED, 7),
            Bytes::from(b),
        ),
        "FCP_CMND TMF",
    );
    let rsp = FcpRspRepr::tmf(unifab_fc::wire::fcp::FcpRspCode::COMPLETE);
    w.push(
        Frame::new(
            fcp_header(RCtl::FCP_RSP, T, H, 0x98_0000, ox, RxId(0x302), 8),
            rsp.to_bytes().unwrap(),
        ),
        "FCP_RSP TMF",
    );
    // ABTS with BA_ACC, and with BA_RJT.
    for accept in [true, false] {
        let ox = w.ox();
        let route = Route {
            s_id: H,
            d_id: T,
            ox_id: ox,
            rx_id: RxId(0x400),
        };
        w.push(compose::abts(route, false), "ABTS");
        let reply = if accept {
            BlsRepr::BaAcc(BaAcc {
                seq_id_validity: 0,
                last_seq_id: 0,
                ox_id: ox,
                rx_id: RxId(0x400),
                low_seq_cnt: 0,
                high_seq_cnt: 0xffff,
            })
        } else {
            BlsRepr::BaRjt(BaRjt {
                reason: BaRjtReason::LOGICAL_ERROR,
                explanation: BaRjtExplanation::INVALID_OX_ID_RX_ID,
                vendor: 0,
            })
        };
        let back = Route {
            s_id: T,
            d_id: H,
            ox_id: ox,
            rx_id: RxId(0x400),
        };
        w.push(
            compose::bls_reply(back, &reply, true).unwrap(),
            format!("{:?}", reply.r_ctl()),
        );
    }
}

#[test]
fn tshark_decodes_every_emitted_frame_without_complaint() {
    let mut w = Writer {
        frames: Vec::new(),
        kinds: Vec::new(),
        next_ox: 0,
    };
    every_link_service(&mut w);
    every_name_server_operation(&mut w);
    every_fcp_iu_and_bls(&mut w);
    let tshark = Tshark::new("emitted.pcap", &w.pcap());
    tshark.assert_no_complaint();
    let run = |filter: &str, fields: &[&str]| tshark.run(filter, fields);
    // tshark saw every frame as FC, and decoded the link services and FCP.
    let all = run("fc", &["frame.number", "_ws.col.Protocol", "_ws.col.Info"]);
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), w.frames.len(), "{all}");
    let protocols = run("fc", &["_ws.col.Protocol"]);
    for p in ["FC ELS", "dNS", "FCP", "FC"] {
        assert!(protocols.lines().any(|l| l == p), "no {p} frame:\n{all}");
    }
    for (n, kind) in w.kinds.iter().enumerate() {
        assert!(!lines[n].is_empty(), "frame {} ({kind}) not decoded", n + 1);
    }
}
