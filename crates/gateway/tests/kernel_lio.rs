//! LIO — the Linux kernel's SCSI target (`target_core_mod`, `tcm_fc`) — as
//! an FC array behind unifab: the guest's FCoE port logs in to unifab's
//! fabric through its FCF, LIO serves a fileio LU on it as an FCP target,
//! and unifab re-exports that LU over iSCSI (`fc://` backend). On the host,
//! libiscsi (`iscsi-inq`, `iscsi-test-cu`) and the test's own initiator go
//! through unifab to LIO: the first FCP target nobody here wrote.
//!
//! unifab's initiator ports are named per host with fixed WWPNs
//! (`[[fabric.initiator.host]]`), so LIO can be given an ACL for each before
//! any host logs in; an initiator LIO has no ACL for gets no answer at all
//! (see docs/measurements/2026-11-28-kernel-peers.md).
//!
//! Needs root (tap device, image build); a missing peer fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fcoe_support;
mod kernel;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fcoe_support::{Gw, require_root, tail};
use kernel::{GUEST, Tap, assert_steps, expect_passed, image, text};
use unifab_testkit::peers::{Guest, IscsiTestCu, Outcome, free_tcp_port};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const IQN: &str = "iqn.2026-11.io.unifab:lio";
/// The guest NIC's MAC, from which Linux's fcoe derives the port's WWPN.
const GUEST_MAC: &str = "52:54:00:12:34:57";
const LIO_WWPN: &str = "20:00:52:54:00:12:34:57";
/// The hosts that go through unifab, and the WWPNs their ports get.
const HOSTS: [(&str, &str); 3] = [
    (
        "iqn.2026-11.invalid.unifab:host-a",
        "21:00:00:00:c9:00:0a:0c",
    ),
    (
        "iqn.2026-11.invalid.unifab:host-b",
        "21:00:00:00:c9:00:0a:0d",
    ),
    ("iqn.2026-11.invalid.unifab:raw", "21:00:00:00:c9:00:0a:0e"),
];

fn config(dir: &Path, tap: &str, port: u16) -> String {
    let admin = free_tcp_port().unwrap();
    let hosts: String = HOSTS
        .iter()
        .map(|(iqn, wwpn)| {
            format!("[[fabric.initiator.host]]\ninitiator = \"{iqn}\"\nwwpn = \"{wwpn}\"\n\n")
        })
        .collect();
    format!(
        r#"[admin]
listen = "127.0.0.1:{admin}"
data_dir = "{dir}/state"

[[lu]]
name = "lio"
backend = "fc://{LIO_WWPN}/0"

[fabric]
domain = 2
switch_wwn = "10:00:00:00:c9:00:00:02"

[fabric.initiator]
wwpn = "21:00:00:00:c9:00:0a:0b"
npiv_name = "per-host"

{hosts}[[fcoe.port]]
interface = "{tap}"
mode = "fcf"
io = "af_packet"

[iscsi]
listen = ["127.0.0.1:{port}"]

[[iscsi.target]]
iqn = "{IQN}"
luns = ["lio"]
"#,
        dir = dir.display(),
    )
}

fn pattern(lba: u64) -> Vec<u8> {
    (0..512u64)
        .flat_map(|i| ((lba * 7919 + i) as u32).to_le_bytes())
        .collect::<Vec<u8>>()
        .into_iter()
        .take(512)
        .collect()
}

