//! The FCoE encapsulation (FC-BB-6 §7.5): after the EtherType 0x8906 come
//! a 14-byte header (4-bit version, 100 reserved bits, the SOF code), the
//! FC frame (header and payload), and an 8-byte trailer (the FC CRC,
//! transmitted least significant byte first as on an FC link, the EOF
//! code, 3 reserved bytes).
//!
//! An FCoE frame is never shorter than the 60-byte Ethernet minimum (the
//! 24-byte FC header alone brings it there), so it needs no padding; the
//! encoder pads anyway if asked to write something shorter. Frames are
//! bounded by the 2,500-byte "baby jumbo" FCoE links are configured for.

use bytes::Bytes;
use unifab_fc::wire::crc::{fc_crc, fc_crc_parts};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{Eof, HEADER_LEN as FC_HEADER_LEN, Sof};

use super::ethernet::EthernetRepr;
use super::{MIN_ETHERNET_FRAME, WireError, check_len};

/// FCoE header length (version, reserved, SOF).
pub const FCOE_HEADER_LEN: usize = 14;
/// FCoE trailer length (CRC, EOF, reserved).
pub const FCOE_TRAILER_LEN: usize = 8;
/// The largest Ethernet frame an FCoE port sends or accepts (without FCS).
pub const BABY_JUMBO: usize = 2500;
/// The largest FCoE frame: tagged header, encapsulation, a 2,112-byte payload.
pub const MAX_FCOE_FRAME: usize =
    18 + FCOE_HEADER_LEN + FC_HEADER_LEN + unifab_fc::wire::MAX_PAYLOAD + FCOE_TRAILER_LEN;
/// The FCoE version this module speaks.
pub const FCOE_VERSION: u8 = 0;

/// A zero-copy view of what follows the FCoE EtherType.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcoeFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FcoeFrame<T> {
    /// Wraps the bytes after the EtherType; they must hold the header, an
    /// FC header and the trailer.
    pub fn new_checked(buffer: T) -> Result<FcoeFrame<T>, WireError> {
        check_len(
            buffer.as_ref(),
            FCOE_HEADER_LEN + FC_HEADER_LEN + FCOE_TRAILER_LEN,
        )?;
        Ok(FcoeFrame { buffer })
    }

    /// The version (high nibble of the first byte).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Whether the reserved header bits and trailer bytes are zero.
    pub fn reserved_zero(&self) -> bool {
        let b = self.buffer.as_ref();
        let n = b.len();
        b[0] & 0x0f == 0
            && b[1..FCOE_HEADER_LEN - 1].iter().all(|x| *x == 0)
            && b[n - 3..].iter().all(|x| *x == 0)
    }

    /// The start-of-frame code.
    pub fn sof(&self) -> Sof {
        Sof(self.buffer.as_ref()[FCOE_HEADER_LEN - 1])
    }

    /// The FC frame: header and payload.
    pub fn fc_frame(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[FCOE_HEADER_LEN..b.len() - FCOE_TRAILER_LEN]
    }

    /// The CRC carried in the trailer.
    pub fn crc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let n = b.len() - FCOE_TRAILER_LEN;
        u32::from_le_bytes([b[n], b[n + 1], b[n + 2], b[n + 3]])
    }

    /// The end-of-frame code.
    pub fn eof(&self) -> Eof {
        let b = self.buffer.as_ref();
        Eof(b[b.len() - 4])
    }

    /// Checks version, delimiters, that the FC frame is whole words, and
    /// the CRC.
    pub fn check(&self) -> Result<(), WireError> {
        if self.version() != FCOE_VERSION {
            return Err(WireError::FcoeVersion(self.version()));
        }
        if !self.sof().is_valid() {
            return Err(WireError::Delimiter(self.sof().0));
        }
        if !self.eof().is_valid() {
            return Err(WireError::Delimiter(self.eof().0));
        }
        if !self.fc_frame().len().is_multiple_of(4) {
            return Err(WireError::Unaligned(self.fc_frame().len()));
        }
        let computed = fc_crc(self.fc_frame());
        if computed != self.crc() {
            return Err(WireError::Crc {
                computed,
                received: self.crc(),
            });
        }
        Ok(())
    }
}

/// The meaning of an FCoE encapsulation (the FC frame is carried apart,
/// as a [`Frame`] or as bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FcoeRepr {
    /// Version (0).
    pub version: u8,
    /// Start of frame.
    pub sof: Sof,
    /// End of frame.
    pub eof: Eof,
}

impl FcoeRepr {
    /// Parses a view (delimiters and version are reported, not refused:
    /// [`FcoeFrame::check`] refuses).
    pub fn parse<T: AsRef<[u8]>>(v: &FcoeFrame<T>) -> FcoeRepr {
        FcoeRepr {
            version: v.version(),
            sof: v.sof(),
            eof: v.eof(),
        }
    }

