#!/usr/bin/env bash
# scripts/loop-libiscsi-test.sh — one libiscsi test against one unifab, N
# times in a row: does a race show?
#
#   bash scripts/loop-libiscsi-test.sh ALL.PreventAllow.ITNexusLoss 200
#
# unifab serves a 64 MiB removable file LU on /dev/shm (removable, so the
# PreventAllow tests run). Prints "runs N failed F" and the output of the
# first failures; exits non-zero if any run failed.
#
# Environment: UNIFAB_BIN (default target/release/unifab).
# Needs: libiscsi-bin (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/peers/lib.sh
. benches/peers/lib.sh

TEST=${1:?usage: loop-libiscsi-test.sh TEST RUNS}
RUNS=${2:?usage: loop-libiscsi-test.sh TEST RUNS}
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer"
BIN=$(realpath "${UNIFAB_BIN:-target/release/unifab}")
[[ -x "$BIN" ]] || die "no unifab at $BIN (cargo build --release -p unifab)"
need iscsi-test-cu libiscsi-bin

WORK=$(mktemp -d /dev/shm/unifab-loop.XXXXXX)
PID=""
cleanup() { stop_pid "$PID"; rm -rf "$WORK"; }
trap cleanup EXIT

port=$(free_port)
cat >"$WORK/unifab.toml" <<EOF
[[lu]]
name = "lu0"
backend = "file:$WORK/lu.img"
size = "64MiB"
removable = true

[iscsi]
listen = ["127.0.0.1:$port"]

[[iscsi.target]]
iqn = "$UNIFAB_IQN"
luns = ["lu0"]

[admin]
listen = "127.0.0.1:0"
data_dir = "$WORK/state"
EOF
"$BIN" run --config "$WORK/unifab.toml" >"$WORK/unifab.log" 2>&1 &
PID=$!
wait_port "$port" 20 || { cat "$WORK/unifab.log" >&2; die "unifab did not open its portal"; }

failed=0
for ((i = 1; i <= RUNS; i++)); do
    out=$(timeout 60 iscsi-test-cu --test="$TEST" "iscsi://127.0.0.1:$port/$UNIFAB_IQN/0" 2>&1) || true
    # "tests  Total  Ran  Passed  Failed  Inactive": one ran, none failed.
    if ! printf '%s\n' "$out" | awk '/^ +tests/ { ok = ($3 >= 1 && $5 == 0) } END { exit !ok }'; then
        failed=$((failed + 1))
        ((failed <= 2)) && printf 'run %d:\n%s\n' "$i" "$(printf '%s\n' "$out" | tail -15)"
    fi
done
echo "runs $RUNS failed $failed ($TEST)"
((failed == 0))
