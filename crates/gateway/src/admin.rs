//! The operator endpoint: `GET /show/<what>` with JSON (what `unifab
//! show …` prints) and `GET /metrics` in the OpenMetrics text format, on
//! loopback TCP and on the admin socket, which alone takes changes
//! (`POST /reload`). The HTTP is hyper's (the `http` module); this module holds
//! what the views and metrics say.

mod http;
pub mod metrics;
pub mod rates;
pub mod view;

pub use http::{AdminToken, Reloader, bind_unix, fetch, post_unix, serve, serve_unix};

use prometheus_client::metrics::MetricType;
use unifab_iscsi::target::server::PortalStats;

use metrics::{Family, Value};

/// The gateway-wide families: the iSCSI portals' counters (`stats`, zero
/// without a portal), the live sessions, the runtime's workers.
pub fn gateway_families(stats: PortalStats, sessions: usize) -> Vec<(Family, MetricType)> {
    let c = |name: &'static str, help: &'static str, v: u64| {
        metrics::counter(Family::new(name, help).with(vec![], Value::Counter(v)))
    };
    let mut v = vec![
        c(
            "unifab_iscsi_connections",
            "TCP connections accepted on iSCSI portals.",
            stats.connections,
        ),
        c(
            "unifab_iscsi_logins",
            "iSCSI logins that reached full-feature phase.",
            stats.logins,
        ),
        c(
            "unifab_iscsi_login_failures",
            "iSCSI logins refused (authentication, authorization, protocol, time-out, resources).",
            stats.login_failures,
        ),
        c(
            "unifab_scsi_commands",
            "SCSI commands run by iSCSI sessions.",
            stats.commands,
        ),
        metrics::gauge(
            Family::new(
                "unifab_iscsi_sessions",
                "iSCSI sessions in full-feature phase.",
            )
            .with(vec![], Value::Gauge(sessions as i64)),
        ),
    ];
    // `[tuning] worker_threads`, or one per core.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        v.push(metrics::gauge(
            Family::new(
                "unifab_runtime_workers",
                "Threads running the gateway's tasks.",
            )
            .with(vec![], Value::Gauge(rt.metrics().num_workers() as i64)),
        ));
    }
    v
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
    "cluster",
    "interface",
];

/// The per-LU families (`unifab_lu_*`, label `lu`): commands, bytes read
/// and written, commands not ended GOOD, and the latency histogram.
pub fn lu_families(
    lus: &[(String, unifab_scsi_core::stats::LuStatsSnapshot)],
) -> Vec<(Family, MetricType)> {
    use unifab_scsi_core::stats::LATENCY_BOUNDS_US;
    type Get = fn(&unifab_scsi_core::stats::LuStatsSnapshot) -> u64;
    let counters: [(&str, &'static str, Get); 4] = [
        ("unifab_lu_commands", "Commands the LU ended.", |t| {
            t.commands
        }),
        (
            "unifab_lu_read_bytes",
            "Data-in bytes the LU returned.",
            |t| t.read_bytes,
        ),
        (
            "unifab_lu_written_bytes",
            "Data-out bytes of commands that ended GOOD.",
            |t| t.written_bytes,
        ),
        (
            "unifab_lu_errors",
            "Commands that ended with a status other than GOOD, or aborted.",
            |t| t.errors,
        ),
    ];
    let mut v = Vec::new();
    for (name, help, get) in counters {
        let mut f = Family::new(name, help);
        for (lu, t) in lus {
            f = f.with(vec![("lu", lu.clone())], Value::Counter(get(t)));
        }
        v.push(metrics::counter(f));
    }
    let mut f = Family::new(
        "unifab_lu_latency_seconds",
        "Time from a command's arrival at the LU to its end.",
    );
    for (lu, t) in lus {
        let buckets = t
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let le = LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(f64::MAX, |us| *us as f64 / 1e6);
                (le, *n)
            })
            .collect();
        f = f.with(
            vec![("lu", lu.clone())],
            Value::Histogram {
                sum: t.latency_ns as f64 / 1e9,
                count: t.commands,
                buckets,
            },
        );
    }
    v.push(metrics::histogram(f));
    v
}

