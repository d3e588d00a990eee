//! Deterministic tests of the full-feature-phase session.

use std::time::{Duration, Instant};

use bytes::Bytes;
use unifab_scsi_core::{
    ItNexus, Lun, Residual, Sense, SenseKey, Status, TargetPort, TaskAttr, TaskResult, TmfFunction,
    TmfResponse, TransportId, sense::asc,
};

use super::session::*;
use crate::ffp::{FfpParams, RESERVED_TAG};
use crate::wire::*;

fn nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.test:init".into(),
            isid: Some([0x40, 0, 0, 1, 0, 0]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.test:tgt,t,0x0001".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

struct Harness {
    s: Session,
    now: Instant,
    cmd_sn: u32,
}

impl Harness {
    fn new(params: FfpParams, limits: SessionLimits) -> Self {
        let now = Instant::now();
        Harness {
            s: Session::new(nexus(), 1, params, limits, 10, 100, now),
            now,
            cmd_sn: 10,
        }
    }

    fn default() -> Self {
        Self::new(FfpParams::default(), SessionLimits::default())
    }

    fn feed(&mut self, pdu: Pdu, data: &[u8]) {
        self.feed_ahs(pdu, &[], data);
    }

    fn feed_ahs(&mut self, pdu: Pdu, ahs: &[u8], data: &[u8]) {
        let wire = encode_pdu(&pdu, ahs, data, Digests::default()).unwrap();
        let framer = Framer {
            digests: Digests::default(),
            max_data_segment_length: 1 << 20,
        };
        let frame = framer
            .decode(&mut bytes::BytesMut::from(&wire[..]))
            .unwrap()
            .unwrap();
        self.s.handle_frame(self.now, frame).unwrap();
    }

    fn next_cmd_sn(&mut self) -> u32 {
        let c = self.cmd_sn;
        self.cmd_sn += 1;
        c
    }

    fn command(&mut self, itt: u32, cdb0: u8, read: u32, write: u32, imm: &[u8], final_flag: bool) {
        let cmd_sn = self.next_cmd_sn();
        let mut cdb = [0u8; 16];
        cdb[0] = cdb0;
        self.feed(
            Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_flag,
                read: read > 0,
                write: write > 0,
                attr: TaskAttrCode::SIMPLE,
                lun: 0,
                itt,
                expected_data_transfer_length: read.max(write),
                cmd_sn,
                exp_stat_sn: 0,
                cdb,
            }),
            imm,
        );
    }

    fn out(&mut self) -> Vec<OutPdu> {
        std::iter::from_fn(|| self.s.poll_transmit()).collect()
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.s.poll_event()).collect()
    }

    /// The tasks handed out since the last look, by ITT; anything else
    /// handed out fails the test.
    fn executed(&mut self) -> Vec<u32> {
        self.events()
            .iter()
            .map(|e| match e {
                Event::Execute { itt, .. } => *itt,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn execute_one(&mut self) -> (u32, unifab_scsi_core::Task) {
        let mut ev = self.events();
        assert_eq!(ev.len(), 1, "{ev:?}");
        match ev.pop() {
            Some(Event::Execute { itt, task }) => (itt, task),
            other => panic!("{other:?}"),
        }
    }
}

fn flatten(v: &[Bytes]) -> Vec<u8> {
    v.iter().flat_map(|b| b.iter().copied()).collect()
}

#[test]
fn read_is_segmented_with_status_collapsed() {
    let mut h = Harness::new(
        FfpParams {
            max_xmit_data_segment_length: 4096,
            ..FfpParams::default()
        },
        SessionLimits::default(),
    );
    h.command(7, 0x28, 10_000, 0, &[], true);
    let (itt, task) = h.execute_one();
    assert_eq!(itt, 7);
    assert_eq!(task.data_in_len, 10_000);
    assert_eq!(task.lun, Lun(0));
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    h.s.complete_task(7, TaskResult::with_data(Bytes::from(data.clone())));
    let out = h.out();
    assert_eq!(out.len(), 3);
    let mut got = Vec::new();
    for (i, o) in out.iter().enumerate() {
        let Pdu::DataIn(d) = o.pdu else {
            panic!("{o:?}")
        };
        assert_eq!(d.data_sn, i as u32);
        assert_eq!(d.buffer_offset, (i * 4096) as u32);
        assert_eq!(d.status_present, i == 2);
        assert_eq!(d.final_flag, i == 2);
        got.extend(flatten(o.data.slices()));
        if i == 2 {
            assert_eq!(d.stat_sn, 100);
            assert_eq!(d.status, 0);
            assert!(!d.overflow && !d.underflow);
            assert_eq!(d.exp_cmd_sn, 11);
        }
    }
    assert_eq!(got, data);
}

#[test]
fn read_residuals_overflow_and_underflow() {
    let mut h = Harness::default();
    // The device server produced 512 bytes; the initiator expected 200.
    h.command(1, 0x28, 200, 0, &[], true);
    h.execute_one();
    h.s.complete_task(1, TaskResult::with_data(Bytes::from(vec![1u8; 512])));
    let out = h.out();
    assert_eq!(out.len(), 1);
    let Pdu::DataIn(d) = out[0].pdu else { panic!() };
    assert!(d.status_present && d.overflow && !d.underflow);
    assert_eq!(d.residual_count, 312);
    assert_eq!(out[0].data.len(), 200);

    // 10000 expected, 512 produced.
    h.command(2, 0x28, 10_000, 0, &[], true);
    h.execute_one();
    h.s.complete_task(2, TaskResult::with_data(Bytes::from(vec![1u8; 512])));
    let Pdu::DataIn(d) = h.out()[0].pdu else {
        panic!()
    };
    assert!(d.underflow && d.residual_count == 9488);

    // Nothing expected at all: SCSI Response with overflow.
    h.command(3, 0x28, 0, 0, &[], true);
    h.execute_one();
    h.s.complete_task(3, TaskResult::with_data(Bytes::from(vec![1u8; 512])));
    let out = h.out();
    let Pdu::ScsiResponse(r) = out[0].pdu else {
        panic!()
    };
    assert!(r.overflow && r.residual_count == 512);
    assert!(out[0].data.is_empty());
}

#[test]
fn check_condition_carries_sense_length_prefix() {
    let mut h = Harness::default();
    h.command(1, 0x28, 512, 0, &[], true);
    h.execute_one();
    let sense = Sense::new(SenseKey::ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE);
    h.s.complete_task(1, TaskResult::check_condition(sense));
    let out = h.out();
    assert_eq!(out.len(), 1);
    let Pdu::ScsiResponse(r) = out[0].pdu else {
        panic!()
    };
    assert_eq!(r.status, Status::CHECK_CONDITION.0);
    assert!(r.underflow);
    assert_eq!(r.residual_count, 512);
    let d = flatten(out[0].data.slices());
    assert_eq!(&d[..2], &[0, 18]);
    assert_eq!(
        Sense::parse(&d[2..]).map(|s| s.asc),
        Some(asc::LBA_OUT_OF_RANGE)
    );
}

#[test]
fn write_with_immediate_data_and_r2ts() {
    let params = FfpParams {
        max_recv_data_segment_length: 65536,
        max_burst_length: 131_072,
        first_burst_length: 65_536,
        initial_r2t: true,
        max_outstanding_r2t: 2,
        ..FfpParams::default()
    };
    let mut h = Harness::new(params, SessionLimits::default());
    let total = 300_000u32;
    let data: Vec<u8> = (0..total).map(|i| (i * 13) as u8).collect();
    h.command(9, 0x2a, 0, total, &data[..8192], true);
    assert!(h.events().is_empty(), "no execution before the data is in");
    let r2ts: Vec<R2t> = h
        .out()
        .into_iter()
        .map(|o| match o.pdu {
            Pdu::R2t(r) => r,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(r2ts.len(), 2);
    assert_eq!(
        (r2ts[0].buffer_offset, r2ts[0].desired_data_transfer_length),
        (8192, 131_072)
    );
    assert_eq!(
        (r2ts[1].buffer_offset, r2ts[1].desired_data_transfer_length),
        (139_264, 131_072)
    );
    assert_eq!((r2ts[0].r2t_sn, r2ts[1].r2t_sn), (0, 1));
    assert_ne!(r2ts[0].ttt, r2ts[1].ttt);
    // Answer each R2T in 64 KiB Data-Outs.
    let answer = |h: &mut Harness, r: R2t| {
        let mut off = r.buffer_offset;
        let end = r.buffer_offset + r.desired_data_transfer_length;
        let mut sn = 0;
        while off < end {
            let len = (end - off).min(65536);
            h.feed(
                Pdu::DataOut(DataOut {
                    final_flag: off + len == end,
                    lun: 0,
                    itt: 9,
                    ttt: r.ttt,
                    exp_stat_sn: 0,
                    data_sn: sn,
                    buffer_offset: off,
                }),
                &data[off as usize..(off + len) as usize],
            );
            sn += 1;
            off += len;
        }
    };
    answer(&mut h, r2ts[0]);
    // The first burst done: a third R2T for the rest.
    let more = h.out();
    assert_eq!(more.len(), 1);
    let Pdu::R2t(r3) = more[0].pdu else { panic!() };
    assert_eq!(
        (r3.buffer_offset, r3.desired_data_transfer_length, r3.r2t_sn),
        (270_336, 29_664, 2)
    );
    answer(&mut h, r2ts[1]);
    answer(&mut h, r3);
    let (itt, task) = h.execute_one();
    assert_eq!(itt, 9);
    assert_eq!(task.data_out_len, total);
    assert_eq!(flatten(&task.data_out), data);
    h.s.complete_task(9, TaskResult::good());
    let out = h.out();
    let Pdu::ScsiResponse(r) = out[0].pdu else {
        panic!()
    };
    assert_eq!(r.status, 0);
    assert!(!r.overflow && !r.underflow);
}

/// A write whose data comes one byte per Data-Out is held as a few
/// coalesced buffers, not one slice per byte; a long Data-Out between
/// them stays a slice of its own; the bytes and their order are exact.
#[test]
fn tiny_data_outs_are_coalesced_and_long_ones_kept() {
    let params = FfpParams {
        max_recv_data_segment_length: 65536,
        max_burst_length: 65536,
        initial_r2t: true,
        immediate_data: false,
        ..FfpParams::default()
    };
    let mut h = Harness::new(params, SessionLimits::default());
    let total = 8192u32;
    let data: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
    h.command(5, 0x2a, 0, total, &[], true);
    let out = h.out();
    let Pdu::R2t(r) = out[0].pdu else {
        panic!("{:?}", out[0].pdu)
    };
    assert_eq!(
        (r.buffer_offset, r.desired_data_transfer_length),
        (0, total)
    );
    // 100 single bytes, one 4 KiB Data-Out, then single bytes to the end.
    let mut pieces: Vec<(u32, u32)> = (0..100).map(|o| (o, 1)).collect();
    pieces.push((100, 4096));
    pieces.extend((4196..total).map(|o| (o, 1)));
    for (sn, &(off, len)) in pieces.iter().enumerate() {
        h.feed(
            Pdu::DataOut(DataOut {
                final_flag: off + len == total,
                lun: 0,
                itt: 5,
                ttt: r.ttt,
                exp_stat_sn: 0,
                data_sn: sn as u32,
                buffer_offset: off,
            }),
            &data[off as usize..(off + len) as usize],
        );
    }
    let (_, task) = h.execute_one();
    assert_eq!(flatten(&task.data_out), data);
    let lens: Vec<usize> = task.data_out.iter().map(Bytes::len).collect();
    assert_eq!(lens, vec![100, 4096, 3996]);
}

#[test]
fn unsolicited_data_out_when_initial_r2t_is_no() {
    let params = FfpParams {
        initial_r2t: false,
        first_burst_length: 16384,
        max_recv_data_segment_length: 8192,
        ..FfpParams::default()
    };
    let mut h = Harness::new(params, SessionLimits::default());
    let data = vec![0x5au8; 20000];
    h.command(3, 0x2a, 0, 20000, &data[..4096], false);
    assert!(
        h.out().is_empty(),
        "no R2T while unsolicited data is still coming"
    );
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: false,
            lun: 0,
            itt: 3,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 4096,
        }),
        &data[4096..12288],
    );
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 3,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            data_sn: 1,
            buffer_offset: 12288,
        }),
        &data[12288..16384],
    );
    let out = h.out();
    assert_eq!(out.len(), 1);
    let Pdu::R2t(r) = out[0].pdu else { panic!() };
    assert_eq!(
        (r.buffer_offset, r.desired_data_transfer_length),
        (16384, 3616)
    );
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 3,
            ttt: r.ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 16384,
        }),
        &data[16384..],
    );
    let (_, task) = h.execute_one();
    assert_eq!(flatten(&task.data_out), data);
}

