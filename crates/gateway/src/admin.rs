//! The operator endpoint: `GET /show/<what>` with JSON (what `unifab
//! show …` prints) and `GET /metrics` in the Prometheus text format, on
//! loopback TCP and on the admin socket, which alone takes changes
//! (`POST /reload`). The HTTP is hyper's ([`http`]); this module holds
//! what the views and metrics say.

mod http;
pub mod rates;
pub mod view;

pub use http::{Reloader, bind_unix, fetch, post_unix, serve, serve_unix};

use unifab_iscsi::target::server::PortalStats;

/// The gateway-wide part of `/metrics` in the Prometheus text format: the
/// iSCSI portals' counters (`stats`, zero without a portal), the live
/// sessions, the runtime's workers.
pub fn render_metrics(stats: PortalStats, sessions: usize) -> String {
    let mut s = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        s.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    };
    counter(
        "unifab_iscsi_connections_total",
        "TCP connections accepted on iSCSI portals.",
        stats.connections,
    );
    counter(
        "unifab_iscsi_logins_total",
        "iSCSI logins that reached full-feature phase.",
        stats.logins,
    );
    counter(
        "unifab_iscsi_login_failures_total",
        "iSCSI logins refused (authentication, authorization, protocol, time-out, resources).",
        stats.login_failures,
    );
    counter(
        "unifab_scsi_commands_total",
        "SCSI commands run by iSCSI sessions.",
        stats.commands,
    );
    s.push_str(&format!(
        "# HELP unifab_iscsi_sessions iSCSI sessions in full-feature phase.\n# TYPE unifab_iscsi_sessions gauge\nunifab_iscsi_sessions {sessions}\n"
    ));
    // `[tuning] worker_threads`, or one per core.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        s.push_str(&format!(
            "# HELP unifab_runtime_workers Threads running the gateway's tasks.\n# TYPE unifab_runtime_workers gauge\nunifab_runtime_workers {}\n",
            rt.metrics().num_workers()
        ));
    }
    s
}

/// Why `/show/<what>` has nothing to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unshown {
    /// No view has that name (404).
    NoSuchView,
    /// The view exists, but the part of the gateway it shows is not
    /// configured: the section to add (409).
    NotConfigured(&'static str),
}

/// The views `/show/<what>` knows.
pub const VIEWS: &[&str] = &[
    "sessions",
    "luns",
    "remotes",
    "targets",
    "flogi",
    "fcns",
    "zones",
    "fcoe",
    "fcip",
    "interface",
];

/// A label value in the Prometheus text format: backslash, double quote
/// and line feed escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The per-LU families (`unifab_lu_*`, label `lu`): commands, bytes read
/// and written, commands not ended GOOD, and the latency histogram.
pub fn render_lu_metrics(lus: &[(String, unifab_scsi_core::stats::LuStatsSnapshot)]) -> String {
    use unifab_scsi_core::stats::LATENCY_BOUNDS_US;
    let mut s = String::new();
    type Get = fn(&unifab_scsi_core::stats::LuStatsSnapshot) -> u64;
    let counters: [(&str, &str, Get); 4] = [
        ("unifab_lu_commands_total", "Commands the LU ended.", |t| {
            t.commands
        }),
        (
            "unifab_lu_read_bytes_total",
            "Data-in bytes the LU returned.",
            |t| t.read_bytes,
        ),
        (
            "unifab_lu_written_bytes_total",
            "Data-out bytes of commands that ended GOOD.",
            |t| t.written_bytes,
        ),
        (
            "unifab_lu_errors_total",
            "Commands that ended with a status other than GOOD, or aborted.",
            |t| t.errors,
        ),
    ];
    for (name, help, get) in counters {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (lu, t) in lus {
            s.push_str(&format!("{name}{{lu=\"{}\"}} {}\n", label(lu), get(t)));
        }
    }
    let name = "unifab_lu_latency_seconds";
    s.push_str(&format!(
        "# HELP {name} Time from a command's arrival at the LU to its end.\n# TYPE {name} histogram\n"
    ));
    for (lu, t) in lus {
        let lu = label(lu);
        let mut cumulative = 0;
        for (i, n) in t.buckets.iter().enumerate() {
            cumulative += n;
            let le = match LATENCY_BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            s.push_str(&format!(
                "{name}_bucket{{lu=\"{lu}\",le=\"{le}\"}} {cumulative}\n"
            ));
        }
        s.push_str(&format!(
            "{name}_sum{{lu=\"{lu}\"}} {}\n",
            t.latency_ns as f64 / 1e9
        ));
        s.push_str(&format!("{name}_count{{lu=\"{lu}\"}} {}\n", t.commands));
    }
    s
}

/// The interface families (`show interface`'s counters, all counters):
/// fabric ports (`unifab_fabric_port_*`, label `port`), FCoE ports
/// (`unifab_fcoe_port_*`, labels `interface` and `mode`) and FCIP circuits
/// (`unifab_fcip_circuit_*`, label `circuit`). Every family's HELP and TYPE
/// lines are there even when no such port is.
pub fn render_interface_metrics(ifs: &[view::Interface]) -> String {
    /// (kind prefix, family prefix, label, counters with their help)
    type Family<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);
    let families: [Family<'_>; 3] = [
        (
            "fabric port",
            "unifab_fabric_port",
            "port",
            &[
                ("rx_frames", "Frames the switch received on the port."),
                ("tx_frames", "Frames the switch sent on the port."),
                ("rx_bytes", "Payload bytes received on the port."),
                ("tx_bytes", "Payload bytes sent on the port."),
                (
                    "discards",
                    "Frames dropped: zoning, no such address, spoofed S_ID.",
                ),
            ],
        ),
        (
            "fcoe",
            "unifab_fcoe_port",
            "interface",
            &[
                ("rx_frames", "FCoE frames received."),
                ("tx_frames", "FCoE frames sent."),
                (
                    "spoofed",
                    "FCoE frames from a MAC address that did not log in (FCF).",
                ),
                (
                    "keep_alive_misses",
                    "VN_Ports whose keep-alives stopped (FCF).",
                ),
                ("discards", "FCoE frames dropped (ENode)."),
            ],
        ),
        (
            "fcip circuit",
            "unifab_fcip_circuit",
            "circuit",
            &[
                ("rx_bytes", "Bytes received on the circuit."),
                ("tx_bytes", "Bytes sent on the circuit."),
                (
                    "retransmits",
                    "Batches resent from the circuit after it died.",
                ),
                ("failures", "Times the circuit went down."),
            ],
        ),
    ];
    let mut s = String::new();
    for (kind, prefix, label_name, counters) in families {
        for (counter, help) in counters {
            let name = format!("{prefix}_{counter}_total");
            s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for i in ifs.iter().filter(|i| i.kind.starts_with(kind)) {
                let Some((_, v)) = i.counters.iter().find(|(c, _)| c == counter) else {
                    continue;
                };
                let mode = i
                    .kind
                    .strip_prefix("fcoe (")
                    .and_then(|m| m.strip_suffix(')'))
                    .map(|m| format!(",mode=\"{m}\""))
                    .unwrap_or_default();
                s.push_str(&format!(
                    "{name}{{{label_name}=\"{}\"{mode}}} {v}\n",
                    label(&i.name)
                ));
            }
        }
    }
    s
}

/// What the admin endpoint can show; implemented by the running gateway.
pub trait AdminView: Send + Sync + 'static {
    /// JSON for `/show/<what>`, or why there is none.
    fn show(&self, what: &str) -> Result<String, Unshown>;
    /// Prometheus text for `/metrics`.
    fn metrics(&self) -> String;
}
