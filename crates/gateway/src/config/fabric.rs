//! `[fabric]`: the configuration of the FC plane (the software switch,
//! zoning, the gateway's FCP target N_Ports, the FCP initiator N_Port
//! behind `fc://WWPN/LUN` backends) and its validation. The running plane
//! is [`crate::plane::fc`].
//!
//! ```toml
//! [fabric]
//! domain = 1                                  # 1–239
//! switch_wwn = "10:00:00:00:c9:00:00:01"
//! default_zone = "permit"                     # or "deny"
//! active_zoneset = "cfg"                      # optional
//!
//! [[fabric.zone]]
//! name = "z_host"
//! members = ["pwwn:21:00:00:00:c9:00:00:0a", "fcid:0x010200"]
//!
//! [[fabric.zoneset]]
//! name = "cfg"
//! zones = ["z_host"]
//!
//! [[fabric.target]]                          # an FCP target N_Port
//! wwpn = "21:00:00:00:c9:00:00:0a"
//! luns = ["disk"]                             # LUN 0, 1, … in order
//!
//! [fabric.initiator]                          # for fc:// backends
//! wwpn = "21:00:00:00:c9:00:00:0b"
//! nexus = "per-initiator"                     # or "shared"
//! npiv_name = "per-host"                      # or "per-port" (default)
//! command_timeout = 30                        # seconds; every command ends within it
//! fast_io_fail = 5                            # seconds a command waits for a lost
//!                                             # target port (default: command_timeout)
//! max_frames_in = 4104                        # frames its open commands may bring
//!                                             # back at once (default: 4104 over an
//!                                             # FCoE ENode, else no bound)
//!
//! [[fabric.initiator.host]]                   # optional: a host's NPIV WWPN,
//! initiator = "iqn.1994-05.com.example:h1"    # set, over npiv_name
//! wwpn = "30:00:00:00:00:00:00:0a"
//!
//! [[lu]]
//! name = "via-fc"
//! backend = "fc://21:00:00:00:c9:00:00:0a/0"
//! [lu.fc]                                     # optional
//! identity = "derived"                        # or "passthrough"
//! identity_seed = "array-7/lun-0"             # default: the backend URL
//! ```
//!
//! Decisions:
//!
//! - With `nexus = "per-initiator"` (the default) each front-end initiator
//!   port reaches the target through an NPIV port of its own (FDISC on the
//!   initiator N_Port), named from the front-end port, so reservations and
//!   unit attentions stay per host.
//! - A remote LU's identity (VPD 0x80/0x83) is derived from its URL by
//!   default, as for `iscsi://` LUs, or from `identity_seed`; with
//!   `identity = "passthrough"` (in `[lu.fc]`) it is the remote's.
//!   Settings that are the remote's (`size`, `block_size`, `serial`, …)
//!   are refused for an `fc://` LU, as for an `iscsi://` one.
//!   `read_only = true` makes the LU a read-only view of the remote, as
//!   for an `iscsi://` LU (docs/bridge.md, "A read-only view").
//! - A command whose target port is not logged in waits for it. Without
//!   `fast_io_fail` it waits up to `command_timeout` (30 s by default, as
//!   long as a host's own SCSI timeout). With it, the wait ends
//!   `fast_io_fail` seconds after the port was lost, and a command for a
//!   port lost longer ago fails at once, with ABORTED COMMAND, LOGICAL
//!   UNIT COMMUNICATION FAILURE (0B/08/00): a multipath host retries on
//!   another path within seconds, as Linux's `fast_io_fail_tmo` does.
//!   Commands in flight when the port goes fail at once either way.
//! - Over an FCoE ENode the initiator bounds the frames its open commands
//!   can bring back (data-in, XFER_RDY, FCP_RSP) to `max_frames_in`, 4,104
//!   by default (eight 1 MiB reads); more commands wait, in order. Its
//!   target ports likewise bound the write data still to come when the
//!   gateway runs an FCF (`max_write_in_flight`, 8 MiB by default).
//!   Without PFC the Ethernet link cannot pause the far side, and a burst
//!   longer than the link can take while the gateway is off the CPU is
//!   lost: the AF_XDP link guarantees 4,160 frames
//!   (`unifab_fcoe::link::af_xdp::Budget`), and 1 MiB reads at queue
//!   depth 32 lost 2,362 frames at once without the bound. The bounds are
//!   the link's (`unifab_fc::nport::LinkBudget`): with `nexus =
//!   "per-initiator"` every host's NPIV port counts against the same
//!   4,104 frames as the initiator N_Port, target ports with the same
//!   `max_write_in_flight` count against one budget of it, and commands
//!   wait in one line across the ports, in order.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use unifab_fc::fabric::zoning::ZoneMember;
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_scsi_core::Lun;
use unifab_scsi_core::remote::Identity;