#[test]
fn protocol_errors_on_the_command_are_rejected() {
    // Immediate data when ImmediateData=No.
    let mut h = Harness::new(
        FfpParams {
            immediate_data: false,
            ..FfpParams::default()
        },
        SessionLimits::default(),
    );
    h.command(1, 0x2a, 0, 512, &[0; 512], true);
    let out = h.out();
    let Pdu::Reject(r) = out[0].pdu else {
        panic!("{out:?}")
    };
    assert_eq!(r.reason, RejectReason::PROTOCOL_ERROR);
    assert_eq!(out[0].data.len(), 48);
    assert!(h.events().is_empty());

    // F=0 with InitialR2T=Yes.
    let mut h = Harness::default();
    h.command(1, 0x2a, 0, 512, &[], false);
    assert!(matches!(h.out()[0].pdu, Pdu::Reject(_)));

    // An ITT already in use.
    let mut h = Harness::default();
    h.command(5, 0x00, 0, 0, &[], true);
    h.command(5, 0x00, 0, 0, &[], true);
    let out = h.out();
    let Pdu::Reject(r) = out[0].pdu else { panic!() };
    assert_eq!(r.reason, RejectReason::TASK_IN_PROGRESS);
}

#[test]
fn data_out_errors() {
    let mut h = Harness::default();
    // Unknown ITT.
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 77,
            ttt: 5,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        }),
        &[0; 512],
    );
    let out = h.out();
    let Pdu::Reject(r) = out[0].pdu else { panic!() };
    assert_eq!(r.reason, RejectReason::INVALID_PDU_FIELD);

    // Wrong DataSN: Reject and CHECK CONDITION, nothing executed.
    h.command(8, 0x2a, 0, 1024, &[], true);
    let Pdu::R2t(r2t) = h.out()[0].pdu else {
        panic!()
    };
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: false,
            lun: 0,
            itt: 8,
            ttt: r2t.ttt,
            exp_stat_sn: 0,
            data_sn: 27,
            buffer_offset: 0,
        }),
        &[0; 512],
    );
    let out = h.out();
    assert!(matches!(out[0].pdu, Pdu::Reject(_)));
    let Pdu::ScsiResponse(rsp) = out[1].pdu else {
        panic!("{out:?}")
    };
    assert_eq!(rsp.status, Status::CHECK_CONDITION.0);
    assert!(h.events().is_empty());
    assert_eq!(h.s.task_count(), 0);
    // The rest of that write is dropped quietly.
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 8,
            ttt: r2t.ttt,
            exp_stat_sn: 0,
            data_sn: 1,
            buffer_offset: 512,
        }),
        &[0; 512],
    );
    assert!(h.out().is_empty());
}

