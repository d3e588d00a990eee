# shellcheck shell=sh
# shellcheck disable=SC2154 # SHARE: set by common.sh, which comes first
# Linux's FCoE stack (fcoe, libfcoe, libfc) as an ENode through unifab's FCF
# (crates/gateway/tests/kernel_fcoe.rs). The test fills in @FCF_MAC@ and
# @VLAN@ (empty: untagged).
FCF_MAC=@FCF_MAC@
VLAN=@VLAN@
modprobe -a fcoe sd_mod sg 8021q
ip link set eth1 mtu 2500 up
if [ -n "$VLAN" ]; then
    # FIP VLAN discovery, then FCoE on the VLAN it found.
    fipvlan -c -s eth1 | tee "$SHARE/fipvlan.txt"
    IF=eth1.$VLAN
    [ -e "/sys/class/net/$IF" ] || fail "fipvlan made no $IF"
    ok "fipvlan found the FCF's VLAN"
else
    echo eth1 >/sys/bus/fcoe/ctlr_create
    for c in /sys/bus/fcoe/devices/ctlr_*; do echo 1 >"$c/enabled"; done
    IF=eth1
fi

# The FC target's remote port Online (at most 60 s).
target_online() {
    i=0
    while [ $i -lt 300 ]; do
        for r in /sys/class/fc_remote_ports/rport-*; do
            if [ -e "$r/roles" ] && grep -q 'FCP Target' "$r/roles" &&
                [ "$(cat "$r/port_state")" = Online ]; then
                return 0
            fi
        done
        sleep 0.2
        i=$((i + 1))
    done
    fail "the FCP target's remote port is not Online within 60 s"
}

# The disk answers reads again (at most 60 s).
disk_back() {
    i=0
    while ! dd if="/dev/$D" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; do
        [ $i -lt 300 ] || fail "/dev/$D does not answer within 60 s"
        sleep 0.2
        i=$((i + 1))
    done
}

check_files() {
    mount "/dev/$D" /mnt/lu
    check_sums "$1"
    umount /mnt/lu
}

D=$(new_disk "")
target_online
ok "FLOGI, name server, PRLI to the target: the LU is a disk"
fcoeadm -i | tee "$SHARE/fcoeadm-i.txt"
fcoeadm -t | tee "$SHARE/fcoeadm-t.txt"
cat /sys/class/fc_host/host*/port_id >"$SHARE/port_id.txt"
cat "/sys/class/net/$IF/address" >"$SHARE/enode_mac.txt"

mkfs.ext4 -q -F -b 4096 "/dev/$D"
mkdir -p /mnt/lu
mount "/dev/$D" /mnt/lu
write_tree 40 8M
save_sums
sync
umount /mnt/lu
echo 3 >/proc/sys/vm/drop_caches
fsck.ext4 -f -n "/dev/$D" || fail "fsck -f found errors"
check_files "a fresh mount"
ok "mkfs, a file tree, sync, umount, fsck -f clean, checksums match"

# Link loss: the ENode's link goes down and comes back.
ip link set eth1 down
i=0
while [ "$(cat /sys/class/fc_host/host*/port_state)" != Linkdown ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
sleep 1
ip link set eth1 up
target_online
disk_back
check_files "after link loss"
ok "link loss recovers"

# Clear Virtual Links: the host removes the FCF port (CVL to this ENode)
# and adds it back.
touch "$SHARE/cvl-now"
wait_host cvl-done 120
target_online
disk_back
check_files "after Clear Virtual Links"
ok "Clear Virtual Links recovers"

# Spoofing: frames with this VN_Port's FC_ID from the ENode's own MAC (not
# its FPMA), and with an FC_ID nobody holds; the FCF drops them all.
touch "$SHARE/spoof-ready"
wait_host spoof-go 60
port_id=$(sed 's/^0x//' "$SHARE/port_id.txt")
"$SHARE/fcoe-spoof" "$IF" "$FCF_MAC" "$(cat "$SHARE/enode_mac.txt")" "$port_id" 020100 3
"$SHARE/fcoe-spoof" "$IF" "$FCF_MAC" 0e:fc:00:02:03:99 020399 020100 2
touch "$SHARE/spoofed"
wait_host spoof-counted 60
check_files "after the spoofed frames"
ok "spoofed frames sent, the real VN_Port still served"
no_io_errors
