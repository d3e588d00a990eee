//! With feature `af-xdp`: compiles bpf/fcoe_filter.c into BPF bytecode
//! (`$OUT_DIR/fcoe_filter.o`) with clang, which the AF_XDP link loads.
//! Needs `clang` and the kernel UAPI headers (Debian: clang,
//! linux-libc-dev; scripts/setup.sh installs them).
#![allow(clippy::expect_used)]

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/fcoe_filter.c");
    println!("cargo:rerun-if-env-changed=CLANG");
    if env::var_os("CARGO_FEATURE_AF_XDP").is_none() {
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // Debian keeps asm/*.h under the multiarch directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .arg("-c")
        .arg("bpf/fcoe_filter.c")
        .arg("-o")
        .arg(out.join("fcoe_filter.o"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed ({s}) compiling bpf/fcoe_filter.c"),
        Err(e) => panic!(
            "cannot run {clang} ({e}): the af-xdp feature needs clang (Debian: apt-get install clang)"
        ),
    }
}
