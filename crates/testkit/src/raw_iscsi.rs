//! A deliberately simple, synchronous iSCSI initiator for tests: it logs
//! in with unifab's own login state machine, then sends PDUs exactly as the
//! test builds them (including malformed ones) and reads what comes back.
//!
//! It is not the product's initiator: it keeps no window, retries nothing
//! and fails loudly. Tests use it to craft bad input and to do verified I/O
//! beside it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use unifab_iscsi::chap::{ChapConfig, ChapCredentials};
use unifab_iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginOutcome};
use unifab_iscsi::negotiate::{Digest, NegotiationLimits};
use unifab_iscsi::wire::{Digests, Framer, Pdu, PduFrame, ScsiCommand, TaskAttrCode, encode_pdu};

/// Login options.
#[derive(Debug, Clone)]
pub struct RawOptions {
    /// InitiatorName.
    pub initiator: String,
    /// ISID.
    pub isid: [u8; 6],
    /// Ask for header and data digests.
    pub digests: bool,
    /// CHAP user and secret.
    pub chap: Option<(String, String)>,
    /// Read timeout for every receive.
    pub timeout: Duration,
    /// After login, send TEST UNIT READY until it is GOOD, consuming the
    /// power-on and other unit attentions as initiators do.
    pub clear_unit_attention: bool,
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions {
            initiator: "iqn.2026-11.io.unifab:testkit".into(),
            isid: [0x80, 0x00, 0x00, 0x00, 0x00, 0x01],
            digests: false,
            chap: None,
            timeout: Duration::from_secs(10),
            clear_unit_attention: true,
        }
    }
}

/// One logged-in connection.
#[derive(Debug)]
pub struct RawSession {
    stream: TcpStream,
    rbuf: BytesMut,
    framer: Framer,
    /// Digests in use after login.
    pub digests: Digests,
    /// Next CmdSN to use.
    pub cmd_sn: u32,
    /// Last StatSN seen + 1.
    pub exp_stat_sn: u32,
    /// Last MaxCmdSN seen.
    pub max_cmd_sn: u32,
    /// Next ITT.
    pub next_itt: u32,
    /// What login negotiated.
    pub outcome: LoginOutcome,
}

