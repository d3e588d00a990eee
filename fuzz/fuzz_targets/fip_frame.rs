//! FIP frames under arbitrary input.
//!
//! 1. `FipRepr::parse` never panics; a frame that parses re-emits to as
//!    many bytes as it had, and the re-emitted bytes parse to the same
//!    frame (fixed point; reserved bits come back as zero, so byte
//!    equality holds for canonical input, as the capture tests show for
//!    every standard frame).
//! 2. The same bytes, as a FIP Ethernet frame (untagged and on VLAN 100),
//!    from the ENode MAC, are handed to an FCF and to an ENode (both
//!    sans-IO); neither panics, and whatever they queue lays out.
#![no_main]

use std::time::{Duration, Instant};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::Wwn;
use unifab_fcoe::enode::{Enode, EnodeConfig};
use unifab_fcoe::fcf::{Fcf, FcfConfig};
use unifab_fcoe::wire::{EtherType, EthernetRepr, FipRepr, MacAddr, VlanTag};

const FCF: MacAddr = MacAddr([2, 0, 0, 0, 0xfc, 1]);
const ENODE: MacAddr = MacAddr([2, 0, 0, 0, 0xe0, 1]);

fn ethernet(vlan: Option<VlanTag>, dst: MacAddr, src: MacAddr, payload: &[u8]) -> Bytes {
    let eth = EthernetRepr {
        dst,
        src,
        vlan,
        ethertype: EtherType::FIP,
    };
    let mut v = vec![0u8; eth.header_len() + payload.len()];
    eth.emit(&mut v).unwrap_or_default();
    v[eth.header_len()..].copy_from_slice(payload);
    Bytes::from(v)
}

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    if let Ok(r) = FipRepr::parse(&bytes) {
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out).expect("a parsed frame emits");
        assert_eq!(out.len(), data.len());
        assert_eq!(FipRepr::parse(&Bytes::from(out)).expect("re-parse"), r);
    }
    let now = Instant::now();
    let mut fcf = Fcf::new(
        FcfConfig::new(FCF, Some(100), Wwn(0x1000_0000_0000_0001)),
        now,
    );
    let mut enode = Enode::new(
        EnodeConfig::new(ENODE, Wwn(0x2000_0000_0000_0001), Some(100)),
        now,
    );
    for vlan in [None, Some(VlanTag::fcoe(100))] {
        fcf.handle_ethernet(now, ethernet(vlan, FCF, ENODE, data));
        fcf.handle_ethernet(now, ethernet(vlan, MacAddr::ALL_FCF_MACS, ENODE, data));
        enode.handle_ethernet(now, ethernet(vlan, ENODE, FCF, data));
        enode.handle_ethernet(now, ethernet(vlan, MacAddr::ALL_ENODE_MACS, FCF, data));
    }
    fcf.handle_timeout(now + Duration::from_secs(30));
    enode.handle_timeout(now + Duration::from_secs(30));
    let mut buf = vec![0u8; 4096];
    while let Some(o) = fcf.poll_transmit() {
        o.emit(&mut buf).expect("queued frames lay out");
    }
    while let Some(o) = enode.poll_transmit() {
        o.emit(&mut buf).expect("queued frames lay out");
    }
    while fcf.poll_fabric().is_some() {}
    while fcf.poll_event().is_some() {}
});
