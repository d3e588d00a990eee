//! Start-of-frame and end-of-frame delimiters (FC-FS-4 §7, FC-BB-6
//! Table 27 for the one-byte encodings FCoE and FCIP carry).
//!
//! The one-byte codes are what FCoE, FCIP and unifab's in-memory links
//! carry; [`Sof::ordered_set`] and [`Eof::ordered_set`] give the 8b/10b
//! ordered sets as pcap link type 225 (`LINKTYPE_FC_2_WITH_FRAME_DELIMS`)
//! records them.

use std::fmt;

/// A start-of-frame delimiter, by its FC-BB one-byte code. Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sof(pub u8);

#[allow(missing_docs)]
impl Sof {
    /// SOFf: class F (inter-switch) frames.
    pub const F: Sof = Sof(0x28);
    pub const I4: Sof = Sof(0x29);
    pub const I2: Sof = Sof(0x2d);
    /// SOFi3: first frame of a class 3 sequence.
    pub const I3: Sof = Sof(0x2e);
    pub const N4: Sof = Sof(0x31);
    pub const N2: Sof = Sof(0x35);
    /// SOFn3: any later frame of a class 3 sequence.
    pub const N3: Sof = Sof(0x36);
    pub const C4: Sof = Sof(0x39);

    /// The delimiter's name, if it is a defined one.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Sof::F => "SOFf",
            Sof::I4 => "SOFi4",
            Sof::I2 => "SOFi2",
            Sof::I3 => "SOFi3",
            Sof::N4 => "SOFn4",
            Sof::N2 => "SOFn2",
            Sof::N3 => "SOFn3",
            Sof::C4 => "SOFc4",
            _ => return None,
        })
    }

    /// A defined SOF code.
    pub fn is_valid(self) -> bool {
        self.name().is_some()
    }

    /// Starts a sequence (SOFi*).
    pub fn is_initiate(self) -> bool {
        matches!(self, Sof::I2 | Sof::I3 | Sof::I4)
    }

    /// The class 3 delimiter for a frame that is (or is not) the first of
    /// its sequence.
    pub fn class3(first_of_sequence: bool) -> Sof {
        if first_of_sequence { Sof::I3 } else { Sof::N3 }
    }

    /// The transmission-word ordered set (K28.5 D21.5 Dx.y Dx.y), big
    /// endian, as pcap link type 225 stores it.
    pub fn ordered_set(self) -> Option<u32> {
        let d = match self {
            Sof::F => 0x58,
            Sof::I4 => 0x59,
            Sof::I2 => 0x55,
            Sof::I3 => 0x56,
            Sof::N4 => 0x39,
            Sof::N2 => 0x35,
            Sof::N3 => 0x36,
            Sof::C4 => 0x19,
            _ => return None,
        };
        Some(0xbcb5_0000 | (d << 8) | d)
    }

    /// The code for an ordered set, if it is a SOF.
    pub fn from_ordered_set(word: u32) -> Option<Sof> {
        [
            Sof::F,
            Sof::I4,
            Sof::I2,
            Sof::I3,
            Sof::N4,
            Sof::N2,
            Sof::N3,
            Sof::C4,
        ]
        .into_iter()
        .find(|s| s.ordered_set() == Some(word))
    }
}

impl fmt::Debug for Sof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Sof({:#04x})", self.0),
        }
    }
}

/// An end-of-frame delimiter, by its FC-BB one-byte code. Open.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Eof(pub u8);

#[allow(missing_docs)]
impl Eof {
    /// EOFn: normal, sequence continues.
    pub const N: Eof = Eof(0x41);
    /// EOFt: terminate, last frame of the sequence.
    pub const T: Eof = Eof(0x42);
    pub const RT: Eof = Eof(0x44);
    pub const DT: Eof = Eof(0x46);
    /// EOFni: normal-invalid (frame known bad).
    pub const NI: Eof = Eof(0x49);
    pub const DTI: Eof = Eof(0x4e);
    pub const RTI: Eof = Eof(0x4f);
    /// EOFa: abort.
    pub const A: Eof = Eof(0x50);

