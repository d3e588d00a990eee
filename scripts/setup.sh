#!/usr/bin/env bash
# scripts/setup.sh — install everything unifab's build, tests and benchmarks
# need on a fresh Debian 12 machine, then prove each peer actually runs.
#
# Assumes only: Debian 12 (bookworm), root (or passwordless sudo), Rust via
# rustup with rustfmt and clippy, gcc, make, git, python3. Idempotent: when
# every package is already installed it does not touch apt at all, and
# cargo-deny is built only if `cargo deny` is missing.
#
# Installs (Debian):
#   libiscsi-bin      iscsi-test-cu, iscsi-perf, iscsi-inq, iscsi-ls
#   tgt               tgtd/tgtadm: the reference iSCSI target
#   qemu-utils        qemu-img (bench) …
#   qemu-block-extra  … with its iSCSI driver (block-iscsi.so)
#   tshark            independent frame decoder (its "non-root capture"
#                     debconf question is pre-answered "no")
#   fcoe-utils        fipvlan (FIP peer)
#   iperf3            loopback ceiling for benchmarks
#   clang m4 libelf-dev pkg-config libpcap-dev   builds of AF_XDP / pcap crates
#   zlib1g-dev linux-libc-dev                   libbpf (libxdp-sys) and the XDP filter program
#   llvm                                        llc, which libxdp-sys's configure looks for
#   iproute2 iputils-ping                       netns/veth for the FCoE and FCIP tests; IP across
#                                               the veth next to the XDP filter
#   (shell linter)    the "shellcheck" package, used by test-all.sh
#   ceph-mon ceph-osd ceph-common   a throwaway one-node Ceph cluster
#                     (scripts/ceph.sh) for the rbd: backend's tests and bench
#   librbd-dev librados-dev         librbd's C API, linked by the rbd feature
#   qemu-system-x86 debootstrap     the Linux guest of the kernel-peer tests
#                     (scripts/vm-image.sh builds its image once, ~90 s, cached
#                     in /var/cache/unifab/vm); e2fsprogs: debugfs reads the
#                     guest's filesystem from the LU's file on the host,
#                     and mkfs.ext4 an ext4 loop mount for the file backend;
#                     gcc libc6-dev: a static helper the FCoE guest runs
#   xfsprogs          mkfs.xfs: the file backend's no-wait writes are tested
#                     on XFS and ext4 loop mounts
#                     (crates/scsi-core/tests/loop_fs_nowait.rs)
# Installs (crates.io): cargo-deny (`cargo install --locked cargo-deny`).
#
# Usage: bash scripts/setup.sh
# Time: 2 s when all is present; on a fresh Debian 12 (checked in a
# debootstrap chroot) apt takes ~25 s (125 packages, 182 MB) and building
# cargo-deny ~4.5 min on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

APT_PACKAGES=(
    libiscsi-bin tgt qemu-utils qemu-block-extra tshark fcoe-utils iperf3
    clang m4 libelf-dev pkg-config libpcap-dev shellcheck
    zlib1g-dev linux-libc-dev llvm iproute2 iputils-ping ethtool
    ceph-mon ceph-osd ceph-common librbd-dev librados-dev
    etcd-server protobuf-compiler libprotobuf-dev
    qemu-system-x86 debootstrap e2fsprogs gcc libc6-dev xfsprogs
)

say() { printf '\n== setup: %s\n' "$*"; }
die() { printf '\nsetup FAILED: %s\n' "$*" >&2; exit 1; }

if [[ $(id -u) -eq 0 ]]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo -n)
else
    die "run as root (or install sudo): apt-get needs it"
fi

# tgtd and friends live in /usr/sbin, which a non-login shell may lack.
export PATH="$PATH:/usr/sbin:/sbin"

# --- Debian packages -------------------------------------------------------
if [[ -r /etc/os-release ]]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    if [[ "${ID:-}" != debian || "${VERSION_ID:-}" != 12 ]]; then
        echo "setup: warning: written for Debian 12, this is ${PRETTY_NAME:-unknown}" >&2
    fi
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    [[ "$status" == ii* ]] || missing+=("$pkg")
done

if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # tshark asks whether non-root users may capture; answer before it asks.
    echo "wireshark-common wireshark-common/install-setuid boolean false" \
        | "${SUDO[@]}" debconf-set-selections
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}"
else
    say "all Debian packages already installed"
fi