use crate::config::{Backend, Config, LuConfig, seconds_in};

/// The default switch name.
pub const DEFAULT_SWITCH_WWN: &str = "10:00:00:00:00:00:00:01";

fn default_domain() -> u8 {
    1
}

fn default_switch_wwn() -> String {
    DEFAULT_SWITCH_WWN.into()
}

/// `[fabric]`: the software FC fabric and the gateway's own FC ports.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FabricSection {
    /// Domain ID (1–239, default 1).
    #[serde(default = "default_domain")]
    pub domain: u8,
    /// Switch name (WWN).
    #[serde(default = "default_switch_wwn")]
    pub switch_wwn: String,
    /// `"permit"` (default) or `"deny"`: whether ports in no active zone
    /// may talk to each other.
    #[serde(default)]
    pub default_zone: Option<String>,
    /// Zones.
    #[serde(default)]
    pub zone: Vec<ZoneSection>,
    /// Zone sets.
    #[serde(default)]
    pub zoneset: Vec<ZoneSetSection>,
    /// The zone set activated at start.
    #[serde(default)]
    pub active_zoneset: Option<String>,
    /// FCP target N_Ports presenting LUs.
    #[serde(default)]
    pub target: Vec<FcTargetSection>,
    /// The FCP initiator N_Port behind `fc://` backends.
    #[serde(default)]
    pub initiator: Option<FcInitiatorSection>,
}

/// `[[fabric.zone]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ZoneSection {
    /// Name.
    pub name: String,
    /// Members: `"pwwn:…"` or `"fcid:0x……"`.
    pub members: Vec<String>,
}

/// `[[fabric.zoneset]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ZoneSetSection {
    /// Name.
    pub name: String,
    /// Zone names.
    pub zones: Vec<String>,
}

/// `[[fabric.target]]`: an FCP target N_Port of the gateway.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcTargetSection {
    /// Port name.
    pub wwpn: String,
    /// Node name (default: the port name with NAA 2 → 1 flipped).
    #[serde(default)]
    pub wwnn: Option<String>,
    /// LU names: LUN 0, 1, … in order.
    pub luns: Vec<String>,
    /// Largest burst one FCP_XFER_RDY asks a host for (default
    /// [`DEFAULT_MAX_BURST`]; [`MAX_BURST`] bounds it).
    #[serde(default)]
    pub max_burst: Option<crate::config::Size>,
    /// Write data the port's open write commands may hold together
    /// (default [`unifab_fc::nport::target::MAX_WRITE_HELD`], 256 MiB;
    /// [`MAX_WRITE_HELD`] bounds it). A write that would pass it waits
    /// for its FCP_XFER_RDY; one larger than all of it is refused.
    #[serde(default)]
    pub max_write_held: Option<crate::config::Size>,
    /// Write data the port's admitted writes may still have to receive at
    /// once ([`unifab_fc::nport::NPortConfig::max_write_in_flight`];
    /// default [`FCF_WRITE_IN_FLIGHT`] when the gateway has an FCoE FCF
    /// port, else no bound; [`MAX_WRITE_HELD`] bounds it). A write that
    /// would pass it waits for its FCP_XFER_RDY; one alone always goes.
    #[serde(default)]
    pub max_write_in_flight: Option<crate::config::Size>,
}

/// `[[fabric.target]] max_write_in_flight` by default when the gateway
/// runs an FCoE FCF: 8 MiB, 4,096 frames of 2 KiB, within the 4,160 the
/// FCF's AF_XDP link can always take with room for the commands. ENodes
/// behind the FCF cannot be paused (no PFC on these links), so write data
/// past what the link can take while the gateway is off the CPU would be
/// lost; 1 MiB writes at queue depth 32 were. The target ports with the
/// same bound share it (one `LinkBudget`): together they stay within it.
pub const FCF_WRITE_IN_FLIGHT: u64 = 8 << 20;

/// `[[fabric.target]] max_burst` by default: 1 MiB, so a write of up to
/// 1 MiB costs one FCP_XFER_RDY. With 256 KiB (the N_Port's own default),
/// 1 MiB writes through an FCoE hop went 565 → 734 MB/s (docs/fcoe.md).
pub const DEFAULT_MAX_BURST: u32 = 1 << 20;

/// The range of `[[fabric.target]] max_burst`: one 512-byte block to
/// 16 MiB.
pub const MAX_BURST: std::ops::RangeInclusive<u32> = 512..=(16 << 20);

/// The range of `[[fabric.target]] max_write_held`: 1 MiB (a largest
/// usual write) to 64 GiB.
pub const MAX_WRITE_HELD: std::ops::RangeInclusive<u64> = (1 << 20)..=(64 << 30);

