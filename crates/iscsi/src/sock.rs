//! Reading a TCP socket with one `recv` per readiness event where one is
//! enough.

use std::io;

use bytes::BytesMut;
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
