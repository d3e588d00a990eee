#!/usr/bin/env bash
# benches/peers/bridge.sh — the bridge's cost: qemu-img bench through
# unifab→tgtd against the same tool straight to tgtd, in the same run.
#
#   bash benches/peers/bridge.sh            # measure and check the targets
#   bash benches/peers/bridge.sh --no-check # measure only
#
# One tgtd serves a 1 GiB, fully allocated LU file on tmpfs (/dev/shm).
# One unifab gateway exports that LU as LUN 0 of its own target, with the
# backend "iscsi://127.0.0.1:TGTD_PORT/IQN/1" (unifab's iSCSI initiator).
# Every measurement runs on both paths, alternating (direct, bridge,
# direct, …) so drift hits both alike; REPEATS times; medians are reported.
#
#   workload           tool                                       size  QD
#   seq 4 KiB read     qemu-img bench (QEMU's own iSCSI driver)   4K    32
#   seq 4 KiB write    qemu-img bench -w                          4K    32
#   seq 1 MiB read     qemu-img bench                             1M     8
#   seq 1 MiB write    qemu-img bench -w                          1M     8
#   seq 4 KiB read     qemu-img bench, latency per request        4K     1
#   seq 4 KiB write    qemu-img bench -w, latency per request     4K     1
#   rand 4 KiB read    unifab bench --rw read, p50 latency        4K     1
#
# qemu-img bench prints only a run time: the QD1 latency is run time /
# requests (a mean per run), and its median over the REPEATS runs is what
# is compared. unifab bench adds a true per-request median (p50), measured
# the same way on both paths (its own initiator, no verification cost in
# the timing).
#
# Targets (the issue's Show list), checked unless --no-check:
#   4 KiB QD32: bridge IOPS >= 80 % of direct (read and write)
#   1 MiB QD8:  bridge MB/s >= 90 % of direct (read and write)
#   QD1:        bridge median latency <= direct + 30 µs (qemu-img, read and write)
#
# With BUSY_POLL_US > 0 (default 0), a third path is measured in the
# same alternation: the same tgtd LU through the same gateway as LUN 1,
# whose initiator busy-polls at queue depth 1 (`[lu.iscsi] busy_poll_us`).
# Its columns are reported and checked beside the plain bridge's.
#
# With RELAY=1, two more paths are measured in the same alternation, as
# references: the host's connection through a byte relay to the same tgtd
# (`relay`, built from benches/src/bin/relay.rs), which parses nothing —
# `relay-copy` reads and writes the bytes, `relay-splice` moves them with
# splice(2). What a relay reaches is a ceiling for any bridge on the same
# machine; its columns are reported, not checked.
#
# Output: a Markdown table on stdout, and in OUT_DIR results.md,
# results.csv (every run) and both targets' logs.
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   REPEATS      repetitions per measurement (default 5)
#   RUN_SECONDS  length of one throughput run (default 4)
#   OUT_DIR      where results go (default target/bench-peers/bridge-<date-time>)
#   BUSY_POLL_US busy-poll window of a third path (default 0: no third path)
#   RELAY        1: also measure the two byte relays (default 0)
#   COALESCE_RESPONSES  if set, the gateway's `[iscsi] coalesce_responses`
#                (0: no response coalescing); unset: the default (16)
#   RELAY_BIN    the relay binary (default target/release/relay; built by
#                cargo build --release -p unifab-benches --bin relay)
#   CPU_LATENCY_US  if set, the gateway holds a CPU wake-up latency request
#                of this many µs (`[tuning] cpu_latency_us`; 0: idle cores
#                poll instead of halting). The request is system-wide and
#                lasts the whole run, so the direct path runs under it too.
#                Unset (the default): no request.
#   WORKER_THREADS  if set, the gateway's `[tuning] worker_threads` (the
#                threads running its tasks); unset: one per core.
#
# Needs: tgt, libiscsi-bin, qemu-utils, qemu-block-extra (scripts/setup.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/peers/lib.sh
. "$HERE/lib.sh"

CHECK=1
for arg in "$@"; do
    case "$arg" in
        --no-check) CHECK=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $arg (try --help)" ;;
    esac
done

