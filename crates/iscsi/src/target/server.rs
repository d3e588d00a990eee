//! The iSCSI target server: portals, target nodes, login and sessions.
//!
//! ```text
//!   accept ─▶ connection limit ─▶ login (bounded time, bounded count)
//!        ─▶ discovery session (SendTargets) | normal session (full feature phase)
//! ```
//!
//! Session reinstatement (RFC 7143 §6.3.5): a new login with TSIH 0 and the
//! InitiatorName and ISID of a live session to the same target ends the old
//! session before the new one starts. MaxConnections is 1: a login that
//! tries to add a connection to a session is refused (0x0205), except a
//! connection reinstatement with the same CID, which replaces the old
//! connection.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use unifab_scsi_core::{Dispatch, ItNexus, TargetPort, TransportId};

use super::io::{
    FfpSetup, Listeners, PortalCmd, SessionHandle, SessionInfo, Shared, fill, run_ffp,
};
use super::session::SessionLimits;
use crate::chap::{ChapConfig, ChapCredentials, TargetSecrets};
use crate::ffp::FfpParams;
use crate::login::{
    AdmitRequest, AuthPolicy, LoginPolicy, LoginStatus, TargetConfig, TargetLogin,
    TargetLoginConfig, TargetLookup, TargetStep,
};
use crate::negotiate::{NegotiationLimits, Role, SessionParams, SessionType};
use crate::sendtargets;
use crate::wire::{Digests, Framer, Pdu, encode_pdu};

/// CHAP credentials a target requires.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSettings {
    /// CHAP_N the initiator must use.
    pub user: String,
    /// The initiator's secret.
    pub secret: Vec<u8>,
    /// Mutual CHAP: the target's name and secret. When set, mutual CHAP is
    /// required.
    pub mutual: Option<(String, Vec<u8>)>,
}

impl std::fmt::Debug for ChapSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapSettings")
            .field("user", &self.user)
            .field("mutual_user", &self.mutual.as_ref().map(|m| &m.0))
            .finish_non_exhaustive()
    }
}

/// One iSCSI target node served by this server.
#[derive(Debug, Clone)]
pub struct TargetNode {
    /// iSCSI name.
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// Where its tasks go.
    pub scsi: Arc<dyn Dispatch>,
    /// Initiator names allowed (None: all).
    pub allow: Option<Vec<String>>,
    /// CHAP, required when set.
    pub chap: Option<ChapSettings>,
}

/// Server-wide settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// TargetPortalGroupTag of every portal (one portal group).
    pub portal_group_tag: u16,
    /// RELATIVE TARGET PORT IDENTIFIER of the target port (SPC-4), for
    /// VPD 83h and REPORT TARGET PORT GROUPS.
    pub relative_port_id: u16,
    /// TARGET PORT GROUP of the target port (ALUA).
    pub port_group: u16,
    /// TCP connections at once.
    pub max_connections: usize,
    /// Connections in the login phase at once (half-open logins beyond it
    /// are dropped at accept).
    pub max_logins: usize,
    /// How long a login may take.
    pub login_timeout: Duration,
    /// Full-feature-phase limits.
    pub limits: SessionLimits,
    /// What we negotiate.
    pub negotiation: NegotiationLimits,
    /// Authentication for discovery sessions.
    pub discovery_auth: AuthPolicy,
    /// The TargetAddress values SendTargets gives instead of the portals'
    /// own addresses (`host[:port]`, checked by
    /// [`crate::sendtargets::check_advertised_address`]): for portals that
    /// hosts reach through NAT or a port mapping. Empty: the portals'
    /// addresses ([`crate::sendtargets::target_addresses`]).
    pub advertise: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            portal_group_tag: 1,
            relative_port_id: 1,
            port_group: 1,
            max_connections: 1024,
            max_logins: 64,
            login_timeout: Duration::from_secs(15),
            limits: SessionLimits::default(),
            negotiation: NegotiationLimits {
                initial_r2t: false,
                immediate_data: true,
                max_recv_data_segment_length: 262_144,
                max_burst_length: 1 << 20,
                first_burst_length: 262_144,
                max_outstanding_r2t: 8,
                ..NegotiationLimits::default()
            },
            discovery_auth: AuthPolicy::None,
            advertise: Vec::new(),
        }
    }
}

