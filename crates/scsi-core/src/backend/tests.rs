use super::memory::CHUNK;
use super::*;

/// Where writes run, as a backend tells it: memory and a file in
/// RAM are written inline, a backend that can wait on the I/O threads
/// (the defaults), a read-only file nowhere. Disk file systems:
/// `tests/loop_fs_nowait.rs`.
#[test]
fn backends_say_where_their_writes_run() {
    assert_eq!(MemoryBackend::new(1 << 20).write_path(), WritePath::Inline);
    let (faulty, _) = crate::FaultyBackend::new(std::sync::Arc::new(MemoryBackend::new(1 << 20)));
    assert!(!faulty.never_blocks());
    assert_eq!(faulty.write_path(), WritePath::IoThreads, "it may wait");
    let shm = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let ram = FileBackend::open(shm.path().join("lu"), Some(1 << 20), FileOptions::default())
        .expect("file LU in RAM");
    assert!(ram.never_blocks(), "/dev/shm is tmpfs");
    assert_eq!(ram.write_path(), WritePath::Inline);
    drop(ram);
    let read_only = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let ro = FileBackend::open(shm.path().join("lu"), None, read_only).expect("read-only");
    assert_eq!(ro.write_path(), WritePath::ReadOnly, "a read-only file");
}

fn b(v: &[u8]) -> Bytes {
    Bytes::copy_from_slice(v)
}

/// A buffer whose bytes hold 0xaa: what a read into it leaves
/// unwritten shows.
fn stale(len: usize) -> Vec<MaybeUninit<u8>> {
    vec![MaybeUninit::new(0xaa); len]
}

/// `read_at_uninit` hands back the very buffer it was given, every byte
/// of it written, with what `read_at` reads: data, and zeroes over
/// holes.
fn uninit_matches_read_at(be: &dyn BlockBackend, offset: u64, len: usize) {
    let mut want = vec![0x55u8; len];
    be.read_at(offset, &mut want).unwrap();
    let mut buf = stale(len);
    let at = buf.as_ptr().cast::<u8>();
    let got = be.read_at_uninit(offset, &mut buf).unwrap();
    assert_eq!(got.as_ptr(), at, "{}: not the buffer given", be.describe());
    assert_eq!(got, &want[..], "{}", be.describe());
    assert!(matches!(
        be.read_at_uninit(be.size() - 1, &mut stale(2)),
        Err(BackendError::OutOfRange { .. })
    ));
}

#[test]
fn uninit_reads_write_every_byte_they_hand_back() {
    // Memory: data straddling two chunks, then a hole to the end of
    // the read (the buffer's 0xaa must not show through).
    let m = MemoryBackend::new(4 * CHUNK as u64);
    let off = CHUNK as u64 - 100;
    m.write_at(off, &[b(&[7u8; 300])], false).unwrap();
    uninit_matches_read_at(&m, off - 50, 2 * CHUNK);
    uninit_matches_read_at(&m, 3 * CHUNK as u64, CHUNK);
    // A file: data then a hole.
    let dir = tempfile::tempdir().unwrap();
    let f = FileBackend::open(
        dir.path().join("lu.img"),
        Some(1 << 20),
        FileOptions::default(),
    )
    .unwrap();
    f.write_at(4096, &[b(&[9u8; 8192])], false).unwrap();
    uninit_matches_read_at(&f, 0, 64 * 1024);
    // The no-wait read hands back a prefix of the buffer, and only
    // bytes the file holds.
    let mut buf = stale(16 * 1024);
    let at = buf.as_ptr().cast::<u8>();
    let head = f.read_at_nowait(4096, &mut buf).unwrap();
    assert!(head.is_empty() || head.as_ptr() == at);
    assert!(head.len() <= 16 * 1024);
    for (i, &x) in head.iter().enumerate() {
        assert_eq!(x, if i < 8192 { 9 } else { 0 }, "byte {i}");
    }
}

#[test]
fn memory_writes_of_many_segments_match_a_flat_model() {
    // Segments of odd sizes (empty ones too) straddling chunk edges, as
    // a write's frame payloads arrive.
    let size = 4 * CHUNK;
    let m = MemoryBackend::new(size as u64);
    let mut model = vec![0u8; size];
    let mut seed = 7u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        seed >> 8
    };
    for _ in 0..200 {
        let mut segs = Vec::new();
        let mut len = 0;
        for _ in 0..(next() % 40) {
            let n = (next() % 5000) as usize;
            let fill = next() as u8;
            segs.push(Bytes::from(vec![fill; n]));
            len += n;
        }
        if len > size {
            continue;
        }
        let off = next() as usize % (size - len + 1);
        m.write_at(off as u64, &segs, false).unwrap();
        let mut at = off;
        for seg in &segs {
            model[at..at + seg.len()].copy_from_slice(seg);
            at += seg.len();
        }
    }
    let mut all = vec![0xaau8; size];
    m.read_at(0, &mut all).unwrap();
    assert!(all == model, "the backend differs from the model");
}