REPEATS=${REPEATS:-5}
RUN_SECONDS=${RUN_SECONDS:-4}
UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-peers/bridge-$(date +%Y%m%d-%H%M%S)}
LU_SIZE=$((1 << 30))
BUSY_POLL_US=${BUSY_POLL_US:-0}
RELAY=${RELAY:-0}
COALESCE_RESPONSES=${COALESCE_RESPONSES:-}
[[ -z "$COALESCE_RESPONSES" || "$COALESCE_RESPONSES" =~ ^[0-9]+$ ]] || die "COALESCE_RESPONSES must be a number"
RELAY_BIN=${RELAY_BIN:-$ROOT/target/release/relay}
[[ "$RELAY" == 0 || "$RELAY" == 1 ]] || die "RELAY must be 0 or 1"
((RELAY == 0)) || [[ -x "$RELAY_BIN" ]] || die "no relay binary at $RELAY_BIN (cargo build --release -p unifab-benches --bin relay, or set RELAY_BIN)"
[[ "$BUSY_POLL_US" =~ ^[0-9]+$ ]] || die "BUSY_POLL_US must be a number of µs"
CPU_LATENCY_US=${CPU_LATENCY_US:-}
[[ -z "$CPU_LATENCY_US" || "$CPU_LATENCY_US" =~ ^[0-9]+$ ]] || die "CPU_LATENCY_US must be a number of µs"
WORKER_THREADS=${WORKER_THREADS:-}
[[ -z "$WORKER_THREADS" || "$WORKER_THREADS" =~ ^[1-9][0-9]*$ ]] || die "WORKER_THREADS must be a positive integer"
TUNING=$'[tuning]'
[[ -n "$CPU_LATENCY_US" ]] && TUNING+=$'\ncpu_latency_us = '"$CPU_LATENCY_US"
[[ -n "$WORKER_THREADS" ]] && TUNING+=$'\nworker_threads = '"$WORKER_THREADS"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer"
[[ "$RUN_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "RUN_SECONDS must be a positive integer"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
[[ -x "$UNIFAB_BIN" ]] || die "no unifab binary at $UNIFAB_BIN (cargo build --release -p unifab, or set UNIFAB_BIN)"

need qemu-img qemu-utils
need iscsi-readcapacity16 libiscsi-bin
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /dev/shm/bridge-bench.XXXXXX)
TGTD_PID="" GW_PID="" RELAY_PIDS=()
cleanup() {
    for pid in "${RELAY_PIDS[@]}"; do stop_pid "$pid"; done
    stop_pid "$GW_PID"
    stop_pid "$TGTD_PID"
    cp -f "$WORK"/tgtd/tgtd.log "$WORK"/gw/unifab.log "$WORK"/gw/unifab.toml "$OUT_DIR"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

make_lu "$WORK/lu.img" "$LU_SIZE"
start_tgtd "$WORK/tgtd" "$WORK/lu.img"
note "tgtd: $TGTD_URL (pid $TGTD_PID)"

# The gateway: the tgtd LU re-exported as LUN 0.
mkdir -p "$WORK/gw"
GW_PORT=$(free_port)
ADMIN_PORT=$(free_port)
BRIDGE_IQN="iqn.2026-11.io.unifab:bridge"
cat >"$WORK/gw/unifab.toml" <<EOF
[[lu]]
name = "bridged"
backend = "$TGTD_URL"

[[lu]]
name = "bridged-poll"
backend = "$TGTD_URL"

[lu.iscsi]
initiator_name = "iqn.2026-11.io.unifab:bridge-poll"
busy_poll_us = $BUSY_POLL_US

[iscsi]
listen = ["127.0.0.1:$GW_PORT"]
${COALESCE_RESPONSES:+coalesce_responses = $COALESCE_RESPONSES}

[[iscsi.target]]
iqn = "$BRIDGE_IQN"
luns = ["bridged", "bridged-poll"]

[admin]
listen = "127.0.0.1:$ADMIN_PORT"
data_dir = "$WORK/gw/state"

$TUNING
EOF
(cd "$WORK/gw" && RUST_LOG=warn exec "$UNIFAB_BIN" run --config "$WORK/gw/unifab.toml") >"$WORK/gw/unifab.log" 2>&1 &
GW_PID=$!
wait_port "$GW_PORT" 20 || { tail -20 "$WORK/gw/unifab.log" >&2; die "the gateway's portal did not open"; }
BRIDGE_URL="iscsi://127.0.0.1:$GW_PORT/$BRIDGE_IQN/0"
POLL_URL="iscsi://127.0.0.1:$GW_PORT/$BRIDGE_IQN/1"
note "bridge: $BRIDGE_URL -> $TGTD_URL (pid $GW_PID)"
declare -A URL=([direct]="$TGTD_URL" [bridge]="$BRIDGE_URL" [poll]="$POLL_URL")
PATHS=(direct bridge)
((BUSY_POLL_US > 0)) && PATHS+=(poll)
if ((RELAY)); then
    for mode in copy splice; do
        port=$(free_port)
        "$RELAY_BIN" "$mode" "127.0.0.1:$port" "127.0.0.1:$TGTD_PORT" >"$WORK/relay-$mode.log" 2>&1 &
        RELAY_PIDS+=($!)
        wait_port "$port" 10 || die "the $mode relay did not open its port"
        URL[relay-$mode]="iscsi://127.0.0.1:$port/$TGTD_IQN/1"
        PATHS+=("relay-$mode")
        note "relay-$mode: ${URL[relay-$mode]} -> tgtd (pid $!)"
    done
fi
# Only unifab's paths are checked against the targets; the relays are
# references.
checked() { [[ "$1" == bridge || "$1" == poll ]]; }
# The first command through the bridge also logs the gateway in to tgtd.
for p in "${PATHS[@]}"; do
    qemu-img bench -f raw -t none -c 16 -d 1 -s 4096 "${URL[$p]}" >/dev/null 2>&1 \
        || die "qemu-img cannot read through ${URL[$p]}; log: $OUT_DIR/unifab.log"
done
# id|size|depth|mode|probe requests
WORKLOADS=(
    "read-4k-qd32|4096|32|read|20000"
    "write-4k-qd32|4096|32|write|20000"
    "read-1m-qd8|1048576|8|read|400"
    "write-1m-qd8|1048576|8|write|400"
    "read-4k-qd1|4096|1|read|2000"
    "write-4k-qd1|4096|1|write|2000"
)

# Request counts sized so a run lasts about RUN_SECONDS (QD1 runs a tenth:
# many short runs make a better median).
declare -A COUNT
for w in "${WORKLOADS[@]}"; do
    IFS='|' read -r id size depth mode probe <<<"$w"
    secs=$(qemu_bench "$TGTD_URL" "$size" "$depth" "$probe" "$mode")
    target=$RUN_SECONDS
    [[ "$depth" == 1 ]] && target=$(awk -v r="$RUN_SECONDS" 'BEGIN { print r / 4 }')
    COUNT[$id]=$(awk -v p="$probe" -v s="$secs" -v r="$target" 'BEGIN { c = int(p / s * r); if (c < p) c = p; print c }')
    note "calibrated $id on tgtd: ${COUNT[$id]} requests per run"
done

CSV="$OUT_DIR/results.csv"
echo "workload,path,repeat,requests,seconds,iops,mb_per_s,us_per_request" >"$CSV"
declare -A RES
for ((r = 1; r <= REPEATS; r++)); do
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r id size depth mode probe <<<"$w"
        for p in "${PATHS[@]}"; do
            n=${COUNT[$id]}
            secs=$(qemu_bench "${URL[$p]}" "$size" "$depth" "$n" "$mode")
            read -r iops mbs us < <(awk -v c="$n" -v s="$secs" -v b="$size" \
                'BEGIN { printf "%.1f %.1f %.1f\n", c / s, c * b / s / 1e6, s / c * 1e6 }')
            echo "$id,$p,$r,$n,$secs,$iops,$mbs,$us" >>"$CSV"
            RES[$id/$p]="${RES[$id/$p]:-} $iops"
            RES[$id/$p/us]="${RES[$id/$p/us]:-} $us"
            RES[$id/$p/mbs]="${RES[$id/$p/mbs]:-} $mbs"
        done
    done
    note "repeat $r of $REPEATS done"
done

# A true per-request median at QD1 with unifab's own initiator.
for ((r = 1; r <= REPEATS; r++)); do
    for p in "${PATHS[@]}"; do
        p50=$("$UNIFAB_BIN" bench "${URL[$p]}" --rw read --qd 1 --bs 4KiB --size 64MiB --time 2 --json --quiet 2>/dev/null \
            | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["read"]["lat_us"]["p50"])')
        RES[p50/$p]="${RES[p50/$p]:-} $p50"
        echo "read-4k-qd1-p50,$p,$r,,,,,$p50" >>"$CSV"
    done
done

# The values of one workload and path: iops, mbs or us.
vals() {
    case $2 in
        iops) echo "${RES[$1]}" ;;
        *) echo "${RES[$1/$2]}" ;;
    esac
}

