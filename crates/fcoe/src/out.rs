//! Ethernet frames the state machines queue: the header and either a FIP
//! message or an FC frame to encapsulate. They are laid out only when a
//! link has a transmit buffer for them ([`EthOut::emit`]), so an FC
//! payload is copied once, into that buffer.

use bytes::Bytes;
use unifab_fc::wire::frame::Frame;

use crate::wire::fcoe::{encapsulate, encapsulated_len};
use crate::wire::{EthernetRepr, FipRepr, MIN_ETHERNET_FRAME, WireError};

/// What an outgoing Ethernet frame carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EthBody {
    /// A FIP message (padded to the Ethernet minimum when laid out).
    Fip(FipRepr),
    /// An FC frame, encapsulated in FCoE when laid out.
    Fcoe(Frame),
}

/// An outgoing Ethernet frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthOut {
    /// The Ethernet header.
    pub eth: EthernetRepr,
    /// The payload.
    pub body: EthBody,
}

impl EthOut {
    /// Bytes the frame takes on the wire (without FCS).
    pub fn buffer_len(&self) -> usize {
        match &self.body {
            EthBody::Fip(f) => (self.eth.header_len() + f.buffer_len()).max(MIN_ETHERNET_FRAME),
            EthBody::Fcoe(f) => encapsulated_len(&self.eth, f),
        }
    }

    /// Lays the frame out at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        match &self.body {
            EthBody::Fip(f) => {
                let n = self.buffer_len();
                crate::wire::check_len(buf, n)?;
                self.eth.emit(buf)?;
                let h = self.eth.header_len();
                f.emit(&mut buf[h..])?;
                buf[h + f.buffer_len()..n].fill(0);
                Ok(n)
            }
            EthBody::Fcoe(f) => encapsulate(&self.eth, f, buf),
        }
    }

    /// The frame as new bytes (control paths, tests, captures).
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        let n = self.emit(&mut v)?;
        v.truncate(n);
        Ok(Bytes::from(v))
    }
}
