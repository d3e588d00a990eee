//! CDB decoding and the emulated device server under arbitrary input.
//!
//! 1. `Command::parse` never panics; a CDB that parses re-emits to exactly
//!    its first `buffer_len()` bytes (bytes after that are padding the
//!    parser ignores, which is the documented canonical form).
//! 2. The same CDB, with the rest of the input as data-out, runs through an
//!    `EmulatedLu` over a small `MemoryBackend` without panicking, and the
//!    task completes on its first poll (inline I/O, nothing else queued).
#![no_main]

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_scsi_core::{
    Command, EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun, MemoryBackend,
    ScsiTarget, TargetPort, Task, TaskAttr, TransportId, task::Cdb,
};

struct World {
    target: ScsiTarget,
    nexus: ItNexus,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let lu = EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                max_transfer_blocks: 64,
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(256 * 512)),
        )
        .expect("lu");
        let target = ScsiTarget::new();
        target.insert(Lun::ZERO, Arc::new(lu));
        let nexus = ItNexus::new(
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
        );
        World { target, nexus }
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&cdb_len, rest)) = input.split_first() else {
        return;
    };
    let cdb_len = usize::from(cdb_len % 17).min(rest.len());
    let (cdb, data) = rest.split_at(cdb_len);

    if let Ok(cmd) = Command::parse(cdb) {
        let n = cmd.buffer_len();
        assert_eq!(cmd.encode().as_ref(), &cdb[..n], "{cmd:?}");
        assert_eq!(Command::parse(cmd.encode().as_ref()), Ok(cmd));
    }

    let w = world();
    let task = Task {
        nexus: w.nexus.clone(),
        lun: Lun::ZERO,
        tag: 1,
        attr: TaskAttr::Simple,
        priority: 0,
        cdb: Cdb::new(Bytes::copy_from_slice(cdb)),
        data_out: vec![Bytes::copy_from_slice(data)],
        data_out_len: data.len() as u32,
        data_in_len: 4096,
    };
    let mut fut = w.target.dispatch(task);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => {
            if let Some(s) = &r.sense {
                assert!(unifab_scsi_core::Sense::parse(s).is_some());
            }
        }
        Poll::Pending => panic!("lone inline task did not complete"),
    }
    let _ = LogicalUnit::describe(&*w.target.get(Lun::ZERO).expect("lu"));
});
