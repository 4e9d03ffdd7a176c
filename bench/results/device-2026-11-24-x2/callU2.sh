#!/bin/bash
# Call U2 (nvidia-h200-x2): what in 25671bc (sound shm) costs at 16 ranks, 8-256 B; the small sizes at 8/16 ranks
# against d651309 with more iterations than the sweep.
set -u
export NCCL_NVLS_ENABLE=0
U=devbin/u; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; for f in enabled shmem_enabled; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done; df -h /dev/shm; mount | grep -E " /dev/shm " ; } | tee $RES/machine.txt
step pages-16r
R=16 MINB=8 MAXB=256 ITERS=100000 ROUNDS=4 W=$RES/raw-pages16 timeout 150 $U/multi.sh $U/s3-0c49e12 $U/s4-25671bc $U/sucl-head $U/sucl-after $U/xx-ftrunc > $RES/pages-16r.md; echo rc=$?
cat $RES/pages-16r.md; pack
for R in 16 8; do
  step small-${R}r
  R=$R MINB=8 MAXB=4096 ITERS=20000 ROUNDS=3 W=$RES/raw-small$R timeout 100 $U/multi.sh $U/s0-d651309 $U/sucl-head $U/sucl-after > $RES/small-${R}r.md; echo rc=$?
  cat $RES/small-${R}r.md; pack
done
step done
