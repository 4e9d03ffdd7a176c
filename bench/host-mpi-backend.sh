#!/usr/bin/env bash
# Figure host-mpi-backend: sucl's mpi backend against the same Open MPI called directly
# (`sucl bench OP --compare mpi,raw-mpi,mpi-nonblocking` under mpirun, best of ROUNDS interleaved
# rounds per size, every result checked), all_reduce, broadcast and all_gather, 8 B-16 MiB.
# usage: [SUCL=sucl built with --features mpi] [RANKS=2] [ROUNDS=5] [ITERS=50] [OUT=target/bench/mpi-backend]
#        bench/host-mpi-backend.sh
# Writes OUT/mpi-backend-<ranks>r.md and OUT/host-mpi-backend.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench/mpi-backend}; export OUT
scripts/bench-mpi-backend.sh "${ROUNDS:-5}" "all_reduce broadcast all_gather"
T=$OUT/mpi-backend-${RANKS:-2}r.md; HEAD=""
for op in all_reduce broadcast all_gather; do
  python3 bench/tocsv.py md "$T" --section "## $op" $HEAD --set op=$op \
    --cols "bytes,raw_mpi_us=raw-mpi (µs),sucl_mpi_us=mpi (µs),ratio=mpi / raw,diff_us=mpi − raw (µs),wrong=#wrong"
  HEAD=--no-header
done >"$OUT/host-mpi-backend.csv"
