//! An independent decoder for tests: frames written to a classic pcap
//! file and read back by Wireshark's `tshark` (Debian package `tshark`).
//! A test that uses it fails with the reason when tshark is missing; it
//! never skips itself.

use std::path::PathBuf;
use std::process::Command;

/// A classic (libpcap) capture file being written in memory.
#[derive(Debug, Clone)]
pub struct PcapWriter {
    bytes: Vec<u8>,
    count: u32,
}

impl PcapWriter {
    /// LINKTYPE_ETHERNET.
    pub const ETHERNET: u32 = 1;
    /// LINKTYPE_FC_2: Fibre Channel frames, header to payload.
    pub const FC_2: u32 = 224;

    /// An empty capture of `link_type` frames (snap length 65,535).
    pub fn new(link_type: u32) -> PcapWriter {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        bytes.extend_from_slice(&2u16.to_le_bytes());
        bytes.extend_from_slice(&4u16.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&65535u32.to_le_bytes());
        bytes.extend_from_slice(&link_type.to_le_bytes());
        PcapWriter { bytes, count: 0 }
    }

    /// Appends one frame; frame N is stamped N seconds after the epoch.
    pub fn push(&mut self, frame: &[u8]) {
        let len = u32::try_from(frame.len()).expect("a frame under 4 GiB");
        self.bytes.extend_from_slice(&self.count.to_le_bytes());
        self.bytes.extend_from_slice(&0u32.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(frame);
        self.count += 1;
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A capture on disk, and tshark to read it.
#[derive(Debug)]
pub struct Tshark {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tshark {
    /// Writes `pcap` to a temporary file named `name`, and a copy to
    /// `$UNIFAB_TSHARK_PCAP` when that is set (for a person to look at).
    ///
    /// # Panics
    ///
    /// When tshark is not installed: it is the decoder the test needs.
    pub fn new(name: &str, pcap: &[u8]) -> Tshark {
        let installed = Command::new("tshark")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            installed,
            "tshark is not installed (Debian package `tshark`): it is the independent decoder this test needs"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join(name);
        std::fs::write(&path, pcap).expect("the capture is written");
        if let Some(keep) = std::env::var_os("UNIFAB_TSHARK_PCAP") {
            std::fs::copy(&path, keep).expect("the capture is copied");
        }
        Tshark { _dir: dir, path }
    }

    /// `tshark -r FILE -Y FILTER [-T fields -e F …]`: its standard output.
    ///
    /// # Panics
    ///
    /// When tshark fails (with its standard error).
    pub fn run(&self, filter: &str, fields: &[&str]) -> String {
        let mut c = Command::new("tshark");
        c.arg("-r").arg(&self.path).arg("-Y").arg(filter);
        if !fields.is_empty() {
            c.arg("-T").arg("fields");
            for f in fields {
                c.arg("-e").arg(f);
            }
        }
        let o = c.output().expect("tshark runs");
        assert!(
            o.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Asserts that tshark marks no frame malformed or short and raises no
    /// expert item of warning severity or worse.
    pub fn assert_no_complaint(&self) {
        let bad = self.run(
            "_ws.malformed || _ws.short || _ws.expert.severity >= 0x00800000",
            &[],
        );
        assert!(bad.trim().is_empty(), "tshark complains:\n{bad}");
    }
}
