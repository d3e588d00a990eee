//! Reload: the configuration file stays the one source of truth. A reload
//! reads it again, checks all of it, computes one plan by diffing the
//! running configuration with the new one, applies what can change live
//! and names what needs a restart, never applying half of one change.
//!
//! Live today: logical units on memory and file backends (added, or
//! removed when no FC target serves them; a file LU grown, which raises
//! CAPACITY DATA HAS CHANGED; write protection switched on, or off where
//! the file was opened writable, which raises MODE PARAMETERS CHANGED),
//! iSCSI targets (added, removed,
//! their LUN maps, ACLs, CHAP and aliases), and the fabric's zoning
//! (zones, zone sets, the default zone, the active zone set: one change,
//! an RSCN to each port whose view changed). Hosts see the protocol's
//! notices: a changed LUN map raises REPORTED LUNS DATA HAS CHANGED; a
//! removed target's sessions, and sessions whose initiator an ACL no
//! longer admits, are asked to log out (Async Message); a LUN removed
//! under a host answers LOGICAL UNIT NOT SUPPORTED. Sessions and LUs the
//! change does not touch see nothing.
//!
//! The iSCSI portal's addresses change live: new ones listen, removed
//! ones stop accepting and keep their sessions.
//!
//! Remote LUs come and go live too (`iscsi://` always, `fc://` where the
//! FC plane and its initiator run): a removed one's sessions to the
//! remote log out. FCoE FCF ports come and go live, and so do FCIP
//! tunnels, and an enhanced-mode
//! tunnel's circuits change live at the end of its list.
//!
//! Needs a restart: a changed LU definition (backend, block size, a
//! memory LU's size, …; a LU never shrinks), `fc://` LUs while `[fabric]` changes, `[iscsi]`
//! settings other than its targets and addresses, the rest
//! of `[fabric]`, `[fcoe]`, the rest of `[fcip]`, `[admin]`'s `data_dir` and
//! `required`, `[tuning]` (the runtime's threads are made once), and
//! `[cluster]`.
//! `[admin]`'s address, token and load intervals change live.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tracing::{info, warn};
use unifab_iscsi::target::server::TargetServer;
use unifab_scsi_core::backend::BlockBackend;
use unifab_scsi_core::target::ScsiTarget;

use crate::config::{Backend, Config, IscsiConfig, LuConfig, TargetConfig};
use crate::plane::iscsi::LunMaps;
use crate::plane::remote::GatewayLu;

/// The local LUs' backends by LU name (flushed at shutdown).
pub type Backends = Arc<RwLock<Vec<(String, Arc<dyn BlockBackend>)>>>;

/// The LUs `unifab show luns` lists, by name, in configuration order.
pub type LuList = Arc<RwLock<Vec<(String, GatewayLu)>>>;

/// The `iscsi://` LUs `unifab show remotes` lists: name, redacted
/// backend, the factory of its sessions.
pub type IscsiRemotes = Arc<RwLock<Vec<(String, String, crate::plane::remote::IscsiPaths)>>>;

/// The `fc://` LUs `unifab show remotes` lists: name and remote.
pub type FcRemotes = Arc<RwLock<Vec<(String, crate::config::fabric::FcUrl)>>>;

/// What a change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Something new.
    Add,
    /// Something gone.
    Remove,
    /// Something different.
    Change,
    /// Something the storage fenced off (a blocklisted RBD client),
    /// opened again as a new client.
    Reopen,
}

/// One line of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Added, removed or changed.
    pub action: Action,
    /// What: `lu "b"`, `iscsi.target "iqn…"`, `[fabric]`.
    pub what: String,
    /// Details (which keys of a target changed).
    pub detail: String,
    /// Applied live; otherwise it waits for a restart.
    pub live: bool,
}

/// What a reload does: every difference between the running
/// configuration and the file, each live or needing a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The changes, LUs first, then targets, then the other sections.
    pub changes: Vec<Change>,
}

