//! Two switches (domains 1 and 2) joined by an FCIP tunnel over loopback
//! TCP: the VE_Ports come up (ELP, ESC, EFP, MR), FSPF routes, the
//! initiator at site A finds the target at site B through GID_FT (the
//! distributed name server), and SCSI writes and reads cross the tunnel —
//! in RFC mode, and in enhanced mode with compression and FastWrite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{INITIATOR, Sites, TARGET, build, build_with, sites, task};
use unifab_fcip::io::LinkMode;
use unifab_fcip::proto::compress;
use unifab_scsi_core::{LogicalUnit, Status};
use unifab_testkit::wan::WanProfile;

async fn io(s: &Sites) {
    let t = std::time::Instant::now();
    let r = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    eprintln!("TUR {:?} {:?}", t.elapsed(), r.status);
    eprintln!(
        "A {:?}\nB {:?}\nT {:?}",
        s.a.with_fabric(|f| f.ports()),
        s.b.with_fabric(|f| f.ports()),
        s.ta.stats()
    );
    assert!(r.status == Status::CHECK_CONDITION || r.status == Status::GOOD);
    let data = Bytes::from(
        (0..262_144u32)
            .map(|x| (x / 512 * 13 + x) as u8)
            .collect::<Vec<u8>>(),
    );
    let mut w = vec![0x2a, 0, 0, 0, 0, 16, 0, 0x02, 0, 0];
    let r = s.remote.execute(task(2, &w, Some(data.clone()), 0)).await;
    assert_eq!(
        r.status,
        Status::GOOD,
        "{r:?}\nA {:?}\nB {:?}",
        s.a.with_fabric(|f| f.ports()),
        s.b.with_fabric(|f| f.ports())
    );
    w[0] = 0x28;
    let r = s.remote.execute(task(3, &w, None, 262_144)).await;
    assert_eq!(r.status, Status::GOOD);
    let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
    assert_eq!(
        got,
        &data[..],
        "what was written through the tunnel reads back"
    );
    // Many small writes at once.
    let mut futs = Vec::new();
    for k in 0..32u32 {
        let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        c[2..6].copy_from_slice(&(4096 + k * 8).to_be_bytes());
        futs.push(s.remote.execute(task(
            100 + u64::from(k),
            &c,
            Some(Bytes::from(vec![k as u8; 4096])),
            0,
        )));
    }
    for f in futs {
        assert_eq!(f.await.status, Status::GOOD);
    }
    for k in 0..32u32 {
        let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        c[2..6].copy_from_slice(&(4096 + k * 8).to_be_bytes());
        let r = s
            .remote
            .execute(task(200 + u64::from(k), &c, None, 4096))
            .await;
        assert!(
            r.data_in
                .iter()
                .flat_map(|x| x.iter())
                .all(|b| *b == k as u8)
        );
    }
}

