//! The Linux kernel's iSCSI initiator (open-iscsi: `iscsid`, `iscsi_tcp`,
//! `sd`) against unifab, in a Debian 12 guest under QEMU
//! (`unifab_testkit::peers::Guest`; the image is built once per machine by
//! `scripts/vm-image.sh`).
//!
//! Each test boots the guest with a shell script (`tests/kernel/*.sh`) that
//! drives open-iscsi, the filesystem and sg3-utils against a gateway on the
//! host's loopback (`10.0.2.2` from inside), and leaves what the tools
//! printed in the share; the test then checks those outputs against what
//! the gateway was configured to serve, and the LU's backing file against
//! what the guest wrote. A step the script could not complete ends it with
//! a non-zero status and the guest's console in the failure.
//!
//! The guest runs under software emulation: a test takes 1 to 3 minutes.
//! Guests run one at a time (two TCG guests on two cores starve each
//! other's iSCSI timers). Needs root (the image build); without QEMU or
//! debootstrap the test fails naming the package.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kernel;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::Gateway;
use kernel::{GUEST, assert_steps, expect_passed, image, text};
use unifab_testkit::peers::{Guest, free_tcp_port};

const IQN: &str = "iqn.2026-11.io.unifab:kernel";
const CHAP_USER: &str = "kernel-host";
const CHAP_SECRET: &str = "host-secret-0123";
const MUTUAL_USER: &str = "unifab-target";
const MUTUAL_SECRET: &str = "target-secret-456";
const LU_BYTES: u64 = 256 << 20;
const SERIAL: &str = "KVOL0";

/// A gateway serving one 256 MiB file LU to `IQN`, mutual CHAP required,
/// on a fixed loopback port (so that a restart comes back where the
/// guest's session expects it).
fn config(dir: &Path, port: u16) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "{LU_BYTES}"
serial = "{SERIAL}"

[iscsi]
listen = ["127.0.0.1:{port}"]
# The guest reaches the host through QEMU's NAT: discovery must name the
# address it dials, not the gateway's own.
advertise = ["10.0.2.2:{port}"]
digests = ["None", "CRC32C"]

[[iscsi.target]]
iqn = "{IQN}"
luns = ["disk"]
chap = {{ user = "{CHAP_USER}", secret = "{CHAP_SECRET}", mutual_user = "{MUTUAL_USER}", mutual_secret = "{MUTUAL_SECRET}" }}

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
}

/// The guest's script: the common helpers, then the test's own steps, with
/// the gateway's address and the secrets filled in.
fn script(port: u16, body: &str) -> String {
    let common = include_str!("kernel/common.sh");
    format!("{common}\n{body}")
        .replace("@PORTAL@", &format!("10.0.2.2:{port}"))
        .replace("@IQN@", IQN)
        .replace("@CHAP_USER@", CHAP_USER)
        .replace("@CHAP_SECRET@", CHAP_SECRET)
        .replace("@MUTUAL_USER@", MUTUAL_USER)
        .replace("@MUTUAL_SECRET@", MUTUAL_SECRET)
}

/// The byte offset of the first data at or after `from` in `path`
/// (`SEEK_DATA`); `None` when only a hole follows.
fn next_data(path: &Path, from: u64) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: lseek on a descriptor this function owns; no memory involved.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, libc::SEEK_DATA) };
    u64::try_from(at).ok()
}

