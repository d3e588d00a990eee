//! CHAP for iSCSI (RFC 1994; RFC 7143 §12.1.3), both directions.
//!
//! Exchange (target as authenticator, optionally mutual):
//!
//! ```text
//! I→T  AuthMethod=CHAP,None            T→I  AuthMethod=CHAP
//! I→T  CHAP_A=7,5                      T→I  CHAP_A=7 CHAP_I=<I> CHAP_C=<C>
//! I→T  CHAP_N=<N> CHAP_R=<R>           T→I  (mutual: CHAP_N=<N'> CHAP_R=<R'>)
//!      (mutual: CHAP_I=<I'> CHAP_C=<C'>)
//! ```
//!
//! `CHAP_R = H(CHAP_I || secret || CHAP_C)`, with H the algorithm CHAP_A
//! names. Algorithm numbers are IANA's "PPP Authentication Algorithms"
//! registry: 5 = MD5, 6 = SHA-1, 7 = SHA-256, 8 = SHA3-256; this module
//! implements 5 and 7.
//!
//! Safety rules enforced:
//! - our challenges come from a CSPRNG and are at least as long as the hash
//!   (default 32 bytes for SHA-256, 16 for MD5; configurable upward);
//! - responses compare in constant time;
//! - a reflected challenge (the initiator's mutual CHAP_C equal to ours) is
//!   refused (RFC 7143 §12.1.3). The initiator's CHAP_I may equal ours: the
//!   RFC does not forbid it, the response still covers a different challenge,
//!   and initiators pick it freely (libiscsi counts from 1, so refusing it
//!   failed one login in 256 against our random identifier);
//! - secrets shorter than [`MIN_SECRET_LEN`] (12 bytes, RFC 7143 §12.1.3's
//!   96-bit recommendation) are refused by default, and the two directions of
//!   mutual CHAP must not share a secret;
//! - binary values are accepted in hex (`0x`) or base64 (`0b`); we send hex.

use rand::{CryptoRng, Rng};
use thiserror::Error;

use crate::negotiate::Pair;
use crate::text::{encode_hex, list_items, parse_binary, parse_number};

/// Default minimum CHAP secret length in bytes.
pub const MIN_SECRET_LEN: usize = 12;
/// Longest challenge we accept from a peer, in bytes (the value limit of a
/// large binary value, 8192 encoded bytes, decodes to at most 4095 bytes in hex).
pub const MAX_CHALLENGE_LEN: usize = 4096;

/// A CHAP algorithm number (CHAP_A). Open: unknown values parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChapAlgorithm(pub u8);

impl ChapAlgorithm {
    /// MD5 (RFC 1994).
    pub const MD5: ChapAlgorithm = ChapAlgorithm(5);
    /// SHA-1 (IANA; not implemented here).
    pub const SHA1: ChapAlgorithm = ChapAlgorithm(6);
    /// SHA-256 (IANA PPP Authentication Algorithms, value 7).
    pub const SHA256: ChapAlgorithm = ChapAlgorithm(7);
    /// SHA3-256 (IANA; not implemented here).
    pub const SHA3_256: ChapAlgorithm = ChapAlgorithm(8);

    /// Length of the hash, for the algorithms implemented here.
    pub fn digest_len(self) -> Option<usize> {
        match self {
            ChapAlgorithm::MD5 => Some(16),
            ChapAlgorithm::SHA256 => Some(32),
            _ => None,
        }
    }

    /// Is this algorithm implemented?
    pub fn is_supported(self) -> bool {
        self.digest_len().is_some()
    }
}

/// Compute `H(id || secret || challenge)`; `None` for an unimplemented algorithm.
pub fn compute_response(
    alg: ChapAlgorithm,
    id: u8,
    secret: &[u8],
    challenge: &[u8],
) -> Option<Vec<u8>> {
    use md5::Digest as _;
    match alg {
        ChapAlgorithm::MD5 => {
            let mut h = md5::Md5::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            Some(h.finalize().to_vec())
        }
        ChapAlgorithm::SHA256 => {
            let mut h = sha2::Sha256::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            Some(h.finalize().to_vec())
        }
        _ => None,
    }
}

