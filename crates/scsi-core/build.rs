//! With the `rbd` feature, finds librbd and librados (Debian's
//! `librbd-dev`, `librados-dev`; they ship no pkg-config files) and turns
//! on `cfg(unifab_rbd)`. Without them the crate still builds: the RBD
//! backend then refuses to open, saying the build has no librbd.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(unifab_rbd)");
    println!("cargo::rerun-if-env-changed=UNIFAB_RBD_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_RBD").is_none() {
        return;
    }
    let mut dirs: Vec<String> = Vec::new();
    if let Ok(d) = std::env::var("UNIFAB_RBD_LIB_DIR") {
        dirs.push(d);
    }
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .map(String::from),
    );
    let found = dirs.iter().find(|d| {
        Path::new(d).join("librbd.so").exists() && Path::new(d).join("librados.so").exists()
    });
    match found {
        Some(dir) => {
            println!("cargo::rerun-if-changed={dir}/librbd.so");
            println!("cargo::rustc-link-search=native={dir}");
            println!("cargo::rustc-link-lib=dylib=rbd");
            println!("cargo::rustc-link-lib=dylib=rados");
            println!("cargo::rustc-cfg=unifab_rbd");
        }
        None => println!(
            "cargo::warning=feature rbd: librbd.so/librados.so not found (install librbd-dev librados-dev, or set UNIFAB_RBD_LIB_DIR); rbd: backends will refuse to open"
        ),
    }
}
