#!/usr/bin/env bash
# Figure stream-triggered (device machine, 2 GPUs): the checks of CommQueue over nccl and staged,
# then its benchmarks (scripts/gpu-stream.sh): the trigger round trip, 26 send/recv pairs through
# the queue against the same NCCL group called directly, and Faces (triggered vs a baseline of
# host-issued isend/irecv) on 2 GPUs and on 2, 4 and 8 host ranks.
# usage: build with scripts/gpu-stream-build.sh, then
#        [BIN=..] [ST=..] [FACES=..] [ST_TEST=..] [OUT=target/bench/stream] bench/stream-triggered.sh
# Writes OUT/gpu-bench.txt, OUT/stream.jsonl (the figure's rows) and OUT/stream.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OUT=${OUT:-target/bench/stream}
mkdir -p "$OUT"
scripts/gpu-stream.sh
python3 bench/tocsv.py jsonl "$OUT/gpu-bench.txt" | tee "$OUT/stream-triggered.jsonl"