impl FcTargetSection {
    /// The burst its FCP_XFER_RDYs ask for, checked.
    pub fn max_burst(&self) -> Result<u32, String> {
        match self.max_burst {
            None => Ok(DEFAULT_MAX_BURST),
            Some(crate::config::Size(n)) => u32::try_from(n)
                .ok()
                .filter(|b| MAX_BURST.contains(b))
                .ok_or_else(|| {
                    format!(
                        "fabric.target {}: max_burst {n} must be {} to {} bytes",
                        self.wwpn,
                        MAX_BURST.start(),
                        MAX_BURST.end()
                    )
                }),
        }
    }

    /// The write data its admitted writes may have to come, checked
    /// (`behind_fcf`: the gateway runs an FCoE FCF).
    pub fn max_write_in_flight(&self, behind_fcf: bool) -> Result<Option<u64>, String> {
        match self.max_write_in_flight {
            None => Ok(behind_fcf.then_some(FCF_WRITE_IN_FLIGHT)),
            Some(crate::config::Size(n)) if MAX_WRITE_HELD.contains(&n) => Ok(Some(n)),
            Some(crate::config::Size(n)) => Err(format!(
                "fabric.target {}: max_write_in_flight {n} must be {} to {} bytes",
                self.wwpn,
                MAX_WRITE_HELD.start(),
                MAX_WRITE_HELD.end()
            )),
        }
    }

    /// The write data its open write commands may hold, checked.
    pub fn max_write_held(&self) -> Result<u64, String> {
        match self.max_write_held {
            None => Ok(unifab_fc::nport::target::MAX_WRITE_HELD),
            Some(crate::config::Size(n)) if MAX_WRITE_HELD.contains(&n) => Ok(n),
            Some(crate::config::Size(n)) => Err(format!(
                "fabric.target {}: max_write_held {n} must be {} to {} bytes",
                self.wwpn,
                MAX_WRITE_HELD.start(),
                MAX_WRITE_HELD.end()
            )),
        }
    }
}

pub use crate::config::MAX_TIMEOUT_SECS;

/// The range of `command_timeout` and `fast_io_fail`: positive, at most a
/// day.
const TIMEOUT_SECS: std::ops::RangeInclusive<f64> = crate::config::POSITIVE_TIMEOUT_SECS;

/// `[fabric.initiator]`: the gateway's FCP initiator N_Port.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcInitiatorSection {
    /// Port name (default derived from the switch name).
    #[serde(default)]
    pub wwpn: Option<String>,
    /// Node name.
    #[serde(default)]
    pub wwnn: Option<String>,
    /// `"per-initiator"` (default) or `"shared"`.
    #[serde(default)]
    pub nexus: Option<String>,
    /// Seconds within which every command ends (default 30).
    #[serde(default)]
    pub command_timeout: Option<f64>,
    /// Seconds a command waits for a target port that was lost (or not
    /// yet seen) before it fails (default: up to `command_timeout`).
    #[serde(default)]
    pub fast_io_fail: Option<f64>,
    /// Frames the open commands may bring back at once
    /// ([`NPortConfig::max_frames_in`]; default [`ENODE_FRAMES_IN`] over
    /// an FCoE ENode, else no bound).
    #[serde(default)]
    pub max_frames_in: Option<u32>,
    /// Physical initiator N_Ports the hosts' NPIV ports spread over
    /// (`"per-initiator"` nexus, on the gateway's own switch): NPIV ports
    /// share their physical port's area, so each holds at most 255 hosts.
    /// Default 1 (255 hosts); 1 to 16. Each port past the first logs in to
    /// the fabric with a port name derived from the initiator's.
    #[serde(default)]
    pub physical_ports: Option<u32>,
    /// How a host's NPIV port is named (`"per-initiator"` nexus):
    /// `"per-port"` (default) from the front-end initiator port (iSCSI:
    /// name and ISID: a port per session), `"per-host"` from the
    /// initiator's name alone (one port per host, known in advance, so
    /// it can be zoned before the host logs in).
    #[serde(default)]
    pub npiv_name: Option<String>,
    /// WWPNs set per host, over `npiv_name`.
    #[serde(default)]
    pub host: Vec<FcHostSection>,
}

/// `[[fabric.initiator.host]]`: the NPIV port name of one host.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcHostSection {
    /// The host's iSCSI initiator name.
    pub initiator: String,
    /// The WWPN its NPIV port logs in with.
    pub wwpn: String,
}

/// Default `[fabric.initiator] physical_ports`.
pub const PHYSICAL_PORTS: u32 = 1;

