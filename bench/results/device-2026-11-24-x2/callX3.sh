#!/bin/bash
# Call X3 (nvidia-h200-x2): the change as committed (new, and the same file again as new2) beside d651309, 58dbc99
# (final) and the oldwait experiment; 2, 4, 8 and 16 ranks, 8 rounds.
set -u
export NCCL_NVLS_ENABLE=0
X=devbin/x2; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
B="$X/s0-d651309 $X/sucl-final $X/sucl-oldwait $X/sucl-new $X/sucl-new2"
for RI in 16:20000 8:20000 4:30000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  R=$R MINB=8 MAXB=1024 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $X/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  sed -n '/^| bytes/,/^$/p' $RES/small-${R}r.md | head -12; sed -n '/median \/ median/,/spread/p' $RES/small-${R}r.md
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
