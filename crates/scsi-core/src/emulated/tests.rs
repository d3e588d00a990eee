use super::spc::SUPPORTED;
use super::*;
use crate::backend::{FileBackend, FileOptions, MemoryBackend};
use crate::target::{Dispatch, ScsiTarget};
use crate::task::{Cdb, Lun, TargetPort, TaskAttr};

const BLOCKS: u64 = 8192;

pub(super) fn nexus(init: &str) -> ItNexus {
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

fn lu_with(cfg: EmulatedLuConfig) -> EmulatedLu {
    EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..cfg
        },
        Arc::new(MemoryBackend::new(BLOCKS * 512)),
    )
    .unwrap()
}

fn lu() -> EmulatedLu {
    lu_with(EmulatedLuConfig::default())
}

fn task(n: &ItNexus, cdb: &[u8], out: &[u8], din: u32) -> Task {
    let task = Task::new(
        n.clone(),
        Lun::ZERO,
        1,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    );
    if out.is_empty() {
        task.with_data_in(din)
    } else {
        task.with_data(Bytes::copy_from_slice(out))
            .with_data_in(din)
    }
}

pub(super) async fn run(lu: &EmulatedLu, n: &ItNexus, cdb: &[u8], out: &[u8]) -> TaskResult {
    lu.execute(task(n, cdb, out, 65536)).await
}

/// LOGICAL UNIT RESET requested by `by`.
async fn lu_reset(lu: &EmulatedLu, by: &ItNexus) -> TmfResponse {
    lu.task_management(TmfRequest {
        nexus: by.clone(),
        lun: Lun::ZERO,
        function: TmfFunction::LogicalUnitReset,
    })
    .await
}

/// A fresh nexus with its power-on unit attention consumed.
pub(super) async fn ready_nexus(lu: &EmulatedLu, name: &str) -> ItNexus {
    let n = nexus(name);
    let r = run(lu, &n, &tur(), &[]).await;
    assert_ua(&r, asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED);
    assert_good(&run(lu, &n, &tur(), &[]).await);
    n
}

pub(super) fn sense_of(r: &TaskResult) -> Sense {
    assert_eq!(r.status, Status::CHECK_CONDITION, "{r:?}");
    Sense::parse(r.sense.as_ref().unwrap()).unwrap()
}
pub(super) fn assert_good(r: &TaskResult) {
    assert_eq!(
        r.status,
        Status::GOOD,
        "{:?}",
        r.sense.as_ref().and_then(|s| Sense::parse(s))
    );
}
pub(super) fn assert_sense(r: &TaskResult, key: SenseKey, code: Asc) {
    let s = sense_of(r);
    assert_eq!((s.key, s.asc), (key, code), "{s:?}");
}
pub(super) fn assert_ua(r: &TaskResult, code: Asc) {
    assert_sense(r, SenseKey::UNIT_ATTENTION, code);
}
pub(super) fn data(r: &TaskResult) -> Vec<u8> {
    let mut v = Vec::new();
    for b in &r.data_in {
        v.extend_from_slice(b);
    }
    v
}

fn tur() -> [u8; 6] {
    [0; 6]
}
pub(super) fn rw10(op: u8, flags: u8, lba: u32, n: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}
pub(super) fn rw16(op: u8, flags: u8, lba: u64, n: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}
pub(super) fn caw(lba: u64, n: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = n;
    c
}
fn inquiry(evpd: bool, page: u8, alloc: u16) -> [u8; 6] {
    let a = alloc.to_be_bytes();
    [0x12, u8::from(evpd), page, a[0], a[1], 0]
}
fn mode_sense6(pc: u8, page: u8, alloc: u8) -> [u8; 6] {
    [0x1a, 0, (pc << 6) | page, 0, alloc, 0]
}
fn prout(sa: u8, ty: u8) -> [u8; 10] {
    [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0]
}
fn prin(sa: u8) -> [u8; 10] {
    [0x5e, sa, 0, 0, 0, 0, 0, 0x40, 0, 0]
}
fn pr_params(rk: u64, sark: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&rk.to_be_bytes());
    p[8..16].copy_from_slice(&sark.to_be_bytes());
    p[20] = flags;
    p
}

#[tokio::test]
async fn unit_attention_state_is_kept_for_a_bounded_number_of_nexuses() {
    let lu = lu();
    // More initiator ports than the bound, each seen once and gone.
    for k in 0..MAX_NEXUSES + 100 {
        let n = nexus(&format!("iqn.2026-11.test:host-{k}"));
        assert_ua(
            &run(&lu, &n, &tur(), &[]).await,
            asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
        );
        lu.nexus_loss(&n);
    }
    assert_eq!(lu.inner.lock().ua.len(), MAX_NEXUSES);
    // Each of them, coming back, hears that its nexus was lost if its
    // state was kept, or a reset if it was let go (100 of them: one per
    // nexus past the bound), and then works.
    let (mut lost, mut reset) = (0, 0);
    for k in 0..MAX_NEXUSES + 100 {
        let n = nexus(&format!("iqn.2026-11.test:host-{k}"));
        let code = sense_of(&run(&lu, &n, &tur(), &[]).await).asc;
        if code == asc::I_T_NEXUS_LOSS_OCCURRED {
            lost += 1;
        } else {
            assert_eq!(code, asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED);
            reset += 1;
        }
        assert_good(&run(&lu, &n, &tur(), &[]).await);
    }
    assert!(reset >= 100 && lost > 0, "{lost} lost, {reset} reset");
    assert_eq!(lu.inner.lock().ua.len(), MAX_NEXUSES);
}

