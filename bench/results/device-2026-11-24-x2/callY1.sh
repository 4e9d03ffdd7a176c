#!/bin/bash
# Call Y1 (nvidia-h200-x2): issue 8's before/after with the session's final code: d651309 (before) vs 368ec71 (after)
# vs Open MPI vader, shm all_reduce; 8 B-64 KiB at 2, 8 and 16 ranks (4 rounds x 5000), 128 KiB-16 MiB at 16 ranks.
set -u
export NCCL_NVLS_ENABLE=0
Y=devbin/y; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
for R in 16 8 2; do
  BEFORE=$Y/s0-d651309 AFTER=$Y/sucl-368ec71 BACKENDS=shm R=$R ROUNDS=4 ITERS=5000 MINB=8 MAXB=65536 timeout 120 scripts/bench-before-after.sh > $RES/small-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/small-${R}r.md; cp -r /tmp/hostbench $RES/raw-small-${R}r
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
BEFORE=$Y/s0-d651309 AFTER=$Y/sucl-368ec71 BACKENDS=shm R=16 ROUNDS=2 ITERS=100 MINB=131072 MAXB=16777216 timeout 120 scripts/bench-before-after.sh > $RES/large-16r.md 2>&1; echo rc=$?
grep "^|" $RES/large-16r.md; cp -r /tmp/hostbench $RES/raw-large-16r
tar czf $OUT/res.tgz -C $RES . 2>/dev/null
