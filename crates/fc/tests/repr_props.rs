//! Property: for every representation the wire layer has, emit followed
//! by parse gives back the same value (and the same bytes again).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;
use unifab_fc::wire::bls::{BaAcc, BaRjt, BaRjtExplanation, BaRjtReason, BlsRepr};
use unifab_fc::wire::ct::{
    CtBody, CtCommand, CtIu, CtPreamble, CtReason, Fc4Features, Fc4Types, FtScope, GsSubtype,
    GsType, NsAccept, NsObject, NsReason, NsRequest, PortEntry,
};
use unifab_fc::wire::els::{
    Adisc, ClassServiceParams, CommonFeatures, CommonServiceParams, ElsCode, ElsRepr, ExchangeRef,
    Lesb, LoginParams, Logo, LsAcc, LsRjt, LsRjtExplanation, LsRjtReason, ProcessLogin, RecAcc,
    Rscn, RscnPage, Scr, ServiceParamPage, Srr,
};
use unifab_fc::wire::fcp::{
    FcpCmndRepr, FcpRspFlags, FcpRspRepr, FcpTaskAttr, FcpTmf, XferRdy, XferRdyRepr,
};
use unifab_fc::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use unifab_fc::wire::{FcId, FrameRepr, OxId, PayloadRepr, ReplyTracker, RxId, Wwn};
use unifab_scsi_core::Lun;

fn fcid() -> impl Strategy<Value = FcId> {
    (0u32..0x100_0000).prop_map(FcId::new)
}

fn wwn() -> impl Strategy<Value = Wwn> {
    any::<u64>().prop_map(Wwn)
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn name() -> impl Strategy<Value = Bytes> {
    bytes(255)
}

fn common() -> impl Strategy<Value = CommonServiceParams> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        0u8..16,
        0u16..0x1000,
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(v, c, f, sc, rx, w2, ed)| CommonServiceParams {
            fc_ph_version: v,
            bb_credit: c,
            features: CommonFeatures(f),
            bb_sc_n: sc,
            rx_data_field_size: rx,
            word2: w2,
            e_d_tov: ed,
        })
}

fn class() -> impl Strategy<Value = ClassServiceParams> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u8>(),
    )
        .prop_map(|(o, i, r, rx, cs, ee, open)| ClassServiceParams {
            service_options: o,
            initiator_control: i,
            recipient_control: r,
            rx_data_field_size: rx,
            concurrent_sequences: cs,
            end_to_end_credit: ee,
            open_sequences_per_exchange: open,
        })
}

fn login() -> impl Strategy<Value = LoginParams> {
    (
        common(),
        wwn(),
        wwn(),
        proptest::array::uniform4(class()),
        proptest::array::uniform16(any::<u8>()),
    )
        .prop_map(|(common, p, n, classes, vv)| LoginParams {
            common,
            port_name: p,
            node_name: n,
            classes,
            vendor_version: vv,
        })
}

