//! Deterministic fabric tests: sans-IO N_Ports on the sans-IO fabric with
//! virtual time. Every frame the fabric forwards is recorded, so the tests
//! check the protocol as well as the outcome.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unifab_scsi_core::Dispatch;

use bytes::Bytes;
use unifab_fc::fabric::zoning::{Zone, ZoneMember, ZoneSet};
use unifab_fc::fabric::{Fabric, FabricConfig, PortIndex};
use unifab_fc::nport::{CommandId, LinkBudget, NPort, NPortConfig, NPortEvent, TaskId};
use unifab_fc::wire::ct::{CtBody, CtCommand, NsAccept};
use unifab_fc::wire::els::{ElsRepr, LsRjtExplanation};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FcType, RCtl};
use unifab_fc::wire::{FcId, FrameRepr, PayloadRepr, ReplyTracker, Wwn};
use unifab_scsi_core::backend::MemoryBackend;
use unifab_scsi_core::initiator::{InitiatorError, Request};
use unifab_scsi_core::{
    BoxFuture, EmulatedLu, EmulatedLuConfig, Lun, Residual, ScsiTarget, Status, TaskResult,
    TmfFunction, TmfResponse,
};

struct Node {
    port: NPort,
    fport: PortIndex,
    scsi: Option<ScsiTarget>,
    /// Tasks handed to the LU whose futures are not yet polled (when
    /// `hold` is set).
    held: Vec<(TaskId, BoxFuture<'static, TaskResult>)>,
    hold: bool,
    results: HashMap<CommandId, Result<TaskResult, InitiatorError>>,
    tmfs: HashMap<CommandId, Result<TmfResponse, InitiatorError>>,
    up: Vec<(FcId, Wwn, bool)>,
    down: Vec<FcId>,
    nexus_losses: usize,
    aborted_in_lu: usize,
    /// Frames for this port are kept in `inbox`, not handled (a port that
    /// does not answer).
    deaf: bool,
    inbox: Vec<Frame>,
}

struct Sim {
    now: Instant,
    fabric: Fabric,
    nodes: Vec<Node>,
    rt: tokio::runtime::Runtime,
    /// Every frame N_Ports sent and every frame the fabric's services
    /// sent, decoded.
    log: Vec<FrameRepr>,
    tracker: ReplyTracker,
    ids: u64,
    /// Each FCP_DATA frame is delivered this many times more (a target
    /// that sends the same offsets again).
    repeat_data: usize,
    /// FCP_DATA frames are delivered cut into pieces of this many bytes
    /// (with their relative offsets), last piece first when `.1`.
    split_data: Option<(usize, bool)>,
}

const T_WWPN: Wwn = Wwn(0x2100_0000_0000_00a1);
const I_WWPN: Wwn = Wwn(0x2100_0000_0000_00b1);
const I2_WWPN: Wwn = Wwn(0x2100_0000_0000_00b2);
const T2_WWPN: Wwn = Wwn(0x2100_0000_0000_00a2);

fn lu(mib: u64) -> Arc<EmulatedLu> {
    let backend = Arc::new(MemoryBackend::new(mib << 20));
    Arc::new(EmulatedLu::new(EmulatedLuConfig::default(), backend).unwrap())
}

impl Sim {
    fn new() -> Sim {
        Sim {
            now: Instant::now(),
            fabric: Fabric::new(FabricConfig::default()),
            nodes: Vec::new(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            log: Vec::new(),
            tracker: ReplyTracker::new(),
            ids: 0,
            repeat_data: 0,
            split_data: None,
        }
    }

    fn add(&mut self, cfg: NPortConfig, scsi: Option<ScsiTarget>) -> usize {
        let fport = self.fabric.attach(&format!("fc{}", self.nodes.len() + 1));
        let mut port = NPort::new(cfg);
        port.link_up(self.now);
        self.nodes.push(Node {
            port,
            fport,
            scsi,
            held: Vec::new(),
            hold: false,
            results: HashMap::new(),
            tmfs: HashMap::new(),
            up: Vec::new(),
            down: Vec::new(),
            nexus_losses: 0,
            aborted_in_lu: 0,
            deaf: false,
            inbox: Vec::new(),
        });
        self.nodes.len() - 1
    }

    fn target(&mut self, wwpn: Wwn, mib: u64, max_burst: u32) -> usize {
        let scsi = ScsiTarget::new();
        scsi.insert(Lun(0), lu(mib));
        let mut cfg = NPortConfig::new(wwpn, Wwn(wwpn.0 ^ 0x0100_0000_0000_0000));
        cfg.target = true;
        cfg.max_burst = max_burst;
        self.add(cfg, Some(scsi))
    }

    fn initiator(&mut self, wwpn: Wwn) -> usize {
        self.initiator_with(wwpn, None)
    }

    fn initiator_with(&mut self, wwpn: Wwn, fast_io_fail: Option<Duration>) -> usize {
        let mut cfg = NPortConfig::new(wwpn, Wwn(wwpn.0 ^ 0x0100_0000_0000_0000));
        cfg.initiator = true;
        cfg.discover = true;
        cfg.fast_io_fail = fast_io_fail;
        self.add(cfg, None)
    }

    /// Moves frames and events until nothing moves.
    fn run(&mut self) {
        for _ in 0..100_000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                // Room one port gave back may be another's turn (ports
                // sharing a link's frame budget).
                self.nodes[i].port.start_waiting(self.now);
                while let Some(f) = self.nodes[i].port.poll_transmit() {
                    moved = true;
                    self.record(&f);
                    let p = self.nodes[i].fport;
                    self.fabric.handle_frame(self.now, p, f);
                }
            }
            while let Some((p, f)) = self.fabric.poll_transmit() {
                moved = true;
                if f.header.s_id.is_well_known() {
                    self.record(&f);
                }
                if let Some(n) = self.nodes.iter_mut().find(|n| n.fport == p) {
                    if n.deaf {
                        n.inbox.push(f);
                        continue;
                    }
                    if f.header.r_ctl == RCtl::FCP_DATA {
                        for _ in 0..self.repeat_data {
                            n.port.handle_frame(self.now, f.clone());
                        }
                        if let Some((size, reversed)) = self.split_data {
                            let mut pieces: Vec<Frame> = (0..f.payload.len())
                                .step_by(size)
                                .map(|at| {
                                    let mut h = f.header;
                                    h.parameter = f.header.parameter + at as u32;
                                    let end = (at + size).min(f.payload.len());
                                    Frame::new(h, f.payload.slice(at..end))
                                })
                                .collect();
                            if reversed {
                                pieces.reverse();
                            }
                            for piece in pieces {
                                n.port.handle_frame(self.now, piece);
                            }
                            continue;
                        }
                    }
                    n.port.handle_frame(self.now, f);
                }
            }
            for i in 0..self.nodes.len() {
                while let Some(ev) = self.nodes[i].port.poll_event() {
                    moved = true;
                    self.event(i, ev);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the simulation does not settle");
    }

    fn record(&mut self, f: &Frame) {
        let mut v = Vec::new();
        f.write_to(&mut v);
        let r = FrameRepr::parse(&Bytes::from(v.clone()), Some(&mut self.tracker)).unwrap();
        assert_eq!(
            r.to_bytes().unwrap(),
            v,
            "every frame on the fabric round-trips"
        );
        self.log.push(r);
    }

    fn event(&mut self, i: usize, ev: NPortEvent) {
        let now = self.now;
        let n = &mut self.nodes[i];
        match ev {
            NPortEvent::Execute { id, task } => {
                // The LU receives the task now (ordering contract).
                let fut = n.scsi.as_ref().unwrap().dispatch(task);
                if n.hold {
                    n.held.push((id, fut));
                } else {
                    let r = self.rt.block_on(fut);
                    n.port.complete_task(now, id, r);
                }
            }
            NPortEvent::TaskManagement { id, request } => {
                let fut = n.scsi.as_ref().unwrap().task_management(request);
                // Held tasks run now, so that those the function aborts can
                // end (their futures resolve aborted) before its response.
                let held: Vec<_> = std::mem::take(&mut n.held)
                    .into_iter()
                    .map(|(id, f)| (id, self.rt.spawn(f)))
                    .collect();
                let r = self.rt.block_on(fut);
                for (tid, h) in held {
                    let tr = self.rt.block_on(h).unwrap();
                    n.aborted_in_lu += usize::from(tr.aborted);
                    n.port.complete_task(now, tid, tr);
                }
                n.port.complete_tmf(now, id, r);
            }
            NPortEvent::NexusLoss(nx) => {
                n.nexus_losses += 1;
                if let Some(s) = &n.scsi {
                    s.nexus_loss(&nx);
                }
            }
            NPortEvent::Completed { id, outcome } => {
                assert!(
                    n.results.insert(id, outcome).is_none(),
                    "one answer per command"
                );
            }
            NPortEvent::TmfCompleted { id, outcome } => {
                assert!(n.tmfs.insert(id, outcome).is_none());
            }
            NPortEvent::PortUp {
                fc_id,
                port_name,
                target,
                ..
            } => n.up.push((fc_id, port_name, target)),
            NPortEvent::PortDown { fc_id, .. } => n.down.push(fc_id),
            NPortEvent::Online { .. } | NPortEvent::Offline { .. } => {}
        }
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        for n in &mut self.nodes {
            n.port.handle_timeout(self.now);
        }
        self.run();
    }

    /// Runs the tasks node `t`'s LU was given while held, answers them,
    /// and moves what follows.
    fn release_held(&mut self, t: usize) {
        let now = self.now;
        for (id, fut) in std::mem::take(&mut self.nodes[t].held) {
            let r = self.rt.block_on(fut);
            self.nodes[t].port.complete_task(now, id, r);
        }
        self.run();
    }

    /// The OX_IDs of the FCP_CMNDs in the log, in order.
    fn command_ox_ids(&self) -> Vec<u16> {
        self.log
            .iter()
            .filter(|f| matches!(f.payload, PayloadRepr::FcpCmnd(_)))
            .map(|f| f.header.ox_id.0)
            .collect()
    }

    fn next_id(&mut self) -> CommandId {
        self.ids += 1;
        CommandId(self.ids)
    }

    fn submit(&mut self, i: usize, target: Wwn, r: Request) -> CommandId {
        let now = self.now;
        let id = self.next_id();
        self.nodes[i].port.submit(now, id, target, r);
        self.run();
        id
    }

    fn tmf(&mut self, i: usize, f: TmfFunction) -> CommandId {
        let now = self.now;
        let id = self.next_id();
        self.nodes[i].port.submit_tmf(now, id, T_WWPN, Lun(0), f);
        self.run();
        id
    }

    fn result(&mut self, i: usize, id: CommandId) -> Result<TaskResult, InitiatorError> {
        self.nodes[i]
            .results
            .remove(&id)
            .unwrap_or_else(|| panic!("command {id:?} has no answer"))
    }

    fn count(&self, pred: impl Fn(&FrameRepr) -> bool) -> usize {
        self.log.iter().filter(|f| pred(f)).count()
    }
}

fn read10(lba: u32, blocks: u16) -> Bytes {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    Bytes::from(c)
}

fn write10(lba: u32, blocks: u16) -> Bytes {
    let mut c = read10(lba, blocks).to_vec();
    c[0] = 0x2a;
    Bytes::from(c)
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

fn joined(r: &TaskResult) -> Vec<u8> {
    r.data_in.iter().flat_map(|b| b.iter().copied()).collect()
}

/// Target and initiator logged in, the initiator's view of the target up.
fn pair(max_burst: u32) -> (Sim, usize, usize) {
    pair_with(max_burst, None)
}

/// [`pair`] with the initiator's `fast_io_fail`.
fn pair_with(max_burst: u32, fast_io_fail: Option<Duration>) -> (Sim, usize, usize) {
    let mut s = Sim::new();
    let t = s.target(T_WWPN, 8, max_burst);
    s.run();
    let i = s.initiator_with(I_WWPN, fast_io_fail);
    s.run();
    // The new nexus starts with a unit attention: consume it.
    let id = s.submit(
        i,
        T_WWPN,
        Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
    );
    let r = s.result(i, id).unwrap();
    assert_eq!(r.status, Status::CHECK_CONDITION);
    assert_eq!(r.sense.unwrap()[2] & 0x0f, 0x06, "UNIT ATTENTION");
    s.log.clear();
    (s, t, i)
}

/// The F_Port logs a port out of the fabric (LOGO from FFFFFE: a switch
/// disabling or re-zoning the port, or an FCoE ENode's Clear Virtual Links
/// for this one VN_Port): the port accepts, its sessions end, it logs in
/// again at once, finds the target again and its I/O goes on. Fails where
/// the LOGO is only acknowledged (the port would go on as if logged in).
#[test]
fn a_port_the_fabric_logs_out_logs_in_again() {
    let (mut s, t, i) = pair(64 * 1024);
    let data = pattern(8 * 512, 3);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 8), data.clone()),
    );
    assert_eq!(s.result(i, w).unwrap().status, Status::GOOD);
    let t_id = s.nodes[t].port.fc_id();
    let i_id = s.nodes[i].port.fc_id();
    s.log.clear();
    // What the fabric's LOGO does to it there: the login is gone.
    let logo = unifab_fc::compose::els(
        unifab_fc::compose::Route::request(FcId::LOGIN_SERVER, i_id, unifab_fc::wire::OxId(0x4242)),
        &ElsRepr::Logo(unifab_fc::wire::els::Logo {
            n_port_id: FcId::LOGIN_SERVER,
            port_name: Wwn(0x2000_0000_0000_0001),
        }),
    )
    .unwrap();
    let now = s.now;
    s.nodes[i].port.handle_frame(now, logo);
    s.run();
    let els = |s: &Sim, code: &str| {
        s.count(|f| matches!(&f.payload, PayloadRepr::Els(e) if format!("{:?}", e.code()) == code))
    };
    assert!(
        s.log.iter().any(|f| f.header.d_id == FcId::LOGIN_SERVER
            && f.header.ox_id.0 == 0x4242
            && matches!(&f.payload, PayloadRepr::Els(e) if format!("{:?}", e.code()) == "LS_ACC")),
        "the LOGO is accepted"
    );
    assert_eq!(els(&s, "FLOGI"), 1, "it logs in to the fabric again");
    assert_eq!(els(&s, "PRLI"), 1, "and to the target again");
    assert_eq!(s.nodes[i].port.ready_port_by_name(T_WWPN), Some(t_id));
    assert!(s.nodes[i].port.is_online());
    // The new nexus starts with its unit attention; then the data is there.
    let tur = s.submit(
        i,
        T_WWPN,
        Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
    );
    let _ = s.result(i, tur);
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    let r = s.result(i, rd).unwrap();
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(joined(&r), &data[..]);
}

/// A target port takes at most `max_logins` remote ports: one more is
/// refused with LS_RJT (insufficient resources) and counted, and the
/// ports logged in keep doing I/O.
#[test]
fn logins_past_the_limit_are_refused_and_the_others_go_on() {
    let mut s = Sim::new();
    let scsi = ScsiTarget::new();
    scsi.insert(Lun(0), lu(8));
    let mut cfg = NPortConfig::new(T_WWPN, Wwn(T_WWPN.0 ^ 0x0100_0000_0000_0000));
    cfg.target = true;
    cfg.max_logins = 2;
    let t = s.add(cfg, Some(scsi));
    s.run();
    let i1 = s.initiator(I_WWPN);
    s.run();
    let i2 = s.initiator(I2_WWPN);
    s.run();
    assert_eq!(s.nodes[t].port.stats().logins_refused, 0);
    let i3 = s.initiator(Wwn(0x2100_0000_0000_00b3));
    s.run();
    assert!(s.nodes[t].port.stats().logins_refused >= 1);
    let refused = s.count(|f| {
        matches!(
            &f.payload,
            PayloadRepr::Els(ElsRepr::LsRjt(r))
                if r.explanation == LsRjtExplanation::INSUFFICIENT_RESOURCES
        )
    });
    assert!(refused >= 1, "an LS_RJT went to the third initiator");
    let ready = |s: &Sim, i: usize| s.nodes[i].up.iter().any(|(_, w, _)| *w == T_WWPN);
    assert!(ready(&s, i1) && ready(&s, i2));
    assert!(!ready(&s, i3), "the third initiator is not logged in");
    for i in [i1, i2] {
        let ua = s.submit(
            i,
            T_WWPN,
            Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
        );
        assert!(s.result(i, ua).is_ok());
        let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
        assert_eq!(s.result(i, id).unwrap().status, Status::GOOD);
    }
}

#[test]
fn login_registration_discovery_and_process_login() {
    let mut s = Sim::new();
    let t = s.target(T_WWPN, 8, 64 * 1024);
    s.run();
    let i = s.initiator(I_WWPN);
    s.run();
    let logins = s.fabric.logins();
    assert_eq!(logins.len(), 2);
    let t_id = s.nodes[t].port.fc_id();
    let i_id = s.nodes[i].port.fc_id();
    assert_eq!(t_id, FcId::from_parts(1, 1, 0));
    assert_eq!(i_id, FcId::from_parts(1, 2, 0));
    // Name server registrations.
    let ns = s.fabric.name_server();
    let te = ns.iter().find(|e| e.fc_id == t_id).unwrap();
    assert!(te.fc4_types.contains(FcType::FCP));
    assert_eq!(te.fc4_features.get(FcType::FCP), 1, "target feature");
    assert_eq!(&te.symbolic_port_name[..], b"unifab");
    let ie = ns.iter().find(|e| e.fc_id == i_id).unwrap();
    assert_eq!(ie.fc4_features.get(FcType::FCP), 2, "initiator feature");
    assert_eq!(s.fabric.scr_registrations().len(), 2);
    // The protocol that got there: FLOGI, PLOGI to the name server, RFT_ID,
    // RFF_ID, RSPN_ID, SCR, GID_FT with the target in its accept, PLOGI and
    // PRLI to the target.
    let els = |code: &str| {
        s.count(|f| matches!(&f.payload, PayloadRepr::Els(e) if format!("{:?}", e.code()) == code))
    };
    assert_eq!(els("FLOGI"), 2);
    assert_eq!(els("SCR"), 2);
    // PLOGI: each port to the name server, the initiator to the target.
    assert_eq!(els("PLOGI"), 3);
    assert_eq!(els("PRLI"), 1);
    let gid_ft_acc = s.log.iter().any(|f| {
        matches!(&f.payload, PayloadRepr::Ct(c) if matches!(&c.body,
            CtBody::Accept(NsAccept::PortIds(ids)) if ids.iter().any(|e| e.port_id == t_id)))
    });
    assert!(gid_ft_acc, "GID_FT found the target");
    assert!(
        s.count(
            |f| matches!(&f.payload, PayloadRepr::Ct(c) if c.preamble.command == CtCommand::RFT_ID)
        ) >= 2
    );
    assert_eq!(s.nodes[i].up, vec![(t_id, T_WWPN, true)]);
    assert_eq!(s.nodes[i].port.ready_port_by_name(T_WWPN), Some(t_id));
    // The target sees the initiator as an initiator.
    assert!(
        s.nodes[t]
            .port
            .ready_ports()
            .iter()
            .any(|p| p.0 == i_id && p.3)
    );
}

/// Initiator-only ports with `restrict_login` (as the gateway's per-host
/// NPIV ports) log into targets alone: GFF_ID before each login, a single
/// GFF_ID (not a whole GID_FT) for an RSCN about one port, and a target
/// that comes later is still found. An unrestricted initiator beside them
/// logs into everyone, which is what the restriction saves.
#[test]
fn restricted_initiators_log_into_targets_only() {
    let mut s = Sim::new();
    let t = s.target(T_WWPN, 8, 64 * 1024);
    s.run();
    let restricted: Vec<usize> = (0..3)
        .map(|k| {
            let wwpn = Wwn(0x2100_0000_0000_00c0 + k);
            let mut cfg = NPortConfig::new(wwpn, Wwn(wwpn.0 ^ 0x0100_0000_0000_0000));
            cfg.initiator = true;
            cfg.discover = true;
            cfg.restrict_login = true;
            let i = s.add(cfg, None);
            s.run();
            i
        })
        .collect();
    let t_id = s.nodes[t].port.fc_id();
    let names = |s: &Sim, i: usize| -> Vec<Wwn> {
        let mut v: Vec<Wwn> = s.nodes[i].port.ready_ports().iter().map(|p| p.1).collect();
        v.sort();
        v
    };
    for &i in &restricted {
        assert_eq!(
            names(&s, i),
            vec![T_WWPN],
            "port {i} logged into the target alone"
        );
    }
    let open = s.initiator(I_WWPN);
    s.run();
    assert_eq!(
        names(&s, open).len(),
        1 + restricted.len(),
        "the unrestricted initiator logged into every FCP port"
    );
    let from = |s: &Sim, i: usize, cmd: CtCommand| {
        let id = s.nodes[i].port.fc_id();
        s.count(|f| {
            f.header.s_id == id
                && matches!(&f.payload, PayloadRepr::Ct(c)
                    if c.preamble.command == cmd && matches!(c.body, CtBody::Request(_)))
        })
    };
    // The first port heard of the two later restricted ports and of the
    // open one by RSCN (one each for the login, RFT_ID and RFF_ID, merged
    // when they come before it answers) and asked GFF_ID about each; it
    // asked about the target once, after its own GID_FT, and never ran
    // discovery again.
    assert_eq!(from(&s, restricted[0], CtCommand::GID_FT), 1);
    let gff = from(&s, restricted[0], CtCommand::GFF_ID);
    assert!((4..=10).contains(&gff), "{gff} GFF_ID queries");
    // A target that comes later is found through its RSCN.
    let t2 = s.target(T2_WWPN, 8, 64 * 1024);
    s.run();
    for &i in &restricted {
        let n = names(&s, i);
        assert!(n.contains(&T2_WWPN), "port {i} found the new target: {n:?}");
        let id = s.submit(
            i,
            T2_WWPN,
            Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
        );
        assert!(s.result(i, id).is_ok());
    }
    assert_eq!(from(&s, restricted[0], CtCommand::GID_FT), 1);
    assert_ne!(s.nodes[t2].port.fc_id(), t_id);
}

/// The RSCN pages in frames `frames`, one Vec per RSCN.
fn rscns(frames: &[Frame]) -> Vec<Vec<FcId>> {
    frames
        .iter()
        .filter_map(|f| match ElsRepr::parse(&f.payload, None) {
            Ok(ElsRepr::Rscn(r)) => Some(r.pages.iter().map(|p| p.affected).collect()),
            _ => None,
        })
        .collect()
}

/// A port has one RSCN outstanding: the changes that come before it
/// answers wait and go as one RSCN, a page per port; an RSCN unanswered
/// for 2 × R_A_TOV stops holding the next.
#[test]
fn rscns_wait_for_the_answer_and_merge() {
    let mut s = Sim::new();
    let a = s.initiator(I_WWPN);
    s.run();
    s.nodes[a].deaf = true;
    let later: Vec<usize> = (0..3)
        .map(|k| {
            let i = s.initiator(Wwn(0x2100_0000_0000_00d0 + k));
            s.run();
            i
        })
        .collect();
    let ids: Vec<FcId> = later.iter().map(|&i| s.nodes[i].port.fc_id()).collect();
    // Three logins, each with two registrations: one RSCN reached the
    // port, about the first login.
    assert_eq!(rscns(&s.nodes[a].inbox), vec![vec![ids[0]]]);
    // It answers: what waited comes in one RSCN, one page per port.
    s.nodes[a].deaf = false;
    for f in std::mem::take(&mut s.nodes[a].inbox) {
        s.nodes[a].port.handle_frame(s.now, f);
    }
    s.nodes[a].deaf = true;
    s.run();
    s.nodes[a].deaf = false;
    let got = rscns(&s.nodes[a].inbox);
    assert_eq!(got.len(), 1, "{got:?}");
    let mut pages = got[0].clone();
    pages.sort();
    assert_eq!(pages, ids, "one page per port that changed");
    for f in std::mem::take(&mut s.nodes[a].inbox) {
        s.nodes[a].port.handle_frame(s.now, f);
    }
    s.run();
    // Now it stops answering: the next login's RSCN is outstanding for
    // good, and after 2 x R_A_TOV the next change no longer waits for it.
    s.nodes[a].deaf = true;
    let e = s.initiator(Wwn(0x2100_0000_0000_00e0));
    s.run();
    let e_id = s.nodes[e].port.fc_id();
    assert_eq!(rscns(&s.nodes[a].inbox), vec![vec![e_id]]);
    s.now += FabricConfig::default().timeouts.els_timeout() + Duration::from_secs(1);
    let f = s.initiator(Wwn(0x2100_0000_0000_00e1));
    s.run();
    let got = rscns(&s.nodes[a].inbox);
    assert_eq!(
        got.len(),
        2,
        "the registrations of the unanswered login went: {got:?}"
    );
    assert_eq!(got[1], vec![e_id]);
    assert_ne!(s.nodes[f].port.fc_id(), e_id);
}

#[test]
fn reads_and_multi_burst_writes_with_verified_data() {
    let (mut s, _t, i) = pair(16 * 1024);
    let data = pattern(100 * 1024, 7);
    // 200 blocks = 100 KiB: seven bursts of at most 16 KiB.
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(64, 200), data.clone()),
    );
    let r = s.result(i, w).unwrap();
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(r.residual, None);
    let xfer_rdys: Vec<(u32, u32)> = s
        .log
        .iter()
        .filter_map(|f| match &f.payload {
            PayloadRepr::FcpXferRdy(x) => Some((x.data_ro, x.burst_len)),
            _ => None,
        })
        .collect();
    assert_eq!(xfer_rdys.len(), 7, "one XFER_RDY per burst");
    assert_eq!(xfer_rdys[0], (0, 16384));
    assert_eq!(xfer_rdys[6], (6 * 16384, 100 * 1024 - 6 * 16384));
    let data_frames = s.count(|f| matches!(f.payload, PayloadRepr::FcpData(_)));
    assert_eq!(data_frames, 50, "2 KiB frames");
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(64, 200), 100 * 1024));
    let r = s.result(i, rd).unwrap();
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(joined(&r), &data[..]);
    assert!(r.data_in.len() >= 50, "data-in stays in frame-sized slices");
    // Unwritten blocks read as zeros.
    let z = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    assert!(joined(&s.result(i, z).unwrap()).iter().all(|b| *b == 0));
}

