//! The gateway's remote `iscsi://` logical units, running: each a
//! `RemoteLu` on unifab's iSCSI initiator with the settings of its
//! `[lu.iscsi]` table ([`crate::config::remote`] checks them), their
//! background probe, and their rows of `unifab show remotes`. Also
//! [`GatewayLu`], the two kinds of LU the gateway builds.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use unifab_iscsi::chap::ChapCredentials;
use unifab_iscsi::initiator::IscsiUrl;
use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiatorFactory};
use unifab_iscsi::negotiate::Digest;
use unifab_scsi_core::LogicalUnit;
use unifab_scsi_core::emulated::EmulatedLu;
use unifab_scsi_core::initiator::InitiatorFactory;
use unifab_scsi_core::multipath::MultipathFactory;
use unifab_scsi_core::remote::{Identity, RemoteLu, RemoteLuConfig};

use crate::config::remote::{identity, replacement_timeout, secs};
use crate::config::{Backend, LuConfig, RemoteIscsiConfig};

/// The InitiatorName of the gateway's own sessions.
pub const GATEWAY_INITIATOR_NAME: &str = "iqn.2026-11.io.unifab:gateway";

/// A logical unit the gateway built from its configuration.
#[derive(Debug, Clone)]
pub enum GatewayLu {
    /// Served from a local backend.
    Emulated(Arc<EmulatedLu>),
    /// Forwarded to a remote target.
    Remote(Arc<RemoteLu>),
    /// A tape drive over a local backend.
    Tape(Arc<unifab_scsi_core::tape::TapeLu>),
}

impl GatewayLu {
    /// The LU as the LUN map holds it.
    pub fn lu(&self) -> Arc<dyn LogicalUnit> {
        match self {
            GatewayLu::Emulated(l) => l.clone(),
            GatewayLu::Remote(l) => l.clone(),
            GatewayLu::Tape(l) => l.clone(),
        }
    }

    /// The NAA designator the LU reports, when unifab decides it.
    pub fn naa(&self) -> Option<u64> {
        match self {
            GatewayLu::Emulated(l) => Some(l.naa()),
            GatewayLu::Tape(l) => Some(l.naa()),
            GatewayLu::Remote(l) => {
                matches!(l.config().identity, Identity::Derived { .. }).then(|| l.naa())
            }
        }
    }
}

/// The initiator settings for a URL and its `[lu.iscsi]` table.
pub fn initiator_config(
    url: &IscsiUrl,
    r: Option<&RemoteIscsiConfig>,
) -> anyhow::Result<InitiatorConfig> {
    let d = RemoteIscsiConfig {
        mutual_user: None,
        mutual_secret: None,
        initiator_name: None,
        nexus: None,
        fixed_name: false,
        identity: None,
        identity_seed: None,
        command_timeout: None,
        nop_interval: None,
        nop_timeout: None,
        login_timeout: None,
        replacement_timeout: None,
        digests: None,
        queue_depth: None,
        busy_poll_us: None,
        busy_poll_depth: None,
        portals: None,
    };
    let r = r.unwrap_or(&d);
    let mut cfg = InitiatorConfig::new(
        r.initiator_name
            .clone()
            .unwrap_or_else(|| GATEWAY_INITIATOR_NAME.to_string()),
    );
    cfg.chap = url
        .chap
        .as_ref()
        .map(|(u, s)| ChapCredentials::new(u.clone(), s.clone().into_bytes()));
    cfg.mutual_chap = match (&r.mutual_user, &r.mutual_secret, &url.mutual_chap) {
        (Some(u), Some(s), _) => Some(ChapCredentials::new(u.clone(), s.clone().into_bytes())),
        (_, _, Some((u, s))) => Some(ChapCredentials::new(u.clone(), s.clone().into_bytes())),
        _ => None,
    };
    let e = anyhow::Error::msg;
    cfg.session.command_timeout = secs("command_timeout", r.command_timeout, 20.0).map_err(e)?;
    let nop = secs("nop_interval", r.nop_interval, 5.0).map_err(e)?;
    cfg.session.nop_interval = (!nop.is_zero()).then_some(nop);
    cfg.session.nop_timeout = secs("nop_timeout", r.nop_timeout, 5.0).map_err(e)?;
    cfg.session.tmf_timeout = cfg.session.nop_timeout.max(Duration::from_secs(1));
    cfg.login_timeout = secs("login_timeout", r.login_timeout, 10.0).map_err(e)?;
    cfg.session.replacement_timeout = replacement_timeout(r).map_err(e)?;
    if let Some(q) = r.queue_depth {
        cfg.session.max_commands = q;
    }
    cfg.busy_poll = Duration::from_micros(r.busy_poll_us.unwrap_or(0));
    cfg.busy_poll_depth = r.busy_poll_depth.unwrap_or(1);
    if let Some(ds) = &r.digests {
        let list: Vec<Digest> = ds.iter().filter_map(|s| Digest::from_name(s)).collect();
        cfg.limits.header_digests = list.clone();
        cfg.limits.data_digests = list;
    }
    Ok(cfg)
}

