//! An in-memory FC fabric: a software switch, an FCP target N_Port serving
//! a 16 MiB memory LU, and an FCP initiator N_Port that logs in through
//! the fabric (FLOGI, name server, PLOGI, PRLI) and reads INQUIRY and a
//! block through it.
//!
//!     cargo run -p unifab-fc --example fabric
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::{FcNode, FcpInitiator, Switch};
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_scsi_core::Initiator;
use unifab_scsi_core::initiator::Request;
use unifab_scsi_core::{EmulatedLu, EmulatedLuConfig, Lun, MemoryBackend, ScsiTarget, Status};

const TARGET: Wwn = Wwn(0x2100_0000_0000_0a01);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0b01);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let switch = Switch::new(FabricConfig::default());
    let node = FcNode::spawn(&switch, "example");

    // The target N_Port and the LUs it presents.
    let scsi = ScsiTarget::new();
    let lu = EmulatedLu::new(
        EmulatedLuConfig::default(),
        Arc::new(MemoryBackend::new(16 << 20)),
    )?;
    scsi.insert(Lun(0), Arc::new(lu));
    let mut t = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_0a01));
    t.target = true;
    node.add_port("fc-target", t, Some(scsi))?;

    // The initiator N_Port: it discovers the target through the name server.
    let mut i = NPortConfig::new(INITIATOR, Wwn(0x2000_0000_0000_0b01));
    i.initiator = true;
    i.discover = true;
    node.add_port("fc-initiator", i, None)?;
    if !node
        .wait_for_peer(INITIATOR, TARGET, Duration::from_secs(5))
        .await
    {
        return Err("the initiator never logged in to the target".into());
    }
    println!("{INITIATOR} logged in to {TARGET} through the fabric");

    // The SCSI initiator interface over that login (I_T nexus).
    let ini = FcpInitiator::new(node.clone(), INITIATOR, TARGET);
    // A new I_T nexus first hears of the power-on reset: TEST UNIT READY
    // until it is GOOD.
    let mut ready = false;
    for _ in 0..3 {
        let tur = Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0);
        if ini.submit(tur).outcome.await?.status == Status::GOOD {
            ready = true;
            break;
        }
    }
    if !ready {
        return Err("TEST UNIT READY never succeeded".into());
    }
    let inquiry = Request::new(Lun(0), Bytes::from_static(&[0x12, 0, 0, 0, 36, 0]), 36);
    let r = ini.submit(inquiry).outcome.await?;
    if r.status != Status::GOOD {
        return Err(format!("INQUIRY: {:?}", r.status).into());
    }
    let data: Vec<u8> = r.data_in.iter().flat_map(|b| b.iter().copied()).collect();
    println!(
        "INQUIRY over FCP: {:?}",
        String::from_utf8_lossy(data.get(8..32).unwrap_or(&[]))
    );
    let read = Request::new(
        Lun(0),
        Bytes::from_static(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
        512,
    );
    let r = ini.submit(read).outcome.await?;
    if r.status != Status::GOOD {
        return Err(format!("READ(10): {:?}", r.status).into());
    }
    let bytes: usize = r.data_in.iter().map(|b| b.len()).sum();
    println!("READ(10) of LBA 0 over FCP: {bytes} bytes");
    ini.close();
    drop(switch);
    Ok(())
}
