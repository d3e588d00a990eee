//! `ceph_mon CEPH_CONF JSON [INPUT_FILE]`: one Ceph monitor command as
//! client.admin, its output on stdout (what `ceph` prints with `-o -`).
//! `scripts/ceph.sh` uses it (`CEPH_MON_CMD`) where the Python `ceph`
//! command is not installed, e.g. on a machine that only carries a bundle
//! of binaries; it speaks librados through `unifab_scsi_core::rbd`.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (conf, cmd) = match (args.first(), args.get(1)) {
        (Some(c), Some(j)) => (c, j),
        _ => {
            eprintln!("usage: ceph_mon CEPH_CONF JSON [INPUT_FILE]");
            return ExitCode::from(2);
        }
    };
    let input = match args.get(2) {
        Some(f) => match std::fs::read(f) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("ceph_mon: reading {f}: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => Vec::new(),
    };
    match unifab_scsi_core::rbd::mon_command(std::path::Path::new(conf), "admin", cmd, &input) {
        Ok(out) => {
            let mut o = std::io::stdout();
            if o.write_all(&out).and_then(|()| o.flush()).is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ceph_mon: {e}");
            ExitCode::FAILURE
        }
    }
}
