//! A sans-IO N_Port: fabric login (FLOGI, or FDISC for an NPIV port),
//! name server registration, discovery (GID_FT), N_Port login and process
//! login (PLOGI, PRLI) with peers, the answers to the link services peers
//! send, the reaction to RSCN, and the two FCP engines:
//!
//! - the target engine ([`target`]) turns FCP_CMND into scsi-core
//!   [`Task`](unifab_scsi_core::Task)s (events) and their results into FCP_DATA and FCP_RSP;
//! - the initiator engine ([`initiator`]) sends commands and task
//!   management to remote targets and reports their answers.
//!
//! Everything is driven by [`NPort::handle_frame`], [`NPort::handle_timeout`]
//! and the completion calls; frames to send come out of
//! [`NPort::poll_transmit`], events out of [`NPort::poll_event`]. No clock
//! is read: every call takes `now`.
//!
//! Decisions:
//!
//! - Fabric requests (name server, SCR) go out one at a time, in order;
//!   a request without a reply within 2 × R_A_TOV is abandoned (its OX_ID
//!   held for R_A_TOV) and the next one goes.
//! - Discovery (initiators) logs into every FCP port GID_FT returns (with
//!   [`NPortConfig::restrict_login`], only into those GFF_ID shows are
//!   FCP targets); the initiator engine addresses targets by WWPN. An
//!   RSCN re-runs discovery (a restricted port asks GFF_ID about a single
//!   port it does not know instead); a port that RSCN names and GPN_ID no
//!   longer finds is logged out locally (its tasks end, as after LOGO).
//! - A frame from a port without an N_Port login gets LS_RJT (ELS) or is
//!   discarded and counted (FCP).

pub mod budget;
pub mod initiator;
pub mod target;

use std::collections::VecDeque;

use std::time::{Duration, Instant};
use unifab_scsi_core::idmap::IdMap;

use bytes::Bytes;
use unifab_scsi_core::{ItNexus, TargetPort, TransportId};

use crate::compose::{self, Route};
use crate::exchange::{ExchangeManager, Timeouts};
use crate::wire::bls::{BaRjt, BaRjtExplanation, BaRjtReason, BlsRepr};
use crate::wire::ct::{
    CtBody, CtCommand, CtIu, Fc4Types, FtScope, NsAccept, NsReason, NsRequest, fcp_features,
};
use crate::wire::els::{
    Adisc, ElsCode, ElsRepr, FcpServiceParams, Lesb, LoginParams, LsAcc, LsRjt, LsRjtExplanation,
    LsRjtReason, PrliResponse, ProcessLogin, Scr, ServiceParamPage, page_flags, rscn_format,
    scr_function,
};
use crate::wire::frame::Frame;
use crate::wire::header::{FcType, RCtl};
use crate::wire::{FcId, OxId, RxId, Wwn};

pub use budget::LinkBudget;
pub use initiator::{CommandId, InitiatorEngine};
pub use target::{TargetEngine, TaskId};

/// An N_Port's settings.
#[derive(Debug, Clone)]
pub struct NPortConfig {
    /// Port name (WWPN).
    pub port_name: Wwn,
    /// Node name (WWNN).
    pub node_name: Wwn,
    /// Offer the FCP initiator function.
    pub initiator: bool,
    /// Offer the FCP target function.
    pub target: bool,
    /// Log in with FDISC (an NPIV port sharing a link already logged in
    /// with FLOGI).
    pub virtual_port: bool,
    /// Query the name server for FCP ports and log into them.
    pub discover: bool,
    /// Discovery logs in only to ports whose registered FC-4 features
    /// (GFF_ID) include FCP target, or that registered none; the others
    /// are remembered until an RSCN names them. For an initiator-only port
    /// that needs targets alone, as an NPIV port per host: without it,
    /// every such port logs into every other, and each login costs all
    /// the others an RSCN answered by a whole GID_FT, so that a fabric of
    /// n hosts does n² logins. Emulex's `lpfc_restrict_login` does the
    /// same for its virtual ports.
    pub restrict_login: bool,
    /// Symbolic port name registered with the name server.
    pub symbolic_name: String,
    /// Largest frame payload this port receives.
    pub rx_data_field_size: u16,
    /// E_D_TOV and R_A_TOV.
    pub timeouts: Timeouts,
    /// How long an initiator command may take before it is aborted.
    pub command_timeout: Duration,
    /// How long an initiator command waits for its target port to be
    /// logged in, counted from the moment the port was lost (or from the
    /// command, for a port not seen since this port came up). A command
    /// for a port lost longer ago fails at once. Linux calls this
    /// `fast_io_fail_tmo`: a multipath host gets a retryable error in
    /// seconds and moves to another path. Once the port is back, a
    /// command still waiting (for the link's room, or behind one that does)
    /// waits up to `command_timeout` and then ends as timed out. `None`: a
    /// command waits up to `command_timeout`.
    pub fast_io_fail: Option<Duration>,
    /// Largest burst a target asks for with one FCP_XFER_RDY.
    pub max_burst: u32,
    /// Write data a target's open exchanges may account for at once
    /// (default [`target::MAX_WRITE_HELD`]); see there.
    pub max_write_held: u64,
    /// Initiator role: the most frames its open commands may bring back
    /// at once (data-in at `rx_data_field_size` per frame, an FCP_RSP,
    /// and an FCP_XFER_RDY for a write); `None`: no bound. A command that
    /// would pass it waits, in order, until earlier ones end (one command
    /// alone always goes). For a link that cannot pause its sender (FCoE
    /// without PFC): a burst longer than the link can take while its
    /// receiver is off the CPU is lost, and FCP class 3 recovers a lost
    /// frame only by the command's timeout.
    ///
    /// The bound is the link's: [`NPort::new`] makes a [`LinkBudget`] for
    /// it and keeps it in [`NPortConfig::frame_budget`], and a port made
    /// from a clone of [`NPort::config`] (an NPIV port on the same link)
    /// counts against the same budget.
    pub max_frames_in: Option<u32>,
    /// The budget `max_frames_in` counts against. [`NPort::new`] fills it
    /// in (a new one, unless it is already there with the same bound);
    /// `None` without `max_frames_in`.
    pub frame_budget: Option<LinkBudget>,
    /// Target role: the most write data its admitted writes may still
    /// have to receive at once; `None`: no bound beyond `max_write_held`.
    /// A write that would pass it waits, in order, with nothing asked for
    /// (one write alone always goes). The target's side of
    /// `max_frames_in`: for a link that cannot pause its sender. Like
    /// that bound it is the link's ([`NPortConfig::write_budget`]).
    pub max_write_in_flight: Option<u64>,
    /// The budget `max_write_in_flight` counts against. [`NPort::new`]
    /// fills it in (a new one, unless it is already there with the same
    /// bound); give target ports behind one link the same one, so that
    /// together they stay within it. `None` without
    /// `max_write_in_flight`.
    pub write_budget: Option<LinkBudget>,
    /// Most open exchanges in each role.
    pub max_exchanges: usize,
    /// Most remote ports logged in at once (PLOGI). A PLOGI from one more
    /// is refused with LS_RJT, insufficient resources (FC-LS-3), as an
    /// array port refuses logins past its limit: every S_ID a fabric
    /// delivers (or a switch across an FCIP link claims) costs a login's
    /// state, and the address space is 2^24.
    pub max_logins: usize,
    /// Relative target port identifier (SPC-4), for the target's nexuses.
    pub relative_port_id: u16,
}

