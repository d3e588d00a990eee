//! Header and data digests: CRC32C (RFC 7143 §11.1, Castagnoli, RFC 3385).
//!
//! The `crc32c` crate uses the SSE4.2 `crc32` instruction (or ARMv8 CRC)
//! when the CPU has it, detected at run time. On the wire the 32-bit digest
//! is sent least-significant byte first, as the RFC's example in §B.4 and
//! every implementation do; the capture tests prove it.

/// CRC32C of one buffer.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over another buffer (for digests spanning the
/// scattered slices of a PDU).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The 4 digest bytes as they are sent.
#[inline]
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Reads 4 digest bytes from the wire.
#[inline]
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

/// Data digest over `slices` followed by zero padding to a 4-byte boundary.
pub fn data_digest<'a>(slices: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut crc = 0;
    let mut len = 0usize;
    for s in slices {
        crc = crc32c_append(crc, s);
        len += s.len();
    }
    let pad = (4 - len % 4) % 4;
    crc32c_append(crc, &[0u8; 3][..pad])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_test_vectors() {
        // RFC 3720 §B.4: 32 bytes of zeros -> aa 36 91 8a (sent LSB first).
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(to_wire(crc32c(&inc)), [0x4e, 0x79, 0xdd, 0x46]);
    }

    #[test]
    fn scattered_equals_contiguous() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let whole = data_digest([&a[..]]);
        let split = data_digest([&a[..3], &a[3..500], &a[500..]]);
        assert_eq!(whole, split);
        let mut padded = a[..999].to_vec();
        padded.push(0);
        assert_eq!(data_digest([&a[..999]]), crc32c(&padded));
    }
}
