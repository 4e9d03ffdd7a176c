#!/usr/bin/env bash
# The task graph on GPU ranks, on the GPU machine (1 GPU needed; 2 add the NCCL runs), in one call:
#  1. sucl-graph's GPU tests (tests/gpu.rs) with SUCL_REQUIRE_GPU=1, so nothing skips: the example
#     programs on GPU queues bit-identical to the host ranks (1 rank; 2 ranks sharing GPU 0,
#     staged; with 2 GPUs also 2 ranks over NCCL and forced staged), an NVRTC compile error on
#     every rank with NVRTC's log, a faulting kernel and a lost rank as errors, not hangs;
#  2. the example programs once more through the launcher (`sucl run`), output kept;
#  3. step rates, graph against hand-written sucl calls on device buffers, #wrong checked:
#     Jacobi 8192² f32 and direct N-body f64 on 1 rank, 2 ranks sharing GPU 0 (both versions
#     staged through host: NCCL refuses two ranks on one GPU) and, with 2 GPUs, 2 ranks over NCCL;
#  4. graph-gpu.jsonl (every JSON result line) and graph-gpu.md (the table) in OUT.
# Fails — never skips — when there is no GPU or any check fails.
#
# build first (here): scripts/graph-gpu-build.sh (stripped binaries into devbin/), then:
#   BIN=devbin/sucl PROGRAMS=devbin/graph_gpu_programs STEP=devbin/graph_gpu_step_bench \
#     GPU_TEST=devbin/graph_gpu_tests OUT=target/bench/graph scripts/graph-gpu.sh
# Sizes: JACOBI_SIZE (8192), JACOBI_STEPS (50), NBODY_SIZE (32768), NBODY_STEPS (5), ROUNDS (3).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-target/release/sucl}
PROGRAMS=${PROGRAMS:-target/release/examples/graph_gpu_programs}
STEP=${STEP:-target/release/examples/graph_gpu_step_bench}
GPU_TEST=${GPU_TEST:-}
OUT=${OUT:-target/bench/graph}
JACOBI_SIZE=${JACOBI_SIZE:-8192}
JACOBI_STEPS=${JACOBI_STEPS:-50}
NBODY_SIZE=${NBODY_SIZE:-32768}
NBODY_STEPS=${NBODY_STEPS:-5}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
status=0
fail() { echo "graph-gpu: $*" >&2; status=1; }
"$BIN" info >"$OUT/gpu-info.txt" 2>&1
grep -q "^  cuda:0 " "$OUT/gpu-info.txt" || { echo "graph-gpu: no CUDA device: failing instead of skipping" >&2; exit 1; }
gpus=1
grep -q "^  cuda:1 " "$OUT/gpu-info.txt" && gpus=2
LOG="$OUT/graph-gpu-checks.txt"
: >"$LOG"
if [ -n "$GPU_TEST" ] && [ -x "$GPU_TEST" ]; then
  echo "== sucl-graph GPU tests: SUCL_REQUIRE_GPU=1 $GPU_TEST --skip gpu_tests_skipped_no_gpu --test-threads=1" >>"$LOG"
  SUCL_REQUIRE_GPU=1 timeout 600 "$GPU_TEST" --skip gpu_tests_skipped_no_gpu --test-threads=1 --nocapture >>"$LOG" 2>&1 || fail "sucl-graph GPU tests failed"
  grep -q "test result: ok. 5 passed" "$LOG" || fail "sucl-graph GPU tests: not all 5 passed"
else
  fail "the sucl-graph GPU test binary is missing (scripts/graph-gpu-build.sh; GPU_TEST=path)"
