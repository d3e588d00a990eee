//! The operator's commands besides `run`: `unifab show` (the admin
//! endpoint's views), `unifab iscsi discover` and `unifab bench` (unifab's
//! own initiator against any target), and what they share.

pub mod bench;
pub mod discover;
pub mod show;

use anyhow::{Context, bail};
use unifab_iscsi::chap::ChapCredentials;
use unifab_iscsi::initiator::IscsiUrl;
use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiator, random_isid};
use unifab_scsi_core::initiator::{Initiator, Request};
use unifab_scsi_core::sense::{Sense, SenseKey};
use unifab_scsi_core::{Status, TaskResult};

/// The InitiatorName `unifab iscsi discover` and `unifab bench` use unless
/// told otherwise.
pub const TOOL_INITIATOR_NAME: &str = "iqn.2026-11.io.unifab:tools";

/// A command-line number of seconds: finite, 0 to a year (a Duration
/// cannot hold every f64, and NaN or infinity would not mean anything).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| crate::config::seconds_in(*v, 0.0..=31_536_000.0).is_some())
        .ok_or_else(|| format!("{s:?} is not a number of seconds from 0 to 31536000"))
}

/// Parses `USER%SECRET`.
pub fn parse_credentials(s: &str) -> anyhow::Result<ChapCredentials> {
    let (u, p) = s
        .split_once('%')
        .context("credentials are written USER%SECRET")?;
    Ok(ChapCredentials::new(u, p.as_bytes().to_vec()))
}

/// Sends a command, retrying through unit attentions and transport hiccups
/// (as a host does), and returns the first other answer.
pub async fn command(ini: &IscsiInitiator, request: Request) -> anyhow::Result<TaskResult> {
    let mut last = None;
    for _ in 0..6 {
        match ini.submit(request.clone()).outcome.await {
            Ok(r) if r.status == Status::CHECK_CONDITION => {
                let s = r.sense.as_deref().and_then(Sense::parse);
                if s.is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION) {
                    continue;
                }
                return Ok(r);
            }
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e.into()),
        None => bail!("unit attentions did not clear"),
    }
}

/// The initiator settings of a one-off tool session (`discover`, `bench`)
/// to `url` as `initiator_name`: a random ISID, so that it never
/// reinstates anyone else's session; CHAP from the URL; mutual CHAP from
/// `mutual_chap` (`USER%SECRET`), else from the URL.
pub fn tool_session(
    initiator_name: &str,
    url: &IscsiUrl,
    mutual_chap: Option<&str>,
) -> anyhow::Result<InitiatorConfig> {
    let mut cfg = InitiatorConfig::new(initiator_name.to_string());
    cfg.isid = random_isid();
    cfg.chap = url
        .chap
        .as_ref()
        .map(|(u, p)| ChapCredentials::new(u.clone(), p.as_bytes().to_vec()));
    cfg.mutual_chap = match (mutual_chap, &url.mutual_chap) {
        (Some(m), _) => Some(parse_credentials(m)?),
        (None, Some((u, p))) => Some(ChapCredentials::new(u.clone(), p.as_bytes().to_vec())),
        _ => None,
    };
    Ok(cfg)
}
