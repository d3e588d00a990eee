//! Additional Header Segments (RFC 7143 §11.2.2).

use bytes::Bytes;

use super::WireError;

/// AHS type codes (§11.2.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhsType(pub u8);

#[allow(missing_docs)]
impl AhsType {
    pub const EXTENDED_CDB: AhsType = AhsType(1);
    pub const BIDIRECTIONAL_READ_EXPECTED_LENGTH: AhsType = AhsType(2);
}

/// One AHS: its type and the bytes after the type byte (AHS-Specific and
/// AHS data, `AHSLength` bytes, no padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ahs {
    /// AHSType.
    pub ahs_type: AhsType,
    /// AHS-Specific byte followed by the AHS data.
    pub body: Bytes,
}

impl Ahs {
    /// An extended-CDB AHS carrying CDB bytes 16.. of a long CDB.
    pub fn extended_cdb(rest: &[u8]) -> Ahs {
        let mut body = Vec::with_capacity(rest.len() + 1);
        body.push(0);
        body.extend_from_slice(rest);
        Ahs {
            ahs_type: AhsType::EXTENDED_CDB,
            body: Bytes::from(body),
        }
    }

    /// A bidirectional read expected data transfer length AHS.
    pub fn bidi_read_length(len: u32) -> Ahs {
        let mut body = vec![0u8; 5];
        body[1..5].copy_from_slice(&len.to_be_bytes());
        Ahs {
            ahs_type: AhsType::BIDIRECTIONAL_READ_EXPECTED_LENGTH,
            body: Bytes::from(body),
        }
    }

    /// Encoded length including the 3-byte header and padding.
    pub fn buffer_len(&self) -> usize {
        (3 + self.body.len()).next_multiple_of(4)
    }

    /// Parses every AHS in a segment of `TotalAHSLength * 4` bytes.
    pub fn parse_all(segment: &Bytes) -> Result<Vec<Ahs>, WireError> {
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < segment.len() {
            let rest = &segment[at..];
            if rest.len() < 4 {
                return Err(WireError::BadAhs("AHS header runs past TotalAHSLength"));
            }
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let ahs_type = AhsType(rest[2]);
            // AHSLength counts AHS-Specific + data, so it is at least 1.
            if len == 0 {
                return Err(WireError::BadAhs("AHSLength is zero"));
            }
            let end = 3 + len;
            if end > rest.len() {
                return Err(WireError::BadAhs("AHS runs past TotalAHSLength"));
            }
            out.push(Ahs {
                ahs_type,
                body: segment.slice(at + 3..at + end),
            });
            at += end.next_multiple_of(4);
        }
        Ok(out)
    }

    /// Appends the encoded AHS (with padding) to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let len = u16::try_from(self.body.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.push(self.ahs_type.0);
        out.extend_from_slice(&self.body[..usize::from(len)]);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    }

    /// For an extended-CDB AHS, the CDB bytes it carries (after the
    /// reserved AHS-Specific byte).
    pub fn extended_cdb_bytes(&self) -> Option<Bytes> {
        (self.ahs_type == AhsType::EXTENDED_CDB && !self.body.is_empty())
            .then(|| self.body.slice(1..))
    }

    /// For a bidirectional read length AHS, the expected read length.
    pub fn bidi_read_expected_length(&self) -> Option<u32> {
        if self.ahs_type != AhsType::BIDIRECTIONAL_READ_EXPECTED_LENGTH || self.body.len() != 5 {
            return None;
        }
        let b = &self.body;
        Some(u32::from_be_bytes([b[1], b[2], b[3], b[4]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let ext = Ahs::extended_cdb(&[1, 2, 3, 4, 5]);
        let bidi = Ahs::bidi_read_length(4096);
        let mut seg = Vec::new();
        ext.emit(&mut seg);
        bidi.emit(&mut seg);
        assert_eq!(seg.len(), ext.buffer_len() + bidi.buffer_len());
        assert_eq!(seg.len() % 4, 0);
        let seg = Bytes::from(seg);
        let parsed = Ahs::parse_all(&seg).unwrap();
        assert_eq!(parsed, vec![ext.clone(), bidi.clone()]);
        assert_eq!(
            parsed[0].extended_cdb_bytes().unwrap().as_ref(),
            &[1, 2, 3, 4, 5]
        );
        assert_eq!(parsed[1].bidi_read_expected_length(), Some(4096));
        // Every truncation of the segment is refused or parses fewer AHSs; never panics.
        for n in 0..seg.len() {
            let _ = Ahs::parse_all(&seg.slice(..n));
        }
        assert!(Ahs::parse_all(&Bytes::from_static(&[0, 0, 1, 0])).is_err());
        assert!(Ahs::parse_all(&Bytes::from_static(&[0, 9, 1, 0, 0, 0, 0, 0])).is_err());
    }
}
