//! The gateway's configuration file (TOML) and the embedded default.
//!
//! Unknown keys are refused: the error names the file, the line and the
//! key, so a typo never silently falls back to a default.

pub mod fabric;
pub mod fcip;
pub mod fcoe;
pub mod remote;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The IQN the embedded default serves.
pub const DEFAULT_IQN: &str = "iqn.2026-11.io.unifab:default";
/// Where the embedded default keeps its data.
pub const DEFAULT_DATA_DIR: &str = "./unifab-data";
/// The embedded default portal.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3260";
/// The embedded default admin endpoint.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9260";

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Logical units.
    #[serde(default)]
    pub lu: Vec<LuConfig>,
    /// The iSCSI front end.
    #[serde(default)]
    pub iscsi: Option<IscsiConfig>,
    /// Operator endpoint.
    #[serde(default)]
    pub admin: AdminConfig,
    /// The FC fabric and the gateway's FC ports.
    #[serde(default)]
    pub fabric: Option<fabric::FabricSection>,
    /// FCoE ports.
    #[serde(default)]
    pub fcoe: Option<fcoe::FcoeSection>,
    /// FCIP tunnels to other sites' fabrics.
    #[serde(default)]
    pub fcip: Option<fcip::FcipSection>,
    /// Host tuning held while the gateway runs.
    #[serde(default)]
    pub tuning: crate::tuning::TuningSection,
    /// `[cluster]`: gateways fronting the same LUs, kept in etcd
    /// (docs/alua.md#a-cluster-of-gateways).
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
}

/// One logical unit.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LuConfig {
    /// Name, referenced by targets' `luns`.
    pub name: String,
    /// The device type: `"disk"` (the default, SBC-3 direct access) or
    /// `"tape"` (SSC-3 sequential access: a tape drive with a cartridge
    /// kept in the backend as a unifab tape image, `size` its capacity;
    /// see docs/tape.md).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// For a tape: the early-warning zone before the end of the medium
    /// (`"1MiB"`, the default), set when a blank image is formatted.
    #[serde(default)]
    pub early_warning: Option<Size>,
    /// `"memory"`, `"file:/path"`, `"rbd:POOL/IMAGE"` (a Ceph RBD image),
    /// `"iscsi://…"` or `"fc://…"`.
    pub backend: String,
    /// Size such as `"1GiB"`, `"512MiB"`, `"4096"`; a missing file is
    /// created sparse with this size. Required for memory backends.
    #[serde(default)]
    pub size: Option<Size>,
    /// Logical block length: 512 (default) or 4096.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Physical block length reported to initiators (READ CAPACITY(16)
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT), e.g. 4096 for a
    /// 512-byte LU on 4 KiB-page storage: a power-of-two multiple of
    /// `block_size`. Default: the logical block length.
    #[serde(default)]
    pub physical_block_size: Option<u32>,
    /// Refuse writes (DATA PROTECT / WRITE PROTECTED). For a remote
    /// (`iscsi://`, `fc://`) LU, a read-only view: only commands that read
    /// or report reach the remote.
    #[serde(default)]
    pub read_only: bool,
    /// Removable medium (INQUIRY RMB=1): START STOP UNIT with LOEJ ejects
    /// and loads it, PREVENT ALLOW MEDIUM REMOVAL guards it. Default false.
    #[serde(default)]
    pub removable: bool,
    /// Most bytes a second a SANITIZE OVERWRITE writes, so a sanitize does
    /// not starve other LUs on the same storage (`"128MiB"`, the default;
    /// `0`: no limit).
    #[serde(default)]
    pub sanitize_rate: Option<Size>,
    /// Write cache enabled at power-on (WCE of the caching mode page).
    /// With it off every write reaches stable storage before its status.
    #[serde(default)]
    pub write_cache: Option<bool>,
    /// Thin provisioning soft threshold (`"256MiB"`): when the space the
    /// LU's backend can still allocate falls below it, every host hears
    /// THIN PROVISIONING SOFT THRESHOLD REACHED (a unit attention) and the
    /// gateway logs it, before writes fail for want of space. Hosts may
    /// change it (MODE SELECT, page 1Ch/02h). Emulated LUs on a thin
    /// backend only.
    #[serde(default)]
    pub soft_threshold: Option<Size>,
    /// Unit serial number (VPD 0x80); derived from the name if absent.
    #[serde(default)]
    pub serial: Option<String>,
    /// For an `rbd:` backend: the cluster's ceph.conf (default:
    /// `$CEPH_CONF`, else `/etc/ceph/ceph.conf`); the keyring is the one
    /// it names.
    #[serde(default)]
    pub ceph_conf: Option<PathBuf>,
    /// For an `rbd:` backend: the Ceph client id (default `admin`, i.e.
    /// `client.admin`).
    #[serde(default)]
    pub ceph_id: Option<String>,
    /// For an `rbd:` backend: seconds an operation may wait for the
    /// cluster before the host gets a retryable error (ABORTED COMMAND,
    /// LOGICAL UNIT COMMUNICATION TIME-OUT); 0 waits for ever. Default 30.
    #[serde(default)]
    pub ceph_op_timeout: Option<u64>,
    /// For an `rbd:` backend: hold the image's exclusive lock while the LU
    /// is open, so a second gateway outside this one's cluster refuses to
    /// open it (default true; ignored for a read-only LU).
    #[serde(default)]
    pub ceph_exclusive_lock: Option<bool>,
    /// For an `rbd:` backend: seconds opening waits for another client's
    /// exclusive lock before it fails (a dead gateway's is broken once its
    /// watch expires); default 45.
    #[serde(default)]
    pub ceph_lock_timeout: Option<u64>,
    /// For an `iscsi://` backend: how the gateway reaches the remote LU
    /// (`[lu.iscsi]`).
    #[serde(default)]
    pub iscsi: Option<RemoteIscsiConfig>,
    /// For an `fc://` backend: how the LU presents itself (`[lu.fc]`).
    #[serde(default)]
    pub fc: Option<RemoteFcConfig>,
    /// ALUA (`[lu.alua]`, emulated disks): the target port groups hosts
    /// see for this LU and their states. Absent: the port a command
    /// arrives through, alone and Active/Optimized.
    #[serde(default)]
    pub alua: Option<AluaSection>,
}

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This gateway's name, unique in the cluster.
    pub name: String,
    /// etcd client URLs (`http://HOST:PORT`).
    pub etcd: Vec<String>,
    /// The membership lease's TTL (`"5s"`, the default; 2 s to 60 s).
    #[serde(default)]
    pub lease_ttl: Option<String>,
    /// The key prefix the cluster keeps its state under (default
    /// `/unifab`).
    #[serde(default)]
    pub prefix: Option<String>,
}

