#!/usr/bin/env bash
# The OpenCL ICD on a GPU machine, from prebuilt binaries (nothing is built here):
#  1. clinfo: the machine's platforms, then the sucl platform with a `sucld --opencl` serving
#     NVIDIA's OpenCL alone; the device queries through sucl beside the same queries answered by
#     NVIDIA's platform directly (they must agree, except where sucl reports less: OpenCL 1.2,
#     no images);
#  2. the Khronos conformance suites (scripts/opencl-cts.sh) on NVIDIA's OpenCL directly and
#     through sucl → sucld → NVIDIA's OpenCL;
#  3. latency (empty kernel + clFinish) and 64 MiB bandwidth on the H100 through sucl beside
#     NVIDIA's OpenCL directly and the raw TCP round trip (bench/opencl/latency-bandwidth.sh);
#  4. the stencil's weak scaling on PoCL's CPU device, the host's cores split between 1, 2 and 4
#     daemons (bench/opencl/stencil.sh).
# Steps run as named (default: all); each writes its output to OUT and the terminal.
#
# usage: scripts/opencl-gpu-check.sh --bin DIR --cts DIR [--out DIR] [STEP...]
#   --bin DIR  sucld, libsucl_opencl.so, clbench, tcpbase, stencil and clinfo (built elsewhere)
#   --cts DIR  an OpenCL-CTS build tree (test_conformance/SUITE/test_SUITE)
#   --out DIR  where results go (default: a temporary directory, printed)
#   STEP       clinfo, cts, latency, stencil
# Environment: SUITES ("events buffers compiler api basic"), CTS_JOBS (8), CTS_TIMEOUT (180),
#   CTS_ONLY (pocl or sucl: one way only),
#   ITERS, REPS, MIB (latency-bandwidth.sh), STENCIL_CORES (nproc).
set -uo pipefail
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
BIN="" CTS="" OUTDIR="" steps=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --bin) BIN="$2"; shift 2 ;;
    --cts) CTS="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    clinfo | cts | latency | stencil) steps+=("$1"); shift ;;
    *) echo "opencl-gpu-check: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$BIN" ] || { usage >&2; exit 2; }
