//! A circuit's TCP connection while it is up: its writer queue and
//! backlog, and the reader and writer tasks that own the socket.

use super::*;

pub(super) struct Circuit {
    pub(super) epoch: u64,
    pub(super) writer: mpsc::Sender<Vec<Bytes>>,
    /// The connection's reader and writer tasks, aborted when the circuit
    /// goes: between them they hold the socket, which must not outlive the
    /// circuit (a black-holed peer never closes it, and a writer stuck on
    /// a full send buffer never finishes).
    pub(super) tasks: [tokio::task::AbortHandle; 2],
    pub(super) done: Option<oneshot::Sender<()>>,
    pub(super) fd: i32,
    pub(super) since: Instant,
    pub(super) peer: SocketAddr,
    /// Writes that found the writer's queue full, in order; handed over
    /// as one when it has room. At most `BACKLOG_MAX` bytes: beyond it the
    /// write is refused (RFC mode drops and counts the frames; enhanced
    /// mode keeps the batch and sends it on another circuit or later).
    pub(super) backlog: Vec<Bytes>,
    pub(super) backlog_bytes: usize,
    /// See `Conn::direct`.
    pub(super) direct: Option<socket2::Socket>,
    /// Writes handed to the writer task and not yet written by it, plus
    /// one while the backlog is not empty: the tunnel (and RFC mode's fast
    /// path) writes directly only while this is zero, so bytes never
    /// overtake one another.
    pub(super) queued: Arc<AtomicUsize>,
    /// Frames the reader handed to the tunnel's task and the task has not
    /// yet handled (RFC mode's fast path waits for none).
    pub(super) unhandled: Arc<AtomicUsize>,
}

/// Bytes a circuit's backlog may hold (bounded memory per peer).
pub(super) const BACKLOG_MAX: usize = 8 << 20;

impl Drop for Circuit {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Circuit {
    pub(super) fn has_room(&self, headroom: usize) -> bool {
        self.backlog.is_empty() && self.writer.capacity() >= headroom
    }

    /// Hands the backlog to the writer if it has room.
    pub(super) fn flush(&mut self) {
        if self.backlog.is_empty() || self.writer.capacity() == 0 {
            return;
        }
        let backlog = std::mem::take(&mut self.backlog);
        match self.hand_over(backlog) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {
                self.backlog_bytes = 0;
                // The backlog's own count, after the hand-over's: `queued`
                // never reads zero while its bytes are still unwritten.
                self.queued.fetch_sub(1, Ordering::AcqRel);
            }
            Err(mpsc::error::TrySendError::Full(b)) => self.backlog = b,
        }
    }

    /// Gives one write to the writer task, counted in `queued` while the
    /// writer holds it.
    pub(super) fn hand_over(
        &self,
        bufs: Vec<Bytes>,
    ) -> Result<(), mpsc::error::TrySendError<Vec<Bytes>>> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let r = self.writer.try_send(bufs);
        if r.is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Queues a write of `n` bytes: to the socket at once when nothing is
    /// ahead of it, else to the writer, or behind the backlog. Err: the
    /// writer is closed, or the backlog is full.
    pub(super) fn queue(&mut self, mut bufs: Vec<Bytes>, n: usize) -> Result<(), ()> {
        // `queued` counts a non-empty backlog too.
        if self.queued.load(Ordering::Acquire) == 0
            && let Some(f) = &self.direct
        {
            // What the socket did not take (or all of it, on an error,
            // which the writer then reports) goes through the writer.
            if write_now(f, &mut bufs) {
                return Ok(());
            }
        }
        if self.backlog.is_empty() {
            return match self.hand_over(bufs) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
                Err(mpsc::error::TrySendError::Full(b)) => {
                    self.backlog = b;
                    self.backlog_bytes = n;
                    self.queued.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                }
            };
        }
        if self.backlog_bytes + n > BACKLOG_MAX {
            return Err(());
        }
        self.backlog.extend(bufs);
        self.backlog_bytes += n;
        Ok(())
    }
}

