//! The enhanced-mode stream: data batches numbered across all circuits of
//! a tunnel, kept by the sender until the receiver's cumulative
//! acknowledgement covers them, resent on a surviving circuit when the
//! circuit that carried them dies, and put back in order (duplicates
//! dropped) by the receiver. This is what makes a circuit loss lossless.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::wire::enhanced::{BatchHeader, BatchKind, Codec, FLAG_RETRANSMIT};

/// A batch sent and not yet acknowledged.
#[derive(Debug, Clone)]
struct Outstanding {
    header: BatchHeader,
    body: Bytes,
    /// The circuit it went out on; `UNASSIGNED` while it waits for one.
    circuit: usize,
    /// Whether it ever reached a writer (a later send is a retransmit).
    sent: bool,
}

/// The circuit of a batch that waits for one.
const UNASSIGNED: usize = usize::MAX;

/// The sender's side.
#[derive(Debug)]
pub struct SendWindow {
    next_seq: u64,
    acked: u64,
    unacked: BTreeMap<u64, Outstanding>,
    in_flight: usize,
    max_bytes: usize,
    /// Batches resent after a circuit died.
    pub retransmits: u64,
}

impl SendWindow {
    /// A window holding at most `max_bytes` of unacknowledged bodies.
    pub fn new(max_bytes: usize) -> SendWindow {
        SendWindow {
            next_seq: 1,
            acked: 0,
            unacked: BTreeMap::new(),
            in_flight: 0,
            max_bytes: max_bytes.max(1),
            retransmits: 0,
        }
    }

    /// Whether another batch may be sent now.
    pub fn has_room(&self) -> bool {
        self.in_flight < self.max_bytes
    }

    /// Bytes sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Batches not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.unacked.len()
    }

    /// Highest sequence number acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Numbers a new data batch sent on `circuit` (`usize::MAX`: kept
    /// for later, see [`SendWindow::orphans`]) and keeps it; returns its
    /// header (the caller fills in `ack`).
    pub fn push(
        &mut self,
        codec: Codec,
        raw_len: usize,
        body: Bytes,
        circuit: usize,
    ) -> BatchHeader {
        let seq = self.next_seq;
        self.next_seq += 1;
        let header = BatchHeader {
            kind: BatchKind::DATA.0,
            codec,
            flags: 0,
            seq,
            ack: 0,
            raw_len: u32::try_from(raw_len).unwrap_or(u32::MAX),
            wire_len: u32::try_from(body.len()).unwrap_or(u32::MAX),
        };
        self.in_flight += body.len();
        self.unacked.insert(
            seq,
            Outstanding {
                header,
                body,
                circuit,
                sent: circuit != UNASSIGNED,
            },
        );
        header
    }

    /// Applies a cumulative acknowledgement; returns the bytes freed.
    pub fn on_ack(&mut self, ack: u64) -> usize {
        if ack <= self.acked || ack >= self.next_seq {
            return 0;
        }
        self.acked = ack;
        let keep = self.unacked.split_off(&(ack + 1));
        let freed: usize = self.unacked.values().map(|o| o.body.len()).sum();
        self.unacked = keep;
        self.in_flight -= freed;
        freed
    }

    /// `circuit` died: every batch it carried that is not acknowledged is
    /// reassigned by `pick` (None: no circuit left, keep it for later) and
    /// returned, in order, to be sent again with the retransmit flag.
    pub fn fail_circuit(
        &mut self,
        circuit: usize,
        mut pick: impl FnMut(u64) -> Option<usize>,
    ) -> Vec<(usize, BatchHeader, Bytes)> {
        let mut out = Vec::new();
        for (seq, o) in self.unacked.iter_mut() {
            if o.circuit != circuit {
                continue;
            }
            if let Some(c) = pick(*seq) {
                o.circuit = c;
                let mut h = o.header;
                h.flags |= FLAG_RETRANSMIT;
                self.retransmits += 1;
                out.push((c, h, o.body.clone()));
            }
        }
        out
    }

    /// Every unacknowledged batch whose circuit is not in `alive`, moved
    /// to a live one (after a circuit was lost with none to take over).
    pub fn orphans(
        &mut self,
        alive: &[usize],
        mut pick: impl FnMut(u64) -> Option<usize>,
    ) -> Vec<(usize, BatchHeader, Bytes)> {
        let mut out = Vec::new();
        for (seq, o) in self.unacked.iter_mut() {
            if alive.contains(&o.circuit) {
                continue;
            }
            if let Some(c) = pick(*seq) {
                o.circuit = c;
                let mut h = o.header;
                if o.sent {
                    h.flags |= FLAG_RETRANSMIT;
                    self.retransmits += 1;
                }
                o.sent = true;
                out.push((c, h, o.body.clone()));
            }
        }
        out
    }

    /// Batch `seq` could not be handed to its circuit's writer after all
    /// (full or closing), in a send with header `h`: it waits for
    /// [`SendWindow::orphans`] again, and if that was its first send, the
    /// next one is not a retransmit.
    pub fn unassign(&mut self, h: &BatchHeader) {
        if let Some(o) = self.unacked.get_mut(&h.seq) {
            o.circuit = UNASSIGNED;
            if h.flags & FLAG_RETRANSMIT == 0 {
                o.sent = false;
            }
        }
    }
}

