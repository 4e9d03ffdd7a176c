#!/usr/bin/env bash
# CI for the OpenCL ICD (crates/sucl-opencl) and sucld's OpenCL devices: installs Debian's
# ICD loader, headers, PoCL's CPU device and clinfo if missing, builds sucld and
# libsucl_opencl.so, and runs C programs through the loader against sucld daemons on loopback
# (TLS and a token; two daemons; a killed daemon; bad input), then the OpenCL wire tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

source scripts/lib/packages.sh
need=()
need_opencl
install_need
clinfo -l

cargo build -p sucl-remote --bin sucld
cargo build -p sucl-opencl
SUCL_OPENCL_TESTS_REQUIRED=1 cargo test -p sucl-opencl --test icd
# Again with calls spinning for their replies (the default only on machines of 4 cores or more).
SUCL_REMOTE_SPIN_US=200 SUCL_OPENCL_TESTS_REQUIRED=1 cargo test -p sucl-opencl --test icd
cargo test -p sucl-remote --lib wire
cargo test -p sucl-remote --test wire_fuzz
