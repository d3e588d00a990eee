//! iSCSI text format (RFC 7143 §6): `key=value\0` pairs carried in the data
//! segment of Login and Text PDUs.
//!
//! - [`TextParams::parse`] splits a complete data segment (all PDUs of a
//!   sequence already joined, see [`TextAccumulator`]) into borrowed
//!   [`KeyValue`] pairs without copying. Key and value limits of §6.1 are
//!   enforced here; whether a key may repeat is the negotiation layer's
//!   business (SendTargets answers repeat `TargetName`/`TargetAddress`).
//! - Value helpers: [`parse_number`] (decimal, `0x` hex, `0b` base64),
//!   [`parse_binary`] (`0x` hex or `0b` base64, for CHAP), [`parse_bool`],
//!   [`list_items`], [`Special`] values (`Reject`, `Irrelevant`, `NotUnderstood`),
//!   [`encode_hex`]/[`encode_base64`].
//! - [`TextWriter`] emits pairs with the same limits.
//! - [`TextError`] maps with one `From` to the answer to send: a Login Status
//!   during login, a Reject reason in full feature phase ([`TextErrorAnswer`]).
//!
//! Decisions: empty pairs (two NUL bytes in a row, or trailing NUL padding)
//! are tolerated and skipped, since some initiators pad; a data segment that
//! does not end in NUL is an error (RFC 7143 §6.1: every pair, including the
//! last, is followed by one NUL).

use std::fmt;

use nom::{IResult, Parser, bytes::complete::take_while, bytes::complete::take_while1};
use thiserror::Error;

/// Longest key name (RFC 7143 §6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Longest ordinary value (RFC 7143 §6.1), not counting the delimiter.
pub const MAX_VALUE_LEN: usize = 255;
/// Longest value of a key that carries a large binary value
/// (CHAP_C, CHAP_R, SRP and Kerberos keys; RFC 7143 §6.1, §12.1).
pub const MAX_LARGE_VALUE_LEN: usize = 8192;
/// Default bound on a whole text sequence (all PDUs of one negotiation
/// step). RFC 7143 §6.1 requires at least 8192 bytes; SendTargets answers
/// are larger, so the default is 64 KiB.
pub const DEFAULT_MAX_TEXT_LEN: usize = 64 * 1024;

/// Errors of the text layer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TextError {
    /// The data segment does not end with the NUL that terminates the last pair.
    #[error("text data does not end with a NUL delimiter")]
    MissingTerminator,
    /// A pair has no `=`.
    #[error("pair at offset {offset} has no '='")]
    MissingEquals {
        /// Offset of the pair in the data segment.
        offset: usize,
    },
    /// A key is empty or holds a character outside RFC 7143 §6.1's set.
    #[error("invalid key at offset {offset}")]
    InvalidKey {
        /// Offset of the pair in the data segment.
        offset: usize,
    },
    /// A key is longer than 63 bytes.
    #[error("key of {len} bytes (max {MAX_KEY_LEN})")]
    KeyTooLong {
        /// Its length.
        len: usize,
    },
    /// A value is longer than its key allows.
    #[error("value of {len} bytes (max {max})")]
    ValueTooLong {
        /// Its length.
        len: usize,
        /// The limit for that key.
        max: usize,
    },
    /// A value is not UTF-8.
    #[error("value at offset {offset} is not UTF-8")]
    NotUtf8 {
        /// Offset of the pair in the data segment.
        offset: usize,
    },
    /// The whole text is longer than allowed.
    #[error("text of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// Bytes received so far.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A numerical value is malformed or out of 64-bit range.
    #[error("malformed numerical value")]
    InvalidNumber,
    /// A binary value is malformed (bad hex or base64).
    #[error("malformed binary value")]
    InvalidBinary,
    /// A boolean is neither `Yes` nor `No`.
    #[error("malformed boolean value")]
    InvalidBoolean,
}

/// What to send back for a [`TextError`]: the Login Status (class, detail)
/// during login, the Reject reason in full feature phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextErrorAnswer {
    /// Status-Class of the Login Response.
    pub status_class: u8,
    /// Status-Detail of the Login Response.
    pub status_detail: u8,
    /// Reason code of the Reject PDU (RFC 7143 §11.17.1).
    pub reject_reason: u8,
}

