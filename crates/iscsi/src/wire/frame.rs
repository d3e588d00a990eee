//! Finding PDU boundaries in a byte stream and verifying digests.
//!
//! [`Framer::decode`] looks at the first 48 bytes (cheap `check`), and only
//! when a whole PDU is buffered splits it off the `BytesMut` as frozen
//! `Bytes` slices: no payload copy. [`encode_header`] builds the
//! BHS + AHS + header digest block a sender writes before the data slices.

use bytes::{Buf, Bytes, BytesMut};

use super::WireError;
use super::bhs::{BHS_LEN, Bhs};
use super::digest;
use super::pdu::Pdu;

/// The largest DataSegmentLength the wire format can carry (2^24 − 1).
pub const MAX_DATA_SEGMENT_LENGTH: u32 = 0x00ff_ffff;

/// A whole received PDU with digests verified and stripped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PduFrame {
    /// The 48 BHS bytes.
    pub bhs: Bytes,
    /// The AHS segment (TotalAHSLength × 4 bytes).
    pub ahs: Bytes,
    /// The data segment, DataSegmentLength bytes, padding removed.
    pub data: Bytes,
}

impl PduFrame {
    /// A view of the BHS.
    pub fn header(&self) -> Bhs<&[u8]> {
        Bhs::new_unchecked(&self.bhs[..])
    }

    /// Parses the BHS.
    pub fn parse(&self) -> Result<Pdu, WireError> {
        Pdu::parse(&Bhs::new_checked(&self.bhs[..])?)
    }
}

/// Digest settings of a connection (both off during login).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    /// HeaderDigest=CRC32C.
    pub header: bool,
    /// DataDigest=CRC32C.
    pub data: bool,
}

impl core::fmt::Display for Digests {
    /// `header=CRC32C,data=None`: the negotiated keys' values.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let n = |b: bool| if b { "CRC32C" } else { "None" };
        write!(f, "header={},data={}", n(self.header), n(self.data))
    }
}

/// Splits PDUs off a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    /// Active digests.
    pub digests: Digests,
    /// Largest data segment accepted: our declared
    /// MaxRecvDataSegmentLength (8192 during login, RFC 7143 §13.12).
    pub max_data_segment_length: u32,
}

impl Default for Framer {
    fn default() -> Self {
        Framer {
            digests: Digests::default(),
            max_data_segment_length: 8192,
        }
    }
}

/// What [`Framer::check`] found at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A whole PDU of this many bytes is buffered.
    Complete(usize),
    /// This many bytes in all are needed (at least).
    Incomplete(usize),
}

impl Framer {
    /// Total on-wire length of the PDU whose BHS is `bhs`, digests and
    /// padding included, after checking it against the limits.
    pub fn pdu_len(&self, bhs: &Bhs<&[u8]>) -> Result<usize, WireError> {
        if bhs.reserved_bit7() {
            return Err(WireError::ReservedBitSet);
        }
        let dsl = bhs.data_segment_length();
        if dsl > self.max_data_segment_length {
            return Err(WireError::DataSegmentTooLong {
                len: dsl,
                max: self.max_data_segment_length,
            });
        }
        let mut len = BHS_LEN + bhs.ahs_len();
        if self.digests.header {
            len += 4;
        }
        if dsl > 0 {
            len += (dsl as usize).next_multiple_of(4);
            if self.digests.data {
                len += 4;
            }
        }
        Ok(len)
    }

    /// Looks at the front of `buf` without consuming anything.
    pub fn check(&self, buf: &[u8]) -> Result<Check, WireError> {
        if buf.len() < BHS_LEN {
            return Ok(Check::Incomplete(BHS_LEN));
        }
        let len = self.pdu_len(&Bhs::new_unchecked(&buf[..BHS_LEN]))?;
        if buf.len() < len {
            Ok(Check::Incomplete(len))
        } else {
            Ok(Check::Complete(len))
        }
    }

