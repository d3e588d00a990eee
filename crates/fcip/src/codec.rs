//! Finding encapsulated frames in a TCP byte stream (RFC 3821 §5.6.2).
//!
//! Every frame is checked before it is handed on. The mandatory checks:
//! Frame Length in 16–544 words with a matching complement, and a valid
//! EOF word. The optional checks unifab also applies: Protocol#/Version
//! and their complements, the repeated first word, pFlags/reserved and
//! their complements, a valid SOF word, the header CRC when CRCV is set,
//! and (configurable) the FC CRC.
//!
//! A failed check means the receiver has lost synchronisation with the
//! stream. With resynchronisation enabled (Appendix D) the decoder
//! searches forward for a position where a whole frame passes every
//! check and is followed by the start of another valid header (or by the
//! end of what has arrived); it gives up, and the connection must be
//! closed, after [`DecoderConfig::max_resync_bytes`]. Without it the
//! first failure closes the connection.

use bytes::{Bytes, BytesMut};

use crate::wire::WireError;
use crate::wire::encap::{ENCAP_LEN, EncapHeader};
use crate::wire::frame::FcipFrame;
use crate::wire::fsf::{SPECIAL_FRAME_LEN, SpecialFrame};

/// Decoder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Check the FC CRC of every frame.
    pub check_fc_crc: bool,
    /// Try to resynchronise after a bad frame instead of closing.
    pub resync: bool,
    /// How far to search for the next good frame before giving up.
    pub max_resync_bytes: usize,
}

impl Default for DecoderConfig {
    fn default() -> DecoderConfig {
        DecoderConfig {
            check_fc_crc: true,
            resync: true,
            max_resync_bytes: 4 * crate::wire::frame::MAX_FRAME_LEN,
        }
    }
}

/// What the decoder found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// An encapsulated FC frame (all of it, header to EOF word).
    Frame(Bytes),
    /// A special frame (76 bytes).
    Special(Bytes),
}

/// Loss of synchronisation the decoder could not repair: close the
/// connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A frame failed its checks and no good frame followed within the
    /// search window (or resynchronisation is off).
    #[error("lost synchronisation ({cause}); {skipped} bytes searched without finding a frame")]
    LostSync {
        /// The first check that failed.
        cause: WireError,
        /// Bytes searched.
        skipped: usize,
    },
}

/// Decoder counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecoderStats {
    /// Frames handed on.
    pub frames: u64,
    /// Times synchronisation was lost and found again.
    pub resyncs: u64,
    /// Bytes discarded while resynchronising.
    pub discarded: u64,
}

/// The stream decoder. Sans-IO: the caller appends what it reads and
/// takes frames out.
#[derive(Debug)]
pub struct Decoder {
    cfg: DecoderConfig,
    buf: BytesMut,
    /// Set while searching: the error that started the search.
    lost: Option<WireError>,
    /// Bytes discarded in the current search.
    searched: usize,
    stats: DecoderStats,
}

enum Check {
    Good(usize, bool),
    NeedMore,
    Bad(WireError),
}

impl Decoder {
    /// A decoder with `cfg`.
    pub fn new(cfg: DecoderConfig) -> Decoder {
        Decoder {
            cfg,
            buf: BytesMut::with_capacity(64 * 1024),
            lost: None,
            searched: 0,
            stats: DecoderStats::default(),
        }
    }

    /// Appends received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The receive buffer, to read into directly.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes waiting.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Counters.
    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Checks the frame starting at `at`.
    fn check_at(&self, at: usize) -> Check {
        let b = &self.buf[at..];
        if b.len() < 16 {
            return Check::NeedMore;
        }
        let h = EncapHeader::new_unchecked(b);
        // Length and its complement first: everything else needs the length.
        let n = usize::from(h.frame_len()) * 4;
        if b.len() < ENCAP_LEN {
            // Enough for the words that are already there to be wrong.
            if h.flags_len_complement() != !h.flags_len_word() {
                return Check::Bad(WireError::Complement("Flags/Frame Length"));
            }
            return Check::NeedMore;
        }
        if let Err(e) = h.check() {
            return Check::Bad(e);
        }
        if b.len() < n {
            return Check::NeedMore;
        }
        let frame = &b[..n];
        if h.pflags().special() {
            if n != SPECIAL_FRAME_LEN {
                return Check::Bad(WireError::FrameLength(h.frame_len()));
            }
            return match SpecialFrame::new_checked(frame) {
                Ok(_) => Check::Good(n, true),
                Err(e) => Check::Bad(e),
            };
        }
        match FcipFrame::new_checked(frame).and_then(|f| f.check(self.cfg.check_fc_crc)) {
            Ok(()) => Check::Good(n, false),
            Err(e) => Check::Bad(e),
        }
    }

