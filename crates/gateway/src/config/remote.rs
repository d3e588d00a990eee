//! Remote logical units in the configuration: a `[[lu]]` whose backend is
//! `iscsi://[user%secret@]host[:port]/iqn/lun` (or `fc://`, with
//! [`crate::config::fabric`]) is a remote LU, exported over the gateway's
//! own targets like any other LU (a bridge). This module checks what only
//! a remote LU may or must have; [`crate::plane::remote`] builds them on
//! unifab's iSCSI initiator.
//!
//! ```toml
//! [[lu]]
//! name = "array-disk"
//! backend = "iscsi://gw%gateway-secret@192.0.2.10:3260/iqn.2001-04.com.example:disk/1"
//! [lu.iscsi]                      # all optional
//! mutual_user = "array"           # mutual CHAP: the target's name and secret
//! mutual_secret = "array-secret-1"
//! nexus = "per-initiator"         # or "shared"
//! identity = "derived"            # or "passthrough"
//! command_timeout = 20            # seconds; every command ends within it
//! replacement_timeout = 5         # seconds without a connection before the
//!                                 # commands waiting for one fail (default:
//!                                 # they wait up to command_timeout)
//! nop_interval = 5
//! nop_timeout = 5
//! digests = ["None", "CRC32C"]
//! ```
//!
//! # Identity
//!
//! With `identity = "derived"` (the default) the LU reports, in VPD page
//! 0x83, an NAA 3h (locally assigned) designator and a T10 vendor ID
//! designator `UNIFAB  <16 hex digits>`, and the same 16 hex digits as its
//! unit serial number (VPD 0x80), all derived from `identity_seed`
//! (default: the remote target name, `/`, and the LUN). The same
//! configuration gives the same identity after every restart; two remote
//! LUs differ even when the remotes report the same identity (tgtd's
//! defaults do). Target-port designators come from the remote unchanged, to
//! match REPORT TARGET PORT GROUPS, which passes through.
//!
//! With `identity = "passthrough"` both pages are the remote's, unchanged:
//! for arrays whose LUs have world-unique names, and for hosts that also
//! reach the array directly and should see one device over two paths.
//!
//! # Nexus
//!
//! With `nexus = "per-initiator"` (the default) every host initiator port
//! gets its own session at the remote, logged in under the host's iSCSI
//! name (FC hosts: `naa.` + WWPN) and a stable ISID derived from its port
//! name, so SCSI-2 and persistent reservations, registrations and unit
//! attentions behave as if each host were attached to the remote directly.
//! `fixed_name = true` keeps the per-host sessions but logs them all in as
//! `initiator_name`. `nexus = "shared"` sends every host's commands through
//! one session (one I_T nexus at the remote).

use std::time::Duration;

use unifab_iscsi::negotiate::Digest;
use unifab_scsi_core::remote::Identity;

use crate::config::{Backend, LuConfig, RemoteIscsiConfig};

pub(crate) fn secs(name: &str, v: Option<f64>, default: f64) -> Result<Duration, String> {
    crate::config::seconds_in(v.unwrap_or(default), 0.0..=86_400.0)
        .ok_or_else(|| format!("{name} must be between 0 and 86400 seconds"))
}

