//! `unifab iscsi discover HOST[:PORT]`: SendTargets discovery, then a
//! login to each target to list its LUNs (REPORT LUNS, INQUIRY, READ
//! CAPACITY), with unifab's own initiator.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use bytes::Bytes;

use super::{TOOL_INITIATOR_NAME, command, tool_session};
use unifab_iscsi::initiator::IscsiUrl;
use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiator, address_of, discover};
use unifab_scsi_core::initiator::{Initiator, Request};
use unifab_scsi_core::{Lun, Status, TaskResult};

/// Options of `unifab iscsi discover`.
#[derive(clap::Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// The portal: `HOST[:PORT]`, or `iscsi://[user%secret@]host[:port]` to log
    /// in with CHAP.
    pub portal: String,
    /// Our InitiatorName.
    #[arg(long, default_value = TOOL_INITIATOR_NAME)]
    pub initiator_name: String,
    /// The target's CHAP credentials for mutual CHAP, as USER%SECRET.
    #[arg(long)]
    pub mutual_chap: Option<String>,
    /// List targets only, without logging in to them.
    #[arg(long)]
    pub no_luns: bool,
    /// Seconds for each login and command.
    #[arg(long, default_value_t = 10.0, value_parser = super::parse_seconds)]
    pub timeout: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// One LUN as discovery reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LunInfo {
    /// LUN index.
    pub lun: u16,
    /// SPC peripheral device type (0 = disk, 0x0c = storage controller, …).
    pub device_type: u8,
    /// T10 vendor identification.
    pub vendor: String,
    /// Product identification.
    pub product: String,
    /// Product revision.
    pub revision: String,
    /// Logical block length (disks).
    pub block_size: Option<u32>,
    /// Number of logical blocks (disks).
    pub blocks: Option<u64>,
    /// The address a `[[lu]]` backend or `unifab bench` takes.
    pub url: String,
}

/// One target as discovery reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetInfo {
    /// TargetName.
    pub name: String,
    /// TargetAddress values.
    pub addresses: Vec<String>,
    /// Its LUNs (empty with `--no-luns`).
    pub luns: Vec<LunInfo>,
    /// Why the LUNs could not be listed.
    pub error: Option<String>,
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

fn flat(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

async fn list_luns(
    cfg: &InitiatorConfig,
    addr: &str,
    target: &str,
    chap_user: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<Vec<LunInfo>> {
    let ini = IscsiInitiator::start(cfg.clone(), addr, target);
    let r = async {
        ini.wait_connected(timeout).await?;
        let report = command(
            &ini,
            Request::new(
                Lun(0),
                Bytes::from_static(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]),
                4096,
            ),
        )
        .await?;
        if report.status != Status::GOOD {
            bail!("REPORT LUNS failed with status {:?}", report.status);
        }
        let list = flat(&report);
        let n = list
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize / 8)
            .unwrap_or(0);
        let mut out = Vec::new();
        for i in 0..n {
            let Some(raw) = list.get(8 + i * 8..16 + i * 8) else {
                break;
            };
            let mut b = [0u8; 8];
            b.copy_from_slice(raw);
            let lun = Lun::from_bytes(b);
            let Some(index) = lun.index() else {
                continue;
            };
            let inq = command(
                &ini,
                Request::new(lun, Bytes::from_static(&[0x12, 0, 0, 0, 96, 0]), 96),
            )
            .await?;
            let d = flat(&inq);
            if inq.status != Status::GOOD || d.len() < 36 {
                continue;
            }
            let device_type = d[0] & 0x1f;
            let (mut block_size, mut blocks) = (None, None);
            if device_type == 0 {
                let cap = command(
                    &ini,
                    Request::new(
                        lun,
                        Bytes::from_static(&[
                            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0,
                        ]),
                        32,
                    ),
                )
                .await?;
                let c = flat(&cap);
                if cap.status == Status::GOOD && c.len() >= 12 {
                    let mut last = [0u8; 8];
                    last.copy_from_slice(&c[..8]);
                    blocks = Some(u64::from_be_bytes(last) + 1);
                    block_size = Some(u32::from_be_bytes([c[8], c[9], c[10], c[11]]));
                }
            }
            let creds = chap_user.map(|u| format!("{u}%…@")).unwrap_or_default();
            out.push(LunInfo {
                lun: index,
                device_type,
                vendor: ascii(&d[8..16]),
                product: ascii(&d[16..32]),
                revision: ascii(&d[32..36]),
                block_size,
                blocks,
                url: format!("iscsi://{creds}{addr}/{target}/{index}"),
            });
        }
        Ok(out)
    }
    .await;
    ini.close();
    r
}

fn device_type_name(t: u8) -> &'static str {
    match t {
        0x00 => "disk",
        0x01 => "tape",
        0x05 => "cd/dvd",
        0x08 => "changer",
        0x0c => "controller",
        0x0d => "enclosure",
        0x1f => "unknown",
        _ => "other",
    }
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", units[u])
}

/// Runs `unifab iscsi discover`.
pub async fn run(args: DiscoverArgs) -> anyhow::Result<ExitCode> {
    let spec = if args.portal.starts_with("iscsi://") {
        args.portal.clone()
    } else {
        format!("iscsi://{}", args.portal)
    };
    let url: IscsiUrl = spec
        .parse()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.portal))?;
    let timeout = Duration::from_secs_f64(args.timeout.clamp(0.1, 3600.0));
    let mut cfg = tool_session(&args.initiator_name, &url, args.mutual_chap.as_deref())?;
    cfg.login_timeout = timeout;
    cfg.session.command_timeout = timeout;
    cfg.reconnect_max = Duration::from_millis(500);
    let portal = url.portal();
    let found = discover(&cfg, &portal)
        .await
        .map_err(|e| anyhow::anyhow!("discovery at {portal}: {e}"))?;
    let mut targets = Vec::new();
    for t in found {
        let addr = t
            .addresses
            .first()
            .map(|a| address_of(a))
            .unwrap_or_else(|| portal.clone());
        let (luns, error) = if args.no_luns {
            (Vec::new(), None)
        } else {
            let user = url.chap.as_ref().map(|(u, _)| u.as_str());
            match list_luns(&cfg, &addr, &t.name, user, timeout).await {
                Ok(l) => (l, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            }
        };
        targets.push(TargetInfo {
            name: t.name,
            addresses: t.addresses,
            luns,
            error,
        });
    }
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&targets)?);
    } else {
        if targets.is_empty() {
            crate::outln!("no targets at {portal}");
        }
        for t in &targets {
            crate::outln!("{}", t.name);
            for a in &t.addresses {
                crate::outln!("  portal {a}");
            }
            if let Some(e) = &t.error {
                crate::outln!("  LUNs not listed: {e}");
            }
            for l in &t.luns {
                let size = match (l.block_size, l.blocks) {
                    (Some(bs), Some(n)) => {
                        format!("{} ({n} x {bs})", human(u64::from(bs) * n))
                    }
                    _ => String::new(),
                };
                crate::outln!(
                    "  LUN {:<3} {:<10} {:<8} {:<16} {:<4} {:<28} {}",
                    l.lun,
                    device_type_name(l.device_type),
                    l.vendor,
                    l.product,
                    l.revision,
                    size,
                    l.url
                );
            }
        }
    }
    let failed = targets.iter().any(|t| t.error.is_some());
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
