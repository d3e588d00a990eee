#!/usr/bin/env bash
# benches/peers/fcoe_hop.sh — throughput and IOPS through an FCoE hop,
# AF_XDP against AF_PACKET, with frames per second and CPU per frame.
#
#   qemu-img bench (QEMU's iSCSI driver) → unifab A (iSCSI target, LU
#   fc://…) → FCP initiator → FCoE ENode → veth (MTU 2500) → FCF in a
#   network namespace → unifab B's fabric → FCP target → LU
#
# Workloads (sequential, one qemu-img bench run each, median of REPEATS):
#   read-1m   1 MiB reads,  queue depth 8
#   write-1m  1 MiB writes, queue depth 8
#   read-1m-qd32, write-1m-qd32  the same at queue depth 32: more than the
#             link can take at once while a gateway is off the CPU, so the
#             gateways' own bounds (max_frames_in, max_write_in_flight)
#             hold commands back; nothing may be lost
#   read-4k   4 KiB reads,  queue depth 32
#   write-4k  4 KiB writes, queue depth 32
# For each: MB/s (10^6 bytes/s), IOPS, FCoE frames/s (both directions, as
# A's ENode counts them) and CPU seconds per million frames (user+system
# of both unifab processes, from /proc/PID/stat, over the run).
#
# B's LU is a memory LU by default (LU=memory), so the hop is measured, not
# a disk; LU=file puts it on a file in /dev/shm.
#
# Needs root (netns, veth, AF_XDP), the release binary (UNIFAB_BIN or
# target/release/unifab), qemu-img with the iSCSI driver. Writes a
# Markdown table to stdout, and results.csv and both gateways' logs to
# OUT_DIR (default target/bench-fcoe/<date-time>, one per run, so a failed
# run's logs survive the next).
#
# Usage: sudo bash benches/peers/fcoe_hop.sh
#   IOS="af_xdp af_packet" REPEATS=3 RUN_SECONDS=5 XDP_MODE=auto LU=memory
# XDP_MODE is the ports' xdp_mode: auto (the default: generic on veth), native
# or generic; the table's link column says which ran.
# CPU_LATENCY_US, if set, makes gateway A hold a CPU wake-up latency request
# of that many µs (`[tuning] cpu_latency_us`; system-wide, so it covers both
# gateways and the host; 0: idle cores poll instead of halting). Unset: none.
# VETH_NAPI=threaded turns on GRO and threaded NAPI on both veth ends, so the
# receiving side's work (XDP, the copy into its UMEM) runs in a kernel thread
# instead of inside the sender's transmit call; the CPU column then counts
# those threads too. Unset: the veth default (receive inline in the sender).
# WORKLOADS_ONLY, if set, is a space-separated subset of the workload names.
# Time: about 2 × (6 workloads × REPEATS × RUN_SECONDS + 10 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
# shellcheck source=benches/peers/lib.sh
source benches/peers/lib.sh

IOS=${IOS:-"af_xdp af_packet"}
REPEATS=${REPEATS:-3}
RUN_SECONDS=${RUN_SECONDS:-5}
XDP_MODE=${XDP_MODE:-auto}
LU=${LU:-memory}
CPU_LATENCY_US=${CPU_LATENCY_US:-}
VETH_NAPI=${VETH_NAPI:-}
[[ -z "$VETH_NAPI" || "$VETH_NAPI" == threaded ]] || die "VETH_NAPI must be empty or threaded"
WORKLOADS_ONLY=${WORKLOADS_ONLY:-}
[[ -z "$CPU_LATENCY_US" || "$CPU_LATENCY_US" =~ ^[0-9]+$ ]] || die "CPU_LATENCY_US must be a number of µs"
TUNING=""
[[ -n "$CPU_LATENCY_US" ]] && TUNING=$'[tuning]\ncpu_latency_us = '"$CPU_LATENCY_US"
UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-fcoe/$(date +%Y%m%d-%H%M%S)}
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, veth, AF_XDP)"
[[ -x "$UNIFAB_BIN" ]] || die "no unifab binary at $UNIFAB_BIN (cargo build --release -p unifab)"
need qemu-img qemu-utils
need ip iproute2
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"
mkdir -p "$OUT_DIR"

