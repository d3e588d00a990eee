//! A throwaway one-node Ceph cluster (`scripts/ceph.sh`) for the `rbd:`
//! backend's tests and benchmark: one monitor, one OSD, pool `rbd`, all in
//! a temporary directory, stopped on drop. Every step is bounded.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{display_command, find_program, run_with_limit};
use super::{PeerError, workspace_root};

/// Where the OSD keeps its objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectStore {
    /// In RAM: fast, lost when the OSD dies.
    Memstore,
    /// In a sparse file: survives killing and restarting the OSD.
    Bluestore,
}

/// A running cluster.
#[derive(Debug)]
pub struct Ceph {
    dir: tempfile::TempDir,
    script: PathBuf,
}

/// The whole start (monitor, OSD, pool) may take this long.
const UP_LIMIT: Duration = Duration::from_secs(90);

impl Ceph {
    /// Starts a cluster. Fails with the reason (a missing package, a daemon
    /// that would not start, with its log) rather than skipping.
    pub fn start(store: ObjectStore) -> Result<Ceph, PeerError> {
        for (program, package) in [
            ("ceph-mon", "ceph-mon"),
            ("ceph-osd", "ceph-osd"),
            ("ceph", "ceph-common"),
            ("rbd", "ceph-common"),
        ] {
            find_program(program, package)?;
        }
        let dir = tempfile::Builder::new()
            .prefix("unifab-ceph-")
            .tempdir()
            .map_err(|e| PeerError::io("creating the cluster's directory", e))?;
        let ceph = Ceph {
            dir,
            script: workspace_root().join("scripts").join("ceph.sh"),
        };
        let store = match store {
            ObjectStore::Memstore => "memstore",
            ObjectStore::Bluestore => "bluestore",
        };
        ceph.script_cmd("up", &[("OBJECTSTORE", store)], UP_LIMIT)?;
        Ok(ceph)
    }

    fn script_cmd(
        &self,
        what: &str,
        env: &[(&str, &str)],
        limit: Duration,
    ) -> Result<String, PeerError> {
        let mut cmd = Command::new("bash");
        cmd.arg(&self.script).arg(what).arg(self.dir.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let shown = format!("bash scripts/ceph.sh {what} {}", self.dir.path().display());
        let done = run_with_limit(&mut cmd, &shown, limit)?;
        match done.status {
            Some(s) if s.success() => Ok(done.stdout),
            Some(status) => Err(PeerError::CommandFailed {
                command: shown,
                status,
                output: format!("{}{}", done.stdout, done.stderr),
            }),
            None => Err(PeerError::io(
                shown,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("ran past {limit:?}: {}{}", done.stdout, done.stderr),
                ),
            )),
        }
    }

    /// The cluster's ceph.conf (it names the client.admin keyring).
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("ceph.conf")
    }

    /// The cluster's directory (logs under `log/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs the OSD.
    pub fn kill_osd(&self) -> Result<(), PeerError> {
        self.script_cmd("osd-kill", &[], Duration::from_secs(20))
            .map(drop)
    }

    /// Starts the OSD again and waits until the monitor has it up.
    pub fn start_osd(&self) -> Result<(), PeerError> {
        self.script_cmd("osd-start", &[], UP_LIMIT).map(drop)
    }

    /// Runs `rbd ARGS` against the cluster (bounded to 60 s).
    pub fn rbd(&self, args: &[&str]) -> Result<String, PeerError> {
        self.tool("rbd", args)
    }

    /// Runs `ceph ARGS` against the cluster (bounded to 60 s).
    pub fn ceph(&self, args: &[&str]) -> Result<String, PeerError> {
        self.tool("ceph", args)
    }

    fn tool(&self, program: &str, args: &[&str]) -> Result<String, PeerError> {
        let bin = find_program(program, "ceph-common")?;
        let conf = self.conf();
        let mut full: Vec<&str> = vec!["-c", conf.to_str().unwrap_or_default()];
        full.extend_from_slice(args);
        let shown = display_command(&bin, &full);
        let mut cmd = Command::new(&bin);
        cmd.args(&full);
        let done = run_with_limit(&mut cmd, &shown, Duration::from_secs(60))?;
        match done.status {
            Some(s) if s.success() => Ok(done.stdout),
            status => Err(PeerError::io(
                shown,
                std::io::Error::other(format!(
                    "{}: {}{}",
                    status.map_or("ran past 60 s".to_owned(), |s| s.to_string()),
                    done.stdout,
                    done.stderr
                )),
            )),
        }
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        if let Err(e) = self.script_cmd("down", &[], Duration::from_secs(40)) {
            eprintln!("stopping the test Ceph cluster: {e}");
        }
    }
}
