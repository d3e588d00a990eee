#!/usr/bin/env bash
# scripts/test-all.sh — THE command: set up the machine and pass every test.
#
#   bash scripts/test-all.sh
#
# CI runs exactly this (.ci/run). Steps, each fatal on failure:
#   1. scripts/setup.sh            Debian peers, cargo-deny; versions; peers run
#   2. cargo fmt --all --check
#   3. cargo clippy --workspace --all-targets -- -D warnings; the fuzz
#      targets (fuzz/, outside the workspace) formatted and type-checked;
#      the crates' API docs (cargo doc --workspace --no-deps) build with no
#      warning: a broken intra-doc link fails the run
#      each protocol crate builds with --no-default-features and pulls no
#      tokio (cargo tree); every crate's examples build, and those that
#      need no outside peer run (scripts/run-examples.sh)
#   4. cargo deny check bans licenses sources, and advisories offline
#      against the RustSec snapshot in ../shared/advisory-db (ADVISORY_DB);
#      a missing snapshot fails the step (deny.toml)
#   5. scripts/check-ratchet.sh    conformance lists only grow; every
#      relative link in the Markdown files resolves (scripts/check-links.py);
#      every shell script through shellcheck
#   6. cargo build --workspace --release   (the unifab binary the peer tests
#      launch: UNIFAB_BIN is exported pointing at target/release/unifab)
#   7. cargo test --workspace      unit, integration and real-peer tests
#      (tgtd + libiscsi conformance, …; the kernel-peer tests,
#      crates/gateway/tests/kernel_*.rs, boot a Linux guest under QEMU
#      eight times, one at a time: about 4 min of this step on 2 cores:
#      234 s in the clean-clone run of 2026-11-28)
#   8. every criterion bench target in smoke mode (--quick, 0.1 s warm-up,
#      0.3 s measurement): benches keep compiling and running; numbers from
#      this mode mean nothing
# and ends with one line "test-all: N passed, N failed" (cargo test totals).
#
# Time on 2 cores (workspace as of this script's writing): ~6.5 min, both
# from a half-warm target/ and in a fresh Debian 12 chroot with a cold
# target/ (clippy ~70 s, release build ~2 min, tests ~1.5 min of which the
# two tgtd conformance runs ~25 s, bench smoke ~1.3 min); a machine without
# cargo-deny adds ~4.5 min to build it. The budget is 60 min (CI's limit is 90).
#
# Environment: SKIP_SETUP=1 skips step 1 (for quick local reruns only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$PATH:/usr/sbin:/sbin:${CARGO_HOME:-$HOME/.cargo}/bin"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# A one-shot build gains nothing from incremental caches, which are most of a
# debug target/'s size.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

LOG_DIR="$ROOT/target/test-all"
mkdir -p "$LOG_DIR"
START=$(date +%s)
STEP="(none)"
STEP_START=$START
TIMES=()

step() {
    finish_step
    disk_report
    STEP=$1
    STEP_START=$(date +%s)
    printf '\n======== test-all: %s\n' "$STEP"
}
finish_step() {
    if [[ "$STEP" != "(none)" ]]; then
        TIMES+=("$(printf '%5ss  %s' $(($(date +%s) - STEP_START)) "$STEP")")
    fi
}
on_exit() {
    local rc=$?
    if ((rc != 0)); then
        printf '\n######## test-all FAILED (exit %s) in step: %s\n' "$rc" "$STEP" >&2
        printf '######## see the output above; logs in %s\n' "$LOG_DIR" >&2
    fi
}
trap on_exit EXIT

# Disk: a cold run of every step below left 3.1 GiB under target/ (clean
# clone, 2026-11-22; the registry and git checkouts of the dependencies
# take ~0.6 GiB more under ~/.cargo). Say so up front rather than fail
# later inside rustc with ENOSPC.
NEED_GIB=5
disk_report() {
    local avail_kib
    avail_kib=$(df -Pk "$ROOT" | awk 'NR == 2 { print $4 }')
    printf 'disk: %s GiB free on %s; target/ holds %s\n' "$((avail_kib / 1048576))" \
        "$(df -P "$ROOT" | awk 'NR == 2 { print $6 }')" \
        "$(du -sh "${CARGO_TARGET_DIR:-$ROOT/target}" 2>/dev/null | cut -f1)"
}
AVAIL_KIB=$(df -Pk "$ROOT" | awk 'NR == 2 { print $4 }')
disk_report
if ((AVAIL_KIB < NEED_GIB * 1048576)); then
    echo "!!!!!!!! test-all: only $((AVAIL_KIB / 1048576)) GiB free; a cold run needs about $NEED_GIB GiB." >&2
    echo "!!!!!!!! The build may stop with 'No space left on device'." >&2
fi

# 1 ---------------------------------------------------------------------------
step "setup"
if [[ "${SKIP_SETUP:-}" == 1 ]]; then
    echo "SKIP_SETUP=1: not running scripts/setup.sh"
else
    bash scripts/setup.sh
fi

# 2 ---------------------------------------------------------------------------
step "cargo fmt --all --check"
cargo fmt --all --check

