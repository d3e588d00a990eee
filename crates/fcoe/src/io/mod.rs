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

/// Sleeps until `deadline` (forever without one).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
        None => std::future::pending::<()>().await,
    }
}

/// Frames taken from a channel at once before the driver sends what it has.
const BATCH: usize = 256;