#[test]
fn cmd_sn_window() {
    let mut h = Harness::new(
        FfpParams::default(),
        SessionLimits {
            queue_depth: 4,
            ..SessionLimits::default()
        },
    );
    assert_eq!(h.s.cmd_window(), (10, 13));
    // Too low and too high are ignored silently.
    let mut cdb = [0u8; 16];
    cdb[0] = 0;
    for cmd_sn in [9u32, 14, 1000] {
        h.feed(
            Pdu::ScsiCommand(ScsiCommand {
                final_flag: true,
                itt: 50 + cmd_sn,
                cmd_sn,
                cdb,
                ..ScsiCommand::default()
            }),
            &[],
        );
    }
    assert!(h.out().is_empty());
    assert!(h.events().is_empty());
    // Four commands fill the window; responses show MaxCmdSN moving.
    for itt in 0..4 {
        h.command(itt, 0, 0, 0, &[], true);
    }
    assert_eq!(h.events().len(), 4);
    assert_eq!(h.s.cmd_window(), (14, 13), "window closed");
    h.s.complete_task(0, TaskResult::good());
    let Pdu::ScsiResponse(r) = h.out()[0].pdu else {
        panic!()
    };
    assert_eq!((r.exp_cmd_sn, r.max_cmd_sn), (14, 14));
    // A command ahead of ExpCmdSN waits for the gap to fill.
    h.s.complete_task(1, TaskResult::good());
    h.s.complete_task(2, TaskResult::good());
    h.out();
    assert_eq!(h.s.cmd_window(), (14, 16));
    h.cmd_sn = 15;
    h.command(20, 0, 0, 0, &[], true);
    assert!(h.events().is_empty());
    h.cmd_sn = 14;
    h.command(21, 0, 0, 0, &[], true);
    assert_eq!(h.executed(), vec![21, 20]);
}

