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

# 128 KiB files, a sync every eighth, through the gateway's restart and
# 5 s after it.
start_writer 131072 8
writes_go_on_through ready-restart restarted 5 "the restart"
ok "writes went on through the restart"

save_sums 'w*'
umount /mnt/lu
echo 3 >/proc/sys/vm/drop_caches
fsck.ext4 -f -n "/dev/$D" || fail "fsck -f found errors after the restart"
mount "/dev/$D" /mnt/lu
check_sums "after the restart"
umount /mnt/lu
ok "the filesystem survives: fsck -f clean, checksums match"

dmesg | grep -E 'connection|iscsi|session' >"$SHARE/recovery.txt" || true
cat "$SHARE/recovery.txt"
no_io_errors
iscsiadm -m session -P 1 | grep -q 'iSCSI Session State: LOGGED_IN' || fail "the session is not logged in"
ok "the session recovered with no I/O error"
logout
no_disks
