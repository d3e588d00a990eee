//! An in-memory Ethernet segment: every frame a port sends reaches every
//! other port (a hub; the state machines filter by address, as NICs in
//! promiscuous mode would). Bounded: a port whose queue is full misses
//! the frame.

use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{EthLink, EthRx, EthTx, LinkFuture, wire_err};
use crate::wire::{MacAddr, WireError};

/// Frames a port's receive queue holds.
const QUEUE: usize = 8192;

#[derive(Debug, Default)]
struct Ports {
    ports: Vec<(usize, mpsc::Sender<Bytes>)>,
    next: usize,
}

/// A shared segment. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct MemorySegment {
    ports: Arc<Mutex<Ports>>,
}

impl MemorySegment {
    /// An empty segment.
    pub fn new() -> MemorySegment {
        MemorySegment::default()
    }

    /// Attaches a port with MAC `mac`.
    pub fn attach(&self, mac: MacAddr, name: &str) -> EthLink {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut p = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let id = p.next;
        p.next += 1;
        p.ports.push((id, tx));
        EthLink {
            rx: Box::new(MemoryRx { rx }),
            tx: Box::new(MemoryTx {
                segment: self.clone(),
                id,
                buf: Vec::new(),
                queued: Vec::new(),
            }),
            mac,
            name: format!("memory:{name}"),
        }
    }

    /// Puts a frame on the segment as if port `from` sent it (`None`:
    /// from outside every port).
    fn deliver(&self, from: Option<usize>, frame: &Bytes) {
        let p = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        for (id, tx) in &p.ports {
            if Some(*id) != from {
                let _ = tx.try_send(frame.clone());
            }
        }
    }

    /// Injects a raw frame (tests: spoofers, malformed input).
    pub fn inject(&self, frame: Bytes) {
        self.deliver(None, &frame);
    }
}

struct MemoryRx {
    rx: mpsc::Receiver<Bytes>,
}

impl EthRx for MemoryRx {
    fn recv<'a>(&'a mut self, out: &'a mut Vec<Bytes>) -> LinkFuture<'a> {
        Box::pin(async move {
            let Some(f) = self.rx.recv().await else {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "segment gone"));
            };
            out.push(f);
            while let Ok(f) = self.rx.try_recv() {
                out.push(f);
                if out.len() >= 256 {
                    break;
                }
            }
            Ok(())
        })
    }
}

struct MemoryTx {
    segment: MemorySegment,
    id: usize,
    buf: Vec<u8>,
    queued: Vec<Bytes>,
}

impl EthTx for MemoryTx {
    fn send(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<usize, WireError>,
    ) -> io::Result<()> {
        self.buf.clear();
        self.buf.resize(len, 0);
        let n = fill(&mut self.buf).map_err(wire_err)?;
        self.queued
            .push(Bytes::copy_from_slice(&self.buf[..n.min(len)]));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        for f in self.queued.drain(..) {
            self.segment.deliver(Some(self.id), &f);
        }
        Ok(())
    }
}
