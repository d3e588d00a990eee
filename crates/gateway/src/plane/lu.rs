//! The gateway's local logical units: a `[[lu]]` with a `memory` or
//! `file:` backend, opened and built as an emulated SBC-3 LU.

use std::sync::Arc;

use anyhow::{Context, bail};
use unifab_scsi_core::backend::{BlockBackend, FileBackend, FileOptions, MemoryBackend};
use unifab_scsi_core::emulated::{EmulatedLu, EmulatedLuConfig};

use crate::config::{Backend, LuConfig};

/// Opens a LU's backend and builds the emulated LU.
pub fn build_lu(
    lu: &LuConfig,
    data_dir: &std::path::Path,
) -> anyhow::Result<(Arc<EmulatedLu>, Arc<dyn BlockBackend>)> {
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
                },
            )
            .with_context(|| format!("lu {:?}: opening {}", lu.name, path.display()))?;
            Arc::new(b)
        }
        Backend::Iscsi(_) => {
            bail!(
                "lu {:?}: an iscsi:// LU is built by plane::remote::build_remote_lu",
                lu.name
            )
        }
        Backend::Fc(_) => bail!("lu {:?}: an fc:// LU is built by the FC plane", lu.name),
    };
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
        ..defaults
    };
    let emulated = EmulatedLu::new(cfg, backend.clone())
        .with_context(|| format!("lu {:?}: cannot build the logical unit", lu.name))?;
    Ok((Arc::new(emulated), backend))
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
