#!/usr/bin/env bash
# Figure host-selection: `sucl tune` measures shm, tcp and mpi per op and size and writes a tuning
# table; `sucl bench OP --compare shm,tcp,mpi,auto` then measures every fixed backend and `auto`
# (following that table) side by side in one job (scripts/select-bench.sh, builds with --features mpi).
# usage: [SUCL=sucl built with --features mpi] [RANKS="2 4"] [MAXB=16M] [ITERS=200] [OUT=target/bench/selection]
#        bench/host-selection.sh
# Writes OUT/selection-<ranks>r.md, OUT/tuning-host-<ranks>r.toml and OUT/host-selection.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench/selection}; export OUT; HEAD=""
mkdir -p "$OUT"
for n in ${RANKS:-2 4}; do
  scripts/select-bench.sh "$n" >/dev/null
  for op in all_reduce broadcast all_to_all; do
    python3 bench/tocsv.py md "$OUT/selection-${n}r.md" --section "## $op" $HEAD --set ranks="$n" --set op=$op \
      --cols "bytes,shm_us=shm (µs),tcp_us=tcp (µs),mpi_us=mpi (µs),best=best fixed,auto_us=auto (µs),auto_over_best=auto / best"
    HEAD=--no-header
  done
done >"$OUT/host-selection.csv"
cat "$OUT/host-selection.csv"