impl From<&TextError> for TextErrorAnswer {
    /// Every malformed text (bad framing, bad key, over-long key, value or
    /// sequence) is the sender's fault: an Initiator Error (0x0200) during
    /// login and a Protocol Error Reject (0x04) in full feature phase. A
    /// well-formed key with a bad value is not a text error: the negotiation
    /// layer answers it with `Reject`.
    fn from(_e: &TextError) -> Self {
        TextErrorAnswer {
            status_class: 0x02,
            status_detail: 0x00,
            reject_reason: 0x04,
        }
    }
}

impl From<TextError> for TextErrorAnswer {
    fn from(e: TextError) -> Self {
        TextErrorAnswer::from(&e)
    }
}

/// One `key=value` pair, borrowed from the data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyValue<'a> {
    /// Key name.
    pub key: &'a str,
    /// Value, as sent (still encoded).
    pub value: &'a str,
}

impl<'a> KeyValue<'a> {
    /// A pair.
    pub const fn new(key: &'a str, value: &'a str) -> Self {
        KeyValue { key, value }
    }

    /// The special value this pair carries, if any.
    pub fn special(&self) -> Option<Special> {
        Special::from_value(self.value)
    }
}

impl fmt::Display for KeyValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// The three constant values every key may take (RFC 7143 §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Special {
    /// `Reject`: the offered value is refused.
    Reject,
    /// `Irrelevant`: the key does not apply in this context.
    Irrelevant,
    /// `NotUnderstood`: the key is unknown to the responder.
    NotUnderstood,
}

impl Special {
    /// Recognise a special value.
    pub fn from_value(v: &str) -> Option<Special> {
        match v {
            "Reject" => Some(Special::Reject),
            "Irrelevant" => Some(Special::Irrelevant),
            "NotUnderstood" => Some(Special::NotUnderstood),
            _ => None,
        }
    }

    /// The text of the value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Special::Reject => "Reject",
            Special::Irrelevant => "Irrelevant",
            Special::NotUnderstood => "NotUnderstood",
        }
    }
}

/// Is this key one whose value may be a large binary value (up to 8192 bytes)?
pub fn is_large_value_key(key: &str) -> bool {
    matches!(key, "CHAP_C" | "CHAP_R")
        || key.starts_with("SRP_")
        || key.starts_with("KRB_")
        || key.starts_with("SPKM_")
}

/// The value limit for a key.
pub fn max_value_len(key: &str) -> usize {
    if is_large_value_key(key) {
        MAX_LARGE_VALUE_LEN
    } else {
        MAX_VALUE_LEN
    }
}

fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'@' | b'_' | b'#')
}

/// The text pairs of one complete data segment, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextParams<'a> {
    pairs: Vec<KeyValue<'a>>,
}

/// nom: one `key=value` record (without the NUL).
fn pair(input: &[u8]) -> IResult<&[u8], (&[u8], &[u8])> {
    let (rest, key) = take_while1(|c| c != b'=' && c != 0).parse(input)?;
    let (rest, _) = nom::bytes::complete::tag(&b"="[..]).parse(rest)?;
    let (rest, value) = take_while(|c| c != 0).parse(rest)?;
    Ok((rest, (key, value)))
}