#[tokio::test]
async fn power_on_ua_then_inquiry_exempt() {
    let lu = lu();
    let n = nexus("a");
    // INQUIRY does not consume the unit attention...
    let r = run(&lu, &n, &inquiry(false, 0, 96), &[]).await;
    assert_good(&r);
    let d = data(&r);
    assert_eq!(d[0], 0x00);
    assert_eq!(d[2], 0x06);
    assert_eq!(d[3] & 0x0f, 2);
    assert_eq!(usize::from(d[4]) + 5, d.len());
    assert_eq!(&d[8..14], b"UNIFAB");
    // ...REQUEST SENSE reports and clears it...
    let r = run(&lu, &n, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    assert_good(&r);
    let s = Sense::parse(&data(&r)).unwrap();
    assert_eq!(s.key, SenseKey::UNIT_ATTENTION);
    assert_eq!(s.asc, asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED);
    // ...and then there is none.
    assert_good(&run(&lu, &n, &tur(), &[]).await);
    let r = run(&lu, &n, &[0x03, 0, 0, 0, 18, 0], &[]).await;
    assert_eq!(Sense::parse(&data(&r)).unwrap().key, SenseKey::NO_SENSE);
}

#[tokio::test]
async fn read_write_round_trip_and_refusals() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
    assert_good(&run(&lu, &n, &rw10(0x2a, 0x08, 10, 2), &payload).await);
    let r = run(&lu, &n, &rw10(0x28, 0x18, 10, 2), &[]).await;
    assert_good(&r);
    assert_eq!(data(&r), payload);
    let r = run(&lu, &n, &rw16(0x88, 0, 10, 2), &[]).await;
    assert_eq!(data(&r), payload);
    // READ(6) with 0 = 256 blocks.
    let r = run(&lu, &n, &[0x08, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(data(&r).len(), 256 * 512);
    // Beyond the end, wrapped LBAs, zero blocks at the end.
    assert_sense(
        &run(&lu, &n, &rw10(0x28, 0, BLOCKS as u32 - 1, 2), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    assert_sense(
        &run(&lu, &n, &rw16(0x88, 0, u64::MAX, 1), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    assert_sense(
        &run(&lu, &n, &rw16(0x8a, 0, BLOCKS + 1, 0), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    assert_good(&run(&lu, &n, &rw10(0x28, 0, 0, 0), &[]).await);
    // RDPROTECT / WRPROTECT without protection information.
    for p in 1..8u8 {
        let s = sense_of(&run(&lu, &n, &rw10(0x28, p << 5, 0, 1), &[]).await);
        assert_eq!(s.asc, asc::INVALID_FIELD_IN_CDB);
        assert_eq!(s.key_specific, Some([0xcf, 0, 1]));
    }
    // Transfer length above the block limits.
    let small = lu_with(EmulatedLuConfig {
        max_transfer_blocks: 100,
        ..Default::default()
    });
    let m = ready_nexus(&small, "m").await;
    let s = sense_of(&run(&small, &m, &rw16(0x88, 0, 0, 200), &[]).await);
    assert_eq!(s.asc, asc::INVALID_FIELD_IN_CDB);
    assert_eq!(s.key_specific, Some([0xc0, 0, 10]));
    // Unknown opcode.
    assert_sense(
        &run(&lu, &n, &[0xc0, 0, 0, 0, 0, 0], &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_COMMAND_OPERATION_CODE,
    );
}

#[tokio::test]
async fn short_and_long_data_out_write_whole_blocks_only() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 0, 2), &[b'a'; 1024]).await);
    // Two blocks announced, one sent: first written, second untouched.
    let r = run(&lu, &n, &rw10(0x2a, 0, 0, 2), &[b'b'; 512]).await;
    assert_good(&r);
    assert_eq!(r.residual, Some(Residual::Overflow(512)));
    let d = data(&run(&lu, &n, &rw10(0x28, 0, 0, 2), &[]).await);
    assert!(d[..512].iter().all(|&b| b == b'b'));
    assert!(d[512..].iter().all(|&b| b == b'a'));
    // One block announced, two sent.
    let r = run(&lu, &n, &rw10(0x2a, 0, 0, 1), &[b'c'; 1024]).await;
    assert_eq!(r.residual, Some(Residual::Underflow(512)));
    let d = data(&run(&lu, &n, &rw10(0x28, 0, 0, 2), &[]).await);
    assert!(d[..512].iter().all(|&b| b == b'c'));
    assert!(d[512..].iter().all(|&b| b == b'a'));
    // No data at all.
    let r = run(&lu, &n, &rw10(0x2a, 0, 0, 1), &[]).await;
    assert_good(&r);
    assert_eq!(r.residual, Some(Residual::Overflow(512)));
}

#[tokio::test]
async fn verify_compare_and_write_orwrite() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let block = [b'A'; 512];
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 5, 1), &block).await);
    // VERIFY BYTCHK=1 match and mismatch (offset in INFORMATION).
    assert_good(&run(&lu, &n, &rw10(0x2f, 0x02, 5, 1), &block).await);
    let mut bad = block;
    bad[100] = b'X';
    let s = sense_of(&run(&lu, &n, &rw10(0x2f, 0x02, 5, 1), &bad).await);
    assert_eq!(
        (s.key, s.asc),
        (
            SenseKey::MISCOMPARE,
            asc::MISCOMPARE_DURING_VERIFY_OPERATION
        )
    );
    assert_eq!(s.information, Some(100));
    // BYTCHK=0 ignores data.
    assert_good(&run(&lu, &n, &rw10(0x2f, 0, 5, 1), &[]).await);
    // COMPARE AND WRITE: miscompare leaves the block alone.
    let mut buf = bad.to_vec();
    buf.extend_from_slice(&[b'B'; 512]);
    let s = sense_of(&run(&lu, &n, &caw(5, 1), &buf).await);
    assert_eq!(s.key, SenseKey::MISCOMPARE);
    assert_eq!(s.information, Some(100));
    assert_eq!(data(&run(&lu, &n, &rw10(0x28, 0, 5, 1), &[]).await), block);
    let mut buf = block.to_vec();
    buf.extend_from_slice(&[b'B'; 512]);
    assert_good(&run(&lu, &n, &caw(5, 1), &buf).await);
    assert_eq!(
        data(&run(&lu, &n, &rw10(0x28, 0, 5, 1), &[]).await),
        [b'B'; 512]
    );
    // Wrong data-out size (libiscsi's 256-block wrap to 0).
    assert_sense(
        &run(&lu, &n, &caw(5, 0), &[0; 1024]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    assert_sense(
        &run(&lu, &n, &caw(5, 1), &[0; 512]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // ORWRITE.
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 6, 1), &[0x0f; 512]).await);
    assert_good(&run(&lu, &n, &rw16(0x8b, 0, 6, 1), &[0xf0; 512]).await);
    assert_eq!(
        data(&run(&lu, &n, &rw10(0x28, 0, 6, 1), &[]).await),
        [0xff; 512]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compare_and_write_is_atomic_against_racing_writers() {
    let lu = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Blocking,
            ..Default::default()
        },
        Arc::new(MemoryBackend::new(BLOCKS * 512)),
    )
    .unwrap();
    let n = ready_nexus(&lu, "a").await;
    // 200 CAWs each flipping the block from generation k to k+1 race
    // against each other; exactly one CAW per generation may succeed, so
    // the final generation equals the number of successes.
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 7, 1), &[0u8; 512]).await);
    let mut handles = Vec::new();
    for _ in 0..8 {
        let lu = lu.clone();
        let n = n.clone();
        handles.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..25 {
                let cur = data(&run(&lu, &n, &rw10(0x28, 0, 7, 1), &[]).await);
                let mut next = cur.clone();
                let g = u32::from_be_bytes([cur[0], cur[1], cur[2], cur[3]]) + 1;
                next[..4].copy_from_slice(&g.to_be_bytes());
                let mut buf = cur;
                buf.extend_from_slice(&next);
                let r = run(&lu, &n, &caw(7, 1), &buf).await;
                if r.status == Status::GOOD {
                    ok += 1;
                } else {
                    assert_eq!(sense_of(&r).key, SenseKey::MISCOMPARE);
                }
            }
            ok
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    let d = data(&run(&lu, &n, &rw10(0x28, 0, 7, 1), &[]).await);
    assert_eq!(u32::from_be_bytes([d[0], d[1], d[2], d[3]]), total);
    assert!(total > 0);
}

