//! The initiator's full-feature-phase session (`initiator::Session`)
//! against a hostile target, with the user's commands, task management,
//! connection losses and the clock also taken from the input.
//!
//! The input first picks the session's configuration and the negotiated
//! parameters, then a run of operations: reads and writes submitted; the
//! target's Data-In, SCSI Response and R2T for a command the session sent
//! (in order, or with offset, DataSN, lengths, flags and status bent); task
//! management and NOP-In answers, target pings, asynchronous messages,
//! rejects, logout and text responses; raw headers with fields patched to
//! the session's tags and numbering; data digest errors; time passing;
//! connections lost and logged in again (with new parameters); aborts,
//! abandoned commands and closing.
//!
//! An input that starts with `R` is a replay instead: a digest selector
//! byte (bit 0 header, bit 1 data), then a stream of target PDUs as
//! captured (`scripts/fuzz-seeds.sh` writes one per captured connection).
//! Sixteen 64 KiB reads and writes are submitted first; each captured PDU
//! is framed, its ITT mapped to one of ours (in order of appearance), and
//! its StatSN, ExpCmdSN and MaxCmdSN set as an orderly target would.
//!
//! Checked, beside "no panic":
//! - every PDU the session emits encodes, frames and parses back to itself,
//!   and its data segment is within the target's MaxRecvDataSegmentLength;
//! - a non-immediate command goes out only inside the CmdSN window;
//! - immediate data only when ImmediateData=Yes, within FirstBurstLength;
//!   Data-Out only inside the command's data-out, unsolicited within
//!   FirstBurstLength, solicited within the R2T it answers;
//! - a command's data-in is never longer than it asked for;
//! - every command and task management function ends exactly once: after
//!   the input, the connection is lost and the clock runs on, and each one
//!   the caller still waits for must have ended (none hangs).
#![no_main]

#[path = "common/iscsi.rs"]
mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use unifab_iscsi::ffp::FfpParams;
use unifab_iscsi::ffp::{RESERVED_TAG, sn_le, sn_lt};
use unifab_iscsi::initiator::{Event, Session, SessionConfig, StartSn};
use unifab_iscsi::wire::{
    AsyncEvent, AsyncMessage, DataIn, LogoutResponse, NopIn, Pdu, PduFrame, R2t, Reject,
    RejectReason, ScsiResponse, TaskMgmtResponse, TextResponse, TmfResponseCode,
};
use unifab_scsi_core::initiator::Request;
use unifab_scsi_core::{Lun, TmfFunction};

use common::{
    Next, check_emitted, data, frame_pdu, next_pdu, put32, raw_pdu, replay_framer, time_step,
    tracing,
};

const SIZES: [u32; 6] = [512, 1024, 4096, 8192, 65_536, 262_144];

fn config(u: &mut Unstructured<'_>) -> Result<SessionConfig> {
    Ok(SessionConfig {
        command_timeout: Duration::from_millis(u.int_in_range(1..=10_000)?),
        tmf_timeout: Duration::from_millis(u.int_in_range(1..=5_000)?),
        nop_interval: if u.arbitrary()? {
            Some(Duration::from_millis(u.int_in_range(1..=5_000)?))
        } else {
            None
        },
        nop_timeout: Duration::from_millis(u.int_in_range(1..=5_000)?),
        max_commands: u.int_in_range(1..=16)?,
        max_attempts: u.int_in_range(1..=3)?,
        replacement_timeout: if u.arbitrary()? {
            Some(Duration::from_millis(u.int_in_range(0..=10_000)?))
        } else {
            None
        },
    })
}

fn params(u: &mut Unstructured<'_>) -> Result<FfpParams> {
    let max_burst_length = *u.choose(&SIZES)?;
    Ok(FfpParams {
        max_xmit_data_segment_length: *u.choose(&SIZES)?,
        max_recv_data_segment_length: *u.choose(&SIZES)?,
        max_burst_length,
        first_burst_length: (*u.choose(&SIZES)?).min(max_burst_length),
        initial_r2t: u.arbitrary()?,
        immediate_data: u.arbitrary()?,
        protocol_level: u.int_in_range(0..=2)?,
        ..FfpParams::default()
    })
}

