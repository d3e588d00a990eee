# shellcheck shell=sh
# shellcheck disable=SC2154 # SHARE: set by common.sh, which comes first
# LIO (target_core_mod, tcm_fc) as an FCP target on the guest's FCoE port,
# logged in to unifab's fabric through its FCF (crates/gateway/tests/
# kernel_lio.rs). The test fills in @INITIATORS@: the WWPNs unifab's
# initiator ports use, each given an ACL with LUN 0.
modprobe -a target_core_mod target_core_file tcm_fc fcoe
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config
C=/sys/kernel/config/target
[ -d $C/core ] || fail "no LIO configfs tree"
ip link set eth1 mtu 2500 up
echo eth1 >/sys/bus/fcoe/ctlr_create
for c in /sys/bus/fcoe/devices/ctlr_*; do echo 1 >"$c/enabled"; done
i=0
while [ "$(cat /sys/class/fc_host/host*/port_state 2>/dev/null)" != Online ] && [ $i -lt 300 ]; do
    sleep 0.2
    i=$((i + 1))
done
[ "$(cat /sys/class/fc_host/host*/port_state)" = Online ] || fail "the FCoE port is not Online"
# The port's WWPN, as LIO names it (20:00:…).
W=$(sed 's/^0x//; s/../&:/g; s/:$//' /sys/class/fc_host/host*/port_name)
echo "$W" >"$SHARE/lio_wwpn.txt"
ok "FCoE port Online"

INITIATORS="@INITIATORS@"

# A 64 MiB fileio backstore, LUN 0 of the port's TPG, an ACL per initiator.
truncate -s 64M /tmp/lio0.img
mkdir -p $C/core/fileio_0/lio0
echo "fd_dev_name=/tmp/lio0.img,fd_dev_size=67108864" >$C/core/fileio_0/lio0/control
echo 1 >$C/core/fileio_0/lio0/enable
T=$C/fc/$W/tpgt_1
mkdir -p $T/lun/lun_0
ln -s $C/core/fileio_0/lio0 $T/lun/lun_0/lio0
for I in $INITIATORS; do
    mkdir -p "$T/acls/$I/lun_0"
    ln -s $T/lun/lun_0 "$T/acls/$I/lun_0/mapped"
done
ok "LIO target on the FC port"
touch "$SHARE/lio-ready"

# The host runs libiscsi through unifab to this LU, then asks for the
# bytes it wrote at 1 MiB.
wait_host host-done 600
dd if=/tmp/lio0.img bs=65536 skip=16 count=1 2>/dev/null | md5sum | cut -d' ' -f1 >"$SHARE/lio-region.md5"
for I in $INITIATORS; do
    cat "$T/acls/$I/info" >>"$SHARE/lio-sessions.txt" 2>/dev/null || true
done
cat "$SHARE/lio-sessions.txt"
ok "LIO served the host"
