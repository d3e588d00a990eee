# shellcheck shell=bash disable=SC2034
# (SC2034: the start_* functions set variables for the sourcing script.)
# benches/peers/lib.sh — helpers for the peer benchmark scripts (sourced).
#
# Starting and stopping targets on loopback (tgtd, unifab), free ports,
# waiting for listeners, and the measurements (qemu-img bench, iscsi-perf,
# iperf3) with their output parsed into plain numbers.
#
# Every function fails loudly (non-zero, message on stderr); the caller runs
# under `set -euo pipefail`.

# The target name unifab serves (same constant as the testkit's
# UNIFAB_DEFAULT_IQN).
UNIFAB_IQN="iqn.2026-11.io.unifab:default"
TGTD_IQN="iqn.2026-11.io.unifab:tgtd"

export PATH="$PATH:/usr/sbin:/sbin"

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
note() { printf '%s\n' "$*" >&2; }

need() { # need PROGRAM DEBIAN-PACKAGE
    command -v "$1" >/dev/null 2>&1 \
        || die "$1 not found: install the Debian package $2 (bash scripts/setup.sh)"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_port() { # wait_port PORT SECONDS
    local port=$1 deadline=$((SECONDS + $2))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        ((SECONDS < deadline)) || return 1
        sleep 0.05
    done
}

# A fully allocated LU file on tmpfs (no page allocation inside the timed
# runs, for either target).
make_lu() { # make_lu PATH SIZE-BYTES
    rm -f "$1"
    fallocate -l "$2" "$1" 2>/dev/null || dd if=/dev/zero of="$1" bs=1M count=$(($2 >> 20)) status=none
}

# start_tgtd WORKDIR LU-FILE... -> sets TGTD_PID TGTD_PORT TGTD_URL
# tgtd 1.0.85: foreground (-f), private management socket (TGT_IPC_SOCKET),
# control port in a C short, LUN 0 is its controller so the data LUs are
# LUN 1, 2, … in the order given (TGTD_URL names LUN 1), and SIGTERM is
# ignored (stop_pid uses SIGKILL).
start_tgtd() {
    local dir=$1 port control lun
    shift
    (($# > 0)) || die "start_tgtd: no LU file given"
    need tgtd tgt
    need tgtadm tgt
    mkdir -p "$dir"
    for _ in 1 2 3 4 5; do
        port=$(free_port)
        control=$((port % 32768))
        TGT_IPC_SOCKET="$dir/socket" tgtd -f -C "$control" --iscsi "portal=127.0.0.1:$port" \
            >"$dir/tgtd.log" 2>&1 &
        TGTD_PID=$!
        local deadline=$((SECONDS + 10))
        until TGT_IPC_SOCKET="$dir/socket" tgtadm -C "$control" --lld iscsi --mode sys --op show >/dev/null 2>&1; do
            kill -0 "$TGTD_PID" 2>/dev/null || { cat "$dir/tgtd.log" >&2; die "tgtd exited while starting"; }
            ((SECONDS < deadline)) || { cat "$dir/tgtd.log" >&2; die "tgtd did not come up"; }
            sleep 0.05
        done
        if grep -q "failed to create/bind to portal" "$dir/tgtd.log"; then
            kill -KILL "$TGTD_PID"; wait "$TGTD_PID" 2>/dev/null || true
            continue
        fi
        local adm=(env "TGT_IPC_SOCKET=$dir/socket" tgtadm -C "$control" --lld iscsi)
        "${adm[@]}" --mode target --op new --tid 1 --targetname "$TGTD_IQN"
        lun=1
        for lu in "$@"; do
            "${adm[@]}" --mode logicalunit --op new --tid 1 --lun "$lun" --backing-store "$lu"
            lun=$((lun + 1))
        done
        "${adm[@]}" --mode target --op bind --tid 1 --initiator-address ALL
        wait_port "$port" 10 || die "tgtd's portal 127.0.0.1:$port did not open"
        TGTD_PORT=$port
        TGTD_URL="iscsi://127.0.0.1:$port/$TGTD_IQN/1"
        return 0
    done
    die "tgtd: every port tried was taken"
}

# start_unifab BINARY WORKDIR LU-FILE SIZE -> sets UNIFAB_PID UNIFAB_PORT UNIFAB_URL
start_unifab() {
    start_unifab_luns "$1" "$2" "$4" "$3"
}

# start_unifab_luns BINARY WORKDIR SIZE LU-FILE... -> sets UNIFAB_PID UNIFAB_PORT UNIFAB_URL
# One target whose LUN 0, 1, … are the files in the order given, each of
# SIZE bytes on the file backend (UNIFAB_URL names LUN 0). Raw TOML from
# the environment goes in too: UNIFAB_LU_EXTRA after each [[lu]] (its
# sub-tables), UNIFAB_ISCSI_EXTRA in [iscsi], UNIFAB_TOML_EXTRA at the end.
start_unifab_luns() {
    local bin=$1 dir=$2 size=$3 port i luns=""
    shift 3
    (($# > 0)) || die "start_unifab_luns: no LU file given"
    [[ -x "$bin" ]] || die "unifab is not runnable: no executable at $bin (build it with 'cargo build --release -p unifab' or set UNIFAB_BIN)"
    mkdir -p "$dir"
    port=$(free_port)
    : >"$dir/unifab.toml"
    i=0
    for lu in "$@"; do
        printf '[[lu]]\nname = "lu%d"\nbackend = "file:%s"\nsize = "%dMiB"\n%s\n\n' \
            "$i" "$lu" "$((size >> 20))" "${UNIFAB_LU_EXTRA:-}" >>"$dir/unifab.toml"
        luns+="${luns:+, }\"lu$i\""
        i=$((i + 1))
    done
    printf '[iscsi]\nlisten = ["127.0.0.1:%d"]\n%s\n\n[[iscsi.target]]\niqn = "%s"\nluns = [%s]\n' \
        "$port" "${UNIFAB_ISCSI_EXTRA:-}" "$UNIFAB_IQN" "$luns" >>"$dir/unifab.toml"
    # The admin endpoint on an ephemeral port: two gateways never collide.
    printf '\n[admin]\nlisten = "127.0.0.1:0"\ndata_dir = "%s/state"\n%s\n' "$dir" "${UNIFAB_TOML_EXTRA:-}" >>"$dir/unifab.toml"
    (cd "$dir" && exec "$bin" run --config "$dir/unifab.toml") >"$dir/unifab.log" 2>&1 &
    UNIFAB_PID=$!
    local deadline=$((SECONDS + 20))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ! kill -0 "$UNIFAB_PID" 2>/dev/null; then
            tail -30 "$dir/unifab.log" >&2
            die "unifab is not runnable: it exited while starting (log above; its config and log are copied to the output directory)"
        fi
        ((SECONDS < deadline)) || { tail -30 "$dir/unifab.log" >&2; die "unifab is not runnable: port $port never opened"; }
        sleep 0.05
    done
    UNIFAB_PORT=$port
    UNIFAB_URL="iscsi://127.0.0.1:$port/$UNIFAB_IQN/0"
}

stop_pid() { # stop_pid PID — SIGKILL and reap (tgtd ignores SIGTERM)
    [[ -n "${1:-}" ]] || return 0
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# The LU's logical block length, from READ CAPACITY (16).
block_length() { # block_length URL
    iscsi-readcapacity16 "$1" | awk -F: '/^LOGICAL BLOCK LENGTH IN BYTES/ {gsub(/ /, "", $2); print $2}'
}

# qemu_bench URL SIZE DEPTH COUNT MODE(read|write) -> prints "SECONDS"
# qemu-img bench through QEMU's own iSCSI driver (qemu-block-extra):
#   -f raw        no format probing
#   -t none       no host cache (cache.direct=on); no flushes are sent
#   -s SIZE       request size; -S SIZE: consecutive (sequential) requests,
#                 wrapping at the end of the LU
#   -d DEPTH      requests in flight; -c COUNT requests in all
#   -w --pattern=0xa5   writes (a non-zero pattern: nothing can skip zeros)
qemu_bench() {
    local url=$1 size=$2 depth=$3 count=$4 mode=$5 out
    local args=(bench -f raw -t none -s "$size" -S "$size" -d "$depth" -c "$count")
    [[ "$mode" == write ]] && args+=(-w --pattern=165)
    out=$(qemu-img "${args[@]}" "$url" 2>&1) || { printf '%s\n' "$out" >&2; die "qemu-img bench failed: qemu-img ${args[*]} $url"; }
    printf '%s\n' "$out" | awk '/Run completed in/ { print $4; found = 1 } END { exit !found }' \
        || { printf '%s\n' "$out" >&2; die "qemu-img bench printed no run time"; }
}

# iscsi_perf URL BLOCKS DEPTH SECONDS -> prints "IOPS"
# iscsi-perf (libiscsi-bin): random READ16s of BLOCKS blocks, DEPTH in flight,
# for SECONDS; its last "iops average N" is the result.
iscsi_perf() {
    local url=$1 blocks=$2 depth=$3 secs=$4 out
    out=$(iscsi-perf -r -m "$depth" -b "$blocks" -t "$secs" "$url" 2>&1) \
        || { printf '%s\n' "$out" | tr '\r' '\n' | tail -5 >&2; die "iscsi-perf failed on $url"; }
    printf '%s\n' "$out" | tr '\r' '\n' | grep -q '^finished\.' \
        || { printf '%s\n' "$out" | tr '\r' '\n' | tail -5 >&2; die "iscsi-perf did not finish cleanly"; }
    printf '%s\n' "$out" | tr '\r' '\n' | awk '/^iops average/ { v = $3 } END { if (v == "") exit 1; print v }'
}

# iperf3_loopback SECONDS -> prints "MB/s" (one TCP stream, 10^6 bytes/s)
# 1 MiB application writes (-l 1M), like the 1 MiB transfers it bounds
# (iperf3's default 128 KiB writes measured ~20% lower here).
# The server is not one-off (-1): the readiness probe is a connection too.
iperf3_loopback() {
    local secs=$1 port pid out
    need iperf3 iperf3
    port=$(free_port)
    iperf3 -s -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    pid=$!
    wait_port "$port" 5 || { stop_pid "$pid"; die "iperf3 server did not start"; }
    sleep 0.2
    out=$(iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -l 1M -J) || { stop_pid "$pid"; printf '%s\n' "$out" >&2; die "iperf3 client failed"; }
    stop_pid "$pid"
    printf '%s' "$out" | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))'
}

median() { # median NUMBER... -> the median (mean of the middle two if even)
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) exit 1
        if (NR % 2) printf "%.1f\n", v[(NR + 1) / 2]
        else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# cpu_of PID -> "utime stime" in clock ticks
cpu_of() { awk '{ print $14, $15 }' "/proc/$1/stat"; }

# cpu_run_one PID URL RW COUNT -> "target_user_us target_sys_us
# client_user_us client_sys_us iops": CPU time per command of the target
# (/proc/PID/stat before and after) and of the client (one qemu-img bench
# of COUNT 4 KiB requests at QD32, getrusage of the children).
cpu_run_one() {
    local pid=$1 url=$2 rw=$3 count=$4 before after ticks client
    ticks=$(getconf CLK_TCK)
    before=$(cpu_of "$pid")
    client=$(python3 - "$url" "$rw" "$count" <<'EOF'
import resource, subprocess, sys, time
url, rw, n = sys.argv[1], sys.argv[2], sys.argv[3]
cmd = ["qemu-img", "bench", "-f", "raw", "-t", "none", "-c", n, "-d", "32", "-s", "4096"]
if rw == "write":
    cmd.append("-w")
cmd.append(url)
t0 = time.monotonic()
subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
wall = time.monotonic() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime, r.ru_stime, wall)
EOF
)
    after=$(cpu_of "$pid")
    python3 - "$before" "$after" "$client" "$count" "$ticks" <<'EOF'
import sys
b = [int(x) for x in sys.argv[1].split()]
a = [int(x) for x in sys.argv[2].split()]
cu, cs, wall = (float(x) for x in sys.argv[3].split())
n, hz = int(sys.argv[4]), int(sys.argv[5])
tu = (a[0] - b[0]) / hz / n * 1e6
ts = (a[1] - b[1]) / hz / n * 1e6
print(f"{tu:.1f} {ts:.1f} {cu / n * 1e6:.1f} {cs / n * 1e6:.1f} {n / wall:.0f}")
EOF
}

# col_median ROWS COLUMN -> the median of column COLUMN of the rows
col_median() {
    local values
    mapfile -t values < <(printf '%s' "$1" | awk -v c="$2" 'NF { print $c }')
    median "${values[@]}"
}
