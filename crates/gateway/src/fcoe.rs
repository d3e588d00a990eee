//! FCoE ports of the gateway: `[[fcoe.port]]` in the configuration, the
//! FCFs attached to the gateway's fabric and the ENode carrying its FCP
//! initiator to another FCF, and their part of `unifab show flogi`.
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
use std::sync::Arc;

use anyhow::Context;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;
use unifab_fc::io::{Connect, Switch};
use unifab_fc::wire::Wwn;
use unifab_fcoe::enode::EnodeConfig;
use unifab_fcoe::fcf::FcfConfig;
use unifab_fcoe::io::{EnodeHandle, FcfHandle, spawn_enode, spawn_fcf};
use unifab_fcoe::link::EthLink;
use unifab_fcoe::wire::MacAddr;

use crate::config::Config;

/// The range of `fka_adv_period`, in seconds.
const FKA_ADV_PERIOD_SECS: std::ops::RangeInclusive<f64> = 0.25..=3600.0;

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
        if let Some(v) = p.vlan {
            if !(1..=4094).contains(&v) {
                return Err(format!("{at}: vlan {v} is not in 1–4094"));
            }
        }
        if let Some(pr) = p.priority {
            if pr > 7 {
                return Err(format!("{at}: priority {pr} is not in 0–7"));
            }
        }
        if let Some(m) = &p.mac {
            let mac: MacAddr = m.parse().map_err(|e| format!("{at}: {e}"))?;
            if !mac.is_unicast() {
                return Err(format!("{at}: mac {mac} is not a unicast address"));
            }
        }
        if let Some(t) = p.fka_adv_period {
            if crate::config::seconds_in(t, FKA_ADV_PERIOD_SECS).is_none() {
                return Err(format!("{at}: fka_adv_period must be 0.25–3600 seconds"));
            }
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

/// Opens a port's link.
fn open_link(p: &FcoePortSection) -> anyhow::Result<EthLink> {
    match p.io.as_str() {
        "af_xdp" => open_xdp(p),
        _ => unifab_fcoe::link::af_packet::open(&p.interface)
            .with_context(|| format!("fcoe.port {:?}: opening AF_PACKET", p.interface)),
    }
}

#[cfg(feature = "af-xdp")]
fn open_xdp(p: &FcoePortSection) -> anyhow::Result<EthLink> {
    use unifab_fcoe::link::af_xdp::{XdpConfig, XdpMode};
    let mode = match p.xdp_mode.as_deref() {
        Some("generic") => XdpMode::Generic,
        Some("native") => XdpMode::Native,
        _ => XdpMode::Auto,
    };
    unifab_fcoe::link::af_xdp::open(&p.interface, &XdpConfig::new(mode))
        .with_context(|| format!("fcoe.port {:?}: opening AF_XDP", p.interface))
}

#[cfg(not(feature = "af-xdp"))]
fn open_xdp(p: &FcoePortSection) -> anyhow::Result<EthLink> {
    anyhow::bail!(
        "fcoe.port {:?}: this unifab was built without the af-xdp feature",
        p.interface
    )
}

/// The running FCoE ports.
#[derive(Debug, Default)]
pub struct FcoePorts {
    fcfs: Vec<FcfHandle>,
    enode: Option<EnodeHandle>,
}

/// Ports opened before the fabric starts: the ENode's uplink goes to the
/// fabric's initiator port; the FCFs start once the switch exists.
pub struct Opened {
    fcf_links: Vec<(FcoePortSection, EthLink)>,
    /// The initiator port's attachment, for an ENode port.
    pub initiator_via: Option<Connect>,
    enode: Option<EnodeHandle>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("fcf_links", &self.fcf_links.len())
            .field("enode", &self.enode)
            .finish()
    }
}

fn mac_of(p: &FcoePortSection, link: &EthLink) -> anyhow::Result<MacAddr> {
    let mac = match &p.mac {
        Some(m) => m.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        None => link.mac,
    };
    anyhow::ensure!(
        mac.is_unicast(),
        "fcoe.port {:?}: the interface has no unicast MAC address; set mac",
        p.interface
    );
    Ok(mac)
}

/// Opens every FCoE port's link and starts the ENode (if any). Must run
/// inside the runtime. `initiator_node_name` names the ENode in FIP.
pub fn open(cfg: &Config, initiator_node_name: Wwn) -> anyhow::Result<Opened> {
    let mut out = Opened {
        fcf_links: Vec::new(),
        initiator_via: None,
        enode: None,
    };
    let Some(f) = &cfg.fcoe else {
        return Ok(out);
    };
    for p in &f.port {
        let link = open_link(p)?;
        info!(interface = %p.interface, link = %link.name, mode = %p.mode, "FCoE port opened");
        if p.mode == "enode" {
            let mac = mac_of(p, &link)?;
            let mut ec = EnodeConfig::new(mac, initiator_node_name, p.vlan);
            ec.vlan_discovery = p.vlan_discovery.unwrap_or(p.vlan.is_none());
            ec.pcp = p.priority.unwrap_or(3);
            let (connect, handle) = spawn_enode(ec, link, &p.interface);
            println!("FCoE ENode on {} ({mac})", p.interface);
            out.initiator_via = Some(connect);
            out.enode = Some(handle);
        } else {
            out.fcf_links.push((p.clone(), link));
        }
    }
    Ok(out)
}