    /// Splits one whole PDU off the front of `buf`, or returns `Ok(None)`
    /// when more bytes are needed.
    ///
    /// A header digest error or an over-long data segment is fatal for the
    /// connection (the stream cannot be trusted). A data digest error
    /// consumes the PDU and returns [`WireError::DataDigest`] carrying the
    /// header, so the caller can Reject it (RFC 7143 §7.8).
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<PduFrame>, WireError> {
        let len = match self.check(buf)? {
            Check::Incomplete(_) => return Ok(None),
            Check::Complete(len) => len,
        };
        let ahs_len = usize::from(buf[4]) * 4;
        let dsl = {
            let b = &buf[5..8];
            u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize
        };
        if self.digests.header {
            let at = BHS_LEN + ahs_len;
            let got = digest::from_wire([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            let want = digest::crc32c(&buf[..at]);
            if got != want {
                return Err(WireError::HeaderDigest {
                    expected: want,
                    got,
                });
            }
        }
        let mut pdu = buf.split_to(len).freeze();
        let bhs = pdu.split_to(BHS_LEN);
        let ahs = pdu.split_to(ahs_len);
        if self.digests.header {
            pdu.advance(4);
        }
        let padded = dsl.next_multiple_of(4);
        let data = pdu.slice(..dsl);
        if self.digests.data && dsl > 0 {
            let d = &pdu[padded..padded + 4];
            let got = digest::from_wire([d[0], d[1], d[2], d[3]]);
            let want = digest::crc32c(&pdu[..padded]);
            if got != want {
                return Err(WireError::DataDigest {
                    bhs,
                    expected: want,
                    got,
                });
            }
        }
        Ok(Some(PduFrame { bhs, ahs, data }))
    }
}

/// The header block a sender writes: BHS, AHS, and the header digest when
/// enabled. At most 48 + 1020 + 4 bytes.
#[derive(Clone)]
pub struct HeaderBlock {
    buf: [u8; BHS_LEN + 4],
    len: usize,
    ahs: Option<Bytes>,
}

impl std::fmt::Debug for HeaderBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderBlock")
            .field("bhs", &&self.buf[..BHS_LEN])
            .field("len", &self.len)
            .finish()
    }
}

impl HeaderBlock {
    /// The BHS (+ digest when there is no AHS), as one slice.
    pub fn bhs_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The AHS segment and its trailing header digest, if the PDU has AHS.
    pub fn ahs(&self) -> Option<&Bytes> {
        self.ahs.as_ref()
    }

    /// All header bytes as one owned buffer (tests, captures).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.bhs_bytes().to_vec();
        if let Some(a) = &self.ahs {
            v.extend_from_slice(a);
        }
        v
    }
}

/// Encodes a PDU header for sending. `ahs` must be a multiple of 4 bytes
/// and at most 1020; `data_len` at most [`MAX_DATA_SEGMENT_LENGTH`].
pub fn encode_header(
    pdu: &Pdu,
    ahs: &[u8],
    data_len: u32,
    header_digest: bool,
) -> Result<HeaderBlock, WireError> {
    if !ahs.len().is_multiple_of(4) || ahs.len() > 255 * 4 {
        return Err(WireError::BadAhs(
            "AHS length not a multiple of 4 or over 1020",
        ));
    }
    if data_len > MAX_DATA_SEGMENT_LENGTH {
        return Err(WireError::DataSegmentTooLong {
            len: data_len,
            max: MAX_DATA_SEGMENT_LENGTH,
        });
    }
    let mut buf = [0u8; BHS_LEN + 4];
    pdu.emit(
        &mut Bhs::new_unchecked(&mut buf[..BHS_LEN]),
        (ahs.len() / 4) as u8,
        data_len,
    );
    if ahs.is_empty() {
        let mut len = BHS_LEN;
        if header_digest {
            let d = digest::to_wire(digest::crc32c(&buf[..BHS_LEN]));
            buf[BHS_LEN..BHS_LEN + 4].copy_from_slice(&d);
            len += 4;
        }
        Ok(HeaderBlock {
            buf,
            len: BHS_LEN,
            ahs: None,
        }
        .with_len(len))
    } else {
        let mut tail = Vec::with_capacity(ahs.len() + 4);
        tail.extend_from_slice(ahs);
        if header_digest {
            let crc = digest::crc32c_append(digest::crc32c(&buf[..BHS_LEN]), ahs);
            tail.extend_from_slice(&digest::to_wire(crc));
        }
        Ok(HeaderBlock {
            buf,
            len: BHS_LEN,
            ahs: Some(Bytes::from(tail)),
        })
    }
}

impl HeaderBlock {
    fn with_len(mut self, len: usize) -> Self {
        self.len = len;
        self
    }
}

/// Padding bytes (0–3) after a data segment of `len` bytes.
pub fn padding(len: usize) -> &'static [u8] {
    &[0u8; 3][..(4 - len % 4) % 4]
}