impl ClusterConfig {
    /// The lease TTL.
    pub fn ttl(&self) -> Result<std::time::Duration, String> {
        let Some(t) = &self.lease_ttl else {
            return Ok(std::time::Duration::from_secs(5));
        };
        let secs: u64 = t
            .trim()
            .strip_suffix('s')
            .unwrap_or(t.trim())
            .trim()
            .parse()
            .map_err(|_| format!("cluster.lease_ttl {t:?}: whole seconds, as \"5s\""))?;
        if !(2..=60).contains(&secs) {
            return Err(format!("cluster.lease_ttl {t:?}: 2s to 60s"));
        }
        Ok(std::time::Duration::from_secs(secs))
    }

    /// The key prefix, without a trailing slash.
    pub fn prefix(&self) -> String {
        self.prefix
            .as_deref()
            .unwrap_or("/unifab")
            .trim_end_matches('/')
            .to_string()
    }

    fn validate(&self) -> Result<(), String> {
        self.ttl()?;
        let ok_name = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !ok_name {
            return Err(format!(
                "cluster.name {:?}: 1 to 64 of A-Z a-z 0-9 - _ .",
                self.name
            ));
        }
        if self.etcd.is_empty() {
            return Err("cluster.etcd: at least one etcd URL".into());
        }
        for u in &self.etcd {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(format!("cluster.etcd {u:?}: an http:// or https:// URL"));
            }
        }
        Ok(())
    }
}

/// `[lu.alua]`: target port groups (SPC-4 §5.16) of one LU.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AluaSection {
    /// Hosts may change the states with SET TARGET PORT GROUPS (TPGS
    /// 11b; default true). False: only the gateway changes them (01b).
    #[serde(default)]
    pub explicit: Option<bool>,
    /// IMPLICIT TRANSITION TIME reported to hosts, seconds (default 10).
    #[serde(default)]
    pub transition_time: Option<u8>,
    /// The groups (`[[lu.alua.group]]`).
    #[serde(default, rename = "group")]
    pub groups: Vec<AluaGroupConfig>,
}

/// `[[lu.alua.group]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AluaGroupConfig {
    /// TARGET PORT GROUP, 1–65535.
    pub id: u16,
    /// `"active/optimized"`, `"active/non-optimized"`, `"standby"` or
    /// `"unavailable"`.
    pub state: String,
    /// PREF: a preferred group (default false).
    #[serde(default)]
    pub preferred: bool,
    /// Relative target port identifiers in the group: this gateway's
    /// (`iscsi.relative_port`) and those of the other gateways in front of
    /// the same LU.
    pub ports: Vec<u16>,
}

impl AluaSection {
    /// The scsi-core configuration, checked.
    pub fn to_core(&self, lu: &str) -> Result<unifab_scsi_core::alua::AluaConfig, String> {
        use unifab_scsi_core::alua::{AccessState, AluaConfig, PortGroup};
        let mut groups = Vec::new();
        for g in &self.groups {
            let state = AccessState::parse(&g.state)
                .filter(|s| !matches!(s, AccessState::Offline | AccessState::Transitioning))
                .ok_or_else(|| {
                    format!(
                        "lu {lu:?}: alua group {}: state {:?} is not one of \"active/optimized\", \"active/non-optimized\", \"standby\", \"unavailable\"",
                        g.id, g.state
                    )
                })?;
            groups.push(PortGroup {
                id: g.id,
                state,
                preferred: g.preferred,
                ports: g.ports.clone(),
            });
        }
        let cfg = AluaConfig {
            groups,
            explicit: self.explicit.unwrap_or(true),
            transition_secs: self.transition_time.unwrap_or(10),
        };
        cfg.validate()
            .map_err(|e| format!("lu {lu:?}: alua: {e}"))?;
        Ok(cfg)
    }
}

/// Settings of a remote LU reached through the gateway's FC initiator
/// N_Port (`[lu.fc]`). How the port itself logs in and how long commands
/// may take are the fabric's (`[fabric.initiator]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteFcConfig {
    /// `"derived"` (default): VPD 0x80/0x83 logical-unit identity derived
    /// from the backend URL (or `identity_seed`). `"passthrough"`: the
    /// remote's own identity, unchanged.
    #[serde(default)]
    pub identity: Option<String>,
    /// Seed of the derived identity (default: the backend URL,
    /// `fc://WWPN/LUN`).
    #[serde(default)]
    pub identity_seed: Option<String>,
}

/// Settings of a remote LU reached through unifab's iSCSI initiator. The
/// initiator's own CHAP credentials go in the backend URL
/// (`iscsi://user%secret@host/iqn/lun`).
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteIscsiConfig {
    /// Mutual CHAP: the name the remote target answers with.
    #[serde(default)]
    pub mutual_user: Option<String>,
    /// Mutual CHAP: the remote target's secret.
    #[serde(default)]
    pub mutual_secret: Option<String>,
    /// InitiatorName of the gateway's own sessions (capacity probes, and
    /// every session with `nexus = "shared"` or `fixed_name = true`).
    /// Default `iqn.2026-11.io.unifab:gateway`.
    #[serde(default)]
    pub initiator_name: Option<String>,
    /// `"per-initiator"` (default): each host's initiator port gets its own
    /// session at the remote, under the host's name, so reservations and
    /// unit attentions stay per host. `"shared"`: one session for all.
    #[serde(default)]
    pub nexus: Option<String>,
    /// Per-initiator sessions log in under `initiator_name` instead of the
    /// host's name (for remote ACLs that know only the gateway).
    #[serde(default)]
    pub fixed_name: bool,
    /// `"derived"` (default): VPD 0x80/0x83 logical-unit identity derived
    /// from the remote target name and LUN (or `identity_seed`).
    /// `"passthrough"`: the remote's own identity, unchanged.
    #[serde(default)]
    pub identity: Option<String>,
    /// Seed of the derived identity (default `TARGET-IQN/LUN`).
    #[serde(default)]
    pub identity_seed: Option<String>,
    /// Seconds within which every command ends (default 20).
    #[serde(default)]
    pub command_timeout: Option<f64>,
    /// Seconds of silence from the remote before a NOP-Out ping (default 5;
    /// 0 = never).
    #[serde(default)]
    pub nop_interval: Option<f64>,
    /// Seconds a ping may go unanswered before the connection is dropped
    /// and logged in again (default 5).
    #[serde(default)]
    pub nop_timeout: Option<f64>,
    /// Seconds a TCP connect plus login may take (default 10).
    #[serde(default)]
    pub login_timeout: Option<f64>,
    /// Seconds commands wait for the session to reconnect before they fail
    /// with LOGICAL UNIT COMMUNICATION FAILURE, and new ones fail at once
    /// until it is back (open-iscsi's `replacement_timeout`; default: none,
    /// each command waits up to `command_timeout`).
    #[serde(default)]
    pub replacement_timeout: Option<f64>,
    /// Digests offered, in preference order (default `["None", "CRC32C"]`).
    #[serde(default)]
    pub digests: Option<Vec<String>>,
    /// Commands the gateway holds for the remote per session (default 1024).
    #[serde(default)]
    pub queue_depth: Option<usize>,
    /// Busy polling at low queue depth, in µs (default 0: off; at most
    /// 10,000): while at most `busy_poll_depth` commands are outstanding
    /// and the session was active this recently, the initiator polls its
    /// socket instead of sleeping, which saves a thread wake-up per reply
    /// (lower QD1 latency) and keeps a core busy during low-depth I/O.
    #[serde(default)]
    pub busy_poll_us: Option<u64>,
    /// See `busy_poll_us` (default 1).
    #[serde(default)]
    pub busy_poll_depth: Option<usize>,
    /// More portals of the same remote target (`host:port`), each another
    /// path to the LU: commands go to the path whose target port group is
    /// Active/Optimized, and on to the others on an ALUA refusal or a lost
    /// path (`unifab_scsi_core::multipath`; docs/bridge.md).
    #[serde(default)]
    pub portals: Option<Vec<String>>,
}