    /// Length of the encapsulation around an FC frame of `fc_len` bytes.
    pub fn buffer_len(fc_len: usize) -> usize {
        FCOE_HEADER_LEN + fc_len + FCOE_TRAILER_LEN
    }

    /// Writes header, `fc` (header + payload) and trailer into `buf`,
    /// computing the CRC.
    pub fn emit(&self, fc: &[u8], buf: &mut [u8]) -> Result<(), WireError> {
        let n = Self::buffer_len(fc.len());
        check_len(buf, n)?;
        buf[..FCOE_HEADER_LEN].fill(0);
        buf[0] = self.version << 4;
        buf[FCOE_HEADER_LEN - 1] = self.sof.0;
        buf[FCOE_HEADER_LEN..FCOE_HEADER_LEN + fc.len()].copy_from_slice(fc);
        let t = FCOE_HEADER_LEN + fc.len();
        buf[t..t + 4].copy_from_slice(&fc_crc(fc).to_le_bytes());
        buf[t + 4] = self.eof.0;
        buf[t + 5..t + 8].fill(0);
        Ok(())
    }
}

/// Decodes an FCoE payload (the bytes after the EtherType, padding
/// allowed only if it is FCoE's own: none) into a frame whose payload is a
/// slice of `payload`. Checks version, delimiters and CRC.
pub fn decode(payload: &Bytes) -> Result<Frame, WireError> {
    let v = FcoeFrame::new_checked(&payload[..])?;
    v.check()?;
    let n = payload.len();
    let (sof, eof) = (v.sof(), v.eof());
    Ok(Frame::parse(
        payload.slice(FCOE_HEADER_LEN..n - FCOE_TRAILER_LEN),
        sof,
        eof,
    )?
    .without_data_fill())
}

/// Bytes an Ethernet frame carrying `frame` takes (its fill bytes
/// included).
pub fn encapsulated_len(eth: &EthernetRepr, frame: &Frame) -> usize {
    (eth.header_len() + FcoeRepr::buffer_len(frame.len() + frame.fill_needed()))
        .max(MIN_ETHERNET_FRAME)
}

