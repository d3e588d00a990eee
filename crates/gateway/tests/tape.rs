//! unifab's tape drive (`type = "tape"`, SSC-3) against tgtd's
//! (`--device-type tape --bstype ssc`, Debian `tgt`): the same command
//! sequence goes to both over iSCSI, and each outcome (status, sense key,
//! ASC/ASCQ, FILEMARK/EOM/ILI, INFORMATION, data) is compared. Where they
//! differ on purpose the step names the SSC-3 clause unifab follows and
//! checks unifab against what that clause says; tgtd's answer is printed
//! beside it.
//!
//! A missing tgtd is a failure naming the package, never a skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use common::Gateway;
use unifab_testkit::peers::Tgtd;
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

/// Key, ASC, ASCQ, FILEMARK, EOM, ILI, INFORMATION (if VALID).
type SenseFields = (u8, u8, u8, bool, bool, bool, Option<i32>);

/// What a command ended with, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    status: u8,
    sense: Option<SenseFields>,
    data: Vec<u8>,
}

impl Outcome {
    fn of(r: CommandResult) -> Outcome {
        let sense = (r.status == 2 && r.sense.len() >= 14).then(|| {
            let s = &r.sense;
            let info = (s[0] & 0x80 != 0).then(|| i32::from_be_bytes([s[3], s[4], s[5], s[6]]));
            (
                s[2] & 0x0f,
                s[12],
                s[13],
                s[2] & 0x80 != 0,
                s[2] & 0x40 != 0,
                s[2] & 0x20 != 0,
                info,
            )
        });
        Outcome {
            status: r.status,
            sense,
            data: r.data,
        }
    }

    fn good() -> Outcome {
        Outcome {
            status: 0,
            sense: None,
            data: Vec::new(),
        }
    }

    fn with_data(data: Vec<u8>) -> Outcome {
        Outcome {
            data,
            ..Outcome::good()
        }
    }

    fn check(key: u8, asc: u8, ascq: u8) -> Outcome {
        Outcome {
            status: 2,
            sense: Some((key, asc, ascq, false, false, false, None)),
            data: Vec::new(),
        }
    }

    fn info(mut self, i: i32) -> Outcome {
        if let Some(s) = &mut self.sense {
            s.6 = Some(i);
        }
        self
    }

    fn fm(mut self) -> Outcome {
        if let Some(s) = &mut self.sense {
            s.3 = true;
        }
        self
    }

    fn eom(mut self) -> Outcome {
        if let Some(s) = &mut self.sense {
            s.4 = true;
        }
        self
    }

    fn data(mut self, d: Vec<u8>) -> Outcome {
        self.data = d;
        self
    }

    fn short(&self) -> String {
        let s = match self.sense {
            Some((k, a, q, f, e, i, info)) => format!(
                " key {k:x} {a:02x}/{q:02x}{}{}{}{}",
                if f { " FM" } else { "" },
                if e { " EOM" } else { "" },
                if i { " ILI" } else { "" },
                info.map(|v| format!(" info {v}")).unwrap_or_default()
            ),
            None => String::new(),
        };
        format!("status {:#04x}{s} data {} B", self.status, self.data.len())
    }
}

/// How a step's two outcomes must relate.
enum Expect {
    /// unifab and tgtd answer the same: status and sense; and data where
    /// the status is GOOD (with CHECK CONDITION tgtd's Data-In count does
    /// not follow what it read: it sends the expected length or none).
    Same,
    /// The same status and sense, and unifab's data is this (an ILI or
    /// FILEMARK read, whose data SSC-3 says is transferred).
    SameSense(Vec<u8>),
    /// Only the first `n` bytes of data are compared (INQUIRY: the rest is
    /// each product's identity), with the same status.
    SamePrefix(usize),
    /// unifab follows `clause` where tgtd does not: unifab must answer
    /// `unifab`; tgtd's answer is reported, not checked.
    Deliberate {
        clause: &'static str,
        unifab: Outcome,
    },
}

