#!/bin/bash
# Call Y2 (nvidia-h200-x2): the final code (368ec71, and the same file again as a noise floor) against d651309,
# shm all_reduce 8 B-4 KiB at 16, 8 and 2 ranks, 8 rounds, order reversed every other round.
set -u
export NCCL_NVLS_ENABLE=0
Y=devbin/y; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
B="$Y/s0-d651309 $Y/sucl-368ec71 $Y/sucl-368ec71-copy"
for RI in 16:20000 8:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  R=$R MINB=8 MAXB=4096 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $Y/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  awk '/median \/ median/{p=1} /spread over/{p=0} p' $RES/small-${R}r.md | grep -v "^$"
  tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
