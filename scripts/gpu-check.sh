#!/usr/bin/env bash
# GPU check, for the device machine in one call: the correctness matrix on device buffers with 1,
# 2 (and 4 when present) GPUs over every device backend, then nccl, staged and auto measured side
# by side in one job with a raw NCCL baseline (NCCL called directly through cudarc, bypassing sucl).
# Fails if CUDA or NCCL is missing or any check fails: nothing here may skip.
# usage: BIN=path/to/sucl OUT=dir [EXAMPLE=path/to/gpu_allreduce] [BENCH=0: checks only] scripts/gpu-check.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-target/release/sucl}
OUT=${OUT:-bench/results/gpu}
MAXB=${MAXB:-128M}
ITERS=${ITERS:-20}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
status=0
"$BIN" info >"$OUT/info.txt" 2>&1
grep -q "^  cuda:0 " "$OUT/info.txt" || { echo "gpu-check: no CUDA device: failing instead of skipping" >&2; exit 1; }
grep -q "^  nccl  available" "$OUT/info.txt" || { echo "gpu-check: NCCL unavailable: failing instead of skipping" >&2; exit 1; }
NGPU=$(grep -c "^  cuda:[0-9]" "$OUT/info.txt")
: >"$OUT/check.txt"
for n in 1 2 4; do
  [ "$n" -le "$NGPU" ] || continue
  "$BIN" check --device cuda --ranks "$n" --ops barrier,broadcast,reduce,all_reduce,gather,all_gather,scatter,all_to_all,reduce_scatter \
    --dtypes f32,f16,bf16,i32,u8,f64 --redops sum,max,avg --big-mib 72 >>"$OUT/check.txt" 2>&1 || status=1
done
grep -q "checks, 0 wrong" "$OUT/check.txt" || status=1
# The example: one all_reduce call on a device buffer and on a host vector.
if [ -n "${EXAMPLE:-}" ]; then
  ne=$(( NGPU < 2 ? NGPU : 2 ))
  "$BIN" run -n "$ne" -- "$EXAMPLE" >>"$OUT/check.txt" 2>&1 || { echo "gpu-check: the example failed" >&2; status=1; }
  [ "$(grep -c "floats all-reduced on" "$OUT/check.txt")" -ge "$ne" ] || status=1
fi
grep -q "WRONG" "$OUT/check.txt" && status=1
# A rank killed mid-run: the survivor must fail naming it (NCCL aborted), not hang. The ranks
# start without the launcher (torchrun's variables), which would otherwise end the survivor first.
if [ "$NGPU" -ge 2 ]; then
  start=$(date +%s)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 SUCL_TIMEOUT=30 timeout 120 \
      "$BIN" check --device cuda --ops all_reduce --dtypes f32 --redops sum --inject-kill 1 --inject-after 3 >"$OUT/fault-$r.txt" 2>&1 &
  done
  wait
  echo "fault run: $(( $(date +%s) - start )) s" >>"$OUT/check.txt"
  cat "$OUT/fault-0.txt" "$OUT/fault-1.txt" >>"$OUT/check.txt"; rm -f "$OUT/fault-0.txt" "$OUT/fault-1.txt"
  grep -q "rank 0: lost peer rank 1" "$OUT/check.txt" || { echo "gpu-check: the survivor did not report the lost rank" >&2; status=1; }
  grep -A3 "fault run" "$OUT/check.txt"
  # A rank that stops answering (alive, store connection open): the other must time out after
  # SUCL_TIMEOUT, abort NCCL and exit, not hang.
  start=$(date +%s)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29556 SUCL_TIMEOUT=5 timeout 40 \
      "$BIN" check --device cuda --ops all_reduce --dtypes f32 --redops sum --inject-stall 1 --inject-after 3 >"$OUT/stall-$r.txt" 2>&1 &
    pids[$r]=$!
  done
  wait "${pids[0]}"
  echo "stall run: rank 0 ended after $(( $(date +%s) - start )) s" >>"$OUT/check.txt"
  kill "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
  cat "$OUT/stall-0.txt" "$OUT/stall-1.txt" >>"$OUT/check.txt"; rm -f "$OUT/stall-0.txt" "$OUT/stall-1.txt"
  grep -q "rank 0: .*timed out after" "$OUT/check.txt" || { echo "gpu-check: the waiting rank did not time out" >&2; status=1; }
  grep -A3 "stall run" "$OUT/check.txt"
fi
# Benchmarks of a build that fails its checks would measure nothing worth keeping.
[ "$status" -eq 0 ] || { grep -h "sucl check\|WRONG\|panicked\|error" "$OUT/check.txt" | head -20; echo "gpu-check: checks failed; no benchmarks" >&2; exit 1; }
if [ "${BENCH:-1}" = 0 ]; then grep -h "sucl check" "$OUT/check.txt"; echo "gpu-check: exit $status (checks only)"; exit $status; fi
: >"$OUT/bench.jsonl"
for R in 2 4; do
  [ "$R" -le "$NGPU" ] || continue
  # Tune nccl against staged, then let auto follow that table in the side-by-side sweeps.
  "$BIN" tune --device cuda --ranks "$R" --ops all_reduce,broadcast,all_gather --min-bytes 8 --max-bytes "$MAXB" --factor 4 \
    --iters "$ITERS" --rounds 2 --out "$OUT/tuning-cuda-${R}gpu.toml" >>"$OUT/check.txt" 2>&1 || status=1
  for op in all_reduce broadcast all_gather; do
    "$BIN" bench "$op" --device cuda --ranks "$R" --config "$OUT/tuning-cuda-${R}gpu.toml" --compare raw,nccl,staged,auto --rounds "$ROUNDS" \
      --min-bytes 8 --max-bytes "$MAXB" --iters "$ITERS" --warmup "${WARMUP:-20}" --json >>"$OUT/bench.jsonl" 2>>"$OUT/bench-errors.txt" || status=1
  done
done
grep -h "sucl check" "$OUT/check.txt"
echo "gpu-check: exit $status"
exit $status
