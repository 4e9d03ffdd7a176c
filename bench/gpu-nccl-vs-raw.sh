#!/usr/bin/env bash
# Figure gpu-nccl-vs-raw (device machine, 2+ GPUs): sucl's nccl, ipc, staged and auto against NCCL
# called directly through cudarc in the same binary (raw), all_reduce, broadcast and all_gather,
# 8 B-MAXB, side by side in one job, every row checked; after the device correctness matrix
# (scripts/gpu-check.sh, which fails rather than skips without CUDA or NCCL).
# usage: BIN=path/to/sucl [ROUNDS=2] [ITERS=20] [OUT=target/bench/gpu] bench/gpu-nccl-vs-raw.sh
#        (keep NCCL_NVLS_ENABLE=0 in the environment)
# Writes OUT/bench.jsonl (every row), OUT/table.md (scripts/gpu_table.py), OUT/gpu-nccl-vs-raw.csv
# (the 2-GPU tables, bench/data's form) and the checks' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-target/bench/gpu} ROUNDS=${ROUNDS:-2} ITERS=${ITERS:-20}
mkdir -p "$OUT"
scripts/gpu-check.sh
python3 scripts/gpu_table.py "$OUT/bench.jsonl" "sucl over NCCL vs NCCL called directly, ROUNDS=$ROUNDS ITERS=$ITERS" >"$OUT/table.md"
C="bytes,raw_nccl_us=raw NCCL (µs),sucl_nccl_us=sucl nccl (µs),overhead_us=overhead (µs),staged_us=staged (µs),auto_us=auto (µs)"
C="$C,raw_busbw=raw busbw,nccl_busbw=nccl busbw,staged_busbw=staged busbw,auto_over_best=auto / best"
HEAD=""
for op in all_reduce broadcast all_gather; do
  python3 bench/tocsv.py md "$OUT/table.md" --section "## $op, 2 GPUs" $HEAD --set op=$op --cols "$C"
  HEAD=--no-header
done | tee "$OUT/gpu-nccl-vs-raw.csv"
