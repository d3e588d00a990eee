//! Hash maps for the small integer keys of per-command state (tags, task
//! tags, nexus ids), with a multiplicative hash instead of SipHash.
//!
//! SipHash resists hash flooding; these maps do not need it: every map
//! keyed by a peer-chosen value (an iSCSI ITT, an FC OX_ID) is bounded by
//! the session's queue depth or exchange limit, so colliding keys can cost
//! at most a scan of that bound, never unbounded growth.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The rustc "Fx" scheme, a word at a time.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl IdHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            if let Some(dst) = w.get_mut(..chunk.len()) {
                dst.copy_from_slice(chunk);
            }
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A `HashMap` with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A `HashSet` with [`IdHasher`].
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_small_keys_spread_and_maps_work() {
        let mut m: IdMap<u32, u32> = IdMap::default();
        for i in 0..1000u32 {
            m.insert(i, i * 2);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&999), Some(&1998));
        assert_eq!(m.remove(&5), Some(10));
        assert!(!m.contains_key(&5));
        let hash = |v: u32| {
            let mut h = IdHasher::default();
            h.write_u32(v);
            h.finish()
        };
        assert_ne!(hash(1), hash(2));
        let mut h = IdHasher::default();
        h.write(&[1, 2, 3]);
        let mut g = IdHasher::default();
        g.write(&[1, 2, 4]);
        assert_ne!(h.finish(), g.finish());
    }
}
