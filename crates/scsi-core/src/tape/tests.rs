use super::*;
use crate::backend::MemoryBackend;
use crate::faulty::FaultyBackend;
use crate::task::{Cdb, Lun, TargetPort};

const MIB: u64 = 1 << 20;

fn nexus(init: &str) -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: init.into(),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.io.unifab:t,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fn tape_on(backend: Arc<dyn BlockBackend>, ew: u64) -> TapeLu {
    TapeLu::new(
        TapeLuConfig {
            early_warning: ew,
            ..TapeLuConfig::default()
        },
        backend,
    )
    .unwrap()
}

/// Runs `cdb` with `out` as data-out, without a runtime (inline).
fn run(lu: &TapeLu, n: &ItNexus, cdb: &[u8], out: &[u8]) -> TaskResult {
    let mut t = Task::new(
        n.clone(),
        Lun::ZERO,
        1,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    )
    .with_data_in(16 << 20);
    if !out.is_empty() {
        t = t
            .with_data(Bytes::copy_from_slice(out))
            .with_data_in(16 << 20);
    }
    futures_lite_block_on(lu.execute(t))
}

fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// A nexus whose power-on unit attention is consumed.
fn ready(lu: &TapeLu, name: &str) -> ItNexus {
    let n = nexus(name);
    let r = run(lu, &n, &[0; 6], &[]);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    assert_good(&run(lu, &n, &[0; 6], &[]));
    n
}

fn assert_good(r: &TaskResult) {
    assert_eq!(r.status, Status::GOOD, "sense {:02x?}", r.sense.as_deref());
}

/// (key, asc, ascq, filemark, eom, ili, information, response code).
fn sense(r: &TaskResult) -> (u8, u8, u8, bool, bool, bool, Option<i32>, u8) {
    assert_eq!(r.status, Status::CHECK_CONDITION, "{r:?}");
    let s = r.sense.as_deref().unwrap();
    let info = (s[0] & 0x80 != 0).then(|| i32::from_be_bytes([s[3], s[4], s[5], s[6]]));
    (
        s[2] & 0x0f,
        s[12],
        s[13],
        s[2] & 0x80 != 0,
        s[2] & 0x40 != 0,
        s[2] & 0x20 != 0,
        info,
        s[0] & 0x7f,
    )
}

