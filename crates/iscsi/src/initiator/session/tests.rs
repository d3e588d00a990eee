//! The initiator session against the target's sans-IO session and an
//! emulated LU, in virtual time: every PDU goes through the real encoder
//! and framer in both directions.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use unifab_scsi_core::backend::MemoryBackend;
use unifab_scsi_core::emulated::{EmulatedLu, EmulatedLuConfig, IoMode};
use unifab_scsi_core::sense::{Sense, SenseKey, asc};
use unifab_scsi_core::{BoxFuture, ItNexus, LogicalUnit, TargetPort, TransportId};

use super::*;
use crate::target::session::{Event as TEvent, OutPdu as TOut, Session as TSession, SessionLimits};
use crate::wire::{Digests, Framer, digest, encode_header, frame::padding};

const LBA_BYTES: usize = 512;

fn nexus() -> ItNexus {
    ItNexus::new(
        TransportId::Iscsi {
            name: "iqn.2026-11.test:ini".into(),
            isid: Some([0x80, 0, 0, 0, 0, 1]),
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

fn lu() -> Arc<EmulatedLu> {
    let cfg = EmulatedLuConfig {
        io_mode: IoMode::Inline,
        ..EmulatedLuConfig::default()
    };
    Arc::new(EmulatedLu::new(cfg, Arc::new(MemoryBackend::new(16 << 20))).unwrap())
}

fn encode(pdu: &Pdu, ahs: &[u8], data: &DataSegment, digests: Digests) -> Vec<u8> {
    let len = data.len();
    let h = encode_header(pdu, ahs, len as u32, digests.header).unwrap();
    let mut v = h.to_vec();
    for s in data.slices() {
        v.extend_from_slice(s);
    }
    if len > 0 {
        v.extend_from_slice(padding(len));
        if digests.data {
            let crc = digest::data_digest(data.slices().iter().map(|b| &b[..]));
            v.extend_from_slice(&digest::to_wire(crc));
        }
    }
    v
}

fn poll<F: Future + Unpin + ?Sized>(f: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(f).poll(&mut cx)
}

/// What each side sent, for assertions.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Ini(Pdu),
    Tgt(Pdu),
}

struct Pair {
    now: Instant,
    ini: Session<u32>,
    tgt: TSession,
    lu: Arc<EmulatedLu>,
    tparams: FfpParams,
    limits: SessionLimits,
    digests: Digests,
    running: Vec<(u32, BoxFuture<'static, TaskResult>)>,
    tmfs: Vec<(u32, BoxFuture<'static, TmfResponse>)>,
    /// While true, the LU's answers wait (except for tasks a task
    /// management function names, which the target needs to end).
    hold: bool,
    released: std::collections::HashSet<u32>,
    /// The target receives nothing while true (a stopped peer).
    deaf: bool,
    outcomes: HashMap<u32, Outcome>,
    tmf_results: HashMap<u32, Result<TmfResponse, InitiatorError>>,
    closed: bool,
    conn_error: Option<ConnectionError>,
    seen: Vec<Seen>,
    /// Corrupt the data digest of the next Data-In the target sends.
    corrupt_next_data_in: bool,
    next_token: u32,
    /// The largest data segment the initiator sent.
    largest_segment: usize,
    /// Each R2T the target sends reaches the initiator this many times
    /// more (a target asking for the same data again).
    repeat_r2t: usize,
}

impl Pair {
    fn new(cfg: SessionConfig, tparams: FfpParams, limits: SessionLimits) -> Pair {
        Pair::with_lu(cfg, tparams, limits, lu())
    }

    fn with_lu(
        cfg: SessionConfig,
        tparams: FfpParams,
        limits: SessionLimits,
        lu: Arc<EmulatedLu>,
    ) -> Pair {
        let now = Instant::now();
        let mut p = Pair {
            now,
            ini: Session::new(cfg, now),
            tgt: TSession::new(nexus(), 1, tparams, limits, 0, 0, now),
            lu,
            tparams,
            limits,
            digests: Digests::default(),
            running: Vec::new(),
            tmfs: Vec::new(),
            hold: false,
            released: Default::default(),
            deaf: false,
            outcomes: HashMap::new(),
            tmf_results: HashMap::new(),
            closed: false,
            conn_error: None,
            seen: Vec::new(),
            corrupt_next_data_in: false,
            next_token: 1,
            largest_segment: 0,
            repeat_r2t: 0,
        };
        p.connect(1000, 500);
        // Clear the power-on unit attention.
        let t = p.submit(Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0));
        p.run();
        assert!(p.outcomes.remove(&t).unwrap().is_ok());
        p.seen.clear();
        p
    }

    fn iparams(&self) -> FfpParams {
        FfpParams {
            protocol_level: 2,
            ..self.tparams.mirrored()
        }
    }

    /// A new connection and target session (reinstatement).
    fn connect(&mut self, cmd_sn: u32, stat_sn: u32) {
        self.tgt = TSession::new(
            nexus(),
            1,
            self.tparams,
            self.limits,
            cmd_sn,
            stat_sn,
            self.now,
        );
        self.running.clear();
        self.tmfs.clear();
        self.conn_error = None;
        self.deaf = false;
        let depth = self.limits.queue_depth;
        let p = self.iparams();
        self.ini.connected(
            self.now,
            p,
            StartSn {
                cmd_sn,
                max_cmd_sn: cmd_sn.wrapping_add(depth - 1),
                exp_stat_sn: stat_sn,
            },
        );
        self.run();
    }

    fn submit(&mut self, r: Request) -> u32 {
        let t = self.next_token;
        self.next_token += 1;
        self.ini.submit(self.now, r, t).map_err(|(e, _)| e).unwrap();
        t
    }

    fn framer(&self) -> Framer {
        Framer {
            digests: self.digests,
            max_data_segment_length: 1 << 24,
        }
    }

    fn deliver_to_target(&mut self, o: OutPdu) {
        self.seen.push(Seen::Ini(o.pdu));
        self.largest_segment = self.largest_segment.max(o.data.len());
        if self.deaf {
            return;
        }
        let wire = encode(&o.pdu, &o.ahs, &o.data, self.digests);
        let frame = self
            .framer()
            .decode(&mut BytesMut::from(&wire[..]))
            .unwrap()
            .unwrap();
        self.tgt.handle_frame(self.now, frame).unwrap();
    }

    fn deliver_to_initiator(&mut self, o: TOut) {
        if matches!(o.pdu, Pdu::R2t(_)) {
            let n = std::mem::take(&mut self.repeat_r2t);
            for _ in 0..n {
                self.deliver_to_initiator(TOut {
                    pdu: o.pdu,
                    data: o.data.clone(),
                });
            }
            self.repeat_r2t = n;
        }
        self.seen.push(Seen::Tgt(o.pdu));
        let mut wire = encode(&o.pdu, &[], &o.data, self.digests);
        if self.corrupt_next_data_in && matches!(o.pdu, Pdu::DataIn(_)) && self.digests.data {
            self.corrupt_next_data_in = false;
            let n = wire.len();
            wire[n - 1] ^= 0xff;
        }
        match self.framer().decode(&mut BytesMut::from(&wire[..])) {
            Ok(Some(frame)) => {
                if let Err(e) = self.ini.handle_frame(self.now, frame) {
                    self.conn_error.get_or_insert(e);
                }
            }
            Err(crate::wire::WireError::DataDigest { bhs, .. }) => {
                if let Err(e) = self.ini.handle_digest_error(self.now, &bhs) {
                    self.conn_error.get_or_insert(e);
                }
            }
            other => panic!("{other:?}"),
        }
    }

    fn run(&mut self) {
        for _ in 0..10_000 {
            let mut progress = false;
            while let Some(o) = self.ini.poll_transmit() {
                progress = true;
                self.deliver_to_target(o);
            }
            while let Some(ev) = self.tgt.poll_event() {
                progress = true;
                match ev {
                    TEvent::Execute { itt, task } => {
                        self.running.push((itt, self.lu.execute(task)))
                    }
                    TEvent::TaskManagement { itt, request } => {
                        match request.function {
                            TmfFunction::AbortTask { tag } => {
                                self.released.insert(tag as u32);
                            }
                            f if aborts_tasks(f) => {
                                for (i, _) in &self.running {
                                    self.released.insert(*i);
                                }
                            }
                            _ => {}
                        }
                        self.tmfs.push((itt, self.lu.task_management(request)))
                    }
                    TEvent::Close(_) => {}
                    other => panic!("{other:?}"),
                }
            }
            {
                let mut i = 0;
                while i < self.running.len() {
                    let go = !self.hold || self.released.contains(&self.running[i].0);
                    if !go {
                        i += 1;
                        continue;
                    }
                    if let Poll::Ready(r) = poll(&mut self.running[i].1) {
                        let (itt, _) = self.running.swap_remove(i);
                        self.tgt.complete_task(itt, r);
                        progress = true;
                    } else {
                        i += 1;
                    }
                }
            }
            let mut i = 0;
            while i < self.tmfs.len() {
                if let Poll::Ready(r) = poll(&mut self.tmfs[i].1) {
                    let (itt, _) = self.tmfs.swap_remove(i);
                    self.tgt.complete_tmf(itt, r);
                    progress = true;
                } else {
                    i += 1;
                }
            }
            if !self.deaf {
                while let Some(o) = self.tgt.poll_transmit() {
                    progress = true;
                    self.deliver_to_initiator(o);
                }
            }
            while let Some(ev) = self.ini.poll_event() {
                progress = true;
                match ev {
                    Event::Command { token, outcome } => {
                        assert!(
                            self.outcomes.insert(token, outcome).is_none(),
                            "one outcome"
                        );
                    }
                    Event::Tmf { token, result } => {
                        self.tmf_results.insert(token, result);
                    }
                    Event::Closed => self.closed = true,
                }
            }
            if !progress {
                return;
            }
        }
        panic!("no quiescence");
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        if let Err(e) = self.ini.handle_timeout(self.now) {
            self.conn_error.get_or_insert(e);
        }
        if !self.deaf {
            self.tgt.handle_timeout(self.now);
        }
        self.run();
    }

    fn ok(&mut self, token: u32) -> TaskResult {
        match self.outcomes.remove(&token) {
            Some(Ok(r)) => r,
            other => panic!("token {token}: {other:?}"),
        }
    }

    fn err(&mut self, token: u32) -> InitiatorError {
        match self.outcomes.remove(&token) {
            Some(Err(e)) => e,
            other => panic!("token {token}: {other:?}"),
        }
    }

    fn commands_at_target(&self) -> Vec<ScsiCommand> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Ini(Pdu::ScsiCommand(c)) => Some(*c),
                _ => None,
            })
            .collect()
    }
}

