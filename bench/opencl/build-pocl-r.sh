#!/usr/bin/env bash
# Builds PoCL-R — PoCL's remote client driver (inside libpocl) and its server `pocld` — from a
# pocl source checkout, for bench/opencl/latency-bandwidth.sh to measure beside sucl.
#
# The build has no LLVM and no CPU driver: libpocl holds only the remote driver, and pocld links
# the system's ICD loader (libOpenCL.so.1) and serves whatever OpenCL platform that loader finds
# (here Debian's PoCL CPU device, `pocl-opencl-icd`). pocl's doc/sphinx/source/remote.rst
# describes this split ("you do not need LLVM if you want to only use the PoCL-Remote driver to
# control server side devices for which a separate OpenCL driver exists"). It takes a few minutes
# on 2 cores instead of the ~20 of a full LLVM build.
#
# Nothing is downloaded: the source checkout is given (e.g. a `git archive v7.0` of pocl/pocl).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/opencl/build-pocl-r.sh [--prefix DIR] [--jobs N] [--source-id S] POCL_SOURCE_DIR

Builds PoCL-R (libpocl with only the remote client driver, and pocld) from POCL_SOURCE_DIR,
a pocl source tree (tested with release v7.0, commit 85654efe8989). Installs into DIR
(default /work/pocl-r): DIR/lib/libpocl.so (the client, load it with
OCL_ICD_VENDORS=DIR/lib/libpocl.so) and DIR/bin/pocld (the server). The build tree is
DIR/build. Needs cmake, a C/C++ compiler, ocl-icd-opencl-dev and opencl-c-headers (installed
with apt-get when missing and running as root); no LLVM, no network.

  --prefix DIR   where to build and install (default /work/pocl-r)
  --jobs N       parallel compile jobs (default: nproc)
  --source-id S  what the source is (e.g. "v7.0 85654efe8989"), recorded in DIR/VERSION;
                 default: `git describe` of POCL_SOURCE_DIR when it is a git checkout
  -h, --help     this text
EOF
}

prefix=/work/pocl-r
jobs=$(nproc)
src=
source_id=
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
        --source-id) source_id=${2:?--source-id needs a text}; shift 2 ;;
        -*) echo "build-pocl-r.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [ -z "$src" ] || { echo "build-pocl-r.sh: one source directory only" >&2; exit 2; }; src=$1; shift ;;
    esac
done
[ -n "$src" ] || { usage >&2; exit 2; }
src=$(cd "$src" && pwd)
if [ ! -f "$src/pocld/pocld.cc" ] || [ ! -d "$src/lib/CL/devices/remote" ]; then
    echo "build-pocl-r.sh: $src is not a pocl source tree with the remote driver" >&2; exit 1
fi

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v c++ >/dev/null || need+=(g++)
[ -e /usr/include/CL/cl.h ] || need+=(opencl-c-headers)
ls /usr/lib/*/libOpenCL.so >/dev/null 2>&1 || need+=(ocl-icd-opencl-dev)
if [ ${#need[@]} -gt 0 ]; then
    sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y --no-install-recommends "${need[@]}"
fi

mkdir -p "$prefix/build"
prefix=$(cd "$prefix" && pwd)
cmake -S "$src" -B "$prefix/build" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DENABLE_LLVM=OFF -DENABLE_HOST_CPU_DEVICES=OFF -DENABLE_LOADABLE_DRIVERS=OFF \
    -DENABLE_REMOTE_CLIENT=ON -DENABLE_REMOTE_SERVER=ON -DENABLE_ICD=ON \
    -DENABLE_TESTS=OFF -DENABLE_EXAMPLES=OFF -DENABLE_POCLCC=OFF >"$prefix/build/configure.log"
cmake --build "$prefix/build" -j "$jobs" --target pocl pocld
mkdir -p "$prefix/lib" "$prefix/bin"
cp -a "$prefix/build/lib/CL/"libpocl.so* "$prefix/lib/"
cp "$prefix/build/pocld/pocld" "$prefix/bin/pocld"
version=$(sed -n 's/^#define POCL_VERSION_FULL "\(.*\)"/\1/p' "$prefix/build/pocl_version.h" 2>/dev/null || true)
if [ -z "$source_id" ]; then
    source_id=$(git -C "$src" describe --tags --always 2>/dev/null || echo "not a git checkout")
    source_id="$source_id $(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || true)"
fi
printf 'PoCL-R %s (source %s: %s; no LLVM, remote client + pocld)\n' "${version:-?}" "$src" "$source_id" | tee "$prefix/VERSION"
echo "client: OCL_ICD_VENDORS=$prefix/lib/libpocl.so POCL_DEVICES=remote POCL_REMOTE0_PARAMETERS=HOST:PORT/0"
echo "server: $prefix/bin/pocld -a HOST -p PORT   (listens on PORT, PORT+1 and PORT+2)"
