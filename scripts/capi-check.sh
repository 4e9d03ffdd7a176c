#!/usr/bin/env bash
# Checks sucl's C library the way its users consume it: installs it into a temporary prefix
# (scripts/install-capi.sh), builds the C examples with gcc through pkg-config (shared and
# static), the C++ example with CMake's find_package(sucl), and runs them: the collectives
# examples on 3 ranks under `sucl run -n 3` (every result checked against a serial reference),
# the C one also from a torchrun-style environment, with explicit rank/size/address, and under
# Open MPI's mpirun when it is installed; the bad-input test in one process; the tests of
# crates/sucl-capi/tests/c (after a failed collective every later call says SUCL_ERR_UNUSABLE;
# threads sharing one communicator) on 2 and 3 ranks. Exits non-zero on
# any failure. Installs cmake and g++ (Debian packages) if missing.
#
#   scripts/capi-check.sh            # release build, as installed
#   scripts/capi-check.sh --debug    # debug build (quicker to build)
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --debug) profile=debug; flags=(--debug); cargo_flags=() ;;
  "") profile=release; flags=(); cargo_flags=(--release) ;;
  *) echo "capi-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
prefix="$work/prefix"
scripts/install-capi.sh --prefix "$prefix" "${flags[@]}"
cargo build "${cargo_flags[@]}" -p sucl-cli
sucl="${CARGO_TARGET_DIR:-target}/$profile/sucl"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
libdir="$(pkg-config --variable=libdir sucl)"
ex=crates/sucl-capi/examples
cc_flags=(-std=c11 -Wall -Wextra -Werror)
# Shared: pkg-config's flags, and an rpath to the prefix (not on the loader's path).
gcc "${cc_flags[@]}" "$ex/c/collectives.c" -o "$work/collectives" $(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir"
gcc "${cc_flags[@]}" "$ex/c/bad_input.c" -o "$work/bad_input" $(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir"
tests=crates/sucl-capi/tests/c
gcc "${cc_flags[@]}" "$tests/after_failure.c" -o "$work/after_failure" $(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir"
gcc "${cc_flags[@]}" "$tests/threads.c" -o "$work/threads" $(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir" -lpthread
# Device pointers (run on GPUs by scripts/capi-gpu-check.sh; here it must build and answer --help).
gcc "${cc_flags[@]}" "$ex/c/device.c" -o "$work/device" $(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir"
# Static: libsucl.a and the system libraries pkg-config --static lists.
gcc "${cc_flags[@]}" "$ex/c/bad_input.c" -o "$work/bad_input_static" $(pkg-config --cflags sucl) "$libdir/libsucl.a" \
  $(pkg-config --static --libs-only-l sucl | sed 's/-lsucl//')
if ldd "$work/bad_input_static" | grep -q libsucl; then
  echo "bad_input_static links libsucl.so, not libsucl.a" >&2
  exit 1
fi
cmake -S "$ex/cpp" -B "$work/cpp" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cpp" >/dev/null

# The library exports exactly the functions the header declares.
declared="$(grep -oE '^(sucl_result|const char \*)[ ]*sucl_[a-z_]+' "$prefix/include/sucl.h" | grep -oE 'sucl_[a-z_]+$' | sort)"
exported="$(nm -D --defined-only "$libdir/libsucl.so.0" | awk '{print $3}' | sort)"
if [ "$declared" != "$exported" ]; then
  echo "libsucl.so's exports differ from sucl.h's declarations:" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi
echo "libsucl.so exports the $(echo "$declared" | wc -l) functions sucl.h declares, nothing else"

for bin in collectives bad_input bad_input_static device cpp/collectives_cpp after_failure threads; do
  "$work/$bin" --help | grep -q "example:" || { echo "$bin --help says no example" >&2; exit 1; }
done

echo "== C: every collective, v-collective, point-to-point call and a stream-triggered queue on 3 ranks"
timeout 300 "$sucl" run -n 3 -- "$work/collectives"
# Three processes started by hand (each bounded), with `launch_rank R` starting rank R.
three() {
  local what="$1" rc=0
  shift
  pids=()
  for r in 0 1 2; do
    "$@" "$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  pids=()
  [ "$rc" -eq 0 ] || { echo "$what failed" >&2; exit 1; }
}
free_port() { python3 scripts/free_port.py; }
torchrun_rank() {
  RANK="$1" WORLD_SIZE=3 LOCAL_RANK="$1" LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
    timeout 300 "$work/collectives"
}
explicit_rank() { timeout 300 "$work/collectives" --explicit "$1" 3 "127.0.0.1:$port"; }
echo "== C: the same from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
port="$(free_port)"
three "torchrun-style launch" torchrun_rank
echo "== C: the same with sucl_init_explicit (rank, size, address)"
port="$(free_port)"
three "explicit init" explicit_rank
if command -v mpirun >/dev/null; then
  echo "== C: the same under Open MPI's mpirun"
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np 3 "$work/collectives"
fi
echo "== C++ (CMake find_package): collectives on 3 ranks"
timeout 300 "$sucl" run -n 3 -- "$work/cpp/collectives_cpp"
echo "== C: bad input (shared and static library)"
timeout 120 "$work/bad_input"
timeout 120 "$work/bad_input_static"
echo "== C: after a count mismatch, later calls return SUCL_ERR_UNUSABLE quoting it (shm; tcp checking)"
timeout 120 "$sucl" run -n 2 -- "$work/after_failure"
SUCL_BACKEND=tcp SUCL_CHECK_COLLECTIVES=1 timeout 120 "$sucl" run -n 3 -- "$work/after_failure"
echo "== C: 4 threads on one communicator (collectives and non-blocking point-to-point), shm and tcp, 3 ranks"
SUCL_BACKEND=shm timeout 300 "$sucl" run -n 3 -- "$work/threads"
SUCL_BACKEND=tcp timeout 300 "$sucl" run -n 3 -- "$work/threads"
echo "C API check passed"