FAIL=0
exec 4>"$OUT_DIR/results.md"
{
    echo "## unifab → tgtd bridge vs tgtd direct (qemu-img bench, $REPEATS runs each, medians)"
    echo
    echo "load average (1/5/15 min) at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg) (the runs' own load counts); $(nproc) CPUs; CPU latency request: ${CPU_LATENCY_US:-none}${CPU_LATENCY_US:+ µs (held by the gateway, system-wide: both paths)}; coalesce_responses: ${COALESCE_RESPONSES:-default}; worker_threads: ${WORKER_THREADS:-one per core}"
    echo
    head="| workload | direct" rule="|---|---:"
    for p in "${PATHS[@]:1}"; do
        case $p in
            bridge) title="through unifab" ;;
            poll) title="busy poll ($BUSY_POLL_US µs)" ;;
            *) title=$p ;;
        esac
        head="$head | $title | ratio | "
        rule="$rule|---:|---:|---"
    done
    echo "$head | target |"
    echo "$rule|---|"
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r id size depth mode probe <<<"$w"
        row="| $id"
        if [[ "$depth" == 1 ]]; then
            key=us unit="latency (µs/request)" target="≤ +30 µs"
        elif [[ "$size" == 1048576 ]]; then
            key=mbs unit="(MB/s)" target="≥ 90 %"
        else
            key=iops unit="(IOPS)" target="≥ 80 %"
        fi
        row="$row $unit"
        # shellcheck disable=SC2046
        d=$(median $(vals "$id/direct" "$key"))
        row="$row | $d"
        for p in "${PATHS[@]:1}"; do
            # shellcheck disable=SC2046
            b=$(median $(vals "$id/$p" "$key"))
            case $key in
                us)
                    cmp=$(awk -v d="$d" -v b="$b" 'BEGIN { printf "%+.1f µs", b - d }')
                    ok=$(awk -v d="$d" -v b="$b" 'BEGIN { print (b - d <= 30) ? "ok" : "MISSED" }') ;;
                mbs)
                    cmp=$(awk -v d="$d" -v b="$b" 'BEGIN { printf "%.0f %%", b / d * 100 }')
                    ok=$(awk -v d="$d" -v b="$b" 'BEGIN { print (b >= 0.9 * d) ? "ok" : "MISSED" }') ;;
                *)
                    cmp=$(awk -v d="$d" -v b="$b" 'BEGIN { printf "%.0f %%", b / d * 100 }')
                    ok=$(awk -v d="$d" -v b="$b" 'BEGIN { print (b >= 0.8 * d) ? "ok" : "MISSED" }') ;;
            esac
            if checked "$p"; then
                [[ "$ok" == ok ]] || FAIL=1
            else
                ok="(reference)"
            fi
            row="$row | $b | $cmp | $ok"
        done
        echo "$row | $target |"
    done
    row="| read-4k-qd1 p50 (µs, unifab bench)"
    # shellcheck disable=SC2086
    d=$(median ${RES[p50/direct]})
    row="$row | $d"
    for p in "${PATHS[@]:1}"; do
        # shellcheck disable=SC2086
        b=$(median ${RES[p50/$p]})
        row="$row | $b | $(awk -v d="$d" -v b="$b" 'BEGIN { printf "%+.1f µs", b - d }') | "
    done
    echo "$row | (informative) |"
} >&4
exec 4>&-
cat "$OUT_DIR/results.md"
note "results in $OUT_DIR"
if ((CHECK && FAIL)); then
    die "a target was missed (see the table)"
fi