#[tokio::test]
async fn write_same_unmap_and_lba_status() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let mut ws = [0u8; 10];
    ws[0] = 0x41;
    ws[7..9].copy_from_slice(&200u16.to_be_bytes());
    assert_good(&run(&lu, &n, &ws, &[0x5a; 512]).await);
    let d = data(&run(&lu, &n, &rw10(0x28, 0, 0, 200), &[]).await);
    assert!(d.iter().all(|&b| b == 0x5a));
    // ANCHOR is refused; wrong data-out size is refused.
    ws[1] = 0x10;
    assert_sense(
        &run(&lu, &n, &ws, &[0; 512]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    ws[1] = 0;
    assert_sense(
        &run(&lu, &n, &ws, &[0; 256]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    // 0 blocks = to the end, checked against MAXIMUM WRITE SAME LENGTH.
    let big = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..Default::default()
        },
        Arc::new(MemoryBackend::new(70_000 * 512)),
    )
    .unwrap();
    let m = ready_nexus(&big, "m").await;
    let s = sense_of(&run(&big, &m, &rw16(0x93, 0, 0, 0), &[0; 512]).await);
    assert_eq!(s.asc, asc::INVALID_FIELD_IN_CDB);
    assert_good(&run(&big, &m, &rw16(0x93, 0, 70_000 - 65535, 0), &[0; 512]).await);
    let s = sense_of(&run(&big, &m, &rw16(0x93, 0, 70_001, 0), &[0; 512]).await);
    assert_eq!(s.asc, asc::LBA_OUT_OF_RANGE);
    assert_good(&run(&lu, &n, &rw16(0x93, 0, BLOCKS - 10, 0), &[0; 512]).await);
    // Write a whole 64 KiB chunk, then WRITE SAME(16) UNMAP NDOB it.
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 256, 128), &[1; 65536]).await);
    let gls = |lba: u64| {
        let mut c = [0u8; 16];
        c[0] = 0x9e;
        c[1] = 0x12;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&64u32.to_be_bytes());
        c
    };
    let d = data(&run(&lu, &n, &gls(256), &[]).await);
    assert_eq!(&d[8..16], &256u64.to_be_bytes());
    assert_eq!(d[20], 0, "mapped");
    assert_good(&run(&lu, &n, &rw16(0x93, 0x08 | 0x01, 256, 128), &[]).await);
    let d = data(&run(&lu, &n, &gls(256), &[]).await);
    assert_eq!(d[20], 1, "deallocated");
    let r = run(&lu, &n, &rw10(0x28, 0, 256, 128), &[]).await;
    assert!(data(&r).iter().all(|&b| b == 0));
    // UNMAP via parameter list; GET LBA STATUS beyond the end.
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 384, 128), &[1; 65536]).await);
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&384u64.to_be_bytes());
    p[16..20].copy_from_slice(&128u32.to_be_bytes());
    assert_good(&run(&lu, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p).await);
    assert_eq!(data(&run(&lu, &n, &gls(384), &[]).await)[20], 1);
    p[8..16].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    p[16..20].copy_from_slice(&2u32.to_be_bytes());
    assert_sense(
        &run(&lu, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    assert_sense(
        &run(&lu, &n, &gls(BLOCKS), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
}

#[tokio::test]
async fn vpd_pages_and_capacity() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let d = data(&run(&lu, &n, &inquiry(true, 0, 255), &[]).await);
    let pages = &d[4..];
    assert_eq!(pages, &[0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2]);
    for &p in pages {
        let r = run(&lu, &n, &inquiry(true, p, 255), &[]).await;
        assert_good(&r);
        let d = data(&r);
        assert_eq!(d[1], p);
        assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])) + 4, d.len());
    }
    assert_sense(
        &run(&lu, &n, &inquiry(false, 1, 255), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    assert_sense(
        &run(&lu, &n, &inquiry(true, 0x42, 255), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // 0x83: NAA first, stable across instances with the same identity.
    let d = data(&run(&lu, &n, &inquiry(true, 0x83, 255), &[]).await);
    assert_eq!(&d[4..8], &[0x01, 0x03, 0, 8]);
    assert_eq!(d[8] >> 4, 3);
    assert_eq!(lu.naa(), self::lu().naa());
    let other = lu_with(EmulatedLuConfig {
        name: "other".into(),
        ..Default::default()
    });
    assert_ne!(lu.naa(), other.naa());
    // The SCSI name string of the target port is there.
    let text = String::from_utf8_lossy(&d);
    assert!(text.contains("iqn.2026-11.io.unifab:t,t,0x1"));
    // Block limits: 64 bytes, unmap limits non-zero.
    let d = data(&run(&lu, &n, &inquiry(true, 0xb0, 255), &[]).await);
    assert_eq!(d.len(), 64);
    assert_eq!(d[5], 255);
    assert_ne!(u32::from_be_bytes([d[20], d[21], d[22], d[23]]), 0);
    // Allocation length truncation.
    let r = run(&lu, &n, &inquiry(true, 0xb0, 10), &[]).await;
    assert_eq!(data(&r).len(), 10);
    // READ CAPACITY.
    let d = data(&run(&lu, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).await);
    assert_eq!(
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as u64,
        BLOCKS - 1
    );
    let mut rc16 = [0u8; 16];
    rc16[0] = 0x9e;
    rc16[1] = 0x10;
    rc16[13] = 32;
    let d = data(&run(&lu, &n, &rc16, &[]).await);
    assert_eq!(d.len(), 32);
    assert_eq!(d[14] & 0xc0, 0xc0, "LBPME LBPRZ");
}

#[tokio::test]
async fn mode_sense_select_swp_and_ua_to_others() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let b = ready_nexus(&lu, "b").await;
    let r = run(&lu, &a, &mode_sense6(0, 0x3f, 255), &[]).await;
    let d = data(&r);
    assert_eq!(usize::from(d[0]) + 1, d.len());
    assert_eq!(d[2] & 0x10, 0x10, "DPOFUA");
    assert_eq!(d[3], 8, "block descriptor");
    // Residual-free truncation to 4 bytes.
    assert_eq!(
        data(&run(&lu, &a, &mode_sense6(0, 0x3f, 4), &[]).await).len(),
        4
    );
    // Saved pages are not supported.
    assert_sense(
        &run(&lu, &a, &mode_sense6(3, 0x3f, 255), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    // Changeable control page: SWP only.
    let d = data(&run(&lu, &a, &[0x1a, 0x08, 0x40 | 0x0a, 0, 255, 0], &[]).await);
    assert_eq!(d[4], 0x0a);
    assert_eq!(d[4 + 4], 0x08);
    // Set SWP with MODE SELECT(6).
    let mut cur = data(&run(&lu, &a, &[0x1a, 0x08, 0x0a, 0, 255, 0], &[]).await);
    cur[0] = 0;
    cur[4 + 4] |= 0x08;
    let len = cur.len() as u8;
    assert_good(&run(&lu, &a, &[0x15, 0x10, 0, 0, len, 0], &cur).await);
    assert_sense(
        &run(&lu, &a, &rw10(0x2a, 0, 0, 1), &[0; 512]).await,
        SenseKey::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
    assert_good(&run(&lu, &a, &rw10(0x28, 0, 0, 1), &[]).await);
    // The other nexus hears MODE PARAMETERS CHANGED; the changer does not.
    assert_ua(
        &run(&lu, &b, &tur(), &[]).await,
        asc::MODE_PARAMETERS_CHANGED,
    );
    assert_good(&run(&lu, &a, &tur(), &[]).await);
    // Changing a non-changeable bit is an invalid field in the list.
    let mut bad = cur.clone();
    bad[4 + 4] &= !0x08;
    bad[4 + 2] |= 0x04; // D_SENSE
    assert_sense(
        &run(&lu, &a, &[0x15, 0x10, 0, 0, len, 0], &bad).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // SP=1 is refused.
    assert_sense(
        &run(&lu, &a, &[0x15, 0x11, 0, 0, len, 0], &cur).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // Short parameter list.
    assert_sense(
        &run(&lu, &a, &[0x15, 0x10, 0, 0, 2, 0], &cur[..2]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::PARAMETER_LIST_LENGTH_ERROR,
    );
}

#[tokio::test]
async fn reserve6_two_nexuses_and_release_by_reset_and_loss() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let b = ready_nexus(&lu, "b").await;
    let c = ready_nexus(&lu, "c").await;
    assert_good(&run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]).await);
    assert_good(&run(&lu, &a, &[0x16, 0, 0, 0, 0, 0], &[]).await);
    let conflict = run(&lu, &b, &[0x16, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(conflict.status, Status::RESERVATION_CONFLICT);
    // RELEASE by a non-holder is GOOD and changes nothing.
    assert_good(&run(&lu, &b, &[0x17, 0, 0, 0, 0, 0], &[]).await);
    assert_eq!(
        run(&lu, &b, &mode_sense6(0, 0x3f, 255), &[]).await.status,
        Status::RESERVATION_CONFLICT
    );
    assert_good(&run(&lu, &b, &inquiry(false, 0, 36), &[]).await);
    assert_good(&run(&lu, &a, &mode_sense6(0, 0x3f, 255), &[]).await);
    // Nexus loss releases it.
    lu.nexus_loss(&a);
    assert_good(&run(&lu, &b, &[0x16, 0, 0, 0, 0, 0], &[]).await);
    // TEST UNIT READY conflicts under RESERVE(6).
    assert_eq!(
        run(&lu, &c, &tur(), &[]).await.status,
        Status::RESERVATION_CONFLICT
    );
    // LU reset releases it; the requester gets no UA, others do.
    let resp = lu_reset(&lu, &c).await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    // A LU reset tells every nexus, the requester's included.
    assert_ua(
        &run(&lu, &c, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&lu, &c, &[0x16, 0, 0, 0, 0, 0], &[]).await);
    assert_ua(
        &run(&lu, &b, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    // The lost nexus's initiator comes back: I_T NEXUS LOSS OCCURRED
    // (superseded by the reset that followed).
    let a2 = nexus("a");
    assert_ua(
        &run(&lu, &a2, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    let d = nexus("d");
    lu.nexus_loss(&d);
    let _ = run(&lu, &d, &tur(), &[]).await;
    lu.nexus_loss(&d);
    assert_ua(
        &run(&lu, &nexus("d"), &tur(), &[]).await,
        asc::I_T_NEXUS_LOSS_OCCURRED,
    );
}

#[tokio::test]
async fn a_departed_hosts_attention_is_its_own_and_a_reset_reaches_every_clear_host() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let b = ready_nexus(&lu, "b").await;
    // b leaves: I_T NEXUS LOSS OCCURRED waits for b's initiator port alone;
    // a, with nothing queued, goes on untouched (and lock-free).
    lu.nexus_loss(&b);
    assert_good(&run(&lu, &a, &tur(), &[]).await);
    assert!(lu.inner.clear.read().unwrap().contains(&a.id()));
    assert!(!lu.inner.clear.read().unwrap().contains(&b.id()));
    // A reset requested by c reaches a although a was on the fast path.
    let c = ready_nexus(&lu, "c").await;
    let resp = lu_reset(&lu, &c).await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&lu, &a, &tur(), &[]).await);
    // INQUIRY does not consume an attention, so it does not clear a nexus.
    let resp = lu_reset(&lu, &c).await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert_good(&run(&lu, &a, &inquiry(false, 0, 36), &[]).await);
    assert!(!lu.inner.clear.read().unwrap().contains(&a.id()));
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    // b's initiator comes back and hears of both the loss and the resets.
    let b2 = nexus("b");
    assert_ua(
        &run(&lu, &b2, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
}

#[tokio::test]
async fn persistent_reservation_two_nexuses() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let b = ready_nexus(&lu, "b").await;
    assert_good(&run(&lu, &a, &prout(6, 0), &pr_params(0, 0xa, 0)).await);
    assert_good(&run(&lu, &b, &prout(6, 0), &pr_params(0, 0xb, 0)).await);
    // Write exclusive, registrants only.
    assert_good(&run(&lu, &a, &prout(1, 5), &pr_params(0xa, 0, 0)).await);
    assert_good(&run(&lu, &b, &rw10(0x2a, 0, 1, 1), &[0; 512]).await);
    let c = ready_nexus(&lu, "c").await;
    assert_good(&run(&lu, &c, &rw10(0x28, 0, 1, 1), &[]).await);
    assert_eq!(
        run(&lu, &c, &rw10(0x2a, 0, 1, 1), &[0; 512]).await.status,
        Status::RESERVATION_CONFLICT
    );
    // READ KEYS truncated to 8 bytes keeps the additional length.
    let r = run(&lu, &a, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[]).await;
    let d = data(&r);
    assert_eq!(d.len(), 8);
    assert_eq!(u32::from_be_bytes([d[4], d[5], d[6], d[7]]), 16);
    // RESERVE by another conflicts; release with wrong type is refused.
    assert_eq!(
        run(&lu, &b, &prout(1, 3), &pr_params(0xb, 0, 0))
            .await
            .status,
        Status::RESERVATION_CONFLICT
    );
    // b preempts a: a hears REGISTRATIONS PREEMPTED.
    assert_good(&run(&lu, &b, &prout(4, 3), &pr_params(0xb, 0xa, 0)).await);
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::REGISTRATIONS_PREEMPTED,
    );
    let d = data(&run(&lu, &a, &prin(1), &[]).await);
    assert_eq!(&d[8..16], &0xbu64.to_be_bytes());
    assert_eq!(d[21], 3);
    assert_eq!(
        run(&lu, &a, &rw10(0x28, 0, 1, 1), &[]).await.status,
        Status::RESERVATION_CONFLICT
    );
    // RESERVE(6) while a persistent reservation exists conflicts.
    assert_eq!(
        run(&lu, &b, &[0x16, 0, 0, 0, 0, 0], &[]).await.status,
        Status::RESERVATION_CONFLICT
    );
    // REPORT CAPABILITIES; unsupported PR IN service action.
    let d = data(&run(&lu, &a, &prin(2), &[]).await);
    assert_eq!(u16::from_be_bytes([d[0], d[1]]), 8);
    assert_eq!(d[2] & 1, 0, "no APTPL without a path");
    assert_sense(
        &run(&lu, &a, &prin(4), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // APTPL without a persistence path is refused.
    assert_sense(
        &run(&lu, &b, &prout(0, 0), &pr_params(0xb, 0xc, 1)).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // CLEAR.
    assert_good(&run(&lu, &b, &prout(3, 0), &pr_params(0xb, 0, 0)).await);
    assert_good(&run(&lu, &c, &rw10(0x2a, 0, 1, 1), &[0; 512]).await);
}

#[tokio::test]
async fn aptpl_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EmulatedLuConfig {
        pr_path: Some(dir.path().join("lu0.pr")),
        io_mode: IoMode::Inline,
        ..Default::default()
    };
    let backend = Arc::new(MemoryBackend::new(BLOCKS * 512));
    let lu = EmulatedLu::new(cfg.clone(), backend.clone()).unwrap();
    let a = ready_nexus(&lu, "a").await;
    assert_good(&run(&lu, &a, &prout(6, 0), &pr_params(0, 0x77, 1)).await);
    assert_good(&run(&lu, &a, &prout(1, 1), &pr_params(0x77, 0, 0)).await);
    drop(lu);
    let lu = EmulatedLu::new(cfg, backend).unwrap();
    let b = ready_nexus(&lu, "b").await;
    let d = data(&run(&lu, &b, &prin(1), &[]).await);
    assert_eq!(&d[8..16], &0x77u64.to_be_bytes());
    let caps = data(&run(&lu, &b, &prin(2), &[]).await);
    assert_eq!(caps[2] & 1, 1, "PTPL_C");
    assert_eq!(caps[3] & 1, 1, "PTPL_A");
    assert_eq!(
        run(&lu, &b, &rw10(0x2a, 0, 1, 1), &[0; 512]).await.status,
        Status::RESERVATION_CONFLICT
    );
}

#[tokio::test]
async fn report_supported_opcodes_is_consistent() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let all = |rctd: bool| {
        let mut c = [0u8; 12];
        c[0] = 0xa3;
        c[1] = 0x0c;
        c[2] = u8::from(rctd) << 7;
        c[6..10].copy_from_slice(&65535u32.to_be_bytes());
        c
    };
    let d = data(&run(&lu, &n, &all(false), &[]).await);
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!(len + 4, d.len());
    let descs: Vec<&[u8]> = d[4..].chunks(8).collect();
    assert_eq!(descs.len(), SUPPORTED.len());
    for desc in descs {
        let (op, sa, servactv) = (
            desc[0],
            u16::from_be_bytes([desc[2], desc[3]]),
            desc[5] & 1 == 1,
        );
        let one = |opt: u8| {
            let mut c = [0u8; 12];
            c[0] = 0xa3;
            c[1] = 0x0c;
            c[2] = opt;
            c[3] = op;
            c[4..6].copy_from_slice(&sa.to_be_bytes());
            c[6..10].copy_from_slice(&65535u32.to_be_bytes());
            c
        };
        let (good, bad) = if servactv { (2, 1) } else { (1, 2) };
        let r = run(&lu, &n, &one(good), &[]).await;
        let o = data(&r);
        assert_eq!(o[1] & 7, 3, "{op:#x}");
        let cdb_len = usize::from(u16::from_be_bytes([o[2], o[3]]));
        assert_eq!(o[4], op);
        assert_eq!(cdb_len, u16::from_be_bytes([desc[6], desc[7]]) as usize);
        // Every bit claimed as usable parses.
        let usage = &o[4..4 + cdb_len];
        let mut probe = vec![0u8; cdb_len];
        probe[0] = op;
        if servactv {
            probe[1] = sa as u8;
        }
        for i in 1..cdb_len {
            probe[i] |= usage[i];
        }
        assert!(
            Command::parse(&probe).is_ok(),
            "{op:#x}: usage {usage:02x?}"
        );
        assert_sense(
            &run(&lu, &n, &one(bad), &[]).await,
            SenseKey::ILLEGAL_REQUEST,
            asc::INVALID_FIELD_IN_CDB,
        );
    }
    // DPO/FUA advertised for READ(10).
    let mut c = [0u8; 12];
    c[0] = 0xa3;
    c[1] = 0x0c;
    c[2] = 1;
    c[3] = 0x28;
    c[9] = 0xff;
    let o = data(&run(&lu, &n, &c, &[]).await);
    assert_eq!(o[5] & 0x18, 0x18);
    assert_eq!(o[5] & 0xe0, 0, "no RDPROTECT");
    // RCTD: every descriptor has a timeouts descriptor of length 10.
    let d = data(&run(&lu, &n, &all(true), &[]).await);
    for desc in d[4..].chunks(20) {
        assert_eq!(desc[5] & 2, 2);
        assert_eq!(u16::from_be_bytes([desc[8], desc[9]]), 0x0a);
    }
    // An unsupported opcode reports SUPPORT = 001b.
    c[3] = 0xc0;
    assert_eq!(data(&run(&lu, &n, &c, &[]).await)[1] & 7, 1);
}

#[tokio::test]
async fn ordered_and_head_of_queue_and_abort() {
    let lu = lu();
    let n = ready_nexus(&lu, "a").await;
    let mk = |tag: u64, attr: TaskAttr, cdb: &[u8], out: &[u8]| {
        let mut t = task(&n, cdb, out, 512);
        t.tag = tag;
        t.attr = attr;
        t
    };
    // A SIMPLE write, then an ORDERED read of the same block, registered
    // in that order: the read sees the write even if polled first.
    let w = lu.execute(mk(1, TaskAttr::Simple, &rw10(0x2a, 0, 3, 1), &[9; 512]));
    let r = lu.execute(mk(2, TaskAttr::Ordered, &rw10(0x28, 0, 3, 1), &[]));
    let s = lu.execute(mk(3, TaskAttr::Simple, &tur(), &[]));
    assert_eq!(lu.task_set().len(), 3);
    let (rr, wr, sr) = tokio::join!(r, w, s);
    assert_good(&wr);
    assert_good(&sr);
    assert_eq!(data(&rr), [9; 512]);
    // ABORT TASK SET: an ORDERED task waiting behind a HEAD OF QUEUE one
    // resolves aborted; the TMF completes after it ended.
    let hoq = lu.execute(mk(4, TaskAttr::HeadOfQueue, &tur(), &[]));
    let ord = lu.execute(mk(5, TaskAttr::Ordered, &tur(), &[]));
    let tmf = lu.task_management(TmfRequest {
        nexus: n.clone(),
        lun: Lun::ZERO,
        function: TmfFunction::QueryTask { tag: 5 },
    });
    assert_eq!(tmf.await, TmfResponse::FunctionSucceeded);
    let abort = lu.task_management(TmfRequest {
        nexus: n.clone(),
        lun: Lun::ZERO,
        function: TmfFunction::AbortTask { tag: 5 },
    });
    let (o, a) = tokio::join!(ord, abort);
    assert!(o.aborted);
    assert_eq!(a, TmfResponse::FunctionComplete);
    assert_good(&hoq.await);
    assert_eq!(lu.task_set().len(), 0);
    // Task set full.
    let small = lu_with(EmulatedLuConfig {
        task_set_depth: 1,
        ..Default::default()
    });
    let m = ready_nexus(&small, "m").await;
    let _first = small.execute(task(&m, &tur(), &[], 0));
    let full = small.execute(task(&m, &tur(), &[], 0)).await;
    assert_eq!(full.status, Status::TASK_SET_FULL);
}

#[tokio::test]
async fn file_backend_fua_and_sync_cache_reach_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let fb = Arc::new(
        FileBackend::open(
            dir.path().join("lu.img"),
            Some(BLOCKS * 512),
            FileOptions::default(),
        )
        .unwrap(),
    );
    let lu = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Blocking,
            ..Default::default()
        },
        fb.clone(),
    )
    .unwrap();
    let n = ready_nexus(&lu, "a").await;
    let before = fb.sync_count();
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 0, 1), &[1; 512]).await);
    assert_eq!(fb.sync_count(), before, "write-back write");
    assert_good(&run(&lu, &n, &rw10(0x2a, 0x08, 0, 1), &[1; 512]).await);
    assert_eq!(fb.sync_count(), before + 1, "FUA");
    assert_good(&run(&lu, &n, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).await);
    assert_eq!(fb.sync_count(), before + 2, "SYNCHRONIZE CACHE");
    // WCE=0: every write is write-through.
    let wt = EmulatedLu::new(
        EmulatedLuConfig {
            write_cache: false,
            io_mode: IoMode::Inline,
            name: "wt".into(),
            ..Default::default()
        },
        Arc::new(
            FileBackend::open(
                dir.path().join("wt.img"),
                Some(BLOCKS * 512),
                FileOptions::default(),
            )
            .unwrap(),
        ),
    )
    .unwrap();
    let m = ready_nexus(&wt, "b").await;
    assert_good(&run(&wt, &m, &rw10(0x2a, 0, 0, 1), &[1; 512]).await);
    let d = data(&run(&wt, &m, &mode_sense6(0, 0x08, 255), &[]).await);
    assert_eq!(d[4 + 8 + 2] & 0x04, 0, "WCE=0 reported");
    // Punch a hole through UNMAP and see it with GET LBA STATUS.
    assert_good(&run(&lu, &n, &rw10(0x2a, 0, 1024, 256), &[7; 256 * 512]).await);
    let mut p = vec![0u8; 24];
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&1024u64.to_be_bytes());
    p[16..20].copy_from_slice(&128u32.to_be_bytes());
    assert_good(&run(&lu, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &p).await);
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x12;
    c[2..10].copy_from_slice(&1024u64.to_be_bytes());
    c[13] = 64;
    let d = data(&run(&lu, &n, &c, &[]).await);
    assert_eq!(d[20], 1, "hole");
    assert_eq!(u32::from_be_bytes([d[16], d[17], d[18], d[19]]), 128);
    assert_eq!(&d[24..32], &1152u64.to_be_bytes());
    assert_eq!(d[36], 0, "still mapped after the hole");
}

#[tokio::test]
async fn read_only_lu_refuses_writes() {
    let lu = lu_with(EmulatedLuConfig {
        read_only: true,
        ..Default::default()
    });
    let n = ready_nexus(&lu, "a").await;
    let d = data(&run(&lu, &n, &mode_sense6(0, 0x3f, 255), &[]).await);
    assert_eq!(d[2] & 0x80, 0x80, "WP");
    for (cdb, out) in [
        (rw10(0x2a, 0, 0, 1).to_vec(), vec![0u8; 512]),
        (rw16(0x93, 0x08, 0, 1).to_vec(), vec![0u8; 512]),
        (vec![0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], vec![0u8; 24]),
        (caw(0, 1).to_vec(), vec![0u8; 1024]),
    ] {
        assert_sense(
            &run(&lu, &n, &cdb, &out).await,
            SenseKey::DATA_PROTECT,
            asc::WRITE_PROTECTED,
        );
    }
}

/// READ CAPACITY(16): the number of blocks.
async fn capacity_blocks(lu: &EmulatedLu, n: &ItNexus) -> u64 {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    let d = data(&run(lu, n, &c, &[]).await);
    u64::from_be_bytes(d[..8].try_into().unwrap()) + 1
}

#[tokio::test]
async fn a_live_lu_grows_and_changes_write_protection_with_unit_attentions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lu.img");
    let lu = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..Default::default()
        },
        Arc::new(FileBackend::open(&path, Some(BLOCKS * 512), FileOptions::default()).unwrap()),
    )
    .unwrap();
    let (a, b) = (
        ready_nexus(&lu, "iqn.a").await,
        ready_nexus(&lu, "iqn.b").await,
    );
    assert_eq!(capacity_blocks(&lu, &a).await, BLOCKS);
    // Past the end: refused before the growth.
    let past = rw16(0x8a, 0, BLOCKS, 1);
    assert_sense(
        &run(&lu, &a, &past, &[5; 512]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    lu.grow(BLOCKS * 2 * 512 + 100).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        BLOCKS * 2 * 512 + 100
    );
    for n in [&a, &b] {
        assert_ua(
            &run(&lu, n, &tur(), &[]).await,
            asc::CAPACITY_DATA_HAS_CHANGED,
        );
        assert_eq!(
            capacity_blocks(&lu, n).await,
            BLOCKS * 2,
            "whole blocks only"
        );
    }
    assert_good(&run(&lu, &a, &past, &[5; 512]).await);
    assert_eq!(
        data(&run(&lu, &b, &rw16(0x88, 0, BLOCKS, 1), &[]).await),
        [5; 512]
    );
    assert_eq!(
        data(&run(&lu, &b, &rw16(0x88, 0, BLOCKS + 1, 1), &[]).await),
        [0; 512],
        "new blocks read as zeros"
    );
    // Never smaller; the same size is no change and no attention.
    assert!(matches!(
        lu.grow(BLOCKS * 512),
        Err(BackendError::Shrink { .. })
    ));
    lu.grow(BLOCKS * 2 * 512 + 100).unwrap();
    assert_good(&run(&lu, &a, &tur(), &[]).await);

    // Write protection on: writes refused, every nexus told, WP set.
    lu.set_read_only(true).unwrap();
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::MODE_PARAMETERS_CHANGED,
    );
    assert_sense(
        &run(&lu, &a, &rw10(0x2a, 0, 0, 1), &[1; 512]).await,
        SenseKey::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
    let d = data(&run(&lu, &a, &mode_sense6(0, 0x3f, 255), &[]).await);
    assert_eq!(d[2] & 0x80, 0x80, "WP");
    assert_ua(
        &run(&lu, &b, &rw10(0x2a, 0, 0, 1), &[1; 512]).await,
        asc::MODE_PARAMETERS_CHANGED,
    );
    lu.set_read_only(true).unwrap();
    assert_good(&run(&lu, &b, &tur(), &[]).await);
    // And off again.
    lu.set_read_only(false).unwrap();
    assert_ua(
        &run(&lu, &b, &tur(), &[]).await,
        asc::MODE_PARAMETERS_CHANGED,
    );
    assert_good(&run(&lu, &b, &rw10(0x2a, 0, 0, 1), &[1; 512]).await);
    let d = data(&run(&lu, &b, &mode_sense6(0, 0x3f, 255), &[]).await);
    assert_eq!(d[2] & 0x80, 0, "WP cleared");

    // A memory LU has a fixed size; a file opened read-only stays so.
    let mem = lu_with(EmulatedLuConfig::default());
    assert!(matches!(
        mem.grow(BLOCKS * 1024),
        Err(BackendError::FixedSize)
    ));
    drop(lu);
    let ro = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..Default::default()
        },
        Arc::new(
            FileBackend::open(
                &path,
                None,
                FileOptions {
                    read_only: true,
                    ..FileOptions::default()
                },
            )
            .unwrap(),
        ),
    )
    .unwrap();
    assert!(matches!(
        ro.set_read_only(false),
        Err(BackendError::ReadOnly)
    ));
    assert!(matches!(
        ro.grow(BLOCKS * 4096),
        Err(BackendError::ReadOnly)
    ));
}

