//! How frames get onto and off a fabric port.
//!
//! An [`FcLink`] is anything a frame can be handed to: the fabric hands
//! frames to the link of the port they leave by (an in-memory channel to
//! one of the gateway's own N_Ports, an FCoE VF_Port that encapsulates
//! them, an FCIP tunnel), and a port's link owner hands received frames to
//! the fabric through the port's own `FcLink` (`io::FabricPort`). A native
//! FC HBA would implement the same trait; none exists on these machines,
//! so that port kind is an interface here, not a claim.

use std::fmt;

use crate::wire::frame::Frame;

/// Why a link did not take a frame. The frame is discarded: class 3 has
/// no delivery guarantee, and the exchange's timeout recovers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The far end is gone.
    #[error("link down")]
    Down,
    /// The link's queue is full (no buffer-to-buffer credit).
    #[error("link congested")]
    Full,
}

/// Something that takes Fibre Channel frames for delivery.
pub trait FcLink: Send + Sync + fmt::Debug {
    /// Hands over a frame. Never blocks; a link that cannot take the frame
    /// now says so and the frame is dropped (and counted by the caller).
    fn transmit(&self, frame: Frame) -> Result<(), LinkError>;

    /// Hands over every frame in `frames`, in order, leaving it empty;
    /// returns how many the link did not take (dropped, as with
    /// [`FcLink::transmit`]). A link that can send several frames at once
    /// (one system call for all) does; by default each goes through
    /// `transmit`.
    fn transmit_batch(&self, frames: &mut Vec<Frame>) -> usize {
        frames
            .drain(..)
            .map(|f| self.transmit(f))
            .filter(Result::is_err)
            .count()
    }

    /// What the link is, for `unifab show` and logs.
    fn describe(&self) -> String;
}
