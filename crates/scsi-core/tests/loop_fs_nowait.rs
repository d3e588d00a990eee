//! The file backend's no-wait write on disk file systems made on a loop
//! device: XFS, which takes buffered writes without waiting, and ext4,
//! which refuses `RWF_NOWAIT` for them (needs root, `mkfs.xfs` from
//! xfsprogs, which `scripts/setup.sh` installs, and `mkfs.ext4`; CI runs as
//! root). Where it cannot run, the test fails and says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use unifab_scsi_core::backend::WritePath;
use unifab_scsi_core::{BlockBackend, FileBackend, FileOptions};

/// A file system on a loop device, mounted until dropped.
struct LoopFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// Makes and mounts a 512 MiB file system of `kind` (`xfs`, `ext4`).
    fn new(kind: &str) -> LoopFs {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            uid, 0,
            "this test mounts a {kind} image on a loop device: run it as root"
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let img = dir.path().join(format!("{kind}.img"));
        let f = std::fs::File::create(&img).expect("image file");
        f.set_len(512 << 20).expect("sparse 512 MiB image");
        drop(f);
        let force = if kind == "xfs" { "-f" } else { "-F" };
        run(Command::new(format!("mkfs.{kind}"))
            .arg("-q")
            .arg(force)
            .arg(&img));
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        run(Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&img)
            .arg(&mnt));
        LoopFs { mnt, _dir: dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?} could not run (scripts/setup.sh installs xfsprogs and e2fsprogs): {e}")
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
    let fs = LoopFs::new("xfs");
    let b = file(&fs.path("lu.img"));
    assert!(!b.never_blocks(), "XFS on a loop device is not RAM");
    assert_eq!(
        b.write_path(),
        WritePath::NoWait,
        "offered before any write"
    );
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
        assert_eq!(b.write_path(), WritePath::NoWait, "round {round}");
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
    assert_eq!(ro.write_path(), WritePath::ReadOnly, "read-only");
}

/// ext4 refuses `RWF_NOWAIT` for buffered writes (`EOPNOTSUPP`, kernel
/// 6.18): the first write offered to the no-wait path writes nothing,
/// turns the path off for the file, and the backend says its writes take
/// the I/O threads. The blocking path then writes it. Should a kernel take
/// such writes, the write lands whole and the path stays no-wait.
#[test]
fn ext4_sends_writes_to_the_io_threads_and_says_so() {
    let fs = LoopFs::new("ext4");
    let b = file(&fs.path("lu.img"));
    assert!(!b.never_blocks(), "ext4 on a loop device is not RAM");
    assert_eq!(
        b.write_path(),
        WritePath::NoWait,
        "offered before any write"
    );
    let data = [Bytes::from(vec![0x5au8; 8192])];
    // A rewrite of cached pages: nothing that could make XFS wait either.
    b.write_at(0, &data, false).expect("blocking write");
    let n = b.write_at_nowait(0, &data).expect("in range");
    match n {
        0 => assert_eq!(b.write_path(), WritePath::IoThreads, "refused: off"),
        8192 => assert_eq!(b.write_path(), WritePath::NoWait, "taken"),
        n => panic!("a cached 8 KiB rewrite taken in part ({n} bytes)"),
    }
    // Whatever the no-wait path did, the medium holds the data.
    b.write_at(0, &data, false).expect("blocking write");
    assert_eq!(read_back(&b, 0, 8192), vec![0x5au8; 8192]);
    // The path stays as the first refusal left it.
    assert_eq!(b.write_at_nowait(0, &data).expect("in range"), n);
}
