//! The FC frame CRC (FC-FS-4 §10): CRC-32 with the IEEE 802.3 polynomial,
//! computed over the frame header and payload (not the delimiters).
//!
//! Byte order, checked against `fcoe-t11.pcap` (whose CRCs tshark marks
//! good): the CRC-32 value is transmitted least significant byte first,
//! as an Ethernet FCS is — `fc_crc(data).to_le_bytes()` are the four bytes
//! that follow the payload on the wire. `crc32fast` uses the CPU's
//! carry-less multiply where it exists.

/// CRC-32 over `data` (header + payload).
#[inline]
pub fn fc_crc(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// CRC-32 over a header and the payload slices that follow it, without
/// joining them.
pub fn fc_crc_parts(header: &[u8], payload: &[impl AsRef<[u8]>]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    for p in payload {
        h.update(p.as_ref());
    }
    h.finalize()
}

/// The four CRC bytes as they appear on the wire after the payload.
#[inline]
pub fn fc_crc_bytes(data: &[u8]) -> [u8; 4] {
    fc_crc(data).to_le_bytes()
}

/// Checks a frame laid out as header + payload + CRC.
pub fn check_crc(frame_with_crc: &[u8]) -> Result<(), super::WireError> {
    let n = frame_with_crc.len();
    super::check_len(frame_with_crc, 4)?;
    let (data, crc) = frame_with_crc.split_at(n - 4);
    let received = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = fc_crc(data);
    if computed == received {
        Ok(())
    } else {
        Err(super::WireError::Crc { computed, received })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value() {
        // The CRC-32/ISO-HDLC check value.
        assert_eq!(fc_crc(b"123456789"), 0xcbf4_3926);
        assert_eq!(
            fc_crc_parts(b"1234", &[&b"56"[..], &b"789"[..]]),
            0xcbf4_3926
        );
    }

    #[test]
    fn captured_flogi_crc() {
        // fcoe-t11.pcap frame 1: FC header + FLOGI payload; the CRC bytes
        // on the wire are c5 eb ec af (tshark: "0xc5ebecaf [correct]").
        let mut whole = vec![
            0x22, 0xff, 0xff, 0xfe, 0x00, 0x00, 0x00, 0x00, 0x01, 0x29, 0x00, 0x00, 0xee, 0x00,
            0x00, 0x00, 0x03, 0xf7, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00,
        ];
        let mut payload = [0u8; 116];
        payload[..12]
            .copy_from_slice(&[4, 0, 0, 0, 0x20, 0x20, 0x00, 0x10, 0x80, 0x00, 0x08, 0x00]);
        payload[20..36].copy_from_slice(&[
            0x10, 0, 0, 0, 0xc9, 0x53, 0xe1, 0x62, 0x20, 0, 0, 0, 0xc9, 0x53, 0xe1, 0x62,
        ]);
        payload[49] = 1;
        payload[52..66].copy_from_slice(&[0x88, 0, 0, 0, 0, 0, 0x08, 0, 0, 0xff, 0, 0x0c, 0, 1]);
        payload[68..82].copy_from_slice(&[0x88, 0, 0, 0, 0, 0, 0x08, 0, 0, 0xff, 0, 0, 0, 1]);
        whole.extend_from_slice(&payload);
        assert_eq!(fc_crc_bytes(&whole), [0xc5, 0xeb, 0xec, 0xaf]);
        whole.extend_from_slice(&[0xc5, 0xeb, 0xec, 0xaf]);
        assert!(check_crc(&whole).is_ok());
        let n = whole.len();
        whole[n - 1] ^= 1;
        assert!(matches!(
            check_crc(&whole),
            Err(super::super::WireError::Crc { .. })
        ));
    }
}