impl<'a> TextParams<'a> {
    /// Parse a complete text data segment (padding already removed).
    pub fn parse(data: &'a [u8]) -> Result<TextParams<'a>, TextError> {
        Self::parse_bounded(data, DEFAULT_MAX_TEXT_LEN)
    }

    /// Parse with an explicit bound on the whole text.
    pub fn parse_bounded(data: &'a [u8], max: usize) -> Result<TextParams<'a>, TextError> {
        if data.len() > max {
            return Err(TextError::TooLong {
                len: data.len(),
                max,
            });
        }
        if data.is_empty() {
            return Ok(TextParams::default());
        }
        if data.last() != Some(&0) {
            return Err(TextError::MissingTerminator);
        }
        let mut pairs = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let offset = data.len() - rest.len();
            if rest.first() == Some(&0) {
                // Empty record: padding or a doubled delimiter.
                rest = rest.get(1..).unwrap_or_default();
                continue;
            }
            let (after, (key, value)) = match pair(rest) {
                Ok(v) => v,
                Err(_) => return Err(TextError::MissingEquals { offset }),
            };
            // `after` starts with the NUL (the data ends in NUL).
            rest = after.get(1..).unwrap_or_default();
            if key.len() > MAX_KEY_LEN {
                return Err(TextError::KeyTooLong { len: key.len() });
            }
            if !key.iter().all(|&c| is_key_char(c)) {
                return Err(TextError::InvalidKey { offset });
            }
            // Key chars are ASCII, so this cannot fail; map anyway.
            let key = std::str::from_utf8(key).map_err(|_| TextError::InvalidKey { offset })?;
            let max = max_value_len(key);
            if value.len() > max {
                return Err(TextError::ValueTooLong {
                    len: value.len(),
                    max,
                });
            }
            let value = std::str::from_utf8(value).map_err(|_| TextError::NotUtf8 { offset })?;
            pairs.push(KeyValue { key, value });
        }
        Ok(TextParams { pairs })
    }

    /// The pairs in order.
    pub fn pairs(&self) -> &[KeyValue<'a>] {
        &self.pairs
    }

    /// Iterate over the pairs.
    pub fn iter(&self) -> std::slice::Iter<'_, KeyValue<'a>> {
        self.pairs.iter()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// No pairs at all.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|p| p.key == key).map(|p| p.value)
    }

    /// The first key that appears more than once, if any.
    pub fn first_duplicate(&self) -> Option<&'a str> {
        for (i, p) in self.pairs.iter().enumerate() {
            if self.pairs.iter().skip(i + 1).any(|q| q.key == p.key) {
                return Some(p.key);
            }
        }
        None
    }

    /// Emit the canonical form (every pair followed by one NUL).
    pub fn emit(&self, w: &mut TextWriter) -> Result<(), TextError> {
        for p in &self.pairs {
            w.push(p.key, p.value)?;
        }
        Ok(())
    }
}

impl<'a, 'b> IntoIterator for &'b TextParams<'a> {
    type Item = &'b KeyValue<'a>;
    type IntoIter = std::slice::Iter<'b, KeyValue<'a>>;
    fn into_iter(self) -> Self::IntoIter {
        self.pairs.iter()
    }
}

/// Builds a text data segment.
#[derive(Debug, Clone, Default)]
pub struct TextWriter {
    buf: Vec<u8>,
    max: usize,
}

impl TextWriter {
    /// A writer bounded by [`DEFAULT_MAX_TEXT_LEN`].
    pub fn new() -> Self {
        TextWriter {
            buf: Vec::new(),
            max: DEFAULT_MAX_TEXT_LEN,
        }
    }

    /// A writer with a bound on the whole text.
    pub fn with_limit(max: usize) -> Self {
        TextWriter {
            buf: Vec::new(),
            max,
        }
    }

    /// Append `key=value\0`.
    pub fn push(&mut self, key: &str, value: &str) -> Result<(), TextError> {
        if key.is_empty() || !key.bytes().all(is_key_char) {
            return Err(TextError::InvalidKey {
                offset: self.buf.len(),
            });
        }
        if key.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong { len: key.len() });
        }
        let max = max_value_len(key);
        if value.len() > max {
            return Err(TextError::ValueTooLong {
                len: value.len(),
                max,
            });
        }
        if value.as_bytes().contains(&0) {
            return Err(TextError::InvalidBinary);
        }
        let len = self.buf.len() + key.len() + value.len() + 2;
        if len > self.max {
            return Err(TextError::TooLong { len, max: self.max });
        }
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(b'=');
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        Ok(())
    }

    /// Append a pair with a special value.
    pub fn push_special(&mut self, key: &str, s: Special) -> Result<(), TextError> {
        self.push(key, s.as_str())
    }

    /// Append a decimal number.
    pub fn push_number(&mut self, key: &str, n: u64) -> Result<(), TextError> {
        self.push(key, &n.to_string())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The text written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The finished text.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Joins the data segments of a multi-PDU text sequence (C bit set on all
/// but the last), bounded.
#[derive(Debug, Clone)]
pub struct TextAccumulator {
    buf: Vec<u8>,
    max: usize,
}

impl Default for TextAccumulator {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TEXT_LEN)
    }
}