impl fmt::Debug for RemoteIscsiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteIscsiConfig")
            .field("mutual_user", &self.mutual_user)
            .field(
                "mutual_secret",
                &self.mutual_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("initiator_name", &self.initiator_name)
            .field("nexus", &self.nexus)
            .field("fixed_name", &self.fixed_name)
            .field("identity", &self.identity)
            .field("command_timeout", &self.command_timeout)
            .field("replacement_timeout", &self.replacement_timeout)
            .finish_non_exhaustive()
    }
}

/// A size in bytes, written as a number or a string with a binary suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

/// Longest timeout accepted, in seconds (a day).
pub const MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// The range of a timeout that must be set to something: positive, at
/// most a day (`[fabric.initiator]`'s timeouts, `replacement_timeout`).
pub const POSITIVE_TIMEOUT_SECS: std::ops::RangeInclusive<f64> =
    f64::MIN_POSITIVE..=MAX_TIMEOUT_SECS;

/// `v` seconds as a [`Duration`](std::time::Duration) when it lies in
/// `range` (a finite range: NaN, the infinities and what a `Duration`
/// cannot hold all fall outside it). Every number of seconds the gateway
/// takes, from a config file or the command line, goes through here.
pub fn seconds_in(v: f64, range: std::ops::RangeInclusive<f64>) -> Option<std::time::Duration> {
    range
        .contains(&v)
        .then(|| std::time::Duration::from_secs_f64(v))
}

/// Parses `"1GiB"`, `"512 MiB"`, `"4k"`, `"1048576"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected a number with an optional unit"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?} (use KiB, MiB, GiB, TiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows 64 bits"))
}

/// The iSCSI front end.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiConfig {
    /// Portals to listen on.
    pub listen: Vec<SocketAddr>,
    /// The addresses SendTargets gives hosts instead of the portals' own
    /// (`host[:port]`, IPv6 in brackets): for a gateway that hosts reach
    /// through NAT or a port mapping. Unset: the portals' addresses.
    #[serde(default)]
    pub advertise: Option<Vec<String>>,
    /// Targets.
    #[serde(default)]
    pub target: Vec<TargetConfig>,
    /// Most TCP connections at once (default 1024).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Commands a session may have outstanding (the CmdSN window, default 128).
    #[serde(default)]
    pub queue_depth: Option<u32>,
    /// Our MaxRecvDataSegmentLength (default 262144).
    #[serde(default)]
    pub max_recv_data_segment_length: Option<u32>,
    /// MaxBurstLength we accept at most (default 1 MiB).
    #[serde(default)]
    pub max_burst_length: Option<u32>,
    /// FirstBurstLength we accept at most (default 256 KiB).
    #[serde(default)]
    pub first_burst_length: Option<u32>,
    /// Offer ImmediateData=Yes (default true).
    #[serde(default)]
    pub immediate_data: Option<bool>,
    /// Offer InitialR2T=No (default: InitialR2T=No, i.e. `false`).
    #[serde(default)]
    pub initial_r2t: Option<bool>,
    /// Digests the target accepts, in preference order: `["None", "CRC32C"]`.
    #[serde(default)]
    pub digests: Option<Vec<String>>,
    /// Seconds between NOP-In pings to an idle initiator (0 = never; default 30).
    #[serde(default)]
    pub nop_in_interval: Option<u64>,
    /// Seconds a NOP-In ping may go unanswered before the connection is
    /// dropped (at least 1; default 60).
    #[serde(default)]
    pub nop_in_timeout: Option<u64>,
    /// Seconds a login may take before the connection is dropped (default 15).
    #[serde(default)]
    pub login_timeout: Option<u64>,
    /// Response coalescing: while at least this many commands of one
    /// connection are in progress, hold the answers of those that finish
    /// until this many are ready (0 = never hold; default 16).
    #[serde(default)]
    pub coalesce_responses: Option<u32>,
    /// The longest an answer is held by coalescing, in µs (default 1000).
    #[serde(default)]
    pub coalesce_max_delay_us: Option<u64>,
    /// RELATIVE TARGET PORT IDENTIFIER of this gateway's iSCSI port (VPD
    /// 83h, REPORT TARGET PORT GROUPS), 1–65535 (default 1). Gateways in
    /// front of one LU each need their own. It is also the port's target
    /// portal group tag, so that the SCSI target port names
    /// (`IQN,t,0xTPGT`) differ between gateways that present one target
    /// name: reservations are held per I_T nexus, that is per target port.
    #[serde(default)]
    pub relative_port: Option<u16>,
    /// TARGET PORT GROUP of this gateway's iSCSI port, 1–65535 (default
    /// 1): the `[[lu.alua.group]]` it belongs to.
    #[serde(default)]
    pub port_group: Option<u16>,
}

/// Most addresses `[iscsi] advertise` may list.
pub const MAX_ADVERTISED: usize = 64;

/// Most answers a batch of response coalescing may hold.
pub const MAX_COALESCE_RESPONSES: u32 = 1024;
/// Longest hold of response coalescing, in µs.
pub const MAX_COALESCE_DELAY_US: u64 = 100_000;

/// One iSCSI target node.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// iSCSI name.
    pub iqn: String,
    /// TargetAlias.
    #[serde(default)]
    pub alias: Option<String>,
    /// LU names: LUN 0, 1, … in order.
    pub luns: Vec<String>,
    /// Initiator names allowed to log in (absent: everyone). Each must be
    /// an iSCSI name (iqn., eui. or naa., RFC 7143 §4.2.7): a mistyped one
    /// would lock its host out without a word, so it is refused, with its
    /// line.
    #[serde(default, deserialize_with = "iscsi_names")]
    pub allow: Option<Vec<String>>,
    /// CHAP credentials; with them, login requires CHAP.
    #[serde(default)]
    pub chap: Option<ChapConfig>,
}

