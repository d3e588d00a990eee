//! The in-memory link: a bounded channel from the fabric to an N_Port
//! driver. Frames move by reference (their payloads are shared `Bytes`).

use tokio::sync::mpsc;

use crate::link::{FcLink, LinkError};
use crate::wire::frame::Frame;

/// The sending end of an in-memory link. Several links may feed one
/// receiver: each tags its frames with its own number.
#[derive(Debug, Clone)]
pub struct MemoryLink {
    tx: mpsc::Sender<(usize, Frame)>,
    tag: usize,
    name: String,
}

impl MemoryLink {
    /// A link tagging frames with `tag` into `tx`.
    pub fn new(tx: mpsc::Sender<(usize, Frame)>, tag: usize, name: &str) -> MemoryLink {
        MemoryLink {
            tx,
            tag,
            name: name.to_string(),
        }
    }

    /// A link and its receiver, holding at most `capacity` frames.
    pub fn pair(capacity: usize, name: &str) -> (MemoryLink, mpsc::Receiver<(usize, Frame)>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (MemoryLink::new(tx, 0, name), rx)
    }
}

impl FcLink for MemoryLink {
    fn transmit(&self, frame: Frame) -> Result<(), LinkError> {
        self.tx.try_send((self.tag, frame)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LinkError::Full,
            mpsc::error::TrySendError::Closed(_) => LinkError::Down,
        })
    }

    fn describe(&self) -> String {
        format!("memory:{}", self.name)
    }
}
