#!/usr/bin/env bash
# benches/peers/scaling.sh — many hosts, many cores: N concurrent
# `qemu-img bench` clients on N distinct LUs and on one shared LU, against
# unifab and tgtd in the same run.
#
#   bash benches/peers/scaling.sh
#   N_LIST="1 2 4" RUN_SECONDS=1 bash benches/peers/scaling.sh   # a quick look
#
# Each target serves MAX_N + 1 LU files in LU_DIR (tmpfs): LUs 1…MAX_N for
# the distinct runs (client i on LU i) and one more that every client of a
# shared run uses. The two targets share the files and never run a workload
# at the same time. Workloads (QEMU's own iSCSI driver, cache=none):
#
#   read-4k    4 KiB sequential reads, QD32 per client
#   write-4k   4 KiB sequential writes, QD32 per client (pattern 0xa5)
#   read-1m    1 MiB sequential reads, QD8 per client
#
# On the shared LU, client i starts at offset i × LU/N so N clients touch
# different blocks, as N hosts on one datastore do; on distinct LUs every
# client starts at 0.
#
# qemu-img bench runs a fixed number of requests, so a one-client probe per
# target and workload measures its rate, and every cell then asks for about
# RUN_SECONDS of work from the previous cell's aggregate rate. Per cell:
#
#   IOPS        requests of all clients / wall time from first start to last exit
#   cores       target CPU time (user + system, /proc/PID/stat) / wall time
#   target µs   target CPU time per request
#   client µs   CPU time of all the qemu-img processes per request
#               (when this approaches what one core gives per request, the
#               clients, not the target, are the limit)
#
# Output: Markdown tables on stdout and OUT_DIR/results.md, every cell in
# OUT_DIR/results.csv, the targets' logs and config beside them. Runs on any
# core count; on two cores the clients and the target share the cores and
# the shared-LU contention appears as a higher CPU per request.
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   N_LIST       client counts (default "1 2 4 8 16")
#   WORKLOADS    subset of "read-4k write-4k read-1m" (default all three)
#   TARGETS      subset of "unifab tgtd" (default both)
#   RUN_SECONDS  aimed length of one cell (default 3)
#   LU_MIB       size of each LU (default 256)
#   LU_DIR       where the LU files live (default /dev/shm, tmpfs; a
#                directory on a disk file system measures the path a
#                production LU takes: page cache, the I/O thread hand-off)
#   OUT_DIR      where results go (default target/bench-peers/scaling-<date-time>)
#
# Needs: tgt, qemu-utils, qemu-block-extra, python3 (scripts/setup.sh), or
# the bundle of ../shared/device/make-bundle.sh first on PATH.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/peers/lib.sh
. "$HERE/lib.sh"

case "${1:-}" in
    "") ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (try --help)" ;;
esac

UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
N_LIST=${N_LIST:-"1 2 4 8 16"}
WORKLOADS=${WORKLOADS:-"read-4k write-4k read-1m"}
TARGETS=${TARGETS:-"unifab tgtd"}
RUN_SECONDS=${RUN_SECONDS:-3}
LU_MIB=${LU_MIB:-256}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-peers/scaling-$(date +%Y%m%d-%H%M%S)}

[[ "$RUN_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "RUN_SECONDS must be a positive integer"
[[ "$LU_MIB" =~ ^[1-9][0-9]*$ ]] || die "LU_MIB must be a positive integer"
MAX_N=0
for n in $N_LIST; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "N_LIST holds '$n', not a positive integer"
    ((n > MAX_N)) && MAX_N=$n
done
((MAX_N > 0)) || die "N_LIST is empty"
for w in $WORKLOADS; do
    case "$w" in read-4k|write-4k|read-1m) ;; *) die "unknown workload '$w'" ;; esac
done
for t in $TARGETS; do
    case "$t" in unifab|tgtd) ;; *) die "unknown target '$t'" ;; esac
done

need qemu-img qemu-utils
need python3 python3
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

