//! Linux's SCSI tape driver (`st`, with `mt` from mt-st and GNU tar)
//! driving unifab's tape LU (`type = "tape"`, SSC-3) over open-iscsi, in a
//! Debian 12 guest under QEMU: `mt status`, rewind, variable block mode,
//! three tar archives separated by the filemarks st writes, `fsf`, `bsf`,
//! `eod`, `tell`, and every archive read back identical — directly, and
//! through a second gateway that reaches the drive across an FCIP tunnel
//! with FastWrite and tape pipelining (whose counters must show the
//! stream was accelerated).
//!
//! Needs root (the image build); a missing peer fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fcoe_support;
mod kernel;

use std::path::Path;
use std::time::{Duration, Instant};

use common::fcip_tunnel;
use fcoe_support::{Gw, tail};
use kernel::{GUEST, assert_steps, expect_passed, image, text};
use unifab_testkit::peers::{Guest, GuestRun, free_tcp_ports};

const IQN: &str = "iqn.2026-11.io.unifab:kernel";
const CHAP: &str = r#"chap = { user = "kernel-host", secret = "host-secret-0123", mutual_user = "unifab-target", mutual_secret = "target-secret-456" }"#;
const TARGET_WWPN: &str = "21:00:00:00:c9:00:0b:0a";
const SW_NEAR: &str = "10:00:00:00:c9:00:00:a1";
const SW_FAR: &str = "10:00:00:00:c9:00:00:b1";

/// The tape LU's `[[lu]]` body (named "tape").
fn tape_lu(dir: &Path) -> String {
    format!(
        "[[lu]]\nname = \"tape\"\ntype = \"tape\"\nbackend = \"file:{}/tape.img\"\nsize = \"256MiB\"\nserial = \"KTAPE0\"\n",
        dir.display()
    )
}

/// Boots the guest with `tape.sh` against `port`; fails with the guest's
/// console and `context` unless its script passed.
fn run_guest(port: u16, context: impl FnOnce() -> String) -> GuestRun {
    let image = image();
    let script = format!(
        "{}\n{}",
        include_str!("kernel/common.sh"),
        include_str!("kernel/tape.sh")
    )
    .replace("@PORTAL@", &format!("10.0.2.2:{port}"))
    .replace("@IQN@", IQN)
    .replace("@CHAP_USER@", "kernel-host")
    .replace("@CHAP_SECRET@", "host-secret-0123")
    .replace("@MUTUAL_USER@", "unifab-target")
    .replace("@MUTUAL_SECRET@", "target-secret-456");
    let run = Guest::builder()
        .script(script)
        .limit(Duration::from_secs(420))
        .run(&image)
        .unwrap();
    expect_passed(&run, &image, context);
    run
}

fn check(run: &GuestRun) {
    assert_steps(
        run,
        &[
            "the tape LU is st0",
            "mt status, rewind, variable block mode",
            "three archives written with filemarks",
            "fsf 2 reads the third archive identical",
            "rewind, the first and second archives read back identical",
            "eod, bsf, tell",
        ],
    );
    let status = text(run, "mt-status.txt");
    assert!(status.contains("ONLINE"), "{status}");
    let rewound = text(run, "mt-rewound.txt");
    assert!(
        rewound.contains("File number=0, block number=0") && rewound.contains("BOT"),
        "{rewound}"
    );
    // Past the first archive's filemark: the start of file 1.
    let first = text(run, "mt-after-first.txt");
    assert!(first.contains("File number=1, block number=0"), "{first}");
    // End of data is past three archives; one filemark back is file 2.
    let bsf = text(run, "mt-bsf.txt");
    assert!(bsf.contains("File number=2"), "{bsf}");
    let eod = text(run, "mt-eod.txt");
    assert!(eod.contains("At block"), "{eod}");
}

