//! The running FCoE ports: links opened (AF_XDP, AF_PACKET), the FCFs
//! attached to the gateway's fabric and the ENode carrying its FCP
//! initiator, and their part of `unifab show flogi` and `show fcoe`. Their
//! configuration is [`crate::config::fcoe`].

use std::sync::Arc;

use anyhow::Context;
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
use crate::config::fcoe::{FKA_ADV_PERIOD_SECS, FcoePortSection};

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
#[derive(Debug)]
pub struct FcoePorts {
    fcfs: std::sync::RwLock<Vec<FcfHandle>>,
    enode: Option<EnodeHandle>,
    /// The switch FCF ports attach to, and its name.
    switch: Switch,
    switch_name: Wwn,
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
            crate::notice!("FCoE ENode on {} ({mac})", p.interface);
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
            fcfs.push(start_fcf(&p, link, switch, switch_name)?);
        }
        Ok(FcoePorts {
            fcfs: std::sync::RwLock::new(fcfs),
            enode: self.enode,
            switch: switch.clone(),
            switch_name,
        })
    }
}

/// Starts an FCF on an opened link.
fn start_fcf(
    p: &FcoePortSection,
    link: EthLink,
    switch: &Switch,
    switch_name: Wwn,
) -> anyhow::Result<FcfHandle> {
    let mac = mac_of(p, &link)?;
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
    crate::notice!(
        "FCoE FCF on {} ({mac}, VLAN {})",
        p.interface,
        p.vlan.map_or("none".to_string(), |v| v.to_string())
    );
    Ok(spawn_fcf(c, link, switch.clone(), &p.interface))
}

impl FcoePorts {
    fn fcfs(&self) -> Vec<FcfHandle> {
        self.fcfs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Opens the link of FCF port `p`, to be added with
    /// [`FcoePorts::add_fcf`] (what can fail is done here).
    pub fn open_fcf(&self, p: &FcoePortSection) -> anyhow::Result<EthLink> {
        anyhow::ensure!(
            !self.fcfs().iter().any(|f| f.interface == p.interface),
            "fcoe.port {:?} runs already",
            p.interface
        );
        let link = open_link(p)?;
        mac_of(p, &link)?;
        info!(interface = %p.interface, link = %link.name, "FCoE port opened");
        Ok(link)
    }

    /// Attaches FCF port `p` on its opened link to the fabric while the
    /// gateway runs (ENodes on the link find it by FIP discovery and log
    /// in).
    pub fn add_fcf(&self, p: &FcoePortSection, link: EthLink) -> anyhow::Result<()> {
        let f = start_fcf(p, link, &self.switch, self.switch_name)?;
        self.fcfs.write().unwrap_or_else(|e| e.into_inner()).push(f);
        Ok(())
    }

    /// Stops FCF port `interface`: it clears its virtual links (a Clear
    /// Virtual Links to each ENode; their VN_Ports leave the fabric) and
    /// closes its link. False if none runs there.
    pub async fn remove_fcf(&self, interface: &str) -> bool {
        let f = {
            let mut all = self.fcfs.write().unwrap_or_else(|e| e.into_inner());
            let Some(i) = all.iter().position(|f| f.interface == interface) else {
                return false;
            };
            all.remove(i)
        };
        f.stop().await;
        crate::notice!("FCoE FCF on {interface} stopped");
        true
    }

    /// Stops every port (FCFs clear their virtual links first).
    pub async fn stop(&self) {
        for f in &self.fcfs() {
            f.stop().await;
        }
        if let Some(e) = &self.enode {
            e.stop().await;
        }
    }

    /// Adds the FCoE columns to `show flogi` rows (from the fabric), and
    /// the ENode's own logins at a remote FCF.
    pub fn flogi(&self, rows: &mut Vec<Value>, fabric_port_of: impl Fn(&str) -> Option<usize>) {
        for f in &self.fcfs() {
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
                    "port_name": v.port_name.to_string(),
                    "node_name": Value::Null,
                    "mac": v.mac.to_string(),
                    "fcf": e.fcf().map(|f| f.mac.to_string()),
                }));
            }
        }
    }

    /// Each port's counters for `show interface`: name, kind, counters.
    pub fn interfaces(&self) -> Vec<crate::admin::view::Interface> {
        let mut v = Vec::new();
        for f in &self.fcfs() {
            let c = f.counters();
            v.push(crate::admin::view::Interface {
                name: f.interface.clone(),
                kind: "fcoe (fcf)",
                state: f.link.clone(),
                counters: vec![
                    ("rx_frames", c.rx_fcoe),
                    ("tx_frames", c.tx_fcoe),
                    ("spoofed", c.spoofed),
                    ("keep_alive_misses", c.keep_alive_timeouts),
                ],
            });
        }
        if let Some(e) = &self.enode {
            let c = e.counters();
            v.push(crate::admin::view::Interface {
                name: e.interface.clone(),
                kind: "fcoe (enode)",
                state: e.link.clone(),
                counters: vec![
                    ("rx_frames", c.rx_fcoe),
                    ("tx_frames", c.tx_fcoe),
                    ("discards", c.dropped),
                ],
            });
        }
        v
    }

    /// `show fcoe`: every port, its link and counters.
    pub fn show(&self) -> Value {
        let mut v = Vec::new();
        for f in &self.fcfs() {
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
