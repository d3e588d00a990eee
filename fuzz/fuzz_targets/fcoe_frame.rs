//! FCoE frames under arbitrary input.
//!
//! 1. `decode` (version, delimiters, whole words, CRC, FC header) never
//!    panics; a frame that decodes re-encapsulates to the same bytes (the
//!    encapsulation has no other fields than those it keeps: reserved
//!    bytes and FCP_DATA fill are checked zero first, so non-canonical
//!    input is compared by meaning).
//! 2. The bytes, as an Ethernet frame with the FCoE EtherType (tagged and
//!    not), reach an FCF with one logged-in VN_Port and an ENode; neither
//!    panics.
#![no_main]

use std::time::Instant;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unifab_fc::Wwn;
use unifab_fcoe::enode::{Enode, EnodeConfig};
use unifab_fcoe::fcf::{Fcf, FcfConfig};
use unifab_fcoe::out::{EthBody, EthOut};
use unifab_fcoe::wire::fcoe::{FcoeFrame, decode};
use unifab_fcoe::wire::{EtherType, EthernetRepr, MacAddr, VlanTag};

const FCF: MacAddr = MacAddr([2, 0, 0, 0, 0xfc, 1]);
const ENODE: MacAddr = MacAddr([2, 0, 0, 0, 0xe0, 1]);

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    if let Ok(f) = decode(&bytes) {
        let eth = EthernetRepr {
            dst: FCF,
            src: ENODE,
            vlan: None,
            ethertype: EtherType::FCOE,
        };
        let out = EthOut {
            eth,
            body: EthBody::Fcoe(f.clone()),
        }
        .to_bytes()
        .expect("a decoded frame encapsulates");
        let again = decode(&out.slice(14..)).expect("re-decode");
        assert_eq!(again, f);
        // Canonical input: reserved bytes zero, and the fill of FCP_DATA
        // (dropped by decode, sent again as zeros) zero too.
        let canonical = FcoeFrame::new_checked(&data[..]).is_ok_and(|v| {
            let fc = v.fc_frame();
            let fill = usize::from(fc[11] & 0b11);
            let data_frame = fc[0] == 0x01 && fc[8] == 0x08;
            v.reserved_zero() && (!data_frame || fc[fc.len() - fill..].iter().all(|&b| b == 0))
        });
        if canonical && out.len() - 14 == data.len() {
            assert_eq!(&out[14..], data);
        }
    }
    let now = Instant::now();
    let mut fcf = Fcf::new(FcfConfig::new(FCF, None, Wwn(0x1000_0000_0000_0001)), now);
    let mut enode = Enode::new(
        EnodeConfig::new(ENODE, Wwn(0x2000_0000_0000_0001), None),
        now,
    );
    for vlan in [None, Some(VlanTag::fcoe(0))] {
        for (dst, src) in [
            (FCF, ENODE),
            (
                MacAddr::fpma(Default::default(), unifab_fc::FcId::new(0x010100)),
                FCF,
            ),
        ] {
            let eth = EthernetRepr {
                dst,
                src,
                vlan,
                ethertype: EtherType::FCOE,
            };
            let mut v = vec![0u8; eth.header_len() + data.len()];
            eth.emit(&mut v).unwrap_or_default();
            v[eth.header_len()..].copy_from_slice(data);
            let b = Bytes::from(v);
            fcf.handle_ethernet(now, b.clone());
            enode.handle_ethernet(now, b);
        }
    }
    while fcf.poll_fabric().is_some() {}
    while enode.poll_fc().is_some() {}
});
