//! `dist/grafana/unifab.json` asks only for metric families a running
//! gateway exports: every name in every query (and in the template
//! variables) is looked up in `/metrics` of a gateway with an iSCSI
//! portal, an LU and an FC fabric.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

fn metrics(admin: SocketAddr) -> String {
    let mut s = TcpStream::connect(admin).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// Every `unifab_…` name in `expr`.
fn names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("unifab_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every string under a key named `expr` or `query`.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

#[test]
fn every_query_names_an_exported_family() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/grafana/unifab.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut qs = Vec::new();
    queries(&dash, &mut qs);
    assert!(qs.len() >= 10, "{} queries", qs.len());

    let dir = tempfile::tempdir().unwrap();
    let admin_port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let config = common::file_lu_config(dir.path(), "8MiB").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!(
            "[fabric]\ndomain = 1\nswitch_wwn = \"10:00:00:00:c9:00:00:01\"\n\n[[fabric.target]]\nwwpn = \"21:00:00:00:c9:00:00:0a\"\nluns = [\"disk\"]\n\n[fcip]\nlisten = \"127.0.0.1:0\"\n\n[[fcip.tunnel]]\nname = \"fcip0\"\npeer = \"10:00:00:00:c9:00:00:02\"\nmode = \"enhanced\"\n\n[[fcip.tunnel.circuit]]\n\n[admin]\nlisten = \"{admin}\""
        ),
    );
    let _gw = common::Gateway::start(dir.path(), &config);
    let text = metrics(admin);
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut asked = BTreeSet::new();
    for q in &qs {
        for n in names(q) {
            asked.insert(n);
        }
    }
    assert!(asked.len() >= 10, "{asked:?}");
    for n in &asked {
        let family = ["_bucket", "_sum", "_count", "_total"]
            .iter()
            .find_map(|s| n.strip_suffix(s).filter(|f| families.contains(f)))
            .unwrap_or(n);
        assert!(
            families.contains(family),
            "the dashboard asks for {n}, which the gateway does not export (families: {families:?})"
        );
    }
}