struct Step {
    what: &'static str,
    cdb: Vec<u8>,
    out: Vec<u8>,
    read: u32,
    expect: Expect,
}

fn step(what: &'static str, cdb: &[u8], out: Vec<u8>, read: u32, expect: Expect) -> Step {
    Step {
        what,
        cdb: cdb.to_vec(),
        out,
        read,
        expect,
    }
}

fn block(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| ((k as u32).wrapping_mul(31) ^ seed.wrapping_mul(2_654_435_761)) as u8)
        .collect()
}

fn write_var(len: u32) -> Vec<u8> {
    let l = len.to_be_bytes();
    vec![0x0a, 0, l[1], l[2], l[3], 0]
}

fn read_var(len: u32, sili: bool) -> Vec<u8> {
    let l = len.to_be_bytes();
    vec![0x08, u8::from(sili) << 1, l[1], l[2], l[3], 0]
}

fn read_fixed(blocks: u32) -> Vec<u8> {
    let l = blocks.to_be_bytes();
    vec![0x08, 1, l[1], l[2], l[3], 0]
}

fn write_fixed(blocks: u32) -> Vec<u8> {
    let l = blocks.to_be_bytes();
    vec![0x0a, 1, l[1], l[2], l[3], 0]
}

fn space(code: u8, count: i32) -> Vec<u8> {
    let c = count.to_be_bytes();
    vec![0x11, code, c[1], c[2], c[3], 0]
}

fn filemarks(n: u8) -> Vec<u8> {
    vec![0x10, 0, 0, 0, n, 0]
}

const REWIND: [u8; 6] = [0x01, 0, 0, 0, 0, 0];

/// MODE SELECT(6) of a header and block descriptor with `block_len`.
fn mode_select_block_len(block_len: u32) -> (Vec<u8>, Vec<u8>) {
    let b = block_len.to_be_bytes();
    let params = vec![0, 0, 0x10, 8, 0, 0, 0, 0, 0, b[1], b[2], b[3]];
    (vec![0x15, 0x10, 0, 0, params.len() as u8, 0], params)
}

/// One logged-in session to a tape at `lun`, its unit attentions read.
struct Drive {
    s: RawSession,
    lun: u16,
}

impl Drive {
    fn open(addr: SocketAddr, iqn: &str, lun: u16) -> Drive {
        let opts = RawOptions {
            clear_unit_attention: false,
            ..RawOptions::default()
        };
        let mut s =
            RawSession::login(addr, iqn, &opts).unwrap_or_else(|e| panic!("login to {iqn}: {e}"));
        for _ in 0..8 {
            let r = s.command_lun(lun, &[0; 6], &[], 0).unwrap();
            if r.status == 0 {
                return Drive { s, lun };
            }
        }
        panic!("{iqn} LUN {lun}: TEST UNIT READY never GOOD");
    }

    fn run(&mut self, cdb: &[u8], out: &[u8], read: u32) -> Outcome {
        Outcome::of(self.s.command_lun(self.lun, cdb, out, read).unwrap())
    }
}

fn unifab_tape_config(dir: &Path, size: &str, early_warning: &str) -> String {
    format!(
        r#"
[[lu]]
name = "tape"
type = "tape"
backend = "file:{dir}/tape.img"
size = "{size}"
early_warning = "{early_warning}"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:tape"
luns = ["tape"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        dir = dir.display()
    )
}

/// Both drives: unifab's and tgtd's, each with a blank cartridge.
struct Pair {
    _dir: tempfile::TempDir,
    _gw: Gateway,
    _tgtd: Tgtd,
    unifab: Drive,
    tgtd: Drive,
}

fn pair(megabytes: u32, early_warning: &str) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("tgt-tape.img");
    Tgtd::make_tape(&img, megabytes).unwrap_or_else(|e| panic!("{e}"));
    let t = Tgtd::builder(&img)
        .tape()
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let gw = Gateway::start(
        dir.path(),
        &unifab_tape_config(dir.path(), &format!("{megabytes}MiB"), early_warning),
    );
    let unifab = Drive::open(gw.addr, &gw.iqn, 0);
    let tgtd = Drive::open(t.addr(), t.iqn(), Tgtd::LUN as u16);
    Pair {
        _dir: dir,
        _gw: gw,
        _tgtd: t,
        unifab,
        tgtd,
    }
}

