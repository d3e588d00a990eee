//! The reservation state a cluster keeps in etcd, as a member reads it
//! back: `SharedReservations::from_text` and `PortKey::from_text` never
//! panic on any text; what parses prints back to text that parses to the
//! same value; and applying it to an emulated LU that shares its
//! reservations never panics, after which PERSISTENT RESERVE IN (every
//! service action) and a READ through an unregistered nexus complete on
//! their first poll.
#![no_main]

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_scsi_core::pr::{PortKey, ReservationStore, SharedReservations};
use unifab_scsi_core::{
    BoxFuture, EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend,
    TargetPort, Task, TransportId, task::Cdb,
};

/// A store nothing is asked of (only applied versions reach the LU).
#[derive(Debug)]
struct Idle;

impl ReservationStore for Idle {
    fn member(&self) -> &str {
        "fuzz"
    }
    fn load(&self) -> BoxFuture<'static, Result<(u64, Option<String>), String>> {
        Box::pin(std::future::ready(Err("idle".into())))
    }
    fn store(&self, _: u64, _: String) -> BoxFuture<'static, Result<Option<u64>, String>> {
        Box::pin(std::future::ready(Err("idle".into())))
    }
    fn settle(&self, _: u64) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn detach(&self, _: BoxFuture<'static, ()>) {}
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(k) = PortKey::from_text(text) {
        assert_eq!(PortKey::from_text(&k.to_text()), Some(k));
    }
    let Some(s) = SharedReservations::from_text(text) else {
        return;
    };
    let again = s.to_text();
    assert_eq!(SharedReservations::from_text(&again).as_ref(), Some(&s));
    let lu = EmulatedLu::new(
        EmulatedLuConfig {
            io_mode: IoMode::Inline,
            ..EmulatedLuConfig::default()
        },
        Arc::new(MemoryBackend::new(64 * 512)),
    )
    .expect("LU");
    assert!(lu.share_reservations(Arc::new(Idle)));
    lu.apply_shared_reservations(1, Some(text))
        .expect("what parses applies");
    let nexus = ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.fuzz:host".into(),
            isid: Some([0x40, 0, 0, 0, 0, 1]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.fuzz:t,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    );
    let mut cx = Context::from_waker(Waker::noop());
    let mut cdbs: Vec<Vec<u8>> = (0u8..4)
        .map(|sa| vec![0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0])
        .collect();
    cdbs.push(vec![0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    for cdb in cdbs {
        let task =
            Task::new(nexus.clone(), Lun::ZERO, 1, Cdb::new(Bytes::from(cdb))).with_data_in(4096);
        let mut f = lu.execute(task);
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(_)));
    }
});