/// Builds the remote LU of an `iscsi://` `[[lu]]`. Nothing connects yet:
/// the first command (or [`RemoteLu::probe`]) logs in.
pub fn build_remote_lu(lu: &LuConfig) -> anyhow::Result<Arc<RemoteLu>> {
    build_remote(lu).map(|(lu, _)| lu)
}

/// The paths of an `iscsi://` LU, for `unifab show remotes`: each
/// portal's address and the factory of its sessions, and with several
/// the multipath factory that chooses among them.
#[derive(Debug, Clone)]
pub struct IscsiPaths {
    /// Each path: its redacted address and its sessions' factory.
    pub paths: Vec<(String, Arc<IscsiInitiatorFactory>)>,
    /// The paths' states, with more than one.
    pub multipath: Option<Arc<MultipathFactory>>,
}

/// [`build_remote_lu`], with its paths (for `unifab show remotes`).
pub fn build_remote(lu: &LuConfig) -> anyhow::Result<(Arc<RemoteLu>, IscsiPaths)> {
    let Backend::Iscsi(url) = lu.parsed_backend().map_err(anyhow::Error::msg)? else {
        anyhow::bail!("lu {:?} is not an iscsi:// LU", lu.name);
    };
    let r = lu.iscsi.as_ref();
    let cfg = initiator_config(&url, r)?;
    let target = url.target.clone().context("no target in the URL")?;
    let lun = url.lun().context("no LUN in the URL")?;
    let per_nexus = r.and_then(|r| r.nexus.as_deref()) != Some("shared");
    let fixed = r.is_some_and(|r| r.fixed_name);
    let mut paths = vec![(
        url.redacted(),
        Arc::new(
            IscsiInitiatorFactory::new(cfg.clone(), &url.portal(), &target, &lu.name, per_nexus)
                .fixed_name(fixed),
        ),
    )];
    for p in r.and_then(|r| r.portals.as_ref()).into_iter().flatten() {
        let other: IscsiUrl = format!("iscsi://{p}/{target}/{}", url.lun.unwrap_or(0))
            .parse()
            .map_err(|e| anyhow::anyhow!("lu {:?}: portal {p:?}: {e}", lu.name))?;
        paths.push((
            other.redacted(),
            Arc::new(
                IscsiInitiatorFactory::new(
                    cfg.clone(),
                    &other.portal(),
                    &target,
                    &lu.name,
                    per_nexus,
                )
                .fixed_name(fixed),
            ),
        ));
    }
    let multipath = (paths.len() > 1).then(|| {
        Arc::new(MultipathFactory::new(
            paths
                .iter()
                .map(|(name, f)| (name.clone(), f.clone() as Arc<dyn InitiatorFactory>))
                .collect(),
        ))
    });
    let factory: Arc<dyn InitiatorFactory> = match &multipath {
        Some(m) => m.clone(),
        None => paths[0].1.clone(),
    };
    let identity = identity(
        r.and_then(|r| r.identity.as_deref()),
        r.and_then(|r| r.identity_seed.as_deref()),
        || format!("{target}/{}", url.lun.unwrap_or(0)),
    );
    let remote = Arc::new(RemoteLu::new(
        RemoteLuConfig {
            name: lu.name.clone(),
            backend: url.redacted(),
            remote_lun: lun,
            identity,
            task_set_depth: 4096,
            read_only: lu.read_only,
        },
        factory,
    ));
    Ok((remote, IscsiPaths { paths, multipath }))
}