/// st against a tape LU of the gateway it logs in to.
#[test]
fn linux_st_drives_unifab_tape_over_iscsi() {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let [port, admin] = free_tcp_ports::<2>().unwrap();
    let config = format!(
        "[admin]\nlisten = \"127.0.0.1:{admin}\"\ndata_dir = \"{d}/state\"\n\n{lu}\n\
         [iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n\n\
         [[iscsi.target]]\niqn = \"{IQN}\"\nluns = [\"tape\"]\n{CHAP}\n",
        d = dir.path().display(),
        lu = tape_lu(dir.path()),
    );
    let gw = Gw::start(dir.path(), "tape", &config, None, "iSCSI target");
    let run = run_guest(port, || format!("gateway:\n{}", tail(&gw.log)));
    check(&run);
}

/// The same through a near gateway whose LU is `fc://` to a far gateway's
/// tape across an FCIP tunnel (FastWrite, tape pipelining) on loopback.
#[test]
fn linux_st_drives_a_far_tape_across_fcip_with_pipelining() {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let [fcip_port, far_admin] = free_tcp_ports::<2>().unwrap();
    let accel = "fastwrite = true\ntape_pipelining = true\n";
    let far = format!(
        "[admin]\nlisten = \"127.0.0.1:{far_admin}\"\ndata_dir = \"{d}/state-far\"\n\n{lu}\n\
         [fabric]\ndomain = 2\nswitch_wwn = \"{SW_FAR}\"\n\n\
         [[fabric.target]]\nwwpn = \"{TARGET_WWPN}\"\nluns = [\"tape\"]\n\n\
         [fcip]\nlisten = \"127.0.0.1:{fcip_port}\"\n\n{tunnel}",
        lu = tape_lu(dir.path()),
        tunnel = fcip_tunnel("fcip0", SW_NEAR, &[None]).replacen(
            "dead_ms = 2000\n",
            &format!("dead_ms = 2000\n{accel}"),
            1
        ),
    );
    let far_gw = Gw::start(dir.path(), "far", &far, None, "FCIP listening");
    let [port, near_admin] = free_tcp_ports::<2>().unwrap();
    let near =
        format!(
            "[admin]\nlisten = \"127.0.0.1:{near_admin}\"\ndata_dir = \"{d}/state-near\"\n\n\
         [[lu]]\nname = \"tape\"\nbackend = \"fc://{TARGET_WWPN}/0\"\n\n\
         [fabric]\ndomain = 1\nswitch_wwn = \"{SW_NEAR}\"\n\n\
         [fabric.initiator]\nwwpn = \"21:00:00:00:c9:00:0a:0b\"\n\n\
         [fcip]\n\n{tunnel}\n\
         [iscsi]\nlisten = [\"127.0.0.1:{port}\"]\n\n\
         [[iscsi.target]]\niqn = \"{IQN}\"\nluns = [\"tape\"]\n{CHAP}\n",
            tunnel = fcip_tunnel("fcip0", SW_FAR, &[Some(format!("127.0.0.1:{fcip_port}"))])
                .replacen("dead_ms = 2000\n", &format!("dead_ms = 2000\n{accel}"), 1),
        );
    let near_gw = Gw::start(dir.path(), "near", &near, None, "iSCSI target");
    // The far tape is reachable once the near gateway's initiator found it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&near_gw.log)
        .unwrap_or_default()
        .contains("fc:// LU reachable")
    {
        assert!(
            Instant::now() < deadline,
            "the far tape never became reachable:\nnear:\n{}\nfar:\n{}",
            tail(&near_gw.log),
            tail(&far_gw.log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let run = run_guest(port, || {
        format!("near:\n{}\nfar:\n{}", tail(&near_gw.log), tail(&far_gw.log))
    });
    check(&run);
    // The stream was pipelined across the tunnel (the statistics refresh
    // about every second).
    let deadline = Instant::now() + Duration::from_secs(10);
    let accelerated = loop {
        let n = near_gw.show("fcip")[0]["tape_accelerated"]
            .as_u64()
            .unwrap_or(0);
        if n > 0 || Instant::now() >= deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        accelerated > 0,
        "no tape write was pipelined: {}",
        near_gw.show("fcip")
    );
}