/// Commands waiting ahead of ExpCmdSN hold their immediate data in memory:
/// with what the writes in progress hold, they stay within the write
/// budget. One that does not fit is not kept (the gap's recovery resends
/// it), and the ones kept run, in order, once the gap fills.
#[test]
fn commands_ahead_of_the_window_are_bounded_by_the_write_budget() {
    let params = FfpParams {
        max_recv_data_segment_length: 65536,
        first_burst_length: 65_536,
        initial_r2t: true,
        ..FfpParams::default()
    };
    let limits = SessionLimits {
        write_buffer_budget: 100_000,
        ..SessionLimits::default()
    };
    let mut h = Harness::new(params, limits);
    let data = vec![0x5au8; 40_000];
    // CmdSN `gap` goes missing (say, lost to a data digest error).
    let gap = h.next_cmd_sn();
    h.command(1, 0x2a, 0, 40_000, &data, true); // kept: 40,048 bytes
    h.command(2, 0x2a, 0, 40_000, &data, true); // kept: 80,096 in all
    h.command(3, 0x2a, 0, 40_000, &data, true); // 120,144: not kept
    h.command(4, 0x28, 512, 0, &[], true); // 48 bytes: kept
    assert!(h.events().is_empty(), "nothing runs before the gap fills");
    assert!(h.out().is_empty());

    // The gap fills: the kept commands follow it, in CmdSN order.
    h.cmd_sn = gap;
    h.command(5, 0x28, 512, 0, &[], true);
    let itts = h.executed();
    assert_eq!(itts, vec![5, 1, 2], "3 was not kept; 4 waits behind it");

    // The initiator resends 3 (its data then counts as a write in
    // progress) and 4 runs after it.
    for itt in [5, 1, 2] {
        h.s.complete_task(itt, TaskResult::good());
    }
    h.out();
    h.cmd_sn = gap + 3;
    h.command(3, 0x2a, 0, 40_000, &data, true);
    let itts = h.executed();
    assert_eq!(itts, vec![3, 4]);
}