impl Plan {
    /// The plan that takes `old` to `new`.
    pub fn diff(old: &Config, new: &Config) -> Plan {
        let mut changes = Vec::new();
        let mut push = |action, what: String, detail: String, live| {
            changes.push(Change {
                action,
                what,
                detail,
                live,
            });
        };
        let local = |lu: &LuConfig| {
            matches!(
                lu.parsed_backend(),
                Ok(Backend::Memory | Backend::File(_) | Backend::Rbd(_))
            )
        };
        // A remote LU comes and goes live where its initiator runs: any
        // iscsi:// LU, an fc:// one where the FC plane runs and stays.
        let remote_live = |lu: &LuConfig| match lu.parsed_backend() {
            Ok(Backend::Iscsi(_)) => true,
            Ok(Backend::Fc(_)) => {
                let initiator =
                    |c: &Config| c.fabric.as_ref().is_some_and(|f| f.initiator.is_some());
                initiator(old) && initiator(new) && old.fabric == new.fabric
            }
            _ => false,
        };
        let fc_uses = |name: &str| {
            old.fabric
                .as_ref()
                .is_some_and(|f| f.target.iter().any(|t| t.luns.iter().any(|l| l == name)))
        };
        // LUs that will be there, by name, and whether they are usable by
        // an iSCSI target after the live part is applied.
        let mut usable: HashMap<&str, bool> = HashMap::new();
        for lu in &new.lu {
            match old.lu.iter().find(|o| o.name == lu.name) {
                None if local(lu) => {
                    usable.insert(&lu.name, true);
                    push(
                        Action::Add,
                        format!("lu {:?}", lu.name),
                        String::new(),
                        true,
                    );
                }
                None => {
                    let live = remote_live(lu);
                    usable.insert(&lu.name, live);
                    let detail = if live {
                        "a remote LU"
                    } else {
                        "an fc:// LU while [fabric] changes"
                    };
                    push(
                        Action::Add,
                        format!("lu {:?}", lu.name),
                        detail.into(),
                        live,
                    );
                }
                Some(o) if o != lu => {
                    usable.insert(&lu.name, true);
                    let (live, detail) = match lu_change(o, lu) {
                        Ok(d) => (true, d),
                        Err(d) => (false, d),
                    };
                    push(Action::Change, format!("lu {:?}", lu.name), detail, live);
                }
                Some(_) => {
                    usable.insert(&lu.name, true);
                }
            }
        }
        for o in &old.lu {
            if !new.lu.iter().any(|lu| lu.name == o.name) {
                let (live, detail) = if fc_uses(&o.name) {
                    (false, "an FC target serves it".to_string())
                } else {
                    (true, String::new())
                };
                if !live {
                    usable.insert(&o.name, true);
                }
                push(Action::Remove, format!("lu {:?}", o.name), detail, live);
            }
        }
        let targets = |c: &Option<IscsiConfig>| -> Vec<TargetConfig> {
            c.as_ref().map_or_else(Vec::new, |i| i.target.clone())
        };
        let (old_t, new_t) = (targets(&old.iscsi), targets(&new.iscsi));
        let iscsi_live = old.iscsi.is_some() && new.iscsi.is_some();
        for t in &new_t {
            let what = format!("iscsi.target {:?}", t.iqn);
            let missing: Vec<&String> = t
                .luns
                .iter()
                .filter(|l| !usable.get(l.as_str()).copied().unwrap_or(false))
                .collect();
            let blocked = if missing.is_empty() {
                None
            } else {
                Some(format!("LUs not available live: {missing:?}"))
            };
            match old_t.iter().find(|o| o.iqn.eq_ignore_ascii_case(&t.iqn)) {
                None => push(
                    Action::Add,
                    what,
                    blocked.clone().unwrap_or_default(),
                    iscsi_live && blocked.is_none(),
                ),
                Some(o) if o != t => {
                    let detail = target_diff(o, t);
                    let detail = match &blocked {
                        Some(b) => format!("{detail}; {b}"),
                        None => detail,
                    };
                    push(Action::Change, what, detail, blocked.is_none());
                }
                Some(_) => {}
            }
        }
        for o in &old_t {
            if !new_t.iter().any(|t| t.iqn.eq_ignore_ascii_case(&o.iqn)) {
                push(
                    Action::Remove,
                    format!("iscsi.target {:?}", o.iqn),
                    String::new(),
                    iscsi_live,
                );
            }
        }
        let iscsi_rest = |c: &Option<IscsiConfig>| {
            c.as_ref().map(|i| IscsiConfig {
                target: Vec::new(),
                listen: Vec::new(),
                advertise: None,
                ..i.clone()
            })
        };
        // What SendTargets advertises changes live: the next discovery
        // gives the new addresses.
        if let (Some(a), Some(b)) = (&old.iscsi, &new.iscsi)
            && a.advertise != b.advertise
        {
            let show = |l: &Option<Vec<String>>| match l {
                Some(l) => format!("[{}]", l.join(", ")),
                None => "the portals' own".into(),
            };
            push(
                Action::Change,
                "[iscsi] advertise".into(),
                format!("{} -> {}", show(&a.advertise), show(&b.advertise)),
                true,
            );
        }
        // The portal's addresses change live (new ones listen, removed
        // ones stop accepting; their sessions go on).
        if let (Some(a), Some(b)) = (&old.iscsi, &new.iscsi)
            && a.listen != b.listen
        {
            let show = |l: &[std::net::SocketAddr]| {
                l.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            push(
                Action::Change,
                "[iscsi] listen".into(),
                format!("[{}] -> [{}]", show(&a.listen), show(&b.listen)),
                true,
            );
        }
        if iscsi_rest(&old.iscsi) != iscsi_rest(&new.iscsi) {
            let action = match (&old.iscsi, &new.iscsi) {
                (None, _) => Action::Add,
                (_, None) => Action::Remove,
                _ => Action::Change,
            };
            push(action, "[iscsi]".into(), "portal settings".into(), false);
        }
        // Zoning changes live (an RSCN to each port whose view changes);
        // the rest of [fabric] needs a restart.
        let (zoning_same, rest_same) = match (&old.fabric, &new.fabric) {
            (Some(a), Some(b)) => (
                a.zone == b.zone
                    && a.zoneset == b.zoneset
                    && a.default_zone == b.default_zone
                    && a.active_zoneset == b.active_zoneset,
                without_zoning(a) == without_zoning(b),
            ),
            (a, b) => (true, a == b),
        };
        if !zoning_same {
            push(
                Action::Change,
                "[fabric] zoning".into(),
                "zones, zone sets, default zone or active zone set".into(),
                true,
            );
        }
        let mut section = |name: &str, same: bool| {
            if !same {
                push(Action::Change, name.to_string(), String::new(), false);
            }
        };
        section("[fabric]", rest_same);
        section("[tuning]", old.tuning == new.tuning);
        section("[cluster]", old.cluster == new.cluster);
        // The admin endpoint's address, token and load intervals change
        // live; where state is kept, and `required`, at a restart.
        let a_rest = |a: &crate::config::AdminConfig| (a.data_dir.clone(), a.required);
        if a_rest(&old.admin) != a_rest(&new.admin) {
            push(Action::Change, "[admin]".into(), String::new(), false);
        } else if old.admin != new.admin {
            let (a, b) = (&old.admin, &new.admin);
            let keys: Vec<&str> = [
                ("listen", a.listen != b.listen),
                ("token", a.token != b.token),
                ("load_interval", a.load_interval != b.load_interval),
            ]
            .into_iter()
            .filter_map(|(k, changed)| changed.then_some(k))
            .collect();
            push(Action::Change, "[admin]".into(), keys.join(", "), true);
        }
        for (action, what, detail, live) in fcoe_changes(old, new) {
            push(action, what, detail, live);
        }
        for (action, what, detail, live) in fcip_changes(old.fcip.as_ref(), new.fcip.as_ref()) {
            push(action, what, detail, live);
        }

        Plan { changes }
    }

    /// Whether the change `action` of `what` is applied live.
    pub fn applies(&self, what: &str, action: Action) -> bool {
        self.changes
            .iter()
            .any(|c| c.live && c.action == action && c.what == what)
    }

    /// Whether some change waits for a restart.
    pub fn needs_restart(&self) -> bool {
        self.changes.iter().any(|c| !c.live)
    }

    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "nothing to change");
        }
        for c in &self.changes {
            let sign = match c.action {
                Action::Add => "+",
                Action::Remove => "-",
                Action::Change => "~",
                Action::Reopen => "*",
            };
            let when = if c.live { "live" } else { "needs restart" };
            write!(f, "{sign} {} [{when}]", c.what)?;
            if !c.detail.is_empty() {
                write!(f, ": {}", c.detail)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// `[fabric]` without its zoning.
fn without_zoning(
    f: &crate::config::fabric::FabricSection,
) -> crate::config::fabric::FabricSection {
    crate::config::fabric::FabricSection {
        zone: Vec::new(),
        zoneset: Vec::new(),
        default_zone: None,
        active_zoneset: None,
        ..f.clone()
    }
}

/// Which keys of a target differ.
fn target_diff(a: &TargetConfig, b: &TargetConfig) -> String {
    let mut keys = Vec::new();
    if a.luns != b.luns {
        keys.push(format!("luns {:?} -> {:?}", a.luns, b.luns));
    }
    if a.allow != b.allow {
        keys.push("allow".to_string());
    }
    if a.chap != b.chap {
        keys.push("chap".to_string());
    }
    if a.alias != b.alias {
        keys.push("alias".to_string());
    }
    if a.iqn != b.iqn {
        keys.push("iqn (case)".to_string());
    }
    keys.join(", ")
}

/// A configuration's FCoE ports (none without `[fcoe]`).
fn fcoe_ports(c: &Config) -> Vec<crate::config::fcoe::FcoePortSection> {
    c.fcoe.as_ref().map_or_else(Vec::new, |f| f.port.clone())
}

/// What changed in `[fcoe]`, by interface: FCF ports added or removed
/// change live where the fabric runs (as it did, and does); an ENode port,
/// or a changed FCF port, needs a restart.
fn fcoe_changes(old: &Config, new: &Config) -> Vec<(Action, String, String, bool)> {
    use crate::config::fcoe::FcoePortSection;
    let (a, b) = (fcoe_ports(old), fcoe_ports(new));
    if a == b {
        return Vec::new();
    }
    let enodes = |v: &[FcoePortSection]| -> Vec<FcoePortSection> {
        v.iter().filter(|p| p.mode == "enode").cloned().collect()
    };
    let fabric = old.fabric.is_some() && new.fabric.is_some();
    if enodes(&a) != enodes(&b) || !fabric {
        return vec![(Action::Change, "[fcoe]".into(), String::new(), false)];
    }
    let what = |p: &FcoePortSection| format!("[fcoe] port {:?}", p.interface);
    let mut out = Vec::new();
    for x in a.iter().filter(|p| p.mode == "fcf") {
        match b.iter().find(|y| y.interface == x.interface) {
            None => out.push((Action::Remove, what(x), String::new(), true)),
            Some(y) if y != x => out.push((Action::Change, what(x), String::new(), false)),
            Some(_) => {}
        }
    }
    for y in b.iter().filter(|p| p.mode == "fcf") {
        if !a.iter().any(|x| x.interface == y.interface) {
            out.push((Action::Add, what(y), String::new(), true));
        }
    }
    out
}

/// What changed in `[fcip]`, by tunnel name: tunnels added or removed
/// change live (the fabric joins across a new one; a removed one's
/// inter-switch link goes); an enhanced-mode tunnel's circuits added or
/// removed at the end of its list (or reweighed) change live; any other
/// change of a tunnel, or of `listen` or `tls`, needs a restart.
fn fcip_changes(
    old: Option<&crate::config::fcip::FcipSection>,
    new: Option<&crate::config::fcip::FcipSection>,
) -> Vec<(Action, String, String, bool)> {
    use crate::config::fcip::TunnelSection;
    if old == new {
        return Vec::new();
    }
    let restart = || vec![(Action::Change, "[fcip]".to_string(), String::new(), false)];
    let (Some(a), Some(b)) = (old, new) else {
        return restart();
    };
    if a.listen != b.listen || a.tls != b.tls {
        return restart();
    }
    let no_circuits = |t: &TunnelSection| TunnelSection {
        circuit: Vec::new(),
        ..t.clone()
    };
    let what = |t: &TunnelSection| format!("[fcip] tunnel {:?}", t.name);
    let mut out = Vec::new();
    for x in &a.tunnel {
        let Some(y) = b.tunnel.iter().find(|y| y.name == x.name) else {
            out.push((Action::Remove, what(x), String::new(), true));
            continue;
        };
        if no_circuits(x) != no_circuits(y) {
            out.push((
                Action::Change,
                what(x),
                "its settings changed (other than its circuits)".into(),
                false,
            ));
            continue;
        }
        if x.circuit == y.circuit {
            continue;
        }
        let kept = x.circuit.len().min(y.circuit.len());
        let moved = (0..kept).find(|i| {
            (x.circuit[*i].peer, x.circuit[*i].local) != (y.circuit[*i].peer, y.circuit[*i].local)
        });
        let (live, detail) = if x.mode.as_deref() != Some("enhanced") {
            (false, "RFC mode pins exchanges to circuits".to_string())
        } else if let Some(i) = moved {
            (
                false,
                format!(
                    "circuit {} changed its addresses (circuits are numbered by place: only the last ones come and go live)",
                    i + 1
                ),
            )
        } else {
            (
                true,
                format!("{} -> {} circuits", x.circuit.len(), y.circuit.len()),
            )
        };
        out.push((
            Action::Change,
            format!("{} circuits", what(x)),
            detail,
            live,
        ));
    }
    for y in &b.tunnel {
        if !a.tunnel.iter().any(|x| x.name == y.name) {
            out.push((Action::Add, what(y), String::new(), true));
        }
    }
    out
}

/// What changed in a LU, if it can change live: `Ok` with the details
/// (growing a file LU, write protection on, or off where the backend is
/// writable); `Err` with why it needs a restart.
fn lu_change(old: &LuConfig, new: &LuConfig) -> Result<String, String> {
    // The groups' states change live (an implicit ALUA transition); their
    // shape does not.
    let shape = |a: &Option<crate::config::AluaSection>| {
        a.as_ref().map(|a| crate::config::AluaSection {
            groups: a
                .groups
                .iter()
                .map(|g| crate::config::AluaGroupConfig {
                    state: String::new(),
                    ..g.clone()
                })
                .collect(),
            ..a.clone()
        })
    };
    let rest = |l: &LuConfig| LuConfig {
        size: None,
        read_only: false,
        alua: shape(&l.alua),
        ..l.clone()
    };
    if rest(old) != rest(new) {
        return Err("its definition changed (the running LU stays as it is)".into());
    }
    if new.is_tape() {
        return Err("a tape's capacity and write protection change at a restart".into());
    }
    let backend = new.parsed_backend();
    // A file or an RBD image grows in place.
    let file = matches!(backend, Ok(Backend::File(_) | Backend::Rbd(_)));
    if !file && !matches!(backend, Ok(Backend::Memory)) {
        return Err("a remote LU's settings change at a restart".into());
    }
    let mut details = Vec::new();
    if let (Some(a), Some(b)) = (&old.alua, &new.alua) {
        for (g, h) in a.groups.iter().zip(&b.groups) {
            if g.state != h.state {
                details.push(format!("alua group {}: {} -> {}", g.id, g.state, h.state));
            }
        }
    }
    match (old.size, new.size) {
        (a, b) if a == b => {}
        (Some(a), Some(b)) if b.0 > a.0 && file => {
            details.push(format!("grows from {} to {} bytes", a.0, b.0));
        }
        (Some(a), Some(b)) if b.0 < a.0 => {
            return Err(format!(
                "a LU never shrinks ({} to {} bytes; a restart refuses it too)",
                a.0, b.0
            ));
        }
        _ if !file => return Err("a memory LU's size is fixed".into()),
        _ => return Err("its size changed from or to the file's own length".into()),
    }
    if old.read_only != new.read_only {
        if !new.read_only && file {
            return Err("its file was opened read-only".into());
        }
        details.push(
            if new.read_only {
                "write protection on"
            } else {
                "write protection off"
            }
            .into(),
        );
    }
    Ok(details.join(", "))
}

/// What a reload makes before it changes anything (`Live::prepare`).
struct Prepared {
    lus: Vec<(LuConfig, Added)>,
    /// The admin endpoint's new address, bound.
    admin: Option<tokio::net::TcpListener>,
    /// New FCoE FCF ports, their links opened.
    fcfs: Vec<(
        crate::config::fcoe::FcoePortSection,
        unifab_fcoe::link::EthLink,
    )>,
    /// New portal addresses, bound: as configured, and the listener.
    listeners: Vec<(std::net::SocketAddr, tokio::net::TcpListener)>,
}

/// A LU a reload adds, built.
enum Added {
    Tape(Arc<unifab_scsi_core::tape::TapeLu>, Arc<dyn BlockBackend>),
    Local(
        Arc<unifab_scsi_core::emulated::EmulatedLu>,
        Arc<dyn BlockBackend>,
    ),
    Iscsi(
        Arc<unifab_scsi_core::RemoteLu>,
        crate::plane::remote::IscsiPaths,
    ),
    Fc(
        Arc<unifab_scsi_core::RemoteLu>,
        crate::config::fabric::FcUrl,
    ),
}

/// The running gateway's reloadable state.
pub struct Live {
    /// What is running: the configuration as started, with every live
    /// change applied since (a change that needs a restart is not in it).
    running: Config,
    /// The file reloads read; `None`: the embedded default.
    path: Option<PathBuf>,
    lus: HashMap<String, GatewayLu>,
    /// What `unifab show luns` lists, in configuration order.
    lu_list: LuList,
    /// The local LUs' backends (flushed at shutdown).
    backends: Backends,
    maps: LunMaps,
    server: Option<TargetServer>,
    /// `running`, as `show targets` reads it.
    published: Running,
    fc: Option<Arc<crate::plane::fc::FcPlane>>,
    fcip: Option<Arc<crate::plane::fcip::FcipPlane>>,
    fcoe: Option<Arc<crate::plane::fcoe::FcoePorts>>,
    remotes: IscsiRemotes,
    fc_remotes: FcRemotes,
    admin: Option<AdminParts>,
}

/// The admin endpoint as a reload changes it: its token, its load rates
/// (in the view) and its TCP task.
pub struct AdminParts {
    /// What it shows.
    pub view: Arc<crate::admin::view::View>,
    /// The token it asks for.
    pub token: crate::admin::AdminToken,
    /// Its TCP task, when it listens.
    pub tcp: Option<tokio::task::AbortHandle>,
    /// Serves the TCP endpoint on a listener (what `unifab run` spawns).
    pub serve: Box<dyn Fn(tokio::net::TcpListener) -> tokio::task::AbortHandle + Send + Sync>,
}

impl fmt::Debug for AdminParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminParts")
            .field("listening", &self.tcp.is_some())
            .finish_non_exhaustive()
    }
}

