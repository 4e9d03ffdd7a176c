#!/usr/bin/env bash
# Builds sucl's C library and installs it under a prefix:
#   PREFIX/lib/libsucl.so.0 (+ libsucl.so -> libsucl.so.0), PREFIX/lib/libsucl.a,
#   PREFIX/include/sucl.h, PREFIX/include/sucl/sycl.hpp (the SYCL interface, header-only),
#   PREFIX/lib/pkgconfig/sucl.pc,
#   PREFIX/lib/cmake/sucl/suclConfig.cmake and suclConfigVersion.cmake.
#
#   scripts/install-capi.sh --prefix /usr/local          # release build (the default)
#   scripts/install-capi.sh --prefix "$HOME/.local" --debug
#   scripts/install-capi.sh --prefix /opt/sucl --features mpi
#
# Afterwards: pkg-config --cflags --libs sucl (with PREFIX/lib/pkgconfig on PKG_CONFIG_PATH),
# or find_package(sucl) in CMake (with PREFIX on CMAKE_PREFIX_PATH). See docs/guide/c.md.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
prefix="" profile="release" features=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --debug) profile="debug"; shift ;;
    --features) features="${2:?--features needs a list}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-capi.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install-capi.sh: --prefix is required (see --help)" >&2; exit 2; }

args=(-p sucl-capi)
[ "$profile" = release ] && args+=(--release)
[ -n "$features" ] && args+=(--features "$features")
cargo build "${args[@]}"

target="${CARGO_TARGET_DIR:-target}/$profile"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
pkg=crates/sucl-capi/pkg
mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/sucl" "$prefix/include/sucl"
prefix="$(cd "$prefix" && pwd)"

install -m 755 "$target/libsucl.so" "$prefix/lib/libsucl.so.0"
ln -sf libsucl.so.0 "$prefix/lib/libsucl.so"
install -m 644 "$target/libsucl.a" "$prefix/lib/libsucl.a"
install -m 644 crates/sucl-capi/include/sucl.h "$prefix/include/sucl.h"
install -m 644 crates/sucl-capi/include/sucl/sycl.hpp "$prefix/include/sucl/sycl.hpp"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$pkg/sucl.pc.in" >"$prefix/lib/pkgconfig/sucl.pc"
install -m 644 "$pkg/suclConfig.cmake" "$prefix/lib/cmake/sucl/suclConfig.cmake"
sed -e "s|@VERSION@|$version|" "$pkg/suclConfigVersion.cmake.in" >"$prefix/lib/cmake/sucl/suclConfigVersion.cmake"
echo "installed sucl $version ($profile) under $prefix"