#[test]
fn ordered_tasks_wait_for_older_data() {
    let mut h = Harness::default();
    h.command(1, 0x2a, 0, 512, &[], true); // waits for R2T data
    let Pdu::R2t(r2t) = h.out()[0].pdu else {
        panic!()
    };
    // A SIMPLE read may pass it.
    h.command(2, 0x28, 512, 0, &[], true);
    assert_eq!(h.events().len(), 1);
    // An ORDERED command may not, nor anything after it.
    let cmd_sn = h.next_cmd_sn();
    h.feed(
        Pdu::ScsiCommand(ScsiCommand {
            final_flag: true,
            attr: TaskAttrCode::ORDERED,
            itt: 3,
            cmd_sn,
            ..ScsiCommand::default()
        }),
        &[],
    );
    h.command(4, 0x28, 512, 0, &[], true);
    assert!(h.events().is_empty());
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 1,
            ttt: r2t.ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        }),
        &[0; 512],
    );
    let ev = h.events();
    let order: Vec<(u32, TaskAttr)> = ev
        .iter()
        .map(|e| match e {
            Event::Execute { itt, task } => (*itt, task.attr),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        order,
        vec![
            (1, TaskAttr::Simple),
            (3, TaskAttr::Ordered),
            (4, TaskAttr::Simple)
        ]
    );
}

#[test]
fn abort_task_running_and_finished() {
    let mut h = Harness::default();
    h.command(1, 0x2a, 0, 512, &[7; 512], true);
    h.execute_one();
    let cmd_sn = h.cmd_sn;
    h.feed(
        Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: TmfCode::ABORT_TASK,
            itt: 100,
            referenced_task_tag: 1,
            cmd_sn,
            ref_cmd_sn: 10,
            ..TaskMgmtRequest::default()
        }),
        &[],
    );
    let ev = h.events();
    match &ev[..] {
        [Event::TaskManagement { itt: 100, request }] => {
            assert_eq!(request.function, TmfFunction::AbortTask { tag: 1 });
        }
        other => panic!("{other:?}"),
    }
    // The LU finishes the write anyway: no response may go out.
    h.s.complete_task(1, TaskResult::good());
    assert!(h.out().is_empty());
    h.s.complete_tmf(100, TmfResponse::FunctionComplete);
    let out = h.out();
    assert_eq!(out.len(), 1);
    let Pdu::TaskMgmtResponse(r) = out[0].pdu else {
        panic!()
    };
    assert_eq!(r.response, TmfResponseCode::FUNCTION_COMPLETE);

    // A task already answered: "Task does not exist".
    h.command(2, 0, 0, 0, &[], true);
    h.execute_one();
    h.s.complete_task(2, TaskResult::good());
    h.out();
    h.feed(
        Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: TmfCode::ABORT_TASK,
            itt: 101,
            referenced_task_tag: 2,
            cmd_sn: h.cmd_sn,
            ref_cmd_sn: h.cmd_sn - 1,
            ..TaskMgmtRequest::default()
        }),
        &[],
    );
    let Pdu::TaskMgmtResponse(r) = h.out()[0].pdu else {
        panic!()
    };
    assert_eq!(r.response, TmfResponseCode::TASK_DOES_NOT_EXIST);
    assert!(h.events().is_empty());
}

#[test]
fn lu_reset_waits_for_its_tasks() {
    let mut h = Harness::default();
    h.command(1, 0x28, 512, 0, &[], true);
    h.command(2, 0x2a, 0, 4096, &[], true); // collecting data
    h.events();
    h.out();
    h.feed(
        Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: TmfCode::LOGICAL_UNIT_RESET,
            itt: 9,
            referenced_task_tag: RESERVED_TAG,
            cmd_sn: h.cmd_sn,
            ..TaskMgmtRequest::default()
        }),
        &[],
    );
    assert!(matches!(h.events()[..], [Event::TaskManagement { .. }]));
    // The write that never reached the LU ended at once, silently.
    assert_eq!(h.s.task_count(), 1);
    h.s.complete_tmf(9, TmfResponse::FunctionComplete);
    assert!(
        h.out().is_empty(),
        "TMF response waits for the running read"
    );
    h.s.complete_task(1, TaskResult::aborted());
    let out = h.out();
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0].pdu, Pdu::TaskMgmtResponse(_)));
}

