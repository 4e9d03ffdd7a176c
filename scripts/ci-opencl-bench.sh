#!/usr/bin/env bash
# CI for the OpenCL latency/bandwidth bench (bench/opencl/): installs Debian's ICD loader,
# headers, PoCL's CPU device and iproute2 if missing, builds sucld and libsucl_opencl.so (debug),
# then checks that
#   - both scripts answer --help and refuse bad settings before measuring anything;
#   - one small run measures every path it can (raw TCP, PoCL directly, sucl with and without
#     TLS) on loopback and, as root, across a veth pair, with a figure in every cell;
#   - a PoCL-R whose pocld cannot start makes that row "failed" and the run exit non-zero, and
#     the network namespaces are gone afterwards;
#   - with POCL_R_PREFIX=<a PoCL-R build>, or POCL_SRC=<a pocl source tree> (not downloaded
#     here) that build-pocl-r.sh builds, the PoCL-R rows are measured too.
# SUCLD= and SUCL_ICD= name prebuilt binaries instead of the debug builds.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

source scripts/lib/packages.sh
need=()
need_opencl
command -v ip >/dev/null && command -v ss >/dev/null || need+=(iproute2)
if [ -n "${POCL_SRC:-}" ]; then
  command -v cmake >/dev/null || need+=(cmake)
  command -v c++ >/dev/null || need+=(g++)
fi
install_need

# SUCLD / SUCL_ICD given (prebuilt binaries): used as they are; else the debug builds.
if [ -z "${SUCLD:-}" ] || [ -z "${SUCL_ICD:-}" ]; then
  cargo build -q -p sucl-remote --bin sucld
  cargo build -q -p sucl-opencl
  export SUCLD=$PWD/target/debug/sucld SUCL_ICD=$PWD/target/debug/libsucl_opencl.so
fi
export ITERS=200 REPS=3 MIB=8 TIMEOUT=120
bench=bench/opencl/latency-bandwidth.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "ci-opencl-bench: $*" >&2; exit 1; }

bash "$bench" --help | grep -q -- --veth || fail "latency-bandwidth.sh --help"
bash bench/opencl/build-pocl-r.sh --help | grep -q -- --prefix || fail "build-pocl-r.sh --help"
status=0; REPS=0 bash "$bench" >"$tmp/out" 2>&1 || status=$?
if [ "$status" != 2 ] || ! grep -q 'REPS must be a positive integer' "$tmp/out"; then fail "REPS=0 was not refused (exit $status)"; fi
status=0; bash bench/opencl/build-pocl-r.sh "$tmp" >"$tmp/out" 2>&1 || status=$?
if [ "$status" != 1 ] || ! grep -q 'not a pocl source tree' "$tmp/out"; then fail "build-pocl-r.sh accepted a non-pocl directory"; fi

# Every networked row of a table must carry figures: "| name | number | ... | number |".
rows_measured() {
  local file=$1; shift
  local name
  for name in "$@"; do
    grep -E "^\| $name +\| +[0-9.]+ \|.*\| +[0-9.]+ \| +[0-9]+ % \| +[0-9]+ % \|$" "$file" >/dev/null \
      || fail "row '$name' not measured in: $(cat "$file")"
  done
}

veth=()
if [ "$(id -u)" = 0 ] && ip netns add "ci-probe-$$" 2>/dev/null; then
  ip netns del "ci-probe-$$"
  veth=(--veth)
else
  echo "ci-opencl-bench: not root or no network namespaces here: loopback only"
fi

# PoCL-R: a prefix given (POCL_R_PREFIX), or built here from POCL_SRC, or its row is skipped.
pocl_r_rows=()
if [ -n "${POCL_R_PREFIX:-}" ]; then
  pocl_r_rows=(PoCL-R)
elif [ -n "${POCL_SRC:-}" ]; then
  bash bench/opencl/build-pocl-r.sh --prefix "$tmp/pocl-r" "$POCL_SRC"
  export POCL_R_PREFIX=$tmp/pocl-r
  pocl_r_rows=(PoCL-R)
fi

bash "$bench" "${veth[@]}" | tee "$tmp/table"
rows_measured "$tmp/table" "raw TCP" "PoCL direct" "sucl TLS on" "sucl TLS off" "${pocl_r_rows[@]}"
[ ${#pocl_r_rows[@]} -gt 0 ] || grep -q '^# PoCL-R skipped' "$tmp/table" || fail "no line says PoCL-R was skipped"
if [ ${#veth[@]} -gt 0 ]; then
  [ "$(grep -c '^| raw TCP ' "$tmp/table")" = 2 ] || fail "no veth table"
fi

# A PoCL-R prefix whose pocld dies at once: its row fails, the run says so and exits 1.
mkdir -p "$tmp/broken/bin" "$tmp/broken/lib"
printf '#!/bin/sh\necho "cannot serve" >&2\nexit 3\n' >"$tmp/broken/bin/pocld"
chmod +x "$tmp/broken/bin/pocld"
: >"$tmp/broken/lib/libpocl.so"
status=0
POCL_R_PREFIX=$tmp/broken bash "$bench" "${veth[@]}" >"$tmp/broken.out" 2>&1 || status=$?
[ "$status" = 1 ] || fail "a pocld that cannot start left exit status $status: $(cat "$tmp/broken.out")"
grep -q 'pocld did not start: cannot serve' "$tmp/broken.out" || fail "pocld's failure not reported"
grep -qE '^\| PoCL-R +\| +failed ' "$tmp/broken.out" || fail "PoCL-R row not marked failed"
rows_measured "$tmp/broken.out" "raw TCP" "sucl TLS on" "sucl TLS off"
if ip netns list 2>/dev/null | grep -q '^suclbench-'; then fail "network namespaces left behind: $(ip netns list)"; fi
echo "ci-opencl-bench: ok"