#[test]
fn memory_read_write_discard() {
    let m = MemoryBackend::new(3 * CHUNK as u64 + 100);
    let mut buf = vec![0xffu8; 10];
    m.read_at(5, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 10]);
    assert!(!m.allocation(0, 10).unwrap().mapped);
    // A write straddling two chunks, in two slices.
    let off = CHUNK as u64 - 3;
    m.write_at(off, &[b(&[1, 2]), b(&[3, 4, 5, 6])], false)
        .unwrap();
    let mut buf = [0u8; 6];
    m.read_at(off, &mut buf).unwrap();
    assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
    assert!(m.allocation(0, 1).unwrap().mapped);
    assert_eq!(
        m.allocation(2 * CHUNK as u64, 10).unwrap(),
        AllocationRun {
            mapped: false,
            len: 10
        }
    );
    // A partial discard zeroes but keeps the chunk.
    m.discard(off, 2).unwrap();
    m.read_at(off, &mut buf).unwrap();
    assert_eq!(buf, [0, 0, 3, 4, 5, 6]);
    assert!(m.allocation(off, 1).unwrap().mapped);
    // A whole-chunk discard frees it.
    m.discard(0, CHUNK as u64).unwrap();
    assert!(!m.allocation(0, 1).unwrap().mapped);
    assert_eq!(m.allocation(0, 3 * CHUNK as u64).unwrap().len, CHUNK as u64);
    // Out of range.
    assert!(matches!(
        m.read_at(m.size() - 1, &mut [0u8; 2]),
        Err(BackendError::OutOfRange { .. })
    ));
    assert!(m.write_at(u64::MAX, &[b(&[1])], false).is_err());
}

#[test]
fn file_create_sparse_punch_and_seek() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lu.img");
    let size = 16 * 1024 * 1024;
    let f = FileBackend::open(&path, Some(size), FileOptions::default()).unwrap();
    assert_eq!(f.size(), size);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    // Fresh file: one hole.
    assert_eq!(
        f.allocation(0, size).unwrap(),
        AllocationRun {
            mapped: false,
            len: size
        }
    );
    let data = Bytes::from(vec![0xa5u8; 1024 * 1024]);
    f.write_at(1024 * 1024, std::slice::from_ref(&data), false)
        .unwrap();
    let run = f.allocation(1024 * 1024, size).unwrap();
    assert!(run.mapped);
    assert!(run.len >= 1024 * 1024);
    let before = f.allocation(0, size).unwrap();
    assert_eq!(
        before,
        AllocationRun {
            mapped: false,
            len: 1024 * 1024
        }
    );
    // Punch the middle 256 KiB: it reads back zero and is a hole.
    f.discard(1024 * 1024 + 256 * 1024, 256 * 1024).unwrap();
    let mut buf = vec![1u8; 256 * 1024];
    f.read_at(1024 * 1024 + 256 * 1024, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
    let hole = f.allocation(1024 * 1024 + 256 * 1024, 1024 * 1024).unwrap();
    assert!(!hole.mapped);
    assert_eq!(hole.len, 256 * 1024);
    // write_zeroes reads back zero.
    f.write_zeroes(1024 * 1024, 4096).unwrap();
    let mut z = vec![1u8; 4096];
    f.read_at(1024 * 1024, &mut z).unwrap();
    assert!(z.iter().all(|&x| x == 0));
}

#[test]
fn reading_a_hole_of_a_tmpfs_file_leaves_it_a_hole() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        panic!("/dev/shm (tmpfs) is needed for this test");
    };
    let path = dir.path().join("lu.img");
    let size = 4 * 1024 * 1024;
    let f = FileBackend::open(&path, Some(size), FileOptions::default()).unwrap();
    let data = Bytes::from(vec![0x5au8; 64 * 1024]);
    f.write_at(0, std::slice::from_ref(&data), false).unwrap();
    // Data reads may come from the mapping; hole reads must not.
    if let Some(r) = f.read_shared(0, 4096) {
        assert_eq!(&r.unwrap()[..], &[0x5a; 4096][..]);
    }
    assert!(f.read_shared(1024 * 1024, 4096).is_none());
    assert!(f.read_shared(60 * 1024, 8192).is_none(), "straddles a hole");
    let mut buf = vec![1u8; 4096];
    f.read_at(1024 * 1024, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
    let run = f.allocation(1024 * 1024, size).unwrap();
    assert!(!run.mapped, "reading a hole allocated it");
}