/// TMFs waiting for the LU are bounded: past the bound an immediate one
/// is rejected and a non-immediate one answered "Function rejected" at
/// once, without reaching the LU; once one is answered, the next goes
/// through again.
#[test]
fn waiting_task_management_functions_are_bounded() {
    let mut h = Harness::default();
    let tmf = |itt: u32, immediate: bool, cmd_sn: u32| {
        Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate,
            function: TmfCode::QUERY_TASK_SET,
            itt,
            referenced_task_tag: RESERVED_TAG,
            cmd_sn,
            ..TaskMgmtRequest::default()
        })
    };
    for itt in 0..MAX_PENDING_TMFS as u32 {
        h.feed(tmf(100 + itt, true, h.cmd_sn), &[]);
    }
    assert_eq!(h.events().len(), MAX_PENDING_TMFS);
    assert!(h.out().is_empty());
    // One more, immediate: a Reject, nothing for the LU.
    h.feed(tmf(1000, true, h.cmd_sn), &[]);
    assert!(h.events().is_empty());
    let out = h.out();
    assert_eq!(out.len(), 1);
    match &out[0].pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::IMMEDIATE_COMMAND_REJECT),
        other => panic!("{other:?}"),
    }
    // Non-immediate: its CmdSN is spent, so it gets an answer.
    let sn = h.next_cmd_sn();
    h.feed(tmf(1001, false, sn), &[]);
    assert!(h.events().is_empty());
    let out = h.out();
    assert_eq!(out.len(), 1);
    match &out[0].pdu {
        Pdu::TaskMgmtResponse(r) => {
            assert_eq!(r.itt, 1001);
            assert_eq!(r.response, TmfResponseCode::FUNCTION_REJECTED);
        }
        other => panic!("{other:?}"),
    }
    // One answered: room for the next.
    h.s.complete_tmf(100, TmfResponse::FunctionComplete);
    assert_eq!(h.out().len(), 1);
    h.feed(tmf(1002, true, h.cmd_sn), &[]);
    assert!(matches!(
        h.events()[..],
        [Event::TaskManagement { itt: 1002, .. }]
    ));
}

#[test]
fn nop_echo_and_ping_timeout() {
    let limits = SessionLimits {
        nop_in_interval: Some(Duration::from_secs(5)),
        nop_in_timeout: Duration::from_secs(3),
        ..SessionLimits::default()
    };
    let mut h = Harness::new(FfpParams::default(), limits);
    let cmd_sn = h.cmd_sn;
    h.feed(
        Pdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: 4,
            ttt: RESERVED_TAG,
            cmd_sn,
            exp_stat_sn: 0,
        }),
        b"ping",
    );
    let out = h.out();
    let Pdu::NopIn(n) = out[0].pdu else { panic!() };
    assert_eq!((n.itt, n.ttt, n.stat_sn), (4, RESERVED_TAG, 100));
    assert_eq!(flatten(out[0].data.slices()), b"ping");

    let t0 = h.now;
    assert_eq!(h.s.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    h.s.handle_timeout(t0 + Duration::from_secs(5));
    let out = h.out();
    let Pdu::NopIn(ping) = out[0].pdu else {
        panic!()
    };
    assert_ne!(ping.ttt, RESERVED_TAG);
    assert_eq!(ping.itt, RESERVED_TAG);
    assert_eq!(ping.stat_sn, 101, "a ping does not advance StatSN");
    // Answered: no close.
    h.feed(
        Pdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: RESERVED_TAG,
            ttt: ping.ttt,
            cmd_sn: h.cmd_sn,
            exp_stat_sn: 101,
        }),
        &[],
    );
    h.s.handle_timeout(t0 + Duration::from_secs(8));
    assert!(h.events().is_empty());
    // Next ping goes unanswered.
    h.now = t0 + Duration::from_secs(6);
    h.s.handle_timeout(t0 + Duration::from_secs(30));
    h.out();
    h.s.handle_timeout(t0 + Duration::from_secs(40));
    assert!(matches!(
        h.events()[..],
        [Event::Close(CloseReason::PingTimeout)]
    ));
    assert!(h.s.is_closed());
}

/// An initiator that reads nothing for a minute after a command (libiscsi's
/// test tool sleeps 60 s between TEST UNIT READYs while a SANITIZE runs)
/// is pinged but not dropped by the default limits; it answers the ping
/// when it wakes. Dropping it just then made it log in again as a new
/// I_T nexus, with a new POWER ON unit attention, before every command.
#[test]
fn default_limits_keep_an_initiator_that_sleeps_a_minute() {
    let mut h = Harness::default();
    let t0 = h.now;
    let ping_at = h.s.poll_timeout().expect("an idle connection is pinged");
    h.s.handle_timeout(ping_at);
    let out = h.out();
    let Pdu::NopIn(ping) = out[0].pdu else {
        panic!("{:?}", out[0].pdu)
    };
    let woke = t0 + Duration::from_secs(61);
    assert!(
        h.s.poll_timeout().is_some_and(|t| t > woke),
        "the ping's deadline falls after the initiator wakes"
    );
    h.s.handle_timeout(woke);
    assert!(h.events().is_empty() && !h.s.is_closed());
    h.now = woke;
    h.feed(
        Pdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: RESERVED_TAG,
            ttt: ping.ttt,
            cmd_sn: h.cmd_sn,
            exp_stat_sn: ping.stat_sn,
        }),
        &[],
    );
    h.s.handle_timeout(t0 + Duration::from_secs(120));
    assert!(
        !h.events()
            .iter()
            .any(|e| matches!(e, Event::Close(CloseReason::PingTimeout)))
    );
}

