//! Reading a TCP socket with one `recv` per readiness event where one is
//! enough, and keeping what a peer sends from pinning more memory than it
//! is charged for.

use std::collections::VecDeque;
use std::io;

use bytes::{Bytes, BytesMut};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::wire::{BHS_LEN, Check, Framer, PduFrame, WireError};

/// What one read gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    /// The peer closed its side.
    Eof,
    /// `n` bytes; `drained` when they were fewer than there was room for,
    /// so the socket held no more at that moment.
    Data { n: usize, drained: bool },
    /// Nothing to read: wait for readiness.
    Empty,
}

/// Reads what `stream` holds into `buf`'s spare capacity (at least a few
/// bytes of it), at most `max` bytes. After a short read, tokio's
/// readiness for the socket is cleared as if the read had hit `EAGAIN`,
/// so the next wait goes straight to the poller instead of spending a
/// `recv` that finds nothing. Sound with edge-triggered readiness: data
/// that arrives after the read raises a new event, and tokio clears only
/// the readiness it had seen before it.
pub(crate) fn read_some(
    stream: &TcpStream,
    buf: &mut BytesMut,
    max: usize,
) -> io::Result<ReadOutcome> {
    use bytes::BufMut;
    let mut got = None;
    let r = stream.try_io(Interest::READABLE, || {
        let room = (buf.capacity() - buf.len()).min(max);
        let n = stream.try_read_buf(&mut (&mut *buf).limit(room))?;
        let drained = n > 0 && n < room;
        got = Some((n, drained));
        if drained {
            // The bytes are in `buf`; this only tells tokio the socket is
            // empty.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (r, got) {
        (Ok(0), _) => Ok(ReadOutcome::Eof),
        (Ok(n), _) => Ok(ReadOutcome::Data { n, drained: false }),
        (Err(_), Some((n, true))) => Ok(ReadOutcome::Data { n, drained: true }),
        (Err(e), _) if e.kind() == io::ErrorKind::WouldBlock => Ok(ReadOutcome::Empty),
        (Err(e), _) => Err(e),
    }
}

/// The most receive memory a kept data segment may keep alive, as a
/// multiple of its own length. See [`RecvAlloc`].
pub(crate) const MAX_PIN_RATIO: usize = 4;

/// The allocation behind a receive buffer, as the PDUs split off it share
/// it.
///
/// A data segment split off the buffer is a slice of that allocation and
/// keeps all of it alive for as long as it is held. Limits on what a peer
/// may make a session hold (the write budget, the output queue) count
/// data bytes. Without a check, a peer could send a small Data-Out for a
/// write that stays open, followed by a large PDU that is handled and
/// dropped at once, and repeat: each small slice would pin a whole
/// buffer, up to the largest PDU plus the read-ahead (hundreds of KiB),
/// against a few KiB of budget. [`RecvAlloc::keepable`] copies a segment
/// shorter than 1/[`MAX_PIN_RATIO`] of its allocation, so what a session
/// holds in slices never keeps more than [`MAX_PIN_RATIO`] times its
/// length alive. Large segments, the ones that matter for throughput,
/// stay zero-copy.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvAlloc {
    /// Address of the allocation's first byte, as far as seen.
    base: usize,
    /// Its size, as far as seen.
    size: usize,
}

impl RecvAlloc {
    /// Notes where `buf` lives now. Call it after anything that may have
    /// moved or grown the buffer (a reserve, a read into it, a new
    /// buffer): a pointer outside the allocation seen so far means a new
    /// one, which then starts at the pointer (a reserve that reallocates
    /// copies the unread bytes to its start).
    pub fn note(&mut self, buf: &BytesMut) {
        let at = buf.as_ptr() as usize;
        let end = at.saturating_add(buf.capacity());
        if at >= self.base && at <= self.base.saturating_add(self.size) {
            self.size = self.size.max(end - self.base);
        } else {
            self.base = at;
            self.size = buf.capacity();
        }
    }

    /// `data`, split off the buffer, in a form a session may keep: the
    /// slice itself when it is at least 1/[`MAX_PIN_RATIO`] of the
    /// allocation it would keep alive, otherwise a copy of its bytes.
    pub fn keepable(&self, data: Bytes) -> Bytes {
        if !data.is_empty() && data.len().saturating_mul(MAX_PIN_RATIO) < self.size {
            Bytes::copy_from_slice(&data)
        } else {
            data
        }
    }
}

/// How much input one wake-up reads before the PDUs are handled (more
/// stays in the socket for the next turn).
pub(crate) const READ_AHEAD_LIMIT: usize = 256 << 10;

/// A data segment at least this long is read into a buffer made for its
/// PDU: of the bytes that arrive with it, only those read with its header
/// are copied, once.
const LARGE_PDU: usize = 32 << 10;

/// The least a read asks for beyond the PDU it completes.
const MIN_READ: usize = 8 << 10;

/// The most a read asks for beyond the PDU it completes: small PDUs
/// (4 KiB writes at queue depth) arrive in runs this long per `recv`.
const MAX_READ: usize = 64 << 10;

/// Gives `buf` room for `cap` bytes in all and returns how many bytes it
/// copied to do so: its unread bytes, or nothing.
///
/// `BytesMut::reserve` can copy more. On a buffer whose allocation is not
/// shared, it grows the whole allocation, and `realloc` copies the bytes
/// in front of the unread ones too; a receive buffer's front is the PDUs
/// already split off, a large write's data among them.
pub(crate) fn make_room(buf: &mut BytesMut, cap: usize) -> usize {
    if buf.capacity() >= cap {
        return 0;
    }
    let at = buf.as_ptr();
    if buf.try_reclaim(cap - buf.len()) {
        // Reclaiming moves the unread bytes to the allocation's start.
        return if buf.as_ptr() == at { 0 } else { buf.len() };
    }
    let mut fresh = BytesMut::with_capacity(cap);
    fresh.extend_from_slice(buf);
    *buf = fresh;
    buf.len()
}

/// What one [`Receiver::read_ready`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Reads {
    /// Bytes arrived: [`Receiver::next`] may have PDUs.
    pub got: bool,
    /// The peer closed its side.
    pub eof: bool,
}

