//! The target's full-feature-phase session (`target::session::Session`)
//! against a hostile initiator, with the logical unit's answers, task
//! management results and the clock also taken from the input.
//!
//! The input first picks the negotiated parameters and the session's
//! limits, then a run of operations: SCSI commands (immediate data, I and F
//! bits, CmdSN in or out of the window, colliding ITTs), Data-Out answering
//! the R2Ts the session sent (whole, or one PDU with its offset, length,
//! DataSN and F bit bent), unsolicited Data-Out, NOP-Out, task management,
//! Text, Logout, raw headers with fields patched to the session's
//! numbering, data digest errors; LU results of any status, length,
//! residual and sense; TMF results; Text answers; time passing.
//!
//! An input that starts with `R` is a replay instead: a digest selector
//! byte (bit 0 header, bit 1 data), then a stream of initiator PDUs as
//! captured (`scripts/fuzz-seeds.sh` writes one per captured connection).
//! Each is framed, its CmdSN renumbered to the session's and a solicited
//! Data-Out's TTT set to the session's R2T for its ITT; the LU answers every
//! task GOOD with the expected data-in.
//!
//! Checked, beside "no panic":
//! - every PDU the session emits encodes, frames and parses back to itself,
//!   and its data segment is within the initiator's
//!   MaxRecvDataSegmentLength;
//! - every R2T asks for 1..=MaxBurstLength bytes inside the command's
//!   expected length, with a TTT other than 0xffffffff;
//! - Data-In goes only to a task the LU has answered, never past the
//!   expected data-in length;
//! - a task handed to the LU carries no more data-out than announced and
//!   lengths within `max_transfer_length`;
//! - the session holds at most `queue_depth + max_immediate` tasks.
#![no_main]

#[path = "common/iscsi.rs"]
mod common;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use unifab_iscsi::ffp::{FfpParams, RESERVED_TAG};
use unifab_iscsi::target::session::{Coalescing, Event, Session, SessionLimits};
use unifab_iscsi::wire::{
    DataOut, LogoutReason, LogoutRequest, NopOut, Pdu, PduFrame, ScsiCommand, TaskAttrCode,
    TaskMgmtRequest, TextRequest, TmfCode,
};
use unifab_scsi_core::{
    ItNexus, Residual, Sense, SenseKey, Status, TargetPort, Task, TaskResult, TmfRequest,
    TmfResponse, TransportId, sense::asc,
};

use common::{
    Next, check_emitted, data, frame_pdu, mostly_reserved, next_pdu, put32, raw_pdu, replay_framer,
    time_step, tracing,
};

/// Segment and burst sizes to negotiate.
const SIZES: [u32; 6] = [512, 1024, 4096, 8192, 65_536, 262_144];

fn nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.fuzz:init".into(),
            isid: Some([0x40, 0, 0, 1, 0, 0]),
        },
        TargetPort {
            id: TransportId::Iscsi {
                name: "iqn.2026-11.fuzz:tgt,t,0x0001".into(),
                isid: None,
            },
            relative_port_id: 1,
            port_group: 1,
        },
    )
}

fn params(u: &mut Unstructured<'_>) -> Result<FfpParams> {
    let max_burst_length = *u.choose(&SIZES)?;
    let first_burst_length = (*u.choose(&SIZES)?).min(max_burst_length);
    Ok(FfpParams {
        max_recv_data_segment_length: *u.choose(&SIZES)?,
        max_xmit_data_segment_length: *u.choose(&SIZES)?,
        max_burst_length,
        first_burst_length,
        initial_r2t: u.arbitrary()?,
        immediate_data: u.arbitrary()?,
        max_outstanding_r2t: u.int_in_range(1..=4)?,
        ..FfpParams::default()
    })
}