/// A command the caller waits for.
#[derive(Debug)]
struct Live {
    tag: u64,
    data_in_len: u32,
    abandoned: bool,
}

/// A command as the target saw it on the wire.
#[derive(Debug, Clone, Copy)]
struct Sent {
    lun: u64,
    read_len: u32,
    write_len: u32,
    /// Data-In sent so far and the next DataSN.
    data_in: u32,
    data_sn: u32,
    /// Bytes solicited so far and the next R2TSN.
    solicited: u32,
    r2t_sn: u32,
}

struct Harness {
    s: Session<u32>,
    now: Instant,
    params: FfpParams,
    connected: bool,
    next_token: u32,
    live: HashMap<u32, Live>,
    tmfs: HashSet<u32>,
    ended: HashSet<u32>,
    closed: bool,
    /// The target's side.
    sent: HashMap<u32, Sent>,
    tmf_itts: Vec<u32>,
    ping_itts: Vec<u32>,
    logout_itt: Option<u32>,
    /// ITTs of the commands sent on this connection, in order.
    order: VecDeque<u32>,
    /// Solicitations: TTT → (ITT, offset, length).
    r2ts: HashMap<u32, Vec<(u32, u32, u32)>>,
    next_ttt: u32,
    stat_sn: u32,
    /// The CmdSN the target expects next and the highest MaxCmdSN it has
    /// given; `window` is what it gives from ExpCmdSN.
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    window: u32,
    /// Every number the target gave on this connection was its own
    /// (none random): the initiator must then keep to its window.
    orderly: bool,
}

impl Harness {
    fn connect(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let params = params(u)?;
        let (cmd_sn, stat_sn) = (u.arbitrary()?, u.arbitrary()?);
        let window = u.int_in_range(0..=8)?;
        self.connect_with(params, cmd_sn, stat_sn, window);
        Ok(())
    }

    fn connect_with(&mut self, params: FfpParams, cmd_sn: u32, stat_sn: u32, window: u32) {
        self.params = params;
        self.stat_sn = stat_sn;
        self.exp_cmd_sn = cmd_sn;
        self.window = window;
        self.sent.clear();
        self.order.clear();
        self.tmf_itts.clear();
        self.ping_itts.clear();
        self.logout_itt = None;
        self.r2ts.clear();
        self.max_cmd_sn = cmd_sn.wrapping_add(self.window).wrapping_sub(1);
        self.orderly = true;
        let sn = StartSn {
            cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
            exp_stat_sn: self.stat_sn,
        };
        self.s.connected(self.now, self.params, sn);
        self.connected = self.s.is_connected();
    }

    fn lose(&mut self) {
        self.s.connection_lost(self.now);
        self.connected = false;
    }

    /// StatSN, ExpCmdSN and MaxCmdSN for the next target PDU, mostly as
    /// an orderly target would set them.
    fn numbers(&mut self, u: &mut Unstructured<'_>, status: bool) -> Result<(u32, u32, u32)> {
        if u.ratio(1, 16)? {
            self.orderly = false;
            return Ok((u.arbitrary()?, u.arbitrary()?, u.arbitrary()?));
        }
        if u.ratio(1, 8)? {
            self.window = u.int_in_range(0..=8)?;
        }
        Ok(self.next_numbers(status))
    }

