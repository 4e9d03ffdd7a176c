#!/usr/bin/env bash
# Figure host-hier-vs-flat: hierarchical all_reduce (shm inside a host, tcp between hosts) against
# flat tcp on HOSTS posed hosts x PER ranks on one machine (SUCL_HOSTNAME per rank), alternating
# per round (scripts/bench-hier.sh).
# usage: [SUCL=target/release/sucl] [HOSTS=2] [PER=2] [ROUNDS=3] [ITERS=100] [OUT=target/bench/hier]
#        bench/host-hier-vs-flat.sh
# Writes OUT/hier.md and OUT/host-hier-vs-flat.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench/hier}; SUCL=${SUCL:-target/release/sucl}
[ -x "$SUCL" ] || cargo build --release -q -p sucl-cli
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3} ITERS=${ITERS:-100} scripts/bench-hier.sh "$SUCL" >"$OUT/hier.md"
python3 bench/tocsv.py md "$OUT/hier.md" \
  --cols "bytes,flat_tcp_us=after tcp µs,hier_us=after hier µs,hier_over_flat_busbw=after hier/flat busbw,wrong=#wrong (all)" \
  | tee "$OUT/host-hier-vs-flat.csv"