/// CHAP credentials.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChapConfig {
    /// The name the initiator answers with (CHAP_N).
    pub user: String,
    /// The initiator's secret.
    pub secret: String,
    /// For mutual CHAP: the name the target answers with.
    #[serde(default)]
    pub mutual_user: Option<String>,
    /// For mutual CHAP: the target's secret.
    #[serde(default)]
    pub mutual_secret: Option<String>,
}

impl fmt::Debug for ChapConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapConfig")
            .field("user", &self.user)
            .field("secret", &"<redacted>")
            .field("mutual_user", &self.mutual_user)
            .field(
                "mutual_secret",
                &self.mutual_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Operator endpoint: `unifab show …` and Prometheus metrics.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// HTTP listen address (loopback by default). Any other address needs
    /// a `token`.
    #[serde(default = "default_admin")]
    pub listen: SocketAddr,
    /// Directory for state (reservations with APTPL).
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Whether the gateway refuses to start when the endpoint cannot bind
    /// (default); `false`: it starts without one, with a warning.
    #[serde(default = "default_true")]
    pub required: bool,
    /// The windows of `show interface`'s load rates, in seconds (1 to 3
    /// of them, each 1 to 600; default 60 and 300, as NX-OS).
    #[serde(default = "default_load_interval")]
    pub load_interval: Vec<u64>,
    /// A bearer token every request must carry (`Authorization: Bearer
    /// …`; `unifab show --token` or `UNIFAB_ADMIN_TOKEN`), at least 16
    /// bytes. Required off loopback.
    #[serde(default)]
    pub token: Option<String>,
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("required", &self.required)
            .field("load_interval", &self.load_interval)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn default_load_interval() -> Vec<u64> {
    vec![60, 300]
}

impl AdminConfig {
    fn validate(&self) -> Result<(), String> {
        if self.load_interval.is_empty()
            || self.load_interval.len() > 3
            || self.load_interval.iter().any(|s| !(1..=600).contains(s))
        {
            return Err(format!(
                "admin.load_interval {:?}: 1 to 3 windows of 1 to 600 seconds",
                self.load_interval
            ));
        }
        if let Some(t) = &self.token
            && t.len() < 16
        {
            return Err("admin.token must be at least 16 bytes".into());
        }
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            return Err(format!(
                "admin.listen {} is not a loopback address: anyone who reaches it could read the gateway's state; set admin.token (clients send it as `Authorization: Bearer …`), or listen on 127.0.0.1",
                self.listen
            ));
        }
        Ok(())
    }
}

fn default_true() -> bool {
    true
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin(),
            data_dir: default_data_dir(),
            required: true,
            load_interval: default_load_interval(),
            token: None,
        }
    }
}

fn default_admin() -> SocketAddr {
    DEFAULT_ADMIN
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9260)))
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DATA_DIR)
}

/// Where a LU keeps its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// RAM.
    Memory,
    /// A file (created sparse if missing).
    File(PathBuf),
    /// A Ceph RBD image, `rbd:POOL/IMAGE` (created if missing and a size
    /// is given).
    Rbd(String),
    /// A LU of a remote iSCSI target (`iscsi://[user%secret@]host[:port]/iqn/lun`).
    Iscsi(unifab_iscsi::initiator::IscsiUrl),
    /// A LU behind an FC target port, through the gateway's fabric
    /// (`fc://WWPN/LUN`).
    Fc(fabric::FcUrl),
}

impl LuConfig {
    /// A tape drive (`type = "tape"`).
    pub fn is_tape(&self) -> bool {
        self.kind.as_deref() == Some("tape")
    }

    /// The checks only a tape has: a local backend, and none of the
    /// disk's keys.
    fn validate_tape(&self, backend: &Backend) -> Result<(), String> {
        let n = &self.name;
        match self.kind.as_deref() {
            None | Some("disk") => {
                if self.early_warning.is_some() {
                    return Err(format!("lu {n:?}: early_warning is for type = \"tape\""));
                }
                return Ok(());
            }
            Some("tape") => {}
            Some(other) => {
                return Err(format!(
                    "lu {n:?}: unknown type {other:?} (expected \"disk\" or \"tape\")"
                ));
            }
        }
        if !matches!(
            backend,
            Backend::Memory | Backend::File(_) | Backend::Rbd(_)
        ) {
            return Err(format!(
                "lu {n:?}: a tape is kept in a memory, file: or rbd: backend (a remote tape needs no type: its commands pass through)"
            ));
        }
        if self.size.is_none() {
            return Err(format!("lu {n:?}: a tape needs a size (its capacity)"));
        }
        if self.block_size.is_some()
            || self.physical_block_size.is_some()
            || self.removable
            || self.sanitize_rate.is_some()
            || self.write_cache.is_some()
            || self.soft_threshold.is_some()
        {
            return Err(format!(
                "lu {n:?}: block_size, physical_block_size, removable, sanitize_rate, write_cache and soft_threshold are a disk's; a tape's block length is set by its hosts (MODE SELECT)"
            ));
        }
        if let (Some(Size(s)), Some(Size(ew))) = (self.size, self.early_warning)
            && ew >= s / 2
        {
            return Err(format!(
                "lu {n:?}: early_warning {ew} must be less than half the size {s}"
            ));
        }
        Ok(())
    }

    /// The parsed backend.
    pub fn parsed_backend(&self) -> Result<Backend, String> {
        if self.backend == "memory" {
            Ok(Backend::Memory)
        } else if let Some(p) = self.backend.strip_prefix("file:") {
            if p.is_empty() {
                return Err(format!(
                    "lu {:?}: backend \"file:\" needs a path",
                    self.name
                ));
            }
            Ok(Backend::File(PathBuf::from(p)))
        } else if let Some(spec) = self.backend.strip_prefix("rbd:") {
            #[cfg(feature = "rbd")]
            unifab_scsi_core::rbd::RbdOptions::parse(spec)
                .map_err(|e| format!("lu {:?}: backend \"rbd:POOL/IMAGE\": {e}", self.name))?;
            #[cfg(not(feature = "rbd"))]
            let _ = spec;
            #[cfg(not(feature = "rbd"))]
            return Err(format!(
                "lu {:?}: this build of unifab has no rbd: backends (cargo feature rbd)",
                self.name
            ));
            #[cfg(feature = "rbd")]
            Ok(Backend::Rbd(spec.to_owned()))
        } else if self.backend.starts_with("iscsi://") {
            let url: unifab_iscsi::initiator::IscsiUrl = self
                .backend
                .parse()
                .map_err(|e| format!("lu {:?}: backend: {e}", self.name))?;
            if url.target.is_none() || url.lun.is_none() {
                return Err(format!(
                    "lu {:?}: an iscsi backend names a target and a LUN: iscsi://host[:port]/iqn/lun",
                    self.name
                ));
            }
            Ok(Backend::Iscsi(url))
        } else if self.backend.starts_with("fc://") {
            self.backend
                .parse()
                .map(Backend::Fc)
                .map_err(|e| format!("lu {:?}: backend {e}", self.name))
        } else {
            Err(format!(
                "lu {:?}: unknown backend {:?} (expected \"memory\", \"file:/path\", \"rbd:POOL/IMAGE\", \"iscsi://host[:port]/iqn/lun\" or \"fc://WWPN/LUN\")",
                self.name, self.backend
            ))
        }
    }
}