fn pages() -> impl Strategy<Value = ProcessLogin> {
    proptest::collection::vec(
        (
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        0..8,
    )
    .prop_map(|v| ProcessLogin {
        pages: v
            .into_iter()
            .map(|(t, e, f, o, r, p)| ServiceParamPage {
                fc_type: FcType(t),
                type_extension: e,
                flags: f,
                originator_pa: o,
                responder_pa: r,
                service_params: p,
            })
            .collect(),
    })
}

fn xref() -> impl Strategy<Value = ExchangeRef> {
    (fcid(), any::<u16>(), any::<u16>()).prop_map(|(o, x, r)| ExchangeRef {
        originator: o,
        ox_id: OxId(x),
        rx_id: RxId(r),
    })
}

fn adisc() -> impl Strategy<Value = Adisc> {
    (fcid(), wwn(), wwn(), fcid()).prop_map(|(h, p, n, id)| Adisc {
        hard_address: h,
        port_name: p,
        node_name: n,
        n_port_id: id,
    })
}

/// An ELS payload and the request code an accept answers.
fn els() -> impl Strategy<Value = (ElsRepr, Option<ElsCode>)> {
    prop_oneof![
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(r, e, v)| (
            ElsRepr::LsRjt(LsRjt {
                reason: LsRjtReason(r),
                explanation: LsRjtExplanation(e),
                vendor: v
            }),
            None
        )),
        login().prop_map(|l| (ElsRepr::Plogi(l), None)),
        login().prop_map(|l| (ElsRepr::Flogi(l), None)),
        login().prop_map(|l| (ElsRepr::Fdisc(l), None)),
        login().prop_map(|l| (ElsRepr::LsAcc(LsAcc::Login(l)), Some(ElsCode::FLOGI))),
        (fcid(), wwn()).prop_map(|(id, w)| (
            ElsRepr::Logo(Logo {
                n_port_id: id,
                port_name: w
            }),
            None
        )),
        pages().prop_map(|p| (ElsRepr::Prli(p), None)),
        pages().prop_map(|p| (ElsRepr::Prlo(p), None)),
        pages().prop_map(|p| (ElsRepr::LsAcc(LsAcc::ProcessLogin(p)), Some(ElsCode::PRLI))),
        adisc().prop_map(|a| (ElsRepr::Adisc(a), None)),
        adisc().prop_map(|a| (ElsRepr::LsAcc(LsAcc::Adisc(a)), Some(ElsCode::ADISC))),
        proptest::collection::vec((0u8..16, 0u8..4, fcid()), 0..64).prop_map(|v| (
            ElsRepr::Rscn(Rscn {
                pages: v
                    .into_iter()
                    .map(|(q, f, a)| RscnPage {
                        event_qualifier: q,
                        address_format: f,
                        affected: a
                    })
                    .collect()
            }),
            None
        )),
        any::<u8>().prop_map(|f| (ElsRepr::Scr(Scr { function: f }), None)),
        xref().prop_map(|x| (ElsRepr::Rrq(x), None)),
        xref().prop_map(|x| (ElsRepr::Rec(x), None)),
        bytes(2000).prop_map(|d| (ElsRepr::Echo(d), None)),
        bytes(2000).prop_map(|d| (ElsRepr::LsAcc(LsAcc::Echo(d)), Some(ElsCode::ECHO))),
        fcid().prop_map(|id| (ElsRepr::Rls(id), None)),
        proptest::array::uniform6(any::<u32>()).prop_map(|a| (
            ElsRepr::LsAcc(LsAcc::Rls(Lesb {
                link_failure: a[0],
                loss_of_sync: a[1],
                loss_of_signal: a[2],
                primitive_sequence_error: a[3],
                invalid_transmission_word: a[4],
                invalid_crc: a[5]
            })),
            Some(ElsCode::RLS)
        )),
        (
            any::<u16>(),
            any::<u16>(),
            fcid(),
            fcid(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(x, r, o, s, v, e)| (
                ElsRepr::LsAcc(LsAcc::Rec(RecAcc {
                    ox_id: OxId(x),
                    rx_id: RxId(r),
                    originator: o,
                    responder: s,
                    fc4_value: v,
                    e_stat: e
                })),
                Some(ElsCode::REC)
            )),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u8>()).prop_map(|(x, r, ro, rc)| (
            ElsRepr::Srr(Srr {
                ox_id: OxId(x),
                rx_id: RxId(r),
                relative_offset: ro,
                r_ctl: rc
            }),
            None
        )),
        Just((ElsRepr::LsAcc(LsAcc::Plain), Some(ElsCode::LOGO))),
        (proptest::array::uniform3(any::<u8>()), bytes(1000)).prop_map(|(w, d)| {
            let mut v = w.to_vec();
            v.extend_from_slice(&d);
            (ElsRepr::LsAcc(LsAcc::Opaque(Bytes::from(v))), None)
        }),
        (
            proptest::sample::select(vec![0x06u8, 0x07, 0x08, 0x0b, 0x0e, 0x11, 0x78, 0x7a]),
            bytes(1000)
        )
            .prop_map(|(c, d)| {
                let mut v = vec![c, 0, 0, 0];
                v.extend_from_slice(&d);
                (ElsRepr::Other(Bytes::from(v)), None)
            }),
    ]
}