fn write16(lba: u64, data: Bytes) -> Request {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&((data.len() / LBA_BYTES) as u32).to_be_bytes());
    Request::with_data_out(Lun(0), Bytes::copy_from_slice(&cdb), data)
}

fn read16(lba: u64, blocks: u32) -> Request {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    Request::new(
        Lun(0),
        Bytes::copy_from_slice(&cdb),
        blocks * LBA_BYTES as u32,
    )
}

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect::<Vec<_>>()
        .into()
}

fn flat(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

fn params(imm: bool, initial_r2t: bool, mrdsl: u32, first: u32, burst: u32) -> FfpParams {
    FfpParams {
        max_recv_data_segment_length: mrdsl,
        max_xmit_data_segment_length: mrdsl,
        max_burst_length: burst,
        first_burst_length: first,
        initial_r2t,
        immediate_data: imm,
        ..FfpParams::default()
    }
}

#[test]
fn writes_and_reads_round_trip_under_every_data_out_mode() {
    for (imm, ir2t) in [(true, true), (true, false), (false, false), (false, true)] {
        for (mrdsl, first, burst) in [
            (8192, 65536, 262_144),
            (4096, 16384, 32768),
            (512, 512, 1024),
        ] {
            let mut p = Pair::new(
                SessionConfig::default(),
                params(imm, ir2t, mrdsl, first, burst),
                SessionLimits::default(),
            );
            for (i, len) in [512usize, 4096, 65536, 300 * 1024].into_iter().enumerate() {
                let data = pattern(len, i as u32);
                let w = p.submit(write16(100 + i as u64 * 1000, data.clone()));
                p.run();
                assert_eq!(p.ok(w).status, Status::GOOD, "imm={imm} r2t={ir2t} {mrdsl}");
                let r = p.submit(read16(100 + i as u64 * 1000, (len / LBA_BYTES) as u32));
                p.run();
                let res = p.ok(r);
                assert_eq!(res.status, Status::GOOD);
                assert!(
                    flat(&res) == data.to_vec(),
                    "imm={imm} r2t={ir2t} len={len}"
                );
                assert_eq!(res.residual, None);
            }
            // No data segment ever exceeded the target's limit.
            assert!(p.largest_segment <= mrdsl as usize, "{}", p.largest_segment);
            assert!(p.largest_segment > 0);
            assert_eq!(p.ini.command_count(), 0);
        }
    }
}

#[test]
fn immediate_and_unsolicited_data_respect_first_burst() {
    let mut p = Pair::new(
        SessionConfig::default(),
        params(true, false, 4096, 16384, 65536),
        SessionLimits::default(),
    );
    let w = p.submit(write16(0, pattern(64 * 1024, 9)));
    p.run();
    assert_eq!(p.ok(w).status, Status::GOOD);
    let mut unsolicited = 0usize;
    let mut solicited = 0usize;
    for s in &p.seen {
        match s {
            Seen::Ini(Pdu::ScsiCommand(c)) => assert!(!c.final_flag, "unsolicited data follows"),
            Seen::Ini(Pdu::DataOut(d)) if d.ttt == RESERVED_TAG => unsolicited += 1,
            Seen::Ini(Pdu::DataOut(_)) => solicited += 1,
            _ => {}
        }
    }
    // 4 KiB immediate + 12 KiB unsolicited in 4 KiB PDUs, the rest by R2T.
    assert_eq!(unsolicited, 3);
    assert_eq!(solicited, (64 - 16) / 4);
}

#[test]
fn a_target_asking_for_the_same_data_again_gets_it_once_and_the_command_fails() {
    let mut p = Pair::new(
        SessionConfig::default(),
        params(false, true, 8192, 65536, 262_144),
        SessionLimits::default(),
    );
    // Every R2T a thousand times over: the data goes once (eight 8 KiB
    // Data-Outs for 64 KiB), not a thousand times, and the command fails
    // with the protocol error once the target answers.
    p.repeat_r2t = 1000;
    let w = p.submit(write16(0, pattern(64 * 1024, 3)));
    p.run();
    let data_outs = p
        .seen
        .iter()
        .filter(|s| matches!(s, Seen::Ini(Pdu::DataOut(_))))
        .count();
    assert_eq!(data_outs, 8);
    assert_eq!(
        p.err(w),
        InitiatorError::Protocol("R2Ts ask for more data than the command carries")
    );
    // A target that asks once: the session goes on.
    p.repeat_r2t = 0;
    let w = p.submit(write16(0, pattern(64 * 1024, 4)));
    p.run();
    assert_eq!(p.ok(w).status, Status::GOOD);
}

#[test]
fn commands_pipeline_within_the_cmdsn_window() {
    let limits = SessionLimits {
        queue_depth: 4,
        ..SessionLimits::default()
    };
    let mut p = Pair::new(SessionConfig::default(), FfpParams::default(), limits);
    p.hold = true;
    let tokens: Vec<u32> = (0..20).map(|i| p.submit(read16(i, 1))).collect();
    p.run();
    // Only the window's worth went out.
    assert_eq!(p.commands_at_target().len(), 4);
    assert_eq!(p.ini.outstanding(), 4);
    p.hold = false;
    p.run();
    for t in tokens {
        assert_eq!(p.ok(t).status, Status::GOOD);
    }
    let cmds = p.commands_at_target();
    assert_eq!(cmds.len(), 20);
    // CmdSN in submission order, no gaps.
    for w in cmds.windows(2) {
        assert_eq!(w[1].cmd_sn, w[0].cmd_sn.wrapping_add(1));
    }
    let lbas: Vec<u8> = cmds.iter().map(|c| c.cdb[9]).collect();
    assert_eq!(lbas, (0..20).collect::<Vec<u8>>());
}

#[test]
fn status_sense_and_residuals_come_back_unchanged() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    // LBA out of range: CHECK CONDITION with the LU's sense.
    let t = p.submit(read16(1 << 40, 1));
    p.run();
    let r = p.ok(t);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let s = Sense::parse(r.sense.as_deref().unwrap()).unwrap();
    assert_eq!(
        (s.key, s.asc),
        (SenseKey::ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE)
    );
    assert!(r.data_in.is_empty());
    // INQUIRY with an expected length beyond the data: underflow.
    let t = p.submit(Request::new(
        Lun(0),
        Bytes::from_static(&[0x12, 0, 0, 0x01, 0, 0]),
        256,
    ));
    p.run();
    let r = p.ok(t);
    assert_eq!(r.status, Status::GOOD);
    let n = r.data_in_total() as u32;
    assert!(n < 256);
    assert_eq!(r.residual, Some(Residual::Underflow(256 - n)));
    // READ of 2 blocks with room for 1: overflow, 1 block of data.
    let mut req = read16(0, 2);
    req.data_in_len = 512;
    let t = p.submit(req);
    p.run();
    let r = p.ok(t);
    assert_eq!(r.data_in_total(), 512);
    assert_eq!(r.residual, Some(Residual::Overflow(512)));
    // READ with an expected length of 0: still a read (R bit), and the
    // target's overflow comes back.
    let mut req = read16(0, 1);
    req.data_in_len = 0;
    let t = p.submit(req);
    p.run();
    let r = p.ok(t);
    assert!(r.data_in.is_empty());
    assert_eq!(r.residual, Some(Residual::Overflow(512)));
    let c = *p.commands_at_target().last().unwrap();
    assert!(c.read && !c.write && c.expected_data_transfer_length == 0);
    // A 32-byte CDB travels in an extended-CDB AHS; the LU refuses the
    // unknown opcode with its own sense.
    let t = p.submit(Request::new(Lun(0), Bytes::from(vec![0x7f; 32]), 0));
    p.run();
    let r = p.ok(t);
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let s = Sense::parse(r.sense.as_deref().unwrap()).unwrap();
    assert_eq!(s.key, SenseKey::ILLEGAL_REQUEST);
}

