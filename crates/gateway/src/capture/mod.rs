//! Reading captures: pcap/pcapng files, link/IP/TCP decoding, TCP stream
//! reassembly and protocol splitters. Used by [`crate::pcap_check`], the
//! capture tests and the fuzz seed generator.

pub mod fc;
pub mod fcip;
pub mod fip;
pub mod iscsi;
pub mod net;
pub mod pcap;
pub mod tcp;