/// A LU that answers promptly (as one on RBD does): a LU whose backend
/// completes commands one by one after network round trips.
#[derive(Debug)]
struct Prompt(EmulatedLu);

impl LogicalUnit for Prompt {
    fn execute(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        self.0.execute(task)
    }
    fn task_management(&self, request: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        self.0.task_management(request)
    }
    fn nexus_loss(&self, nexus: &ItNexus) {
        self.0.nexus_loss(nexus);
    }
    fn describe(&self) -> LuDescription {
        self.0.describe()
    }
    fn answer_promptly(&self) -> bool {
        true
    }
}

/// The target tells a transport which LUNs' answers must not be held for
/// a batch: those of a LU that answers promptly, while it is mapped; no
/// other (an emulated LU on memory, a LUN not mapped).
#[test]
fn the_target_names_the_luns_whose_answers_go_out_promptly() {
    let t = ScsiTarget::new();
    t.insert(Lun::ZERO, Arc::new(lu()));
    assert!(!lu().answer_promptly(), "a memory LU");
    assert!(!t.answer_promptly(Lun::ZERO));
    t.insert(Lun(1), Arc::new(Prompt(lu())));
    assert!(t.answer_promptly(Lun(1)));
    assert!(!t.answer_promptly(Lun::ZERO));
    assert!(!t.answer_promptly(Lun(2)), "not mapped");
    t.remove(Lun(1));
    assert!(!t.answer_promptly(Lun(1)));
    // Mapped again over another LU: the map is looked at again.
    t.insert(Lun::ZERO, Arc::new(Prompt(lu())));
    assert!(t.answer_promptly(Lun::ZERO));
}