#[test]
fn a_command_without_answer_times_out_and_is_aborted_at_the_target() {
    let cfg = SessionConfig {
        command_timeout: Duration::from_secs(10),
        nop_interval: None,
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    p.hold = true;
    let t = p.submit(read16(0, 1));
    p.run();
    p.advance(Duration::from_secs(9));
    assert!(!p.outcomes.contains_key(&t));
    p.advance(Duration::from_secs(1));
    assert_eq!(
        p.err(t),
        InitiatorError::Timeout {
            after: Duration::from_secs(10)
        }
    );
    // ABORT TASK went out for it and the target confirmed.
    assert!(p.seen.iter().any(
        |s| matches!(s, Seen::Ini(Pdu::TaskMgmtRequest(r)) if r.function == TmfCode::ABORT_TASK)
    ));
    assert!(
        p.seen
            .iter()
            .any(|s| matches!(s, Seen::Tgt(Pdu::TaskMgmtResponse(_))))
    );
    assert_eq!(
        p.ini.command_count(),
        0,
        "the slot is free once the abort is confirmed"
    );
    assert!(p.conn_error.is_none());
}

#[test]
fn an_unanswered_abort_declares_the_connection_dead() {
    let cfg = SessionConfig {
        command_timeout: Duration::from_secs(10),
        tmf_timeout: Duration::from_secs(3),
        nop_interval: None,
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    let t = p.submit(read16(0, 1));
    p.deaf = true;
    p.run();
    p.advance(Duration::from_secs(10));
    assert!(matches!(
        p.outcomes.remove(&t),
        Some(Err(InitiatorError::Timeout { .. }))
    ));
    assert!(p.conn_error.is_none());
    p.advance(Duration::from_secs(3));
    assert_eq!(p.conn_error, Some(ConnectionError::TmfTimeout));
    p.ini.connection_lost(p.now);
    assert_eq!(p.ini.command_count(), 0);
}

/// The target pings (NOP-In with `ttt` and `data`): the initiator's answer.
fn target_ping(p: &mut Pair, ttt: u32, data: Bytes) -> OutPdu {
    let frame = encode(
        &Pdu::NopIn(NopIn {
            lun: 0,
            itt: RESERVED_TAG,
            ttt,
            stat_sn: 501,
            exp_cmd_sn: 1001,
            max_cmd_sn: 1100,
        }),
        &[],
        &DataSegment::One(data),
        Digests::default(),
    );
    let f = p
        .framer()
        .decode(&mut BytesMut::from(&frame[..]))
        .unwrap()
        .unwrap();
    p.ini.handle_frame(p.now, f).unwrap();
    p.ini.poll_transmit().unwrap()
}

#[test]
fn nop_pings_detect_a_dead_peer_and_answer_the_targets() {
    let cfg = SessionConfig {
        nop_interval: Some(Duration::from_secs(5)),
        nop_timeout: Duration::from_secs(5),
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    // Alive: the target answers our pings.
    for _ in 0..4 {
        p.advance(Duration::from_secs(5));
    }
    assert!(p.conn_error.is_none());
    let pings = p
        .seen
        .iter()
        .filter(|s| matches!(s, Seen::Ini(Pdu::NopOut(n)) if n.itt != RESERVED_TAG))
        .count();
    assert!(pings >= 2, "{pings}");
    // Stopped: no answer within the NOP timeout.
    p.deaf = true;
    p.advance(Duration::from_secs(5));
    assert!(p.conn_error.is_none());
    p.advance(Duration::from_secs(5));
    assert_eq!(p.conn_error, Some(ConnectionError::PeerDead));

    // The target's own ping gets its TTT and data back.
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    let o = target_ping(&mut p, 0x1234, Bytes::from_static(b"ping"));
    match o.pdu {
        Pdu::NopOut(n) => {
            assert_eq!((n.itt, n.ttt), (RESERVED_TAG, 0x1234));
            assert_eq!(o.data, DataSegment::One(Bytes::from_static(b"ping")));
        }
        other => panic!("{other:?}"),
    }

    // Ping data longer than the target accepts comes back cut to its
    // MaxRecvDataSegmentLength (ours, which bounds what came, is larger).
    let mut tp = params(true, true, 512, 512, 512);
    tp.max_xmit_data_segment_length = 8192;
    let mut p = Pair::new(SessionConfig::default(), tp, SessionLimits::default());
    let ping = pattern(3000, 7);
    let o = target_ping(&mut p, 0x1235, ping.clone());
    assert!(matches!(o.pdu, Pdu::NopOut(n) if n.ttt == 0x1235), "{o:?}");
    assert_eq!(o.data, DataSegment::One(ping.slice(..512)));
}

#[test]
fn connection_loss_resends_idempotent_commands_in_order_and_fails_the_rest() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let w1 = p.submit(write16(10, pattern(4096, 1)));
    let r1 = p.submit(read16(10, 8));
    // PERSISTENT RESERVE OUT (REGISTER): not idempotent.
    let mut pr = [0u8; 10];
    pr[0] = 0x5f;
    pr[8] = 24;
    let mut plist = vec![0u8; 24];
    plist[15] = 7;
    let pro = p.submit(Request::with_data_out(
        Lun(0),
        Bytes::copy_from_slice(&pr),
        Bytes::from(plist),
    ));
    let w2 = p.submit(write16(10, pattern(4096, 2)));
    p.run();
    assert_eq!(p.ini.outstanding(), 4);
    p.seen.clear();
    // The connection drops; the target's tasks are gone with it.
    p.ini.connection_lost(p.now);
    p.run();
    assert_eq!(p.err(pro), InitiatorError::Disconnected);
    assert_eq!(p.ini.command_count(), 3);
    p.hold = false;
    p.connect(77, 9);
    p.run();
    assert_eq!(p.ok(w1).status, Status::GOOD);
    assert_eq!(p.ok(w2).status, Status::GOOD);
    let cmds = p.commands_at_target();
    // Sent again in their original order, then the read sees... whatever
    // the order gives: w1, r1, w2.
    assert_eq!(
        cmds.iter().map(|c| c.cdb[0]).collect::<Vec<_>>(),
        vec![0x8a, 0x88, 0x8a]
    );
    assert_eq!(cmds[0].cmd_sn, 77);
    let r = p.ok(r1);
    // The power-on unit attention of the new nexus comes back unchanged
    // (this target session is new); or the data if it was consumed.
    assert!(r.status == Status::GOOD || r.status == Status::CHECK_CONDITION);
    // The disk holds the last write.
    let t = p.submit(read16(10, 8));
    p.run();
    let mut r = p.ok(t);
    if r.status != Status::GOOD {
        let t = p.submit(read16(10, 8));
        p.run();
        r = p.ok(t);
    }
    assert!(flat(&r) == pattern(4096, 2).to_vec());
}

#[test]
fn commands_wait_for_a_connection_until_their_deadline() {
    let cfg = SessionConfig {
        command_timeout: Duration::from_secs(10),
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    p.ini.connection_lost(p.now);
    let a = p.submit(read16(0, 1));
    p.advance(Duration::from_secs(4));
    let b = p.submit(read16(0, 1));
    p.advance(Duration::from_secs(6));
    assert!(matches!(
        p.outcomes.remove(&a),
        Some(Err(InitiatorError::Timeout { .. }))
    ));
    assert!(!p.outcomes.contains_key(&b));
    p.connect(5, 5);
    p.run();
    assert!(p.outcomes.remove(&b).unwrap().is_ok());
    // A permanent login failure fails queued commands at once.
    p.ini.connection_lost(p.now);
    let c = p.submit(read16(0, 1));
    p.ini.login_failed(true, "authentication failed");
    p.run();
    assert!(matches!(
        p.outcomes.remove(&c),
        Some(Err(InitiatorError::Unreachable { .. }))
    ));
}

#[test]
fn abort_task_and_abort_task_set_end_the_commands_once_confirmed() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let a = p.submit(read16(0, 1));
    let b = p.submit(read16(1, 1));
    let c = p.submit(read16(2, 1));
    p.run();
    let tag_a = {
        // Tags are assigned in order: recover a's tag through QUERY TASK.
        let mut tags = Vec::new();
        for i in 0..p.ini.slots.len() {
            if let Some(c) = p.ini.cmd_ref(i as u16) {
                tags.push((c.cmd_sn, c.tag));
            }
        }
        tags.sort();
        tags[0].1
    };
    p.ini
        .task_management(p.now, Lun(0), TmfFunction::QueryTask { tag: tag_a }, 900);
    p.run();
    assert_eq!(
        p.tmf_results.remove(&900),
        Some(Ok(TmfResponse::FunctionSucceeded))
    );
    p.ini
        .task_management(p.now, Lun(0), TmfFunction::AbortTask { tag: tag_a }, 901);
    p.run();
    assert_eq!(
        p.tmf_results.remove(&901),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(p.err(a), InitiatorError::Aborted);
    // ABORT TASK for a finished command: FUNCTION COMPLETE, nothing sent.
    let before = p.seen.len();
    p.ini
        .task_management(p.now, Lun(0), TmfFunction::AbortTask { tag: tag_a }, 902);
    p.run();
    assert_eq!(
        p.tmf_results.remove(&902),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(p.seen.len(), before);
    // A queued command (window closed) plus two outstanding: ABORT TASK SET.
    p.ini.max_cmd_sn = p.ini.cmd_sn.wrapping_sub(1);
    let d = p.submit(read16(3, 1));
    p.ini
        .task_management(p.now, Lun(0), TmfFunction::AbortTaskSet, 903);
    p.run();
    assert_eq!(p.err(d), InitiatorError::Aborted, "never sent");
    assert_eq!(
        p.tmf_results.remove(&903),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(p.err(b), InitiatorError::Aborted);
    assert_eq!(p.err(c), InitiatorError::Aborted);
    assert_eq!(p.ini.command_count(), 0);
    // The target sent no response for them.
    assert!(!p.seen.iter().any(|s| matches!(
        s,
        Seen::Tgt(Pdu::ScsiResponse(_)) | Seen::Tgt(Pdu::DataIn(_))
    )));
    // LU reset.
    p.hold = true;
    let e = p.submit(read16(4, 1));
    p.run();
    p.ini
        .task_management(p.now, Lun(0), TmfFunction::LogicalUnitReset, 904);
    p.run();
    assert_eq!(
        p.tmf_results.remove(&904),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(p.err(e), InitiatorError::Aborted);
}

#[test]
fn dropping_a_future_aborts_the_command() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let _a = p.submit(read16(0, 1));
    p.run();
    let tag = (0..p.ini.slots.len())
        .find_map(|i| p.ini.cmd_ref(i as u16).map(|c| c.tag))
        .unwrap();
    p.ini.abandon(p.now, tag);
    p.run();
    assert!(p.seen.iter().any(
        |s| matches!(s, Seen::Ini(Pdu::TaskMgmtRequest(r)) if r.function == TmfCode::ABORT_TASK)
    ));
    assert_eq!(p.ini.command_count(), 0);
    assert!(p.outcomes.is_empty(), "nobody waits for it");
}

#[test]
fn a_data_digest_error_on_data_in_sends_the_read_again() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.digests = Digests {
        header: true,
        data: true,
    };
    let data = pattern(8192, 5);
    let w = p.submit(write16(50, data.clone()));
    p.run();
    assert_eq!(p.ok(w).status, Status::GOOD);
    p.corrupt_next_data_in = true;
    let r = p.submit(read16(50, 16));
    p.run();
    let res = p.ok(r);
    assert!(
        flat(&res) == data.to_vec(),
        "the good copy, never the corrupt one"
    );
    assert_eq!(
        p.commands_at_target()
            .iter()
            .filter(|c| c.cdb[0] == 0x88)
            .count(),
        2,
        "sent twice"
    );
    assert!(p.conn_error.is_none());
}

#[test]
fn data_in_beyond_the_expected_length_fails_only_that_command() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let t = p.submit(read16(0, 1));
    p.run();
    // The target's task produces two blocks for a one-block read.
    let (itt, _) = p.running.pop().unwrap();
    p.tgt
        .complete_task(itt, TaskResult::with_data(Bytes::from(vec![0u8; 1024])));
    p.hold = false;
    p.run();
    // The target sends only EDTL bytes with overflow: not an error.
    let r = p.ok(t);
    assert_eq!(r.data_in_total(), 512);
    // A hand-made Data-In past the end is refused.
    p.hold = true;
    let t = p.submit(read16(0, 1));
    p.run();
    let cmd_itt = match p.commands_at_target().last() {
        Some(c) => c.itt,
        None => panic!(),
    };
    let bad = encode(
        &Pdu::DataIn(DataIn {
            final_flag: true,
            status_present: true,
            itt: cmd_itt,
            ttt: RESERVED_TAG,
            stat_sn: 9999,
            exp_cmd_sn: p.ini.exp_cmd_sn,
            max_cmd_sn: p.ini.max_cmd_sn,
            ..DataIn::default()
        }),
        &[],
        &DataSegment::One(Bytes::from(vec![1u8; 1024])),
        Digests::default(),
    );
    let f = p
        .framer()
        .decode(&mut BytesMut::from(&bad[..]))
        .unwrap()
        .unwrap();
    p.ini.handle_frame(p.now, f).unwrap();
    p.run();
    assert!(matches!(
        p.outcomes.remove(&t),
        Some(Err(InitiatorError::Protocol(_)))
    ));
}

/// A read answered with a long Data-In and then one byte per Data-In:
/// the long one is kept as it came, the tiny ones gathered into one
/// buffer, and the data is whole and in order.
#[test]
fn tiny_data_ins_are_gathered() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let t = p.submit(read16(0, 8));
    p.run();
    let cmd_itt = match p.commands_at_target().last() {
        Some(c) => c.itt,
        None => panic!(),
    };
    let want: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut pieces = vec![(0usize, 2048usize)];
    pieces.extend((2048..4096).map(|o| (o, 1)));
    let last = pieces.len() - 1;
    for (sn, (at, len)) in pieces.into_iter().enumerate() {
        let pdu = encode(
            &Pdu::DataIn(DataIn {
                final_flag: sn == last,
                status_present: sn == last,
                itt: cmd_itt,
                ttt: RESERVED_TAG,
                stat_sn: 9999,
                exp_cmd_sn: p.ini.exp_cmd_sn,
                max_cmd_sn: p.ini.max_cmd_sn,
                data_sn: sn as u32,
                buffer_offset: at as u32,
                ..DataIn::default()
            }),
            &[],
            &DataSegment::One(Bytes::copy_from_slice(&want[at..at + len])),
            Digests::default(),
        );
        let f = p
            .framer()
            .decode(&mut BytesMut::from(&pdu[..]))
            .unwrap()
            .unwrap();
        p.ini.handle_frame(p.now, f).unwrap();
    }
    p.run();
    let r = p.ok(t);
    assert_eq!(r.data_in.len(), 2, "one kept, one gathered");
    assert_eq!(r.data_in.concat(), want);
}

#[test]
fn a_rejected_command_fails_with_the_reason() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let t = p.submit(read16(0, 1));
    p.run();
    let c = *p.commands_at_target().last().unwrap();
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&encode(
        &Pdu::ScsiCommand(c),
        &[],
        &DataSegment::None,
        Digests::default(),
    ));
    let rej = encode(
        &Pdu::Reject(Reject {
            reason: crate::wire::RejectReason::INVALID_PDU_FIELD,
            stat_sn: 600,
            exp_cmd_sn: p.ini.exp_cmd_sn,
            max_cmd_sn: p.ini.max_cmd_sn,
            data_sn: 0,
        }),
        &[],
        &DataSegment::One(Bytes::from(hdr)),
        Digests::default(),
    );
    let f = p
        .framer()
        .decode(&mut BytesMut::from(&rej[..]))
        .unwrap()
        .unwrap();
    p.ini.handle_frame(p.now, f).unwrap();
    p.run();
    assert_eq!(p.err(t), InitiatorError::Rejected { reason: 9 });
}

