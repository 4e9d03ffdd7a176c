#!/usr/bin/env bash
# Builds what bench/sycl/*.sh run into BIN (default target/bench/sycl): AdaptiveCpp (cached, see
# third_party/adaptivecpp), sucl's C library (release, installed into BIN/prefix), and with
# `acpp --acpp-targets=omp.library-only -O2` the Halo, Transpose and cost programs of
# crates/sucl-capi/examples/sycl, the MPI variants with Open MPI's compile and link flags.
# usage: [BIN=target/bench/sycl] bench/sycl/build.sh
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/bench/sycl}
mkdir -p "$BIN"
acpp_prefix="$(third_party/adaptivecpp/build-adaptivecpp.sh | tail -n1)"
scripts/install-capi.sh --prefix "$BIN/prefix" >/dev/null
cargo build --release -q -p sucl-cli
export PKG_CONFIG_PATH="$BIN/prefix/lib/pkgconfig"
sucl_flags=($(pkg-config --cflags --libs sucl) -Wl,-rpath,"$(pkg-config --variable=libdir sucl)")
mpi_flags=(-DOMPI_SKIP_MPICXX $(mpicxx --showme:compile) $(mpicxx --showme:link))
ex=crates/sucl-capi/examples/sycl
for prog in halo transpose cost halo_mpi transpose_mpi; do
  case "$prog" in *_mpi) flags=("${mpi_flags[@]}") ;; *) flags=("${sucl_flags[@]}") ;; esac
  "$acpp_prefix/bin/acpp" --acpp-targets=omp.library-only -O2 -std=c++17 "$ex/$prog.cpp" -o "$BIN/$prog" "${flags[@]}"
done
echo "built into $BIN"
