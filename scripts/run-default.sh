#!/usr/bin/env bash
# Sets the machine up and runs unifab on its embedded default:
# a sparse 1 GiB file LU in ./unifab-data/, exported over iSCSI on
# 127.0.0.1:3260 as LUN 0 of iqn.2026-11.io.unifab:default.
#
#   bash scripts/run-default.sh            # set up, build (release), run
#   SKIP_SETUP=1 bash scripts/run-default.sh
#
# Extra arguments go to `unifab run` (e.g. --config FILE.toml).
# Stop with Ctrl-C: initiators are asked to log out, then it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${SKIP_SETUP:-}" != 1 ]]; then
    bash scripts/setup.sh
fi
cargo build --release -p unifab
exec target/release/unifab run "$@"
