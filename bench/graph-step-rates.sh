#!/usr/bin/env bash
# Figure graph-step-rates: Jacobi and N-body written on the task graph against the same algorithm
# written by hand with sucl calls, step rates side by side, #wrong checked.
#   host ranks (any machine): graph_step_bench on 1, 2, 4 ranks;
#   GPU ranks (device machine): DEVICE=1 runs scripts/graph-gpu.sh (1 GPU, 2 ranks sharing it,
#   and with 2 GPUs 2 ranks over NCCL; build first with scripts/graph-gpu-build.sh).
# usage: [SUCL=target/release/sucl] [STEP=target/release/examples/graph_step_bench] [RANKS="1 2 4"]
#        [JACOBI_SIZE=8192] [JACOBI_STEPS=5] [NBODY_SIZE=4096] [NBODY_STEPS=3] [ROUNDS=3]
#        [DEVICE=1] [OUT=target/bench/graph-steps] bench/graph-step-rates.sh
# Writes OUT/steps.jsonl (host) and, with DEVICE=1, OUT/graph-gpu.md and OUT/graph-gpu.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench/graph-steps}; SUCL=${SUCL:-target/release/sucl}
STEP=${STEP:-target/release/examples/graph_step_bench}
mkdir -p "$OUT"
if [ "${DEVICE:-0}" = 1 ]; then
  NCCL_NVLS_ENABLE=0 OUT=$OUT scripts/graph-gpu.sh
  exit
fi
[ -x "$SUCL" ] || cargo build --release -q -p sucl-cli
[ -x "$STEP" ] || cargo build --release -q -p sucl-graph --example graph_step_bench
: >"$OUT/steps.jsonl"
for n in ${RANKS:-1 2 4}; do
  "$SUCL" run -n "$n" --no-prefix -- "$STEP" jacobi --size "${JACOBI_SIZE:-8192}" --steps "${JACOBI_STEPS:-5}" \
    --rounds "${ROUNDS:-3}" >>"$OUT/steps.jsonl"
  "$SUCL" run -n "$n" --no-prefix -- "$STEP" nbody --size "${NBODY_SIZE:-4096}" --steps "${NBODY_STEPS:-3}" \
    --rounds "${ROUNDS:-3}" >>"$OUT/steps.jsonl"
done
cat "$OUT/steps.jsonl"