/// MD5 of a file in the ext4 filesystem on `image`, read on the host by
/// `debugfs` (e2fsprogs), independent of the guest's kernel.
fn md5_in_image(image: &Path, file: &str) -> String {
    let out = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump {file} {}", out.path().display()))
        .arg(image)
        .output()
        .expect("debugfs (e2fsprogs)");
    assert!(status.status.success(), "debugfs: {status:?}");
    let sum = Command::new("md5sum").arg(out.path()).output().unwrap();
    String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Discovery; login refused with a wrong CHAP secret and with a wrong
/// mutual secret; login with mutual CHAP and CRC32C header and data
/// digests; the LU as a disk: mkfs.ext4, a file tree, sync, umount,
/// fsck -f clean; logout, a fresh login, the checksums match; fstrim and
/// blkdiscard reach UNMAP and the discarded blocks read back as zeroes;
/// sg_vpd, sg_readcap -l and sg_persist (register, reserve, a second
/// nexus kept from writing, preempt, clear) agree with what unifab serves.
#[test]
fn open_iscsi_filesystem_chap_digests_unmap_sg3_utils() {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port().unwrap();
    let _gateway = Gateway::start(dir.path(), &config(dir.path(), port));

    let run = Guest::builder()
        .script(script(port, include_str!("kernel/filesystem.sh")))
        .limit(Duration::from_secs(420))
        .run(&image)
        .unwrap();
    expect_passed(&run, &image, String::new);
    assert_steps(
        &run,
        &[
            "discovery lists the target at the advertised address",
            "a wrong CHAP secret is refused",
            "a wrong mutual CHAP secret is refused",
            "login with mutual CHAP",
            "CRC32C header and data digests",
            "mkfs, a file tree, sync, umount, fsck -f clean",
            "checksums match after logout and a fresh login",
            "fstrim trims",
            "blkdiscard reads back zeroes",
            "sg3-utils",
            "Write Exclusive keeps a second nexus from writing",
            "preempt from the second nexus",
            "logged out",
        ],
    );

    // What the kernel saw matches the configuration.
    let readcap = text(&run, "readcap.txt");
    assert!(
        readcap.contains(&format!("Number of logical blocks={}", LU_BYTES / 512)),
        "{readcap}"
    );
    assert!(
        readcap.contains("Logical block length=512 bytes"),
        "{readcap}"
    );
    let serial = text(&run, "vpd-sn.txt");
    assert!(serial.contains(SERIAL), "{serial}");
    let lbpv = text(&run, "vpd-lbpv.txt");
    assert!(lbpv.contains("(LBPU): 1"), "UNMAP not advertised:\n{lbpv}");

    // The reservation as both nexuses read it.
    let keys = text(&run, "pr-keys-1.txt");
    assert!(keys.contains("0x1111"), "{keys}");
    let resv = text(&run, "pr-resv-1.txt");
    assert!(
        resv.contains("Key=0x1111") && resv.contains("Write Exclusive"),
        "{resv}"
    );
    let keys = text(&run, "pr-keys-2.txt");
    assert!(
        keys.contains("0x2222") && !keys.contains("0x1111"),
        "{keys}"
    );
    let resv = text(&run, "pr-resv-2.txt");
    assert!(resv.contains("Key=0x2222"), "{resv}");
    let cleared = text(&run, "pr-keys-3.txt");
    assert!(cleared.contains("there are NO registered"), "{cleared}");

    // The backing file agrees: the big file's bytes, read by debugfs on
    // the host, and a hole where the guest discarded.
    let disk = dir.path().join("disk.img");
    let sums = text(&run, "sums");
    let big = sums
        .lines()
        .find(|l| l.ends_with("./big"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the guest's checksum of ./big");
    assert_eq!(md5_in_image(&disk, "/big"), big, "/big differs on the host");
    let discarded = 208u64 << 20;
    let next = next_data(&disk, discarded);
    assert!(
        next.is_none_or(|at| at >= discarded + (16 << 20)),
        "the discarded range still holds data at {next:?}"
    );
}

/// The gateway killed (SIGKILL) under a mounted, busy ext4 and started
/// again on the same portal: the kernel's session recovery (within its
/// replacement timeout) logs back in, the writes go on, no I/O error
/// reaches the filesystem, fsck -f is clean and every file reads back.
#[test]
fn open_iscsi_survives_a_gateway_restart_under_a_mounted_filesystem() {
    let _one = GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let port = free_tcp_port().unwrap();
    let gateway = Gateway::start(dir.path(), &config(dir.path(), port));

    let mut guest = Guest::builder()
        .script(script(port, include_str!("kernel/restart.sh")))
        .limit(Duration::from_secs(420))
        .start(&image)
        .unwrap();
    guest
        .wait_for_file("ready-restart", Duration::from_secs(240))
        .unwrap();
    let config = gateway.kill();
    // Down long enough for the kernel to notice and retry its login.
    std::thread::sleep(Duration::from_secs(3));
    let gateway = Gateway::start_with(config);
    guest.write_file("restarted", b"").unwrap();
    let run = guest.wait().unwrap();
    drop(gateway);
    expect_passed(&run, &image, String::new);
    assert_steps(
        &run,
        &[
            "login",
            "writes went on through the restart",
            "the filesystem survives: fsck -f clean, checksums match",
            "the session recovered with no I/O error",
        ],
    );
    // The kernel saw the connection fail and recovered it.
    let recovery = text(&run, "recovery.txt");
    assert!(
        recovery.contains("detected conn error"),
        "no connection error in the guest's log: the gateway was not really gone?\n{recovery}"
    );
}