/// Default for [`NPortConfig::max_logins`].
pub const MAX_LOGINS: usize = 2048;

impl NPortConfig {
    /// Defaults for a port with these names.
    pub fn new(port_name: Wwn, node_name: Wwn) -> NPortConfig {
        NPortConfig {
            port_name,
            node_name,
            initiator: false,
            target: false,
            virtual_port: false,
            discover: false,
            restrict_login: false,
            symbolic_name: String::from("unifab"),
            rx_data_field_size: 2048,
            timeouts: Timeouts::default(),
            command_timeout: Duration::from_secs(30),
            fast_io_fail: None,
            max_burst: 256 * 1024,
            max_write_held: target::MAX_WRITE_HELD,
            max_frames_in: None,
            frame_budget: None,
            max_write_in_flight: None,
            write_budget: None,
            max_exchanges: 4096,
            max_logins: MAX_LOGINS,
            relative_port_id: 1,
        }
    }
}

/// The budget for `max`: `given` if it has that bound, else a new one.
fn link_budget(max: Option<u64>, given: Option<LinkBudget>) -> Option<LinkBudget> {
    max.map(|max| match given {
        Some(b) if b.max() == max => b,
        _ => LinkBudget::new(max),
    })
}

/// What the N_Port tells its driver.
#[derive(Debug)]
pub enum NPortEvent {
    /// Fabric login succeeded.
    Online {
        /// The assigned address.
        fc_id: FcId,
    },
    /// Fabric login failed or was lost.
    Offline {
        /// Why, for the log.
        reason: String,
    },
    /// A peer completed N_Port and process login.
    PortUp {
        /// Its address.
        fc_id: FcId,
        /// Its name.
        port_name: Wwn,
        /// It offers the FCP target function.
        target: bool,
        /// It offers the FCP initiator function.
        initiator: bool,
    },
    /// A peer went away (LOGO, PRLO, gone from the name server).
    PortDown {
        /// Its address.
        fc_id: FcId,
        /// Its name.
        port_name: Wwn,
        /// Why, for the log and the operator.
        reason: String,
    },
    /// Target role: run this task and call [`NPort::complete_task`].
    Execute {
        /// Completion handle.
        id: TaskId,
        /// The task.
        task: unifab_scsi_core::Task,
    },
    /// Target role: run this task management function and call
    /// [`NPort::complete_tmf`].
    TaskManagement {
        /// Completion handle.
        id: TaskId,
        /// The function.
        request: unifab_scsi_core::TmfRequest,
    },
    /// Target role: an initiator's nexus ended (LOGO, PRLO, new PLOGI).
    NexusLoss(ItNexus),
    /// Initiator role: a command ended.
    Completed {
        /// The command.
        id: CommandId,
        /// The remote's answer or why there is none.
        outcome: unifab_scsi_core::initiator::Outcome,
    },
    /// Initiator role: a task management function ended.
    TmfCompleted {
        /// The function.
        id: CommandId,
        /// The remote's response or why there is none.
        outcome: Result<unifab_scsi_core::TmfResponse, unifab_scsi_core::initiator::InitiatorError>,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NPortStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames discarded (not for us, malformed, no login).
    pub discarded: u64,
    /// ABTS sent.
    pub abts_sent: u64,
    /// ABTS received.
    pub abts_received: u64,
    /// RSCNs received.
    pub rscn_received: u64,
    /// Write commands refused as larger than the whole write-data budget
    /// ([`target::MAX_WRITE_HELD`]).
    pub write_refusals: u64,
    /// Write commands that waited for the write-data budget before their
    /// FCP_XFER_RDY.
    pub writes_deferred: u64,
    /// PLOGIs refused because `max_logins` ports were logged in.
    pub logins_refused: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginState {
    Offline,
    Sent { ox: OxId, deadline: Instant },
    Online,
}

/// A fabric request, sent one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    PlogiNs,
    RftId,
    RffId,
    RspnId,
    Scr,
    GidFt,
    /// Is this port still there (after an RSCN)?
    Check(FcId),
    /// Is this port an FCP target (GFF_ID), before logging into it? With
    /// `true` (the port came from GID_FT), a port that registered no
    /// features is logged into, as a port that predates RFF_ID may be a
    /// target; with `false` (an RSCN named it) it is left until the RSCN
    /// its registration brings.
    Features(FcId, bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Req {
    FabricLogin,
    Step(Step),
    Plogi(FcId),
    Prli(FcId),
    Rrq,
}

#[derive(Debug, Clone, Copy)]
struct PendingReq {
    what: Req,
    deadline: Instant,
}

/// What this port knows of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RState {
    PlogiSent,
    LoggedIn,
    PrliSent,
    Ready,
}

#[derive(Debug, Clone)]
pub(crate) struct Remote {
    pub(crate) fc_id: FcId,
    pub(crate) port_name: Wwn,
    pub(crate) node_name: Wwn,
    /// Largest payload the peer receives.
    pub(crate) rx_size: u16,
    state: RState,
    pub(crate) fcp: FcpServiceParams,
    pub(crate) nexus: Option<ItNexus>,
    plogi_tries: u8,
}

impl Remote {
    pub(crate) fn ready(&self) -> bool {
        self.state == RState::Ready
    }
}

/// A sans-IO N_Port. See the [module documentation](self).
#[derive(Debug)]
pub struct NPort {
    cfg: NPortConfig,
    login: LoginState,
    /// The fabric refused this port's last login (FLOGI/FDISC): until a
    /// new login is sent, commands fail at once instead of waiting for a
    /// port that is not coming.
    fabric_refused: bool,
    fc_id: FcId,
    fabric_params: Option<LoginParams>,
    pub(crate) xm: ExchangeManager,
    pending: IdMap<OxId, PendingReq>,
    steps: VecDeque<Step>,
    step_busy: bool,
    pub(crate) remotes: IdMap<FcId, Remote>,
    /// With `restrict_login`: ports GFF_ID showed not to be FCP targets.
    not_targets: std::collections::HashSet<FcId>,
    /// A GID_FT has been answered since the last fabric login.
    discovered: bool,
    pub(crate) target: TargetEngine,
    pub(crate) initiator: InitiatorEngine,
    tx: VecDeque<Frame>,
    events: VecDeque<NPortEvent>,
    seq_id: u8,
    stats: NPortStats,
    /// RRQ exchange → the OX_ID it recovers.
    rrq_for: IdMap<OxId, OxId>,
}

impl NPort {
    /// A port, offline.
    pub fn new(mut cfg: NPortConfig) -> NPort {
        cfg.frame_budget = link_budget(cfg.max_frames_in.map(u64::from), cfg.frame_budget.take());
        cfg.write_budget = link_budget(cfg.max_write_in_flight, cfg.write_budget.take());
        let xm = ExchangeManager::new(cfg.timeouts, cfg.max_exchanges);
        NPort {
            target: TargetEngine::new(cfg.max_burst, cfg.max_write_held, cfg.write_budget.clone()),
            initiator: InitiatorEngine::new(
                cfg.command_timeout,
                cfg.fast_io_fail,
                cfg.frame_budget.clone(),
                cfg.rx_data_field_size,
            ),
            cfg,
            login: LoginState::Offline,
            fabric_refused: false,
            fc_id: FcId::UNIDENTIFIED,
            fabric_params: None,
            xm,
            pending: IdMap::default(),
            steps: VecDeque::new(),
            step_busy: false,
            remotes: IdMap::default(),
            not_targets: std::collections::HashSet::new(),
            discovered: false,
            tx: VecDeque::new(),
            events: VecDeque::new(),
            seq_id: 0,
            stats: NPortStats::default(),
            rrq_for: IdMap::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &NPortConfig {
        &self.cfg
    }

    /// The address the fabric assigned (00.00.00 before login).
    pub fn fc_id(&self) -> FcId {
        self.fc_id
    }

    /// Logged into the fabric.
    pub fn is_online(&self) -> bool {
        self.login == LoginState::Online
    }

    /// Counters.
    pub fn stats(&self) -> NPortStats {
        self.stats
    }

    /// Target role: write data its admitted write exchanges account for
    /// (received or still to come), at most `NPortConfig::max_write_held`.
    pub fn write_bytes_held(&self) -> u64 {
        self.target.write_bytes_held()
    }

    /// Target role: write commands waiting for room in the write-data
    /// budget before their FCP_XFER_RDY.
    pub fn writes_waiting(&self) -> usize {
        self.target.writes_waiting()
    }

    /// Target role: write data its admitted writes have yet to receive,
    /// at most `NPortConfig::max_write_in_flight` (but one write alone may
    /// pass it).
    pub fn write_bytes_to_come(&self) -> u64 {
        self.target.write_bytes_to_come()
    }

    /// Initiator role: frames its open commands can still bring back, at
    /// most `NPortConfig::max_frames_in` (but one command alone may pass
    /// it).
    pub fn frames_in(&self) -> u32 {
        self.initiator.frames_in()
    }

    /// Starts commands that waited for room on the link if any has been
    /// given back since the port last looked: initiator commands under
    /// `NPortConfig::max_frames_in`, and writes (their FCP_XFER_RDY) under
    /// `NPortConfig::max_write_in_flight`. A driver with several ports on
    /// one [`LinkBudget`] calls it for each after handling any of them:
    /// room one port gives back may be another's turn.
    pub fn start_waiting(&mut self, now: Instant) {
        self.initiator_window_freed(now);
        self.target_room_freed(now);
    }

    /// Initiator role: commands waiting for their target port or for room
    /// under `NPortConfig::max_frames_in`.
    pub fn commands_waiting(&self) -> usize {
        self.initiator.waiting()
    }

    /// Is a fabric login (FLOGI/FDISC) with this OX_ID outstanding? Lets
    /// a driver hand the accept (addressed to the new FC_ID) to this port.
    pub fn awaits_fabric_login(&self, ox: OxId) -> bool {
        matches!(self.login, LoginState::Sent { ox: o, .. } if o == ox)
    }

    /// The fabric refused the last fabric login, and no new one has been
    /// sent.
    pub fn fabric_refused(&self) -> bool {
        self.fabric_refused
    }

    /// A fabric login (FLOGI/FDISC) is outstanding.
    pub fn fabric_login_pending(&self) -> bool {
        matches!(self.login, LoginState::Sent { .. })
    }

    /// Peers that completed process login: (address, name, target?,
    /// initiator?).
    pub fn ready_ports(&self) -> Vec<(FcId, Wwn, bool, bool)> {
        let mut v: Vec<_> = self
            .remotes
            .values()
            .filter(|r| r.ready())
            .map(|r| {
                (
                    r.fc_id,
                    r.port_name,
                    r.fcp.contains(FcpServiceParams::TARGET_FUNCTION),
                    r.fcp.contains(FcpServiceParams::INITIATOR_FUNCTION),
                )
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// The address of a ready peer by name.
    pub fn ready_port_by_name(&self, name: Wwn) -> Option<FcId> {
        self.remotes
            .values()
            .find(|r| r.port_name == name && r.ready())
            .map(|r| r.fc_id)
    }

    /// The next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Frame> {
        let f = self.tx.pop_front()?;
        self.stats.tx_frames += 1;
        Some(f)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<NPortEvent> {
        self.events.pop_front()
    }

    pub(crate) fn send(&mut self, f: Frame) {
        self.tx.push_back(f);
    }

    pub(crate) fn event(&mut self, e: NPortEvent) {
        self.events.push_back(e);
    }

    pub(crate) fn next_seq_id(&mut self) -> u8 {
        self.seq_id = self.seq_id.wrapping_add(1);
        self.seq_id
    }

    fn our_login_params(&self) -> LoginParams {
        let ms = u32::try_from(self.cfg.timeouts.e_d_tov.as_millis()).unwrap_or(u32::MAX);
        LoginParams::n_port(
            self.cfg.port_name,
            self.cfg.node_name,
            self.cfg.rx_data_field_size,
            ms,
        )
    }

    fn fcp_params(&self) -> u32 {
        let mut p = 0;
        if self.cfg.initiator {
            p |= FcpServiceParams::INITIATOR_FUNCTION;
        }
        if self.cfg.target {
            p |= FcpServiceParams::TARGET_FUNCTION | FcpServiceParams::READ_XFER_RDY_DISABLED;
        }
        p
    }

    /// The link came up: log into the fabric.
    pub fn link_up(&mut self, now: Instant) {
        if self.login != LoginState::Offline {
            return;
        }
        let Ok(ox) = self.xm.alloc_ox() else {
            return;
        };
        let p = self.our_login_params();
        let els = if self.cfg.virtual_port {
            ElsRepr::Fdisc(p)
        } else {
            ElsRepr::Flogi(p)
        };
        let deadline = now + self.cfg.timeouts.els_timeout();
        self.login = LoginState::Sent { ox, deadline };
        self.fabric_refused = false;
        self.pending.insert(
            ox,
            PendingReq {
                what: Req::FabricLogin,
                deadline,
            },
        );
        if let Ok(f) = compose::els(
            Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, ox),
            &els,
        ) {
            self.send(f);
        }
    }

    /// The link went down: every login ends.
    pub fn link_down(&mut self, now: Instant, reason: &str) {
        let ids: Vec<FcId> = self.remotes.keys().copied().collect();
        let why = format!("link down: {reason}");
        for id in ids {
            self.drop_remote(now, id, &why);
        }
        self.pending.clear();
        self.rrq_for.clear();
        self.steps.clear();
        self.step_busy = false;
        self.login = LoginState::Offline;
        self.fc_id = FcId::UNIDENTIFIED;
        self.xm = ExchangeManager::new(self.cfg.timeouts, self.cfg.max_exchanges);
        self.event(NPortEvent::Offline {
            reason: reason.to_string(),
        });
    }

    /// Logs out of the fabric (LOGO to FFFFFE) and drops every peer.
    pub fn logout(&mut self, now: Instant) {
        if self.login != LoginState::Online {
            return;
        }
        let ids: Vec<FcId> = self.remotes.keys().copied().collect();
        for id in ids {
            self.send_logo(id);
            self.drop_remote(now, id, "we logged out of the fabric");
        }
        if let Ok(ox) = self.xm.alloc_ox() {
            let els = ElsRepr::Logo(crate::wire::els::Logo {
                n_port_id: self.fc_id,
                port_name: self.cfg.port_name,
            });
            if let Ok(f) = compose::els(Route::request(self.fc_id, FcId::LOGIN_SERVER, ox), &els) {
                self.send(f);
            }
            self.xm.close_ox(ox);
        }
        self.login = LoginState::Offline;
        self.fc_id = FcId::UNIDENTIFIED;
        self.event(NPortEvent::Offline {
            reason: "logged out".into(),
        });
    }

    /// Explicit N_Port logout from a peer (LOGO), ending its sessions.
    pub fn logout_peer(&mut self, now: Instant, peer: FcId) {
        if self.remotes.contains_key(&peer) {
            self.send_logo(peer);
            self.drop_remote(now, peer, "we logged out of the port");
        }
    }

    fn send_logo(&mut self, peer: FcId) {
        let Ok(ox) = self.xm.alloc_ox() else {
            return;
        };
        let els = ElsRepr::Logo(crate::wire::els::Logo {
            n_port_id: self.fc_id,
            port_name: self.cfg.port_name,
        });
        if let Ok(f) = compose::els(Route::request(self.fc_id, peer, ox), &els) {
            self.send(f);
        }
        // The accept, if any, is not awaited.
        self.xm.close_ox(ox);
    }

    /// When [`NPort::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.xm.poll_timeout();
        let mut min = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        };
        min(self.pending.values().map(|p| p.deadline).min());
        min(self.target.poll_timeout());
        min(self.initiator.poll_timeout());
        t
    }

    /// Runs what is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.xm.handle_timeout(now);
        let due: Vec<(OxId, PendingReq)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(k, v)| (*k, *v))
            .collect();
        for (ox, p) in due {
            self.pending.remove(&ox);
            self.xm.hold_ox(now, ox);
            match p.what {
                Req::FabricLogin => {
                    // Unanswered: the driver may log in again; commands
                    // keep waiting (a refusal, below, fails them).
                    self.login = LoginState::Offline;
                    self.event(NPortEvent::Offline {
                        reason: "no answer to fabric login".into(),
                    });
                }
                Req::Step(_) => {
                    self.step_busy = false;
                    self.run_steps(now);
                }
                Req::Plogi(id) => {
                    let retry = self
                        .remotes
                        .get(&id)
                        .is_some_and(|r| r.state == RState::PlogiSent && r.plogi_tries < 3);
                    if retry {
                        self.send_plogi(now, id);
                    } else {
                        self.remotes.remove(&id);
                    }
                }
                Req::Prli(id) => {
                    if let Some(r) = self.remotes.get_mut(&id) {
                        r.state = RState::LoggedIn;
                    }
                }
                // Unanswered: the OX_ID it named stays held until R_A_TOV.
                Req::Rrq => {
                    self.rrq_for.remove(&ox);
                }
            }
        }
        self.target_timeouts(now);
        self.initiator_timeouts(now);
        self.initiator_window_freed(now);
    }

    /// Handles a frame addressed to this port.
    pub fn handle_frame(&mut self, now: Instant, frame: Frame) {
        self.stats.rx_frames += 1;
        let h = frame.header;
        let for_login = matches!(self.login, LoginState::Sent { ox, .. } if ox == h.ox_id)
            && h.s_id == FcId::LOGIN_SERVER;
        if h.d_id != self.fc_id && !for_login {
            self.stats.discarded += 1;
            return;
        }
        match (h.fc_type, h.r_ctl) {
            (FcType::ELS, RCtl::ELS_REQUEST) => self.els_request(now, frame),
            (FcType::ELS, RCtl::ELS_REPLY) | (FcType::CT, RCtl::CT_REPLY) => self.reply(now, frame),
            (FcType::FCP, RCtl::FCP_CMND) => self.target_command(now, frame),
            (FcType::FCP, RCtl::FCP_DATA) => {
                if h.f_ctl.exchange_responder() {
                    self.initiator_data(now, frame);
                } else {
                    self.target_data(now, frame);
                }
            }
            (FcType::FCP, RCtl::FCP_XFER_RDY) => self.initiator_xfer_rdy(now, frame),
            (FcType::FCP, RCtl::FCP_RSP) => self.initiator_response(now, frame),
            (FcType::FCP, RCtl::FC4_LS_REQUEST) => {
                // SRR and other FCP link services: not supported.
                let rx = self.xm.rx_of(h.s_id, h.ox_id).unwrap_or(RxId::UNASSIGNED);
                let rjt = ElsRepr::LsRjt(LsRjt::new(
                    LsRjtReason::COMMAND_NOT_SUPPORTED,
                    LsRjtExplanation::NONE,
                ));
                if let Ok(mut f) = compose::els(Route::reply_to(&h, rx), &rjt) {
                    f.header.r_ctl = RCtl::FC4_LS_REPLY;
                    f.header.fc_type = FcType::FCP;
                    self.send(f);
                }
            }
            (_, RCtl::ABTS) => self.abts_received(now, frame),
            (_, RCtl::BA_ACC) | (_, RCtl::BA_RJT) => self.initiator_abts_answer(now, frame),
            _ => self.stats.discarded += 1,
        }
        self.initiator_window_freed(now);
    }

    fn answer_els(&mut self, h: &crate::wire::FcHeaderRepr, els: &ElsRepr) {
        let route = Route::reply_to(h, RxId::UNASSIGNED);
        if let Ok(f) = compose::els(route, els) {
            self.send(f);
        }
    }

    fn els_request(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let els = match ElsRepr::parse(&frame.payload, None) {
            Ok(e) => e,
            Err(e) => {
                self.answer_els(&h, &ElsRepr::LsRjt(LsRjt::from(&e)));
                return;
            }
        };
        let logged_in = self
            .remotes
            .get(&h.s_id)
            .is_some_and(|r| r.state != RState::PlogiSent);
        let rjt = |r, e| ElsRepr::LsRjt(LsRjt::new(r, e));
        match els {
            ElsRepr::Plogi(p) => {
                if !p.class3().is_valid() {
                    self.answer_els(
                        &h,
                        &rjt(
                            LsRjtReason::UNABLE_TO_PERFORM,
                            LsRjtExplanation::SERVICE_PARAM_ERROR_OPTIONS,
                        ),
                    );
                    return;
                }
                if !self.remotes.contains_key(&h.s_id) && self.remotes.len() >= self.cfg.max_logins
                {
                    self.stats.logins_refused += 1;
                    self.answer_els(
                        &h,
                        &rjt(
                            LsRjtReason::UNABLE_TO_PERFORM,
                            LsRjtExplanation::INSUFFICIENT_RESOURCES,
                        ),
                    );
                    return;
                }
                // A new PLOGI ends any earlier session with this port.
                if let Some(old) = self.remotes.get(&h.s_id)
                    && (old.nexus.is_some() || old.port_name != p.port_name)
                {
                    self.drop_remote(now, h.s_id, "new PLOGI from the port");
                }
                let rx_size = p
                    .class3()
                    .rx_data_field_size
                    .min(p.common.rx_data_field_size);
                let r = self.remotes.entry(h.s_id).or_insert(Remote {
                    fc_id: h.s_id,
                    port_name: p.port_name,
                    node_name: p.node_name,
                    rx_size,
                    state: RState::LoggedIn,
                    fcp: FcpServiceParams(0),
                    nexus: None,
                    plogi_tries: 0,
                });
                r.port_name = p.port_name;
                r.node_name = p.node_name;
                r.rx_size = rx_size.clamp(256, 2112);
                if r.state == RState::PlogiSent {
                    // Both sides sent PLOGI: theirs counts.
                    r.state = RState::LoggedIn;
                }
                let acc = ElsRepr::LsAcc(LsAcc::Login(self.our_login_params()));
                self.answer_els(&h, &acc);
            }
            _ if !logged_in => {
                let reply = match els {
                    // A LOGO from a port we do not know is still accepted.
                    ElsRepr::Logo(_) => ElsRepr::LsAcc(LsAcc::Plain),
                    _ => rjt(
                        LsRjtReason::UNABLE_TO_PERFORM,
                        LsRjtExplanation::N_PORT_LOGIN_REQUIRED,
                    ),
                };
                if h.s_id.is_well_known() {
                    self.fabric_els(now, &h, els);
                } else {
                    self.answer_els(&h, &reply);
                }
            }
            ElsRepr::Prli(pl) => {
                let Some(page) = pl.pages.iter().find(|p| p.fc_type == FcType::FCP).copied() else {
                    self.answer_els(
                        &h,
                        &rjt(LsRjtReason::UNABLE_TO_PERFORM, LsRjtExplanation::NONE),
                    );
                    return;
                };
                let theirs = FcpServiceParams(page.service_params);
                let acc_page = ServiceParamPage::fcp(
                    page_flags::ESTABLISH_IMAGE_PAIR | PrliResponse::EXECUTED.0,
                    self.fcp_params(),
                );
                self.answer_els(
                    &h,
                    &ElsRepr::LsAcc(LsAcc::ProcessLogin(ProcessLogin {
                        pages: vec![acc_page],
                    })),
                );
                self.process_login_done(now, h.s_id, theirs);
            }
            ElsRepr::Logo(_) => {
                self.answer_els(&h, &ElsRepr::LsAcc(LsAcc::Plain));
                self.drop_remote(now, h.s_id, "LOGO from the port");
            }
            ElsRepr::Prlo(pl) => {
                let pages = pl
                    .pages
                    .iter()
                    .map(|p| ServiceParamPage {
                        flags: PrliResponse::EXECUTED.0,
                        service_params: 0,
                        ..*p
                    })
                    .collect();
                self.answer_els(
                    &h,
                    &ElsRepr::LsAcc(LsAcc::ProcessLogin(ProcessLogin { pages })),
                );
                self.end_process_login(now, h.s_id, "PRLO from the port");
            }
            ElsRepr::Adisc(_) => {
                let acc = ElsRepr::LsAcc(LsAcc::Adisc(Adisc {
                    hard_address: FcId::UNIDENTIFIED,
                    port_name: self.cfg.port_name,
                    node_name: self.cfg.node_name,
                    n_port_id: self.fc_id,
                }));
                self.answer_els(&h, &acc);
            }
            ElsRepr::Rrq(x) => {
                // Only the exchange's originator may release what is held
                // for it, and only for that exchange (FC-LS-3 RRQ);
                // anything else would free an RX_ID another exchange's
                // late frames may still carry.
                let reply =
                    if x.originator == h.s_id && self.xm.release_rx(h.s_id, x.ox_id, x.rx_id) {
                        ElsRepr::LsAcc(LsAcc::Plain)
                    } else {
                        rjt(
                            LsRjtReason::UNABLE_TO_PERFORM,
                            LsRjtExplanation::INVALID_OX_ID_RX_ID,
                        )
                    };
                self.answer_els(&h, &reply);
            }
            ElsRepr::Rec(x) => {
                let reply = match self.target_rec(x.originator, x.ox_id) {
                    Some(acc) => ElsRepr::LsAcc(LsAcc::Rec(acc)),
                    None => rjt(
                        LsRjtReason::UNABLE_TO_PERFORM,
                        LsRjtExplanation::INVALID_OX_ID_RX_ID,
                    ),
                };
                self.answer_els(&h, &reply);
            }
            other => self.fabric_els(now, &h, other),
        }
    }

    /// ELS any port answers alike, and those from the fabric (RSCN).
    fn fabric_els(&mut self, now: Instant, h: &crate::wire::FcHeaderRepr, els: ElsRepr) {
        match els {
            ElsRepr::Rscn(r) => {
                self.stats.rscn_received += 1;
                self.answer_els(h, &ElsRepr::LsAcc(LsAcc::Plain));
                self.rscn(now, &r);
            }
            ElsRepr::Echo(d) => self.answer_els(h, &ElsRepr::LsAcc(LsAcc::Echo(d))),
            ElsRepr::Rls(_) => self.answer_els(h, &ElsRepr::LsAcc(LsAcc::Rls(Lesb::default()))),
            ElsRepr::Logo(_)
                if h.s_id == FcId::LOGIN_SERVER && self.login == LoginState::Online =>
            {
                // The F_Port logged us out of the fabric (FC-LS-3 LOGO: an
                // implicit logout of every session through it; an FCoE
                // ENode turns a Clear Virtual Links for this VN_Port into
                // this). The link itself is up: every login ends, and the
                // port logs in again at once, as libfc's lport reset does.
                self.answer_els(h, &ElsRepr::LsAcc(LsAcc::Plain));
                tracing::warn!(port = %self.cfg.port_name, fc_id = %self.fc_id, "logged out by the fabric: logging in again");
                self.link_down(now, "logged out by the fabric");
                self.link_up(now);
            }
            ElsRepr::Logo(_) => self.answer_els(h, &ElsRepr::LsAcc(LsAcc::Plain)),
            _ => self.answer_els(
                h,
                &ElsRepr::LsRjt(LsRjt::new(
                    LsRjtReason::COMMAND_NOT_SUPPORTED,
                    LsRjtExplanation::NONE,
                )),
            ),
        }
    }

    fn rscn(&mut self, now: Instant, r: &crate::wire::els::Rscn) {
        // A restricted port answers a page naming one port it does not
        // know with a GFF_ID for that port, not a whole GID_FT (as libfc
        // does with GPN_ID): n hosts logging in cost each other O(n)
        // queries, not O(n²) name server entries.
        let mut rediscover = false;
        for p in &r.pages {
            if p.address_format == rscn_format::PORT {
                self.not_targets.remove(&p.affected);
                if self.cfg.restrict_login && !self.remotes.contains_key(&p.affected) {
                    if self.cfg.discover && p.affected != self.fc_id {
                        self.queue_step(Step::Features(p.affected, false));
                    }
                    continue;
                }
            } else {
                self.not_targets.clear();
            }
            rediscover = true;
            let known: Vec<FcId> = self
                .remotes
                .keys()
                .copied()
                .filter(|id| match p.address_format {
                    rscn_format::PORT => *id == p.affected,
                    rscn_format::AREA => {
                        id.domain() == p.affected.domain() && id.area() == p.affected.area()
                    }
                    rscn_format::DOMAIN => id.domain() == p.affected.domain(),
                    _ => true,
                })
                .collect();
            for id in known {
                self.queue_step(Step::Check(id));
            }
        }
        if self.cfg.discover && rediscover {
            self.queue_step(Step::GidFt);
        }
        self.run_steps(now);
    }

    fn queue_step(&mut self, s: Step) {
        if !self.steps.contains(&s) {
            self.steps.push_back(s);
        }
    }

    fn process_login_done(&mut self, now: Instant, peer: FcId, theirs: FcpServiceParams) {
        let our_name = self.cfg.port_name;
        let rel = self.cfg.relative_port_id;
        let we_target = self.cfg.target;
        let Some(r) = self.remotes.get_mut(&peer) else {
            return;
        };
        r.fcp = theirs;
        let was_ready = r.state == RState::Ready;
        r.state = RState::Ready;
        let mut lost = None;
        if we_target && theirs.contains(FcpServiceParams::INITIATOR_FUNCTION) {
            // A new image pair is a new I_T nexus.
            lost = r.nexus.take();
            r.nexus = Some(ItNexus::new(
                TransportId::Fcp {
                    wwpn: r.port_name.0,
                },
                TargetPort {
                    id: TransportId::Fcp { wwpn: our_name.0 },
                    relative_port_id: rel,
                    port_group: 1,
                },
            ));
        }
        let (fc_id, port_name) = (r.fc_id, r.port_name);
        if let Some(n) = lost {
            self.target_nexus_gone(now, peer, n);
        }
        if !was_ready {
            self.event(NPortEvent::PortUp {
                fc_id,
                port_name,
                target: theirs.contains(FcpServiceParams::TARGET_FUNCTION),
                initiator: theirs.contains(FcpServiceParams::INITIATOR_FUNCTION),
            });
        }
        self.initiator_port_ready(now, peer);
    }

    fn end_process_login(&mut self, now: Instant, peer: FcId, reason: &str) {
        let Some(r) = self.remotes.get_mut(&peer) else {
            return;
        };
        let was_ready = r.state == RState::Ready;
        r.state = RState::LoggedIn;
        let nexus = r.nexus.take();
        let port_name = r.port_name;
        if let Some(n) = nexus {
            self.target_nexus_gone(now, peer, n);
        }
        self.initiator_port_gone(now, peer);
        if was_ready {
            self.initiator_port_lost(now, port_name);
            self.event(NPortEvent::PortDown {
                fc_id: peer,
                port_name,
                reason: reason.to_string(),
            });
        }
    }

    /// The peer is gone: its sessions end.
    fn drop_remote(&mut self, now: Instant, peer: FcId, reason: &str) {
        self.end_process_login(now, peer, reason);
        self.remotes.remove(&peer);
        self.xm.close_peer(peer);
    }

    fn send_plogi(&mut self, now: Instant, peer: FcId) {
        let Ok(ox) = self.xm.alloc_ox() else {
            return;
        };
        let params = self.our_login_params();
        let r = self.remotes.entry(peer).or_insert(Remote {
            fc_id: peer,
            port_name: Wwn(0),
            node_name: Wwn(0),
            rx_size: 2048,
            state: RState::PlogiSent,
            fcp: FcpServiceParams(0),
            nexus: None,
            plogi_tries: 0,
        });
        r.plogi_tries += 1;
        r.state = RState::PlogiSent;
        self.pending.insert(
            ox,
            PendingReq {
                what: Req::Plogi(peer),
                deadline: now + self.cfg.timeouts.els_timeout(),
            },
        );
        if let Ok(f) = compose::els(
            Route::request(self.fc_id, peer, ox),
            &ElsRepr::Plogi(params),
        ) {
            self.send(f);
        }
    }

    fn send_prli(&mut self, now: Instant, peer: FcId) {
        let Ok(ox) = self.xm.alloc_ox() else {
            return;
        };
        if let Some(r) = self.remotes.get_mut(&peer) {
            r.state = RState::PrliSent;
        }
        self.pending.insert(
            ox,
            PendingReq {
                what: Req::Prli(peer),
                deadline: now + self.cfg.timeouts.els_timeout(),
            },
        );
        let page = ServiceParamPage::fcp(page_flags::ESTABLISH_IMAGE_PAIR, self.fcp_params());
        let els = ElsRepr::Prli(ProcessLogin { pages: vec![page] });
        if let Ok(f) = compose::els(Route::request(self.fc_id, peer, ox), &els) {
            self.send(f);
        }
    }

    pub(crate) fn send_rrq(&mut self, now: Instant, peer: FcId, ox: OxId, rx: RxId) {
        let Ok(rrq_ox) = self.xm.alloc_ox() else {
            return;
        };
        self.pending.insert(
            rrq_ox,
            PendingReq {
                what: Req::Rrq,
                deadline: now + self.cfg.timeouts.els_timeout(),
            },
        );
        let els = ElsRepr::Rrq(crate::wire::els::ExchangeRef {
            originator: self.fc_id,
            ox_id: ox,
            rx_id: rx,
        });
        if let Ok(f) = compose::els(Route::request(self.fc_id, peer, rrq_ox), &els) {
            self.send(f);
        }
        // The RRQ's own pending entry releases `ox` when accepted.
        self.rrq_for.insert(rrq_ox, ox);
    }

    fn run_steps(&mut self, now: Instant) {
        if self.step_busy || self.login != LoginState::Online {
            return;
        }
        let Some(step) = self.steps.pop_front() else {
            return;
        };
        let Ok(ox) = self.xm.alloc_ox() else {
            self.steps.push_front(step);
            return;
        };
        let me = self.fc_id;
        let frame = match step {
            Step::PlogiNs => compose::els(
                Route::request(me, FcId::NAME_SERVER, ox),
                &ElsRepr::Plogi(self.our_login_params()),
            ),
            Step::Scr => compose::els(
                Route::request(me, FcId::FABRIC_CONTROLLER, ox),
                &ElsRepr::Scr(Scr {
                    function: scr_function::FULL,
                }),
            ),
            Step::RftId => ns_request(
                me,
                ox,
                NsRequest::RftId {
                    port_id: me,
                    types: Fc4Types::of(FcType::FCP),
                },
            ),
            Step::RffId => {
                let mut features = 0;
                if self.cfg.target {
                    features |= fcp_features::TARGET;
                }
                if self.cfg.initiator {
                    features |= fcp_features::INITIATOR;
                }
                ns_request(
                    me,
                    ox,
                    NsRequest::RffId {
                        port_id: me,
                        features,
                        fc_type: FcType::FCP,
                    },
                )
            }
            Step::RspnId => ns_request(
                me,
                ox,
                NsRequest::RspnId {
                    port_id: me,
                    name: Bytes::from(
                        self.cfg.symbolic_name.as_bytes()[..self.cfg.symbolic_name.len().min(255)]
                            .to_vec(),
                    ),
                },
            ),
            Step::GidFt => ns_request(
                me,
                ox,
                NsRequest::GidFt(FtScope {
                    domain: 0,
                    area: 0,
                    fc_type: FcType::FCP,
                }),
            ),
            Step::Check(id) => ns_request(me, ox, NsRequest::GpnId(id)),
            Step::Features(id, _) => ns_request(me, ox, NsRequest::GffId(id)),
        };
        self.step_busy = true;
        self.pending.insert(
            ox,
            PendingReq {
                what: Req::Step(step),
                deadline: now + self.cfg.timeouts.els_timeout(),
            },
        );
        if let Ok(f) = frame {
            self.send(f);
        }
    }

    fn reply(&mut self, now: Instant, frame: Frame) {
        let h = frame.header;
        let Some(p) = self.pending.remove(&h.ox_id) else {
            self.stats.discarded += 1;
            return;
        };
        self.xm.close_ox(h.ox_id);
        match p.what {
            Req::FabricLogin => {
                let els = ElsRepr::parse(&frame.payload, Some(ElsCode::FLOGI));
                match els {
                    Ok(ElsRepr::LsAcc(LsAcc::Login(params))) => {
                        self.fc_id = h.d_id;
                        self.fabric_params = Some(params);
                        self.login = LoginState::Online;
                        self.discovered = false;
                        self.event(NPortEvent::Online { fc_id: h.d_id });
                        let mut steps = vec![
                            Step::PlogiNs,
                            Step::RftId,
                            Step::RffId,
                            Step::RspnId,
                            Step::Scr,
                        ];
                        if self.cfg.discover {
                            steps.push(Step::GidFt);
                        }
                        for s in steps {
                            self.queue_step(s);
                        }
                        self.run_steps(now);
                    }
                    other => {
                        // An NPIV port the fabric has no address for (the
                        // physical port's 255 are taken), a duplicate name:
                        // the commands waiting for the port fail now, as a
                        // lost connection (ABORTED COMMAND, LOGICAL UNIT
                        // COMMUNICATION FAILURE), not at their timeout.
                        self.login = LoginState::Offline;
                        self.fabric_refused = true;
                        self.end_waiting_commands();
                        self.event(NPortEvent::Offline {
                            reason: format!("fabric login refused: {other:?}"),
                        });
                    }
                }
            }
            Req::Step(step) => {
                self.step_busy = false;
                self.step_reply(now, step, &frame);
                self.run_steps(now);
            }
            Req::Plogi(peer) => match ElsRepr::parse(&frame.payload, Some(ElsCode::PLOGI)) {
                Ok(ElsRepr::LsAcc(LsAcc::Login(p))) => {
                    let rx_size = p
                        .class3()
                        .rx_data_field_size
                        .min(p.common.rx_data_field_size);
                    if let Some(r) = self.remotes.get_mut(&peer) {
                        r.port_name = p.port_name;
                        r.node_name = p.node_name;
                        r.rx_size = rx_size.clamp(256, 2112);
                        r.state = RState::LoggedIn;
                    }
                    self.send_prli(now, peer);
                }
                _ => {
                    self.remotes.remove(&peer);
                }
            },
            Req::Prli(peer) => match ElsRepr::parse(&frame.payload, Some(ElsCode::PRLI)) {
                Ok(ElsRepr::LsAcc(LsAcc::ProcessLogin(pl))) => {
                    let page = pl.pages.iter().find(|p| p.fc_type == FcType::FCP);
                    match page {
                        Some(pg) if pg.response() == PrliResponse::EXECUTED => {
                            self.process_login_done(now, peer, FcpServiceParams(pg.service_params));
                        }
                        _ => {
                            if let Some(r) = self.remotes.get_mut(&peer) {
                                r.state = RState::LoggedIn;
                            }
                        }
                    }
                }
                _ => {
                    if let Some(r) = self.remotes.get_mut(&peer) {
                        r.state = RState::LoggedIn;
                    }
                }
            },
            Req::Rrq => {
                if let Some(ox) = self.rrq_for.remove(&h.ox_id)
                    && matches!(
                        ElsRepr::parse(&frame.payload, Some(ElsCode::RRQ)),
                        Ok(ElsRepr::LsAcc(_))
                    )
                {
                    self.xm.release_ox(ox);
                }
            }
        }
        self.fail_invisible(now);
    }

    /// With `restrict_login` (a host's NPIV port): discovery has settled
    /// (a GID_FT answered, no name server query or login under way) and
    /// no logged-in port has the name `target`. The name server shows a
    /// port only what zoning lets it see, so the target is zoned out (or
    /// not logged in to the fabric): a command for it fails now rather
    /// than at its timeout.
    pub(crate) fn target_invisible(&self, target: Wwn) -> bool {
        self.cfg.restrict_login
            && self.cfg.discover
            && self.login == LoginState::Online
            && self.discovered
            && self.steps.is_empty()
            && !self.step_busy
            && self.remotes.values().all(|r| {
                matches!(r.state, RState::Ready | RState::LoggedIn) && r.port_name != target
            })
    }

    fn step_reply(&mut self, now: Instant, step: Step, frame: &Frame) {
        let ct = |cmd| CtIu::parse(&frame.payload, Some(cmd)).ok();
        match step {
            Step::GidFt => {
                self.discovered = true;
                let found: Vec<FcId> = match ct(CtCommand::GID_FT) {
                    Some(CtIu {
                        body: CtBody::Accept(NsAccept::PortIds(ids)),
                        ..
                    }) => ids.iter().map(|e| e.port_id).collect(),
                    _ => Vec::new(),
                };
                let listed: std::collections::HashSet<FcId> = found.iter().copied().collect();
                let gone: Vec<FcId> = self
                    .remotes
                    .keys()
                    .copied()
                    .filter(|id| !listed.contains(id))
                    .collect();
                for id in gone {
                    self.drop_remote(now, id, "no longer in the name server (GID_FT)");
                }
                self.not_targets.retain(|id| listed.contains(id));
                for id in found {
                    if id == self.fc_id || self.remotes.contains_key(&id) {
                        continue;
                    }
                    if !self.cfg.restrict_login {
                        self.send_plogi(now, id);
                    } else if !self.not_targets.contains(&id) {
                        self.queue_step(Step::Features(id, true));
                    }
                }
            }
            Step::Features(id, listed) => {
                let target = match ct(CtCommand::GFF_ID) {
                    Some(CtIu {
                        body: CtBody::Accept(NsAccept::Features(f)),
                        ..
                    }) => f.get(FcType::FCP) & fcp_features::TARGET != 0,
                    // Gone from the name server: nothing to log into.
                    Some(CtIu { preamble, .. })
                        if preamble.explanation == NsReason::PORT_ID_NOT_REGISTERED =>
                    {
                        return;
                    }
                    // No features registered (or no answer): for a port
                    // GID_FT listed, only a login tells, as without the
                    // restriction; a port an RSCN named is still
                    // registering, and its RFF_ID brings another RSCN.
                    _ if !listed => return,
                    _ => true,
                };
                if !target {
                    self.not_targets.insert(id);
                } else if !self.remotes.contains_key(&id) {
                    self.send_plogi(now, id);
                }
            }
            Step::Check(id) => {
                let still = matches!(
                    ct(CtCommand::GPN_ID),
                    Some(CtIu {
                        body: CtBody::Accept(NsAccept::Name(_)),
                        ..
                    })
                );
                if !still {
                    self.drop_remote(now, id, "no longer in the name server (GPN_ID)");
                }
            }
            // Registrations: accepted or not, login goes on.
            _ => {}
        }
    }

    pub(crate) fn ba_rjt(&mut self, h: &crate::wire::FcHeaderRepr) {
        let rjt = BlsRepr::BaRjt(BaRjt {
            reason: BaRjtReason::LOGICAL_ERROR,
            explanation: BaRjtExplanation::INVALID_OX_ID_RX_ID,
            vendor: 0,
        });
        let from_responder = !h.f_ctl.exchange_responder();
        if let Ok(f) = compose::bls_reply(Route::reply_to(h, h.rx_id), &rjt, from_responder) {
            self.send(f);
        }
    }

    fn abts_received(&mut self, now: Instant, frame: Frame) {
        self.stats.abts_received += 1;
        let h = frame.header;
        if h.f_ctl.exchange_responder() {
            // The responder aborts one of our exchanges.
            self.initiator_abts_from_target(now, &h);
        } else {
            self.target_abts(now, &h);
        }
    }
}

fn ns_request(me: FcId, ox: OxId, req: NsRequest) -> Result<Frame, crate::wire::WireError> {
    compose::ct(
        Route::request(me, FcId::NAME_SERVER, ox),
        &CtIu::request(req),
        false,
    )
}
