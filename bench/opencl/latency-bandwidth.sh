#!/usr/bin/env bash
# OpenCL latency (empty kernel + clFinish) and 64 MiB write/read bandwidth over loopback:
# sucl (ICD → sucld, TLS and a token) beside PoCL used directly, and the raw TCP round trip
# and stream on the same loopback (bench/opencl/tcpbase.c).
# usage: [ITERS=5000] [MIB=64] [REPS=7] bench/opencl/latency-bandwidth.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ITERS=${ITERS:-5000}; MIB=${MIB:-64}; REPS=${REPS:-7}
cargo build --release -q -p sucl-remote --bin sucld
cargo build --release -q -p sucl-opencl
work=$(mktemp -d)
daemon=
trap '[ -n "$daemon" ] && kill "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
cc -O2 -o "$work/clbench" bench/opencl/clbench.c -lOpenCL
cc -O2 -o "$work/tcpbase" bench/opencl/tcpbase.c
target/release/sucld --gen-token "$work/token" >/dev/null
env -u OCL_ICD_VENDORS target/release/sucld --token-file "$work/token" --listen 127.0.0.1:0 --opencl --host-devices 0 \
  --tls-ephemeral --print-address >"$work/daemon.out" 2>/dev/null &
daemon=$!
for _ in $(seq 100); do grep -q 'tls pin' "$work/daemon.out" 2>/dev/null && break; sleep 0.1; done
SUCL_REMOTE=$(sed -n 's/listening on //p' "$work/daemon.out")
SUCL_REMOTE_TLS_PIN=$(sed -n 's/tls pin //p' "$work/daemon.out")
export SUCL_REMOTE SUCL_REMOTE_TLS_PIN SUCL_REMOTE_TOKEN_FILE=$work/token
icd=OCL_ICD_VENDORS=$PWD/target/release/libsucl_opencl.so
echo "# $(date -u +%F) $(nproc)-core $(uname -m), loopback"
"$work/tcpbase" rtt "$ITERS"
env -u OCL_ICD_VENDORS "$work/clbench" Portable latency "$ITERS"
env "$icd" "$work/clbench" sucl latency "$ITERS"
"$work/tcpbase" stream "$MIB" "$REPS"
env -u OCL_ICD_VENDORS "$work/clbench" Portable bandwidth "$MIB" "$REPS"
env "$icd" "$work/clbench" sucl bandwidth "$MIB" "$REPS"