/// `[fabric.initiator] max_frames_in` over an FCoE ENode by default: eight
/// 1 MiB reads (8 × 512 data frames and their FCP_RSPs), within what the
/// AF_XDP link can always receive with the gateway off the CPU (4,160
/// frames with its default budget), with room for FIP and ELS frames;
/// AF_PACKET's 64 MiB socket buffer holds more.
pub const ENODE_FRAMES_IN: u32 = 8 * 513;

/// The range of `max_frames_in`: one 1 MiB read (513 frames) must fit.
pub(crate) const FRAMES_IN: std::ops::RangeInclusive<u32> = 513..=1 << 20;

/// An `fc://WWPN/LUN` backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FcUrl {
    /// The target port.
    pub wwpn: Wwn,
    /// The LUN index at that port.
    pub lun: u16,
}

impl fmt::Display for FcUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fc://{}/{}", self.wwpn, self.lun)
    }
}

impl FromStr for FcUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<FcUrl, String> {
        let rest = s
            .strip_prefix("fc://")
            .ok_or_else(|| format!("{s:?} is not an fc:// URL"))?;
        let (w, l) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected fc://WWPN/LUN"))?;
        let wwpn = w.parse::<Wwn>().map_err(|e| format!("{s:?}: {e}"))?;
        let lun = l
            .parse::<u16>()
            .ok()
            .filter(|n| Lun::from_index(*n).is_some())
            .ok_or_else(|| format!("{s:?}: LUN {l:?} is not a number below 16384"))?;
        Ok(FcUrl { wwpn, lun })
    }
}

pub(crate) fn wwn(field: &str, s: &str) -> Result<Wwn, String> {
    s.parse::<Wwn>()
        .map_err(|_| format!("{field}: {s:?} is not a WWN (20:00:00:25:b5:00:00:01)"))
}

/// Node name for a port name when none is given.
pub(crate) fn node_name_for(port: Wwn) -> Wwn {
    Wwn(port.0 ^ 0x0100_0000_0000_0000)
}

impl FabricSection {
    pub(crate) fn switch(&self) -> Result<Wwn, String> {
        wwn("fabric.switch_wwn", &self.switch_wwn)
    }

    /// The FCP initiator N_Port's configuration from `[fabric.initiator]`
    /// (names, command timeout, `fast_io_fail`; default E_D_TOV/R_A_TOV).
    pub(crate) fn initiator_port_config(&self) -> Result<NPortConfig, String> {
        let initiator = self.initiator_wwpn()?;
        let section = self.initiator.as_ref();
        let wwnn = match section.and_then(|i| i.wwnn.as_ref()) {
            Some(n) => wwn("fabric.initiator.wwnn", n)?,
            None => node_name_for(initiator),
        };
        let mut cfg = NPortConfig::new(initiator, wwnn);
        cfg.initiator = true;
        cfg.discover = true;
        cfg.symbolic_name = format!("unifab FCP initiator {initiator}");
        let secs = |v: Option<f64>| v.and_then(|t| seconds_in(t, TIMEOUT_SECS));
        if let Some(d) = secs(section.and_then(|i| i.command_timeout)) {
            cfg.command_timeout = d;
        }
        cfg.fast_io_fail = secs(section.and_then(|i| i.fast_io_fail));
        cfg.max_frames_in = section.and_then(|i| i.max_frames_in);
        Ok(cfg)
    }

    pub(crate) fn initiator_wwpn(&self) -> Result<Wwn, String> {
        match self.initiator.as_ref().and_then(|i| i.wwpn.as_ref()) {
            Some(w) => wwn("fabric.initiator.wwpn", w),
            // 21:00 and the switch's low six bytes.
            None => Ok(Wwn(
                (0x2100 << 48) | (self.switch()?.0 & 0x0000_ffff_ffff_ffff)
            )),
        }
    }

    /// The initiator N_Port's node name.
    pub fn initiator_node_name(&self) -> Result<Wwn, String> {
        match self.initiator.as_ref().and_then(|i| i.wwnn.as_ref()) {
            Some(n) => wwn("fabric.initiator.wwnn", n),
            None => Ok(node_name_for(self.initiator_wwpn()?)),
        }
    }

    /// How the hosts' NPIV ports are named ([`FcInitiatorSection::npiv_name`],
    /// [`FcInitiatorSection::host`]).
    pub fn npiv_names(&self) -> unifab_fc::io::NpivNames {
        let Some(i) = &self.initiator else {
            return unifab_fc::io::NpivNames::default();
        };
        unifab_fc::io::NpivNames {
            per_host: i.npiv_name.as_deref() == Some("per-host"),
            fixed: i
                .host
                .iter()
                .filter_map(|h| {
                    let w = wwn("fabric.initiator.host.wwpn", &h.wwpn).ok()?;
                    Some((h.initiator.to_ascii_lowercase(), w))
                })
                .collect(),
        }
    }