/// Runs the steps on both drives; every mismatch is collected, then
/// reported together with the whole transcript.
fn differential(p: &mut Pair, steps: &[Step]) {
    let mut transcript = String::new();
    let mut failures = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let u = p.unifab.run(&st.cdb, &st.out, st.read);
        let t = p.tgtd.run(&st.cdb, &st.out, st.read);
        let _ = writeln!(
            transcript,
            "{i:2} {:<44} unifab: {}\n   {:<44} tgtd:   {}",
            st.what,
            u.short(),
            "",
            t.short()
        );
        let ok = match &st.expect {
            Expect::Same => {
                u.status == t.status && u.sense == t.sense && (u.status != 0 || u.data == t.data)
            }
            Expect::SameSense(data) => {
                u.status == t.status && u.sense == t.sense && u.data == *data
            }
            Expect::SamePrefix(n) => {
                u.status == t.status
                    && u.data.len() >= *n
                    && t.data.len() >= *n
                    && u.data[..*n] == t.data[..*n]
            }
            Expect::Deliberate { clause, unifab } => {
                let _ = writeln!(transcript, "   deliberate: {clause}");
                u == *unifab
            }
        };
        if !ok {
            failures.push(format!(
                "step {i} ({}): unifab {} / tgtd {}",
                st.what,
                u.short(),
                t.short()
            ));
        }
    }
    eprintln!("{transcript}");
    assert!(
        failures.is_empty(),
        "{}\n\n{transcript}",
        failures.join("\n")
    );
}

