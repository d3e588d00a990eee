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
        "luns" => &["name", "backend", "block_size", "blocks", "bytes", "naa"],
        "remotes" => &[
            "lu",
            "remote",
            "initiator",
            "isid",
            "state",
            "zoning",
            "for",
            "logins",
            "digests",
            "commands",
            "last error",
        ],
        "flogi" => &["interface", "vlan", "fcid", "port name", "node name", "mac"],
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
            "tunnel state",
            "failures",
            "last error",
        ],
        _ => &[],
    };
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
        .map(|r| {
            columns
                .iter()
                .map(|c| cell(r.get(*c).unwrap_or(&Value::Null)))
                .collect()
        })
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
}
