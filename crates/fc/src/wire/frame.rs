//! Whole frames: a zero-copy view over header + payload, the owned
//! [`Frame`] that moves through unifab's fabric, and [`FrameRepr`], the
//! typed meaning of a frame's payload used by `pcap-check` and the tests.

use std::collections::HashMap;

use bytes::Bytes;

use super::bls::BlsRepr;
use super::ct::{CtBody, CtCommand, CtIu};
use super::delimiter::{Eof, Sof};
use super::els::{ElsCode, ElsRepr};
use super::fcp::{FcpCmndRepr, FcpRspRepr, XferRdy, XferRdyRepr};
use super::header::{FcHeader, FcHeaderRepr, FcType, HEADER_LEN, RCtl};
use super::{FcId, MAX_PAYLOAD, OxId, WireError};

/// A zero-copy view of an FC frame: 24-byte header and payload, without
/// delimiters or CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcFrame<T> {
    /// Wraps header + payload; the payload may be empty but not longer
    /// than 2112 bytes.
    pub fn new_checked(buffer: T) -> Result<FcFrame<T>, WireError> {
        let n = buffer.as_ref().len();
        super::check_len(buffer.as_ref(), HEADER_LEN)?;
        if n - HEADER_LEN > MAX_PAYLOAD {
            return Err(WireError::PayloadTooLong(n - HEADER_LEN));
        }
        Ok(FcFrame { buffer })
    }

    /// The header.
    pub fn header(&self) -> FcHeader<&[u8]> {
        FcHeader::new_unchecked(&self.buffer.as_ref()[..HEADER_LEN])
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// A frame moving through unifab: delimiters, the parsed header, and the
/// payload as a `Bytes` slice (of a receive buffer or of a data buffer).
/// Links that need bytes on a wire (FCoE, FCIP, pcap) lay it out with
/// [`Frame::write_to`] and [`Frame::crc`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Start-of-frame delimiter.
    pub sof: Sof,
    /// The header.
    pub header: FcHeaderRepr,
    /// The payload (fill bytes included).
    pub payload: Bytes,
    /// End-of-frame delimiter.
    pub eof: Eof,
}

impl Frame {
    /// A class 3 frame; SOF and EOF follow from the header's F_CTL
    /// (first sequence → SOFi3, end of sequence → EOFt).
    pub fn new(header: FcHeaderRepr, payload: Bytes) -> Frame {
        Frame {
            sof: Sof::class3(header.seq_cnt == 0),
            eof: Eof::class3(header.f_ctl.end_sequence()),
            header,
            payload,
        }
    }

    /// Parses header + payload (no CRC) from a received buffer.
    pub fn parse(bytes: Bytes, sof: Sof, eof: Eof) -> Result<Frame, WireError> {
        let v = FcFrame::new_checked(&bytes[..])?;
        let header = FcHeaderRepr::parse(&v.header());
        Ok(Frame {
            sof,
            header,
            payload: bytes.slice(HEADER_LEN..),
            eof,
        })
    }

    /// Header + payload length.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Never true: a frame always has a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends header + payload to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header.to_bytes());
        out.extend_from_slice(&self.payload);
    }

    /// The FC CRC over header and payload.
    pub fn crc(&self) -> u32 {
        super::crc::fc_crc_parts(&self.header.to_bytes(), &[&self.payload])
    }

    /// Fill bytes a link must add after the payload to make the data
    /// field whole words (FC-FS-4 §9.5: a frame's content is a multiple of
    /// four bytes; F_CTL bits 1–0 count the fill). 0 for a payload that
    /// already is (ELS and CT payloads are built padded).
    pub fn fill_needed(&self) -> usize {
        (4 - self.payload.len() % 4) % 4
    }

    /// The header as it goes on a wire: with F_CTL counting the fill bytes
    /// [`Frame::fill_needed`] adds (unchanged when none are needed).
    pub fn wire_header(&self) -> FcHeaderRepr {
        let mut h = self.header;
        let fill = self.fill_needed();
        if fill != 0 {
            h.f_ctl = h.f_ctl.with_fill_bytes(fill as u8);
        }
        h
    }

    /// The frame with the fill bytes of solicited data (FCP_DATA) removed,
    /// as F_CTL counts them: fill is not data, and the payload is then
    /// exactly what the sender's FCP layer sent. Other frames keep theirs
    /// (their payload structures account for it).
    pub fn without_data_fill(mut self) -> Frame {
        let fill = usize::from(self.header.f_ctl.fill_bytes());
        if fill != 0
            && self.header.fc_type == FcType::FCP
            && self.header.r_ctl == RCtl::FCP_DATA
            && self.payload.len() >= fill
        {
            self.payload = self.payload.slice(..self.payload.len() - fill);
            self.header.f_ctl = self.header.f_ctl.with_fill_bytes(0);
        }
        self
    }
}

