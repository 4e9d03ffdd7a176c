#!/usr/bin/env bash
# Figure graph-scheduler (and the communication-only and N-body tables beside it).
# Collective pattern discovery benchmarks (host ranks), each with and without discovery side by
# side in one run, rounds alternating which mode goes first:
#   1. scheduler throughput (graph only) of the Table 3 programs, the stencil control and the
#      N-body loop at 1, 4, 16, 64, 256 simulated ranks        -> cpd_sched.jsonl
#   2. communication-only throughput (kernels off) of the Table 3 programs and the stencil
#      control on 2 and 4 ranks, f32 buffers 4 KiB .. 64 MiB   -> cpd_comm.jsonl
#   3. N-body (f64, direct) strong scaling on 1, 2, 4 ranks     -> cpd_nbody.jsonl
# then the tables (cpd_tables.py) -> cpd_results.md, and the figure's data -> graph-scheduler.csv.
#
# Build (anywhere), then run with the binaries' paths:
#   cargo build --release -p sucl-graph --example graph_sched_bench --example graph_cpd_bench
#   cargo build --release -p sucl-cli
#   BIN_SCHED=target/release/examples/graph_sched_bench BIN_CPD=target/release/examples/graph_cpd_bench \
#   SUCL=target/release/sucl bench/graph-scheduler.sh [OUT_DIR]   (default target/bench/graph)
# Knobs (environment): ROUNDS (5), SCHED_SECONDS (0.5 CPU-seconds per measurement),
# MAX_BYTES (67108864), RANKS_COMM ("2 4"), RANKS_NBODY ("1 2 4"), BODIES (4096), STEPS (3),
# PROGRAMS (all five).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=${1:-$root/target/bench/graph}
mkdir -p "$out"
BIN_SCHED=${BIN_SCHED:-$root/target/release/examples/graph_sched_bench}
BIN_CPD=${BIN_CPD:-$root/target/release/examples/graph_cpd_bench}
SUCL=${SUCL:-$root/target/release/sucl}
ROUNDS=${ROUNDS:-5}
SCHED_SECONDS=${SCHED_SECONDS:-0.5}
MAX_BYTES=${MAX_BYTES:-67108864}
RANKS_COMM=${RANKS_COMM:-"2 4"}
RANKS_NBODY=${RANKS_NBODY:-"1 2 4"}
BODIES=${BODIES:-4096}
STEPS=${STEPS:-3}
PROGRAMS=${PROGRAMS:-allgather,gather_scatter,gather_bcast,alltoall,stencil}
for b in "$BIN_SCHED" "$BIN_CPD" "$SUCL"; do
  [ -x "$b" ] || { echo "graph-scheduler.sh: $b is not an executable (set BIN_SCHED, BIN_CPD, SUCL)" >&2; exit 2; }
done
{ echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$out/cpd_machine.txt"
"$BIN_SCHED" --ranks 1,4,16,64,256 --min-seconds "$SCHED_SECONDS" --rounds "$ROUNDS" \
  --programs "$PROGRAMS,nbody" --json > "$out/cpd_sched.jsonl"
: > "$out/cpd_comm.jsonl"
for n in $RANKS_COMM; do
  "$SUCL" run -n "$n" --no-prefix -- "$BIN_CPD" comm --programs "$PROGRAMS" --rounds "$ROUNDS" \
    --max-bytes "$MAX_BYTES" >> "$out/cpd_comm.jsonl"
done
: > "$out/cpd_nbody.jsonl"
for n in $RANKS_NBODY; do
  "$SUCL" run -n "$n" --no-prefix -- "$BIN_CPD" nbody --size "$BODIES" --steps "$STEPS" \
    --rounds "$ROUNDS" >> "$out/cpd_nbody.jsonl"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/cpd_machine.txt"
python3 "$here/cpd_tables.py" "$out" > "$out/cpd_results.md"
cat "$out/cpd_results.md"
python3 "$here/tocsv.py" md "$out/cpd_results.md" --section "Scheduler throughput" \
  --cols "program,ranks,rounds,p2p_tasks_per_s=p2p tasks/s,cpd_tasks_per_s=cpd tasks/s,speedup=speed-up,speedup_range=min-max" \
  > "$out/graph-scheduler.csv"
