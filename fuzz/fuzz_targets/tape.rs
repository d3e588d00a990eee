//! The tape drive (SSC-3) under arbitrary command sequences.
//!
//! The input is a series of commands, each a length byte, a CDB (the
//! opcode folded onto the commands a tape knows, so the fuzzer spends
//! its time past the opcode switch) and a little data-out. They run in
//! order against one `TapeLu` over a small `MemoryBackend` (its early
//! warning and end of medium within reach). No command may panic; every
//! CHECK CONDITION carries sense that parses; READ POSITION's long form
//! never reports a position past end-of-data. At the end the image is
//! opened again: whatever the commands did, it opens, and it holds the
//! objects the drive had (nothing was flushed out of order).
#![no_main]

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_scsi_core::tape::{TapeLu, TapeLuConfig};
use unifab_scsi_core::{
    BlockBackend, ItNexus, LogicalUnit, Lun, MemoryBackend, Status, TargetPort, Task, TransportId,
    task::Cdb,
};

const OPS: [u8; 28] = [
    0x00, 0x01, 0x03, 0x05, 0x08, 0x0a, 0x10, 0x11, 0x12, 0x15, 0x16, 0x17, 0x19, 0x1a, 0x1b, 0x1e,
    0x2b, 0x34, 0x44, 0x55, 0x56, 0x57, 0x5a, 0x5e, 0x5f, 0x91, 0x92, 0xa0,
];

fn nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.fuzz:i".into(),
            isid: Some([0; 6]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.fuzz:t,t,0x1".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fuzz_target!(|input: &[u8]| {
    let backend: Arc<dyn BlockBackend> = Arc::new(MemoryBackend::new(256 * 1024));
    let cfg = TapeLuConfig {
        early_warning: 32 * 1024,
        max_block: 64 * 1024,
        ..TapeLuConfig::default()
    };
    let lu = TapeLu::new(cfg.clone(), backend.clone()).expect("blank image");
    let n = nexus();
    let mut rest = input;
    let mut tag = 0u64;
    while let Some((&len, r)) = rest.split_first() {
        let cdb_len = usize::from(len % 17).min(r.len());
        let (cdb, r) = r.split_at(cdb_len);
        let out_len = r
            .first()
            .map_or(0, |b| usize::from(*b) * 64)
            .min(r.len().saturating_sub(1));
        let out = r.get(1..1 + out_len).unwrap_or(&[]);
        rest = r.get(1 + out_len..).unwrap_or(&[]);
        let mut cdb = cdb.to_vec();
        if let Some(op) = cdb.first_mut() {
            *op = OPS[usize::from(*op) % OPS.len()];
        }
        tag += 1;
        let task = Task::new(
            n.clone(),
            Lun::ZERO,
            tag,
            Cdb::new(Bytes::from(cdb.clone())),
        )
        .with_data(Bytes::copy_from_slice(out))
        .with_data_in(256 * 1024);
        let mut fut = lu.execute(task);
        let Poll::Ready(r) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("a lone tape command did not complete inline");
        };
        if r.status == Status::CHECK_CONDITION {
            let s = r.sense.as_deref().expect("CHECK CONDITION without sense");
            assert!(unifab_scsi_core::Sense::parse(s).is_some(), "{s:02x?}");
        }
        let (pos, objects) = lu.position();
        assert!(pos <= objects, "position {pos} past end-of-data {objects}");
    }
    let (_, objects) = lu.position();
    drop(lu);
    let again = TapeLu::new(cfg, backend).expect("the image opens again");
    assert_eq!(
        again.position(),
        (0, objects),
        "objects lost or found on reopen"
    );
});