/// The result of a SCSI command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    /// SCSI status.
    pub status: u8,
    /// Data-In, reassembled.
    pub data: Vec<u8>,
    /// Sense data (without the SenseLength prefix).
    pub sense: Vec<u8>,
    /// Residual count and flags (O, U).
    pub residual: (u32, bool, bool),
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl RawSession {
    /// Logs in to `target` at `addr`.
    pub fn login(addr: SocketAddr, target: &str, opts: &RawOptions) -> io::Result<RawSession> {
        let stream = TcpStream::connect_timeout(&addr, opts.timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(opts.timeout))?;
        let digests = if opts.digests {
            vec![Digest::Crc32c]
        } else {
            vec![Digest::None]
        };
        let limits = NegotiationLimits {
            header_digests: digests.clone(),
            data_digests: digests,
            initial_r2t: false,
            immediate_data: true,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 262_144,
            max_outstanding_r2t: 1,
            ..NegotiationLimits::default()
        };
        let mut sm = InitiatorLogin::new(InitiatorLoginConfig {
            initiator_name: opts.initiator.clone(),
            initiator_alias: None,
            target_name: Some(target.to_string()),
            isid: opts.isid,
            tsih: 0,
            cid: 1,
            itt: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            chap: opts.chap.as_ref().map(|(u, s)| {
                (
                    ChapCredentials {
                        name: u.clone(),
                        secret: s.clone().into_bytes(),
                    },
                    None,
                )
            }),
            chap_config: ChapConfig::default(),
            limits,
            session: None,
        })
        .map_err(other)?;
        let mut s = RawSession {
            stream,
            rbuf: BytesMut::with_capacity(65536),
            framer: Framer::default(),
            digests: Digests::default(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            max_cmd_sn: 1,
            next_itt: 1,
            outcome: LoginOutcome {
                initiator_name: String::new(),
                initiator_alias: None,
                target_name: None,
                target_alias: None,
                portal_group_tag: None,
                isid: [0; 6],
                tsih: 0,
                cid: 0,
                session_type: unifab_iscsi::negotiate::SessionType::Normal,
                leading: true,
                chap_name: None,
                session: Default::default(),
                connection: Default::default(),
                digests: Digests::default(),
                next_stat_sn: 0,
                exp_cmd_sn: 0,
            },
        };
        let first = sm.start().map_err(other)?;
        s.send_raw(
            &encode_pdu(
                &Pdu::LoginRequest(first.header),
                &[],
                &first.data,
                Digests::default(),
            )
            .map_err(other)?,
        )?;
        let mut rng: rand::rngs::StdRng = rand::make_rng();
        loop {
            let frame = s.recv()?;
            let Ok(Pdu::LoginResponse(rsp)) = frame.parse() else {
                return Err(other("expected a Login Response"));
            };
            match sm.handle(&rsp, &frame.data, &mut rng) {
                InitiatorStep::Send(p) => {
                    s.send_raw(
                        &encode_pdu(
                            &Pdu::LoginRequest(p.header),
                            &[],
                            &p.data,
                            Digests::default(),
                        )
                        .map_err(other)?,
                    )?;
                }
                InitiatorStep::Complete(outcome) => {
                    s.digests = outcome.digests;
                    s.framer = Framer {
                        digests: outcome.digests,
                        max_data_segment_length: 1 << 24,
                    };
                    s.cmd_sn = outcome.exp_cmd_sn;
                    s.exp_stat_sn = rsp.stat_sn.wrapping_add(1);
                    s.max_cmd_sn = rsp.max_cmd_sn;
                    s.outcome = outcome;
                    if opts.clear_unit_attention {
                        s.clear_unit_attentions()?;
                    }
                    return Ok(s);
                }
                InitiatorStep::Failed(e) => return Err(other(format!("login failed: {e}"))),
            }
        }
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Encodes and sends one PDU with the session's digests.
    pub fn send(&mut self, pdu: &Pdu, data: &[u8]) -> io::Result<()> {
        let b = encode_pdu(pdu, &[], data, self.digests).map_err(other)?;
        self.send_raw(&b)
    }

    /// When a reply sent from now must have arrived: one read timeout
    /// away. The target's NOP-In pings reset the read timeout, so a
    /// command the target never answers would otherwise wait for ever.
    fn reply_deadline(&self) -> Instant {
        let t = self
            .stream
            .read_timeout()
            .ok()
            .flatten()
            .unwrap_or(Duration::from_secs(60));
        Instant::now() + t
    }

    /// [`recv`](Self::recv), failing with `TimedOut` once `deadline` has
    /// passed (however many pings arrived meanwhile).
    fn recv_before(&mut self, deadline: Instant) -> io::Result<PduFrame> {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no reply within the read timeout (the target only pinged)",
            ));
        }
        self.recv()
    }

    /// Receives one PDU (Err on timeout, close, or digest failure).
    pub fn recv(&mut self) -> io::Result<PduFrame> {
        loop {
            match self.framer.decode(&mut self.rbuf) {
                Ok(Some(f)) => {
                    self.track(&f);
                    return Ok(f);
                }
                Ok(None) => {}
                Err(e) => return Err(other(e)),
            }
            let mut tmp = [0u8; 65536];
            let n = self.stream.read(&mut tmp)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.rbuf.extend_from_slice(&tmp[..n]);
        }
    }

    fn track(&mut self, f: &PduFrame) {
        let h = f.header();
        // Target PDUs carry StatSN at word 6 and MaxCmdSN at word 8.
        if !h.opcode().is_initiator() {
            self.max_cmd_sn = h.word8();
        }
    }

    /// True when the target closed the connection (reads EOF or reset
    /// within the timeout).
    pub fn is_closed_by_peer(&mut self) -> bool {
        let mut tmp = [0u8; 4096];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    /// Runs one SCSI command with optional data-out (sent as immediate
    /// data + unsolicited Data-Out, answering R2Ts) and collects the reply.
    pub fn command(
        &mut self,
        cdb: &[u8],
        data_out: &[u8],
        read_len: u32,
    ) -> io::Result<CommandResult> {
        self.command_lun(0, cdb, data_out, read_len)
    }

    /// [`command`](Self::command) to the LU with LUN index `lun`
    /// (single-level peripheral or flat addressing, SAM-5 §4.7).
    pub fn command_lun(
        &mut self,
        lun: u16,
        cdb: &[u8],
        data_out: &[u8],
        read_len: u32,
    ) -> io::Result<CommandResult> {
        let lun = unifab_scsi_core::Lun::from_index(lun)
            .ok_or_else(|| other(format!("LUN index {lun} has no single-level address")))?
            .0;
        let itt = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        let mut c = [0u8; 16];
        c[..cdb.len().min(16)].copy_from_slice(&cdb[..cdb.len().min(16)]);
        let write_len = data_out.len() as u32;
        let imm = if self.outcome.session.immediate_data {
            data_out
                .len()
                .min(self.outcome.session.first_burst_length as usize)
                .min(self.outcome.connection.target_max_recv_data_segment_length as usize)
        } else {
            0
        };
        let pdu = Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_flag: true,
            read: read_len > 0,
            write: write_len > 0,
            attr: TaskAttrCode::SIMPLE,
            lun,
            itt,
            expected_data_transfer_length: if write_len > 0 { write_len } else { read_len },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c,
        });
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(&pdu, &data_out[..imm])?;
        let mut data = vec![0u8; read_len as usize];
        let deadline = self.reply_deadline();
        loop {
            let f = self.recv_before(deadline)?;
            match f.parse().map_err(other)? {
                Pdu::DataIn(d) if d.itt == itt => {
                    let off = d.buffer_offset as usize;
                    let end = off + f.data.len();
                    if end > data.len() {
                        return Err(other("Data-In beyond the expected length"));
                    }
                    data[off..end].copy_from_slice(&f.data);
                    if d.status_present {
                        self.exp_stat_sn = d.stat_sn.wrapping_add(1);
                        return Ok(CommandResult {
                            status: d.status,
                            data,
                            sense: Vec::new(),
                            residual: (d.residual_count, d.overflow, d.underflow),
                        });
                    }
                }
                Pdu::R2t(r) if r.itt == itt => {
                    let mut off = r.buffer_offset as usize;
                    let end = off + r.desired_data_transfer_length as usize;
                    let max = self.outcome.connection.target_max_recv_data_segment_length as usize;
                    let mut sn = 0;
                    while off < end {
                        let len = (end - off).min(max);
                        let d = Pdu::DataOut(unifab_iscsi::wire::DataOut {
                            final_flag: off + len == end,
                            lun,
                            itt,
                            ttt: r.ttt,
                            exp_stat_sn: self.exp_stat_sn,
                            data_sn: sn,
                            buffer_offset: off as u32,
                        });
                        self.send(&d, &data_out[off..off + len])?;
                        sn += 1;
                        off += len;
                    }
                }
                Pdu::ScsiResponse(r) if r.itt == itt => {
                    self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                    let sense = if f.data.len() >= 2 {
                        let n = u16::from_be_bytes([f.data[0], f.data[1]]) as usize;
                        f.data[2..(2 + n).min(f.data.len())].to_vec()
                    } else {
                        Vec::new()
                    };
                    let received =
                        data.len() as u32 - if r.underflow { r.residual_count } else { 0 };
                    if write_len == 0 {
                        data.truncate(received as usize);
                    }
                    return Ok(CommandResult {
                        status: r.status,
                        data,
                        sense,
                        residual: (r.residual_count, r.overflow, r.underflow),
                    });
                }
                Pdu::NopIn(n) if n.itt == u32::MAX && n.ttt != u32::MAX => {
                    // Answer the target's ping.
                    let p = Pdu::NopOut(unifab_iscsi::wire::NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: u32::MAX,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    });
                    self.send(&p, &[])?;
                }
                Pdu::Reject(r) => {
                    return Err(other(format!(
                        "target rejected the command: reason {:#04x}",
                        r.reason.0
                    )));
                }
                other_pdu => {
                    return Err(other(format!("unexpected PDU {other_pdu:?}")));
                }
            }
        }
    }

    /// Sends a task management function as an immediate command to the LU
    /// with LUN index `lun` and waits for its response code.
    pub fn task_management(
        &mut self,
        function: unifab_iscsi::wire::TmfCode,
        lun: u16,
        referenced_task_tag: u32,
    ) -> io::Result<unifab_iscsi::wire::TmfResponseCode> {
        let lun = unifab_scsi_core::Lun::from_index(lun)
            .ok_or_else(|| other(format!("LUN index {lun} has no single-level address")))?
            .0;
        let itt = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1);
        let pdu = Pdu::TaskMgmtRequest(unifab_iscsi::wire::TaskMgmtRequest {
            immediate: true,
            function,
            lun,
            itt,
            referenced_task_tag,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn: self.cmd_sn,
            exp_data_sn: 0,
        });
        self.send(&pdu, &[])?;
        let deadline = self.reply_deadline();
        loop {
            let f = self.recv_before(deadline)?;
            match f.parse().map_err(other)? {
                Pdu::TaskMgmtResponse(r) if r.itt == itt => {
                    self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                    return Ok(r.response);
                }
                Pdu::ScsiResponse(r) => {
                    // A response to an earlier command finishing meanwhile.
                    self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                }
                Pdu::NopIn(_) => {}
                other_pdu => {
                    return Err(other(format!("unexpected PDU {other_pdu:?}")));
                }
            }
        }
    }

    /// TEST UNIT READY until GOOD (at most 16 unit attentions).
    pub fn clear_unit_attentions(&mut self) -> io::Result<()> {
        for _ in 0..16 {
            let r = self.command(&[0, 0, 0, 0, 0, 0], &[], 0)?;
            if r.status == 0 {
                return Ok(());
            }
            // CHECK CONDITION with UNIT ATTENTION (key 6): try again.
            let key = r.sense.get(2).map(|k| k & 0x0f);
            if r.status != 2 || key != Some(6) {
                return Err(other(format!(
                    "TEST UNIT READY: status {:#x} sense {:02x?}",
                    r.status, r.sense
                )));
            }
        }
        Err(other("unit attentions did not clear"))
    }

    /// READ(16) of `blocks` blocks of `block_size` at `lba`.
    pub fn read16(&mut self, lba: u64, blocks: u32, block_size: u32) -> io::Result<CommandResult> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        self.command(&cdb, &[], blocks * block_size)
    }

    /// WRITE(16) of `data` at `lba`, with FUA when asked.
    pub fn write16(
        &mut self,
        lba: u64,
        data: &[u8],
        block_size: u32,
        fua: bool,
    ) -> io::Result<CommandResult> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        if fua {
            cdb[1] = 0x08;
        }
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&((data.len() as u32) / block_size).to_be_bytes());
        self.command(&cdb, data, 0)
    }

    /// SYNCHRONIZE CACHE(10) of the whole medium.
    pub fn synchronize_cache(&mut self) -> io::Result<CommandResult> {
        self.command(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0)
    }

    /// Logs out (close session) and waits for the response.
    pub fn logout(mut self) -> io::Result<()> {
        let p = Pdu::LogoutRequest(unifab_iscsi::wire::LogoutRequest {
            immediate: true,
            reason: unifab_iscsi::wire::LogoutReason::CLOSE_SESSION,
            itt: self.next_itt,
            cid: 1,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        self.send(&p, &[])?;
        let deadline = self.reply_deadline();
        loop {
            let f = self.recv_before(deadline)?;
            if let Ok(Pdu::LogoutResponse(_)) = f.parse() {
                return Ok(());
            }
        }
    }

    /// The raw stream, for tests that write garbage.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Bytes already buffered but not yet parsed.
    pub fn buffered(&self) -> Bytes {
        Bytes::copy_from_slice(&self.rbuf)
    }
}
