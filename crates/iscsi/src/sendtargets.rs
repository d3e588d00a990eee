//! SendTargets (RFC 7143 §12.3, Appendix C): the answer text and its
//! delivery across several Text Responses.
//!
//! - [`SendTargetsRequest::parse`] reads the request value: `All`, an
//!   iSCSI name, or empty.
//! - [`build_response`] writes `TargetName=`/`TargetAddress=` lists from the
//!   targets the session layer passes. `All` is honoured in discovery
//!   sessions only (a normal session gets `SendTargets=Reject`); the empty
//!   value names the session's own target (normal sessions); a name returns
//!   that target if the initiator may see it.
//! - [`TextContinuation`] hands the answer out in pieces no larger than the
//!   initiator's MaxRecvDataSegmentLength: every piece but the last has the
//!   C bit and a Target Transfer Tag the initiator echoes in its empty Text
//!   Request asking for more; the last has F set and TTT 0xffffffff.

use bytes::Bytes;

use crate::text::{TextError, TextWriter};

/// The TTT meaning "no continuation".
pub const RESERVED_TTT: u32 = 0xffff_ffff;

/// What a `SendTargets=` value asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendTargetsRequest<'a> {
    /// `All`: every target the initiator may see (discovery sessions).
    All,
    /// One target by name.
    Target(&'a str),
    /// Empty: the session's own target (normal sessions).
    SessionTarget,
}

impl<'a> SendTargetsRequest<'a> {
    /// Parse a `SendTargets` value.
    pub fn parse(value: &'a str) -> Self {
        match value {
            "All" => SendTargetsRequest::All,
            "" => SendTargetsRequest::SessionTarget,
            name => SendTargetsRequest::Target(name),
        }
    }
}

/// One target as the session layer describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetEntry<'a> {
    /// TargetName.
    pub name: &'a str,
    /// TargetAddress values: `host:port,tpgt` (IPv6 hosts in brackets).
    pub addresses: &'a [String],
}

/// Format a TargetAddress value.
pub fn target_address(addr: std::net::SocketAddr, portal_group_tag: u16) -> String {
    match addr {
        std::net::SocketAddr::V4(a) => format!("{}:{},{}", a.ip(), a.port(), portal_group_tag),
        std::net::SocketAddr::V6(a) => format!("[{}]:{},{}", a.ip(), a.port(), portal_group_tag),
    }
}

/// The TargetAddress values of one portal group (RFC 7143 §13.9:
/// `domainname[:port],portal-group-tag`) for a host that reached the
/// portal at `via`:
///
/// - `advertised`, where the operator named the addresses hosts use (a
///   portal behind NAT or a port mapping: its own addresses are not the
///   ones to dial);
/// - else each bound portal, a wildcard one (`0.0.0.0`, `[::]`) as the
///   address the host reached, and a loopback one only to a host that came
///   over loopback itself: no other host can reach it, and one told to
///   dial `127.0.0.1` would dial itself. Duplicates are given once.
pub fn target_addresses(
    bound: &[std::net::SocketAddr],
    via: std::net::SocketAddr,
    advertised: &[String],
    portal_group_tag: u16,
) -> Vec<String> {
    if !advertised.is_empty() {
        return advertised
            .iter()
            .map(|a| format!("{a},{portal_group_tag}"))
            .collect();
    }
    let mut out: Vec<String> = Vec::new();
    for b in bound {
        let a = if b.ip().is_unspecified() { via } else { *b };
        if a.ip().is_loopback() && !via.ip().is_loopback() {
            continue;
        }
        let shown = target_address(a, portal_group_tag);
        if !out.contains(&shown) {
            out.push(shown);
        }
    }
    out
}

/// Checks one address an operator advertises for SendTargets:
/// `host[:port]`, the host an IPv4 address, a DNS name or an IPv6 address
/// in brackets, the port 1–65535 (without one, initiators dial 3260).
pub fn check_advertised_address(a: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(format!("{a:?}: '[' without ']'"));
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{a:?}: {v6:?} is not an IPv6 address"));
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(p) => (None, Some(p)),
                None => return Err(format!("{a:?}: expected ':PORT' after ']'")),
            },
        }
    } else {
        match a.split_once(':') {
            Some((h, p)) if !p.contains(':') => (Some(h), Some(p)),
            Some(_) => {
                return Err(format!(
                    "{a:?}: an IPv6 address goes in brackets ([2001:db8::1]:3260)"
                ));
            }
            None => (Some(a), None),
        }
    };
    if let Some(h) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if h.is_empty() || h.len() > 253 || !h.split('.').all(label_ok) {
            return Err(format!(
                "{a:?}: {h:?} is neither an IPv4 address nor a DNS name"
            ));
        }
    }
    if let Some(p) = port
        && !matches!(p.parse::<u16>(), Ok(1..))
    {
        return Err(format!("{a:?}: port {p:?} is not 1-65535"));
    }
    Ok(())
}