/// A connection's receive side: reads the socket into one buffer and
/// splits PDUs off it without copying their data.
///
/// Room is made for the whole PDU whose header has arrived, so a large
/// data segment lands in one allocation and is handed on as a slice of it.
/// When the buffer fills during one wake-up's reads, the whole PDUs in it
/// are split off first and kept in arrival order, so that growing the
/// buffer copies only the partial PDU at its end, never data already
/// received whole.
#[derive(Debug)]
pub(crate) struct Receiver {
    framer: Framer,
    buf: BytesMut,
    /// The allocation the PDUs split off `buf` share.
    alloc: RecvAlloc,
    /// Whole PDUs split off during reads, or what decoding found, in order.
    staged: VecDeque<Result<PduFrame, WireError>>,
    /// A framing error was found: nothing after it is decoded.
    lost: bool,
    /// Bytes copied to make room, all told.
    copied: u64,
    /// How far beyond a known PDU a read goes: [`MIN_READ`] after a large
    /// PDU, doubling up to [`MAX_READ`] while PDUs are small. It carries
    /// over from one wake-up to the next, as the initiator's mix does.
    grow: usize,
}

impl Receiver {
    /// A receiver whose buffer starts with `buf` (bytes read during login
    /// beyond its last PDU).
    pub fn new(framer: Framer, buf: BytesMut) -> Self {
        Receiver {
            framer,
            buf,
            alloc: RecvAlloc::default(),
            staged: VecDeque::new(),
            lost: false,
            copied: 0,
            grow: MIN_READ,
        }
    }

    /// Bytes copied to make room so far (whole PDUs are never copied).
    #[cfg(test)]
    pub fn copied(&self) -> u64 {
        self.copied
    }

