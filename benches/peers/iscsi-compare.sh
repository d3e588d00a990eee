#!/usr/bin/env bash
# benches/peers/iscsi-compare.sh — unifab against tgtd, measured the same way
# in the same run, with iperf3 as the loopback ceiling.
#
#   bash benches/peers/iscsi-compare.sh              # tgtd and unifab
#   bash benches/peers/iscsi-compare.sh --only-tgtd  # tgtd alone (developing this script)
#
# Both targets serve a 1 GiB, fully allocated LU file on tmpfs (/dev/shm) on
# 127.0.0.1, one after the other (never at the same time). Measurements:
#
#   workload           tool                                           size  QD
#   seq 4 KiB read     qemu-img bench (QEMU's own iSCSI driver)       4K    32
#   seq 4 KiB write    qemu-img bench -w                              4K    32
#   seq 1 MiB read     qemu-img bench                                 1M     8
#   seq 1 MiB write    qemu-img bench -w                              1M     8
#   rand 4 KiB read    iscsi-perf -r (libiscsi)                       4K    32
#   TCP loopback       iperf3, one stream, 1 MiB writes: the ceiling for
#                      1 MiB transfers
#
# qemu-img bench runs a fixed number of requests: a short probe run first
# (also a warm-up) measures each target's rate, and the count is then set so
# that one run lasts about RUN_SECONDS on that target. iscsi-perf and iperf3
# run for RUN_SECONDS. Every measurement is repeated REPEATS times,
# alternating targets (tgtd, unifab, tgtd, …) so drift hits both alike, and
# the median is reported.
#
# Output: a Markdown table on stdout (IOPS, MB/s = 10^6 bytes/s,
# unifab/tgtd ratio, % of iperf3 for 1 MiB transfers), and in OUT_DIR:
# results.md, results.csv (every raw run), and the targets' logs.
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   REPEATS      repetitions per measurement (default 5)
#   RUN_SECONDS  length of one run (default 5)
#   OUT_DIR      where results go (default target/bench-peers/<date-time>)
#
# Exits non-zero, saying why, if unifab is not runnable (unless --only-tgtd)
# or if any tool fails. Takes about 2.5 min per target with the defaults.
# Needs: tgt, libiscsi-bin, qemu-utils, qemu-block-extra, iperf3
# (scripts/setup.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/peers/lib.sh
. "$HERE/lib.sh"

ONLY_TGTD=0
for arg in "$@"; do
    case "$arg" in
        --only-tgtd) ONLY_TGTD=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $arg (try --help)" ;;
    esac
done