/// The running configuration, for views.
pub type Running = Arc<RwLock<Config>>;

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("path", &self.path)
            .field("lus", &self.lus.len())
            .finish_non_exhaustive()
    }
}

/// Parts of [`Live`] that `unifab run` builds.
pub struct LiveParts {
    /// The configuration it started with.
    pub running: Config,
    /// Its file.
    pub path: Option<PathBuf>,
    /// Every LU by name.
    pub lus: HashMap<String, GatewayLu>,
    /// The list the admin view shows.
    pub lu_list: LuList,
    /// The local LUs' backends.
    pub backends: Backends,
    /// The iSCSI targets' LUN maps.
    pub maps: LunMaps,
    /// The portal.
    pub server: Option<TargetServer>,
    /// Where the running configuration is published for views.
    pub published: Running,
    /// The FC plane (zoning).
    pub fc: Option<Arc<crate::plane::fc::FcPlane>>,
    /// The FCIP plane (circuits).
    pub fcip: Option<Arc<crate::plane::fcip::FcipPlane>>,
    /// The FCoE ports (FCFs).
    pub fcoe: Option<Arc<crate::plane::fcoe::FcoePorts>>,
    /// The `iscsi://` LUs `show remotes` lists.
    pub remotes: IscsiRemotes,
    /// The `fc://` LUs `show remotes` lists.
    pub fc_remotes: FcRemotes,
}

