//! Numbered FCoE frames for the link tests: each carries its sequence
//! number right after the Ethernet header.

use bytes::Bytes;
use unifab_fcoe::link::EthLink;

/// Sends `n` 64-byte FCoE frames numbered from `first` from `from` to
/// `to`, each handed to the wire at once.
pub fn send(from: &mut EthLink, to: [u8; 6], first: u32, n: u32) {
    let src = from.mac.0;
    for seq in first..first + n {
        from.tx
            .send(64, &mut |buf| {
                buf[..6].copy_from_slice(&to);
                buf[6..12].copy_from_slice(&src);
                buf[12..14].copy_from_slice(&0x8906u16.to_be_bytes());
                buf[14..18].copy_from_slice(&seq.to_be_bytes());
                buf[18..64].fill(0xa5);
                Ok(64)
            })
            .expect("send");
        from.tx.flush().expect("flush");
    }
}

/// The sequence numbers of received frames.
#[allow(dead_code)] // not every test reads them
pub fn seqs(frames: &[Bytes]) -> Vec<u32> {
    frames
        .iter()
        .map(|f| u32::from_be_bytes([f[14], f[15], f[16], f[17]]))
        .collect()
}
