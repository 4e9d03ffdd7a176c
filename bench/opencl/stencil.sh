#!/usr/bin/env bash
# Weak scaling of the multi-device OpenCL stencil (bench/opencl/stencil.c): one `sucld --opencl`
# per strip (PoCL's CPU device, TLS and a token, loopback), the same strip on every device, halos
# moved between daemons by buffer migration each step; every run checked against the serial
# reference. The machine's cores are split evenly between the daemons' PoCL devices
# (POCL_MAX_PTHREAD_COUNT = CORES / daemons, at least 1: with fewer cores than daemons they
# oversubscribe). Also the same strip on PoCL directly (one device, all CORES threads) as the
# baseline without sucl. Prints a markdown table: median ms per step over REPS runs, the
# efficiency t(1)/t(N), and the throughput ratio N*t(1)/t(N) (the same measure when every
# daemon has its own cores; the one that means something when N daemons share fewer cores,
# as on a 2-core machine, where t(1)/t(N) cannot exceed CORES/N).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: [CORES=<nproc>] [DAEMONS="1 2 4"] [NX=2048] [ROWS=1024] [STEPS=40] [REPS=3]
       [SUCLD=path] [SUCL_OPENCL_LIB=path] [STENCIL_BIN=path] [SERVED_ICD=pocl.icd] bench/opencl/stencil.sh
  CORES    cores to split evenly between the daemons' PoCL devices (16 on a 16-core host)
  DAEMONS  daemon counts to run (one device, one strip each)
  NX, ROWS grid columns, and rows per device (fixed: weak scaling)
  STEPS    timed steps per run (after 2 untimed ones); REPS runs per count, median kept
  SUCLD, SUCL_OPENCL_LIB  binaries to use (default: built here in release)
  STENCIL_BIN  a prebuilt bench/opencl/stencil.c (default: compiled here with cc)
  SERVED_ICD   the PoCL vendor file the daemons serve, where the loader has other platforms too
  PIN_CORES    1: each daemon is pinned to its own CORES/N cores (taskset), the direct run to
               cores 0..CORES-1 (default 1 where CORES/N >= 1 for every N and taskset exists)
EOF
}
case "${1:-}" in -h | --help) usage; exit 0 ;; "") ;; *) usage >&2; exit 2 ;; esac

cd "$(dirname "$0")/../.."
CORES=${CORES:-$(nproc)}
DAEMONS=${DAEMONS:-"1 2 4"}
NX=${NX:-2048} ROWS=${ROWS:-1024} STEPS=${STEPS:-40} REPS=${REPS:-3}
if [ -z "${SUCLD:-}" ] || [ -z "${SUCL_OPENCL_LIB:-}" ]; then
  cargo build --release -q -p sucl-remote --bin sucld
  cargo build --release -q -p sucl-opencl
fi
source scripts/lib/opencl-daemons.sh
bin=$SUCL_DAEMON_DIR/stencil
if [ -n "${STENCIL_BIN:-}" ]; then cp "$STENCIL_BIN" "$bin"; else cc -O2 -o "$bin" bench/opencl/stencil.c -lOpenCL -lm; fi

# The median of the ms_per_step of REPS runs of "$@" (each must pass its check).
median_ms() {
  local i line times=()
  for ((i = 0; i < REPS; i++)); do
    line=$("$@" --nx "$NX" --rows "$ROWS" --steps "$STEPS")
    echo "  $line" >&2
    times+=("$(sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p' <<<"$line")")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

echo "# stencil weak scaling, $(date -u +%F), $(nproc)-core $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# strip ${ROWS}x${NX} f32 per device, $STEPS steps, median of $REPS; CORES=$CORES"
if [ -z "${PIN_CORES:-}" ]; then
  PIN_CORES=0
  command -v taskset >/dev/null && [ "$CORES" -le "$(nproc)" ] && PIN_CORES=1
  for n in $DAEMONS; do [ "$n" -le "$CORES" ] || PIN_CORES=0; done
fi
export PIN_CORES
direct_pin=()
[ "$PIN_CORES" = 1 ] && direct_pin=(taskset -c "0-$((CORES - 1))")
echo "# PIN_CORES=$PIN_CORES"
pocl_ms=$(median_ms "${direct_pin[@]}" env "${served_env[@]}" POCL_MAX_PTHREAD_COUNT="$CORES" POCL_CPU_MAX_CU_COUNT="$CORES" "$bin" --platform Portable --devices 1)
echo
echo "| daemons | PoCL threads each | ms/step | Mcells/s | efficiency t(1)/t(N) | throughput N·t(1)/t(N) |"
echo "|---|---|---|---|---|---|"
echo "| PoCL directly, 1 device | $CORES | $pocl_ms | $(awk -v ms="$pocl_ms" -v c=$((ROWS * NX)) 'BEGIN {printf "%.0f", c / ms / 1e3}') | | |"
t1=
for n in $DAEMONS; do
  threads=$((CORES / n))
  [ "$threads" -ge 1 ] || threads=1
  start_daemons "$n" "$threads"
  ms=$(median_ms through_sucl "$bin" --devices "$n")
  stop_daemons
  [ -n "$t1" ] || t1=$ms
  note=""
  [ $((threads * n)) -gt "$CORES" ] && note=" (oversubscribed)"
  awk -v n="$n" -v th="$threads" -v ms="$ms" -v t1="$t1" -v c=$((ROWS * NX)) -v note="$note" \
    'BEGIN {printf "| %d | %d%s | %s | %.0f | %.2f | %.2f |\n", n, th, note, ms, n * c / ms / 1e3, t1 / ms, n * t1 / ms}'
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
