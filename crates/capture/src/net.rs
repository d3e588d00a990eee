//! Link, IPv4/IPv6 and TCP decoding for captured frames.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::pcap::{CapturedFrame, LinkType};

/// EtherType of FCoE.
pub const ETHERTYPE_FCOE: u16 = 0x8906;
/// EtherType of FIP.
pub const ETHERTYPE_FIP: u16 = 0x8914;

/// What the link layer of a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkPayload<'a> {
    /// An IP packet.
    Ip(&'a [u8]),
    /// Another EtherType (FCoE, FIP, …) with its payload.
    Ether {
        /// The EtherType.
        ethertype: u16,
        /// Bytes after the (VLAN-stripped) Ethernet header.
        payload: &'a [u8],
    },
    /// A bare Fibre Channel frame (link types 224/225).
    Fc(&'a [u8]),
    /// Something this reader does not decode.
    Other,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decode the link layer.
pub fn link_payload<'a>(frame: &CapturedFrame<'a>) -> LinkPayload<'a> {
    let d = frame.data;
    match frame.link_type {
        LinkType::ETHERNET => {
            let mut at = 12;
            let Some(mut et) = be16(d, at) else {
                return LinkPayload::Other;
            };
            // 802.1Q / 802.1ad tags.
            while matches!(et, 0x8100 | 0x88a8 | 0x9100) {
                at += 4;
                let Some(e) = be16(d, at) else {
                    return LinkPayload::Other;
                };
                et = e;
            }
            let Some(payload) = d.get(at + 2..) else {
                return LinkPayload::Other;
            };
            match et {
                0x0800 | 0x86dd => LinkPayload::Ip(payload),
                _ => LinkPayload::Ether {
                    ethertype: et,
                    payload,
                },
            }
        }
        LinkType::LINUX_SLL => match (be16(d, 14), d.get(16..)) {
            (Some(0x0800 | 0x86dd), Some(p)) => LinkPayload::Ip(p),
            (Some(et), Some(p)) => LinkPayload::Ether {
                ethertype: et,
                payload: p,
            },
            _ => LinkPayload::Other,
        },
        LinkType::RAW | LinkType::IPV4 | LinkType::IPV6 => LinkPayload::Ip(d),
        LinkType::FC_2 | LinkType::FC_2_WITH_FRAME_DELIMS => LinkPayload::Fc(d),
        _ => LinkPayload::Other,
    }
}

/// A decoded TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// Sequence number.
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// Captured payload bytes.
    pub payload: &'a [u8],
    /// Payload bytes on the wire (from the IP length); more than
    /// `payload.len()` when the frame was cut at capture.
    pub wire_len: usize,
}

/// Decode IPv4/IPv6 + TCP. `None` for anything else (or a fragment).
pub fn tcp_segment(ip: &[u8]) -> Option<TcpSegment<'_>> {
    let version = ip.first()? >> 4;
    let (src, dst, proto, l4, l4_wire_len) = match version {
        4 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(be16(ip, 2)?);
            let frag = be16(ip, 6)?;
            if frag & 0x3fff != 0 || ihl < 20 || total < ihl {
                return None;
            }
            let src = IpAddr::V4(Ipv4Addr::from(be32(ip, 12)?));
            let dst = IpAddr::V4(Ipv4Addr::from(be32(ip, 16)?));
            (src, dst, *ip.get(9)?, ip.get(ihl..)?, total - ihl)
        }
        6 => {
            let plen = usize::from(be16(ip, 4)?);
            let mut next = *ip.get(6)?;
            let s: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let d: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            let mut at = 40;
            let mut remaining = plen;
            // Skip hop-by-hop, routing and destination options headers.
            while matches!(next, 0 | 43 | 60) {
                let n = *ip.get(at)?;
                let len = (usize::from(*ip.get(at + 1)?) + 1) * 8;
                at += len;
                remaining = remaining.checked_sub(len)?;
                next = n;
            }
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                next,
                ip.get(at..)?,
                remaining,
            )
        }
        _ => return None,
    };
    if proto != 6 {
        return None;
    }
    let sport = be16(l4, 0)?;
    let dport = be16(l4, 2)?;
    let seq = be32(l4, 4)?;
    let off = usize::from(l4.get(12)? >> 4) * 4;
    let flags = *l4.get(13)?;
    if off < 20 {
        return None;
    }
    let wire_len = l4_wire_len.saturating_sub(off);
    let captured = l4.get(off..).unwrap_or_default();
    // Ethernet padding may follow a short IP packet: cut to the IP length.
    let payload = captured
        .get(..wire_len.min(captured.len()))
        .unwrap_or_default();
    Some(TcpSegment {
        src: SocketAddr::new(src, sport),
        dst: SocketAddr::new(dst, dport),
        seq,
        syn: flags & 0x02 != 0,
        fin: flags & 0x01 != 0,
        rst: flags & 0x04 != 0,
        payload,
        wire_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_tcp_with_padding() {
        let mut ip = vec![
            0x45, 0, 0, 44, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let mut tcp = vec![
            0x0c, 0xbc, 0x80, 0x00, 0, 0, 0, 7, 0, 0, 0, 0, 0x50, 0x18, 0, 0, 0, 0, 0, 0,
        ];
        tcp.extend_from_slice(b"data");
        ip.extend_from_slice(&tcp);
        ip.extend_from_slice(&[0, 0]); // Ethernet padding beyond the IP length
        let s = tcp_segment(&ip).unwrap();
        assert_eq!(s.src.port(), 3260);
        assert_eq!(s.seq, 7);
        assert_eq!(s.payload, b"data");
        assert_eq!(s.wire_len, 4);
        assert!(!s.syn);
        assert!(tcp_segment(&ip[..10]).is_none());
        ip[9] = 17;
        assert!(tcp_segment(&ip).is_none());
    }

    #[test]
    fn ethernet_vlan() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0, 5, 0x89, 0x06, 1, 2]);
        let frame = CapturedFrame {
            number: 1,
            link_type: LinkType::ETHERNET,
            data: &f,
            orig_len: f.len() as u32,
        };
        assert_eq!(
            link_payload(&frame),
            LinkPayload::Ether {
                ethertype: ETHERTYPE_FCOE,
                payload: &[1, 2]
            }
        );
    }
}
