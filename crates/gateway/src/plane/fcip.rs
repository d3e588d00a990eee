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

/// Starts the tunnel of a `[[fcip.tunnel]]` section.
fn start_tunnel(
    t: &crate::config::fcip::TunnelSection,
    number: u32,
    controller: &InterSwitch,
    tls: &Option<Arc<TlsSettings>>,
) -> anyhow::Result<Tunnel> {
    let peer = wwn("fcip.tunnel.peer", &t.peer).map_err(anyhow::Error::msg)?;
    let mut tc = TunnelConfig::new(&t.name, number, peer, circuits(t));
    tc.mode = mode(t).map_err(anyhow::Error::msg)?;
    tc.compression = t
        .compression
        .as_deref()
        .unwrap_or("none")
        .parse()
        .map_err(anyhow::Error::msg)?;
    tc.fastwrite = t.fastwrite;
    tc.tape_pipelining = t.tape_pipelining;
    let ka = t.keepalive_ms.unwrap_or(20);
    tc.keepalive = Duration::from_millis(ka);
    tc.dead_after = Duration::from_millis(t.dead_ms.unwrap_or(4 * ka));
    tc.tls = tls.clone();
    let tunnel = Tunnel::start(tc, controller.clone());
    crate::notice!("FCIP tunnel {} to switch {peer}", t.name);
    Ok(tunnel)
}