impl TextAccumulator {
    /// An empty accumulator with a bound.
    pub fn new(max: usize) -> Self {
        TextAccumulator {
            buf: Vec::new(),
            max,
        }
    }

    /// Append one PDU's data segment.
    pub fn push(&mut self, data: &[u8]) -> Result<(), TextError> {
        let len = self.buf.len().saturating_add(data.len());
        if len > self.max {
            return Err(TextError::TooLong { len, max: self.max });
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The joined text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Take the joined text, leaving the accumulator empty.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Forget what is held.
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

/// Split a list value (`a,b,c`) into items.
pub fn list_items(value: &str) -> impl Iterator<Item = &str> {
    value.split(',')
}

/// Parse a boolean (`Yes`/`No`).
pub fn parse_bool(value: &str) -> Result<bool, TextError> {
    match value {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(TextError::InvalidBoolean),
    }
}

/// The text of a boolean.
pub const fn bool_str(b: bool) -> &'static str {
    if b { "Yes" } else { "No" }
}

/// Parse a numerical value: decimal, `0x`/`0X` hex, or `0b`/`0B` base64,
/// up to 64 bits (RFC 7143 §6.1, numerical-value / binary-value).
pub fn parse_number(value: &str) -> Result<u64, TextError> {
    let b = value.as_bytes();
    match b {
        [b'0', b'x' | b'X', ..] => {
            let digits = value.get(2..).ok_or(TextError::InvalidNumber)?;
            let digits = digits.trim_start_matches('0');
            if value.len() == 2 {
                return Err(TextError::InvalidNumber);
            }
            if digits.is_empty() {
                return Ok(0);
            }
            if digits.len() > 16 || !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(TextError::InvalidNumber);
            }
            u64::from_str_radix(digits, 16).map_err(|_| TextError::InvalidNumber)
        }
        [b'0', b'b' | b'B', ..] => {
            let bytes = parse_binary(value).map_err(|_| TextError::InvalidNumber)?;
            let significant: &[u8] = {
                let first = bytes.iter().position(|&c| c != 0).unwrap_or(bytes.len());
                bytes.get(first..).unwrap_or_default()
            };
            if significant.len() > 8 {
                return Err(TextError::InvalidNumber);
            }
            Ok(significant
                .iter()
                .fold(0u64, |acc, &c| (acc << 8) | u64::from(c)))
        }
        _ => {
            if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
                return Err(TextError::InvalidNumber);
            }
            value.parse::<u64>().map_err(|_| TextError::InvalidNumber)
        }
    }
}

