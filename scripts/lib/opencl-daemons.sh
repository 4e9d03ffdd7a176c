# shellcheck shell=bash
# Sourced by the OpenCL program scripts: starts `sucld --opencl` daemons on loopback (TLS and a
# token, one PoCL CPU device each) and sets what a client needs to see them through the ICD.
#   SUCLD=<sucld binary>  SUCL_OPENCL_LIB=<libsucl_opencl.so>  (defaults: target/release)
#   SUCLD_ARGS="..."          more sucld options (e.g. --max-session-bytes)
#   PIN_CORES=1               start_daemons pins daemon i to cores i*THREADS .. (i+1)*THREADS-1
#                             (taskset), so that the daemons' devices share no core
#   SERVED_ICD=<.icd file>    the one OpenCL vendor the daemons serve and on_pocl uses
#                             (default: every platform of the loader, PoCL here)
#   start_daemons N THREADS   N daemons, each PoCL limited to THREADS threads
#                             (POCL_MAX_PTHREAD_COUNT, and POCL_CPU_MAX_CU_COUNT for PoCL 4+); exports SUCL_REMOTE, SUCL_REMOTE_TLS_PIN,
#                             SUCL_REMOTE_TOKEN_FILE
#   stop_daemons              kills and reaps them (also run on EXIT by the trap set here)
#   through_sucl CMD...       runs CMD with the ICD as its only OpenCL platform
#   on_pocl CMD...            runs CMD on the machine's own platforms (PoCL), no sucl
SUCLD=${SUCLD:-$PWD/target/release/sucld}
SUCL_OPENCL_LIB=${SUCL_OPENCL_LIB:-$PWD/target/release/libsucl_opencl.so}
SUCL_DAEMON_DIR=$(mktemp -d)
SUCL_DAEMON_PIDS=()
# shellcheck source=scripts/lib/opencl-vendor.sh
source "$(dirname "${BASH_SOURCE[0]}")/opencl-vendor.sh"
served_env_for "${SERVED_ICD:-}"
export SUCL_OPENCL_TIMEOUT=${SUCL_OPENCL_TIMEOUT:-60}

stop_daemons() {
  local pid
  for pid in "${SUCL_DAEMON_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SUCL_DAEMON_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SUCL_DAEMON_PIDS=()
}

cleanup_daemons() {
  stop_daemons
  rm -rf "$SUCL_DAEMON_DIR"
}
trap cleanup_daemons EXIT

start_daemons() {
  local n=$1 threads=$2 i out addrs=() pins=() pin=()
  [ -x "$SUCLD" ] || { echo "sucld not found at $SUCLD (set SUCLD)" >&2; return 1; }
  [ -e "$SUCL_OPENCL_LIB" ] || { echo "libsucl_opencl.so not found at $SUCL_OPENCL_LIB (set SUCL_OPENCL_LIB)" >&2; return 1; }
  stop_daemons
  [ -e "$SUCL_DAEMON_DIR/token" ] || "$SUCLD" --gen-token "$SUCL_DAEMON_DIR/token" >/dev/null
  for ((i = 0; i < n; i++)); do
    out=$SUCL_DAEMON_DIR/daemon$i.out
    : >"$out"
    pin=()
    [ "${PIN_CORES:-0}" = 1 ] && pin=(taskset -c "$((i * threads))-$(((i + 1) * threads - 1))")
    # shellcheck disable=SC2086 # SUCLD_ARGS is a list of options
    "${pin[@]}" env "${served_env[@]}" POCL_MAX_PTHREAD_COUNT="$threads" POCL_CPU_MAX_CU_COUNT="$threads" "$SUCLD" --token-file "$SUCL_DAEMON_DIR/token" \
      --listen 127.0.0.1:0 --opencl --host-devices 0 --tls-ephemeral --print-address ${SUCLD_ARGS:-} \
      >"$out" 2>"$SUCL_DAEMON_DIR/daemon$i.err" &
    SUCL_DAEMON_PIDS+=($!)
  done
  for ((i = 0; i < n; i++)); do
    out=$SUCL_DAEMON_DIR/daemon$i.out
    for _ in $(seq 300); do grep -q '^tls pin' "$out" && break; sleep 0.1; done
    grep -q '^tls pin' "$out" || { echo "sucld $i did not start:" >&2; cat "$SUCL_DAEMON_DIR/daemon$i.err" >&2; return 1; }
    addrs+=("$(sed -n 's/^listening on //p' "$out")")
    pins+=("$(sed -n 's/^tls pin //p' "$out")")
  done
  SUCL_REMOTE=$(IFS=,; echo "${addrs[*]}")
  SUCL_REMOTE_TLS_PIN=$(IFS=,; echo "${pins[*]}")
  export SUCL_REMOTE SUCL_REMOTE_TLS_PIN SUCL_REMOTE_TOKEN_FILE=$SUCL_DAEMON_DIR/token
}

through_sucl() { env OCL_ICD_VENDORS="$SUCL_OPENCL_LIB" OCL_ICD_FILENAMES="$SUCL_OPENCL_LIB" "$@"; }
on_pocl() { env "${served_env[@]}" "$@"; }