/// The initiator bounds the frames its open commands can bring back
/// (`max_frames_in`, for a link that cannot pause its sender): a command
/// that would pass it waits, in order, until earlier ones end; one command
/// alone always goes; a later small command does not overtake a waiting
/// one; every command ends with the right data.
#[test]
fn frames_in_flight_toward_an_initiator_are_bounded() {
    // An 8 KiB read brings back 4 data frames and an FCP_RSP.
    let (mut s, t, i) = configured_pair(|t| t.max_burst = 1 << 20, |i| i.max_frames_in = Some(10));
    assert_eq!(s.nodes[i].port.frames_in(), 0);
    // Data to read back.
    let data = pattern(64 * 1024, 9);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 128), data.clone()),
    );
    assert_eq!(s.result(i, w).unwrap().status, Status::GOOD);

    s.nodes[t].hold = true;
    s.log.clear();
    let read = |s: &mut Sim, kib: u32| {
        let blocks = (kib * 2) as u16;
        s.submit(
            i,
            T_WWPN,
            Request::new(Lun(0), read10(0, blocks), kib * 1024),
        )
    };
    let a = read(&mut s, 8);
    let b = read(&mut s, 8);
    assert_eq!(s.nodes[i].port.frames_in(), 10);
    // A third would pass the bound: it waits, and so does a 1 KiB read
    // after it (two frames would fit, but it does not overtake).
    let c = read(&mut s, 8);
    let d = read(&mut s, 1);
    let cmnds = |s: &Sim| s.count(|f| matches!(f.payload, PayloadRepr::FcpCmnd(_)));
    assert_eq!(cmnds(&s), 2);
    assert_eq!(s.nodes[i].port.commands_waiting(), 2);
    assert_eq!(s.nodes[t].held.len(), 2);
    // The held commands end: the waiting ones go, in order.
    let release = |s: &mut Sim| s.release_held(t);
    release(&mut s);
    for id in [a, b] {
        assert_eq!(joined(&s.result(i, id).unwrap()), &data[..8192]);
    }
    assert_eq!(cmnds(&s), 4);
    assert_eq!(s.nodes[i].port.commands_waiting(), 0);
    assert_eq!(s.nodes[i].port.frames_in(), 5 + 2);
    release(&mut s);
    assert_eq!(joined(&s.result(i, c).unwrap()), &data[..8192]);
    assert_eq!(joined(&s.result(i, d).unwrap()), &data[..1024]);
    assert_eq!(s.nodes[i].port.frames_in(), 0);
    // One command larger than the whole bound still goes, alone.
    let big = read(&mut s, 64);
    assert_eq!(s.nodes[t].held.len(), 1);
    release(&mut s);
    assert_eq!(joined(&s.result(i, big).unwrap()), &data[..]);
    assert_eq!(s.nodes[i].port.frames_in(), 0);
}

