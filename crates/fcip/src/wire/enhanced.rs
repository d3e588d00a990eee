//! unifab enhanced mode on the wire: batches of FC frames, carried as
//! ordinary FCIP-encapsulated FC frames of a vendor-unique TYPE, so the
//! stream stays valid FCIP (any RFC 3821 decoder, tshark included, sees
//! well-formed class 3 frames).
//!
//! A batch is one FC sequence of *fragments*: FC frames with TYPE
//! [`BATCH_TYPE`], R_CTL 0x04, D_ID = S_ID = FFFFFD, SEQ_CNT the fragment
//! index, SOFi3/SOFn3 and EOFn/EOFt. The first fragment's payload starts
//! with the 32-byte [`BatchHeader`]; the body (records, maybe
//! compressed) follows across the fragments, zero-padded to a word.
//!
//! Body records (after decompression), one per FC frame:
//! `len: u16, sof: u8, eof: u8, flags: u8, 3 reserved` then `len` bytes
//! of FC header and payload. Record flag [`RECORD_FASTWRITE`] marks an
//! FCP_CMND whose initiator already got a proxy XFER_RDY, [`RECORD_TAPE`]
//! one that tape pipelining answered for; [`RECORD_AHEAD`],
//! [`RECORD_HIT`] and [`RECORD_STREAM`] mark tape read-ahead's frames.

use bytes::{BufMut, Bytes, BytesMut};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, HEADER_LEN, RCtl};
use unifab_fc::wire::{Eof, FcHeaderRepr, FcId, OxId, RxId, Sof};

use super::{WireError, be};

/// The FC TYPE of batch fragments (vendor unique range).
pub const BATCH_TYPE: FcType = FcType(0xee);
/// Batch header length.
pub const BATCH_HEADER_LEN: usize = 32;
/// Record header length.
pub const RECORD_HEADER_LEN: usize = 8;
/// Largest fragment payload (an FC frame's data field).
pub const MAX_FRAGMENT: usize = 2112;
/// Record flag: FCP_CMND accelerated by FastWrite.
pub const RECORD_FASTWRITE: u8 = 0x01;
/// Record flag: FCP_CMND to a tape answered by tape pipelining
/// (`proto::tape`): the far side sends it to the drive in turn.
pub const RECORD_TAPE: u8 = 0x02;
/// Record flag, toward the host: a frame of a read ahead
/// (`proto::tape::ahead`), its FCP_CMND, FCP_DATA or FCP_RSP.
pub const RECORD_AHEAD: u8 = 0x04;
/// Record flag, toward the drive: a READ(6) answered from what was read
/// ahead; the far side does not send it to the drive.
pub const RECORD_HIT: u8 = 0x08;
/// Record flag, toward the drive: a READ(6) that starts a stream to read
/// ahead.
pub const RECORD_STREAM: u8 = 0x10;
const MAGIC: [u8; 3] = *b"ufb";
const VERSION: u8 = 1;

/// What a batch carries. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchKind(pub u8);

impl BatchKind {
    /// FC frames, sequenced.
    pub const DATA: BatchKind = BatchKind(0);
    /// An acknowledgement / heartbeat; no body, not sequenced.
    pub const CONTROL: BatchKind = BatchKind(1);
    /// Capability hello (body: [`Hello`]), not sequenced.
    pub const HELLO: BatchKind = BatchKind(2);
}

/// Body compression. Open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Codec(pub u8);

impl Codec {
    /// Raw.
    pub const NONE: Codec = Codec(0);
    /// LZ4 block.
    pub const LZ4: Codec = Codec(1);
    /// Zstandard frame.
    pub const ZSTD: Codec = Codec(2);
}

/// The batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchHeader {
    /// Kind.
    pub kind: u8,
    /// Body compression.
    pub codec: Codec,
    /// Flags (bit 0: a retransmission).
    pub flags: u16,
    /// Sequence number (data batches; from 1).
    pub seq: u64,
    /// Cumulative acknowledgement: every data batch up to this one was
    /// delivered.
    pub ack: u64,
    /// Body length before compression.
    pub raw_len: u32,
    /// Body length on the wire (after compression, before padding).
    pub wire_len: u32,
}

/// Flag: this batch was sent before on another circuit.
pub const FLAG_RETRANSMIT: u16 = 0x0001;

impl BatchHeader {
    /// Parses the first 32 bytes of a first fragment.
    pub fn parse(b: &[u8]) -> Result<BatchHeader, WireError> {
        super::check_len(b, BATCH_HEADER_LEN)?;
        if b[..3] != MAGIC || b[3] != VERSION {
            return Err(WireError::InvalidField("batch magic/version"));
        }
        let h = BatchHeader {
            kind: b[4],
            codec: Codec(b[5]),
            flags: be::u16_at(b, 6),
            seq: be::u64_at(b, 8),
            ack: be::u64_at(b, 16),
            raw_len: be::u32_at(b, 24),
            wire_len: be::u32_at(b, 28),
        };
        if h.codec == Codec::NONE && h.raw_len != h.wire_len {
            return Err(WireError::BadLength {
                what: "uncompressed batch",
                len: h.wire_len as usize,
            });
        }
        Ok(h)
    }

