//! Durability: a write the protocol calls stable (acknowledged FUA write, or
//! any write followed by an acknowledged SYNCHRONIZE CACHE) survives a
//! SIGKILL of the gateway. Loops with random data at random places
//! (`common::stable`; `rbd.rs` runs the same loop on an RBD image).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::stable::{BS, survive_sigkill};
use common::{Gateway, file_lu_config};

const BLOCKS: u64 = (64 << 20) / BS as u64;

#[test]
fn acknowledged_stable_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = file_lu_config(dir.path(), "64MiB");
    survive_sigkill(Gateway::start(dir.path(), &cfg), 25, BLOCKS);
}