/// What every row of `unifab show remotes` has, `iscsi://` or `fc://`.
#[derive(Debug)]
pub struct RemoteRow<'a> {
    /// The LU.
    pub lu: &'a str,
    /// Its remote, redacted.
    pub remote: &'a str,
    /// The local initiator port.
    pub initiator: String,
    /// In session now.
    pub up: bool,
    /// How long it has been so.
    pub for_how_long: Duration,
    /// Successful logins so far.
    pub logins: u64,
    /// The last failure and how long ago it was.
    pub last_error: Option<(&'a str, Duration)>,
}

impl RemoteRow<'_> {
    /// The row as JSON, with the transport's own columns added.
    pub fn to_json(&self, extra: serde_json::Value) -> serde_json::Value {
        let secs = self.for_how_long.as_secs_f64();
        let mut row = serde_json::json!({
            "lu": self.lu,
            "remote": self.remote,
            "initiator": self.initiator,
            "state": if self.up { "up" } else { "down" },
            "seconds": secs,
            "logins": self.logins,
            "last_error": self.last_error.map(|(e, _)| e),
            "last_error_seconds": self.last_error.map(|(_, age)| age.as_secs_f64()),
        });
        if let (Some(row), serde_json::Value::Object(extra)) = (row.as_object_mut(), extra) {
            row.extend(extra);
        }
        row
    }
}

/// Rows of `unifab show remotes`: every session to the remote of each
/// `iscsi://` LU (the shared one that probes it, and one per host
/// initiator with `nexus = "per-initiator"`).
pub fn iscsi_remote_rows(remotes: &[(String, String, IscsiPaths)]) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for (name, _, paths) in remotes {
        let states = paths.multipath.as_ref().map(|m| m.paths());
        for (i, (backend, factory)) in paths.paths.iter().enumerate() {
            // With several paths: each one's ALUA state as learnt.
            let path = states.as_ref().and_then(|s| s.get(i)).map(|p| {
                serde_json::json!({
                    "group": p.group,
                    "state": p.state.map(|s| s.name()),
                    "failures": p.failures,
                    "last_error": p.last_error,
                })
            });
            for s in factory.sessions() {
                let row = RemoteRow {
                    lu: name,
                    remote: backend,
                    initiator: s.initiator_name.clone(),
                    up: s.connected,
                    for_how_long: s.for_how_long,
                    logins: s.logins,
                    last_error: s.last_error.as_deref().zip(s.last_error_age),
                };
                rows.push(row.to_json(serde_json::json!({
                    "isid": s.isid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                    "digests": s.digests.map(|d| d.to_string()),
                    "commands": s.commands,
                    "path": path.as_ref().and_then(|p| p["state"].as_str()).unwrap_or("-"),
                    "path_detail": path,
                })));
            }
        }
    }
    rows
}