fi
grep -h "^test \|test result\|bit-identical\|SKIPPED" "$LOG"
[ -x "$PROGRAMS" ] || fail "$PROGRAMS missing (scripts/graph-gpu-build.sh)"
if [ -x "$PROGRAMS" ]; then
  echo "== programs, 2 ranks sharing GPU 0: CUDA_VISIBLE_DEVICES=0 $BIN run -n 2 -- $PROGRAMS" >>"$LOG"
  CUDA_VISIBLE_DEVICES=0 SUCL_TIMEOUT=60 timeout 300 "$BIN" run -n 2 -- "$PROGRAMS" >>"$LOG" 2>&1 || fail "programs on 2 ranks sharing GPU 0 failed"
  if [ "$gpus" -ge 2 ]; then
    echo "== programs, 2 ranks on 2 GPUs: $BIN run -n 2 -- $PROGRAMS" >>"$LOG"
    SUCL_TIMEOUT=60 timeout 300 "$BIN" run -n 2 -- "$PROGRAMS" >>"$LOG" 2>&1 || fail "programs on 2 GPUs failed"
  fi
fi
[ "$status" -eq 0 ] || { echo "graph-gpu: checks failed; no benchmarks (see $LOG)" >&2; exit 1; }
[ -x "$STEP" ] || { echo "graph-gpu: $STEP missing (scripts/graph-gpu-build.sh)" >&2; exit 1; }
STAGED_CFG="$OUT/.staged-only.toml"
printf '[platforms.cuda]\nbackends = ["staged"]\n' >"$STAGED_CFG"
BENCH="$OUT/graph-gpu-bench.txt"
: >"$BENCH"
run_bench() { # label, env assignments..., -- ranks program size steps
  local label=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local n=$1 prog=$2 size=$3 steps=$4
  echo "== $label: ${envs[*]} $BIN run -n $n -- $STEP $prog --size $size --steps $steps --rounds $ROUNDS --verbose" >>"$BENCH"
  env "${envs[@]}" SUCL_TIMEOUT=120 timeout 600 "$BIN" run -n "$n" -- "$STEP" "$prog" --size "$size" --steps "$steps" --rounds "$ROUNDS" --verbose >>"$BENCH" 2>&1 ||
    fail "$label: $prog failed"
}
for prog in jacobi nbody; do
  if [ "$prog" = jacobi ]; then size=$JACOBI_SIZE; steps=$JACOBI_STEPS; else size=$NBODY_SIZE; steps=$NBODY_STEPS; fi
  run_bench "1 GPU, 1 rank" CUDA_VISIBLE_DEVICES=0 -- 1 "$prog" "$size" "$steps"
  run_bench "1 GPU, 2 ranks (staged)" CUDA_VISIBLE_DEVICES=0 SUCL_CONFIG="$STAGED_CFG" -- 2 "$prog" "$size" "$steps"
  if [ "$gpus" -ge 2 ]; then
    run_bench "2 GPUs, 2 ranks" CUDA_VISIBLE_DEVICES=0,1 -- 2 "$prog" "$size" "$steps"
  fi
done
rm -f "$STAGED_CFG"
cat "$BENCH"
sed -n 's/^\(\[[0-9]*\] \)\{0,1\}\({"bench":"graph_gpu".*\)$/\2/p' "$BENCH" >"$OUT/graph-gpu.jsonl"
if command -v python3 >/dev/null; then
  python3 - "$OUT/graph-gpu.jsonl" >"$OUT/graph-gpu.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| program | size | ranks | GPU | graph transport | hand backends | graph ms/step | hand ms/step | graph/hand step rate | #wrong |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['program']} | {r['size']} | {r['ranks']} | {r['gpu']} | {r['transport']} | {r['hand_backend']} | {r['graph_ms_per_step']:.4f} | {r['hand_ms_per_step']:.4f} | {r['ratio']:.3f} | {r['wrong']} |")
PY
  cat "$OUT/graph-gpu.md"
fi
grep -q '"wrong":0' "$OUT/graph-gpu.jsonl" || fail "no benchmark result"
grep -q '"wrong":[1-9]' "$OUT/graph-gpu.jsonl" && fail "a benchmark's graph and hand-written results differ"
echo "graph-gpu: exit $status"
exit $status