/// Ports on one link share its frame budget (`max_frames_in`): an NPIV
/// port made from the physical port's configuration, as the gateway makes
/// one per front-end host, counts against the same bound. Commands on
/// either port wait in one line across the link, in order; a command that
/// gives up waiting leaves the line and holds up nobody.
#[test]
fn ports_on_one_link_share_its_frame_budget() {
    let (mut s, t, i) = configured_pair(|t| t.max_burst = 1 << 20, |i| i.max_frames_in = Some(10));
    let data = pattern(64 * 1024, 5);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 128), data.clone()),
    );
    assert_eq!(s.result(i, w).unwrap().status, Status::GOOD);
    // The second port, as node.rs makes an NPIV port: the parent's
    // configuration under another name (and, here, a shorter timeout).
    let mut cfg = s.nodes[i].port.config().clone();
    cfg.port_name = I2_WWPN;
    cfg.node_name = Wwn(I2_WWPN.0 ^ 0x0100_0000_0000_0000);
    cfg.command_timeout = Duration::from_secs(2);
    let j = s.add(cfg, None);
    s.run();
    let budget = s.nodes[i].port.config().frame_budget.clone().unwrap();
    assert!(
        budget.same(s.nodes[j].port.config().frame_budget.as_ref().unwrap()),
        "the clone shares the parent's budget"
    );
    let ua = s.submit(
        j,
        T_WWPN,
        Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
    );
    assert_eq!(s.result(j, ua).unwrap().status, Status::CHECK_CONDITION);

    s.nodes[t].hold = true;
    s.log.clear();
    let read = |s: &mut Sim, port: usize, kib: u32| {
        let blocks = (kib * 2) as u16;
        s.submit(
            port,
            T_WWPN,
            Request::new(Lun(0), read10(0, blocks), kib * 1024),
        )
    };
    let cmnds = |s: &Sim| s.count(|f| matches!(f.payload, PayloadRepr::FcpCmnd(_)));
    // Port i fills the link: two 8 KiB reads, 5 frames each.
    let a = read(&mut s, i, 8);
    let b = read(&mut s, i, 8);
    assert_eq!(budget.in_use(), 10);
    // Port j has nothing open, yet its reads wait: the link is full.
    let c = read(&mut s, j, 8);
    let d = read(&mut s, j, 1);
    assert_eq!(s.nodes[j].port.frames_in(), 0);
    assert_eq!(s.nodes[j].port.commands_waiting(), 2);
    // A later read on port i waits behind them (two frames would fit
    // beside c, but it does not overtake).
    let e = read(&mut s, i, 8);
    assert_eq!(cmnds(&s), 2);
    assert_eq!(budget.waiting(), 3);
    let release = |s: &mut Sim| s.release_held(t);
    // a and b end: j's two go first, then e would pass the bound (7 + 5).
    release(&mut s);
    for id in [a, b] {
        assert_eq!(joined(&s.result(i, id).unwrap()), &data[..8192]);
    }
    assert_eq!(cmnds(&s), 4);
    assert_eq!(s.nodes[j].port.frames_in(), 5 + 2);
    assert_eq!(s.nodes[i].port.commands_waiting(), 1);
    assert_eq!(budget.in_use(), 7);
    release(&mut s);
    assert_eq!(joined(&s.result(j, c).unwrap()), &data[..8192]);
    assert_eq!(joined(&s.result(j, d).unwrap()), &data[..1024]);
    assert_eq!(cmnds(&s), 5, "e went once c and d gave their room back");
    release(&mut s);
    assert_eq!(joined(&s.result(i, e).unwrap()), &data[..8192]);
    assert_eq!(budget.in_use(), 0);

    // A waiting command that times out leaves the line.
    let f = read(&mut s, i, 8);
    let g = read(&mut s, i, 8);
    let h = read(&mut s, j, 8);
    assert_eq!(budget.waiting(), 1);
    s.advance(Duration::from_secs(3));
    assert!(
        matches!(s.result(j, h), Err(InitiatorError::Timeout { .. })),
        "h waited past its port's command timeout"
    );
    assert_eq!(budget.waiting(), 0);
    release(&mut s);
    for id in [f, g] {
        assert_eq!(joined(&s.result(i, id).unwrap()), &data[..8192]);
    }
    assert_eq!(budget.in_use(), 0);
    let k = read(&mut s, j, 8);
    release(&mut s);
    assert_eq!(joined(&s.result(j, k).unwrap()), &data[..8192]);
}

