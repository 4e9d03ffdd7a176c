#!/bin/bash
# Call X4 (nvidia-h200-x2): the wait as an explicit loop (A, twice: A2) or through shm_sync::wait_until inlined always (B),
# beside d651309, 58dbc99 (final) and oldwait; 2, 8 and 16 ranks, 8 rounds.
set -u
export NCCL_NVLS_ENABLE=0
X=devbin/x2; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
B="$X/s0-d651309 $X/sucl-final $X/sucl-oldwait $X/sucl-A $X/sucl-A2 $X/sucl-B"
for RI in 16:20000 8:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  R=$R MINB=8 MAXB=1024 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $X/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  sed -n '/^| bytes/,/^$/p' $RES/small-${R}r.md | head -12; sed -n '/median \/ median/,/spread/p' $RES/small-${R}r.md
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
