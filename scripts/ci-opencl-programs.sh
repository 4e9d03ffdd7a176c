#!/usr/bin/env bash
# CI for unmodified OpenCL programs through the ICD: installs Debian's ICD loader, headers,
# PoCL's CPU device, pyopencl with its examples and tests, pytest and hashcat if missing; builds
# sucld and libsucl_opencl.so; runs pyopencl's examples and test suite (test_wrapper.py) and
# hashcat on two devices (two daemons), through sucld and on PoCL directly
# (scripts/opencl-programs.sh --only pyopencl,hashcat), then the multi-device stencil
# (bench/opencl/stencil.c) on 2 daemons, checked against its serial reference.
# SUCLD / SUCL_OPENCL_LIB, when both set, replace the debug build.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

source scripts/lib/packages.sh
need=()
need_opencl
/usr/bin/python3 -c 'import pyopencl' 2>/dev/null || need+=(python3-pyopencl)
[ -e /usr/share/doc/python-pyopencl-doc/examples/test_wrapper.py ] || need+=(python-pyopencl-doc)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
command -v hashcat >/dev/null || need+=(hashcat)
install_need

if [ -z "${SUCLD:-}" ] || [ -z "${SUCL_OPENCL_LIB:-}" ]; then
  cargo build -p sucl-remote --bin sucld
  cargo build -p sucl-opencl
  export SUCLD=$PWD/target/debug/sucld SUCL_OPENCL_LIB=$PWD/target/debug/libsucl_opencl.so
fi

PYTHON=/usr/bin/python3 scripts/opencl-programs.sh --only pyopencl,hashcat

# The stencil on two daemons, halos moved between them every step; exits non-zero when the
# result differs from the serial reference.
source scripts/lib/opencl-daemons.sh
cc -O2 -o "$SUCL_DAEMON_DIR/stencil" bench/opencl/stencil.c -lOpenCL -lm
start_daemons 2 1
through_sucl timeout 300 "$SUCL_DAEMON_DIR/stencil" --devices 2 --nx 512 --rows 128 --steps 30
