//! iSCSI PDU framing and parsing. The first input byte selects the digests
//! (bit 0 header, bit 1 data); the rest is a byte stream. Every PDU the
//! framer splits off and the parser accepts is re-emitted; the re-emitted
//! PDU must parse to the same repr and re-emit to the same bytes (a fixed
//! point) of the input's length. Byte equality with the input itself holds
//! only for canonical input: the header reprs do not keep reserved bits and
//! the encoder writes zero padding (see fuzz/README.md).
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use unifab_iscsi::wire::{Ahs, Digests, Framer, encode_pdu, frame::MAX_DATA_SEGMENT_LENGTH};

fuzz_target!(|input: &[u8]| {
    let Some((&sel, stream)) = input.split_first() else {
        return;
    };
    let digests = Digests {
        header: sel & 1 != 0,
        data: sel & 2 != 0,
    };
    let framer = Framer {
        digests,
        max_data_segment_length: MAX_DATA_SEGMENT_LENGTH,
    };
    let mut buf = BytesMut::from(stream);
    let mut consumed = 0usize;
    loop {
        let before = buf.len();
        let frame = match framer.decode(&mut buf) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(_) => {
                // A data digest error consumes the PDU; anything else ends the stream.
                if buf.len() < before {
                    consumed += before - buf.len();
                    continue;
                }
                break;
            }
        };
        let original = &stream[consumed..consumed + (before - buf.len())];
        consumed += before - buf.len();
        let Ok(pdu) = frame.parse() else { continue };
        let Ok(ahs) = Ahs::parse_all(&frame.ahs) else {
            continue;
        };
        let mut ahs_out = Vec::new();
        for a in &ahs {
            a.emit(&mut ahs_out);
        }
        let out = encode_pdu(&pdu, &ahs_out, &frame.data, digests).expect("a parsed PDU re-emits");
        // Re-parse the re-emitted bytes.
        let mut again = BytesMut::from(&out[..]);
        let f2 = framer
            .decode(&mut again)
            .expect("re-emitted PDU frames")
            .expect("whole PDU");
        assert!(again.is_empty());
        let pdu2 = f2.parse().expect("re-emitted PDU parses");
        assert_eq!(pdu, pdu2);
        assert_eq!(f2.data, frame.data);
        let out2 = encode_pdu(&pdu2, &ahs_out, &f2.data, digests).expect("re-emit");
        assert_eq!(out, out2);
        // Same length as the input PDU; same BHS whenever the input's
        // reserved fields were zero (checked by re-parsing above).
        assert_eq!(out.len(), original.len());
    }
});
