#!/usr/bin/env bash
# benches/peers/cpu-per-io.sh — where the CPU goes: CPU time per command of
# the target (unifab and tgtd) and of the client (qemu-img bench), user and
# system separately, for 4 KiB reads and writes at QD32.
#
#   bash benches/peers/cpu-per-io.sh
#
# On a machine where the client and the target share the cores, the IOPS
# ratio between two targets is bounded by the client's own CPU per command;
# this script shows that split. It measures CPU time, not wall time: the
# target's from /proc/PID/stat before and after the run, the client's from
# getrusage(RUSAGE_CHILDREN). Each figure is the median of REPEATS runs,
# alternating the targets.
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   REPEATS      runs per measurement (default 3)
#   REQUESTS     qemu-img bench requests per run (default 100000)
#   LU_DIR       where the LU files live (default /dev/shm, tmpfs; a
#                directory on a disk file system measures the path a
#                production LU takes: page cache, the I/O thread hand-off)
#   OUT_DIR      where logs go (default target/bench-peers/cpu-<date-time>)
#
# Needs: tgt, qemu-utils, qemu-block-extra (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benches/peers/lib.sh
source benches/peers/lib.sh

UNIFAB_BIN=$(realpath "${UNIFAB_BIN:-target/release/unifab}")
REPEATS=${REPEATS:-3}
REQUESTS=${REQUESTS:-100000}
OUT_DIR=${OUT_DIR:-target/bench-peers/cpu-$(date +%Y%m%d-%H%M%S)}
need qemu-img qemu-utils
need python3 python3
mkdir -p "$OUT_DIR"
LU_DIR=${LU_DIR:-/dev/shm}
[[ -d "$LU_DIR" ]] || die "LU_DIR=$LU_DIR is not a directory"
WORK=$(mktemp -d "$LU_DIR/unifab-cpu.XXXXXX")
TGTD_PID=""
UNIFAB_PID=""
cleanup() {
    [[ -n $TGTD_PID ]] && stop_pid "$TGTD_PID"
    [[ -n $UNIFAB_PID ]] && stop_pid "$UNIFAB_PID"
    rm -rf "$WORK"
}
trap cleanup EXIT

SIZE=$((1 << 30))
make_lu "$WORK/tgtd.img" "$SIZE"
make_lu "$WORK/unifab.img" "$SIZE"
start_tgtd "$WORK/tgtd" "$WORK/tgtd.img"
start_unifab "$UNIFAB_BIN" "$WORK/unifab" "$WORK/unifab.img" "$SIZE"

# Warm up both: logins, and a first write of every block the runs touch
# (REQUESTS sequential 4 KiB requests from block 0), so reads measure data
# written before, as on a LU in use, not never-written blocks of the file.
qemu-img bench -f raw -t none -c "$REQUESTS" -d 32 -s 4096 -w "$TGTD_URL" >/dev/null
qemu-img bench -f raw -t none -c "$REQUESTS" -d 32 -s 4096 -w "$UNIFAB_URL" >/dev/null

declare -A rows
for rw in read write; do
    for ((i = 0; i < REPEATS; i++)); do
        rows[tgtd-$rw]+="$(cpu_run_one "$TGTD_PID" "$TGTD_URL" "$rw" "$REQUESTS")"$'\n'
        rows[unifab-$rw]+="$(cpu_run_one "$UNIFAB_PID" "$UNIFAB_URL" "$rw" "$REQUESTS")"$'\n'
    done
done


{
    echo "## CPU per 4 KiB command at QD32 (qemu-img bench), µs"
    echo
    echo "Medians of $REPEATS runs of $REQUESTS requests, alternating targets; LUs in $LU_DIR; $(nproc) cores."
    echo
    echo "| target | workload | target user | target sys | client user | client sys | IOPS |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for rw in read write; do
        for t in tgtd unifab; do
            r=${rows[$t-$rw]}
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$rw" \
                "$(col_median "$r" 1)" "$(col_median "$r" 2)" "$(col_median "$r" 3)" \
                "$(col_median "$r" 4)" "$(col_median "$r" 5)"
        done
    done
    echo
    echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT_DIR/results.md"
