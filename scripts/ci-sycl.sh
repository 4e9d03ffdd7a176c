#!/usr/bin/env bash
# Checks sucl's SYCL interface (include/sucl/sycl.hpp) with a real SYCL implementation:
# builds AdaptiveCpp from third_party/adaptivecpp once into ~/.cache/sucl-ci/acpp (reused while
# it holds the same snapshot; $ACPP_PREFIX overrides), installs sucl's C library into a temporary
# prefix (scripts/install-capi.sh), compiles the SYCL tests, applications and benchmark with
# `acpp --acpp-targets=omp.library-only` (OpenMP devices) through pkg-config and CMake, and runs
# them: every call on buffers and USM against serial references at 1-4 ranks under `sucl run`,
# the bad-input cases, Halo and Transpose (sucl at 1, 2, 3 and 4 ranks, waiting for each step and
# with every step submitted at once; their MPI variants under
# mpirun at 2 ranks) with their checks, and the layer-cost benchmark briefly. Installs the Debian
# packages it needs (cmake, g++, pkg-config, Boost.Context/Fiber, Open MPI) if missing. Exits
# non-zero on any failure.
#
#   scripts/ci-sycl.sh            # release build of the library
#   scripts/ci-sycl.sh --debug    # debug build (quicker to build)
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --debug) profile=debug; flags=(--debug); cargo_flags=() ;;
  "") profile=release; flags=(); cargo_flags=(--release) ;;
  *) echo "ci-sycl.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."


missing=()
for p in cmake g++ pkg-config python3 libboost-context-dev libboost-fiber-dev libopenmpi-dev openmpi-bin; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi

acpp_prefix="$(third_party/adaptivecpp/build-adaptivecpp.sh | tail -n1)"
acpp=("$acpp_prefix/bin/acpp" --acpp-targets=omp.library-only -O2 -std=c++17 -Wall -Wextra -Werror)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
scripts/install-capi.sh --prefix "$prefix" "${flags[@]}"
cargo build "${cargo_flags[@]}" -p sucl-cli
sucl="${CARGO_TARGET_DIR:-target}/$profile/sucl"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
libdir="$(pkg-config --variable=libdir sucl)"
ex=crates/sucl-capi/examples/sycl
sucl_flags=($(pkg-config --cflags --libs sucl) -Wl,-rpath,"$libdir")
mpi_flags=(-DOMPI_SKIP_MPICXX $(mpicxx --showme:compile) $(mpicxx --showme:link))

echo "== compiling the SYCL programs with AdaptiveCpp (two at a time)"
compile() { # name, extra flags...
  local name="$1"
  shift
  "${acpp[@]}" "$ex/$name.cpp" -o "$work/$name" "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; return 1; }
}
pids=()
for prog in calls bad_input halo transpose cost halo_mpi transpose_mpi; do
  case "$prog" in
    *_mpi) compile "$prog" "${mpi_flags[@]}" & ;;
    *) compile "$prog" "${sucl_flags[@]}" & ;;
  esac
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
# The CMake package: find_package(sucl) gives sycl.hpp's include directory too.
cmake -S "$ex" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$acpp_prefix/bin/acpp" \
  -DCMAKE_CXX_FLAGS="--acpp-targets=omp.library-only" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cmake" >/dev/null

for bin in calls bad_input halo transpose cost halo_mpi transpose_mpi cmake/bad_input_cmake; do
  "$work/$bin" --help | grep -q "example:" || { echo "$bin --help says no example" >&2; exit 1; }
done

# One OpenMP thread per rank: the kernels are small, and 4 ranks already share 2 cores.
export OMP_NUM_THREADS=1
for n in 1 2 3 4; do
  echo "== every call on buffers and USM, $n rank(s)"
  timeout 300 "$sucl" run -n "$n" -- "$work/calls"
done
echo "== bad input (pkg-config build and CMake build)"
timeout 120 "$work/bad_input"
timeout 120 "$work/cmake/bad_input_cmake"
for n in 1 2 3 4; do
  echo "== Halo and Transpose through sucl, $n rank(s)"
  for mode in "" --ahead; do
    timeout 300 "$sucl" run -n "$n" -- "$work/halo" --size 24 --steps 6 --warmup 2 $mode
    timeout 300 "$sucl" run -n "$n" -- "$work/transpose" --size 24 --steps 4 --warmup 1 $mode
  done
done
echo "== Halo and Transpose through MPI, 2 ranks"
timeout 300 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np 2 "$work/halo_mpi" --size 24 --steps 6 --warmup 2
timeout 300 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np 2 "$work/transpose_mpi" --size 24 --steps 4 --warmup 1
echo "== the layer's cost, briefly (2 ranks)"
timeout 300 "$sucl" run -n 2 -- "$work/cost" --iters 50 --rounds 1
echo "SYCL check passed"