/// Compare in time independent of where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from short-circuiting the fold.
    std::hint::black_box(diff) == 0
}

/// A CHAP name and secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// CHAP_N: the name this side sends.
    pub name: String,
    /// The shared secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("name", &self.name)
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .finish()
    }
}

impl ChapCredentials {
    /// Credentials.
    pub fn new(name: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        ChapCredentials {
            name: name.into(),
            secret: secret.into(),
        }
    }
}

/// CHAP configuration of one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapConfig {
    /// Algorithms we accept, most preferred first.
    pub algorithms: Vec<ChapAlgorithm>,
    /// Our challenge length in bytes (raised to the hash length if lower).
    pub challenge_len: usize,
    /// Shortest secret we use or accept.
    pub min_secret_len: usize,
}

impl Default for ChapConfig {
    fn default() -> Self {
        ChapConfig {
            algorithms: vec![ChapAlgorithm::SHA256, ChapAlgorithm::MD5],
            challenge_len: 32,
            min_secret_len: MIN_SECRET_LEN,
        }
    }
}

/// CHAP errors; each fails the login with Status 0x0201 (authentication
/// failure) unless [`ChapError::login_status`] says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ChapError {
    /// No algorithm in common.
    #[error("no common CHAP algorithm")]
    NoCommonAlgorithm,
    /// A required CHAP key is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A CHAP key has a malformed value.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The response does not match.
    #[error("CHAP response does not match")]
    BadResponse,
    /// The name is unknown to the authenticator.
    #[error("unknown CHAP name")]
    UnknownName,
    /// The peer's challenge equals ours (reflection attack).
    #[error("reflected CHAP challenge")]
    ReflectedChallenge,
    /// A secret is shorter than the configured minimum.
    #[error("CHAP secret shorter than {min} bytes")]
    SecretTooShort {
        /// The minimum.
        min: usize,
    },
    /// Both directions of mutual CHAP use the same secret.
    #[error("the same secret is used in both directions")]
    SecretReuse,
    /// The peer asked for mutual CHAP and we have no credentials for it, or
    /// we require mutual CHAP and the peer did not ask.
    #[error("mutual CHAP mismatch")]
    MutualMismatch,
    /// A CHAP key arrived out of order.
    #[error("unexpected CHAP key")]
    Unexpected,
}

impl ChapError {
    /// The Login Status (class, detail): local configuration faults are
    /// target errors (0x0300), the rest authentication failures (0x0201).
    pub fn login_status(&self) -> (u8, u8) {
        match self {
            ChapError::SecretTooShort { .. } | ChapError::SecretReuse => (0x03, 0x00),
            _ => (0x02, 0x01),
        }
    }
}

fn parse_alg_list(value: &str) -> impl Iterator<Item = ChapAlgorithm> + '_ {
    list_items(value).filter_map(|v| {
        parse_number(v)
            .ok()
            .and_then(|n| u8::try_from(n).ok())
            .map(ChapAlgorithm)
    })
}

fn parse_id(value: &str) -> Result<u8, ChapError> {
    parse_number(value)
        .ok()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(ChapError::Malformed("CHAP_I"))
}

fn parse_challenge(value: &str) -> Result<Vec<u8>, ChapError> {
    let c = parse_binary(value).map_err(|_| ChapError::Malformed("CHAP_C"))?;
    if c.is_empty() || c.len() > MAX_CHALLENGE_LEN {
        return Err(ChapError::Malformed("CHAP_C"));
    }
    Ok(c)
}

fn new_challenge<R: CryptoRng + ?Sized>(
    rng: &mut R,
    alg: ChapAlgorithm,
    config: &ChapConfig,
) -> (u8, Vec<u8>) {
    let len = config
        .challenge_len
        .max(alg.digest_len().unwrap_or(16))
        .min(MAX_CHALLENGE_LEN);
    let mut c = vec![0u8; len];
    rng.fill_bytes(&mut c);
    let mut id = [0u8; 1];
    rng.fill_bytes(&mut id);
    (id[0], c)
}

