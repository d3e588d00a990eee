#!/usr/bin/env python3
"""Checks that every relative link in the project's Markdown files names a
file or folder that exists (anchors are not checked). scripts/test-all.sh
runs it; it prints each broken link and exits 1 if there is one."""
import os
import re
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
files = subprocess.run(
    ["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True, check=True
).stdout.split()
link = re.compile(r"\]\(([^)\s]+)\)")
broken = 0
for f in files:
    text = open(os.path.join(root, f), encoding="utf-8").read()
    # Links inside fenced code blocks are examples, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in link.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        full = os.path.normpath(os.path.join(root, os.path.dirname(f), path))
        if not os.path.exists(full):
            print(f"{f}: broken link {target}")
            broken += 1
print(f"check-links: {len(files)} Markdown files, {broken} broken links")
sys.exit(1 if broken else 0)
