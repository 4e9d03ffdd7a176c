#!/usr/bin/env bash
# Figure gpu-ipc-vs-nccl (device machine, 2 GPUs that reach each other's memory): the peer-memory
# (ipc) all_reduce against sucl's nccl and NCCL called directly, f32 sum, 8 B-64 MiB, side by side
# in one job after `sucl tune --device cuda`; then the same calls captured into a CUDA graph and
# replayed (nccl vs ipc, 8 B-4 MiB). Every row checked (#wrong).
# usage: [SUCL=target/release/sucl] [ROUNDS=2] [OUT=target/bench/ipc] bench/gpu-ipc-vs-nccl.sh
# Writes OUT/stream.txt, OUT/graph.txt and OUT/gpu-ipc-vs-nccl.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
SUCL=${SUCL:-target/release/sucl}; OUT=${OUT:-target/bench/ipc}; ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
"$SUCL" tune --device cuda --ranks 2 --ops all_reduce --min-bytes 8 --max-bytes 64M --factor 4 --iters 50 --rounds 2 \
  --out "$OUT/tuning-cuda-2gpu.toml" >"$OUT/tune.txt"
"$SUCL" bench all_reduce --device cuda --ranks 2 --config "$OUT/tuning-cuda-2gpu.toml" --compare raw,nccl,ipc,auto \
  --min-bytes 8 --max-bytes 64M --factor 2 --rounds "$ROUNDS" --iters 100 --warmup 20 >"$OUT/stream.txt"
"$SUCL" bench all_reduce --device cuda --ranks 2 --graph --compare nccl,ipc \
  --min-bytes 8 --max-bytes 4M --factor 2 --rounds "$ROUNDS" --iters 100 --warmup 20 >"$OUT/graph.txt"
{ python3 bench/tocsv.py ws "$OUT/stream.txt" --set mode=stream \
    --cols "bytes,raw_nccl_us=raw,sucl_nccl_us=nccl,ipc_us=ipc,auto_us=auto,wrong=#wrong"
  python3 bench/tocsv.py ws "$OUT/graph.txt" --no-header --set mode=graph --cols "bytes,nccl,ipc,#wrong" \
    | awk -F, 'BEGIN{OFS=","} {print $1,$2,"",$3,$4,"",$5}'
} | tee "$OUT/gpu-ipc-vs-nccl.csv"
