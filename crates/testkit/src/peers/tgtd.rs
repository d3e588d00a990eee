//! [`Tgtd`]: the Linux SCSI target framework's user-space iSCSI target
//! (Debian package `tgt`), as a peer and as the performance baseline.
//!
//! Each instance is private: it runs in the foreground (`tgtd -f`), listens
//! on its own loopback port, and its management socket lives in its own
//! temporary directory (`TGT_IPC_SOCKET`), so any number of instances and a
//! system-wide tgtd can coexist. The instance is killed when the [`Tgtd`] is
//! dropped.
//!
//! Facts about tgtd 1.0.85 this relies on (read from its source and checked
//! by the tests in `crates/testkit/tests/peers.rs`):
//! - LUN 0 of every tgtd target is its own controller LU; the data LU made
//!   here is therefore LUN **1** ([`Tgtd::LUN`]).
//! - tgtd ignores SIGTERM (its handler is empty); only SIGKILL or
//!   `tgtadm --mode system --op delete` stop it. In `-f` mode it creates no
//!   SysV IPC objects, so SIGKILL leaves nothing behind.
//! - If its portal port is taken, tgtd logs `failed to create/bind to portal`
//!   and keeps running without it; the launcher watches for that line and
//!   retries on another port.
//! - `HeaderDigest=CRC32C` on a tgtd target means "CRC32C or None, preferring
//!   CRC32C": tgtd always accepts None too, so it cannot *require* a digest.

use std::fmt;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::PeerError;
use super::net::{free_tcp_port, wait_for_port};
use super::process::{KillOnDrop, display_command, find_program, log_tail, run_checked};

/// The Debian package that ships `tgtd` and `tgtadm`.
const PACKAGE: &str = "tgt";
/// How many ports are tried when the chosen one turns out to be taken.
const PORT_ATTEMPTS: usize = 5;
/// The line tgtd logs when it cannot bind its portal.
const BIND_FAILURE: &str = "failed to create/bind to portal";

/// A CHAP account: a user name and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// The CHAP name.
    pub user: String,
    /// The CHAP secret.
    pub secret: String,
}

impl Chap {
    /// An account from a user name and secret.
    pub fn new(user: impl Into<String>, secret: impl Into<String>) -> Self {
        Chap {
            user: user.into(),
            secret: secret.into(),
        }
    }
}

impl fmt::Debug for Chap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &"…")
            .finish()
    }
}

/// A digest setting for the target (`HeaderDigest` / `DataDigest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Digest {
    /// Offer `None` only (tgtd's default).
    #[default]
    None,
    /// Offer `CRC32C` (preferred) and `None`: an initiator that offers
    /// CRC32C gets it. tgtd has no way to refuse `None`.
    Crc32c,
}

impl Digest {
    fn tgtadm_value(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
}

/// Settings for a [`Tgtd`] instance; made by [`Tgtd::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct TgtdBuilder {
    backing: PathBuf,
    iqn: String,
    chap: Option<Chap>,
    mutual_chap: Option<Chap>,
    header_digest: Digest,
    data_digest: Digest,
    ready_timeout: Duration,
    tape: bool,
    ip: Ipv4Addr,
}

impl TgtdBuilder {
    /// The portal's address (default 127.0.0.1): another local address,
    /// e.g. the root side of a network namespace's veth, so that a process
    /// inside the namespace reaches tgtd.
    pub fn portal_ip(mut self, ip: Ipv4Addr) -> Self {
        self.ip = ip;
        self
    }

    /// Serve the backing file as a tape drive (`--device-type tape
    /// --bstype ssc`): the file must be a tgt tape image, made by
    /// [`Tgtd::make_tape`].
    pub fn tape(mut self) -> Self {
        self.tape = true;
        self
    }

    /// The target's name (default `iqn.2026-11.io.unifab:tgtd`).
    pub fn iqn(mut self, iqn: impl Into<String>) -> Self {
        self.iqn = iqn.into();
        self
    }

    /// Require one-way CHAP: the initiator must log in as this account.
    pub fn chap(mut self, account: Chap) -> Self {
        self.chap = Some(account);
        self
    }

    /// Mutual CHAP: the target proves itself to the initiator with this
    /// account (tgtd's "outgoing" account). Only meaningful with [`Self::chap`].
    pub fn mutual_chap(mut self, account: Chap) -> Self {
        self.mutual_chap = Some(account);
        self
    }