fn data(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

fn write_var(len: u32) -> [u8; 6] {
    let l = len.to_be_bytes();
    [0x0a, 0, l[1], l[2], l[3], 0]
}

fn read_var(len: u32, sili: bool) -> [u8; 6] {
    let l = len.to_be_bytes();
    [0x08, u8::from(sili) << 1, l[1], l[2], l[3], 0]
}

fn filemarks(n: u8, immed: bool) -> [u8; 6] {
    [0x10, u8::from(immed), 0, 0, n, 0]
}

fn space(code: u8, count: i32) -> [u8; 6] {
    let c = count.to_be_bytes();
    [0x11, code, c[1], c[2], c[3], 0]
}

const REWIND: [u8; 6] = [0x01, 0, 0, 0, 0, 0];

fn position(lu: &TapeLu, n: &ItNexus) -> u64 {
    let r = run(lu, n, &[0x34, 0x06, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_good(&r);
    let d = data(&r);
    u64::from_be_bytes(d[8..16].try_into().unwrap())
}

fn block(i: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u32 ^ i.wrapping_mul(2654435761)) as u8)
        .collect()
}

#[test]
fn blocks_and_filemarks_read_back_in_order_with_ssc_sense() {
    let lu = tape_on(Arc::new(MemoryBackend::new(16 * MIB)), MIB);
    let n = ready(&lu, "iqn.h1");
    let inq = run(&lu, &n, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(&data(&inq)[..2], &[0x01, 0x80], "peripheral type 01h, RMB");
    for i in 0..3 {
        assert_good(&run(
            &lu,
            &n,
            &write_var(1000 + i),
            &block(i, 1000 + i as usize),
        ));
    }
    assert_good(&run(&lu, &n, &filemarks(1, false), &[]));
    assert_good(&run(&lu, &n, &write_var(10), &block(9, 10)));
    assert_eq!(position(&lu, &n), 5);
    assert_good(&run(&lu, &n, &REWIND, &[]));
    assert_eq!(position(&lu, &n), 0);
    // Exact length.
    let r = run(&lu, &n, &read_var(1000, false), &[]);
    assert_good(&r);
    assert_eq!(data(&r), block(0, 1000));
    // Longer request: ILI with the positive residue, the block's bytes.
    let r = run(&lu, &n, &read_var(1100, false), &[]);
    assert_eq!(sense(&r), (0, 0, 0, false, false, true, Some(99), 0x70));
    assert_eq!(data(&r), block(1, 1001));
    // ... quiet with SILI.
    let r = run(&lu, &n, &read_var(1100, true), &[]);
    assert_good(&r);
    assert_eq!(data(&r).len(), 1002);
    // The filemark: FILEMARK, FILEMARK DETECTED, position past it.
    let r = run(&lu, &n, &read_var(512, false), &[]);
    assert_eq!(sense(&r), (0, 0, 1, true, false, false, Some(512), 0x70));
    assert_eq!(position(&lu, &n), 4);
    // Shorter request: ILI with a negative residue, the bytes asked for.
    let r = run(&lu, &n, &read_var(4, false), &[]);
    assert_eq!(sense(&r), (0, 0, 0, false, false, true, Some(-6), 0x70));
    assert_eq!(data(&r), block(9, 10)[..4].to_vec());
    // End-of-data: BLANK CHECK, END-OF-DATA DETECTED, no motion.
    let r = run(&lu, &n, &read_var(512, false), &[]);
    assert_eq!(sense(&r), (8, 0, 5, false, false, false, Some(512), 0x70));
    assert_eq!(position(&lu, &n), 5);
}

#[test]
fn space_stops_at_filemarks_bop_and_eod_with_the_residue() {
    let lu = tape_on(Arc::new(MemoryBackend::new(16 * MIB)), MIB);
    let n = ready(&lu, "iqn.h1");
    // b0 b1 FM b3 b4 FM b6 | EOD
    for i in 0..7u32 {
        if i == 2 || i == 5 {
            assert_good(&run(&lu, &n, &filemarks(1, false), &[]));
        } else {
            assert_good(&run(&lu, &n, &write_var(512), &block(i, 512)));
        }
    }
    assert_good(&run(&lu, &n, &REWIND, &[]));
    // Blocks forward into a filemark: stop past it, residue 3.
    let r = run(&lu, &n, &space(0, 5), &[]);
    assert_eq!(sense(&r), (0, 0, 1, true, false, false, Some(3), 0x70));
    assert_eq!(position(&lu, &n), 3);
    // Filemarks forward past the second, then to EOD.
    assert_good(&run(&lu, &n, &space(1, 1), &[]));
    assert_eq!(position(&lu, &n), 6);
    let r = run(&lu, &n, &space(1, 2), &[]);
    assert_eq!(sense(&r), (8, 0, 5, false, false, false, Some(2), 0x70));
    assert_eq!(position(&lu, &n), 7);
    // Blocks reverse into a filemark: stop before it (BOP side).
    let r = run(&lu, &n, &space(0, -3), &[]);
    assert_eq!(sense(&r), (0, 0, 1, true, false, false, Some(2), 0x70));
    assert_eq!(position(&lu, &n), 5);
    // Filemarks reverse: the BOP side of the first filemark, then BOP.
    assert_good(&run(&lu, &n, &space(1, -1), &[]));
    assert_eq!(position(&lu, &n), 2);
    let r = run(&lu, &n, &space(1, -1), &[]);
    assert_eq!(sense(&r), (0, 0, 4, false, true, false, Some(1), 0x70));
    assert_eq!(position(&lu, &n), 0);
    // End-of-data, and SPACE(16) back from it.
    assert_good(&run(&lu, &n, &space(3, 0), &[]));
    assert_eq!(position(&lu, &n), 7);
    let mut s16 = [0u8; 16];
    s16[0] = 0x91;
    s16[4..12].copy_from_slice(&(-1i64).to_be_bytes());
    assert_good(&run(&lu, &n, &s16, &[]));
    assert_eq!(position(&lu, &n), 6);
    // Sequential filemarks and setmarks are refused.
    assert_eq!(sense(&run(&lu, &n, &space(2, 1), &[])).0, 5);
    // LOCATE(10) to object 4, LOCATE(16) to file 2, past EOD.
    assert_good(&run(&lu, &n, &[0x2b, 0, 0, 0, 0, 0, 4, 0, 0, 0], &[]));
    assert_eq!(position(&lu, &n), 4);
    let mut l16 = [0u8; 16];
    l16[0] = 0x92;
    l16[1] = 1 << 3;
    l16[4..12].copy_from_slice(&2u64.to_be_bytes());
    assert_good(&run(&lu, &n, &l16, &[]));
    assert_eq!(position(&lu, &n), 6);
    let r = run(&lu, &n, &[0x2b, 0, 0, 0, 0, 0, 99, 0, 0, 0], &[]);
    assert_eq!(sense(&r).0, 8);
    assert_eq!(position(&lu, &n), 7);
    // The long form's file number: two filemarks before EOD.
    let r = run(&lu, &n, &[0x34, 0x06, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(u64::from_be_bytes(data(&r)[16..24].try_into().unwrap()), 2);
}

#[test]
fn fixed_mode_needs_a_block_length_and_reads_whole_blocks() {
    let lu = tape_on(Arc::new(MemoryBackend::new(16 * MIB)), MIB);
    let n = ready(&lu, "iqn.h1");
    // Fixed mode with block length 0 (variable): refused.
    let r = run(&lu, &n, &[0x0a, 1, 0, 0, 1, 0], &block(0, 512));
    assert_eq!(sense(&r).0, 5);
    // MODE SELECT(6): block descriptor with 512-byte blocks.
    let mut ms = vec![
        0,
        0,
        0x10,
        8,
        super::DENSITY_CODE,
        0,
        0,
        0,
        0,
        0,
        0x02,
        0x00,
    ];
    assert_good(&run(&lu, &n, &[0x15, 0x10, 0, 0, ms.len() as u8, 0], &ms));
    let sense6 = run(&lu, &n, &[0x1a, 0, 0x3f, 0, 255, 0], &[]);
    let d = data(&sense6);
    assert_eq!(d[3], 8);
    assert_eq!(&d[9..12], &[0, 2, 0], "block length 512 in the descriptor");
    let mut four = Vec::new();
    for i in 0..4 {
        four.extend(block(i, 512));
    }
    assert_good(&run(&lu, &n, &[0x0a, 1, 0, 0, 4, 0], &four));
    assert_good(&run(&lu, &n, &write_var(100), &block(7, 100)));
    assert_good(&run(&lu, &n, &REWIND, &[]));
    let r = run(&lu, &n, &[0x08, 1, 0, 0, 2, 0], &[]);
    assert_good(&r);
    assert_eq!(data(&r), four[..1024].to_vec());
    // SILI with FIXED is refused.
    assert_eq!(sense(&run(&lu, &n, &[0x08, 3, 0, 0, 1, 0], &[])).0, 5);
    // Three asked, two read, then the 100-byte block: ILI, residue 1.
    let r = run(&lu, &n, &[0x08, 1, 0, 0, 3, 0], &[]);
    assert_eq!(sense(&r), (0, 0, 0, false, false, true, Some(1), 0x70));
    assert_eq!(data(&r), four[1024..].to_vec());
    assert_eq!(position(&lu, &n), 5);
    // A page whose contents differ from the current ones is refused.
    ms.extend_from_slice(&[0x10, 0x0e, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x18, 0, 0, 0, 0, 0]);
    let r = run(&lu, &n, &[0x15, 0x10, 0, 0, ms.len() as u8, 0], &ms);
    assert_eq!(sense(&r).1, 0x26);
}

#[test]
fn early_warning_then_volume_overflow() {
    // 64 KiB of records past the label, early warning 16 KiB before.
    let size = medium::DATA_START + medium::RECORD_HEADER + 64 * 1024;
    let lu = tape_on(Arc::new(MemoryBackend::new(size)), 16 * 1024);
    let n = ready(&lu, "iqn.h1");
    let mut warned = None;
    for i in 0..20u32 {
        let r = run(&lu, &n, &write_var(4000), &block(i, 4000));
        if r.status == Status::GOOD {
            assert!(warned.is_none(), "GOOD after the early warning");
            continue;
        }
        let s = sense(&r);
        if s.0 == 0 {
            assert_eq!(s, (0, 0, 2, false, true, false, None, 0x70));
            warned.get_or_insert(i);
            continue;
        }
        // VOLUME OVERFLOW: nothing of this block written.
        assert_eq!(s, (0x0d, 0, 2, false, true, false, Some(4000), 0x70));
        assert!(warned.is_some(), "overflow without an early warning");
        let (pos, len) = lu.position();
        assert_eq!((pos, len), (i as usize, i as usize));
        return;
    }
    panic!("never reached the physical end");
}

#[test]
fn overwriting_erases_what_followed_and_reopening_does_not_bring_it_back() {
    let backend: Arc<dyn BlockBackend> = Arc::new(MemoryBackend::new(16 * MIB));
    {
        let lu = tape_on(backend.clone(), MIB);
        let n = ready(&lu, "iqn.h1");
        for i in 0..10 {
            assert_good(&run(&lu, &n, &write_var(700), &block(i, 700)));
        }
        assert_good(&run(&lu, &n, &filemarks(1, false), &[]));
        assert_good(&run(&lu, &n, &REWIND, &[]));
        assert_good(&run(&lu, &n, &space(0, 3), &[]));
        // A longer block at 3 ends the tape there.
        assert_good(&run(&lu, &n, &write_var(900), &block(99, 900)));
        assert_good(&run(&lu, &n, &filemarks(0, false), &[]));
    }
    let lu = tape_on(backend.clone(), MIB);
    assert_eq!(lu.position(), (0, 4));
    let n = ready(&lu, "iqn.h1");
    assert_good(&run(&lu, &n, &space(0, 3), &[]));
    assert_eq!(
        data(&run(&lu, &n, &read_var(900, false), &[])),
        block(99, 900)
    );
    assert_eq!(sense(&run(&lu, &n, &read_var(900, false), &[])).0, 8);
    // ERASE at 1: two objects left, after a reopen too.
    assert_good(&run(&lu, &n, &REWIND, &[]));
    assert_good(&run(&lu, &n, &space(0, 1), &[]));
    assert_good(&run(&lu, &n, &[0x19, 0, 0, 0, 0, 0], &[]));
    drop(lu);
    assert_eq!(tape_on(backend, MIB).position(), (0, 1));
}

#[test]
fn a_torn_record_after_the_last_sync_ends_the_tape_where_it_began() {
    let backend: Arc<dyn BlockBackend> = Arc::new(MemoryBackend::new(16 * MIB));
    {
        let lu = tape_on(backend.clone(), MIB);
        let n = ready(&lu, "iqn.h1");
        for i in 0..3 {
            assert_good(&run(&lu, &n, &write_var(4096), &block(i, 4096)));
        }
        assert_good(&run(&lu, &n, &filemarks(1, false), &[]));
        for i in 3..5 {
            assert_good(&run(&lu, &n, &write_var(4096), &block(i, 4096)));
        }
    }
    // The crash tore the last block's data (after the sync point): three
    // blocks, a filemark, one block, then the last block's data.
    let rec = medium::RECORD_HEADER + 4096;
    let at = medium::DATA_START + 4 * rec + 2 * medium::RECORD_HEADER + 100;
    backend
        .write_at(at, &[Bytes::from_static(&[0xee; 64])], false)
        .unwrap();
    let lu = tape_on(backend, MIB);
    assert_eq!(
        lu.position(),
        (0, 5),
        "the torn last block is gone, the rest kept"
    );
}

#[test]
fn a_failed_immediate_flush_is_one_deferred_error_and_every_later_sync_fails() {
    let (faulty, faults) = FaultyBackend::new(Arc::new(MemoryBackend::new(16 * MIB)));
    let lu = tape_on(Arc::new(faulty), MIB);
    let a = ready(&lu, "iqn.a");
    let b = ready(&lu, "iqn.b");
    assert_good(&run(&lu, &a, &write_var(512), &block(0, 512)));
    faults.fail_flush(true);
    // IMMED: GOOD now; the flush fails after it.
    assert_good(&run(&lu, &a, &filemarks(1, true), &[]));
    // The other initiator does not hear it; the one that wrote does, once.
    assert_good(&run(&lu, &b, &[0; 6], &[]));
    let r = run(&lu, &a, &[0; 6], &[]);
    assert_eq!(sense(&r), (3, 0x0c, 0, false, false, false, None, 0x71));
    assert_good(&run(&lu, &a, &[0; 6], &[]));
    // The flush works again, but no later sync point may succeed.
    faults.fail_flush(false);
    let r = run(&lu, &a, &filemarks(0, false), &[]);
    assert_eq!(sense(&r), (3, 0x0c, 0, false, false, false, None, 0x70));
    assert_eq!(sense(&run(&lu, &a, &REWIND, &[])).0, 3);
}

#[test]
fn reservations_and_prevention_hold() {
    let lu = tape_on(Arc::new(MemoryBackend::new(16 * MIB)), MIB);
    let a = ready(&lu, "iqn.a");
    let b = ready(&lu, "iqn.b");
    assert_good(&run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(
        run(&lu, &b, &write_var(10), &block(0, 10)).status,
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        run(&lu, &b, &REWIND, &[]).status,
        Status::RESERVATION_CONFLICT
    );
    assert_good(&run(&lu, &b, &[0x12, 0, 0, 0, 36, 0], &[]));
    assert_good(&run(&lu, &a, &write_var(10), &block(0, 10)));
    assert_good(&run(&lu, &a, &[0x17, 0, 0, 0, 0, 0], &[]));
    // PREVENT: unloading is refused until ALLOW.
    assert_good(&run(&lu, &b, &[0x1e, 0, 0, 0, 1, 0], &[]));
    let r = run(&lu, &a, &[0x1b, 0, 0, 0, 0, 0], &[]);
    assert_eq!((sense(&r).1, sense(&r).2), (0x53, 0x02));
    assert_good(&run(&lu, &b, &[0x1e, 0, 0, 0, 0, 0], &[]));
    assert_good(&run(&lu, &a, &[0x1b, 0, 0, 0, 0, 0], &[]));
    let r = run(&lu, &a, &[0; 6], &[]);
    assert_eq!(
        (sense(&r).0, sense(&r).1),
        (2, 0x3a),
        "NOT READY, MEDIUM NOT PRESENT"
    );
    assert_good(&run(&lu, &a, &[0x1b, 0, 0, 0, 1, 0], &[]));
    assert_good(&run(&lu, &a, &[0; 6], &[]));
    // The other initiator hears the load.
    let r = run(&lu, &b, &[0; 6], &[]);
    assert_eq!((sense(&r).0, sense(&r).1), (6, 0x28));
}

#[test]
fn a_blank_image_is_formatted_and_a_foreign_one_refused() {
    let backend: Arc<dyn BlockBackend> = Arc::new(MemoryBackend::new(MIB));
    backend
        .write_at(0, &[Bytes::from_static(b"not a tape at all")], false)
        .unwrap();
    let e = TapeLu::new(TapeLuConfig::default(), backend).unwrap_err();
    assert!(matches!(e, MediumError::NotATape(_)), "{e}");
    let e = TapeLu::new(TapeLuConfig::default(), Arc::new(MemoryBackend::new(4096))).unwrap_err();
    assert!(matches!(e, MediumError::TooSmall(_)), "{e}");
}

#[test]
fn arbitrary_cdbs_never_panic() {
    let lu = tape_on(Arc::new(MemoryBackend::new(4 * MIB)), 64 * 1024);
    let n = ready(&lu, "iqn.fuzz");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let ops = [
        0x00u8, 0x01, 0x03, 0x05, 0x08, 0x0a, 0x10, 0x11, 0x12, 0x15, 0x16, 0x17, 0x19, 0x1a, 0x1b,
        0x1e, 0x2b, 0x34, 0x44, 0x55, 0x56, 0x57, 0x5a, 0x5e, 0x5f, 0x91, 0x92, 0xa0,
    ];
    for _ in 0..20_000 {
        let mut cdb = [0u8; 16];
        for b in cdb.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        cdb[0] = ops[(x >> 40) as usize % ops.len()];
        // Keep transfers small so the run stays quick.
        if matches!(cdb[0], 0x08 | 0x0a) {
            cdb[2] = 0;
            cdb[3] &= 0x0f;
        }
        let out = block(x as u32, (x >> 20) as usize % 300);
        let r = run(&lu, &n, &cdb, &out);
        if r.status == Status::CHECK_CONDITION {
            assert!(r.sense.as_ref().is_some_and(|s| s.len() >= 18));
        }
    }
}

#[test]
fn a_failed_overwrite_still_erases_what_followed() {
    let mem: Arc<dyn BlockBackend> = Arc::new(MemoryBackend::new(16 * MIB));
    let (faulty, faults) = FaultyBackend::new(mem.clone());
    let lu = tape_on(Arc::new(faulty), MIB);
    let n = ready(&lu, "iqn.h1");
    for i in 0..5 {
        assert_good(&run(&lu, &n, &write_var(1000), &block(i, 1000)));
    }
    assert_good(&run(&lu, &n, &REWIND, &[]));
    assert_good(&run(&lu, &n, &space(0, 1), &[]));
    // The new block's data cannot be written; its end-of-data record can.
    let at = medium::DATA_START + (medium::RECORD_HEADER + 1000) + medium::RECORD_HEADER;
    faults.fail_writes(at..at + 1);
    let r = run(&lu, &n, &write_var(2000), &block(9, 2000));
    assert_eq!(sense(&r).0, 3, "MEDIUM ERROR");
    drop(lu);
    // Blocks 1 to 4 were erased by the overwrite: they do not come back.
    assert_eq!(tape_on(mem, MIB).position(), (0, 1));
}