/// Build the SendTargets answer. `targets` are those the initiator is
/// allowed to see; `session_target` is the normal session's target (None
/// in a discovery session). iSCSI names compare case-insensitively.
pub fn build_response(
    request: SendTargetsRequest<'_>,
    targets: &[TargetEntry<'_>],
    session_target: Option<&str>,
    max_len: usize,
) -> Result<Vec<u8>, TextError> {
    let mut w = TextWriter::with_limit(max_len);
    let selected: Vec<&TargetEntry<'_>> = match (request, session_target) {
        (SendTargetsRequest::All, None) => targets.iter().collect(),
        (SendTargetsRequest::All, Some(_)) => {
            w.push("SendTargets", "Reject")?;
            return Ok(w.into_bytes());
        }
        (SendTargetsRequest::SessionTarget, Some(own)) => targets
            .iter()
            .filter(|t| t.name.eq_ignore_ascii_case(own))
            .collect(),
        (SendTargetsRequest::SessionTarget, None) => Vec::new(),
        (SendTargetsRequest::Target(name), _) => targets
            .iter()
            .filter(|t| t.name.eq_ignore_ascii_case(name))
            .collect(),
    };
    for t in selected {
        w.push("TargetName", t.name)?;
        for a in t.addresses {
            w.push("TargetAddress", a)?;
        }
    }
    Ok(w.into_bytes())
}

/// One Text Response's worth of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPiece {
    /// Data segment.
    pub data: Bytes,
    /// C bit: more follows.
    pub continue_flag: bool,
    /// F bit: this is the last piece.
    pub final_flag: bool,
    /// Target Transfer Tag: the tag to echo for more, or 0xffffffff.
    pub ttt: u32,
}

/// Delivers a long text answer in pieces (RFC 7143 §11.11: C bit and TTT).
#[derive(Debug, Clone)]
pub struct TextContinuation {
    data: Bytes,
    offset: usize,
    max: usize,
    ttt: u32,
    sent_last: bool,
}

impl TextContinuation {
    /// `max` is the initiator's MaxRecvDataSegmentLength; `ttt` a tag the
    /// session layer allocates (not 0xffffffff).
    pub fn new(data: Bytes, max: usize, ttt: u32) -> Self {
        TextContinuation {
            data,
            offset: 0,
            max: max.max(1),
            ttt,
            sent_last: false,
        }
    }

    /// Is there still something to send?
    pub fn is_done(&self) -> bool {
        self.sent_last
    }

    /// The tag an initiator echoes to ask for the next piece.
    pub fn ttt(&self) -> u32 {
        self.ttt
    }

    /// Does an empty Text Request with this TTT continue this answer?
    pub fn continues(&self, request_ttt: u32) -> bool {
        !self.sent_last && self.offset > 0 && request_ttt == self.ttt
    }

