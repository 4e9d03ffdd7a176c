#!/bin/bash
# Builds every binary the final device calls need into devbin/z2 (stripped), with the "before"
# binaries (d4ee521, this session's start) in devbin/z2/b4.
set -euo pipefail
cd /work/main
D=devbin/z2; mkdir -p $D/b4
tb() { cargo test --release -p "$1" $2 --no-run --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep /deps/ | tail -1; }
cargo build --release -p sucl-cli --bin sucl 2>&1 | tail -1
cargo build --release -p sucl-stream --example faces --example st_gpu --example stream_plot -p sucl-graph --example graph_gpu_step_bench -p sucl-remote --example remote_bench 2>&1 | tail -1
for b in sucl examples/faces examples/st_gpu examples/stream_plot examples/graph_gpu_step_bench examples/remote_bench; do strip -o $D/$(basename $b) target/release/$b; done
strip -o $D/stream_gpu_tests "$(tb sucl-stream '--test gpu')"
strip -o $D/graph_gpu_tests "$(tb sucl-graph '--test gpu')"
strip -o $D/cli_gpu_ipc_tests "$(tb sucl-cli '--test gpu_ipc')"
strip -o $D/sucl_cuda_tests "$(tb sucl-cuda '--lib')"
cp devbin/y/graph_gpu_tests_sab $D/
cp devbin/x/sucl devbin/x/remote_bench devbin/x/faces $D/b4/
cp devbin/x/sucl-d651309 $D/
ls -la $D $D/b4; du -sh $D
