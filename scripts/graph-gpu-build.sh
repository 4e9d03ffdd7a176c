#!/usr/bin/env bash
# Builds (here, no GPU needed) everything scripts/graph-gpu.sh runs on the GPU machine and puts
# stripped copies into devbin/ (small enough to travel with the working tree):
#   devbin/sucl devbin/graph_gpu_programs devbin/graph_gpu_step_bench devbin/graph_gpu_tests
# then on the GPU machine, in one call:
#   BIN=devbin/sucl PROGRAMS=devbin/graph_gpu_programs STEP=devbin/graph_gpu_step_bench \
#     GPU_TEST=devbin/graph_gpu_tests OUT=target/bench/graph scripts/graph-gpu.sh
set -euo pipefail
DEST=${DEST:-devbin}
cargo build --release -p sucl-cli --bin sucl
cargo build --release -p sucl-graph --example graph_gpu_programs --example graph_gpu_step_bench
# The test binary's path, from cargo's JSON messages (sucl-graph's tests/gpu.rs).
test_bin=$(cargo test --release -p sucl-graph --test gpu --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep /deps/ | tail -1)
[ -n "$test_bin" ] && [ -x "$test_bin" ] || { echo "graph-gpu-build: no test binary for sucl-graph's tests/gpu.rs" >&2; exit 1; }
mkdir -p "$DEST"
for b in target/release/sucl target/release/examples/graph_gpu_programs target/release/examples/graph_gpu_step_bench; do
  strip -o "$DEST/$(basename "$b")" "$b"
done
strip -o "$DEST/graph_gpu_tests" "$test_bin"
ls -la "$DEST"
