//! Zoning (FC-GS-7 §10, in the spirit of a SAN switch's `zone` and
//! `zoneset` commands): zones of members named by port WWN or FC_ID, zone
//! sets, one active zone set, and the default zone for ports no active
//! zone names.
//!
//! Two ports may talk when an active zone holds both, or when neither is
//! in any active zone and the default zone permits. With no zone set
//! active every port is in the default zone.

use std::collections::BTreeMap;

use std::fmt;
use std::str::FromStr;
use unifab_scsi_core::idmap::IdMap;

use crate::wire::{FcId, Wwn};

/// A zone member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ZoneMember {
    /// A port by its WWPN.
    PortName(Wwn),
    /// A port by its address.
    FcId(FcId),
}

impl fmt::Display for ZoneMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZoneMember::PortName(w) => write!(f, "pwwn {w}"),
            ZoneMember::FcId(id) => write!(f, "fcid {id}"),
        }
    }
}

/// A zone member that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid zone member {0:?}: expected \"pwwn:20:00:…\" or \"fcid:0x010200\"")]
pub struct BadMember(String);

impl FromStr for ZoneMember {
    type Err = BadMember;
    /// `pwwn:20:00:00:25:b5:00:00:01` (or a bare WWN) and
    /// `fcid:0x010200`.
    fn from_str(s: &str) -> Result<ZoneMember, BadMember> {
        let bad = || BadMember(s.to_string());
        let t = s.trim();
        if let Some(w) = t.strip_prefix("pwwn:").or_else(|| t.strip_prefix("wwpn:")) {
            return w.parse().map(ZoneMember::PortName).map_err(|_| bad());
        }
        if let Some(id) = t.strip_prefix("fcid:") {
            return id.parse().map(ZoneMember::FcId).map_err(|_| bad());
        }
        t.parse().map(ZoneMember::PortName).map_err(|_| bad())
    }
}

/// A named zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// Name.
    pub name: String,
    /// Members.
    pub members: Vec<ZoneMember>,
}

/// A named set of zones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSet {
    /// Name.
    pub name: String,
    /// Zone names.
    pub zones: Vec<String>,
}

/// What a zoning change was refused for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZoningError {
    /// No zone set of that name is defined.
    #[error("no zone set named {0:?}")]
    NoSuchZoneSet(String),
    /// A zone set names a zone that is not defined.
    #[error("zone set {set:?} names undefined zone {zone:?}")]
    NoSuchZone {
        /// The zone set.
        set: String,
        /// The missing zone.
        zone: String,
    },
}

/// The zoning database and its active configuration.
#[derive(Debug, Clone, Default)]
pub struct Zoning {
    zones: BTreeMap<String, Zone>,
    sets: BTreeMap<String, ZoneSet>,
    active: Option<String>,
    /// The active zones, copied at activation.
    active_zones: Vec<Zone>,
    default_permit: bool,
}

/// A port as zoning sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZonedPort {
    /// Address.
    pub fc_id: FcId,
    /// Port name.
    pub port_name: Wwn,
}

/// Which active zones each port is in, computed once per change.
#[derive(Debug, Clone, Default)]
pub struct Membership {
    zones: IdMap<FcId, Vec<u64>>,
    default_permit: bool,
    enforcing: bool,
}

impl Membership {
    /// May `a` and `b` talk?
    pub fn allowed(&self, a: FcId, b: FcId) -> bool {
        if !self.enforcing || a == b {
            return true;
        }
        match (self.zones.get(&a), self.zones.get(&b)) {
            (Some(x), Some(y)) => x.iter().zip(y.iter()).any(|(p, q)| p & q != 0),
            (None, None) => self.default_permit,
            _ => false,
        }
    }
}

impl Zoning {
    /// Empty, with the default zone permitting (`true`) or denying.
    pub fn new(default_permit: bool) -> Zoning {
        Zoning {
            default_permit,
            ..Zoning::default()
        }
    }

    /// Defines (or replaces) a zone. The active configuration does not
    /// change until a zone set is activated again.
    pub fn define_zone(&mut self, zone: Zone) {
        self.zones.insert(zone.name.clone(), zone);
    }

    /// Defines (or replaces) a zone set.
    pub fn define_zone_set(&mut self, set: ZoneSet) {
        self.sets.insert(set.name.clone(), set);
    }

    /// Forgets a zone definition (the active configuration keeps its copy
    /// until the next activation).
    pub fn remove_zone(&mut self, name: &str) {
        self.zones.remove(name);
    }

    /// Forgets a zone set definition.
    pub fn remove_zone_set(&mut self, name: &str) {
        self.sets.remove(name);
    }

