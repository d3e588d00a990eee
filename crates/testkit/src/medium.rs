//! LU image files for tests that must show a medium did not change: a
//! pattern where libiscsi's suites write (LBA 0 on), and a digest of the
//! whole file to compare before and after.

use std::hash::Hasher;
use std::io::{self, Read};
use std::path::Path;

/// Writes a sparse image of `size` bytes whose first MiB (or all of it, if
/// smaller) holds a non-zero pattern, so a write of anything that got
/// through would show.
pub fn patterned(path: &Path, size: u64) -> io::Result<()> {
    let head = size.min(1 << 20) as u32;
    let pattern: Vec<u8> = (0..head).map(|i| (i % 253) as u8 ^ 0xa5).collect();
    std::fs::write(path, &pattern)?;
    std::fs::File::options()
        .write(true)
        .open(path)?
        .set_len(size)
}

/// A digest of a file's whole contents, read in 1 MiB pieces.
pub fn digest(path: &Path) -> io::Result<u64> {
    let mut f = std::fs::File::open(path)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.write(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_changes_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lu.img");
        patterned(&p, 4 << 20).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 << 20);
        let before = digest(&p).unwrap();
        assert_eq!(digest(&p).unwrap(), before);
        let mut bytes = std::fs::read(&p).unwrap();
        assert!(bytes[..1 << 20].iter().any(|b| *b != 0));
        bytes[(3 << 20) + 7] = 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_ne!(digest(&p).unwrap(), before);
    }
}