# 3 ---------------------------------------------------------------------------
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# 3b --------------------------------------------------------------------------
# The fuzz crate is outside the workspace (cargo-fuzz, nightly): check that it
# is formatted and still compiles against the crates' APIs, on stable.
step "fuzz targets: cargo fmt --check, cargo check"
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo check --manifest-path fuzz/Cargo.toml --bins

# 3c --------------------------------------------------------------------------
# The protocol crates are libraries for other projects: their docs are part
# of the product. Broken intra-doc links and bad doc markup fail here.
step "cargo doc --workspace --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# 3d --------------------------------------------------------------------------
# Another Rust storage project may take the wire layers and sans-IO state
# machines alone: each protocol crate must build without its default
# features, and that build must pull no tokio (docs/architecture.md).
step "library crates without default features: build, and no tokio in cargo tree"
for crate in unifab-scsi-core unifab-iscsi unifab-fc unifab-fcoe unifab-fcip unifab-capture; do
    cargo build -p "$crate" --no-default-features
    if cargo tree -p "$crate" --no-default-features -e normal --prefix none |
        grep -E '^(tokio|tokio-[a-z-]+|mio) v' >"$LOG_DIR/tree-$crate.txt"; then
        echo "$crate --no-default-features pulls an async runtime:" >&2
        sort -u "$LOG_DIR/tree-$crate.txt" >&2
        exit 1
    fi
    echo "$crate --no-default-features: built, no tokio in its dependency tree"
done

# 3e --------------------------------------------------------------------------
# Every library crate's examples build, and those that need no outside peer
# run (the iSCSI target and initiator examples are each other's peer).
step "examples: build, and run the ones that need no outside peer"
cargo build --workspace --examples
bash scripts/run-examples.sh

# 4 ---------------------------------------------------------------------------
step "cargo deny check"
cargo deny check bans licenses sources
# Advisories: against the dated RustSec snapshot beside the clone (this
# machine cannot reach GitHub, where the live database is). No snapshot, no
# pass: the step fails and says where it looked.
ADVISORY_DB=${ADVISORY_DB:-$ROOT/../shared/advisory-db}
if [[ ! -f "$ADVISORY_DB/use.sh" || ! -f "$ADVISORY_DB/SNAPSHOT" ]]; then
    echo "cargo deny: no RustSec advisory snapshot at $ADVISORY_DB (set ADVISORY_DB);" >&2
    echo "advisories cannot be checked, and an unchecked step does not pass" >&2
    exit 1
fi
bash "$ADVISORY_DB/use.sh" "${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
echo "advisory snapshot: $(cat "$ADVISORY_DB/SNAPSHOT")"
cargo deny --offline check advisories

# 5 ---------------------------------------------------------------------------
step "conformance ratchet only grows; Markdown links; shellcheck"
bash scripts/check-ratchet.sh
python3 scripts/check-links.py
mapfile -t SHELL_SCRIPTS < <(git ls-files '*.sh' .ci/run 2>/dev/null || ls scripts/*.sh benches/peers/*.sh .ci/run)
shellcheck -x --severity=warning "${SHELL_SCRIPTS[@]}"
echo "shellcheck (warnings and errors): ${#SHELL_SCRIPTS[@]} scripts clean"

# 6 ---------------------------------------------------------------------------
step "cargo build --workspace --release"
cargo build --workspace --release
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [[ -x "$TARGET_DIR/release/unifab" ]]; then
    export UNIFAB_BIN="$TARGET_DIR/release/unifab"
    echo "UNIFAB_BIN=$UNIFAB_BIN"
else
    echo "no unifab binary in $TARGET_DIR/release (tests that need it will say so)"
fi

# 7 ---------------------------------------------------------------------------
step "cargo test --workspace"
cargo test --workspace 2>&1 | tee "$LOG_DIR/cargo-test.log"
read -r PASSED FAILED < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/) p += $(i - 1)
            if ($(i) ~ /^failed;?$/) f += $(i - 1)
        }
    } END { print p + 0, f + 0 }' "$LOG_DIR/cargo-test.log")
if ((PASSED == 0)); then
    echo "cargo test ran no test" >&2
    exit 1
fi

# 8 ---------------------------------------------------------------------------
step "criterion benches (smoke mode)"
# Packages that have bench targets; each is built once and all its benches
# run in one `cargo bench -p PKG --bench '*'` (bench binaries are LTO builds:
# building them is most of this step's time).
mapfile -t BENCH_PKGS < <(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
for pkg in meta["packages"]:
    if pkg["id"] in members and any("bench" in t["kind"] for t in pkg["targets"]):
        print(pkg["name"])
')
if ((${#BENCH_PKGS[@]} == 0)); then
    echo "no bench targets in the workspace yet (nothing to run; the benches"
    echo "crate's library was built by clippy --all-targets and cargo test)"
else
    for pkg in "${BENCH_PKGS[@]}"; do
        echo "---- $pkg"
        cargo bench -p "$pkg" --bench '*' -- \
            --quick --warm-up-time 0.1 --measurement-time 0.3 --noplot
    done
fi

finish_step
STEP="(done)"
disk_report
printf '\n======== test-all: step times\n'
printf '%s\n' "${TIMES[@]}"
printf '%5ss  total\n' $(($(date +%s) - START))
printf '\ntest-all: %s passed, %s failed\n' "$PASSED" "$FAILED"
