#!/usr/bin/env bash
# scripts/ceph.sh — a throwaway one-node Ceph cluster for tests and benchmarks.
#
#   bash scripts/ceph.sh up DIR         start it; prints the ceph.conf path last
#   bash scripts/ceph.sh down DIR       stop it (DIR is left for the caller)
#   bash scripts/ceph.sh osd-kill DIR   SIGKILL the OSD (a failure, for tests)
#   bash scripts/ceph.sh osd-start DIR  start the OSD again; waits until it is up
#
# OBJECTSTORE=bluestore keeps the OSD's data in a sparse file under DIR
# (it then survives osd-kill); the default, memstore, keeps it in RAM.
#
# Everything lives under DIR: ceph.conf, the keyring, the monitor's and the
# OSD's data, admin sockets, logs and pid files. One ceph-mon on 127.0.0.1
# (messenger v2 only, on a free port), one ceph-osd with the memstore object
# store (data in RAM: fast, and gone with the process), pool "rbd" with one
# replica, cephx on (client.admin's key is in DIR/keyring, which ceph.conf
# names). No ceph-mgr: I/O does not need one.
#
# Every wait is bounded (UP_TIMEOUT seconds for the whole start, 60 by
# default). `down` sends SIGTERM, then SIGKILL after 10 s, and waits until
# each daemon is gone or a zombie (PID 1 may reap late here).
#
# Needs (Debian 12): ceph-mon ceph-osd ceph-common (scripts/setup.sh).
set -euo pipefail

die() { printf 'ceph.sh: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 2 ]] || die "usage: ceph.sh up|down DIR"
cmd=$1
dir=$(realpath -m "$2")
UP_TIMEOUT=${UP_TIMEOUT:-60}

# A daemon is gone when its pid no longer exists or is a zombie.
alive() {
    local st
    st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ "$st" != Z ]]
}