/// Encodes a whole PDU into one contiguous buffer (login, text, tests —
/// the data path writes header and data slices vectored instead).
pub fn encode_pdu(
    pdu: &Pdu,
    ahs: &[u8],
    data: &[u8],
    digests: Digests,
) -> Result<Vec<u8>, WireError> {
    let data_len = u32::try_from(data.len()).map_err(|_| WireError::DataSegmentTooLong {
        len: u32::MAX,
        max: MAX_DATA_SEGMENT_LENGTH,
    })?;
    let hdr = encode_header(pdu, ahs, data_len, digests.header)?;
    let mut v = hdr.to_vec();
    if !data.is_empty() {
        v.extend_from_slice(data);
        v.extend_from_slice(padding(data.len()));
        if digests.data {
            v.extend_from_slice(&digest::to_wire(digest::data_digest([data])));
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pdu::{DataOut, NopOut, RejectReason};

    fn data_out(len: usize) -> (Pdu, Vec<u8>) {
        let pdu = Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 1,
            ttt: 2,
            exp_stat_sn: 3,
            data_sn: 0,
            buffer_offset: 0,
        });
        (pdu, (0..len).map(|i| i as u8).collect())
    }

    #[test]
    fn frames_with_and_without_digests() {
        for digests in [
            Digests::default(),
            Digests {
                header: true,
                data: false,
            },
            Digests {
                header: true,
                data: true,
            },
            Digests {
                header: false,
                data: true,
            },
        ] {
            let framer = Framer {
                digests,
                max_data_segment_length: 8192,
            };
            for len in [0usize, 1, 3, 4, 5, 511, 8192] {
                let (pdu, data) = data_out(len);
                let ahs = [0u8, 5, 1, 0, 1, 2, 3, 4, 5, 0, 0, 0];
                let wire = encode_pdu(&pdu, &ahs, &data, digests).unwrap();
                let mut buf = BytesMut::new();
                // Byte-at-a-time arrival never yields a frame early.
                for (i, b) in wire.iter().enumerate() {
                    assert!(framer.decode(&mut buf).unwrap().is_none(), "early at {i}");
                    buf.extend_from_slice(&[*b]);
                }
                buf.extend_from_slice(&wire); // a second PDU behind it
                let f = framer.decode(&mut buf).unwrap().unwrap();
                assert_eq!(f.parse().unwrap(), pdu);
                assert_eq!(&f.ahs[..], &ahs[..]);
                assert_eq!(&f.data[..], &data[..]);
                assert_eq!(buf.len(), wire.len());
                assert!(framer.decode(&mut buf).unwrap().is_some());
                assert!(buf.is_empty());
            }
        }
    }

    #[test]
    fn digest_errors() {
        let digests = Digests {
            header: true,
            data: true,
        };
        let framer = Framer {
            digests,
            max_data_segment_length: 8192,
        };
        let (pdu, data) = data_out(100);
        let wire = encode_pdu(&pdu, &[], &data, digests).unwrap();

        let mut bad_hdr = wire.clone();
        bad_hdr[20] ^= 1;
        let err = framer
            .decode(&mut BytesMut::from(&bad_hdr[..]))
            .unwrap_err();
        assert!(matches!(err, WireError::HeaderDigest { .. }));
        assert_eq!(err.reject_reason(), None);

        let mut bad_data = wire.clone();
        bad_data[60] ^= 1;
        let mut buf = BytesMut::from(&bad_data[..]);
        let err = framer.decode(&mut buf).unwrap_err();
        match &err {
            WireError::DataDigest { bhs, .. } => assert_eq!(&bhs[..], &wire[..48]),
            other => panic!("{other:?}"),
        }
        assert!(buf.is_empty(), "a data digest error consumes the PDU");
        assert_eq!(err.reject_reason(), Some(RejectReason::DATA_DIGEST_ERROR));
    }

    #[test]
    fn limits() {
        let framer = Framer {
            digests: Digests::default(),
            max_data_segment_length: 8192,
        };
        let (pdu, data) = data_out(8193);
        let wire = encode_pdu(&pdu, &[], &data, Digests::default()).unwrap();
        assert_eq!(
            framer.decode(&mut BytesMut::from(&wire[..48])).unwrap_err(),
            WireError::DataSegmentTooLong {
                len: 8193,
                max: 8192
            }
        );
        let mut nop = encode_pdu(
            &Pdu::NopOut(NopOut::default()),
            &[],
            &[],
            Digests::default(),
        )
        .unwrap();
        nop[0] |= 0x80;
        assert_eq!(
            framer.decode(&mut BytesMut::from(&nop[..])).unwrap_err(),
            WireError::ReservedBitSet
        );
        assert!(encode_header(&pdu, &[0; 3], 0, false).is_err());
        assert!(encode_header(&pdu, &[], MAX_DATA_SEGMENT_LENGTH + 1, false).is_err());
    }
}
