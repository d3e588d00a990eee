//! The SIGKILL durability loop: a write the protocol calls stable (an
//! acknowledged FUA write, or any write followed by an acknowledged
//! SYNCHRONIZE CACHE) survives a SIGKILL of the gateway. Random data at
//! random places, checked after every restart.

use std::time::Duration;

use rand::{Rng, RngExt, SeedableRng};
use unifab_testkit::raw_iscsi::{RawOptions, RawSession};

use super::Gateway;

/// Block length of the LU under test.
pub const BS: u32 = 512;

/// Runs `rounds` rounds against LUN 0 of `gw` (a LU of `blocks` blocks):
/// each checks everything acknowledged so far, writes 1–7 random extents
/// (FUA on even rounds, SYNCHRONIZE CACHE after them on odd ones), and
/// SIGKILLs and restarts the gateway. Panics on the first lost byte.
pub fn survive_sigkill(mut gw: Gateway, rounds: u32, blocks: u64) {
    let seed: u64 = rand::rng().random();
    eprintln!("durability seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // What the disk must hold: (lba, data) of every stable write.
    let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();
    // A restarted gateway on shared storage may first wait for the storage
    // to hand it the image (an RBD exclusive lock held by the killed
    // process): a bound on that wait, not a speed claim.
    let opts = RawOptions {
        timeout: Duration::from_secs(60),
        ..RawOptions::default()
    };

    for round in 0..rounds {
        let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
        // Everything acknowledged earlier reads back, byte for byte.
        for (lba, data) in &expected {
            let r = s.read16(*lba, data.len() as u32 / BS, BS).unwrap();
            assert_eq!(r.status, 0, "round {round}: read of LBA {lba} failed");
            assert!(
                r.data == *data,
                "round {round}: LBA {lba} lost data after SIGKILL"
            );
        }
        let fua = round % 2 == 0;
        for _ in 0..rng.random_range(1..8) {
            let n = rng.random_range(1..=256u32);
            let lba = rng.random_range(0..blocks - u64::from(n));
            let mut data = vec![0u8; (n * BS) as usize];
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
    let mut s = RawSession::login(gw.addr, &gw.iqn, &opts).unwrap();
    for (lba, data) in &expected {
        let r = s.read16(*lba, data.len() as u32 / BS, BS).unwrap();
        assert!(r.data == *data, "final check: LBA {lba} lost data");
    }
}

/// Records a write in the model, trimming older overlapping extents.
pub fn apply(expected: &mut Vec<(u64, Vec<u8>)>, lba: u64, data: Vec<u8>) {
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
