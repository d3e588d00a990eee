#!/usr/bin/env bash
# benches/peers/ab.sh — two unifab binaries against each other, alternated:
# does a change make the iSCSI target faster or slower?
#
#   UNIFAB_A=/path/to/old/unifab UNIFAB_B=target/release/unifab \
#       bash benches/peers/ab.sh
#
# Both serve a 1 GiB, fully allocated LU file in LU_DIR (tmpfs) on
# 127.0.0.1, side by side for the whole run. qemu-img bench (QEMU's own
# iSCSI driver) runs each workload against A, then B, ROUNDS times, and the
# script prints every round and the medians, in requests per second, each
# with the target's CPU time per request (user + system of its process,
# from /proc/PID/stat around the run, in µs): when the client is the limit,
# the rates match and only the CPU tells a cheaper target from a dearer one.
#
#   write-4k   4 KiB sequential writes, queue depth 32
#   read-4k    4 KiB sequential reads,  queue depth 32
#
# Environment:
#   UNIFAB_A, UNIFAB_B  the binaries (required; they may be the same, to see
#                       the noise)
#   ROUNDS              rounds (default 4)
#   REQUESTS            requests per run (default 150000)
#   LU_DIR              where the LU files live (default /dev/shm, tmpfs;
#                       a disk file system measures the page cache and the
#                       I/O thread hand-off)
#
# Needs: qemu-utils, qemu-block-extra (scripts/setup.sh). Takes about
# ROUNDS × 4 × (REQUESTS / 150,000) s on two cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benches/peers/lib.sh
source benches/peers/lib.sh

A=${UNIFAB_A:-}
B=${UNIFAB_B:-}
[[ -n "$A" && -n "$B" ]] || die "set UNIFAB_A and UNIFAB_B to the two unifab binaries"
ROUNDS=${ROUNDS:-4}
REQUESTS=${REQUESTS:-150000}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
[[ "$REQUESTS" =~ ^[1-9][0-9]*$ ]] || die "REQUESTS must be a positive integer"
need qemu-img qemu-utils
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

SIZE=$((1 << 30))
LU_DIR=${LU_DIR:-/dev/shm}
[[ -d "$LU_DIR" ]] || die "LU_DIR=$LU_DIR is not a directory"
WORK=$(mktemp -d "$LU_DIR/unifab-ab.XXXXXX")
A_PID="" B_PID=""
cleanup() {
    stop_pid "$A_PID"
    stop_pid "$B_PID"
    rm -rf "$WORK"
}
trap cleanup EXIT

make_lu "$WORK/a.img" "$SIZE"
make_lu "$WORK/b.img" "$SIZE"
start_unifab "$A" "$WORK/a" "$WORK/a.img" "$SIZE"
A_PID=$UNIFAB_PID A_URL=$UNIFAB_URL
start_unifab "$B" "$WORK/b" "$WORK/b.img" "$SIZE"
B_PID=$UNIFAB_PID B_URL=$UNIFAB_URL

TICKS=$(getconf CLK_TCK)
# rate URL MODE PID -> "requests per second" "target CPU µs per request" of
# one qemu-img bench run
rate() {
    local flag=() start end before after
    [[ $2 == write ]] && flag=(-w)
    before=$(cpu_of "$3")
    start=$(date +%s.%N)
    qemu-img bench -f raw -t none "${flag[@]}" -c "$REQUESTS" -d 32 -s 4096 -S 4096 "$1" \
        >/dev/null 2>&1 || die "qemu-img bench failed on $1 ($2)"
    end=$(date +%s.%N)
    after=$(cpu_of "$3")
    python3 -c "
b, a = '$before'.split(), '$after'.split()
cpu = (int(a[0]) + int(a[1]) - int(b[0]) - int(b[1])) / $TICKS
print(f'{$REQUESTS / ($end - $start):.0f} {cpu / $REQUESTS * 1e6:.2f}')"
}

declare -A RUNS CPU
echo "| round | workload | A (req/s) | B (req/s) | A (µs CPU/req) | B (µs CPU/req) |"
echo "|---|---|---:|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
    for mode in write read; do
        read -r a ca < <(rate "$A_URL" "$mode" "$A_PID")
        read -r b cb < <(rate "$B_URL" "$mode" "$B_PID")
        RUNS[$mode-a]+="$a "
        RUNS[$mode-b]+="$b "
        CPU[$mode-a]+="$ca "
        CPU[$mode-b]+="$cb "
        echo "| $r | $mode-4k | $a | $b | $ca | $cb |"
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for mode in write read; do
    a=$(median <<<"${RUNS[$mode-a]}")
    b=$(median <<<"${RUNS[$mode-b]}")
    ca=$(median <<<"${CPU[$mode-a]}")
    cb=$(median <<<"${CPU[$mode-b]}")
    echo "| median | $mode-4k | $a | $b (B/A $(python3 -c "print(f'{$b / $a:.3f}')")) | $ca | $cb (B/A $(python3 -c "print(f'{$cb / $ca:.3f}')")) |"
done