impl fmt::Debug for LiveParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveParts")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Live {
    /// The reloadable state of a gateway `unifab run` started.
    pub fn new(p: LiveParts) -> Live {
        Live {
            running: p.running,
            path: p.path,
            lus: p.lus,
            lu_list: p.lu_list,
            backends: p.backends,
            maps: p.maps,
            server: p.server,
            published: p.published,
            fc: p.fc,
            fcip: p.fcip,
            fcoe: p.fcoe,
            remotes: p.remotes,
            fc_remotes: p.fc_remotes,
            admin: None,
        }
    }

    /// The admin endpoint, once it runs.
    pub fn attach_admin(&mut self, admin: AdminParts) {
        self.admin = Some(admin);
    }

    /// Reads the file again and returns the plan, with the new
    /// configuration; an invalid file is an error and changes nothing.
    pub fn plan(&self) -> Result<(Plan, Config), String> {
        let Some(path) = &self.path else {
            return Err("running the embedded default: there is no file to re-read".into());
        };
        let new = Config::load(path).map_err(|e| e.to_string())?;
        let mut plan = Plan::diff(&self.running, &new);
        plan.changes.splice(0..0, self.reopens(&new));
        Ok((plan, new))
    }

    /// The LUs whose storage fenced this gateway off (an RBD image whose
    /// client the cluster blocklisted) and that `new` keeps: a reload
    /// opens each again as a new client — the operator's way back once the
    /// cause is dealt with, without a restart that would drop every host.
    /// Not in a `[cluster]`: there the other members fenced this gateway
    /// off on purpose, and it reopens its images itself when it joins
    /// again.
    fn reopens(&self, new: &Config) -> Vec<Change> {
        if self.running.cluster.is_some() {
            return Vec::new();
        }
        self.backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(name, b)| b.fenced() && new.lu.iter().any(|l| &l.name == name))
            .map(|(name, b)| Change {
                action: Action::Reopen,
                what: format!("lu {name:?}"),
                detail: format!(
                    "{}: fenced off by the storage, opens again as a new client",
                    b.describe()
                ),
                live: true,
            })
            .collect()
    }

    /// Reloads: reads the file, applies what can change live, and returns
    /// the plan (what was applied, what waits for a restart).
    pub async fn reload(&mut self) -> Result<Plan, String> {
        let (plan, new) = self.plan()?;
        self.apply(&plan, &new).await?;
        Ok(plan)
    }

    fn data_dir(&self) -> &Path {
        &self.running.admin.data_dir
    }

    /// Makes what the plan adds (LUs opened, remote LUs built, new portal
    /// addresses bound) without changing anything that runs.
    async fn prepare(&self, plan: &Plan, new: &Config) -> Result<Prepared, String> {
        let live = |what: &str, action: Action| plan.applies(what, action);
        // Fenced LUs first: reopening one changes nothing a host could
        // miss (it served nothing), and it is what most often fails (the
        // cluster still blocklists this host, another client took the
        // image's exclusive lock).
        let fenced: Vec<(String, Arc<dyn BlockBackend>)> = self
            .backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(name, _)| live(&format!("lu {name:?}"), Action::Reopen))
            .cloned()
            .collect();
        for (name, backend) in fenced {
            tokio::task::spawn_blocking(move || backend.reconnect())
                .await
                .map_err(|e| format!("lu {name:?}: reopening its storage: {e}"))?
                .map_err(|e| format!("lu {name:?}: reopening its fenced storage: {e}"))?;
            info!(lu = %name, "reload: the fenced LU's storage is open again");
        }
        let mut lus = Vec::new();
        for lu in &new.lu {
            if !live(&format!("lu {:?}", lu.name), Action::Add) {
                continue;
            }
            let err = |e: anyhow::Error| format!("lu {:?}: {e:#}", lu.name);
            let added = match lu.parsed_backend() {
                Ok(Backend::Iscsi(_)) => {
                    let (remote, sessions) = crate::plane::remote::build_remote(lu).map_err(err)?;
                    Added::Iscsi(remote, sessions)
                }
                Ok(Backend::Fc(url)) => {
                    let fc = self
                        .fc
                        .as_ref()
                        .ok_or_else(|| format!("lu {:?}: no FC plane runs", lu.name))?;
                    Added::Fc(fc.remote_lu(lu, url), url)
                }
                _ if lu.is_tape() => {
                    let (tape, backend) = crate::plane::lu::build_tape(lu).map_err(err)?;
                    Added::Tape(tape, backend)
                }
                _ => {
                    let (built, backend) = crate::plane::lu::build_lu(
                        lu,
                        self.data_dir(),
                        self.running.cluster.is_some(),
                    )
                    .map_err(err)?;
                    Added::Local(built, backend)
                }
            };
            lus.push((lu.clone(), added));
        }
        let mut listeners = Vec::new();
        if let (Some(running), Some(new_i)) = (&self.running.iscsi, &new.iscsi)
            && live("[iscsi] listen", Action::Change)
        {
            for a in new_i.listen.iter().filter(|a| !running.listen.contains(a)) {
                let l = tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| format!("[iscsi] listen: cannot listen on {a}: {e}"))?;
                listeners.push((*a, l));
            }
        }
        let mut admin = None;
        if live("[admin]", Action::Change) && self.running.admin.listen != new.admin.listen {
            let a = new.admin.listen;
            admin = Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| format!("[admin] listen: cannot listen on {a}: {e}"))?,
            );
        }
        let mut fcfs = Vec::new();
        if let (Some(fcoe), Some(f)) = (&self.fcoe, &new.fcoe) {
            for p in &f.port {
                if live(&format!("[fcoe] port {:?}", p.interface), Action::Add) {
                    let link = fcoe
                        .open_fcf(p)
                        .map_err(|e| format!("[fcoe] port {:?}: {e:#}", p.interface))?;
                    fcfs.push((p.clone(), link));
                }
            }
        }
        Ok(Prepared {
            lus,
            listeners,
            admin,
            fcfs,
        })
    }

    async fn apply(&mut self, plan: &Plan, new: &Config) -> Result<(), String> {
        let live = |what: &str, action: Action| plan.applies(what, action);
        // Everything that can fail is made first: a failure changes nothing.
        let prepared = self.prepare(plan, new).await?;
        // New LUs first: targets may map them.
        for (lu, added) in prepared.lus {
            let built = match added {
                Added::Local(built, backend) => {
                    self.backends
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((lu.name.clone(), backend));
                    GatewayLu::Emulated(built)
                }
                Added::Tape(tape, backend) => {
                    self.backends
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((lu.name.clone(), backend));
                    GatewayLu::Tape(tape)
                }
                Added::Iscsi(remote, sessions) => {
                    self.remotes
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((lu.name.clone(), remote.config().backend.clone(), sessions));
                    crate::plane::remote::spawn_probe(lu.name.clone(), remote.clone());
                    GatewayLu::Remote(remote)
                }
                Added::Fc(remote, url) => {
                    self.fc_remotes
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((lu.name.clone(), url));
                    GatewayLu::Remote(remote)
                }
            };
            info!(lu = %lu.name, "reload: logical unit added");
            self.lus.insert(lu.name.clone(), built);
            self.running.lu.push(lu);
        }
        // LUs that grow or change their write protection.
        for lu in &new.lu {
            if !live(&format!("lu {:?}", lu.name), Action::Change) {
                continue;
            }
            let Some(GatewayLu::Emulated(running)) = self.lus.get(&lu.name) else {
                return Err(format!("lu {:?}: not a local LU", lu.name));
            };
            if let Some(size) = lu.size {
                running
                    .grow(size.0)
                    .map_err(|e| format!("lu {:?}: {e}", lu.name))?;
            }
            running
                .set_read_only(lu.read_only)
                .map_err(|e| format!("lu {:?}: {e}", lu.name))?;
            // ALUA states: an implicit transition, heard by every host.
            if let Some(a) = &lu.alua {
                let core = a.to_core(&lu.name)?;
                for g in &core.groups {
                    if running.set_alua_state(g.id, g.state) {
                        info!(lu = %lu.name, group = g.id, state = g.state.name(), "reload: ALUA transition");
                    }
                }
            }
            if let Some(r) = self.running.lu.iter_mut().find(|r| r.name == lu.name) {
                *r = lu.clone();
            }
            info!(lu = %lu.name, size = ?lu.size.map(|s| s.0), read_only = lu.read_only, "reload: logical unit changed");
        }
        // Targets.
        let new_targets = new.iscsi.as_ref().map_or(&[][..], |i| &i.target[..]);
        if let (Some(server), Some(running_iscsi)) = (&self.server, self.running.iscsi.as_mut()) {
            let old_targets = running_iscsi.target.clone();
            for o in &old_targets {
                if live(&format!("iscsi.target {:?}", o.iqn), Action::Remove) {
                    server.remove_target(&o.iqn);
                    self.maps.remove(&o.iqn.to_ascii_lowercase());
                    running_iscsi
                        .target
                        .retain(|t| !t.iqn.eq_ignore_ascii_case(&o.iqn));
                }
            }
            for t in new_targets {
                let what = format!("iscsi.target {:?}", t.iqn);
                let add = live(&what, Action::Add);
                let change = live(&what, Action::Change);
                if !add && !change {
                    continue;
                }
                let key = t.iqn.to_ascii_lowercase();
                let scsi = self
                    .maps
                    .entry(key)
                    .or_insert_with(|| Arc::new(ScsiTarget::new()))
                    .clone();
                let lus = &self.lus;
                crate::plane::iscsi::map_luns(t, &scsi, |name| lus.get(name).map(GatewayLu::lu))
                    .map_err(|e| format!("{what}: {e:#}"))?;
                server.set_target(crate::plane::iscsi::target_node(t, scsi));
                info!(target = %t.iqn, "reload: target {}", if add { "added" } else { "changed" });
                match running_iscsi
                    .target
                    .iter_mut()
                    .find(|r| r.iqn.eq_ignore_ascii_case(&t.iqn))
                {
                    Some(r) => *r = t.clone(),
                    None => running_iscsi.target.push(t.clone()),
                }
            }
        }
        // The portal's addresses.
        if let (Some(server), Some(running_iscsi), Some(new_i)) =
            (&self.server, self.running.iscsi.as_mut(), &new.iscsi)
            && live("[iscsi] listen", Action::Change)
        {
            for (a, l) in prepared.listeners {
                let bound = server
                    .add_listener(a, l)
                    .map_err(|e| format!("[iscsi] listen: {e}"))?;
                info!(addr = %bound, "reload: iSCSI portal added");
                running_iscsi.listen.push(a);
            }
            for a in running_iscsi.listen.clone() {
                if !new_i.listen.contains(&a) {
                    server.remove_portal(a);
                    info!(addr = %a, "reload: iSCSI portal removed; its sessions go on");
                    running_iscsi.listen.retain(|x| *x != a);
                }
            }
        }
        // The addresses discovery advertises.
        if let (Some(server), Some(running_iscsi), Some(new_i)) =
            (&self.server, self.running.iscsi.as_mut(), &new.iscsi)
            && live("[iscsi] advertise", Action::Change)
        {
            server.set_advertised(new_i.advertise.clone().unwrap_or_default());
            running_iscsi.advertise = new_i.advertise.clone();
            info!(advertise = ?new_i.advertise, "reload: SendTargets addresses changed");
        }
        // Zoning.
        if let (Some(fc), Some(old_f), Some(new_f)) =
            (&self.fc, self.running.fabric.as_mut(), &new.fabric)
            && plan
                .changes
                .iter()
                .any(|c| c.live && c.what == "[fabric] zoning")
        {
            fc.reconfigure_zoning(old_f, new_f)
                .map_err(|e| format!("[fabric] zoning: {e:#}"))?;
            old_f.zone = new_f.zone.clone();
            old_f.zoneset = new_f.zoneset.clone();
            old_f.default_zone = new_f.default_zone.clone();
            old_f.active_zoneset = new_f.active_zoneset.clone();
            info!(active = ?new_f.active_zoneset, "reload: zoning changed");
        }
        // FCIP tunnels and circuits.
        if let (Some(fcip), Some(running), Some(new_f)) =
            (&self.fcip, self.running.fcip.as_mut(), &new.fcip)
        {
            let what = |name: &str| format!("[fcip] tunnel {name:?}");
            for r in running.tunnel.clone() {
                if live(&what(&r.name), Action::Remove) {
                    fcip.remove_tunnel(&r.name)
                        .await
                        .map_err(|e| format!("[fcip] tunnel {:?}: {e}", r.name))?;
                    info!(tunnel = %r.name, "reload: FCIP tunnel removed");
                    running.tunnel.retain(|t| t.name != r.name);
                }
            }
            for t in &new_f.tunnel {
                if live(&what(&t.name), Action::Add) {
                    fcip.add_tunnel(t)
                        .map_err(|e| format!("[fcip] tunnel {:?}: {e}", t.name))?;
                    info!(tunnel = %t.name, "reload: FCIP tunnel added");
                    running.tunnel.push(t.clone());
                }
                if live(&format!("{} circuits", what(&t.name)), Action::Change) {
                    fcip.set_circuits(t)
                        .await
                        .map_err(|e| format!("[fcip] tunnel {:?}: {e}", t.name))?;
                    info!(tunnel = %t.name, circuits = t.circuit.len(), "reload: FCIP circuits changed");
                    if let Some(r) = running.tunnel.iter_mut().find(|r| r.name == t.name) {
                        r.circuit = t.circuit.clone();
                    }
                }
            }
        }
        // FCoE FCF ports.
        if let Some(fcoe) = &self.fcoe {
            for p in fcoe_ports(&self.running) {
                if live(&format!("[fcoe] port {:?}", p.interface), Action::Remove) {
                    fcoe.remove_fcf(&p.interface).await;
                    info!(interface = %p.interface, "reload: FCoE FCF port removed");
                    if let Some(f) = self.running.fcoe.as_mut() {
                        f.port.retain(|x| x.interface != p.interface);
                    }
                }
            }
            for (p, link) in prepared.fcfs {
                fcoe.add_fcf(&p, link)
                    .map_err(|e| format!("[fcoe] port {:?}: {e:#}", p.interface))?;
                info!(interface = %p.interface, "reload: FCoE FCF port added");
                self.running
                    .fcoe
                    .get_or_insert_with(|| crate::config::fcoe::FcoeSection { port: Vec::new() })
                    .port
                    .push(p);
            }
        }
        // The admin endpoint.
        if live("[admin]", Action::Change) {
            if let Some(a) = &mut self.admin {
                *a.token.write().unwrap_or_else(|e| e.into_inner()) =
                    new.admin.token.as_deref().map(Arc::from);
                if self.running.admin.load_interval != new.admin.load_interval {
                    *a.view.load.rates.lock().unwrap_or_else(|e| e.into_inner()) =
                        crate::admin::rates::Rates::new(
                            new.admin
                                .load_interval
                                .iter()
                                .map(|s| std::time::Duration::from_secs(*s))
                                .collect(),
                        );
                }
                if let Some(l) = prepared.admin {
                    if let Some(old) = a.tcp.take() {
                        old.abort();
                    }
                    a.tcp = Some((a.serve)(l));
                    info!(addr = %new.admin.listen, "reload: admin endpoint moved");
                }
            }
            self.running.admin.listen = new.admin.listen;
            self.running.admin.token = new.admin.token.clone();
            self.running.admin.load_interval = new.admin.load_interval.clone();
        }
        // LUs no target maps any more.
        for o in self.running.lu.clone() {
            if live(&format!("lu {:?}", o.name), Action::Remove) {
                // Out of every LUN map by now: a remote LU's sessions log out.
                if let Some(GatewayLu::Remote(r)) = self.lus.remove(&o.name) {
                    r.close();
                    self.remotes
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|(n, _, _)| *n != o.name);
                    self.fc_remotes
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|(n, _)| *n != o.name);
                }
                self.backends
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(n, _)| *n != o.name);
                self.running.lu.retain(|l| l.name != o.name);
                info!(lu = %o.name, "reload: logical unit removed");
            }
        }
        // What `show luns` lists, in the running order.
        let list: Vec<(String, GatewayLu)> = self
            .running
            .lu
            .iter()
            .filter_map(|l| self.lus.get(&l.name).map(|g| (l.name.clone(), g.clone())))
            .collect();
        *self.lu_list.write().unwrap_or_else(|e| e.into_inner()) = list;
        *self.published.write().unwrap_or_else(|e| e.into_inner()) = self.running.clone();
        Ok(())
    }
}