pub(super) async fn writer(
    mut w: tokio::io::WriteHalf<Box<dyn Stream>>,
    mut rx: mpsc::Receiver<Vec<Bytes>>,
    ev: mpsc::Sender<Ev>,
    slot: usize,
    epoch: u64,
    room: Arc<Notify>,
    queued: Arc<AtomicUsize>,
) {
    let mut pending: Vec<Bytes> = Vec::new();
    while let Some(bufs) = rx.recv().await {
        pending.extend(bufs);
        let mut taken = 1;
        while let Ok(more) = rx.try_recv() {
            pending.extend(more);
            taken += 1;
            if pending.len() > 1024 {
                break;
            }
        }
        room.notify_one();
        if let Err(e) = write_all_vectored(&mut w, &mut pending).await {
            let _ = ev
                .send(Ev::Closed(slot, epoch, format!("write: {e}")))
                .await;
            return;
        }
        if let Err(e) = w.flush().await {
            let _ = ev
                .send(Ev::Closed(slot, epoch, format!("flush: {e}")))
                .await;
            return;
        }
        // Written: the tunnel may write directly again once nothing else
        // is queued.
        queued.fetch_sub(taken, Ordering::AcqRel);
    }
    let _ = w.shutdown().await;
}

/// Writes `bufs` to the socket now, as far as it takes them without
/// blocking; true when all went. What is left stays in `bufs` (a partly
/// written slice is cut to its unwritten tail).
pub(super) fn write_now(f: &socket2::Socket, bufs: &mut Vec<Bytes>) -> bool {
    let mut start = 0;
    while start < bufs.len() {
        // A closed peer is an error here, never a SIGPIPE.
        let n = match f
            .send_vectored_with_flags(&io_slices(&bufs[start..], 1024), libc::MSG_NOSIGNAL)
        {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        consume(bufs, &mut start, n);
    }
    bufs.drain(..start);
    bufs.is_empty()
}

/// At most `max` slices of `bufs`, for one vectored write.
pub(super) fn io_slices(bufs: &[Bytes], max: usize) -> Vec<IoSlice<'_>> {
    bufs.iter().take(max).map(|b| IoSlice::new(b)).collect()
}

/// `n` bytes of `bufs[*start..]` were written: moves `start` past the
/// whole slices and cuts a partly written one to its tail.
pub(super) fn consume(bufs: &mut [Bytes], start: &mut usize, mut n: usize) {
    while *start < bufs.len() && n >= bufs[*start].len() {
        n -= bufs[*start].len();
        *start += 1;
    }
    if n > 0 {
        let b = bufs[*start].slice(n..);
        bufs[*start] = b;
    }
}

pub(super) async fn write_all_vectored(
    w: &mut (impl AsyncWrite + Unpin),
    bufs: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    let mut start = 0;
    while start < bufs.len() {
        let n = w.write_vectored(&io_slices(&bufs[start..], 64)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        consume(bufs, &mut start, n);
    }
    bufs.clear();
    Ok(())
}

/// `item` in a buffer of its own. The decoder hands out slices of the
/// reader's buffer (64 KiB and more per read), and a frame is kept for
/// as long as its exchange needs it (an FCP target holds a write's data
/// until the command runs, its command longer): a slice would keep the
/// whole buffer alive, so a peer sending small frames among large ones
/// that are dropped at once could make each kept byte cost many times
/// its size. A copy of one frame (at most 2,148 bytes) costs little next
/// to the socket read that brought it; the decoder's buffer is then
/// free again for the next read.
pub(super) fn owned(item: Item) -> Item {
    match item {
        Item::Frame(b) => Item::Frame(Bytes::copy_from_slice(&b)),
        Item::Special(b) => Item::Special(Bytes::copy_from_slice(&b)),
    }
}

pub(super) async fn reader(
    mut r: tokio::io::ReadHalf<Box<dyn Stream>>,
    leftover: Bytes,
    ev: mpsc::Sender<Ev>,
    slot: usize,
    epoch: u64,
    unhandled: Arc<AtomicUsize>,
    fast: Option<FastRx>,
) {
    let mut dec = Decoder::new(DecoderConfig::default());
    dec.extend(&leftover);
    loop {
        loop {
            match dec.decode() {
                Ok(Some(item)) => {
                    let item = owned(item);
                    let item = match &fast {
                        Some(f) => match f.deliver(item) {
                            Some(item) => item,
                            None => continue,
                        },
                        None => item,
                    };
                    unhandled.fetch_add(1, Ordering::AcqRel);
                    if ev.send(Ev::Rx(slot, epoch, item)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = ev.send(Ev::Closed(slot, epoch, e.to_string())).await;
                    return;
                }
            }
        }
        let buf = dec.buffer_mut();
        buf.reserve(64 * 1024);
        match r.read_buf(buf).await {
            Ok(0) => {
                let _ = ev
                    .send(Ev::Closed(slot, epoch, "closed by the peer".into()))
                    .await;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = ev.send(Ev::Closed(slot, epoch, format!("read: {e}"))).await;
                return;
            }
        }
    }
}
