//! The `rbd:` backend against a real one-node Ceph cluster
//! (`scripts/ceph.sh`, started per test and stopped on drop): libiscsi's
//! suite passes what it passes on a file LU, acknowledged stable writes
//! survive SIGKILL, a killed OSD gives the host retryable errors and no
//! corruption, an image resized underneath raises CAPACITY DATA HAS
//! CHANGED, and a blocklisted gateway fences the LU until `unifab reload`
//! opens it again (not while another gateway holds the image).
//!
//! Needs Debian ceph-mon, ceph-osd, ceph-common and a build with librbd
//! (`bash scripts/setup.sh`); without them each test fails and says why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::stable::{BS, apply, survive_sigkill};
use common::{Gateway, reload, show_json};
use rand::{Rng, RngExt, SeedableRng};
use unifab_scsi_core::sense::asc;
use unifab_scsi_core::{Sense, SenseKey};
use unifab_testkit::peers::{
    Ceph, IscsiTestCu, ObjectStore, PassList, Unifab, assert_run_passes, conformance_dir,
};
use unifab_testkit::raw_iscsi::{CommandResult, RawOptions, RawSession};

const CHECK_CONDITION: u8 = 0x02;

/// A gateway config serving `rbd:rbd/IMAGE` over iSCSI on an ephemeral port.
fn rbd_config(dir: &Path, conf: &Path, image: &str, size: &str, extra: &str) -> String {
    format!(
        r#"
[[lu]]
name = "disk"
backend = "rbd:rbd/{image}"
size = "{size}"
ceph_conf = "{conf}"
{extra}

[iscsi]
listen = ["127.0.0.1:0"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:rbd"
luns = ["disk"]

[admin]
listen = "127.0.0.1:0"
data_dir = "{dir}/state"
"#,
        conf = conf.display(),
        dir = dir.display()
    )
}

fn cluster(store: ObjectStore) -> Ceph {
    Ceph::start(store).unwrap_or_else(|e| panic!("the test Ceph cluster did not start: {e}"))
}

fn session(gw: &Gateway) -> RawSession {
    let opts = RawOptions {
        timeout: Duration::from_secs(60),
        ..RawOptions::default()
    };
    RawSession::login(gw.addr, &gw.iqn, &opts).unwrap()
}

fn sense(r: &CommandResult) -> Sense {
    assert_eq!(r.status, CHECK_CONDITION, "{r:?}");
    Sense::parse(&r.sense).expect("fixed or descriptor sense")
}

/// The file LU's pass list, less what RBD cannot do
/// (`conformance/unifab-rbd.except`: one test per line with the reason),
/// is in the RBD LU's list, and the RBD run passes its list.
#[test]
fn the_rbd_lu_passes_what_the_file_lu_passes() {
    let ceph = cluster(ObjectStore::Memstore);
    let gw = Unifab::builder()
        .rbd_lu("rbd/conformance", ceph.conf(), 1 << 30)
        .start()
        .expect("unifab starts");
    let result = IscsiTestCu::new(gw.url()).run().expect("suite runs");
    result.record("unifab-rbd").expect("record the run");
    assert_run_passes("unifab-rbd.pass", &result);
    let file = PassList::load(conformance_dir().join("unifab.pass")).expect("pass list");
    let rbd = PassList::load(conformance_dir().join("unifab-rbd.pass")).expect("pass list");
    let except = std::fs::read_to_string(conformance_dir().join("unifab-rbd.except"))
        .expect("conformance/unifab-rbd.except");
    let excepted: BTreeSet<String> = except
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect();
    let behind: Vec<&String> = file
        .names
        .iter()
        .filter(|t| !rbd.names.contains(*t) && !excepted.contains(*t))
        .collect();
    assert!(
        behind.is_empty(),
        "unifab-rbd.pass lacks tests the file LU passes (pass them, or name each with its reason in unifab-rbd.except): {behind:?}"
    );
}

#[test]
fn acknowledged_stable_writes_on_rbd_survive_sigkill() {
    let ceph = cluster(ObjectStore::Memstore);
    let dir = tempfile::tempdir().unwrap();
    let cfg = rbd_config(dir.path(), &ceph.conf(), "durable", "64MiB", "");
    survive_sigkill(
        Gateway::start(dir.path(), &cfg),
        25,
        (64 << 20) / u64::from(BS),
    );
}

/// Sends `write` until it is GOOD, at most `limit`; each failure on the
/// way must be one a host retries (ABORTED COMMAND, LOGICAL UNIT
/// COMMUNICATION FAILURE or TIME-OUT), never a medium error.
fn until_good(
    s: &mut RawSession,
    limit: Duration,
    mut cmd: impl FnMut(&mut RawSession) -> CommandResult,
) -> u32 {
    let deadline = Instant::now() + limit;
    let mut retryable = 0;
    loop {
        let r = cmd(s);
        if r.status == 0 {
            return retryable;
        }
        let sn = sense(&r);
        assert!(
            sn.key == SenseKey::ABORTED_COMMAND
                && (sn.asc == asc::LOGICAL_UNIT_COMMUNICATION_TIME_OUT
                    || sn.asc == asc::LOGICAL_UNIT_COMMUNICATION_FAILURE),
            "not a retryable error while the OSD is away: {sn:?}"
        );
        retryable += 1;
        assert!(
            Instant::now() < deadline,
            "I/O did not resume within {limit:?} after the OSD came back"
        );
    }
}

#[test]
fn a_killed_osd_gives_retryable_errors_and_io_resumes_without_corruption() {
    let ceph = cluster(ObjectStore::Bluestore);
    let dir = tempfile::tempdir().unwrap();
    // Operations fail after 3 s without an OSD, so the host sees errors
    // rather than a stall.
    let cfg = rbd_config(
        dir.path(),
        &ceph.conf(),
        "osdkill",
        "64MiB",
        "ceph_op_timeout = 3",
    );
    let gw = Gateway::start(dir.path(), &cfg);
    let mut s = session(&gw);
    let seed: u64 = rand::rng().random();
    eprintln!("osd-kill seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let blocks = (64u64 << 20) / u64::from(BS);
    // Acknowledged FUA writes in the first half of the LU.
    let mut expected = Vec::new();
    for _ in 0..32 {
        let n = rng.random_range(1..=64u32);
        let lba = rng.random_range(0..blocks / 2 - u64::from(n));
        let mut data = vec![0u8; (n * BS) as usize];
        rng.fill_bytes(&mut data);
        let r = s.write16(lba, &data, BS, true).unwrap();
        assert_eq!(r.status, 0, "write before the OSD died");
        apply(&mut expected, lba, data);
    }

    ceph.kill_osd().expect("kill the OSD");
    // While it is away, a read and a write each fail, retryably. The read
    // is of blocks written above: librbd answers a read of an object never
    // written from its object map, without an OSD (block 0 is such a one
    // when no write landed in the first object). The write goes to the
    // second half, which the model does not cover: a host may not assume
    // anything of a write that failed.
    let (written, _) = expected[0];
    let r = s.read16(written, 1, BS).unwrap();
    let sn = sense(&r);
    assert_eq!(
        sn.key,
        SenseKey::ABORTED_COMMAND,
        "read with the OSD dead: {sn:?}"
    );
    let probe = vec![0xa5u8; 16 * BS as usize];
    let late_lba = blocks / 2 + 100;
    let r = s.write16(late_lba, &probe, BS, true).unwrap();
    let sn = sense(&r);
    assert_eq!(
        sn.key,
        SenseKey::ABORTED_COMMAND,
        "write with the OSD dead: {sn:?}"
    );

    ceph.start_osd().expect("restart the OSD");
    // The host retries the failed write; it succeeds once the OSD is back.
    until_good(&mut s, Duration::from_secs(90), |s| {
        s.write16(late_lba, &probe, BS, true).unwrap()
    });
    apply(&mut expected, late_lba, probe);
    // Nothing acknowledged was lost or changed; the session lived through it.
    for (lba, data) in &expected {
        let r = s.read16(*lba, data.len() as u32 / BS, BS).unwrap();
        assert_eq!(r.status, 0, "read of LBA {lba} after the OSD came back");
        assert!(r.data == *data, "LBA {lba} changed across the OSD's death");
    }
}

fn read_capacity16(s: &mut RawSession) -> CommandResult {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    s.command(&cdb, &[], 32).unwrap()
}

#[test]
fn an_image_resized_underneath_raises_capacity_data_has_changed() {
    let ceph = cluster(ObjectStore::Memstore);
    let dir = tempfile::tempdir().unwrap();
    let admin_port = unifab_testkit::peers::free_tcp_port().unwrap();
    let admin = format!("127.0.0.1:{admin_port}");
    let cfg = rbd_config(dir.path(), &ceph.conf(), "grows", "64MiB", "").replace(
        "listen = \"127.0.0.1:0\"\ndata_dir",
        &format!("listen = \"{admin}\"\ndata_dir"),
    );
    assert!(cfg.contains(&admin));
    let gw = Gateway::start(dir.path(), &cfg);
    let mut s = session(&gw);
    s.clear_unit_attentions().unwrap();
    let r = read_capacity16(&mut s);
    assert_eq!(r.status, 0);
    let last = u64::from_be_bytes(r.data[..8].try_into().unwrap());
    assert_eq!(last + 1, (64 << 20) / u64::from(BS));

    ceph.rbd(&["resize", "--size", "128M", "rbd/grows"])
        .expect("rbd resize");
    // librbd calls back when the header changes; the host hears it on its
    // next command.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = s.command(&[0, 0, 0, 0, 0, 0], &[], 0).unwrap();
        if r.status == CHECK_CONDITION {
            let sn = sense(&r);
            assert_eq!(
                (sn.key, sn.asc),
                (SenseKey::UNIT_ATTENTION, asc::CAPACITY_DATA_HAS_CHANGED)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CAPACITY DATA HAS CHANGED within 30 s of the resize"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = read_capacity16(&mut s);
    assert_eq!(r.status, 0);
    let last = u64::from_be_bytes(r.data[..8].try_into().unwrap());
    assert_eq!(last + 1, (128 << 20) / u64::from(BS));
    // The new blocks work.
    let data = vec![0x5au8; 8 * BS as usize];
    assert_eq!(s.write16(last - 7, &data, BS, true).unwrap().status, 0);
    assert_eq!(s.read16(last - 7, 8, BS).unwrap().data, data);

    // The operations librbd did show: in `unifab show luns` and /metrics.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["show", "luns", "--json", "--admin", &admin])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &rows[0];
    assert_eq!(row["backend"], "rbd:rbd/grows");
    // At least the write (and its flush) and the read just done.
    assert!(row["backend_operations"].as_u64().unwrap() >= 3, "{row}");
    assert_eq!(row["backend_in_flight"].as_u64(), Some(0), "{row}");
    assert!(row["backend_latency_us"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(row["write_path"], "async", "librbd's aio: {row}");
    let mut c = std::net::TcpStream::connect(&admin).unwrap();
    std::io::Write::write_all(
        &mut c,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut c, &mut text).unwrap();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    };
    assert!(value("unifab_lu_backend_operations_total{lu=\"disk\"}") >= 3.0);
    assert_eq!(value("unifab_lu_backend_in_flight{lu=\"disk\"}"), 0.0);
    assert!(value("unifab_lu_backend_latency_microseconds_total{lu=\"disk\"}") > 0.0);
    assert_eq!(
        value("unifab_lu_write_path{lu=\"disk\",path=\"async\"}"),
        1.0
    );
}

#[test]
fn a_blocklisted_gateway_fences_the_lu() {
    let ceph = cluster(ObjectStore::Memstore);
    let dir = tempfile::tempdir().unwrap();
    let cfg = rbd_config(dir.path(), &ceph.conf(), "fenced", "64MiB", "");
    let gw = Gateway::start(dir.path(), &cfg);
    let mut s = session(&gw);
    s.clear_unit_attentions().unwrap();
    let data = vec![0x11u8; 8 * BS as usize];
    assert_eq!(s.write16(0, &data, BS, true).unwrap().status, 0);

    // The gateway's librados client is the image's watcher.
    let addr = watcher(&ceph, "rbd/fenced").expect("the gateway watches its image");
    // Writers keep commands in flight while the blocklist lands: librbd
    // parks a write that meets its exclusive lock being torn down and
    // never completes it, so the gateway has to notice the lock is gone.
    // Each writer's every command gets an answer (the session's 60 s read
    // timeout fails it otherwise), ending with NOT READY.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0u8..8)
        .map(|i| {
            let opts = RawOptions {
                timeout: Duration::from_secs(60),
                isid: [0x80, 0, 0, 0, 0x10, i],
                ..RawOptions::default()
            };
            let mut w = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
            w.clear_unit_attentions().unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let lba = 1024 * (u64::from(i) + 1);
                let block = vec![i; 8 * BS as usize];
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = w
                        .write16(lba, &block, BS, false)
                        .unwrap_or_else(|e| panic!("writer {i}, write {n}: no answer: {e}"));
                    n += 1;
                    if r.status == CHECK_CONDITION {
                        let sn = Sense::parse(&r.sense).expect("sense");
                        if sn.key == SenseKey::NOT_READY {
                            return Ok(n);
                        }
                    }
                }
                Err(n)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    ceph.ceph(&["osd", "blocklist", "add", &addr])
        .expect("ceph osd blocklist add");

    // The next write meets the blocklist: NOT READY, MANUAL INTERVENTION
    // REQUIRED; so does everything after it, reads included, even once the
    // blocklist entry is gone: a fenced LU stays fenced until reopened.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = s.write16(8, &data, BS, true).unwrap();
        if r.status == CHECK_CONDITION {
            let sn = sense(&r);
            if sn.key == SenseKey::NOT_READY {
                assert_eq!(
                    sn.asc,
                    asc::LOGICAL_UNIT_NOT_READY_MANUAL_INTERVENTION_REQUIRED
                );
                break;
            }
            assert_eq!(
                sn.key,
                SenseKey::ABORTED_COMMAND,
                "a blocklisted write failed otherwise: {sn:?}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "writes still succeed 60 s after the blocklist"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The writers end too, each on NOT READY (60 s at most after the
    // first did: then `stop` ends one still writing successfully, and the
    // assertion names it).
    let writers_deadline = Instant::now() + Duration::from_secs(60);
    while !writers.iter().all(std::thread::JoinHandle::is_finished)
        && Instant::now() < writers_deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (i, w) in writers.into_iter().enumerate() {
        match w.join().unwrap_or_else(|_| panic!("writer {i} failed")) {
            Ok(n) => assert!(
                n > 1,
                "writer {i} wrote {n} times: not in flight at the blocklist"
            ),
            Err(n) => panic!("writer {i}: {n} writes, still succeeding 60 s after the fence"),
        }
    }
    ceph.ceph(&["osd", "blocklist", "rm", &addr])
        .expect("ceph osd blocklist rm");
    let r = s.read16(0, 8, BS).unwrap();
    let sn = sense(&r);
    assert_eq!(
        (sn.key, sn.asc),
        (
            SenseKey::NOT_READY,
            asc::LOGICAL_UNIT_NOT_READY_MANUAL_INTERVENTION_REQUIRED
        ),
        "a fenced LU served a read"
    );
    let luns = show_json(dir.path(), "luns");
    assert_eq!(
        (&luns[0]["fenced"], &luns[0]["state"]),
        (&serde_json::json!(true), &serde_json::json!("fenced")),
        "{luns:?}"
    );

    // The manual intervention: `unifab reload` (the file unchanged) opens
    // the image again as a new librados client, taking the exclusive lock
    // the blocklisted one held, and the same session reads what was
    // written before the fence and writes again; nobody logged out.
    let dry = reload(&gw.config, true);
    let text = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(dry.status.success(), "{dry:?}");
    assert!(text.contains("* lu \"disk\" [live]"), "{text}");
    assert_eq!(
        show_json(dir.path(), "luns")[0]["fenced"],
        true,
        "a dry run reopened"
    );
    let out = reload(&gw.config, false);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "reload: {out:?}");
    assert!(
        text.contains("fenced off by the storage, opens again as a new client"),
        "{text}"
    );
    let luns = show_json(dir.path(), "luns");
    assert_eq!(luns[0]["state"], "ready", "{luns:?}");
    let r = s.read16(0, 8, BS).unwrap();
    assert_eq!(r.status, 0, "read after the reopen: {r:?}");
    assert!(r.data == data, "the data written before the fence differs");
    let more = vec![0x22u8; 8 * BS as usize];
    let w = s.write16(8, &more, BS, true).unwrap();
    assert_eq!(w.status, 0, "write after the reopen: {w:?}");
    assert!(s.read16(8, 8, BS).unwrap().data == more);
    let now = watcher(&ceph, "rbd/fenced").expect("a watcher after the reopen");
    assert_ne!(now, addr, "the blocklisted client still watches");
    // Nothing to reopen any more: the next reload changes nothing.
    let again = reload(&gw.config, false);
    let text = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(
        again.status.success() && text.contains("nothing to change"),
        "{again:?}"
    );
}

#[test]
fn a_second_gateway_refuses_an_image_another_holds() {
    let ceph = cluster(ObjectStore::Memstore);
    let dir = tempfile::tempdir().unwrap();
    let cfg = rbd_config(dir.path(), &ceph.conf(), "held", "64MiB", "");
    let gw = Gateway::start(dir.path(), &cfg);
    let mut s = session(&gw);
    s.clear_unit_attentions().unwrap();
    let data = vec![0x22u8; 8 * BS as usize];
    assert_eq!(s.write16(0, &data, BS, true).unwrap().status, 0);

    // A second gateway on the same image waits 3 s for the lock, then
    // refuses to start, naming the image.
    let dir2 = tempfile::tempdir().unwrap();
    let cfg2 = rbd_config(
        dir2.path(),
        &ceph.conf(),
        "held",
        "64MiB",
        "ceph_lock_timeout = 3",
    );
    let path = dir2.path().join("unifab.toml");
    std::fs::write(&path, cfg2).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_unifab"))
        .args(["run", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the second gateway still runs 60 s later: it took a held image");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "the second gateway started");
    assert!(
        err.contains("exclusive lock") && err.contains("rbd/held"),
        "the refusal does not name the lock and the image: {err}"
    );
    // The first gateway still serves, its data intact.
    assert_eq!(s.read16(0, 8, BS).unwrap().data, data);
    assert_eq!(s.write16(8, &data, BS, true).unwrap().status, 0);
}

/// The watcher address of `image` (its one librados client), from
/// `rbd status`.
fn watcher(ceph: &Ceph, image: &str) -> Option<String> {
    let status = ceph.rbd(&["status", image]).expect("rbd status");
    status
        .lines()
        .find_map(|l| l.trim().strip_prefix("watcher="))
        .and_then(|w| w.split_whitespace().next())
        .map(str::to_owned)
}

/// A fenced gateway's reload does not take an image another live gateway
/// opened meanwhile (it broke the fenced client's lock): it waits
/// `ceph_lock_timeout`, fails naming the lock, and the LU stays fenced,
/// serving nothing. Once that gateway is gone (killed: its watch expires),
/// the next reload reopens the LU and it serves what the other wrote.
#[test]
fn a_fenced_lu_is_not_reopened_while_another_gateway_holds_the_image() {
    let ceph = cluster(ObjectStore::Memstore);
    let extra = "ceph_lock_timeout = 3";
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Gateway::start(
        da.path(),
        &rbd_config(da.path(), &ceph.conf(), "taken", "64MiB", extra),
    );
    let mut sa = session(&a);
    sa.clear_unit_attentions().unwrap();
    let data = vec![0x31u8; 8 * BS as usize];
    assert_eq!(sa.write16(0, &data, BS, true).unwrap().status, 0);
    let addr = watcher(&ceph, "rbd/taken").expect("gateway A watches its image");
    ceph.ceph(&["osd", "blocklist", "add", &addr])
        .expect("ceph osd blocklist add");
    let deadline = Instant::now() + Duration::from_secs(60);
    while show_json(da.path(), "luns")[0]["fenced"] != true {
        // A's next command meets the blocklist.
        let _ = sa.write16(8, &data, BS, true).unwrap();
        assert!(
            Instant::now() < deadline,
            "A is not fenced 60 s after the blocklist"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Gateway B opens the image: A's client no longer watches it, so B
    // breaks its lock and takes it.
    let b = Gateway::start(
        db.path(),
        &rbd_config(db.path(), &ceph.conf(), "taken", "64MiB", extra),
    );
    let mut sb = session(&b);
    sb.clear_unit_attentions().unwrap();
    let other = vec![0x42u8; 8 * BS as usize];
    assert_eq!(sb.write16(0, &other, BS, true).unwrap().status, 0);

    let out = reload(&a.config, false);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "A reopened an image B holds: {out:?}"
    );
    assert!(
        err.contains("exclusive lock") && err.contains("rbd/taken"),
        "the refusal does not name the lock and the image: {err}"
    );
    let luns = show_json(da.path(), "luns");
    assert_eq!(luns[0]["state"], "fenced", "{luns:?}");
    let r = sa.read16(0, 8, BS).unwrap();
    assert_eq!(
        sense(&r).key,
        SenseKey::NOT_READY,
        "a fenced LU served a read"
    );
    // B is untouched.
    assert!(sb.read16(0, 8, BS).unwrap().data == other);

    // B goes away without releasing its lock; once its watch expires, A's
    // reload breaks the lock and serves B's data.
    drop(sb);
    b.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = reload(&a.config, false);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A does not reopen 60 s after B died: {out:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(show_json(da.path(), "luns")[0]["state"], "ready");
    let r = sa.read16(0, 8, BS).unwrap();
    assert_eq!(r.status, 0, "read after the reopen: {r:?}");
    assert!(r.data == other, "A does not read what B wrote");
}

/// COMPARE AND WRITE(16) of `blocks` blocks at `lba`: `compare` then
/// `write`, each `blocks` blocks long.
fn compare_and_write(s: &mut RawSession, lba: u64, compare: &[u8], write: &[u8]) -> CommandResult {
    let blocks = (compare.len() / BS as usize) as u8;
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = blocks;
    let data = [compare, write].concat();
    s.command(&cdb, &data, 0).unwrap()
}

fn counter_block(n: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    b[..8].copy_from_slice(&n.to_be_bytes());
    b
}

/// COMPARE AND WRITE goes to librbd (atomic at the OSD): two gateways on
/// one image, each incrementing a counter block with read + COMPARE AND
/// WRITE (VMware's ATS pattern), never lose an increment. With the compare
/// and the write done under each gateway's own lock instead, both would
/// win the same round. A miscompare names its first differing byte, and a
/// range across an object boundary (which librbd refuses) still works.
#[test]
fn compare_and_write_is_atomic_across_two_gateways() {
    let ceph = cluster(ObjectStore::Memstore);
    let extra = "ceph_exclusive_lock = false";
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Gateway::start(
        da.path(),
        &rbd_config(da.path(), &ceph.conf(), "ats", "64MiB", extra),
    );
    let b = Gateway::start(
        db.path(),
        &rbd_config(db.path(), &ceph.conf(), "ats", "64MiB", extra),
    );
    let mut s = session(&a);
    s.clear_unit_attentions().unwrap();
    assert_eq!(s.write16(0, &counter_block(0), BS, true).unwrap().status, 0);

    // The miscompare offset: two blocks, the first difference at byte 700.
    let mut two = vec![0x33u8; 2 * BS as usize];
    assert_eq!(s.write16(100, &two, BS, true).unwrap().status, 0);
    let mut wrong = two.clone();
    wrong[700] ^= 0xff;
    let r = compare_and_write(&mut s, 100, &wrong, &vec![0x44u8; 2 * BS as usize]);
    let sn = sense(&r);
    assert_eq!(sn.key, SenseKey::MISCOMPARE);
    assert_eq!(&r.sense[3..7], &700u32.to_be_bytes(), "INFORMATION: {sn:?}");
    assert_eq!(
        s.read16(100, 2, BS).unwrap().data,
        two,
        "a miscompare wrote"
    );
    // Across the 4 MiB object boundary: LBA 8191 and 8192.
    let edge = (4u64 << 20) / u64::from(BS) - 1;
    assert_eq!(s.write16(edge, &two, BS, true).unwrap().status, 0);
    two.iter_mut().for_each(|b| *b = 0x55);
    let r = compare_and_write(&mut s, edge, &vec![0x33u8; 2 * BS as usize], &two);
    assert_eq!(r.status, 0, "{:?}", Sense::parse(&r.sense));
    assert_eq!(s.read16(edge, 2, BS).unwrap().data, two);

    const EACH: u64 = 60;
    let run = |gw: &Gateway, isid: u8| {
        let opts = RawOptions {
            timeout: Duration::from_secs(60),
            isid: [0x80, 0, 0, 0, 0, isid],
            ..RawOptions::default()
        };
        let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
        s.clear_unit_attentions().unwrap();
        let (mut won, mut lost) = (0u64, 0u64);
        while won < EACH {
            let cur = s.read16(0, 1, BS).unwrap();
            assert_eq!(cur.status, 0);
            let v = u64::from_be_bytes(cur.data[..8].try_into().unwrap());
            let r = compare_and_write(&mut s, 0, &counter_block(v), &counter_block(v + 1));
            if r.status == 0 {
                won += 1;
            } else {
                assert_eq!(sense(&r).key, SenseKey::MISCOMPARE, "{:?}", sense(&r));
                lost += 1;
            }
        }
        lost
    };
    let (lost_a, lost_b) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| run(&a, 0x11));
        let tb = sc.spawn(|| run(&b, 0x12));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    eprintln!("miscompares: {lost_a} on gateway a, {lost_b} on gateway b");
    let end = s.read16(0, 1, BS).unwrap();
    assert_eq!(
        u64::from_be_bytes(end.data[..8].try_into().unwrap()),
        2 * EACH,
        "an increment was lost: two gateways both won one round"
    );
}