/// The peer's mutual challenge, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MutualChallenge {
    id: u8,
    challenge: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetState {
    AwaitAlgorithms,
    AwaitResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
}

/// The target side of CHAP: authenticator of the initiator, and responder
/// to the initiator's challenge in mutual CHAP.
#[derive(Debug, Clone)]
pub struct TargetChap {
    config: ChapConfig,
    state: TargetState,
}

/// The CHAP keys of one initiator PDU, as received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChapKeys<'a> {
    /// CHAP_A.
    pub a: Option<&'a str>,
    /// CHAP_I.
    pub i: Option<&'a str>,
    /// CHAP_C.
    pub c: Option<&'a str>,
    /// CHAP_N.
    pub n: Option<&'a str>,
    /// CHAP_R.
    pub r: Option<&'a str>,
}

impl ChapKeys<'_> {
    /// No CHAP key at all.
    pub fn is_empty(&self) -> bool {
        self.a.is_none()
            && self.i.is_none()
            && self.c.is_none()
            && self.n.is_none()
            && self.r.is_none()
    }
}

/// What the authenticator needs to check a response: the secret the named
/// initiator must use, and (for mutual CHAP) the target's own credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSecrets {
    /// The secret expected from the initiator for the CHAP_N it sent.
    pub initiator_secret: Vec<u8>,
    /// The target's name and secret for mutual CHAP, if configured.
    pub mutual: Option<ChapCredentials>,
    /// Refuse a login that does not ask for mutual CHAP.
    pub require_mutual: bool,
}

impl TargetChap {
    /// A fresh exchange.
    pub fn new(config: ChapConfig) -> Self {
        TargetChap {
            config,
            state: TargetState::AwaitAlgorithms,
        }
    }

    /// Has the initiator been authenticated?
    pub fn is_done(&self) -> bool {
        self.state == TargetState::Done
    }

    /// Are we waiting for CHAP_N/CHAP_R?
    pub fn awaiting_response(&self) -> bool {
        matches!(self.state, TargetState::AwaitResponse { .. })
    }

    /// Step 2: the initiator's CHAP_A list. Answers CHAP_A, CHAP_I, CHAP_C.
    pub fn on_algorithms<R: CryptoRng + ?Sized>(
        &mut self,
        chap_a: &str,
        rng: &mut R,
    ) -> Result<Vec<Pair>, ChapError> {
        if self.state != TargetState::AwaitAlgorithms {
            return Err(ChapError::Unexpected);
        }
        let alg = parse_alg_list(chap_a)
            .find(|a| a.is_supported() && self.config.algorithms.contains(a))
            .ok_or(ChapError::NoCommonAlgorithm)?;
        let (id, challenge) = new_challenge(rng, alg, &self.config);
        let out = vec![
            Pair::new("CHAP_A", alg.0.to_string()),
            Pair::new("CHAP_I", id.to_string()),
            Pair::new("CHAP_C", encode_hex(&challenge)),
        ];
        self.state = TargetState::AwaitResponse { alg, id, challenge };
        Ok(out)
    }