#[test]
fn libiscsi_through_unifab_to_lio_over_fcoe() {
    require_root("a tap device for the guest's FCoE NIC");
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let tap = Tap::new();
    let port = free_tcp_port().unwrap();
    let gw = Gw::start(
        dir.path(),
        "gw",
        &config(dir.path(), &tap.0, port),
        None,
        "iSCSI target",
    );
    let initiators: Vec<&str> = HOSTS.iter().map(|(_, w)| *w).collect();
    let script = format!(
        "{}\n{}",
        include_str!("kernel/common.sh"),
        include_str!("kernel/lio.sh")
    )
    .replace("@INITIATORS@", &initiators.join(" "));
    let mut guest = Guest::builder()
        .script(script)
        .qemu_args(tap.qemu_nic(Some(GUEST_MAC)))
        .limit(Duration::from_secs(540))
        .start(&image)
        .unwrap();
    guest
        .wait_for_file("lio-ready", Duration::from_secs(240))
        .unwrap_or_else(|e| panic!("{e}\ngateway:\n{}", tail(&gw.log)));
    let url = format!("iscsi://127.0.0.1:{port}/{IQN}/0");

    // libiscsi's INQUIRY names LIO: the LU really is the guest's.
    let deadline = Instant::now() + Duration::from_secs(60);
    let inquiry = loop {
        let out = Command::new("iscsi-inq")
            .args(["-i", HOSTS[0].0, &url])
            .output()
            .expect("iscsi-inq (Debian: libiscsi-bin)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() || Instant::now() >= deadline {
            break text;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(
        inquiry.contains("LIO-ORG"),
        "INQUIRY through unifab does not name LIO:\n{inquiry}\ngateway:\n{}",
        tail(&gw.log)
    );

    // A slice of libiscsi's own suite through both hops.
    let result = IscsiTestCu::new(&url)
        .tests("ALL.Read10,ALL.Write10,ALL.ReadCapacity10,ALL.TestUnitReady,ALL.Inquiry")
        .initiator_names(HOSTS[0].0, HOSTS[1].0)
        .timeout(Duration::from_secs(400))
        .run()
        .unwrap();
    result.record("kernel-lio").unwrap();
    println!("libiscsi through unifab to LIO:\n{}", result.to_table());

    // Then verified writes and reads through unifab (after libiscsi's
    // suite, which writes across the LU), the last at 1 MiB for the guest
    // to check in LIO's backing file.
    let mut s = RawSession::login(
        ([127, 0, 0, 1], port).into(),
        IQN,
        &RawOptions {
            initiator: HOSTS[2].0.to_owned(),
            timeout: Duration::from_secs(60),
            ..RawOptions::default()
        },
    )
    .unwrap();
    for lba in (0..64u64).map(|i| i * 37) {
        let data = pattern(lba);
        let w = s.write16(lba, &data, 512, false).unwrap();
        assert_eq!(w.status, 0, "WRITE(16) at {lba}: {w:?}");
        let r = s.read16(lba, 1, 512).unwrap();
        assert_eq!(r.status, 0, "READ(16) at {lba}: {r:?}");
        assert!(r.data == data, "LBA {lba} read back differs");
    }
    let region: Vec<u8> = (0..128u64).flat_map(pattern).collect();
    let w = s.write16(2048, &region, 512, false).unwrap();
    assert_eq!(w.status, 0, "{w:?}");
    drop(s);

    guest.write_file("host-done", b"").unwrap();
    let run = guest.wait().unwrap();
    expect_passed(&run, &image, || format!("gateway:\n{}", tail(&gw.log)));
    assert_steps(
        &run,
        &[
            "FCoE port Online",
            "LIO target on the FC port",
            "LIO served the host",
        ],
    );
    assert_eq!(text(&run, "lio_wwpn.txt").trim(), LIO_WWPN);
    // The bytes written through unifab are in LIO's backing file.
    let md5 = Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&region)?;
            c.wait_with_output()
        })
        .unwrap();
    let want = String::from_utf8_lossy(&md5.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(text(&run, "lio-region.md5").trim(), want);
    assert!(
        result.is_complete()
            && result.count(Outcome::Failed) == 0
            && result.count(Outcome::Passed) > 0,
        "libiscsi through unifab to LIO:\n{}\n{}\n{}",
        result.failures(),
        result.to_table(),
        result.stderr_tail
    );
}
