//! A complete iSCSI target: one 64 MiB memory LU as LUN 0 of
//! `iqn.2026-11.io.unifab:example`, until Ctrl-C.
//!
//!     cargo run -p unifab-iscsi --example target [ADDR]    # default 127.0.0.1:3260
//!     iscsi-inq iscsi://127.0.0.1:3260/iqn.2026-11.io.unifab:example/0
use std::sync::Arc;

use tokio::sync::watch;
use unifab_iscsi::target::server::{ServerConfig, TargetNode, TargetServer};
use unifab_scsi_core::{EmulatedLu, EmulatedLuConfig, Lun, MemoryBackend, ScsiTarget};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3260".into());
    // The SCSI side: a LUN map with one emulated SBC-3 disk.
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(64 << 20)),
    )?;
    let scsi = Arc::new(ScsiTarget::new());
    scsi.insert(Lun(0), Arc::new(lu));
    // The iSCSI side: a portal and a target node dispatching into it.
    let node = TargetNode {
        name: "iqn.2026-11.io.unifab:example".into(),
        alias: None,
        scsi,
        allow: None, // any initiator
        chap: None,  // no CHAP
    };
    let (server, listeners) =
        TargetServer::bind(&[addr.parse()?], ServerConfig::default(), vec![node]).await?;
    println!(
        "serving iqn.2026-11.io.unifab:example on {}",
        server.local_addrs()[0]
    );
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop.send(true);
    });
    server.run(listeners, stopped).await;
    Ok(())
}
