//! Starting and stopping a real `unifab` process for integration tests.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::zombie_processes
)]

pub mod stable;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use unifab_testkit::lines::child_portal;

/// A running `unifab run --config …`.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub iqn: String,
    pub config: PathBuf,
}

impl Gateway {
    /// Writes `config` (with `@PORT@` replaced by 0-port listen and admin
    /// addresses) and starts the gateway, waiting for it to print its portal.
    pub fn start(dir: &Path, config: &str) -> Gateway {
        let path = dir.join("unifab.toml");
        std::fs::write(&path, config).unwrap();
        Gateway::start_with(path)
    }

    /// Starts the gateway on an existing config file.
    pub fn start_with(path: PathBuf) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_unifab"))
            .arg("run")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn unifab");
        let (iqn, addr) = child_portal(&mut child, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("unifab did not print its portal: {e}"));
        Gateway {
            child,
            addr,
            iqn,
            config: path,
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(mut self) -> PathBuf {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.config.clone()
    }
}

/// `unifab reload --config CFG` (`--dry-run` with `dry_run`), finding the
/// running gateway's admin socket from the file.
pub fn reload(cfg: &Path, dry_run: bool) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_unifab"));
    c.arg("reload").arg("--config").arg(cfg);
    if dry_run {
        c.arg("--dry-run");
    }
    c.output().unwrap()
}

