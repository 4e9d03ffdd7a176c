#!/bin/bash
# Call X1 (nvidia-h200-x2): the 16-rank small-size cost, three more candidates built on 58dbc99: the inline wait
# written as d651309's (oldwait), no settings agreement at init (noagree), both plus no control-block asserts (all).
set -u
export NCCL_NVLS_ENABLE=0
X=devbin/x2; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
B="$X/s0-d651309 $X/sucl-final $X/sucl-oldwait $X/sucl-noagree $X/sucl-all"
for RI in 16:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  R=$R MINB=8 MAXB=1024 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $X/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  sed -n '/^| bytes/,/^$/p' $RES/small-${R}r.md | head -12; sed -n '/median \/ median/,/spread/p' $RES/small-${R}r.md
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
