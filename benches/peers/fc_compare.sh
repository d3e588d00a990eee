#!/usr/bin/env bash
# benches/peers/fc_compare.sh — the cost of the FC bridge: qemu-img bench
# through iSCSI → fabric → LU against iSCSI → LU, in the same run.
#
#   bash benches/peers/fc_compare.sh
#
# One unifab process serves two iSCSI targets on 127.0.0.1:
#
#   direct  iSCSI target → file LU (1 GiB, fully allocated, tmpfs)
#   via-fc  iSCSI target → fc:// LU → FCP initiator (an NPIV port per host
#           session) → software fabric → FCP target N_Port → file LU
#           (another 1 GiB file on tmpfs)
#
# Workloads (qemu-img bench, QEMU's own iSCSI driver):
#
#   workload      size  QD
#   read-4k       4K    32
#   write-4k      4K    32
#   read-1m       1M     8
#
# A short probe run (also the warm-up) sets each path's request count so a
# run lasts about RUN_SECONDS; every measurement is repeated REPEATS times,
# alternating the paths (direct, via-fc, direct, …), and the median is
# reported, with via-fc/direct.
#
# The issue's bar: via-fc reaches at least 90 % of direct's IOPS at 4 KiB
# QD32 (read and write). The script says PASS or FAIL for each and exits 1
# on a FAIL.
#
# Output: a Markdown table on stdout, and in OUT_DIR results.md, results.csv
# (every raw run), unifab's config and log.
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   REPEATS      repetitions per measurement (default 5)
#   RUN_SECONDS  length of one run (default 5)
#   OUT_DIR      where results go (default target/bench-peers/fc-<date-time>)
#
# Needs: qemu-utils, qemu-block-extra (scripts/setup.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/peers/lib.sh
. "$HERE/lib.sh"

for arg in "$@"; do
    case "$arg" in
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $arg (try --help)" ;;
    esac
done