fn limits(u: &mut Unstructured<'_>) -> Result<SessionLimits> {
    Ok(SessionLimits {
        queue_depth: u.int_in_range(1..=8)?,
        max_immediate: u.int_in_range(0..=4)?,
        max_transfer_length: *u.choose(&[4096, 65_536, 1 << 20, 16 << 20])?,
        write_buffer_budget: *u.choose(&[512, 8192, 65_536, 1 << 20])?,
        nop_in_interval: if u.arbitrary()? {
            Some(Duration::from_millis(u.int_in_range(1..=5_000)?))
        } else {
            None
        },
        nop_in_timeout: Duration::from_millis(u.int_in_range(1..=5_000)?),
        logout_timeout: Duration::from_millis(u.int_in_range(1..=5_000)?),
        coalescing: if u.arbitrary()? {
            Coalescing {
                responses: u.int_in_range(1..=4)?,
                max_delay: Duration::from_micros(u.int_in_range(0..=2_000)?),
            }
        } else {
            Coalescing::OFF
        },
    })
}

/// An R2T the session sent and the fuzzer has not yet answered in full.
#[derive(Debug, Clone, Copy)]
struct OpenR2t {
    itt: u32,
    ttt: u32,
    offset: u32,
    length: u32,
    lun: u64,
}

struct Harness {
    s: Session,
    now: Instant,
    params: FfpParams,
    limits: SessionLimits,
    /// The CmdSN an orderly initiator would use next.
    cmd_sn: u32,
    r2ts: Vec<OpenR2t>,
    pings: VecDeque<u32>,
    /// Tasks handed to the LU, not yet answered.
    execs: Vec<(u32, Task)>,
    tmfs: Vec<(u32, TmfRequest)>,
    texts: Vec<u32>,
    /// Expected data-in length of tasks the LU answered, by ITT, until
    /// their status goes out.
    answered: HashMap<u32, u32>,
    /// Expected data-out lengths of the write commands fed, by ITT (the
    /// last 16).
    write_len: HashMap<u32, Vec<u32>>,
    closed: bool,
}

impl Harness {
    fn itt(u: &mut Unstructured<'_>) -> Result<u32> {
        Ok(if u.ratio(1, 32)? {
            RESERVED_TAG
        } else {
            u.int_in_range(0..=7)?
        })
    }

    fn cmd_sn(&mut self, u: &mut Unstructured<'_>, immediate: bool) -> Result<u32> {
        Ok(match u.int_in_range(0..=7)? {
            0 => u.arbitrary()?,
            1 => self.cmd_sn.wrapping_add(u.int_in_range(1..=4)?),
            2 => self.cmd_sn.wrapping_sub(u.int_in_range(1..=4)?),
            _ if immediate => self.cmd_sn,
            _ => {
                let c = self.cmd_sn;
                self.cmd_sn = c.wrapping_add(1);
                c
            }
        })
    }

    fn feed(&mut self, frame: Option<unifab_iscsi::wire::PduFrame>) {
        let Some(frame) = frame else { return };
        if tracing() {
            eprintln!("feed {:?} +{}", frame.parse(), frame.data.len());
        }
        if let Ok(Pdu::ScsiCommand(c)) = frame.parse() {
            // Every write length an ITT has come with: a command reusing
            // the ITT of one in progress is refused, and the R2Ts go on
            // for the first.
            let lens = self.write_len.entry(c.itt).or_default();
            if c.write && !lens.contains(&c.expected_data_transfer_length) {
                if lens.len() == 16 {
                    lens.remove(0);
                }
                lens.push(c.expected_data_transfer_length);
            }
        }
        if self.s.handle_frame(self.now, frame).is_err() {
            self.closed = true;
        }
    }