    /// Physical initiator ports (see [`FcInitiatorSection::physical_ports`]).
    pub(crate) fn physical_ports(&self) -> u32 {
        self.initiator
            .as_ref()
            .and_then(|i| i.physical_ports)
            .unwrap_or(PHYSICAL_PORTS)
    }

    pub(crate) fn per_nexus(&self) -> bool {
        self.initiator
            .as_ref()
            .and_then(|i| i.nexus.as_deref())
            .is_none_or(|n| n == "per-initiator")
    }
}

/// Cross-checks of `[fabric]` and of `fc://` LUs.
pub fn validate(cfg: &Config) -> Result<(), String> {
    let fc_lus: Vec<&LuConfig> = cfg
        .lu
        .iter()
        .filter(|l| matches!(l.parsed_backend(), Ok(Backend::Fc(_))))
        .collect();
    let Some(f) = &cfg.fabric else {
        if let Some(l) = fc_lus.first() {
            return Err(format!(
                "lu {:?}: an fc:// backend needs a [fabric] section",
                l.name
            ));
        }
        return Ok(());
    };
    if !(1..=239).contains(&f.domain) {
        return Err(format!("fabric.domain {} is not in 1–239", f.domain));
    }
    f.switch()?;
    match f.default_zone.as_deref() {
        None | Some("permit" | "deny") => {}
        Some(o) => return Err(format!("fabric.default_zone {o:?}: \"permit\" or \"deny\"")),
    }
    let mut zones = HashSet::new();
    for z in &f.zone {
        if !zones.insert(z.name.as_str()) {
            return Err(format!("fabric.zone {:?} is defined twice", z.name));
        }
        for m in &z.members {
            m.parse::<ZoneMember>()
                .map_err(|e| format!("fabric.zone {:?}: {e}", z.name))?;
        }
    }
    let mut sets = HashSet::new();
    for s in &f.zoneset {
        if !sets.insert(s.name.as_str()) {
            return Err(format!("fabric.zoneset {:?} is defined twice", s.name));
        }
        for z in &s.zones {
            if !zones.contains(z.as_str()) {
                return Err(format!(
                    "fabric.zoneset {:?}: zone {z:?} is not defined",
                    s.name
                ));
            }
        }
    }
    if let Some(a) = &f.active_zoneset
        && !sets.contains(a.as_str())
    {
        return Err(format!(
            "fabric.active_zoneset {a:?} is not a defined zoneset"
        ));
    }
    let names: HashSet<&str> = cfg.lu.iter().map(|l| l.name.as_str()).collect();
    let mut ports = HashSet::new();
    for t in &f.target {
        let w = wwn("fabric.target.wwpn", &t.wwpn)?;
        if !ports.insert(w) {
            return Err(format!("fabric.target {} is defined twice", t.wwpn));
        }
        if let Some(n) = &t.wwnn {
            wwn("fabric.target.wwnn", n)?;
        }
        t.max_burst()?;
        t.max_write_held()?;
        t.max_write_in_flight(false)?;
        if t.luns.is_empty() {
            return Err(format!("fabric.target {} has no luns", t.wwpn));
        }
        for l in &t.luns {
            if !names.contains(l.as_str()) {
                return Err(format!(
                    "fabric.target {}: lun {l:?} is not a defined lu",
                    t.wwpn
                ));
            }
            if fc_lus.iter().any(|x| x.name == *l) {
                return Err(format!(
                    "fabric.target {}: lun {l:?} is itself an fc:// LU",
                    t.wwpn
                ));
            }
        }
    }
    let iw = f.initiator_wwpn()?;
    if ports.contains(&iw) {
        return Err(format!("fabric.initiator.wwpn {iw} is also a target's"));
    }
    if let Some(i) = &f.initiator {
        if let Some(n) = &i.wwnn {
            wwn("fabric.initiator.wwnn", n)?;
        }
        match i.nexus.as_deref() {
            None | Some("per-initiator" | "shared") => {}
            Some(o) => {
                return Err(format!(
                    "fabric.initiator.nexus {o:?}: \"per-initiator\" or \"shared\""
                ));
            }
        }
        for (key, v) in [
            ("command_timeout", i.command_timeout),
            ("fast_io_fail", i.fast_io_fail),
        ] {
            if let Some(t) = v
                && seconds_in(t, TIMEOUT_SECS).is_none()
            {
                return Err(format!(
                    "fabric.initiator.{key} {t} must be positive and at most {MAX_TIMEOUT_SECS} s"
                ));
            }
        }
        if let Some(n) = i.max_frames_in
            && !FRAMES_IN.contains(&n)
        {
            return Err(format!(
                "fabric.initiator.max_frames_in {n} must be {} to {}",
                FRAMES_IN.start(),
                FRAMES_IN.end()
            ));
        }
        if let Some(n) = i.physical_ports
            && !(1..=16).contains(&n)
        {
            return Err(format!(
                "fabric.initiator.physical_ports {n} must be 1 to 16"
            ));
        }
        match i.npiv_name.as_deref() {
            None | Some("per-port" | "per-host") => {}
            Some(o) => {
                return Err(format!(
                    "fabric.initiator.npiv_name {o:?}: \"per-port\" or \"per-host\""
                ));
            }
        }
        let mut hosts = std::collections::HashSet::new();
        for h in &i.host {
            crate::config::check_iscsi_name(&h.initiator)
                .map_err(|e| format!("fabric.initiator.host {:?}: {e}", h.initiator))?;
            let w = wwn("fabric.initiator.host.wwpn", &h.wwpn)?;
            if ports.contains(&w) || w == iw {
                return Err(format!(
                    "fabric.initiator.host {:?}: wwpn {w} is also a target's or the initiator's",
                    h.initiator
                ));
            }
            if !hosts.insert(h.initiator.to_ascii_lowercase()) {
                return Err(format!(
                    "fabric.initiator.host {:?} is listed twice",
                    h.initiator
                ));
            }
        }
    }
    // What an fc:// LU may not have (size, serial, …) was checked with
    // the other remote LUs (`remote::validate`).
    Ok(())
}