mkdir -p "$OUT_DIR"
LU_DIR=${LU_DIR:-/dev/shm}
[[ -d "$LU_DIR" ]] || die "LU_DIR=$LU_DIR is not a directory"
WORK=$(mktemp -d "$LU_DIR/unifab-scaling.XXXXXX")
TGTD_PID="" UNIFAB_PID=""
cleanup() {
    stop_pid "$TGTD_PID"
    stop_pid "$UNIFAB_PID"
    cp -f "$WORK"/tgtd/tgtd.log "$WORK"/unifab/unifab.log "$WORK"/unifab/unifab.toml "$OUT_DIR"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

LU_SIZE=$((LU_MIB << 20))
LUS=()
for ((i = 0; i <= MAX_N; i++)); do
    make_lu "$WORK/lu$i.img" "$LU_SIZE"
    LUS+=("$WORK/lu$i.img")
done
SHARED=$MAX_N # index of the shared LU among LUS

declare -A BASE # target -> URL prefix; LUN = index + LUN0
declare -A LUN0 PID
for t in $TARGETS; do
    case "$t" in
        unifab)
            start_unifab_luns "$UNIFAB_BIN" "$WORK/unifab" "$LU_SIZE" "${LUS[@]}"
            BASE[unifab]="iscsi://127.0.0.1:$UNIFAB_PORT/$UNIFAB_IQN"; LUN0[unifab]=0; PID[unifab]=$UNIFAB_PID ;;
        tgtd)
            start_tgtd "$WORK/tgtd" "${LUS[@]}"
            BASE[tgtd]="iscsi://127.0.0.1:$TGTD_PORT/$TGTD_IQN"; LUN0[tgtd]=1; PID[tgtd]=$TGTD_PID ;;
    esac
done

# cpu_ticks PID -> user + system clock ticks of the whole process
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
TICKS=$(getconf CLK_TCK)

# shape WORKLOAD -> "SIZE DEPTH WRITE"
shape() {
    case "$1" in
        read-4k) echo "4096 32 0" ;;
        write-4k) echo "4096 32 1" ;;
        read-1m) echo "1048576 8 0" ;;
    esac
}

# cell TARGET WORKLOAD LAYOUT N COUNT -> "IOPS CORES TARGET_US CLIENT_US"
# N clients at once, COUNT requests each; fails if any client fails.
cell() {
    local t=$1 w=$2 layout=$3 n=$4 count=$5 size depth write i lun offset
    read -r size depth write <<<"$(shape "$w")"
    local dir="$WORK/cell"
    rm -rf "$dir"; mkdir -p "$dir"
    local stride=$(((LU_SIZE / n) / size * size))
    local pids=() t0 t1 c0 c1
    c0=$(cpu_ticks "${PID[$t]}")
    t0=$EPOCHREALTIME
    for ((i = 0; i < n; i++)); do
        if [[ $layout == distinct ]]; then
            lun=$((LUN0[$t] + i)); offset=0
        else
            lun=$((LUN0[$t] + SHARED)); offset=$((i * stride))
        fi
        local args=(bench -f raw -t none -s "$size" -S "$size" -d "$depth" -c "$count" -o "$offset")
        ((write)) && args+=(-w --pattern=165)
        # The subshell's `times` gives its child's (qemu-img's) CPU time.
        ( qemu-img "${args[@]}" "${BASE[$t]}/$lun" >"$dir/$i.out" 2>&1; echo "rc $?" >>"$dir/$i.out"; times >"$dir/$i.times" ) &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$EPOCHREALTIME
    c1=$(cpu_ticks "${PID[$t]}")
    for ((i = 0; i < n; i++)); do
        grep -q '^rc 0$' "$dir/$i.out" \
            || { cat "$dir/$i.out" >&2; die "qemu-img bench failed ($t $w $layout N=$n client $i)"; }
    done
    python3 - "$t0" "$t1" "$c0" "$c1" "$TICKS" "$n" "$count" "$dir" <<'EOF'
import sys, re
t0, t1 = float(sys.argv[1]), float(sys.argv[2])
c0, c1, hz, n, count = (int(x) for x in sys.argv[3:8])
d = sys.argv[8]
def secs(s):
    m = re.fullmatch(r"(\d+)m([\d.]+)s", s)
    return int(m.group(1)) * 60 + float(m.group(2))
client = 0.0
for i in range(n):
    lines = open(f"{d}/{i}.times").read().split("\n")
    u, s = lines[1].split()
    client += secs(u) + secs(s)
wall = t1 - t0
reqs = n * count
cpu = (c1 - c0) / hz
print(f"{reqs / wall:.0f} {cpu / wall:.2f} {cpu / reqs * 1e6:.1f} {client / reqs * 1e6:.1f}")
EOF
}