    fn command(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let immediate = u.ratio(1, 4)?;
        let (read, write) = (u.arbitrary()?, u.arbitrary()?);
        let edtl = match u.int_in_range(0..=5)? {
            0 => 0,
            1 => 512,
            2 => 4096,
            3 => *u.choose(&SIZES)? + u.int_in_range(0..=1)?,
            4 => u.int_in_range(0..=(2 << 20))?,
            _ => u.arbitrary()?,
        };
        let mut cdb = [0u8; 16];
        cdb[0] = *u.choose(&[0x28, 0x2a, 0x00, 0x12, 0x88, 0x8a, 0x35])?;
        if u.ratio(1, 4)? {
            u.fill_buffer(&mut cdb)?;
        }
        let imm_len = if u.arbitrary()? {
            u.int_in_range(0..=edtl.min(self.params.max_recv_data_segment_length + 1))?
        } else {
            0
        };
        let seg = data(u, imm_len as usize)?;
        let cmd = ScsiCommand {
            immediate,
            final_flag: u.ratio(3, 4)?,
            read,
            write,
            attr: TaskAttrCode(u.int_in_range(0..=7)?),
            lun: u.int_in_range(0..=2)? << 48,
            itt: Self::itt(u)?,
            expected_data_transfer_length: edtl,
            cmd_sn: self.cmd_sn(u, immediate)?,
            exp_stat_sn: 0,
            cdb,
        };
        self.feed(frame_pdu(&Pdu::ScsiCommand(cmd), &seg));
        Ok(())
    }

    fn data_out_for_r2t(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.r2ts.is_empty() {
            return Ok(());
        }
        let i = u.choose_index(self.r2ts.len())?;
        let r = self.r2ts[i];
        let mrdsl = self.params.max_recv_data_segment_length;
        if u.ratio(3, 4)? {
            // The whole burst, in order.
            self.r2ts.swap_remove(i);
            let mut sent = 0u32;
            let mut data_sn = 0u32;
            while sent < r.length && !self.closed {
                let n = (r.length - sent).min(mrdsl);
                let d = DataOut {
                    final_flag: sent + n == r.length,
                    lun: r.lun,
                    itt: r.itt,
                    ttt: r.ttt,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: r.offset + sent,
                };
                let fill = vec![data_sn as u8; n as usize];
                self.feed(frame_pdu(&Pdu::DataOut(d), &fill));
                sent += n;
                data_sn += 1;
            }
        } else {
            // One PDU, bent.
            let len = u.int_in_range(0..=r.length.min(mrdsl) + 1)?;
            let d = DataOut {
                final_flag: u.arbitrary()?,
                lun: r.lun,
                itt: if u.ratio(1, 8)? { Self::itt(u)? } else { r.itt },
                ttt: if u.ratio(1, 8)? {
                    u.arbitrary()?
                } else {
                    r.ttt
                },
                exp_stat_sn: 0,
                data_sn: u.int_in_range(0..=2)?,
                buffer_offset: r
                    .offset
                    .wrapping_add(u.int_in_range(0..=2)? * 512)
                    .wrapping_sub(u.int_in_range(0..=1)? * 512),
            };
            let seg = data(u, len as usize)?;
            self.feed(frame_pdu(&Pdu::DataOut(d), &seg));
        }
        Ok(())
    }

    fn unsolicited(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let len = u.int_in_range(0..=self.params.max_recv_data_segment_length + 1)?;
        let d = DataOut {
            final_flag: u.arbitrary()?,
            lun: 0,
            itt: Self::itt(u)?,
            ttt: mostly_reserved(u, 7)?,
            exp_stat_sn: 0,
            data_sn: u.int_in_range(0..=3)?,
            buffer_offset: u.int_in_range(0..=4)? * 512,
        };
        let seg = data(u, len as usize)?;
        self.feed(frame_pdu(&Pdu::DataOut(d), &seg));
        Ok(())
    }

    fn nop_out(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let answer = u.arbitrary::<bool>()? && !self.pings.is_empty();
        let n = if answer {
            NopOut {
                immediate: true,
                lun: 0,
                itt: RESERVED_TAG,
                ttt: self.pings.pop_front().unwrap_or(RESERVED_TAG),
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            }
        } else {
            let immediate = u.arbitrary()?;
            NopOut {
                immediate,
                lun: 0,
                itt: Self::itt(u)?,
                ttt: mostly_reserved(u, 7)?,
                cmd_sn: self.cmd_sn(u, immediate)?,
                exp_stat_sn: 0,
            }
        };
        let len = u.int_in_range(0..=self.params.max_recv_data_segment_length + 1)?;
        let seg = data(u, len as usize)?;
        self.feed(frame_pdu(&Pdu::NopOut(n), &seg));
        Ok(())
    }

