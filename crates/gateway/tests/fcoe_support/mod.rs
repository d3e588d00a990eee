//! Network namespaces, veth pairs and unifab processes for the FCoE tests.
//!
//! Every test that uses these needs root (network namespaces, AF_PACKET,
//! AF_XDP): without it the test fails and says so. The veth pair and the
//! namespace are created by the test and removed when it ends (also when
//! it fails); a unifab that dies is reported with its log.
//!
//! Topology of a hop: gateway A runs in the test's own namespace (so that
//! iscsi-test-cu and the test reach its iSCSI portal on 127.0.0.1); its
//! FCoE port is one end of a veth pair; the other end is in a namespace
//! of its own, where gateway B runs.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::zombie_processes
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use unifab_testkit::lines::{Lines, portal};
use unifab_testkit::peers::{free_tcp_port, unifab_bin};
use unifab_testkit::veth::run;

pub const TARGET_WWPN: &str = "21:00:00:00:c9:00:00:0a";
pub const INITIATOR_WWPN: &str = "21:00:00:00:c9:00:00:0b";
pub const IQN: &str = "iqn.2026-11.io.unifab:via-fcoe";
pub const VLAN: u16 = 100;

/// Fails the test unless it runs as root with `ip` available.
pub fn require_root(what: &str) {
    unifab_testkit::veth::require_root(what, "unifab");
}

/// A veth pair: `a` here, `b` in namespace `ns`. Removed on drop.
pub struct Veth {
    pub ns: String,
    pub a: String,
    pub b: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Removes the namespaces and veth ends a killed test run left behind
/// (named after a process that no longer exists). Deleting the veth also
/// detaches any XDP program on it.
fn sweep_stale() {
    let dead = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|t| t.split_once('x'))
            .and_then(|(pid, _)| u32::from_str_radix(pid, 16).ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for ns in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|ns| dead(ns, "fcoens"))
        {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
    if let Ok(out) = Command::new("ip").args(["-br", "link", "show"]).output() {
        for dev in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|d| d.split('@').next().unwrap_or(d))
            .filter(|d| dead(d, "fcoea"))
        {
            let _ = Command::new("ip").args(["link", "del", dev]).output();
        }
    }
}

impl Veth {
    /// Creates the namespace and the pair (MTU 2,500: an FCoE baby
    /// jumbo), both ends up.
    pub fn new() -> Veth {
        sweep_stale();
        // fcoe{ns,a,b}<pid in hex>x<n>: at most 15 characters, an
        // interface name's limit; the pid lets a later run tell leftovers
        // of a killed run from a running test's.
        let tag = format!(
            "{:x}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let v = Veth {
            ns: format!("fcoens{tag}"),
            a: format!("fcoea{tag}"),
            b: format!("fcoeb{tag}"),
        };
        run(&["ip", "netns", "add", &v.ns]);
        run(&[
            "ip", "link", "add", &v.a, "type", "veth", "peer", "name", &v.b,
        ]);
        run(&["ip", "link", "set", &v.b, "netns", &v.ns]);
        run(&["ip", "link", "set", &v.a, "mtu", "2500", "up"]);
        run(&["ip", "-n", &v.ns, "link", "set", &v.b, "mtu", "2500", "up"]);
        run(&["ip", "-n", &v.ns, "link", "set", "lo", "up"]);
        v
    }

    /// Gives both ends link-local IPv4 addresses (169.254.77.1 here,
    /// .2 there), to show IP still works next to FCoE.
    pub fn with_ip(self) -> Veth {
        run(&["ip", "addr", "add", "169.254.77.1/24", "dev", &self.a]);
        run(&[
            "ip",
            "-n",
            &self.ns,
            "addr",
            "add",
            "169.254.77.2/24",
            "dev",
            &self.b,
        ]);
        self
    }