/// The typed meaning of a frame's payload, chosen by R_CTL, TYPE and
/// DF_CTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadRepr {
    /// An extended link service.
    Els(ElsRepr),
    /// An FC-4 link service (FCP's SRR and its replies), ELS format.
    Fc4LinkService(ElsRepr),
    /// A basic link service.
    Bls(BlsRepr),
    /// A common transport IU (name server).
    Ct(CtIu),
    /// FCP_CMND.
    FcpCmnd(FcpCmndRepr),
    /// FCP_XFER_RDY.
    FcpXferRdy(XferRdyRepr),
    /// FCP_RSP.
    FcpRsp(FcpRspRepr),
    /// FCP_DATA (relative offset in the header).
    FcpData(Bytes),
    /// Anything unifab does not decode: link control, SW_ILS, other FC-4s,
    /// frames with optional headers.
    Raw(Bytes),
}

impl PayloadRepr {
    /// A short name for reports.
    pub fn kind(&self) -> String {
        match self {
            PayloadRepr::Els(e) | PayloadRepr::Fc4LinkService(e) => format!("ELS {:?}", e.code()),
            PayloadRepr::Bls(b) => format!("BLS {:?}", b.r_ctl()),
            PayloadRepr::Ct(c) => format!("CT {:?}", c.preamble.command),
            PayloadRepr::FcpCmnd(_) => "FCP_CMND".into(),
            PayloadRepr::FcpXferRdy(_) => "FCP_XFER_RDY".into(),
            PayloadRepr::FcpRsp(_) => "FCP_RSP".into(),
            PayloadRepr::FcpData(_) => "FCP_DATA".into(),
            PayloadRepr::Raw(_) => "raw".into(),
        }
    }

    fn buffer_len(&self) -> usize {
        match self {
            PayloadRepr::Els(e) | PayloadRepr::Fc4LinkService(e) => e.buffer_len(),
            PayloadRepr::Bls(b) => b.buffer_len(),
            PayloadRepr::Ct(c) => c.buffer_len(),
            PayloadRepr::FcpCmnd(c) => c.buffer_len(),
            PayloadRepr::FcpXferRdy(x) => x.buffer_len(),
            PayloadRepr::FcpRsp(r) => r.buffer_len(),
            PayloadRepr::FcpData(d) | PayloadRepr::Raw(d) => d.len(),
        }
    }

    fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        match self {
            PayloadRepr::Els(e) | PayloadRepr::Fc4LinkService(e) => e.emit(buf),
            PayloadRepr::Bls(b) => b.emit(buf),
            PayloadRepr::Ct(c) => c.emit(buf),
            PayloadRepr::FcpCmnd(c) => c.emit(buf),
            PayloadRepr::FcpXferRdy(x) => x.emit(buf),
            PayloadRepr::FcpRsp(r) => r.emit(buf),
            PayloadRepr::FcpData(d) | PayloadRepr::Raw(d) => {
                super::check_len(buf, d.len())?;
                buf[..d.len()].copy_from_slice(d);
                Ok(())
            }
        }
    }
}

/// What a request was, so that its reply can be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Els(ElsCode),
    Ct(CtCommand),
}

/// Remembers open link-service requests per exchange, so that LS_ACC and
/// FS_ACC bodies (whose layout depends on the request) can be decoded.
/// Bounded: past 4096 open requests the oldest knowledge is dropped.
#[derive(Debug, Default)]
pub struct ReplyTracker {
    open: HashMap<(FcId, FcId, OxId), Pending>,
}

impl ReplyTracker {
    const LIMIT: usize = 4096;

    /// An empty tracker.
    pub fn new() -> ReplyTracker {
        ReplyTracker::default()
    }

    fn remember(&mut self, h: &FcHeaderRepr, p: Pending) {
        if self.open.len() >= Self::LIMIT {
            self.open.clear();
        }
        self.open.insert((h.s_id, h.d_id, h.ox_id), p);
    }

    fn answer(&mut self, h: &FcHeaderRepr) -> Option<Pending> {
        // A fabric login is answered to the newly assigned address.
        self.open
            .remove(&(h.d_id, h.s_id, h.ox_id))
            .or_else(|| self.open.remove(&(FcId::UNIDENTIFIED, h.s_id, h.ox_id)))
    }
}

/// A frame's parsed meaning: header, payload, and any bytes after what
/// the payload's structure covers (fill bytes, padding, extensions), kept
/// so that emit reproduces the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRepr {
    /// The header.
    pub header: FcHeaderRepr,
    /// The payload's meaning.
    pub payload: PayloadRepr,
    /// Bytes after the structure.
    pub trailer: Bytes,
}

