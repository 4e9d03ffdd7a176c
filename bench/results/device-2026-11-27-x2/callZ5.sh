#!/bin/bash
# Call Z5: the shm barrier's wait written out like the inline step's (sucl-bar, an experiment on f3f9167) beside
# d651309, the final tree and its copy: 8 B-4 KiB at 16/8/2 ranks (8 rounds), 128 KiB-16 MiB at 4 ranks (6 rounds).
set -u
export NCCL_NVLS_ENABLE=0
Z=devbin/z; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } > $RES/machine.txt
B="$Z/s-d651309 $Z/sucl-final $Z/sucl-bar $Z/sucl-final-copy"
for RI in 8:20000 16:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  R=$R MINB=8 MAXB=4096 ITERS=$I ROUNDS=8 W=$RES/raw-small-$R timeout 120 $Z/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  awk '/median \/ median/{p=1} /spread over/{p=0} p' $RES/small-${R}r.md | grep -v "^$"
  tar czf $OUT/res.tgz -C $RES .
done
WARMUP=10 R=4 MINB=131072 MAXB=16777216 ITERS=100 ROUNDS=6 W=$RES/raw-large-4 timeout 200 $Z/multi.sh $B > $RES/large-4r.md; echo rc=$?
awk '/median \/ median/{p=1} /spread over/{p=0} p' $RES/large-4r.md | grep -v "^$"
tar czf $OUT/res.tgz -C $RES .
