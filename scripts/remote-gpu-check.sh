#!/usr/bin/env bash
# Remote CUDA devices on a GPU machine.
#  1. starts `sucld --cuda` on loopback (TLS, a fresh certificate) and runs the
#     remote_cuda_check example against it (upload, fill, copy, an NVRTC kernel compiled on the
#     server, events, on every GPU), then the loopback latency and reconnect benchmark;
#  2. the applications on GPU daemons — a Jacobi 3D stencil (halos migrated server to server
#     each step) and a blocked matmul (B's column blocks passed round the daemons S2S) — with
#     CUDA C kernels compiled by NVRTC on the servers, checked bit for bit (#wrong) against
#     the same kernels run locally on GPU 0, and timed against them (efficiency):
#     with 1 GPU on the one daemon; with 2+ GPUs on one daemon per GPU
#     (CUDA_VISIBLE_DEVICES=0 and =1), split over 1 and 2 daemons;
#  3. with 2+ GPUs: the benchmark makes the two daemons one mesh and migrates 64 MiB GPU0 →
#     GPU1 server to server vs through the client (client links paced at 1 Gbit/s).
# Fails if a daemon cannot open a GPU, any check fails, or any #wrong is not 0.
# Sizes: JACOBI_N (256), JACOBI_NZ (256), JACOBI_STEPS (50), MATMUL_N (4096).
# usage: [OUT=dir] [HOST_BENCH=0] scripts/remote-gpu-check.sh   (builds what it needs in release)
#        SUCLD=path CHECK=path BENCH=path scripts/remote-gpu-check.sh   (prebuilt binaries, no cargo)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-target/bench/remote/gpu}
mkdir -p "$OUT"
if [ -z "${SUCLD:-}" ]; then
  cargo build --release -p sucl-remote --bin sucld --example remote_cuda_check --example remote_bench || exit 1
fi
SUCLD=${SUCLD:-target/release/sucld}
CHECK=${CHECK:-target/release/examples/remote_cuda_check}
BENCH=${BENCH:-target/release/examples/remote_bench}
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
"$SUCLD" --gen-token "$TMP/token" >/dev/null || exit 1

# start_daemon NAME [env...]: starts sucld --cuda; sets ADDR_NAME and PIN_NAME.
start_daemon() {
  local name=$1; shift
  env "$@" "$SUCLD" --cuda --listen 127.0.0.1:0 --print-address --tls-ephemeral --token-file "$TMP/token" \
    >"$TMP/$name.addr" 2>"$OUT/sucld-$name.log" &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "^tls " "$TMP/$name.addr" && break; sleep 0.1; done
  local addr pin
  addr=$(sed -n 's/^listening on //p' "$TMP/$name.addr")
  pin=$(sed -n 's/^tls pin //p' "$TMP/$name.addr")
  [ -n "$addr" ] && [ -n "$pin" ] || { echo "remote-gpu-check: sucld --cuda ($name) did not start:" >&2; cat "$OUT/sucld-$name.log" >&2; exit 1; }
  printf -v "ADDR_$name" %s "$addr"
  printf -v "PIN_$name" %s "$pin"
}

status=0
start_daemon all
SUCL_REMOTE=$ADDR_all SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PIN_all "$CHECK" | tee "$OUT/check.txt" || status=1
grep -q "NVRTC kernel, events: OK" "$OUT/check.txt" || status=1
"$BENCH" --only latency,reconnect --iters 20000 --out "$OUT/noop_latency.md" || status=1
# The whole host benchmark (in-process daemons on host devices), on an idle machine
# (HOST_BENCH=0 leaves it out).
if [ "${HOST_BENCH:-1}" != 0 ]; then "$BENCH" --out "$OUT/host_loopback.md" || status=1; fi

# every_right FILE: the application tables of FILE ran and every #wrong (last column) is 0.
every_right() {
  awk -F'|' '/^\| [0-9]+ \| [0-9]/ { rows++; if ($(NF-1) + 0 != 0) bad = 1 } END { exit (bad || rows == 0) }' "$1" \
    || { echo "remote-gpu-check: $1: an application run is missing or computed wrong results" >&2; status=1; }
}
APPS="--only jacobi,matmul --cuda --jacobi-n ${JACOBI_N:-256} --jacobi-nz ${JACOBI_NZ:-256} --jacobi-steps ${JACOBI_STEPS:-50} --matmul-n ${MATMUL_N:-4096}"

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -ge 2 ]; then
  kill "${PIDS[0]}" 2>/dev/null  # the all-GPU daemon is not needed any more
  start_daemon g0 CUDA_VISIBLE_DEVICES=0
  start_daemon g1 CUDA_VISIBLE_DEVICES=1
  SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PIN_g0,$PIN_g1 \
    "$BENCH" $APPS --servers "$ADDR_g0,$ADDR_g1" --out "$OUT/apps_gpu.md" || status=1
  every_right "$OUT/apps_gpu.md"
  SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PIN_g0,$PIN_g1 \
    "$BENCH" --only migrate --servers "$ADDR_g0,$ADDR_g1" --out "$OUT/migrate_2gpu.md" || status=1
  grep -q "Cuda → Cuda" "$OUT/migrate_2gpu.md" || { echo "remote-gpu-check: the migration did not run GPU to GPU" >&2; status=1; }
else
  SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PIN_all \
    "$BENCH" $APPS --servers "$ADDR_all" --out "$OUT/apps_gpu.md" || status=1
  every_right "$OUT/apps_gpu.md"
  echo "remote-gpu-check: $ngpu GPU(s): the applications ran on one daemon; skipping the two-daemon runs" >&2
fi
exit $status
