//! A frame as FCIP puts it on a connection: encapsulation header and SOF,
//! the frame (its payload not copied), CRC and EOF. Shared by the tunnel and
//! RFC mode's fast path.

use bytes::{Bytes, BytesMut};
use unifab_fc::wire::frame::Frame;

use crate::wire::frame::FcipFrameRepr;

/// A frame as FCIP puts it on a connection: encapsulation header and SOF,
/// the frame (its payload not copied), CRC and EOF; and their length. Err:
/// the frame is too long for FCIP's length field (given back).
pub fn encode(f: Frame) -> Result<([Bytes; 3], usize), (Frame, crate::wire::WireError)> {
    let w = Wire::new(f)?;
    let n = w.len();
    Ok((
        [
            Bytes::copy_from_slice(&w.head),
            w.payload,
            Bytes::copy_from_slice(&w.tail),
        ],
        n,
    ))
}

/// A frame encoded for a connection, its header and trailer in place (no
/// allocation): encapsulation header, SOF and FC header; the payload;
/// CRC and EOF.
#[derive(Debug)]
pub struct Wire {
    /// Encapsulation header, SOF and FC header.
    pub head: [u8; crate::wire::ENCAP_LEN + 4 + unifab_fc::wire::header::HEADER_LEN],
    /// The payload, word-aligned (not copied unless it needed fill).
    pub payload: Bytes,
    /// CRC and EOF.
    pub tail: [u8; 8],
}

#[allow(clippy::len_without_is_empty)] // never empty: a header at least
impl Wire {
    /// Encodes `f`; Err: too long for FCIP's length field (given back).
    pub fn new(f: Frame) -> Result<Wire, (Frame, crate::wire::WireError)> {
        let r = FcipFrameRepr::new(word_aligned(f));
        match r.head_tail() {
            Ok((head, tail)) => Ok(Wire {
                head,
                payload: r.frame.payload,
                tail,
            }),
            Err(e) => Err((r.frame, e)),
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len() + self.tail.len()
    }

    /// The three parts, in order.
    pub fn parts(&self) -> [&[u8]; 3] {
        [&self.head, &self.payload, &self.tail]
    }
}

/// FCIP carries whole words: a payload that is not is padded with fill
/// bytes, counted in F_CTL as FC-FS wants.
pub fn word_aligned(mut f: Frame) -> Frame {
    let fill = (4 - f.payload.len() % 4) % 4;
    if fill != 0 {
        let mut p = BytesMut::with_capacity(f.payload.len() + fill);
        p.extend_from_slice(&f.payload);
        p.extend_from_slice(&[0u8; 3][..fill]);
        f.payload = p.freeze();
        f.header.f_ctl = f.header.f_ctl.with_fill_bytes(fill as u8);
    }
    f
}

/// Fill bytes of solicited data are not data: they are dropped again on
/// receive so the payload is exactly what the sender's FCP layer sent
/// ([`Frame::without_data_fill`]).
pub fn strip_data_fill(f: Frame) -> Frame {
    f.without_data_fill()
}
