#!/usr/bin/env bash
# benches/peers/rbd-compare.sh — unifab in front of a Ceph RBD image, against
# the host talking to Ceph itself, in the same run.
#
#   bash benches/peers/rbd-compare.sh
#
# Starts a one-node Ceph cluster (scripts/ceph.sh: one monitor, one memstore
# OSD, all on 127.0.0.1) and a 1 GiB image written through once (so reads
# find data and writes never allocate objects while timed). Then, on that
# same image:
#
#   unifab       qemu-img bench through QEMU's iSCSI driver to unifab, whose
#                LU is rbd:rbd/bench (librbd's aio, in the gateway)
#   qemu-rbd     qemu-img bench through QEMU's own rbd driver
#                (qemu-block-extra's block-rbd.so): the host on librbd
#                directly, the ceiling a gateway is judged against
#   rbd bench    librbd's own tool (sequential, the same size and depth),
#                for reference
#
#   workload   size  QD     (qemu-img bench: -t none, sequential; -w --pattern for writes)
#   read-4k    4K    32
#   write-4k   4K    32
#   read-1m    1M     8
#   write-1m   1M     8
#
# A short probe run calibrates each client's request count so one run lasts
# about RUN_SECONDS; each measurement is repeated REPEATS times, alternating
# unifab and qemu-rbd, and the median is reported with unifab/qemu-rbd,
# beside the gateway's CPU time per request (user + system of its process,
# librbd's threads included, from /proc/PID/stat around each run).
# The issue's goal: unifab at least 80 % of qemu-rbd at 4 KiB and 90 % at 1 MiB.
#
# Output: a Markdown table on stdout; results.md and results.csv (every raw
# run) in OUT_DIR with unifab's and the cluster's logs.
#
# Environment: UNIFAB_BIN (default target/release/unifab), REPEATS (3),
# RUN_SECONDS (4), OUT_DIR (target/bench-peers/rbd-<date-time>),
# RBD_BUNDLE (an unpacked benches/peers/rbd-bundle.sh output, for a machine
# without the peers: its programs go first on PATH), UNIFAB_ISCSI_EXTRA
# (lines added to unifab's [iscsi] section, e.g. "coalesce_responses = 0").
# Needs: ceph-mon ceph-osd ceph-common qemu-utils qemu-block-extra
# libiscsi-bin, and unifab built with librbd (scripts/setup.sh).
# Takes about 3 min with the defaults.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/peers/lib.sh
. "$HERE/lib.sh"

case "${1:-}" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown argument $1 (try --help)" ;;
esac

REPEATS=${REPEATS:-3}
RUN_SECONDS=${RUN_SECONDS:-4}
# On a machine without the peers: the unpacked rbd-bundle.sh output.
if [[ -n "${RBD_BUNDLE:-}" ]]; then
    [[ -x "$RBD_BUNDLE/w/ceph_mon" ]] || die "RBD_BUNDLE=$RBD_BUNDLE is not an unpacked rbd-bundle.sh output"
    export PATH="$RBD_BUNDLE/w:$PATH"
    export CEPH_MON_CMD="$RBD_BUNDLE/w/ceph_mon"
    export CEPH_PLUGIN_DIR="$RBD_BUNDLE/ceph-plugins"
    UNIFAB_BIN=${UNIFAB_BIN:-$RBD_BUNDLE/w/unifab}
fi
UNIFAB_BIN=${UNIFAB_BIN:-$ROOT/target/release/unifab}
OUT_DIR=${OUT_DIR:-$ROOT/target/bench-peers/rbd-$(date +%Y%m%d-%H%M%S)}
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer"
[[ "$RUN_SECONDS" =~ ^[1-9][0-9]*$ ]] || die "RUN_SECONDS must be a positive integer"
[[ -x "$UNIFAB_BIN" ]] || die "no unifab at $UNIFAB_BIN (cargo build --release -p unifab)"