fn check_fabrics(s: &Sites) {
    // The distributed name server: A knows B's target, B knows A's initiator.
    let ra = s.a.with_fabric(|f| f.remote_entries());
    assert!(ra.iter().any(|e| e.port_name == TARGET), "{ra:?}");
    let rb = s.b.with_fabric(|f| f.remote_entries());
    assert!(rb.iter().any(|e| e.port_name == INITIATOR), "{rb:?}");
    assert_eq!(s.a.with_fabric(|f| f.routes()).len(), 1);
    let st = s.ta.stats();
    assert!(st.state.starts_with("up (domain 2"), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_mode_carries_scsi_between_sites() {
    common::trace();
    let t = std::time::Instant::now();
    let s = sites(LinkMode::Rfc, false, compress::Mode::None).await;
    eprintln!("up after {:?}", t.elapsed());
    check_fabrics(&s);
    io(&s).await;
    eprintln!("io after {:?}", t.elapsed());
    // The class 3 frames took the fast path, both ways at both ends, and
    // the circuits' byte counters saw them.
    for (name, st) in [("A", s.ta.stats()), ("B", s.tb.stats())] {
        assert!(st.fast_tx > 0 && st.fast_rx > 0, "site {name}: {st:?}");
        let (data_tx, data_rx) = st
            .circuits
            .iter()
            .filter(|c| c.slot > 0)
            .fold((0u64, 0u64), |(t, r), c| (t + c.tx_bytes, r + c.rx_bytes));
        // 256 KiB written and read back, and 32 × 4 KiB each way.
        assert!(
            data_tx > 256 << 10 && data_rx > 256 << 10,
            "site {name}: {st:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc_mode_fast_path_carries_many_exchanges_at_once() {
    let s = sites(LinkMode::Rfc, false, compress::Mode::None).await;
    check_fabrics(&s);
    // The first command takes the unit attention of the new nexus.
    let r = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    assert!(r.status == Status::CHECK_CONDITION || r.status == Status::GOOD);
    // 64 writes of 64 KiB in flight at once, then each read back: frames
    // of many exchanges share the circuits and the socket buffers fill, so
    // the fast path hands over to the writers and back; nothing may be
    // lost or damaged. (The order rules themselves are unit-tested in
    // `io::fast`: the FCP target here puts data in place by relative
    // offset, so an overtaking frame would not show.)
    for round in 0..4u8 {
        let mut futs = Vec::new();
        for k in 0..64u32 {
            let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 128, 0];
            c[2..6].copy_from_slice(&(k * 128).to_be_bytes());
            let data: Vec<u8> = (0..65_536u32)
                .map(|i| (i as u8) ^ (k as u8) ^ round.wrapping_mul(31))
                .collect();
            futs.push(s.remote.execute(task(
                1000 * u64::from(round) + u64::from(k),
                &c,
                Some(Bytes::from(data)),
                0,
            )));
        }
        for f in futs {
            let r = f.await;
            assert_eq!(r.status, Status::GOOD, "{r:?}");
        }
        let mut futs = Vec::new();
        let remote = &s.remote;
        for k in 0..64u32 {
            let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 128, 0];
            c[2..6].copy_from_slice(&(k * 128).to_be_bytes());
            futs.push(async move {
                (
                    k,
                    remote
                        .execute(task(
                            5000 + 1000 * u64::from(round) + u64::from(k),
                            &c,
                            None,
                            65_536,
                        ))
                        .await,
                )
            });
        }
        for f in futs {
            let (k, r) = f.await;
            assert_eq!(r.status, Status::GOOD, "{r:?}");
            let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
            assert_eq!(got.len(), 65_536);
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, b)| *b == (i as u8) ^ (k as u8) ^ round.wrapping_mul(31)),
                "write {k} of round {round} reads back wrong"
            );
        }
    }
    let (a, b) = (s.ta.stats(), s.tb.stats());
    assert!(a.fast_tx > 0 && b.fast_rx > 0, "A {a:?}\nB {b:?}");
    assert_eq!(a.dropped + b.dropped, 0, "A {a:?}\nB {b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_mode_with_fastwrite_and_compression() {
    let s = sites(LinkMode::Enhanced, true, compress::Mode::Lz4).await;
    check_fabrics(&s);
    io(&s).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let st = s.ta.stats();
    assert!(st.fastwrite, "{st:?}");
    assert!(st.fastwrite_writes >= 33, "{st:?}");
    assert!(st.wire_bytes < st.raw_bytes, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastwrite_needs_both_ends() {
    for (a, b) in [(true, false), (false, true)] {
        let s = build(LinkMode::Enhanced, (a, b), compress::Mode::None, None).await;
        io(&s).await;
        let st = s.ta.stats();
        assert!(
            !st.fastwrite && st.fastwrite_writes == 0,
            "A {a}, B {b}: {st:?}"
        );
    }
}

/// Enhanced mode acks batches late enough for the reply to carry the ack:
/// request/response traffic needs (almost) no ack batches of their own.
/// Before the delayed ack, site A sent one standalone ack for every reply
/// it received, i.e. one per write here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_carry_the_acks() {
    let s = sites(LinkMode::Enhanced, true, compress::Mode::None).await;
    let _ = s.remote.execute(task(1, &[0; 6], None, 0)).await;
    let before = s.ta.stats().standalone_acks;
    let writes = 200u32;
    let data = Bytes::from(vec![0x5a; 4096]);
    for k in 0..writes {
        let lba = (k * 8).to_be_bytes();
        let cdb = [0x2a, 0, lba[0], lba[1], lba[2], lba[3], 0, 0, 8, 0];
        let r = s
            .remote
            .execute(task(10 + u64::from(k), &cdb, Some(data.clone()), 0))
            .await;
        assert_eq!(r.status, Status::GOOD, "{r:?}");
    }
    let acks = s.ta.stats().standalone_acks - before;
    // Each write's reply reaches A, and A's next write leaves within
    // microseconds carrying the ack; a standalone one goes only when the
    // next write is more than the ack delay (1 ms) late.
    assert!(
        acks < u64::from(writes) / 2,
        "{acks} standalone acks for {writes} writes"
    );
}

/// A circuit writer that cannot keep up holds the tunnel back instead of
/// losing frames. With a one-write queue on each circuit and a slow link,
/// the tunnel finds a full writer all the time; before, it dropped what did
/// not fit: in RFC mode the exchange's frames (the command timed out), in
/// enhanced mode a numbered batch that was never sent again (the peer
/// waited for it forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_writers_hold_frames_back_and_lose_none() {
    common::trace();
    for mode in [LinkMode::Rfc, LinkMode::Enhanced] {
        let slow = WanProfile::rtt(Duration::from_micros(200), 20_000_000);
        let s = build_with(
            mode,
            (false, false),
            compress::Mode::None,
            Some(slow),
            |c| {
                c.writer_queue = 1;
            },
            |_| {},
        )
        .await;
        let done = tokio::time::timeout(Duration::from_secs(60), io(&s)).await;
        let st = s.ta.stats();
        assert!(
            done.is_ok(),
            "{mode:?}: I/O through the tunnel hung: {st:?}"
        );
        assert_eq!(st.dropped, 0, "{mode:?}: {st:?}");
    }
}
