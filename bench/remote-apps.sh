#!/usr/bin/env bash
# Figure remote-apps (device machine, 1+ GPUs): Jacobi 3D and a blocked matmul on GPU daemons
# (`sucld --cuda`, one per GPU, TLS), halos and blocks moved server to server, checked bit for bit
# against the same kernels run locally, and timed against them (scripts/remote-gpu-check.sh).
# usage: [SUCLD=.. CHECK=.. BENCH=..] [JACOBI_N=256] [JACOBI_NZ=256] [JACOBI_STEPS=50] [MATMUL_N=4096]
#        [OUT=target/bench/remote-gpu] bench/remote-apps.sh
# Writes OUT/apps_gpu.md, OUT/migrate_2gpu.md, OUT/noop_latency.md and OUT/remote-apps.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OUT=${OUT:-target/bench/remote-gpu} HOST_BENCH=0
mkdir -p "$OUT"
scripts/remote-gpu-check.sh
A=$OUT/apps_gpu.md
{ python3 bench/tocsv.py md "$A" --section "Jacobi 3D" --set app=jacobi3d \
    --cols "daemons,time_ms=time ms,efficiency_vs_local=efficiency vs local,wrong=#wrong"
  python3 bench/tocsv.py md "$A" --section "Blocked matmul" --no-header --set app=matmul \
    --cols "daemons,time ms,efficiency vs local,#wrong"; } | tee "$OUT/remote-apps.csv"
