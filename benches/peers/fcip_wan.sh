#!/usr/bin/env bash
# benches/peers/fcip_wan.sh — FCIP over an emulated WAN (not a test: figures).
#
#   bash benches/peers/fcip_wan.sh                 # latency, throughput, failover
#   bash benches/peers/fcip_wan.sh latency         # one part (latency | throughput | tape | failover)
#   FCIP_WAN_WORKERS=1 bash benches/peers/fcip_wan.sh latency   # both sites on one thread
#   FCIP_WAN_CPU_LATENCY_US=0 bash benches/peers/fcip_wan.sh latency
#                       # hold a CPU wake-up latency request of 0 µs for the
#                       # run (as `[tuning] cpu_latency_us`; needs root)
#   bash benches/peers/fcip_wan.sh overhead      # only the 0 ms tunnel overhead, in
#                       # seven interleaved rounds (not part of the default run)
#
# Builds and runs benches/src/bin/fcip_wan.rs in release: site A's switch
# with an FCP initiator, an FCIP tunnel of two circuits, each through its
# own testkit WAN relay (delay, rate limit, black-hole cut), site B's switch
# with an FCP target over a 1 GiB memory LU, all in one process.
#
#   latency     4 KiB writes at QD1, 2,000 each, at emulated RTT 0, 0.25,
#               0.5 and 1 ms, FastWrite off and on; plus the path without
#               FCIP (initiator and target on one switch), the tunnel
#               without a relay, and in the same run the link alone (plain
#               TCP, 4 KiB there / 64 B back, through the same relay).
#   throughput  1 MiB sequential writes at QD 8 for 4 s through a 1 Gb/s
#               link (two circuits of 500 Mb/s, 0.5 ms RTT) on zeros,
#               database-like 8 KiB pages (benches/src/pages.rs) and random
#               data, per compression mode, FastWrite on (plus `none` with
#               it off): MB/s, share of what the link alone carries
#               (measured first, same run), ratio, CPU s/GB.
#   tape        64 KiB WRITE(6) one at a time to a tape drive at site B,
#               then REWIND and READ(6) of every block one at a time,
#               through a 1 Gb/s link at RTT 0, 1 and 5 ms, tape pipelining
#               off and on, against what the link alone carries (measured
#               first, same run) and the one-round-trip-per-block ceiling.
#   failover    8 writers of 8 KiB; circuit 2 black-holed at 1 s for 1.5 s:
#               longest pause, I/O errors, data verified, batches resent,
#               rejoin; at keep-alive 20 ms (dead after 80 ms) and 10/40 ms.
#
# Output: Markdown on stdout; a copy in target/fcip-wan/results.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=target/fcip-wan
mkdir -p "$OUT"
cargo build --release -p unifab-benches --bin fcip_wan
./target/release/fcip_wan "$@" | tee "$OUT/results.md"