REPEATS=${REPEATS:-5}
RUN_SECONDS=${RUN_SECONDS:-5}
UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-peers/fc-$(date +%Y%m%d-%H%M%S)}
LU_SIZE=$((1 << 30))
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer"
[[ "$RUN_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "RUN_SECONDS must be a positive integer"
[[ -x "$UNIFAB_BIN" ]] || die "no executable at $UNIFAB_BIN (cargo build --release -p unifab, or set UNIFAB_BIN)"
need qemu-img qemu-utils
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /dev/shm/fc-compare.XXXXXX)
UNIFAB_PID=""
cleanup() {
    stop_pid "$UNIFAB_PID"
    cp -f "$WORK"/unifab.log "$WORK"/unifab.toml "$OUT_DIR"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

make_lu "$WORK/direct.img" "$LU_SIZE"
make_lu "$WORK/fc.img" "$LU_SIZE"
PORT=$(free_port)
ADMIN=$(free_port)
T_WWPN="21:00:00:00:c9:00:00:0a"
cat >"$WORK/unifab.toml" <<EOF
[[lu]]
name = "direct"
backend = "file:$WORK/direct.img"
size = "$((LU_SIZE >> 20))MiB"

[[lu]]
name = "fc-disk"
backend = "file:$WORK/fc.img"
size = "$((LU_SIZE >> 20))MiB"

[[lu]]
name = "via-fc"
backend = "fc://$T_WWPN/0"

[fabric]
domain = 1
switch_wwn = "10:00:00:00:c9:00:00:01"

[[fabric.target]]
wwpn = "$T_WWPN"
luns = ["fc-disk"]

[fabric.initiator]
wwpn = "21:00:00:00:c9:00:00:0b"

[iscsi]
listen = ["127.0.0.1:$PORT"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:direct"
luns = ["direct"]

[[iscsi.target]]
iqn = "iqn.2026-11.io.unifab:via-fc"
luns = ["via-fc"]

[admin]
listen = "127.0.0.1:$ADMIN"
data_dir = "$WORK/state"
EOF
(cd "$WORK" && exec "$UNIFAB_BIN" run --config "$WORK/unifab.toml") >"$WORK/unifab.log" 2>&1 &
UNIFAB_PID=$!
wait_port "$PORT" 20 || { tail -30 "$WORK/unifab.log" >&2; die "unifab did not open its portal"; }
declare -A URL
URL[direct]="iscsi://127.0.0.1:$PORT/iqn.2026-11.io.unifab:direct/0"
URL[via-fc]="iscsi://127.0.0.1:$PORT/iqn.2026-11.io.unifab:via-fc/0"
PATHS=(direct via-fc)
for p in "${PATHS[@]}"; do
    qemu-img bench -f raw -t none -c 16 -d 1 -s 4096 "${URL[$p]}" >/dev/null 2>&1 \
        || { tail -30 "$WORK/unifab.log" >&2; die "qemu-img cannot read $p (${URL[$p]})"; }
    note "$p: ${URL[$p]}"
done

CSV="$OUT_DIR/results.csv"
echo "path,workload,size_bytes,depth,repeat,requests,seconds,iops,mb_per_s" >"$CSV"
# workload id | request size | depth | qemu mode | probe count
WORKLOADS=(
    "read-4k|4096|32|read|20000"
    "write-4k|4096|32|write|20000"
    "read-1m|1048576|8|read|400"
)
declare -A COUNT
for line in "${WORKLOADS[@]}"; do
    IFS='|' read -r id size depth mode probe <<<"$line"
    for p in "${PATHS[@]}"; do
        secs=$(qemu_bench "${URL[$p]}" "$size" "$depth" "$probe" "$mode")
        COUNT[$p/$id]=$(awk -v c="$probe" -v s="$secs" -v r="$RUN_SECONDS" \
            'BEGIN { n = int(c / s * r); if (n < c) n = c; print n }')
        note "calibrated $p $id: $probe requests in ${secs}s -> ${COUNT[$p/$id]} per run"
    done
done

START=$SECONDS
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq 1 "$REPEATS"); do
    note "repetition $rep of $REPEATS"
    for line in "${WORKLOADS[@]}"; do
        IFS='|' read -r id size depth mode _ <<<"$line"
        for p in "${PATHS[@]}"; do
            n=${COUNT[$p/$id]}
            secs=$(qemu_bench "${URL[$p]}" "$size" "$depth" "$n" "$mode")
            iops=$(awk -v c="$n" -v s="$secs" 'BEGIN { printf "%.1f", c / s }')
            mbps=$(awk -v i="$iops" -v b="$size" 'BEGIN { printf "%.1f", i * b / 1e6 }')
            echo "$p,$id,$size,$depth,$rep,$n,$secs,$iops,$mbps" >>"$CSV"
            note "  $p $id #$rep: $iops IOPS, $mbps MB/s"
        done
    done
done
kill -0 "$UNIFAB_PID" 2>/dev/null || die "unifab exited during the runs"

col() { # col PATH WORKLOAD FIELD(8=iops,9=mbps)
    local values
    values=$(awk -F, -v p="$1" -v w="$2" -v f="$3" '$1 == p && $2 == w { print $f }' "$CSV")
    # shellcheck disable=SC2086
    median $values
}
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
{
    echo "## The FC bridge: iSCSI → fabric → LU against iSCSI → LU"
    echo
    echo "Medians of $REPEATS runs of ~${RUN_SECONDS}s each, alternating paths; one unifab ($UNIFAB_BIN);"
    echo "1 GiB file LUs on tmpfs; qemu-img $(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || echo '?'); $(nproc) cores."
    echo
    echo "| workload | QD | direct IOPS | via-fc IOPS | via-fc MB/s | via-fc/direct | bar |"
    echo "|---|---:|---:|---:|---:|---:|---|"
    for line in "${WORKLOADS[@]}"; do
        IFS='|' read -r id _ depth _ _ <<<"$line"
        d=$(col direct "$id" 8); f=$(col via-fc "$id" 8); fm=$(col via-fc "$id" 9)
        r=$(awk -v a="$f" -v b="$d" 'BEGIN { printf "%.3f", a / b }')
        bar="—"
        if [[ "$id" == read-4k || "$id" == write-4k ]]; then
            if awk -v r="$r" 'BEGIN { exit !(r >= 0.90) }'; then bar="PASS (≥ 0.90)"; else bar="FAIL (< 0.90)"; fi
        fi
        echo "| $id | $depth | $d | $f | $fm | $r | $bar |"
    done
    echo
    echo "Took $((SECONDS - START)) s of runs; load average (1/5/15 min) at start $LOAD_START, at end $LOAD_END."
    echo "Raw runs: $CSV"
} | tee "$OUT_DIR/results.md"
if grep -q 'FAIL (' "$OUT_DIR/results.md"; then
    exit 1
fi
