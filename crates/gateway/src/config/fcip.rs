//! `[fcip]`: the tunnels joining this gateway's fabric to other sites'
//! (VE_Ports), their circuits and the FCIP listener, and their
//! validation. The running tunnels are [`crate::plane::fcip`].
//!
//! ```toml
//! [fcip]
//! listen = "0.0.0.0:3225"              # accept tunnels (omit to only connect)
//! # TLS 1.3 on every circuit, both ends unifab (RFC 3821's IPsec is not
//! # available to a userspace gateway). Either a pre-shared key …
//! tls = { psk = "at-least-16-bytes-of-secret" }
//! # … or mutual certificates:
//! # tls = { cert = "site-a.pem", key = "site-a.key", ca = "ca.pem", peer_name = "site-b" }
//!
//! [[fcip.tunnel]]
//! name = "fcip0"
//! peer = "10:00:00:00:c9:00:00:02"     # the far switch's name (its fabric.switch_wwn)
//! mode = "enhanced"                    # or "rfc" (plain RFC 3821, any FCIP peer)
//! compression = "auto"                 # none | lz4 | zstd | auto (enhanced mode)
//! fastwrite = true                     # enhanced mode; both ends must want it
//! tape_pipelining = true               # with fastwrite: tapes' writes answered by the tunnel
//! keepalive_ms = 20                    # heartbeat (enhanced) / HLO (rfc) interval
//! dead_ms = 80                         # silence that declares a circuit dead
//!
//! [[fcip.tunnel.circuit]]
//! peer = "192.0.2.20:3225"             # omit on the accepting side
//! local = "192.0.2.10:0"               # optional source address
//! weight = 1
//! ```
//!
//! The tunnel joins this gateway's `[fabric]` (whose domain must differ
//! from the far side's) to the far fabric: hosts find targets at the
//! other site through the name server, and `fc://WWPN/LUN` LUs reach them.

use std::net::SocketAddr;

use serde::Deserialize;
use unifab_fc::wire::Wwn;
use unifab_fcip::io::LinkMode;
use unifab_fcip::proto::compress;

use crate::config::Config;

/// `[fcip]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcipSection {
    /// Where to accept tunnels.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// TLS for every circuit.
    #[serde(default)]
    pub tls: Option<TlsSection>,
    /// Tunnels.
    #[serde(default)]
    pub tunnel: Vec<TunnelSection>,
}

/// `[fcip] tls`: a pre-shared key, or mutual certificates.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Pre-shared key (≥ 16 bytes).
    #[serde(default)]
    pub psk: Option<String>,
    /// Our certificate chain (PEM file).
    #[serde(default)]
    pub cert: Option<String>,
    /// Our key (PEM file).
    #[serde(default)]
    pub key: Option<String>,
    /// CA certificates that sign the peers' (PEM file).
    #[serde(default)]
    pub ca: Option<String>,
    /// Name the peer's certificate must carry.
    #[serde(default)]
    pub peer_name: Option<String>,
}

impl std::fmt::Debug for TlsSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSection")
            .field("psk", &self.psk.as_ref().map(|_| "<redacted>"))
            .field("cert", &self.cert)
            .field("ca", &self.ca)
            .finish()
    }
}

/// `[[fcip.tunnel]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TunnelSection {
    /// Name (also the VE_Port's fabric port name).
    pub name: String,
    /// The far switch's name.
    pub peer: String,
    /// `"rfc"` (default) or `"enhanced"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// `none` (default), `lz4`, `zstd`, `auto`.
    #[serde(default)]
    pub compression: Option<String>,
    /// FastWrite.
    #[serde(default)]
    pub fastwrite: bool,
    /// Tape pipelining (needs `fastwrite`; both ends must want it): a
    /// tape's WRITE(6) and WRITE FILEMARKS IMMED answered by the tunnel,
    /// the far drive fed one command at a time (docs/fcip.md).
    #[serde(default)]
    pub tape_pipelining: bool,
    /// Keep-alive interval in ms (default 20).
    #[serde(default)]
    pub keepalive_ms: Option<u64>,
    /// Dead-circuit timeout in ms (default 4 × keep-alive).
    #[serde(default)]
    pub dead_ms: Option<u64>,
    /// Circuits.
    pub circuit: Vec<CircuitSection>,
}

/// `[[fcip.tunnel.circuit]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CircuitSection {
    /// Address to connect to (absent: accept).
    #[serde(default)]
    pub peer: Option<SocketAddr>,
    /// Source address.
    #[serde(default)]
    pub local: Option<SocketAddr>,
    /// Weight (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
}

pub(crate) fn wwn(field: &str, s: &str) -> Result<Wwn, String> {
    s.parse::<Wwn>()
        .map_err(|_| format!("{field}: {s:?} is not a WWN (10:00:00:00:c9:00:00:02)"))
}

pub(crate) fn mode(t: &TunnelSection) -> Result<LinkMode, String> {
    match t.mode.as_deref() {
        None | Some("rfc") => Ok(LinkMode::Rfc),
        Some("enhanced") => Ok(LinkMode::Enhanced),
        Some(o) => Err(format!(
            "fcip.tunnel {:?}: mode {o:?}: \"rfc\" or \"enhanced\"",
            t.name
        )),
    }
}

