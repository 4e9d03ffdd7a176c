#!/bin/bash
# Call U1 (nvidia-h200-x2, 32 CPUs): the 16-rank small-size shm bisect, the one-step cap (1.5x) before/after
# vs vader at 4/8/16 ranks, a full shm sweep after vs vader at 2/4/8/16 ranks, tcp 2 ranks vs btl tcp.
set -u
export NCCL_NVLS_ENABLE=0
U=devbin/u; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; lscpu | grep -E "Model name|Socket|NUMA|Core|Thread"; numactl -H 2>/dev/null | head -4; cat /proc/sys/net/ipv4/tcp_congestion_control; mpirun --version | head -1; } | tee $RES/machine.txt
BIS="$U/s0-d651309 $U/s1-bd729fb $U/s-211a8e8 $U/s-fdc5f82 $U/s2-702ea9d $U/s3-0c49e12 $U/s4-25671bc $U/s5-3ecef04 $U/sucl-head"
step bisect-16r
R=16 MINB=8 MAXB=256 ITERS=100000 ROUNDS=3 W=$RES/raw-bis16 timeout 150 $U/multi.sh $BIS > $RES/bisect-16r.md; echo rc=$?
cat $RES/bisect-16r.md; pack
for R in 16 8 4; do
  step cap-${R}r
  BEFORE=$U/sucl-head AFTER=$U/sucl-after BACKENDS=shm R=$R ROUNDS=3 ITERS=2000 MINB=256 MAXB=65536 timeout 80 scripts/bench-before-after.sh > $RES/cap-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/cap-${R}r.md; cp -r /tmp/hostbench $RES/raw-cap-${R}r; pack
done
for R in 16 8 4 2; do
  step sweep-${R}r
  BEFORE=$U/sucl-head AFTER=$U/sucl-after BACKENDS=shm R=$R ROUNDS=2 ITERS=200 MINB=8 MAXB=16777216 timeout 100 scripts/bench-before-after.sh > $RES/sweep-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/sweep-${R}r.md; cp -r /tmp/hostbench $RES/raw-sweep-${R}r; pack
done
step tcp-2r-small
BEFORE=$U/sucl-073c4cc AFTER=$U/sucl-after BACKEND=tcp R=2 ROUNDS=4 ITERS=5000 MINB=8 MAXB=4096 VARIANTS="default:" W=$RES/raw-tcp-2r-small timeout 70 scripts/bench-variants.sh > $RES/tcp-2r-small.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r-small.md; pack
step tcp-2r
BEFORE=$U/sucl-073c4cc AFTER=$U/sucl-after BACKEND=tcp R=2 ROUNDS=3 ITERS=200 MINB=8 MAXB=16777216 VARIANTS="default:" W=$RES/raw-tcp-2r timeout 90 scripts/bench-variants.sh > $RES/tcp-2r.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r.md; pack
step done
