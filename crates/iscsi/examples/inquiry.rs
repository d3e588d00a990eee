//! An iSCSI initiator: log in, read the standard INQUIRY data and block 0
//! of LUN 0, print them, and log out.
//!
//!     cargo run -p unifab-iscsi --example inquiry [PORTAL] [TARGET]
//!     # defaults: 127.0.0.1:3260 iqn.2026-11.io.unifab:example
use std::time::Duration;

use bytes::Bytes;
use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiator};
use unifab_scsi_core::initiator::Request;
use unifab_scsi_core::{Initiator, Lun, Status, TaskResult};

async fn run(ini: &IscsiInitiator, cdb: &[u8], len: u32) -> Result<TaskResult, String> {
    let request = Request::new(Lun(0), Bytes::copy_from_slice(cdb), len);
    let result = ini
        .submit(request)
        .outcome
        .await
        .map_err(|e| e.to_string())?;
    if result.status == Status::GOOD {
        Ok(result)
    } else {
        Err(format!("{:02x?}: status {:?}", cdb, result.status))
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let portal = args.next().unwrap_or_else(|| "127.0.0.1:3260".into());
    let target = args
        .next()
        .unwrap_or_else(|| "iqn.2026-11.io.unifab:example".into());
    let cfg = InitiatorConfig::new("iqn.2026-11.io.unifab:example-initiator");
    let ini = IscsiInitiator::start(cfg, &portal, &target);
    ini.wait_connected(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    // The first command after login may meet the power-on unit attention.
    let _ = run(&ini, &[0; 6], 0).await;
    let inq = run(&ini, &[0x12, 0, 0, 0, 36, 0], 36).await?;
    let data: Vec<u8> = inq.data_in.iter().flat_map(|b| b.iter().copied()).collect();
    let text = |r: std::ops::Range<usize>| {
        String::from_utf8_lossy(data.get(r).unwrap_or(&[])).into_owned()
    };
    println!(
        "vendor {:?} product {:?} revision {:?}",
        text(8..16),
        text(16..32),
        text(32..36)
    );
    let block = run(&ini, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512).await?;
    let first: Vec<u8> = block
        .data_in
        .iter()
        .flat_map(|b| b.iter().copied())
        .take(16)
        .collect();
    println!("block 0 starts {first:02x?}");
    // Close logs out in the background; give it a moment before exiting.
    ini.close();
    for _ in 0..100 {
        if !ini.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
