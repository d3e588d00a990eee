//! Data that arrives in pieces (Data-Out, Data-In, FCP_DATA frames) and is
//! held until its command can use it.

use bytes::{Bytes, BytesMut};

/// Pieces of one transfer, in arrival order. A piece of at least `below`
/// bytes is kept as it came (a slice of a receive buffer, no copy); shorter
/// ones are copied together into one buffer until the next long piece.
/// A peer sending a transfer one byte per PDU or frame would otherwise make
/// the holder keep an entry and a buffer per byte, many times what its
/// limits count; normal pieces are far longer and stay zero-copy.
#[derive(Debug, Default)]
pub struct Gathered {
    pieces: Vec<Bytes>,
    small: BytesMut,
}

impl Gathered {
    /// Takes the next piece; pieces shorter than `below` are copied
    /// together.
    pub fn push(&mut self, data: Bytes, below: usize) {
        if data.len() < below {
            self.small.extend_from_slice(&data);
        } else {
            self.flush();
            self.pieces.push(data);
        }
    }

    /// Room for `n` more kept pieces.
    pub fn reserve(&mut self, n: usize) {
        self.pieces.reserve_exact(n);
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty() && self.small.is_empty()
    }

    /// Drops everything held.
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.small.clear();
    }

    /// Every piece, in order, leaving this empty.
    pub fn take(&mut self) -> Vec<Bytes> {
        self.flush();
        std::mem::take(&mut self.pieces)
    }

    fn flush(&mut self) {
        if !self.small.is_empty() {
            self.pieces.push(self.small.split().freeze());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long pieces stay as they came; runs of short ones become one copy
    /// each, between them, in order.
    #[test]
    fn short_pieces_are_copied_together_and_long_ones_kept() {
        let long = Bytes::from(vec![1u8; 4096]);
        let mut g = Gathered::default();
        assert!(g.is_empty());
        for b in b"abc" {
            g.push(Bytes::copy_from_slice(&[*b]), 2048);
        }
        g.push(long.clone(), 2048);
        g.push(Bytes::from_static(b"de"), 2048);
        assert!(!g.is_empty());
        let v = g.take();
        assert!(g.is_empty());
        assert_eq!(v.len(), 3);
        assert_eq!(&v[0][..], b"abc");
        assert_eq!(v[1].as_ptr(), long.as_ptr(), "not copied");
        assert_eq!(&v[2][..], b"de");
        g.push(Bytes::from_static(b"x"), 2048);
        g.clear();
        assert!(g.take().is_empty());
    }
}
