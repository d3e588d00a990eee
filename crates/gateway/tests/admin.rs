//! The admin surface: a token when one is set, no stranger's endpoint off
//! loopback, a start that fails when the endpoint cannot bind, and SIGHUP
//! that never ends the process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Gateway, file_lu_config};

const TOKEN: &str = "an-admin-token-of-32-characters!";

fn get(admin: SocketAddr, path: &str, token: Option<&str>) -> String {
    let mut s = TcpStream::connect(admin).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

fn config_with_admin(dir: &std::path::Path, admin: &str) -> String {
    file_lu_config(dir, "8MiB").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!("[admin]\nlisten = \"{admin}\""),
    )
}

fn unifab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_unifab"));
    c.env("RUST_LOG", "warn");
    c
}

/// With a token, a request without it (or with another) is refused 401
/// and one with it answered; `unifab show` sends it from `--token` or
/// `UNIFAB_ADMIN_TOKEN` and finds the endpoint in `UNIFAB_ADMIN`.
#[test]
fn a_token_is_required_when_set() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = config_with_admin(dir.path(), &admin.to_string())
        .replace("data_dir", &format!("token = \"{TOKEN}\"\ndata_dir"));
    assert!(cfg.contains(TOKEN), "{cfg}");
    let _gw = Gateway::start(dir.path(), &cfg);
    assert!(get(admin, "/metrics", None).starts_with("HTTP/1.1 401"));
    assert!(get(admin, "/metrics", Some("not-the-token-at-all!")).starts_with("HTTP/1.1 401"));
    assert!(get(admin, "/metrics", Some(TOKEN)).starts_with("HTTP/1.1 200"));
    let out = unifab()
        .args(["show", "sessions"])
        .env("UNIFAB_ADMIN", admin.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    let out = unifab()
        .args(["show", "sessions"])
        .env("UNIFAB_ADMIN", admin.to_string())
        .env("UNIFAB_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Off loopback without a token the configuration is refused, by `check`
/// and by `run`; with one it is accepted.
#[test]
fn an_endpoint_off_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("open.toml");
    std::fs::write(&path, config_with_admin(dir.path(), "0.0.0.0:9999")).unwrap();
    for cmd in ["check", "run"] {
        let out = unifab()
            .arg(cmd)
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cmd}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a loopback address") && err.contains("admin.token"),
            "{cmd}: {err}"
        );
    }
    let with = config_with_admin(dir.path(), "0.0.0.0:9999")
        .replace("data_dir", &format!("token = \"{TOKEN}\"\ndata_dir"));
    std::fs::write(&path, with).unwrap();
    let out = unifab()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A second gateway whose admin address is taken does not start (unless
/// `required = false`); SIGHUP leaves the first running and answering.
#[test]
fn a_taken_admin_address_stops_the_start_and_sighup_does_not_kill() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut gw = Gateway::start(
        dir.path(),
        &config_with_admin(dir.path(), &admin.to_string()),
    );

    let dir2 = tempfile::tempdir().unwrap();
    let path2 = dir2.path().join("second.toml");
    std::fs::write(&path2, config_with_admin(dir2.path(), &admin.to_string())).unwrap();
    let out = unifab()
        .arg("run")
        .arg("--config")
        .arg(&path2)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("admin endpoint {admin}")), "{err}");

    for _ in 0..3 {
        let r = Command::new("kill")
            .args(["-HUP", &gw.child.id().to_string()])
            .status()
            .unwrap();
        assert!(r.success());
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert!(
            gw.child.try_wait().unwrap().is_none(),
            "the gateway ended after SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(get(admin, "/metrics", None).starts_with("HTTP/1.1 200"));
}

/// An unknown view and a view of a part the gateway does not run get
/// different answers: 404 naming the views, 409 naming the section.
#[test]
fn unknown_views_and_unconfigured_planes_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _gw = Gateway::start(
        dir.path(),
        &config_with_admin(dir.path(), &admin.to_string()),
    );
    let r = get(admin, "/show/zonez", None);
    assert!(
        r.starts_with("HTTP/1.1 404") && r.contains("views: sessions"),
        "{r}"
    );
    for (view, section) in [
        ("zones", "[fabric]"),
        ("fcip", "[fcip]"),
        ("fcoe", "[fcoe]"),
    ] {
        let r = get(admin, &format!("/show/{view}"), None);
        assert!(
            r.starts_with("HTTP/1.1 409") && r.contains(section),
            "{view}: {r}"
        );
    }
    assert!(get(admin, "/show/sessions", None).starts_with("HTTP/1.1 200"));
}

/// A circuit whose peer does not answer says so: `show fcip` names the
/// configured peer, counts the failed attempts and gives the last error
/// and how long ago it came.
#[test]
fn a_circuit_to_a_dead_peer_says_why_it_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Nobody listens there.
    let dead = unifab_testkit::peers::free_tcp_port().unwrap();
    let cfg = format!(
        r#"{base}
[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"

[[fcip.tunnel]]
name = "fcip0"
peer = "10:00:00:00:c9:00:00:02"
mode = "enhanced"

[[fcip.tunnel.circuit]]
peer = "127.0.0.1:{dead}"
"#,
        base = config_with_admin(dir.path(), &admin.to_string())
    );
    let _gw = Gateway::start(dir.path(), &cfg);
    let deadline = Instant::now() + Duration::from_secs(10);
    let row = loop {
        let out = unifab()
            .args(["show", "fcip", "--json", "--admin", &admin.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        let row = rows
            .into_iter()
            .find(|r| r["circuit"] == "1")
            .expect("circuit 1 listed");
        if row["connect_failures"].as_u64().unwrap_or(0) >= 2 || Instant::now() > deadline {
            break row;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(row["state"], "down", "{row}");
    assert_eq!(row["peer"], format!("127.0.0.1:{dead}"), "{row}");
    assert!(row["connect_failures"].as_u64().unwrap() >= 2, "{row}");
    let last = row["last_error"].as_str().unwrap();
    assert!(
        last.starts_with("connect: ") && last.contains("refused"),
        "{row}"
    );
    assert!(
        row["last_error_seconds"].as_f64().is_some_and(|s| s >= 0.0),
        "{row}"
    );
    // Every key is snake_case.
    for k in row.as_object().unwrap().keys() {
        assert!(
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{k:?} in {row}"
        );
    }
}

/// `show targets`: target, portal, LUN, LU, ACL and CHAP user, never the
/// secret.
#[test]
fn show_targets_lists_the_tree_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let secret = "a-secret-nobody-sees";
    let cfg = config_with_admin(dir.path(), &admin.to_string()).replace(
        "luns = [\"disk\"]",
        &format!(
            "luns = [\"disk\"]\nallow = [\"iqn.1994-05.com.example:h1\"]\nchap = {{ user = \"u1\", secret = \"{secret}\" }}"
        ),
    );
    assert!(cfg.contains(secret));
    let gw = Gateway::start(dir.path(), &cfg);
    let out = unifab()
        .args(["show", "targets", "--json", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(secret), "{text}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(rows.len(), 1, "{text}");
    let r = &rows[0];
    assert_eq!(r["target"], gw.iqn.as_str());
    assert_eq!(r["lun"], 0);
    assert_eq!(r["lu"], "disk");
    assert_eq!(r["acl"], "iqn.1994-05.com.example:h1");
    assert_eq!(r["chap"], "user u1");
    assert_eq!(r["portals"], gw.addr.to_string());
    let table = unifab()
        .args(["show", "targets", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("user u1"));
}
