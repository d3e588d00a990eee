//! The gateway's local logical units: a `[[lu]]` with a `memory` or
//! `file:` backend, opened and built as an emulated SBC-3 LU.

use std::sync::Arc;

use anyhow::{Context, bail};
use unifab_scsi_core::backend::{BlockBackend, FileBackend, FileOptions, MemoryBackend};
use unifab_scsi_core::emulated::{EmulatedLu, EmulatedLuConfig};
#[cfg(feature = "rbd")]
use unifab_scsi_core::rbd::{RbdBackend, RbdOptions};
use unifab_scsi_core::tape::{TapeLu, TapeLuConfig};

use crate::config::{Backend, LuConfig};

/// A LU's backend, opened (a missing file created with the LU's size).
struct Opened {
    backend: Arc<dyn BlockBackend>,
    #[cfg(feature = "rbd")]
    rbd: Option<Arc<RbdBackend>>,
}

/// `shared`: the LU is a clustered one, which other gateways of the
/// cluster may open too (a file is then held with a shared lock).
fn open_backend(lu: &LuConfig, shared: bool) -> anyhow::Result<Opened> {
    #[cfg(feature = "rbd")]
    let mut rbd: Option<Arc<RbdBackend>> = None;
    let backend: Arc<dyn BlockBackend> = match lu.parsed_backend().map_err(anyhow::Error::msg)? {
        Backend::Memory => {
            let size = lu.size.map(|s| s.0).context("a memory LU needs a size")?;
            Arc::new(MemoryBackend::new(size))
        }
        Backend::File(path) => {
            if let Some(dir) = path.parent()
                && !dir.as_os_str().is_empty()
            {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let b = FileBackend::open(
                &path,
                lu.size.map(|s| s.0),
                FileOptions {
                    read_only: lu.read_only,
                    shared,
                },
            )
            .with_context(|| format!("lu {:?}: opening {}", lu.name, path.display()))?;
            Arc::new(b)
        }
        #[cfg(feature = "rbd")]
        Backend::Rbd(spec) => {
            let b = Arc::new(open_rbd(lu, &spec)?);
            rbd = Some(b.clone());
            b
        }
        #[cfg(not(feature = "rbd"))]
        Backend::Rbd(_) => bail!("lu {:?}: this build has no rbd: backends", lu.name),
        Backend::Iscsi(_) => {
            bail!(
                "lu {:?}: an iscsi:// LU is built by plane::remote::build_remote_lu",
                lu.name
            )
        }
        Backend::Fc(_) => bail!("lu {:?}: an fc:// LU is built by the FC plane", lu.name),
    };
    Ok(Opened {
        backend,
        #[cfg(feature = "rbd")]
        rbd,
    })
}

/// Opens a tape LU's backend and the tape drive over it.
pub fn build_tape(lu: &LuConfig) -> anyhow::Result<(Arc<TapeLu>, Arc<dyn BlockBackend>)> {
    let opened = open_backend(lu, false)?;
    let defaults = TapeLuConfig::default();
    let cfg = TapeLuConfig {
        name: lu.name.clone(),
        serial: lu.serial.clone().unwrap_or_default(),
        identity: lu.name.clone(),
        read_only: lu.read_only,
        early_warning: lu.early_warning.map_or(defaults.early_warning, |s| s.0),
        ..defaults
    };
    let tape = TapeLu::new(cfg, opened.backend.clone())
        .with_context(|| format!("lu {:?}: cannot open the tape", lu.name))?;
    Ok((Arc::new(tape), opened.backend))
}

/// Opens a LU's backend and builds the emulated LU.
///
/// `clustered`: this gateway is in a `[cluster]`; a LU with `[lu.alua]`
/// is then one the cluster's gateways share, fenced by the cluster, and
/// its file is opened with a shared lock.
pub fn build_lu(
    lu: &LuConfig,
    data_dir: &std::path::Path,
    clustered: bool,
) -> anyhow::Result<(Arc<EmulatedLu>, Arc<dyn BlockBackend>)> {
    let opened = open_backend(lu, clustered && lu.alua.is_some())?;
    let backend = opened.backend;
    #[cfg(feature = "rbd")]
    let rbd = opened.rbd;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let defaults = EmulatedLuConfig::default();
    let cfg = EmulatedLuConfig {
        name: lu.name.clone(),
        block_size: lu.block_size.unwrap_or(512),
        serial: lu.serial.clone().unwrap_or_default(),
        identity: lu.name.clone(),
        pr_path: Some(data_dir.join(format!("{}.pr", sanitize(&lu.name)))),
        write_cache: lu.write_cache.unwrap_or(defaults.write_cache),
        read_only: lu.read_only,
        physical_block_size: lu.physical_block_size,
        removable: lu.removable,
        sanitize_rate: lu.sanitize_rate.map_or(defaults.sanitize_rate, |s| s.0),
        soft_threshold: lu.soft_threshold.map(|s| s.0),
        alua: match &lu.alua {
            Some(a) => a.to_core(&lu.name).map_err(anyhow::Error::msg)?,
            None => defaults.alua.clone(),
        },
        ..defaults
    };
    let emulated = Arc::new(
        EmulatedLu::new(cfg, backend.clone())
            .with_context(|| format!("lu {:?}: cannot build the logical unit", lu.name))?,
    );
    #[cfg(feature = "rbd")]
    if let Some(rbd) = rbd {
        watch_rbd_size(&emulated, &rbd)?;
    }
    Ok((emulated, backend))
}

/// Opens (or creates, with a size) the LU's RBD image.
#[cfg(feature = "rbd")]
fn open_rbd(lu: &LuConfig, spec: &str) -> anyhow::Result<RbdBackend> {
    let mut opts = RbdOptions::parse(spec).map_err(anyhow::Error::msg)?;
    opts.ceph_conf = lu.ceph_conf.clone();
    if let Some(id) = &lu.ceph_id {
        opts.ceph_id = id.clone();
    }
    if let Some(s) = lu.ceph_op_timeout {
        opts.op_timeout = std::time::Duration::from_secs(s);
    }
    if let Some(x) = lu.ceph_exclusive_lock {
        opts.exclusive = x;
    }
    if let Some(s) = lu.ceph_lock_timeout {
        opts.lock_timeout = std::time::Duration::from_secs(s);
    }
    opts.size = lu.size.map(|s| s.0);
    opts.read_only = lu.read_only;
    let conf = opts.conf_path();
    RbdBackend::open(opts)
        .with_context(|| format!("lu {:?}: opening rbd:{spec} ({})", lu.name, conf.display()))
}

/// An RBD image resized by someone else (`rbd resize`) is a capacity
/// change the hosts hear: librbd calls back when the image's header
/// changes, and a short thread re-reads the size and raises CAPACITY DATA
/// HAS CHANGED (the callback itself may not call back into librbd).
#[cfg(feature = "rbd")]
fn watch_rbd_size(lu: &Arc<EmulatedLu>, rbd: &Arc<RbdBackend>) -> anyhow::Result<()> {
    let lu_w = Arc::downgrade(lu);
    let be_w = Arc::downgrade(rbd);
    rbd.watch(Box::new(move || {
        let (lu_w, be_w) = (lu_w.clone(), be_w.clone());
        let spawned = std::thread::Builder::new()
            .name("rbd-resize".into())
            .spawn(move || {
                let (Some(lu), Some(rbd)) = (lu_w.upgrade(), be_w.upgrade()) else {
                    return;
                };
                match rbd.refresh_size() {
                    Ok(_) => lu.refresh_capacity(),
                    Err(e) => tracing::warn!(error = %e, "rbd: re-reading the image size failed"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "rbd: cannot start the resize thread");
        }
    }))
    .map_err(anyhow::Error::from)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