    /// Step 3: the initiator's CHAP_N/CHAP_R (and CHAP_I/CHAP_C for mutual).
    /// `secrets` looks up what the name must prove (None: unknown name).
    /// Answers, for mutual CHAP, the target's CHAP_N and CHAP_R.
    pub fn on_response(
        &mut self,
        keys: &ChapKeys<'_>,
        secrets: impl FnOnce(&str) -> Option<TargetSecrets>,
    ) -> Result<Vec<Pair>, ChapError> {
        let TargetState::AwaitResponse { alg, id, challenge } = &self.state else {
            return Err(ChapError::Unexpected);
        };
        let (alg, id) = (*alg, *id);
        let name = keys.n.ok_or(ChapError::Missing("CHAP_N"))?;
        let r = keys.r.ok_or(ChapError::Missing("CHAP_R"))?;
        let r = parse_binary(r).map_err(|_| ChapError::Malformed("CHAP_R"))?;
        let mutual = match (keys.i, keys.c) {
            (Some(i), Some(c)) => Some(MutualChallenge {
                id: parse_id(i)?,
                challenge: parse_challenge(c)?,
            }),
            (None, None) => None,
            (None, Some(_)) => return Err(ChapError::Missing("CHAP_I")),
            (Some(_), None) => return Err(ChapError::Missing("CHAP_C")),
        };
        if let Some(m) = &mutual
            && constant_time_eq(&m.challenge, challenge)
        {
            return Err(ChapError::ReflectedChallenge);
        }
        let s = secrets(name).ok_or(ChapError::UnknownName)?;
        if s.initiator_secret.len() < self.config.min_secret_len {
            return Err(ChapError::SecretTooShort {
                min: self.config.min_secret_len,
            });
        }
        let expected = compute_response(alg, id, &s.initiator_secret, challenge)
            .ok_or(ChapError::NoCommonAlgorithm)?;
        if !constant_time_eq(&expected, &r) {
            return Err(ChapError::BadResponse);
        }
        let out = match (mutual, s.mutual) {
            (None, _) if s.require_mutual => return Err(ChapError::MutualMismatch),
            (None, _) => Vec::new(),
            (Some(_), None) => return Err(ChapError::MutualMismatch),
            (Some(m), Some(ours)) => {
                if ours.secret.len() < self.config.min_secret_len {
                    return Err(ChapError::SecretTooShort {
                        min: self.config.min_secret_len,
                    });
                }
                if constant_time_eq(&ours.secret, &s.initiator_secret) {
                    return Err(ChapError::SecretReuse);
                }
                let resp = compute_response(alg, m.id, &ours.secret, &m.challenge)
                    .ok_or(ChapError::NoCommonAlgorithm)?;
                vec![
                    Pair::new("CHAP_N", ours.name),
                    Pair::new("CHAP_R", encode_hex(&resp)),
                ]
            }
        };
        self.state = TargetState::Done;
        Ok(out)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum InitiatorState {
    Start,
    AwaitChallenge,
    AwaitMutual {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
}

/// The initiator side of CHAP: answers the target's challenge, and in mutual
/// CHAP challenges the target and checks its answer.
#[derive(Debug, Clone)]
pub struct InitiatorChap {
    config: ChapConfig,
    credentials: ChapCredentials,
    /// The target's expected name and secret, for mutual CHAP.
    target: Option<ChapCredentials>,
    state: InitiatorState,
}

impl InitiatorChap {
    /// A fresh exchange. `target` enables mutual CHAP.
    pub fn new(
        config: ChapConfig,
        credentials: ChapCredentials,
        target: Option<ChapCredentials>,
    ) -> Result<Self, ChapError> {
        if credentials.secret.len() < config.min_secret_len
            || target
                .as_ref()
                .is_some_and(|t| t.secret.len() < config.min_secret_len)
        {
            return Err(ChapError::SecretTooShort {
                min: config.min_secret_len,
            });
        }
        if target
            .as_ref()
            .is_some_and(|t| t.secret == credentials.secret)
        {
            return Err(ChapError::SecretReuse);
        }
        Ok(InitiatorChap {
            config,
            credentials,
            target,
            state: InitiatorState::Start,
        })
    }

    /// Is authentication (both ways if mutual) complete?
    pub fn is_done(&self) -> bool {
        self.state == InitiatorState::Done
    }

    /// Awaiting the target's mutual answer?
    pub fn awaiting_mutual(&self) -> bool {
        matches!(self.state, InitiatorState::AwaitMutual { .. })
    }

    /// Step 2: our CHAP_A offer.
    pub fn algorithms(&mut self) -> Pair {
        self.state = InitiatorState::AwaitChallenge;
        let list: Vec<String> = self
            .config
            .algorithms
            .iter()
            .filter(|a| a.is_supported())
            .map(|a| a.0.to_string())
            .collect();
        Pair::new("CHAP_A", list.join(","))
    }

    /// Step 3: the target's CHAP_A/CHAP_I/CHAP_C. Answers CHAP_N, CHAP_R
    /// and, for mutual CHAP, our CHAP_I and CHAP_C.
    pub fn on_challenge<R: CryptoRng + ?Sized>(
        &mut self,
        keys: &ChapKeys<'_>,
        rng: &mut R,
    ) -> Result<Vec<Pair>, ChapError> {
        if self.state != InitiatorState::AwaitChallenge {
            return Err(ChapError::Unexpected);
        }
        let a = keys.a.ok_or(ChapError::Missing("CHAP_A"))?;
        let alg = parse_number(a)
            .ok()
            .and_then(|n| u8::try_from(n).ok())
            .map(ChapAlgorithm)
            .ok_or(ChapError::NoCommonAlgorithm)?;
        if !alg.is_supported() || !self.config.algorithms.contains(&alg) {
            return Err(ChapError::NoCommonAlgorithm);
        }
        let id = parse_id(keys.i.ok_or(ChapError::Missing("CHAP_I"))?)?;
        let challenge = parse_challenge(keys.c.ok_or(ChapError::Missing("CHAP_C"))?)?;
        let resp = compute_response(alg, id, &self.credentials.secret, &challenge)
            .ok_or(ChapError::NoCommonAlgorithm)?;
        let mut out = vec![
            Pair::new("CHAP_N", self.credentials.name.clone()),
            Pair::new("CHAP_R", encode_hex(&resp)),
        ];
        if self.target.is_some() {
            let (mut my_id, mut mine) = new_challenge(rng, alg, &self.config);
            // Never reuse the target's identifier or reflect its challenge.
            if my_id == id {
                my_id = my_id.wrapping_add(1);
            }
            while mine == challenge {
                rng.fill_bytes(&mut mine);
            }
            out.push(Pair::new("CHAP_I", my_id.to_string()));
            out.push(Pair::new("CHAP_C", encode_hex(&mine)));
            self.state = InitiatorState::AwaitMutual {
                alg,
                id: my_id,
                challenge: mine,
            };
        } else {
            self.state = InitiatorState::Done;
        }
        Ok(out)
    }

    /// Step 4 (mutual only): the target's CHAP_N/CHAP_R.
    pub fn on_mutual_response(&mut self, keys: &ChapKeys<'_>) -> Result<(), ChapError> {
        let InitiatorState::AwaitMutual { alg, id, challenge } = &self.state else {
            return Err(ChapError::Unexpected);
        };
        let target = self.target.as_ref().ok_or(ChapError::MutualMismatch)?;
        let n = keys.n.ok_or(ChapError::Missing("CHAP_N"))?;
        let r = parse_binary(keys.r.ok_or(ChapError::Missing("CHAP_R"))?)
            .map_err(|_| ChapError::Malformed("CHAP_R"))?;
        if n != target.name {
            return Err(ChapError::UnknownName);
        }
        let expected = compute_response(*alg, *id, &target.secret, challenge)
            .ok_or(ChapError::NoCommonAlgorithm)?;
        if !constant_time_eq(&expected, &r) {
            return Err(ChapError::BadResponse);
        }
        self.state = InitiatorState::Done;
        Ok(())
    }
}

/// A deterministic CSPRNG-shaped generator for tests and fuzzing only: it
/// is *not* secure (a counter through SHA-256), but lets tests replay.
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        TestRng(seed)
    }
}

impl rand::TryRng for TestRng {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        use sha2::Digest as _;
        for chunk in dst.chunks_mut(32) {
            self.0 = self.0.wrapping_add(1);
            let h = sha2::Sha256::digest(self.0.to_le_bytes());
            for (d, s) in chunk.iter_mut().zip(h.iter()) {
                *d = *s;
            }
        }
        Ok(())
    }
}

