#!/bin/bash
# Call W1 (nvidia-h200-x2): tcp without the drained skip (XX_NODRAIN), at 4 ranks 4-256 KiB and 2 ranks 8 B-4 KiB,
# beside the defaults and both features off; before = 073c4cc. 4 rounds, order reversed every other round.
set -u
export NCCL_NVLS_ENABLE=0
W0=devbin/w; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
V="default: nodrain:XX_NODRAIN=1 nodrain-nopoll:XX_NODRAIN=1,SUCL_TCP_POLL_FIRST=0 neither:SUCL_TCP_POLL_FIRST=0,SUCL_TCP_READ_AHEAD_BYTES=0"
BEFORE=$W0/sucl-073c4cc AFTER=$W0/sucl-xx BACKEND=tcp R=4 ROUNDS=4 ITERS=300 MINB=4096 MAXB=262144 VARIANTS="$V" \
  W=$RES/raw-4r timeout 200 scripts/bench-variants.sh > $RES/tcp-4r.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-4r.md | cut -d'|' -f1-2,13-17
tar czf $OUT/res.tgz -C $RES . 2>/dev/null
BEFORE=$W0/sucl-073c4cc AFTER=$W0/sucl-xx BACKEND=tcp R=2 ROUNDS=4 ITERS=5000 MINB=8 MAXB=4096 VARIANTS="$V" \
  W=$RES/raw-2r timeout 150 scripts/bench-variants.sh > $RES/tcp-2r.md 2>&1; echo rc=$?
grep "^|" $RES/tcp-2r.md | cut -d'|' -f1-2,13-17
tar czf $OUT/res.tgz -C $RES . 2>/dev/null