    fn tmf(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let immediate = u.arbitrary()?;
        let t = TaskMgmtRequest {
            immediate,
            function: TmfCode(u.int_in_range(0..=13)?),
            lun: u.int_in_range(0..=2)? << 48,
            itt: Self::itt(u)?,
            referenced_task_tag: Self::itt(u)?,
            cmd_sn: self.cmd_sn(u, immediate)?,
            exp_stat_sn: 0,
            ref_cmd_sn: self.cmd_sn.wrapping_sub(u.int_in_range(0..=4)?),
            exp_data_sn: u.int_in_range(0..=2)?,
        };
        self.feed(frame_pdu(&Pdu::TaskMgmtRequest(t), &[]));
        Ok(())
    }

    fn text(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let immediate = u.arbitrary()?;
        let t = TextRequest {
            immediate,
            final_flag: u.ratio(3, 4)?,
            continue_flag: u.ratio(1, 4)?,
            lun: 0,
            itt: Self::itt(u)?,
            ttt: mostly_reserved(u, 6)?,
            cmd_sn: self.cmd_sn(u, immediate)?,
            exp_stat_sn: 0,
        };
        let seg = if u.arbitrary()? {
            b"SendTargets=All\0".to_vec()
        } else {
            let len = u.int_in_range(0..=self.params.max_recv_data_segment_length + 1)?;
            data(u, len as usize)?
        };
        self.feed(frame_pdu(&Pdu::TextRequest(t), &seg));
        Ok(())
    }

    fn logout(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let immediate = u.arbitrary()?;
        let l = LogoutRequest {
            immediate,
            reason: LogoutReason(u.int_in_range(0..=3)?),
            itt: Self::itt(u)?,
            cid: u.int_in_range(0..=2)?,
            cmd_sn: self.cmd_sn(u, immediate)?,
            exp_stat_sn: 0,
        };
        self.feed(frame_pdu(&Pdu::LogoutRequest(l), &[]));
        Ok(())
    }

    fn raw(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let max = self.params.max_recv_data_segment_length as usize + 1;
        let cmd_sn = self.cmd_sn;
        let r2t = self.r2ts.first().copied();
        let frame = raw_pdu(u, max, |bhs, u| {
            let fix: u8 = u.arbitrary()?;
            if fix & 1 != 0 {
                put32(bhs, 24, cmd_sn);
            }
            if fix & 2 != 0 {
                put32(bhs, 16, u.int_in_range(0..=7)?);
            }
            if let (true, Some(r)) = (fix & 4 != 0, r2t) {
                put32(bhs, 16, r.itt);
                put32(bhs, 20, r.ttt);
                put32(bhs, 40, r.offset);
            }
            if fix & 8 != 0 {
                // An initiator opcode.
                bhs[0] =
                    (bhs[0] & 0x40) | *u.choose(&[0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x10])?;
            }
            Ok(())
        })?;
        if fix_cmd_sn_advances(&frame, cmd_sn) {
            self.cmd_sn = cmd_sn.wrapping_add(1);
        }
        self.feed(frame);
        Ok(())
    }

    fn digest_error(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let mut bhs = [0u8; 48];
        u.fill_buffer(&mut bhs)?;
        if u.arbitrary()? {
            put32(&mut bhs, 24, self.cmd_sn);
        }
        if self
            .s
            .handle_digest_error(self.now, Bytes::copy_from_slice(&bhs))
            .is_err()
        {
            self.closed = true;
        }
        Ok(())
    }