impl rand::TryCryptoRng for TestRng {}

/// Fill `buf` from a CSPRNG (helper so callers need not name the trait).
pub fn fill_random<R: Rng + ?Sized>(rng: &mut R, buf: &mut [u8]) {
    rng.fill_bytes(buf);
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::field_reassign_with_default
)]
mod tests {
    use super::*;

    fn keys<'a>(pairs: &'a [Pair]) -> ChapKeys<'a> {
        let g = |k: &str| pairs.iter().find(|p| p.key == k).map(|p| p.value.as_str());
        ChapKeys {
            a: g("CHAP_A"),
            i: g("CHAP_I"),
            c: g("CHAP_C"),
            n: g("CHAP_N"),
            r: g("CHAP_R"),
        }
    }

    #[test]
    fn rfc1994_md5_vector() {
        // MD5(0x01 || "secret" || 16 zero bytes), computed independently:
        // (checked with Python hashlib).
        let r = compute_response(ChapAlgorithm::MD5, 1, b"secret", &[0u8; 16]).unwrap();
        assert_eq!(encode_hex(&r), "0x7570c653cdf4755ccffcaa80f29268d1");
    }

    #[test]
    fn sha256_vector() {
        let r = compute_response(ChapAlgorithm::SHA256, 0x2a, b"0123456789ab", b"abc").unwrap();
        assert_eq!(
            encode_hex(&r),
            "0x0fb8e272bbd4a5fe73f93766e8476e12239b8cc1d113b8231fe8db1e0015fc92"
        );
    }

    fn run(
        alg_pref: &[ChapAlgorithm],
        mutual: bool,
        target_secret_for_initiator: &[u8],
    ) -> Result<(), ChapError> {
        let mut rng = TestRng::new(7);
        let mut t = TargetChap::new(ChapConfig::default());
        let mut icfg = ChapConfig::default();
        icfg.algorithms = alg_pref.to_vec();
        let tcreds = ChapCredentials::new("tgt", b"target-secret-0001".to_vec());
        let mut i = InitiatorChap::new(
            icfg,
            ChapCredentials::new("iqn.init", b"initiator-secret".to_vec()),
            mutual.then(|| tcreds.clone()),
        )?;
        let a = i.algorithms();
        let challenge = t.on_algorithms(&a.value, &mut rng)?;
        let resp = i.on_challenge(&keys(&challenge), &mut rng)?;
        let mutual_resp = t.on_response(&keys(&resp), |n| {
            (n == "iqn.init").then(|| TargetSecrets {
                initiator_secret: target_secret_for_initiator.to_vec(),
                mutual: Some(tcreds.clone()),
                require_mutual: false,
            })
        })?;
        assert!(t.is_done());
        if mutual {
            i.on_mutual_response(&keys(&mutual_resp))?;
        } else {
            assert!(mutual_resp.is_empty());
        }
        assert!(i.is_done());
        Ok(())
    }

    #[test]
    fn one_way_and_mutual() {
        run(&[ChapAlgorithm::MD5], false, b"initiator-secret").unwrap();
        run(&[ChapAlgorithm::SHA256], false, b"initiator-secret").unwrap();
        run(
            &[ChapAlgorithm::SHA256, ChapAlgorithm::MD5],
            true,
            b"initiator-secret",
        )
        .unwrap();
        run(&[ChapAlgorithm::MD5], true, b"initiator-secret").unwrap();
        assert_eq!(
            run(&[ChapAlgorithm::MD5], false, b"wrong-secret-123"),
            Err(ChapError::BadResponse)
        );
        assert_eq!(
            run(&[ChapAlgorithm::SHA256], true, b"wrong-secret-123"),
            Err(ChapError::BadResponse)
        );
        assert_eq!(
            run(&[ChapAlgorithm::MD5], false, b"short"),
            Err(ChapError::SecretTooShort { min: 12 })
        );
    }

    #[test]
    fn algorithm_choice() {
        let mut rng = TestRng::new(1);
        let mut t = TargetChap::new(ChapConfig::default());
        let out = t.on_algorithms("6,5,7", &mut rng).unwrap();
        assert_eq!(out[0].value, "5"); // first of the offer we support
        assert_eq!(parse_binary(&out[2].value).unwrap().len(), 32);
        let mut t = TargetChap::new(ChapConfig::default());
        assert_eq!(
            t.on_algorithms("6,8,x", &mut rng),
            Err(ChapError::NoCommonAlgorithm)
        );
    }

    #[test]
    fn reflection_refused_identifier_reuse_allowed() {
        let mut rng = TestRng::new(3);
        let mut t = TargetChap::new(ChapConfig::default());
        let ch = t.on_algorithms("5", &mut rng).unwrap();
        let k = keys(&ch);
        let id: u8 = k.i.unwrap().parse().unwrap();
        let c = parse_binary(k.c.unwrap()).unwrap();
        let r =
            encode_hex(&compute_response(ChapAlgorithm::MD5, id, b"initiator-secret", &c).unwrap());
        let secrets = |_: &str| {
            Some(TargetSecrets {
                initiator_secret: b"initiator-secret".to_vec(),
                mutual: Some(ChapCredentials::new("t", b"another-secret-1".to_vec())),
                require_mutual: false,
            })
        };
        let other_id = id.wrapping_add(1).to_string();
        let reflected = ChapKeys {
            n: Some("i"),
            r: Some(&r),
            i: Some(&other_id),
            c: k.c,
            a: None,
        };
        assert_eq!(
            t.clone().on_response(&reflected, secrets),
            Err(ChapError::ReflectedChallenge)
        );
        // The same identifier with the initiator's own challenge is fine
        // (libiscsi always sends CHAP_I=1 on a first login), and the answer
        // covers that identifier and challenge.
        let same_id = ChapKeys {
            n: Some("i"),
            r: Some(&r),
            i: k.i,
            c: Some("0x0102030405060708"),
            a: None,
        };
        let out = t.clone().on_response(&same_id, secrets).unwrap();
        let expected = compute_response(
            ChapAlgorithm::MD5,
            id,
            b"another-secret-1",
            &[1, 2, 3, 4, 5, 6, 7, 8],
        )
        .unwrap();
        assert_eq!(out[1].value, encode_hex(&expected));
        let ok = ChapKeys {
            n: Some("i"),
            r: Some(&r),
            i: Some(&other_id),
            c: Some("0bAQIDBAUGBwg="),
            a: None,
        };
        let out = t.clone().on_response(&ok, secrets).unwrap();
        assert_eq!(out[0].value, "t");
        // Unknown name, missing keys, mutual required.
        assert_eq!(
            t.clone().on_response(&ok, |_| None),
            Err(ChapError::UnknownName)
        );
        let no_r = ChapKeys {
            n: Some("i"),
            ..Default::default()
        };
        assert_eq!(
            t.clone().on_response(&no_r, secrets),
            Err(ChapError::Missing("CHAP_R"))
        );
        let one_way = ChapKeys {
            n: Some("i"),
            r: Some(&r),
            ..Default::default()
        };
        let required = |_: &str| {
            Some(TargetSecrets {
                initiator_secret: b"initiator-secret".to_vec(),
                mutual: None,
                require_mutual: true,
            })
        };
        assert_eq!(
            t.clone().on_response(&one_way, required),
            Err(ChapError::MutualMismatch)
        );
        assert!(t.on_response(&one_way, secrets).unwrap().is_empty());
    }

    #[test]
    fn secret_rules() {
        let c = ChapCredentials::new("i", b"same-secret-xyz".to_vec());
        assert_eq!(
            InitiatorChap::new(ChapConfig::default(), c.clone(), Some(c.clone())).err(),
            Some(ChapError::SecretReuse)
        );
        assert_eq!(
            InitiatorChap::new(
                ChapConfig::default(),
                ChapCredentials::new("i", b"short".to_vec()),
                None
            )
            .err(),
            Some(ChapError::SecretTooShort { min: 12 })
        );
        assert!(format!("{c:?}").contains("<15 bytes>"));
        assert!(!format!("{c:?}").contains("same-secret"));
    }

    #[test]
    fn ct_eq() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
