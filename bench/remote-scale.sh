#!/usr/bin/env bash
# Figure remote-scale (device machine, 2-4 GPUs): remote GPU daemons that scale. One `sucld
# --cuda` per GPU (TLS, loopback); Jacobi 3D weak scaling (512³ f32 per daemon, halos every
# step) and a blocked matmul (4096², 8192² f64) over 1, 2 and 4 daemons, run twice side by side:
# migrations over the TLS peer link (`sucld --peer-path network`, the baseline) and GPU to GPU
# through peer memory (`--peer-path auto`); each checked bit for bit against the same kernels on
# one GPU, with a per-step breakdown (migrations, bytes, host wait per migration, client round
# trips). With SENDRECV and SUCL_BIN also the reference: the same 3D stencil written with sucl's
# device send/recv, one GPU per rank (the `sucl` crate's example jacobi3d_sendrecv), at the same
# cells per rank.
# usage: [SUCLD=.. BENCH=.. CHECK=..] [SENDRECV=.. SUCL_BIN=..] [JACOBI_N=512 JACOBI_NZ=512 JACOBI_STEPS=20]
#        [MATMUL_NS="4096 8192"] [OUT=target/bench/remote-scale] bench/remote-scale.sh
# Builds what it needs in release when SUCLD is not given. Writes OUT/network.md, OUT/peer.md
# and OUT/remote-scale.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OUT=${OUT:-target/bench/remote-scale}
if [ -z "${SUCLD:-}" ]; then
  cargo build --release -p sucl-remote --bin sucld --example remote_bench --example remote_cuda_check
fi
scripts/remote-scale.sh