/// Cross-checks of `[fcip]`.
pub fn validate(cfg: &Config) -> Result<(), String> {
    let Some(f) = &cfg.fcip else { return Ok(()) };
    if cfg.fabric.is_none() {
        return Err("[fcip] needs a [fabric] section (tunnels join fabrics)".into());
    }
    let mut names = std::collections::HashSet::new();
    for t in &f.tunnel {
        if !names.insert(t.name.as_str()) {
            return Err(format!("fcip.tunnel {:?} is defined twice", t.name));
        }
        wwn(&format!("fcip.tunnel {:?}: peer", t.name), &t.peer)?;
        let m = mode(t)?;
        let c = t
            .compression
            .as_deref()
            .unwrap_or("none")
            .parse::<compress::Mode>()
            .map_err(|e| format!("fcip.tunnel {:?}: {e}", t.name))?;
        if t.tape_pipelining && !t.fastwrite {
            return Err(format!(
                "fcip.tunnel {:?}: tape_pipelining builds on FastWrite: set fastwrite = true",
                t.name
            ));
        }
        if m == LinkMode::Rfc && (c != compress::Mode::None || t.fastwrite) {
            return Err(format!(
                "fcip.tunnel {:?}: compression and fastwrite need mode = \"enhanced\"",
                t.name
            ));
        }
        if t.circuit.is_empty() {
            return Err(format!("fcip.tunnel {:?} has no circuit", t.name));
        }
        if t.circuit.len() > unifab_fcip::io::MAX_CIRCUITS {
            return Err(format!(
                "fcip.tunnel {:?} has {} circuits; at most {}",
                t.name,
                t.circuit.len(),
                unifab_fcip::io::MAX_CIRCUITS
            ));
        }
        let connects = t.circuit.iter().filter(|c| c.peer.is_some()).count();
        if connects != 0 && connects != t.circuit.len() {
            return Err(format!(
                "fcip.tunnel {:?}: either every circuit names a peer address (this side connects) or none does (it accepts)",
                t.name
            ));
        }
        if connects == 0 && f.listen.is_none() {
            return Err(format!(
                "fcip.tunnel {:?} accepts its circuits: fcip.listen is needed",
                t.name
            ));
        }
        if t.circuit.iter().any(|c| c.weight == Some(0)) {
            return Err(format!(
                "fcip.tunnel {:?}: a circuit weight must be positive",
                t.name
            ));
        }
        if t.keepalive_ms == Some(0) || t.dead_ms.is_some_and(|d| d < t.keepalive_ms.unwrap_or(20))
        {
            return Err(format!(
                "fcip.tunnel {:?}: keepalive_ms must be positive and dead_ms at least keepalive_ms",
                t.name
            ));
        }
    }
    if let Some(t) = &f.tls {
        match (&t.psk, &t.cert, &t.key, &t.ca) {
            (Some(p), None, None, None) if p.len() >= 16 => {}
            (Some(_), None, None, None) => {
                return Err("fcip.tls.psk must have at least 16 bytes".into());
            }
            (None, Some(_), Some(_), Some(_)) if t.peer_name.is_some() => {}
            _ => {
                return Err("fcip.tls: either psk, or cert + key + ca + peer_name".into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const CFG: &str = r#"
[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"

[fcip]
listen = "127.0.0.1:3225"
tls = { psk = "at-least-16-bytes-of-secret" }

[[fcip.tunnel]]
name = "fcip0"
peer = "10:00:00:00:c9:00:00:02"
mode = "enhanced"
compression = "auto"
fastwrite = true
keepalive_ms = 20
dead_ms = 80

[[fcip.tunnel.circuit]]
peer = "192.0.2.20:3225"
weight = 2

[[fcip.tunnel.circuit]]
peer = "192.0.2.21:3225"
local = "192.0.2.10:0"
"#;

    #[test]
    fn the_documented_config_parses_and_bad_ones_are_refused() {
        let c = Config::parse(CFG, "site.toml").unwrap();
        let f = c.fcip.as_ref().unwrap();
        assert_eq!(f.tunnel[0].circuit.len(), 2);
        assert_eq!(f.tunnel[0].circuit[0].weight, Some(2));
        assert_eq!(mode(&f.tunnel[0]).unwrap(), LinkMode::Enhanced);
        let bad = |from: &str, to: &str| {
            Config::parse(&CFG.replace(from, to), "site.toml")
                .unwrap_err()
                .to_string()
        };
        assert!(bad("mode = \"enhanced\"", "mode = \"fast\"").contains("mode"));
        assert!(bad("mode = \"enhanced\"", "mode = \"rfc\"").contains("need mode = \"enhanced\""));
        assert!(bad("compression = \"auto\"", "compression = \"gzip\"").contains("compression"));
        assert!(bad("peer = \"10:00:00:00:c9:00:00:02\"", "peer = \"nope\"").contains("not a WWN"));
        assert!(bad("weight = 2", "weight = 0").contains("weight"));
        assert!(bad("dead_ms = 80", "dead_ms = 5").contains("dead_ms"));
        assert!(
            bad("psk = \"at-least-16-bytes-of-secret\"", "psk = \"short\"").contains("16 bytes")
        );
        assert!(bad("peer = \"192.0.2.21:3225\"\n", "").contains("either every circuit"));
        let e = bad("fastwrite = true", "fastwrite = true\nturbo = 1");
        assert!(e.starts_with("site.toml:") && e.contains("turbo"), "{e}");
        let no_fabric = CFG.replace(
            "[fabric]\ndomain = 1\nswitch_wwn = \"10:00:00:00:c9:00:00:01\"\n",
            "",
        );
        assert!(
            Config::parse(&no_fabric, "x")
                .unwrap_err()
                .to_string()
                .contains("needs a [fabric]")
        );
    }
}
