//! Property tests of the FCoE wire layer: emit then parse is the identity
//! for Ethernet headers, every FIP descriptor and message, and FCoE
//! frames; whatever parses re-emits to bytes that parse to the same
//! meaning (reserved bits are not kept: they come back as zero, which is
//! what every standard frame carries); no parser panics on arbitrary
//! input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::{Eof, FcHeader, FcHeaderRepr, Sof};
use unifab_fc::{FcId, Wwn};
use unifab_fcoe::out::{EthBody, EthOut};
use unifab_fcoe::wire::fcoe::decode;
use unifab_fcoe::wire::{
    Descriptor, DescriptorType, EtherType, EthernetFrame, EthernetRepr, FcMap, FipFlags, FipOp,
    FipRepr, FipSubcode, MacAddr, VlanTag,
};

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn fc_bytes() -> impl Strategy<Value = Bytes> {
    (any::<[u8; 24]>(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(h, mut p)| {
        p.truncate(p.len() / 4 * 4);
        let mut v = h.to_vec();
        v.extend(p);
        Bytes::from(v)
    })
}

fn descriptor() -> impl Strategy<Value = Descriptor> {
    prop_oneof![
        any::<u8>().prop_map(Descriptor::Priority),
        mac().prop_map(Descriptor::MacAddress),
        (0u32..1 << 24).prop_map(|m| Descriptor::FcMap(FcMap(m))),
        any::<u64>().prop_map(|w| Descriptor::NameIdentifier(Wwn(w))),
        (any::<u16>(), 0u32..1 << 24, any::<u64>()).prop_map(|(v, m, n)| Descriptor::Fabric {
            vf_id: v,
            fc_map: FcMap(m),
            fabric_name: Wwn(n)
        }),
        any::<u16>().prop_map(Descriptor::MaxFcoeSize),
        fc_bytes().prop_map(Descriptor::Flogi),
        fc_bytes().prop_map(Descriptor::Fdisc),
        fc_bytes().prop_map(Descriptor::Logo),
        fc_bytes().prop_map(Descriptor::Elp),
        (mac(), 0u32..1 << 24, any::<u64>()).prop_map(|(m, id, w)| Descriptor::VxPortId {
            mac: m,
            fc_id: FcId::new(id),
            port_name: Wwn(w)
        }),
        (any::<bool>(), any::<u32>()).prop_map(|(d, p)| Descriptor::FkaAdvPeriod {
            no_vn_keep_alives: d,
            period_ms: p
        }),
        any::<[u8; 8]>().prop_map(Descriptor::VendorId),
        (0u16..4096).prop_map(Descriptor::Vlan),
        (0usize..20).prop_map(|n| Descriptor::Fc4Attributes(Bytes::from(vec![7u8; n * 4 + 2]))),
        (16u8..=255, 0usize..20).prop_map(|(t, n)| Descriptor::Other {
            ty: DescriptorType(t),
            value: Bytes::from(vec![t; n * 4 + 2])
        }),
    ]
}

fn fip() -> impl Strategy<Value = FipRepr> {
    (
        any::<u16>(),
        any::<u8>(),
        any::<u16>(),
        prop::collection::vec(descriptor(), 0..8),
        prop::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(op, sub, flags, descriptors, pad)| FipRepr {
            op: FipOp(op),
            subcode: FipSubcode(sub),
            flags: FipFlags(flags),
            descriptors,
            padding: Bytes::from(pad),
        })
}

fn eth(ethertype: EtherType) -> impl Strategy<Value = EthernetRepr> {
    (
        mac(),
        mac(),
        prop::option::of((0u8..8, any::<bool>(), 0u16..4096)),
    )
        .prop_map(move |(dst, src, tag)| EthernetRepr {
            dst,
            src,
            vlan: tag.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
            ethertype,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fip_emit_parse_identity(r in fip()) {
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        let back = FipRepr::parse(&Bytes::from(b.clone())).unwrap();
        prop_assert_eq!(&back, &r);
        let mut again = vec![0u8; back.buffer_len()];
        back.emit(&mut again).unwrap();
        prop_assert_eq!(again, b);
    }

    #[test]
    fn fip_in_ethernet(e in eth(EtherType::FIP), r in fip()) {
        let out = EthOut { eth: e, body: EthBody::Fip(r.clone()) };
        let bytes = out.to_bytes().unwrap();
        prop_assert!(bytes.len() >= 60);
        let v = EthernetFrame::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&v), e);
        let back = FipRepr::parse(&bytes.slice(v.header_len()..)).unwrap();
        prop_assert_eq!(back.descriptors, r.descriptors);
    }

    #[test]
    fn fcoe_encapsulate_decode_identity(
        e in eth(EtherType::FCOE),
        h in any::<[u8; 24]>(),
        words in 0usize..528,
        sof in prop::sample::select(vec![Sof::I3, Sof::N3, Sof::F, Sof::I2]),
        eof in prop::sample::select(vec![Eof::N, Eof::T, Eof::A, Eof::NI]),
    ) {
        let header = FcHeaderRepr::parse(&FcHeader::new_checked(&h[..]).unwrap());
        let payload = Bytes::from((0..words * 4).map(|i| i as u8).collect::<Vec<u8>>());
        let f = Frame { sof, header, payload, eof };
        let bytes = EthOut { eth: e, body: EthBody::Fcoe(f.clone()) }.to_bytes().unwrap();
        let v = EthernetFrame::new_checked(&bytes[..]).unwrap();
        let back = decode(&bytes.slice(v.header_len()..)).unwrap();
        prop_assert_eq!(back, f);
    }

    #[test]
    fn parsers_never_panic(b in prop::collection::vec(any::<u8>(), 0..600)) {
        let bytes = Bytes::from(b);
        if let Ok(r) = FipRepr::parse(&bytes) {
            // What parses re-emits to bytes of the same meaning and
            // length (reserved bits come back as zero).
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out).unwrap();
            prop_assert_eq!(out.len(), bytes.len());
            prop_assert_eq!(FipRepr::parse(&Bytes::from(out)).unwrap(), r);
        }
        let _ = decode(&bytes);
        if let Ok(v) = EthernetFrame::new_checked(&bytes[..]) {
            let _ = EthernetRepr::parse(&v);
        }
    }
}
