#!/usr/bin/env bash
# Regenerate the fuzz seed corpora (fuzz/corpus/, gitignored) from the
# captures in ../shared/captures: every iSCSI PDU of iscsi-tapel.pcap and
# scsi-osd-example-001.pcap for iscsi_pdu, and their Login/Text data
# segments for iscsi_text; the FCIP frames of fcip_trace.cap (TCP
# reassembled) for fcip_encap, fcip_fsf and fcip_sw_ils; the FC frames
# of the FCoE captures for fc_header, fc_els, fc_ct and fc_fcp; their
# FIP and FCoE Ethernet payloads for fip_frame and fcoe_frame; whole
# capture files for pcap_check (see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p unifab --test captures -- --ignored write_fuzz_seeds
cargo test -p unifab --test fcip_captures -- --ignored write_fcip_fuzz_seeds
cargo test -p unifab --test fc_captures -- --ignored write_fc_fuzz_seeds
cargo test -p unifab --test fcoe_captures -- --ignored write_fcoe_fuzz_seeds
for d in iscsi_pdu iscsi_text iscsi_target_session iscsi_initiator_session iscsi_initiator_login iscsi_target_login cdb fcip_encap fcip_fsf fcip_sw_ils fc_header fc_els fc_ct fc_fcp fip_frame fcoe_frame; do
    echo "$d: $(find "fuzz/corpus/$d" -type f | wc -l) files"
done
# pcap_check takes whole capture files: every capture up to 256 KiB.
mkdir -p fuzz/corpus/pcap_check
for f in ../shared/captures/*.cap ../shared/captures/*.pcap; do
    if [ "$(stat -c %s "$f")" -le 262144 ]; then
        cp "$f" fuzz/corpus/pcap_check/
    fi
done
echo "pcap_check: $(find fuzz/corpus/pcap_check -type f | wc -l) files"
