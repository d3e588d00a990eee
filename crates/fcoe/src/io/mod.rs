//! tokio drivers (feature `io`): one task per FCoE port runs the sans-IO
//! state machine with its Ethernet link.
//!
//! - [`fcf::spawn_fcf`]: an FCF whose ENodes' VF_Ports attach to a
//!   `unifab_fc` [`Switch`](unifab_fc::io::Switch).
//! - [`enode::spawn_enode`]: an ENode carrying an N_Port of a
//!   [`FcNode`](unifab_fc::io::FcNode) to a remote FCF (through
//!   [`FcNode::add_port_via`](unifab_fc::io::FcNode::add_port_via)).

pub mod enode;
pub mod fcf;

use std::time::Instant;

pub use enode::{EnodeHandle, spawn_enode};
pub use fcf::{FcfHandle, spawn_fcf};

/// A driver loop's one timer. It is re-armed only when the deadline moves,
/// not built afresh (a timer-wheel entry registered and removed) on every
/// pass of the loop, which under load is every batch of frames.
struct Timer {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl Timer {
    fn new() -> Timer {
        Timer {
            // Unarmed: never awaited until `arm` gives it a deadline.
            sleep: Box::pin(tokio::time::sleep(std::time::Duration::from_secs(
                365 * 86_400,
            ))),
            armed: None,
        }
    }

    /// Fires at `deadline` (never without one).
    fn arm(&mut self, deadline: Option<Instant>) {
        if deadline != self.armed {
            if let Some(d) = deadline {
                self.sleep.as_mut().reset(tokio::time::Instant::from_std(d));
            }
            self.armed = deadline;
        }
    }

    /// Waits for the armed deadline; at once if it has passed.
    async fn fired(&mut self) {
        match self.armed {
            Some(_) => self.sleep.as_mut().await,
            None => std::future::pending::<()>().await,
        }
    }
}

/// Frames taken from a channel at once before the driver sends what it has.
const BATCH: usize = 256;
