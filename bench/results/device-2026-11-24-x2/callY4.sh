#!/bin/bash
# Call Y4 (nvidia-h200-x2): shm all_reduce 512 KiB-4 MiB at 16 ranks, the pipeline chunk (SUCL_SHM_CHUNK_BYTES) from
# 64 KiB to 1 MiB against the 256 KiB default, d651309 and Open MPI vader; 3 rounds x 200, order reversed every other round.
set -u
export NCCL_NVLS_ENABLE=0
Y=devbin/y; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
BEFORE=$Y/s0-d651309 AFTER=$Y/sucl-368ec71 BACKEND=shm R=16 ROUNDS=3 ITERS=200 MINB=524288 MAXB=4194304 \
  VARIANTS="default: c64k:SUCL_SHM_CHUNK_BYTES=64K c128k:SUCL_SHM_CHUNK_BYTES=128K c512k:SUCL_SHM_CHUNK_BYTES=512K c1m:SUCL_SHM_CHUNK_BYTES=1M" \
  W=$RES/raw timeout 150 scripts/bench-variants.sh > $RES/chunk-16r.md 2>&1; echo rc=$?
grep "^|" $RES/chunk-16r.md
tar czf $OUT/res.tgz -C $RES . 2>/dev/null