/// The target bounds the write data its admitted writes have yet to
/// receive (`max_write_in_flight`): a write that would pass it gets no
/// FCP_XFER_RDY until the data of earlier ones has come; one write alone
/// always goes; every write lands.
#[test]
fn write_data_in_flight_toward_a_target_is_bounded() {
    let (mut s, t, i) = write_bound_pair(|_| {});
    s.log.clear();
    // Three 12 KiB writes and a 32 KiB one, submitted together.
    let sizes = [12u16, 12, 12, 32];
    let mut ids = Vec::new();
    let now = s.now;
    for (k, kib) in sizes.iter().enumerate() {
        let id = s.next_id();
        let data = pattern(usize::from(*kib) * 1024, k as u8);
        let lba = 100 * k as u32;
        s.nodes[i].port.submit(
            now,
            id,
            T_WWPN,
            Request::with_data_out(Lun(0), write10(lba, kib * 2), data),
        );
        ids.push(id);
    }
    s.run();
    // Replay the log: a write's data is "to come" from its first
    // XFER_RDY until its data frames have brought it. It never passes
    // 16 KiB, but for the 32 KiB write, alone.
    let oxs = s.command_ox_ids();
    assert_eq!(oxs.len(), 4);
    let size = |ox: u16| {
        let k = oxs.iter().position(|o| *o == ox).unwrap();
        usize::from(sizes[k]) * 1024
    };
    let mut to_come: std::collections::HashMap<u16, usize> = Default::default();
    let (mut peak, mut peak_alone) = (0, 0);
    for f in &s.log {
        let ox = f.header.ox_id.0;
        match &f.payload {
            PayloadRepr::FcpXferRdy(x) if x.data_ro == 0 => {
                to_come.insert(ox, size(ox));
            }
            PayloadRepr::FcpData(d) if oxs.contains(&ox) => {
                let left = to_come.get_mut(&ox).unwrap();
                *left -= d.len();
            }
            _ => continue,
        }
        let total: usize = to_come.values().sum();
        if to_come.values().filter(|v| **v > 0).count() > 1 {
            peak = peak.max(total);
        } else {
            peak_alone = peak_alone.max(total);
        }
    }
    assert!(peak <= 16 * 1024, "{peak}");
    assert_eq!(peak_alone, 32 * 1024);
    assert!(s.nodes[t].port.stats().writes_deferred >= 3);
    for (k, id) in ids.iter().enumerate() {
        assert_eq!(s.result(i, *id).unwrap().status, Status::GOOD);
        let lba = 100 * k as u32;
        let blocks = sizes[k] * 2;
        let rd = s.submit(
            i,
            T_WWPN,
            Request::new(Lun(0), read10(lba, blocks), u32::from(blocks) * 512),
        );
        let want = pattern(usize::from(sizes[k]) * 1024, k as u8);
        assert_eq!(joined(&s.result(i, rd).unwrap()), &want[..]);
    }
    assert_eq!(s.nodes[t].port.write_bytes_to_come(), 0);
}

