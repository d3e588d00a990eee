#!/usr/bin/env bash
# benches/peers/rbd-bundle.sh OUT.tar.xz — everything rbd-compare.sh needs,
# for a machine with none of it installed (the many-core device machine of
# ../shared/device/README.md): unifab, ceph_mon (monitor commands without
# the Python `ceph`), qemu-img with its iSCSI and rbd modules,
# iscsi-readcapacity16, ceph-mon, ceph-osd, ceph-authtool, monmaptool, rbd,
# with every library they load and the dynamic loader, packed with xz.
#
#   cargo build --release -p unifab -p unifab-benches --bin unifab --bin ceph_mon
#   bash benches/peers/rbd-bundle.sh .bundle-rbd.tar.xz
#
# On the other machine: tar xJf .bundle-rbd.tar.xz (makes .bundle-rbd/),
# then run rbd-compare.sh with RBD_BUNDLE=$PWD/.bundle-rbd.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:?usage: rbd-bundle.sh OUT.tar.xz}
cd "$ROOT"
STAGE=.bundle-rbd
[[ -x target/release/unifab && -x target/release/ceph_mon ]] \
    || { echo "build first: cargo build --release -p unifab -p unifab-benches --bin unifab --bin ceph_mon" >&2; exit 1; }
rm -rf "$STAGE"
bash ../shared/device/make-bundle.sh "$STAGE" /usr/bin/ceph-mon /usr/bin/ceph-osd \
    /usr/bin/ceph-authtool /usr/bin/monmaptool /usr/bin/rbd /usr/bin/iscsi-readcapacity16 \
    target/release/ceph_mon >/dev/null
# Only what rbd-compare.sh runs.
for n in tgtd tgtadm qemu-io iscsi-test-cu iscsi-ls iscsi-inq iscsi-perf; do
    rm -f "$STAGE/bin/$n" "$STAGE/w/$n"
done
cp /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so "$STAGE/qemu/"
ldd "$STAGE/qemu/block-rbd.so" | awk '/=>/ {print $3}' | while read -r l; do
    if [[ -f "$l" && ! -f "$STAGE/lib/$(basename "$l")" ]]; then cp -L "$l" "$STAGE/lib/"; fi
done
# Ceph's plugins (the monitor will not start without the erasure-code
# ones) and the OSD's object classes (cls_rbd: no image without it);
# ceph.sh points at them with CEPH_PLUGIN_DIR.
mkdir -p "$STAGE/ceph-plugins"
for d in erasure-code compressor crypto; do
    cp -rL "/usr/lib/x86_64-linux-gnu/ceph/$d" "$STAGE/ceph-plugins/"
done
cp -rL /usr/lib/x86_64-linux-gnu/rados-classes "$STAGE/ceph-plugins/"
find "$STAGE/ceph-plugins" -name '*.so*' -exec ldd {} \; | awk '/=>/ {print $3}' | sort -u |
    while read -r l; do
        if [[ -f "$l" && ! -f "$STAGE/lib/$(basename "$l")" ]]; then cp -L "$l" "$STAGE/lib/"; fi
    done
strip "$STAGE"/bin/* 2>/dev/null || true
tar cJf "$OUT" "$STAGE"
rm -rf "$STAGE"
du -h "$OUT"