impl FrameRepr {
    /// Parses header + payload (no delimiters, no CRC). With a tracker,
    /// replies to requests it has seen are decoded fully.
    pub fn parse(
        bytes: &Bytes,
        tracker: Option<&mut ReplyTracker>,
    ) -> Result<FrameRepr, WireError> {
        let v = FcFrame::new_checked(&bytes[..])?;
        let header = FcHeaderRepr::parse(&v.header());
        let payload = bytes.slice(HEADER_LEN..);
        let mut tracker = tracker;
        let parsed = if header.df_ctl != 0 {
            PayloadRepr::Raw(payload.clone())
        } else {
            match (header.fc_type, header.r_ctl) {
                (FcType::ELS, RCtl::ELS_REQUEST) => {
                    let e = ElsRepr::parse(&payload, None)?;
                    if let Some(t) = tracker.as_deref_mut() {
                        t.remember(&header, Pending::Els(e.code()));
                    }
                    PayloadRepr::Els(e)
                }
                (FcType::ELS, RCtl::ELS_REPLY) => {
                    let req = match tracker.as_deref_mut().and_then(|t| t.answer(&header)) {
                        Some(Pending::Els(c)) => Some(c),
                        _ => None,
                    };
                    PayloadRepr::Els(ElsRepr::parse(&payload, req)?)
                }
                (FcType::FCP, RCtl::FC4_LS_REQUEST) => {
                    let e = ElsRepr::parse(&payload, None)?;
                    if let Some(t) = tracker.as_deref_mut() {
                        t.remember(&header, Pending::Els(e.code()));
                    }
                    PayloadRepr::Fc4LinkService(e)
                }
                (FcType::FCP, RCtl::FC4_LS_REPLY) => {
                    let req = match tracker.as_deref_mut().and_then(|t| t.answer(&header)) {
                        Some(Pending::Els(c)) => Some(c),
                        _ => None,
                    };
                    PayloadRepr::Fc4LinkService(ElsRepr::parse(&payload, req)?)
                }
                (FcType::CT, RCtl::CT_REQUEST) => {
                    let c = CtIu::parse(&payload, None)?;
                    if let (Some(t), CtBody::Request(_)) = (tracker.as_deref_mut(), &c.body) {
                        t.remember(&header, Pending::Ct(c.preamble.command));
                    }
                    PayloadRepr::Ct(c)
                }
                (FcType::CT, RCtl::CT_REPLY) => {
                    let req = match tracker.and_then(|t| t.answer(&header)) {
                        Some(Pending::Ct(c)) => Some(c),
                        _ => None,
                    };
                    PayloadRepr::Ct(CtIu::parse(&payload, req)?)
                }
                (FcType::FCP, RCtl::FCP_CMND) => {
                    PayloadRepr::FcpCmnd(FcpCmndRepr::parse(&payload)?)
                }
                (FcType::FCP, RCtl::FCP_XFER_RDY) => PayloadRepr::FcpXferRdy(XferRdyRepr::parse(
                    &XferRdy::new_checked(&payload[..])?,
                )),
                (FcType::FCP, RCtl::FCP_RSP) => PayloadRepr::FcpRsp(FcpRspRepr::parse(&payload)?),
                (FcType::FCP, RCtl::FCP_DATA) => PayloadRepr::FcpData(payload.clone()),
                (_, r) if r.is_bls() => PayloadRepr::Bls(BlsRepr::parse(r, &payload)?),
                _ => PayloadRepr::Raw(payload.clone()),
            }
        };
        let used = parsed.buffer_len().min(payload.len());
        Ok(FrameRepr {
            header,
            payload: parsed,
            trailer: payload.slice(used..),
        })
    }

    /// Header + payload + trailer length.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.buffer_len() + self.trailer.len()
    }

    /// Writes header + payload + trailer.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        super::check_len(buf, n)?;
        self.header
            .emit(&mut FcHeader::new_unchecked(&mut buf[..HEADER_LEN]));
        let p = self.payload.buffer_len();
        self.payload.emit(&mut buf[HEADER_LEN..HEADER_LEN + p])?;
        buf[HEADER_LEN + p..n].copy_from_slice(&self.trailer);
        Ok(())
    }

    /// The frame as a new buffer.
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }

    /// A frame carrying `payload` with `header`, for the test and
    /// capture writers. Fill bytes are not added.
    pub fn new(header: FcHeaderRepr, payload: PayloadRepr) -> FrameRepr {
        FrameRepr {
            header,
            payload,
            trailer: Bytes::new(),
        }
    }
}