/// Target ports behind one link share its write budget
/// (`max_write_in_flight`): a second target port made from the first's
/// configuration counts against the same bound, so writes to both stay
/// within it together, in one line; every write lands.
#[test]
fn target_ports_on_one_link_share_its_write_budget() {
    let (mut s, t, i) = write_bound_pair(|_| {});
    let (t2, budget) = second_target(&mut s, t, i);
    s.log.clear();
    // Four 12 KiB writes, to T, T2, T, T2, submitted together: each port
    // alone would let two through (24 KiB to come).
    let targets = [T_WWPN, T2_WWPN, T_WWPN, T2_WWPN];
    let mut ids = Vec::new();
    let now = s.now;
    for (k, to) in targets.iter().enumerate() {
        let id = s.next_id();
        let data = pattern(12 * 1024, 20 + k as u8);
        let lba = 100 * k as u32;
        s.nodes[i].port.submit(
            now,
            id,
            *to,
            Request::with_data_out(Lun(0), write10(lba, 24), data),
        );
        ids.push(id);
    }
    s.run();
    let oxs = s.command_ox_ids();
    assert_eq!(oxs.len(), 4);
    let mut to_come: std::collections::HashMap<u16, usize> = Default::default();
    let mut peak = 0;
    for f in &s.log {
        let ox = f.header.ox_id.0;
        match &f.payload {
            PayloadRepr::FcpXferRdy(x) if x.data_ro == 0 => {
                to_come.insert(ox, 12 * 1024);
            }
            PayloadRepr::FcpData(d) if oxs.contains(&ox) => {
                *to_come.get_mut(&ox).unwrap() -= d.len();
            }
            _ => continue,
        }
        peak = peak.max(to_come.values().sum::<usize>());
    }
    assert!(peak <= 16 * 1024, "{peak} bytes to come over the link");
    // In line across the two ports: the writes are asked for in the order
    // they came, whichever port each came to.
    let asked: Vec<u16> = s
        .log
        .iter()
        .filter(|f| matches!(&f.payload, PayloadRepr::FcpXferRdy(x) if x.data_ro == 0))
        .map(|f| f.header.ox_id.0)
        .collect();
    assert_eq!(asked, oxs);
    let deferred =
        s.nodes[t].port.stats().writes_deferred + s.nodes[t2].port.stats().writes_deferred;
    assert!(deferred >= 3, "{deferred}");
    for (k, id) in ids.iter().enumerate() {
        assert_eq!(s.result(i, *id).unwrap().status, Status::GOOD);
        let lba = 100 * k as u32;
        let rd = s.submit(
            i,
            targets[k],
            Request::new(Lun(0), read10(lba, 24), 12 * 1024),
        );
        let want = pattern(12 * 1024, 20 + k as u8);
        assert_eq!(joined(&s.result(i, rd).unwrap()), &want[..]);
    }
    assert_eq!(budget.in_use(), 0);
    assert_eq!(budget.waiting(), 0);
}

/// A second target port (T2, its own 8 MiB LU) made from a clone of
/// target `t`'s configuration, as on the same link, and initiator `i`
/// logged in to it with the LU's unit attention taken. Returns its node
/// and the write budget the two ports share.
fn second_target(s: &mut Sim, t: usize, i: usize) -> (usize, LinkBudget) {
    let mut cfg = s.nodes[t].port.config().clone();
    cfg.port_name = T2_WWPN;
    cfg.node_name = Wwn(T2_WWPN.0 ^ 0x0100_0000_0000_0000);
    let scsi = ScsiTarget::new();
    scsi.insert(Lun(0), lu(8));
    let t2 = s.add(cfg, Some(scsi));
    s.run();
    let budget = s.nodes[t].port.config().write_budget.clone().unwrap();
    assert!(budget.same(s.nodes[t2].port.config().write_budget.as_ref().unwrap()));
    // The initiator finds the new port (RSCN) and takes its unit attention.
    let ua = s.submit(
        i,
        T2_WWPN,
        Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
    );
    assert_eq!(s.result(i, ua).unwrap().status, Status::CHECK_CONDITION);
    (t2, budget)
}

/// A write that waits for its own port's bound (`max_write_held`: its LU
/// still holds earlier writes' data) holds no place in the link's line:
/// another target port's write goes while the link has room.
#[test]
fn a_write_waiting_for_its_port_holds_up_no_other_port() {
    let (mut s, t, i) = write_bound_pair(|t| t.max_write_held = 16 * 1024);
    let (_t2, budget) = second_target(&mut s, t, i);
    let write = |s: &mut Sim, to: Wwn, lba: u32, kib: u16, seed: u8| {
        let data = pattern(usize::from(kib) * 1024, seed);
        s.submit(
            i,
            to,
            Request::with_data_out(Lun(0), write10(lba, kib * 2), data),
        )
    };
    // T's LU holds a 16 KiB write: its data has all come (the link has
    // room again), and T holds all it may.
    s.nodes[t].hold = true;
    let a = write(&mut s, T_WWPN, 0, 16, 1);
    assert_eq!(s.nodes[t].held.len(), 1);
    assert_eq!(budget.in_use(), 0);
    // T's next write waits for T.
    let b = write(&mut s, T_WWPN, 100, 4, 2);
    assert!(unanswered(&s, i, b));
    assert_eq!(s.nodes[t].port.writes_waiting(), 1);
    assert_eq!(budget.waiting(), 0, "not in the link's line");
    // T2's write goes meanwhile.
    let c = write(&mut s, T2_WWPN, 200, 4, 3);
    assert_eq!(s.result(i, c).unwrap().status, Status::GOOD);
    assert!(unanswered(&s, i, a) && unanswered(&s, i, b));
    // T's LU lets go: both of T's writes land.
    s.nodes[t].hold = false;
    s.release_held(t);
    assert_eq!(s.result(i, a).unwrap().status, Status::GOOD);
    assert_eq!(s.result(i, b).unwrap().status, Status::GOOD);
    for (to, lba, kib, seed) in [
        (T_WWPN, 0, 16, 1),
        (T_WWPN, 100, 4, 2),
        (T2_WWPN, 200, 4, 3),
    ] {
        let len = usize::from(kib) * 1024;
        let rd = s.submit(
            i,
            to,
            Request::new(Lun(0), read10(lba, kib * 2), len as u32),
        );
        assert_eq!(joined(&s.result(i, rd).unwrap()), &pattern(len, seed)[..]);
    }
    assert_eq!((budget.in_use(), budget.waiting()), (0, 0));
}

/// A target port asking for 4 KiB bursts under a 16 KiB
/// `max_write_in_flight`, configured further by `more`, and an initiator,
/// as [`configured_pair`] makes them.
fn write_bound_pair(more: impl FnOnce(&mut NPortConfig)) -> (Sim, usize, usize) {
    configured_pair(
        |t| {
            t.max_burst = 4096;
            t.max_write_in_flight = Some(16 * 1024);
            more(t);
        },
        |_| {},
    )
}

/// A target port whose write-data budget is `max_write_held`, an
/// initiator logged in to it, and the LU's power-on unit attention taken.
fn budget_pair(max_write_held: u64) -> (Sim, usize, usize) {
    configured_pair(|t| t.max_write_held = max_write_held, |_| {})
}

/// A target port (an 8 MiB LU) and an initiator, each configured further
/// by its closure, logged in, and the LU's power-on unit attention taken.
fn configured_pair(
    target: impl FnOnce(&mut NPortConfig),
    initiator: impl FnOnce(&mut NPortConfig),
) -> (Sim, usize, usize) {
    let mut s = Sim::new();
    let scsi = ScsiTarget::new();
    scsi.insert(Lun(0), lu(8));
    let mut cfg = NPortConfig::new(T_WWPN, Wwn(T_WWPN.0 ^ 0x0100_0000_0000_0000));
    cfg.target = true;
    target(&mut cfg);
    let t = s.add(cfg, Some(scsi));
    s.run();
    let mut cfg = NPortConfig::new(I_WWPN, Wwn(I_WWPN.0 ^ 0x0100_0000_0000_0000));
    cfg.initiator = true;
    cfg.discover = true;
    initiator(&mut cfg);
    let i = s.add(cfg, None);
    s.run();
    let ua = s.submit(
        i,
        T_WWPN,
        Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
    );
    assert_eq!(s.result(i, ua).unwrap().status, Status::CHECK_CONDITION);
    (s, t, i)
}

/// The target bounds the write data its open exchanges hold: a write
/// that would pass the bound waits, with no data asked for, one larger
/// than the whole bound is refused with ILLEGAL REQUEST, an ABTS ends a
/// waiting write; the budget comes back as commands end, and the waiting
/// write is then asked for its data and succeeds.
#[test]
fn write_data_held_by_a_target_is_bounded() {
    let (mut s, t, i) = budget_pair(64 * 1024);
    let write = |s: &mut Sim, lba: u32, kib: u16, seed: u8| {
        let data = pattern(usize::from(kib) * 1024, seed);
        s.submit(
            i,
            T_WWPN,
            Request::with_data_out(Lun(0), write10(lba, kib * 2), data),
        )
    };
    // Larger than the whole bound: refused at once, no XFER_RDY.
    s.log.clear();
    let big = write(&mut s, 0, 65, 1);
    let r = s.result(i, big).unwrap();
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let sense = r.sense.unwrap();
    assert_eq!((sense[2] & 0x0f, sense[12], sense[13]), (0x05, 0x24, 0x00));
    assert_eq!(
        s.count(|f| matches!(f.payload, PayloadRepr::FcpXferRdy(_))),
        0
    );
    // The LU holds the tasks: 48 KiB then 16 KiB fill the bound.
    s.nodes[t].hold = true;
    let a = write(&mut s, 0, 48, 2);
    let c = write(&mut s, 200, 16, 3);
    assert_eq!(s.nodes[t].held.len(), 2);
    assert_eq!(s.nodes[t].port.write_bytes_held(), 64 * 1024);
    // One more write would pass it: it waits, and nothing is asked for.
    s.log.clear();
    let b = write(&mut s, 400, 1, 4);
    let d = write(&mut s, 600, 2, 5);
    assert!(unanswered(&s, i, b) && unanswered(&s, i, d));
    assert_eq!(
        s.count(|f| matches!(f.payload, PayloadRepr::FcpXferRdy(_))),
        0
    );
    assert_eq!(s.nodes[t].port.writes_waiting(), 2);
    assert_eq!(s.nodes[t].port.write_bytes_held(), 64 * 1024);
    assert_eq!(s.nodes[t].port.stats().writes_deferred, 2);
    assert_eq!(s.nodes[t].port.stats().write_refusals, 1);
    // An ABTS for a waiting write ends it at once, and it never runs.
    let tmf = s.tmf(i, TmfFunction::AbortTask { tag: d.0 });
    assert_eq!(
        s.nodes[i].tmfs.remove(&tmf),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(s.result(i, d).unwrap_err(), InitiatorError::Aborted);
    assert_eq!(s.nodes[t].port.writes_waiting(), 1);
    // The held commands end: the budget is back, and the waiting write is
    // asked for its data and goes.
    s.nodes[t].hold = false;
    s.release_held(t);
    assert_eq!(s.result(i, a).unwrap().status, Status::GOOD);
    assert_eq!(s.result(i, c).unwrap().status, Status::GOOD);
    assert_eq!(s.result(i, b).unwrap().status, Status::GOOD);
    assert_eq!(
        s.count(|f| matches!(f.payload, PayloadRepr::FcpXferRdy(_))),
        1
    );
    assert_eq!(s.nodes[t].port.writes_waiting(), 0);
    assert_eq!(s.nodes[t].port.write_bytes_held(), 0);
    // The aborted write never reached the LU.
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(600, 2), 1024));
    assert_eq!(joined(&s.result(i, rd).unwrap()), &[0u8; 1024][..]);
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(400, 2), 1024));
    assert_eq!(joined(&s.result(i, rd).unwrap()), &pattern(1024, 4)[..]);
    assert_eq!(s.nodes[t].port.write_bytes_held(), 0);
}

