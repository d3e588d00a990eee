//! MAC addresses: the FIP group addresses, fabric-provided MAC addresses
//! (FPMA: the 24-bit FC-MAP followed by the 24-bit FC_ID, FC-BB-6 §7.7)
//! and server-provided ones (SPMA: the ENode's own choice).

use std::fmt;
use std::str::FromStr;

use unifab_fc::FcId;

/// A 48-bit IEEE MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// 00:00:00:00:00:00 (FIP: "no address proposed").
    pub const ZERO: MacAddr = MacAddr([0; 6]);
    /// FF:FF:FF:FF:FF:FF.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// All-ENode-MACs: multicast advertisements go here.
    pub const ALL_ENODE_MACS: MacAddr = MacAddr([0x01, 0x10, 0x18, 0x01, 0x00, 0x01]);
    /// All-FCF-MACs: solicitations and VLAN requests go here.
    pub const ALL_FCF_MACS: MacAddr = MacAddr([0x01, 0x10, 0x18, 0x01, 0x00, 0x02]);
    /// All-VN2VN-MACs (VN2VN probes, claims, beacons).
    pub const ALL_VN2VN_MACS: MacAddr = MacAddr([0x01, 0x10, 0x18, 0x01, 0x00, 0x04]);
    /// All-P2P-MACs (point-to-point VN2VN).
    pub const ALL_P2P_MACS: MacAddr = MacAddr([0x01, 0x10, 0x18, 0x01, 0x00, 0x05]);

    /// The fabric-provided MAC address of `fc_id` under `fc_map`.
    pub fn fpma(fc_map: FcMap, fc_id: FcId) -> MacAddr {
        let m = fc_map.0.to_be_bytes();
        let i = fc_id.to_bytes();
        MacAddr([m[1], m[2], m[3], i[0], i[1], i[2]])
    }

    /// The FC-MAP and FC_ID of an FPMA.
    pub fn split_fpma(self) -> (FcMap, FcId) {
        let b = self.0;
        (
            FcMap(u32::from_be_bytes([0, b[0], b[1], b[2]])),
            FcId::new(u32::from_be_bytes([0, b[3], b[4], b[5]])),
        )
    }

    /// Whether this is the FPMA of `fc_id` under `fc_map`.
    pub fn is_fpma_of(self, fc_map: FcMap, fc_id: FcId) -> bool {
        self == MacAddr::fpma(fc_map, fc_id)
    }

    /// A group (multicast or broadcast) address.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 != 0
    }

    /// A locally administered address (FPMAs are: FC-MAP 0E-FC-xx).
    pub fn is_local(self) -> bool {
        self.0[0] & 2 != 0
    }

    /// An individual, non-zero address an ENode or FCF may use as its own.
    pub fn is_unicast(self) -> bool {
        !self.is_multicast() && self != MacAddr::ZERO
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// A MAC address text that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?} (expected 0e:fc:00:01:02:03)")]
pub struct MacParseError(String);

impl FromStr for MacAddr {
    type Err = MacParseError;
    /// `0e:fc:00:01:02:03` or `0e-fc-00-01-02-03`.
    fn from_str(s: &str) -> Result<MacAddr, MacParseError> {
        let err = || MacParseError(s.to_string());
        let parts: Vec<&str> = s.trim().split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(err());
        }
        let mut out = [0u8; 6];
        for (o, p) in out.iter_mut().zip(parts) {
            if p.len() != 2 {
                return Err(err());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        Ok(MacAddr(out))
    }
}

/// The 24-bit FC-MAP a fabric prefixes FC_IDs with to form FPMAs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FcMap(pub u32);

impl FcMap {
    /// The default FC-MAP, 0E-FC-00.
    pub const DEFAULT: FcMap = FcMap(0x0e_fc00);

    /// The three wire bytes.
    pub fn to_bytes(self) -> [u8; 3] {
        let b = self.0.to_be_bytes();
        [b[1], b[2], b[3]]
    }

    /// From three wire bytes.
    pub fn from_bytes(b: [u8; 3]) -> FcMap {
        FcMap(u32::from_be_bytes([0, b[0], b[1], b[2]]))
    }
}

impl Default for FcMap {
    fn default() -> FcMap {
        FcMap::DEFAULT
    }
}

impl fmt::Debug for FcMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.to_bytes();
        write!(f, "FcMap({:02x}-{:02x}-{:02x})", b[0], b[1], b[2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fpma_and_text() {
        let id = FcId::from_parts(0x13, 0x04, 0x00);
        let m = MacAddr::fpma(FcMap::DEFAULT, id);
        assert_eq!(m.to_string(), "0e:fc:00:13:04:00");
        assert_eq!(m.split_fpma(), (FcMap::DEFAULT, id));
        assert!(m.is_fpma_of(FcMap::DEFAULT, id));
        assert!(!m.is_fpma_of(FcMap(0x0e_fc01), id));
        assert!(m.is_local() && m.is_unicast());
        assert!(MacAddr::ALL_FCF_MACS.is_multicast());
        assert_eq!("0e-fc-00-13-04-00".parse::<MacAddr>().unwrap(), m);
        assert!("0e:fc:00:13:04".parse::<MacAddr>().is_err());
        assert!("0e:fc:00:13:04:zz".parse::<MacAddr>().is_err());
        assert_eq!(FcMap::from_bytes([0x0e, 0xfc, 0x00]), FcMap::DEFAULT);
    }
}
