//! RFC mode's fast path: class 3 frames go between the fabric and the data
//! circuits' sockets without a hand-off to the tunnel's task.
//!
//! Without it a frame crossing the tunnel passes through four tasks: the
//! sending switch's caller hands it to the tunnel's task, which writes it
//! to the socket; the far side's reader task decodes it and hands it to
//! that tunnel's task, which gives it to the fabric. Each hand-off is a
//! wake-up, and at 0 ms RTT they were most of the tunnel's cost (an FCP
//! write crosses four times: command, FCP_XFER_RDY, data, response). On
//! the fast path the fabric's call writes the frame to the socket itself,
//! and the reader gives what it decodes to the fabric itself; the tunnel's
//! task keeps everything else: class F, keep-alives, circuits coming and
//! going, the link's state, and any frame the fast path does not take.
//!
//! It is open only while the link is up in RFC mode (enhanced mode's
//! batches, acks and FastWrite need the tunnel's task). Order is kept, per
//! circuit and so per exchange (an exchange's frames always take the same
//! circuit, [`rfc_pick`]):
//!
//! - sending: a frame takes the fast path only when no frame handed to the
//!   tunnel's task is still on its way to a socket (`pending`) and the
//!   circuit's writer task has nothing queued; what the socket does not
//!   take at once goes to that writer, so later frames queue behind it;
//! - receiving: a reader delivers a frame itself only when every frame it
//!   passed to the tunnel's task has been handled.
//!
//! Writing from the fabric's call means the socket write happens under the
//! switch's lock; it never blocks (the socket is non-blocking, and what it
//! does not take goes to the writer task).

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::mpsc;
use unifab_fc::io::FabricPort;
use unifab_fc::link::{FcLink, LinkError};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{FcId, Sof};

use crate::codec::Item;
pub(super) use crate::proto::link::rfc_pick;
use crate::wire::enhanced;
use crate::wire::frame::FcipFrame;
use crate::wire::framing::{Wire, strip_data_fill};

