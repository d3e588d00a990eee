//! A whole encapsulated frame (RFC 3643 §5, RFC 3821 §5.6): the
//! encapsulation header, the SOF word (`SOF SOF ~SOF ~SOF`), the FC frame
//! header and payload, the FC CRC, and the EOF word (`EOF EOF ~EOF ~EOF`).

use bytes::Bytes;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::HEADER_LEN;
use unifab_fc::wire::{Eof, FcHeader, FcHeaderRepr, Sof};

use super::WireError;
use super::encap::{ENCAP_LEN, EncapHeader, EncapRepr};

/// Bytes an encapsulated frame adds around header + payload: header 28,
/// SOF word 4, CRC 4, EOF word 4.
pub const OVERHEAD: usize = ENCAP_LEN + 12;
/// Largest encapsulated frame in bytes (544 words).
pub const MAX_FRAME_LEN: usize = 544 * 4;

/// The four bytes of a delimiter word: `d d ~d ~d`.
pub const fn delimiter_word(d: u8) -> [u8; 4] {
    [d, d, !d, !d]
}

/// The code of a delimiter word, if the word is well formed.
pub fn parse_delimiter_word(w: &[u8]) -> Option<u8> {
    match w {
        [a, b, c, d] if a == b && *c == !*a && *d == !*a => Some(*a),
        _ => None,
    }
}

