#!/usr/bin/env bash
# scripts/vm-image.sh — build (once) the Linux guest the kernel-peer tests boot.
#
#   bash scripts/vm-image.sh          # build if missing; print the image dir
#   bash scripts/vm-image.sh --path   # print the image dir, build nothing
#
# The guest is Debian 12 (bookworm) from the same mirror as the host's apt,
# made with `debootstrap --variant=minbase`: Debian's 6.1 kernel and the
# kernel's storage tools (open-iscsi, multipath-tools, fcoe-utils, sg3-utils,
# mt-st). It is cached OUTSIDE the clone, in
#
#   ${UNIFAB_VM_CACHE:-/var/cache/unifab/vm}/<key>/{vmlinuz,initrd.img,rootfs.qcow2,RECIPE}
#
# where <key> is a hash of this script's code (comments left out): change
# the recipe and the next run builds a new image beside the old one.
# Nothing here is ever committed.
# A build takes ~2 minutes on 2 cores (debootstrap ~80 s) and ~500 MB of
# disk; a cached image costs nothing. The build happens in a temporary
# directory and is renamed into place, under a lock, so two concurrent
# callers build it once and a killed build leaves no half image.
#
# Its last line of output is the image's directory (all else goes to
# stderr). The guest does not run systemd. Its kernel command line names
# init=/sbin/unifab-init (written below): mount /proc, /sys, /dev, the 9p
# share "unifab" at /mnt/host, run /mnt/host/run.sh with its output on the
# console (ttyS0), eth0 at 10.0.2.15/24 (QEMU user networking: the host's
# loopback is 10.0.2.2), write its exit status to the second serial port (ttyS1)
# as "unifab-guest-exit N", and power off. The initrd holds only what the
# boot needs (virtio, ext4, 9p).
#
# Needs root (debootstrap, chroot) and the Debian packages debootstrap,
# qemu-utils and qemu-system-x86 (scripts/setup.sh installs them).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

CACHE=${UNIFAB_VM_CACHE:-/var/cache/unifab/vm}
# The recipe is this script without its comment lines: editing the words
# above builds nothing new.
KEY=$(grep -v '^[[:space:]]*#' "$here/vm-image.sh" | sha256sum | cut -c1-16)
DEST="$CACHE/$KEY"

if [[ "${1:-}" == --path ]]; then
    echo "$DEST"
    exit 0
fi

# A built image needs nothing more (booting it needs no root).
if [[ -f "$DEST/RECIPE" ]]; then
    echo "$DEST"
    exit 0
fi

die() { printf 'vm-image FAILED: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "building the guest image needs root (debootstrap, chroot)"
export PATH="$PATH:/usr/sbin:/sbin"
for prog in debootstrap qemu-img mkfs.ext4; do
    command -v "$prog" >/dev/null 2>&1 \
        || die "$prog not found: install the Debian packages debootstrap qemu-utils e2fsprogs (scripts/setup.sh)"
done

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
# Another build of the same key finishes in ~2 minutes; wait at most 10.
flock -w 600 9 || die "timed out waiting for another build's lock ($CACHE/.lock)"
if [[ -f "$DEST/RECIPE" ]]; then
    echo "$DEST"
    exit 0
fi

MIRROR=${UNIFAB_VM_MIRROR:-}
if [[ -z "$MIRROR" ]]; then
    # The host's own mirror (deb822 or one-line sources), else Debian's.
    MIRROR=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
        /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | head -1 | awk '{ print $2 }') || true
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

WORK=$(mktemp -d "$CACHE/.build-XXXXXX")
ROOTFS="$WORK/rootfs"
cleanup() {
    local m
    for m in proc sys dev; do
        mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m"
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

PACKAGES=(
    linux-image-amd64 initramfs-tools busybox kmod udev iproute2 procps
    e2fsprogs util-linux
    open-iscsi multipath-tools sg3-utils mt-st fcoe-utils lldpad
)
echo "vm-image: debootstrap bookworm from $MIRROR into $ROOTFS" >&2
# debootstrap's own download is bounded by apt's timeouts; the whole step
# by this timeout.
timeout --kill-after=30 900 debootstrap --variant=minbase \
    --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }

# --- the initrd: only virtio, ext4 and 9p -------------------------------------
cat >"$ROOTFS/etc/initramfs-tools/modules" <<'EOF'
virtio_pci
virtio_blk
virtio_net
ext4
9p
9pnet_virtio
EOF
sed -i 's/^MODULES=.*/MODULES=list/' "$ROOTFS/etc/initramfs-tools/initramfs.conf"
sed -i 's/^COMPRESS=.*/COMPRESS=gzip/' "$ROOTFS/etc/initramfs-tools/initramfs.conf"
KVER=$(basename "$(ls -d "$ROOTFS"/lib/modules/*)")
chroot "$ROOTFS" update-initramfs -c -k "$KVER" >"$WORK/initramfs.log" 2>&1 \
    || { tail -20 "$WORK/initramfs.log" >&2; die "update-initramfs failed"; }

# --- the guest's init -------------------------------------------------------------
cat >"$ROOTFS/sbin/unifab-init" <<'EOF'
#!/bin/sh
# unifab test guest: run the host's script from the 9p share, report, power off.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sys /sys
mountpoint -q /dev || mount -t devtmpfs dev /dev
mkdir -p /dev/pts /run /tmp /mnt/host
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t configfs configfs /sys/kernel/config 2>/dev/null
hostname unifab-guest
ip link set lo up
# QEMU user networking: the host's loopback is 10.0.2.2.
if ip link set eth0 up 2>/dev/null; then
    ip addr add 10.0.2.15/24 dev eth0
    ip route add default via 10.0.2.2
fi
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 unifab /mnt/host; then
    cd /mnt/host && sh ./run.sh > /dev/ttyS0 2>&1
    rc=$?
else
    rc=99
fi
dmesg > /mnt/host/dmesg.txt 2>/dev/null
sync
echo "unifab-guest-exit $rc" > /dev/ttyS1
umount /mnt/host 2>/dev/null
echo o > /proc/sysrq-trigger
sleep 30
EOF
chmod 755 "$ROOTFS/sbin/unifab-init"
echo "InitiatorName=iqn.2026-11.invalid.unifab:guest" >"$ROOTFS/etc/iscsi/initiatorname.iscsi"

# --- trim: docs, locales, caches, firmware, the package lists ------------------
rm -rf "$ROOTFS"/usr/share/{doc,man,info,locale}/* "$ROOTFS"/var/cache/apt/* \
    "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/lib/firmware/* \
    "$ROOTFS"/lib/modules/"$KVER"/kernel/drivers/{gpu,media,net/wireless,infiniband,staging,sound} \
    "$ROOTFS"/lib/modules/"$KVER"/kernel/sound

mkdir -p "$WORK/out"
cp "$ROOTFS/boot/vmlinuz-$KVER" "$WORK/out/vmlinuz"
cp "$ROOTFS/boot/initrd.img-$KVER" "$WORK/out/initrd.img"
SIZE_MB=$(($(du -sm "$ROOTFS" | cut -f1) + 400))
mkfs.ext4 -q -L unifab-guest -d "$ROOTFS" "$WORK/rootfs.raw" "${SIZE_MB}M" >&2
qemu-img convert -O qcow2 "$WORK/rootfs.raw" "$WORK/out/rootfs.qcow2" >&2
{
    echo "key $KEY"
    echo "kernel $KVER"
    echo "mirror $MIRROR"
    echo "built $(date -u +%FT%TZ)"
    echo "packages ${PACKAGES[*]}"
    # The versions the kernel-peer tests ran against (README, interop).
    chroot "$ROOTFS" dpkg-query -W -f='version ${Package} ${Version}\n' \
        linux-image-amd64 open-iscsi multipath-tools fcoe-utils sg3-utils mt-st
} >"$WORK/out/RECIPE"
mv "$WORK/out" "$DEST"
# Images of other recipes unused for a week, and builds a killed run left.
find "$CACHE" -mindepth 1 -maxdepth 1 -type d -name '????????????????' ! -name "$KEY" \
    -mtime +7 -exec rm -rf {} + 2>/dev/null || true
find "$CACHE" -mindepth 1 -maxdepth 1 -type d -name '.build-*' -mmin +60 \
    -exec rm -rf {} + 2>/dev/null || true
echo "$DEST"