#[test]
fn logout_waits_for_running_tasks() {
    let mut h = Harness::default();
    h.command(1, 0x28, 512, 0, &[], true);
    h.execute_one();
    let cmd_sn = h.cmd_sn;
    h.feed(
        Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CLOSE_SESSION,
            itt: 2,
            cid: 1,
            cmd_sn,
            exp_stat_sn: 0,
        }),
        &[],
    );
    assert!(h.out().is_empty());
    // New commands are refused meanwhile.
    h.command(3, 0, 0, 0, &[], true);
    let Pdu::Reject(r) = h.out()[0].pdu else {
        panic!()
    };
    assert_eq!(r.reason, RejectReason::WAITING_FOR_LOGOUT);
    h.s.complete_task(1, TaskResult::with_data(Bytes::from(vec![0u8; 512])));
    let out = h.out();
    assert!(matches!(out[0].pdu, Pdu::DataIn(_)));
    let Pdu::LogoutResponse(l) = out[1].pdu else {
        panic!()
    };
    assert_eq!(l.response, 0);
    assert!(matches!(
        h.events()[..],
        [Event::Close(CloseReason::Logout)]
    ));
}

#[test]
fn write_budget_throttles_r2ts() {
    let params = FfpParams {
        max_burst_length: 65536,
        max_outstanding_r2t: 4,
        ..FfpParams::default()
    };
    let limits = SessionLimits {
        write_buffer_budget: 100_000,
        ..SessionLimits::default()
    };
    let mut h = Harness::new(params, limits);
    h.command(1, 0x2a, 0, 65536, &[], true);
    h.command(2, 0x2a, 0, 65536, &[], true);
    let out = h.out();
    assert_eq!(out.len(), 1, "the second write waits for budget");
    let Pdu::R2t(r) = out[0].pdu else { panic!() };
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 1,
            ttt: r.ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        }),
        &vec![0u8; 65536],
    );
    h.execute_one();
    assert!(h.out().is_empty());
    h.s.complete_task(1, TaskResult::good());
    let out = h.out();
    assert!(matches!(out[0].pdu, Pdu::ScsiResponse(_)));
    let Pdu::R2t(r2) = out[1].pdu else {
        panic!("{out:?}")
    };
    assert_eq!(r2.itt, 2);
}

#[test]
fn write_residual_from_the_lu_is_reported() {
    let mut h = Harness::default();
    h.command(1, 0x2a, 0, 200, &[1; 200], true);
    h.execute_one();
    h.s.complete_task(
        1,
        TaskResult {
            residual: Some(Residual::Overflow(312)),
            ..TaskResult::good()
        },
    );
    let Pdu::ScsiResponse(r) = h.out()[0].pdu else {
        panic!()
    };
    assert!(r.overflow && r.residual_count == 312);
}

#[test]
fn unknown_opcode_and_snack_are_rejected() {
    let mut h = Harness::default();
    let mut bhs = [0u8; 48];
    bhs[0] = 0x1c;
    let framer = Framer::default();
    let frame = framer
        .decode(&mut bytes::BytesMut::from(&bhs[..]))
        .unwrap()
        .unwrap();
    h.s.handle_frame(h.now, frame).unwrap();
    let Pdu::Reject(r) = h.out()[0].pdu else {
        panic!()
    };
    assert_eq!(r.reason, RejectReason::COMMAND_NOT_SUPPORTED);
    h.feed(Pdu::SnackRequest(SnackRequest::default()), &[]);
    let Pdu::Reject(r) = h.out()[0].pdu else {
        panic!()
    };
    assert_eq!(r.reason, RejectReason::PROTOCOL_ERROR);
}

#[test]
fn extended_cdb_from_ahs() {
    let mut h = Harness::default();
    let mut cdb = [0u8; 16];
    cdb[0] = 0x7f;
    let ext = Ahs::extended_cdb(&[0xaa; 16]);
    let mut ahs = Vec::new();
    ext.emit(&mut ahs);
    let cmd_sn = h.next_cmd_sn();
    h.feed_ahs(
        Pdu::ScsiCommand(ScsiCommand {
            final_flag: true,
            itt: 1,
            cmd_sn,
            cdb,
            ..ScsiCommand::default()
        }),
        &ahs,
        &[],
    );
    let (_, task) = h.execute_one();
    assert_eq!(task.cdb.len(), 32);
    assert_eq!(task.cdb.as_bytes()[0], 0x7f);
    assert_eq!(task.cdb.as_bytes()[31], 0xaa);
}

