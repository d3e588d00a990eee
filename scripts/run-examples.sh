#!/usr/bin/env bash
# scripts/run-examples.sh — run every library crate's examples that need no
# outside peer (scripts/test-all.sh calls it after `cargo build --examples`).
#
#   bash scripts/run-examples.sh
#
# The iSCSI target and initiator examples are each other's peer: the target
# is started on a free loopback port and the initiator reads through it.
# The capture checker runs over the shared captures when they are there
# (../shared/captures beside the clone, as in CI) and over a capture the
# repository carries otherwise. Each run is bounded; any failure fails.
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
    printf '\n---- example: %s\n' "$*"
    timeout --kill-after=5 60 cargo run -q "$@"
}

run -p unifab-scsi-core --example memory_lu
run -p unifab-fc --example header_roundtrip
run -p unifab-fc --example fabric
run -p unifab-fcoe --example fip_roundtrip
run -p unifab-fcip --example encap_roundtrip
run -p unifab-testkit --example wan_echo

CAPTURE=../shared/captures/fcip_trace.cap
[[ -f $CAPTURE ]] || CAPTURE=$(git ls-files '*.pcap' '*.cap' | head -n 1)
[[ -n $CAPTURE && -f $CAPTURE ]] || { echo "no capture to check" >&2; exit 1; }
run -p unifab-capture --example check -- "$CAPTURE"

# The iSCSI target on a free port, and the initiator against it.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cargo build -q -p unifab-iscsi --example target --example inquiry
TARGET_LOG=$(mktemp)
timeout --kill-after=5 120 cargo run -q -p unifab-iscsi --example target -- "127.0.0.1:$PORT" >"$TARGET_LOG" 2>&1 &
TARGET_PID=$!
trap 'kill "$TARGET_PID" 2>/dev/null || true; rm -f "$TARGET_LOG"' EXIT
for _ in $(seq 1 100); do
    grep -q '^serving' "$TARGET_LOG" && break
    kill -0 "$TARGET_PID" 2>/dev/null || { cat "$TARGET_LOG" >&2; echo "the target example died" >&2; exit 1; }
    sleep 0.1
done
grep -q '^serving' "$TARGET_LOG" || { cat "$TARGET_LOG" >&2; echo "the target example never listened" >&2; exit 1; }
cat "$TARGET_LOG"
run -p unifab-iscsi --example inquiry -- "127.0.0.1:$PORT" iqn.2026-11.io.unifab:example
echo
echo "run-examples: every example ran"
