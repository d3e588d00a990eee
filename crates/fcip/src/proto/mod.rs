//! sans-IO state machines: they take input (bytes, frames, `now`) and
//! produce output; no sockets, clocks or tasks.

pub mod compress;
pub mod eport;
pub mod fastwrite;
pub mod fspf;
pub mod handshake;
pub mod link;
pub mod stream;
pub mod tape;