# The tgt package ships a system service that would hold 0.0.0.0:3260 (the
# port `unifab run` uses by default). Tests start their own private tgtd
# instances, so the system one is stopped and disabled where systemd runs it.
if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-enabled --quiet tgt.service 2>/dev/null \
        || systemctl is-active --quiet tgt.service 2>/dev/null; then
        say "stopping and disabling the system tgt service (tests run their own tgtd)"
        "${SUDO[@]}" systemctl disable --now tgt.service
    fi
    # etcd-server's service likewise: the cluster tests start their own.
    if systemctl is-enabled --quiet etcd.service 2>/dev/null \
        || systemctl is-active --quiet etcd.service 2>/dev/null; then
        say "stopping and disabling the system etcd service (tests run their own etcd)"
        "${SUDO[@]}" systemctl disable --now etcd.service
    fi
fi

# --- Rust tools ---------------------------------------------------------------
command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust with rustup first"
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        say "adding rustup component $component"
        rustup component add "$component" \
            || die "rustup could not add $component (it is fetched from the Rust servers)"
    fi
done
if ! cargo deny --version >/dev/null 2>&1; then
    say "building cargo-deny (cargo install --locked cargo-deny)"
    cargo install --locked cargo-deny
fi

# --- Versions -----------------------------------------------------------------
say "versions"
pkgver() { dpkg-query -W -f='${Version}' "$1"; }
printf '%-18s %s\n' \
    debian "$(cat /etc/debian_version 2>/dev/null || echo '?')" \
    rustc "$(rustc --version)" \
    cargo "$(cargo --version)" \
    rustfmt "$(cargo fmt --version)" \
    clippy "$(cargo clippy --version)" \
    cargo-deny "$(cargo deny --version)"
for pkg in "${APT_PACKAGES[@]}"; do
    printf '%-18s %s\n' "$pkg" "$(pkgver "$pkg")"
done

# --- Prove the peers run --------------------------------------------------------
say "checking that each peer runs"
check() {
    local what=$1
    shift
    if out=$("$@" 2>&1); then
        printf '  ok  %s\n' "$what"
    else
        printf '%s\n' "$out" | tail -5 >&2
        die "$what does not run: $*"
    fi
}
check "iscsi-test-cu --help" iscsi-test-cu --help
check "etcd --version" etcd --version
check "protoc --version (etcd-client's build)" protoc --version
# shellcheck disable=SC2016 # expanded by the inner bash
check "iscsi-test-cu lists the ALL family" \
    bash -c 'n=$(iscsi-test-cu --list | grep -c "^ALL\.[^.]*\.[^.]*$"); echo "$n tests"; [ "$n" -ge 200 ]'
check "iscsi-perf present" bash -c 'iscsi-perf 2>&1 | grep -q "Usage: iscsi-perf"'
check "iscsi-inq --help" iscsi-inq --help
check "tgtd -V" tgtd -V
check "tgtadm --help" tgtadm --help
check "qemu-img --version" qemu-img --version
check "qemu-img has the iscsi driver" bash -c 'qemu-img --help | grep -qw iscsi'
check "tshark --version" tshark --version
check "fipvlan --version" fipvlan --version
check "iperf3 --version" iperf3 --version
check "ip netns list (iproute2)" ip netns list
check "clang --version" clang --version
check "llc --version" llc --version
check "ip -V" ip -V
check "ping -V" ping -V
check "shellcheck --version" shellcheck --version
check "pkg-config finds libpcap" pkg-config --exists libpcap
check "pkg-config finds libelf" pkg-config --exists libelf
check "tmpfs at /dev/shm" test -d /dev/shm -a -w /dev/shm
check "mkfs.xfs -V (xfsprogs)" mkfs.xfs -V
check "mkfs.ext4 -V (e2fsprogs)" mkfs.ext4 -V
check "qemu-img has the rbd driver" bash -c 'qemu-img --help | grep -qw rbd'
check "librbd and librados to link" test -e /usr/lib/x86_64-linux-gnu/librbd.so -a -e /usr/lib/x86_64-linux-gnu/librados.so
ceph_check() {
    local d rc=0
    d=$(mktemp -d)
    bash "$here/ceph.sh" up "$d" >/dev/null \
        && timeout 30 rbd -c "$d/ceph.conf" create rbd/setup-check --size 16M || rc=$?
    bash "$here/ceph.sh" down "$d" || rc=$?
    rm -rf "$d"
    return "$rc"
}
check "a one-node Ceph cluster starts, makes an image, stops (scripts/ceph.sh)" ceph_check
check "qemu-system-x86_64 --version" qemu-system-x86_64 --version
check "the kernel-peer guest image (scripts/vm-image.sh; built once, ~90 s)" \
    timeout --kill-after=30 900 bash "$here/vm-image.sh"
if ! python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 3260))' 2>/dev/null; then
    echo "  note: 127.0.0.1:3260 (unifab run's default portal) is taken by another process here" >&2
fi

say "done"
