//! The special frame exchange on a new TCP connection (RFC 3821 §7.1).
//!
//! - The connecting side sends its FSF first and waits for the echo. It
//!   closes if bytes 28–71 come back changed or the echoed destination is
//!   0 ([`check_echo`]).
//! - The accepting side refuses a nonce it has seen from the same address
//!   ([`NonceCache`]), refuses an FSF naming another switch as
//!   destination or an unknown peer, fills in its own name when asked
//!   ("who are you?": destination 0) and then echoes with Ch set and
//!   closes, else echoes unchanged ([`Acceptor::accept`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use unifab_fc::wire::Wwn;

use crate::wire::WireError;
use crate::wire::fsf::{SPECIAL_FRAME_LEN, SpecialFrame, SpecialFrameRepr};

/// Why a special frame exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The bytes are not a special frame.
    #[error("not a special frame: {0}")]
    Malformed(WireError),
    /// The nonce was used before from this address.
    #[error("connection nonce {0:#018x} replayed")]
    NonceReplay(u64),
    /// The FSF names another switch as destination.
    #[error("special frame is for switch {got}, this is {expected}")]
    WrongDestination {
        /// This switch.
        expected: Wwn,
        /// What the FSF named.
        got: Wwn,
    },
    /// The peer is not one this side has a tunnel for.
    #[error("no tunnel is configured for switch {0}")]
    UnknownPeer(Wwn),
    /// The echo differs from what was sent.
    #[error("the acceptor changed the special frame")]
    EchoChanged,
    /// The acceptor did not name itself.
    #[error("the echoed destination name is 0")]
    EchoAnonymous,
    /// The peer is not the switch the tunnel expects.
    #[error("connected to switch {got}, expected {expected}")]
    UnexpectedPeer {
        /// Configured peer.
        expected: Wwn,
        /// The peer's name.
        got: Wwn,
    },
}

/// Checks the acceptor's echo of `sent`.
pub fn check_echo(
    sent: &[u8; SPECIAL_FRAME_LEN],
    echo: &[u8],
) -> Result<SpecialFrameRepr, HandshakeError> {
    let v = SpecialFrame::new_checked(echo).map_err(HandshakeError::Malformed)?;
    let r = SpecialFrameRepr::parse(&v);
    if r.destination_wwn == Wwn(0) {
        return Err(HandshakeError::EchoAnonymous);
    }
    let s = SpecialFrame::new_checked(&sent[..]).map_err(HandshakeError::Malformed)?;
    if r.changed || v.echoed_part() != s.echoed_part() {
        return Err(HandshakeError::EchoChanged);
    }
    Ok(r)
}

/// Nonces seen per peer address, the most recent `per_peer` of each, for
/// at most [`NonceCache::MAX_ADDRESSES`] addresses (the one heard from
/// longest ago is forgotten first).
#[derive(Debug, Clone)]
pub struct NonceCache {
    per_peer: usize,
    seen: HashMap<IpAddr, VecDeque<u64>>,
    /// Addresses in `seen`, least recently heard from first.
    order: VecDeque<IpAddr>,
}

impl NonceCache {
    /// Addresses remembered at once. The acceptor records a nonce only
    /// for a connection from a switch it has a tunnel for, but on a
    /// plaintext listener anyone can claim that switch's name, from any
    /// number of addresses: without a bound, each would cost up to
    /// `per_peer` × 8 bytes for as long as the process runs.
    pub const MAX_ADDRESSES: usize = 64;

    /// Remembers up to `per_peer` nonces per address.
    pub fn new(per_peer: usize) -> NonceCache {
        NonceCache {
            per_peer: per_peer.max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `nonce` was seen from `peer` before.
    pub fn seen(&self, peer: IpAddr, nonce: u64) -> bool {
        self.seen.get(&peer).is_some_and(|q| q.contains(&nonce))
    }

    /// Records `nonce` from `peer`; `false` if it was seen before.
    pub fn check_and_insert(&mut self, peer: IpAddr, nonce: u64) -> bool {
        if self.seen(peer, nonce) {
            return false;
        }
        if let Some(i) = self.order.iter().position(|a| *a == peer) {
            self.order.remove(i);
        } else if self.order.len() >= Self::MAX_ADDRESSES
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.order.push_back(peer);
        let q = self.seen.entry(peer).or_default();
        if q.len() >= self.per_peer {
            q.pop_front();
        }
        q.push_back(nonce);
        true
    }

    /// Addresses remembered now.
    pub fn addresses(&self) -> usize {
        self.seen.len()
    }
}

/// What the acceptor decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Echo these bytes and keep the connection: it joins (or creates)
    /// the link of `repr.source_wwn` / `repr.entity_id`.
    Join {
        /// The FSF as received.
        repr: SpecialFrameRepr,
        /// The echo (identical bytes).
        echo: [u8; SPECIAL_FRAME_LEN],
    },
    /// The connector asked who we are: echo this (Ch set, our name
    /// filled in), then close.
    Identify([u8; SPECIAL_FRAME_LEN]),
}

/// The accepting side.
#[derive(Debug, Clone)]
pub struct Acceptor {
    /// This switch's name.
    pub local_wwn: Wwn,
    /// Nonce replay protection.
    pub nonces: NonceCache,
}

impl Acceptor {
    /// An acceptor for switch `local_wwn`.
    pub fn new(local_wwn: Wwn) -> Acceptor {
        Acceptor {
            local_wwn,
            nonces: NonceCache::new(4096),
        }
    }

