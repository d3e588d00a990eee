//! The command line as an operator meets it: `unifab check`, and output
//! into a pipe that closes early.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

fn unifab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_unifab"));
    c.env("RUST_LOG", "warn");
    c
}

const CHAP_TARGET: &str = r#"
[[lu]]
name = "disk"
backend = "memory"
size = "8MiB"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:cli"
luns = ["disk"]
allow = ["iqn.1994-05.com.example:host1"]
chap = { user = "u", secret = "at-least-12-bytes" }
"#;

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// `unifab check` validates and starts nothing: a good file passes; a
/// file with secrets that others may read passes with a warning; a
/// mistyped ACL name fails with its file and line.
#[test]
fn check_validates_warns_about_readable_secrets_and_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let private = write(dir.path(), "private.toml", CHAP_TARGET, 0o600);
    let out = unifab()
        .arg("check")
        .arg("--config")
        .arg(&private)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("chmod 600"));

    let open = write(dir.path(), "open.toml", CHAP_TARGET, 0o644);
    let out = unifab()
        .arg("check")
        .arg("--config")
        .arg(&open)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds secrets") && err.contains("chmod 600"),
        "{err}"
    );

    let bad = CHAP_TARGET.replace("iqn.1994-05.com.example:host1", "host1");
    let bad = write(dir.path(), "bad.toml", &bad, 0o600);
    let out = unifab()
        .arg("check")
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let line = CHAP_TARGET
        .lines()
        .position(|l| l.starts_with("allow"))
        .unwrap()
        + 1;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("bad.toml:{line}:")) && err.contains("not an iSCSI name"),
        "{err}"
    );
}

/// `unifab pcap-check FILE | head -2`: the reader goes after two lines and
/// unifab ends quietly (status 0, no panic), as `head` expects.
#[test]
fn a_reader_that_goes_early_ends_the_command_quietly() {
    let cap = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/captures/iscsi-scsi-data-cdrom.pcap");
    assert!(cap.exists(), "{} is missing", cap.display());
    let mut child = unifab()
        .args(["pcap-check", "--verbose"])
        .arg(&cap)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        assert!(lines.next().unwrap().unwrap().starts_with("frame "));
    }
    // The verbose listing is far longer than a pipe holds: unifab is
    // still writing when the reader goes.
    drop(lines);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}