fn entries(names: bool) -> impl Strategy<Value = Vec<PortEntry>> {
    proptest::collection::vec((fcid(), wwn()), 1..100).prop_map(move |v| {
        let n = v.len();
        v.into_iter()
            .enumerate()
            .map(|(i, (id, w))| PortEntry {
                last: i + 1 == n,
                port_id: id,
                port_name: if names { w } else { Wwn(0) },
            })
            .collect()
    })
}

fn types() -> impl Strategy<Value = Fc4Types> {
    proptest::array::uniform32(any::<u8>()).prop_map(Fc4Types)
}

fn ns_request() -> impl Strategy<Value = NsRequest> {
    let scope = (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(d, a, t)| FtScope {
        domain: d,
        area: a,
        fc_type: FcType(t),
    });
    prop_oneof![
        fcid().prop_map(NsRequest::GaNxt),
        fcid().prop_map(NsRequest::GpnId),
        fcid().prop_map(NsRequest::GnnId),
        fcid().prop_map(NsRequest::GftId),
        fcid().prop_map(NsRequest::GspnId),
        fcid().prop_map(NsRequest::GffId),
        fcid().prop_map(NsRequest::DaId),
        wwn().prop_map(NsRequest::GidPn),
        wwn().prop_map(NsRequest::GsnnNn),
        scope.clone().prop_map(NsRequest::GidFt),
        scope.prop_map(NsRequest::GpnFt),
        (fcid(), wwn()).prop_map(|(p, w)| NsRequest::RpnId {
            port_id: p,
            port_name: w
        }),
        (fcid(), wwn()).prop_map(|(p, w)| NsRequest::RnnId {
            port_id: p,
            node_name: w
        }),
        (fcid(), types()).prop_map(|(p, t)| NsRequest::RftId {
            port_id: p,
            types: t
        }),
        (fcid(), any::<u8>(), any::<u8>()).prop_map(|(p, f, t)| NsRequest::RffId {
            port_id: p,
            features: f,
            fc_type: FcType(t)
        }),
        (fcid(), name()).prop_map(|(p, n)| NsRequest::RspnId {
            port_id: p,
            name: n
        }),
        (wwn(), name()).prop_map(|(w, n)| NsRequest::RsnnNn {
            node_name: w,
            name: n
        }),
    ]
}

fn ns_accept() -> impl Strategy<Value = (NsAccept, CtCommand)> {
    prop_oneof![
        Just((NsAccept::Empty, CtCommand::RFT_ID)),
        entries(false).prop_map(|e| (NsAccept::PortIds(e), CtCommand::GID_FT)),
        entries(true).prop_map(|e| (NsAccept::PortNames(e), CtCommand::GPN_FT)),
        wwn().prop_map(|w| (NsAccept::Name(w), CtCommand::GNN_ID)),
        fcid().prop_map(|id| (NsAccept::PortId(id), CtCommand::GID_PN)),
        name().prop_map(|n| (NsAccept::SymbolicName(n), CtCommand::GSNN_NN)),
        types().prop_map(|t| (NsAccept::Types(t), CtCommand::GFT_ID)),
        proptest::collection::vec(any::<u8>(), 128).prop_map(|v| {
            let mut f = [0u8; 128];
            f.copy_from_slice(&v);
            (
                NsAccept::Features(Box::new(Fc4Features(f))),
                CtCommand::GFF_ID,
            )
        }),
        (
            any::<u8>(),
            fcid(),
            wwn(),
            name(),
            wwn(),
            name(),
            any::<u64>(),
            any::<u32>(),
            types(),
            wwn(),
            fcid()
        )
            .prop_map(|(pt, id, pn, spn, nn, snn, ipa, cos, t, fpn, hard)| (
                NsAccept::Object(Box::new(NsObject {
                    port_type: pt,
                    port_id: id,
                    port_name: pn,
                    symbolic_port_name: spn,
                    node_name: nn,
                    symbolic_node_name: snn,
                    initial_process_associator: ipa,
                    ip_address_node: [7; 16],
                    class_of_service: cos,
                    fc4_types: t,
                    ip_address_port: [9; 16],
                    fabric_port_name: fpn,
                    hard_address: hard
                })),
                CtCommand::GA_NXT
            )),
    ]
}

