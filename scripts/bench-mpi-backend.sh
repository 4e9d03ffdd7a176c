#!/usr/bin/env bash
# The mpi backend against MPI called directly, side by side in one job per op: `sucl bench
# --compare mpi,raw-mpi,mpi-nonblocking` under mpirun (2 ranks unless RANKS is set), best of
# ROUNDS interleaved rounds per size, every result checked against the serial reference.
#   mpi              the backend as it is: MPI's blocking collectives, bounded by the watchdog
#   raw-mpi          MPI_Allreduce/MPI_Bcast/... on MPI_COMM_WORLD, nothing of sucl around it
#   mpi-nonblocking  the backend on MPI's non-blocking collectives polled with MPI_Test (the
#                    path it took before: MPI_Iallreduce, ...)
# usage: [SUCL=path] [ITERS=50] [MINB=8] [MAXB=16M] [TAG=] scripts/bench-mpi-backend.sh [ROUNDS] [OPS]
#        [OUT=dir] (defaults: 5 "all_reduce broadcast all_gather"; bench/host-mpi-backend.sh runs it)
# Writes OUT/mpi-backend-<ranks>r<TAG>.md (OUT: target/bench/mpi-backend) and the raw JSON lines beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
OPS=${2:-all_reduce broadcast all_gather}
RANKS=${RANKS:-2}
ITERS=${ITERS:-50}
MAXB=${MAXB:-16M}
MINB=${MINB:-8}
TAG=${TAG:-}
# SUCL=path: a prebuilt sucl with the mpi feature (the GPU machine has no cargo).
if [ -z "${SUCL:-}" ]; then cargo build --release -q -p sucl-cli --features mpi; fi
SUCL=${SUCL:-target/release/sucl}
DIR=${OUT:-target/bench/mpi-backend}
RAW=$DIR/raw-mpi-backend-${RANKS}r${TAG}
rm -rf "$RAW" && mkdir -p "$RAW"
for op in $OPS; do
  echo "$op ..." >&2
  uptime >"$RAW/$op.load"
  mpirun --allow-run-as-root --oversubscribe -n "$RANKS" --bind-to core "$SUCL" bench "$op" \
    --compare mpi,raw-mpi,mpi-nonblocking --min-bytes "$MINB" --max-bytes "$MAXB" --factor 2 \
    --iters "$ITERS" --warmup 5 --rounds "$ROUNDS" --json >"$RAW/$op.jsonl"
  uptime >>"$RAW/$op.load"
done
OUT=$DIR/mpi-backend-${RANKS}r${TAG}.md
python3 scripts/mpi_backend_table.py "$RAW" "$RANKS" "$ROUNDS" "$ITERS" "$OPS" "$(mpirun --version | head -1)" "$MINB" "$MAXB" >"$OUT"
cat "$OUT"
