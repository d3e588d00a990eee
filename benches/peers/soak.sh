#!/usr/bin/env bash
# benches/peers/soak.sh — a thousand hosts on one gateway: SESSIONS iSCSI
# sessions at once, each writing its own 4 KiB block and reading it back
# (verified) from 8 driver threads, for SOAK_SECONDS. Prints logins, I/Os,
# errors, the gateway's resident set per session and its descriptors every
# 10 s and at the end. Not part of the default test run (its short form is
# crates/gateway/tests/thousand_sessions.rs).
#
#   bash benches/peers/soak.sh
#   SESSIONS=200 SOAK_SECONDS=10 bash benches/peers/soak.sh   # a quick look
#
# Environment:
#   UNIFAB_BIN     unifab binary (default target/release/unifab)
#   SOAK_BIN       the soak client (default target/release/soak)
#   SESSIONS       sessions (default 1000)
#   SOAK_SECONDS   how long the I/O runs (default 60)
#   OUT_DIR        where the log and results go (default target/bench-peers/soak-<date-time>)
#
# Exit status: 0 when every login, command and comparison succeeded.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benches/peers/lib.sh
. benches/peers/lib.sh

UNIFAB_BIN=${UNIFAB_BIN:-target/release/unifab}
SOAK_BIN=${SOAK_BIN:-target/release/soak}
SESSIONS=${SESSIONS:-1000}
SOAK_SECONDS=${SOAK_SECONDS:-60}
OUT_DIR=${OUT_DIR:-target/bench-peers/soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
UNIFAB_BIN=$(realpath "$UNIFAB_BIN" 2>/dev/null || echo "$UNIFAB_BIN")
SOAK_BIN=$(realpath "$SOAK_BIN" 2>/dev/null || echo "$SOAK_BIN")
[[ -x "$SOAK_BIN" ]] || die "no soak client at $SOAK_BIN (cargo build --release -p unifab-benches --bin soak, or set SOAK_BIN)"

# Each session holds a socket at both ends: the soft descriptor limit goes
# to the hard one (the gateway raises its own the same way).
ulimit -n "$(ulimit -Hn)"
(($(ulimit -n) >= SESSIONS + 100)) || die "the descriptor limit ($(ulimit -n)) is below $((SESSIONS + 100)): raise ulimit -Hn"

work=$(mktemp -d /dev/shm/soak.XXXXXX)
cleanup() { stop_pid "${UNIFAB_PID:-}"; rm -rf "$work"; }
trap cleanup EXIT
# 4 KiB per session, rounded up to whole MiB, at least 16 MiB.
size=$(((SESSIONS * 4096 + (1 << 20) - 1) >> 20 << 20))
((size >= 16 << 20)) || size=$((16 << 20))
make_lu "$work/lu.img" "$size"
start_unifab_luns "$UNIFAB_BIN" "$work/unifab" "$size" "$work/lu.img"
note "unifab $UNIFAB_PID on 127.0.0.1:$UNIFAB_PORT; $SESSIONS sessions for $SOAK_SECONDS s"
status=0
"$SOAK_BIN" "127.0.0.1:$UNIFAB_PORT" "$UNIFAB_IQN" "$SESSIONS" "$SOAK_SECONDS" "$UNIFAB_PID" |
    tee "$OUT_DIR/results.txt" || status=$?
cp "$work/unifab/unifab.log" "$work/unifab/unifab.toml" "$OUT_DIR/" 2>/dev/null || true
{
    echo "unifab: $UNIFAB_BIN; $(nproc) cores; load average at end $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$OUT_DIR/results.txt"
note "results: $OUT_DIR/results.txt"
exit "$status"