/// A zero-copy view of one encapsulated frame (exactly Frame Length
/// words long).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcipFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcipFrame<T> {
    /// Wraps a buffer holding exactly one encapsulated frame: the header
    /// must pass its checks, its Frame Length must match the buffer, and
    /// there must be room for the SOF word, an FC header, CRC and EOF.
    /// Delimiters and CRCs are checked by [`FcipFrame::check`].
    pub fn new_checked(buffer: T) -> Result<FcipFrame<T>, WireError> {
        let b = buffer.as_ref();
        let h = EncapHeader::new_checked(b)?;
        h.check()?;
        let n = usize::from(h.frame_len()) * 4;
        if b.len() != n {
            return Err(WireError::Truncated {
                needed: n,
                got: b.len(),
            });
        }
        if h.pflags().special() {
            return Err(WireError::InvalidField(
                "special frame where a data frame was expected",
            ));
        }
        if n < OVERHEAD + HEADER_LEN {
            return Err(WireError::FrameLength(h.frame_len()));
        }
        Ok(FcipFrame { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The encapsulation header.
    pub fn encap(&self) -> EncapHeader<&[u8]> {
        EncapHeader::new_unchecked(&self.b()[..ENCAP_LEN])
    }

    /// The SOF word.
    pub fn sof_word(&self) -> &[u8] {
        &self.b()[ENCAP_LEN..ENCAP_LEN + 4]
    }

    /// The SOF code (first byte of the SOF word).
    pub fn sof(&self) -> Sof {
        Sof(self.b()[ENCAP_LEN])
    }

    /// FC header and payload.
    pub fn fc_bytes(&self) -> &[u8] {
        let n = self.b().len();
        &self.b()[ENCAP_LEN + 4..n - 8]
    }

    /// The FC header.
    pub fn fc_header(&self) -> FcHeader<&[u8]> {
        FcHeader::new_unchecked(&self.fc_bytes()[..HEADER_LEN])
    }

    /// The FC CRC as carried (least significant byte first on the wire).
    pub fn fc_crc(&self) -> u32 {
        let n = self.b().len();
        let c = &self.b()[n - 8..n - 4];
        u32::from_le_bytes([c[0], c[1], c[2], c[3]])
    }

    /// The EOF word.
    pub fn eof_word(&self) -> &[u8] {
        let n = self.b().len();
        &self.b()[n - 4..]
    }

    /// The EOF code.
    pub fn eof(&self) -> Eof {
        let n = self.b().len();
        Eof(self.b()[n - 4])
    }

    /// Checks the delimiter words (RFC 3821 §5.6.2.2: a valid EOF is
    /// mandatory; SOF is one of the optional checks) and, if `crc`, the FC
    /// CRC (another optional check).
    pub fn check(&self, crc: bool) -> Result<(), WireError> {
        match parse_delimiter_word(self.sof_word()) {
            Some(s) if Sof(s).is_valid() => {}
            _ => return Err(WireError::Delimiter("SOF")),
        }
        match parse_delimiter_word(self.eof_word()) {
            Some(e) if Eof(e).is_valid() => {}
            _ => return Err(WireError::Delimiter("EOF")),
        }
        if crc {
            let computed = crc32fast::hash(self.fc_bytes());
            if computed != self.fc_crc() {
                return Err(WireError::FcCrc {
                    computed,
                    received: self.fc_crc(),
                });
            }
        }
        Ok(())
    }
}

impl FcipFrame<Bytes> {
    /// The FC frame inside, its payload a slice of this buffer.
    pub fn to_fc_frame(&self) -> Result<Frame, WireError> {
        let n = self.buffer.len();
        let fc = self.buffer.slice(ENCAP_LEN + 4..n - 8);
        Frame::parse(fc, self.sof(), self.eof()).map_err(WireError::Fc)
    }
}

/// An encapsulated FC frame: the header fields that vary and the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FcipFrameRepr {
    /// Encapsulation header fields (Frame Length is recomputed on emit).
    pub encap: EncapRepr,
    /// The FC frame with its delimiters.
    pub frame: Frame,
}

impl FcipFrameRepr {
    /// Wraps a frame with a plain header (no CRCV, no timestamp).
    pub fn new(frame: Frame) -> FcipFrameRepr {
        let mut encap = EncapRepr::for_len(frame.len() + OVERHEAD);
        encap.frame_len = u16::try_from((frame.len() + OVERHEAD).div_ceil(4)).unwrap_or(0);
        FcipFrameRepr { encap, frame }
    }

    /// Parses and checks a whole frame (delimiters and FC CRC included).
    pub fn parse(buf: &Bytes) -> Result<FcipFrameRepr, WireError> {
        let v = FcipFrame::new_checked(buf.clone())?;
        v.check(true)?;
        let encap = EncapRepr::parse(&v.encap())?;
        Ok(FcipFrameRepr {
            encap,
            frame: v.to_fc_frame()?,
        })
    }

    /// Encoded length. FC payloads are whole words (fill bytes are part
    /// of the payload), so this is a multiple of 4 for valid frames.
    pub fn buffer_len(&self) -> usize {
        self.frame.len() + OVERHEAD
    }

    /// Writes the frame into `buf` (exactly [`FcipFrameRepr::buffer_len`]
    /// bytes). Frame Length is set from the length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let n = self.buffer_len();
        if buf.len() != n || !n.is_multiple_of(4) || n > MAX_FRAME_LEN {
            return Err(WireError::FrameLength(
                u16::try_from(n / 4).unwrap_or(u16::MAX),
            ));
        }
        let mut e = self.encap;
        e.frame_len = u16::try_from(n / 4).unwrap_or(0);
        e.emit(&mut EncapHeader::new_unchecked(&mut buf[..ENCAP_LEN]));
        buf[ENCAP_LEN..ENCAP_LEN + 4].copy_from_slice(&delimiter_word(self.frame.sof.0));
        let hdr = self.frame.header.to_bytes();
        let p = ENCAP_LEN + 4;
        buf[p..p + HEADER_LEN].copy_from_slice(&hdr);
        buf[p + HEADER_LEN..n - 8].copy_from_slice(&self.frame.payload);
        let crc = self.frame.crc();
        buf[n - 8..n - 4].copy_from_slice(&crc.to_le_bytes());
        buf[n - 4..].copy_from_slice(&delimiter_word(self.frame.eof.0));
        Ok(())
    }

    /// The header words in front of the payload (encapsulation header,
    /// SOF word, FC header) and the trailer (CRC, EOF word), so a sender
    /// can write `head`, the payload `Bytes` and `tail` as one vectored
    /// write without copying the payload.
    pub fn head_tail(&self) -> Result<([u8; ENCAP_LEN + 4 + HEADER_LEN], [u8; 8]), WireError> {
        let n = self.buffer_len();
        if !n.is_multiple_of(4) || n > MAX_FRAME_LEN {
            return Err(WireError::FrameLength(
                u16::try_from(n / 4).unwrap_or(u16::MAX),
            ));
        }
        let mut head = [0u8; ENCAP_LEN + 4 + HEADER_LEN];
        let mut e = self.encap;
        e.frame_len = u16::try_from(n / 4).unwrap_or(0);
        e.emit(&mut EncapHeader::new_unchecked(&mut head[..ENCAP_LEN]));
        head[ENCAP_LEN..ENCAP_LEN + 4].copy_from_slice(&delimiter_word(self.frame.sof.0));
        head[ENCAP_LEN + 4..].copy_from_slice(&self.frame.header.to_bytes());
        let mut tail = [0u8; 8];
        tail[..4].copy_from_slice(&self.frame.crc().to_le_bytes());
        tail[4..].copy_from_slice(&delimiter_word(self.frame.eof.0));
        Ok((head, tail))
    }

    /// The FC header.
    pub fn header(&self) -> &FcHeaderRepr {
        &self.frame.header
    }

    /// The whole frame as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}