    /// The next frame, `Ok(None)` if more bytes are needed.
    pub fn decode(&mut self) -> Result<Option<Item>, CodecError> {
        loop {
            if let Some(cause) = self.lost.clone() {
                return self.resync(cause);
            }
            match self.check_at(0) {
                Check::NeedMore => return Ok(None),
                Check::Good(n, special) => {
                    self.stats.frames += 1;
                    let f = self.buf.split_to(n).freeze();
                    return Ok(Some(if special {
                        Item::Special(f)
                    } else {
                        Item::Frame(f)
                    }));
                }
                Check::Bad(e) => {
                    if !self.cfg.resync {
                        return Err(CodecError::LostSync {
                            cause: e,
                            skipped: 0,
                        });
                    }
                    self.lost = Some(e);
                }
            }
        }
    }

    fn resync(&mut self, cause: WireError) -> Result<Option<Item>, CodecError> {
        let limit = self.cfg.max_resync_bytes;
        let mut at = 1;
        while at < self.buf.len() && at <= limit {
            let b = &self.buf[at..];
            let looks = b.len() < 8
                || (b[0] == 1 && b[1] == 1 && b[2] == 0xfe && b[3] == 0xfe && b[..4] == b[4..8]);
            if looks {
                match self.check_at(at) {
                    Check::NeedMore => {
                        // Drop what is certainly garbage and wait.
                        self.discard(at);
                        return self.give_up_after(limit, cause);
                    }
                    Check::Good(n, _) => {
                        // The frame after it must start well too, if it is here.
                        let next = at + n;
                        let follows = match self.check_at(next) {
                            Check::Good(..) | Check::NeedMore => true,
                            Check::Bad(_) => false,
                        };
                        if follows {
                            self.discard(at);
                            self.lost = None;
                            self.searched = 0;
                            self.stats.resyncs += 1;
                            return self.decode();
                        }
                    }
                    Check::Bad(_) => {}
                }
            }
            at += 1;
        }
        if at > limit {
            return Err(CodecError::LostSync { cause, skipped: at });
        }
        // Everything but the last few bytes is garbage; keep searching later.
        let keep = self.buf.len().min(7);
        let drop = self.buf.len() - keep;
        self.discard(drop);
        self.give_up_after(limit, cause)
    }

    fn give_up_after(&self, limit: usize, cause: WireError) -> Result<Option<Item>, CodecError> {
        if self.searched > limit {
            return Err(CodecError::LostSync {
                cause,
                skipped: self.searched,
            });
        }
        Ok(None)
    }

    fn discard(&mut self, n: usize) {
        let _ = self.buf.split_to(n);
        self.stats.discarded += n as u64;
        self.searched += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::FcipFrameRepr;
    use unifab_fc::wire::frame::Frame;
    use unifab_fc::wire::{FcHeaderRepr, FcId};

    fn frame(payload_len: usize) -> Vec<u8> {
        let h = FcHeaderRepr {
            d_id: FcId::new(0x010200),
            ..FcHeaderRepr::default()
        };
        let f = Frame::new(h, Bytes::from(vec![0xab; payload_len]));
        FcipFrameRepr::new(f).to_bytes().unwrap()
    }

    #[test]
    fn frames_split_anywhere_are_found() {
        let mut stream = Vec::new();
        for n in [0, 4, 2048, 2112, 36] {
            stream.extend(frame(n));
        }
        for chunk in [1, 3, 7, 100, 5000] {
            let mut d = Decoder::new(DecoderConfig::default());
            let mut got = 0;
            for c in stream.chunks(chunk) {
                d.extend(c);
                while let Some(Item::Frame(_)) = d.decode().unwrap() {
                    got += 1;
                }
            }
            assert_eq!(got, 5, "chunk {chunk}");
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn garbage_between_frames_is_skipped_and_counted() {
        let mut stream = frame(64);
        stream.extend([0x01, 0x01, 0xfe, 0xfe, 0x55, 0x55, 0x99]);
        stream.extend(frame(128));
        stream.extend(frame(8));
        let mut d = Decoder::new(DecoderConfig::default());
        d.extend(&stream);
        let mut got = 0;
        while d.decode().unwrap().is_some() {
            got += 1;
        }
        assert_eq!(got, 3);
        assert_eq!(d.stats().resyncs, 1);
        assert_eq!(d.stats().discarded, 7);
    }

    #[test]
    fn a_bad_crc_is_lost_sync_without_resync() {
        let mut f = frame(64);
        let n = f.len();
        f[n - 20] ^= 1;
        let mut d = Decoder::new(DecoderConfig {
            resync: false,
            ..DecoderConfig::default()
        });
        d.extend(&f);
        assert!(matches!(
            d.decode(),
            Err(CodecError::LostSync {
                cause: WireError::FcCrc { .. },
                ..
            })
        ));
    }

    #[test]
    fn endless_garbage_closes() {
        let mut d = Decoder::new(DecoderConfig::default());
        let junk = vec![0x5au8; 64 * 1024];
        let mut closed = false;
        for c in junk.chunks(1000) {
            d.extend(c);
            if d.decode().is_err() {
                closed = true;
                break;
            }
        }
        assert!(closed);
    }
}
