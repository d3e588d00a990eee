//! Linux's FCoE stack (`fcoe`, `libfcoe`, `libfc`, fcoe-utils) as an ENode
//! through unifab's FCF, in a Debian 12 guest under QEMU: a tap device
//! carries the guest's second NIC to the gateway's `[[fcoe.port]]`.
//!
//! The guest finds the FCF by FIP (with VLAN discovery through `fipvlan`,
//! and untagged through `/sys/bus/fcoe/ctlr_create`), logs in to the
//! fabric and the name server, logs in to the FCP target, and its LU
//! becomes a SCSI disk over FC: ext4, a file tree, fsck, checksums;
//! `fcoeadm -i`/`-t` report the fabric and the target; link loss and
//! Clear Virtual Links (the FCF port removed and re-added by reload)
//! recover; the FCF accepts the kernel's FPMA MACs (no frame of its
//! counted as spoofed) and drops frames whose MAC and S_ID do not pair
//! (sent from the guest by `tests/kernel/fcoe-spoof.c`, built here).
//!
//! Needs root (tap devices, the image build) and gcc's static libc for
//! the helper; a missing one fails the test with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fcoe_support;
mod kernel;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fcoe_support::{Gw, TARGET_WWPN, require_root, tail};
use kernel::{GUEST, Tap, assert_steps, expect_passed, image, text};
use unifab_testkit::peers::{Guest, free_tcp_port, unifab_bin};

const VLAN: u16 = 100;
const LU_BYTES: u64 = 256 << 20;

/// The FCF gateway: a fabric, an FCP target over a file LU, an FCF on the
/// tap (on `vlan`, or untagged).
fn config(dir: &Path, tap: &str, vlan: Option<u16>) -> String {
    let admin = free_tcp_port().unwrap();
    let vlan = vlan.map(|v| format!("vlan = {v}")).unwrap_or_default();
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/lu.img"
size = "{LU_BYTES}"

[fabric]
domain = 2
switch_wwn = "10:00:00:00:c9:00:00:02"

[[fabric.target]]
wwpn = "{TARGET_WWPN}"
luns = ["disk"]

[[fcoe.port]]
interface = "{tap}"
mode = "fcf"
io = "af_packet"
{vlan}

[admin]
listen = "127.0.0.1:{admin}"
data_dir = "{dir}/state"
"#,
        dir = dir.display(),
    )
}