#[test]
fn text_requests_gather_continuations_and_page_long_answers() {
    let mut h = Harness::new(
        FfpParams {
            max_xmit_data_segment_length: 512,
            ..FfpParams::default()
        },
        SessionLimits::default(),
    );
    let cmd_sn = h.next_cmd_sn();
    h.feed(
        Pdu::TextRequest(TextRequest {
            final_flag: false,
            continue_flag: true,
            itt: 5,
            ttt: RESERVED_TAG,
            cmd_sn,
            ..TextRequest::default()
        }),
        b"SendTar",
    );
    let out = h.out();
    let Pdu::TextResponse(r) = out[0].pdu else {
        panic!()
    };
    assert!(!r.final_flag && out[0].data.is_empty());
    assert!(h.events().is_empty());
    let cmd_sn = h.next_cmd_sn();
    h.feed(
        Pdu::TextRequest(TextRequest {
            final_flag: true,
            continue_flag: false,
            itt: 5,
            ttt: RESERVED_TAG,
            cmd_sn,
            ..TextRequest::default()
        }),
        b"gets=All\0",
    );
    let ev = h.events();
    let Event::Text { itt, data } = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!((*itt, &data[..]), (5, &b"SendTargets=All\0"[..]));
    // A 1300-byte answer goes out in three pieces of at most 512.
    let answer: Vec<u8> = (0..1300u32).map(|i| b'a' + (i % 26) as u8).collect();
    h.s.text_response(5, Bytes::from(answer.clone()));
    let mut got = Vec::new();
    loop {
        let out = h.out();
        assert_eq!(out.len(), 1);
        let Pdu::TextResponse(r) = out[0].pdu else {
            panic!()
        };
        assert!(out[0].data.len() <= 512);
        got.extend(flatten(out[0].data.slices()));
        if r.final_flag {
            assert_eq!(r.ttt, RESERVED_TAG);
            assert!(!r.continue_flag);
            break;
        }
        assert!(r.continue_flag && r.ttt != RESERVED_TAG);
        let cmd_sn = h.next_cmd_sn();
        h.feed(
            Pdu::TextRequest(TextRequest {
                final_flag: true,
                itt: 5,
                ttt: r.ttt,
                cmd_sn,
                ..TextRequest::default()
            }),
            &[],
        );
    }
    assert_eq!(got, answer);
    // A stale TTT is refused.
    let cmd_sn = h.next_cmd_sn();
    h.feed(
        Pdu::TextRequest(TextRequest {
            final_flag: true,
            itt: 5,
            ttt: 77,
            cmd_sn,
            ..TextRequest::default()
        }),
        &[],
    );
    assert!(matches!(h.out()[0].pdu, Pdu::Reject(_)));
}

/// A Data-Out for a task the LU is already running (all its data came, or
/// it had none) is rejected, and the task keeps its ITT until the LU
/// answers: a new command with that ITT is refused ("task in progress")
/// rather than executed and sent the first one's data.
#[test]
fn a_stray_data_out_does_not_free_the_tag_of_a_task_the_lu_runs() {
    let mut h = Harness::default();
    // READ(10) of 512 bytes, handed to the LU.
    h.command(5, 0x28, 512, 0, &[], true);
    let (itt, task) = h.execute_one();
    assert_eq!((itt, task.data_in_len), (5, 512));
    h.out();
    h.feed(
        Pdu::DataOut(DataOut {
            final_flag: true,
            lun: 0,
            itt: 5,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        }),
        &[0; 512],
    );
    let out = h.out();
    assert!(
        matches!(out.as_slice(), [o] if matches!(o.pdu, Pdu::Reject(_))),
        "{out:?}"
    );
    // The tag is still the first READ's.
    h.command(5, 0x28, 4096, 0, &[], true);
    let out = h.out();
    let Pdu::Reject(r) = out[0].pdu else {
        panic!("{out:?}")
    };
    assert_eq!(r.reason, RejectReason::TASK_IN_PROGRESS);
    assert!(h.events().is_empty(), "a second task with the tag ran");
    // The LU's answer goes to the first READ: 512 bytes and GOOD.
    h.s.complete_task(5, TaskResult::with_data(Bytes::from(vec![0xab; 512])));
    let out = h.out();
    let data: usize = out
        .iter()
        .filter(|o| matches!(o.pdu, Pdu::DataIn(d) if d.itt == 5))
        .map(|o| o.data.len())
        .sum();
    assert_eq!(data, 512, "{out:?}");
}
