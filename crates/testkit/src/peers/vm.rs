//! A Linux guest under QEMU, for tests whose peer is the kernel itself
//! (open-iscsi, the FCoE stack, dm-multipath, LIO, `st`).
//!
//! The image is Debian 12 with Debian's kernel, built once per machine by
//! `scripts/vm-image.sh` and cached outside the clone
//! ([`GuestImage::ensure`]). Each run boots it from a throwaway qcow2
//! overlay, under software emulation (TCG: this machine's `/dev/kvm` is a
//! nested device that cannot run Debian's kernel), with
//!
//! * a 9p share mounted at `/mnt/host` in the guest: it carries the test's
//!   `run.sh` in and whatever the script writes there out, and the guest's
//!   `dmesg.txt` after the script;
//! * the script's output on the first serial port ([`GuestRun::console`])
//!   and its exit status on the second, so a guest that hangs, panics or
//!   powers off early can never be mistaken for one that passed;
//! * user-mode networking: the guest reaches the host's loopback at
//!   [`HOST_FROM_GUEST`] (`10.0.2.2`), so a gateway listening on
//!   `127.0.0.1:PORT` is `10.0.2.2:PORT` from inside.
//!
//! The whole run is bounded: QEMU is killed at the limit, and dropped
//! guests are killed. The host side can watch the script's progress and
//! answer it through the share ([`Guest::wait_for_file`],
//! [`Guest::write_file`]): that is how a test restarts a gateway under a
//! mounted filesystem.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{KillOnDrop, find_program, log_tail, run_with_limit};
use super::{PeerError, workspace_root};

/// The host's loopback as the guest sees it (QEMU user networking).
pub const HOST_FROM_GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// How long building the image may take (it takes ~2 minutes on 2 cores).
const IMAGE_BUILD_LIMIT: Duration = Duration::from_secs(900);

/// A built guest image: a kernel, its initrd and a root filesystem.
#[derive(Debug, Clone)]
pub struct GuestImage {
    dir: PathBuf,
}

impl GuestImage {
    /// The cached image, built first by `scripts/vm-image.sh` if this
    /// machine has none for the script's current recipe.
    ///
    /// # Errors
    /// Missing QEMU or debootstrap (naming the package), not root, or the
    /// build's own failure with its output.
    pub fn ensure() -> Result<GuestImage, PeerError> {
        find_program("qemu-system-x86_64", "qemu-system-x86")?;
        find_program("qemu-img", "qemu-utils")?;
        let script = workspace_root().join("scripts/vm-image.sh");
        let mut command = Command::new("bash");
        command.arg(&script);
        let shown = format!("bash {}", script.display());
        let finished = run_with_limit(&mut command, &shown, IMAGE_BUILD_LIMIT)?;
        let Some(status) = finished.status else {
            return Err(PeerError::Timeout {
                command: shown,
                limit: IMAGE_BUILD_LIMIT,
                output: format!("{}{}", finished.stdout, finished.stderr),
            });
        };
        if !status.success() {
            return Err(PeerError::CommandFailed {
                command: shown,
                status,
                output: format!("{}{}", finished.stdout, finished.stderr),
            });
        }
        // The script's last line names the image's directory.
        let dir = PathBuf::from(finished.stdout.lines().last().unwrap_or_default().trim());
        for part in ["vmlinuz", "initrd.img", "rootfs.qcow2"] {
            if !dir.join(part).is_file() {
                return Err(PeerError::Unparsable {
                    command: shown,
                    reason: format!("no {part} in {}", dir.display()),
                });
            }
        }
        Ok(GuestImage { dir })
    }

    /// The directory holding the image.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The guest kernel's release (from the image's `RECIPE`).
    pub fn kernel_release(&self) -> String {
        fs::read_to_string(self.dir.join("RECIPE"))
            .ok()
            .and_then(|recipe| {
                recipe
                    .lines()
                    .find_map(|l| l.strip_prefix("kernel ").map(str::to_owned))
            })
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// How a guest is started; made by [`Guest::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct GuestBuilder {
    script: String,
    files: Vec<(String, Vec<u8>)>,
    memory_mib: u32,
    limit: Duration,
    extra: Vec<String>,
}

impl GuestBuilder {
    /// The guest's `run.sh` (POSIX sh, run with `/mnt/host` as its working
    /// directory; its exit status is the run's).
    pub fn script(mut self, script: impl Into<String>) -> Self {
        self.script = script.into();
        self
    }