    /// The next piece.
    pub fn next_piece(&mut self) -> TextPiece {
        let end = (self.offset + self.max).min(self.data.len());
        let data = self.data.slice(self.offset..end);
        self.offset = end;
        let more = end < self.data.len();
        self.sent_last = !more;
        TextPiece {
            data,
            continue_flag: more,
            final_flag: !more,
            ttt: if more { self.ttt } else { RESERVED_TTT },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::TextParams;

    fn targets() -> Vec<(String, Vec<String>)> {
        vec![
            (
                "iqn.2026-01.test:a".into(),
                vec!["192.0.2.1:3260,1".into(), "[2001:db8::1]:3260,1".into()],
            ),
            ("iqn.2026-01.test:b".into(), vec!["192.0.2.1:3260,1".into()]),
        ]
    }

    fn entries(t: &[(String, Vec<String>)]) -> Vec<TargetEntry<'_>> {
        t.iter()
            .map(|(n, a)| TargetEntry {
                name: n,
                addresses: a,
            })
            .collect()
    }

    #[test]
    fn all_name_and_empty() {
        let t = targets();
        let e = entries(&t);
        let all = build_response(SendTargetsRequest::parse("All"), &e, None, 65536).unwrap();
        let p = TextParams::parse(&all).unwrap();
        let keys: Vec<&str> = p.iter().map(|kv| kv.key).collect();
        assert_eq!(
            keys,
            [
                "TargetName",
                "TargetAddress",
                "TargetAddress",
                "TargetName",
                "TargetAddress"
            ]
        );
        assert_eq!(p.pairs()[2].value, "[2001:db8::1]:3260,1");
        let one = build_response(
            SendTargetsRequest::parse("IQN.2026-01.TEST:B"),
            &e,
            None,
            65536,
        )
        .unwrap();
        assert_eq!(
            one,
            b"TargetName=iqn.2026-01.test:b\0TargetAddress=192.0.2.1:3260,1\0"
        );
        let own = build_response(
            SendTargetsRequest::parse(""),
            &e,
            Some("iqn.2026-01.test:a"),
            65536,
        )
        .unwrap();
        assert!(own.starts_with(b"TargetName=iqn.2026-01.test:a\0"));
        assert_eq!(
            build_response(SendTargetsRequest::parse(""), &e, None, 65536).unwrap(),
            b""
        );
        let rej = build_response(
            SendTargetsRequest::All,
            &e,
            Some("iqn.2026-01.test:a"),
            65536,
        )
        .unwrap();
        assert_eq!(rej, b"SendTargets=Reject\0");
        assert_eq!(
            build_response(SendTargetsRequest::Target("iqn.x:none"), &e, None, 65536).unwrap(),
            b""
        );
        assert_eq!(
            target_address("192.0.2.9:3260".parse().unwrap(), 7),
            "192.0.2.9:3260,7"
        );
    }

    #[test]
    fn addresses_advertised_wildcard_and_loopback() {
        let b = |s: &[&str]| -> Vec<std::net::SocketAddr> {
            s.iter().map(|a| a.parse().unwrap()).collect()
        };
        let remote: std::net::SocketAddr = "192.0.2.7:3260".parse().unwrap();
        let local: std::net::SocketAddr = "127.0.0.1:3260".parse().unwrap();
        // A wildcard portal is shown as the address the host reached.
        assert_eq!(
            target_addresses(&b(&["0.0.0.0:3260"]), remote, &[], 1),
            ["192.0.2.7:3260,1"]
        );
        // Loopback portals only to a host on loopback; no duplicates.
        let bound = b(&["127.0.0.1:3260", "192.0.2.7:3260", "0.0.0.0:3260"]);
        assert_eq!(
            target_addresses(&bound, remote, &[], 2),
            ["192.0.2.7:3260,2"]
        );
        assert_eq!(
            target_addresses(&bound, local, &[], 2),
            ["127.0.0.1:3260,2", "192.0.2.7:3260,2"]
        );
        assert_eq!(
            target_addresses(
                &b(&["[::]:3260"]),
                "[2001:db8::5]:3260".parse().unwrap(),
                &[],
                1
            ),
            ["[2001:db8::5]:3260,1"]
        );
        // What the operator advertises replaces the portals' addresses.
        let adv = vec![
            "gw.example.net:13260".to_string(),
            "[2001:db8::9]".to_string(),
        ];
        assert_eq!(
            target_addresses(&bound, remote, &adv, 3),
            ["gw.example.net:13260,3", "[2001:db8::9],3"]
        );
    }

    #[test]
    fn advertised_addresses_are_checked() {
        for ok in [
            "203.0.113.5:3260",
            "203.0.113.5",
            "gw-1.example.net:13260",
            "[2001:db8::1]:3260",
            "[2001:db8::1]",
        ] {
            assert_eq!(check_advertised_address(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "2001:db8::1",
            "[2001:db8::1",
            "[not-v6]:3260",
            "[2001:db8::1]3260",
            "host:0",
            "host:65536",
            "host:",
            "bad_name:3260",
            "-host:3260",
            "a..b:3260",
            "host,1:3260",
            "host=1",
            "two words",
        ] {
            assert!(check_advertised_address(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn long_answer_in_pieces() {
        let names: Vec<(String, Vec<String>)> = (0..500)
            .map(|i| {
                (
                    format!("iqn.2026-01.test:disk{i:04}"),
                    vec![format!("192.0.2.1:3260,{}", i % 4)],
                )
            })
            .collect();
        let e = entries(&names);
        let all = build_response(SendTargetsRequest::All, &e, None, 1 << 20).unwrap();
        assert!(all.len() > 3 * 8192);
        let mut c = TextContinuation::new(Bytes::from(all.clone()), 8192, 0x55);
        let mut joined = Vec::new();
        let mut pieces = 0;
        loop {
            let p = c.next_piece();
            pieces += 1;
            assert!(p.data.len() <= 8192);
            joined.extend_from_slice(&p.data);
            if p.final_flag {
                assert!(!p.continue_flag);
                assert_eq!(p.ttt, RESERVED_TTT);
                break;
            }
            assert!(p.continue_flag);
            assert_eq!(p.ttt, 0x55);
            assert!(c.continues(0x55));
            assert!(!c.continues(0x56));
        }
        assert!(c.is_done());
        assert_eq!(pieces, all.len().div_ceil(8192));
        assert_eq!(joined, all);
        let p = TextParams::parse(&joined).unwrap();
        assert_eq!(p.iter().filter(|kv| kv.key == "TargetName").count(), 500);
        // An empty answer is one final piece.
        let mut c = TextContinuation::new(Bytes::new(), 8192, 1);
        let p = c.next_piece();
        assert!(p.final_flag && p.data.is_empty());
        assert!(c.is_done());
    }
}