    /// The target's `HeaderDigest` setting.
    pub fn header_digest(mut self, digest: Digest) -> Self {
        self.header_digest = digest;
        self
    }

    /// The target's `DataDigest` setting.
    pub fn data_digest(mut self, digest: Digest) -> Self {
        self.data_digest = digest;
        self
    }

    /// How long to wait for tgtd to come up (default 10 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts tgtd and configures the target, LU, ACL, accounts and digests.
    ///
    /// # Errors
    /// [`PeerError::MissingProgram`] if `tgt` is not installed; otherwise
    /// the step that failed, with tgtd's log.
    pub fn start(self) -> Result<Tgtd, PeerError> {
        let tgtd = find_program("tgtd", PACKAGE)?;
        let tgtadm = find_program("tgtadm", PACKAGE)?;
        let meta = std::fs::metadata(&self.backing)
            .map_err(|e| PeerError::io(format!("backing file {}", self.backing.display()), e))?;
        if meta.len() == 0 {
            return Err(PeerError::io(
                format!("backing file {}", self.backing.display()),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "file is empty"),
            ));
        }

        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            match self.try_start(&tgtd, &tgtadm)? {
                Started::Ready(instance) => return self.configure(instance),
                Started::PortTaken(err) => last_err = Some(err),
            }
        }
        Err(last_err.unwrap_or_else(|| PeerError::io("tgtd", std::io::ErrorKind::AddrInUse.into())))
    }

    fn try_start(&self, tgtd: &Path, tgtadm: &Path) -> Result<Started, PeerError> {
        let dir = tempfile::Builder::new()
            .prefix("tgtd-")
            .tempdir()
            .map_err(|e| PeerError::io("creating tgtd's temporary directory", e))?;
        let port = free_tcp_port()?;
        // The management socket path is private (TGT_IPC_SOCKET), so the
        // control port number only has to be unique within this directory.
        // tgtd keeps it in a C `short`: derive a distinct one from the portal
        // port within 0..=32767, which also makes instances easy to tell
        // apart in `ps`.
        let control_port = port % 32768;
        let log_path = dir.path().join("tgtd.log");
        let log = File::create(&log_path)
            .map_err(|e| PeerError::io(format!("creating {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| PeerError::io("duplicating the log file handle", e))?;
        let ipc_socket = dir.path().join("socket");
        let args = [
            "-f".to_owned(),
            "-C".to_owned(),
            control_port.to_string(),
            "--iscsi".to_owned(),
            format!("portal={}:{port}", self.ip),
        ];
        let child = Command::new(tgtd)
            .args(&args)
            .env("TGT_IPC_SOCKET", &ipc_socket)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| PeerError::Spawn {
                program: display_command(tgtd, &args),
                source,
            })?;
        let mut instance = Tgtd {
            child: KillOnDrop(child),
            ip: self.ip,
            port,
            control_port,
            iqn: self.iqn.clone(),
            chap: self.chap.clone(),
            mutual_chap: self.mutual_chap.clone(),
            tgtadm: tgtadm.to_path_buf(),
            ipc_socket,
            log_path,
            _dir: dir,
        };

        // Ready when the management socket answers; by then the portal has
        // been bound (or has failed to bind) too.
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            if let Some(status) = instance.child.exited() {
                return Err(PeerError::Exited {
                    program: "tgtd".to_owned(),
                    status,
                    log: instance.log(),
                });
            }
            if instance.tgtadm(&["--mode", "sys", "--op", "show"]).is_ok() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(PeerError::NotReady {
                    program: "tgtd".to_owned(),
                    waited: self.ready_timeout,
                    reason: "tgtadm could not reach its management socket".to_owned(),
                    log: instance.log(),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
        if instance.log().contains(BIND_FAILURE) {
            return Ok(Started::PortTaken(PeerError::NotReady {
                program: "tgtd".to_owned(),
                waited: self.ready_timeout,
                reason: format!("port {port} was taken on every attempt"),
                log: instance.log(),
            }));
        }
        Ok(Started::Ready(instance))
    }

    fn configure(&self, tgtd: Tgtd) -> Result<Tgtd, PeerError> {
        let tid = Tgtd::TID.to_string();
        let lun = Tgtd::LUN.to_string();
        let backing = self.backing.to_string_lossy().into_owned();
        tgtd.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "new",
            "--tid",
            &tid,
            "--targetname",
            &self.iqn,
        ])?;
        let mut lu_args = vec![
            "--mode",
            "logicalunit",
            "--op",
            "new",
            "--tid",
            &tid,
            "--lun",
            &lun,
            "--backing-store",
            &backing,
        ];
        if self.tape {
            lu_args.extend(["--device-type", "tape", "--bstype", "ssc"]);
        }
        tgtd.tgtadm(&lu_args)?;
        // Any initiator address may log in (libiscsi's tests use two
        // initiator names from the same address).
        tgtd.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "bind",
            "--tid",
            &tid,
            "--initiator-address",
            "ALL",
        ])?;
        if let Some(chap) = &self.chap {
            tgtd.tgtadm(&[
                "--mode",
                "account",
                "--op",
                "new",
                "--user",
                &chap.user,
                "--password",
                &chap.secret,
            ])?;
            tgtd.tgtadm(&[
                "--mode", "account", "--op", "bind", "--tid", &tid, "--user", &chap.user,
            ])?;
        }
        if let Some(mutual) = &self.mutual_chap {
            tgtd.tgtadm(&[
                "--mode",
                "account",
                "--op",
                "new",
                "--user",
                &mutual.user,
                "--password",
                &mutual.secret,
            ])?;
            tgtd.tgtadm(&[
                "--mode",
                "account",
                "--op",
                "bind",
                "--tid",
                &tid,
                "--user",
                &mutual.user,
                "--outgoing",
            ])?;
        }
        for (name, digest) in [
            ("HeaderDigest", self.header_digest),
            ("DataDigest", self.data_digest),
        ] {
            tgtd.tgtadm(&[
                "--mode",
                "target",
                "--op",
                "update",
                "--tid",
                &tid,
                "--name",
                name,
                "--value",
                digest.tgtadm_value(),
            ])?;
        }
        wait_for_port(tgtd.addr(), self.ready_timeout)?;
        Ok(tgtd)
    }
}

