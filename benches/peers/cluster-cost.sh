#!/usr/bin/env bash
# benches/peers/cluster-cost.sh — the cost of clustering: 4 KiB QD32 reads
# and writes (qemu-img bench) through a gateway in a cluster (an etcd on
# 127.0.0.1, a lease, the LU's reservations shared through etcd, target
# port groups) against the same binary unclustered, in the same run.
#
#   bash benches/peers/cluster-cost.sh
#
# Reservation-free I/O must not touch etcd: the clustered gateway's
# figures should match the plain one's. Reported: IOPS and the target's
# CPU time per command (user + system, from /proc/PID/stat), medians of
# REPEATS runs alternating the two gateways, and clustered/plain ratios.
# One member (the other members only add watch traffic on reservation
# changes, which this workload never makes).
#
# Environment:
#   UNIFAB_BIN   unifab binary (default target/release/unifab)
#   REPEATS      runs per measurement (default 5)
#   REQUESTS     qemu-img bench requests per run (default 100000)
#   OUT_DIR      where logs go (default target/bench-peers/cluster-<date-time>)
#
# Needs: etcd-server, qemu-utils, qemu-block-extra (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=benches/peers/lib.sh
source benches/peers/lib.sh

UNIFAB_BIN=$(realpath "${UNIFAB_BIN:-target/release/unifab}")
REPEATS=${REPEATS:-5}
REQUESTS=${REQUESTS:-100000}
OUT_DIR=${OUT_DIR:-target/bench-peers/cluster-$(date +%Y%m%d-%H%M%S)}
need qemu-img qemu-utils
need etcd etcd-server
need python3 python3
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /dev/shm/unifab-cluster.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do stop_pid "$p"; done
    cp "$WORK"/*/unifab.log "$WORK"/etcd.log "$OUT_DIR/" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# etcd on two free ports, healthy within 10 s.
client=$(free_port)
peer=$(free_port)
etcd --name=bench --data-dir="$WORK/etcd" \
    --listen-client-urls="http://127.0.0.1:$client" --advertise-client-urls="http://127.0.0.1:$client" \
    --listen-peer-urls="http://127.0.0.1:$peer" --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
    --initial-cluster="bench=http://127.0.0.1:$peer" --logger=zap --log-outputs="$WORK/etcd.log" \
    </dev/null >/dev/null 2>&1 &
PIDS+=($!)
deadline=$((SECONDS + 10))
until python3 -c "import urllib.request,sys; sys.exit(0 if b'true' in urllib.request.urlopen('http://127.0.0.1:$client/health', timeout=1).read() else 1)" 2>/dev/null; do
    ((SECONDS < deadline)) || die "etcd was not healthy within 10 s (log: $WORK/etcd.log)"
    sleep 0.1
done

SIZE=$((1 << 30))
make_lu "$WORK/plain.img" "$SIZE"
make_lu "$WORK/clustered.img" "$SIZE"
start_unifab "$UNIFAB_BIN" "$WORK/plain" "$WORK/plain.img" "$SIZE"
PIDS+=("$UNIFAB_PID")
PLAIN_PID=$UNIFAB_PID PLAIN_URL=$UNIFAB_URL
UNIFAB_LU_EXTRA=$'[lu.alua]\nexplicit = false\n[[lu.alua.group]]\nid = 1\nstate = "active/optimized"\nports = [1]' \
    UNIFAB_TOML_EXTRA=$'[cluster]\nname = "bench"\netcd = ["http://127.0.0.1:'"$client"$'"]\nlease_ttl = "5s"' \
    start_unifab "$UNIFAB_BIN" "$WORK/clustered" "$WORK/clustered.img" "$SIZE"
PIDS+=("$UNIFAB_PID")
CLUSTER_PID=$UNIFAB_PID CLUSTER_URL=$UNIFAB_URL

# The clustered gateway serves once it holds its lease (its port is
# Unavailable until then): wait for a read to pass, at most 20 s.
deadline=$((SECONDS + 20))
until iscsi-inq "$CLUSTER_URL" >/dev/null 2>&1 && qemu-img bench -f raw -t none -c 1 "$CLUSTER_URL" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "the clustered gateway did not serve within 20 s (log: $WORK/clustered/unifab.log)"
    sleep 0.2
done
grep -q 'cluster: member' "$WORK/clustered/unifab.log" \
    || die "the clustered gateway serves but never logged 'cluster: member' (log: $WORK/clustered/unifab.log)"

# Warm up: logins, and every block the runs read written once.
qemu-img bench -f raw -t none -c "$REQUESTS" -d 32 -s 4096 -w "$PLAIN_URL" >/dev/null
qemu-img bench -f raw -t none -c "$REQUESTS" -d 32 -s 4096 -w "$CLUSTER_URL" >/dev/null

declare -A rows
for rw in read write; do
    for ((i = 0; i < REPEATS; i++)); do
        rows[plain-$rw]+="$(cpu_run_one "$PLAIN_PID" "$PLAIN_URL" "$rw" "$REQUESTS")"$'\n'
        rows[clustered-$rw]+="$(cpu_run_one "$CLUSTER_PID" "$CLUSTER_URL" "$rw" "$REQUESTS")"$'\n'
    done
done

cpu() { # cpu ROWS -> median of target user + system per command
    local values
    mapfile -t values < <(printf '%s' "$1" | awk 'NF { print $1 + $2 }')
    median "${values[@]}"
}

{
    echo "## Cost of clustering: 4 KiB QD32 (qemu-img bench), same binary, same run"
    echo
    echo "Medians of $REPEATS runs of $REQUESTS requests, alternating gateways; LUs on tmpfs; $(nproc) cores; lease TTL 5 s."
    echo
    echo "| workload | plain IOPS | clustered IOPS | ratio | plain target CPU µs/cmd | clustered | ratio |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    for rw in read write; do
        pi=$(col_median "${rows[plain-$rw]}" 5)
        ci=$(col_median "${rows[clustered-$rw]}" 5)
        pc=$(cpu "${rows[plain-$rw]}")
        cc=$(cpu "${rows[clustered-$rw]}")
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$rw" "$pi" "$ci" \
            "$(python3 -c "print(f'{$ci / $pi:.3f}')")" "$pc" "$cc" \
            "$(python3 -c "print(f'{$cc / $pc:.3f}')")"
    done
    echo
    echo "Load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT_DIR/results.md"
