//! `fast_io_fail` across a tunnel: when the tunnel stops, site B's target
//! port leaves site A's fabric (route withdrawn, name-server entries and
//! RSCN), and a command for it ends after `fast_io_fail` with a sense the
//! host retries, instead of waiting out the 30 s command timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{TARGET, build_with, task};
use unifab_fcip::io::LinkMode;
use unifab_fcip::proto::compress;
use unifab_scsi_core::{LogicalUnit, Status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_behind_a_stopped_tunnel_fails_its_commands_after_fast_io_fail() {
    let s = build_with(
        LinkMode::Rfc,
        (false, false),
        compress::Mode::None,
        None,
        |_| {},
        |i| i.fast_io_fail = Some(Duration::from_millis(300)),
    )
    .await;
    // The new nexus's unit attention, then a good answer.
    let _ = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    let r = s.remote.execute(task(2, &[0; 6], None, 0)).await;
    assert_eq!(r.status, Status::GOOD, "{:?}", r.sense);

    s.ta.stop().await;
    assert!(
        !s.a.with_fabric(|f| f.remote_entries())
            .iter()
            .any(|e| e.port_name == TARGET)
    );
    // The guard is a third of the 30 s command timeout: without
    // fast_io_fail the command would still be waiting for the port.
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        s.remote.execute(task(3, &[0; 6], None, 0)),
    )
    .await
    .expect("the command ended by fast_io_fail, not by the command timeout");
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let sense = r.sense.expect("sense data");
    assert_eq!(
        (sense[2] & 0x0f, sense[12], sense[13]),
        (0x0b, 0x08, 0x00),
        "ABORTED COMMAND, LOGICAL UNIT COMMUNICATION FAILURE"
    );
    s.tb.stop().await;
    s.listener.stop();
}