[ ${#steps[@]} -gt 0 ] || steps=(clinfo cts latency stencil)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
repo=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath "$BIN")
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"
OUTDIR=$(realpath "$OUTDIR")
echo "# results in $OUTDIR; $(date -u '+%F %T UTC'), $(nproc)-core $(uname -m)"

# The loader's vendor files for NVIDIA's OpenCL and PoCL.
vendor_file() { grep -l -i "$1" /etc/OpenCL/vendors/*.icd 2>/dev/null | head -n 1; }
nvidia_icd=$(vendor_file nvidia)
pocl_icd=$(vendor_file pocl)
# Some images load NVIDIA's OpenCL without a vendor file: write one for its library.
if [ -z "$nvidia_icd" ]; then
  nvidia_lib=$(ldconfig -p | sed -n 's/.*libnvidia-opencl\.so\.1 .*=> //p' | head -n 1)
  for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -n "$nvidia_lib" ] || [ ! -e "$d/libnvidia-opencl.so.1" ] || nvidia_lib=$d/libnvidia-opencl.so.1
  done
  if [ -n "$nvidia_lib" ]; then echo "$nvidia_lib" >"$OUTDIR/nvidia.icd"; nvidia_icd=$OUTDIR/nvidia.icd; fi
fi
echo "# vendor files: NVIDIA ${nvidia_icd:-none}, PoCL ${pocl_icd:-none}"
status=0
# shellcheck source=scripts/lib/opencl-vendor.sh
source "$repo/scripts/lib/opencl-vendor.sh"

run_clinfo() {
  local tmp pid keys
  env -u OCL_ICD_VENDORS "$BIN/clinfo" -l 2>&1 | tee "$OUTDIR/clinfo-machine.txt"
  [ -n "$nvidia_icd" ] || { echo "no NVIDIA vendor file"; return 1; }
  tmp=$(mktemp -d)
  "$BIN/sucld" --gen-token "$tmp/token" >/dev/null
  served_env_for "$nvidia_icd"
  env "${served_env[@]}" "$BIN/sucld" --listen 127.0.0.1:0 \
    --opencl --host-devices 0 --tls-ephemeral --print-address --token-file "$tmp/token" >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  for _ in $(seq 300); do grep -q '^tls pin' "$tmp/out" && break; sleep 0.1; done
  env OCL_ICD_VENDORS="$BIN/libsucl_opencl.so" OCL_ICD_FILENAMES="$BIN/libsucl_opencl.so" \
    SUCL_REMOTE="$(sed -n 's/^listening on //p' "$tmp/out")" SUCL_REMOTE_TLS_PIN="$(sed -n 's/^tls pin //p' "$tmp/out")" \
    SUCL_REMOTE_TOKEN_FILE="$tmp/token" "$BIN/clinfo" --raw >"$OUTDIR/clinfo-sucl.txt" 2>&1
  env "${served_env[@]}" "$BIN/clinfo" --raw >"$OUTDIR/clinfo-nvidia.txt" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null
  rm -rf "$tmp"
  keys='CL_DEVICE_(TYPE|NAME|VENDOR|VENDOR_ID|VERSION|OPENCL_C_VERSION|DRIVER_VERSION|MAX_COMPUTE_UNITS|MAX_CLOCK_FREQUENCY|GLOBAL_MEM_SIZE|MAX_MEM_ALLOC_SIZE|LOCAL_MEM_SIZE|MAX_CONSTANT_BUFFER_SIZE|MAX_WORK_GROUP_SIZE|MAX_WORK_ITEM_SIZES|MAX_WORK_ITEM_DIMENSIONS|IMAGE_SUPPORT|PROFILING_TIMER_RESOLUTION|ADDRESS_BITS|EXTENSIONS)[[:space:]]'
  echo "# device queries: NVIDIA's OpenCL directly, then through sucl"
  grep -E "$keys" "$OUTDIR/clinfo-nvidia.txt" | sed 's/^\[[^]]*\] *//' | sort >"$OUTDIR/q-nvidia.txt"
  grep -E "$keys" "$OUTDIR/clinfo-sucl.txt" | sed 's/^\[[^]]*\] *//' | sort >"$OUTDIR/q-sucl.txt"
  paste -d'\n' "$OUTDIR/q-nvidia.txt" "$OUTDIR/q-sucl.txt" | sed 'n;s/^/  sucl: /'
  grep -q "CL_PLATFORM_NAME *sucl" "$OUTDIR/clinfo-sucl.txt" && grep -q "NVIDIA" "$OUTDIR/q-sucl.txt"
}

run_cts() {
  local suite rc=0
  [ -n "$CTS" ] || { echo "no --cts"; return 1; }
  for suite in ${SUITES:-events buffers compiler api basic}; do
    echo "## test_$suite"
    "$repo/scripts/opencl-cts.sh" --served-icd "$nvidia_icd" --jobs "${CTS_JOBS:-8}" --timeout "${CTS_TIMEOUT:-180}" ${CTS_ONLY:+--only "$CTS_ONLY"} \
      --sucld "$BIN/sucld" --icd "$BIN/libsucl_opencl.so" --out "$OUTDIR/cts" "$CTS" "$suite" >"$OUTDIR/cts-$suite.log" 2>&1 || rc=1
    sed -n '/^suite /,$p' "$OUTDIR/cts-$suite.log"
  done
  return $rc
}

run_latency() {
  SERVED_ICD="$nvidia_icd" DIRECT_PLATFORM=NVIDIA SUCLD="$BIN/sucld" SUCL_ICD="$BIN/libsucl_opencl.so" \
    CLBENCH="$BIN/clbench" TCPBASE="$BIN/tcpbase" ITERS="${ITERS:-3000}" REPS="${REPS:-5}" \
    PATH="$BIN:$PATH" "$repo/bench/opencl/latency-bandwidth.sh" 2>&1 | tee "$OUTDIR/latency-bandwidth.txt"
}

run_stencil() {
  CORES="${STENCIL_CORES:-$(nproc)}" SERVED_ICD="$pocl_icd" SUCLD="$BIN/sucld" SUCL_OPENCL_LIB="$BIN/libsucl_opencl.so" \
    STENCIL_BIN="$BIN/stencil" "$repo/bench/opencl/stencil.sh" 2>&1 | tee "$OUTDIR/stencil.txt"
}

for step in "${steps[@]}"; do
  echo "# === $step ($(date -u +%T))"
  "run_$step" || { echo "# $step FAILED"; status=1; }
done
exit $status
