#!/usr/bin/env bash
# Checks sucl's C library the way its users consume it: installs it into a temporary prefix
# (scripts/install-capi.sh), builds the C examples with gcc through pkg-config (shared and
# static), the C++ example with CMake's find_package(sucl), and runs them: the collectives
# examples on 3 ranks under `sucl run -n 3` (every result checked against a serial reference),
# the bad-input test in one process. Exits non-zero on any failure. Installs cmake and g++
# (Debian packages) if missing.
#
#   scripts/capi-check.sh            # release build, as installed
#   scripts/capi-check.sh --debug    # debug build (quicker to build)
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
trap 'rm -rf "$work"' EXIT
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
# Static: libsucl.a and the system libraries pkg-config --static lists.
gcc "${cc_flags[@]}" "$ex/c/bad_input.c" -o "$work/bad_input_static" $(pkg-config --cflags sucl) "$libdir/libsucl.a" \
  $(pkg-config --static --libs-only-l sucl | sed 's/-lsucl//')
if ldd "$work/bad_input_static" | grep -q libsucl; then
  echo "bad_input_static links libsucl.so, not libsucl.a" >&2
  exit 1
fi
cmake -S "$ex/cpp" -B "$work/cpp" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cpp" >/dev/null

for bin in collectives bad_input bad_input_static cpp/collectives_cpp; do
  "$work/$bin" --help | grep -q "example:" || { echo "$bin --help says no example" >&2; exit 1; }
done

echo "== C: every collective, v-collective, point-to-point call and a stream-triggered queue on 3 ranks"
timeout 300 "$sucl" run -n 3 -- "$work/collectives"
echo "== C++ (CMake find_package): collectives on 3 ranks"
timeout 300 "$sucl" run -n 3 -- "$work/cpp/collectives_cpp"
echo "== C: bad input (shared and static library)"
timeout 120 "$work/bad_input"
timeout 120 "$work/bad_input_static"
echo "C API check passed"