enum Started {
    Ready(Tgtd),
    PortTaken(PeerError),
}

/// A running tgtd with one target and one file-backed LU; killed on drop.
///
/// ```no_run
/// use unifab_testkit::peers::{Chap, Tgtd};
/// let tgtd = Tgtd::builder("/dev/shm/lu.img")
///     .chap(Chap::new("user", "secret-123456"))
///     .start()?;
/// println!("{}", tgtd.url()); // iscsi://user%secret-123456@127.0.0.1:PORT/IQN/1
/// # Ok::<(), unifab_testkit::peers::PeerError>(())
/// ```
#[derive(Debug)]
pub struct Tgtd {
    child: KillOnDrop,
    ip: Ipv4Addr,
    port: u16,
    control_port: u16,
    iqn: String,
    chap: Option<Chap>,
    mutual_chap: Option<Chap>,
    tgtadm: PathBuf,
    ipc_socket: PathBuf,
    log_path: PathBuf,
    // Last: removed after the child is killed.
    _dir: tempfile::TempDir,
}

impl Tgtd {
    /// The target id used for the one target.
    pub const TID: u32 = 1;
    /// The data LU's LUN (tgtd keeps LUN 0 for its controller LU).
    pub const LUN: u64 = 1;
    /// The default target name.
    pub const DEFAULT_IQN: &'static str = "iqn.2026-11.io.unifab:tgtd";

    /// Settings for an instance serving `backing` (an existing, non-empty
    /// regular file or block device).
    pub fn builder(backing: impl Into<PathBuf>) -> TgtdBuilder {
        TgtdBuilder {
            backing: backing.into(),
            iqn: Self::DEFAULT_IQN.to_owned(),
            chap: None,
            mutual_chap: None,
            header_digest: Digest::None,
            data_digest: Digest::None,
            ready_timeout: Duration::from_secs(10),
            tape: false,
            ip: Ipv4Addr::LOCALHOST,
        }
    }

