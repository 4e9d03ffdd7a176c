#!/usr/bin/env bash
# Reproduces the task-graph benchmarks in this folder (host only).
#   cargo build --release -p sucl-graph --examples && cargo build -p sucl-cli
#   bench/results/graph/run.sh [OUT_DIR]
# Writes sched.jsonl (scheduler throughput), steps.jsonl (graph vs hand-written step rates).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-bench/results/graph}
ex=target/release/examples
sucl=${SUCL:-target/debug/sucl}
JACOBI=${JACOBI:-8192}
BODIES=${BODIES:-4096}
$ex/graph_sched_bench --ranks 1,4,16,64,256 --min-seconds 2 --json | tee "$out/sched.jsonl"
: > "$out/steps.jsonl"
for n in 1 2 4; do
  $sucl run -n "$n" --no-prefix -- $ex/graph_step_bench jacobi --size "$JACOBI" --steps 5 --rounds 5 --verbose | tee -a "$out/steps.jsonl"
  $sucl run -n "$n" --no-prefix -- $ex/graph_step_bench nbody --size "$BODIES" --steps 3 --rounds 5 --verbose | tee -a "$out/steps.jsonl"
done
# Collective pattern discovery: the Table 3 programs with and without discovery, side by side.
$ex/graph_sched_bench --ranks 1,4,16,64,256 --min-seconds 1 --programs allgather,gather_scatter,gather_bcast,alltoall,stencil --json | tee "$out/cpd_sched.jsonl"
python3 bench/results/graph/cpd_table.py "$out" > "$out/cpd_sched.md"