/// An `fc://` LU's identity (`[lu.fc]`): derived from `identity_seed`,
/// or else from the backend URL, unless passed through.
pub(crate) fn fc_identity(lu: &LuConfig, url: FcUrl) -> Identity {
    let fc = lu.fc.as_ref();
    crate::config::remote::identity(
        fc.and_then(|f| f.identity.as_deref()),
        fc.and_then(|f| f.identity_seed.as_deref()),
        || url.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fc_urls() {
        let u: FcUrl = "fc://21:00:00:00:c9:00:00:0a/3".parse().unwrap();
        assert_eq!(u.wwpn, Wwn(0x2100_0000_c900_000a));
        assert_eq!(u.lun, 3);
        assert_eq!(u.to_string(), "fc://21:00:00:00:c9:00:00:0a/3");
        assert!("fc://21:00/0".parse::<FcUrl>().is_err());
        assert!("fc://21:00:00:00:c9:00:00:0a".parse::<FcUrl>().is_err());
        assert!(
            "fc://21:00:00:00:c9:00:00:0a/70000"
                .parse::<FcUrl>()
                .is_err()
        );
        assert!("iscsi://x/y/0".parse::<FcUrl>().is_err());
    }

    const CFG: &str = r#"
[[lu]]
name = "disk"
backend = "memory"
size = "64MiB"

[[lu]]
name = "via-fc"
backend = "fc://21:00:00:00:c9:00:00:0a/0"

[fabric]
domain = 7
switch_wwn = "10:00:00:00:c9:00:00:01"
default_zone = "deny"
active_zoneset = "cfg"

[[fabric.zone]]
name = "z1"
members = ["pwwn:21:00:00:00:c9:00:00:0a", "pwwn:21:00:00:00:c9:00:00:0b"]

[[fabric.zoneset]]
name = "cfg"
zones = ["z1"]

[[fabric.target]]
wwpn = "21:00:00:00:c9:00:00:0a"
luns = ["disk"]

[fabric.initiator]
wwpn = "21:00:00:00:c9:00:00:0b"
"#;

    /// `[lu.fc]` sets an fc:// LU's identity; what is the remote's
    /// (size, serial, …) is refused, not ignored; `read_only` is taken.
    #[test]
    fn an_fc_lu_takes_its_identity_settings_and_refuses_the_remotes() {
        let with = |lines: &str| {
            let backend = "backend = \"fc://21:00:00:00:c9:00:00:0a/0\"\n";
            Config::parse(
                &CFG.replace(backend, &format!("{backend}{lines}\n")),
                "fc.toml",
            )
            .map_err(|e| e.to_string())
        };
        let identity = |lines: &str| {
            let c = with(lines).unwrap();
            let Ok(Backend::Fc(url)) = c.lu[1].parsed_backend() else {
                panic!("not an fc:// LU: {:?}", c.lu[1]);
            };
            fc_identity(&c.lu[1], url)
        };
        let url_seed = Identity::Derived {
            seed: "fc://21:00:00:00:c9:00:00:0a/0".into(),
        };
        assert_eq!(identity(""), url_seed);
        assert_eq!(identity("[lu.fc]\nidentity = \"derived\""), url_seed);
        assert_eq!(
            identity("[lu.fc]\nidentity_seed = \"array-7/0\""),
            Identity::Derived {
                seed: "array-7/0".into()
            }
        );
        assert_eq!(
            identity("[lu.fc]\nidentity = \"passthrough\""),
            Identity::Passthrough
        );
        for (lines, want) in [
            ("[lu.fc]\nidentity = \"borrowed\"", "identity \"borrowed\""),
            ("[lu.iscsi]\nnexus = \"shared\"", "need an iscsi:// backend"),
            ("size = \"1GiB\"", "takes its size"),
            ("block_size = 4096", "takes its size"),
            ("write_cache = false", "write_cache"),
            ("serial = \"S1\"", "serial"),
            ("physical_block_size = 4096", "physical_block_size"),
            ("removable = true", "removable"),
            ("sanitize_rate = \"1MiB\"", "sanitize_rate"),
        ] {
            let e = with(lines).unwrap_err();
            assert!(e.contains("via-fc") && e.contains(want), "{lines:?}: {e}");
        }
        // A read-only view is the gateway's to enforce: taken.
        assert!(with("read_only = true").unwrap().lu[1].read_only);
        let e = with("[lu.fc]\nbogus = 1").unwrap_err();
        assert!(e.starts_with("fc.toml:") && e.contains("bogus"), "{e}");
        // [lu.fc] on a LU that is not fc://.
        let e = Config::parse(
            &CFG.replace(
                "size = \"64MiB\"\n",
                "size = \"64MiB\"\n[lu.fc]\nidentity = \"derived\"\n",
            ),
            "fc.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"disk\"") && e.contains("need an fc:// backend"),
            "{e}"
        );
    }

    #[test]
    fn the_documented_fabric_parses_and_checks() {
        let c = Config::parse(CFG, "fc.toml").unwrap();
        let f = c.fabric.as_ref().unwrap();
        assert_eq!(f.domain, 7);
        assert_eq!(f.initiator_wwpn().unwrap(), Wwn(0x2100_0000_c900_000b));
        assert!(f.per_nexus());
        assert_eq!(
            c.lu[1].parsed_backend().unwrap(),
            Backend::Fc(FcUrl {
                wwpn: Wwn(0x2100_0000_c900_000a),
                lun: 0
            })
        );
        let bad = |from: &str, to: &str| {
            Config::parse(&CFG.replace(from, to), "fc.toml")
                .unwrap_err()
                .to_string()
        };
        assert!(bad("domain = 7", "domain = 240").contains("domain"));
        assert!(bad("zones = [\"z1\"]", "zones = [\"z9\"]").contains("z9"));
        assert!(bad("active_zoneset = \"cfg\"", "active_zoneset = \"nope\"").contains("nope"));
        assert!(bad("\"pwwn:21:00:00:00:c9:00:00:0b\"", "\"pwwn:xx\"").contains("zone member"));
        assert!(bad("luns = [\"disk\"]", "luns = [\"via-fc\"]").contains("itself an fc://"));
        // max_burst: 1 MiB unless set; a block to 16 MiB.
        assert_eq!(f.target[0].max_burst(), Ok(DEFAULT_MAX_BURST));
        // The target section with one more line, parsed and checked.
        let target_with = |line: String| {
            Config::parse(
                &CFG.replace("luns = [\"disk\"]", &format!("luns = [\"disk\"]\n{line}")),
                "fc.toml",
            )
            .map_err(|e| e.to_string())
            .map(|c| c.fabric.unwrap().target.remove(0))
        };
        let burst =
            |v: &str| target_with(format!("max_burst = {v}")).map(|t| t.max_burst().unwrap());
        assert_eq!(burst("\"256KiB\""), Ok(256 << 10));
        assert_eq!(burst("512"), Ok(512));
        assert_eq!(burst("\"16MiB\""), Ok(16 << 20));
        for v in ["511", "0", "\"17MiB\"", "\"1TiB\""] {
            let e = burst(v).unwrap_err();
            assert!(
                e.contains("max_burst") && e.contains("16777216"),
                "{v}: {e}"
            );
        }
        // max_write_held: 256 MiB unless set; 1 MiB to 64 GiB.
        assert_eq!(f.target[0].max_write_held(), Ok(256 << 20));
        let held = |v: &str| {
            target_with(format!("max_write_held = {v}")).map(|t| t.max_write_held().unwrap())
        };
        assert_eq!(held("\"1GiB\""), Ok(1 << 30));
        assert_eq!(held("\"1MiB\""), Ok(1 << 20));
        assert_eq!(held("\"64GiB\""), Ok(64 << 30));
        for v in ["\"1023KiB\"", "0", "\"65GiB\""] {
            let e = held(v).unwrap_err();
            assert!(
                e.contains("max_write_held") && e.contains("68719476736"),
                "{v}: {e}"
            );
        }
        // max_write_in_flight: 8 MiB behind an FCoE FCF, else none, unless
        // set; 1 MiB to 64 GiB.
        assert_eq!(f.target[0].max_write_in_flight(false), Ok(None));
        assert_eq!(f.target[0].max_write_in_flight(true), Ok(Some(8 << 20)));
        let in_flight = |v: &str| {
            target_with(format!("max_write_in_flight = {v}"))
                .map(|t| t.max_write_in_flight(true).unwrap())
        };
        assert_eq!(in_flight("\"2MiB\""), Ok(Some(2 << 20)));
        for v in ["\"1023KiB\"", "0", "\"65GiB\""] {
            let e = in_flight(v).unwrap_err();
            assert!(e.contains("max_write_in_flight"), "{v}: {e}");
        }
        assert!(
            bad("default_zone = \"deny\"", "default_zone = \"maybe\"").contains("default_zone")
        );
        let e = bad("[fabric]\ndomain = 7", "[fabric]\ndomain = 7\nbogus = 1");
        assert!(e.starts_with("fc.toml:") && e.contains("bogus"), "{e}");
        // The initiator's timeouts: positive, finite, at most a day.
        // CFG ends inside [fabric.initiator].
        let timed = |line: &str| format!("{CFG}{line}\n");
        let c = Config::parse(
            &timed("fast_io_fail = 2.5\ncommand_timeout = 20"),
            "fc.toml",
        )
        .unwrap();
        let i = c.fabric.as_ref().unwrap().initiator.as_ref().unwrap();
        assert_eq!((i.fast_io_fail, i.command_timeout), (Some(2.5), Some(20.0)));
        let port = c.fabric.as_ref().unwrap().initiator_port_config().unwrap();
        assert_eq!(port.fast_io_fail, Some(Duration::from_millis(2500)));
        assert_eq!(port.command_timeout, Duration::from_secs(20));
        assert!(port.initiator && port.discover);
        let f = Config::parse(CFG, "fc.toml").unwrap().fabric.unwrap();
        let port = f.initiator_port_config().unwrap();
        assert_eq!(port.fast_io_fail, None, "off unless configured");
        assert_eq!(port.command_timeout, Duration::from_secs(30));
        for (line, key) in [
            ("fast_io_fail = 0", "fast_io_fail"),
            ("fast_io_fail = -1", "fast_io_fail"),
            ("fast_io_fail = 1e30", "fast_io_fail"),
            ("fast_io_fail = nan", "fast_io_fail"),
            ("command_timeout = 1e30", "command_timeout"),
        ] {
            let e = Config::parse(&timed(line), "fc.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains("at most 86400"),
                "{line}: {e}"
            );
        }
        // The bound on frames in flight toward the initiator: off unless
        // configured (the FCoE ENode default is applied at start), 513 (one
        // 1 MiB read) to 2^20.
        assert_eq!(port.max_frames_in, None);
        let c = Config::parse(&timed("max_frames_in = 1024"), "fc.toml").unwrap();
        let port = c.fabric.as_ref().unwrap().initiator_port_config().unwrap();
        assert_eq!(port.max_frames_in, Some(1024));
        for n in [0, 512, (1 << 20) + 1] {
            let e = Config::parse(&timed(&format!("max_frames_in = {n}")), "fc.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains("max_frames_in") && e.contains("513"), "{n}: {e}");
        }
        // Physical initiator ports for NPIV: 1 by default, 1 to 16.
        assert_eq!(c.fabric.as_ref().unwrap().physical_ports(), 1);
        let c = Config::parse(&timed("physical_ports = 4"), "fc.toml").unwrap();
        assert_eq!(c.fabric.as_ref().unwrap().physical_ports(), 4);
        for n in [0, 17] {
            let e = Config::parse(&timed(&format!("physical_ports = {n}")), "fc.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("physical_ports") && e.contains("1 to 16"),
                "{n}: {e}"
            );
        }
        // The default over an ENode is within what the AF_XDP link can
        // always take, with room for FIP and ELS frames.
        #[cfg(feature = "af-xdp")]
        {
            use unifab_fcoe::link::af_xdp::{Budget, XdpConfig, XdpMode};
            let burst = Budget::of(&XdpConfig::new(XdpMode::Auto)).burst();
            assert!(
                ENODE_FRAMES_IN + 56 <= burst,
                "{ENODE_FRAMES_IN} against {burst}"
            );
            assert!(FCF_WRITE_IN_FLIGHT / 2048 + 64 <= u64::from(burst));
        }
        // An fc:// LU without a fabric.
        let no_fabric = CFG.split("[fabric]").next().unwrap();
        assert!(
            Config::parse(no_fabric, "x")
                .unwrap_err()
                .to_string()
                .contains("needs a [fabric]")
        );
    }
}
