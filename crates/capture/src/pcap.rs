//! pcap and pcapng file readers (libpcap format; pcapng SHB/IDB/EPB/SPB/OPB).

use thiserror::Error;

/// Link-layer types (LINKTYPE_* values of the tcpdump registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkType(pub u32);

impl LinkType {
    /// Ethernet.
    pub const ETHERNET: LinkType = LinkType(1);
    /// Raw IP (IPv4 or IPv6, from the version nibble).
    pub const RAW: LinkType = LinkType(101);
    /// Linux cooked capture v1.
    pub const LINUX_SLL: LinkType = LinkType(113);
    /// Fibre Channel FC-2 frames (SOF/EOF stripped).
    pub const FC_2: LinkType = LinkType(224);
    /// Fibre Channel FC-2 with frame delimiters.
    pub const FC_2_WITH_FRAME_DELIMS: LinkType = LinkType(225);
    /// Raw IPv4.
    pub const IPV4: LinkType = LinkType(228);
    /// Raw IPv6.
    pub const IPV6: LinkType = LinkType(229);
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame<'a> {
    /// 1-based frame number, as Wireshark counts.
    pub number: u64,
    /// Link type of the interface.
    pub link_type: LinkType,
    /// The captured bytes.
    pub data: &'a [u8],
    /// The length of the frame on the wire (≥ `data.len()`).
    pub orig_len: u32,
}

impl CapturedFrame<'_> {
    /// Was the frame cut short at capture (snaplen)?
    pub fn is_truncated(&self) -> bool {
        (self.orig_len as usize) > self.data.len()
    }
}

/// Errors reading a capture file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Neither pcap nor pcapng magic.
    #[error("not a pcap or pcapng file")]
    UnknownFormat,
    /// The file ends inside a header or record.
    #[error("file truncated at byte {offset}")]
    Truncated {
        /// Where.
        offset: usize,
    },
    /// A pcapng block is malformed.
    #[error("malformed pcapng block at byte {offset}")]
    BadBlock {
        /// Where.
        offset: usize,
    },
}

fn rd_u16(b: &[u8], at: usize, be: bool) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(if be {
        u16::from_be_bytes(s)
    } else {
        u16::from_le_bytes(s)
    })
}

fn rd_u32(b: &[u8], at: usize, be: bool) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(if be {
        u32::from_be_bytes(s)
    } else {
        u32::from_le_bytes(s)
    })
}

/// Read every frame of a pcap or pcapng file held in memory.
pub fn read_frames(file: &[u8]) -> Result<Vec<CapturedFrame<'_>>, CaptureError> {
    let magic = file.get(0..4).ok_or(CaptureError::UnknownFormat)?;
    match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => read_pcap(file, false),
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => read_pcap(file, true),
        [0x0a, 0x0d, 0x0d, 0x0a] => read_pcapng(file),
        _ => Err(CaptureError::UnknownFormat),
    }
}

fn read_pcap(file: &[u8], be: bool) -> Result<Vec<CapturedFrame<'_>>, CaptureError> {
    let link = rd_u32(file, 20, be).ok_or(CaptureError::Truncated { offset: 0 })?;
    // The upper bits of the link-type field may carry FCS information.
    let link_type = LinkType(link & 0x0fff_ffff);
    let mut frames = Vec::new();
    let mut at = 24;
    let mut number = 0;
    while at < file.len() {
        let incl = rd_u32(file, at + 8, be).ok_or(CaptureError::Truncated { offset: at })? as usize;
        let orig = rd_u32(file, at + 12, be).ok_or(CaptureError::Truncated { offset: at })?;
        let data = file
            .get(at + 16..at + 16 + incl)
            .ok_or(CaptureError::Truncated { offset: at })?;
        number += 1;
        frames.push(CapturedFrame {
            number,
            link_type,
            data,
            orig_len: orig.max(incl as u32),
        });
        at += 16 + incl;
    }
    Ok(frames)
}

