//! The running FCIP plane: the tunnels and circuits of `[fcip]` attached
//! to the gateway's switch, and `unifab show fcip`. Their configuration is
//! [`crate::config::fcip`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use unifab_fcip::io::tls::TlsSettings;
use unifab_fcip::io::{CircuitConfig, InterSwitch, Listener, Tunnel, TunnelConfig};

use crate::config::fcip::{FcipSection, mode, wwn};

/// The circuits of a `[[fcip.tunnel]]`.
fn circuits(t: &crate::config::fcip::TunnelSection) -> Vec<CircuitConfig> {
    t.circuit
        .iter()
        .map(|c| CircuitConfig {
            peer: c.peer,
            local: c.local,
            weight: c.weight.unwrap_or(1),
        })
        .collect()
}

/// The running FCIP plane.
#[derive(Debug)]
pub struct FcipPlane {
    tunnels: Vec<Tunnel>,
    listener: Option<Listener>,
    controller: InterSwitch,
}

impl FcipPlane {
    /// Starts the controller, the tunnels and the listener on `switch`.
    pub async fn start(
        f: &FcipSection,
        switch: &unifab_fc::io::Switch,
    ) -> anyhow::Result<FcipPlane> {
        let tls = match &f.tls {
            None => None,
            Some(t) => Some(Arc::new(match &t.psk {
                Some(p) => TlsSettings::pre_shared_key(p.as_bytes())?,
                None => {
                    let read = |p: &Option<String>, what: &str| -> anyhow::Result<Vec<u8>> {
                        let p = p.as_ref().with_context(|| format!("fcip.tls.{what}"))?;
                        std::fs::read(p).with_context(|| format!("fcip.tls.{what}: reading {p}"))
                    };
                    TlsSettings::mutual(
                        &read(&t.cert, "cert")?,
                        &read(&t.key, "key")?,
                        &read(&t.ca, "ca")?,
                        t.peer_name.as_deref().unwrap_or_default(),
                    )?
                }
            })),
        };
        let controller = InterSwitch::start(switch.clone());
        let mut tunnels = Vec::new();
        for (i, t) in f.tunnel.iter().enumerate() {
            let peer = wwn("fcip.tunnel.peer", &t.peer).map_err(anyhow::Error::msg)?;
            let circuits = circuits(t);
            let mut tc = TunnelConfig::new(&t.name, u32::try_from(i).unwrap_or(0), peer, circuits);
            tc.mode = mode(t).map_err(anyhow::Error::msg)?;
            tc.compression = t
                .compression
                .as_deref()
                .unwrap_or("none")
                .parse()
                .map_err(anyhow::Error::msg)?;
            tc.fastwrite = t.fastwrite;
            let ka = t.keepalive_ms.unwrap_or(20);
            tc.keepalive = Duration::from_millis(ka);
            tc.dead_after = Duration::from_millis(t.dead_ms.unwrap_or(4 * ka));
            tc.tls = tls.clone();
            tunnels.push(Tunnel::start(tc, controller.clone()));
            crate::notice!("FCIP tunnel {} to switch {peer}", t.name);
        }
        let listener = match f.listen {
            Some(addr) => {
                let local = switch.with_fabric(|f| f.switch_name());
                let l = Listener::start(addr, local, tunnels.clone(), tls.clone())
                    .await
                    .with_context(|| format!("fcip.listen {addr}"))?;
                crate::notice!("FCIP listening on {}", l.local_addr());
                Some(l)
            }
            None => None,
        };
        Ok(FcipPlane {
            tunnels,
            listener,
            controller,
        })
    }

    /// Gives tunnel `t` the circuits its section lists now (see
    /// [`Tunnel::set_circuits`]: enhanced mode, circuits added or removed
    /// at the end).
    pub async fn set_circuits(&self, t: &crate::config::fcip::TunnelSection) -> Result<(), String> {
        let tunnel = self
            .tunnels
            .iter()
            .find(|x| x.config().name == t.name)
            .ok_or_else(|| format!("no tunnel {:?} runs", t.name))?;
        tunnel.set_circuits(circuits(t)).await
    }

    /// Each circuit's counters for `show interface` (`TUNNEL/N`, class F
    /// `TUNNEL/F`).
    pub fn interfaces(&self) -> Vec<crate::admin::view::Interface> {
        let mut v = Vec::new();
        for t in &self.tunnels {
            let s = t.stats();
            for c in &s.circuits {
                let slot = if c.slot == 0 {
                    "F".to_string()
                } else {
                    c.slot.to_string()
                };
                v.push(crate::admin::view::Interface {
                    name: format!("{}/{slot}", s.name),
                    kind: "fcip circuit",
                    state: c.state.clone(),
                    counters: vec![
                        ("rx_bytes", c.rx_bytes),
                        ("tx_bytes", c.tx_bytes),
                        ("retransmits", c.retransmits),
                        ("failures", c.failures),
                    ],
                });
            }
        }
        v
    }

    /// JSON for `unifab show fcip`: one row per circuit.
    pub fn show(&self) -> String {
        let mut rows = Vec::new();
        let two = |x: f64| (x * 100.0).round() / 100.0;
        for t in &self.tunnels {
            let s = t.stats();
            let ratio = (s.wire_bytes > 0).then(|| two(s.raw_bytes as f64 / s.wire_bytes as f64));
            for c in &s.circuits {
                rows.push(serde_json::json!({
                    "tunnel": s.name,
                    "circuit": if c.slot == 0 { "classF".to_string() } else { c.slot.to_string() },
                    "state": c.state,
                    "tunnel_state": s.state,
                    "mode": s.mode,
                    "peer": c.peer,
                    "weight": c.weight,
                    "uptime_seconds": two(c.uptime_s),
                    "tx_mb_per_s": two(c.tx_mbps),
                    "rx_mb_per_s": two(c.rx_mbps),
                    "compression": s.compression,
                    "compression_ratio": ratio,
                    "retransmits": c.retransmits,
                    "rtt_us": c.rtt_us,
                    "fastwrite": s.fastwrite,
                    "fastwrite_writes": s.fastwrite_writes,
                    "failures": c.failures,
                    "connect_failures": c.connect_failures,
                    "last_error": c.last_error_at.map(|_| c.last_error.clone()),
                    "last_error_seconds": c.last_error_at.map(|at| two(at.elapsed().as_secs_f64())),
                }));
            }
        }
        if let Some(l) = &self.listener {
            let st = l.stats();
            if st.refused > 0 {
                rows.push(serde_json::json!({
                    "tunnel": "(listener)",
                    "state": format!("{} refused; last: {}", st.refused, st.last_refusal),
                    "refused": st.refused,
                    "last_refusal": st.last_refusal,
                }));
            }
        }
        serde_json::Value::Array(rows).to_string()
    }

    /// The controller (routes).
    pub fn controller(&self) -> &InterSwitch {
        &self.controller
    }
}