    /// Reads what `stream` holds, up to [`READ_AHEAD_LIMIT`], without
    /// waiting. A short read drained the socket: no second `recv` to find
    /// it empty ([`read_some`]).
    pub fn read_ready(&mut self, stream: &TcpStream) -> io::Result<Reads> {
        let mut reads = Reads::default();
        if self.lost {
            return Ok(reads);
        }
        // Room for the rest of the PDU at the front, and a little beyond;
        // reads stop at `end` even where the allocation is larger, so the
        // PDU after it is not cut at an arbitrary point.
        let mut end = self.room();
        let mut read = 0usize;
        loop {
            let max = end - self.buf.len();
            match read_some(stream, &mut self.buf, max)? {
                ReadOutcome::Eof => {
                    reads.eof = true;
                    return Ok(reads);
                }
                ReadOutcome::Empty => return Ok(reads),
                ReadOutcome::Data { n, drained } => {
                    reads.got = true;
                    read += n;
                    if drained || read >= READ_AHEAD_LIMIT {
                        return Ok(reads);
                    }
                }
            }
            if end - self.buf.len() >= 1024 {
                continue;
            }
            // At `end`: split the whole PDUs off before the buffer grows.
            let before = self.staged.len();
            self.stage();
            if self.lost {
                return Ok(reads);
            }
            let (mut large, mut small) = (false, 0usize);
            for f in self.staged.range(before..).flatten() {
                if f.data.len() >= LARGE_PDU {
                    large = true;
                } else {
                    small += BHS_LEN + f.data.len();
                }
            }
            // Small PDUs filled the read: read more of them at once. After
            // a large one, read little beyond the next header: that little
            // is what the room made for the PDU behind it copies.
            if large {
                self.grow = MIN_READ;
            } else if small >= self.grow / 2 {
                self.grow = (self.grow * 2).min(MAX_READ);
            }
            end = self.room();
        }
    }

    /// Makes room for the rest of the PDU at the front and [`Self::grow`]
    /// bytes beyond it, and returns where reading stops. A buffer that
    /// already holds the whole PDU is not moved for the bytes beyond it:
    /// each PDU is copied at most once after its header has arrived.
    fn room(&mut self) -> usize {
        let len = self.buf.len();
        let need = match self.framer.check(&self.buf) {
            Ok(Check::Incomplete(n)) => n,
            Ok(Check::Complete(_)) | Err(_) => 0,
        };
        let want = need.max(len + self.grow);
        if need > len && self.buf.capacity() >= need {
            return want.min(self.buf.capacity());
        }
        self.copied += make_room(&mut self.buf, want) as u64;
        want
    }

    /// Splits every whole PDU at the front of the buffer off into
    /// `staged`. A framing error is staged last: nothing beyond it can be
    /// trusted.
    fn stage(&mut self) {
        while let Some(decoded) = self.decode() {
            self.staged.push_back(decoded);
        }
    }

    fn decode(&mut self) -> Option<Result<PduFrame, WireError>> {
        if self.lost {
            return None;
        }
        self.alloc.note(&self.buf);
        match self.framer.decode(&mut self.buf) {
            Ok(Some(mut frame)) => {
                frame.data = self.alloc.keepable(frame.data);
                Some(Ok(frame))
            }
            Ok(None) => None,
            // The PDU is consumed; the stream goes on (RFC 7143 §7.8).
            Err(e @ WireError::DataDigest { .. }) => Some(Err(e)),
            Err(e) => {
                self.lost = true;
                Some(Err(e))
            }
        }
    }

    /// The next PDU in arrival order, or what decoding it found; `None`
    /// when no whole PDU is buffered (or after a framing error, which is
    /// returned once).
    pub fn next(&mut self) -> Option<Result<PduFrame, WireError>> {
        self.staged.pop_front().or_else(|| self.decode())
    }