#[test]
fn close_drains_then_logs_out() {
    let mut p = Pair::new(
        SessionConfig::default(),
        FfpParams::default(),
        SessionLimits::default(),
    );
    p.hold = true;
    let t = p.submit(read16(0, 1));
    p.run();
    p.ini.close(p.now);
    // A login failure reported while the connection is up (a driver's
    // mistake) neither closes the session nor strands the command sent.
    p.ini.login_failed(true, "not logging in");
    assert!(!p.ini.is_closed() && !p.closed);
    assert!(matches!(
        p.ini.submit(p.now, read16(0, 1), 77),
        Err((InitiatorError::Closed, 77))
    ));
    p.run();
    assert!(
        !p.seen
            .iter()
            .any(|s| matches!(s, Seen::Ini(Pdu::LogoutRequest(_))))
    );
    p.hold = false;
    p.run();
    assert_eq!(p.ok(t).status, Status::GOOD);
    assert!(
        p.seen
            .iter()
            .any(|s| matches!(s, Seen::Ini(Pdu::LogoutRequest(_))))
    );
    assert_eq!(p.conn_error, Some(ConnectionError::LoggedOut));
    p.ini.connection_lost(p.now);
    p.run();
    assert!(p.closed);
    assert!(p.ini.is_closed());
}