/// Write data cut into 4-byte frames: in offset order they are gathered
/// and the write succeeds with its data intact; scattered out of order,
/// so finely that each would be its own piece, the write is refused with
/// FCP_RSP code 3 before the pieces outgrow the data, and the LU never
/// sees it.
#[test]
fn write_data_in_tiny_frames_is_gathered_or_refused() {
    let (mut s, t, i) = pair(64 * 1024);
    s.split_data = Some((4, false));
    let data = pattern(16 * 1024, 7);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(8, 32), data.clone()),
    );
    assert_eq!(s.result(i, w).unwrap().status, Status::GOOD);
    s.split_data = None;
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(8, 32), 16 * 1024));
    assert_eq!(joined(&s.result(i, rd).unwrap()), &data[..]);

    s.split_data = Some((4, true));
    let other = pattern(16 * 1024, 9);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(8, 32), other),
    );
    assert_eq!(
        s.result(i, w).unwrap_err(),
        InitiatorError::ServiceResponse(3),
        "a write scattered into 4,096 pieces is refused with FCP_RSP code 3"
    );
    s.split_data = None;
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(8, 32), 16 * 1024));
    assert_eq!(
        joined(&s.result(i, rd).unwrap()),
        &data[..],
        "the refused write never reached the LU"
    );
    assert_eq!(s.nodes[t].port.write_bytes_held(), 0);
}

/// Read data cut into 4-byte frames: in offset order the initiator
/// gathers them and the read returns the data; scattered out of order so
/// finely that each would be its own piece, the command fails (and its
/// exchange is aborted) before the pieces outgrow the data.
#[test]
fn read_data_in_tiny_frames_is_gathered_or_refused() {
    let (mut s, _t, i) = pair(64 * 1024);
    let data = pattern(16 * 1024, 5);
    let w = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(16, 32), data.clone()),
    );
    assert_eq!(s.result(i, w).unwrap().status, Status::GOOD);

    s.split_data = Some((4, false));
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(16, 32), 16 * 1024));
    let r = s.result(i, rd).unwrap();
    assert_eq!(joined(&r), &data[..]);
    assert!(
        r.data_in.len() <= 2,
        "4,096 frames gathered into {} pieces",
        r.data_in.len()
    );

    s.split_data = Some((4, true));
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(16, 32), 16 * 1024));
    assert_eq!(
        s.result(i, rd).unwrap_err(),
        InitiatorError::Protocol("data-in scattered out of order too finely")
    );
    s.split_data = None;
    let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(16, 32), 16 * 1024));
    assert_eq!(joined(&s.result(i, rd).unwrap()), &data[..], "I/O goes on");
}

#[test]
fn residual_overrun_and_underrun() {
    let (mut s, _t, i) = pair(64 * 1024);
    // Underrun: the initiator expects 8 KiB, the CDB moves 4 KiB.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 8192));
    let r = s.result(i, id).unwrap();
    assert_eq!(r.residual, Some(Residual::Underflow(4096)));
    assert_eq!(joined(&r).len(), 4096);
    // Overrun: the initiator expects 1 KiB of a 4 KiB read.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 1024));
    let r = s.result(i, id).unwrap();
    assert_eq!(r.residual, Some(Residual::Overflow(3072)));
    assert_eq!(joined(&r).len(), 1024, "never more than expected");
    // Write overrun: 8 KiB announced for a 4 KiB write.
    let id = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 8), pattern(8192, 1)),
    );
    let r = s.result(i, id).unwrap();
    assert_eq!(r.status, Status::GOOD);
    assert_eq!(r.residual, Some(Residual::Underflow(4096)));
    // Write underrun: 2 KiB announced for a 4 KiB write.
    let id = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 8), pattern(2048, 1)),
    );
    let r = s.result(i, id).unwrap();
    assert_eq!(r.residual, Some(Residual::Overflow(2048)));
    // The residual flags travelled in FCP_RSP.
    let flags: Vec<u8> = s
        .log
        .iter()
        .filter_map(|f| match &f.payload {
            PayloadRepr::FcpRsp(r) => Some(r.flags.0 & 0x0c),
            _ => None,
        })
        .collect();
    assert_eq!(flags, vec![0x08, 0x04, 0x08, 0x04]);
    // CHECK CONDITION carries sense: READ beyond the end of the 8 MiB LU.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0x10000, 1), 512));
    let r = s.result(i, id).unwrap();
    assert_eq!(r.status, Status::CHECK_CONDITION);
    let sense = r.sense.unwrap();
    assert_eq!(sense[2] & 0x0f, 0x05, "ILLEGAL REQUEST");
    assert_eq!(sense[12], 0x21, "LBA OUT OF RANGE");
}

#[test]
fn abts_in_the_middle_of_an_exchange() {
    let (mut s, t, i) = pair(64 * 1024);
    s.nodes[t].hold = true;
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    assert_eq!(
        s.nodes[t].held.len(),
        1,
        "the target is running the command"
    );
    assert!(!s.nodes[i].results.contains_key(&id));
    // ABORT TASK: the initiator sends ABTS; the target aborts the task in
    // the LU and answers BA_ACC; the initiator recovers the OX_ID with RRQ.
    s.log.clear();
    let tmf = s.tmf(i, TmfFunction::AbortTask { tag: id.0 });
    assert_eq!(
        s.count(|f| matches!(&f.payload, PayloadRepr::Bls(b) if b.r_ctl() == RCtl::ABTS)),
        1
    );
    assert_eq!(
        s.count(|f| matches!(&f.payload, PayloadRepr::Bls(b) if b.r_ctl() == RCtl::BA_ACC)),
        1
    );
    assert_eq!(
        s.nodes[i].tmfs.remove(&tmf),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(s.result(i, id).unwrap_err(), InitiatorError::Aborted);
    assert_eq!(
        s.count(
            |f| matches!(&f.payload, PayloadRepr::Els(e) if format!("{:?}", e.code()) == "RRQ")
        ),
        1
    );
    // The RRQ named the exchange whose RX_ID the target held: accepted.
    let els_replies: Vec<String> = s
        .log
        .iter()
        .filter_map(|f| match &f.payload {
            PayloadRepr::Els(e) => Some(format!("{e:?}")),
            _ => None,
        })
        .filter(|e| e.starts_with("LsAcc") || e.starts_with("LsRjt"))
        .collect();
    assert_eq!(els_replies.len(), 1, "{els_replies:?}");
    assert!(els_replies[0].starts_with("LsAcc"), "{els_replies:?}");
    // The held task ended aborted in the LU, and nothing went out for it.
    assert_eq!(s.nodes[t].aborted_in_lu, 1);
    assert!(s.nodes[t].held.is_empty());
    assert_eq!(s.count(|f| matches!(f.payload, PayloadRepr::FcpRsp(_))), 0);
    s.nodes[t].hold = false;
    // The exchange is gone at both ends and I/O goes on.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    assert_eq!(s.result(i, id).unwrap().status, Status::GOOD);
}

#[test]
fn a_target_sending_data_in_twice_is_cut_off_at_the_read_length() {
    let (mut s, _t, i) = pair(64 * 1024);
    // Every data frame a thousand times: the initiator holds no more than
    // the command reads, fails it at once and aborts the exchange.
    s.repeat_data = 1000;
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    assert_eq!(
        s.result(i, id).unwrap_err(),
        InitiatorError::Protocol("data-in beyond the expected length")
    );
    assert!(s.count(|f| matches!(&f.payload, PayloadRepr::Bls(b) if b.r_ctl() == RCtl::ABTS)) >= 1);
    // A well-behaved target again: I/O goes on.
    s.repeat_data = 0;
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    assert_eq!(s.result(i, id).unwrap().status, Status::GOOD);
}

#[test]
fn a_command_without_answer_times_out_and_is_aborted() {
    let (mut s, t, i) = pair(64 * 1024);
    s.nodes[t].hold = true;
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    s.advance(Duration::from_secs(31));
    assert_eq!(
        s.count(|f| matches!(&f.payload, PayloadRepr::Bls(b) if b.r_ctl() == RCtl::ABTS)),
        1
    );
    assert!(matches!(
        s.result(i, id),
        Err(InitiatorError::Timeout { .. })
    ));
}

#[test]
fn abandoned_command_is_aborted_silently() {
    let (mut s, t, i) = pair(64 * 1024);
    s.nodes[t].hold = true;
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    let now = s.now;
    s.nodes[i].port.abandon(now, id);
    s.run();
    assert_eq!(
        s.count(|f| matches!(&f.payload, PayloadRepr::Bls(b) if b.r_ctl() == RCtl::BA_ACC)),
        1
    );
    assert!(
        s.nodes[i].results.is_empty(),
        "nothing reported for an abandoned command"
    );
}

#[test]
fn lun_reset_ends_the_initiators_own_commands() {
    let (mut s, t, i) = pair(64 * 1024);
    s.nodes[t].hold = true;
    let a = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 8), 4096));
    let tmf = s.tmf(i, TmfFunction::LogicalUnitReset);
    assert_eq!(
        s.nodes[i].tmfs.remove(&tmf),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(s.result(i, a).unwrap_err(), InitiatorError::Aborted);
    let tmf_cmnds = s.count(|f| matches!(&f.payload, PayloadRepr::FcpCmnd(c) if c.tmf.0 == 0x10));
    assert_eq!(tmf_cmnds, 1, "LOGICAL UNIT RESET went as FCP_CMND flags");
}

