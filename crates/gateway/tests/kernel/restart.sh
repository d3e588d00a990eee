# shellcheck shell=sh
# shellcheck disable=SC2154 # PORTAL, IQN, SHARE: set by common.sh, which comes first
# A gateway killed (SIGKILL) and restarted under a mounted filesystem that
# is being written: the kernel's session recovery (replacement timeout)
# carries the I/O over, the filesystem survives, no I/O error reaches it
# (crates/gateway/tests/kernel_iscsi.rs).
start_iscsid
make_node
node_set node.session.timeo.replacement_timeout 90
login
D=$(new_disk "")
ok "login"
mkfs.ext4 -q -F -b 4096 "/dev/$D"
mkdir -p /mnt/lu
mount "/dev/$D" /mnt/lu

# The writer: 128 KiB files, a sync every eighth, until the host says stop.
(
    i=0
    while [ ! -e "$SHARE/stop" ]; do
        head -c 131072 /dev/urandom >"/mnt/lu/w$i"
        if [ $((i % 8)) -eq 0 ]; then sync; fi
        i=$((i + 1))
    done
    echo "$i" >"$SHARE/written"
) &
WRITER=$!
sleep 3
touch "$SHARE/ready-restart"
wait_host restarted 120
before=$(find /mnt/lu -maxdepth 1 -name 'w*' | wc -l)
# Go on writing through the restarted gateway for a while.
sleep 5
touch "$SHARE/stop"
wait $WRITER || fail "the writer failed"
sync || fail "sync failed after the restart"
after=$(find /mnt/lu -maxdepth 1 -name 'w*' | wc -l)
echo "files: $before when the host had restarted the gateway, $after at the end"
[ "$after" -gt "$before" ] || fail "no file was written after the restart"
ok "writes went on through the restart"

(cd /mnt/lu && find . -type f -name 'w*' -print | sort | xargs md5sum) >"$SHARE/sums"
umount /mnt/lu
echo 3 >/proc/sys/vm/drop_caches
fsck.ext4 -f -n "/dev/$D" || fail "fsck -f found errors after the restart"
mount "/dev/$D" /mnt/lu
(cd /mnt/lu && md5sum -c --quiet "$SHARE/sums") || fail "checksums differ after the restart"
umount /mnt/lu
ok "the filesystem survives: fsck -f clean, checksums match"

dmesg | grep -E 'connection|iscsi|session' >"$SHARE/recovery.txt" || true
cat "$SHARE/recovery.txt"
no_io_errors
iscsiadm -m session -P 1 | grep -q 'iSCSI Session State: LOGGED_IN' || fail "the session is not logged in"
ok "the session recovered with no I/O error"
logout
no_disks
