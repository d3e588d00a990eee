//! Reading a TCP socket with one `recv` per readiness event where one is
//! enough, and keeping what a peer sends from pinning more memory than it
//! is charged for.

use std::io;

use bytes::{Bytes, BytesMut};
use tokio::io::Interest;
use tokio::net::TcpStream;

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
/// bytes of it). After a short read, tokio's readiness for the socket is
/// cleared as if the read had hit `EAGAIN`, so the next wait goes straight
/// to the poller instead of spending a `recv` that finds nothing. Sound
/// with edge-triggered readiness: data that arrives after the read raises
/// a new event, and tokio clears only the readiness it had seen before it.
pub(crate) fn read_some(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<ReadOutcome> {
    let mut got = None;
    let r = stream.try_io(Interest::READABLE, || {
        let room = buf.capacity() - buf.len();
        let n = stream.try_read_buf(buf)?;
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
}
