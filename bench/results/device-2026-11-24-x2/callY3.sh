#!/bin/bash
# Call Y3 (nvidia-h200-x2): shm all_reduce 256 KiB-4 MiB against Open MPI vader at 16 and 8 ranks, 4 rounds x 200
# (Y1 had 16 ranks x 1 MiB at 1.04x vader in 2 rounds x 100; U1's sweep 0.88x). before = d651309, after = 368ec71.
set -u
export NCCL_NVLS_ENABLE=0
Y=devbin/y; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
for R in 16 8; do
  BEFORE=$Y/s0-d651309 AFTER=$Y/sucl-368ec71 BACKENDS=shm R=$R ROUNDS=4 ITERS=200 MINB=262144 MAXB=4194304 timeout 120 scripts/bench-before-after.sh > $RES/large-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/large-${R}r.md; cp -r /tmp/hostbench $RES/raw-large-${R}r
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