/// The running FCIP plane.
#[derive(Debug)]
pub struct FcipPlane {
    tunnels: std::sync::RwLock<Vec<Tunnel>>,
    listener: Option<Listener>,
    controller: InterSwitch,
    tls: Option<Arc<TlsSettings>>,
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
            tunnels.push(start_tunnel(
                t,
                u32::try_from(i).unwrap_or(0),
                &controller,
                &tls,
            )?);
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
            tunnels: std::sync::RwLock::new(tunnels),
            listener,
            controller,
            tls,
        })
    }

    fn tunnels(&self) -> Vec<Tunnel> {
        self.tunnels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts tunnel `t` while the plane runs (the fabric joins across it
    /// as at start-up); the listener hands it its connections.
    pub fn add_tunnel(&self, t: &crate::config::fcip::TunnelSection) -> Result<(), String> {
        let mut all = self.tunnels.write().unwrap_or_else(|e| e.into_inner());
        if all.iter().any(|x| x.config().name == t.name) {
            return Err(format!("tunnel {:?} runs already", t.name));
        }
        let number = all.iter().map(|x| x.config().number + 1).max().unwrap_or(0);
        let tunnel =
            start_tunnel(t, number, &self.controller, &self.tls).map_err(|e| format!("{e:#}"))?;
        all.push(tunnel);
        if let Some(l) = &self.listener {
            l.set_tunnels(all.clone());
        }
        Ok(())
    }

    /// Stops tunnel `name` ([`Tunnel::stop`]: the inter-switch link goes,
    /// routes through it are withdrawn) and forgets it.
    pub async fn remove_tunnel(&self, name: &str) -> Result<(), String> {
        let tunnel = {
            let mut all = self.tunnels.write().unwrap_or_else(|e| e.into_inner());
            let i = all
                .iter()
                .position(|x| x.config().name == name)
                .ok_or_else(|| format!("no tunnel {name:?} runs"))?;
            let t = all.remove(i);
            if let Some(l) = &self.listener {
                l.set_tunnels(all.clone());
            }
            t
        };
        tunnel.stop().await;
        crate::notice!("FCIP tunnel {name} stopped");
        Ok(())
    }

    /// Gives tunnel `t` the circuits its section lists now (see
    /// [`Tunnel::set_circuits`]: enhanced mode, circuits added or removed
    /// at the end).
    pub async fn set_circuits(&self, t: &crate::config::fcip::TunnelSection) -> Result<(), String> {
        let tunnel = self
            .tunnels()
            .into_iter()
            .find(|x| x.config().name == t.name)
            .ok_or_else(|| format!("no tunnel {:?} runs", t.name))?;
        tunnel.set_circuits(circuits(t)).await
    }

    /// Each circuit's counters for `show interface` (`TUNNEL/N`, class F
    /// `TUNNEL/F`).
    pub fn interfaces(&self) -> Vec<crate::admin::view::Interface> {
        let mut v = Vec::new();
        for t in &self.tunnels() {
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

    /// The `unifab_fcip_*` families beyond the circuits' byte and failure
    /// counters (those are `show interface`'s, [`FcipPlane::interfaces`]):
    /// per tunnel its state, the bytes of FC frames before and after
    /// compression (their ratio is the compression ratio), failovers,
    /// FastWrite writes and dropped frames; per circuit its state, RTT and
    /// failed connection attempts.
    pub fn metric_families(
        &self,
    ) -> Vec<(
        crate::admin::metrics::Family,
        prometheus_client::metrics::MetricType,
    )> {
        use crate::admin::metrics::{Family, Value, counter, gauge};
        let stats: Vec<_> = self.tunnels().iter().map(Tunnel::stats).collect();
        type TunnelGet = fn(&unifab_fcip::io::TunnelStats) -> u64;
        let per_tunnel: [(&str, &'static str, TunnelGet); 13] = [
            (
                "unifab_fcip_tunnel_frame_bytes",
                "Bytes of FC frames the tunnel sent, before compression.",
                |s| s.raw_bytes,
            ),
            (
                "unifab_fcip_tunnel_wire_bytes",
                "Bytes the tunnel sent after compression (frame bytes / wire bytes is the compression ratio).",
                |s| s.wire_bytes,
            ),
            (
                "unifab_fcip_tunnel_failovers",
                "Circuits lost while another carried on.",
                |s| s.failovers,
            ),
            (
                "unifab_fcip_tunnel_fastwrite_writes",
                "Writes FastWrite accelerated.",
                |s| s.fastwrite_writes,
            ),
            (
                "unifab_fcip_tunnel_tape_accelerated",
                "Tape commands tape pipelining answered for (WRITE(6), WRITE FILEMARKS with IMMED).",
                |s| s.tape.accelerated,
            ),
            (
                "unifab_fcip_tunnel_tape_proxy_status",
                "GOOD statuses tape pipelining gave hosts before the far drive answered.",
                |s| s.tape.proxy_status,
            ),
            (
                "unifab_fcip_tunnel_tape_deferred_errors",
                "Far drive errors given to hosts as deferred errors.",
                |s| s.tape.deferred_errors,
            ),
            (
                "unifab_fcip_tunnel_tape_withheld",
                "Tape commands withheld at a sync point or a full pipeline.",
                |s| s.tape.withheld,
            ),
            (
                "unifab_fcip_tunnel_tape_discarded",
                "Queued tape commands the far side discarded after a drive error.",
                |s| s.tape.discarded,
            ),
            (
                "unifab_fcip_tunnel_tape_read_ahead_hits",
                "Host READ(6)s answered from what the far side read ahead.",
                |s| s.tape.read_ahead_hits,
            ),
            (
                "unifab_fcip_tunnel_tape_read_ahead_discarded",
                "Results read ahead and dropped unconsumed (the far drive was spaced back).",
                |s| s.tape.read_ahead_discarded,
            ),
            (
                "unifab_fcip_tunnel_tape_read_ahead_issued",
                "READ(6)s this side sent its drives ahead of the host.",
                |s| s.tape.read_ahead_issued,
            ),
            (
                "unifab_fcip_tunnel_dropped_frames",
                "Frames the tunnel could not carry.",
                |s| s.dropped,
            ),
        ];
        let mut out = Vec::new();
        for (name, help, get) in per_tunnel {
            let mut f = Family::new(name, help);
            for s in &stats {
                f = f.with(vec![("tunnel", s.name.clone())], Value::Counter(get(s)));
            }
            out.push(counter(f));
        }
        let mut up = Family::new("unifab_fcip_tunnel_up", "1 while the tunnel's link is up.");
        for s in &stats {
            up = up.with(
                vec![("tunnel", s.name.clone())],
                Value::Gauge(i64::from(s.state.starts_with("up"))),
            );
        }
        out.push(gauge(up));
        let circuit = |s: &unifab_fcip::io::TunnelStats, c: &unifab_fcip::io::CircuitStats| {
            let slot = if c.slot == 0 {
                "F".to_string()
            } else {
                c.slot.to_string()
            };
            vec![("circuit", format!("{}/{slot}", s.name))]
        };
        let mut rtt = Family::new(
            "unifab_fcip_circuit_rtt_microseconds",
            "The circuit's smoothed TCP round-trip time (TCP_INFO).",
        );
        let mut cup = Family::new(
            "unifab_fcip_circuit_up",
            "1 while the circuit is connected.",
        );
        let mut fails = Family::new(
            "unifab_fcip_circuit_connect_failures",
            "Connection attempts for the circuit that failed.",
        );
        for s in &stats {
            for c in &s.circuits {
                rtt = rtt.with(circuit(s, c), Value::Gauge(i64::from(c.rtt_us)));
                cup = cup.with(circuit(s, c), Value::Gauge(i64::from(c.state == "up")));
                fails = fails.with(circuit(s, c), Value::Counter(c.connect_failures));
            }
        }
        out.push(gauge(rtt));
        out.push(gauge(cup));
        out.push(counter(fails));
        out
    }

    /// JSON for `unifab show fcip`: one row per circuit.
    pub fn show(&self) -> String {
        let mut rows = Vec::new();
        let two = |x: f64| (x * 100.0).round() / 100.0;
        for t in &self.tunnels() {
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
                    "tape_pipelining": s.tape_pipelining,
                    "tape_accelerated": s.tape.accelerated,
                    "tape_proxy_status": s.tape.proxy_status,
                    "tape_deferred_errors": s.tape.deferred_errors,
                    "tape_withheld": s.tape.withheld,
                    "tape_discarded": s.tape.discarded,
                    "tape_read_ahead_hits": s.tape.read_ahead_hits,
                    "tape_read_ahead_discarded": s.tape.read_ahead_discarded,
                    "tape_read_ahead_issued": s.tape.read_ahead_issued,
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
