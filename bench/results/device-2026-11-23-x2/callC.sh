#!/bin/bash
# Call C: host benchmarks on the 32-core host: hier vs flat tcp 2x2 (issue 9), shm before/after
# d651309 at 2 and 16 ranks (issue 8).
. devbin/x/common.sh
lscpu | grep -E "Model name|^CPU\(s\)|NUMA node"; uptime
step hier
ROUNDS=3 ITERS=100 W=/tmp/hier PROFILE=1 timeout 170 scripts/bench-hier.sh $X/sucl > $RES/hier-2x2.md 2> $RES/hier-2x2.err; echo "rc=$?"
grep -E "^\| [0-9]" $RES/hier-2x2.md | awk -F'|' '{print $2,$3,$4,$7}'
pack C
for c in 0 131072 524288; do
  step "hier chunk $c"
  SUCL_HIER_CHUNK_BYTES=$c MINB=131072 MAXB=4194304 ROUNDS=2 ITERS=100 W=/tmp/hier$c timeout 60 scripts/bench-hier.sh $X/sucl > $RES/hier-chunk-$c.md 2>/dev/null
  grep -E "^\| [0-9]" $RES/hier-chunk-$c.md | awk -F'|' '{print $2,$3,$4,$7}'
done
pack C
step shm-2r
BACKENDS=shm R=2 ROUNDS=3 ITERS=1000 MAXB=16777216 BEFORE=$X/sucl-d651309 AFTER=$X/sucl timeout 130 scripts/bench-before-after.sh > $RES/shm-2r.md 2>&1; echo "rc=$?"
head -30 $RES/shm-2r.md
pack C
step shm-16r
BACKENDS=shm R=16 ROUNDS=2 ITERS=500 MAXB=16777216 BEFORE=$X/sucl-d651309 AFTER=$X/sucl timeout 150 scripts/bench-before-after.sh > $RES/shm-16r.md 2>&1; echo "rc=$?"
head -30 $RES/shm-16r.md
pack C
step done