    /// The delimiter's name, if it is a defined one.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Eof::N => "EOFn",
            Eof::T => "EOFt",
            Eof::RT => "EOFrt",
            Eof::DT => "EOFdt",
            Eof::NI => "EOFni",
            Eof::DTI => "EOFdti",
            Eof::RTI => "EOFrti",
            Eof::A => "EOFa",
            _ => return None,
        })
    }

    /// A defined EOF code.
    pub fn is_valid(self) -> bool {
        self.name().is_some()
    }

    /// The frame content is valid (not EOFni/EOFdti/EOFrti/EOFa).
    pub fn frame_valid(self) -> bool {
        matches!(self, Eof::N | Eof::T | Eof::RT | Eof::DT)
    }

    /// The class 3 delimiter for a frame that does (or does not) end its
    /// sequence.
    pub fn class3(end_of_sequence: bool) -> Eof {
        if end_of_sequence { Eof::T } else { Eof::N }
    }

    /// The ordered set with negative running disparity (K28.5 D21.4 …),
    /// big endian, as pcap link type 225 stores it.
    pub fn ordered_set(self) -> Option<u32> {
        Some(match self {
            Eof::N => 0xbc95_d5d5,
            Eof::T => 0xbc95_7575,
            Eof::DT => 0xbc95_9595,
            Eof::A => 0xbc95_f5f5,
            Eof::NI => 0xbc8a_d5d5,
            Eof::DTI => 0xbc8a_9595,
            Eof::RT => 0xbc95_9999,
            Eof::RTI => 0xbc8a_9999,
            _ => return None,
        })
    }

    /// The code for an ordered set of either running disparity.
    pub fn from_ordered_set(word: u32) -> Option<Eof> {
        // Positive disparity forms flip the second character: 95→b5, 8a→aa.
        let negative = match word & 0xffff_0000 {
            0xbcb5_0000 => (word & 0x0000_ffff) | 0xbc95_0000,
            0xbcaa_0000 => (word & 0x0000_ffff) | 0xbc8a_0000,
            _ => word,
        };
        [
            Eof::N,
            Eof::T,
            Eof::RT,
            Eof::DT,
            Eof::NI,
            Eof::DTI,
            Eof::RTI,
            Eof::A,
        ]
        .into_iter()
        .find(|e| e.ordered_set() == Some(negative))
    }
}

impl fmt::Debug for Eof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Eof({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_ordered_sets() {
        assert_eq!(Sof::I3.ordered_set(), Some(0xbcb5_5656));
        assert_eq!(Sof::from_ordered_set(0xbcb5_3636), Some(Sof::N3));
        assert_eq!(Sof(0x77).ordered_set(), None);
        assert_eq!(Eof::from_ordered_set(0xbcb5_7575), Some(Eof::T));
        assert_eq!(Eof::from_ordered_set(0xbc95_7575), Some(Eof::T));
        assert_eq!(Eof::from_ordered_set(0xbcaa_d5d5), Some(Eof::NI));
        assert_eq!(Eof::from_ordered_set(0x1234_5678), None);
        assert!(Eof::T.frame_valid() && !Eof::A.frame_valid());
        assert_eq!(Sof::class3(true), Sof::I3);
        assert_eq!(Eof::class3(false), Eof::N);
        assert_eq!(format!("{:?}", Sof(0x2e)), "SOFi3");
        assert_eq!(format!("{:?}", Eof(0x99)), "Eof(0x99)");
        for s in [Sof::F, Sof::I2, Sof::N2, Sof::I4, Sof::N4, Sof::C4] {
            assert_eq!(s.ordered_set().and_then(Sof::from_ordered_set), Some(s));
        }
        for e in [Eof::N, Eof::RT, Eof::DT, Eof::DTI, Eof::RTI, Eof::A] {
            assert_eq!(e.ordered_set().and_then(Eof::from_ordered_set), Some(e));
        }
    }
}
