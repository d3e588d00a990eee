//! A thin file LU on a file system that fills up: a 64 MiB LU file on a
//! 4 MiB tmpfs, and on an 8 MiB ext4 image (both mounted for the test:
//! needs root, which CI has). The host writes until the medium is full;
//! the gateway must live, answer DATA PROTECT, SPACE ALLOCATION FAILED
//! WRITE PROTECT (not MEDIUM ERROR, and not die of SIGBUS, as it did while
//! tmpfs files were written through their mapping), keep what was written,
//! and keep serving its other LU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Gateway;
use unifab_scsi_core::sense::asc;
use unifab_scsi_core::{Sense, SenseKey};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};
use unifab_testkit::veth::{require_root, run};

const BS: u32 = 512;
const CHUNK: usize = 64 * 1024;

/// A small file system mounted at `dir`, unmounted on drop.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    /// An ext4 file system in an image file of `size` bytes beside `dir`,
    /// mounted through a loop device (released with the mount).
    fn ext4(dir: &Path, size: u64) -> SmallTmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let image = dir.with_extension("img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        run(&["mkfs.ext4", "-q", "-F", image.to_str().unwrap()]);
        run(&[
            "mount",
            "-o",
            "loop",
            image.to_str().unwrap(),
            dir.to_str().unwrap(),
        ]);
        SmallTmpfs(dir.to_path_buf())
    }

    fn mount(dir: &Path, size: &str) -> SmallTmpfs {
        std::fs::create_dir_all(dir).unwrap();
        run(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        SmallTmpfs(dir.to_path_buf())
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_file_system_gets_space_allocation_failed_and_the_gateway_lives() {
    require_root("full_tmpfs", "unifab");
    let dir = tempfile::tempdir().unwrap();
    let small = SmallTmpfs::mount(&dir.path().join("small"), "4m");
    full_medium(dir.path(), small);
}

/// The same on ext4 (a real ENOSPC from a disk file system, through the
/// page cache: ext4 reserves the blocks of delayed allocation at `write`).
#[test]
fn a_full_ext4_file_system_gets_space_allocation_failed_and_the_gateway_lives() {
    require_root("full_tmpfs", "unifab");
    let dir = tempfile::tempdir().unwrap();
    let small = SmallTmpfs::ext4(&dir.path().join("small"), 8 << 20);
    full_medium(dir.path(), small);
}

/// Fills the LU file on `small` through the gateway until it is full, and
/// checks the answers (see the file's documentation).
fn full_medium(dir: &Path, small: SmallTmpfs) {
    let config = format!(
        r#"
[[lu]]
name = "thin"
backend = "file:{small}/thin.img"
size = "64MiB"

[[lu]]
name = "other"
backend = "file:{dir}/other.img"
size = "16MiB"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:full"
luns = ["thin", "other"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        small = small.0.display(),
        dir = dir.display()
    );
    let mut gw = Gateway::start(dir, &config);
    let opts = RawOptions {
        timeout: Duration::from_secs(20),
        ..RawOptions::default()
    };
    let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
    // Fill: 64 KiB at a time until the file system has no room.
    let mut written = 0usize;
    let refused = loop {
        assert!(written < 16 << 20, "16 MiB went into a small file system");
        let lba = (written / BS as usize) as u64;
        let chunk = vec![(lba % 251) as u8 | 1; CHUNK];
        let r = s.write16(lba, &chunk, BS, false).unwrap();
        if r.status != 0 {
            break (lba, r);
        }
        written += CHUNK;
    };
    assert!(gw.child.try_wait().unwrap().is_none(), "the gateway died");
    let (lba, r) = refused;
    let sense = Sense::parse(&r.sense).expect("sense");
    assert_eq!(r.status, 0x02, "CHECK CONDITION");
    assert_eq!(sense.key, SenseKey::DATA_PROTECT, "{sense:?}");
    assert_eq!(sense.asc, asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT);
    let info = sense.information.expect("the first LBA not written");
    assert!(
        u64::from(info) >= lba && u64::from(info) < lba + (CHUNK as u64 / u64::from(BS)),
        "INFORMATION {info} outside the refused write at {lba}"
    );
    assert!(written >= 1 << 20, "only {written} bytes fit");
    // What was written reads back.
    let first = s.read16(0, (CHUNK as u32) / BS, BS).unwrap();
    assert_eq!(first.status, 0);
    assert_eq!(first.data, vec![1u8; CHUNK]);
    // The other LU keeps working: write and verify.
    let block = vec![0x5au8; BS as usize];
    let mut w = [0u8; 16];
    w[0] = 0x8a;
    w[9] = 7;
    w[13] = 1;
    let mut r16 = w;
    r16[0] = 0x88;
    let mut ok = s.command_lun(1, &w, &block, 0).unwrap();
    if ok.status == 0x02 {
        // LUN 1's power-on unit attention first.
        ok = s.command_lun(1, &w, &block, 0).unwrap();
    }
    assert_eq!(ok.status, 0, "{:?}", Sense::parse(&ok.sense));
    let back = s.command_lun(1, &r16, &[], BS).unwrap();
    assert_eq!(back.status, 0);
    assert_eq!(back.data, block);
    s.logout().unwrap();
    assert!(gw.child.try_wait().unwrap().is_none(), "the gateway died");
    drop(gw);
    drop(small);
}

/// The same full file system with `soft_threshold = "2MiB"`: the host hears
/// THIN PROVISIONING SOFT THRESHOLD REACHED (a unit attention, once) while
/// there is still room, before any write fails with SPACE ALLOCATION
/// FAILED; the LU advertises the threshold (VPD B2h, mode page 1Ch/02h)
/// and LOG SENSE reports less than 2 MiB available when it fires.
#[test]
fn a_soft_threshold_warns_before_the_file_system_is_full() {
    require_root("full_tmpfs", "unifab");
    let dir = tempfile::tempdir().unwrap();
    let small = SmallTmpfs::mount(&dir.path().join("small"), "4m");
    let config = format!(
        r#"
[[lu]]
name = "thin"
backend = "file:{small}/thin.img"
size = "64MiB"
soft_threshold = "2MiB"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:full"
luns = ["thin"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        small = small.0.display(),
        dir = dir.path().display()
    );
    let mut gw = Gateway::start(dir.path(), &config);
    let opts = RawOptions {
        timeout: Duration::from_secs(20),
        ..RawOptions::default()
    };
    let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
    // Advertised: threshold sets of 1 MiB, a soft threshold of 2 sets on
    // available resources, armed decreasing, enabled.
    let vpd = s
        .command_lun(0, &[0x12, 0x01, 0xb2, 0, 64, 0], &[], 64)
        .unwrap();
    assert_eq!(vpd.status, 0);
    assert_eq!(vpd.data[4], 11, "THRESHOLD EXPONENT");
    let mut ms = [0u8; 10];
    ms[0] = 0x5a;
    ms[1] = 0x08;
    ms[2] = 0x1c;
    ms[3] = 0x02;
    ms[8] = 255;
    let page = s.command_lun(0, &ms, &[], 255).unwrap();
    assert_eq!(page.status, 0);
    assert_eq!(&page.data[8..10], &[0x5c, 0x02]);
    assert_eq!((page.data[8 + 16], page.data[8 + 17]), (0x80, 0x01));
    assert_eq!(&page.data[8 + 20..8 + 24], &2u32.to_be_bytes());
    let log_sense = |s: &mut RawSession| {
        let c = [0x4d, 0, 0x4c, 0, 0, 0, 0, 0, 64, 0];
        let r = s.command_lun(0, &c, &[], 64).unwrap();
        assert_eq!(r.status, 0, "{:?}", Sense::parse(&r.sense));
        // Parameter 0001h: available sets.
        assert_eq!(&r.data[4..6], &[0, 1]);
        u32::from_be_bytes([r.data[8], r.data[9], r.data[10], r.data[11]])
    };
    assert!(log_sense(&mut s) >= 2, "room before any write");

    let mut written = 0usize;
    let mut warned_at = None;
    let refused = loop {
        assert!(written < 16 << 20, "16 MiB went into a 4 MiB file system");
        let lba = (written / BS as usize) as u64;
        let chunk = vec![(lba % 251) as u8 | 1; CHUNK];
        let r = s.write16(lba, &chunk, BS, false).unwrap();
        if r.status == 0 {
            written += CHUNK;
            continue;
        }
        let sense = Sense::parse(&r.sense).expect("sense");
        if sense.key == SenseKey::UNIT_ATTENTION {
            assert_eq!(
                sense.asc,
                asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED,
                "{sense:?}"
            );
            assert!(warned_at.is_none(), "warned twice");
            warned_at = Some(written);
            assert!(log_sense(&mut s) < 2, "warned with 2 MiB or more available");
            // The write was not run (a unit attention): again.
            continue;
        }
        break sense;
    };
    let warned_at = warned_at.expect("no soft threshold warning before the medium was full");
    assert_eq!(
        (refused.key, refused.asc),
        (
            SenseKey::DATA_PROTECT,
            asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT
        )
    );
    assert!(
        warned_at < written,
        "warned at {warned_at} bytes, full at {written}"
    );
    eprintln!("warned after {warned_at} bytes, full after {written}");
    assert!(gw.child.try_wait().unwrap().is_none(), "the gateway died");
    s.logout().unwrap();
    drop(gw);
    drop(small);
}
