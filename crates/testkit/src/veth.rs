//! For tests that need root: a root check that says how to run them, a
//! command that must succeed, and a veth pair in the test's namespace.
//!
//! Nothing here skips itself: without root or `ip`, the test fails and
//! says why (CI runs as root).

use std::process::Command;

/// Fails the test unless it runs as root with iproute2's `ip` available.
/// `what` names the test; `package` the crate (`-p`) to rerun it with.
pub fn require_root(what: &str, package: &str) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(
        uid == 0,
        "{what} needs root (network namespaces, veth, AF_PACKET/AF_XDP); running as uid {uid}. \
         CI runs as root; run `sudo -E cargo test -p {package} --test <name>` by hand."
    );
    let ok = Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "{what} needs iproute2's `ip` (Debian: iproute2)");
}

/// Runs `cmd`; fails the test with its stderr if it does not succeed.
pub fn run(cmd: &[&str]) {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", cmd[0]));
    assert!(
        out.status.success(),
        "{}: {}",
        cmd.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A veth pair in this namespace, both ends up; removed on drop.
#[derive(Debug)]
pub struct VethPair {
    /// One end.
    pub a: String,
    /// The other.
    pub b: String,
}

impl VethPair {
    /// Creates `<prefix>a<pid>` and `<prefix>b<pid>` (a prefix of at most
    /// four characters keeps the names within the kernel's 15), removing
    /// a pair of those names a killed run left behind.
    pub fn new(prefix: &str) -> VethPair {
        assert!(
            prefix.len() <= 4,
            "veth prefix {prefix:?}: four characters at most"
        );
        let id = std::process::id() % 100_000;
        let v = VethPair {
            a: format!("{prefix}a{id}"),
            b: format!("{prefix}b{id}"),
        };
        let _ = Command::new("ip").args(["link", "del", &v.a]).output();
        run(&[
            "ip", "link", "add", &v.a, "type", "veth", "peer", "name", &v.b,
        ]);
        for i in [&v.a, &v.b] {
            run(&["ip", "link", "set", i, "up"]);
        }
        v
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting one end deletes both (and detaches any XDP program).
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
    }
}