fn preamble() -> impl Strategy<Value = CtPreamble> {
    (any::<u8>(), fcid(), any::<u8>(), any::<u16>(), any::<u8>()).prop_map(
        |(rev, in_id, o, m, fr)| CtPreamble {
            revision: rev,
            in_id,
            gs_type: GsType::DIRECTORY,
            gs_subtype: GsSubtype::NAME_SERVER,
            options: o,
            max_residual_size: m,
            fragment_id: fr,
            ..CtPreamble::default()
        },
    )
}

/// A CT_IU and the request an accept answers.
fn ct() -> impl Strategy<Value = (CtIu, Option<CtCommand>)> {
    prop_oneof![
        (preamble(), ns_request()).prop_map(|(p, r)| (
            CtIu {
                preamble: CtPreamble {
                    command: r.command(),
                    ..p
                },
                body: CtBody::Request(r)
            },
            None
        )),
        (preamble(), ns_accept()).prop_map(|(p, (a, cmd))| (
            CtIu {
                preamble: CtPreamble {
                    command: CtCommand::FS_ACC,
                    ..p
                },
                body: CtBody::Accept(a)
            },
            Some(cmd)
        )),
        (preamble(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(p, r, e, v)| (
            CtIu {
                preamble: CtPreamble {
                    command: CtCommand::FS_RJT,
                    reason: CtReason(r),
                    explanation: NsReason(e),
                    vendor: v,
                    ..p
                },
                body: CtBody::Reject
            },
            None
        )),
        (preamble(), bytes(1000)).prop_map(|(p, b)| (
            CtIu {
                preamble: CtPreamble {
                    command: CtCommand::FS_ACC,
                    ..p
                },
                body: CtBody::Opaque(b)
            },
            None
        )),
    ]
}

fn fcp_cmnd() -> impl Strategy<Value = FcpCmndRepr> {
    (
        any::<u64>(),
        any::<u8>(),
        0u8..16,
        0u8..8,
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
        0usize..64,
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 268),
    )
        .prop_map(
            |(lun, crn, prio, attr, tmf, rd, wr, addl, dl, bidi, cdb)| FcpCmndRepr {
                lun: Lun(lun),
                crn,
                priority: prio,
                task_attribute: FcpTaskAttr(attr),
                tmf: FcpTmf(tmf),
                rddata: rd,
                wrdata: wr,
                cdb: Bytes::copy_from_slice(&cdb[..16 + 4 * addl]),
                fcp_dl: dl,
                bidirectional_read_dl: (rd && wr).then_some(bidi),
            },
        )
}

fn fcp_rsp() -> impl Strategy<Value = FcpRspRepr> {
    (
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
        proptest::sample::select(vec![0usize, 4, 8]),
        any::<u8>(),
        bytes(252),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(rdt, flags, status, resid, rlen, code, sense, bidi)| {
            let mut info = vec![0u8; rlen];
            if rlen > 0 {
                info[3] = code;
            }
            let mut f = flags
                & !(FcpRspFlags::RSP_LEN_VALID
                    | FcpRspFlags::SNS_LEN_VALID
                    | FcpRspFlags::BIDI_RSP);
            if rlen > 0 {
                f |= FcpRspFlags::RSP_LEN_VALID;
            }
            if !sense.is_empty() {
                f |= FcpRspFlags::SNS_LEN_VALID;
            }
            if bidi.is_some() {
                f |= FcpRspFlags::BIDI_RSP;
            }
            FcpRspRepr {
                retry_delay_timer: rdt,
                flags: FcpRspFlags(f),
                scsi_status: status,
                resid,
                rsp_info: Bytes::from(info),
                sense,
                bidirectional_read_resid: bidi,
            }
        })
}

fn bls() -> impl Strategy<Value = BlsRepr> {
    prop_oneof![
        Just(BlsRepr::Abts),
        (
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
            any::<u16>()
        )
            .prop_map(|(v, s, o, r, l, h)| BlsRepr::BaAcc(BaAcc {
                seq_id_validity: v,
                last_seq_id: s,
                ox_id: OxId(o),
                rx_id: RxId(r),
                low_seq_cnt: l,
                high_seq_cnt: h
            })),
        (any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(r, e, v)| BlsRepr::BaRjt(BaRjt {
            reason: BaRjtReason(r),
            explanation: BaRjtExplanation(e),
            vendor: v
        })),
    ]
}

