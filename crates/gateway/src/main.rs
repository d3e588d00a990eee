//! `unifab`: the storage gateway's command line.
//!
//! - `unifab run [--config FILE]`: serve (the embedded default without a file).
//! - `unifab check --config FILE`: validate a configuration, start nothing.
//! - `unifab reload [--dry-run]`: apply a running gateway's changed file.
//! - `unifab show sessions|luns|remotes|metrics|flogi|fcns|zones|fcoe|fcip [--admin ADDR]`: the operator's view of a
//!   running gateway.
//! - `unifab pcap-check FILE`: re-emit every frame of a capture and report any
//!   that does not round-trip byte for byte.
//! - `unifab iscsi discover HOST[:PORT]`: list a portal's targets and LUNs.
//! - `unifab bench URL`: a verifying load generator over unifab's initiator.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use unifab::config::{self, Config};

#[derive(Parser, Debug)]
#[command(
    name = "unifab",
    version,
    about = "unifab storage gateway (iSCSI, FC, FCoE, FCIP)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway. Without --config: a sparse 1 GiB file LU in
    /// ./unifab-data/, LUN 0 of iqn.2026-11.io.unifab:default on 127.0.0.1:3260.
    Run {
        /// TOML configuration file.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Check a configuration file and exit: every error with its file and
    /// line (status 1), a warning for secrets others can read.
    Check {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Reload a running gateway's configuration file: apply what can
    /// change live, name what needs a restart (SIGHUP does the same).
    Reload {
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// The gateway's admin socket (default: `admin.sock` in the
        /// `[admin] data_dir` of --config, else ./unifab-data/admin.sock).
        #[arg(long, env = "UNIFAB_ADMIN_SOCKET")]
        socket: Option<PathBuf>,
        /// The gateway's configuration file, to find its admin socket.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Seconds to wait for the gateway's answer: a reload is answered
        /// when it ends, and opening an RBD image may wait
        /// `ceph_lock_timeout` (45 s) for a lock, per LU.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Show the state of a running gateway.
    Show {
        /// sessions | luns | remotes | targets | metrics | flogi | fcns | zones | fcoe | fcip | interface
        what: String,
        /// With `interface`: one interface (`iscsi`, `fc1`, `fcip0/1`, …).
        name: Option<String>,
        /// The running gateway's admin endpoint.
        #[arg(long, env = "UNIFAB_ADMIN", default_value = config::DEFAULT_ADMIN)]
        admin: SocketAddr,
        /// The endpoint's `[admin] token`, when it has one.
        #[arg(long, env = "UNIFAB_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Parse every frame of a capture, re-emit it, and report each frame that
    /// does not round-trip byte for byte (exit status 1 if any).
    PcapCheck {
        /// A pcap or pcapng file.
        file: PathBuf,
        /// List every checked PDU or frame, not only the failures.
        #[arg(long, short)]
        verbose: bool,
    },
    /// iSCSI initiator tools.
    Iscsi {
        #[command(subcommand)]
        command: IscsiCommand,
    },
    /// A verifying load generator: random or sequential reads and writes
    /// through unifab's iSCSI initiator, every read checked.
    Bench(unifab::cli::bench::BenchArgs),
    /// Print a shell completion script (e.g. `unifab completions bash >
    /// /etc/bash_completion.d/unifab`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, unifab(1), in roff (`unifab manpage | man -l -`).
    Manpage,
}

#[derive(Subcommand, Debug)]
enum IscsiCommand {
    /// SendTargets discovery at a portal, then the LUNs of each target.
    Discover(unifab::cli::discover::DiscoverArgs),
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log file or journald gets plain
    // `key=value` text that grep and log shippers can read.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

/// Keeps large buffers (1 MiB reads and writes) on the heap instead of
/// fresh mmaps: every mmap/munmap pair costs page faults, zeroing and TLB
/// shootdowns across the runtime's threads, which halved 1 MiB throughput.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc malloc tunables; called once at
    // start, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    init_tracing();
    // `run` reads its configuration first: it sizes the runtime.
    let config = match &cli.command {
        Command::Run { config: Some(path) } => match Config::load(path) {
            Ok(cfg) => Some(cfg),
            Err(e) => {
                eprintln!("unifab: {e}");
                return ExitCode::FAILURE;
            }
        },
        Command::Run { config: None } => Some(Config::embedded_default()),
        _ => None,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.as_ref().and_then(|c| c.tuning.worker_threads) {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("unifab: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Run { config: path } => match config {
                Some(cfg) => unifab::run::run_from(cfg, path).await,
                None => Err(anyhow::anyhow!("no configuration")),
            },
            Command::Show {
                what,
                name,
                admin,
                token,
                json,
            } => {
                unifab::cli::show::show(&what, name.as_deref(), admin, token.as_deref(), json).await
            }
            Command::Reload {
                dry_run,
                socket,
                config,
                timeout,
            } => {
                let socket = match (socket, config) {
                    (Some(s), _) => s,
                    (None, Some(c)) => Config::load(&c)?
                        .admin
                        .data_dir
                        .join(unifab::run::ADMIN_SOCKET),
                    (None, None) => {
                        PathBuf::from(config::DEFAULT_DATA_DIR).join(unifab::run::ADMIN_SOCKET)
                    }
                };
                let path = if dry_run {
                    "/reload?dry_run=1"
                } else {
                    "/reload"
                };
                let wait = std::time::Duration::from_secs(timeout.max(1));
                let body = unifab::admin::post_unix(&socket, path, wait)
                    .await
                    .map_err(anyhow::Error::msg)?;
                unifab::out!("{body}");
                Ok(ExitCode::SUCCESS)
            }
            Command::Completions { shell } => {
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut Cli::command(), "unifab", &mut out);
                unifab::out!("{}", String::from_utf8_lossy(&out));
                Ok(ExitCode::SUCCESS)
            }
            Command::Manpage => {
                let mut out = Vec::new();
                clap_mangen::Man::new(Cli::command()).render(&mut out)?;
                unifab::out!("{}", String::from_utf8_lossy(&out));
                Ok(ExitCode::SUCCESS)
            }
            Command::Check { config } => {
                Config::load(&config)?;
                unifab::outln!("{}: ok", config.display());
                Ok(ExitCode::SUCCESS)
            }
            Command::PcapCheck { file, verbose } => pcap_check(&file, verbose),
            Command::Iscsi {
                command: IscsiCommand::Discover(args),
            } => unifab::cli::discover::run(args).await,
            Command::Bench(args) => unifab::cli::bench::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("unifab: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn pcap_check(file: &std::path::Path, verbose: bool) -> anyhow::Result<ExitCode> {
    use unifab_capture::check::{Protocol, Verdict};
    let report = unifab_capture::check::pcap_check(file)?;
    if verbose {
        for e in &report.entries {
            if e.verdict == Verdict::Ok {
                unifab::outln!("frame {}: {:?} {}: ok", e.frame, e.protocol, e.what);
            }
        }
    }
    unifab::outln!("{report}");
    let failed = [
        Protocol::Iscsi,
        Protocol::Fc,
        Protocol::Fcoe,
        Protocol::Fip,
        Protocol::Fcip,
    ]
    .iter()
    .map(|p| report.failures(*p).len())
    .sum::<usize>();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
