//! `[[fcoe.port]]`: the gateway's FCoE ports (FCFs attached to its
//! fabric, and the ENode carrying its FCP initiator to another FCF) and
//! their validation. The running ports are [`crate::plane::fcoe`].
//!
//! ```toml
//! [[fcoe.port]]
//! interface = "eth1"          # the Ethernet interface
//! mode = "fcf"                # "fcf": ENodes log into this gateway's fabric
//!                             # "enode": the [fabric.initiator] port logs
//!                             #          into the FCF found on this link
//! io = "af_xdp"               # or "af_packet"
//! vlan = 100                  # FCoE VLAN (absent: untagged)
//! priority = 3                # 802.1Q priority of FCoE/FIP frames
//! # Optional:
//! # mac = "02:00:00:00:00:01" # default: the interface's address
//! # fcf_priority = 128        # FIP priority advertised (fcf)
//! # fka_adv_period = 8        # seconds between advertisements (fcf)
//! # vlan_discovery = true     # ask FCFs for the VLAN first (enode; default
//! #                           # true when no vlan is given)
//! # xdp_mode = "auto"         # or "native", "generic" (af_xdp; auto:
//! #                           # generic on veth and other virtual
//! #                           # interfaces, native on a NIC)
//! ```
//!
//! Decisions:
//!
//! - Both modes need a `[fabric]` section: an FCF's ENodes log into it,
//!   and an ENode port carries the fabric's initiator N_Port (and its
//!   NPIV ports) to the remote FCF, so `fc://` LUs reach targets behind
//!   that FCF. At most one port may be an ENode.
//! - The AF_XDP mode is `auto` unless set: generic XDP on a virtual
//!   interface (veth: its native XDP copies every skb it is handed, and
//!   the generic path was faster through the FCoE hop), native on a NIC,
//!   and generic when the NIC's driver has no native XDP. The socket is
//!   in copy mode unless the NIC supports zero-copy; `unifab show fcoe`
//!   reports both.

use std::collections::HashSet;

use serde::Deserialize;
use unifab_fcoe::wire::MacAddr;

use crate::config::Config;

/// The range of `fka_adv_period`, in seconds.
pub(crate) const FKA_ADV_PERIOD_SECS: std::ops::RangeInclusive<f64> = 0.25..=3600.0;

/// `[fcoe]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcoeSection {
    /// The ports.
    #[serde(default)]
    pub port: Vec<FcoePortSection>,
}

/// `[[fcoe.port]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcoePortSection {
    /// Ethernet interface.
    pub interface: String,
    /// FCoE VLAN.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// 802.1Q priority (default 3).
    #[serde(default)]
    pub priority: Option<u8>,
    /// `"fcf"` or `"enode"`.
    pub mode: String,
    /// `"af_xdp"` or `"af_packet"`.
    pub io: String,
    /// MAC address (default: the interface's).
    #[serde(default)]
    pub mac: Option<String>,
    /// FIP priority advertised (FCF).
    #[serde(default)]
    pub fcf_priority: Option<u8>,
    /// Seconds between multicast advertisements (FCF, default 8).
    #[serde(default)]
    pub fka_adv_period: Option<f64>,
    /// Ask for the VLAN first (ENode).
    #[serde(default)]
    pub vlan_discovery: Option<bool>,
    /// `"auto"` (the default), `"native"` or `"generic"` (AF_XDP).
    #[serde(default)]
    pub xdp_mode: Option<String>,
}