#[tokio::test]
async fn target_report_luns_missing_lun_and_map_change_ua() {
    let t = ScsiTarget::new();
    let lu0: Arc<dyn LogicalUnit> = Arc::new(lu());
    t.insert(Lun::ZERO, lu0.clone());
    let n = nexus("a");
    let mk = |lun: Lun, cdb: &[u8]| {
        let mut x = task(&n, cdb, &[], 4096);
        x.lun = lun;
        x
    };
    let rl = |sel: u8| [0xa0, 0, sel, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = t.dispatch(mk(Lun::ZERO, &rl(0))).await;
    assert_eq!(data(&r), [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let r = t.dispatch(mk(Lun::ZERO, &rl(1))).await;
    assert_eq!(&data(&r)[8..10], &[0xc1, 0x01]);
    assert_eq!(data(&t.dispatch(mk(Lun::ZERO, &rl(2))).await).len(), 24);
    assert_sense(
        &t.dispatch(mk(Lun::ZERO, &rl(7))).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    let mut short = rl(0);
    short[9] = 8;
    short[8] = 0;
    assert_sense(
        &t.dispatch(mk(Lun::ZERO, &short)).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // Missing LUN.
    let l5 = Lun::from_index(5).unwrap();
    let r = t.dispatch(mk(l5, &inquiry(false, 0, 36))).await;
    assert_eq!(data(&r)[0], 0x7f);
    assert_sense(
        &t.dispatch(mk(l5, &tur())).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LOGICAL_UNIT_NOT_SUPPORTED,
    );
    let r = t.dispatch(mk(l5, &[0x03, 0, 0, 0, 18, 0])).await;
    assert_good(&r);
    assert_eq!(
        Sense::parse(&data(&r)).unwrap().asc,
        asc::LOGICAL_UNIT_NOT_SUPPORTED
    );
    // Map change: REPORTED LUNS DATA HAS CHANGED once, INQUIRY exempt.
    t.insert(
        l5,
        Arc::new(lu_with(EmulatedLuConfig {
            name: "l5".into(),
            ..Default::default()
        })),
    );
    assert_good(&t.dispatch(mk(Lun::ZERO, &inquiry(false, 0, 36))).await);
    assert_ua(
        &t.dispatch(mk(Lun::ZERO, &tur())).await,
        asc::REPORTED_LUNS_DATA_HAS_CHANGED,
    );
    // Then the LU's own power-on UA, then good.
    assert_ua(
        &t.dispatch(mk(l5, &tur())).await,
        asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
    );
    assert_good(&t.dispatch(mk(l5, &tur())).await);
    t.remove(l5);
    assert_eq!(
        data(&t.dispatch(mk(Lun::ZERO, &rl(0))).await).len(),
        16,
        "REPORT LUNS clears the UA"
    );
    assert_ua(
        &t.dispatch(mk(Lun::ZERO, &tur())).await,
        asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
    );
    assert_good(&t.dispatch(mk(Lun::ZERO, &tur())).await);
    // TMF routing.
    let tmf = |lun: Lun, function: TmfFunction| TmfRequest {
        nexus: n.clone(),
        lun,
        function,
    };
    assert_eq!(
        t.task_management(tmf(l5, TmfFunction::AbortTaskSet)).await,
        TmfResponse::IncorrectLun
    );
    assert_eq!(
        t.task_management(tmf(Lun::ZERO, TmfFunction::TargetReset))
            .await,
        TmfResponse::FunctionComplete
    );
    let m = nexus("b");
    let mut x = task(&m, &tur(), &[], 0);
    x.lun = Lun::ZERO;
    assert_ua(
        &t.dispatch(x).await,
        asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET_OCCURRED,
    );
    t.nexus_loss(&n);
}

fn start_stop(loej: bool, start: bool) -> [u8; 6] {
    [0x1b, 0, 0, 0, (u8::from(loej) << 1) | u8::from(start), 0]
}
fn prevent(p: u8) -> [u8; 6] {
    [0x1e, 0, 0, 0, p, 0]
}

#[tokio::test]
async fn removable_medium_eject_load_and_prevention() {
    let lu = lu_with(EmulatedLuConfig {
        removable: true,
        ..Default::default()
    });
    let a = ready_nexus(&lu, "a").await;
    let b = ready_nexus(&lu, "b").await;
    let d = data(&run(&lu, &a, &inquiry(false, 0, 36), &[]).await);
    assert_eq!(d[1] & 0x80, 0x80, "RMB");
    // Eject, then medium commands are NOT READY; INQUIRY still works.
    assert_good(&run(&lu, &a, &start_stop(true, false), &[]).await);
    for cdb in [
        tur().to_vec(),
        rw10(0x28, 0, 0, 1).to_vec(),
        vec![0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ] {
        assert_sense(
            &run(&lu, &b, &cdb, &[]).await,
            SenseKey::NOT_READY,
            asc::MEDIUM_NOT_PRESENT,
        );
    }
    assert_good(&run(&lu, &b, &inquiry(false, 0, 36), &[]).await);
    // PREVENT while ejected is accepted, and then load is refused too.
    assert_good(&run(&lu, &a, &prevent(1), &[]).await);
    assert_sense(
        &run(&lu, &a, &start_stop(true, true), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::MEDIUM_REMOVAL_PREVENTED,
    );
    assert_good(&run(&lu, &a, &prevent(0), &[]).await);
    assert_good(&run(&lu, &a, &start_stop(true, true), &[]).await);
    assert_good(&run(&lu, &a, &tur(), &[]).await);
    // A prevention by one nexus guards against every nexus.
    assert_good(&run(&lu, &a, &prevent(1), &[]).await);
    assert_sense(
        &run(&lu, &b, &start_stop(true, false), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::MEDIUM_REMOVAL_PREVENTED,
    );
    // START without LOEJ does not touch the medium.
    assert_good(&run(&lu, &b, &start_stop(false, false), &[]).await);
    assert_good(&run(&lu, &b, &tur(), &[]).await);
    // PREVENT 2 and 3 are refused.
    assert_sense(
        &run(&lu, &a, &prevent(2), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // The holder's nexus loss ends its prevention.
    lu.nexus_loss(&a);
    assert_good(&run(&lu, &b, &start_stop(true, false), &[]).await);
    assert_good(&run(&lu, &b, &start_stop(true, true), &[]).await);
    // A LU reset ends every prevention.
    assert_good(&run(&lu, &b, &prevent(1), &[]).await);
    let resp = lu_reset(&lu, &b).await;
    assert_eq!(resp, TmfResponse::FunctionComplete);
    assert_ua(
        &run(&lu, &b, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_good(&run(&lu, &b, &start_stop(true, false), &[]).await);
    // So does a target reset.
    assert_good(&run(&lu, &b, &start_stop(true, true), &[]).await);
    assert_good(&run(&lu, &b, &prevent(1), &[]).await);
    lu.task_management(TmfRequest {
        nexus: b.clone(),
        lun: Lun::ZERO,
        function: TmfFunction::TargetReset,
    })
    .await;
    assert_good(&run(&lu, &b, &start_stop(true, false), &[]).await);
}

#[tokio::test]
async fn fixed_medium_ignores_loej_and_prevent() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let d = data(&run(&lu, &a, &inquiry(false, 0, 36), &[]).await);
    assert_eq!(d[1] & 0x80, 0, "RMB");
    assert_good(&run(&lu, &a, &prevent(1), &[]).await);
    assert_good(&run(&lu, &a, &start_stop(true, false), &[]).await);
    assert_good(&run(&lu, &a, &tur(), &[]).await);
}

#[tokio::test]
async fn physical_block_size_sets_lbppbe() {
    let lu = lu_with(EmulatedLuConfig {
        physical_block_size: Some(4096),
        ..Default::default()
    });
    let a = ready_nexus(&lu, "a").await;
    let rc16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let d = data(&run(&lu, &a, &rc16, &[]).await);
    assert_eq!(d[13] & 0x0f, 3, "8 logical blocks per physical block");
    let bl = data(&run(&lu, &a, &inquiry(true, 0xb0, 64), &[]).await);
    assert_eq!(u16::from_be_bytes([bl[6], bl[7]]), 8, "OTLG");
    assert_eq!(
        u32::from_be_bytes([bl[28], bl[29], bl[30], bl[31]]),
        8,
        "OUG"
    );
    // Unaligned unmapping WRITE SAME still succeeds.
    assert_good(&run(&lu, &a, &rw16(0x93, 0x09, 3, 5), &[]).await);
    let plain = lu_with(EmulatedLuConfig::default());
    let z = ready_nexus(&plain, "z").await;
    let d = data(&run(&plain, &z, &rc16, &[]).await);
    assert_eq!(d[13] & 0x0f, 0);
    for bad in [256, 1536, 512 << 16] {
        let e = EmulatedLu::new(
            EmulatedLuConfig {
                physical_block_size: Some(bad),
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(BLOCKS * 512)),
        );
        assert!(
            matches!(e, Err(LuError::PhysicalBlockSize(b)) if b == bad),
            "{bad}"
        );
    }
}

fn write_atomic16(flags: u8, lba: u64, boundary: u16, n: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9c;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..12].copy_from_slice(&boundary.to_be_bytes());
    c[12..14].copy_from_slice(&n.to_be_bytes());
    c
}

#[tokio::test]
async fn write_atomic16_writes_and_refuses() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let payload: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    assert_good(&run(&lu, &a, &write_atomic16(0x18, 10, 0, 2), &payload).await);
    let back = data(&run(&lu, &a, &rw10(0x28, 0, 10, 2), &[]).await);
    assert_eq!(back, payload);
    // Zero blocks at the end is GOOD, past it out of range.
    assert_good(&run(&lu, &a, &write_atomic16(0, BLOCKS, 0, 0), &[]).await);
    for lba in [BLOCKS + 1, 1 << 63, u64::MAX] {
        assert_sense(
            &run(&lu, &a, &write_atomic16(0, lba, 0, 0), &[]).await,
            SenseKey::ILLEGAL_REQUEST,
            asc::LBA_OUT_OF_RANGE,
        );
    }
    assert_sense(
        &run(&lu, &a, &write_atomic16(0, BLOCKS - 1, 0, 2), &payload).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::LBA_OUT_OF_RANGE,
    );
    for flags in [0x20, 0xe0] {
        assert_sense(
            &run(&lu, &a, &write_atomic16(flags, 0, 0, 1), &payload[..512]).await,
            SenseKey::ILLEGAL_REQUEST,
            asc::INVALID_FIELD_IN_CDB,
        );
    }
    assert_sense(
        &run(&lu, &a, &write_atomic16(0, 0, 1, 1), &payload[..512]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    let bl = data(&run(&lu, &a, &inquiry(true, 0xb0, 64), &[]).await);
    let max_atomic = u32::from_be_bytes([bl[44], bl[45], bl[46], bl[47]]);
    let max_xfer = u32::from_be_bytes([bl[8], bl[9], bl[10], bl[11]]);
    assert!(max_atomic > 0 && max_atomic <= max_xfer);
    // REPORT SUPPORTED OPCODES lists it with DPO and FUA usable.
    let rsoc = [0xa3, 0x0c, 0x01, 0x9c, 0, 0, 0, 0, 1, 0, 0, 0];
    let d = data(&run(&lu, &a, &rsoc, &[]).await);
    assert_eq!(d[1] & 0x07, 0x03, "supported");
    assert_eq!(d[4 + 1] & 0x18, 0x18, "DPO FUA in usage data");
    let ro = lu_with(EmulatedLuConfig {
        read_only: true,
        ..Default::default()
    });
    let r = ready_nexus(&ro, "a").await;
    assert_sense(
        &run(&ro, &r, &write_atomic16(0, 0, 0, 1), &payload[..512]).await,
        SenseKey::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
}

pub(super) fn sanitize(immed: bool, sa: u8, param_len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x48;
    c[1] = (u8::from(immed) << 7) | sa;
    c[7..9].copy_from_slice(&param_len.to_be_bytes());
    c
}

pub(super) fn overwrite_params(flags: u8, pattern: &[u8]) -> Vec<u8> {
    let mut p = vec![flags, 0];
    p.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    p.extend_from_slice(pattern);
    p
}

#[tokio::test]
async fn sanitize_overwrite_erase_and_refusals() {
    let lu = lu_with(EmulatedLuConfig {
        sanitize_rate: 0,
        ..Default::default()
    });
    let a = ready_nexus(&lu, "a").await;
    // OVERWRITE with a 3-byte pattern repeated through every block.
    let p = overwrite_params(0x01, &[1, 2, 3]);
    assert_good(&run(&lu, &a, &sanitize(false, 1, p.len() as u16), &p).await);
    let expect: Vec<u8> = [1u8, 2, 3].iter().cycle().take(512).copied().collect();
    for lba in [0, BLOCKS as u32 - 1] {
        assert_eq!(
            data(&run(&lu, &a, &rw10(0x28, 0, lba, 1), &[]).await),
            expect
        );
    }
    // Two inverted passes leave the inverse.
    let p = overwrite_params(0x82, &[0x0f]);
    assert_good(&run(&lu, &a, &sanitize(false, 1, p.len() as u16), &p).await);
    assert_eq!(
        data(&run(&lu, &a, &rw10(0x28, 0, 7, 1), &[]).await),
        vec![0xf0; 512]
    );
    // BLOCK ERASE and CRYPTO ERASE: zeros, deallocated.
    for sa in [2, 3] {
        assert_good(&run(&lu, &a, &rw10(0x2a, 0, 0, 1), &[0xaa; 512]).await);
        assert_good(&run(&lu, &a, &sanitize(false, sa, 0), &[]).await);
        assert_eq!(
            data(&run(&lu, &a, &rw10(0x28, 0, 0, 1), &[]).await),
            vec![0; 512]
        );
    }
    let gls = rw16(0x9e, 0x12, 0, 0);
    let mut gls = gls;
    gls[10..14].copy_from_slice(&64u32.to_be_bytes());
    let d = data(&run(&lu, &a, &gls, &[]).await);
    assert_eq!(d[20], 1, "deallocated");
    // Refusals: service actions, lengths, parameter fields.
    let invalid = |r: &TaskResult| {
        let s = sense_of(r);
        assert_eq!(s.key, SenseKey::ILLEGAL_REQUEST, "{s:?}");
        assert!(
            s.asc == asc::INVALID_FIELD_IN_CDB || s.asc == asc::INVALID_FIELD_IN_PARAMETER_LIST,
            "{s:?}"
        );
    };
    for sa in [0, 4, 0x10, 0x1e] {
        invalid(&run(&lu, &a, &sanitize(false, sa, 0), &[]).await);
    }
    for sa in [2, 3, 0x1f] {
        invalid(&run(&lu, &a, &sanitize(false, sa, 8), &[0; 8]).await);
    }
    assert_good(&run(&lu, &a, &sanitize(false, 0x1f, 0), &[]).await);
    let full = overwrite_params(0x01, &[0xaa; 512]);
    for len in [0u16, 1, 4, 517] {
        invalid(
            &run(
                &lu,
                &a,
                &sanitize(false, 1, len),
                &vec![0; usize::from(len)],
            )
            .await,
        );
    }
    let mut zero_count = full.clone();
    zero_count[0] = 0;
    invalid(&run(&lu, &a, &sanitize(false, 1, 516), &zero_count).await);
    let mut bad_ipl = full.clone();
    bad_ipl[2..4].copy_from_slice(&0u16.to_be_bytes());
    invalid(&run(&lu, &a, &sanitize(false, 1, 516), &bad_ipl).await);
    let mut reserved = sanitize(false, 2, 0);
    reserved[1] |= 0x40;
    invalid(&run(&lu, &a, &reserved, &[]).await);
    // Listed per service action.
    for sa in [1u8, 2, 3, 0x1f] {
        let rsoc = [0xa3, 0x0c, 0x02, 0x48, 0, sa, 0, 0, 1, 0, 0, 0];
        let d = data(&run(&lu, &a, &rsoc, &[]).await);
        assert_eq!(d[1] & 0x07, 0x03, "{sa:#x} supported");
    }
    let d = data(&run(&lu, &a, &inquiry(true, 0xb1, 64), &[]).await);
    assert_eq!(d[7], 0x50, "WABEREQ WACEREQ");
    // A write-protected LU refuses it.
    let ro = lu_with(EmulatedLuConfig {
        read_only: true,
        ..Default::default()
    });
    let r = ready_nexus(&ro, "a").await;
    assert_sense(
        &run(&ro, &r, &sanitize(false, 2, 0), &[]).await,
        SenseKey::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sanitize_in_progress_refuses_commands_until_done() {
    // 4 MiB at 4 MiB/s: about a second in progress.
    let lu = lu_with(EmulatedLuConfig {
        sanitize_rate: 4 << 20,
        ..Default::default()
    });
    let a = ready_nexus(&lu, "a").await;
    let p = overwrite_params(0x01, &[0x5a]);
    assert_good(&run(&lu, &a, &sanitize(true, 1, p.len() as u16), &p).await);
    assert_sense(
        &run(&lu, &a, &tur(), &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
    );
    assert_sense(
        &run(&lu, &a, &rw10(0x28, 0, 0, 1), &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
    );
    assert_good(&run(&lu, &a, &inquiry(false, 0, 36), &[]).await);
    let s = data(&run(&lu, &a, &[0x03, 0, 0, 0, 18, 0], &[]).await);
    assert_eq!((s[2] & 0x0f, s[12], s[13]), (0x02, 0x04, 0x1b));
    // A LU reset does not stop it.
    lu.task_management(TmfRequest {
        nexus: a.clone(),
        lun: Lun::ZERO,
        function: TmfFunction::LogicalUnitReset,
    })
    .await;
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED,
    );
    assert_sense(
        &run(&lu, &a, &tur(), &[]).await,
        SenseKey::NOT_READY,
        asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
    );
    loop {
        let r = run(&lu, &a, &tur(), &[]).await;
        if r.status == Status::GOOD {
            break;
        }
        assert_sense(
            &r,
            SenseKey::NOT_READY,
            asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        data(&run(&lu, &a, &rw10(0x28, 0, BLOCKS as u32 - 1, 1), &[]).await),
        vec![0x5a; 512]
    );
}

pub(super) fn xcopy_cdb(len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&len.to_be_bytes());
    c
}

fn rcr_cdb(sa: u8, list_id: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

/// A one-segment LID1 list copying `n` blocks within the LU named `naa`.
pub(super) fn xcopy_list(list_id: u8, usage: u8, naa: u64, n: u16, src: u64, dst: u64) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    p[3] = 32;
    p[11] = 28;
    let mut cscd = vec![0u8; 32];
    cscd[0] = 0xe4;
    cscd[4] = 0x01;
    cscd[5] = 0x03;
    cscd[7] = 8;
    cscd[8..16].copy_from_slice(&naa.to_be_bytes());
    cscd[29..32].copy_from_slice(&[0, 2, 0]);
    p.extend(cscd);
    let mut seg = vec![0u8; 28];
    seg[0] = 0x02;
    seg[3] = 24;
    seg[10..12].copy_from_slice(&n.to_be_bytes());
    seg[12..20].copy_from_slice(&src.to_be_bytes());
    seg[20..28].copy_from_slice(&dst.to_be_bytes());
    p.extend(seg);
    p
}

#[tokio::test]
async fn extended_copy_and_receive_copy_results() {
    let lu = lu();
    let a = ready_nexus(&lu, "a").await;
    let payload: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    assert_good(&run(&lu, &a, &rw10(0x2a, 0, 0, 8), &payload).await);
    // No result held yet for list 5.
    assert_sense(
        &run(&lu, &a, &rcr_cdb(0, 5), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    let p = xcopy_list(5, 0, lu.naa(), 8, 0, 4000);
    assert_good(&run(&lu, &a, &xcopy_cdb(p.len() as u32), &p).await);
    assert_eq!(
        data(&run(&lu, &a, &rw10(0x28, 0, 4000, 8), &[]).await),
        payload
    );
    let s = data(&run(&lu, &a, &rcr_cdb(0, 5), &[]).await);
    assert_eq!((s[4], u16::from_be_bytes([s[5], s[6]])), (0x01, 1));
    // Another nexus does not see it.
    let b = ready_nexus(&lu, "b").await;
    assert_sense(
        &run(&lu, &b, &rcr_cdb(0, 5), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // An overlapping copy upwards keeps the source intact while copying.
    let p = xcopy_list(6, 2, lu.naa(), 8, 4000, 4004);
    assert_good(&run(&lu, &a, &xcopy_cdb(p.len() as u32), &p).await);
    assert_eq!(
        data(&run(&lu, &a, &rw10(0x28, 0, 4004, 8), &[]).await),
        payload
    );
    // Beyond the end and a foreign LU: COPY ABORTED.
    for p in [
        xcopy_list(7, 0, lu.naa(), 8, 0, BLOCKS - 1),
        xcopy_list(7, 0, lu.naa() ^ 1, 8, 0, 100),
    ] {
        let s = sense_of(&run(&lu, &a, &xcopy_cdb(p.len() as u32), &p).await);
        assert_eq!(s.key, SenseKey::COPY_ABORTED, "{s:?}");
    }
    // Held results end with the nexus.
    lu.nexus_loss(&a);
    let a = nexus("a");
    assert_ua(
        &run(&lu, &a, &tur(), &[]).await,
        asc::I_T_NEXUS_LOSS_OCCURRED,
    );
    assert_sense(
        &run(&lu, &a, &rcr_cdb(0, 5), &[]).await,
        SenseKey::ILLEGAL_REQUEST,
        asc::INVALID_FIELD_IN_CDB,
    );
    // An empty parameter list does nothing.
    assert_good(&run(&lu, &a, &xcopy_cdb(0), &[]).await);
    let op = data(&run(&lu, &a, &rcr_cdb(3, 0), &[]).await);
    assert!(op.len() >= 44);
    assert_eq!(
        u16::from_be_bytes([op[8], op[9]]),
        xcopy::MAX_CSCD_DESCRIPTORS
    );
    // VPD 0x8F is listed and served.
    let pages = data(&run(&lu, &a, &inquiry(true, 0, 64), &[]).await);
    assert!(pages[4..].contains(&0x8f));
    let tpc = data(&run(&lu, &a, &inquiry(true, 0x8f, 64), &[]).await);
    assert_eq!(tpc[1], 0x8f);
    assert_eq!(&tpc[4..6], &[0x00, 0x01]);
    // A write-protected LU refuses it.
    let ro = lu_with(EmulatedLuConfig {
        read_only: true,
        ..Default::default()
    });
    let r = ready_nexus(&ro, "a").await;
    let p = xcopy_list(1, 0, ro.naa(), 1, 0, 1);
    assert_sense(
        &run(&ro, &r, &xcopy_cdb(p.len() as u32), &p).await,
        SenseKey::DATA_PROTECT,
        asc::WRITE_PROTECTED,
    );
}

/// Every command boxes `execute`'s future. glibc's malloc serves a block of
/// up to 1,032 bytes from its per-thread cache; a bigger one goes to the
/// arena, which first consolidates its fast bins: on a 4 KiB read bridged
/// through the fabric that was 3 % of the gateway's CPU when the future
/// was 1,208 bytes (each call level of the state machine kept its own copy
/// of the `Task`).
#[test]
fn a_commands_future_fits_the_allocators_per_thread_cache() {
    let l = lu();
    let n = nexus("i");
    let read = l.execute(task(&n, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512));
    let size = std::mem::size_of_val(&*read);
    assert!(size <= 1024, "execute's future is {size} bytes");
}

/// The `BlockBackend` methods a test backend hands to its `inner`
/// [`MemoryBackend`] unchanged: size, flush, discard, write_zeroes,
/// allocation and caps.
macro_rules! delegate_to_inner {
    () => {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn flush(&self) -> Result<(), BackendError> {
            self.inner.flush()
        }
        fn discard(&self, offset: u64, len: u64) -> Result<(), BackendError> {
            self.inner.discard(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
            self.inner.write_zeroes(offset, len)
        }
        fn allocation(
            &self,
            offset: u64,
            len: u64,
        ) -> Result<crate::backend::AllocationRun, BackendError> {
            self.inner.allocation(offset, len)
        }
        fn caps(&self) -> crate::backend::BackendCaps {
            self.inner.caps()
        }
    };
}

/// A backend that hands back, from a read into uninitialised memory, a
/// buffer other than the one it was given (in its no-wait read or in
/// its blocking one).
#[derive(Debug)]
struct ForeignReads {
    inner: MemoryBackend,
    in_nowait: bool,
}

impl crate::backend::BlockBackend for ForeignReads {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read_at(offset, buf)
    }
    fn read_at_uninit<'a>(
        &self,
        _offset: u64,
        buf: &'a mut [std::mem::MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        Ok(Box::leak(vec![0x5a; buf.len()].into_boxed_slice()))
    }
    fn read_at_nowait<'a>(
        &self,
        _offset: u64,
        buf: &'a mut [std::mem::MaybeUninit<u8>],
    ) -> Result<&'a mut [u8], BackendError> {
        if self.in_nowait {
            Ok(Box::leak(vec![0x5a; buf.len()].into_boxed_slice()))
        } else {
            Ok(&mut [])
        }
    }
    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError> {
        self.inner.write_at(offset, data, fua)
    }
    delegate_to_inner!();
    fn describe(&self) -> String {
        "foreign-reads".into()
    }
}

/// A read only hands data to the host from the buffer the LU gave the
/// backend: a backend handing back another buffer fails the read with
/// HARDWARE ERROR, and none of that buffer's bytes reach the host.
#[tokio::test]
async fn a_read_backend_handing_back_another_buffer_fails_the_read() {
    for in_nowait in [false, true] {
        let lu = EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Adaptive,
                ..Default::default()
            },
            Arc::new(ForeignReads {
                inner: MemoryBackend::new(BLOCKS * 512),
                in_nowait,
            }),
        )
        .unwrap();
        let n = ready_nexus(&lu, "a").await;
        let r = run(&lu, &n, &rw10(0x28, 0, 0, 8), &[]).await;
        assert_sense(&r, SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
        assert!(
            data(&r).is_empty(),
            "in_nowait {in_nowait}: data reached the host"
        );
    }
}

/// A backend whose no-wait write takes only the first `take` bytes of
/// each write (as `pwritev2(RWF_NOWAIT)` stops short where it would have
/// to wait), recording what each path was handed.
#[derive(Debug)]
struct PartialNowait {
    inner: MemoryBackend,
    take: usize,
    /// (offset, bytes) of each no-wait write, and of each blocking one.
    nowait: std::sync::Mutex<Vec<(u64, usize)>>,
    blocking: std::sync::Mutex<Vec<(u64, usize)>>,
}

impl crate::backend::BlockBackend for PartialNowait {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read_at(offset, buf)
    }
    fn write_at_nowait(&self, offset: u64, data: &[Bytes]) -> Result<usize, BackendError> {
        let all: Vec<u8> = data.iter().flat_map(|b| b.iter().copied()).collect();
        let n = self.take.min(all.len());
        self.nowait.lock().unwrap().push((offset, all.len()));
        if n > 0 {
            self.inner
                .write_at(offset, &[Bytes::copy_from_slice(&all[..n])], false)?;
        }
        Ok(n)
    }
    fn write_at(&self, offset: u64, data: &[Bytes], fua: bool) -> Result<(), BackendError> {
        let len = data.iter().map(Bytes::len).sum();
        self.blocking.lock().unwrap().push((offset, len));
        self.inner.write_at(offset, data, fua)
    }
    delegate_to_inner!();
    fn describe(&self) -> String {
        "partial-nowait".into()
    }
}

/// A plain write goes to the backend's no-wait path first; what that path
/// did not take is written by the blocking path from the first byte it
/// left, and the medium ends up holding the whole write. A FUA write never
/// takes the no-wait path (it must reach stable storage before good
/// status), nor does a LU in `Blocking` mode.
#[tokio::test]
async fn a_write_is_split_where_the_no_wait_path_stopped() {
    for (mode, take, fua) in [
        (IoMode::Adaptive, 0, false),
        (IoMode::Adaptive, 1536, false),
        (IoMode::Adaptive, 4096, false),
        (IoMode::Adaptive, 1536, true),
        (IoMode::Blocking, 1536, false),
    ] {
        let backend = Arc::new(PartialNowait {
            inner: MemoryBackend::new(BLOCKS * 512),
            take,
            nowait: Default::default(),
            blocking: Default::default(),
        });
        let lu = EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: mode,
                ..Default::default()
            },
            backend.clone(),
        )
        .unwrap();
        let n = ready_nexus(&lu, "a").await;
        let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let flags = if fua { 0x08 } else { 0 };
        assert_good(&run(&lu, &n, &rw10(0x2a, flags, 16, 8), &payload).await);
        let nowait = backend.nowait.lock().unwrap().clone();
        let blocking = backend.blocking.lock().unwrap().clone();
        let case =
            format!("{mode:?} take {take} fua {fua}: nowait {nowait:?} blocking {blocking:?}");
        if fua || mode == IoMode::Blocking {
            assert!(nowait.is_empty(), "{case}");
            assert_eq!(blocking, vec![(16 * 512, 4096)], "{case}");
        } else {
            assert_eq!(nowait, vec![(16 * 512, 4096)], "{case}");
            if take >= 4096 {
                assert!(blocking.is_empty(), "{case}");
            } else {
                assert_eq!(
                    blocking,
                    vec![(16 * 512 + take as u64, 4096 - take)],
                    "{case}"
                );
            }
        }
        let back = data(&run(&lu, &n, &rw10(0x28, 0, 16, 8), &[]).await);
        assert_eq!(back, payload, "{case}");
    }
}

#[test]
fn skipping_bytes_cuts_across_slices() {
    let d = vec![
        Bytes::from_static(b"abc"),
        Bytes::new(),
        Bytes::from_static(b"defg"),
        Bytes::from_static(b"h"),
    ];
    let flat = |v: Vec<Bytes>| v.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>();
    for n in 0..=9 {
        let rest = skip_bytes(d.clone(), n);
        assert_eq!(
            flat(rest.clone()),
            b"abcdefgh"[n.min(8)..].to_vec(),
            "n {n}"
        );
        assert!(
            rest.iter().all(|b| !b.is_empty()) || n == 0,
            "n {n}: {rest:?}"
        );
    }
}

/// `show luns` says where a LU's plain writes run: as `io_mode` sets it,
/// and in the default adaptive mode as the backend says (memory inline, a
/// backend that may wait on the I/O threads); nowhere while the LU is
/// write-protected.
#[test]
fn a_lu_says_where_its_writes_run() {
    use crate::backend::WritePath;
    let on = |io_mode: IoMode, backend: Arc<dyn BlockBackend>| {
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode,
                ..Default::default()
            },
            backend,
        )
        .unwrap()
        .describe()
        .write_path
    };
    let memory = || Arc::new(MemoryBackend::new(BLOCKS * 512)) as Arc<dyn BlockBackend>;
    let may_wait = || Arc::new(crate::FaultyBackend::new(memory()).0) as Arc<dyn BlockBackend>;
    assert_eq!(on(IoMode::Adaptive, memory()), Some(WritePath::Inline));
    assert_eq!(on(IoMode::Adaptive, may_wait()), Some(WritePath::IoThreads));
    assert_eq!(on(IoMode::Blocking, memory()), Some(WritePath::IoThreads));
    assert_eq!(on(IoMode::Inline, may_wait()), Some(WritePath::Inline));

    // Write-protected, a LU writes nowhere, until the protection goes.
    let lu = EmulatedLu::new(
        EmulatedLuConfig {
            read_only: true,
            ..Default::default()
        },
        memory(),
    )
    .unwrap();
    assert_eq!(lu.describe().write_path, Some(WritePath::ReadOnly));
    lu.set_read_only(false).unwrap();
    assert_eq!(lu.describe().write_path, Some(WritePath::Inline));
    lu.set_read_only(true).unwrap();
    assert_eq!(lu.describe().write_path, Some(WritePath::ReadOnly));
}