    /// Another file in the share (`name` relative to it).
    pub fn file(mut self, name: impl Into<String>, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.into(), contents.into()));
        self
    }

    /// Guest memory (default 512 MiB).
    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// The longest the guest may run, boot included (default 300 s);
    /// QEMU is killed past it.
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Extra QEMU arguments (another NIC: `-netdev tap,…`).
    pub fn qemu_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra.extend(args.into_iter().map(Into::into));
        self
    }

    /// Boots the guest from a fresh overlay of `image` and returns at once.
    ///
    /// # Errors
    /// The overlay, the share or QEMU could not be made or started.
    pub fn start(self, image: &GuestImage) -> Result<Guest, PeerError> {
        let qemu = find_program("qemu-system-x86_64", "qemu-system-x86")?;
        let qemu_img = find_program("qemu-img", "qemu-utils")?;
        let dir = tempfile::Builder::new()
            .prefix("unifab-guest-")
            .tempdir()
            .map_err(|e| PeerError::io("guest temp dir", e))?;
        let share = dir.path().join("share");
        fs::create_dir(&share).map_err(|e| PeerError::io("guest share", e))?;
        fs::write(share.join("run.sh"), &self.script)
            .map_err(|e| PeerError::io("writing run.sh", e))?;
        for (name, contents) in &self.files {
            fs::write(share.join(name), contents)
                .map_err(|e| PeerError::io(format!("writing {name} into the share"), e))?;
        }
        let overlay = dir.path().join("overlay.qcow2");
        let base = image.dir.join("rootfs.qcow2");
        let mut create = Command::new(&qemu_img);
        create
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&base)
            .arg(&overlay);
        super::process::run_checked(&mut create, "qemu-img create (overlay)")?;
        let console = dir.path().join("console.log");
        let status = dir.path().join("status.log");
        let qemu_log = dir.path().join("qemu.log");
        let log = fs::File::create(&qemu_log).map_err(|e| PeerError::io("qemu log", e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| PeerError::io("qemu log handle", e))?;
        let mut command = Command::new(&qemu);
        command
            .args([
                "-nodefaults",
                "-display",
                "none",
                "-no-reboot",
                "-monitor",
                "none",
            ])
            .args(["-accel", "tcg,tb-size=128", "-cpu", "max", "-smp", "1"])
            .arg("-m")
            .arg(self.memory_mib.to_string())
            .arg("-kernel")
            .arg(image.dir.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.dir.join("initrd.img"))
            .arg("-append")
            .arg(
                "console=ttyS0 root=/dev/vda rw init=/sbin/unifab-init panic=-1 \
                 loglevel=4 net.ifnames=0",
            )
            .arg("-drive")
            .arg(format!(
                "file={},if=virtio,format=qcow2,cache=unsafe",
                overlay.display()
            ))
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=unifab,security_model=none",
                share.display()
            ))
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-serial")
            .arg(format!("file:{}", status.display()))
            .args([
                "-netdev",
                "user,id=n0",
                "-device",
                "virtio-net-pci,netdev=n0",
            ])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = command.spawn().map_err(|source| PeerError::Spawn {
            program: "qemu-system-x86_64".into(),
            source,
        })?;
        Ok(Guest {
            child: KillOnDrop(child),
            started: Instant::now(),
            limit: self.limit,
            share,
            console,
            status,
            qemu_log,
            _dir: dir,
        })
    }

    /// Boots the guest and waits for it to power off (or its limit).
    ///
    /// # Errors
    /// As [`GuestBuilder::start`].
    pub fn run(self, image: &GuestImage) -> Result<GuestRun, PeerError> {
        self.start(image)?.wait()
    }
}