/// Logs a plan, one line per change.
pub fn log_plan(plan: &Plan, applied: bool) {
    if plan.is_empty() {
        info!("reload: the configuration file is unchanged");
        return;
    }
    for c in &plan.changes {
        let line = format!("{} {}", c.what, c.detail);
        match (c.live, applied) {
            (true, true) => info!(change = ?c.action, "reload: applied: {line}"),
            (true, false) => info!(change = ?c.action, "reload (dry run): would apply: {line}"),
            (false, _) => warn!(change = ?c.action, "reload: needs a restart, not applied: {line}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text, "test.toml").unwrap()
    }

    const BASE: &str = r#"
[[lu]]
name = "a"
backend = "memory"
size = "8MiB"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:t"
luns = ["a"]
"#;

    fn live_of(p: &Plan) -> Vec<(String, bool)> {
        p.changes.iter().map(|c| (c.what.clone(), c.live)).collect()
    }

    #[test]
    fn a_file_lu_grows_and_switches_write_protection_live_and_never_shrinks() {
        let base = BASE.replace("backend = \"memory\"", "backend = \"file:/tmp/a.img\"");
        let plan = |from: &str, to: &str| {
            let p = Plan::diff(&cfg(from), &cfg(to));
            assert_eq!(p.changes.len(), 1, "{p}");
            (p.changes[0].live, p.changes[0].detail.clone())
        };
        let grown = base.replace("8MiB", "16MiB");
        assert_eq!(
            plan(&base, &grown),
            (true, "grows from 8388608 to 16777216 bytes".into())
        );
        let (live, why) = plan(&grown, &base);
        assert!(!live && why.contains("never shrinks"), "{why}");
        let ro = grown.replace("size = \"16MiB\"", "size = \"16MiB\"\nread_only = true");
        assert_eq!(
            plan(&base, &ro),
            (
                true,
                "grows from 8388608 to 16777216 bytes, write protection on".into()
            )
        );
        let (live, why) = plan(&ro, &grown);
        assert!(!live && why.contains("opened read-only"), "{why}");
        // A memory LU may lift it; any other key needs a restart.
        let mem_ro = BASE.replace("size = \"8MiB\"", "size = \"8MiB\"\nread_only = true");
        assert_eq!(plan(&mem_ro, BASE), (true, "write protection off".into()));
        let bs = grown.replace("size = \"16MiB\"", "size = \"16MiB\"\nblock_size = 4096");
        assert!(!plan(&base, &bs).0);
    }

    #[test]
    fn fcip_circuits_at_the_end_of_an_enhanced_tunnel_change_live() {
        let fcip = |mode: &str, circuits: &[&str]| {
            let mut s = format!(
                "{BASE}\n[fabric]\ndomain = 1\nswitch_wwn = \"10:00:00:00:c9:00:00:01\"\n\n[fcip]\n\n[[fcip.tunnel]]\nname = \"t0\"\npeer = \"10:00:00:00:c9:00:00:02\"\nmode = \"{mode}\"\n"
            );
            for c in circuits {
                s.push_str(&format!("\n[[fcip.tunnel.circuit]]\npeer = \"{c}\"\n"));
            }
            s
        };
        let (one, two) = ("192.0.2.1:3225", "192.0.2.2:3225");
        let plan = |a: &str, b: &str| {
            let p = Plan::diff(&cfg(a), &cfg(b));
            p.changes
                .iter()
                .map(|c| (c.what.clone(), c.detail.clone(), c.live))
                .collect::<Vec<_>>()
        };
        let line = |detail: &str, live| {
            vec![(
                "[fcip] tunnel \"t0\" circuits".to_string(),
                detail.to_string(),
                live,
            )]
        };
        assert_eq!(
            plan(&fcip("enhanced", &[one]), &fcip("enhanced", &[one, two])),
            line("1 -> 2 circuits", true)
        );
        assert_eq!(
            plan(&fcip("enhanced", &[one, two]), &fcip("enhanced", &[one])),
            line("2 -> 1 circuits", true)
        );
        let (_, why, live) =
            plan(&fcip("enhanced", &[one, two]), &fcip("enhanced", &[two])).remove(0);
        assert!(
            !live && why.contains("circuit 1 changed its addresses"),
            "{why}"
        );
        let (_, why, live) = plan(&fcip("rfc", &[one]), &fcip("rfc", &[one, two])).remove(0);
        assert!(!live && why.contains("RFC mode"), "{why}");
        // Any other key of a tunnel: that tunnel, at a restart.
        assert_eq!(
            plan(&fcip("enhanced", &[one]), &fcip("rfc", &[one, two])),
            vec![(
                "[fcip] tunnel \"t0\"".to_string(),
                "its settings changed (other than its circuits)".to_string(),
                false
            )]
        );
        // A tunnel added, and one removed: live.
        let more = fcip("enhanced", &[one])
            + "\n[[fcip.tunnel]]\nname = \"t1\"\npeer = \"10:00:00:00:c9:00:00:03\"\n\n[[fcip.tunnel.circuit]]\npeer = \"192.0.2.9:3225\"\n";
        let p = Plan::diff(&cfg(&fcip("enhanced", &[one])), &cfg(&more));
        assert_eq!(
            p.changes
                .iter()
                .map(|c| (c.action, c.what.clone(), c.live))
                .collect::<Vec<_>>(),
            vec![(Action::Add, "[fcip] tunnel \"t1\"".to_string(), true)],
            "{p}"
        );
        let p = Plan::diff(&cfg(&more), &cfg(&fcip("enhanced", &[one])));
        assert_eq!(p.changes[0].action, Action::Remove, "{p}");
        assert!(p.changes[0].live && p.changes.len() == 1, "{p}");
    }

    #[test]
    fn fcf_ports_come_and_go_live_and_an_enode_port_does_not() {
        let fabric = "[fabric]\ndomain = 1\n\n";
        let port = |iface: &str, mode: &str| {
            format!(
                "[[fcoe.port]]\ninterface = \"{iface}\"\nmode = \"{mode}\"\nio = \"af_packet\"\n\n"
            )
        };
        let with = |ports: &str| BASE.replace("[iscsi]", &format!("{fabric}{ports}[iscsi]"));
        let plan = |a: &str, b: &str| {
            Plan::diff(&cfg(a), &cfg(b))
                .changes
                .into_iter()
                .map(|c| (c.action, c.what, c.live))
                .collect::<Vec<_>>()
        };
        let one = with(&port("veth0", "fcf"));
        let two = with(&(port("veth0", "fcf") + &port("veth1", "fcf")));
        assert_eq!(
            plan(&one, &two),
            vec![(Action::Add, "[fcoe] port \"veth1\"".to_string(), true)]
        );
        assert_eq!(
            plan(&two, &with("")),
            vec![
                (Action::Remove, "[fcoe] port \"veth0\"".to_string(), true),
                (Action::Remove, "[fcoe] port \"veth1\"".to_string(), true)
            ]
        );
        let changed = with(&port("veth0", "fcf").replace("af_packet", "af_xdp"));
        assert_eq!(
            plan(&one, &changed),
            vec![(Action::Change, "[fcoe] port \"veth0\"".to_string(), false)]
        );
        let enode = with(&(port("veth0", "fcf") + &port("veth9", "enode")));
        assert_eq!(
            plan(&one, &enode),
            vec![(Action::Change, "[fcoe]".to_string(), false)]
        );
        // A fabric that starts with the file: at a restart.
        assert_eq!(
            plan(BASE, &one)
                .into_iter()
                .filter(|c| c.1 == "[fcoe]")
                .collect::<Vec<_>>(),
            vec![(Action::Change, "[fcoe]".to_string(), false)]
        );
    }

    #[test]
    fn the_same_file_changes_nothing() {
        let p = Plan::diff(&cfg(BASE), &cfg(BASE));
        assert!(p.is_empty());
        assert_eq!(p.to_string(), "nothing to change\n");
    }

    #[test]
    fn a_changed_lu_needs_a_restart_and_a_target_mapping_it_still_changes_live() {
        let new = BASE
            .replace("size = \"8MiB\"", "size = \"16MiB\"")
            .replace("luns = [\"a\"]", "luns = [\"a\"]\nalias = \"renamed\"");
        let p = Plan::diff(&cfg(BASE), &cfg(&new));
        assert_eq!(
            live_of(&p),
            vec![
                ("lu \"a\"".to_string(), false),
                ("iscsi.target \"iqn.2026-11.io.unifab:t\"".to_string(), true),
            ]
        );
        assert!(p.needs_restart());
    }

    #[test]
    fn a_remote_lu_comes_and_goes_live_where_its_initiator_runs() {
        let with = |backend: &str, fabric: &str| {
            BASE.replace(
                "[iscsi]",
                &format!("[[lu]]\nname = \"r\"\nbackend = \"{backend}\"\n\n{fabric}[iscsi]"),
            ) + "\n[[iscsi.target]]\niqn = \"iqn.2026-11.io.unifab:r\"\nluns = [\"r\"]\n"
        };
        let both_live = |p: &Plan, live: bool| {
            assert_eq!(
                live_of(p),
                vec![
                    ("lu \"r\"".to_string(), live),
                    ("iscsi.target \"iqn.2026-11.io.unifab:r\"".to_string(), live),
                ],
                "{p}"
            );
        };
        // iscsi://: added with the target that maps it, and removed.
        let iscsi = with("iscsi://127.0.0.1:3261/iqn.2026-11.io.example:x/0", "");
        both_live(&Plan::diff(&cfg(BASE), &cfg(&iscsi)), true);
        let p = Plan::diff(&cfg(&iscsi), &cfg(BASE));
        assert!(
            p.changes
                .iter()
                .all(|c| c.live && c.action == Action::Remove),
            "{p}"
        );
        // fc://: live only where the FC plane and its initiator run and stay.
        let fabric =
            "[fabric]\ndomain = 1\n\n[fabric.initiator]\nwwpn = \"21:00:00:00:c9:00:00:0b\"\n\n";
        let fc = with("fc://21:00:00:00:c9:00:00:0a/0", fabric);
        let running = BASE.replace("[iscsi]", &format!("{fabric}[iscsi]"));
        both_live(&Plan::diff(&cfg(&running), &cfg(&fc)), true);
        let p = Plan::diff(&cfg(BASE), &cfg(&fc));
        assert!(
            p.to_string().contains("LUs not available live: [\"r\"]"),
            "{p}"
        );
        assert!(
            !p.changes.iter().any(|c| c.what == "lu \"r\"" && c.live),
            "{p}"
        );
    }

    #[test]
    fn zoning_changes_live_and_the_rest_of_the_fabric_does_not() {
        let fabric = |members: &str, domain: u8| {
            format!(
                "{BASE}\n[fabric]\ndomain = {domain}\nactive_zoneset = \"cfg\"\n\n[[fabric.zone]]\nname = \"z\"\nmembers = [{members}]\n\n[[fabric.zoneset]]\nname = \"cfg\"\nzones = [\"z\"]\n"
            )
        };
        let old = cfg(&fabric("\"pwwn:21:00:00:00:c9:00:00:0a\"", 1));
        let zoned = cfg(&fabric("\"pwwn:21:00:00:00:c9:00:00:0b\"", 1));
        assert_eq!(
            live_of(&Plan::diff(&old, &zoned)),
            vec![("[fabric] zoning".to_string(), true)]
        );
        let both = cfg(&fabric("\"pwwn:21:00:00:00:c9:00:00:0b\"", 2));
        assert_eq!(
            live_of(&Plan::diff(&old, &both)),
            vec![
                ("[fabric] zoning".to_string(), true),
                ("[fabric]".to_string(), false)
            ]
        );
    }

    #[test]
    fn other_sections_need_a_restart_and_the_portal_addresses_do_not() {
        let new = BASE.replace(
            "listen = [\"127.0.0.1:0\"]",
            "listen = [\"127.0.0.1:3999\"]\nlogin_timeout = 20",
        ) + "\n[tuning]\nworker_threads = 2\n";
        let p = Plan::diff(&cfg(BASE), &cfg(&new));
        assert_eq!(
            live_of(&p),
            vec![
                ("[iscsi] listen".to_string(), true),
                ("[iscsi]".to_string(), false),
                ("[tuning]".to_string(), false)
            ]
        );
    }
}
