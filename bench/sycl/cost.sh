#!/usr/bin/env bash
# The cost of the SYCL layer: an 8-byte all_reduce through sucl/sycl.hpp (USM and buffer, each
# submitted and waited for) beside the C call sucl_all_reduce it wraps, at each rank count
# (crates/sucl-capi/examples/sycl/cost.cpp; shm backend forced; OMP_NUM_THREADS default 1).
# Prints its tables.
# usage: [RANKS="1 2"] [ITERS=2000] [ROUNDS=5] [BIN=target/bench/sycl] bench/sycl/cost.sh
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/../.."
RANKS=${RANKS:-1 2}; ITERS=${ITERS:-2000}; ROUNDS=${ROUNDS:-5}; BIN=${BIN:-target/bench/sycl}
[ -x "$BIN/cost" ] || BIN="$BIN" bench/sycl/build.sh
SUCL=${SUCL:-target/release/sucl}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for r in $RANKS; do
  SUCL_BACKEND=shm timeout 600 "$SUCL" run -n "$r" -- "$BIN/cost" --iters "$ITERS" --rounds "$ROUNDS"
done