/// `GET /show/WHAT` on the admin socket under `dir/state` (which answers
/// GET like the TCP endpoint), parsed.
pub fn show_json(dir: &Path, what: &str) -> Vec<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("state/admin.sock")).unwrap();
    write!(
        s,
        "GET /show/{what} HTTP/1.1\r\nHost: unifab\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).unwrap()
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `[lu.alua]` of a LU behind two clustered gateways: group 1 (gateway
/// A's port 1) Active/Optimized, group 2 (B's port 2)
/// Active/Non-optimized, so both paths serve.
pub const TWO_GATEWAY_GROUPS: &str = r#"[lu.alua]
explicit = false
[[lu.alua.group]]
id = 1
state = "active/optimized"
ports = [1]
[[lu.alua.group]]
id = 2
state = "active/non-optimized"
ports = [2]
"#;

/// The iSCSI target of a clustered LU.
pub const CLUSTERED_IQN: &str = "iqn.2026-11.io.unifab:clustered";

/// A member of a cluster of gateways: its name, the etcd it uses (3 s
/// lease), its iSCSI listen address, its port `rel` (relative port and
/// port group, in [`TWO_GATEWAY_GROUPS`]) and its admin endpoint.
pub struct Member<'a> {
    pub name: &'a str,
    pub etcd: &'a str,
    pub listen: &'a str,
    pub rel: u16,
    pub admin: &'a str,
}

/// `member`'s config: the shared file LU `{shared}/disk.img` of `size` to
/// [`CLUSTERED_IQN`], state in `dir`.
pub fn clustered_config(dir: &Path, shared: &Path, size: &str, member: &Member<'_>) -> String {
    let lu = format!(
        "backend = \"file:{shared}/disk.img\"\nsize = \"{size}\"",
        shared = shared.display()
    );
    clustered_config_with(dir, &lu, member)
}

/// [`clustered_config`] with the LU's backend lines `lu` (`backend = …`,
/// its size and options).
pub fn clustered_config_with(dir: &Path, lu: &str, member: &Member<'_>) -> String {
    let Member {
        name,
        etcd,
        listen,
        rel,
        admin,
    } = member;
    format!(
        r#"
[[lu]]
name = "disk"
{lu}

{TWO_GATEWAY_GROUPS}
[iscsi]
listen = ["{listen}"]
relative_port = {rel}
port_group = {rel}

[[iscsi.target]]
iqn = "{CLUSTERED_IQN}"
luns = ["disk"]

[cluster]
name = "{name}"
etcd = ["{etcd}"]
lease_ttl = "3s"

[admin]
listen = "{admin}"
data_dir = "{dir}/state"
"#,
        dir = dir.display(),
    )
}

/// A config serving one file LU over iSCSI on an ephemeral port.
pub fn file_lu_config(dir: &Path, size: &str) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/disk.img"
size = "{size}"

[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = 5

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:test"
luns = ["disk"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
}

/// Extra keys for [`fc_lu_config`], each placed at the end of its section.
#[derive(Default)]
pub struct FcExtra<'a> {
    /// In `[fabric]` (zones go here, as `[[fabric.zone]]` tables after it).
    pub fabric: &'a str,
    /// In `[fabric.initiator]` (and tables after it).
    pub initiator: &'a str,
    /// In `[admin]`.
    pub admin: &'a str,
}

/// A gateway whose iSCSI target `iqn` exports an `fc://` LU ("via-fc") on
/// its own fabric: a file LU ("disk", 16 MiB) behind FC target
/// 21:00:00:00:c9:00:00:0a, reached through initiator port
/// 21:00:00:00:c9:00:00:0b (an NPIV port per host); the admin endpoint
/// at `admin`; NOP-Ins off (the tests' clients answer none).
pub fn fc_lu_config(dir: &Path, iqn: &str, admin: SocketAddr, extra: &FcExtra<'_>) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/lu.img"
size = "16MiB"

[[lu]]
name = "via-fc"
backend = "fc://21:00:00:00:c9:00:00:0a/0"

[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = 0

[[iscsi.target]]
iqn = "{iqn}"
luns = ["via-fc"]

[admin]
listen = "{admin}"
data_dir = "{dir}/state"
{admin_extra}

[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"
{fabric_extra}

[[fabric.target]]
wwpn = "21:00:00:00:c9:00:00:0a"
luns = ["disk"]

[fabric.initiator]
wwpn = "21:00:00:00:c9:00:00:0b"
{initiator_extra}
"#,
        dir = dir.display(),
        admin_extra = extra.admin,
        fabric_extra = extra.fabric,
        initiator_extra = extra.initiator,
    )
}

/// The far site of a two-gateway FCIP test: FC target
/// 21:00:00:00:c9:00:0b:0a on switch 10:00:00:00:c9:00:00:b1 (domain 2)
/// exports a 16 MiB file LU; it accepts FCIP on `listen` for the
/// enhanced-mode tunnel `name` with `circuits` accepting circuits
/// (100 ms keep-alive, 2 s dead timer); iSCSI (the readiness line) and the
/// admin endpoint on ephemeral ports.
pub fn fcip_far_site(dir: &Path, listen: &str, name: &str, circuits: usize) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{d}/disk.img"
size = "16MiB"

[fabric]
domain = 2
switch_wwn = "10:00:00:00:c9:00:00:b1"

[[fabric.target]]
wwpn = "21:00:00:00:c9:00:0b:0a"
luns = ["disk"]

[fcip]
listen = "{listen}"

{tunnel}
[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:fcip-far"
luns = ["disk"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{d}/state"
"#,
        d = dir.display(),
        tunnel = fcip_tunnel(name, "10:00:00:00:c9:00:00:a1", &vec![None; circuits]),
    )
}

/// The near site: LU "far" (`fc://` to the far site's target) on iSCSI
/// target `iqn` (NOP-Ins off), initiator 21:00:00:00:c9:00:0a:0b on switch
/// 10:00:00:00:c9:00:00:a1 (domain 1), `[fcip]` with `tunnels`, the admin
/// endpoint at `admin`.
pub fn fcip_near_site(dir: &Path, iqn: &str, tunnels: &str, admin: &str) -> String {
    format!(
        r#"
[[lu]]
name = "far"
backend = "fc://21:00:00:00:c9:00:0b:0a/0"

[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:a1"

[fabric.initiator]
wwpn = "21:00:00:00:c9:00:0a:0b"

[fcip]

{tunnels}
[iscsi]
listen = ["127.0.0.1:0"]
nop_in_interval = 0

[[iscsi.target]]
iqn = "{iqn}"
luns = ["far"]

[admin]
listen = "{admin}"
data_dir = "{d}/state"
"#,
        d = dir.display()
    )
}

/// An enhanced-mode `[[fcip.tunnel]]` to switch `peer` (100 ms keep-alive,
/// 2 s dead timer) with a circuit per entry: connecting to the address, or
/// accepting (`None`).
pub fn fcip_tunnel(name: &str, peer: &str, circuits: &[Option<String>]) -> String {
    let mut s = format!(
        "[[fcip.tunnel]]\nname = \"{name}\"\npeer = \"{peer}\"\nmode = \"enhanced\"\nkeepalive_ms = 100\ndead_ms = 2000\n\n"
    );
    for c in circuits {
        s.push_str("[[fcip.tunnel.circuit]]\n");
        if let Some(a) = c {
            s.push_str(&format!("peer = \"{a}\"\n"));
        }
    }
    s
}