/// A target server's counters since start ([`TargetServer::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortalStats {
    /// TCP connections accepted on the portals (refused ones too).
    pub connections: u64,
    /// Logins that reached full feature phase (normal and discovery).
    pub logins: u64,
    /// Logins refused: authentication, authorization, a protocol error,
    /// a login that timed out, a connection refused for want of
    /// resources.
    pub login_failures: u64,
    /// SCSI commands run.
    pub commands: u64,
}

/// A running target server's handle.
#[derive(Debug, Clone)]
pub struct TargetServer {
    shared: Arc<Shared>,
    nodes: Arc<RwLock<HashMap<String, Arc<TargetNode>>>>,
    config: Arc<ServerConfig>,
    portals: Arc<Mutex<Portals>>,
    /// What SendTargets advertises (starts as `config.advertise`; a reload
    /// changes it).
    advertised: Arc<RwLock<Vec<String>>>,
}

/// The portals: each configured address with the one it is bound to, and
/// while [`TargetServer::run`] serves, the way to change them.
#[derive(Debug, Default)]
struct Portals {
    bound: Vec<(SocketAddr, SocketAddr)>,
    /// Changes for the accept loop (buffered until `run` takes them).
    control: Option<tokio::sync::mpsc::UnboundedSender<PortalCmd>>,
    commands: Option<tokio::sync::mpsc::UnboundedReceiver<PortalCmd>>,
}

impl TargetServer {
    /// Binds the portals. Call [`TargetServer::run`] to serve.
    pub async fn bind(
        addrs: &[SocketAddr],
        config: ServerConfig,
        nodes: Vec<TargetNode>,
    ) -> io::Result<(TargetServer, Listeners)> {
        let listeners = Listeners::bind(addrs).await?;
        let bound = addrs.iter().copied().zip(listeners.local_addrs()).collect();
        let (control, commands) = tokio::sync::mpsc::unbounded_channel();
        let map = nodes
            .into_iter()
            .map(|n| (n.name.to_ascii_lowercase(), Arc::new(n)))
            .collect();
        let server = TargetServer {
            shared: Arc::new(Shared::new()),
            nodes: Arc::new(RwLock::new(map)),
            advertised: Arc::new(RwLock::new(config.advertise.clone())),
            config: Arc::new(config),
            portals: Arc::new(Mutex::new(Portals {
                bound,
                control: Some(control),
                commands: Some(commands),
            })),
        };
        Ok((server, listeners))
    }

    /// Replaces the addresses SendTargets advertises (empty: the portals'
    /// own); answers from then on use them.
    pub fn set_advertised(&self, addresses: Vec<String>) {
        *self.advertised.write().unwrap_or_else(|e| e.into_inner()) = addresses;
    }