    /// Activates a zone set: its zones become the enforced ones.
    pub fn activate(&mut self, name: &str) -> Result<(), ZoningError> {
        let set = self
            .sets
            .get(name)
            .ok_or_else(|| ZoningError::NoSuchZoneSet(name.to_string()))?;
        let mut zones = Vec::new();
        for z in &set.zones {
            let zone = self.zones.get(z).ok_or_else(|| ZoningError::NoSuchZone {
                set: name.to_string(),
                zone: z.clone(),
            })?;
            zones.push(zone.clone());
        }
        self.active = Some(name.to_string());
        self.active_zones = zones;
        Ok(())
    }

    /// No zone set active: everyone is in the default zone.
    pub fn deactivate(&mut self) {
        self.active = None;
        self.active_zones.clear();
    }

    /// Sets the default zone policy.
    pub fn set_default_permit(&mut self, permit: bool) {
        self.default_permit = permit;
    }

    /// The default zone policy.
    pub fn default_permit(&self) -> bool {
        self.default_permit
    }

    /// The active zone set's name.
    pub fn active(&self) -> Option<&str> {
        self.active.as_deref()
    }

    /// The active zones.
    pub fn active_zones(&self) -> &[Zone] {
        &self.active_zones
    }

    /// Defined zones.
    pub fn zones(&self) -> impl Iterator<Item = &Zone> {
        self.zones.values()
    }

    /// Defined zone sets.
    pub fn zone_sets(&self) -> impl Iterator<Item = &ZoneSet> {
        self.sets.values()
    }

    /// Computes which active zones each port is in.
    pub fn membership(&self, ports: impl IntoIterator<Item = ZonedPort>) -> Membership {
        let enforcing = self.active.is_some();
        let words = self.active_zones.len().div_ceil(64).max(1);
        let mut zones = IdMap::default();
        if enforcing {
            for p in ports {
                let mut bits = vec![0u64; words];
                let mut any = false;
                for (i, z) in self.active_zones.iter().enumerate() {
                    let hit = z.members.iter().any(|m| match m {
                        ZoneMember::PortName(w) => *w == p.port_name,
                        ZoneMember::FcId(id) => *id == p.fc_id,
                    });
                    if hit {
                        bits[i / 64] |= 1 << (i % 64);
                        any = true;
                    }
                }
                if any {
                    zones.insert(p.fc_id, bits);
                }
            }
        }
        Membership {
            zones,
            default_permit: self.default_permit,
            enforcing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(id: u32, w: u64) -> ZonedPort {
        ZonedPort {
            fc_id: FcId::new(id),
            port_name: Wwn(w),
        }
    }

    #[test]
    fn members_parse() {
        assert_eq!(
            "pwwn:20:00:00:00:00:00:00:01"
                .parse::<ZoneMember>()
                .unwrap(),
            ZoneMember::PortName(Wwn(0x2000_0000_0000_0001))
        );
        assert_eq!(
            "fcid:0x010200".parse::<ZoneMember>().unwrap(),
            ZoneMember::FcId(FcId::new(0x010200))
        );
        assert!("fcid:zz".parse::<ZoneMember>().is_err());
    }

    #[test]
    fn zones_decide_who_talks() {
        let (h1, h2, t1) = (port(0x10100, 1), port(0x10200, 2), port(0x10300, 3));
        let mut z = Zoning::new(false);
        let all = [h1, h2, t1];
        // No active zone set: the default zone holds everyone.
        assert!(z.membership(all).allowed(h1.fc_id, t1.fc_id));
        z.define_zone(Zone {
            name: "z1".into(),
            members: vec![ZoneMember::PortName(Wwn(1)), ZoneMember::FcId(t1.fc_id)],
        });
        z.define_zone_set(ZoneSet {
            name: "cfg".into(),
            zones: vec!["z1".into()],
        });
        assert_eq!(
            z.activate("nope"),
            Err(ZoningError::NoSuchZoneSet("nope".into()))
        );
        z.activate("cfg").unwrap();
        let m = z.membership(all);
        assert!(m.allowed(h1.fc_id, t1.fc_id));
        assert!(!m.allowed(h2.fc_id, t1.fc_id));
        assert!(!m.allowed(h2.fc_id, h1.fc_id));
        assert!(m.allowed(h2.fc_id, h2.fc_id));
        // Default zone permit lets unzoned ports talk among themselves only.
        let h3 = port(0x10400, 4);
        z.set_default_permit(true);
        let m = z.membership([h1, h2, t1, h3]);
        assert!(m.allowed(h2.fc_id, h3.fc_id));
        assert!(!m.allowed(h2.fc_id, t1.fc_id));
        z.define_zone_set(ZoneSet {
            name: "bad".into(),
            zones: vec!["missing".into()],
        });
        assert!(matches!(
            z.activate("bad"),
            Err(ZoningError::NoSuchZone { .. })
        ));
        assert_eq!(z.active(), Some("cfg"));
        z.deactivate();
        assert!(z.membership(all).allowed(h2.fc_id, t1.fc_id));
    }
}