    fn complete_task(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.execs.is_empty() {
            return Ok(());
        }
        let (itt, task) = self.execs.remove(u.choose_index(self.execs.len())?);
        let expected = task.data_in_len;
        let mut result = match u.int_in_range(0..=5)? {
            0 => TaskResult::good(),
            1 | 2 => {
                let len = match u.int_in_range(0..=3)? {
                    0 => expected,
                    1 => expected.saturating_sub(u.int_in_range(1..=512)?),
                    2 => expected.saturating_add(u.int_in_range(1..=512)?),
                    _ => u.int_in_range(0..=expected.saturating_mul(2).min(4 << 20))?,
                };
                let mut r = TaskResult::good();
                // Data in one to three slices.
                let pieces = u.int_in_range(1..=3u32)?;
                let mut left = len;
                for k in 0..pieces {
                    let n = if k + 1 == pieces { left } else { left / 2 };
                    r.data_in.push(Bytes::from(vec![k as u8; n as usize]));
                    left -= n;
                }
                r
            }
            3 => TaskResult::check_condition(Sense::new(
                SenseKey::MEDIUM_ERROR,
                asc::UNRECOVERED_READ_ERROR,
            )),
            4 => {
                let mut r = TaskResult::status(Status(u.arbitrary()?));
                if u.arbitrary()? {
                    let len = u.int_in_range(0..=300)?;
                    r.sense = Some(Bytes::from(data(u, len)?));
                }
                r
            }
            _ => TaskResult::aborted(),
        };
        if u.ratio(1, 4)? {
            result.residual = Some(if u.arbitrary()? {
                Residual::Overflow(u.arbitrary()?)
            } else {
                Residual::Underflow(u.arbitrary()?)
            });
        }
        if tracing() {
            eprintln!(
                "  complete {itt}: {:?}, {} bytes",
                result.status,
                result.data_in_total()
            );
        }
        if !result.aborted {
            self.answered.insert(itt, expected);
        }
        self.s.complete_task(itt, result);
        Ok(())
    }

    fn complete_tmf(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.tmfs.is_empty() {
            return Ok(());
        }
        let (itt, _) = self.tmfs.remove(u.choose_index(self.tmfs.len())?);
        let response = *u.choose(&[
            TmfResponse::FunctionComplete,
            TmfResponse::FunctionSucceeded,
            TmfResponse::FunctionRejected,
            TmfResponse::IncorrectLun,
            TmfResponse::ServiceDeliveryFailure,
        ])?;
        self.s.complete_tmf(itt, response);
        Ok(())
    }

    fn text_response(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if self.texts.is_empty() {
            return Ok(());
        }
        let itt = self.texts.remove(u.choose_index(self.texts.len())?);
        let len = u.int_in_range(0..=3 * self.params.max_xmit_data_segment_length)?;
        let text = data(u, len as usize)?;
        self.s.text_response(itt, Bytes::from(text));
        Ok(())
    }

    fn tick(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let step = time_step(u, self.now, self.s.poll_timeout())?;
        self.now += step;
        self.s.handle_timeout(self.now);
        Ok(())
    }

    fn op(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        match u.int_in_range(0..=15)? {
            0..=2 => self.command(u)?,
            3 | 4 => self.data_out_for_r2t(u)?,
            5 => self.unsolicited(u)?,
            6 => self.nop_out(u)?,
            7 => self.tmf(u)?,
            8 => self.text(u)?,
            9 => self.logout(u)?,
            10 => self.raw(u)?,
            11 => self.digest_error(u)?,
            12 | 13 => self.complete_task(u)?,
            14 => {
                self.complete_tmf(u)?;
                self.text_response(u)?;
            }
            _ => {
                if u.ratio(1, 16)? {
                    self.s.request_logout(u.arbitrary()?);
                } else if u.ratio(1, 16)? {
                    self.s.abort_all();
                } else {
                    self.tick(u)?;
                }
            }
        }
        self.drain();
        Ok(())
    }