/// The per-LU backend families (label `lu`), for LUs whose backend counts
/// its operations (an RBD image): operations in flight, completed, and the
/// time they took (`…_latency_microseconds` over `…_operations` is the
/// mean latency; a float counter in seconds the encoder does not have).
pub fn lu_backend_families(
    lus: &[(String, unifab_scsi_core::backend::BackendIoStats)],
) -> Vec<(Family, MetricType)> {
    let mut in_flight = Family::new(
        "unifab_lu_backend_in_flight",
        "Backend operations submitted and not yet completed.",
    );
    let mut ops = Family::new(
        "unifab_lu_backend_operations",
        "Backend operations completed.",
    );
    let mut secs = Family::new(
        "unifab_lu_backend_latency_microseconds",
        "Time completed backend operations took, submission to completion, in microseconds.",
    );
    for (lu, t) in lus {
        let l = || vec![("lu", lu.clone())];
        in_flight = in_flight.with(l(), Value::Gauge(t.in_flight as i64));
        ops = ops.with(l(), Value::Counter(t.completed));
        secs = secs.with(l(), Value::Counter(t.latency_us_total));
    }
    vec![
        metrics::gauge(in_flight),
        metrics::counter(ops),
        metrics::counter(secs),
    ]
}

/// Where each LU's plain writes run (`unifab_lu_write_path`, labels `lu`
/// and `path`): 1 on the LU's current path, 0 on the others, so that an
/// alert can ask for the LUs whose writes all take the I/O threads (a file
/// LU on ext4) or whose file system stopped taking no-wait writes.
pub fn lu_write_path_families(
    lus: &[(String, unifab_scsi_core::backend::WritePath)],
) -> Vec<(Family, MetricType)> {
    use unifab_scsi_core::backend::WritePath;
    let mut path = Family::new(
        "unifab_lu_write_path",
        "Where the LU's plain writes run: inline, no-wait, no-wait backing off, io threads or async (1 on the current one).",
    );
    for (lu, now) in lus {
        for p in WritePath::ALL {
            path = path.with(
                vec![("lu", lu.clone()), ("path", p.name().to_string())],
                Value::Gauge(i64::from(p == *now)),
            );
        }
    }
    vec![metrics::gauge(path)]
}

/// The interface families (`show interface`'s counters, all counters):
/// fabric ports (`unifab_fabric_port_*`, label `port`), FCoE ports
/// (`unifab_fcoe_port_*`, labels `interface` and `mode`) and FCIP circuits
/// (`unifab_fcip_circuit_*`, label `circuit`). Every family's HELP and TYPE
/// lines are there even when no such port is.
pub fn interface_families(ifs: &[view::Interface]) -> Vec<(Family, MetricType)> {
    /// (kind prefix, family prefix, label, counters with their help)
    type Kind = (
        &'static str,
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
    );
    let kinds: [Kind; 3] = [
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
    let mut v = Vec::new();
    for (kind, prefix, label_name, counters) in kinds {
        for (counter, help) in counters {
            let mut f = Family::new(format!("{prefix}_{counter}"), help);
            for i in ifs.iter().filter(|i| i.kind.starts_with(kind)) {
                let Some((_, n)) = i.counters.iter().find(|(c, _)| c == counter) else {
                    continue;
                };
                let mut labels = vec![(label_name, i.name.clone())];
                if let Some(mode) = i
                    .kind
                    .strip_prefix("fcoe (")
                    .and_then(|m| m.strip_suffix(')'))
                {
                    labels.push(("mode", mode.to_string()));
                }
                f = f.with(labels, Value::Counter(*n));
            }
            v.push(metrics::counter(f));
        }
    }
    v
}

/// What the admin endpoint can show; implemented by the running gateway.
pub trait AdminView: Send + Sync + 'static {
    /// JSON for `/show/<what>`, or why there is none.
    fn show(&self, what: &str) -> Result<String, Unshown>;
    /// `/metrics` in the OpenMetrics text format ([`metrics::encode`]).
    fn metrics(&self) -> String;
}