impl Opened {
    /// Starts the FCFs on `switch`.
    pub fn start(self, switch: &Switch, switch_name: Wwn) -> anyhow::Result<FcoePorts> {
        let mut fcfs = Vec::new();
        for (p, link) in self.fcf_links {
            let mac = mac_of(&p, &link)?;
            let mut c = FcfConfig::new(mac, p.vlan, switch_name);
            c.pcp = p.priority.unwrap_or(3);
            if let Some(pr) = p.fcf_priority {
                c.priority = pr;
            }
            if let Some(d) = p
                .fka_adv_period
                .and_then(|t| crate::config::seconds_in(t, FKA_ADV_PERIOD_SECS))
            {
                c.fka_adv_period = d;
            }
            println!(
                "FCoE FCF on {} ({mac}, VLAN {})",
                p.interface,
                p.vlan.map_or("none".to_string(), |v| v.to_string())
            );
            fcfs.push(spawn_fcf(c, link, switch.clone(), &p.interface));
        }
        Ok(FcoePorts {
            fcfs,
            enode: self.enode,
        })
    }
}

impl FcoePorts {
    /// Stops every port (FCFs clear their virtual links first).
    pub async fn stop(&self) {
        for f in &self.fcfs {
            f.stop().await;
        }
        if let Some(e) = &self.enode {
            e.stop().await;
        }
    }

    /// Adds the FCoE columns to `show flogi` rows (from the fabric), and
    /// the ENode's own logins at a remote FCF.
    pub fn flogi(&self, rows: &mut Vec<Value>, fabric_port_of: impl Fn(&str) -> Option<usize>) {
        for f in &self.fcfs {
            let ports = f.fabric_ports();
            for v in f.vn_ports() {
                let fcid = v.fc_id.to_string();
                let iface = format!("{}/vfc{}", f.interface, v.vf.0);
                let on_fabric_port = ports.get(&v.vf).copied();
                for r in rows.iter_mut() {
                    let same_id = r.get("fcid").and_then(Value::as_str) == Some(fcid.as_str());
                    let same_port = r
                        .get("interface")
                        .and_then(Value::as_str)
                        .and_then(&fabric_port_of)
                        .is_some_and(|p| Some(p) == on_fabric_port);
                    if same_id && (same_port || on_fabric_port.is_none()) {
                        r["interface"] = json!(if v.npiv {
                            format!("{iface} (npiv)")
                        } else {
                            iface.clone()
                        });
                        r["vlan"] = json!(f.vlan);
                        r["mac"] = json!(v.mac.to_string());
                        r["enode"] = json!(v.enode.to_string());
                    }
                }
            }
        }
        if let Some(e) = &self.enode {
            for v in e.vn_ports() {
                rows.push(json!({
                    "interface": format!("{} (enode)", e.interface),
                    "vlan": e.vlan(),
                    "fcid": v.fc_id.to_string(),
                    "port name": v.port_name.to_string(),
                    "node name": Value::Null,
                    "mac": v.mac.to_string(),
                    "fcf": e.fcf().map(|f| f.mac.to_string()),
                }));
            }
        }
    }

    /// `show fcoe`: every port, its link and counters.
    pub fn show(&self) -> Value {
        let mut v = Vec::new();
        for f in &self.fcfs {
            let c = f.counters();
            v.push(json!({
                "interface": f.interface, "mode": "fcf", "link": f.link, "vlan": f.vlan,
                "vn_ports": f.vn_ports().len(), "logins": c.logins,
                "rx_fcoe": c.rx_fcoe, "tx_fcoe": c.tx_fcoe, "rx_fip": c.rx_fip,
                "malformed_fip": c.malformed_fip, "refused_fip": c.refused_fip,
                "spoofed": c.spoofed, "bad_fcoe": c.bad_fcoe,
                "login_limited": c.login_limited,
                "keep_alive_timeouts": c.keep_alive_timeouts, "cvl_sent": c.cvl_sent,
            }));
        }
        if let Some(e) = &self.enode {
            let c = e.counters();
            v.push(json!({
                "interface": e.interface, "mode": "enode", "link": e.link, "vlan": e.vlan(),
                "fcf": e.fcf().map(|f| f.mac.to_string()),
                "vn_ports": e.vn_ports().len(),
                "rx_fcoe": c.rx_fcoe, "tx_fcoe": c.tx_fcoe, "dropped": c.dropped,
                "cvl_received": c.cvl_received, "fcf_lost": c.fcf_lost,
            }));
        }
        Value::Array(v)
    }
}

/// `show flogi` with FCoE details, and `show fcoe`.
pub fn show(
    fc: Option<&crate::plane::fc::FcPlane>,
    fcoe: Option<&Arc<FcoePorts>>,
    what: &str,
) -> Option<String> {
    match what {
        "flogi" => {
            let mut rows: Vec<Value> = fc
                .and_then(|f| f.show("flogi"))
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
            if let (Some(p), Some(fc)) = (fcoe, fc) {
                let names = fc.switch().with_fabric(|f| {
                    f.ports()
                        .into_iter()
                        .map(|p| (p.name, p.index.0))
                        .collect::<Vec<_>>()
                });
                p.flogi(&mut rows, |iface| {
                    let base = iface.trim_end_matches(" (npiv)");
                    names.iter().find(|(n, _)| n == base).map(|(_, i)| *i)
                });
            } else if let Some(p) = fcoe {
                p.flogi(&mut rows, |_| None);
            }
            Some(Value::Array(rows).to_string())
        }
        "fcoe" => Some(
            fcoe.map_or(Value::Array(Vec::new()), |p| p.show())
                .to_string(),
        ),
        _ => None,
    }
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