    /// Handles the first 76 bytes of a connection from `peer`. `known`
    /// says whether a tunnel exists for the source switch.
    pub fn accept(
        &mut self,
        peer: IpAddr,
        bytes: &[u8],
        known: impl Fn(&SpecialFrameRepr) -> bool,
    ) -> Result<Accepted, HandshakeError> {
        let v = SpecialFrame::new_checked(bytes).map_err(HandshakeError::Malformed)?;
        let repr = SpecialFrameRepr::parse(&v);
        // A replay is refused whatever else the frame says; a nonce is
        // remembered only once the frame would join a tunnel (below), so
        // strangers and questions cost no memory.
        if self.nonces.seen(peer, repr.nonce) {
            return Err(HandshakeError::NonceReplay(repr.nonce));
        }
        if repr.destination_wwn == Wwn(0) {
            let mut r = repr;
            r.destination_wwn = self.local_wwn;
            r.changed = true;
            return Ok(Accepted::Identify(r.to_bytes()));
        }
        if repr.destination_wwn != self.local_wwn {
            return Err(HandshakeError::WrongDestination {
                expected: self.local_wwn,
                got: repr.destination_wwn,
            });
        }
        if !known(&repr) {
            return Err(HandshakeError::UnknownPeer(repr.source_wwn));
        }
        self.nonces.check_and_insert(peer, repr.nonce);
        let mut echo = [0u8; SPECIAL_FRAME_LEN];
        echo.copy_from_slice(bytes);
        Ok(Accepted::Join { repr, echo })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fsf::{EntityId, UsageFlags};

    fn fsf(nonce: u64, dest: u64) -> [u8; SPECIAL_FRAME_LEN] {
        SpecialFrameRepr {
            source_wwn: Wwn(0xa),
            entity_id: EntityId(1),
            nonce,
            usage_flags: UsageFlags::class_f(),
            destination_wwn: Wwn(dest),
            k_a_tov: 10_000,
            ..SpecialFrameRepr::default()
        }
        .to_bytes()
    }

    #[test]
    fn accept_echo_and_refusals() {
        let ip: IpAddr = [10, 0, 0, 1].into();
        let mut a = Acceptor::new(Wwn(0xb));
        let sent = fsf(1, 0xb);
        let Accepted::Join { echo, repr } = a.accept(ip, &sent, |_| true).unwrap() else {
            panic!()
        };
        assert_eq!(repr.source_wwn, Wwn(0xa));
        assert_eq!(check_echo(&sent, &echo).unwrap().nonce, 1);
        // Replay from the same address; the same nonce from elsewhere is fine.
        assert_eq!(
            a.accept(ip, &sent, |_| true),
            Err(HandshakeError::NonceReplay(1))
        );
        assert!(a.accept([10, 0, 0, 2].into(), &sent, |_| true).is_ok());
        assert!(matches!(
            a.accept(ip, &fsf(2, 0xc), |_| true),
            Err(HandshakeError::WrongDestination { .. })
        ));
        assert_eq!(
            a.accept(ip, &fsf(3, 0xb), |_| false),
            Err(HandshakeError::UnknownPeer(Wwn(0xa)))
        );
        assert!(matches!(
            a.accept(ip, &[0u8; 76], |_| true),
            Err(HandshakeError::Malformed(_))
        ));
        // "Who are you?" gets our name with Ch, which the connector refuses
        // as an echo but learns from.
        let who = fsf(4, 0);
        let Accepted::Identify(e) = a.accept(ip, &who, |_| true).unwrap() else {
            panic!()
        };
        let r = SpecialFrameRepr::parse(&SpecialFrame::new_checked(&e[..]).unwrap());
        assert!(r.changed && r.destination_wwn == Wwn(0xb));
        assert_eq!(check_echo(&who, &e), Err(HandshakeError::EchoChanged));
        // A changed echo is refused.
        let mut bad = sent;
        bad[50] ^= 1;
        assert_eq!(check_echo(&sent, &bad), Err(HandshakeError::EchoChanged));
    }

    /// Only a frame that joins a tunnel is remembered: strangers, wrong
    /// destinations and questions leave nothing behind, however many
    /// addresses they come from; known peers are remembered for at most
    /// `MAX_ADDRESSES` addresses, the longest silent forgotten first.
    #[test]
    fn nonces_are_remembered_for_joining_peers_only_and_bounded() {
        let mut a = Acceptor::new(Wwn(0xb));
        let ip = |i: u32| IpAddr::from(std::net::Ipv6Addr::from(u128::from(i)));
        for i in 0..10_000 {
            let _ = a.accept(ip(i), &fsf(u64::from(i), 0xb), |_| false);
            let _ = a.accept(ip(i), &fsf(u64::from(i), 0xc), |_| true);
            let _ = a.accept(ip(i), &fsf(u64::from(i), 0), |_| true);
        }
        assert_eq!(a.nonces.addresses(), 0);
        for i in 0..1_000 {
            assert!(a.accept(ip(i), &fsf(7, 0xb), |_| true).is_ok());
        }
        assert_eq!(a.nonces.addresses(), NonceCache::MAX_ADDRESSES);
        // The newest addresses still refuse a replay; the oldest were
        // forgotten.
        assert_eq!(
            a.accept(ip(999), &fsf(7, 0xb), |_| true),
            Err(HandshakeError::NonceReplay(7))
        );
        assert!(a.accept(ip(0), &fsf(7, 0xb), |_| true).is_ok());
        // A replayed nonce is refused before anything else is looked at.
        assert_eq!(
            a.accept(ip(0), &fsf(7, 0), |_| true),
            Err(HandshakeError::NonceReplay(7))
        );
    }
}
