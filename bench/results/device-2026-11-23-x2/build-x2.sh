#!/bin/bash
# Builds every binary the 2-GPU device calls need into devbin/x (stripped).
set -euo pipefail
cd /work/main
D=devbin/x; mkdir -p $D/fault
tb() { # crate test-target -> path of test binary
  cargo test --release -p "$1" $2 --no-run --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep /deps/ | tail -1
}
nice cargo build --release -p sucl-cli --bin sucl -p sucl-remote --bin sucld 2>&1 | tail -1
nice cargo build --release -p sucl-stream --example faces --example st_gpu --example stream_plot -p sucl-graph --example graph_gpu_programs --example graph_gpu_step_bench -p sucl-remote --example remote_cuda_check --example remote_bench 2>&1 | tail -1
for b in sucl sucld examples/faces examples/st_gpu examples/stream_plot examples/graph_gpu_programs examples/graph_gpu_step_bench examples/remote_cuda_check examples/remote_bench; do strip -o $D/$(basename $b) target/release/$b; done
strip -o $D/stream_gpu_tests "$(tb sucl-stream '--test gpu')"
strip -o $D/graph_gpu_tests "$(tb sucl-graph '--test gpu')"
strip -o $D/cli_gpu_ipc_tests "$(tb sucl-cli '--test gpu_ipc')"
strip -o $D/cli_gpu_tests "$(tb sucl-cli '--test gpu')"
strip -o $D/sucl_cuda_tests "$(tb sucl-cuda '--lib')"
nice cargo build --release -p sucl-cli --bin sucl --features sucl-cli/fault-hook 2>&1 | tail -1
strip -o $D/fault/sucl target/release/sucl
nice cargo build --release -p sucl-cli --bin sucl 2>&1 | tail -1
ls -la $D $D/fault; du -sh $D
