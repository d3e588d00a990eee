//! A sick backend, seen by a host through a real iSCSI session: an
//! in-process target (the library's `TargetServer`) serves an emulated LU
//! over `FaultyBackend` beside a healthy one, and a raw iSCSI session
//! checks the exact status and sense of each fault.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use unifab_iscsi::target::server::{ServerConfig, TargetNode, TargetServer};
use unifab_iscsi::wire::{TmfCode, TmfResponseCode};
use unifab_scsi_core::sense::asc;
use unifab_scsi_core::{
    EmulatedLu, EmulatedLuConfig, Faults, FaultyBackend, IoMode, Lun, MemoryBackend, ScsiTarget,
    Sense, SenseKey,
};
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

const IQN: &str = "iqn.2026-11.io.unifab:faults";
const BS: u32 = 512;
const CHECK_CONDITION: u8 = 0x02;

struct Rig {
    addr: SocketAddr,
    faults: Faults,
    _stop: watch::Sender<bool>,
    _rt: tokio::runtime::Runtime,
}

/// LUN 0 over a faulty memory backend, LUN 1 healthy.
fn rig() -> Rig {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (faulty, faults) = FaultyBackend::new(Arc::new(MemoryBackend::new(8 << 20)));
    let cfg = |name: &str| EmulatedLuConfig {
        name: name.into(),
        io_mode: IoMode::Blocking,
        ..Default::default()
    };
    let sick = EmulatedLu::new(cfg("sick"), Arc::new(faulty)).unwrap();
    let well = EmulatedLu::new(cfg("well"), Arc::new(MemoryBackend::new(8 << 20))).unwrap();
    let scsi = Arc::new(ScsiTarget::new());
    scsi.insert(Lun(0), Arc::new(sick));
    scsi.insert(Lun::from_index(1).unwrap(), Arc::new(well));
    let node = TargetNode {
        name: IQN.into(),
        alias: None,
        scsi,
        allow: None,
        chap: None,
    };
    let (stop, stopped) = watch::channel(false);
    let addr = rt.block_on(async {
        let (server, listeners) = TargetServer::bind(
            &["127.0.0.1:0".parse().unwrap()],
            ServerConfig::default(),
            vec![node],
        )
        .await
        .unwrap();
        let addr = server.local_addrs()[0];
        tokio::spawn(async move { server.run(listeners, stopped).await });
        addr
    });
    Rig {
        addr,
        faults,
        _stop: stop,
        _rt: rt,
    }
}

fn session(r: &Rig) -> RawSession {
    session_as(r, 1)
}

/// A session with ISID …`n` (sessions of one test must differ, or a login
/// reinstates the other).
fn session_as(r: &Rig, n: u8) -> RawSession {
    let opts = RawOptions {
        timeout: Duration::from_secs(10),
        isid: [0x80, 0, 0, 0, 0, n],
        ..RawOptions::default()
    };
    RawSession::login(r.addr, IQN, &opts).unwrap()
}

fn sense(r: &CommandResult) -> Sense {
    assert_eq!(r.status, CHECK_CONDITION, "{r:?}");
    Sense::parse(&r.sense).expect("fixed or descriptor sense")
}

fn good(r: &CommandResult) {
    assert_eq!(r.status, 0, "{:?}", Sense::parse(&r.sense));
}

#[test]
fn a_read_error_names_its_lba_and_other_blocks_still_read() {
    let r = rig();
    let mut s = session(&r);
    good(&s.write16(100, &[7u8; 8 * BS as usize], BS, false).unwrap());
    // Block 103 cannot be read.
    r.faults
        .fail_reads(103 * u64::from(BS)..104 * u64::from(BS));
    let sn = sense(&s.read16(100, 8, BS).unwrap());
    assert_eq!(sn.key, SenseKey::MEDIUM_ERROR);
    assert_eq!(sn.asc, asc::UNRECOVERED_READ_ERROR);
    assert_eq!(sn.information, Some(103), "VALID and the failing LBA");
    let ok = s.read16(100, 3, BS).unwrap();
    good(&ok);
    assert_eq!(ok.data, vec![7u8; 3 * BS as usize]);
    // A write error names its LBA too.
    r.faults
        .fail_writes(205 * u64::from(BS)..206 * u64::from(BS));
    let sn = sense(&s.write16(200, &[1u8; 8 * BS as usize], BS, false).unwrap());
    assert_eq!((sn.key, sn.asc), (SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR));
    assert_eq!(sn.information, Some(205));
    assert!(r.faults.injected() >= 2);
    s.logout().unwrap();
}