    /// Takes everything the session produced, checking it.
    fn drain(&mut self) {
        let p = self.params;
        while let Some(out) = self.s.poll_transmit() {
            let len = check_emitted(&out.pdu, &[], out.data.slices());
            assert!(
                len <= p.max_xmit_data_segment_length as usize,
                "{len} bytes of data past the initiator's MaxRecvDataSegmentLength {}: {:?}",
                p.max_xmit_data_segment_length,
                out.pdu
            );
            match out.pdu {
                Pdu::R2t(r) => {
                    let n = r.desired_data_transfer_length;
                    assert!(n > 0 && n <= p.max_burst_length, "R2T for {n} bytes: {r:?}");
                    assert_ne!(r.ttt, RESERVED_TAG, "R2T with the reserved TTT");
                    let wl = self.write_len.get(&r.itt).and_then(|l| l.iter().max());
                    assert!(
                        wl.is_some_and(
                            |&w| u64::from(r.buffer_offset) + u64::from(n) <= u64::from(w)
                        ),
                        "R2T past any expected length its ITT came with ({wl:?}): {r:?}"
                    );
                    if self.r2ts.len() < 64 {
                        self.r2ts.push(OpenR2t {
                            itt: r.itt,
                            ttt: r.ttt,
                            offset: r.buffer_offset,
                            length: n,
                            lun: r.lun,
                        });
                    }
                }
                Pdu::DataIn(d) => {
                    let Some(&expected) = self.answered.get(&d.itt) else {
                        panic!("Data-In for a task the LU has not answered: {d:?}");
                    };
                    assert!(
                        u64::from(d.buffer_offset) + len as u64 <= u64::from(expected),
                        "Data-In past the expected length {expected}: {d:?}"
                    );
                    if d.status_present {
                        self.answered.remove(&d.itt);
                    }
                }
                Pdu::ScsiResponse(r) => {
                    self.answered.remove(&r.itt);
                }
                Pdu::NopIn(n) if n.ttt != RESERVED_TAG && self.pings.len() < 8 => {
                    self.pings.push_back(n.ttt);
                }
                _ => {}
            }
        }
        while let Some(ev) = self.s.poll_event() {
            match ev {
                Event::Execute { itt, task } => {
                    if tracing() {
                        eprintln!("  execute {itt}: {:02x?}", task.cdb.as_bytes());
                    }
                    let max = self.limits.max_transfer_length;
                    assert!(
                        task.data_out_total() <= task.data_out_len as usize,
                        "more data-out than announced"
                    );
                    assert!(task.data_out_len <= max && task.data_in_len <= max);
                    self.execs.push((itt, task));
                }
                Event::TaskManagement { itt, request } => self.tmfs.push((itt, request)),
                Event::Text { itt, .. } => self.texts.push(itt),
                Event::TargetColdReset | Event::Close(_) => self.closed = true,
            }
        }
        let bound = (self.limits.queue_depth.max(1) + self.limits.max_immediate) as usize;
        assert!(
            self.s.task_count() <= bound,
            "{} tasks held, more than the window allows ({bound})",
            self.s.task_count()
        );
    }
}

/// Whether a raw PDU whose CmdSN was patched to the expected one took it
/// (a non-immediate command-like PDU), so the next structured PDU follows.
fn fix_cmd_sn_advances(frame: &Option<unifab_iscsi::wire::PduFrame>, cmd_sn: u32) -> bool {
    let Some(f) = frame else { return false };
    match f.parse() {
        Ok(Pdu::ScsiCommand(c)) => !c.immediate && c.cmd_sn == cmd_sn,
        Ok(Pdu::TaskMgmtRequest(t)) => !t.immediate && t.cmd_sn == cmd_sn,
        Ok(Pdu::TextRequest(t)) => !t.immediate && t.cmd_sn == cmd_sn,
        Ok(Pdu::LogoutRequest(l)) => !l.immediate && l.cmd_sn == cmd_sn,
        Ok(Pdu::NopOut(n)) => !n.immediate && n.itt != RESERVED_TAG && n.cmd_sn == cmd_sn,
        _ => false,
    }
}

impl Harness {
    fn new(params: FfpParams, limits: SessionLimits, cmd_sn: u32, stat_sn: u32) -> Harness {
        let now = Instant::now();
        Harness {
            s: Session::new(nexus(), 1, params, limits, cmd_sn, stat_sn, now),
            now,
            params,
            limits,
            cmd_sn,
            r2ts: Vec::new(),
            pings: VecDeque::new(),
            execs: Vec::new(),
            tmfs: Vec::new(),
            texts: Vec::new(),
            answered: HashMap::new(),
            write_len: HashMap::new(),
            closed: false,
        }
    }