    /// The bound portal addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.portals().bound.iter().map(|(_, b)| *b).collect()
    }

    fn portals(&self) -> std::sync::MutexGuard<'_, Portals> {
        self.portals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens on `addr` too (from when [`TargetServer::run`] serves);
    /// returns the bound address.
    pub async fn add_portal(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        self.add_listener(addr, l)
    }

    /// [`TargetServer::add_portal`] with a listener bound already (so that
    /// a caller changing several things binds before it changes any):
    /// `addr` is the address as configured.
    pub fn add_listener(
        &self,
        addr: SocketAddr,
        l: tokio::net::TcpListener,
    ) -> io::Result<SocketAddr> {
        let bound = l.local_addr()?;
        let mut p = self.portals();
        let sent = p
            .control
            .as_ref()
            .is_some_and(|c| c.send(PortalCmd::Add(l)).is_ok());
        if !sent {
            return Err(io::Error::other("the server has stopped"));
        }
        p.bound.push((addr, bound));
        info!(addr = %bound, "iSCSI portal listening");
        Ok(bound)
    }

    /// Stops listening on the portal configured (or bound) as `addr`: no
    /// new connection is accepted there; sessions it accepted go on.
    /// False if there is none.
    pub fn remove_portal(&self, addr: SocketAddr) -> bool {
        let mut p = self.portals();
        let Some(i) = p.bound.iter().position(|(c, b)| *c == addr || *b == addr) else {
            return false;
        };
        let (_, bound) = p.bound.remove(i);
        if let Some(c) = &p.control {
            let _ = c.send(PortalCmd::Remove(bound));
        }
        info!(addr = %bound, "iSCSI portal closed; its sessions go on");
        true
    }

    /// Live sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.shared.snapshot()
    }

    /// SCSI commands run since start, by live sessions and ended ones.
    /// Never goes down.
    pub fn commands(&self) -> u64 {
        self.shared.commands_total()
    }

    /// The portals' counters since start.
    pub fn stats(&self) -> PortalStats {
        PortalStats {
            connections: self.shared.connections.load(Ordering::Relaxed),
            logins: self.shared.logins.load(Ordering::Relaxed),
            login_failures: self.shared.login_failures.load(Ordering::Relaxed),
            commands: self.commands(),
        }
    }

    /// Serves until `shutdown` flips to true; then asks every session to
    /// log out (Async Message), waits up to 5 s, and returns.
    pub async fn run(&self, listeners: Listeners, shutdown: watch::Receiver<bool>) {
        let limit = Arc::new(Semaphore::new(self.config.max_connections));
        let logins = Arc::new(Semaphore::new(self.config.max_logins));
        let me = self.clone();
        let tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::new(Mutex::new(Vec::new()));
        let tasks2 = tasks.clone();
        let sd = shutdown.clone();
        let commands = self.portals().commands.take();
        let Some(commands) = commands else {
            warn!("the server already runs");
            return;
        };
        listeners
            .accept_loop(self.shared.clone(), limit, shutdown.clone(), commands, move |stream, probe, peer, permit| {
                let Ok(login_permit) = logins.clone().try_acquire_owned() else {
                    warn!(%peer, "too many logins in progress; login refused (out of resources)");
                    me.shared.login_failures.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(super::io::refuse_login(stream));
                    return;
                };
                let me = me.clone();
                let sd = sd.clone();
                let h = tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = me.connection(stream, probe, peer, login_permit, sd).await {
                        debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
                let mut t = tasks2.lock().unwrap_or_else(|e| e.into_inner());
                t.retain(|h| !h.is_finished());
                t.push(h);
            })
            .await;
        let handles: Vec<_> = std::mem::take(&mut *tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::time::timeout(Duration::from_secs(8), async {
            for h in handles {
                let _ = h.await;
            }
        })
        .await;
    }

    async fn connection(
        &self,
        mut stream: TcpStream,
        probe: socket2::Socket,
        peer: SocketAddr,
        login_permit: tokio::sync::OwnedSemaphorePermit,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        stream.set_nodelay(true)?;
        let local = stream.local_addr()?;
        let mut rbuf = BytesMut::with_capacity(8192);
        let login = tokio::time::timeout(
            self.config.login_timeout,
            self.login(&mut stream, &mut rbuf, peer),
        )
        .await;
        drop(login_permit);
        let (outcome, stat_sn) = match login {
            Ok(Ok(Some(x))) => x,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => {
                self.shared.login_failures.fetch_add(1, Ordering::Relaxed);
                info!(%peer, error = %e, "login failed");
                return Err(e);
            }
            Err(_) => {
                self.shared.login_failures.fetch_add(1, Ordering::Relaxed);
                info!(%peer, timeout = ?self.config.login_timeout, "login timed out; closing");
                return Ok(());
            }
        };
        self.shared.logins.fetch_add(1, Ordering::Relaxed);
        match outcome.session_type {
            SessionType::Discovery => self.discovery(stream, rbuf, outcome, stat_sn, local).await,
            _ => {
                let conn = LoggedIn {
                    stream,
                    probe,
                    rbuf,
                    outcome,
                    stat_sn,
                    peer,
                    local,
                };
                self.normal(conn, shutdown).await
            }
        }
    }

    /// Runs the login phase. `Ok(None)`: refused (the response was sent).
    async fn login(
        &self,
        stream: &mut TcpStream,
        rbuf: &mut BytesMut,
        peer: SocketAddr,
    ) -> io::Result<Option<(crate::login::LoginOutcome, u32)>> {
        let framer = Framer::default();
        let mut sm = TargetLogin::new(TargetLoginConfig {
            initial_stat_sn: rand_u32(),
            cmd_window: self.config.limits.queue_depth.max(1),
            chap: ChapConfig::default(),
            ..TargetLoginConfig::default()
        });
        let mut policy = Policy {
            server: self,
            pending_reinstatement: None,
        };
        let mut rng: rand::rngs::StdRng = rand::make_rng();
        loop {
            let more = fill(stream, rbuf, &framer)
                .await
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if !more {
                return Ok(None);
            }
            let frame = match framer.decode(rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            };
            let req = match frame.parse() {
                Ok(Pdu::LoginRequest(r)) => r,
                Ok(other) => {
                    // Only Login Requests before full feature phase (§6.3).
                    info!(%peer, pdu = ?other.opcode(), "non-login PDU during login; closing");
                    self.shared.login_failures.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            };
            let step = sm.handle(&req, &frame.data, &mut policy, &mut rng);
            match step {
                TargetStep::Continue(pdu) => {
                    write_login(stream, &pdu).await?;
                }
                TargetStep::Complete(pdu, outcome) => {
                    // A reinstated session must be gone before the new one
                    // answers (its tasks are aborted, nexus loss reported).
                    if let Some(done) = policy.pending_reinstatement.take() {
                        wait_done(done).await;
                    }
                    // So must sessions whose peer is already gone.
                    if let Some(target) = &outcome.target_name {
                        for done in self.shared.end_dead_sessions(target) {
                            wait_done(done).await;
                        }
                    }
                    write_login(stream, &pdu).await?;
                    let stat_sn = pdu.header.stat_sn.wrapping_add(1);
                    return Ok(Some((outcome, stat_sn)));
                }
                TargetStep::Failed(pdu, err) => {
                    self.shared.login_failures.fetch_add(1, Ordering::Relaxed);
                    info!(%peer, error = %err, "login refused");
                    write_login(stream, &pdu).await?;
                    let _ = stream.shutdown().await;
                    return Ok(None);
                }
            }
        }
    }

    async fn discovery(
        &self,
        stream: TcpStream,
        rbuf: BytesMut,
        outcome: crate::login::LoginOutcome,
        stat_sn: u32,
        local: SocketAddr,
    ) -> io::Result<()> {
        // A discovery session is a full-feature-phase session that accepts
        // only Text (SendTargets), NOP and Logout: its `Dispatch` refuses SCSI
        // commands.
        let me = self.clone();
        let initiator = outcome.initiator_name.clone();
        let text =
            Box::new(move |data: &Bytes| Some(me.send_targets(data, local, &initiator, None)));
        let nexus = ItNexus::new(
            TransportId::Iscsi {
                name: outcome.initiator_name.clone(),
                isid: Some(outcome.isid),
            },
            TargetPort {
                id: TransportId::Iscsi {
                    name: "discovery".into(),
                    isid: None,
                },
                relative_port_id: self.config.relative_port_id,
                port_group: self.config.port_group,
            },
        );
        let info = Arc::new(Mutex::new(SessionInfo {
            target: "(discovery)".into(),
            initiator: outcome.initiator_name.clone(),
            isid: hex(&outcome.isid),
            tsih: outcome.tsih,
            peer: String::new(),
            digests: digest_name(outcome.digests),
            commands: 0,
        }));
        let (_kill_tx, kill) = watch::channel(false);
        let (_sd_tx, sd) = watch::channel(false);
        let setup = FfpSetup {
            nexus,
            cid: outcome.cid,
            params: FfpParams::from_login(&outcome, Role::Target),
            limits: SessionLimits {
                queue_depth: 8,
                ..self.config.limits
            },
            digests: outcome.digests,
            exp_cmd_sn: outcome.exp_cmd_sn,
            stat_sn,
            scsi: Arc::new(DiscoverySessionTarget),
            kill,
            shutdown: sd,
            // Discovery sessions are not asked to leave alone.
            logout: watch::channel(false).1,
            info,
            text,
            cold_reset: Box::new(|| {}),
        };
        run_ffp(stream, rbuf, setup).await
    }

    async fn normal(&self, conn: LoggedIn, shutdown: watch::Receiver<bool>) -> io::Result<()> {
        let LoggedIn {
            stream,
            probe,
            rbuf,
            outcome,
            stat_sn,
            peer,
            local,
        } = conn;
        let target_name = outcome.target_name.clone().unwrap_or_default();
        let Some(node) = self.node(&target_name) else {
            return Ok(());
        };
        let key = (
            target_name.to_ascii_lowercase(),
            outcome.initiator_name.to_ascii_lowercase(),
            outcome.isid,
        );
        let nexus = ItNexus::new(
            TransportId::Iscsi {
                name: outcome.initiator_name.clone(),
                isid: Some(outcome.isid),
            },
            TargetPort {
                id: TransportId::Iscsi {
                    name: format!("{},t,0x{:04x}", node.name, self.config.portal_group_tag),
                    isid: None,
                },
                relative_port_id: self.config.relative_port_id,
                port_group: self.config.port_group,
            },
        );
        let info = Arc::new(Mutex::new(SessionInfo {
            target: node.name.clone(),
            initiator: outcome.initiator_name.clone(),
            isid: hex(&outcome.isid),
            tsih: outcome.tsih,
            peer: peer.to_string(),
            digests: digest_name(outcome.digests),
            commands: 0,
        }));
        let (kill_tx, kill) = watch::channel(false);
        let (logout_tx, logout) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        {
            let mut sessions = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            sessions.insert(
                key.clone(),
                SessionHandle {
                    tsih: outcome.tsih,
                    kill: kill_tx,
                    info: info.clone(),
                    done: done_rx,
                    logout: logout_tx,
                    probe,
                },
            );
        }
        info!(
            target = %node.name,
            initiator = %outcome.initiator_name,
            tsih = outcome.tsih,
            %peer,
            digests = %digest_name(outcome.digests),
            "session in full feature phase"
        );
        let me = self.clone();
        let initiator = outcome.initiator_name.clone();
        let text = Box::new(move |data: &Bytes| {
            Some(me.send_targets(data, local, &initiator, Some(&target_name)))
        });
        let me2 = self.clone();
        let cold_target = node.name.clone();
        let setup = FfpSetup {
            nexus: nexus.clone(),
            cid: outcome.cid,
            params: FfpParams::from_login(&outcome, Role::Target),
            limits: self.config.limits,
            digests: outcome.digests,
            exp_cmd_sn: outcome.exp_cmd_sn,
            stat_sn,
            scsi: node.scsi.clone(),
            kill,
            shutdown,
            logout,
            info: info.clone(),
            text,
            cold_reset: Box::new(move || me2.kill_target_sessions(&cold_target)),
        };
        let result = run_ffp(stream, rbuf, setup).await;
        node.scsi.nexus_loss(&nexus);
        let commands = {
            let mut sessions = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // Only remove our own entry (a reinstating session may already
            // have replaced it).
            if sessions
                .get(&key)
                .is_some_and(|h| Arc::ptr_eq(&h.info, &info))
            {
                sessions.remove(&key);
            }
            // Under the table's lock, as `commands_total` reads both: the
            // count moves from the table to the ended sessions' total, never
            // in both at once.
            let commands = info.lock().unwrap_or_else(|e| e.into_inner()).commands;
            self.shared.commands.fetch_add(commands, Ordering::Relaxed);
            commands
        };
        let _ = done_tx.send(true);
        match &result {
            Ok(()) => info!(
                target = %node.name, initiator = %outcome.initiator_name, tsih = outcome.tsih,
                %peer, commands, "session ended"
            ),
            Err(e) => info!(
                target = %node.name, initiator = %outcome.initiator_name, tsih = outcome.tsih,
                %peer, commands, error = %e, "session ended"
            ),
        }
        result
    }

    fn node(&self, name: &str) -> Option<Arc<TargetNode>> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name.to_ascii_lowercase())
            .cloned()
    }

    /// Adds target node `node`, or replaces the one of the same name: new
    /// logins see the new ACL and CHAP at once; sessions whose initiator
    /// the new ACL no longer admits are asked to log out (Async Message).
    /// A session keeps the LUN map it logged in to (`node.scsi`): change
    /// a target's LUNs in that map, not by a new one.
    pub fn set_target(&self, node: TargetNode) {
        let key = node.name.to_ascii_lowercase();
        let node = Arc::new(node);
        let replaced = self
            .nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), node.clone());
        if replaced.is_none() {
            info!(target = %node.name, "target added");
            return;
        }
        let Some(allow) = &node.allow else {
            return;
        };
        let sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (k, h) in sessions.iter().filter(|(k, _)| k.0 == key) {
            if !allow.iter().any(|a| a.eq_ignore_ascii_case(&k.1)) {
                info!(target = %node.name, initiator = %k.1, "initiator no longer allowed: asking it to log out");
                let _ = h.logout.send(true);
            }
        }
    }

    /// Removes target node `name` (false if there was none): no new login
    /// finds it, and its sessions are asked to log out (Async Message) and
    /// closed 5 s later if they have not.
    pub fn remove_target(&self, name: &str) -> bool {
        let key = name.to_ascii_lowercase();
        let removed = self
            .nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .is_some();
        if removed {
            let sessions = self
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut n = 0;
            for (_, h) in sessions.iter().filter(|(k, _)| k.0 == key) {
                let _ = h.logout.send(true);
                n += 1;
            }
            info!(target = %name, sessions = n, "target removed; its sessions are asked to log out");
        }
        removed
    }

    fn kill_target_sessions(&self, target: &str) {
        let t = target.to_ascii_lowercase();
        let sessions = self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (k, h) in sessions.iter() {
            if k.0 == t {
                let _ = h.kill.send(true);
            }
        }
    }

    /// The SendTargets answer (RFC 7143 §12.3, Appendix C) for
    /// `initiator`, which reached the portal at `portal`: `All` in a
    /// discovery session, the session's own target for an empty value in
    /// a normal one (`own`), a target by name in either. A target whose
    /// ACL leaves the initiator out is not named to it, as its login
    /// would be refused.
    fn send_targets(
        &self,
        request: &Bytes,
        portal: SocketAddr,
        initiator: &str,
        own: Option<&str>,
    ) -> Bytes {
        let mut which: Option<String> = None;
        for kv in request.split(|b| *b == 0) {
            if let Some(v) = kv.strip_prefix(b"SendTargets=") {
                which = Some(String::from_utf8_lossy(v).into_owned());
            }
        }
        let Some(which) = which else {
            return Bytes::new();
        };
        let addresses = {
            let advertised = self.advertised.read().unwrap_or_else(|e| e.into_inner());
            sendtargets::target_addresses(
                &self.local_addrs(),
                portal,
                &advertised,
                self.config.portal_group_tag,
            )
        };
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        let mut visible: Vec<&Arc<TargetNode>> = nodes
            .values()
            .filter(|n| {
                n.allow
                    .as_ref()
                    .is_none_or(|l| l.iter().any(|a| a.eq_ignore_ascii_case(initiator)))
            })
            .collect();
        visible.sort_by(|a, b| a.name.cmp(&b.name));
        let entries: Vec<sendtargets::TargetEntry<'_>> = visible
            .iter()
            .map(|n| sendtargets::TargetEntry {
                name: &n.name,
                addresses: &addresses,
            })
            .collect();
        match sendtargets::build_response(
            sendtargets::SendTargetsRequest::parse(&which),
            &entries,
            own,
            SEND_TARGETS_MAX,
        ) {
            Ok(text) => Bytes::from(text),
            Err(e) => {
                warn!(error = %e, "SendTargets answer too long: not sent");
                Bytes::new()
            }
        }
    }
}

