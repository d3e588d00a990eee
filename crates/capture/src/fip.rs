//! FIP frames in captures: each is parsed with `unifab-fcoe`'s wire layer
//! (header, every descriptor, the bytes after the descriptor list),
//! re-emitted and compared byte for byte. A frame cut short at capture is
//! reported as truncated; one the parser refuses (a descriptor of the
//! wrong length, a pre-standard layout) as not accepted, with the reason.
//! The FC frames inside FLOGI/FDISC/LOGO/ELP descriptors are checked by
//! [`super::fc::check_fip`].

use bytes::Bytes;
use unifab_fcoe::wire::{FipRepr, WireError};

use crate::check::{Entry, Protocol, Verdict};

/// Checks one FIP frame; `payload` is what follows the EtherType.
pub fn check(number: u64, payload: &[u8], truncated: bool) -> Entry {
    let entry = |what: String, verdict| Entry {
        frame: number,
        protocol: Protocol::Fip,
        what,
        verdict,
    };
    if truncated {
        return entry("FIP frame".into(), Verdict::Truncated);
    }
    let bytes = Bytes::copy_from_slice(payload);
    let repr = match FipRepr::parse(&bytes) {
        Ok(r) => r,
        Err(e) => {
            // The 2008 FC-BB-5 drafts had a 3-word Fabric descriptor (no
            // VF_ID word); captures from CNAs of that time carry it.
            let reason = match e {
                WireError::DescriptorLength {
                    ty: 5, words: 3, ..
                } => "pre-standard FIP (FC-BB-5 draft): a 3-word Fabric descriptor, the \
                     standard's has 4"
                    .to_string(),
                other => other.to_string(),
            };
            return entry("FIP frame".into(), Verdict::NotAccepted { reason });
        }
    };
    let what = repr.name();
    let mut out = vec![0u8; repr.buffer_len()];
    if let Err(e) = repr.emit(&mut out) {
        return entry(
            what,
            Verdict::NotAccepted {
                reason: format!("re-emit: {e}"),
            },
        );
    }
    let diff = out
        .iter()
        .zip(payload)
        .position(|(a, b)| a != b)
        .or_else(|| (out.len() != payload.len()).then(|| out.len().min(payload.len())));
    match diff {
        None => entry(what, Verdict::Ok),
        Some(offset) => entry(what, Verdict::Mismatch { offset }),
    }
}