    /// The attached XDP program's name on `a`, if any.
    pub fn xdp_on_a(&self) -> Option<String> {
        let out = Command::new("ip")
            .args(["-d", "link", "show", "dev", &self.a])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_once("prog/xdp")
            .map(|(_, rest)| rest.split_whitespace().nth(3).unwrap_or("?").to_string())
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}

/// A running unifab; killed on drop.
pub struct Gw {
    pub child: Child,
    pub admin: SocketAddr,
    pub iscsi: Option<SocketAddr>,
    pub log: PathBuf,
    pub ns: Option<String>,
}

impl Gw {
    /// Starts `unifab run` on `config` (in `ns` if given) and waits for
    /// the line starting with `ready`.
    pub fn start(dir: &Path, name: &str, config: &str, ns: Option<&str>, ready: &str) -> Gw {
        let bin = unifab_bin().expect("the release binary (cargo build --release -p unifab)");
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let log = dir.join(format!("{name}.log"));
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let mut child = cmd
            .arg("run")
            .arg("--config")
            .arg(&path)
            .current_dir(dir)
            // UNIFAB_TEST_LOG raises the gateways' log level when chasing
            // a failure (e.g. `info,unifab_fc=debug`).
            .env(
                "RUST_LOG",
                std::env::var("UNIFAB_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn unifab");
        let admin: SocketAddr = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("listen = \"127.0.0.1:"))
            .map(|p| {
                format!("127.0.0.1:{}", p.trim_end_matches('"'))
                    .parse()
                    .unwrap()
            })
            .expect("an [admin] listen line in the config");
        let mut lines = Lines::new(child.stdout.take().unwrap());
        let mut iscsi = None;
        let ready_line = lines.wait_for(Duration::from_secs(30), |line| {
            if let Some((_, addr)) = portal(line) {
                iscsi = Some(addr);
            }
            line.starts_with(ready).then_some(())
        });
        if let Err(e) = ready_line {
            panic!("{name} did not print {ready:?}: {e}:\n{}", tail(&log));
        }
        lines.drain();
        Gw {
            child,
            admin,
            iscsi,
            log,
            ns: ns.map(str::to_string),
        }
    }

    /// The log lines reporting a forwarded command that failed in
    /// transport (`RemoteLu`'s WARN).
    pub fn transport_failures(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("forwarded command failed"))
            .map(str::to_string)
            .collect()
    }