    /// Makes a blank tgt tape image of `megabytes` at `path` with `tgtimg`
    /// (for [`TgtdBuilder::tape`]).
    ///
    /// # Errors
    /// [`PeerError::MissingProgram`] without `tgt`; the command's output
    /// when it fails.
    pub fn make_tape(path: &std::path::Path, megabytes: u32) -> Result<(), PeerError> {
        let tgtimg = find_program("tgtimg", PACKAGE)?;
        let out = std::process::Command::new(&tgtimg)
            .args([
                "--op",
                "new",
                "--device-type",
                "tape",
                "--barcode",
                "UNIFAB01",
            ])
            .arg(format!("--size={megabytes}"))
            .args(["--type", "data", "--file"])
            .arg(path)
            .output()
            .map_err(|e| PeerError::io("running tgtimg", e))?;
        if !out.status.success() {
            return Err(PeerError::io(
                "tgtimg",
                std::io::Error::other(format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )),
            ));
        }
        Ok(())
    }

    /// Starts an instance with default settings serving `backing`.
    ///
    /// # Errors
    /// As [`TgtdBuilder::start`].
    pub fn start(backing: impl Into<PathBuf>) -> Result<Tgtd, PeerError> {
        Self::builder(backing).start()
    }

    /// The portal: its address (127.0.0.1 unless [`TgtdBuilder::portal_ip`]
    /// said otherwise) and [`Self::port`].
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip, self.port))
    }

    /// The portal's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The management control port (`tgtadm -C`).
    pub fn control_port(&self) -> u16 {
        self.control_port
    }

    /// The target's name.
    pub fn iqn(&self) -> &str {
        &self.iqn
    }

    /// The data LU's LUN ([`Self::LUN`]).
    pub fn lun(&self) -> u64 {
        Self::LUN
    }

    /// tgtd's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A libiscsi URL for the data LU, with the CHAP account (and, for mutual
    /// CHAP, `target_user`/`target_password`) when the target requires them.
    pub fn url(&self) -> String {
        let mut url = String::from("iscsi://");
        if let Some(chap) = &self.chap {
            url.push_str(&format!("{}%{}@", chap.user, chap.secret));
        }
        url.push_str(&format!("{}/{}/{}", self.addr(), self.iqn, Self::LUN));
        if let (Some(_), Some(mutual)) = (&self.chap, &self.mutual_chap) {
            url.push_str(&format!(
                "?target_user={}&target_password={}",
                mutual.user, mutual.secret
            ));
        }
        url
    }

    /// A libiscsi URL for the data LU without any credentials.
    pub fn url_without_credentials(&self) -> String {
        format!("iscsi://{}/{}/{}", self.addr(), self.iqn, Self::LUN)
    }

    /// Runs `tgtadm --lld iscsi` with `args` against this instance and
    /// returns its output.
    ///
    /// # Errors
    /// [`PeerError::CommandFailed`] with tgtadm's message.
    pub fn tgtadm(&self, args: &[&str]) -> Result<String, PeerError> {
        let control = self.control_port.to_string();
        let mut full: Vec<&str> = vec!["-C", &control, "--lld", "iscsi"];
        full.extend_from_slice(args);
        let shown = display_command(&self.tgtadm, &full);
        run_checked(
            Command::new(&self.tgtadm)
                .args(&full)
                .env("TGT_IPC_SOCKET", &self.ipc_socket),
            &shown,
        )
    }

    /// The last 40 lines of tgtd's own log (stdout and stderr).
    pub fn log(&self) -> String {
        log_tail(&self.log_path, 40)
    }

    /// Whether tgtd is still running (`Err` with its log if it exited).
    ///
    /// # Errors
    /// [`PeerError::Exited`] if the process is gone.
    pub fn check_alive(&mut self) -> Result<(), PeerError> {
        match self.child.exited() {
            None => Ok(()),
            Some(status) => Err(PeerError::Exited {
                program: "tgtd".to_owned(),
                status,
                log: self.log(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chap_debug_hides_the_secret() {
        let shown = format!("{:?}", Chap::new("alice", "hunter2-hunter2"));
        assert!(shown.contains("alice"));
        assert!(!shown.contains("hunter2"));
    }

    #[test]
    fn digest_values_are_what_tgtadm_accepts() {
        assert_eq!(Digest::None.tgtadm_value(), "None");
        assert_eq!(Digest::Crc32c.tgtadm_value(), "CRC32C");
    }
}