/// A receiver error: the peer broke the stream's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// A batch far beyond the reorder window.
    #[error("batch {seq} is beyond the reorder window (delivered up to {delivered})")]
    BeyondWindow {
        /// The batch.
        seq: u64,
        /// Delivered so far.
        delivered: u64,
    },
    /// The batches held for an earlier one would pass the byte bound: the
    /// peer sends more than any window allows without the batch it owes.
    #[error(
        "{held} bytes held waiting for batch {missing}, past the bound of {max} (the peer sends beyond its window)"
    )]
    HeldTooMuch {
        /// Bytes held (with the batch that would pass the bound).
        held: usize,
        /// The batch everything waits for.
        missing: u64,
        /// The bound.
        max: usize,
    },
}

/// What a held batch is charged beyond its bytes (its place in the map),
/// so that a flood of tiny batches is bounded too.
const HELD_OVERHEAD: usize = 128;

/// The receiver's side: puts batches back in sequence order. `T` is what a
/// batch carries (the tunnel keeps it as received, compressed, and
/// decompresses it once it is in order).
#[derive(Debug)]
pub struct ReceiveWindow<T = Bytes> {
    delivered: u64,
    pending: BTreeMap<u64, (T, usize)>,
    max_ahead: u64,
    /// Bytes held in `pending`, each batch charged `HELD_OVERHEAD` more.
    held: usize,
    max_held: usize,
    /// Batches received twice (after a failover) and dropped.
    pub duplicates: u64,
}

impl<T> ReceiveWindow<T> {
    /// Accepts batches at most `max_ahead` beyond the last delivered, and
    /// holds at most `max_held` bytes of them waiting for an earlier one.
    /// A sender keeps at most its window in flight, and only batches in
    /// flight can be held, so a bound above the sender's window is never
    /// reached by a peer that keeps to it.
    pub fn new(max_ahead: u64, max_held: usize) -> ReceiveWindow<T> {
        ReceiveWindow {
            delivered: 0,
            pending: BTreeMap::new(),
            max_ahead: max_ahead.max(1),
            held: 0,
            max_held,
            duplicates: 0,
        }
    }

    /// Bytes held waiting for an earlier batch (with the per-batch charge).
    pub fn held(&self) -> usize {
        self.held
    }

    /// The cumulative acknowledgement to send.
    pub fn ack(&self) -> u64 {
        self.delivered
    }