    /// Writes the 32 bytes.
    pub fn emit(&self, out: &mut BytesMut) {
        out.put_slice(&MAGIC);
        out.put_u8(VERSION);
        out.put_u8(self.kind);
        out.put_u8(self.codec.0);
        out.put_u16(self.flags);
        out.put_u64(self.seq);
        out.put_u64(self.ack);
        out.put_u32(self.raw_len);
        out.put_u32(self.wire_len);
    }
}

/// The capability hello both unifab ends send once on the class F
/// connection (enhanced mode is agreed when both send one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hello {
    /// Capability bits (see `fsf::Capabilities`).
    pub capabilities: u8,
    /// FastWrite wanted on this tunnel.
    pub fastwrite: bool,
    /// Accelerated exchanges the sender can hold.
    pub fastwrite_table: u16,
    /// Largest write (bytes) the sender accelerates or holds.
    pub fastwrite_max_bytes: u32,
}

impl Hello {
    /// Encodes the 8-byte body.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.capabilities;
        b[1] = u8::from(self.fastwrite);
        b[2..4].copy_from_slice(&self.fastwrite_table.to_be_bytes());
        b[4..8].copy_from_slice(&self.fastwrite_max_bytes.to_be_bytes());
        b
    }

    /// Parses the body.
    pub fn parse(b: &[u8]) -> Result<Hello, WireError> {
        super::check_len(b, 8)?;
        Ok(Hello {
            capabilities: b[0],
            fastwrite: b[1] & 1 != 0,
            fastwrite_table: be::u16_at(b, 2),
            fastwrite_max_bytes: be::u32_at(b, 4),
        })
    }
}

/// Appends a record for `frame` to a body under construction.
pub fn put_record(body: &mut BytesMut, frame: &Frame, flags: u8) {
    let len = frame.len();
    body.put_u16(u16::try_from(len).unwrap_or(0));
    body.put_u8(frame.sof.0);
    body.put_u8(frame.eof.0);
    body.put_u8(flags);
    body.put_bytes(0, 3);
    body.put_slice(&frame.header.to_bytes());
    body.put_slice(&frame.payload);
}

/// Splits a body into its frames (payloads are slices of `body`).
pub fn records(body: &Bytes) -> Result<Vec<(Frame, u8)>, WireError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let rest = &body[at..];
        super::check_len(rest, RECORD_HEADER_LEN)?;
        let len = usize::from(be::u16_at(rest, 0));
        if !(HEADER_LEN..=HEADER_LEN + unifab_fc::wire::MAX_PAYLOAD).contains(&len) {
            return Err(WireError::BadLength {
                what: "batch record",
                len,
            });
        }
        super::check_len(rest, RECORD_HEADER_LEN + len)?;
        let (sof, eof, flags) = (Sof(rest[2]), Eof(rest[3]), rest[4]);
        if !sof.is_valid() || !eof.is_valid() {
            return Err(WireError::Delimiter("record"));
        }
        let start = at + RECORD_HEADER_LEN;
        let f = Frame::parse(body.slice(start..start + len), sof, eof).map_err(WireError::Fc)?;
        out.push((f, flags));
        at = start + len;
    }
    Ok(out)
}

/// The FC frames (fragments) that carry one batch: `header` then `body`
/// (already compressed as `header.codec` says).
pub fn fragments(header: &BatchHeader, body: &Bytes) -> Vec<Frame> {
    let mut first = BytesMut::with_capacity(MAX_FRAGMENT);
    header.emit(&mut first);
    let take = body.len().min(MAX_FRAGMENT - BATCH_HEADER_LEN);
    first.put_slice(&body[..take]);
    let mut payloads = vec![first];
    let mut at = take;
    while at < body.len() {
        let n = (body.len() - at).min(MAX_FRAGMENT);
        let mut p = BytesMut::with_capacity(n + 3);
        p.put_slice(&body[at..at + n]);
        payloads.push(p);
        at += n;
    }
    let count = payloads.len();
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            while p.len() % 4 != 0 {
                p.put_u8(0);
            }
            let last = i + 1 == count;
            let mut f = FCtl(0);
            if i == 0 {
                f.0 |= FCtl::FIRST_SEQUENCE;
            }
            if last {
                f.0 |= FCtl::END_SEQUENCE | FCtl::SEQUENCE_INITIATIVE;
            }
            let h = FcHeaderRepr {
                r_ctl: RCtl::UNSOLICITED_DATA,
                d_id: FcId::FABRIC_CONTROLLER,
                s_id: FcId::FABRIC_CONTROLLER,
                fc_type: BATCH_TYPE,
                f_ctl: f,
                seq_id: header.seq as u8,
                seq_cnt: u16::try_from(i).unwrap_or(u16::MAX),
                ox_id: OxId((header.seq >> 8) as u16),
                rx_id: RxId::UNASSIGNED,
                parameter: header.kind.into(),
                ..FcHeaderRepr::default()
            };
            Frame {
                sof: if i == 0 { Sof::I3 } else { Sof::N3 },
                eof: if last { Eof::T } else { Eof::N },
                header: h,
                payload: p.freeze(),
            }
        })
        .collect()
}