#[test]
fn file_fua_and_flush_reach_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let f = FileBackend::open(dir.path().join("x"), Some(1 << 20), FileOptions::default()).unwrap();
    assert_eq!(f.sync_count(), 0);
    f.write_at(0, &[b(&[1; 512])], false).unwrap();
    assert_eq!(f.sync_count(), 0);
    f.write_at(512, &[b(&[2; 512]), b(&[3; 512])], true)
        .unwrap();
    assert_eq!(f.sync_count(), 1);
    f.flush().unwrap();
    assert_eq!(f.sync_count(), 2);
    let mut buf = [0u8; 1536];
    f.read_at(0, &mut buf).unwrap();
    assert_eq!(&buf[..512], &[1; 512]);
    assert_eq!(&buf[512..1024], &[2; 512]);
    assert_eq!(&buf[1024..], &[3; 512]);
}

#[test]
fn file_lock_and_size_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("y");
    assert!(matches!(
        FileBackend::open(&path, None, FileOptions::default()),
        Err(BackendError::NoSize(_))
    ));
    let f = FileBackend::open(&path, Some(1 << 20), FileOptions::default()).unwrap();
    assert!(matches!(
        FileBackend::open(&path, Some(1 << 20), FileOptions::default()),
        Err(BackendError::Locked(_))
    ));
    drop(f);
    // Reopen without a size: the file's own size; larger size grows it.
    let f = FileBackend::open(&path, None, FileOptions::default()).unwrap();
    assert_eq!(f.size(), 1 << 20);
    drop(f);
    let f = FileBackend::open(&path, Some(2 << 20), FileOptions::default()).unwrap();
    assert_eq!(f.size(), 2 << 20);
    drop(f);
    assert!(matches!(
        FileBackend::open(&path, Some(1 << 20), FileOptions::default()),
        Err(BackendError::SizeMismatch { .. })
    ));
    let ro = FileBackend::open(
        &path,
        None,
        FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert!(matches!(
        ro.write_at(0, &[b(&[1])], false),
        Err(BackendError::ReadOnly)
    ));
    assert!(ro.caps().read_only);
}

#[test]
fn file_many_slices_batch() {
    let dir = tempfile::tempdir().unwrap();
    let f = FileBackend::open(dir.path().join("z"), Some(1 << 20), FileOptions::default()).unwrap();
    // More slices than one pwritev batch, some empty.
    let slices: Vec<Bytes> = (0..200u32)
        .map(|i| {
            if i % 7 == 0 {
                Bytes::new()
            } else {
                Bytes::from(vec![(i % 251) as u8; 100])
            }
        })
        .collect();
    f.write_at(10, &slices, true).unwrap();
    let mut want = Vec::new();
    for s in &slices {
        want.extend_from_slice(s);
    }
    let mut got = vec![0u8; want.len()];
    f.read_at(10, &mut got).unwrap();
    assert_eq!(got, want);
}

#[test]
fn tmpfs_files_are_read_from_a_shared_mapping() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("lu.img");
    let b = FileBackend::open(&path, Some(1 << 20), FileOptions::default()).unwrap();
    assert!(b.never_blocks(), "a /dev/shm file lives in RAM");
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    b.write_at(4096, &[Bytes::from(data.clone())], false)
        .unwrap();
    let shared = b.read_shared(4096, 8192).unwrap().unwrap();
    assert_eq!(&shared[..], &data[..]);
    let mut copy = vec![0u8; 8192];
    b.read_at(4096, &mut copy).unwrap();
    assert_eq!(copy, data);
    // Out of range is an error, not a panic.
    assert!(b.read_shared((1 << 20) - 10, 20).unwrap().is_err());
    assert!(
        b.write_at((1 << 20) - 10, &[Bytes::from(vec![1u8; 20])], false)
            .is_err()
    );
    // Writes through the mapping are seen by pread, and FUA syncs.
    let syncs = b.sync_count();
    b.write_at(
        0,
        &[Bytes::from_static(b"ab"), Bytes::from_static(b"cd")],
        true,
    )
    .unwrap();
    assert_eq!(b.sync_count(), syncs + 1);
    let mut four = [0u8; 4];
    b.read_at(0, &mut four).unwrap();
    assert_eq!(&four, b"abcd");
    // The slice outlives the backend (the mapping is reference counted).
    drop(b);
    assert_eq!(&shared[..16], &data[..16]);
}