/// Cross-checks of `[fcoe]`.
pub fn validate(cfg: &Config) -> Result<(), String> {
    let Some(f) = &cfg.fcoe else {
        return Ok(());
    };
    let mut names = HashSet::new();
    let mut enodes = 0;
    for p in &f.port {
        let at = format!("fcoe.port {:?}", p.interface);
        if p.interface.is_empty() {
            return Err("fcoe.port: interface is empty".into());
        }
        if !names.insert(p.interface.as_str()) {
            return Err(format!("{at} is defined twice"));
        }
        match p.mode.as_str() {
            "fcf" => {}
            "enode" => enodes += 1,
            o => return Err(format!("{at}: mode {o:?}: \"fcf\" or \"enode\"")),
        }
        match p.io.as_str() {
            "af_xdp" | "af_packet" => {}
            o => return Err(format!("{at}: io {o:?}: \"af_xdp\" or \"af_packet\"")),
        }
        if let Some(v) = p.vlan
            && !(1..=4094).contains(&v)
        {
            return Err(format!("{at}: vlan {v} is not in 1–4094"));
        }
        if let Some(pr) = p.priority
            && pr > 7
        {
            return Err(format!("{at}: priority {pr} is not in 0–7"));
        }
        if let Some(m) = &p.mac {
            let mac: MacAddr = m.parse().map_err(|e| format!("{at}: {e}"))?;
            if !mac.is_unicast() {
                return Err(format!("{at}: mac {mac} is not a unicast address"));
            }
        }
        if let Some(t) = p.fka_adv_period
            && crate::config::seconds_in(t, FKA_ADV_PERIOD_SECS).is_none()
        {
            return Err(format!("{at}: fka_adv_period must be 0.25–3600 seconds"));
        }
        match p.xdp_mode.as_deref() {
            None | Some("auto" | "native" | "generic") => {}
            Some(o) => {
                return Err(format!(
                    "{at}: xdp_mode {o:?}: \"auto\", \"native\" or \"generic\""
                ));
            }
        }
        if cfg.fabric.is_none() {
            return Err(format!("{at}: FCoE ports need a [fabric] section"));
        }
    }
    if enodes > 1 {
        return Err("fcoe: at most one port may be an ENode".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"
[[lu]]
name = "disk"
backend = "memory"
size = "64MiB"

[fabric]
[[fabric.target]]
wwpn = "21:00:00:00:c9:00:00:0a"
luns = ["disk"]

[[fcoe.port]]
interface = "veth-b"
mode = "fcf"
io = "af_packet"
vlan = 100
priority = 3
"#;

    #[test]
    fn the_documented_ports_parse_and_check() {
        let c = Config::parse(CFG, "fcoe.toml").unwrap();
        let p = &c.fcoe.as_ref().unwrap().port[0];
        assert_eq!(p.vlan, Some(100));
        assert_eq!(p.mode, "fcf");
        let bad = |from: &str, to: &str| {
            Config::parse(&CFG.replace(from, to), "fcoe.toml")
                .unwrap_err()
                .to_string()
        };
        assert!(bad("mode = \"fcf\"", "mode = \"npv\"").contains("mode"));
        assert!(bad("io = \"af_packet\"", "io = \"dpdk\"").contains("io"));
        assert!(bad("vlan = 100", "vlan = 4095").contains("vlan"));
        assert!(bad("priority = 3", "priority = 9").contains("priority"));
        assert!(
            bad("priority = 3", "priority = 3\nmac = \"01:00:00:00:00:01\"").contains("unicast")
        );
        assert!(bad("priority = 3", "priority = 3\nbogus = 1").contains("bogus"));
        let e = bad(
            "[fabric]\n[[fabric.target]]\nwwpn = \"21:00:00:00:c9:00:00:0a\"\nluns = [\"disk\"]\n",
            "",
        );
        assert!(e.contains("[fabric]"), "{e}");
        let two = format!(
            "{CFG}\n[[fcoe.port]]\ninterface = \"a\"\nmode = \"enode\"\nio = \"af_xdp\"\n[[fcoe.port]]\ninterface = \"b\"\nmode = \"enode\"\nio = \"af_xdp\"\n"
        );
        assert!(
            Config::parse(&two, "x")
                .unwrap_err()
                .to_string()
                .contains("one port")
        );
    }
}