    /// Fails with the log if the gateway is gone.
    pub fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("unifab exited ({status}):\n{}", tail(&self.log));
        }
    }

    /// `unifab show WHAT --json`, parsed.
    pub fn show(&self, what: &str) -> serde_json::Value {
        let bin = unifab_bin().unwrap();
        let mut cmd = match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let out = cmd
            .args(["show", what, "--json", "--admin", &self.admin.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "show {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Asks the gateway to stop (SIGTERM) and waits up to 15 s.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            assert!(Instant::now() < deadline, "unifab did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last lines of a log.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Gateway B: fabric, FCP target over a file LU, an FCF on `iface`.
pub fn config_b(dir: &Path, iface: &str, io: &str, extra_port: &str) -> String {
    let admin = free_tcp_port().unwrap();
    format!(
        r#"
[[lu]]
name = "disk"
backend = "file:{dir}/lu.img"
size = "1GiB"

[fabric]
domain = 2
switch_wwn = "10:00:00:00:c9:00:00:02"

[[fabric.target]]
wwpn = "{TARGET_WWPN}"
luns = ["disk"]

[[fcoe.port]]
interface = "{iface}"
mode = "fcf"
{io_keys}
vlan = {VLAN}
priority = 3
{extra_port}

[admin]
listen = "127.0.0.1:{admin}"
data_dir = "{dir}/state-b"
"#,
        dir = dir.display(),
        io_keys = io_keys(io),
    )
}

/// The port's `io` line, and its `xdp_mode` line for `af_xdp/MODE`
/// (`af_xdp` alone leaves the mode to the gateway's default, `auto`).
pub fn io_keys(io: &str) -> String {
    match io.split_once('/') {
        Some((io, mode)) => format!("io = \"{io}\"\nxdp_mode = \"{mode}\""),
        None => format!("io = \"{io}\""),
    }
}

/// Gateway A: an ENode on `iface` carrying the initiator; the fc:// LU
/// exported over iSCSI on 127.0.0.1.
pub fn config_a(dir: &Path, iface: &str, io: &str) -> String {
    let admin = free_tcp_port().unwrap();
    format!(
        r#"
[[lu]]
name = "via-fcoe"
backend = "fc://{TARGET_WWPN}/0"

[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"

[fabric.initiator]
wwpn = "{INITIATOR_WWPN}"

[[fcoe.port]]
interface = "{iface}"
mode = "enode"
{io_keys}
priority = 3

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "{IQN}"
luns = ["via-fcoe"]

[admin]
listen = "127.0.0.1:{admin}"
data_dir = "{dir}/state-a"
"#,
        dir = dir.display(),
        io_keys = io_keys(io),
    )
}

/// Both gateways of a hop, B first; waits until A's fc:// LU answers.
pub struct Hop {
    pub veth: Veth,
    pub b: Gw,
    pub a: Gw,
}

impl Hop {
    pub fn start(dir: &Path, io: &str, extra_b_port: &str) -> Hop {
        let veth = Veth::new().with_ip();
        let b = Gw::start(
            dir,
            "b",
            &config_b(dir, &veth.b, io, extra_b_port),
            Some(&veth.ns),
            "FCoE FCF on",
        );
        let a = Gw::start(dir, "a", &config_a(dir, &veth.a, io), None, "iSCSI target");
        let mut hop = Hop { veth, b, a };
        // The LU is reachable once A logged in through B and found the target.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            hop.a.check_alive();
            hop.b.check_alive();
            let log = std::fs::read_to_string(&hop.a.log).unwrap_or_default();
            if log.contains("fc:// LU reachable") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the fc:// LU never became reachable through FCoE:\nA:\n{}\nB:\n{}",
                tail(&hop.a.log),
                tail(&hop.b.log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        hop
    }

    pub fn url(&self) -> String {
        format!("iscsi://{}/{IQN}/0", self.a.iscsi.expect("A's portal"))
    }
}

/// A tshark capture on an interface of this namespace; stopped by pid.
pub struct Capture {
    child: Child,
    pub file: PathBuf,
}

impl Capture {
    pub fn start(iface: &str, file: PathBuf) -> Capture {
        let child = Command::new("tshark")
            .args(["-i", iface, "-q", "-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tshark (Debian: tshark)");
        // tshark needs a moment before it captures.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !file.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        Capture { child, file }
    }

    /// Stops tshark (SIGINT, so it finishes the file) and returns the file.
    pub fn stop(mut self) -> PathBuf {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let _ = self.child.wait();
        self.file.clone()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What tshark makes of a capture: frames of each kind, and every frame
/// it flags (malformed, short, error-severity expert items, bad CRC).
pub struct Decoded {
    pub fip: usize,
    pub fcoe: usize,
    pub crc_good: usize,
    pub flagged: String,
}

/// What tshark flags: malformed or short frames, error-severity expert
/// items, FCoE frames whose CRC is not good.
const FLAGGED: &str = "(fip || fcoe) && (_ws.malformed || _ws.short \
                       || _ws.expert.severity >= 0x00800000 || fcoe.crc.status != 1)";

/// Decodes `file` with tshark in one pass (an I/O statistics table with a
/// count per filter); lists the flagged frames only when there are any.
pub fn decode(file: &Path) -> Decoded {
    let stat = format!(
        "io,stat,0,COUNT(frame)frame && fip,COUNT(frame)frame && fcoe,\
         COUNT(frame)frame && fcoe.crc.status == 1,COUNT(frame)frame && {FLAGGED}"
    );
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-q", "-z", &stat])
        .output()
        .expect("tshark (Debian: tshark)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark -r {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.contains("<>"))
        .unwrap_or_else(|| panic!("no statistics row in tshark's output:\n{text}"));
    let counts: Vec<usize> = row
        .split('|')
        .skip(2)
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert_eq!(counts.len(), 4, "unexpected statistics row: {row}");
    let flagged = if counts[3] == 0 {
        String::new()
    } else {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(file)
            .args(["-Y", FLAGGED])
            .output()
            .unwrap();
        let list = String::from_utf8_lossy(&out.stdout).into_owned();
        format!("{} frames:\n{list}", counts[3])
    };
    Decoded {
        fip: counts[0],
        fcoe: counts[1],
        crc_good: counts[2],
        flagged,
    }
}
