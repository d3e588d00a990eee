# shellcheck shell=sh
# Helpers for the kernel-peer guest scripts (crates/gateway/tests/kernel_iscsi.rs).
# POSIX sh (dash); run by the guest's init from /mnt/host; the test fills in
# @PORTAL@, @IQN@ and the CHAP names and secrets.
set -eu
PORTAL=@PORTAL@
IQN=@IQN@
SHARE=/mnt/host

ok() {
    echo "ok: $*"
    echo "$*" >>"$SHARE/passed"
}
# To stderr as well: inside $(…) stdout is captured.
fail() {
    echo "FAIL: $*"
    echo "FAIL: $*" >&2
    exit 1
}

# Start iscsid (no systemd here): it forks once its socket is up.
start_iscsid() {
    # No udev: load what a new LU needs by hand (sd for disks, sg, st).
    modprobe -a iscsi_tcp sd_mod sg
    mkdir -p /run/lock/iscsi /var/lib/iscsi/nodes /var/lib/iscsi/send_targets /var/lib/iscsi/ifaces
    iscsid || fail "iscsid did not start"
    # iscsiadm -m session: 0 or 21 (no sessions) once iscsid answers.
    i=0
    while [ $i -lt 50 ]; do
        rc=0
        iscsiadm -m session >/dev/null 2>&1 || rc=$?
        if [ $rc -eq 0 ] || [ $rc -eq 21 ]; then
            return 0
        fi
        sleep 0.2
        i=$((i + 1))
    done
    fail "iscsid does not answer"
}

# iscsiadm -m node ... -o update for the node record (and iface $IFACE, if set).
node_set() {
    iscsiadm -m node -T "$IQN" -p "$PORTAL" ${IFACE:+-I "$IFACE"} -o update -n "$1" -v "$2"
}

# A node record for the portal as the guest reaches it (SendTargets names
# 127.0.0.1, the guest's own loopback), with mutual CHAP and both digests.
make_node() {
    iscsiadm -m node -o new -T "$IQN" -p "$PORTAL" ${IFACE:+-I "$IFACE"} >/dev/null
    node_set node.session.auth.authmethod CHAP
    node_set node.session.auth.username @CHAP_USER@
    node_set node.session.auth.password @CHAP_SECRET@
    node_set node.session.auth.username_in @MUTUAL_USER@
    node_set node.session.auth.password_in @MUTUAL_SECRET@
    node_set 'node.conn[0].iscsi.HeaderDigest' CRC32C
    node_set 'node.conn[0].iscsi.DataDigest' CRC32C
    node_set node.session.initial_login_retry_max 1
}

login() {
    iscsiadm -m node -T "$IQN" -p "$PORTAL" ${IFACE:+-I "$IFACE"} --login
}
logout() {
    iscsiadm -m node -T "$IQN" -p "$PORTAL" ${IFACE:+-I "$IFACE"} --logout
}

# The SCSI disks present now, one per line (sda sdb …).
disks() {
    for d in /sys/block/sd*; do
        if [ -e "$d" ]; then echo "${d##*/}"; fi
    done
}

# Waits (at most 60 s) for a disk not in "$1" to appear with its device
# node, and prints its name.
new_disk() {
    before=$1
    i=0
    while [ $i -lt 300 ]; do
        for d in $(disks); do
            case " $before " in
            *" $d "*) ;;
            *) if [ -b "/dev/$d" ] && [ "$(cat /sys/block/$d/size)" -gt 0 ]; then
                echo "$d"
                return 0
            fi ;;
            esac
        done
        sleep 0.2
        i=$((i + 1))
    done
    fail "no new disk within 60 s (had: $before; now: $(disks | tr '\n' ' '))"
}

# Waits (at most 60 s) until no SCSI disk is left.
no_disks() {
    i=0
    while [ -n "$(disks)" ] && [ $i -lt 300 ]; do
        sleep 0.2
        i=$((i + 1))
    done
    [ -z "$(disks)" ] || fail "disks still present after logout: $(disks | tr '\n' ' ')"
}

# Waits (at most $2 seconds) for the host to make $SHARE/$1.
wait_host() {
    i=0
    while [ ! -e "$SHARE/$1" ] && [ $i -lt $(($2 * 5)) ]; do
        sleep 0.2
        i=$((i + 1))
    done
    [ -e "$SHARE/$1" ] || fail "the host did not make $1 within $2 s"
}

# The kernel log must hold no I/O error: one would have reached a
# filesystem or an application.
no_io_errors() {
    if dmesg | grep -E 'I/O error|EXT4-fs error|Buffer I/O|blk_update_request'; then
        fail "the kernel logged I/O errors"
    fi
}

# COUNT files of assorted sizes in a tree under /mnt/lu, and /mnt/lu/big of
# BIG bytes (head -c syntax: 8M).
write_tree() {
    i=0
    while [ $i -lt "$1" ]; do
        d=/mnt/lu/dir$((i % 6))/sub$((i % 3))
        mkdir -p "$d"
        head -c $((i * 7919 + 513)) /dev/urandom >"$d/file$i"
        i=$((i + 1))
    done
    head -c "$2" /dev/urandom >/mnt/lu/big
}

# The checksums of the files under /mnt/lu (named like $1, default all)
# into $SHARE/sums; check_sums WHY checks them again.
save_sums() {
    (cd /mnt/lu && find . -type f -name "${1:-*}" -print | sort | xargs md5sum) >"$SHARE/sums"
}
check_sums() {
    (cd /mnt/lu && md5sum -c --quiet "$SHARE/sums") || fail "checksums differ ($1)"
}

# A writer of SIZE-byte files w0, w1, … in /mnt/lu, a sync every SYNC_EVERY
# files, until $SHARE/stop; its pid in WRITER.
start_writer() {
    (
        i=0
        while [ ! -e "$SHARE/stop" ]; do
            head -c "$1" /dev/urandom >"/mnt/lu/w$i"
            if [ $((i % $2)) -eq 0 ]; then sync; fi
            i=$((i + 1))
        done
    ) &
    WRITER=$!
}

# With the writer running: asks the host to act ($SHARE/$1), waits for its
# answer ($2, at most 120 s), writes on for $3 s, stops the writer; fails
# unless every write and the sync after succeeded and files were written
# after the host's act ($4 names it).
writes_go_on_through() {
    sleep 3
    touch "$SHARE/$1"
    wait_host "$2" 120
    before=$(find /mnt/lu -maxdepth 1 -name 'w*' | wc -l)
    sleep "$3"
    touch "$SHARE/stop"
    wait "$WRITER" || fail "the writer failed"
    sync || fail "sync failed after $4"
    after=$(find /mnt/lu -maxdepth 1 -name 'w*' | wc -l)
    echo "files: $before when $4 was done, $after at the end"
    [ "$after" -gt "$before" ] || fail "no file was written after $4"
}
