#!/bin/bash
# Call Z1 (nvidia-h200-x2 asked for): the final tree (f3f9167) on the host CPUs, side by side in one job:
# shm all_reduce vs Open MPI vader and d651309 at 16/8/4/2 ranks (8 B-16 MiB), the 1 MiB reduction step
# at 16 ranks against 368ec71 (256 KiB steps), issue 8's small sizes against d651309 in 8 rounds,
# tcp 2 ranks vs btl tcp, hierarchical vs flat tcp on 2 posed hosts x 2.
set -u
export NCCL_NVLS_ENABLE=0
Z=devbin/z; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; lscpu | grep -E "Model name|Socket|NUMA|Core|Thread"; mpirun --version | head -1; } | tee $RES/machine.txt
for R in 16 8 4 2; do
  step sweep-${R}r
  BEFORE=$Z/s-d651309 AFTER=$Z/sucl-final BACKENDS=shm R=$R ROUNDS=2 ITERS=200 MINB=8 MAXB=16777216 timeout 110 scripts/bench-before-after.sh > $RES/sweep-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/sweep-${R}r.md | head -40; cp -r /tmp/hostbench $RES/raw-sweep-${R}r; pack
done
step step-16r
BEFORE=$Z/s-368ec71 AFTER=$Z/sucl-final BACKENDS=shm R=16 ROUNDS=4 ITERS=200 MINB=262144 MAXB=4194304 timeout 80 scripts/bench-before-after.sh > $RES/step-16r.md 2>&1; echo rc=$?
grep "^|" $RES/step-16r.md; cp -r /tmp/hostbench $RES/raw-step-16r; pack
cp $Z/sucl-final $Z/sucl-final-copy
for RI in 16:20000 8:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  step small-${R}r
  R=$R MINB=8 MAXB=4096 ITERS=$I ROUNDS=8 W=$RES/raw-small-$R timeout 100 $Z/multi.sh $Z/s-d651309 $Z/sucl-final $Z/sucl-final-copy > $RES/small-${R}r.md; echo rc=$?
  awk '/median \/ median/{p=1} /spread over/{p=0} p' $RES/small-${R}r.md | grep -v "^$"; pack
done
step tcp-2r
BEFORE=$Z/s-d651309 AFTER=$Z/sucl-final BACKENDS=tcp R=2 ROUNDS=3 ITERS=200 MINB=8 MAXB=16777216 timeout 90 scripts/bench-before-after.sh > $RES/tcp-2r.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r.md; cp -r /tmp/hostbench $RES/raw-tcp-2r; pack
step hier-2x2
ROUNDS=3 ITERS=100 W=/tmp/hier timeout 90 scripts/bench-hier.sh $Z/sucl-final > $RES/hier-2x2.md 2> $RES/hier-2x2.err; echo rc=$?
cat $RES/hier-2x2.md; cp -r /tmp/hier $RES/raw-hier; pack
step done