    /// Batches waiting for an earlier one.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Takes batch `seq` (`body`, of `len` bytes); returns the bodies that
    /// are now in order, oldest first.
    pub fn accept(&mut self, seq: u64, body: T, len: usize) -> Result<Vec<T>, StreamError> {
        if seq <= self.delivered || self.pending.contains_key(&seq) {
            self.duplicates += 1;
            return Ok(Vec::new());
        }
        if seq > self.delivered + self.max_ahead {
            return Err(StreamError::BeyondWindow {
                seq,
                delivered: self.delivered,
            });
        }
        let mut out = Vec::new();
        if seq == self.delivered + 1 {
            // In order: never held.
            self.delivered += 1;
            out.push(body);
        } else {
            let charge = len.saturating_add(HELD_OVERHEAD);
            let held = self.held.saturating_add(charge);
            if held > self.max_held {
                return Err(StreamError::HeldTooMuch {
                    held,
                    missing: self.delivered + 1,
                    max: self.max_held,
                });
            }
            self.held = held;
            self.pending.insert(seq, (body, charge));
        }
        while let Some((b, charge)) = self.pending.remove(&(self.delivered + 1)) {
            self.held -= charge;
            self.delivered += 1;
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two circuits, one dies with batches in flight; the receiver gets
    /// everything exactly once, in order.
    #[test]
    fn failover_is_lossless_and_ordered() {
        let mut tx = SendWindow::new(1 << 20);
        let mut rx = ReceiveWindow::new(1024, 1 << 20);
        let mut wire: Vec<(usize, u64, Bytes)> = Vec::new();
        for i in 0..20u8 {
            let c = usize::from(i % 2);
            let h = tx.push(Codec::NONE, 1, Bytes::from(vec![i]), c);
            wire.push((c, h.seq, Bytes::from(vec![i])));
        }
        // Circuit 1 is black-holed: its batches never arrive.
        let mut got = Vec::new();
        for (c, seq, b) in &wire {
            if *c == 0 {
                got.extend(rx.accept(*seq, b.clone(), b.len()).unwrap());
            }
        }
        assert_eq!(got.len(), 1, "only batch 1 is deliverable before the gap");
        tx.on_ack(rx.ack());
        let resend = tx.fail_circuit(1, |_| Some(0));
        assert_eq!(resend.len(), 10);
        assert!(
            resend
                .iter()
                .all(|(c, h, _)| *c == 0 && h.flags & FLAG_RETRANSMIT != 0)
        );
        // The resent batches arrive, and one of circuit 0's again (duplicate).
        for (_, h, b) in &resend {
            got.extend(rx.accept(h.seq, b.clone(), b.len()).unwrap());
        }
        got.extend(rx.accept(2, Bytes::from(vec![1]), 1).unwrap());
        let order: Vec<u8> = got.iter().map(|b| b[0]).collect();
        assert_eq!(order, (0..20).collect::<Vec<u8>>());
        assert_eq!(rx.duplicates, 1);
        assert_eq!(tx.on_ack(rx.ack()), 19);
        assert_eq!(tx.outstanding(), 0);
        assert!(rx.accept(5000, Bytes::new(), 0).is_err());
    }

    /// A peer that withholds one batch and sends on cannot make the
    /// receiver hold more than its bound, however small the batches; what
    /// arrives in order is never held.
    #[test]
    fn held_batches_are_bounded_in_bytes() {
        let mut rx: ReceiveWindow<u64> = ReceiveWindow::new(1 << 20, 64 << 10);
        // In order: delivered at once, nothing held, whatever the size.
        assert_eq!(rx.accept(1, 1, 1 << 20).unwrap(), vec![1]);
        assert_eq!(rx.held(), 0);
        // Batch 2 withheld; tiny batches after it are charged their
        // overhead too, so the flood stops well short of the window.
        let mut seq = 3;
        let err = loop {
            match rx.accept(seq, seq, 1) {
                Ok(v) => assert!(v.is_empty()),
                Err(e) => break e,
            }
            seq += 1;
            assert!(seq < 10_000, "never refused");
        };
        assert!(
            matches!(err, StreamError::HeldTooMuch { missing: 2, .. }),
            "{err}"
        );
        assert!(rx.held() <= 64 << 10);
        assert!(seq - 3 < 1000, "{} tiny batches held", seq - 3);
        // The missing batch comes: everything held is delivered in order
        // and the count goes back to zero.
        let got = rx.accept(2, 2, 10).unwrap();
        assert_eq!(got, (2..seq).collect::<Vec<u64>>());
        assert_eq!(rx.held(), 0);
    }

    /// A batch that never reached a writer goes out later as a first send;
    /// one whose resend failed stays a retransmit. Only unassigned batches
    /// are picked up, in order.
    #[test]
    fn unsent_batches_wait_and_go_out_in_order() {
        let mut tx = SendWindow::new(1 << 20);
        let a = tx.push(Codec::NONE, 1, Bytes::from_static(b"a"), 1);
        let b = tx.push(Codec::NONE, 1, Bytes::from_static(b"b"), usize::MAX);
        let c = tx.push(Codec::NONE, 1, Bytes::from_static(b"c"), 1);
        tx.unassign(&c);
        let out = tx.orphans(&[1, 2], |_| Some(2));
        let seqs: Vec<u64> = out.iter().map(|(_, h, _)| h.seq).collect();
        assert_eq!(
            seqs,
            [b.seq, c.seq],
            "batch {} is still on circuit 1",
            a.seq
        );
        assert!(
            out.iter()
                .all(|(c, h, _)| *c == 2 && h.flags & FLAG_RETRANSMIT == 0)
        );
        assert_eq!(tx.retransmits, 0);
        assert!(
            tx.orphans(&[1, 2], |_| Some(2)).is_empty(),
            "nothing left to send"
        );
        // Circuit 1 dies; the resend of `a` finds no room and waits again.
        let moved = tx.fail_circuit(1, |_| Some(2));
        assert_eq!(moved.len(), 1);
        tx.unassign(&moved[0].1);
        let again = tx.orphans(&[2], |_| Some(2));
        assert_eq!(again.len(), 1);
        assert_ne!(again[0].1.flags & FLAG_RETRANSMIT, 0);
        assert_eq!(tx.retransmits, 2);
    }
}