/// A configuration error, naming where it is.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The embedded default: a sparse 1 GiB file LU in `./unifab-data/`,
    /// LUN 0 of [`DEFAULT_IQN`] on 127.0.0.1:3260.
    pub fn embedded_default() -> Config {
        Config {
            lu: vec![LuConfig {
                name: "default".into(),
                kind: None,
                early_warning: None,
                backend: format!("file:{DEFAULT_DATA_DIR}/default.img"),
                size: Some(Size(1 << 30)),
                block_size: None,
                physical_block_size: None,
                read_only: false,
                removable: false,
                sanitize_rate: None,
                write_cache: None,
                soft_threshold: None,
                serial: None,
                ceph_conf: None,
                ceph_id: None,
                ceph_op_timeout: None,
                ceph_exclusive_lock: None,
                ceph_lock_timeout: None,
                iscsi: None,
                fc: None,
                alua: None,
            }],
            iscsi: Some(IscsiConfig {
                listen: vec![
                    DEFAULT_LISTEN
                        .parse()
                        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 3260))),
                ],
                target: vec![TargetConfig {
                    iqn: DEFAULT_IQN.into(),
                    alias: Some("unifab default".into()),
                    luns: vec!["default".into()],
                    allow: None,
                    chap: None,
                }],
                max_connections: None,
                queue_depth: None,
                max_recv_data_segment_length: None,
                max_burst_length: None,
                first_burst_length: None,
                immediate_data: None,
                initial_r2t: None,
                digests: None,
                nop_in_interval: None,
                nop_in_timeout: None,
                login_timeout: None,
                coalesce_responses: None,
                coalesce_max_delay_us: None,
                advertise: None,
                relative_port: None,
                port_group: None,
            }),
            admin: AdminConfig::default(),
            fabric: None,
            fcoe: None,
            fcip: None,
            tuning: Default::default(),
            cluster: None,
        }
    }

    /// Reads and checks a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        let cfg = Config::parse(&text, &path.display().to_string())?;
        if cfg.holds_secrets() {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(m) = std::fs::metadata(path)
                && m.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(
                    file = %path.display(),
                    mode = format!("{:o}", m.permissions().mode() & 0o777),
                    "the configuration holds secrets (CHAP, TLS pre-shared key) and others may read it: chmod 600"
                );
            }
        }
        Ok(cfg)
    }

    /// Whether the configuration holds a secret: a CHAP secret (the
    /// targets', a remote target's mutual one, or one in an `iscsi://`
    /// URL), the FCIP pre-shared key or the admin token.
    pub fn holds_secrets(&self) -> bool {
        let targets = self
            .iscsi
            .iter()
            .flat_map(|i| &i.target)
            .any(|t| t.chap.is_some());
        let remotes = self.lu.iter().any(|lu| {
            lu.iscsi.as_ref().is_some_and(|r| r.mutual_secret.is_some())
                || lu
                    .backend
                    .strip_prefix("iscsi://")
                    .and_then(|rest| rest.split('/').next())
                    .is_some_and(|authority| authority.contains('@'))
        });
        let psk = self
            .fcip
            .as_ref()
            .and_then(|f| f.tls.as_ref())
            .is_some_and(|t| t.psk.is_some());
        targets || remotes || psk || self.admin.token.is_some()
    }

    /// Parses and checks TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().trim().to_string();
            match line {
                Some(l) => ConfigError(format!("{origin}:{l}: {msg}")),
                None => ConfigError(format!("{origin}: {msg}")),
            }
        })?;
        cfg.validate()
            .map_err(|m| ConfigError(format!("{origin}: {m}")))?;
        Ok(cfg)
    }

    /// Cross-checks: unique names, LUN references, sizes, IQN syntax.
    pub fn validate(&self) -> Result<(), String> {
        self.tuning.validate()?;
        self.admin.validate()?;
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        if let Some(iscsi) = &self.iscsi
            && (iscsi.relative_port == Some(0) || iscsi.port_group == Some(0))
        {
            return Err(
                "iscsi.relative_port and iscsi.port_group are 1–65535 (0 is reserved)".into(),
            );
        }
        let mut names = HashSet::new();
        for lu in &self.lu {
            if !names.insert(lu.name.as_str()) {
                return Err(format!("lu {:?} is defined twice", lu.name));
            }
            let backend = lu.parsed_backend()?;
            remote::validate(lu, &backend)?;
            lu.validate_tape(&backend)?;
            if let Some(a) = &lu.alua {
                if lu.is_tape()
                    || !matches!(
                        backend,
                        Backend::Memory | Backend::File(_) | Backend::Rbd(_)
                    )
                {
                    return Err(format!(
                        "lu {:?}: alua is for an emulated disk (memory, file: or rbd:); a remote LU passes its own through",
                        lu.name
                    ));
                }
                let core = a.to_core(&lu.name)?;
                // In a cluster the LU is one behind every gateway: only a
                // backend every gateway reaches as the same storage.
                if self.cluster.is_some() {
                    if matches!(backend, Backend::Memory) {
                        return Err(format!(
                            "lu {:?}: in a [cluster] a LU with [lu.alua] is one LU behind every gateway; a memory backend would be each gateway's own (use file: on storage they share, or rbd:)",
                            lu.name
                        ));
                    }
                    if matches!(backend, Backend::Rbd(_))
                        && !lu.read_only
                        && lu.ceph_exclusive_lock != Some(false)
                    {
                        return Err(format!(
                            "lu {:?}: in a [cluster] every gateway opens the image: set ceph_exclusive_lock = false (the cluster's reservations and fencing arbitrate instead)",
                            lu.name
                        ));
                    }
                }
                if let Some(iscsi) = &self.iscsi {
                    let (port, group) = (
                        iscsi.relative_port.unwrap_or(1),
                        iscsi.port_group.unwrap_or(1),
                    );
                    if !core.groups.is_empty()
                        && !core
                            .groups
                            .iter()
                            .any(|g| g.id == group && g.ports.contains(&port))
                    {
                        return Err(format!(
                            "lu {:?}: alua: this gateway's iSCSI port (relative port {port}, group {group}: iscsi.relative_port, iscsi.port_group) is in none of the LU's groups",
                            lu.name
                        ));
                    }
                }
            }
            if backend == Backend::Memory && lu.size.is_none() {
                return Err(format!("lu {:?}: a memory backend needs a size", lu.name));
            }
            let ceph =
                lu.ceph_conf.is_some() || lu.ceph_id.is_some() || lu.ceph_op_timeout.is_some();
            if ceph && !matches!(backend, Backend::Rbd(_)) {
                return Err(format!(
                    "lu {:?}: the ceph_* keys need an rbd: backend",
                    lu.name
                ));
            }
            if lu
                .ceph_id
                .as_ref()
                .is_some_and(|id| id.is_empty() || id.contains('\0'))
            {
                return Err(format!(
                    "lu {:?}: ceph_id must be a non-empty name",
                    lu.name
                ));
            }
            let bs = lu.block_size.unwrap_or(512);
            if bs != 512 && bs != 4096 {
                return Err(format!(
                    "lu {:?}: block_size must be 512 or 4096, not {bs}",
                    lu.name
                ));
            }
            if let Some(p) = lu.physical_block_size {
                let ratio = p / bs;
                if p < bs || p % bs != 0 || !ratio.is_power_of_two() || ratio > 1 << 15 {
                    return Err(format!(
                        "lu {:?}: physical_block_size {p} must be a power-of-two multiple of the block size {bs} (at most 2^15 blocks)",
                        lu.name
                    ));
                }
            }
            if lu.soft_threshold.is_some() && !matches!(backend, Backend::Memory | Backend::File(_))
            {
                return Err(format!(
                    "lu {:?}: soft_threshold applies to memory and file LUs, not to an rbd or remote LU",
                    lu.name
                ));
            }
            if let Some(Size(s)) = lu.size
                && (s == 0 || s % u64::from(bs) != 0)
            {
                return Err(format!(
                    "lu {:?}: size {s} is not a positive multiple of the block size {bs}",
                    lu.name
                ));
            }
        }
        if let Some(iscsi) = &self.iscsi {
            if iscsi.listen.is_empty() {
                return Err("iscsi.listen is empty".into());
            }
            if let Some(adv) = &iscsi.advertise {
                if adv.len() > MAX_ADVERTISED {
                    return Err(format!(
                        "iscsi.advertise: at most {MAX_ADVERTISED} addresses"
                    ));
                }
                for a in adv {
                    unifab_iscsi::sendtargets::check_advertised_address(a)
                        .map_err(|e| format!("iscsi.advertise: {e}"))?;
                }
            }
            if iscsi
                .coalesce_responses
                .is_some_and(|n| n > MAX_COALESCE_RESPONSES)
            {
                return Err(format!(
                    "iscsi.coalesce_responses must be 0..={MAX_COALESCE_RESPONSES}"
                ));
            }
            if iscsi
                .coalesce_max_delay_us
                .is_some_and(|us| us == 0 || us > MAX_COALESCE_DELAY_US)
            {
                return Err(format!(
                    "iscsi.coalesce_max_delay_us must be 1..={MAX_COALESCE_DELAY_US} (turn coalescing off with coalesce_responses = 0)"
                ));
            }
            let mut iqns = HashSet::new();
            for t in &iscsi.target {
                check_iscsi_name(&t.iqn).map_err(|e| format!("iscsi.target {:?}: {e}", t.iqn))?;
                if !iqns.insert(t.iqn.to_ascii_lowercase()) {
                    return Err(format!("iscsi.target {:?} is defined twice", t.iqn));
                }
                if t.luns.is_empty() {
                    return Err(format!("iscsi.target {:?} has no luns", t.iqn));
                }
                for l in &t.luns {
                    if !names.contains(l.as_str()) {
                        return Err(format!(
                            "iscsi.target {:?}: lun {l:?} is not a defined lu",
                            t.iqn
                        ));
                    }
                }
                if let Some(c) = &t.chap {
                    if c.mutual_user.is_some() != c.mutual_secret.is_some() {
                        return Err(format!(
                            "iscsi.target {:?}: mutual CHAP needs both mutual_user and mutual_secret",
                            t.iqn
                        ));
                    }
                    if c.secret.len() < 12 {
                        return Err(format!(
                            "iscsi.target {:?}: CHAP secrets must be at least 12 bytes (RFC 7143 §9.2.1)",
                            t.iqn
                        ));
                    }
                    if c.mutual_secret.as_ref().is_some_and(|s| s.len() < 12) {
                        return Err(format!(
                            "iscsi.target {:?}: the mutual CHAP secret must be at least 12 bytes",
                            t.iqn
                        ));
                    }
                    if c.mutual_secret.as_ref() == Some(&c.secret) {
                        return Err(format!(
                            "iscsi.target {:?}: the mutual secret must differ from the initiator's",
                            t.iqn
                        ));
                    }
                }
            }
            if let Some(d) = &iscsi.digests {
                for v in d {
                    if v != "None" && v != "CRC32C" {
                        return Err(format!(
                            "iscsi.digests: unknown digest {v:?} (None, CRC32C)"
                        ));
                    }
                }
            }
        }
        fabric::validate(self)?;
        fcoe::validate(self)?;
        fcip::validate(self)?;
        Ok(())
    }
}

