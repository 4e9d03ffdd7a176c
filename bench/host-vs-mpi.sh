#!/usr/bin/env bash
# Figures host-shm-vs-mpi and host-tcp-vs-mpi: sucl's all_reduce (f32 sum) against Open MPI on one
# host, side by side, alternating per round (scripts/bench-before-after.sh, run with one binary as
# both "before" and "after", so its before/after column is the noise floor of the run).
#   BACKEND=shm (Open MPI btl vader) or tcp (btl tcp on loopback); RANKS: a list, one table each.
# usage: [SUCL=target/release/sucl] [BACKEND=shm] [RANKS="2 4 8 16"] [ROUNDS=2] [ITERS=200]
#        [MINB=8] [MAXB=16777216] [OUT=target/bench/host-vs-mpi] bench/host-vs-mpi.sh
# Writes OUT/<backend>-<ranks>r.md (the table) and OUT/host-<backend>-vs-mpi.csv (bench/data's form).
# The published figures: BACKEND=shm RANKS="2 4 8 16" ROUNDS=2, and BACKEND=tcp RANKS=2 ROUNDS=3.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${BACKEND:-shm}; RANKS=${RANKS:-2 4 8 16}; OUT=${OUT:-target/bench/host-vs-mpi}
SUCL=${SUCL:-target/release/sucl}
[ -x "$SUCL" ] || cargo build --release -q -p sucl-cli
mkdir -p "$OUT"
CSV=$OUT/host-$BACKEND-vs-mpi.csv; HEAD=""
for r in $RANKS; do
  BEFORE=$SUCL AFTER=$SUCL BACKENDS=$BACKEND R=$r ROUNDS=${ROUNDS:-2} ITERS=${ITERS:-200} MINB=${MINB:-8} MAXB=${MAXB:-16777216} \
    scripts/bench-before-after.sh >"$OUT/$BACKEND-${r}r.md"
  python3 bench/tocsv.py md "$OUT/$BACKEND-${r}r.md" $HEAD --set ranks="$r" \
    --cols "bytes,mpi_us=MPI µs,sucl_us=after µs,sucl_over_mpi=after/MPI,wrong=after #wrong"
  HEAD=--no-header
done >"$CSV"
cat "$CSV"
