#!/usr/bin/env bash
# Remote CUDA devices on a GPU machine: starts `sucld --cuda` on loopback, runs the
# remote_cuda_check example against it (upload, fill, copy, an NVRTC kernel compiled on the
# server, events, on every GPU), then the loopback latency benchmark. Fails if the daemon cannot
# open a GPU or any check fails.
# usage: [OUT=dir] scripts/remote-gpu-check.sh   (builds what it needs in release)
#        SUCLD=path CHECK=path BENCH=path scripts/remote-gpu-check.sh   (prebuilt binaries, no cargo)
set -uo pipefail
OUT=${OUT:-bench/results/remote/gpu}
mkdir -p "$OUT"
if [ -z "${SUCLD:-}" ]; then
  cargo build --release -p sucl-remote --bin sucld --example remote_cuda_check --example remote_bench || exit 1
fi
SUCLD=${SUCLD:-target/release/sucld}
CHECK=${CHECK:-target/release/examples/remote_cuda_check}
BENCH=${BENCH:-target/release/examples/remote_bench}
TMP=$(mktemp -d)
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$TMP"' EXIT
"$SUCLD" --gen-token "$TMP/token" >/dev/null || exit 1
"$SUCLD" --cuda --listen 127.0.0.1:0 --print-address --token-file "$TMP/token" >"$TMP/addr" 2>"$OUT/sucld.log" &
PID=$!
for _ in $(seq 100); do grep -q "listening on" "$TMP/addr" && break; sleep 0.1; done
ADDR=$(sed -n 's/^listening on //p' "$TMP/addr")
[ -n "$ADDR" ] || { echo "remote-gpu-check: sucld --cuda did not start:" >&2; cat "$OUT/sucld.log" >&2; exit 1; }
status=0
SUCL_REMOTE=$ADDR SUCL_REMOTE_TOKEN_FILE=$TMP/token "$CHECK" | tee "$OUT/check.txt" || status=1
grep -q "NVRTC kernel, events: OK" "$OUT/check.txt" || status=1
"$BENCH" --iters 20000 --out "$OUT/noop_latency.md" || status=1
exit $status
