//! Shared helpers of the bridge tests: LU files, a `unifab run` whose log
//! the test can read, and `unifab bench` / `unifab iscsi discover` runs with
//! their JSON parsed.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::zombie_processes
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use unifab_testkit::lines::child_portal;

/// The unifab binary cargo built for these tests.
pub fn unifab() -> &'static str {
    env!("CARGO_BIN_EXE_unifab")
}

/// A scratch directory on tmpfs.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bridge-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// A zero-filled LU file of `size` bytes.
pub fn lu_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

/// A running `unifab run`, stderr in a file, killed on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub iqn: String,
    pub log: PathBuf,
}

impl Gateway {
    /// Writes `config` to `dir/unifab.toml` and starts the gateway.
    pub fn start(dir: &Path, config: &str) -> Gateway {
        let path = dir.join("unifab.toml");
        std::fs::write(&path, config).unwrap();
        let log = dir.join("unifab.log");
        let mut child = Command::new(unifab())
            .arg("run")
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn unifab");
        let (iqn, addr) = child_portal(&mut child, Duration::from_secs(60)).unwrap_or_else(|e| {
            panic!(
                "unifab did not print its portal: {e}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Gateway {
            child,
            addr,
            iqn,
            log,
        }
    }

    /// The URL of the gateway's LUN `lun`.
    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.addr, self.iqn)
    }

    /// What the gateway logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The admin endpoint's address, from the gateway's log.
    pub fn admin(&self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            let found = log
                .lines()
                .filter(|l| l.contains("admin endpoint listening"))
                .find_map(|l| {
                    let rest = &l[l.find("addr=")? + 5..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == ':'))
                        .unwrap_or(rest.len());
                    rest[..end].parse().ok()
                });
            if let Some(a) = found {
                return a;
            }
            assert!(
                Instant::now() < deadline,
                "no admin endpoint in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `unifab show WHAT --json` against this gateway.
    pub fn show(&self, what: &str) -> serde_json::Value {
        let out = Command::new(unifab())
            .args(["show", what, "--json", "--admin", &self.admin().to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "unifab show {what}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway configuration exporting one remote LU (`backend`), with
/// `[lu.iscsi]` lines `remote`.
pub fn bridge_config(dir: &Path, backend: &str, remote: &str) -> String {
    bridge_config_lu(dir, backend, "", remote)
}

/// As [`bridge_config`], with more `[[lu]]` settings (`lu_lines`).
pub fn bridge_config_lu(dir: &Path, backend: &str, lu_lines: &str, remote: &str) -> String {
    format!(
        r#"
[[lu]]
name = "bridged"
backend = "{backend}"
{lu_lines}
{remote_table}

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:bridge"
luns = ["bridged"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        remote_table = if remote.is_empty() {
            String::new()
        } else {
            format!("[lu.iscsi]\n{remote}")
        },
        dir = dir.display()
    )
}

/// The outcome of a `unifab bench` run.
pub struct BenchRun {
    pub ok: bool,
    pub json: serde_json::Value,
    pub stderr: String,
    pub stdout: String,
}

impl BenchRun {
    pub fn u64(&self, key: &str) -> u64 {
        self.json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {}", self.json))
    }

    /// Retry reasons the host saw, as (reason, count).
    pub fn retry_reasons(&self) -> Vec<(String, u64)> {
        self.json["retry_reasons"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A report for assertion messages.
    pub fn report(&self) -> String {
        format!(
            "stdout:\n{}\nstderr (tail):\n{}",
            self.stdout,
            tail(&self.stderr, 30)
        )
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn bench_output(out: Output) -> BenchRun {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("unifab bench printed no JSON ({e}):\nstdout:\n{stdout}\nstderr:\n{stderr}")
    });
    BenchRun {
        ok: out.status.success(),
        json,
        stderr,
        stdout,
    }
}

/// `unifab bench URL --json --quiet ARGS…`, waiting for it.
pub fn bench(url: &str, args: &[&str]) -> BenchRun {
    let out = Command::new(unifab())
        .arg("bench")
        .arg(url)
        .args(["--json", "--quiet"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    bench_output(out)
}

/// Starts `unifab bench` in the background.
pub fn bench_spawn(url: &str, args: &[&str]) -> Child {
    Command::new(unifab())
        .arg("bench")
        .arg(url)
        .args(["--json", "--quiet"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a background bench.
pub fn bench_wait(child: Child) -> BenchRun {
    bench_output(child.wait_with_output().unwrap())
}

/// `unifab iscsi discover ARGS…`: (success, stdout, stderr).
pub fn discover(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(unifab())
        .args(["iscsi", "discover"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Host-side SCSI through unifab's own iSCSI initiator, for tests that
/// need what libiscsi's tools cannot do together (two hosts, task
/// management between their commands).
pub mod host {
    use std::time::Duration;

    use bytes::Bytes;
    use unifab_iscsi::initiator::io::{InitiatorConfig, IscsiInitiator};
    pub use unifab_scsi_core::initiator::Initiator;
    use unifab_scsi_core::initiator::Request;
    use unifab_scsi_core::{Asc, Lun, Sense, SenseKey, Status, TaskResult};

    pub const TUR: &[u8] = &[0, 0, 0, 0, 0, 0];
    pub const RESERVE6: &[u8] = &[0x16, 0, 0, 0, 0, 0];
    pub const RELEASE6: &[u8] = &[0x17, 0, 0, 0, 0, 0];
    pub const READ10: &[u8] = &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

    /// A session of initiator `name` to `target` at `portal`, logged in.
    pub async fn login(name: &str, portal: &str, target: &str) -> IscsiInitiator {
        let i = IscsiInitiator::start(InitiatorConfig::new(name), portal, target);
        i.wait_connected(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{name} → {target} at {portal}: {e}"));
        i
    }

    /// Runs `cdb` on `lun` (data-in up to `len` bytes).
    pub async fn run(i: &IscsiInitiator, lun: Lun, cdb: &'static [u8], len: u32) -> TaskResult {
        let out = i.submit(Request::new(lun, Bytes::from_static(cdb), len));
        out.outcome.await.unwrap()
    }

    /// The sense key and code of a CHECK CONDITION.
    pub fn sense(r: &TaskResult) -> Option<(SenseKey, Asc)> {
        r.sense
            .as_deref()
            .and_then(Sense::parse)
            .map(|s| (s.key, s.asc))
    }

    /// TEST UNIT READY until GOOD: past the unit attentions a new nexus
    /// gets.
    pub async fn ready(i: &IscsiInitiator, lun: Lun) {
        for _ in 0..4 {
            if run(i, lun, TUR, 0).await.status == Status::GOOD {
                return;
            }
        }
        panic!("TEST UNIT READY never became GOOD");
    }
}