TAG=$$
NS=fcoebench$TAG
VA=fcoeba$TAG
VB=fcoebb$TAG
WORK=$(mktemp -d /dev/shm/fcoe-bench.XXXXXX)
A_PID="" B_PID=""
cleanup() {
    stop_gw "$A_PID"
    stop_gw "$B_PID"
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$VA" 2>/dev/null || true
    cp -f "$WORK"/*.log "$OUT_DIR"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# SIGTERM first: a gateway that stops cleanly detaches its XDP program.
stop_gw() { # stop_gw PID
    [[ -n "${1:-}" ]] || return 0
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    stop_pid "$1"
}

TICKS=$(getconf CLK_TCK)
cpu_ticks() { # cpu_ticks PID... -> user+system ticks, summed
    local t=0 p f
    for p in "$@"; do
        read -r -a f <"/proc/$p/stat"
        # Fields 14 and 15 (utime, stime), after the parenthesised name.
        t=$((t + f[13] + f[14]))
    done
    echo "$t"
}
frames() { # frames ADMIN -> rx_fcoe + tx_fcoe of the ENode
    "$UNIFAB_BIN" show fcoe --json --admin "$1" | python3 -c '
import json, sys
p = json.load(sys.stdin)[0]
print(p["rx_fcoe"] + p["tx_fcoe"])'
}

start_hop() { # start_hop IO
    local io=$1 pa pb lu_cfg
    ip netns add "$NS"
    ip link add "$VA" type veth peer name "$VB"
    ip link set "$VB" netns "$NS"
    ip link set "$VA" mtu 2500 up
    ip -n "$NS" link set "$VB" mtu 2500 up
    ip -n "$NS" link set lo up
    NAPI_PIDS=()
    if [[ "$VETH_NAPI" == threaded ]]; then
        command -v ethtool >/dev/null || die "VETH_NAPI=threaded needs ethtool (scripts/setup.sh installs it)"
        ethtool -K "$VA" gro on
        ip netns exec "$NS" ethtool -K "$VB" gro on
        echo 1 >"/sys/class/net/$VA/threaded"
        ip netns exec "$NS" sh -c "echo 1 >/sys/class/net/$VB/threaded"
        # A thread's name is "napi/<dev>-<id>", cut to 15 characters.
        mapfile -t NAPI_PIDS < <(ps -e -o pid=,comm= | awk -v a="napi/$VA" -v b="napi/$VB" \
            'index($2, substr(a, 1, 15)) == 1 || index($2, substr(b, 1, 15)) == 1 { print $1 }')
        [[ ${#NAPI_PIDS[@]} -ge 2 ]] || die "no NAPI threads for $VA/$VB"
    fi
    pa=$(free_port)
    pb=$(free_port)
    if [[ "$LU" == file ]]; then
        lu_cfg="backend = \"file:$WORK/lu.img\""
    else
        lu_cfg='backend = "memory"'
    fi
    cat >"$WORK/b.toml" <<EOF
[[lu]]
name = "disk"
$lu_cfg
size = "1GiB"
[fabric]
domain = 2
[[fabric.target]]
wwpn = "21:00:00:00:c9:00:00:0a"
luns = ["disk"]
[[fcoe.port]]
interface = "$VB"
mode = "fcf"
io = "$io"
xdp_mode = "$XDP_MODE"
vlan = 100
[admin]
listen = "127.0.0.1:$pb"
data_dir = "$WORK/b"
EOF
    cat >"$WORK/a.toml" <<EOF
[[lu]]
name = "via-fcoe"
backend = "fc://21:00:00:00:c9:00:00:0a/0"
[fabric]
[fabric.initiator]
wwpn = "21:00:00:00:c9:00:00:0b"
nexus = "shared"
[[fcoe.port]]
interface = "$VA"
mode = "enode"
io = "$io"
xdp_mode = "$XDP_MODE"
[iscsi]
listen = ["127.0.0.1:0"]
[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:bench"
luns = ["via-fcoe"]
[admin]
listen = "127.0.0.1:$pa"
data_dir = "$WORK/a"
$TUNING
EOF
    ip netns exec "$NS" "$UNIFAB_BIN" run --config "$WORK/b.toml" >"$WORK/b.out" 2>"$WORK/b-$io.log" &
    B_PID=$!
    "$UNIFAB_BIN" run --config "$WORK/a.toml" >"$WORK/a.out" 2>"$WORK/a-$io.log" &
    A_PID=$!
    A_ADMIN=127.0.0.1:$pa
    for _ in $(seq 1 100); do
        grep -q "fc:// LU reachable" "$WORK/a-$io.log" 2>/dev/null && break
        sleep 0.2
    done
    grep -q "fc:// LU reachable" "$WORK/a-$io.log" || die "the fc:// LU never became reachable over $io (logs in $OUT_DIR)"
    URL=$(awk '/^  iscsi:\/\// { print $1; exit }' "$WORK/a.out")
    [[ -n "$URL" ]] || die "unifab A printed no portal"
    LINK=$("$UNIFAB_BIN" show fcoe --json --admin "$A_ADMIN" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["link"])')
}

stop_hop() {
    stop_gw "$A_PID"
    stop_gw "$B_PID"
    A_PID="" B_PID=""
    ip netns del "$NS"
    ip link del "$VA" 2>/dev/null || true
}

# FCoE assumes a lossless link: a frame either link drops (AF_XDP's
# receive counters, a stuck TX ring, AF_PACKET's full socket buffer) costs a
# command its timeout. Any such line in either gateway's log, and any
# forwarded command that failed, is printed and fails the run at the end.
LOSSES=0
check_losses() { # check_losses IO
    local f n
    for f in "$WORK/a-$1.log" "$WORK/b-$1.log"; do
        n=$(grep -cE 'receive drops|TX ring stuck|no free TX frame|frames dropped|forwarded command failed' "$f" || true)
        if ((n > 0)); then
            note "$1: $n loss or failure lines in $(basename "$f"):"
            grep -E 'receive drops|TX ring stuck|no free TX frame|frames dropped|forwarded command failed' "$f" | head -5 >&2
            LOSSES=$((LOSSES + n))
        fi
    done
}

CSV="$OUT_DIR/results.csv"
echo "io,link,workload,size_bytes,depth,repeat,requests,seconds,mb_per_s,iops,frames_per_s,cpu_s_per_mframe" >"$CSV"
# workload | size | depth | mode | probe requests
WORKLOADS=(
    "read-1m|1048576|8|read|400"
    "write-1m|1048576|8|write|400"
    "read-1m-qd32|1048576|32|read|400"
    "write-1m-qd32|1048576|32|write|400"
    "read-4k|4096|32|read|20000"
    "write-4k|4096|32|write|20000"
)
printf 'load average at start: %s; %s CPUs; CPU latency request: %s; veth NAPI: %s\n\n' \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)" "${CPU_LATENCY_US:-none}${CPU_LATENCY_US:+ µs (gateway A, system-wide)}" \
    "${VETH_NAPI:-inline}"
printf '| io | link | workload | MB/s | IOPS | FCoE frames/s | CPU s per 10^6 frames |\n'
printf '|---|---|---|---:|---:|---:|---:|\n'
for io in $IOS; do
    start_hop "$io"
    note "$io: $LINK, $URL"
    for w in "${WORKLOADS[@]}"; do
        IFS='|' read -r name size depth mode probe <<<"$w"
        [[ -z "$WORKLOADS_ONLY" || " $WORKLOADS_ONLY " == *" $name "* ]] || continue
        # A probe run sizes the request count to about RUN_SECONDS.
        secs=$(qemu_bench "$URL" "$size" "$depth" "$probe" "$mode")
        count=$(python3 -c "print(max($probe, int($probe * $RUN_SECONDS / max($secs, 0.001))))")
        mbs=() iops=() fps=() cpm=()
        for r in $(seq 1 "$REPEATS"); do
            f0=$(frames "$A_ADMIN")
            c0=$(cpu_ticks "$A_PID" "$B_PID" "${NAPI_PIDS[@]}")
            secs=$(qemu_bench "$URL" "$size" "$depth" "$count" "$mode")
            c1=$(cpu_ticks "$A_PID" "$B_PID" "${NAPI_PIDS[@]}")
            f1=$(frames "$A_ADMIN")
            read -r mb io_s fs cm < <(python3 -c "
s=$secs; n=$count; b=$size; fr=$f1-$f0; cpu=($c1-$c0)/$TICKS
print(f'{n*b/s/1e6:.1f} {n/s:.0f} {fr/s:.0f} {cpu/max(fr,1)*1e6:.2f}')")
            # The link's description has commas ("generic, copy"): quoted.
            echo "$io,\"$LINK\",$name,$size,$depth,$r,$count,$secs,$mb,$io_s,$fs,$cm" >>"$CSV"
            mbs+=("$mb") iops+=("$io_s") fps+=("$fs") cpm+=("$cm")
        done
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$io" "$LINK" "$name" \
            "$(median "${mbs[@]}")" "$(median "${iops[@]}")" "$(median "${fps[@]}")" "$(median "${cpm[@]}")"
    done
    stop_hop
    check_losses "$io"
done
note "results: $CSV"
((LOSSES == 0)) || die "$LOSSES loss or failure lines in the gateways' logs (copied to $OUT_DIR)"