/// A running guest; killed, and its overlay and share removed, on drop.
#[derive(Debug)]
pub struct Guest {
    child: KillOnDrop,
    started: Instant,
    limit: Duration,
    share: PathBuf,
    console: PathBuf,
    status: PathBuf,
    qemu_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Guest {
    /// A guest that runs nothing yet.
    pub fn builder() -> GuestBuilder {
        GuestBuilder {
            script: String::new(),
            files: Vec::new(),
            memory_mib: 512,
            limit: Duration::from_secs(300),
            extra: Vec::new(),
        }
    }

    /// The host side of the guest's `/mnt/host`.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// The guest's pid (QEMU's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the script has made `name` in the share, at most
    /// `within`; an error when the guest ended first or the time ran out,
    /// with the console so far.
    ///
    /// # Errors
    /// [`PeerError::NotReady`].
    pub fn wait_for_file(&mut self, name: &str, within: Duration) -> Result<(), PeerError> {
        let deadline = Instant::now() + within;
        loop {
            if self.share.join(name).exists() {
                return Ok(());
            }
            let ended = self.child.exited();
            if ended.is_some() || Instant::now() >= deadline {
                return Err(PeerError::NotReady {
                    program: "guest".into(),
                    waited: within,
                    reason: format!(
                        "the guest's script did not make {name} ({})",
                        match ended {
                            Some(status) => format!("QEMU ended: {status}"),
                            None => "still running".into(),
                        }
                    ),
                    log: log_tail(&self.console, 40),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes a file into the share (an answer to the script).
    ///
    /// # Errors
    /// The write failed.
    pub fn write_file(&self, name: &str, contents: &[u8]) -> Result<(), PeerError> {
        fs::write(self.share.join(name), contents)
            .map_err(|e| PeerError::io(format!("writing {name} into the share"), e))
    }

    /// Waits for the guest to power off, at most what remains of its limit
    /// (then QEMU is killed), and collects what it left.
    ///
    /// # Errors
    /// Reading what it left failed.
    pub fn wait(mut self) -> Result<GuestRun, PeerError> {
        let left = self.limit.saturating_sub(self.started.elapsed());
        let ended = super::process::wait_until(&mut self.child.0, left)
            .map_err(|e| PeerError::io("waiting for QEMU", e))?;
        let timed_out = ended.is_none();
        if timed_out {
            let _ = self.child.0.kill();
            let _ = self.child.0.wait();
        }
        let read = |p: &Path| {
            fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let status_text = read(&self.status);
        let exit = status_text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("unifab-guest-exit ")
                .and_then(|n| n.trim().parse().ok())
        });
        // The share goes with the guest: keep its files.
        let mut files = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.share) {
            for entry in entries.flatten() {
                if let Ok(contents) = fs::read(entry.path()) {
                    files.push((entry.file_name().to_string_lossy().into_owned(), contents));
                }
            }
        }
        Ok(GuestRun {
            exit,
            timed_out,
            elapsed: self.started.elapsed(),
            console: read(&self.console),
            dmesg: read(&self.share.join("dmesg.txt")),
            qemu_log: read(&self.qemu_log),
            files,
        })
    }
}

/// What a finished guest left.
#[derive(Debug, Clone)]
pub struct GuestRun {
    /// The script's exit status, as the guest reported it on its second
    /// serial port; `None` when it never reported (hung, panicked, killed).
    pub exit: Option<i32>,
    /// The guest ran past its limit and was killed.
    pub timed_out: bool,
    /// Boot to power-off.
    pub elapsed: Duration,
    /// The first serial port: the kernel's boot messages and the script's
    /// output.
    pub console: String,
    /// The guest kernel's log after the script.
    pub dmesg: String,
    /// QEMU's own output.
    pub qemu_log: String,
    /// The files in the share when the guest ended (name, contents).
    pub files: Vec<(String, Vec<u8>)>,
}

impl GuestRun {
    /// `Ok` when the script exited 0; otherwise an error carrying the
    /// console's and the kernel log's ends.
    ///
    /// # Errors
    /// The script failed, the guest never reported, or it timed out.
    pub fn success(&self) -> Result<&GuestRun, String> {
        if self.exit == Some(0) {
            return Ok(self);
        }
        Err(format!(
            "guest {} after {:.0?}\n---- console (end)\n{}\n---- dmesg (end)\n{}\n---- qemu\n{}",
            match (self.exit, self.timed_out) {
                (_, true) => "ran past its limit and was killed".to_owned(),
                (Some(rc), _) => format!("script exited {rc}"),
                (None, false) => "ended without reporting its script's status".to_owned(),
            },
            self.elapsed,
            super::process::tail(&self.console, 60),
            super::process::tail(&self.dmesg, 30),
            super::process::tail(&self.qemu_log, 10),
        ))
    }

    /// A file the script left in the share.
    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.as_slice())
    }
}