    /// Answers everything the driver was asked: tasks GOOD with their
    /// expected data-in, functions complete, texts empty.
    fn settle(&mut self) {
        while !self.closed
            && !(self.execs.is_empty() && self.tmfs.is_empty() && self.texts.is_empty())
        {
            for (itt, task) in std::mem::take(&mut self.execs) {
                let len = task.data_in_len.min(1 << 20) as usize;
                self.answered.insert(itt, task.data_in_len);
                self.s
                    .complete_task(itt, TaskResult::with_data(Bytes::from(vec![0x3c; len])));
            }
            for (itt, _) in std::mem::take(&mut self.tmfs) {
                self.s.complete_tmf(itt, TmfResponse::FunctionComplete);
            }
            for itt in std::mem::take(&mut self.texts) {
                self.s.text_response(itt, Bytes::new());
            }
            self.drain();
        }
    }
}

/// Replays a captured initiator PDU stream (see the module docs).
fn replay(sel: u8, stream: &[u8]) {
    let big = 1 << 18;
    let params = FfpParams {
        max_recv_data_segment_length: big,
        max_xmit_data_segment_length: big,
        max_burst_length: 1 << 20,
        first_burst_length: big,
        initial_r2t: false,
        immediate_data: true,
        max_outstanding_r2t: 4,
        ..FfpParams::default()
    };
    let mut h = Harness::new(params, SessionLimits::default(), 1, 1);
    let framer = replay_framer(sel, big);
    let mut buf = BytesMut::from(stream);
    while !h.closed {
        let (frame, mut bhs) = match next_pdu(&framer, &mut buf) {
            Next::Pdu(f, bhs) => (f, bhs),
            Next::DigestError(bhs) => {
                h.closed |= h.s.handle_digest_error(h.now, bhs).is_err();
                h.drain();
                continue;
            }
            Next::End => break,
        };
        let op = bhs[0] & 0x3f;
        if matches!(op, 0x00 | 0x01 | 0x02 | 0x04 | 0x06) {
            put32(&mut bhs, 24, h.cmd_sn);
            let immediate = bhs[0] & 0x40 != 0;
            let pinged = op == 0x00 && bhs[16..20] == [0xff; 4];
            if !immediate && !pinged {
                h.cmd_sn = h.cmd_sn.wrapping_add(1);
            }
        }
        if op == 0x05 && bhs[20..24] != [0xff; 4] {
            let itt = u32::from_be_bytes([bhs[16], bhs[17], bhs[18], bhs[19]]);
            if let Some(r) = h.r2ts.iter().find(|r| r.itt == itt) {
                put32(&mut bhs, 20, r.ttt);
            }
        }
        let frame = PduFrame {
            bhs: Bytes::copy_from_slice(&bhs),
            ..frame
        };
        // The numbering is the session's now: no CmdSN bookkeeping in `feed`.
        if let Ok(Pdu::ScsiCommand(c)) = frame.parse() {
            let lens = h.write_len.entry(c.itt).or_default();
            if c.write && lens.len() < 16 {
                lens.push(c.expected_data_transfer_length);
            }
        }
        if tracing() {
            eprintln!("replay {:?} +{}", frame.parse(), frame.data.len());
        }
        h.closed |= h.s.handle_frame(h.now, frame).is_err();
        h.drain();
        h.settle();
    }
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let params = params(u)?;
    let limits = limits(u)?;
    let cmd_sn: u32 = u.arbitrary()?;
    let stat_sn: u32 = u.arbitrary()?;
    let mut h = Harness::new(params, limits, cmd_sn, stat_sn);
    let mut ops = 0;
    while !h.closed && !u.is_empty() && ops < 512 && h.op(u).is_ok() {
        ops += 1;
    }
    Ok(())
}

fuzz_target!(|input: &[u8]| {
    match input {
        [b'R', sel, stream @ ..] => replay(*sel, stream),
        _ => {
            let _ = run(&mut Unstructured::new(input));
        }
    }
});
