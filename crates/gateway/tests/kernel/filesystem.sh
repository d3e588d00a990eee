# shellcheck shell=sh
# shellcheck disable=SC2154 # PORTAL, IQN, SHARE: set by common.sh, which comes first
# open-iscsi against unifab: discovery, CHAP, digests, a filesystem, UNMAP,
# sg3-utils (crates/gateway/tests/kernel_iscsi.rs).
start_iscsid

out=$(iscsiadm -m discovery -t sendtargets -p "$PORTAL")
echo "$out"
# The gateway listens on the host's 127.0.0.1 behind QEMU's NAT and
# advertises the address the guest dials ([iscsi] advertise).
echo "$out" | grep -qx "$PORTAL,1 $IQN" || fail "SendTargets did not name $IQN at $PORTAL"
# The CHAP and digest settings go on a record of our own.
iscsiadm -m node -o delete
ok "discovery lists the target at the advertised address"

make_node
node_set node.session.auth.password wrong-secret-9876
if login; then fail "a login with a wrong CHAP secret succeeded"; fi
ok "a wrong CHAP secret is refused"
node_set node.session.auth.password @CHAP_SECRET@
node_set node.session.auth.password_in wrong-mutual-secret
if login; then fail "a login where the target answered a wrong mutual secret succeeded"; fi
ok "a wrong mutual CHAP secret is refused"
node_set node.session.auth.password_in @MUTUAL_SECRET@
login
D=$(new_disk "")
ok "login with mutual CHAP"

iscsiadm -m session -P 2 | tee "$SHARE/session.txt"
grep -q 'HeaderDigest: CRC32C' "$SHARE/session.txt" || fail "header digest not CRC32C"
grep -q 'DataDigest: CRC32C' "$SHARE/session.txt" || fail "data digest not CRC32C"
ok "CRC32C header and data digests"

# ext4 on the first 200 MiB; the rest stays outside for blkdiscard.
mkfs.ext4 -q -F -b 4096 "/dev/$D" 200M
mkdir -p /mnt/lu
mount "/dev/$D" /mnt/lu
write_tree 60 24M
save_sums
sync
umount /mnt/lu
fsck.ext4 -f -n "/dev/$D" || fail "fsck -f found errors"
ok "mkfs, a file tree, sync, umount, fsck -f clean"

logout
no_disks
login
D=$(new_disk "")
mount "/dev/$D" /mnt/lu
check_sums "after a fresh login"
ok "checksums match after logout and a fresh login"

[ "$(cat "/sys/block/$D/queue/discard_max_bytes")" -gt 0 ] || fail "the disk takes no discard"
fstrim -v /mnt/lu | tee "$SHARE/fstrim.txt"
grep -q '(0 bytes) trimmed' "$SHARE/fstrim.txt" && fail "fstrim trimmed nothing"
ok "fstrim trims"
umount /mnt/lu

sg_vpd -p lbpv "/dev/$D" >"$SHARE/vpd-lbpv.txt"
dd if=/dev/urandom of="/dev/$D" bs=1M seek=208 count=16 oflag=direct conv=fsync 2>/dev/null
blkdiscard -f -o $((208 << 20)) -l $((16 << 20)) "/dev/$D"
if grep -q '(LBPRZ): 1' "$SHARE/vpd-lbpv.txt"; then
    dd if="/dev/$D" bs=1M skip=208 count=16 iflag=direct 2>/dev/null |
        cmp -n $((16 << 20)) - /dev/zero || fail "discarded blocks do not read back as zeroes"
else
    fail "the LU does not say discarded blocks read as zeroes (LBPRZ 0)"
fi
ok "blkdiscard reads back zeroes"

sg_vpd -p sn "/dev/$D" >"$SHARE/vpd-sn.txt"
sg_vpd -p di "/dev/$D" >"$SHARE/vpd-di.txt"
sg_readcap -l "/dev/$D" >"$SHARE/readcap.txt"
cat "$SHARE/vpd-sn.txt" "$SHARE/vpd-di.txt" "$SHARE/readcap.txt"
ok "sg3-utils"

# Persistent reservations: this nexus registers and reserves Write
# Exclusive; a second session (another iface: another ISID) is a second
# I_T nexus to the same LU.
sg_persist --out --register --param-sark=0x1111 "/dev/$D"
sg_persist --out --reserve --param-rk=0x1111 --prout-type=1 "/dev/$D"
sg_persist --in --read-keys "/dev/$D" >"$SHARE/pr-keys-1.txt"
sg_persist --in --read-reservation "/dev/$D" >"$SHARE/pr-resv-1.txt"
cat "$SHARE/pr-keys-1.txt" "$SHARE/pr-resv-1.txt"
iscsiadm -m iface -I second -o new >/dev/null
export IFACE=second
make_node
login
E=$(new_disk "$D")
if dd if=/dev/zero of="/dev/$E" bs=4096 count=1 seek=60000 oflag=direct 2>/dev/null; then
    fail "a write through a nexus that holds no reservation succeeded under Write Exclusive"
fi
ok "Write Exclusive keeps a second nexus from writing"
sg_persist --out --register --param-sark=0x2222 "/dev/$E"
sg_persist --out --preempt --param-rk=0x2222 --param-sark=0x1111 --prout-type=1 "/dev/$E"
sg_persist --in --read-keys "/dev/$E" >"$SHARE/pr-keys-2.txt"
sg_persist --in --read-reservation "/dev/$E" >"$SHARE/pr-resv-2.txt"
cat "$SHARE/pr-keys-2.txt" "$SHARE/pr-resv-2.txt"
dd if=/dev/zero of="/dev/$E" bs=4096 count=1 seek=60000 oflag=direct 2>/dev/null ||
    fail "the new holder cannot write"
ok "preempt from the second nexus"
sg_persist --out --clear --param-rk=0x2222 "/dev/$E"
sg_persist --in --read-keys "/dev/$D" >"$SHARE/pr-keys-3.txt" ||
    sg_persist --in --read-keys "/dev/$D" >"$SHARE/pr-keys-3.txt"

iscsiadm -m node --logout
no_disks
ok "logged out"
