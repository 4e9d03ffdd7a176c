#!/bin/bash
# Call U4 (nvidia-h200-x2): the inline step's wait with one look at every peer's line first (pass), and also
# waiting in rotated order (rot), against d651309, main at the session's start and the cap build; 8 rounds.
set -u
export NCCL_NVLS_ENABLE=0
U=devbin/u; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; } | tee $RES/machine.txt
B="$U/s0-d651309 $U/sucl-head $U/sucl-after $U/sucl-pass $U/sucl-rot"
for RI in 16:20000 8:20000 2:50000; do
  R=${RI%%:*}; I=${RI#*:}
  step small-${R}r
  R=$R MINB=8 MAXB=4096 ITERS=$I ROUNDS=8 W=$RES/raw-$R timeout 170 $U/multi.sh $B > $RES/small-${R}r.md; echo rc=$?
  sed -n '/median \/ median/,/spread/p' $RES/small-${R}r.md; pack
done
step done