/// The longest SendTargets answer (sent in pieces of the initiator's
/// MaxRecvDataSegmentLength): thousands of targets.
const SEND_TARGETS_MAX: usize = 1 << 20;

/// A connection that has just completed a normal-session login.
struct LoggedIn {
    stream: TcpStream,
    /// The session's second descriptor ([`super::io::SessionHandle::probe`]).
    probe: socket2::Socket,
    rbuf: BytesMut,
    outcome: crate::login::LoginOutcome,
    stat_sn: u32,
    peer: SocketAddr,
    local: SocketAddr,
}

async fn wait_done(mut done: watch::Receiver<bool>) {
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while !*done.borrow() {
            if done.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
}

async fn write_login(
    stream: &mut TcpStream,
    pdu: &crate::login::LoginPdu<crate::wire::LoginResponse>,
) -> io::Result<()> {
    let bytes = encode_pdu(
        &Pdu::LoginResponse(pdu.header),
        &[],
        &pdu.data,
        Digests::default(),
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    stream.write_all(&bytes).await
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn digest_name(d: Digests) -> String {
    d.to_string()
}

fn rand_u32() -> u32 {
    use rand::RngExt;
    rand::rng().random()
}

/// The [`LoginPolicy`] the server gives each login.
struct Policy<'a> {
    server: &'a TargetServer,
    /// An old session being reinstated: wait for it before answering.
    pending_reinstatement: Option<watch::Receiver<bool>>,
}

impl LoginPolicy for Policy<'_> {
    fn lookup_target(
        &mut self,
        session_type: SessionType,
        target_name: Option<&str>,
    ) -> TargetLookup {
        let cfg = &self.server.config;
        match (session_type, target_name) {
            (SessionType::Discovery, _) => TargetLookup::Found(TargetConfig {
                alias: None,
                portal_group_tag: cfg.portal_group_tag,
                auth: cfg.discovery_auth,
                limits: cfg.negotiation.clone(),
            }),
            (_, Some(name)) => match self.server.node(name) {
                Some(node) => TargetLookup::Found(TargetConfig {
                    alias: node.alias.clone(),
                    portal_group_tag: cfg.portal_group_tag,
                    auth: match &node.chap {
                        None => AuthPolicy::None,
                        Some(c) => AuthPolicy::Chap {
                            mutual: c.mutual.is_some(),
                        },
                    },
                    limits: cfg.negotiation.clone(),
                }),
                None => TargetLookup::Refused(LoginStatus::NOT_FOUND),
            },
            (_, None) => TargetLookup::Refused(LoginStatus::MISSING_PARAMETER),
        }
    }

    fn authorize(&mut self, initiator_name: &str, target_name: Option<&str>) -> bool {
        let Some(name) = target_name else {
            return true;
        };
        match self.server.node(name) {
            Some(node) => match &node.allow {
                None => true,
                Some(list) => list.iter().any(|a| a.eq_ignore_ascii_case(initiator_name)),
            },
            None => false,
        }
    }

    fn chap_secrets(
        &mut self,
        target_name: Option<&str>,
        chap_name: &str,
    ) -> Option<TargetSecrets> {
        let node = self.server.node(target_name?)?;
        let c = node.chap.as_ref()?;
        if c.user != chap_name {
            return None;
        }
        Some(TargetSecrets {
            initiator_secret: c.secret.clone(),
            mutual: c.mutual.as_ref().map(|(n, s)| ChapCredentials {
                name: n.clone(),
                secret: s.clone(),
            }),
            require_mutual: c.mutual.is_some(),
        })
    }

    fn existing_session(
        &mut self,
        _initiator_name: &str,
        _isid: [u8; 6],
        _tsih: u16,
    ) -> Result<SessionParams, LoginStatus> {
        // MaxConnections=1: no connection can join a session.
        Err(LoginStatus::TOO_MANY_CONNECTIONS)
    }

    fn admit(&mut self, request: &AdmitRequest<'_>) -> Result<u16, LoginStatus> {
        if request.tsih != 0 {
            return Err(LoginStatus::TOO_MANY_CONNECTIONS);
        }
        if request.session_type == SessionType::Discovery {
            return Ok(self.server.shared.alloc_tsih());
        }
        let target = request.target_name.unwrap_or_default().to_ascii_lowercase();
        let key = (
            target,
            request.initiator_name.to_ascii_lowercase(),
            request.isid,
        );
        let old = {
            let sessions = self
                .server
                .shared
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            sessions.get(&key).map(|h| {
                let _ = h.kill.send(true);
                h.done.clone()
            })
        };
        if let Some(done) = old {
            info!(initiator = %request.initiator_name, "session reinstatement: ending the old session");
            self.pending_reinstatement = Some(done);
        }
        Ok(self.server.shared.alloc_tsih())
    }
}

/// What a discovery session dispatches to: it carries no SCSI, so every
/// command gets the target's refusal.
#[derive(Debug)]
struct DiscoverySessionTarget;

impl Dispatch for DiscoverySessionTarget {
    fn dispatch(
        &self,
        _task: unifab_scsi_core::Task,
    ) -> unifab_scsi_core::BoxFuture<'static, unifab_scsi_core::TaskResult> {
        Box::pin(async {
            unifab_scsi_core::TaskResult::check_condition(unifab_scsi_core::Sense::new(
                unifab_scsi_core::SenseKey::ILLEGAL_REQUEST,
                unifab_scsi_core::sense::asc::LOGICAL_UNIT_NOT_SUPPORTED,
            ))
        })
    }

    fn task_management(
        &self,
        _request: unifab_scsi_core::TmfRequest,
    ) -> unifab_scsi_core::BoxFuture<'static, unifab_scsi_core::TmfResponse> {
        Box::pin(async { unifab_scsi_core::TmfResponse::FunctionRejected })
    }

    fn nexus_loss(&self, _nexus: &ItNexus) {}
}