/// Deserializes a list of iSCSI names, refusing one that is not (the
/// error carries the value's place in the file).
fn iscsi_names<'de, D>(d: D) -> Result<Option<Vec<String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let names = Vec::<String>::deserialize(d)?;
    for n in &names {
        check_iscsi_name(n)
            .map_err(|e| serde::de::Error::custom(format!("{n:?} is not an iSCSI name: {e}")))?;
    }
    Ok(Some(names))
}

/// Checks an iSCSI name's form (RFC 7143 §4.2.7): `iqn.YYYY-MM.reversed.domain[:…]`,
/// `eui.` + 16 hex digits, or `naa.` + 16 or 32 hex digits; at most 223 bytes.
pub fn check_iscsi_name(name: &str) -> Result<(), String> {
    if name.len() > 223 {
        return Err("longer than 223 bytes".into());
    }
    let lower = name.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("iqn.") {
        let b = rest.as_bytes();
        let date_ok = b.len() >= 8
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && b[7] == b'.';
        if !date_ok {
            return Err("iqn names need a date: iqn.YYYY-MM.domain".into());
        }
        if !rest[8..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:".contains(c))
        {
            return Err("iqn names may hold only letters, digits, '-', '.', ':'".into());
        }
        Ok(())
    } else if let Some(hex) = lower.strip_prefix("eui.") {
        if hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err("eui names need 16 hex digits".into())
        }
    } else if let Some(hex) = lower.strip_prefix("naa.") {
        if (hex.len() == 16 || hex.len() == 32) && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err("naa names need 16 or 32 hex digits".into())
        }
    } else {
        Err("an iSCSI name starts with iqn., eui. or naa.".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[[lu]]
name = "vol0"
backend = "file:/var/lib/unifab/vol0.img"   # or "memory"
size = "1GiB"                               # created sparse if missing
[iscsi]
listen = ["127.0.0.1:3260"]
[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:vol0"
luns = ["vol0"]                             # LUN 0, 1, … in order
allow = ["iqn.1994-05.com.example:host1"]   # optional initiator ACL
chap = { user = "u", secret = "secretsecret", mutual_user = "t", mutual_secret = "mutualsecret" }
"#;

    #[test]
    fn cluster_settings_are_checked() {
        let with = |c: &str| {
            Config::parse(&format!("{EXAMPLE}\n[cluster]\n{c}\n"), "f").map_err(|e| e.to_string())
        };
        let ok = with("name = \"gw-a\"\netcd = [\"http://127.0.0.1:2379\"]").unwrap();
        let c = ok.cluster.unwrap();
        assert_eq!(
            (c.ttl(), c.prefix()),
            (Ok(std::time::Duration::from_secs(5)), "/unifab".into())
        );
        let c = with(
            "name = \"gw-a\"\netcd = [\"http://e:2379\"]\nlease_ttl = \"12s\"\nprefix = \"/x/\"",
        )
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(
            (c.ttl(), c.prefix()),
            (Ok(std::time::Duration::from_secs(12)), "/x".into())
        );
        for (c, want) in [
            ("name = \"\"\netcd = [\"http://e\"]", "cluster.name"),
            ("name = \"a b\"\netcd = [\"http://e\"]", "cluster.name"),
            ("name = \"a\"\netcd = []", "at least one"),
            ("name = \"a\"\netcd = [\"e:2379\"]", "http://"),
            (
                "name = \"a\"\netcd = [\"http://e\"]\nlease_ttl = \"1s\"",
                "2s to 60s",
            ),
            (
                "name = \"a\"\netcd = [\"http://e\"]\nlease_ttl = \"5m\"",
                "whole seconds",
            ),
        ] {
            let e = with(c).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn alua_groups_are_checked() {
        let with = |lu_extra: &str, iscsi_extra: &str| {
            Config::parse(
                &EXAMPLE
                    .replace("size = \"1GiB\"", &format!("size = \"1GiB\"\n{lu_extra}"))
                    .replace(
                        "listen = [\"127.0.0.1:3260\"]",
                        &format!("listen = [\"127.0.0.1:3260\"]\n{iscsi_extra}"),
                    ),
                "f",
            )
            .map_err(|e| e.to_string())
        };
        let groups = "[lu.alua]\n[[lu.alua.group]]\nid = 1\nstate = \"active/optimized\"\nports = [1]\n[[lu.alua.group]]\nid = 2\nstate = \"STATE\"\nports = [2]";
        let c = with(&groups.replace("STATE", "standby"), "").unwrap();
        let core = c.lu[0].alua.as_ref().unwrap().to_core("vol0").unwrap();
        assert_eq!(core.groups.len(), 2);
        assert!(core.explicit);
        assert!(
            with(
                &groups.replace("STATE", "standby"),
                "relative_port = 2\nport_group = 2"
            )
            .is_ok()
        );
        for (lu, iscsi, want) in [
            (
                groups.replace("STATE", "transitioning"),
                "",
                "is not one of",
            ),
            (groups.replace("STATE", "bogus"), "", "is not one of"),
            (
                groups.replace("STATE", "standby").replace("[2]", "[1]"),
                "",
                "in two groups",
            ),
            (
                groups
                    .replace("STATE", "standby")
                    .replace("id = 2", "id = 1"),
                "",
                "appears twice",
            ),
            (
                groups.replace("STATE", "standby"),
                "relative_port = 2",
                "in none of the LU's groups",
            ),
            (
                groups.replace("STATE", "standby"),
                "port_group = 0",
                "0 is reserved",
            ),
            (
                format!("type = \"tape\"\n{}", groups.replace("STATE", "standby")),
                "",
                "emulated disk",
            ),
        ] {
            let e = with(&lu, iscsi).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        // In a cluster: not a memory LU, not an rbd: image under its
        // exclusive lock.
        let cluster = "[cluster]\nname = \"gw-a\"\netcd = [\"http://127.0.0.1:2379\"]\n";
        let clustered = |backend: &str, extra: &str| {
            Config::parse(
                &format!(
                    "{}\n{cluster}",
                    EXAMPLE
                        .replace("file:/var/lib/unifab/vol0.img", backend)
                        .replace(
                            "size = \"1GiB\"",
                            &format!(
                                "size = \"1GiB\"\n{extra}\n{}",
                                groups.replace("STATE", "standby")
                            )
                        )
                ),
                "f",
            )
            .map_err(|e| e.to_string())
        };
        assert!(clustered("file:/srv/vol0.img", "").is_ok());
        let e = clustered("memory", "").unwrap_err();
        assert!(e.contains("each gateway's own"), "{e}");
        let e = clustered("rbd:rbd/vol0", "").unwrap_err();
        assert!(e.contains("ceph_exclusive_lock = false"), "{e}");
        assert!(clustered("rbd:rbd/vol0", "ceph_exclusive_lock = false").is_ok());
    }

    #[test]
    fn a_tape_is_a_local_lu_without_the_disks_keys() {
        let tape = |extra: &str| {
            Config::parse(
                &EXAMPLE.replace(
                    "size = \"1GiB\"",
                    &format!("size = \"1GiB\"\ntype = \"tape\"\n{extra}"),
                ),
                "f",
            )
        };
        let c = tape("early_warning = \"16MiB\"").unwrap();
        assert!(c.lu[0].is_tape());
        assert_eq!(c.lu[0].early_warning, Some(Size(16 << 20)));
        for (extra, says) in [
            ("block_size = 4096", "a disk's"),
            ("removable = true", "a disk's"),
            ("write_cache = false", "a disk's"),
            ("early_warning = \"512MiB\"", "less than half"),
        ] {
            let e = tape(extra).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
        let e = Config::parse(
            &EXAMPLE.replace("size = \"1GiB\"", "size = \"1GiB\"\ntype = \"changer\""),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown type"), "{e}");
        let e = Config::parse(
            &EXAMPLE.replace(
                "size = \"1GiB\"",
                "size = \"1GiB\"\nearly_warning = \"1MiB\"",
            ),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("for type = \"tape\""), "{e}");
        let e = Config::parse(
            &EXAMPLE.replace(
                "backend = \"file:/var/lib/unifab/vol0.img\"   # or \"memory\"\nsize = \"1GiB\"",
                "backend = \"iscsi://127.0.0.1/iqn.2026-11.io.example:t/1\"\ntype = \"tape\"",
            ),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("pass through"), "{e}");
    }

    #[test]
    fn secrets_are_noticed() {
        assert!(
            Config::parse(EXAMPLE, "example.toml")
                .unwrap()
                .holds_secrets()
        );
        assert!(!Config::embedded_default().holds_secrets());
    }

    #[test]
    fn a_mistyped_acl_name_is_refused_with_its_line() {
        let text = EXAMPLE.replace("iqn.1994-05.com.example:host1", "not an iqn");
        let e = Config::parse(&text, "example.toml")
            .unwrap_err()
            .to_string();
        let line = EXAMPLE
            .lines()
            .position(|l| l.contains("iqn.1994-05.com.example:host1"))
            .unwrap()
            + 1;
        assert!(
            e.starts_with(&format!("example.toml:{line}:"))
                && e.contains("\"not an iqn\" is not an iSCSI name"),
            "{e}"
        );
        let text = EXAMPLE.replace("iqn.1994-05.com.example:host1", "eui.02004567A425678D");
        assert!(Config::parse(&text, "example.toml").is_ok());
    }

    #[test]
    fn the_documented_example_parses() {
        let c = Config::parse(EXAMPLE, "example.toml").unwrap();
        assert_eq!(c.lu[0].size, Some(Size(1 << 30)));
        assert_eq!(
            c.lu[0].parsed_backend().unwrap(),
            Backend::File("/var/lib/unifab/vol0.img".into())
        );
        let t = &c.iscsi.as_ref().unwrap().target[0];
        assert_eq!(
            t.allow.as_ref().unwrap()[0],
            "iqn.1994-05.com.example:host1"
        );
        assert_eq!(t.chap.as_ref().unwrap().mutual_user.as_deref(), Some("t"));
        assert!(!format!("{:?}", t.chap).contains("secretsecret"));
    }

    #[test]
    fn tuning_is_off_unless_asked_for_and_checked_when_it_is() {
        let c = Config::parse(EXAMPLE, "example.toml").unwrap();
        assert_eq!(c.tuning.cpu_latency_us, None);
        let tuned = |line: &str| Config::parse(&format!("{EXAMPLE}[tuning]\n{line}\n"), "t.toml");
        let c = tuned("cpu_latency_us = 0").unwrap();
        assert_eq!(c.tuning.cpu_latency_us, Some(0));
        let refused = |line: &str| tuned(line).unwrap_err().to_string();
        let e = refused("cpu_latency_us = -1");
        assert!(e.starts_with("t.toml:14:"), "{e}");
        let e = refused("cpu_latency_us = 2147483648");
        assert!(e.contains("above the kernel's limit"), "{e}");
        let e = refused("cpu_latency = 0");
        assert!(e.contains("cpu_latency"), "{e}");
        assert_eq!(c.tuning.worker_threads, None);
        let c = tuned("worker_threads = 1").unwrap();
        assert_eq!(c.tuning.worker_threads, Some(1));
        for n in ["0", "1025"] {
            let e = refused(&format!("worker_threads = {n}"));
            assert!(
                e.contains("worker_threads") && e.contains("1 to 1024"),
                "{e}"
            );
        }
        let e = refused("worker_threads = -1");
        assert!(e.starts_with("t.toml:14:"), "{e}");
    }

    #[test]
    fn response_coalescing_is_bounded() {
        let with = |lines: &str| {
            let text = EXAMPLE.replace(
                "listen = [\"127.0.0.1:3260\"]",
                &format!("listen = [\"127.0.0.1:3260\"]\n{lines}"),
            );
            Config::parse(&text, "c.toml")
        };
        let c = with("coalesce_responses = 32\ncoalesce_max_delay_us = 500").unwrap();
        let i = c.iscsi.unwrap();
        assert_eq!(i.coalesce_responses, Some(32));
        assert_eq!(i.coalesce_max_delay_us, Some(500));
        assert!(with("coalesce_responses = 0").is_ok(), "0 turns it off");
        let e = with("coalesce_responses = 1025").unwrap_err().to_string();
        assert!(e.contains("coalesce_responses must be 0..=1024"), "{e}");
        let e = with("coalesce_max_delay_us = 0").unwrap_err().to_string();
        assert!(
            e.contains("coalesce_max_delay_us must be 1..=100000"),
            "{e}"
        );
        let e = with("coalesce_max_delay_us = 100001")
            .unwrap_err()
            .to_string();
        assert!(e.contains("coalesce_max_delay_us"), "{e}");
    }

    #[test]
    fn unknown_keys_name_file_line_and_key() {
        let bad = EXAMPLE.replace("luns = [\"vol0\"]", "luns = [\"vol0\"]\nlunz = 3");
        let e = Config::parse(&bad, "site.toml").unwrap_err().to_string();
        assert!(e.starts_with("site.toml:11:"), "{e}");
        assert!(e.contains("lunz"), "{e}");
        let e = Config::parse("[iscsi]\nlisten=[]\nbogus=1\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml:3:") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn cross_checks() {
        let e = Config::parse(
            &EXAMPLE.replace("luns = [\"vol0\"]", "luns = [\"vol9\"]"),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("vol9"), "{e}");
        let e = Config::parse(
            &EXAMPLE.replace("secret = \"secretsecret\"", "secret = \"short\""),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("12 bytes"), "{e}");
        let e = Config::parse(
            &EXAMPLE.replace("size = \"1GiB\"", "size = \"1GiB\"\nblock_size = 520"),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("block_size"), "{e}");
        for bad in [256, 1536, 3072] {
            let e = Config::parse(
                &EXAMPLE.replace(
                    "size = \"1GiB\"",
                    &format!("size = \"1GiB\"\nphysical_block_size = {bad}"),
                ),
                "f",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("physical_block_size"), "{e}");
        }
        let c = Config::parse(
            &EXAMPLE.replace(
                "size = \"1GiB\"",
                "size = \"1GiB\"\nphysical_block_size = 4096\nremovable = true",
            ),
            "f",
        )
        .unwrap();
        assert_eq!(c.lu[0].physical_block_size, Some(4096));
        assert!(c.lu[0].removable);
        let c = Config::parse(
            &EXAMPLE.replace(
                "size = \"1GiB\"",
                "size = \"1GiB\"\nsanitize_rate = \"1GiB\"",
            ),
            "f",
        )
        .unwrap();
        assert_eq!(c.lu[0].sanitize_rate, Some(Size(1 << 30)));
        let e = Config::parse(
            &EXAMPLE.replace("iqn.2026-11.io.unifab:vol0", "notaname"),
            "f",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("iqn."), "{e}");
        let e = Config::parse("[[lu]]\nname=\"m\"\nbackend=\"memory\"\n", "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a size"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("10XB").is_err());
        assert!(parse_size("99999999999999999999TiB").is_err());
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded_default();
        c.validate().unwrap();
        assert_eq!(c.iscsi.unwrap().target[0].iqn, DEFAULT_IQN);
    }

    #[test]
    fn iscsi_names() {
        assert!(check_iscsi_name("iqn.2026-11.io.unifab:x").is_ok());
        assert!(check_iscsi_name("eui.0123456789ABCDEF").is_ok());
        assert!(check_iscsi_name("naa.52004567ba64678d").is_ok());
        assert!(check_iscsi_name("iqn.26-11.x").is_err());
        assert!(check_iscsi_name("iqn.2026-11.a b").is_err());
        assert!(check_iscsi_name("foo").is_err());
    }
}