need qemu-img qemu-utils
need rbd ceph-common
need iscsi-readcapacity16 libiscsi-bin
qemu-img --help | grep -qw rbd || die "qemu-img has no rbd driver: install qemu-block-extra"
qemu-img --help | grep -qw iscsi || die "qemu-img has no iscsi driver: install qemu-block-extra"

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/rbd-compare.XXXXXX)
UNIFAB_PID=""
cleanup() {
    stop_pid "$UNIFAB_PID"
    bash "$ROOT/scripts/ceph.sh" down "$WORK/ceph" || true
    cp -f "$WORK"/unifab.log "$WORK"/unifab.toml "$OUT_DIR"/ 2>/dev/null || true
    cp -rf "$WORK"/ceph/log "$OUT_DIR"/ceph-log 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

note "starting a one-node Ceph cluster"
CONF=$(bash "$ROOT/scripts/ceph.sh" up "$WORK/ceph" | tail -1)
[[ -f "$CONF" ]] || die "scripts/ceph.sh gave no ceph.conf"
timeout 60 rbd -c "$CONF" create rbd/bench --size 1G
note "writing the image through once"
timeout 300 rbd -c "$CONF" bench --io-type write --io-size 4M --io-threads 8 \
    --io-total 1G --io-pattern seq rbd/bench >/dev/null

port=$(free_port)
cat >"$WORK/unifab.toml" <<EOF
[[lu]]
name = "bench"
backend = "rbd:rbd/bench"
ceph_conf = "$CONF"
# QEMU's rbd driver writes the same image between unifab's runs.
ceph_exclusive_lock = false

[iscsi]
listen = ["127.0.0.1:$port"]
${UNIFAB_ISCSI_EXTRA:-}

[[iscsi.target]]
iqn = "$UNIFAB_IQN"
luns = ["bench"]

[admin]
listen = "127.0.0.1:0"
data_dir = "$WORK/state"
EOF
"$UNIFAB_BIN" run --config "$WORK/unifab.toml" >"$WORK/unifab.log" 2>&1 &
UNIFAB_PID=$!
wait_port "$port" 30 || { tail -20 "$WORK/unifab.log" >&2; die "unifab did not open its portal"; }

declare -A URL
URL[unifab]="iscsi://127.0.0.1:$port/$UNIFAB_IQN/0"
URL[qemu-rbd]="json:{\"file.driver\":\"rbd\",\"file.pool\":\"rbd\",\"file.image\":\"bench\",\"file.conf\":\"$CONF\"}"
CLIENTS=(unifab qemu-rbd)
qemu-img bench -f raw -t none -c 16 -d 1 -s 4096 "${URL[unifab]}" >/dev/null 2>&1 \
    || die "unifab accepts connections but qemu-img cannot read its LU (log: $OUT_DIR/unifab.log)"

CSV="$OUT_DIR/results.csv"
echo "client,workload,size_bytes,depth,repeat,requests,seconds,iops,mb_per_s,gateway_cpu_us" >"$CSV"

# workload id | size | depth | mode | probe count
WORKLOADS=(
    "read-4k|4096|32|read|4000"
    "write-4k|4096|32|write|2000"
    "read-1m|1048576|8|read|200"
    "write-1m|1048576|8|write|100"
)

declare -A COUNT
for line in "${WORKLOADS[@]}"; do
    IFS='|' read -r id size depth mode probe <<<"$line"
    for c in "${CLIENTS[@]}"; do
        secs=$(qemu_bench "${URL[$c]}" "$size" "$depth" "$probe" "$mode")
        COUNT[$c/$id]=$(awk -v p="$probe" -v s="$secs" -v r="$RUN_SECONDS" \
            'BEGIN { c = int(p / s * r); if (c < p) c = p; print c }')
        note "calibrated $c $id: $probe in ${secs}s -> ${COUNT[$c/$id]} per run"
    done
done

# rbd bench SIZE DEPTH MODE -> IOPS (sequential, RUN_SECONDS' worth of a probe)
rbd_bench() {
    local size=$1 depth=$2 mode=$3 total out
    total=$((size * ${COUNT[qemu-rbd/$4]}))
    out=$(timeout 300 rbd -c "$CONF" bench --io-type "$mode" --io-size "$size" \
        --io-threads "$depth" --io-total "$total" --io-pattern seq rbd/bench 2>&1) \
        || { printf '%s\n' "$out" >&2; die "rbd bench failed"; }
    printf '%s\n' "$out" | awk '/^elapsed:/ { for (i = 1; i < NF; i++) if ($i == "ops/sec:") print $(i + 1) }'
}

TICKS=$(getconf CLK_TCK)
START=$SECONDS
for rep in $(seq 1 "$REPEATS"); do
    note "repetition $rep of $REPEATS"
    for line in "${WORKLOADS[@]}"; do
        IFS='|' read -r id size depth mode _ <<<"$line"
        for c in "${CLIENTS[@]}"; do
            n=${COUNT[$c/$id]}
            before=$(cpu_of "$UNIFAB_PID")
            secs=$(qemu_bench "${URL[$c]}" "$size" "$depth" "$n" "$mode")
            after=$(cpu_of "$UNIFAB_PID")
            iops=$(awk -v c="$n" -v s="$secs" 'BEGIN { printf "%.1f", c / s }')
            mb=$(awk -v i="$iops" -v b="$size" 'BEGIN { printf "%.1f", i * b / 1e6 }')
            us=""
            if [[ $c == unifab ]]; then
                us=$(awk -v b="$before" -v a="$after" -v n="$n" -v t="$TICKS" 'BEGIN {
                    split(b, x, " "); split(a, y, " ")
                    printf "%.1f", (y[1] + y[2] - x[1] - x[2]) / t / n * 1e6 }')
            fi
            echo "$c,$id,$size,$depth,$rep,$n,$secs,$iops,$mb,$us" >>"$CSV"
            note "  $c $id #$rep: $iops IOPS, $mb MB/s"
        done
        iops=$(rbd_bench "$size" "$depth" "$mode" "$id")
        mb=$(awk -v i="$iops" -v b="$size" 'BEGIN { printf "%.1f", i * b / 1e6 }')
        echo "rbd-bench,$id,$size,$depth,$rep,0,0,$iops,$mb," >>"$CSV"
        note "  rbd bench $id #$rep: $iops IOPS"
    done
done

col() { # col CLIENT WORKLOAD FIELD(8=iops,9=mbps,10=gateway CPU µs)
    local values
    values=$(awk -F, -v c="$1" -v w="$2" -v f="$3" '$1 == c && $2 == w { print $f }' "$CSV")
    [[ -n "$values" ]] || { echo "—"; return; }
    # shellcheck disable=SC2086
    median $values
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "—"; else printf "%.0f%%", 100 * a / b }'; }
{
    echo "## unifab on Ceph RBD vs QEMU's rbd driver on the same image"
    echo
    echo "Medians of $REPEATS runs of ~${RUN_SECONDS}s; MB/s = 10^6 bytes/s; one-node cluster (memstore OSD) on 127.0.0.1; $(nproc) cores;"
    echo "ceph $(ceph-osd --version 2>/dev/null | awk '{print $3}'), $(qemu-img --version 2>/dev/null | head -1)."
    echo
    echo "| workload | QD | unifab (iSCSI) IOPS | MB/s | gateway CPU µs/req | qemu-rbd IOPS | MB/s | unifab / qemu-rbd | rbd bench IOPS |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for line in "${WORKLOADS[@]}"; do
        IFS='|' read -r id _ depth _ _ <<<"$line"
        ui=$(col unifab "$id" 8); um=$(col unifab "$id" 9)
        qi=$(col qemu-rbd "$id" 8); qm=$(col qemu-rbd "$id" 9)
        echo "| $id | $depth | $ui | $um | $(col unifab "$id" 10) | $qi | $qm | $(pct "$ui" "$qi") | $(col rbd-bench "$id" 8) |"
    done
    echo
    echo "Took $((SECONDS - START)) s after set-up. Raw runs: $CSV"
} | tee "$OUT_DIR/results.md"