#[test]
fn the_targets_logout_request_drains_logs_out_and_keeps_queued_commands() {
    let limits = SessionLimits {
        queue_depth: 1,
        ..SessionLimits::default()
    };
    let mut p = Pair::new(SessionConfig::default(), FfpParams::default(), limits);
    p.hold = true;
    let a = p.submit(read16(0, 1));
    let b = p.submit(read16(1, 1));
    p.run();
    p.tgt.request_logout(2);
    p.run();
    assert!(
        !p.seen
            .iter()
            .any(|s| matches!(s, Seen::Ini(Pdu::LogoutRequest(_))))
    );
    p.hold = false;
    p.run();
    assert_eq!(p.ok(a).status, Status::GOOD);
    assert_eq!(p.conn_error, Some(ConnectionError::LoggedOut));
    assert!(
        !p.outcomes.contains_key(&b),
        "b waits for the next connection"
    );
    p.ini.connection_lost(p.now);
    assert!(!p.ini.is_closed());
    p.connect(1, 1);
    p.run();
    assert!(p.outcomes.remove(&b).unwrap().is_ok());
}

#[test]
fn the_queue_is_bounded() {
    let cfg = SessionConfig {
        max_commands: 3,
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    p.hold = true;
    for i in 0..3 {
        p.submit(read16(i, 1));
    }
    assert!(matches!(
        p.ini.submit(p.now, read16(0, 1), 5),
        Err((InitiatorError::QueueFull, 5))
    ));
    // A bad request never enters.
    let mut bad = write16(0, pattern(512, 0));
    bad.data_out_len = 1024;
    p.hold = false;
    p.run();
    assert!(matches!(
        p.ini.submit(p.now, bad, 6),
        Err((InitiatorError::InvalidRequest(_), 6))
    ));
}

#[test]
fn slicing_data_out_across_buffers() {
    let a = Bytes::from_static(b"abcdef");
    let b = Bytes::from_static(b"ghij");
    let v = vec![a, b];
    assert_eq!(
        slice_data(&v, 0, 3),
        DataSegment::One(Bytes::from_static(b"abc"))
    );
    assert_eq!(
        slice_data(&v, 4, 4),
        DataSegment::Many(vec![Bytes::from_static(b"ef"), Bytes::from_static(b"gh")])
    );
    assert_eq!(
        slice_data(&v, 6, 4),
        DataSegment::One(Bytes::from_static(b"ghij"))
    );
    assert_eq!(slice_data(&v, 10, 4), DataSegment::None);
}

fn unreachable(p: &mut Pair, token: u32) -> bool {
    matches!(
        p.outcomes.remove(&token),
        Some(Err(InitiatorError::Unreachable { .. }))
    )
}

#[test]
fn replacement_timeout_bounds_the_wait_for_a_lost_connection() {
    let cfg = SessionConfig {
        command_timeout: Duration::from_secs(30),
        replacement_timeout: Some(Duration::from_secs(2)),
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    p.hold = true;
    let sent = p.submit(read16(0, 1));
    p.run();
    assert_eq!(p.ini.outstanding(), 1);
    p.ini.connection_lost(p.now);
    p.run();
    // Sent but unanswered: queued again for the next connection.
    assert!(p.outcomes.is_empty());
    p.advance(Duration::from_secs(1));
    let queued = p.submit(read16(0, 1));
    let tmf = p.next_token;
    p.next_token += 1;
    p.ini
        .task_management(p.now, Lun(1), TmfFunction::LogicalUnitReset, tmf);
    p.advance(Duration::from_millis(999));
    assert!(p.outcomes.is_empty() && p.tmf_results.is_empty());
    // Two seconds without a connection: everything waiting fails, well
    // before the command timeout.
    p.advance(Duration::from_millis(1));
    assert!(unreachable(&mut p, sent));
    assert!(unreachable(&mut p, queued));
    assert!(matches!(
        p.tmf_results.remove(&tmf),
        Some(Err(InitiatorError::Unreachable { .. }))
    ));
    assert_eq!(p.ini.command_count(), 0);
    // Later commands fail at once while the session stays down.
    let late = p.next_token;
    let e = p
        .ini
        .submit(p.now, read16(0, 1), late)
        .map(|_| ())
        .unwrap_err()
        .0;
    assert!(matches!(e, InitiatorError::Unreachable { .. }), "{e:?}");
    // A new connection ends it: commands go out again.
    p.hold = false;
    p.connect(40, 40);
    let after = p.submit(read16(0, 1));
    p.run();
    assert!(p.outcomes.remove(&after).unwrap().is_ok());
    // The clock starts again at the next loss.
    p.ini.connection_lost(p.now);
    let again = p.submit(read16(0, 1));
    p.advance(Duration::from_millis(1999));
    assert!(!p.outcomes.contains_key(&again));
    p.connect(60, 60);
    p.run();
    assert!(p.outcomes.remove(&again).is_some_and(|o| o.is_ok()));
}

#[test]
fn without_replacement_timeout_commands_wait_their_whole_timeout() {
    let cfg = SessionConfig {
        command_timeout: Duration::from_secs(30),
        ..SessionConfig::default()
    };
    let mut p = Pair::new(cfg, FfpParams::default(), SessionLimits::default());
    p.ini.connection_lost(p.now);
    let a = p.submit(read16(0, 1));
    p.advance(Duration::from_secs(29));
    assert!(!p.outcomes.contains_key(&a));
    p.advance(Duration::from_secs(1));
    assert!(matches!(
        p.outcomes.remove(&a),
        Some(Err(InitiatorError::Timeout { .. }))
    ));
}

#[test]
fn replacement_timeout_counts_from_the_start_for_the_first_connection() {
    let cfg = SessionConfig {
        replacement_timeout: Some(Duration::from_secs(3)),
        ..SessionConfig::default()
    };
    let mut now = Instant::now();
    let mut s: Session<u32> = Session::new(cfg, now);
    s.submit(now, read16(0, 1), 1).map_err(|(e, _)| e).unwrap();
    now += Duration::from_secs(2);
    s.handle_timeout(now).unwrap();
    assert!(s.poll_event().is_none());
    s.submit(now, read16(0, 1), 2).map_err(|(e, _)| e).unwrap();
    let due = s.poll_timeout().unwrap();
    assert!(due <= now + Duration::from_secs(1), "{due:?}");
    now += Duration::from_secs(1);
    s.handle_timeout(now).unwrap();
    let mut failed = Vec::new();
    while let Some(e) = s.poll_event() {
        if let Event::Command {
            token,
            outcome: Err(InitiatorError::Unreachable { reason }),
        } = e
        {
            assert!(reason.contains("replacement_timeout"), "{reason}");
            failed.push(token);
        }
    }
    assert_eq!(failed, vec![1, 2]);
}
