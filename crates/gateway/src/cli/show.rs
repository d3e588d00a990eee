//! `unifab show …`: the operator's view of a running gateway, in the spirit
//! of a SAN switch CLI, fetched from its admin endpoint.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::anyhow;
use serde_json::Value;

use crate::admin;

/// Prints one view (`name`: one interface of `show interface`).
pub async fn show(
    what: &str,
    name: Option<&str>,
    admin_addr: SocketAddr,
    token: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if what == "metrics" {
        let text = admin::fetch(admin_addr, "/metrics", token)
            .await
            .map_err(|e| anyhow!(e))?;
        crate::out!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let path = match name {
        Some(n) => format!("/show/{what}/{n}"),
        None => format!("/show/{what}"),
    };
    let body = admin::fetch(admin_addr, &path, token)
        .await
        .map_err(|e| anyhow!(e))?;
    if json {
        crate::outln!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Value> = serde_json::from_str(&body)
        .map_err(|e| anyhow!("the gateway answered something that is not JSON: {e}"))?;
    if what == "interface" {
        crate::out!("{}", interfaces(&rows));
        return Ok(ExitCode::SUCCESS);
    }
    let columns: &[&str] = match what {
        "sessions" => &[
            "target",
            "initiator",
            "isid",
            "tsih",
            "peer",
            "digests",
            "commands",
        ],
        "luns" => &[
            "name",
            "backend",
            "block_size",
            "blocks",
            "bytes",
            "naa",
            "state",
            "write path",
            "in flight",
            "latency us",
        ],
        "remotes" => &[
            "lu",
            "remote",
            "initiator",
            "isid",
            "state",
            "path",
            "zoning",
            "for",
            "logins",
            "digests",
            "commands",
            "last error",
        ],
        "flogi" => &["interface", "vlan", "fcid", "port name", "node name", "mac"],
        "cluster" => &[
            "member",
            "state",
            "admin",
            "relative port",
            "lease",
            "etcd us",
            "fenced",
            "last error",
        ],
        "fcoe" => &[
            "interface",
            "mode",
            "link",
            "vlan",
            "vn_ports",
            "rx_fcoe",
            "tx_fcoe",
            "spoofed",
            "malformed_fip",
        ],
        "fcns" => &[
            "fcid",
            "type",
            "pwwn",
            "nwwn",
            "fc4-type:feature",
            "symbolic name",
        ],
        "zones" => &["zoneset", "zone", "member", "active"],
        "targets" => &["target", "portals", "lun", "lu", "backend", "acl", "chap"],
        "fcip" => &[
            "tunnel",
            "circuit",
            "state",
            "peer",
            "weight",
            "uptime",
            "tx MB/s",
            "rx MB/s",
            "comp",
            "retrans",
            "rtt us",
            "fastwrite",
            "tape",
            "tunnel state",
            "failures",
            "last error",
        ],
        _ => &[],
    };
    if what == "cluster" {
        // The members, then each clustered LU.
        let lus = admin::fetch(admin_addr, "/show/cluster-lus", token)
            .await
            .map_err(|e| anyhow!(e))?;
        let lus: Vec<Value> = serde_json::from_str(&lus)
            .map_err(|e| anyhow!("the gateway answered something that is not JSON: {e}"))?;
        crate::out!(
            "{}\n{}",
            table(columns, &rows),
            table(&["lu", "alua", "owner", "reservation"], &lus)
        );
        return Ok(ExitCode::SUCCESS);
    }
    crate::out!("{}", table(columns, &rows));
    Ok(ExitCode::SUCCESS)
}

/// `show interface` as NX-OS prints it: a block per interface, its
/// state, the rates over each load interval, then the counters.
pub fn interfaces(rows: &[Value]) -> String {
    let mut out = String::new();
    for r in rows {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
        out.push_str(&format!(
            "{} is {}, {}\n",
            s("interface"),
            s("state"),
            s("kind")
        ));
        let Some(m) = r.as_object() else { continue };
        let counters: Vec<&String> = m
            .keys()
            // Counters are integers; rates are not.
            .filter(|k| m.get(*k).is_some_and(Value::is_u64))
            .collect();
        // The gateway lists its load intervals, shortest first.
        let windows = m.get("load_intervals").and_then(Value::as_array);
        for w in windows.into_iter().flatten().filter_map(Value::as_str) {
            let rates: Vec<String> = counters
                .iter()
                .map(|c| {
                    let v = m.get(&format!("{c}_{w}")).and_then(Value::as_f64);
                    format!("{c} {}", v.map_or("-".into(), |x| format!("{x:.2}/s")))
                })
                .collect();
            out.push_str(&format!("  {w} rate: {}\n", rates.join(", ")));
        }
        let totals: Vec<String> = counters
            .iter()
            .map(|c| format!("{c} {}", m.get(*c).map_or("-".into(), Value::to_string)))
            .collect();
        out.push_str(&format!("  {}\n", totals.join(", ")));
    }
    out
}

/// A row's value for a table column. The gateway's JSON has snake_case
/// keys and typed values (`last_error` and `last_error_seconds`); a column
/// names its key with spaces (`last error`), and a few columns are made
/// for reading from several values (`for` from `seconds`, `last error`
/// with its age, `comp` from the algorithm and the ratio).
fn column_value(row: &Value, column: &str) -> Value {
    let num = |k: &str| row.get(k).and_then(Value::as_f64);
    let text = |k: &str| row.get(k).and_then(Value::as_str);
    let made = match column {
        "for" => num("seconds").map(|s| format!("{s:.1} s")),
        // A backend that counts its operations (RBD): in flight now, and
        // the mean time one took.
        "in flight" => num("backend_in_flight").map(|n| format!("{n:.0}")),
        "latency us" => num("backend_latency_us").map(|n| format!("{n:.0}")),
        "uptime" => num("uptime_seconds").map(|s| format!("{s:.0}s")),
        "tx MB/s" => num("tx_mb_per_s").map(|x| format!("{x:.2}")),
        "rx MB/s" => num("rx_mb_per_s").map(|x| format!("{x:.2}")),
        "last error" => text("last_error").map(|e| match num("last_error_seconds") {
            Some(age) => format!("{e} ({age:.1} s ago)"),
            None => e.to_string(),
        }),
        "comp" => text("compression").map(|c| match num("compression_ratio") {
            Some(r) => format!("{c} {r:.2}"),
            None => format!("{c} -"),
        }),
        "fastwrite" => row.get("fastwrite").and_then(Value::as_bool).map(|on| {
            match (on, row.get("fastwrite_writes")) {
                (true, Some(n)) => format!("on ({n})"),
                (true, None) => "on".into(),
                (false, _) => "off".into(),
            }
        }),
        "tape" => row
            .get("tape_pipelining")
            .and_then(Value::as_bool)
            .map(|on| {
                if on {
                    let n = |k: &str| row.get(k).and_then(Value::as_u64).unwrap_or(0);
                    format!(
                        "on ({} acc, {} deferred, {} ahead)",
                        n("tape_accelerated"),
                        n("tape_deferred_errors"),
                        n("tape_read_ahead_hits")
                    )
                } else {
                    "off".into()
                }
            }),
        _ => None,
    };
    if let Some(m) = made {
        return Value::String(m);
    }
    let key = match column {
        "retrans" => "retransmits".to_string(),
        "etcd us" => "etcd_latency_us".to_string(),
        "fc4-type:feature" => "fc4_type_feature".to_string(),
        c => c.replace(' ', "_"),
    };
    row.get(&key).cloned().unwrap_or(Value::Null)
}

/// Renders rows as an aligned text table with the given columns.
pub fn table(columns: &[&str], rows: &[Value]) -> String {
    let cell = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let mut widths: Vec<usize> = columns.iter().map(|c| c.len()).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(&column_value(r, c))).collect())
        .collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, items: Vec<String>| {
        let parts: Vec<String> = items
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:<w$}"))
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(
        &mut out,
        columns.iter().map(|c| c.to_ascii_uppercase()).collect(),
    );
    line(&mut out, widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in cells {
        line(&mut out, row);
    }
    out.push_str(&format!(
        "{} entr{}\n",
        rows.len(),
        if rows.len() == 1 { "y" } else { "ies" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let rows: Vec<Value> = serde_json::from_str(
            r#"[{"name":"vol0","bytes":1073741824},{"name":"a-much-longer-name","bytes":5}]"#,
        )
        .unwrap();
        let t = table(&["name", "bytes"], &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "NAME                BYTES");
        assert_eq!(lines[2], "vol0                1073741824");
        assert_eq!(lines[3], "a-much-longer-name  5");
        assert_eq!(lines[4], "2 entries");
    }

    #[test]
    fn columns_read_typed_snake_case_values() {
        let row: Value = serde_json::json!({
            "lu": "a", "seconds": 6.66, "last_error": "connect refused",
            "last_error_seconds": 1.64, "port_name": "21:00:00:00:c9:00:00:0b",
            "compression": "lz4", "compression_ratio": 2.5, "fastwrite": true,
            "fastwrite_writes": 7, "retransmits": 3,
        });
        let t = table(
            &[
                "lu",
                "for",
                "last error",
                "port name",
                "comp",
                "fastwrite",
                "retrans",
            ],
            &[row],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[2],
            "a   6.7 s  connect refused (1.6 s ago)  21:00:00:00:c9:00:00:0b  lz4 2.50  on (7)     3"
        );
        let down = serde_json::json!({"lu": "b", "last_error": null, "compression": "none",
            "compression_ratio": null, "fastwrite": false});
        let t = table(&["lu", "last error", "comp", "fastwrite"], &[down]);
        assert_eq!(t.lines().nth(2), Some("b   -           none -  off"));
    }
}
