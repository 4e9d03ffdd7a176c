#!/bin/bash
# Call Z3 (same machine as Z1-Z2): Z1's fixed-order sweep had the final build 1.03-1.11x d651309 at 2 and 4 ranks
# from 128 KiB up. The same sizes with the order reversed every other round (multi.sh), 6 rounds x 100 calls,
# with the final file run twice as a noise floor.
set -u
export NCCL_NVLS_ENABLE=0
Z=devbin/z; RES=$OUT/res; mkdir -p $RES
for R in 2 4; do
  WARMUP=10 R=$R MINB=131072 MAXB=16777216 ITERS=100 ROUNDS=6 W=$RES/raw-large-$R timeout 250 $Z/multi.sh $Z/s-d651309 $Z/sucl-final $Z/sucl-final-copy > $RES/large-${R}r.md; echo rc=$?
  cat $RES/large-${R}r.md
  tar czf $OUT/res.tgz -C $RES .
done
