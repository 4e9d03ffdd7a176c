#!/bin/bash
# Call U3 (nvidia-h200-x2): shm all_reduce 8 B-4 KiB, d651309 (issue 8's before) vs main at the session's start,
# the one-step cap, the same build twice (the noise floor) and a build without the control-block asserts; 8 rounds.
set -u
export NCCL_NVLS_ENABLE=0
U=devbin/u; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; } | tee $RES/machine.txt
B="$U/s0-d651309 $U/sucl-head $U/sucl-after $U/sucl-after2 $U/sucl-nochk"
for RI in 8:20000 16:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  step small-${R}r
  R=$R MINB=8 MAXB=4096 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $U/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  cat $RES/small-${R}r.md; pack
done
step done