#[test]
fn the_same_commands_give_the_same_answers_as_tgtds_tape() {
    let mut p = pair(64, "1MiB");
    let b = |seed, len| block(seed, len);
    let no = Vec::new;
    let (ms512, ms512_params) = mode_select_block_len(512);
    let (msvar, msvar_params) = mode_select_block_len(0);
    let mut fixed4 = Vec::new();
    for i in 0..4 {
        fixed4.extend(b(100 + i, 512));
    }
    use Expect::*;
    let steps = vec![
        step("TEST UNIT READY", &[0; 6], no(), 0, Same),
        step(
            "INQUIRY: type 01h, RMB",
            &[0x12, 0, 0, 0, 36, 0],
            no(),
            36,
            SamePrefix(2),
        ),
        step(
            "READ BLOCK LIMITS",
            &[0x05, 0, 0, 0, 0, 0],
            no(),
            6,
            Deliberate {
                clause: "SSC-3 READ BLOCK LIMITS: unifab's own limits (granularity 0, 1 B to 1 MiB); tgtd: granularity 9, 4 B to 1 MiB",
                unifab: Outcome::with_data(vec![0, 0x10, 0, 0, 0, 1]),
            },
        ),
        // Variable mode: a file of two blocks, a file of one, an empty
        // file, then one more block.
        step("WRITE(6) 1000 B", &write_var(1000), b(1, 1000), 0, Same),
        step("WRITE(6) 2000 B", &write_var(2000), b(2, 2000), 0, Same),
        step("WRITE FILEMARKS 1", &filemarks(1), no(), 0, Same),
        step("WRITE(6) 3000 B", &write_var(3000), b(3, 3000), 0, Same),
        step("WRITE FILEMARKS 2", &filemarks(2), no(), 0, Same),
        step("WRITE(6) 500 B", &write_var(500), b(4, 500), 0, Same),
        step("REWIND", &REWIND, no(), 0, Same),
        step(
            "READ(6) 1000 of 1000",
            &read_var(1000, false),
            no(),
            1000,
            Same,
        ),
        step(
            "READ(6) 2500 of 2000: ILI +500",
            &read_var(2500, false),
            no(),
            2500,
            SameSense(b(2, 2000)),
        ),
        step(
            "READ(6) at a filemark",
            &read_var(100, false),
            no(),
            100,
            SameSense(no()),
        ),
        step(
            "READ(6) 100 of 3000: ILI -2900",
            &read_var(100, false),
            no(),
            100,
            SameSense(b(3, 100)),
        ),
        step(
            "READ(6) at the 2nd filemark",
            &read_var(10, false),
            no(),
            10,
            SameSense(no()),
        ),
        step(
            "READ(6) at the 3rd filemark",
            &read_var(10, false),
            no(),
            10,
            SameSense(no()),
        ),
        step("READ(6) 500 of 500", &read_var(500, false), no(), 500, Same),
        step(
            "READ(6) at end-of-data",
            &read_var(500, false),
            no(),
            500,
            Deliberate {
                clause: "SSC-3 end-of-data: BLANK CHECK, END-OF-DATA DETECTED (00h/05h), INFORMATION the residue, EOM only past early warning; tgtd: ASC 00h/00h with EOM",
                unifab: Outcome::check(8, 0, 5).info(500),
            },
        ),
        step("REWIND", &REWIND, no(), 0, Same),
        step("SPACE 1 filemark", &space(1, 1), no(), 0, Same),
        step(
            "READ(6) the 3000 B block",
            &read_var(3000, false),
            no(),
            3000,
            Same,
        ),
        step("SPACE 2 filemarks", &space(1, 2), no(), 0, Same),
        step(
            "READ(6) the 500 B block",
            &read_var(500, false),
            no(),
            500,
            Same,
        ),
        step("SPACE to end-of-data", &space(3, 0), no(), 0, Same),
        step("SPACE -1 block", &space(0, -1), no(), 0, Same),
        step(
            "READ(6) the 500 B block again",
            &read_var(500, false),
            no(),
            500,
            Same,
        ),
        step("REWIND", &REWIND, no(), 0, Same),
        step("SPACE 1 block", &space(0, 1), no(), 0, Same),
        step(
            "READ(6) the 2000 B block",
            &read_var(2000, false),
            no(),
            2000,
            Same,
        ),
        step(
            "SPACE 1 block into a filemark",
            &space(0, 1),
            no(),
            0,
            Deliberate {
                clause: "SSC-3 SPACE(6): a filemark met while spacing over blocks ends the command (NO SENSE, FILEMARK, FILEMARK DETECTED, the residue), positioned after it; tgtd counts it as a block",
                unifab: Outcome::check(0, 0, 1).fm().info(1),
            },
        ),
        step(
            "READ(6) the 3000 B block after it",
            &read_var(3000, false),
            no(),
            3000,
            Same,
        ),
        step(
            "SPACE -9 blocks to beginning-of-partition",
            &space(0, -9),
            no(),
            0,
            Deliberate {
                clause: "SSC-3 SPACE(6): spacing reverse into a filemark stops on its BOP side with FILEMARK and the residue; tgtd goes on",
                unifab: Outcome::check(0, 0, 1).fm().info(8),
            },
        ),
        step("REWIND", &REWIND, no(), 0, Same),
        step(
            "SPACE -1 block at BOP",
            &space(0, -1),
            no(),
            0,
            Deliberate {
                clause: "SSC-3 SPACE(6): beginning-of-partition: NO SENSE, EOM, BEGINNING-OF-PARTITION/MEDIUM DETECTED, the residue; tgtd: no EOM, no residue",
                unifab: Outcome::check(0, 0, 4).eom().info(1),
            },
        ),
        // Fixed mode.
        step(
            "MODE SELECT(6): 512 B blocks",
            &ms512,
            ms512_params,
            0,
            Same,
        ),
        step(
            "WRITE(6) fixed 4 blocks",
            &write_fixed(4),
            fixed4.clone(),
            0,
            Same,
        ),
        step("WRITE FILEMARKS 1", &filemarks(1), no(), 0, Same),
        step("REWIND", &REWIND, no(), 0, Same),
        step("READ(6) fixed 2 blocks", &read_fixed(2), no(), 1024, Same),
        step(
            "READ(6) fixed 4 blocks into a filemark",
            &read_fixed(4),
            no(),
            2048,
            Deliberate {
                clause: "SSC-3 READ(6): the blocks before the filemark are transferred, FILEMARK with the blocks not read; tgtd sends no data",
                unifab: Outcome::check(0, 0, 1)
                    .fm()
                    .info(2)
                    .data(fixed4[1024..].to_vec()),
            },
        ),
        step(
            "READ(6) SILI with FIXED: refused",
            &[0x08, 3, 0, 0, 1, 0],
            no(),
            512,
            Same,
        ),
        step(
            "MODE SELECT(6): variable blocks",
            &msvar,
            msvar_params,
            0,
            Same,
        ),
        step(
            "PREVENT MEDIUM REMOVAL",
            &[0x1e, 0, 0, 0, 1, 0],
            no(),
            0,
            Same,
        ),
        step(
            "ALLOW MEDIUM REMOVAL",
            &[0x1e, 0, 0, 0, 0, 0],
            no(),
            0,
            Same,
        ),
        step(
            "RESERVE(6)",
            &[0x16, 0, 0, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 Table 2 lists RESERVE/RELEASE for tape; tgtd's tape: INVALID COMMAND OPERATION CODE",
                unifab: Outcome::good(),
            },
        ),
        step(
            "RELEASE(6)",
            &[0x17, 0, 0, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "as RESERVE(6)",
                unifab: Outcome::good(),
            },
        ),
        // What tgtd does not implement.
        step(
            "READ POSITION short form",
            &[0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            no(),
            20,
            Deliberate {
                clause: "SSC-3 READ POSITION: the position (object 5, past the filemark; first and last location); tgtd answers zeros",
                unifab: Outcome::with_data({
                    let mut v = vec![0u8; 20];
                    v[7] = 5;
                    v[11] = 5;
                    v
                }),
            },
        ),
        step(
            "LOCATE(10) to object 4",
            &[0x2b, 0, 0, 0, 0, 0, 4, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 LOCATE(10) is mandatory; tgtd: INVALID COMMAND OPERATION CODE",
                unifab: Outcome::good(),
            },
        ),
        step(
            "READ POSITION long form after LOCATE",
            &[0x34, 6, 0, 0, 0, 0, 0, 0, 0, 0],
            no(),
            32,
            Deliberate {
                clause: "SSC-3 READ POSITION long form: object 4, file 0; tgtd answers zeros",
                unifab: Outcome::with_data({
                    let mut v = vec![0u8; 32];
                    v[15] = 4;
                    v
                }),
            },
        ),
        step(
            "ERASE from object 4",
            &[0x19, 0, 0, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 ERASE is mandatory; tgtd: INVALID COMMAND OPERATION CODE",
                unifab: Outcome::good(),
            },
        ),
        step(
            "SPACE(16) to end-of-data",
            &[0x91, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 SPACE(16); tgtd: INVALID COMMAND OPERATION CODE (in its disk table 91h is SYNCHRONIZE CACHE(16))",
                unifab: Outcome::good(),
            },
        ),
        step(
            "READ(6) at the new end-of-data",
            &read_var(512, true),
            no(),
            512,
            Deliberate {
                clause: "ERASE ended the data at object 4 (see above)",
                unifab: Outcome::check(8, 0, 5).info(512),
            },
        ),
        step(
            "REPORT DENSITY SUPPORT",
            &[0x44, 0, 0, 0, 0, 0, 0, 0, 4, 0],
            no(),
            4,
            Deliberate {
                clause: "SSC-3 REPORT DENSITY SUPPORT is mandatory; tgtd: INVALID COMMAND OPERATION CODE",
                unifab: Outcome::with_data(vec![0, 54, 0, 0]),
            },
        ),
        step(
            "LOAD UNLOAD: unload",
            &[0x1b, 0, 0, 0, 0, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 LOAD UNLOAD is mandatory; tgtd: INVALID COMMAND OPERATION CODE",
                unifab: Outcome::good(),
            },
        ),
        step(
            "TEST UNIT READY with the medium out",
            &[0; 6],
            no(),
            0,
            Deliberate {
                clause: "SPC-4: NOT READY, MEDIUM NOT PRESENT after the unload (tgtd never unloaded)",
                unifab: Outcome::check(2, 0x3a, 0),
            },
        ),
        step(
            "LOAD UNLOAD: load",
            &[0x1b, 0, 0, 0, 1, 0],
            no(),
            0,
            Deliberate {
                clause: "SSC-3 LOAD UNLOAD",
                unifab: Outcome::good(),
            },
        ),
    ];
    differential(&mut p, &steps);
    // Equal answers could be equally wrong: the data read back is what
    // was written.
    let (ms, params) = mode_select_block_len(512);
    assert_eq!(p.unifab.run(&ms, &params, 0), Outcome::good());
    let r = p.unifab.run(&read_fixed(4), &[], 2048);
    assert_eq!(r, Outcome::with_data(fixed4), "fixed-mode data read back");
    assert_eq!(p.unifab.run(&REWIND, &[], 0), Outcome::good());
}

#[test]
fn early_warning_comes_before_the_end_and_volume_overflow_at_it() {
    let mut p = pair(2, "256KiB");
    let mut unifab_ew = None;
    let mut unifab_overflow = None;
    let mut tgtd_eom = None;
    for i in 0..64u32 {
        let data = block(i, 64 * 1024);
        let u = p.unifab.run(&write_var(64 * 1024), &data, 0);
        let t = p.tgtd.run(&write_var(64 * 1024), &data, 0);
        if u.status != 0 {
            let s = u.sense.unwrap();
            match (s.0, s.1, s.2, s.4) {
                (0, 0, 2, true) => {
                    unifab_ew.get_or_insert(i);
                }
                (0x0d, 0, 2, true) => {
                    assert_eq!(
                        s.6,
                        Some(64 * 1024),
                        "VOLUME OVERFLOW's residue: the whole block"
                    );
                    unifab_overflow.get_or_insert(i);
                }
                _ => panic!("write {i}: unifab {}", u.short()),
            }
        }
        if t.status != 0 && tgtd_eom.is_none() {
            tgtd_eom = Some((i, t.short()));
        }
        if unifab_overflow.is_some() && tgtd_eom.is_some() {
            break;
        }
    }
    let ew = unifab_ew.expect("no early warning");
    let over = unifab_overflow.expect("no volume overflow");
    eprintln!("unifab: early warning at write {ew}, VOLUME OVERFLOW at {over}; tgtd: {tgtd_eom:?}");
    // 2 MiB, 256 KiB of early warning: about 28 blocks before it.
    assert!((26..30).contains(&ew), "early warning at write {ew}");
    assert!(over > ew, "overflow {over} before early warning {ew}");
    // Deliberate: tgtd reports EOM (NO SENSE, 00h/00h) only once past its
    // capacity; SSC-3 (early warning) wants END-OF-PARTITION/MEDIUM DETECTED at
    // early warning, before the end.
    let (t_at, t_sense) = tgtd_eom.expect("tgtd never reported the end of its medium");
    assert!(t_sense.contains("EOM"), "tgtd: {t_sense}");
    assert!(ew < t_at, "unifab warned at {ew}, tgtd's end at {t_at}");
}

/// What WRITE FILEMARKS (without IMMED) acknowledged survives SIGKILL of
/// the gateway: every block before it reads back after a restart, and
/// end-of-data is where the tape said.
#[test]
fn a_synced_tape_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), &unifab_tape_config(dir.path(), "64MiB", "1MiB"));
    let mut d = Drive::open(gw.addr, &gw.iqn, 0);
    let sizes: Vec<u32> = (0..40).map(|i| 512 + (i * 4099) % 60_000).collect();
    for (i, len) in sizes.iter().enumerate() {
        let r = d.run(&write_var(*len), &block(i as u32, *len as usize), 0);
        assert_eq!(r, Outcome::good(), "write {i}");
    }
    assert_eq!(d.run(&filemarks(1), &[], 0), Outcome::good());
    let config = gw.kill();
    let gw = Gateway::start_with(config);
    let mut d = Drive::open(gw.addr, &gw.iqn, 0);
    for (i, len) in sizes.iter().enumerate() {
        let r = d.run(&read_var(*len, false), &[], *len);
        assert_eq!(
            r,
            Outcome::with_data(block(i as u32, *len as usize)),
            "block {i}"
        );
    }
    assert_eq!(
        d.run(&read_var(10, false), &[], 10),
        Outcome::check(0, 0, 1).fm().info(10)
    );
    assert_eq!(
        d.run(&read_var(10, false), &[], 10),
        Outcome::check(8, 0, 5).info(10)
    );
}