fn header(r_ctl: RCtl, t: FcType) -> impl Strategy<Value = FcHeaderRepr> {
    (
        fcid(),
        fcid(),
        any::<u8>(),
        0u32..0x100_0000,
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(
            move |(d, s, cs, fctl, seq, cnt, ox, rx, par)| FcHeaderRepr {
                r_ctl,
                d_id: d,
                cs_ctl: cs,
                s_id: s,
                fc_type: t,
                f_ctl: FCtl(fctl),
                seq_id: seq,
                df_ctl: 0,
                seq_cnt: cnt,
                ox_id: OxId(ox),
                rx_id: RxId(rx),
                parameter: par,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn els_round_trips((e, answering) in els()) {
        let b = e.to_bytes().unwrap();
        prop_assert_eq!(b.len(), e.buffer_len());
        let back = ElsRepr::parse(&b, answering).unwrap();
        prop_assert_eq!(&back, &e);
        prop_assert_eq!(back.to_bytes().unwrap(), b);
    }

    #[test]
    fn ct_round_trips((iu, answering) in ct()) {
        let b = iu.to_bytes().unwrap();
        let back = CtIu::parse(&b, answering).unwrap();
        prop_assert_eq!(&back, &iu);
        prop_assert_eq!(back.to_bytes().unwrap(), b);
    }

    #[test]
    fn fcp_cmnd_round_trips(c in fcp_cmnd()) {
        let mut b = vec![0u8; c.buffer_len()];
        c.emit(&mut b).unwrap();
        let back = FcpCmndRepr::parse(&Bytes::from(b)).unwrap();
        prop_assert_eq!(back, c);
    }

    #[test]
    fn fcp_rsp_round_trips(r in fcp_rsp()) {
        let b = r.to_bytes().unwrap();
        prop_assert_eq!(FcpRspRepr::parse(&b).unwrap(), r);
    }

    #[test]
    fn xfer_rdy_round_trips(ro in any::<u32>(), len in any::<u32>()) {
        let x = XferRdyRepr { data_ro: ro, burst_len: len };
        let b = x.to_bytes();
        prop_assert_eq!(XferRdyRepr::parse(&XferRdy::new_checked(&b[..]).unwrap()), x);
    }

    #[test]
    fn bls_round_trips(b in bls()) {
        let mut v = vec![0u8; b.buffer_len()];
        b.emit(&mut v).unwrap();
        prop_assert_eq!(BlsRepr::parse(b.r_ctl(), &Bytes::from(v)).unwrap(), b);
    }

    #[test]
    fn whole_frames_round_trip(
        h in header(RCtl::ELS_REQUEST, FcType::ELS),
        hc in header(RCtl::CT_REQUEST, FcType::CT),
        hf in header(RCtl::FCP_CMND, FcType::FCP),
        (e, _) in els(),
        (iu, _) in ct(),
        c in fcp_cmnd(),
        trailer in bytes(8),
    ) {
        for (h, p) in [
            (FcHeaderRepr { r_ctl: if e.is_reply() { RCtl::ELS_REPLY } else { RCtl::ELS_REQUEST }, ..h }, PayloadRepr::Els(e)),
            (hc, PayloadRepr::Ct(iu)),
            (hf, PayloadRepr::FcpCmnd(c)),
        ] {
            let f = FrameRepr { header: h, payload: p, trailer: trailer.clone() };
            let b = Bytes::from(f.to_bytes().unwrap());
            let mut t = ReplyTracker::new();
            let back = FrameRepr::parse(&b, Some(&mut t)).unwrap();
            prop_assert_eq!(back.to_bytes().unwrap(), b.to_vec());
        }
    }

    #[test]
    fn no_parser_panics_on_noise(b in bytes(2200), answering in any::<u8>(), cmd in any::<u16>()) {
        let _ = ElsRepr::parse(&b, Some(ElsCode(answering)));
        let _ = CtIu::parse(&b, Some(CtCommand(cmd)));
        let _ = FcpCmndRepr::parse(&b);
        let _ = FcpRspRepr::parse(&b);
        let _ = FrameRepr::parse(&b, None);
    }
}