REPEATS=${REPEATS:-5}
RUN_SECONDS=${RUN_SECONDS:-5}
UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-peers/$(date +%Y%m%d-%H%M%S)}
LU_SIZE=$((1 << 30))
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer"
[[ "$RUN_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "RUN_SECONDS must be a positive integer"

need qemu-img qemu-utils
need iscsi-perf libiscsi-bin
need iscsi-readcapacity16 libiscsi-bin
need iperf3 iperf3
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /dev/shm/iscsi-compare.XXXXXX)
TGTD_PID="" UNIFAB_PID=""
cleanup() {
    stop_pid "$TGTD_PID"
    stop_pid "$UNIFAB_PID"
    cp -f "$WORK"/tgtd/tgtd.log "$WORK"/unifab/unifab.log "$WORK"/unifab/unifab.toml "$OUT_DIR"/ 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

TARGETS=(tgtd)
((ONLY_TGTD)) || TARGETS+=(unifab)

# Both targets run for the whole script: the LU files are fully allocated
# (so writes never allocate pages while timed), and each target is idle while
# the other is measured.
make_lu "$WORK/tgtd.img" "$LU_SIZE"
start_tgtd "$WORK/tgtd" "$WORK/tgtd.img"
declare -A URL
URL[tgtd]=$TGTD_URL
if ((ONLY_TGTD == 0)); then
    make_lu "$WORK/unifab.img" "$LU_SIZE"
    start_unifab "$UNIFAB_BIN" "$WORK/unifab" "$WORK/unifab.img" "$LU_SIZE"
    URL[unifab]=$UNIFAB_URL
    # A target that listens but cannot serve I/O is not runnable either.
    qemu-img bench -f raw -t none -c 16 -d 1 -s 4096 "$UNIFAB_URL" >/dev/null 2>&1 \
        || die "unifab is not runnable: it accepts connections but qemu-img cannot read its LU ($UNIFAB_URL; log in $OUT_DIR after exit)"
fi
declare -A BLOCK
for t in "${TARGETS[@]}"; do
    BLOCK[$t]=$(block_length "${URL[$t]}")
    [[ "${BLOCK[$t]}" =~ ^[0-9]+$ ]] || die "could not read $t's block length"
    note "$t: ${URL[$t]} (block length ${BLOCK[$t]})"
done

CSV="$OUT_DIR/results.csv"
echo "target,workload,tool,size_bytes,depth,repeat,requests,seconds,iops,mb_per_s" >"$CSV"

# workload id | tool | request size | depth | qemu mode | probe count
WORKLOADS=(
    "read-4k|qemu-img bench|4096|32|read|20000"
    "write-4k|qemu-img bench|4096|32|write|20000"
    "read-1m|qemu-img bench|1048576|8|read|400"
    "write-1m|qemu-img bench|1048576|8|write|400"
    "randread-4k|iscsi-perf|4096|32|-|-"
)

declare -A COUNT
calibrate() { # calibrate TARGET WORKLOAD-LINE
    local t=$1 id tool size depth mode probe secs
    IFS='|' read -r id tool size depth mode probe <<<"$2"
    [[ "$tool" == "qemu-img bench" ]] || return 0
    secs=$(qemu_bench "${URL[$t]}" "$size" "$depth" "$probe" "$mode")
    COUNT[$t/$id]=$(awk -v p="$probe" -v s="$secs" -v r="$RUN_SECONDS" \
        'BEGIN { c = int(p / s * r); if (c < p) c = p; print c }')
    note "calibrated $t $id: probe $probe requests in ${secs}s -> ${COUNT[$t/$id]} requests per run"
}

measure() { # measure TARGET WORKLOAD-LINE REPEAT -> appends to CSV
    local t=$1 rep=$3 id tool size depth mode probe secs iops requests blocks
    IFS='|' read -r id tool size depth mode probe <<<"$2"
    if [[ "$tool" == "qemu-img bench" ]]; then
        requests=${COUNT[$t/$id]}
        secs=$(qemu_bench "${URL[$t]}" "$size" "$depth" "$requests" "$mode")
        iops=$(awk -v c="$requests" -v s="$secs" 'BEGIN { printf "%.1f", c / s }')
    else
        blocks=$((size / BLOCK[$t]))
        ((blocks >= 1)) || die "$t's block length ${BLOCK[$t]} exceeds $size"
        iops=$(iscsi_perf "${URL[$t]}" "$blocks" "$depth" "$RUN_SECONDS")
        secs=$RUN_SECONDS
        requests=$(awk -v i="$iops" -v s="$secs" 'BEGIN { printf "%d", i * s }')
    fi
    local mbps
    mbps=$(awk -v i="$iops" -v b="$size" 'BEGIN { printf "%.1f", i * b / 1e6 }')
    echo "$t,$id,$tool,$size,$depth,$rep,$requests,$secs,$iops,$mbps" >>"$CSV"
    note "  $t $id #$rep: $iops IOPS, $mbps MB/s (${secs}s)"
}

START=$SECONDS
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for line in "${WORKLOADS[@]}"; do
    for t in "${TARGETS[@]}"; do calibrate "$t" "$line"; done
done
for rep in $(seq 1 "$REPEATS"); do
    note "repetition $rep of $REPEATS"
    for line in "${WORKLOADS[@]}"; do
        for t in "${TARGETS[@]}"; do measure "$t" "$line" "$rep"; done
    done
    mb=$(iperf3_loopback "$RUN_SECONDS")
    echo "loopback,tcp,iperf3,0,1,$rep,0,$RUN_SECONDS,0,$mb" >>"$CSV"
    note "  iperf3 loopback #$rep: $mb MB/s"
done

# ---- report ---------------------------------------------------------------------
col() { # col TARGET WORKLOAD FIELD(9=iops,10=mbps) -> median of that column
    local values
    values=$(awk -F, -v t="$1" -v w="$2" -v f="$3" '$1 == t && $2 == w { print $f }' "$CSV")
    [[ -n "$values" ]] || { echo "—"; return; }
    # shellcheck disable=SC2086
    median $values
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "—" || b == "—" || b == 0) print "—"; else printf "%.2f", a / b }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "—" || b == "—" || b == 0) print "—"; else printf "%.0f%%", 100 * a / b }'; }

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
IPERF=$(col loopback tcp 10)
U=unifab
((ONLY_TGTD)) && U=none
{
    echo "## iSCSI on loopback: unifab vs tgtd"
    echo
    echo "Medians of $REPEATS runs of ~${RUN_SECONDS}s each; MB/s = 10^6 bytes/s; 1 GiB LU on tmpfs; $(nproc) cores."
    echo "tgtd $(dpkg-query -W -f='${Version}' tgt), qemu-img $(dpkg-query -W -f='${Version}' qemu-utils), libiscsi $(dpkg-query -W -f='${Version}' libiscsi-bin); unifab: $( ((ONLY_TGTD)) && echo 'not run (--only-tgtd)' || echo "$UNIFAB_BIN")."
    echo
    echo "| workload | tool | QD | tgtd IOPS | tgtd MB/s | unifab IOPS | unifab MB/s | unifab/tgtd | % of iperf3 (tgtd / unifab) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
    for line in "${WORKLOADS[@]}"; do
        IFS='|' read -r id tool size depth _ _ <<<"$line"
        ti=$(col tgtd "$id" 9); tm=$(col tgtd "$id" 10)
        ui=$(col "$U" "$id" 9); um=$(col "$U" "$id" 10)
        p="—"
        [[ "$size" == 1048576 ]] && p="$(pct "$tm" "$IPERF") / $(pct "$um" "$IPERF")"
        echo "| $id | $tool | $depth | $ti | $tm | $ui | $um | $(ratio "$ui" "$ti") | $p |"
    done
    echo "| tcp loopback | iperf3 (1 stream) | — | — | $IPERF | — | — | — | 100% |"
    echo
    echo "Took $((SECONDS - START)) s; load average (1/5/15 min) at start $LOAD_START, at end $LOAD_END"
    echo "(other work on the machine competes for the same cores: compare ratios within one run, not across runs)."
    echo "Raw runs: $CSV"
} | tee "$OUT_DIR/results.md"