/// Decode a binary value: `0x`/`0X` hex or `0b`/`0B` base64 (RFC 7143 §6.1).
pub fn parse_binary(value: &str) -> Result<Vec<u8>, TextError> {
    let b = value.as_bytes();
    match b {
        [b'0', b'x' | b'X', rest @ ..] => decode_hex(rest),
        [b'0', b'b' | b'B', rest @ ..] => decode_base64(rest),
        _ => Err(TextError::InvalidBinary),
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn decode_hex(digits: &[u8]) -> Result<Vec<u8>, TextError> {
    if digits.is_empty() {
        return Err(TextError::InvalidBinary);
    }
    let mut out = Vec::with_capacity(digits.len().div_ceil(2));
    // An odd number of digits: the first nibble stands alone.
    let (head, tail) = digits.split_at(digits.len() % 2);
    if let Some(&c) = head.first() {
        out.push(hex_val(c).ok_or(TextError::InvalidBinary)?);
    }
    for ch in tail.chunks_exact(2) {
        let (Some(&h), Some(&l)) = (ch.first(), ch.get(1)) else {
            return Err(TextError::InvalidBinary);
        };
        let h = hex_val(h).ok_or(TextError::InvalidBinary)?;
        let l = hex_val(l).ok_or(TextError::InvalidBinary)?;
        out.push((h << 4) | l);
    }
    Ok(out)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_val(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

fn decode_base64(text: &[u8]) -> Result<Vec<u8>, TextError> {
    if text.is_empty() || !text.len().is_multiple_of(4) {
        return Err(TextError::InvalidBinary);
    }
    let pad = text.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return Err(TextError::InvalidBinary);
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let last = text.len() / 4 - 1;
    for (i, quad) in text.chunks_exact(4).enumerate() {
        let mut acc = 0u32;
        let mut valid = 0;
        for (j, &c) in quad.iter().enumerate() {
            if c == b'=' {
                // Padding only at the end of the last quad.
                if i != last || j < 4 - pad {
                    return Err(TextError::InvalidBinary);
                }
                acc <<= 6;
            } else {
                acc = (acc << 6) | u32::from(b64_val(c).ok_or(TextError::InvalidBinary)?);
                valid += 1;
            }
        }
        let bytes = acc.to_be_bytes();
        let n = match valid {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return Err(TextError::InvalidBinary),
        };
        out.extend_from_slice(bytes.get(1..1 + n).ok_or(TextError::InvalidBinary)?);
    }
    Ok(out)
}

/// Encode bytes as a `0x` hex binary value (lower case).
pub fn encode_hex(data: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + data.len() * 2);
    s.push_str("0x");
    for &b in data {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

/// Encode bytes as a `0b` base64 binary value (with `=` padding).
pub fn encode_base64(data: &[u8]) -> String {
    let mut s = String::with_capacity(2 + data.len().div_ceil(3) * 4);
    s.push_str("0b");
    for chunk in data.chunks(3) {
        let b0 = chunk.first().copied().unwrap_or(0);
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let n = (u32::from(b0) << 16) | (u32::from(b1) << 8) | u32::from(b2);
        let idx = [(n >> 18) & 63, (n >> 12) & 63, (n >> 6) & 63, n & 63];
        for (k, &i) in idx.iter().enumerate() {
            if k <= chunk.len() {
                s.push(char::from(B64[i as usize]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_simple() {
        let t = TextParams::parse(b"InitiatorName=iqn.x\0AuthMethod=CHAP,None\0").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.get("InitiatorName"), Some("iqn.x"));
        assert_eq!(
            list_items(t.get("AuthMethod").unwrap()).collect::<Vec<_>>(),
            ["CHAP", "None"]
        );
        let mut w = TextWriter::new();
        t.emit(&mut w).unwrap();
        assert_eq!(w.as_bytes(), b"InitiatorName=iqn.x\0AuthMethod=CHAP,None\0");
    }

    #[test]
    fn empty_value_and_padding() {
        let t = TextParams::parse(b"SendTargets=\0\0\0").unwrap();
        assert_eq!(t.pairs(), &[KeyValue::new("SendTargets", "")]);
        assert!(TextParams::parse(b"").unwrap().is_empty());
    }

    #[test]
    fn errors() {
        assert_eq!(TextParams::parse(b"A=1"), Err(TextError::MissingTerminator));
        assert_eq!(
            TextParams::parse(b"A=1\0B\0"),
            Err(TextError::MissingEquals { offset: 4 })
        );
        assert_eq!(
            TextParams::parse(b"=1\0"),
            Err(TextError::MissingEquals { offset: 0 })
        );
        assert_eq!(
            TextParams::parse(b"A b=1\0"),
            Err(TextError::InvalidKey { offset: 0 })
        );
        let long_key = [b'K'; 64];
        let mut d = long_key.to_vec();
        d.extend_from_slice(b"=1\0");
        assert_eq!(
            TextParams::parse(&d),
            Err(TextError::KeyTooLong { len: 64 })
        );
        let mut d = b"A=".to_vec();
        d.extend(std::iter::repeat_n(b'v', 256));
        d.push(0);
        assert_eq!(
            TextParams::parse(&d),
            Err(TextError::ValueTooLong { len: 256, max: 255 })
        );
        let mut d = b"CHAP_C=0x".to_vec();
        d.extend(std::iter::repeat_n(b'a', 2000));
        d.push(0);
        assert_eq!(
            TextParams::parse(&d).unwrap().get("CHAP_C").map(str::len),
            Some(2002)
        );
        assert_eq!(
            TextParams::parse(b"A=\xff\0"),
            Err(TextError::NotUtf8 { offset: 0 })
        );
        assert_eq!(
            TextParams::parse_bounded(b"A=1\0", 3),
            Err(TextError::TooLong { len: 4, max: 3 })
        );
    }

    #[test]
    fn value_with_equals_kept() {
        let t = TextParams::parse(b"X-a=b=c\0").unwrap();
        assert_eq!(t.get("X-a"), Some("b=c"));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X00ff"), Ok(255));
        assert_eq!(parse_number("0x0"), Ok(0));
        assert_eq!(parse_number("0bAAAgAA=="), Ok(0x2000)); // 00 00 20 00
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_number("18446744073709551616"),
            Err(TextError::InvalidNumber)
        );
        assert_eq!(parse_number("0x"), Err(TextError::InvalidNumber));
        assert_eq!(
            parse_number("0x1ffffffffffffffff"),
            Err(TextError::InvalidNumber)
        );
        assert_eq!(parse_number(""), Err(TextError::InvalidNumber));
        assert_eq!(parse_number("-1"), Err(TextError::InvalidNumber));
        assert_eq!(parse_number("+1"), Err(TextError::InvalidNumber));
        assert_eq!(parse_number("1 "), Err(TextError::InvalidNumber));
    }

    #[test]
    fn binary() {
        assert_eq!(parse_binary("0x0102ff"), Ok(vec![1, 2, 0xff]));
        assert_eq!(parse_binary("0xabc"), Ok(vec![0x0a, 0xbc]));
        assert_eq!(parse_binary("0bAQL/"), Ok(vec![1, 2, 0xff]));
        assert_eq!(parse_binary("0BAQI="), Ok(vec![1, 2]));
        assert_eq!(parse_binary("0bAQ=="), Ok(vec![1]));
        assert_eq!(parse_binary("0bAQ="), Err(TextError::InvalidBinary));
        assert_eq!(parse_binary("0bA=Q="), Err(TextError::InvalidBinary));
        assert_eq!(parse_binary("0b===="), Err(TextError::InvalidBinary));
        assert_eq!(parse_binary("0xzz"), Err(TextError::InvalidBinary));
        assert_eq!(parse_binary("1234"), Err(TextError::InvalidBinary));
        for n in 0..40u8 {
            let data: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37)).collect();
            if n > 0 {
                assert_eq!(parse_binary(&encode_hex(&data)).unwrap(), data);
                assert_eq!(parse_binary(&encode_base64(&data)).unwrap(), data);
            }
        }
        assert_eq!(encode_base64(&[1, 2, 0xff]), "0bAQL/");
        assert_eq!(encode_base64(&[1]), "0bAQ==");
        assert_eq!(encode_hex(&[0xde, 0xad]), "0xdead");
    }

    #[test]
    fn specials_and_bools() {
        assert_eq!(Special::from_value("Reject"), Some(Special::Reject));
        assert_eq!(Special::from_value("Irrelevant"), Some(Special::Irrelevant));
        assert_eq!(
            Special::from_value("NotUnderstood"),
            Some(Special::NotUnderstood)
        );
        assert_eq!(Special::from_value("reject"), None);
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("No"), Ok(false));
        assert_eq!(parse_bool("yes"), Err(TextError::InvalidBoolean));
    }

    #[test]
    fn writer_limits() {
        let mut w = TextWriter::with_limit(8);
        w.push("A", "1").unwrap();
        assert!(matches!(
            w.push("B", "2345"),
            Err(TextError::TooLong { .. })
        ));
        assert!(matches!(w.push("", "1"), Err(TextError::InvalidKey { .. })));
        assert_eq!(w.as_bytes(), b"A=1\0");
    }

    #[test]
    fn accumulator_bound() {
        let mut a = TextAccumulator::new(6);
        a.push(b"Ab").unwrap();
        a.push(b"c=1\0").unwrap();
        assert_eq!(
            TextParams::parse(a.as_bytes()).unwrap().get("Abc"),
            Some("1")
        );
        assert!(matches!(
            a.push(b"x"),
            Err(TextError::TooLong { len: 7, max: 6 })
        ));
    }

    #[test]
    fn duplicates() {
        let t = TextParams::parse(b"A=1\0B=2\0A=3\0").unwrap();
        assert_eq!(t.first_duplicate(), Some("A"));
        assert_eq!(TextParams::parse(b"A=1\0").unwrap().first_duplicate(), None);
    }

    #[test]
    fn error_answer() {
        let a = TextErrorAnswer::from(TextError::MissingTerminator);
        assert_eq!(
            (a.status_class, a.status_detail, a.reject_reason),
            (2, 0, 4)
        );
    }
}