/// Writes a whole Ethernet frame carrying `frame` into `buf` (which must
/// hold [`encapsulated_len`] bytes) and returns its length. The payload is
/// copied once, here; a payload that is not whole words (FCP_DATA of an
/// odd length) gets its fill bytes, counted in F_CTL (FC-FS-4 §9.5: Linux's
/// libfc checks a data frame's CRC over payload and fill); the CRC is
/// computed over header, payload and fill.
pub fn encapsulate(eth: &EthernetRepr, frame: &Frame, buf: &mut [u8]) -> Result<usize, WireError> {
    let n = encapsulated_len(eth, frame);
    if n > BABY_JUMBO {
        return Err(WireError::TooLong(n));
    }
    check_len(buf, n)?;
    eth.emit(buf)?;
    let mut at = eth.header_len();
    buf[at..at + FCOE_HEADER_LEN].fill(0);
    buf[at] = FCOE_VERSION << 4;
    buf[at + FCOE_HEADER_LEN - 1] = frame.sof.0;
    at += FCOE_HEADER_LEN;
    let header = frame.wire_header().to_bytes();
    buf[at..at + FC_HEADER_LEN].copy_from_slice(&header);
    at += FC_HEADER_LEN;
    let p = frame.payload.len();
    buf[at..at + p].copy_from_slice(&frame.payload);
    at += p;
    let fill = &[0u8; 3][..frame.fill_needed()];
    buf[at..at + fill.len()].copy_from_slice(fill);
    at += fill.len();
    let crc = fc_crc_parts(&header, &[&frame.payload, fill]);
    buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    buf[at + 4] = frame.eof.0;
    buf[at + 5..at + 8].fill(0);
    at += FCOE_TRAILER_LEN;
    buf[at..n].fill(0);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ethernet::{EtherType, EthernetFrame};
    use crate::wire::{MacAddr, VlanTag};
    use unifab_fc::wire::FcHeaderRepr;

    fn sample() -> Frame {
        let header = FcHeaderRepr::parse(
            &unifab_fc::wire::FcHeader::new_checked(
                &[
                    0x22, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0x01, 0x29, 0, 0, 0, 0, 0, 0, 0, 1, 0xff,
                    0xff, 0, 0, 0, 0,
                ][..],
            )
            .unwrap(),
        );
        Frame::new(header, Bytes::from_static(&[4, 0, 0, 0, 1, 2, 3, 4]))
    }

    #[test]
    fn encapsulate_then_decode() {
        let f = sample();
        for vlan in [None, Some(VlanTag::fcoe(5))] {
            let eth = EthernetRepr {
                dst: MacAddr::fpma(crate::wire::FcMap::DEFAULT, f.header.d_id),
                src: MacAddr([2, 0, 0, 0, 0, 1]),
                vlan,
                ethertype: EtherType::FCOE,
            };
            let mut buf = vec![0u8; encapsulated_len(&eth, &f)];
            let n = encapsulate(&eth, &f, &mut buf).unwrap();
            assert_eq!(n, buf.len());
            let e = EthernetFrame::new_checked(&buf[..]).unwrap();
            assert_eq!(EthernetRepr::parse(&e), eth);
            let payload = Bytes::copy_from_slice(e.payload());
            let back = decode(&payload).unwrap();
            assert_eq!(back, f);
            let v = FcoeFrame::new_checked(&payload[..]).unwrap();
            assert!(v.reserved_zero());
            let r = FcoeRepr::parse(&v);
            let mut again = vec![0u8; FcoeRepr::buffer_len(v.fc_frame().len())];
            r.emit(v.fc_frame(), &mut again).unwrap();
            assert_eq!(&again[..], &payload[..]);
            // Every cut is an error, never a panic.
            for cut in 0..payload.len() {
                assert!(decode(&payload.slice(..cut)).is_err());
            }
            let mut bad = payload.to_vec();
            let k = bad.len() - 8;
            bad[k] ^= 0xff;
            assert!(matches!(
                decode(&Bytes::from(bad)),
                Err(WireError::Crc { .. })
            ));
            let mut bad = payload.to_vec();
            bad[0] = 0x10;
            assert_eq!(decode(&Bytes::from(bad)), Err(WireError::FcoeVersion(1)));
        }
    }

    /// FCP_DATA of a length that is not whole words (an 11-byte VPD page,
    /// say) goes out padded with fill bytes that F_CTL counts, the CRC over
    /// all of it, as FC-FS wants and Linux's libfc checks; decoding drops
    /// the fill again.
    #[test]
    fn odd_fcp_data_is_padded_with_counted_fill_and_stripped_on_decode() {
        use unifab_fc::wire::{FCtl, FcId, FcType, OxId, RCtl, RxId};
        for len in [1usize, 2, 3, 4, 11, 2047] {
            let header = FcHeaderRepr {
                r_ctl: RCtl::FCP_DATA,
                d_id: FcId::new(0x02_03_00),
                cs_ctl: 0,
                s_id: FcId::new(0x02_01_00),
                fc_type: FcType::FCP,
                f_ctl: FCtl(FCtl::EXCHANGE_CONTEXT | FCtl::RELATIVE_OFFSET | FCtl::END_SEQUENCE),
                seq_id: 1,
                df_ctl: 0,
                seq_cnt: 0,
                ox_id: OxId(7),
                rx_id: RxId(9),
                parameter: 0,
            };
            let data: Vec<u8> = (0..len).map(|i| i as u8 | 0x80).collect();
            let f = Frame::new(header, Bytes::from(data.clone()));
            let eth = EthernetRepr {
                dst: MacAddr([0x0e, 0xfc, 0, 2, 3, 0]),
                src: MacAddr([2, 0, 0, 0, 0, 1]),
                vlan: None,
                ethertype: EtherType::FCOE,
            };
            let mut buf = vec![0u8; encapsulated_len(&eth, &f)];
            let n = encapsulate(&eth, &f, &mut buf).unwrap();
            let e = EthernetFrame::new_checked(&buf[..n]).unwrap();
            let payload = Bytes::copy_from_slice(e.payload());
            let v = FcoeFrame::new_checked(&payload[..]).unwrap();
            let fill = (4 - len % 4) % 4;
            // The FC frame on the wire: header, data, fill; whole words.
            let fc = v.fc_frame();
            assert_eq!(fc.len(), 24 + len + fill, "len {len}");
            assert_eq!(fc.len() % 4, 0);
            // F_CTL is header bytes 9–11; bits 1–0 of byte 11 count the fill.
            assert_eq!(usize::from(fc[11] & 0b11), fill, "F_CTL fill count");
            assert!(fc[24 + len..].iter().all(|&b| b == 0));
            // The CRC covers the fill (decode checks it over everything).
            let back = decode(&payload).unwrap();
            assert_eq!(&back.payload[..], &data[..], "len {len}");
            assert_eq!(back.header.f_ctl.fill_bytes(), 0);
            assert_eq!(back.header, header);
            // Without its fill, the same frame is refused: an FC frame is
            // whole words.
            if fill != 0 {
                let bare = &fc[..24 + len];
                let r = FcoeRepr::parse(&v);
                let mut raw = vec![0u8; FcoeRepr::buffer_len(bare.len())];
                r.emit(bare, &mut raw).unwrap();
                assert_eq!(
                    decode(&Bytes::from(raw)),
                    Err(WireError::Unaligned(24 + len))
                );
            }
        }
    }
}
