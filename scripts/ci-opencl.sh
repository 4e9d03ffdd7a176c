#!/usr/bin/env bash
# CI for the OpenCL ICD (crates/sucl-opencl) and sucld's OpenCL devices: installs Debian's
# ICD loader, headers, PoCL's CPU device and clinfo if missing, builds sucld and
# libsucl_opencl.so, and runs C programs through the loader against sucld daemons on loopback
# (TLS and a token; two daemons; a killed daemon; bad input), then the OpenCL wire tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

need=()
[ -e /usr/include/CL/cl.h ] || need+=(opencl-c-headers)
[ -e /usr/lib/x86_64-linux-gnu/libOpenCL.so ] || ldconfig -p | grep -q 'libOpenCL.so ' || need+=(ocl-icd-opencl-dev)
ls /etc/OpenCL/vendors/*pocl* >/dev/null 2>&1 || need+=(pocl-opencl-icd)
command -v clinfo >/dev/null || need+=(clinfo)
command -v cc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
clinfo -l

cargo build -p sucl-remote --bin sucld
cargo build -p sucl-opencl
SUCL_OPENCL_TESTS_REQUIRED=1 cargo test -p sucl-opencl --test icd
cargo test -p sucl-remote --lib wire
cargo test -p sucl-remote --test wire_fuzz
