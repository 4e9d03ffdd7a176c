#!/usr/bin/env bash
# Builds (here, no GPU needed) everything scripts/gpu-stream.sh runs on the GPU machine and puts
# stripped copies into devbin/ (small enough to travel with the working tree):
#   devbin/sucl devbin/st_gpu devbin/faces devbin/stream_plot devbin/stream_gpu_tests
# then on the GPU machine, in one call:
#   BIN=devbin/sucl ST=devbin/st_gpu FACES=devbin/faces PLOT=devbin/stream_plot \
#     ST_TEST=devbin/stream_gpu_tests OUT=target/bench/stream scripts/gpu-stream.sh
set -euo pipefail
DEST=${DEST:-devbin}
cargo build --release -p sucl-cli -p sucl-stream --examples
cargo build --release -p sucl-cli --bin sucl
# The test binary's path, from cargo's JSON messages.
test_bin=$(cargo test --release -p sucl-stream --test gpu --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | grep /deps/ | tail -1)
[ -n "$test_bin" ] && [ -x "$test_bin" ] || { echo "gpu-stream-build: no test binary for sucl-stream's tests/gpu.rs" >&2; exit 1; }
mkdir -p "$DEST"
for b in target/release/sucl target/release/examples/st_gpu target/release/examples/faces target/release/examples/stream_plot; do
  strip -o "$DEST/$(basename "$b")" "$b"
done
strip -o "$DEST/stream_gpu_tests" "$test_bin"
ls -la "$DEST"