/// `tests/kernel/fcoe-spoof.c`, built static for the guest.
fn spoof_helper(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kernel/fcoe-spoof.c");
    let out = dir.join("fcoe-spoof");
    let built = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("gcc (Debian: gcc, libc6-dev) to build the guest's FCoE spoofing helper");
    assert!(
        built.status.success(),
        "building {}: {}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

fn reload(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap();
    let out = Command::new(unifab_bin().unwrap())
        .args(["reload", "--config"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The FCF port's counter `key` in `show fcoe`.
fn counter(gw: &Gw, key: &str) -> u64 {
    gw.show("fcoe")[0][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {}", gw.show("fcoe")))
}

fn kernel_enode(vlan: Option<u16>) {
    require_root("a tap device for the guest's FCoE NIC");
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let tap = Tap::new();
    let helper = spoof_helper(dir.path());
    let with_port = config(dir.path(), &tap.0, vlan);
    let gw = Gw::start(dir.path(), "fcf", &with_port, None, "FCoE FCF on");
    let path = dir.path().join("fcf.toml");

    let script = format!(
        "{}\n{}",
        include_str!("kernel/common.sh"),
        include_str!("kernel/fcoe.sh")
    )
    .replace("@FCF_MAC@", &tap.mac())
    .replace("@VLAN@", &vlan.map(|v| v.to_string()).unwrap_or_default());
    let mut guest = Guest::builder()
        .script(script)
        .file("fcoe-spoof", std::fs::read(&helper).unwrap())
        .qemu_args(tap.qemu_nic(None))
        .limit(Duration::from_secs(420))
        .start(&image)
        .unwrap();
    std::fs::set_permissions(
        guest.share().join("fcoe-spoof"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    // Clear Virtual Links: the port removed (CVL to every ENode) and
    // added back.
    guest
        .wait_for_file("cvl-now", Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("{e}\ngateway:\n{}", tail(&gw.log)));
    let logins_before = counter(&gw, "logins");
    let start = with_port.find("[[fcoe.port]]").unwrap();
    let end = with_port.find("[admin]").unwrap();
    let without = format!("{}{}", &with_port[..start], &with_port[end..]);
    let plan = reload(&path, &without);
    assert!(
        plan.contains(&format!("- [fcoe] port \"{}\"", tap.0)),
        "{plan}"
    );
    assert_eq!(gw.show("fcoe"), serde_json::json!([]));
    let plan = reload(&path, &with_port);
    assert!(
        plan.contains(&format!("+ [fcoe] port \"{}\"", tap.0)),
        "{plan}"
    );
    guest.write_file("cvl-done", b"").unwrap();

    // Spoofing: nothing the kernel sent was counted as spoofed; the
    // helper's five frames all are.
    guest
        .wait_for_file("spoof-ready", Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("{e}\ngateway:\n{}", tail(&gw.log)));
    // The port's counters are refreshed about every second: wait for the
    // kernel's frames since the CVL to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&gw, "rx_fcoe") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(counter(&gw, "rx_fcoe") > 0, "{}", gw.show("fcoe"));
    assert_eq!(counter(&gw, "spoofed"), 0, "{}", gw.show("fcoe"));
    guest.write_file("spoof-go", b"").unwrap();
    guest
        .wait_for_file("spoofed", Duration::from_secs(60))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&gw, "spoofed") < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let spoofed = counter(&gw, "spoofed");
    guest.write_file("spoof-counted", b"").unwrap();

    let run = guest.wait().unwrap();
    expect_passed(&run, &image, || format!("gateway:\n{}", tail(&gw.log)));
    assert_eq!(spoofed, 5, "spoofed frames counted: {}", gw.show("fcoe"));
    let mut steps = vec![
        "FLOGI, name server, PRLI to the target: the LU is a disk",
        "mkfs, a file tree, sync, umount, fsck -f clean, checksums match",
        "link loss recovers",
        "Clear Virtual Links recovers",
        "spoofed frames sent, the real VN_Port still served",
    ];
    if vlan.is_some() {
        steps.push("fipvlan found the FCF's VLAN");
    }
    assert_steps(&run, &steps);

    // fcoeadm saw the fabric and the target as unifab serves them.
    let fabric = text(&run, "fcoeadm-i.txt");
    assert!(
        fabric.contains("Fabric Name:       0x10000000c9000002"),
        "{fabric}"
    );
    assert!(fabric.contains("State:             Online"), "{fabric}");
    let target = text(&run, "fcoeadm-t.txt");
    let wwpn = format!("0x{}", TARGET_WWPN.replace(':', ""));
    assert!(target.contains(&wwpn), "{target}");
    assert!(target.contains("FCP Target"), "{target}");
    assert!(target.contains("256.00 MiB"), "{target}");
    if let Some(v) = vlan {
        let found = text(&run, "fipvlan.txt");
        assert!(found.contains(&format!("eth1.{v}")), "{found}");
    }
    // The kernel's VN_Port logged in again after the link loss and after
    // the CVL (the re-added port counts afresh).
    assert!(logins_before >= 2, "logins before the CVL: {logins_before}");
    let log = std::fs::read_to_string(&gw.log).unwrap();
    let vn_logins = log.matches("VN_Port logged in").count();
    assert!(
        vn_logins >= 3,
        "VN_Port logins: {vn_logins}\n{}",
        tail(&gw.log)
    );
    assert!(
        log.contains("mac=0e:fc:00:02:"),
        "the VN_Port's MAC is not an FPMA in domain 2:\n{}",
        tail(&gw.log)
    );
}

/// FIP VLAN discovery by `fipvlan`, FCoE on the VLAN it found (8021q).
#[test]
fn linux_fcoe_enode_through_unifab_fcf_on_a_vlan() {
    kernel_enode(Some(VLAN));
}

/// Untagged, the FCoE controller made through sysfs.
#[test]
fn linux_fcoe_enode_through_unifab_fcf_untagged() {
    kernel_enode(None);
}
