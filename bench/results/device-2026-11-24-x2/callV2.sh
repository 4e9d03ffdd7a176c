#!/bin/bash
# Call V2 (nvidia-h200-x2): tcp all_reduce at 4 ranks, 4 KiB-2 MiB, main before the read-ahead work (073c4cc)
# against now with each of read-ahead and poll-first switched off; 4 rounds, order reversed every other round.
set -u
export NCCL_NVLS_ENABLE=0
V=devbin/v; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
for R in 4 8; do
BEFORE=$V/sucl-073c4cc AFTER=$V/sucl-final BACKEND=tcp R=$R ROUNDS=4 ITERS=200 MINB=4096 MAXB=2097152 \
  VARIANTS="default: nopoll:SUCL_TCP_POLL_FIRST=0 ra0:SUCL_TCP_READ_AHEAD_BYTES=0 neither:SUCL_TCP_POLL_FIRST=0,SUCL_TCP_READ_AHEAD_BYTES=0" \
  W=$RES/raw-tcp-${R}r timeout 200 scripts/bench-variants.sh > $RES/tcp-${R}r-mid.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-${R}r-mid.md
tar czf $OUT/res.tgz -C $RES . 2>/dev/null
done
