//! Building link-service frames: ELS, CT and BLS requests and replies with
//! the F_CTL, SOF and EOF the standards give single-frame sequences.

use bytes::Bytes;

use crate::wire::bls::BlsRepr;
use crate::wire::ct::CtIu;
use crate::wire::els::ElsRepr;
use crate::wire::frame::Frame;
use crate::wire::header::{FCtl, FcHeaderRepr, FcType, RCtl};
use crate::wire::{FcId, OxId, RxId, WireError};

/// Addresses and exchange identifiers of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Source.
    pub s_id: FcId,
    /// Destination.
    pub d_id: FcId,
    /// OX_ID.
    pub ox_id: OxId,
    /// RX_ID.
    pub rx_id: RxId,
}

impl Route {
    /// A new exchange from `s_id` to `d_id`.
    pub fn request(s_id: FcId, d_id: FcId, ox_id: OxId) -> Route {
        Route {
            s_id,
            d_id,
            ox_id,
            rx_id: RxId::UNASSIGNED,
        }
    }

    /// The route of a reply to a frame with this header, from `rx_id`.
    pub fn reply_to(h: &FcHeaderRepr, rx_id: RxId) -> Route {
        Route {
            s_id: h.d_id,
            d_id: h.s_id,
            ox_id: h.ox_id,
            rx_id,
        }
    }
}

fn header(route: Route, r_ctl: RCtl, fc_type: FcType, f_ctl: FCtl, seq_id: u8) -> FcHeaderRepr {
    FcHeaderRepr {
        r_ctl,
        d_id: route.d_id,
        cs_ctl: 0,
        s_id: route.s_id,
        fc_type,
        f_ctl,
        seq_id,
        df_ctl: 0,
        seq_cnt: 0,
        ox_id: route.ox_id,
        rx_id: route.rx_id,
        parameter: 0,
    }
}

/// A frame for `payload`, padded to a whole word with fill bytes that
/// F_CTL counts (FC-FS-4 §9.5).
fn padded(mut h: FcHeaderRepr, payload: Bytes) -> Frame {
    let fill = (4 - payload.len() % 4) % 4;
    if fill == 0 {
        return Frame::new(h, payload);
    }
    h.f_ctl = h.f_ctl.with_fill_bytes(fill as u8);
    let mut v = Vec::with_capacity(payload.len() + fill);
    v.extend_from_slice(&payload);
    v.resize(payload.len() + fill, 0);
    Frame::new(h, Bytes::from(v))
}

/// An ELS request (first sequence, sequence initiative passed) or reply
/// (responder, last sequence), chosen by the payload's command.
pub fn els(route: Route, els: &ElsRepr) -> Result<Frame, WireError> {
    let (r_ctl, f_ctl) = if els.is_reply() {
        (RCtl::ELS_REPLY, FCtl::last_reply())
    } else {
        (RCtl::ELS_REQUEST, FCtl::request())
    };
    Ok(padded(
        header(route, r_ctl, FcType::ELS, f_ctl, 0),
        els.to_bytes()?,
    ))
}

/// A CT request (`reply` false) or its FS_ACC/FS_RJT.
pub fn ct(route: Route, iu: &CtIu, reply: bool) -> Result<Frame, WireError> {
    let (r_ctl, f_ctl) = if reply {
        (RCtl::CT_REPLY, FCtl::last_reply())
    } else {
        (RCtl::CT_REQUEST, FCtl::request())
    };
    Ok(padded(
        header(route, r_ctl, FcType::CT, f_ctl, 0),
        iu.to_bytes()?,
    ))
}

/// ABTS from the exchange originator (`responder` false) or responder.
/// Parameter bit 0 clear: abort the whole exchange.
pub fn abts(route: Route, responder: bool) -> Frame {
    let f = FCtl(FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE)
        .with(FCtl::EXCHANGE_CONTEXT, responder);
    Frame::new(header(route, RCtl::ABTS, FcType::BLS, f, 0), Bytes::new())
}

/// BA_ACC or BA_RJT answering an ABTS: it ends the exchange.
pub fn bls_reply(route: Route, reply: &BlsRepr, from_responder: bool) -> Result<Frame, WireError> {
    let mut v = vec![0u8; reply.buffer_len()];
    reply.emit(&mut v)?;
    let f =
        FCtl(FCtl::LAST_SEQUENCE | FCtl::END_SEQUENCE).with(FCtl::EXCHANGE_CONTEXT, from_responder);
    Ok(Frame::new(
        header(route, reply.r_ctl(), FcType::BLS, f, 0),
        Bytes::from(v),
    ))
}
