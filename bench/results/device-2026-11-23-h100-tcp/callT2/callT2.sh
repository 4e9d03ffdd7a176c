#!/bin/bash
# Second call: the chosen tcp defaults (read-ahead 8K, poll first from 2 peer sockets) against main at the
# session's start, no read-ahead, and no poll; 2, 4 and 8 ranks; order reversed every other round.
set -u
export NCCL_NVLS_ENABLE=0
T=devbin/t2; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; cat /proc/sys/net/ipv4/tcp_congestion_control; mpirun --version | head -1; } | tee $RES/machine.txt
step tcp-2r-small
BEFORE=$T/sucl-before AFTER=$T/sucl R=2 ROUNDS=4 ITERS=5000 MINB=8 MAXB=4096 VARIANTS="default: ra0:SUCL_TCP_READ_AHEAD_BYTES=0" W=$RES/raw-2r-small timeout 100 scripts/bench-variants.sh > $RES/tcp-2r-small.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r-small.md; pack
step tcp-2r
BEFORE=$T/sucl-before AFTER=$T/sucl R=2 ROUNDS=4 ITERS=200 MINB=8 MAXB=16777216 VARIANTS="default: ra0:SUCL_TCP_READ_AHEAD_BYTES=0" W=$RES/raw-2r timeout 150 scripts/bench-variants.sh > $RES/tcp-2r.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r.md; pack
for R in 4 8; do
  step tcp-${R}r
  BEFORE=$T/sucl-before AFTER=$T/sucl R=$R ROUNDS=3 ITERS=1000 MINB=8 MAXB=65536 VARIANTS="default: nopoll:SUCL_TCP_POLL_FIRST=0" W=$RES/raw-${R}r timeout 100 scripts/bench-variants.sh > $RES/tcp-${R}r.md 2>&1; echo rc=$?
  grep "^|" $RES/tcp-${R}r.md; pack
done
step done
