//! Bad input on one connection gets a Reject or a closed connection, never
//! a crash, while another session keeps doing verified I/O throughout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::Gateway;
use rand::{Rng, RngExt, SeedableRng};
use unifab_iscsi::wire::{
    DataOut, Digests, NopOut, Pdu, RejectReason, ScsiCommand, TaskAttrCode, encode_pdu,
};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const BS: u32 = 512;

fn config(dir: &std::path::Path) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "64MiB"

[iscsi]
listen = ["127.0.0.1:0"]
login_timeout = 2
digests = ["None", "CRC32C"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:test"
luns = ["disk"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
}

fn opts(isid_last: u8, digests: bool) -> RawOptions {
    RawOptions {
        isid: [0x80, 0, 0, 0, 0, isid_last],
        digests,
        timeout: Duration::from_secs(5),
        ..RawOptions::default()
    }
}

/// Expects a Reject with `reason` echoing the header we sent.
fn expect_reject(s: &mut RawSession, reason: RejectReason, sent_header: &[u8]) {
    let f = s.recv().expect("expected a Reject, the connection failed");
    match f.parse().unwrap() {
        Pdu::Reject(r) => {
            assert_eq!(r.reason, reason);
            assert_eq!(
                &f.data[..48],
                &sent_header[..48],
                "Reject carries the rejected header"
            );
        }
        other => panic!("expected a Reject, got {other:?}"),
    }
}

fn nop(s: &RawSession, itt: u32) -> Pdu {
    Pdu::NopOut(NopOut {
        immediate: true,
        lun: 0,
        itt,
        ttt: u32::MAX,
        cmd_sn: s.cmd_sn,
        exp_stat_sn: s.exp_stat_sn,
    })
}

#[test]
fn bad_input_is_refused_while_another_session_does_verified_io() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), &config(dir.path()));
    let (addr, iqn) = (gw.addr, gw.iqn.clone());

    // The good session: write random data, read it back, forever.
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let good = {
        let (stop, ops, iqn) = (stop.clone(), ops.clone(), iqn.clone());
        std::thread::spawn(move || {
            let mut s = RawSession::login(addr, &iqn, &opts(1, true)).unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            while !stop.load(Ordering::Relaxed) {
                let blocks = rng.random_range(1..=64u32);
                // Below the block the out-of-window probe (step 4) reads at
                // 50_000_000 / 512 = 97_656: the two must not overlap.
                let lba = rng.random_range(0..50_000u64);
                let mut data = vec![0u8; (blocks * BS) as usize];
                rng.fill_bytes(&mut data);
                let w = s
                    .write16(lba, &data, BS, false)
                    .expect("good session write");
                assert_eq!(w.status, 0, "good session write status");
                let r = s.read16(lba, blocks, BS).expect("good session read");
                assert_eq!(r.status, 0);
                assert!(r.data == data, "good session read back different data");
                ops.fetch_add(1, Ordering::Relaxed);
            }
            s.logout().unwrap();
        })
    };
    let wait_progress = |ops: &AtomicU64| {
        let before = ops.load(Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while ops.load(Ordering::Relaxed) < before + 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the good session stalled"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_progress(&ops);

    // 1. An undefined opcode: Reject (command not supported), connection stays.
    let mut s = RawSession::login(addr, &iqn, &opts(2, false)).unwrap();
    let mut bad = encode_pdu(&nop(&s, 9), &[], &[], Digests::default()).unwrap();
    bad[0] = 0x40 | 0x1c;
    s.send_raw(&bad).unwrap();
    expect_reject(&mut s, RejectReason::COMMAND_NOT_SUPPORTED, &bad);
    let r = s.read16(0, 1, BS).unwrap();
    assert_eq!(r.status, 0, "the connection still works after the Reject");
    wait_progress(&ops);

    // 2. A data segment longer than our MaxRecvDataSegmentLength: the
    //    framing cannot be trusted, the connection is closed.
    let mut s = RawSession::login(addr, &iqn, &opts(3, false)).unwrap();
    let max = s.outcome.connection.target_max_recv_data_segment_length as usize;
    let big = vec![0xaau8; max + 4];
    let pdu = encode_pdu(&nop(&s, 10), &[], &big, Digests::default()).unwrap();
    let _ = s.send_raw(&pdu);
    assert!(
        s.is_closed_by_peer(),
        "an over-long data segment must close the connection"
    );
    wait_progress(&ops);

    // 3a. A bad data digest: Reject (data digest error), connection stays.
    let mut s = RawSession::login(addr, &iqn, &opts(4, true)).unwrap();
    assert!(
        s.digests.header && s.digests.data,
        "digests were negotiated"
    );
    let mut pdu = encode_pdu(&nop(&s, 11), &[], b"ping data!!!", s.digests).unwrap();
    let n = pdu.len();
    pdu[n - 1] ^= 0xff;
    s.send_raw(&pdu).unwrap();
    expect_reject(&mut s, RejectReason::DATA_DIGEST_ERROR, &pdu);
    assert_eq!(s.read16(0, 1, BS).unwrap().status, 0);
    // 3b. A bad header digest: the connection is closed.
    let mut pdu = encode_pdu(&nop(&s, 12), &[], &[], s.digests).unwrap();
    pdu[50] ^= 0xff;
    s.send_raw(&pdu).unwrap();
    assert!(
        s.is_closed_by_peer(),
        "a header digest error must close the connection"
    );
    wait_progress(&ops);

    // 4. A CmdSN outside the window. RFC 7143 §4.2.2.1 requires the target to
    //    ignore it silently (libiscsi's iSCSICmdSnTooHigh/TooLow check that):
    //    no response, nothing executed, and the connection goes on.
    let mut s = RawSession::login(addr, &iqn, &opts(5, false)).unwrap();
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a; // WRITE(16) of LBA 0, one block: must NOT happen.
    cdb[13] = 1;
    let before = s
        .read16(50_000_000 / 512, 1, BS)
        .map(|r| r.data)
        .unwrap_or_default();
    for cmd_sn in [
        s.max_cmd_sn.wrapping_add(1),
        s.cmd_sn.wrapping_sub(1),
        s.cmd_sn.wrapping_add(1 << 30),
    ] {
        let mut c = cdb;
        c[2..10].copy_from_slice(&(50_000_000u64 / 512).to_be_bytes());
        let cmd = Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_flag: true,
            read: false,
            write: true,
            attr: TaskAttrCode::SIMPLE,
            lun: 0,
            itt: 77,
            expected_data_transfer_length: BS,
            cmd_sn,
            exp_stat_sn: s.exp_stat_sn,
            cdb: c,
        });
        s.send(&cmd, &[0x55; BS as usize]).unwrap();
    }
    s.stream()
        .set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    let mut probe = [0u8; 48];
    match s.stream().read(&mut probe) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("an out-of-window command must get no answer, got {other:?}"),
    }
    s.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let after = s.read16(50_000_000 / 512, 1, BS).unwrap();
    assert_eq!(after.status, 0, "the connection goes on");
    assert_eq!(
        after.data, before,
        "the out-of-window WRITE was not executed"
    );
    wait_progress(&ops);

    // 5. Data-Out for an ITT that names no task: Reject (invalid PDU field).
    let mut s = RawSession::login(addr, &iqn, &opts(6, false)).unwrap();
    let d = Pdu::DataOut(DataOut {
        final_flag: true,
        lun: 0,
        itt: 0xdead,
        ttt: 5,
        exp_stat_sn: s.exp_stat_sn,
        data_sn: 0,
        buffer_offset: 0,
    });
    let pdu = encode_pdu(&d, &[], &[0u8; 512], Digests::default()).unwrap();
    s.send_raw(&pdu).unwrap();
    expect_reject(&mut s, RejectReason::INVALID_PDU_FIELD, &pdu);
    assert_eq!(s.read16(0, 1, BS).unwrap().status, 0);
    wait_progress(&ops);

    // 6. A flood of half-open logins: many connections that never finish a
    //    login. Those over the login limit are dropped at once; the rest are
    //    closed when the login timeout (2 s here) runs out.
    let mut flood = Vec::new();
    for i in 0..300 {
        let mut c = TcpStream::connect(addr).unwrap();
        // Half a Login Request header.
        let _ = c.write_all(&[0x43, 0x87, 0, 0][..(i % 4) + 1]);
        flood.push(c);
    }
    wait_progress(&ops);
    std::thread::sleep(Duration::from_secs(3));
    let mut closed = 0;
    for c in &mut flood {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = [0u8; 64];
        match c.read(&mut b) {
            Ok(0) => closed += 1,
            Err(e)
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                closed += 1
            }
            _ => {}
        }
    }
    assert_eq!(
        closed,
        flood.len(),
        "every half-open login was closed by the target"
    );
    // A new login still works after the flood.
    let s = RawSession::login(addr, &iqn, &opts(7, false)).unwrap();
    s.logout().unwrap();
    wait_progress(&ops);

    stop.store(true, Ordering::Relaxed);
    good.join().expect("the good session failed");
    assert!(ops.load(Ordering::Relaxed) > 20);
}
