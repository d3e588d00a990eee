//! Launchers for the real peers that integration tests and benchmarks talk to.
//!
//! Every peer here is a Debian package, run as an ordinary user-space process
//! on loopback:
//!
//! | launcher | program | Debian package |
//! |---|---|---|
//! | [`Tgtd`] | `tgtd`, `tgtadm` | `tgt` |
//! | [`IscsiTestCu`] | `iscsi-test-cu` | `libiscsi-bin` |
//! | [`Unifab`] | `unifab` (this workspace, release build) | — |
//! | [`Etcd`] | `etcd` | `etcd-server` |
//! | [`Guest`] | a Linux kernel under `qemu-system-x86_64` (image: `scripts/vm-image.sh`) | `qemu-system-x86`, `debootstrap` |
//!
//! A missing program is an error that names the package to install
//! ([`PeerError::MissingProgram`]); nothing here skips itself quietly.
//! `scripts/setup.sh` installs every package.
//!
//! The conformance ratchet ([`ratchet`]) compares a [`SuiteResult`] with a
//! checked-in list of tests that must pass (`conformance/<suite>.pass`).
//!
//! # Writing a conformance test against a target
//!
//! ```no_run
//! use unifab_testkit::peers::{IscsiTestCu, PassList, Unifab};
//!
//! let dir = tempfile::tempdir_in("/dev/shm")?;
//! let unifab = Unifab::builder().file_lu(dir.path().join("lu0.img"), 1 << 30).start()?;
//! let result = IscsiTestCu::new(unifab.url()).multipath_url(unifab.url()).run()?;
//! result.record("unifab")?; // target/conformance/unifab.{txt,console}
//! let list = PassList::load(unifab_testkit::peers::conformance_dir().join("unifab.pass"))?;
//! list.check(&result).map_err(|failure| failure.to_string())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod ceph;
mod etcd;
mod iscsi_test_cu;
mod net;
mod process;
pub mod ratchet;
mod tgtd;
mod unifab;
mod vm;

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

pub use ceph::{Ceph, ObjectStore};
pub use etcd::Etcd;
pub use iscsi_test_cu::{
    IscsiTestCu, Outcome, ParsedConsole, RunSummary, SuiteResult, TestResult, list_tests,
    parse_console, suites_except,
};
pub use net::{free_tcp_port, free_tcp_ports, wait_for_port};
pub use process::find_program;
pub use ratchet::{Broken, PassList, RatchetFailure, RatchetReport, assert_run_passes};
pub use tgtd::{Chap, Digest, Tgtd, TgtdBuilder};
pub use unifab::{UNIFAB_DEFAULT_IQN, Unifab, UnifabBuilder, unifab_bin};
pub use vm::{Guest, GuestBuilder, GuestImage, GuestRun, HOST_FROM_GUEST};

/// Why a peer could not be started, driven or understood.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The program is not installed (or not on `PATH`, `/usr/sbin`, `/sbin`).
    #[error(
        "`{program}` not found on PATH, /usr/sbin or /sbin: install the Debian package \
         `{package}` (bash scripts/setup.sh installs every peer)"
    )]
    MissingProgram {
        /// The program that was looked for.
        program: String,
        /// The Debian package that ships it.
        package: String,
    },
    /// The unifab binary does not exist where it was looked for.
    #[error(
        "unifab binary not found at {path}: build it with `cargo build --release -p unifab` \
         or point UNIFAB_BIN at it"
    )]
    MissingUnifab {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The program could not be spawned.
    #[error("could not start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}):\n{output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed (stdout and stderr).
        output: String,
    },
    /// A daemon exited on its own while it was being started or used.
    #[error("`{program}` exited unexpectedly ({status}); its log:\n{log}")]
    Exited {
        /// The program.
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// A daemon did not become ready in time.
    #[error("`{program}` was not ready after {waited:?}: {reason}; its log:\n{log}")]
    NotReady {
        /// The program.
        program: String,
        /// How long it was waited for.
        waited: Duration,
        /// What was being waited for.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// Nothing accepted TCP connections on an address in time.
    #[error("nothing accepted TCP connections on {addr} within {waited:?}")]
    PortTimeout {
        /// The address.
        addr: std::net::SocketAddr,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A test program ran past its time limit and was killed.
    #[error(
        "`{command}` did not finish within {limit:?} and was killed; its output so far:\n{output}"
    )]
    Timeout {
        /// The command line.
        command: String,
        /// The limit.
        limit: Duration,
        /// The end of its output.
        output: String,
    },
    /// A test program's output could not be understood.
    #[error("could not understand the output of `{command}`: {reason}")]
    Unparsable {
        /// The command line.
        command: String,
        /// What did not fit.
        reason: String,
    },
    /// Another I/O error (temporary files, logs).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl PeerError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        PeerError::Io {
            context: context.into(),
            source,
        }
    }
}

/// The workspace's root directory (where `Cargo.lock` and `conformance/` are).
pub fn workspace_root() -> PathBuf {
    // crates/testkit → ../..
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(|crates| crates.parent())
        .map(PathBuf::from)
        .unwrap_or(manifest)
}

/// The checked-in conformance lists: `<workspace>/conformance`.
pub fn conformance_dir() -> PathBuf {
    workspace_root().join("conformance")
}