    /// The numbers of an orderly target.
    fn next_numbers(&mut self, status: bool) -> (u32, u32, u32) {
        let stat_sn = self.stat_sn;
        if status {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        let max = self.exp_cmd_sn.wrapping_add(self.window).wrapping_sub(1);
        if sn_lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
        (stat_sn, self.exp_cmd_sn, max)
    }

    /// Feeds a target PDU, with its data within our MaxRecvDataSegmentLength
    /// (the driver's framer refuses longer segments).
    fn feed(&mut self, frame: Option<PduFrame>) {
        let Some(frame) = frame else { return };
        if !self.connected || frame.data.len() > self.params.max_recv_data_segment_length as usize {
            return;
        }
        if self.s.handle_frame(self.now, frame).is_err() {
            self.lose();
        }
    }

    fn submit(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let lun = Lun(u64::from(u.int_in_range(0..=2u8)?) << 48);
        let len = match u.int_in_range(0..=3)? {
            0 => 0,
            1 => *u.choose(&SIZES)?,
            2 => *u.choose(&SIZES)? * u.int_in_range(1..=4)?,
            _ => u.int_in_range(0..=(1 << 20))?,
        };
        let op: u8 = *u.choose(&[0x28, 0x2a, 0x00, 0x12, 0x35, 0x89])?;
        let mut cdb = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let request = if op == 0x2a || op == 0x89 {
            let mut r = Request::with_data_out(
                lun,
                Bytes::from(cdb),
                Bytes::from(vec![0xa5; len as usize]),
            );
            if len > 1 && u.arbitrary()? {
                // Two slices.
                let all = r.data_out.remove(0);
                let cut = u.int_in_range(1..=len as usize - 1)?;
                r.data_out = vec![all.slice(..cut), all.slice(cut..)];
            }
            r
        } else {
            cdb[9] = u.arbitrary()?;
            Request::new(lun, Bytes::from(cdb), len)
        };
        self.submit_request(request);
        Ok(())
    }

    fn submit_request(&mut self, request: Request) {
        let data_in_len = request.data_in_len;
        let token = self.next_token;
        self.next_token += 1;
        match self.s.submit(self.now, request, token) {
            Ok(tag) => {
                self.live.insert(
                    token,
                    Live {
                        tag,
                        data_in_len,
                        abandoned: false,
                    },
                );
            }
            Err((_, t)) => assert_eq!(t, token, "a refused command returns its token"),
        }
    }

    fn pick_sent(&self, u: &mut Unstructured<'_>) -> Result<Option<u32>> {
        if self.sent.is_empty() {
            return Ok(None);
        }
        let mut itts: Vec<u32> = self.sent.keys().copied().collect();
        itts.sort_unstable();
        Ok(Some(itts[u.choose_index(itts.len())?]))
    }

    fn answer_command(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let Some(itt) = self.pick_sent(u)? else {
            return Ok(());
        };
        let Some(mut c) = self.sent.get(&itt).copied() else {
            return Ok(());
        };
        let mrdsl = self.params.max_recv_data_segment_length;
        match u.int_in_range(0..=3)? {
            0 | 1 => {
                // Data-In.
                let left = c.read_len.saturating_sub(c.data_in);
                let len = match u.int_in_range(0..=3)? {
                    0 | 1 => left.min(mrdsl),
                    2 => u.int_in_range(0..=left.min(mrdsl))?,
                    _ => u.int_in_range(0..=mrdsl)?,
                };
                let bent = u.ratio(1, 8)?;
                let last = c.data_in + len >= c.read_len;
                let status_present = last && u.ratio(3, 4)? || u.ratio(1, 16)?;
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, status_present)?;
                let d = DataIn {
                    final_flag: status_present || (last && u.arbitrary()?),
                    acknowledge: false,
                    overflow: u.ratio(1, 16)?,
                    underflow: u.ratio(1, 8)?,
                    status_present,
                    status: if u.ratio(7, 8)? { 0 } else { u.arbitrary()? },
                    lun: c.lun,
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    data_sn: if bent {
                        u.int_in_range(0..=3)?
                    } else {
                        c.data_sn
                    },
                    buffer_offset: if bent {
                        u.int_in_range(0..=4)? * 512
                    } else {
                        c.data_in
                    },
                    residual_count: if u.ratio(3, 4)? { 0 } else { u.arbitrary()? },
                };
                let seg = data(u, len as usize)?;
                c.data_in += len;
                c.data_sn = c.data_sn.wrapping_add(1);
                if status_present {
                    self.sent.remove(&itt);
                } else {
                    self.sent.insert(itt, c);
                }
                self.feed(frame_pdu(&Pdu::DataIn(d), &seg));
            }
            2 => {
                // SCSI Response.
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let status: u8 = *u.choose(&[0, 0, 2, 8, 0x18, 0x28])?;
                let r = ScsiResponse {
                    bidi_overflow: u.ratio(1, 32)?,
                    bidi_underflow: u.ratio(1, 32)?,
                    overflow: u.ratio(1, 16)?,
                    underflow: u.ratio(1, 8)?,
                    response: if u.ratio(7, 8)? { 0 } else { u.arbitrary()? },
                    status,
                    itt,
                    snack_tag: 0,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    exp_data_sn: c.data_sn,
                    bidi_residual_count: 0,
                    residual_count: if u.ratio(3, 4)? { 0 } else { u.arbitrary()? },
                };
                let seg = if status == 2 || u.ratio(1, 8)? {
                    let n = u.int_in_range(0..=40u16)?;
                    let declared = if u.ratio(7, 8)? { n } else { u.arbitrary()? };
                    let mut s = declared.to_be_bytes().to_vec();
                    s.extend(data(u, usize::from(n))?);
                    s
                } else {
                    Vec::new()
                };
                self.sent.remove(&itt);
                self.feed(frame_pdu(&Pdu::ScsiResponse(r), &seg));
            }
            _ => {
                // R2T.
                let left = c.write_len.saturating_sub(c.solicited);
                let (offset, len) = if u.ratio(7, 8)? {
                    (c.solicited, left.min(self.params.max_burst_length))
                } else {
                    (u.int_in_range(0..=4)? * 512, u.int_in_range(0..=8192)?)
                };
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, false)?;
                let ttt = self.next_ttt;
                self.next_ttt = self.next_ttt.wrapping_add(1) & 0x7fff_ffff;
                let r = R2t {
                    lun: c.lun,
                    itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    r2t_sn: c.r2t_sn,
                    buffer_offset: offset,
                    desired_data_transfer_length: len,
                };
                c.solicited = c.solicited.saturating_add(len);
                c.r2t_sn = c.r2t_sn.wrapping_add(1);
                self.sent.insert(itt, c);
                if self.r2ts.len() < 1024 {
                    self.r2ts.entry(ttt).or_default().push((itt, offset, len));
                }
                self.feed(frame_pdu(&Pdu::R2t(r), &[]));
            }
        }
        Ok(())
    }

    fn answer_control(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        match u.int_in_range(0..=6)? {
            0 if !self.tmf_itts.is_empty() => {
                let itt = self.tmf_itts.remove(u.choose_index(self.tmf_itts.len())?);
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let t = TaskMgmtResponse {
                    response: TmfResponseCode(*u.choose(&[0, 0, 1, 2, 5, 7, 255, 6])?),
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                };
                self.feed(frame_pdu(&Pdu::TaskMgmtResponse(t), &[]));
            }
            1 => {
                // A NOP-In: the answer to a ping, or a ping of the target's.
                let answer = !self.ping_itts.is_empty() && u.arbitrary()?;
                let itt = if answer {
                    self.ping_itts.remove(u.choose_index(self.ping_itts.len())?)
                } else {
                    RESERVED_TAG
                };
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, answer)?;
                let n = NopIn {
                    lun: 0,
                    itt,
                    ttt: if answer {
                        RESERVED_TAG
                    } else {
                        u.int_in_range(0..=0x7fff_ffff)?
                    },
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                };
                let len = u.int_in_range(0..=self.params.max_recv_data_segment_length)?;
                let seg = data(u, len as usize)?;
                self.feed(frame_pdu(&Pdu::NopIn(n), &seg));
            }
            2 => {
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let a = AsyncMessage {
                    lun: 0,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    event: AsyncEvent(u.int_in_range(0..=5)?),
                    vcode: 0,
                    parameter1: u.arbitrary()?,
                    parameter2: u.int_in_range(0..=3)?,
                    parameter3: u.int_in_range(0..=3)?,
                };
                let seg = if a.event == AsyncEvent::SCSI_ASYNC_EVENT {
                    let mut s = 18u16.to_be_bytes().to_vec();
                    s.extend(data(u, 18)?);
                    s
                } else {
                    Vec::new()
                };
                self.feed(frame_pdu(&Pdu::AsyncMessage(a), &seg));
            }
            3 => {
                // A Reject carrying the header of a PDU we sent, or junk.
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let r = Reject {
                    reason: RejectReason(*u.choose(&[2, 4, 5, 6, 7, 9, 0x0b, 0x0c])?),
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    data_sn: 0,
                };
                let mut bhs = [0u8; 48];
                u.fill_buffer(&mut bhs)?;
                if let Some(itt) = self.pick_sent(u)? {
                    bhs[0] = 0x01;
                    put32(&mut bhs, 16, itt);
                    if u.arbitrary()? {
                        self.sent.remove(&itt);
                    }
                }
                self.feed(frame_pdu(&Pdu::Reject(r), &bhs));
            }
            4 => {
                let itt = match self.logout_itt.take() {
                    Some(i) if u.ratio(3, 4)? => i,
                    _ => u.arbitrary()?,
                };
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let l = LogoutResponse {
                    response: if u.ratio(3, 4)? {
                        0
                    } else {
                        u.int_in_range(0..=3)?
                    },
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    time2wait: u.arbitrary()?,
                    time2retain: u.arbitrary()?,
                };
                self.feed(frame_pdu(&Pdu::LogoutResponse(l), &[]));
            }
            5 => {
                let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, true)?;
                let t = TextResponse {
                    final_flag: true,
                    continue_flag: false,
                    lun: 0,
                    itt: u.arbitrary()?,
                    ttt: RESERVED_TAG,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                };
                self.feed(frame_pdu(&Pdu::TextResponse(t), b"X=Y\0"));
            }
            _ => self.raw(u)?,
        }
        Ok(())
    }

    fn raw(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let itt = self.pick_sent(u)?;
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = self.numbers(u, false)?;
        let max = self.params.max_recv_data_segment_length as usize;
        let mut numbered = false;
        let frame = raw_pdu(u, max, |bhs, u| {
            let fix: u8 = u.arbitrary()?;
            if fix & 1 != 0 {
                // A target opcode.
                bhs[0] =
                    *u.choose(&[0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f])?;
            }
            if let (true, Some(itt)) = (fix & 2 != 0, itt) {
                put32(bhs, 16, itt);
            }
            if fix & 4 != 0 {
                put32(bhs, 24, stat_sn);
                put32(bhs, 28, exp_cmd_sn);
                put32(bhs, 32, max_cmd_sn);
            }
            numbered = fix & 4 != 0;
            Ok(())
        })?;
        if !numbered {
            self.orderly = false;
        }
        if let Some(Ok(Pdu::R2t(r))) = frame.as_ref().map(PduFrame::parse) {
            // A raw R2T solicits too.
            if self.r2ts.len() < 1024 {
                let e = self.r2ts.entry(r.ttt).or_default();
                if e.len() < 16 {
                    e.push((r.itt, r.buffer_offset, r.desired_data_transfer_length));
                }
            }
        }
        self.feed(frame);
        Ok(())
    }

    fn digest_error(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        if !self.connected {
            return Ok(());
        }
        let mut bhs = [0u8; 48];
        u.fill_buffer(&mut bhs)?;
        if let Some(itt) = self.pick_sent(u)? {
            bhs[0] = *u.choose(&[0x25, 0x21])?;
            put32(&mut bhs, 16, itt);
        }
        if self
            .s
            .handle_digest_error(self.now, &Bytes::copy_from_slice(&bhs))
            .is_err()
        {
            self.lose();
        }
        Ok(())
    }

    fn tick(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let step = time_step(u, self.now, self.s.poll_timeout())?;
        self.now += step;
        if self.s.handle_timeout(self.now).is_err() {
            self.lose();
        }
        Ok(())
    }

    fn user(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let mut tokens: Vec<u32> = self.live.keys().copied().collect();
        tokens.sort_unstable();
        let tag = if tokens.is_empty() {
            u.arbitrary()?
        } else {
            self.live[&tokens[u.choose_index(tokens.len())?]].tag
        };
        let which = u.int_in_range(0..=5)?;
        if tracing() {
            eprintln!("  user {which}");
        }
        match which {
            0 | 1 => {
                let function = match u.int_in_range(0..=9)? {
                    0 => TmfFunction::AbortTask { tag },
                    1 => TmfFunction::AbortTaskSet,
                    2 => TmfFunction::ClearTaskSet,
                    3 => TmfFunction::ClearAca,
                    4 => TmfFunction::LogicalUnitReset,
                    5 => TmfFunction::TargetReset,
                    6 => TmfFunction::ItNexusReset,
                    7 => TmfFunction::QueryTask { tag },
                    8 => TmfFunction::QueryTaskSet,
                    _ => TmfFunction::QueryAsyncEvent,
                };
                let token = self.next_token;
                self.next_token += 1;
                self.tmfs.insert(token);
                let lun = Lun(u64::from(u.int_in_range(0..=2u8)?) << 48);
                self.s.task_management(self.now, lun, function, token);
            }
            2 => {
                if !tokens.is_empty() {
                    let t = tokens[u.choose_index(tokens.len())?];
                    if let Some(l) = self.live.get_mut(&t) {
                        l.abandoned = true;
                        self.s.abandon(self.now, l.tag);
                    }
                }
            }
            3 => self.s.close(self.now),
            4 => {
                if self.connected {
                    self.lose();
                } else {
                    self.connect(u)?;
                }
            }
            _ => self.s.login_failed(u.arbitrary()?, "fuzz"),
        }
        Ok(())
    }

    fn op(&mut self, u: &mut Unstructured<'_>) -> Result<()> {
        let k = u.int_in_range(0..=11)?;
        if tracing() {
            eprintln!(
                "op {k} window {:?} connected {}",
                self.s.cmd_window(),
                self.connected
            );
        }
        match k {
            0..=2 => self.submit(u)?,
            3..=5 => self.answer_command(u)?,
            6 | 7 => self.answer_control(u)?,
            8 => self.digest_error(u)?,
            9 => self.tick(u)?,
            _ => self.user(u)?,
        }
        if tracing() {
            eprintln!("  -> live {:?} closed {}", self.live, self.closed);
        }
        self.drain();
        Ok(())
    }

    /// A non-immediate PDU took a CmdSN: from an orderly target's point of
    /// view, the next one and inside the window it gave.
    fn numbered(&mut self, cmd_sn: u32) {
        if self.orderly {
            assert_eq!(cmd_sn, self.exp_cmd_sn, "CmdSN out of sequence");
            assert!(
                sn_le(cmd_sn, self.max_cmd_sn),
                "CmdSN {cmd_sn} past the target's MaxCmdSN {}",
                self.max_cmd_sn
            );
        }
        if sn_le(self.exp_cmd_sn, cmd_sn) {
            self.exp_cmd_sn = cmd_sn.wrapping_add(1);
        }
    }

    fn end(&mut self, token: u32) {
        assert!(self.ended.insert(token), "token {token} ended twice");
    }

    /// Takes everything the session produced, checking it.
    fn drain(&mut self) {
        let p = self.params;
        while let Some(out) = self.s.poll_transmit() {
            let len = check_emitted(&out.pdu, &out.ahs, out.data.slices()) as u32;
            assert!(
                len <= p.max_xmit_data_segment_length,
                "{len} bytes of data past the target's MaxRecvDataSegmentLength {}: {:?}",
                p.max_xmit_data_segment_length,
                out.pdu
            );
            match out.pdu {
                Pdu::ScsiCommand(c) => {
                    if !c.immediate {
                        self.numbered(c.cmd_sn);
                    }
                    let write_len = if c.write {
                        c.expected_data_transfer_length
                    } else {
                        0
                    };
                    if len > 0 {
                        assert!(p.immediate_data, "immediate data with ImmediateData=No");
                        assert!(len <= p.first_burst_length && len <= write_len);
                    }
                    if self.order.len() < 1024 {
                        self.order.push_back(c.itt);
                    }
                    self.sent.insert(
                        c.itt,
                        Sent {
                            lun: c.lun,
                            read_len: if c.read {
                                c.expected_data_transfer_length
                            } else {
                                0
                            },
                            write_len,
                            data_in: 0,
                            data_sn: 0,
                            solicited: if p.initial_r2t {
                                0
                            } else {
                                write_len.min(p.first_burst_length)
                            },
                            r2t_sn: 0,
                        },
                    );
                }
                Pdu::DataOut(d) => {
                    let end = u64::from(d.buffer_offset) + u64::from(len);
                    if d.ttt == RESERVED_TAG {
                        assert!(!p.initial_r2t, "unsolicited Data-Out with InitialR2T=Yes");
                        assert!(
                            end <= u64::from(p.first_burst_length),
                            "unsolicited past FirstBurstLength"
                        );
                    } else {
                        let Some(given) = self.r2ts.get(&d.ttt) else {
                            panic!("Data-Out for a TTT no R2T gave: {d:?}");
                        };
                        assert!(
                            given.iter().any(|&(itt, off, n)| itt == d.itt
                                && d.buffer_offset >= off
                                && end <= u64::from(off) + u64::from(n)),
                            "Data-Out outside the R2Ts with its TTT {given:?}: {d:?}"
                        );
                    }
                    if let Some(c) = self.sent.get(&d.itt) {
                        assert!(
                            end <= u64::from(c.write_len),
                            "Data-Out past the command's data-out"
                        );
                    }
                }
                Pdu::TaskMgmtRequest(t) => {
                    if !t.immediate {
                        self.numbered(t.cmd_sn);
                    }
                    self.tmf_itts.push(t.itt);
                }
                Pdu::NopOut(n) if n.itt != RESERVED_TAG => {
                    if !n.immediate {
                        self.numbered(n.cmd_sn);
                    }
                    self.ping_itts.push(n.itt);
                }
                Pdu::LogoutRequest(l) => {
                    if !l.immediate {
                        self.numbered(l.cmd_sn);
                    }
                    self.logout_itt = Some(l.itt);
                }
                _ => {}
            }
        }
        while let Some(ev) = self.s.poll_event() {
            match ev {
                Event::Command { token, outcome } => {
                    if tracing() {
                        eprintln!("  ended {token}: {:?}", outcome.as_ref().map(|r| r.status));
                    }
                    let Some(l) = self.live.remove(&token) else {
                        panic!("an outcome for token {token}, which is not waiting");
                    };
                    self.end(token);
                    if let Ok(r) = outcome {
                        assert!(
                            r.data_in_total() <= l.data_in_len as usize,
                            "{} bytes of data-in for a command that asked for {}",
                            r.data_in_total(),
                            l.data_in_len
                        );
                    }
                }
                Event::Tmf { token, .. } => {
                    assert!(
                        self.tmfs.remove(&token),
                        "a TMF outcome for token {token}, not waiting"
                    );
                    self.end(token);
                }
                Event::Closed => {
                    assert!(!self.closed, "closed twice");
                    self.closed = true;
                }
            }
        }
    }

    /// The connection is lost and the clock runs until the session has
    /// nothing left to time: every command and function must have ended.
    fn finish(&mut self) {
        self.lose();
        self.drain();
        for _ in 0..1000 {
            if tracing() {
                eprintln!(
                    "finish: timeout {:?} live {:?}",
                    self.s
                        .poll_timeout()
                        .map(|t| t.saturating_duration_since(self.now)),
                    self.live
                );
            }
            let Some(t) = self.s.poll_timeout() else {
                break;
            };
            self.now = self.now.max(t) + Duration::from_millis(1);
            let _ = self.s.handle_timeout(self.now);
            self.drain();
        }
        let waiting: Vec<&Live> = self.live.values().filter(|l| !l.abandoned).collect();
        assert!(waiting.is_empty(), "commands never ended: {waiting:?}");
        assert!(
            self.tmfs.is_empty(),
            "task management never ended: {:?}",
            self.tmfs
        );
    }
}

