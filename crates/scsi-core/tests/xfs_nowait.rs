//! The file backend's no-wait write on a file system that takes buffered
//! writes without waiting: XFS, made on a loop device (needs root, and
//! `mkfs.xfs` from xfsprogs, which `scripts/setup.sh` installs; CI runs as
//! root). Where it cannot run, the test fails and says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use unifab_scsi_core::{BlockBackend, FileBackend, FileOptions};

/// An XFS file system on a loop device, mounted until dropped.
struct Xfs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Xfs {
    fn new() -> Xfs {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            uid, 0,
            "this test mounts an XFS image on a loop device: run it as root"
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let img = dir.path().join("xfs.img");
        let f = std::fs::File::create(&img).expect("image file");
        f.set_len(512 << 20).expect("sparse 512 MiB image");
        drop(f);
        run(Command::new("mkfs.xfs").arg("-q").arg("-f").arg(&img));
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        run(Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&img)
            .arg(&mnt));
        Xfs { mnt, _dir: dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?} could not run (scripts/setup.sh installs xfsprogs): {e}")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_back(b: &FileBackend, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.read_at(offset, &mut v).expect("read back");
    v
}

fn file(path: &Path) -> FileBackend {
    FileBackend::open(path, Some(64 << 20), FileOptions::default()).expect("file LU")
}

/// On XFS a buffered write into the page cache is taken without waiting,
/// both where the file already has the page and where it is a hole: the
/// whole write, from several slices, lands, and reads back.
#[test]
fn xfs_takes_buffered_writes_without_waiting() {
    let fs = Xfs::new();
    let b = file(&fs.path("lu.img"));
    assert!(!b.never_blocks(), "XFS on a loop device is not RAM");
    let payload: Vec<u8> = (0..12288u32).map(|i| (i % 251) as u8).collect();
    let slices = [
        Bytes::copy_from_slice(&payload[..4096]),
        Bytes::copy_from_slice(&payload[4096..5000]),
        Bytes::copy_from_slice(&payload[5000..]),
    ];
    // A hole first, then the same pages again (now in the page cache).
    for round in 0..2 {
        let n = b.write_at_nowait(1 << 20, &slices).expect("in range");
        assert_eq!(
            n,
            payload.len(),
            "round {round}: XFS took {n} bytes without waiting"
        );
        assert_eq!(
            read_back(&b, 1 << 20, payload.len()),
            payload,
            "round {round}"
        );
    }
    // Out of range is refused, not written.
    assert!(b.write_at_nowait((64 << 20) - 4096, &slices).is_err());
    // A read-only LU takes nothing here; the blocking path refuses it.
    drop(b);
    let ro = FileBackend::open(
        fs.path("lu.img"),
        None,
        FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .expect("read-only open");
    assert_eq!(ro.write_at_nowait(0, &slices).expect("in range"), 0);
    assert_eq!(read_back(&ro, 0, 4096), vec![0u8; 4096]);
}