/// Whether an FC frame is a batch fragment.
pub fn is_fragment(h: &FcHeaderRepr) -> bool {
    h.fc_type == BATCH_TYPE && h.r_ctl == RCtl::UNSOLICITED_DATA
}

/// Reassembles one batch from its fragments, in order, as they come off
/// one circuit.
#[derive(Debug, Default)]
pub struct Reassembly {
    header: Option<BatchHeader>,
    body: BytesMut,
    next: u16,
}

/// Largest body a batch may carry on the wire.
pub const MAX_BATCH_BODY: usize = 1 << 20;

impl Reassembly {
    /// Takes the next fragment; returns the header and the (still
    /// compressed) body when the batch is complete.
    pub fn push(&mut self, f: &Frame) -> Result<Option<(BatchHeader, Bytes)>, WireError> {
        let p = &f.payload[..];
        let data = if f.header.seq_cnt == 0 {
            if self.header.is_some() {
                return Err(WireError::InvalidField("batch started inside a batch"));
            }
            let h = BatchHeader::parse(p)?;
            if h.wire_len as usize > MAX_BATCH_BODY || h.raw_len as usize > 4 * MAX_BATCH_BODY {
                return Err(WireError::BadLength {
                    what: "batch body",
                    len: h.wire_len as usize,
                });
            }
            self.header = Some(h);
            self.body.clear();
            self.next = 1;
            &p[BATCH_HEADER_LEN..]
        } else {
            if self.header.is_none() || f.header.seq_cnt != self.next {
                return Err(WireError::InvalidField("batch fragment out of order"));
            }
            self.next = self.next.wrapping_add(1);
            p
        };
        let Some(h) = self.header else {
            return Err(WireError::InvalidField("batch fragment without a start"));
        };
        let want = h.wire_len as usize - self.body.len().min(h.wire_len as usize);
        let take = data.len().min(want);
        let pad = &data[take..];
        if pad.len() > 3 || pad.iter().any(|&b| b != 0) {
            return Err(WireError::BadLength {
                what: "batch fragment",
                len: data.len(),
            });
        }
        self.body.extend_from_slice(&data[..take]);
        let end = f.header.f_ctl.end_sequence();
        if end {
            self.header = None;
            if self.body.len() != h.wire_len as usize {
                return Err(WireError::BadLength {
                    what: "batch body",
                    len: self.body.len(),
                });
            }
            return Ok(Some((h, self.body.split().freeze())));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_many_frames_round_trips() {
        let mut body = BytesMut::new();
        let mut frames = Vec::new();
        for i in 0..5u8 {
            let h = FcHeaderRepr {
                d_id: FcId::new(0x020100),
                s_id: FcId::new(0x010100),
                ox_id: OxId(u16::from(i)),
                ..FcHeaderRepr::default()
            };
            let f = Frame::new(h, Bytes::from(vec![i; 2048]));
            put_record(&mut body, &f, i & 1);
            frames.push(f);
        }
        let body = body.freeze();
        let hdr = BatchHeader {
            kind: BatchKind::DATA.0,
            seq: 77,
            ack: 5,
            raw_len: body.len() as u32,
            wire_len: body.len() as u32,
            ..BatchHeader::default()
        };
        let frags = fragments(&hdr, &body);
        assert!(frags.len() >= 5);
        let mut r = Reassembly::default();
        let mut done = None;
        for f in &frags {
            assert!(f.payload.len() <= MAX_FRAGMENT && f.payload.len() % 4 == 0);
            assert!(is_fragment(&f.header));
            if let Some(x) = r.push(f).unwrap() {
                done = Some(x);
            }
        }
        let (h, b) = done.unwrap();
        assert_eq!(h, hdr);
        let recs = records(&b).unwrap();
        assert_eq!(recs.len(), 5);
        for (i, (f, fl)) in recs.iter().enumerate() {
            assert_eq!(f, &frames[i]);
            assert_eq!(*fl, (i as u8) & 1);
        }
    }

    #[test]
    fn out_of_order_fragments_are_refused() {
        let body = Bytes::from(vec![0u8; 5000]);
        let hdr = BatchHeader {
            raw_len: 5000,
            wire_len: 5000,
            ..BatchHeader::default()
        };
        let frags = fragments(&hdr, &body);
        let mut r = Reassembly::default();
        r.push(&frags[0]).unwrap();
        assert!(r.push(&frags[2]).is_err());
        let mut r = Reassembly::default();
        assert!(r.push(&frags[1]).is_err());
    }

    #[test]
    fn hello_round_trips() {
        let h = Hello {
            capabilities: 0x0f,
            fastwrite: true,
            fastwrite_table: 2048,
            fastwrite_max_bytes: 1 << 20,
        };
        assert_eq!(Hello::parse(&h.to_bytes()).unwrap(), h);
    }
}
