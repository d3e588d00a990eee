//! Hash maps keyed by small integers (FC_IDs, OX_IDs, command ids) with a
//! cheap multiplicative hash instead of SipHash. The keys are bounded in
//! number (open exchanges, logged-in ports), so hash flooding cannot grow
//! a map past its configured limit.
//!
//! The hasher is scsi-core's [`IdHasher`](unifab_scsi_core::idmap::IdHasher),
//! which the iSCSI session and the SCSI core use for the same purpose;
//! these names are kept for the FC plane's code.

pub use unifab_scsi_core::idmap::{IdHasher as FastHasher, IdMap as FastMap, IdSet as FastSet};

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hasher;

    #[test]
    fn maps_work() {
        let mut m: FastMap<(u32, u16), u16> = FastMap::default();
        for i in 0..1000u16 {
            m.insert((u32::from(i) * 7, i), i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&(70, 10)), Some(&10));
        let mut h = FastHasher::default();
        h.write(b"abc");
        assert_ne!(h.finish(), 0);
        let s: FastSet<u32> = (0..10).collect();
        assert!(s.contains(&9) && !s.contains(&10));
    }
}