impl Harness {
    fn new(cfg: SessionConfig) -> Harness {
        let now = Instant::now();
        Harness {
            s: Session::new(cfg, now),
            now,
            params: FfpParams::default(),
            connected: false,
            next_token: 0,
            live: HashMap::new(),
            tmfs: HashSet::new(),
            ended: HashSet::new(),
            closed: false,
            sent: HashMap::new(),
            tmf_itts: Vec::new(),
            ping_itts: Vec::new(),
            logout_itt: None,
            r2ts: HashMap::new(),
            next_ttt: 1,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            window: 1,
            orderly: true,
            order: VecDeque::new(),
        }
    }
}

/// Replays a captured target PDU stream (see the module docs).
fn replay(sel: u8, stream: &[u8]) {
    let big = 1 << 18;
    let mut h = Harness::new(SessionConfig::default());
    let params = FfpParams {
        max_xmit_data_segment_length: big,
        max_recv_data_segment_length: big,
        max_burst_length: 1 << 20,
        first_burst_length: big,
        initial_r2t: false,
        immediate_data: true,
        protocol_level: 2,
        ..FfpParams::default()
    };
    h.connect_with(params, 1, 1, 64);
    for i in 0..16u8 {
        let lun = Lun(u64::from(i % 2) << 48);
        let request = if i % 2 == 0 {
            Request::new(
                lun,
                Bytes::from_static(&[0x28, 0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
                64 << 10,
            )
        } else {
            let cdb = Bytes::from_static(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 0x80, 0]);
            Request::with_data_out(lun, cdb, Bytes::from(vec![i; 64 << 10]))
        };
        h.submit_request(request);
    }
    h.drain();
    let framer = replay_framer(sel, big);
    let mut buf = BytesMut::from(stream);
    // Captured ITTs, mapped to ours in order of appearance.
    let mut itts: HashMap<u32, u32> = HashMap::new();
    while h.connected {
        let (frame, mut bhs) = match next_pdu(&framer, &mut buf) {
            Next::Pdu(f, bhs) => (f, bhs),
            Next::DigestError(bhs) => {
                if h.s.handle_digest_error(h.now, &bhs).is_err() {
                    h.lose();
                }
                h.drain();
                continue;
            }
            Next::End => break,
        };
        let op = bhs[0] & 0x3f;
        let itt = u32::from_be_bytes([bhs[16], bhs[17], bhs[18], bhs[19]]);
        if itt != RESERVED_TAG {
            let next = h.order.pop_front().unwrap_or(itt);
            put32(&mut bhs, 16, *itts.entry(itt).or_insert(next));
        }
        let status = match op {
            0x20 => itt != RESERVED_TAG,
            0x25 => bhs[1] & 1 != 0,
            0x31 => false,
            _ => true,
        };
        let (stat_sn, exp_cmd_sn, max_cmd_sn) = h.next_numbers(status);
        put32(&mut bhs, 24, stat_sn);
        put32(&mut bhs, 28, exp_cmd_sn);
        put32(&mut bhs, 32, max_cmd_sn);
        let frame = PduFrame {
            bhs: Bytes::copy_from_slice(&bhs),
            ..frame
        };
        if let Ok(Pdu::R2t(r)) = frame.parse() {
            h.r2ts.entry(r.ttt).or_default().push((
                r.itt,
                r.buffer_offset,
                r.desired_data_transfer_length,
            ));
        }
        if tracing() {
            eprintln!("replay {:?} +{}", frame.parse(), frame.data.len());
        }
        h.feed(Some(frame));
        h.drain();
    }
    h.finish();
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut h = Harness::new(config(u)?);
    h.connect(u)?;
    h.drain();
    let mut ops = 0;
    while !u.is_empty() && ops < 512 && h.op(u).is_ok() {
        ops += 1;
    }
    h.finish();
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
