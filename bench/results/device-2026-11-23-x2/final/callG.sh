#!/bin/bash
# Call G: where the ipc all_reduce should switch to two-shot: 1 MiB (default) vs 2 MiB, rounds alternated.
export NCCL_NVLS_ENABLE=0
mkdir -p $OUT/g
for r in 1 2 3; do for t in 1048576 2097152; do
  SUCL_IPC_TWO_SHOT_BYTES=$t timeout 40 devbin/z3/sucl bench all_reduce --device cuda --ranks 2 --compare nccl,ipc --min-bytes 262144 --max-bytes 4M --factor 2 --rounds 2 --iters 200 --warmup 20 > $OUT/g/t$t-$r.txt 2>&1
  echo "two-shot from $t, round $r:"; grep -E "^ +[0-9]" $OUT/g/t$t-$r.txt
done; done
