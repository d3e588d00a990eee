//! The SCSI core without any transport: a LUN map with one emulated disk
//! on a memory backend, driven through [`Dispatch`], the one door every
//! transport's target uses. Writes a block, reads it back, and prints
//! INQUIRY and READ CAPACITY(10).
//!
//!     cargo run -p unifab-scsi-core --example memory_lu
use std::sync::Arc;

use bytes::Bytes;
use unifab_scsi_core::{
    Cdb, Dispatch, EmulatedLu, EmulatedLuConfig, ItNexus, Lun, MemoryBackend, ScsiTarget, Status,
    Task, TaskResult,
};

/// One command on LUN 0 from `nexus`, with optional data-out.
fn task(nexus: &ItNexus, tag: u64, cdb: &[u8], data_out: Option<Bytes>, data_in_len: u32) -> Task {
    let task = Task::new(
        nexus.clone(),
        Lun(0),
        tag,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    )
    .with_data_in(data_in_len);
    match data_out {
        Some(data) => task.with_data(data),
        None => task,
    }
}

fn data(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(16 << 20)),
    )?;
    let target = ScsiTarget::new();
    target.insert(Lun(0), Arc::new(lu));
    let host = ItNexus::iscsi(
        "iqn.2026-11.io.unifab:host",
        [0x40, 0, 0, 0, 0, 1],
        "iqn.2026-11.io.unifab:example,t,0x1",
    );

    // A new I_T nexus first hears of the power-on reset (a unit attention).
    let r = target.dispatch(task(&host, 1, &[0; 6], None, 0)).await;
    println!(
        "TEST UNIT READY: {:?} (the power-on unit attention)",
        r.status
    );

    let inq = data(
        &target
            .dispatch(task(&host, 2, &[0x12, 0, 0, 0, 36, 0], None, 36))
            .await,
    );
    println!(
        "INQUIRY: {:?} {:?}",
        String::from_utf8_lossy(&inq[8..16]),
        String::from_utf8_lossy(&inq[16..32])
    );

    let cap = data(
        &target
            .dispatch(task(&host, 3, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], None, 8))
            .await,
    );
    let last = u32::from_be_bytes([cap[0], cap[1], cap[2], cap[3]]);
    let size = u32::from_be_bytes([cap[4], cap[5], cap[6], cap[7]]);
    println!(
        "READ CAPACITY(10): {} blocks of {size} bytes",
        u64::from(last) + 1
    );

    let block = Bytes::from(vec![0xa5u8; 512]);
    let write = [0x2a, 0, 0, 0, 0, 7, 0, 0, 1, 0]; // WRITE(10) LBA 7, 1 block
    let r = target
        .dispatch(task(&host, 4, &write, Some(block.clone()), 0))
        .await;
    assert_eq!(r.status, Status::GOOD);
    let read = [0x28, 0, 0, 0, 0, 7, 0, 0, 1, 0];
    let r = target.dispatch(task(&host, 5, &read, None, 512)).await;
    assert_eq!(data(&r), block[..], "the block reads back as written");
    println!("WRITE(10) then READ(10) of LBA 7: the data read back");
    Ok(())
}
