//! CDB decoding and the emulated device server under arbitrary input.
//!
//! 1. `Command::parse` never panics; a CDB that parses re-emits to exactly
//!    its first `buffer_len()` bytes (bytes after that are padding the
//!    parser ignores, which is the documented canonical form).
//! 2. The same CDB, with the rest of the input as data-out, runs through an
//!    `EmulatedLu` over a small `MemoryBackend` without panicking, and the
//!    task completes on its first poll (inline I/O, nothing else queued).
//!    The one exception is SANITIZE without IMMED: where scsi-core's
//!    `tokio` feature is on it waits for its worker thread on a tokio
//!    timer, so it is driven to its end on a current-thread runtime.
//! 3. The same task runs through two `RemoteLu`s forwarding to that LU over
//!    a loopback initiator: one with a derived identity (VPD pages 0x80 and
//!    0x83 rebuilt, EXTENDED COPY CSCDs rewritten from the data-out), one a
//!    read-only view. Each completes on its first poll with parseable
//!    sense; the view answers anything its allow-list refuses with DATA
//!    PROTECT, WRITE PROTECTED, and a GOOD MODE SENSE through it carries WP.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_scsi_core::initiator::LoopbackFactory;
use unifab_scsi_core::remote::Identity;
use unifab_scsi_core::{
    BoxFuture, Command, Dispatch, EmulatedLu, EmulatedLuConfig, IoMode, ItNexus, LogicalUnit, Lun,
    MemoryBackend, RemoteLu, RemoteLuConfig, ScsiTarget, SenseKey, Status, TargetPort, Task,
    TaskResult, TransportId, sense::asc, task::Cdb,
};

struct World {
    rt: tokio::runtime::Runtime,
    target: ScsiTarget,
    nexus: ItNexus,
    derived: RemoteLu,
    view: RemoteLu,
}

/// Runs a task's future: inline I/O completes on the first poll; only
/// SANITIZE (0x48) without IMMED may wait, for its worker thread.
fn complete(
    rt: &tokio::runtime::Runtime,
    opcode: Option<u8>,
    mut fut: BoxFuture<'static, TaskResult>,
) -> TaskResult {
    let _in = rt.enter();
    let r = match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => r,
        Poll::Pending => {
            assert_eq!(opcode, Some(0x48), "lone inline task did not complete");
            rt.block_on(fut)
        }
    };
    if let Some(s) = &r.sense {
        assert!(unifab_scsi_core::Sense::parse(s).is_some());
    }
    r
}

fn run(rt: &tokio::runtime::Runtime, lu: &dyn LogicalUnit, task: Task) -> TaskResult {
    let opcode = task.cdb.opcode();
    complete(rt, opcode, lu.execute(task))
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let lu = EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                max_transfer_blocks: 64,
                ..Default::default()
            },
            Arc::new(MemoryBackend::new(256 * 512)),
        )
        .expect("lu");
        let lu = Arc::new(lu);
        let target = ScsiTarget::new();
        target.insert(Lun::ZERO, lu.clone());
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
        let remote = |identity: Identity, read_only: bool| {
            let factory = LoopbackFactory::new(
                lu.clone(),
                nexus.target().clone(),
                TransportId::Iscsi {
                    name: "iqn.fuzz:gateway".into(),
                    isid: Some([1; 6]),
                },
                true,
            );
            RemoteLu::new(
                RemoteLuConfig {
                    name: "remote".into(),
                    backend: "loopback".into(),
                    remote_lun: Lun::ZERO,
                    identity,
                    task_set_depth: 4,
                    read_only,
                },
                Arc::new(factory),
            )
        };
        let derived = remote(
            Identity::Derived {
                seed: "fuzz".into(),
            },
            false,
        );
        let view = remote(Identity::Passthrough, true);
        // The derived view learns the remote's NAA (from page 0x83), so
        // EXTENDED COPY lists are rewritten.
        for _ in 0..2 {
            let page_83 = Cdb::new(Bytes::from_static(&[0x12, 1, 0x83, 0x10, 0, 0]));
            let inquiry = Task::new(nexus.clone(), Lun::ZERO, 0, page_83).with_data_in(4096);
            run(&rt, &derived, inquiry);
        }
        World {
            rt,
            target,
            nexus,
            derived,
            view,
        }
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
    let task = Task::new(
        w.nexus.clone(),
        Lun::ZERO,
        1,
        Cdb::new(Bytes::copy_from_slice(cdb)),
    )
    .with_data(Bytes::copy_from_slice(data))
    .with_data_in(4096);
    let opcode = cdb.first().copied();
    complete(&w.rt, opcode, w.target.dispatch(task.clone()));
    let _ = LogicalUnit::describe(&*w.target.get(Lun::ZERO).expect("lu"));

    run(&w.rt, &w.derived, task.clone());
    let r = run(&w.rt, &w.view, task);
    let sense = r.sense.as_deref().and_then(unifab_scsi_core::Sense::parse);
    let protected = sense
        .as_ref()
        .is_some_and(|s| s.key == SenseKey::DATA_PROTECT && s.asc == asc::WRITE_PROTECTED);
    let reads = matches!(opcode, Some(0x00 | 0x03 | 0x08 | 0x12 | 0x28 | 0x88 | 0x25));
    let writes = matches!(
        opcode,
        None | Some(
            0x0a | 0x2a
                | 0x8a
                | 0xaa
                | 0x41
                | 0x93
                | 0x42
                | 0x89
                | 0x04
                | 0x48
                | 0x15
                | 0x55
                | 0x5f
        )
    );
    assert!(
        !writes || protected,
        "{cdb:02x?} passed a read-only view: {r:?}"
    );
    assert!(
        !reads || !protected,
        "{cdb:02x?} refused by a read-only view"
    );
    if r.status == Status::GOOD {
        let data: Vec<u8> = r.data_in.iter().flat_map(|b| b.iter().copied()).collect();
        let wp = match opcode {
            Some(0x1a) => data.get(2),
            Some(0x5a) => data.get(3),
            _ => None,
        };
        assert!(
            wp.is_none_or(|b| b & 0x80 != 0),
            "MODE SENSE without WP: {data:02x?}"
        );
    }
});