/// tgtd's tape behind unifab's iSCSI bridge (`backend = "iscsi://…"`, no
/// `type`: a remote tape's commands pass through): a backup stream of
/// 64 KiB blocks with a filemark every four, rewound, spaced and read
/// back, the remote drive's own sense reaching the host.
#[test]
fn a_remote_tape_passes_through_the_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("tgt-tape.img");
    Tgtd::make_tape(&img, 64).unwrap_or_else(|e| panic!("{e}"));
    let t = Tgtd::builder(&img)
        .tape()
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let config = format!(
        r#"
[[lu]]
name = "far-tape"
backend = "iscsi://{addr}/{iqn}/{lun}"

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:bridge-tape"
luns = ["far-tape"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        addr = t.addr(),
        iqn = t.iqn(),
        lun = Tgtd::LUN,
        dir = dir.path().display()
    );
    let gw = Gateway::start(dir.path(), &config);
    let mut d = Drive::open(gw.addr, &gw.iqn, 0);
    let inq = d.run(&[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(&inq.data[..2], &[0x01, 0x80], "the remote's tape INQUIRY");
    const BLK: usize = 64 * 1024;
    for i in 0..16u32 {
        assert_eq!(
            d.run(&write_var(BLK as u32), &block(i, BLK), 0),
            Outcome::good(),
            "block {i}"
        );
        if i % 4 == 3 {
            assert_eq!(d.run(&filemarks(1), &[], 0), Outcome::good());
        }
    }
    assert_eq!(d.run(&REWIND, &[], 0), Outcome::good());
    assert_eq!(d.run(&space(1, 2), &[], 0), Outcome::good());
    let r = d.run(&read_var(BLK as u32, false), &[], BLK as u32);
    assert_eq!(
        r,
        Outcome::with_data(block(8, BLK)),
        "the third file's first block"
    );
    assert_eq!(d.run(&REWIND, &[], 0), Outcome::good());
    for i in 0..16u32 {
        let r = d.run(&read_var(BLK as u32, false), &[], BLK as u32);
        assert_eq!(r, Outcome::with_data(block(i, BLK)), "block {i}");
        if i % 4 == 3 {
            let r = d.run(&read_var(BLK as u32, false), &[], BLK as u32);
            assert_eq!(
                r.sense,
                Some((0, 0, 1, true, false, false, Some(BLK as i32))),
                "filemark after block {i}: {}",
                r.short()
            );
        }
    }
}