    /// Lets go of a buffer larger than `keep` when nothing is buffered, so
    /// that an idle session does not hold one.
    pub fn shrink_when_empty(&mut self, keep: usize) {
        if self.buf.is_empty() && self.staged.is_empty() && self.buf.capacity() > keep {
            self.buf = BytesMut::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(b: &Bytes, alloc: &RecvAlloc) -> bool {
        let p = b.as_ptr() as usize;
        p >= alloc.base && p < alloc.base + alloc.size
    }

    /// The pattern of the target's read loop: reserve, read, split PDUs
    /// off, reserve again once the first PDUs are held elsewhere (which
    /// makes the buffer shared, so the reserve must allocate anew).
    #[test]
    fn small_segments_are_copied_and_large_ones_kept_across_reallocations() {
        let mut buf = BytesMut::new();
        let mut alloc = RecvAlloc::default();
        buf.reserve(64 * 1024);
        alloc.note(&buf);
        assert!(alloc.size >= 64 * 1024, "{alloc:?}");
        let first = alloc;

        // One read: a 2 KiB segment, then 40 KiB.
        buf.extend_from_slice(&[1u8; 2048]);
        buf.extend_from_slice(&[2u8; 40 * 1024]);
        alloc.note(&buf);
        assert_eq!(
            alloc, first,
            "a read into spare room is the same allocation"
        );
        let small = buf.split_to(2048).freeze();
        let large = buf.split_to(40 * 1024).freeze();
        assert!(within(&small, &alloc) && within(&large, &alloc));

        let kept_small = alloc.keepable(small.clone());
        assert_eq!(kept_small, small);
        assert!(!within(&kept_small, &alloc), "2 KiB of 64 KiB is copied");
        let kept_large = alloc.keepable(large.clone());
        assert_eq!(
            kept_large.as_ptr(),
            large.as_ptr(),
            "40 KiB of 64 KiB is kept"
        );

        // The held slices share the allocation: growing past its end
        // needs a new one.
        buf.extend_from_slice(&[3u8; 100]);
        buf.reserve(200 * 1024);
        alloc.note(&buf);
        assert_ne!(alloc.base, first.base, "{alloc:?} after {first:?}");
        assert!(alloc.size >= 200 * 1024);
        assert_eq!(&buf[..], &[3u8; 100][..], "unread bytes move to the start");
        let tail = buf.split_to(100).freeze();
        assert!(!within(&alloc.keepable(tail.clone()), &alloc));
        assert_eq!(alloc.keepable(tail.clone()), tail);

        // Emptiness is never copied.
        assert!(alloc.keepable(Bytes::new()).is_empty());
    }

    /// Consuming the buffer up to its end and noting it there (capacity
    /// 0) is still the same allocation; a fresh empty buffer is a new,
    /// empty one, and nothing split off it is copied.
    #[test]
    fn the_end_of_an_allocation_is_still_that_allocation() {
        let mut buf = BytesMut::with_capacity(4096);
        let mut alloc = RecvAlloc::default();
        alloc.note(&buf);
        let size = alloc.size;
        buf.extend_from_slice(&vec![7u8; buf.capacity()]);
        let _all = buf.split();
        alloc.note(&buf);
        assert_eq!(alloc.size, size);
        let mut fresh = BytesMut::new();
        alloc.note(&fresh);
        assert_eq!(alloc.size, 0);
        fresh.extend_from_slice(b"abc");
        let d = fresh.split().freeze();
        assert_eq!(alloc.keepable(d.clone()).as_ptr(), d.as_ptr());
    }

    /// A Data-Out-shaped PDU: ITT `itt`, `len` data bytes of `fill`, the
    /// data digest right unless `bad_digest`.
    fn pdu(itt: u32, len: usize, fill: u8, bad_digest: bool) -> Vec<u8> {
        use crate::wire::digest;
        let mut p = vec![0u8; 48];
        p[0] = 0x05;
        p[5..8].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        p[16..20].copy_from_slice(&itt.to_be_bytes());
        if len > 0 {
            let mut data = vec![fill; len];
            data.resize(len.next_multiple_of(4), 0);
            let crc = digest::crc32c(&data) ^ u32::from(bad_digest);
            p.extend_from_slice(&data);
            p.extend_from_slice(&digest::to_wire(crc));
        }
        p
    }

    fn framer() -> Framer {
        Framer {
            digests: crate::wire::Digests {
                header: false,
                data: true,
            },
            max_data_segment_length: 256 << 10,
        }
    }

    /// Connects a client to a server socket on loopback.
    async fn pair() -> (std::net::TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// Everything the peer sends, as the receiver hands it on: (ITT, data
    /// length, data intact) per PDU, or the ITT of a data digest error.
    async fn receive_all(rx: &mut Receiver, server: &TcpStream) -> Vec<Result<(u32, usize), u32>> {
        let mut got = Vec::new();
        loop {
            server.readable().await.unwrap();
            let reads = rx.read_ready(server).unwrap();
            while let Some(d) = rx.next() {
                got.push(match d {
                    Ok(f) => {
                        let itt = u32::from_be_bytes(f.bhs[16..20].try_into().unwrap());
                        let fill = (itt % 251) as u8;
                        assert!(
                            f.data.iter().all(|&b| b == fill),
                            "PDU {itt}'s data is not what was sent"
                        );
                        Ok((itt, f.data.len()))
                    }
                    Err(WireError::DataDigest { bhs, .. }) => {
                        Err(u32::from_be_bytes(bhs[16..20].try_into().unwrap()))
                    }
                    Err(e) => panic!("unexpected {e}"),
                });
            }
            if reads.eof {
                return got;
            }
        }
    }

    /// Sends `sizes` (PDU data lengths; ITT = index; the PDU at `bad`
    /// with a wrong data digest) in uneven pieces, none aligned to a PDU,
    /// and checks that every PDU comes out whole and in order, the bad one
    /// as a digest error in its place. Returns the bytes sent and the
    /// bytes the receiver copied to make room.
    async fn send_and_receive(sizes: &[usize], bad: usize) -> (usize, u64) {
        use std::io::Write;
        let (mut client, server) = pair().await;
        let mut wire = Vec::new();
        for (itt, &len) in sizes.iter().enumerate() {
            wire.extend(pdu(itt as u32, len, (itt % 251) as u8, itt == bad));
        }
        let total = wire.len();
        let writer = std::thread::spawn(move || {
            let mut at = 0;
            let mut step = 7_001usize;
            while at < wire.len() {
                let end = (at + step).min(wire.len());
                client.write_all(&wire[at..end]).unwrap();
                at = end;
                step = (step * 7 + 4_099) % 300_000 + 1;
            }
        });
        let mut rx = Receiver::new(framer(), BytesMut::new());
        let got = receive_all(&mut rx, &server).await;
        writer.join().unwrap();
        let want: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(itt, &len)| {
                if itt == bad {
                    Err(bad as u32)
                } else {
                    Ok((itt as u32, len))
                }
            })
            .collect();
        assert_eq!(got, want);
        (total, rx.copied())
    }

    /// A stream of large writes (what a 1 MiB write is on the wire: 256 KiB
    /// segments) is received without copying beyond what comes in with
    /// each header: a buffer grown with the PDUs already read still in it
    /// would copy each of them again.
    #[tokio::test]
    async fn large_data_segments_are_received_in_place() {
        let sizes: Vec<usize> = (0..64)
            .map(|i| if i % 5 == 4 { 0 } else { 256 << 10 })
            .collect();
        let (total, copied) = send_and_receive(&sizes, 33).await;
        // At most the 8 KiB read beyond each PDU's predecessor, and a
        // little before the first.
        assert!(
            copied <= (sizes.len() as u64) * 8300,
            "{copied} bytes copied to receive {total}"
        );
    }

    /// A host's mix (256 KiB and 100 KiB Data-Outs, 4 KiB writes, bare
    /// headers, a bad data digest): whole and in order; what is copied is
    /// only the read-ahead that arrived with a large PDU's header.
    #[tokio::test]
    async fn a_mix_of_sizes_comes_out_whole_and_in_order() {
        let sizes: Vec<usize> = (0..120)
            .map(|i| match i % 6 {
                0 | 3 => 256 << 10,
                1 => 0,
                2 | 4 => 4096,
                _ => 100 << 10,
            })
            .collect();
        let (total, copied) = send_and_receive(&sizes, 57).await;
        let large = sizes.iter().filter(|&&n| n >= LARGE_PDU).count() as u64;
        assert!(
            copied <= large * (64 << 10) + (8 << 10),
            "{copied} bytes copied to receive {total}"
        );
    }

    /// A framing error (a data segment over the declared maximum) comes
    /// out once, after the PDUs before it; nothing after it is decoded or
    /// read.
    #[tokio::test]
    async fn a_framing_error_ends_the_stream_after_what_came_before_it() {
        use std::io::Write;
        let (mut client, server) = pair().await;
        let mut wire = pdu(1, 4096, 1, false);
        wire.extend(pdu(2, 0, 2, false));
        let mut over = pdu(3, 0, 3, false);
        over[5..8].copy_from_slice(&((256u32 << 10) + 4).to_be_bytes()[1..]);
        wire.extend(over);
        wire.extend(pdu(4, 4096, 4, false));
        client.write_all(&wire).unwrap();
        let mut rx = Receiver::new(framer(), BytesMut::new());
        let mut got = Vec::new();
        while got.len() < 3 {
            server.readable().await.unwrap();
            rx.read_ready(&server).unwrap();
            while let Some(d) = rx.next() {
                got.push(d);
            }
        }
        assert!(matches!(&got[0], Ok(f) if f.data.len() == 4096));
        assert!(matches!(&got[1], Ok(f) if f.data.is_empty()));
        assert!(
            matches!(got[2], Err(WireError::DataSegmentTooLong { .. })),
            "{:?}",
            got[2]
        );
        assert_eq!(got.len(), 3);
        assert!(rx.next().is_none());
        assert_eq!(rx.read_ready(&server).unwrap(), Reads::default());
    }

    /// Making room copies the unread bytes only, and nothing when the
    /// allocation can be reused in place.
    #[test]
    fn making_room_copies_only_the_unread_bytes() {
        let mut buf = BytesMut::with_capacity(64 << 10);
        buf.extend_from_slice(&[9u8; 60 << 10]);
        let held = buf.split_to(56 << 10).freeze();
        assert_eq!(make_room(&mut buf, 4 << 10), 0, "room enough already");
        // Shared with `held`: a new allocation, 4 KiB copied.
        assert_eq!(make_room(&mut buf, 128 << 10), 4 << 10);
        assert!(buf.capacity() >= 128 << 10);
        assert_eq!(&buf[..], &[9u8; 4 << 10][..]);
        drop(held);
        // Unique, with consumed bytes in front: reclaimed in place.
        buf.extend_from_slice(&[8u8; 100 << 10]);
        let _ = buf.split_to(104 << 10);
        buf.extend_from_slice(&[7u8; 1000]);
        let copied = make_room(&mut buf, 120 << 10);
        assert!(copied <= 1000, "{copied}");
        assert_eq!(&buf[..], &[7u8; 1000][..]);
        assert!(buf.capacity() >= 120 << 10);
    }

    /// Any mix of PDU sizes, cut into any pieces, comes out whole and in
    /// order, and no PDU is copied more than once after its header has
    /// arrived, nor more of it than a read takes beyond the PDU before it.
    mod any_stream {
        use super::*;
        use proptest::prelude::*;

        fn size() -> impl Strategy<Value = usize> {
            prop_oneof![
                Just(0usize),
                1usize..600,
                Just(4096usize),
                8000usize..70_000,
                Just(256usize << 10),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(24))]
            #[test]
            fn pdus_survive_any_cutting(
                sizes in proptest::collection::vec(size(), 1..40),
                cuts in proptest::collection::vec(1usize..300_000, 1..64),
                bad in 0usize..40,
            ) {
                use std::io::Write;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                    .unwrap();
                let (got, copied, wire_lens) = rt.block_on(async {
                    let (mut client, server) = pair().await;
                    let mut wire = Vec::new();
                    let mut wire_lens = Vec::new();
                    for (itt, &len) in sizes.iter().enumerate() {
                        let p = pdu(itt as u32, len, (itt % 251) as u8, itt == bad);
                        wire_lens.push(p.len());
                        wire.extend(p);
                    }
                    let writer = std::thread::spawn(move || {
                        let mut at = 0;
                        for &c in cuts.iter().cycle() {
                            if at == wire.len() {
                                break;
                            }
                            let end = (at + c).min(wire.len());
                            client.write_all(&wire[at..end]).unwrap();
                            at = end;
                        }
                    });
                    let mut rx = Receiver::new(framer(), BytesMut::new());
                    let got = receive_all(&mut rx, &server).await;
                    writer.join().unwrap();
                    (got, rx.copied(), wire_lens)
                });
                // A PDU without data has no data digest to get wrong.
                let want: Vec<_> = sizes
                    .iter()
                    .enumerate()
                    .map(|(itt, &len)| {
                        if itt == bad && len > 0 {
                            Err(bad as u32)
                        } else {
                            Ok((itt as u32, len))
                        }
                    })
                    .collect();
                prop_assert_eq!(got, want);
                // Per PDU: a header not yet whole, then what was read of
                // it when its header had arrived.
                let bound: usize = wire_lens.iter().map(|&l| l.min(BHS_LEN) + l.min(MAX_READ)).sum();
                prop_assert!(copied as usize <= bound, "{} copied, bound {}", copied, bound);
            }
        }
    }
}