/// Checks what only a remote (`iscsi://` or `fc://`) LU may or must have.
pub fn validate(lu: &LuConfig, backend: &Backend) -> Result<(), String> {
    let n = &lu.name;
    if lu.iscsi.is_some() && !matches!(backend, Backend::Iscsi(_)) {
        return Err(format!(
            "lu {n:?}: [lu.iscsi] settings need an iscsi:// backend"
        ));
    }
    if lu.fc.is_some() && !matches!(backend, Backend::Fc(_)) {
        return Err(format!("lu {n:?}: [lu.fc] settings need an fc:// backend"));
    }
    let kind = match backend {
        Backend::Iscsi(_) => "an iscsi",
        Backend::Fc(_) => "an fc",
        Backend::Memory | Backend::File(_) | Backend::Rbd(_) => return Ok(()),
    };
    // What an emulated LU decides is the remote's: refused, not ignored.
    // `read_only` is the exception: the gateway enforces it (a read-only
    // view, `unifab_scsi_core::remote`).
    if lu.size.is_some() || lu.block_size.is_some() {
        return Err(format!(
            "lu {n:?}: a remote LU takes its size and block size from the remote; remove size/block_size"
        ));
    }
    if lu.write_cache.is_some() || lu.serial.is_some() {
        return Err(format!(
            "lu {n:?}: write_cache and serial are the remote's for {kind} backend"
        ));
    }
    if lu.physical_block_size.is_some() || lu.removable || lu.sanitize_rate.is_some() {
        return Err(format!(
            "lu {n:?}: physical_block_size, removable and sanitize_rate are the remote's for {kind} backend"
        ));
    }
    let Backend::Iscsi(url) = backend else {
        return check_identity(n, lu.fc.as_ref().and_then(|f| f.identity.as_deref()));
    };
    if let Some((_, secret)) = &url.chap
        && secret.len() < 12
    {
        return Err(format!(
            "lu {n:?}: the CHAP secret in the backend URL must be at least 12 bytes (RFC 7143 §9.2.1)"
        ));
    }
    let Some(r) = &lu.iscsi else {
        return Ok(());
    };
    let mutual = match (&r.mutual_user, &r.mutual_secret) {
        (Some(u), Some(s)) => Some((u, s)),
        (None, None) => None,
        _ => {
            return Err(format!(
                "lu {n:?}: mutual CHAP needs both mutual_user and mutual_secret"
            ));
        }
    };
    if let Some((_, s)) = mutual {
        if url.chap.is_none() {
            return Err(format!(
                "lu {n:?}: mutual CHAP needs the initiator's own CHAP credentials in the URL (iscsi://user%secret@…)"
            ));
        }
        if s.len() < 12 {
            return Err(format!(
                "lu {n:?}: the mutual CHAP secret must be at least 12 bytes"
            ));
        }
    }
    if url.mutual_chap.is_some() && mutual.is_some() {
        return Err(format!(
            "lu {n:?}: mutual CHAP is given both in the URL and in [lu.iscsi]"
        ));
    }
    if let Some(name) = &r.initiator_name {
        crate::config::check_iscsi_name(name)
            .map_err(|e| format!("lu {n:?}: initiator_name: {e}"))?;
    }
    match r.nexus.as_deref() {
        None | Some("per-initiator") | Some("shared") => {}
        Some(other) => {
            return Err(format!(
                "lu {n:?}: nexus {other:?} (expected \"per-initiator\" or \"shared\")"
            ));
        }
    }
    check_identity(n, r.identity.as_deref())?;
    if let Some(d) = &r.digests {
        if d.is_empty() {
            return Err(format!("lu {n:?}: digests is empty"));
        }
        for v in d {
            if Digest::from_name(v).is_none() {
                return Err(format!("lu {n:?}: unknown digest {v:?} (None, CRC32C)"));
            }
        }
    }
    let ct =
        secs("command_timeout", r.command_timeout, 20.0).map_err(|e| format!("lu {n:?}: {e}"))?;
    if ct.is_zero() {
        return Err(format!("lu {n:?}: command_timeout must be positive"));
    }
    secs("nop_interval", r.nop_interval, 5.0).map_err(|e| format!("lu {n:?}: {e}"))?;
    secs("nop_timeout", r.nop_timeout, 5.0).map_err(|e| format!("lu {n:?}: {e}"))?;
    secs("login_timeout", r.login_timeout, 10.0).map_err(|e| format!("lu {n:?}: {e}"))?;
    replacement_timeout(r).map_err(|e| format!("lu {n:?}: {e}"))?;
    if r.queue_depth
        .is_some_and(|q| q == 0 || q > unifab_iscsi::initiator::session::MAX_COMMANDS)
    {
        return Err(format!(
            "lu {n:?}: queue_depth must be 1..={}",
            unifab_iscsi::initiator::session::MAX_COMMANDS
        ));
    }
    if r.busy_poll_us.is_some_and(|u| u > MAX_BUSY_POLL_US) {
        return Err(format!(
            "lu {n:?}: busy_poll_us must be 0..={MAX_BUSY_POLL_US}"
        ));
    }
    if r.busy_poll_depth == Some(0) {
        return Err(format!("lu {n:?}: busy_poll_depth must be at least 1"));
    }
    Ok(())
}

/// `identity`, if set: `"derived"` or `"passthrough"`.
fn check_identity(n: &str, identity: Option<&str>) -> Result<(), String> {
    match identity {
        None | Some("derived" | "passthrough") => Ok(()),
        Some(other) => Err(format!(
            "lu {n:?}: identity {other:?} (expected \"derived\" or \"passthrough\")"
        )),
    }
}

/// A remote LU's identity from its checked `identity` and `identity_seed`
/// settings; `default_seed` when derived without a seed of its own.
pub(crate) fn identity(
    identity: Option<&str>,
    seed: Option<&str>,
    default_seed: impl FnOnce() -> String,
) -> Identity {
    match identity {
        Some("passthrough") => Identity::Passthrough,
        _ => Identity::Derived {
            seed: seed.map_or_else(default_seed, str::to_owned),
        },
    }
}

/// `replacement_timeout`, if set: positive, at most a day.
pub(crate) fn replacement_timeout(r: &RemoteIscsiConfig) -> Result<Option<Duration>, String> {
    r.replacement_timeout
        .map(|v| {
            crate::config::seconds_in(v, crate::config::POSITIVE_TIMEOUT_SECS).ok_or_else(|| {
                format!(
                    "replacement_timeout must be positive, at most {} seconds",
                    crate::config::MAX_TIMEOUT_SECS
                )
            })
        })
        .transpose()
}

/// The longest busy-poll window a remote LU may ask for.
pub(crate) const MAX_BUSY_POLL_US: u64 = 10_000;
