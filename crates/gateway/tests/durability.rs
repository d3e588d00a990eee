//! Durability: a write the protocol calls stable (acknowledged FUA write, or
//! any write followed by an acknowledged SYNCHRONIZE CACHE) survives a
//! SIGKILL of the gateway. Loops with random data at random places.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Gateway, file_lu_config};
use rand::{Rng, RngExt, SeedableRng};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

const BS: u32 = 512;
const BLOCKS: u64 = (64 << 20) / BS as u64;

#[test]
fn acknowledged_stable_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = file_lu_config(dir.path(), "64MiB");
    let mut gw = Gateway::start(dir.path(), &cfg);
    let seed: u64 = rand::rng().random();
    eprintln!("durability seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // What the disk must hold: (lba, data) of every stable write.
    let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();

    for round in 0..25 {
        let mut s = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
        // Everything acknowledged earlier reads back, byte for byte.
        for (lba, data) in &expected {
            let r = s.read16(*lba, data.len() as u32 / BS, BS).unwrap();
            assert_eq!(r.status, 0, "round {round}: read of LBA {lba} failed");
            assert!(
                r.data == *data,
                "round {round}: LBA {lba} lost data after SIGKILL"
            );
        }
        // New writes: sometimes FUA, sometimes plain + SYNCHRONIZE CACHE.
        let fua = round % 2 == 0;
        for _ in 0..rng.random_range(1..8) {
            let blocks = rng.random_range(1..=256u32);
            let lba = rng.random_range(0..BLOCKS - u64::from(blocks));
            let mut data = vec![0u8; (blocks * BS) as usize];
            rng.fill_bytes(&mut data);
            let r = s.write16(lba, &data, BS, fua).unwrap();
            assert_eq!(r.status, 0, "write failed");
            // Later writes overwrite earlier ones: keep the model exact.
            apply(&mut expected, lba, data);
        }
        if !fua {
            let r = s.synchronize_cache().unwrap();
            assert_eq!(r.status, 0, "SYNCHRONIZE CACHE failed");
        }
        // Good status is in: kill the gateway at once, no logout.
        let cfg_path = gw.kill();
        gw = Gateway::start_with(cfg_path);
    }
    let mut s = RawSession::login(gw.addr, &gw.iqn, &RawOptions::default()).unwrap();
    for (lba, data) in &expected {
        let r = s.read16(*lba, data.len() as u32 / BS, BS).unwrap();
        assert!(r.data == *data, "final check: LBA {lba} lost data");
    }
}

/// Records a write in the model, trimming older overlapping extents.
fn apply(expected: &mut Vec<(u64, Vec<u8>)>, lba: u64, data: Vec<u8>) {
    let end = lba + data.len() as u64 / u64::from(BS);
    let mut next = Vec::new();
    for (l, d) in expected.drain(..) {
        let e = l + d.len() as u64 / u64::from(BS);
        if e <= lba || l >= end {
            next.push((l, d));
            continue;
        }
        if l < lba {
            next.push((l, d[..((lba - l) * u64::from(BS)) as usize].to_vec()));
        }
        if e > end {
            next.push((end, d[((end - l) * u64::from(BS)) as usize..].to_vec()));
        }
    }
    next.push((lba, data));
    *expected = next;
}
