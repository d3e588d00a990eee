#!/usr/bin/env bash
# Regenerate the fuzz seed corpora (fuzz/corpus/, gitignored) from the
# captures in ../shared/captures: every iSCSI PDU of iscsi-tapel.pcap and
# scsi-osd-example-001.pcap for iscsi_pdu, and their Login/Text data
# segments for iscsi_text.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p unifab --test captures -- --ignored write_fuzz_seeds
ls fuzz/corpus/iscsi_pdu | wc -l
ls fuzz/corpus/iscsi_text | wc -l
ls fuzz/corpus/cdb | wc -l