stop() {
    local pids=() f p
    for f in "$dir"/run/*.pid; do
        [[ -f "$f" ]] || continue
        p=$(cat "$f" 2>/dev/null || true)
        [[ -n "$p" ]] && alive "$p" && pids+=("$p")
    done
    [[ ${#pids[@]} -eq 0 ]] && return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
        local left=0
        for p in "${pids[@]}"; do alive "$p" && left=1; done
        [[ $left -eq 0 ]] && return 0
        if [[ $i -eq 50 ]]; then kill -KILL "${pids[@]}" 2>/dev/null || true; fi
        sleep 0.2
    done
    die "daemons still alive after 20 s: ${pids[*]}"
}

conf=$dir/ceph.conf
deadline=$((SECONDS + UP_TIMEOUT))

c() { timeout 20 ceph -c "$conf" --connect-timeout 15 "$@"; }

# mon JSON [ceph CLI words…]: one monitor command, through CEPH_MON_CMD (a
# program taking CONF JSON [INPUT], e.g. unifab-benches' ceph_mon, for a
# machine without the Python `ceph` command) or else the `ceph` command.
# MON_INPUT names an input file.
mon() {
    local json=$1
    shift
    if [[ -n "${CEPH_MON_CMD:-}" ]]; then
        timeout 30 "$CEPH_MON_CMD" "$conf" "$json" ${MON_INPUT:+"$MON_INPUT"}
    else
        c "$@" ${MON_INPUT:+-i "$MON_INPUT"}
    fi
}

osds_up() {
    mon '{"prefix": "osd dump", "format": "json"}' osd dump --format json 2>/dev/null \
        | grep -o '"up": *1[,}]' | wc -l
}
q() { "$@" >>"$dir/log/setup.log" 2>&1 || die "failed: $* (see $dir/log/setup.log)"; }

start_osd() {
    # A killed OSD can hold its pid file's lock for a moment after it shows
    # as a zombie (its threads still exiting): retry until the deadline.
    until ceph-osd -c "$conf" -i 0 --keyring "$dir/osd0/keyring" >>"$dir/log/setup.log" 2>&1; do
        ((SECONDS < deadline)) || die "the OSD would not start within ${UP_TIMEOUT}s (see $dir/log/setup.log)"
        sleep 0.2
    done
    until [[ "$(osds_up)" == 1 ]]; do
        ((SECONDS < deadline)) || die "the OSD did not come up within ${UP_TIMEOUT}s (log: $dir/log/osd.0.log)"
        sleep 0.2
    done
}

case "$cmd" in
down)
    stop
    exit 0
    ;;
osd-kill)
    p=$(cat "$dir/run/osd.0.pid" 2>/dev/null) || die "no OSD pid file in $dir/run"
    kill -KILL "$p" 2>/dev/null || true
    for _ in $(seq 1 100); do
        alive "$p" || exit 0
        sleep 0.1
    done
    die "the OSD (pid $p) did not die within 10 s"
    ;;
osd-start)
    [[ -f "$conf" ]] || die "no cluster in $dir"
    start_osd
    exit 0
    ;;
up) ;;
*) die "usage: ceph.sh up|down|osd-kill|osd-start DIR" ;;
esac

tools=(ceph-mon ceph-osd ceph-authtool monmaptool rbd)
[[ -n "${CEPH_MON_CMD:-}" ]] || tools+=(ceph)
for b in "${tools[@]}"; do
    command -v "$b" >/dev/null || die "$b not found: run scripts/setup.sh (Debian ceph-mon ceph-osd ceph-common)"
done

mkdir -p "$dir"/{run,log,mon,osd0}
stop

# A port for the monitor: below the kernel's ephemeral range (a port there
# may be the local end of some connection, and binding it then fails), and
# refusing connections now. Another process can still take it before the
# monitor binds: the start below tries again with another.
pick_port() {
    local low p
    low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    ((low > 11000)) || low=32768
    for _ in $(seq 1 50); do
        p=$((10000 + RANDOM % (low - 10000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port below $low"
}
fsid=$(cat /proc/sys/kernel/random/uuid)
case "${OBJECTSTORE:-memstore}" in
memstore)
    store="osd objectstore = memstore
memstore device bytes = ${MEMSTORE_BYTES:-4294967296}"
    ;;
bluestore)
    store="osd objectstore = bluestore
bluestore block path = $dir/osd0.block
bluestore block create = true
bluestore block size = ${BLUESTORE_BYTES:-8589934592}
bluestore cache size = 134217728
bluestore fsck on mkfs = false
bluestore fsck on mount = false"
    ;;
*) die "OBJECTSTORE is memstore or bluestore" ;;
esac
write_conf() {
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port]
ms bind msgr1 = false
ms bind msgr2 = true
public addr = 127.0.0.1
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.\$pid.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
${CEPH_PLUGIN_DIR:+plugin dir = $CEPH_PLUGIN_DIR
erasure code dir = $CEPH_PLUGIN_DIR/erasure-code
osd class dir = $CEPH_PLUGIN_DIR/rados-classes}
mon warn on pool no redundancy = false
# ceph-mon refuses to start when the file system under its data has 5 % or
# less free (mon data avail crit): a test run's target/ and temporary files
# can bring a small CI disk there, and this monitor's store is a few MiB.
mon data avail crit = 0
mon data avail warn = 0
rbd cache = false
# A gateway killed and restarted finds its old incarnation holding the
# image's exclusive lock; librbd breaks it once the dead client's watch has
# expired (30 s by default): 5 s keeps the tests' restarts quick.
osd client watch timeout = 5
[mon]
mon data = $dir/mon/\$id
[osd]
osd data = $dir/osd0
$store
osd max object name len = 256
osd max object namespace len = 64
EOF
}

port=$(pick_port)
write_conf
q ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *'
q ceph-authtool "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
# Why the monitor did not start, for the message that ends the run: CI keeps
# the output, not DIR.
why_mon() {
    printf 'free space under %s: %s;' "$dir" "$(df -Ph "$dir" | awk 'NR == 2 { print $4 " of " $2 " (" $6 ")" }')"
    printf '\n--- last lines of setup.log:\n%s' "$(tail -n 8 "$dir/log/setup.log" 2>/dev/null)"
    printf '\n--- last lines of mon.a.log:\n%s' "$(tail -n 8 "$dir/log/mon.a.log" 2>/dev/null)"
}
# The monitor's address is in its monmap: a port taken meanwhile means a new
# monmap, a new store and a new start (at most five).
for attempt in 1 2 3 4 5; do
    q monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap"
    q ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
    if ceph-mon -c "$conf" -i a >>"$dir/log/setup.log" 2>&1; then
        break
    fi
    ((attempt < 5)) || die "ceph-mon would not start in 5 tries (see $dir/log/setup.log, $dir/log/mon.a.log); $(why_mon)"
    echo "ceph-mon did not start on port $port: trying another" >>"$dir/log/setup.log"
    rm -rf "$dir/mon/a"
    port=$(pick_port)
    write_conf
done

until mon '{"prefix": "mon stat"}' mon stat >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "the monitor did not answer within ${UP_TIMEOUT}s (log: $dir/log/mon.a.log)"
    sleep 0.2
done

osd_uuid=$(cat /proc/sys/kernel/random/uuid)
osd_key=$(ceph-authtool --gen-print-key)
printf '{"cephx_secret": "%s"}\n' "$osd_key" >"$dir/osd0-secret.json"
id=$(MON_INPUT="$dir/osd0-secret.json" mon "{\"prefix\": \"osd new\", \"uuid\": \"$osd_uuid\"}" \
    osd new "$osd_uuid") || die "ceph osd new failed"
id=$(printf '%s' "$id" | tr -d '[:space:]')
[[ "$id" == 0 ]] || die "expected OSD id 0, got '$id'"
q ceph-authtool --create-keyring "$dir/osd0/keyring" --name osd.0 --add-key "$osd_key"
q ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" --keyring "$dir/osd0/keyring"
start_osd

q mon '{"prefix": "osd pool create", "pool": "rbd", "pg_num": 8, "pgp_num": 8}' \
    osd pool create rbd 8 8
q mon '{"prefix": "osd pool set", "pool": "rbd", "var": "size", "val": "1", "yes_i_really_mean_it": true}' \
    osd pool set rbd size 1 --yes-i-really-mean-it
q timeout 30 rbd -c "$conf" pool init rbd
echo "$conf"