fn read_pcapng(file: &[u8]) -> Result<Vec<CapturedFrame<'_>>, CaptureError> {
    let mut frames = Vec::new();
    let mut at = 0;
    let mut be = false;
    let mut links: Vec<LinkType> = Vec::new();
    let mut number = 0;
    while at < file.len() {
        let block_type_raw = file
            .get(at..at + 4)
            .ok_or(CaptureError::Truncated { offset: at })?;
        if block_type_raw == [0x0a, 0x0d, 0x0d, 0x0a] {
            // Section header: byte order magic decides endianness.
            let bom = file
                .get(at + 8..at + 12)
                .ok_or(CaptureError::Truncated { offset: at })?;
            be = bom == [0x1a, 0x2b, 0x3c, 0x4d];
            links.clear();
        }
        let block_type = rd_u32(file, at, be).ok_or(CaptureError::Truncated { offset: at })?;
        let len = rd_u32(file, at + 4, be).ok_or(CaptureError::Truncated { offset: at })? as usize;
        if len < 12 || !len.is_multiple_of(4) {
            return Err(CaptureError::BadBlock { offset: at });
        }
        let block = file
            .get(at..at + len)
            .ok_or(CaptureError::Truncated { offset: at })?;
        match block_type {
            // Interface description.
            1 => {
                let lt = rd_u16(block, 8, be).ok_or(CaptureError::BadBlock { offset: at })?;
                links.push(LinkType(u32::from(lt)));
            }
            // Enhanced packet.
            6 => {
                let iface =
                    rd_u32(block, 8, be).ok_or(CaptureError::BadBlock { offset: at })? as usize;
                let cap =
                    rd_u32(block, 20, be).ok_or(CaptureError::BadBlock { offset: at })? as usize;
                let orig = rd_u32(block, 24, be).ok_or(CaptureError::BadBlock { offset: at })?;
                let data = block
                    .get(28..28 + cap)
                    .ok_or(CaptureError::BadBlock { offset: at })?;
                let link_type = *links
                    .get(iface)
                    .ok_or(CaptureError::BadBlock { offset: at })?;
                number += 1;
                frames.push(CapturedFrame {
                    number,
                    link_type,
                    data,
                    orig_len: orig.max(cap as u32),
                });
            }
            // Simple packet: interface 0, captured length bounded by the block.
            3 => {
                let orig = rd_u32(block, 8, be).ok_or(CaptureError::BadBlock { offset: at })?;
                let cap = (orig as usize).min(len.saturating_sub(16));
                let data = block
                    .get(12..12 + cap)
                    .ok_or(CaptureError::BadBlock { offset: at })?;
                let link_type = *links.first().ok_or(CaptureError::BadBlock { offset: at })?;
                number += 1;
                frames.push(CapturedFrame {
                    number,
                    link_type,
                    data,
                    orig_len: orig.max(cap as u32),
                });
            }
            // Obsolete packet block.
            2 => {
                let iface =
                    rd_u16(block, 8, be).ok_or(CaptureError::BadBlock { offset: at })? as usize;
                let cap =
                    rd_u32(block, 20, be).ok_or(CaptureError::BadBlock { offset: at })? as usize;
                let orig = rd_u32(block, 24, be).ok_or(CaptureError::BadBlock { offset: at })?;
                let data = block
                    .get(28..28 + cap)
                    .ok_or(CaptureError::BadBlock { offset: at })?;
                let link_type = *links
                    .get(iface)
                    .ok_or(CaptureError::BadBlock { offset: at })?;
                number += 1;
                frames.push(CapturedFrame {
                    number,
                    link_type,
                    data,
                    orig_len: orig.max(cap as u32),
                });
            }
            _ => {}
        }
        at += len;
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcap_le(link: u32, frames: &[(&[u8], u32)]) -> Vec<u8> {
        let mut f = vec![
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0,
        ];
        f.extend_from_slice(&link.to_le_bytes());
        for (d, orig) in frames {
            f.extend_from_slice(&[0; 8]);
            f.extend_from_slice(&(d.len() as u32).to_le_bytes());
            f.extend_from_slice(&orig.to_le_bytes());
            f.extend_from_slice(d);
        }
        f
    }

    #[test]
    fn pcap_frames() {
        let f = pcap_le(1, &[(b"abcd", 4), (b"xy", 60)]);
        let frames = read_frames(&f).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].data, b"abcd");
        assert_eq!(frames[1].number, 2);
        assert!(frames[1].is_truncated());
        assert_eq!(frames[0].link_type, LinkType::ETHERNET);
        assert_eq!(
            read_frames(&f[..f.len() - 1]),
            Err(CaptureError::Truncated { offset: 44 })
        );
        assert_eq!(read_frames(b"nope"), Err(CaptureError::UnknownFormat));
    }

    #[test]
    fn pcapng_frames() {
        let mut f = Vec::new();
        // SHB
        f.extend_from_slice(&[0x0a, 0x0d, 0x0d, 0x0a]);
        f.extend_from_slice(&28u32.to_le_bytes());
        f.extend_from_slice(&[0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0]);
        f.extend_from_slice(&[0xff; 8]);
        f.extend_from_slice(&28u32.to_le_bytes());
        // IDB, link type 224
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&20u32.to_le_bytes());
        f.extend_from_slice(&224u16.to_le_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&20u32.to_le_bytes());
        // EPB with 5 bytes (padded to 8)
        f.extend_from_slice(&6u32.to_le_bytes());
        f.extend_from_slice(&40u32.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&5u32.to_le_bytes());
        f.extend_from_slice(&5u32.to_le_bytes());
        f.extend_from_slice(b"hello\0\0\0");
        f.extend_from_slice(&40u32.to_le_bytes());
        let frames = read_frames(&f).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].data, b"hello");
        assert_eq!(frames[0].link_type, LinkType::FC_2);
    }
}