/// Asks the remote for the LU's capacity in the background until it
/// answers, logging the outcome once (a remote that is down at start does
/// not stop the gateway; its commands fail with sense until it is back).
pub fn spawn_probe(name: String, lu: Arc<RemoteLu>) {
    // A LU removed by a reload is not kept alive (nor probed) by this.
    let weak = Arc::downgrade(&lu);
    drop(lu);
    tokio::spawn(async move {
        let mut wait = Duration::from_millis(500);
        let mut warned = false;
        loop {
            let Some(lu) = weak.upgrade() else {
                return;
            };
            match lu.probe().await {
                Ok((0, _)) => {
                    tracing::info!(
                        lu = %name,
                        remote = %lu.config().backend,
                        "remote logical unit reachable (no READ CAPACITY: not a block device)"
                    );
                    return;
                }
                Ok((bs, blocks)) => {
                    tracing::info!(
                        lu = %name,
                        remote = %lu.config().backend,
                        block_size = bs,
                        bytes = u64::from(bs) * blocks,
                        "remote logical unit reachable"
                    );
                    return;
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(lu = %name, remote = %lu.config().backend, error = %e, "remote logical unit not reachable yet; retrying");
                        warned = true;
                    }
                    drop(lu);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use unifab_scsi_core::Lun;

    fn cfg(extra: &str, backend: &str) -> Result<Config, String> {
        Config::parse(
            &format!("[[lu]]\nname = \"r\"\nbackend = \"{backend}\"\n{extra}"),
            "t.toml",
        )
        .map_err(|e| e.to_string())
    }

    const URL: &str = "iscsi://gw%gateway-secret@127.0.0.1:3261/iqn.2026-11.io.unifab:tgtd/1";

    #[test]
    fn a_remote_lu_parses_with_its_settings() {
        let c = cfg(
            "[lu.iscsi]\nmutual_user = \"t\"\nmutual_secret = \"target-secret-1\"\nnexus = \"shared\"\nidentity = \"passthrough\"\ncommand_timeout = 2.5\nreplacement_timeout = 0.75\nnop_interval = 0\ndigests = [\"CRC32C\"]\n",
            URL,
        )
        .unwrap();
        let lu = &c.lu[0];
        let Backend::Iscsi(url) = lu.parsed_backend().unwrap() else {
            panic!()
        };
        let ic = initiator_config(&url, lu.iscsi.as_ref()).unwrap();
        assert_eq!(ic.session.command_timeout, Duration::from_millis(2500));
        assert_eq!(
            ic.session.replacement_timeout,
            Some(Duration::from_millis(750))
        );
        assert_eq!(ic.session.nop_interval, None);
        assert_eq!(ic.limits.header_digests, vec![Digest::Crc32c]);
        assert_eq!(ic.chap.as_ref().unwrap().name, "gw");
        assert_eq!(ic.mutual_chap.as_ref().unwrap().name, "t");
        assert_eq!(ic.initiator_name, GATEWAY_INITIATOR_NAME);
        assert!(!format!("{:?}", lu.iscsi).contains("target-secret-1"));
        // Without the setting, commands wait up to command_timeout.
        let plain = initiator_config(&url, None).unwrap();
        assert_eq!(plain.session.replacement_timeout, None);
    }

    #[test]
    fn mistakes_are_named() {
        for (extra, backend, want) in [
            ("size = \"1GiB\"\n", URL, "takes its size"),
            ("[lu.iscsi]\nnexus = \"many\"\n", URL, "nexus"),
            ("[lu.iscsi]\nidentity = \"x\"\n", URL, "identity"),
            (
                "[lu.iscsi]\nmutual_user = \"t\"\n",
                URL,
                "mutual CHAP needs both",
            ),
            ("[lu.iscsi]\ndigests = [\"MD5\"]\n", URL, "unknown digest"),
            ("[lu.iscsi]\ncommand_timeout = 0\n", URL, "command_timeout"),
            (
                "[lu.iscsi]\nreplacement_timeout = 0\n",
                URL,
                "replacement_timeout",
            ),
            (
                "[lu.iscsi]\nreplacement_timeout = nan\n",
                URL,
                "replacement_timeout",
            ),
            (
                "[lu.iscsi]\nreplacement_timeout = 1e9\n",
                URL,
                "replacement_timeout",
            ),
            ("[lu.iscsi]\nbogus = 1\n", URL, "bogus"),
            ("", "iscsi://h/iqn.2026-11.x:y", "names a target and a LUN"),
            ("", "iscsi://u%short@h/iqn.2026-11.x:y/0", "12 bytes"),
            (
                "size = \"1GiB\"\n[lu.iscsi]\nnexus = \"shared\"\n",
                "memory",
                "need an iscsi:// backend",
            ),
            (
                "[lu.iscsi]\nmutual_user = \"t\"\nmutual_secret = \"target-secret-1\"\n",
                "iscsi://h/iqn.2026-11.x:y/0",
                "initiator's own CHAP",
            ),
        ] {
            let e = cfg(extra, backend).unwrap_err();
            assert!(e.contains(want), "{backend} {extra:?}: {e}");
            assert!(
                !e.contains("gateway-secret"),
                "secrets never in errors: {e}"
            );
        }
    }

    #[tokio::test]
    async fn the_remote_lu_names_its_remote_without_secrets() {
        let c = cfg("", URL).unwrap();
        let lu = build_remote_lu(&c.lu[0]).unwrap();
        let d = lu.describe();
        assert_eq!(
            d.backend,
            "iscsi://127.0.0.1:3261/iqn.2026-11.io.unifab:tgtd/1"
        );
        assert_eq!(lu.config().remote_lun, Lun(1 << 48));
        // Derived identity from target and LUN, stable.
        let again = build_remote_lu(&c.lu[0]).unwrap();
        assert_eq!(lu.naa(), again.naa());
        let g = GatewayLu::Remote(lu);
        assert!(g.naa().is_some());
    }
}
