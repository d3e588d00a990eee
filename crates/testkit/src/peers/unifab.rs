//! [`Unifab`]: this workspace's own gateway binary, launched the way the
//! peers are, so conformance tests and benchmarks treat it like tgtd.
//!
//! The binary is the release build (`cargo build --release -p unifab`):
//! `UNIFAB_BIN` if set, else `$CARGO_TARGET_DIR/release/unifab`, else
//! `<workspace>/target/release/unifab` ([`unifab_bin`]). A missing binary is
//! an error, never a skip.
//!
//! Each instance gets a private directory (its working directory, so any
//! `./unifab-data/` lands there, and its `[admin] data_dir`), a generated
//! `unifab.toml` and an ephemeral loopback port that the gateway binds
//! itself and names in its first line (`iSCSI target IQN on ADDR`): a port
//! chosen beforehand could be taken in between, and a connect to it could
//! reach another test's gateway.
//!
//! ```toml
//! [[lu]]
//! name = "lu0"
//! backend = "file:/dev/shm/x/lu0.img"   # or "memory"
//! size = "1GiB"
//! [iscsi]
//! listen = ["127.0.0.1:0"]
//! [[iscsi.target]]
//! iqn = "iqn.2026-11.io.unifab:default"
//! luns = ["lu0"]
//! ```
//!
//! LUNs are numbered in the order of `luns`, so the first LU is LUN 0.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::process::{KillOnDrop, log_tail};
use super::{PeerError, workspace_root};

/// The target name `unifab run` serves its default LU under (LUN 0), and the
/// name the launcher uses unless told otherwise.
pub const UNIFAB_DEFAULT_IQN: &str = "iqn.2026-11.io.unifab:default";

/// The release binary: `UNIFAB_BIN`, else `$CARGO_TARGET_DIR/release/unifab`,
/// else `<workspace>/target/release/unifab`.
///
/// # Errors
/// [`PeerError::MissingUnifab`] if there is no executable file there.
pub fn unifab_bin() -> Result<PathBuf, PeerError> {
    let path = match std::env::var_os("UNIFAB_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            let target = if target.is_absolute() {
                target
            } else {
                workspace_root().join(target)
            };
            target.join("release").join("unifab")
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(PeerError::MissingUnifab { path })
    }
}

/// A logical unit's backing store in the generated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Backend {
    File(PathBuf),
    Memory,
    /// `rbd:POOL/IMAGE` on the cluster of a ceph.conf.
    Rbd(String, PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LuSpec {
    name: String,
    backend: Backend,
    size: u64,
    /// Further `key = value` lines (value already TOML).
    settings: Vec<(String, String)>,
    /// Sub-tables after them (`[lu.alua]` …), raw TOML.
    tables: String,
}

/// Settings for a [`Unifab`] instance; made by [`Unifab::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct UnifabBuilder {
    iqn: String,
    lus: Vec<LuSpec>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready_timeout: Duration,
    /// `key = value` lines of `[iscsi]`.
    iscsi: Vec<(String, String)>,
    /// Raw TOML after everything else (`[cluster]` …).
    tail: String,
}

impl UnifabBuilder {
    /// The target name (default [`UNIFAB_DEFAULT_IQN`]).
    pub fn iqn(mut self, iqn: impl Into<String>) -> Self {
        self.iqn = iqn.into();
        self
    }

    /// Adds a file-backed LU of `size` bytes (the file is created by
    /// unifab if missing). LUNs follow the order of the calls.
    pub fn file_lu(mut self, path: impl Into<PathBuf>, size: u64) -> Self {
        let name = format!("lu{}", self.lus.len());
        self.lus.push(LuSpec {
            name,
            backend: Backend::File(path.into()),
            size,
            settings: Vec::new(),
            tables: String::new(),
        });
        self
    }

    /// Adds a memory-backed LU of `size` bytes.
    pub fn memory_lu(mut self, size: u64) -> Self {
        let name = format!("lu{}", self.lus.len());
        self.lus.push(LuSpec {
            name,
            backend: Backend::Memory,
            size,
            settings: Vec::new(),
            tables: String::new(),
        });
        self
    }

