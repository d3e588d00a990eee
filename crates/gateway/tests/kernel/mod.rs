//! What the kernel-peer tests (`kernel_*.rs`) share: one guest at a time,
//! the image, and reading what the guest's script left.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use unifab_testkit::peers::{GuestImage, GuestRun};

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
