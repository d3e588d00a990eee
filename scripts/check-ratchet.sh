#!/usr/bin/env bash
# scripts/check-ratchet.sh — the conformance lists only ever grow.
#
# For every conformance/*.pass file, every test name that any committed
# version of that file ever listed must still be listed now, unless
# conformance/retired.txt names it (one "TEST-NAME  reason" per line, for a
# test that libiscsi renamed or removed). Uncommitted edits are checked too:
# the working-tree file is what "now" means.
#
# Usage: bash scripts/check-ratchet.sh     (run by scripts/test-all.sh; <1 s)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "check-ratchet: NOT CHECKED — $(pwd) is not a git checkout, so there is no history to compare with" >&2
    exit 1
fi

# Test names of a list on stdin (none is not an error: a list not yet
# committed has no history).
names() { { grep -v '^[[:space:]]*#' || true; } | sed 's/#.*//; s/[[:space:]]//g' | { grep -v '^$' || true; } | sort -u; }

retired=$(mktemp)
trap 'rm -f "$retired"' EXIT
if [[ -f conformance/retired.txt ]]; then
    awk '!/^[[:space:]]*#/ && NF { print $1 }' conformance/retired.txt | sort -u > "$retired"
fi

status=0
checked=0
shopt -s nullglob
# Lists in the working tree and lists that were ever committed (a deleted
# list drops every test it had).
lists=$( { printf '%s\n' conformance/*.pass
          git log --format= --name-only -- 'conformance/*.pass'; } | grep -v '^$' | sort -u)
for list in $lists; do
    checked=$((checked + 1))
    if [[ -f "$list" ]]; then
        current=$(names < "$list")
    else
        current=""
    fi
    ever=$(git log --format=%H -- "$list" | while read -r commit; do
        git show "$commit:$list" 2>/dev/null || true
    done | names)
    dropped=$(comm -23 <(printf '%s\n' "$ever" | grep -v '^$' || true) \
        <(printf '%s\n' "$current") | comm -23 - "$retired")
    if [[ -n "$dropped" ]]; then
        echo "check-ratchet: $list no longer lists tests it listed before:" >&2
        printf '%s\n' "$dropped" | sed 's/^/  /' >&2
        echo "  A listed test must keep passing. If libiscsi itself renamed or removed it," >&2
        echo "  add it to conformance/retired.txt with the reason." >&2
        status=1
    else
        echo "check-ratchet: $list ok ($(printf '%s\n' "$current" | grep -c .) tests, none dropped)"
    fi
done
if ((checked == 0)); then
    echo "check-ratchet: no conformance/*.pass files found" >&2
    exit 1
fi
exit "$status"
