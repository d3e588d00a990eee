# shellcheck shell=sh
# shellcheck disable=SC2154 # SHARE, IQN: set by common.sh, which comes first
# dm-multipath with scsi_dh_alua over two clustered unifab gateways
# (crates/gateway/tests/kernel_multipath.rs): the ALUA groups as multipath
# sees them, a reservation through both paths, and a SIGKILL of the
# Active/Optimized gateway under a verified write load. The test fills in
# @PORTAL_A@ and @PORTAL_B@.
PORTAL_A=@PORTAL_A@
PORTAL_B=@PORTAL_B@
modprobe -a iscsi_tcp sd_mod sg dm_multipath dm_round_robin scsi_dh_alua
# multipath finds its paths' WWIDs through udev.
/lib/systemd/systemd-udevd --daemon
mkdir -p /run/lock/iscsi /var/lib/iscsi/nodes /var/lib/iscsi/ifaces /etc/multipath
iscsid || fail "iscsid did not start"
sleep 1
for P in $PORTAL_A $PORTAL_B; do
    iscsiadm -m node -o new -T "$IQN" -p "$P" >/dev/null
    # A dead gateway's path fails (to dm-multipath) 5 s after its
    # connection drops, not the default 120 s.
    iscsiadm -m node -T "$IQN" -p "$P" -o update -n node.session.timeo.replacement_timeout -v 5
done
iscsiadm -m node -T "$IQN" -p "$PORTAL_A" --login
A=$(new_disk "")
iscsiadm -m node -T "$IQN" -p "$PORTAL_B" --login
B=$(new_disk "$A")
udevadm trigger
udevadm settle -t 30
ok "two paths: $A through gateway A, $B through gateway B"

cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names yes
    find_multipaths no
    polling_interval 2
}
devices {
    device {
        vendor "UNIFAB"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        failback immediate
        no_path_retry queue
    }
}
CONF
multipathd -s || fail "multipathd did not start"
sleep 2
multipath -v2 >/dev/null
i=0
while [ ! -e /dev/mapper/mpatha ] && [ $i -lt 150 ]; do
    sleep 0.2
    i=$((i + 1))
done
[ -e /dev/mapper/mpatha ] || fail "no multipath map"
sleep 3
multipath -ll | tee "$SHARE/mp-before.txt"
ok "one multipath map over both paths"

# A reservation the failover must keep: every path registers the key,
# Write Exclusive - Registrants Only through path A.
sg_persist --out --register --param-sark=0xabc "/dev/$A"
sg_persist --out --register --param-sark=0xabc "/dev/$B"
sg_persist --out --reserve --param-rk=0xabc --prout-type=5 "/dev/$A"
sg_persist --in --read-reservation "/dev/$B" | tee "$SHARE/pr-before.txt"

mkfs.ext4 -q -F -b 4096 /dev/mapper/mpatha
mkdir -p /mnt/lu
mount /dev/mapper/mpatha /mnt/lu
# 64 KiB files, each synced, through the SIGKILL of gateway A and 12 s
# after it.
start_writer 65536 1
writes_go_on_through kill-now killed 12 "gateway A's SIGKILL"
save_sums 'w*'
umount /mnt/lu
echo 3 >/proc/sys/vm/drop_caches
fsck.ext4 -f -n /dev/mapper/mpatha || fail "fsck -f found errors after the failover"
mount /dev/mapper/mpatha /mnt/lu
check_sums "after the failover"
umount /mnt/lu
ok "writes went on through the failover; fsck -f clean, checksums match"

# Path errors on the dead gateway's disk are expected; none may reach the
# multipath device or the filesystem.
if dmesg | grep -E 'EXT4-fs error|Buffer I/O error|I/O error, dev dm-'; then
    fail "an I/O error reached the multipath device or the filesystem"
fi
ok "no I/O error above dm-multipath"
multipath -ll | tee "$SHARE/mp-after.txt"
sg_persist --in --read-reservation "/dev/$B" >"$SHARE/pr-after.txt" ||
    sg_persist --in --read-reservation "/dev/$B" >"$SHARE/pr-after.txt"
sg_persist --in --read-keys "/dev/$B" >"$SHARE/keys-after.txt" ||
    sg_persist --in --read-keys "/dev/$B" >"$SHARE/keys-after.txt"
cat "$SHARE/pr-after.txt" "$SHARE/keys-after.txt"
ok "the reservation read through the surviving path"