CSV="$OUT_DIR/results.csv"
echo "target,workload,layout,clients,requests_per_client,iops,mb_s,target_cores,target_us_per_io,client_us_per_io" >"$CSV"
declare -A RES # target,workload,layout,n -> "IOPS CORES TUS CUS"

for w in $WORKLOADS; do
    read -r size _ _ <<<"$(shape "$w")"
    for t in $TARGETS; do
        # probe (also the warm-up: logins, first touch of every page)
        probe=$((size == 4096 ? 20000 : 500))
        read -r rate _ <<<"$(cell "$t" "$w" distinct 1 "$probe")"
        note "$t $w probe: $rate IOPS"
        for layout in distinct shared; do
            est=$rate
            for n in $N_LIST; do
                count=$(((est * RUN_SECONDS + n - 1) / n))
                ((count < 100)) && count=100
                r=$(cell "$t" "$w" "$layout" "$n" "$count")
                RES[$t,$w,$layout,$n]=$r
                read -r iops cores tus cus <<<"$r"
                mbs=$(awk -v i="$iops" -v s="$size" 'BEGIN { printf "%.0f", i * s / 1e6 }')
                echo "$t,$w,$layout,$n,$count,$iops,$mbs,$cores,$tus,$cus" >>"$CSV"
                note "$t $w $layout N=$n: $iops IOPS, $cores cores, $tus µs target, $cus µs client"
                est=$iops
            done
        done
    done
done

{
    echo "## Scaling: N qemu-img bench clients, N distinct LUs against one shared LU"
    echo
    echo "$(nproc) cores; LUs of $LU_MIB MiB in $LU_DIR; each cell about $RUN_SECONDS s;" \
        "IOPS = all requests / wall time; cores and µs = the target process's CPU" \
        "(client µs = the qemu-img processes' CPU per request)."
    for w in $WORKLOADS; do
        echo
        echo "### $w"
        echo
        echo "| target | N | distinct IOPS | shared IOPS | shared/distinct | distinct cores | shared cores | distinct µs/IO | shared µs/IO | shared/distinct µs | client µs/IO |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for t in $TARGETS; do
            for n in $N_LIST; do
                read -r di dc dt dcu <<<"${RES[$t,$w,distinct,$n]}"
                read -r si sc st _ <<<"${RES[$t,$w,shared,$n]}"
                awk -v t="$t" -v n="$n" -v di="$di" -v si="$si" -v dc="$dc" -v sc="$sc" \
                    -v dt="$dt" -v st="$st" -v cu="$dcu" 'BEGIN {
                    printf "| %s | %d | %d | %d | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f | %.1f |\n",
                        t, n, di, si, si / di, dc, sc, dt, st, st / dt, cu }'
            done
        done
    done
    if [[ " $TARGETS " == *" unifab "* && " $TARGETS " == *" tgtd "* ]]; then
        echo
        echo "### unifab / tgtd, same run"
        echo
        echo "| workload | layout | N | unifab IOPS | tgtd IOPS | ratio | unifab µs/IO | tgtd µs/IO |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|"
        for w in $WORKLOADS; do
            for layout in distinct shared; do
                for n in $N_LIST; do
                    read -r ui _ ut _ <<<"${RES[unifab,$w,$layout,$n]}"
                    read -r ti _ tt _ <<<"${RES[tgtd,$w,$layout,$n]}"
                    awk -v w="$w" -v l="$layout" -v n="$n" -v ui="$ui" -v ti="$ti" -v ut="$ut" -v tt="$tt" 'BEGIN {
                        printf "| %s | %s | %d | %d | %d | %.2f | %.1f | %.1f |\n", w, l, n, ui, ti, ui / ti, ut, tt }'
                done
            done
        done
    fi
    echo
    echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT_DIR/results.md"