/// A data circuit as the sending side of the fast path sees it.
#[derive(Debug)]
pub(super) struct FastCircuit {
    pub slot: usize,
    pub weight: u32,
    /// The socket, for writes that bypass the writer task; `None` for a
    /// TLS circuit (its frames take the tunnel's task).
    pub sock: Option<socket2::Socket>,
    /// The circuit's writer task.
    pub writer: mpsc::Sender<Vec<Bytes>>,
    /// Writes queued at the writer task or in the circuit's backlog.
    pub queued: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Tx {
    /// RFC mode and the link is up.
    open: bool,
    /// Frames handed to the tunnel's task that it has not yet queued on a
    /// circuit.
    pending: usize,
    /// The data circuits that are up, in slot order.
    data: Vec<FastCircuit>,
    /// `data`'s slots and weights, for [`rfc_pick`].
    weights: Vec<(usize, u32)>,
}

/// Per-slot byte counters, shared by both paths.
#[derive(Debug, Default)]
pub(super) struct SlotBytes {
    pub tx: AtomicU64,
    pub rx: AtomicU64,
}

/// The state the fast path shares between the fabric's calls, the readers
/// and the tunnel's task.
#[derive(Debug)]
pub(super) struct FastPath {
    tx: Mutex<Tx>,
    /// The receive side is open: RFC mode and the link is up.
    rx_open: AtomicBool,
    /// Byte counters by slot (0 the class F connection).
    pub bytes: Box<[SlotBytes]>,
    /// Frames sent and received on the fast path.
    pub fast_tx: AtomicU64,
    pub fast_rx: AtomicU64,
    /// The tunnel's count of frames dropped (the fast path's share: a
    /// circuit closing under a write).
    pub dropped: Arc<AtomicU64>,
}

impl FastPath {
    /// A closed fast path for a tunnel of `circuits` data circuits.
    pub fn new(circuits: usize, dropped: Arc<AtomicU64>) -> FastPath {
        FastPath {
            tx: Mutex::new(Tx::default()),
            rx_open: AtomicBool::new(false),
            // Every slot a reload may add has its counters from the start.
            bytes: (0..=circuits.max(super::MAX_CIRCUITS))
                .map(|_| SlotBytes::default())
                .collect(),
            fast_tx: AtomicU64::new(0),
            fast_rx: AtomicU64::new(0),
            dropped,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tx> {
        // A panic elsewhere while holding the lock leaves nothing half
        // done that matters here: carry on with the state as it is.
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `n` bytes sent on `slot`.
    pub fn count_tx(&self, slot: usize, n: usize) {
        if let Some(b) = self.bytes.get(slot) {
            b.tx.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Counts `n` bytes received on `slot`.
    pub fn count_rx(&self, slot: usize, n: usize) {
        if let Some(b) = self.bytes.get(slot) {
            b.rx.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Opens (RFC mode, link up) or closes both sides.
    pub fn set_open(&self, open: bool) {
        let mut g = self.lock();
        g.open = open;
        self.rx_open.store(open, Ordering::Release);
    }

    /// A data circuit came up (replacing any on the same slot).
    pub fn add(&self, c: FastCircuit) {
        let mut g = self.lock();
        g.data.retain(|d| d.slot != c.slot);
        let at = g.data.partition_point(|d| d.slot < c.slot);
        g.data.insert(at, c);
        g.weights = g.data.iter().map(|d| (d.slot, d.weight.max(1))).collect();
    }

    /// A data circuit went down.
    pub fn remove(&self, slot: usize) {
        let mut g = self.lock();
        g.data.retain(|d| d.slot != slot);
        g.weights = g.data.iter().map(|d| (d.slot, d.weight.max(1))).collect();
    }

    /// The tunnel's task queued `n` frames it took from the fabric.
    pub fn handled(&self, n: usize) {
        let mut g = self.lock();
        g.pending = g.pending.saturating_sub(n);
    }

    /// A frame from the fabric: written to its circuit's socket when the
    /// fast path may take it, else handed to the tunnel's task through
    /// `slow`.
    pub fn transmit(&self, frame: Frame, slow: &mpsc::Sender<Frame>) -> Result<(), LinkError> {
        let mut g = self.lock();
        let Some(slot) = self.fast_slot(&g, &frame) else {
            return self.to_task(&mut g, frame, slow);
        };
        match self.encode(frame, slot) {
            Ok(w) => {
                self.write(&g, slot, std::slice::from_ref(&w));
                Ok(())
            }
            Err(frame) => self.to_task(&mut g, frame, slow),
        }
    }

    /// Frames from the fabric, in order, leaving `frames` empty: each run
    /// of frames for one circuit that the fast path may take goes out in
    /// one vectored write (an FCP sequence's data frames, say); from the
    /// first frame it may not take on, the rest go to the tunnel's task.
    /// Returns how many were dropped.
    pub fn transmit_batch(&self, frames: &mut Vec<Frame>, slow: &mpsc::Sender<Frame>) -> usize {
        let mut g = self.lock();
        let mut run: Option<(usize, Vec<Wire>)> = None;
        let mut frames = frames.drain(..);
        let mut first_slow = None;
        for frame in frames.by_ref() {
            let Some(slot) = self.fast_slot(&g, &frame) else {
                first_slow = Some(frame);
                break;
            };
            if let Some((s, wires)) = run.take_if(|(s, _)| *s != slot) {
                self.write(&g, s, &wires);
            }
            match self.encode(frame, slot) {
                Ok(w) => run.get_or_insert_with(|| (slot, Vec::new())).1.push(w),
                Err(frame) => {
                    first_slow = Some(frame);
                    break;
                }
            }
        }
        if let Some((s, wires)) = run {
            self.write(&g, s, &wires);
        }
        let mut dropped = 0;
        for f in first_slow.into_iter().chain(frames) {
            dropped += usize::from(self.to_task(&mut g, f, slow).is_err());
        }
        dropped
    }

    /// Hands `frame` to the tunnel's task.
    fn to_task(
        &self,
        g: &mut Tx,
        frame: Frame,
        slow: &mpsc::Sender<Frame>,
    ) -> Result<(), LinkError> {
        g.pending += 1;
        slow.try_send(frame).map_err(|e| {
            g.pending -= 1;
            self.dropped.fetch_add(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => LinkError::Full,
                mpsc::error::TrySendError::Closed(_) => LinkError::Down,
            }
        })
    }

    /// The circuit `frame` takes on the fast path, if it may take it now.
    fn fast_slot(&self, g: &Tx, frame: &Frame) -> Option<usize> {
        if !g.open || g.pending != 0 || frame.sof == Sof::F {
            return None;
        }
        let slot = rfc_pick(&frame.header, &g.weights)?;
        let c = g.data.iter().find(|c| c.slot == slot)?;
        (c.sock.is_some() && c.queued.load(Ordering::Acquire) == 0).then_some(slot)
    }

    /// Encodes `frame` for `slot` and counts it, or gives the frame back
    /// (it does not encode: the tunnel's task logs and counts it).
    fn encode(&self, frame: Frame, slot: usize) -> Result<Wire, Frame> {
        let h = frame.header;
        let w = Wire::new(frame).map_err(|(f, _)| f)?;
        tracing::trace!(s_id = %h.s_id, d_id = %h.d_id, r_ctl = h.r_ctl.0, ox = h.ox_id.0, slot, "tx (fast)");
        self.count_tx(slot, w.len());
        self.fast_tx.fetch_add(1, Ordering::Relaxed);
        Ok(w)
    }

    /// Writes encoded frames to circuit `slot`'s socket ([`Self::fast_slot`]
    /// found it idle): what the socket does not take at once goes to the
    /// circuit's writer, and later frames queue behind it.
    fn write(&self, g: &Tx, slot: usize, wires: &[Wire]) {
        let Some(c) = g.data.iter().find(|c| c.slot == slot) else {
            return;
        };
        let done = c.sock.as_ref().map_or(0, |sock| send_now(sock, wires));
        if done == wires.iter().map(Wire::len).sum::<usize>() {
            return;
        }
        // The socket took part of it (or failed, which the writer then
        // reports).
        c.queued.fetch_add(1, Ordering::AcqRel);
        if c.writer.try_send(unsent(wires, done)).is_err() {
            // Closed: the circuit is going down.
            c.queued.fetch_sub(1, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes `wires` to the socket as far as it takes them without blocking,
/// with the I/O vectors on the stack; returns the bytes written.
fn send_now(sock: &socket2::Socket, wires: &[Wire]) -> usize {
    const MAX: usize = 48;
    let total: usize = wires.iter().map(Wire::len).sum();
    let mut done = 0;
    while done < total {
        let mut iov = [IoSlice::new(&[]); MAX];
        let mut n = 0;
        let mut skip = done;
        for part in wires.iter().flat_map(Wire::parts) {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let Some(v) = iov.get_mut(n) else { break };
            *v = IoSlice::new(&part[skip..]);
            skip = 0;
            n += 1;
        }
        // A closed peer is an error here, never a SIGPIPE.
        match sock.send_vectored_with_flags(&iov[..n], libc::MSG_NOSIGNAL) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    done
}

/// What is left of `wires` after the first `done` bytes, for the writer.
fn unsent(wires: &[Wire], done: usize) -> Vec<Bytes> {
    let mut skip = done;
    let mut out = Vec::new();
    for w in wires {
        for (i, part) in w.parts().into_iter().enumerate() {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            out.push(if i == 1 {
                w.payload.slice(skip..)
            } else {
                Bytes::copy_from_slice(&part[skip..])
            });
            skip = 0;
        }
    }
    out
}

/// The receiving side of the fast path, one per data circuit's reader.
#[derive(Debug)]
pub(super) struct FastRx {
    pub fast: Arc<FastPath>,
    pub port: FabricPort,
    pub slot: usize,
    /// Items this reader passed to the tunnel's task that it has not yet
    /// handled.
    pub unhandled: Arc<AtomicUsize>,
}

impl FastRx {
    /// Delivers a class 3 frame to the fabric itself when it may; gives
    /// back what the tunnel's task must handle (the reader counts it in
    /// `unhandled` until the task has).
    pub fn deliver(&self, item: Item) -> Option<Item> {
        if self.fast.rx_open.load(Ordering::Acquire)
            && self.unhandled.load(Ordering::Acquire) == 0
            && let Item::Frame(bytes) = &item
            && let Some(f) = Self::class_3(bytes)
        {
            tracing::trace!(s_id = %f.header.s_id, d_id = %f.header.d_id, r_ctl = f.header.r_ctl.0, ox = f.header.ox_id.0, slot = self.slot, "rx (fast)");
            self.fast.count_rx(self.slot, bytes.len());
            self.fast.fast_rx.fetch_add(1, Ordering::Relaxed);
            let _ = self.port.transmit(strip_data_fill(f));
            return None;
        }
        Some(item)
    }

    /// The frame, if it is class 3 between N_Ports: not class F, not an
    /// enhanced-mode fragment (an error on an RFC link), not for the
    /// fabric controller or a domain controller. Anything else, a frame
    /// that does not parse included, is the tunnel task's to handle.
    fn class_3(bytes: &Bytes) -> Option<Frame> {
        let f = FcipFrame::new_checked(bytes.clone())
            .and_then(|f| f.to_fc_frame())
            .ok()?;
        let d = f.header.d_id;
        let plain = f.sof != Sof::F
            && !enhanced::is_fragment(&f.header)
            && d != FcId::FABRIC_CONTROLLER
            && unifab_fc::fabric::isl::controller_domain(d).is_none();
        plain.then_some(f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use unifab_fc::wire::OxId;
    use unifab_fc::wire::header::FcHeaderRepr;

    fn header(s: u32, d: u32, ox: u16) -> FcHeaderRepr {
        FcHeaderRepr {
            s_id: FcId::new(s),
            d_id: FcId::new(d),
            ox_id: OxId(ox),
            ..FcHeaderRepr::default()
        }
    }

    #[test]
    fn an_exchange_takes_one_circuit_both_ways_and_weights_share_them() {
        let data = [(1, 1), (2, 3)];
        let mut per = [0u32; 3];
        for ox in 0..4000u16 {
            let there = rfc_pick(&header(0x01_00_01, 0x02_00_01, ox), &data).unwrap();
            let back = rfc_pick(&header(0x02_00_01, 0x01_00_01, ox), &data).unwrap();
            assert_eq!(there, back, "OX_ID {ox}");
            per[there] += 1;
        }
        // Weights 1 and 3: about a quarter and three quarters.
        assert!((800..1200).contains(&per[1]), "{per:?}");
        assert!((2800..3200).contains(&per[2]), "{per:?}");
        assert_eq!(rfc_pick(&header(1, 2, 3), &[]), None);
    }

    /// The FC frame in FCIP bytes read from `s`.
    fn read_frame(s: &mut std::net::TcpStream) -> Frame {
        use std::io::Read;
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        FcipFrame::new_checked(Bytes::copy_from_slice(&buf[..n]))
            .and_then(|f| f.to_fc_frame())
            .unwrap()
    }

    /// A fast path with one data circuit on a loopback connection: the
    /// path, the connection's far end, the circuit's writer queue and its
    /// `queued` count.
    fn one_circuit() -> (
        FastPath,
        std::net::TcpStream,
        mpsc::Receiver<Vec<Bytes>>,
        Arc<AtomicUsize>,
    ) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        let (wtx, wrx) = mpsc::channel(4);
        let queued = Arc::new(AtomicUsize::new(0));
        let fast = FastPath::new(1, Arc::new(AtomicU64::new(0)));
        fast.add(FastCircuit {
            slot: 1,
            weight: 1,
            sock: Some(socket2::Socket::from(a)),
            writer: wtx,
            queued: queued.clone(),
        });
        (fast, b, wrx, queued)
    }

    #[test]
    fn frames_bypass_the_task_only_when_nothing_is_ahead_of_them() {
        let (fast, mut b, mut wrx, queued) = one_circuit();
        let (slow, mut task) = mpsc::channel(8);
        let frame = |ox| {
            Frame::new(
                header(0x01_00_01, 0x02_00_01, ox),
                Bytes::from_static(b"data"),
            )
        };
        let ox = |f: Frame| f.header.ox_id.0;

        // Closed (the link is not up): the tunnel's task takes it.
        fast.transmit(frame(1), &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(1));
        fast.set_open(true);
        // Frame 1 is not yet on a circuit: frame 2 follows it to the task.
        fast.transmit(frame(2), &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(2));
        fast.handled(1);
        fast.transmit(frame(3), &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(3));
        fast.handled(2);
        // Nothing ahead of it: straight to the socket.
        fast.transmit(frame(4), &slow).unwrap();
        assert!(task.try_recv().is_err());
        assert_eq!(read_frame(&mut b).header.ox_id.0, 4);
        assert_eq!(fast.fast_tx.load(Ordering::Relaxed), 1);
        assert!(fast.bytes[1].tx.load(Ordering::Relaxed) > 4);
        // The circuit's writer holds a write: frame 5 goes behind it.
        queued.store(1, Ordering::Release);
        fast.transmit(frame(5), &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(5));
        fast.handled(1);
        queued.store(0, Ordering::Release);
        // Class F is never the fast path's.
        let mut f = frame(6);
        f.sof = Sof::F;
        fast.transmit(f, &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(6));
        fast.handled(1);
        // The circuit gone: the task's again.
        fast.remove(1);
        fast.transmit(frame(7), &slow).unwrap();
        assert_eq!(task.try_recv().map(ox), Ok(7));
        assert!(wrx.try_recv().is_err(), "nothing went through the writer");
    }

    #[test]
    fn what_the_socket_does_not_take_goes_to_the_writer_and_later_frames_behind_it() {
        let (fast, _b, mut wrx, queued) = one_circuit(); // never read
        fast.set_open(true);
        let (slow, mut task) = mpsc::channel(8);
        let payload = Bytes::from(vec![7u8; 2048]);
        let mut sent = 0u16;
        let rest = loop {
            assert!(sent < 60_000, "the socket never filled");
            let f = Frame::new(header(0x01_00_01, 0x02_00_01, 9), payload.clone());
            fast.transmit(f, &slow).unwrap();
            sent += 1;
            if let Ok(rest) = wrx.try_recv() {
                break rest;
            }
        };
        assert!(
            task.try_recv().is_err(),
            "every frame up to the full socket was written directly"
        );
        let rest_len: usize = rest.iter().map(|b| b.len()).sum();
        // The FCIP header (28), SOF (4), FC header (24), payload, CRC and EOF.
        assert!(
            rest_len > 0 && rest_len <= 28 + 4 + 24 + 2048 + 4 + 4,
            "{rest_len}"
        );
        assert_eq!(
            queued.load(Ordering::Acquire),
            1,
            "the writer's share is counted"
        );
        // The next frame must not overtake what the writer holds.
        let f = Frame::new(header(0x01_00_01, 0x02_00_01, 9), payload);
        fast.transmit(f, &slow).unwrap();
        assert!(task.try_recv().is_ok());
        assert_eq!(fast.fast_tx.load(Ordering::Relaxed), u64::from(sent));
    }

    /// The frames of a batch the fast path may take are written together,
    /// in order; from the first it may not take (class F here), the rest
    /// go to the tunnel's task, fast-path frames behind it included.
    #[test]
    fn a_batch_goes_out_in_one_write_until_a_frame_must_take_the_task() {
        use std::io::Read;
        let (fast, mut b, mut wrx, _queued) = one_circuit();
        fast.set_open(true);
        let (slow, mut task) = mpsc::channel(8);
        let frame = |ox, sof| {
            let mut f = Frame::new(
                header(0x01_00_01, 0x02_00_01, 7),
                Bytes::from(vec![ox as u8; 2048]),
            );
            f.header.seq_cnt = ox;
            f.sof = sof;
            f
        };
        let mut batch = vec![frame(0, Sof::I3), frame(1, Sof::N3), frame(2, Sof::N3)];
        assert_eq!(fast.transmit_batch(&mut batch, &slow), 0);
        assert!(batch.is_empty());
        assert!(task.try_recv().is_err());
        assert_eq!(fast.fast_tx.load(Ordering::Relaxed), 3);
        // All three, whole and in order, on the socket.
        b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut dec = crate::codec::Decoder::new(crate::codec::DecoderConfig::default());
        let mut got = Vec::new();
        let mut buf = vec![0u8; 16384];
        while got.len() < 3 {
            let n = b.read(&mut buf).unwrap();
            assert!(n > 0);
            dec.extend(&buf[..n]);
            while let Some(Item::Frame(f)) = dec.decode().unwrap() {
                let f = FcipFrame::new_checked(f)
                    .and_then(|f| f.to_fc_frame())
                    .unwrap();
                got.push((f.header.seq_cnt, f.payload[0]));
            }
        }
        assert_eq!(got, vec![(0, 0), (1, 1), (2, 2)]);
        // A class F frame in the middle: it and everything after it go to
        // the task, in order.
        let mut batch = vec![frame(3, Sof::N3), frame(4, Sof::F), frame(5, Sof::N3)];
        assert_eq!(fast.transmit_batch(&mut batch, &slow), 0);
        assert_eq!(fast.fast_tx.load(Ordering::Relaxed), 4);
        assert_eq!(task.try_recv().map(|f| f.header.seq_cnt), Ok(4));
        assert_eq!(task.try_recv().map(|f| f.header.seq_cnt), Ok(5));
        // Frame 3 went first, straight to the socket.
        let n = b.read(&mut buf).unwrap();
        dec.extend(&buf[..n]);
        let Ok(Some(Item::Frame(f))) = dec.decode() else {
            panic!("frame 3 not on the socket");
        };
        let f = FcipFrame::new_checked(f)
            .and_then(|f| f.to_fc_frame())
            .unwrap();
        assert_eq!(f.header.seq_cnt, 3);
        // While those two are not yet on a circuit, a batch goes to the
        // task whole; past the task queue's room (8), one is dropped.
        let mut batch: Vec<Frame> = (6..15).map(|i| frame(i, Sof::N3)).collect();
        assert_eq!(fast.transmit_batch(&mut batch, &slow), 1);
        for i in 6..14 {
            assert_eq!(task.try_recv().map(|f| f.header.seq_cnt), Ok(i));
        }
        assert!(wrx.try_recv().is_err(), "nothing went through the writer");
    }

    /// What the writer gets after a partial write is exactly the bytes
    /// the socket did not take, wherever the write stopped.
    #[test]
    fn the_unsent_part_is_exactly_the_rest() {
        let wires: Vec<Wire> = [3usize, 2048, 0]
            .iter()
            .map(|&n| {
                let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
                let f = Frame::new(header(0x01_00_01, 0x02_00_01, 1), Bytes::from(payload));
                Wire::new(f).map_err(|_| "encode").unwrap()
            })
            .collect();
        let all: Vec<u8> = wires
            .iter()
            .flat_map(Wire::parts)
            .flatten()
            .copied()
            .collect();
        assert_eq!(all.len(), wires.iter().map(Wire::len).sum::<usize>());
        for done in 0..=all.len() {
            let rest: Vec<u8> = unsent(&wires, done).concat();
            assert!(rest == all[done..], "after {done} bytes");
        }
    }
}