    /// Adds an RBD image `POOL/IMAGE` of `size` bytes (created if missing)
    /// on the cluster `ceph_conf` describes.
    pub fn rbd_lu(mut self, spec: &str, ceph_conf: impl Into<PathBuf>, size: u64) -> Self {
        let name = format!("lu{}", self.lus.len());
        self.lus.push(LuSpec {
            name,
            backend: Backend::Rbd(spec.to_owned(), ceph_conf.into()),
            size,
            settings: Vec::new(),
            tables: String::new(),
        });
        self
    }

    /// Adds `key = value` to the last LU's `[[lu]]` table; `value` is TOML
    /// (`"true"`, `"4096"`, `"\"text\""`). Does nothing before the first
    /// LU.
    pub fn lu_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let Some(lu) = self.lus.last_mut() {
            lu.settings.push((key.into(), value.into()));
        }
        self
    }

    /// Appends raw TOML after the last LU's settings: its sub-tables
    /// (`[lu.alua]`, `[[lu.alua.group]]`). Does nothing before the first
    /// LU.
    pub fn lu_table(mut self, toml: impl AsRef<str>) -> Self {
        if let Some(lu) = self.lus.last_mut() {
            lu.tables.push_str(toml.as_ref());
            lu.tables.push('\n');
        }
        self
    }

    /// Adds `key = value` to `[iscsi]`; `value` is TOML.
    pub fn iscsi_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.iscsi.push((key.into(), value.into()));
        self
    }

    /// Appends raw TOML at the end of the file (a `[cluster]` table …).
    pub fn section(mut self, toml: impl AsRef<str>) -> Self {
        self.tail.push_str(toml.as_ref());
        self.tail.push('\n');
        self
    }

    /// The last LU is write-protected (`read_only = true`; its file must
    /// exist, a read-only LU never creates one).
    pub fn read_only(self) -> Self {
        self.lu_setting("read_only", "true")
    }

    /// The last LU has a removable medium (`removable = true`).
    pub fn removable(self) -> Self {
        self.lu_setting("removable", "true")
    }

    /// The last LU reports `bytes` as its physical block length
    /// (`physical_block_size`).
    pub fn physical_block_size(self, bytes: u32) -> Self {
        self.lu_setting("physical_block_size", bytes.to_string())
    }

    /// Extra arguments after `run --config FILE`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// An environment variable for the process (e.g. `RUST_LOG`).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How long to wait for the portal to accept connections (default 20 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// The configuration file this builder writes, with `state` as the
    /// admin endpoint's `data_dir`.
    pub fn config_toml(&self, state: &Path) -> String {
        let mut out = String::new();
        for lu in &self.lus {
            let backend = match &lu.backend {
                Backend::File(path) => format!("file:{}", path.display()),
                Backend::Memory => "memory".to_owned(),
                Backend::Rbd(spec, _) => format!("rbd:{spec}"),
            };
            out.push_str(&format!(
                "[[lu]]\nname = {}\nbackend = {}\nsize = {}\n",
                toml_string(&lu.name),
                toml_string(&backend),
                toml_string(&size_string(lu.size)),
            ));
            if let Backend::Rbd(_, conf) = &lu.backend {
                out.push_str(&format!(
                    "ceph_conf = {}\n",
                    toml_string(&conf.display().to_string())
                ));
            }
            for (key, value) in &lu.settings {
                out.push_str(&format!("{key} = {value}\n"));
            }
            out.push_str(&lu.tables);
            out.push('\n');
        }
        let luns: Vec<String> = self.lus.iter().map(|lu| toml_string(&lu.name)).collect();
        out.push_str(&format!(
            "[iscsi]\nlisten = [{}]\n",
            toml_string("127.0.0.1:0")
        ));
        for (key, value) in &self.iscsi {
            out.push_str(&format!("{key} = {value}\n"));
        }
        out.push_str(&format!(
            "\n[[iscsi.target]]\niqn = {}\nluns = [{}]\n",
            toml_string(&self.iqn),
            luns.join(", "),
        ));
        // The admin endpoint on an ephemeral port and state in a private
        // directory, so parallel test gateways never collide.
        out.push_str(&format!(
            "\n[admin]\nlisten = \"127.0.0.1:0\"\ndata_dir = {}\n",
            toml_string(&state.display().to_string()),
        ));
        out.push_str(&self.tail);
        out
    }

    /// Starts `unifab run --config <generated file>` and waits until it
    /// names its portal (bound, listening) and that portal accepts a
    /// connection.
    ///
    /// # Errors
    /// [`PeerError::MissingUnifab`] without a release binary; otherwise the
    /// step that failed, with unifab's log.
    pub fn start(self) -> Result<Unifab, PeerError> {
        let bin = unifab_bin()?;
        if self.lus.is_empty() {
            return Err(PeerError::io(
                "unifab launcher",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "no LU configured: call file_lu or memory_lu",
                ),
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("unifab-")
            .tempdir()
            .map_err(|e| PeerError::io("creating unifab's temporary directory", e))?;
        let config_path = dir.path().join("unifab.toml");
        std::fs::write(&config_path, self.config_toml(&dir.path().join("state")))
            .map_err(|e| PeerError::io(format!("writing {}", config_path.display()), e))?;
        let log_path = dir.path().join("unifab.log");
        let log = File::create(&log_path)
            .map_err(|e| PeerError::io(format!("creating {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| PeerError::io("duplicating the log file handle", e))?;
        let mut command = Command::new(&bin);
        command
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .args(&self.args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let child = command.spawn().map_err(|source| PeerError::Spawn {
            program: bin.display().to_string(),
            source,
        })?;
        let mut instance = Unifab {
            child: KillOnDrop(child),
            port: 0,
            iqn: self.iqn.clone(),
            log_path,
            config_path,
            dir,
        };
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            if let Some(status) = instance.child.exited() {
                return Err(PeerError::Exited {
                    program: "unifab".to_owned(),
                    status,
                    log: instance.log(),
                });
            }
            if instance.port == 0 {
                let text = std::fs::read_to_string(&instance.log_path).unwrap_or_default();
                if let Some(addr) = portal_line(&text, &self.iqn) {
                    instance.port = addr.port();
                }
            }
            if instance.port != 0
                && std::net::TcpStream::connect_timeout(
                    &instance.addr(),
                    Duration::from_millis(200),
                )
                .is_ok()
            {
                return Ok(instance);
            }
            if Instant::now() >= deadline {
                let reason = if instance.port == 0 {
                    format!(
                        "it did not name its portal (\"iSCSI target {} on …\")",
                        self.iqn
                    )
                } else {
                    format!("nothing accepted connections on {}", instance.addr())
                };
                return Err(PeerError::NotReady {
                    program: "unifab".to_owned(),
                    waited: self.ready_timeout,
                    reason,
                    log: instance.log(),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The portal a gateway's output names for target `iqn` (its line
/// `iSCSI target IQN on ADDR`, printed once the portal listens).
fn portal_line(output: &str, iqn: &str) -> Option<SocketAddr> {
    output.lines().find_map(|l| {
        let (name, addr) = l.strip_prefix("iSCSI target ")?.split_once(" on ")?;
        if name == iqn {
            addr.trim().parse().ok()
        } else {
            None
        }
    })
}

/// A running `unifab run --config …`; killed when dropped.
#[derive(Debug)]
pub struct Unifab {
    child: KillOnDrop,
    port: u16,
    iqn: String,
    log_path: PathBuf,
    config_path: PathBuf,
    // Last: removed after the child is killed.
    dir: tempfile::TempDir,
}

impl Unifab {
    /// Settings for an instance; add at least one LU.
    pub fn builder() -> UnifabBuilder {
        UnifabBuilder {
            iqn: UNIFAB_DEFAULT_IQN.to_owned(),
            lus: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(20),
            iscsi: Vec::new(),
            tail: String::new(),
        }
    }

    /// The portal: 127.0.0.1 and [`Self::port`].
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The portal's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The target's name.
    pub fn iqn(&self) -> &str {
        &self.iqn
    }

    /// A libiscsi URL for LUN 0 (the first LU).
    pub fn url(&self) -> String {
        self.url_for_lun(0)
    }

    /// A libiscsi URL for `lun`.
    pub fn url_for_lun(&self, lun: u64) -> String {
        format!("iscsi://{}/{}/{lun}", self.addr(), self.iqn)
    }

    /// The generated configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The instance's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// unifab's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last 60 lines of unifab's output (stdout and stderr).
    pub fn log(&self) -> String {
        log_tail(&self.log_path, 60)
    }

    /// Whether unifab is still running (`Err` with its log if it exited).
    ///
    /// # Errors
    /// [`PeerError::Exited`] if the process is gone.
    pub fn check_alive(&mut self) -> Result<(), PeerError> {
        match self.child.exited() {
            None => Ok(()),
            Some(status) => Err(PeerError::Exited {
                program: "unifab".to_owned(),
                status,
                log: self.log(),
            }),
        }
    }
}

/// A TOML basic string with `"` `\` and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A size in the largest binary unit that divides it exactly ("1GiB",
/// "64MiB", "4KiB"), or plain bytes ("4097").
fn size_string(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn sizes_use_exact_units() {
        assert_eq!(size_string(1 << 30), "1GiB");
        assert_eq!(size_string(3 << 29), "1536MiB");
        assert_eq!(size_string(4096), "4KiB");
        assert_eq!(size_string(4097), "4097");
        assert_eq!(size_string(0), "0");
    }

    #[test]
    fn config_is_the_documented_toml() {
        let builder = Unifab::builder()
            .read_only()
            .file_lu("/dev/shm/a \"b\"/lu0.img", 1 << 30)
            .memory_lu(64 << 20)
            .removable()
            .physical_block_size(4096);
        let text = builder.config_toml(Path::new("/tmp/x/state"));
        let value: toml::Table = text.parse().expect("valid TOML");
        let lus = value["lu"].as_array().expect("lu array");
        assert_eq!(lus.len(), 2);
        assert_eq!(lus[0]["name"].as_str(), Some("lu0"));
        assert_eq!(
            lus[0]["backend"].as_str(),
            Some("file:/dev/shm/a \"b\"/lu0.img")
        );
        assert_eq!(lus[0]["size"].as_str(), Some("1GiB"));
        assert_eq!(lus[1]["backend"].as_str(), Some("memory"));
        assert!(
            lus[0].get("read_only").is_none(),
            "no LU yet when it was set"
        );
        assert_eq!(lus[1]["removable"].as_bool(), Some(true));
        assert_eq!(lus[1]["physical_block_size"].as_integer(), Some(4096));
        assert_eq!(lus[1]["size"].as_str(), Some("64MiB"));
        let iscsi = value["iscsi"].as_table().expect("iscsi table");
        assert_eq!(
            iscsi["listen"].as_array().expect("listen")[0].as_str(),
            Some("127.0.0.1:0")
        );
        assert_eq!(
            value["admin"]["data_dir"].as_str(),
            Some("/tmp/x/state"),
            "{text}"
        );
        let target = &iscsi["target"].as_array().expect("targets")[0];
        assert_eq!(target["iqn"].as_str(), Some(UNIFAB_DEFAULT_IQN));
        let luns: Vec<&str> = target["luns"]
            .as_array()
            .expect("luns")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(luns, ["lu0", "lu1"]);
    }

    #[test]
    fn the_portal_is_the_one_the_gateway_names_for_its_target() {
        let out = "2026-11-28T14:00:00Z  INFO unifab: starting\n\
                   iSCSI target iqn.2026-11.io.unifab:other on 127.0.0.1:4000\n\
                   iSCSI target iqn.2026-11.io.unifab:default on 127.0.0.1:41234\n\
                   \x20 iscsi://127.0.0.1:41234/iqn.2026-11.io.unifab:default/0\n";
        assert_eq!(
            portal_line(out, UNIFAB_DEFAULT_IQN),
            Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 41234)))
        );
        assert_eq!(portal_line(out, "iqn.2026-11.io.unifab:none"), None);
        assert_eq!(portal_line("iSCSI target iqn.x on \n", "iqn.x"), None);
    }

    #[test]
    fn missing_binary_is_an_error_naming_the_fix() {
        let err = PeerError::MissingUnifab {
            path: PathBuf::from("/nonexistent/unifab"),
        };
        let text = err.to_string();
        assert!(text.contains("cargo build --release -p unifab"), "{text}");
        assert!(text.contains("UNIFAB_BIN"), "{text}");
    }
}