#[test]
fn lun_reset_ends_writes_waiting_for_the_budget() {
    let (mut s, t, i) = budget_pair(16 * 1024);
    // The LU holds a 16 KiB write, so the next one waits for its share.
    s.nodes[t].hold = true;
    let a = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(0, 32), pattern(16 * 1024, 1)),
    );
    let b = s.submit(
        i,
        T_WWPN,
        Request::with_data_out(Lun(0), write10(100, 8), pattern(4096, 2)),
    );
    assert_eq!(s.nodes[t].port.writes_waiting(), 1);
    s.log.clear();
    // LOGICAL UNIT RESET: the LU aborts the running write and the port the
    // waiting one; the budget the first gives back asks for no data.
    let tmf = s.tmf(i, TmfFunction::LogicalUnitReset);
    assert_eq!(
        s.nodes[i].tmfs.remove(&tmf),
        Some(Ok(TmfResponse::FunctionComplete))
    );
    assert_eq!(s.result(i, a).unwrap_err(), InitiatorError::Aborted);
    assert_eq!(s.result(i, b).unwrap_err(), InitiatorError::Aborted);
    assert_eq!(
        s.count(|f| matches!(f.payload, PayloadRepr::FcpXferRdy(_))),
        0
    );
    assert_eq!(s.nodes[t].port.writes_waiting(), 0);
    assert_eq!(s.nodes[t].port.write_bytes_held(), 0);
    // Nothing of either write reached the medium.
    s.nodes[t].hold = false;
    let ua = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    assert_eq!(s.result(i, ua).unwrap().status, Status::CHECK_CONDITION);
    for lba in [0, 100] {
        let rd = s.submit(i, T_WWPN, Request::new(Lun(0), read10(lba, 8), 4096));
        assert_eq!(joined(&s.result(i, rd).unwrap()), &[0u8; 4096][..]);
    }
}

#[test]
fn logo_ends_the_nexus() {
    let (mut s, t, i) = pair(64 * 1024);
    let t_id = s.nodes[t].port.fc_id();
    let now = s.now;
    s.nodes[i].port.logout_peer(now, t_id);
    s.run();
    assert_eq!(
        s.nodes[t].nexus_losses, 1,
        "the target's LU heard of the nexus loss"
    );
    assert_eq!(s.nodes[i].down, vec![t_id]);
    assert!(s.nodes[i].port.ready_port_by_name(T_WWPN).is_none());
    // A command now waits for a login that does not come.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    s.advance(Duration::from_secs(31));
    assert!(matches!(
        s.result(i, id),
        Err(InitiatorError::Unreachable { .. })
    ));
}

/// The target leaves the fabric; the initiator learns it by RSCN.
fn target_leaves(s: &mut Sim, t: usize, i: usize) {
    let now = s.now;
    s.nodes[t].port.logout(now);
    s.run();
    assert!(s.nodes[i].port.ready_port_by_name(T_WWPN).is_none());
}

/// A one-block READ(10) for `target`.
fn read_one(s: &mut Sim, i: usize, target: Wwn) -> CommandId {
    s.submit(i, target, Request::new(Lun(0), read10(0, 1), 512))
}

/// The command has no answer yet.
fn unanswered(s: &Sim, i: usize, id: CommandId) -> bool {
    !s.nodes[i].results.contains_key(&id)
}

fn unreachable_reason(r: Result<TaskResult, InitiatorError>) -> String {
    match r {
        Err(InitiatorError::Unreachable { reason }) => reason,
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

#[test]
fn fast_io_fail_bounds_the_wait_for_a_lost_target_port() {
    let (mut s, t, i) = pair_with(64 * 1024, Some(Duration::from_secs(5)));
    target_leaves(&mut s, t, i);
    let a = read_one(&mut s, i, T_WWPN);
    s.advance(Duration::from_secs(3));
    assert!(
        unanswered(&s, i, a),
        "within fast_io_fail a command waits for the port"
    );
    let b = read_one(&mut s, i, T_WWPN);
    // 5.5 s after the loss: both end, the later one too (its wait counts
    // from the loss, not from its submission).
    s.advance(Duration::from_millis(2500));
    for id in [a, b] {
        let reason = unreachable_reason(s.result(i, id));
        assert!(
            reason.contains("lost") && reason.contains("fast_io_fail"),
            "{reason}"
        );
    }
    // Lost for longer than fast_io_fail: a new command fails at once.
    let c = read_one(&mut s, i, T_WWPN);
    let reason = unreachable_reason(s.result(i, c));
    assert!(reason.contains(&T_WWPN.to_string()), "{reason}");
    // The port comes back: commands reach it again.
    let now = s.now;
    s.nodes[t].port.link_up(now);
    s.run();
    assert!(s.nodes[i].port.ready_port_by_name(T_WWPN).is_some());
    let d = read_one(&mut s, i, T_WWPN);
    assert!(s.result(i, d).is_ok(), "the returned port answers");
}

#[test]
fn without_fast_io_fail_a_command_waits_its_whole_timeout() {
    let (mut s, t, i) = pair(64 * 1024);
    target_leaves(&mut s, t, i);
    let a = read_one(&mut s, i, T_WWPN);
    s.advance(Duration::from_secs(29));
    assert!(unanswered(&s, i, a), "still waiting at 29 s");
    s.advance(Duration::from_secs(2));
    let reason = unreachable_reason(s.result(i, a));
    assert!(!reason.contains("fast_io_fail"), "{reason}");
}

/// Once a lost port is back, `fast_io_fail` no longer bounds the wait of
/// its commands: one queued behind an earlier command for the same port
/// that waits for the link's room waits its whole timeout, as that one
/// does, and then both end as timed out, not as "not logged in".
#[test]
fn a_command_behind_one_waiting_for_room_waits_its_timeout_once_the_port_is_back() {
    let mut s = Sim::new();
    let t1 = s.target(T_WWPN, 8, 1 << 20);
    let t2 = s.target(T2_WWPN, 8, 1 << 20);
    s.run();
    let mut cfg = NPortConfig::new(I_WWPN, Wwn(I_WWPN.0 ^ 0x0100_0000_0000_0000));
    cfg.initiator = true;
    cfg.discover = true;
    cfg.fast_io_fail = Some(Duration::from_secs(5));
    cfg.max_frames_in = Some(10);
    let i = s.add(cfg, None);
    s.run();
    for target in [T_WWPN, T2_WWPN] {
        let ua = s.submit(
            i,
            target,
            Request::new(Lun(0), Bytes::from_static(&[0; 6]), 0),
        );
        assert_eq!(s.result(i, ua).unwrap().status, Status::CHECK_CONDITION);
    }
    // T1 holds two 8 KiB reads: the link's room is taken.
    s.nodes[t1].hold = true;
    for _ in 0..2 {
        s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 16), 8192));
    }
    assert_eq!(s.nodes[i].port.frames_in(), 10);
    // T2 leaves; two commands wait for it.
    let now = s.now;
    s.nodes[t2].port.logout(now);
    s.run();
    assert!(s.nodes[i].port.ready_port_by_name(T2_WWPN).is_none());
    let c = read_one(&mut s, i, T2_WWPN);
    let d = read_one(&mut s, i, T2_WWPN);
    s.advance(Duration::from_secs(1));
    // T2 is back: c waits for room, d behind c.
    let now = s.now;
    s.nodes[t2].port.link_up(now);
    s.run();
    assert!(s.nodes[i].port.ready_port_by_name(T2_WWPN).is_some());
    assert_eq!(s.nodes[i].port.commands_waiting(), 2);
    // Past the loss's fast_io_fail: both still wait.
    s.advance(Duration::from_secs(6));
    assert!(
        unanswered(&s, i, c) && unanswered(&s, i, d),
        "{:?}",
        s.nodes[i].results
    );
    // Past their own timeout: both time out.
    s.advance(Duration::from_secs(24));
    for id in [c, d] {
        assert!(
            matches!(s.result(i, id), Err(InitiatorError::Timeout { .. })),
            "{:?}",
            s.result(i, id)
        );
    }
}