#[test]
fn a_full_lu_refuses_writes_with_space_allocation_failed_and_keeps_reading() {
    let r = rig();
    let mut s = session(&r);
    r.faults.space(Some(16 * u64::from(BS)));
    good(&s.write16(0, &[3u8; 16 * BS as usize], BS, false).unwrap());
    let sn = sense(&s.write16(16, &[4u8; 8 * BS as usize], BS, false).unwrap());
    assert_eq!(sn.key, SenseKey::DATA_PROTECT);
    assert_eq!(sn.asc, asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT);
    assert_eq!(sn.information, Some(16));
    // What was written before the medium filled still reads back; the
    // refused write left nothing.
    let back = s.read16(0, 24, BS).unwrap();
    good(&back);
    assert_eq!(&back.data[..16 * BS as usize], &[3u8; 16 * BS as usize][..]);
    assert_eq!(&back.data[16 * BS as usize..], &[0u8; 8 * BS as usize][..]);
    // Space freed (the thin pool grown): writes go on.
    r.faults.space(None);
    good(&s.write16(16, &[4u8; 8 * BS as usize], BS, false).unwrap());
    s.logout().unwrap();
}

#[test]
fn after_a_failed_flush_no_flush_reports_success_and_other_lus_are_untouched() {
    let r = rig();
    let mut s = session(&r);
    good(&s.write16(0, &[5u8; 8 * BS as usize], BS, false).unwrap());
    good(&s.synchronize_cache().unwrap());
    // A write acknowledged into the cache, then the flush fails.
    good(&s.write16(8, &[6u8; 8 * BS as usize], BS, false).unwrap());
    r.faults.fail_flush(true);
    let sn = sense(&s.synchronize_cache().unwrap());
    assert_eq!((sn.key, sn.asc), (SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR));
    // The medium recovers, but the write before may be gone: later flushes
    // and FUA writes still fail; plain writes still go to the cache.
    r.faults.fail_flush(false);
    let sn = sense(&s.synchronize_cache().unwrap());
    assert_eq!((sn.key, sn.asc), (SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR));
    let sn = sense(&s.write16(16, &[7u8; 8 * BS as usize], BS, true).unwrap());
    assert_eq!((sn.key, sn.asc), (SenseKey::MEDIUM_ERROR, asc::WRITE_ERROR));
    good(&s.write16(16, &[7u8; 8 * BS as usize], BS, false).unwrap());
    s.logout().unwrap();
    // LUN 1 on the same target flushes normally.
    let mut s = session(&r);
    let lun1 = lun1_sync(&mut s);
    good(&lun1);
    s.logout().unwrap();
}

#[test]
fn a_stalled_lu_answers_a_reset_while_another_lu_keeps_its_speed() {
    let r = rig();
    let mut sick = session_as(&r, 2);
    let mut well = session_as(&r, 3);
    good(&sick.write16(0, &[9u8; 8 * BS as usize], BS, false).unwrap());
    let _ = lun1_sync(&mut well);
    // LUN 0's backend stalls: its next operation waits until released.
    r.faults.stall(true);
    let stalled = std::thread::spawn(move || {
        let res = sick.read16(0, 8, BS);
        (res, sick)
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while r.faults.stalled_operations() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the read never reached the backend"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Meanwhile LUN 1 does verified I/O: 200 write/read pairs, all while
    // LUN 0's read is still held in the stall.
    for i in 0..200u64 {
        let block = vec![(i % 251) as u8; BS as usize];
        let w = well.command_lun(1, &write16_cdb(i, 1), &block, 0).unwrap();
        good(&w);
        let rd = well.command_lun(1, &read16_cdb(i, 1), &[], BS).unwrap();
        good(&rd);
        assert_eq!(rd.data, block);
    }
    assert_eq!(
        r.faults.stalled_operations(),
        1,
        "LUN 0's read is still held"
    );
    assert!(!stalled.is_finished());
    // A LOGICAL UNIT RESET of the stalled LU, from another session: it is
    // answered once the command it aborts has left the backend (SAM-5: a
    // task in the medium is not abandoned while it may still write).
    let reset = std::thread::spawn({
        let mut admin = session_as(&r, 4);
        move || admin.task_management(TmfCode::LOGICAL_UNIT_RESET, 0, u32::MAX)
    });
    r.faults.stall(false);
    assert_eq!(
        reset.join().unwrap().unwrap(),
        TmfResponseCode::FUNCTION_COMPLETE
    );
    let (res, sick) = stalled.join().unwrap();
    // The held read was aborted by the reset (no response on the wire,
    // which the raw session reports as the session ending or a timeout),
    // or it finished first: never a wrong answer.
    if let Ok(res) = res
        && res.status == 0
    {
        assert_eq!(res.data, vec![9u8; 8 * BS as usize]);
    }
    drop(sick);
    let mut again = session_as(&r, 5);
    let back = again.read16(0, 8, BS).unwrap();
    good(&back);
    assert_eq!(back.data, vec![9u8; 8 * BS as usize]);
}

fn write16_cdb(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read16_cdb(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = write16_cdb(lba, blocks);
    c[0] = 0x88;
    c
}

/// SYNCHRONIZE CACHE(10) to LUN 1, after its power-on unit attention.
fn lun1_sync(s: &mut RawSession) -> CommandResult {
    let sync = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let first = s.command_lun(1, &sync, &[], 0).unwrap();
    if first.status == CHECK_CONDITION && sense(&first).key == SenseKey::UNIT_ATTENTION {
        return s.command_lun(1, &sync, &[], 0).unwrap();
    }
    first
}
