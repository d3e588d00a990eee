//! What the kernel-peer tests (`kernel_*.rs`) share: one guest at a time,
//! the image, and reading what the guest's script left.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use unifab_testkit::peers::{GuestImage, GuestRun};
use unifab_testkit::veth::run;

/// One guest at a time: two TCG guests on two cores starve each other's
/// SCSI and FC timers.
pub static GUEST: Mutex<()> = Mutex::new(());

/// The guest image, built on first use (`scripts/vm-image.sh`); a machine
/// that cannot build or boot it fails the test with the reason.
pub fn image() -> GuestImage {
    GuestImage::ensure().unwrap_or_else(|e| panic!("the kernel-peer guest cannot run: {e}"))
}

/// A text file the guest's script left in the share.
pub fn text(run: &GuestRun, name: &str) -> String {
    String::from_utf8_lossy(
        run.file(name)
            .unwrap_or_else(|| panic!("the guest left no {name}")),
    )
    .into_owned()
}

/// Every step the script reports (`ok NAME` lines in `passed`) must be
/// there: a script that stopped early cannot pass.
pub fn assert_steps(run: &GuestRun, steps: &[&str]) {
    let passed = text(run, "passed");
    for step in steps {
        assert!(
            passed.lines().any(|l| l == *step),
            "step {step:?} not reported by the guest; it reported:\n{passed}"
        );
    }
}

/// Prints what the guest did and fails the test with its console, kernel
/// log and `context` (the gateways' logs) unless its script passed.
pub fn expect_passed(run: &GuestRun, image: &GuestImage, context: impl FnOnce() -> String) {
    println!("guest ({}): {:.1?}", image.kernel_release(), run.elapsed);
    println!("{}", run.console);
    if let Err(why) = run.success() {
        panic!("{why}\n{}", context());
    }
}

/// A tap device (MTU 2500, up) for a guest's FCoE NIC, deleted on drop;
/// `kfc<pid>x<n>`, and those a killed run left behind are swept first.
pub struct Tap(pub String);

static NEXT_TAP: AtomicU32 = AtomicU32::new(0);

impl Tap {
    pub fn new() -> Tap {
        if let Ok(out) = Command::new("ip").args(["-br", "link", "show"]).output() {
            for dev in String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
            {
                let dead = dev
                    .strip_prefix("kfc")
                    .and_then(|t| t.split_once('x'))
                    .and_then(|(pid, _)| u32::from_str_radix(pid, 16).ok())
                    .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                if dead {
                    let _ = Command::new("ip").args(["link", "del", dev]).output();
                }
            }
        }
        let name = format!(
            "kfc{:x}x{}",
            std::process::id(),
            NEXT_TAP.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "tuntap", "add", "dev", &name, "mode", "tap"]);
        run(&["ip", "link", "set", &name, "mtu", "2500", "up"]);
        Tap(name)
    }

    /// The tap's own MAC (the address unifab's FCF uses on it).
    pub fn mac(&self) -> String {
        std::fs::read_to_string(format!("/sys/class/net/{}/address", self.0))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// QEMU arguments for a virtio NIC on this tap (MTU 2500), with `mac`.
    pub fn qemu_nic(&self, mac: Option<&str>) -> [String; 4] {
        let mac = mac.map(|m| format!(",mac={m}")).unwrap_or_default();
        [
            "-netdev".to_owned(),
            format!("tap,id=n1,ifname={},script=no,downscript=no", self.0),
            "-device".to_owned(),
            format!("virtio-net-pci,netdev=n1,host_mtu=2500{mac}"),
        ]
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}