#[test]
fn fast_io_fail_waits_for_a_port_not_yet_seen_and_sends_when_it_comes() {
    let mut s = Sim::new();
    let i = s.initiator_with(I_WWPN, Some(Duration::from_secs(5)));
    s.run();
    let a = read_one(&mut s, i, T_WWPN);
    s.advance(Duration::from_secs(4));
    assert!(unanswered(&s, i, a));
    s.target(T_WWPN, 8, 64 * 1024);
    s.run();
    let r = s.result(i, a).expect("sent once the port logged in");
    assert_eq!(
        r.status,
        Status::CHECK_CONDITION,
        "the new nexus's unit attention"
    );
    // A port never seen: the wait counts from the command.
    let b = read_one(&mut s, i, Wwn(0x2100_0000_0000_00c1));
    s.advance(Duration::from_secs(4));
    assert!(unanswered(&s, i, b));
    s.advance(Duration::from_millis(1500));
    let reason = unreachable_reason(s.result(i, b));
    assert!(reason.contains("within fast_io_fail"), "{reason}");
}

#[test]
fn fabric_logout_and_rscn() {
    let (mut s, t, i) = pair(64 * 1024);
    let i_id = s.nodes[i].port.fc_id();
    let rscn_before = s.fabric.rscns_sent();
    let now = s.now;
    s.nodes[i].port.logout(now);
    s.run();
    assert_eq!(s.fabric.logins().len(), 1);
    assert!(s.fabric.rscns_sent() > rscn_before, "the target was told");
    assert_eq!(
        s.nodes[t].nexus_losses, 1,
        "the target dropped the gone initiator"
    );
    assert!(s.nodes[t].port.ready_ports().iter().all(|p| p.0 != i_id));
}

fn zone(name: &str, members: &[Wwn]) -> Zone {
    Zone {
        name: name.into(),
        members: members.iter().map(|w| ZoneMember::PortName(*w)).collect(),
    }
}

#[test]
fn rscn_on_zone_change() {
    let (mut s, t, i) = pair(64 * 1024);
    let t_id = s.nodes[t].port.fc_id();
    s.fabric.define_zone(zone("z_host", &[I_WWPN, T_WWPN]));
    s.fabric.define_zone(zone("z_other", &[I2_WWPN, T_WWPN]));
    s.fabric.define_zone_set(ZoneSet {
        name: "cfg1".into(),
        zones: vec!["z_host".into()],
    });
    s.fabric.define_zone_set(ZoneSet {
        name: "cfg2".into(),
        zones: vec!["z_other".into()],
    });
    let base = s.fabric.rscns_sent();
    s.fabric.activate_zone_set("cfg1").unwrap();
    s.run();
    assert_eq!(
        s.fabric.rscns_sent(),
        base,
        "cfg1 changes nothing the two see"
    );
    let heard = s.nodes[i].port.stats().rscn_received;
    s.fabric.activate_zone_set("cfg2").unwrap();
    s.run();
    assert_eq!(
        s.fabric.rscns_sent(),
        base + 2,
        "both ports lost each other"
    );
    assert_eq!(s.nodes[i].port.stats().rscn_received, heard + 1);
    assert_eq!(
        s.nodes[i].down,
        vec![t_id],
        "rediscovery dropped the target"
    );
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    s.advance(Duration::from_secs(31));
    assert!(matches!(
        s.result(i, id),
        Err(InitiatorError::Unreachable { .. })
    ));
    // Back in the zone: RSCN, rediscovery, login, I/O.
    s.fabric.activate_zone_set("cfg1").unwrap();
    s.run();
    assert_eq!(s.nodes[i].port.ready_port_by_name(T_WWPN), Some(t_id));
    // A new nexus: the LU reports the earlier one's loss first.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    let r = s.result(i, id).unwrap();
    assert_eq!(r.sense.unwrap()[2] & 0x0f, 0x06, "UNIT ATTENTION");
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    assert_eq!(s.result(i, id).unwrap().status, Status::GOOD);
}

#[test]
fn zoned_out_initiator_sees_nothing_and_its_frames_are_dropped() {
    let (mut s, t, i) = pair(64 * 1024);
    s.fabric.define_zone(zone("z_host", &[I_WWPN, T_WWPN]));
    s.fabric.define_zone_set(ZoneSet {
        name: "cfg".into(),
        zones: vec!["z_host".into()],
    });
    s.fabric.activate_zone_set("cfg").unwrap();
    s.fabric.set_default_zone_permit(false);
    s.run();
    let i2 = s.initiator(I2_WWPN);
    s.run();
    let t_id = s.nodes[t].port.fc_id();
    assert!(s.nodes[i2].port.is_online());
    assert!(s.nodes[i2].up.is_empty(), "no target visible");
    // Its GID_FT answer named no target.
    let i2_id = s.nodes[i2].port.fc_id();
    let saw_target = s.log.iter().any(|f| {
        f.header.d_id == i2_id
            && matches!(&f.payload, PayloadRepr::Ct(c) if matches!(&c.body,
                CtBody::Accept(NsAccept::PortIds(ids)) if ids.iter().any(|e| e.port_id == t_id)))
    });
    assert!(!saw_target);
    // Frames it addresses to the target are dropped and counted.
    let fport = s.nodes[i2].fport;
    let drops = s.fabric.counters(fport).unwrap().zone_drops;
    let mut h = unifab_fc::wire::FcHeaderRepr {
        r_ctl: RCtl::FCP_CMND,
        d_id: t_id,
        s_id: i2_id,
        fc_type: FcType::FCP,
        ..Default::default()
    };
    h.ox_id = unifab_fc::wire::OxId(1);
    let delivered = s.nodes[t].port.stats().rx_frames;
    s.fabric
        .handle_frame(s.now, fport, Frame::new(h, Bytes::from_static(&[0; 32])));
    s.run();
    assert_eq!(s.fabric.counters(fport).unwrap().zone_drops, drops + 1);
    assert_eq!(
        s.nodes[t].port.stats().rx_frames,
        delivered,
        "nothing reached the target"
    );
    // A command from it never reaches a target.
    let id = s.submit(i2, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    s.advance(Duration::from_secs(31));
    assert!(matches!(
        s.result(i2, id),
        Err(InitiatorError::Unreachable { .. })
    ));
    // The zoned initiator still works.
    let id = s.submit(i, T_WWPN, Request::new(Lun(0), read10(0, 1), 512));
    assert_eq!(s.result(i, id).unwrap().status, Status::GOOD);
}

/// An FDISC right after a LOGO gets a new N_Port_ID, not the one just
/// given back: frames still in flight for the old login (a target's late
/// answer, its LOGO) must not reach the port that logs in next. Found
/// through the FCoE and FCIP hops, where a host session's NPIV port is
/// released and the next session's acquired within a millisecond.
#[test]
fn fdisc_after_logo_does_not_reuse_the_address_at_once() {
    use unifab_fc::compose::{self, Route};
    use unifab_fc::fabric::LoginKind;
    use unifab_fc::wire::OxId;
    use unifab_fc::wire::els::{ElsRepr, LoginParams, Logo};

    let mut fabric = Fabric::new(FabricConfig::default());
    let port = fabric.attach("vfc1");
    let now = Instant::now();
    let mut ox = 0u16;
    let mut login = |fabric: &mut Fabric, fdisc: bool, name: u64| -> FcId {
        ox += 1;
        let params = LoginParams::n_port(Wwn(name), Wwn(name | 1 << 60), 2048, 2000);
        let els = if fdisc {
            ElsRepr::Fdisc(params)
        } else {
            ElsRepr::Flogi(params)
        };
        let route = Route::request(FcId::UNIDENTIFIED, FcId::LOGIN_SERVER, OxId(ox));
        fabric.handle_frame(now, port, compose::els(route, &els).unwrap());
        while fabric.poll_transmit().is_some() {}
        let entry = fabric
            .logins()
            .into_iter()
            .find(|l| l.port_name == Wwn(name))
            .expect("the login was accepted");
        assert_eq!(entry.kind == LoginKind::Fdisc, fdisc);
        entry.fc_id
    };
    let physical = login(&mut fabric, false, 0x2000_0000_0000_0001);
    let mut seen = vec![physical];
    for i in 0..300u64 {
        let name = 0x3000_0000_0000_0000 | i;
        let id = login(&mut fabric, true, name);
        assert!(
            !seen.ends_with(&[id]),
            "FDISC {i} got {id:?}, the address just logged out"
        );
        // Within one cycle of the 255 port numbers no address repeats.
        if seen.len() <= 255 {
            assert!(!seen.contains(&id), "FDISC {i} reused {id:?} early");
        }
        seen.push(id);
        let logo = ElsRepr::Logo(Logo {
            n_port_id: id,
            port_name: Wwn(name),
        });
        let route = Route::request(id, FcId::LOGIN_SERVER, OxId(0x4000 + i as u16));
        fabric.handle_frame(now, port, compose::els(route, &logo).unwrap());
        while fabric.poll_transmit().is_some() {}
        assert!(fabric.login(id).is_none(), "the LOGO ended the login");
    }
}
