#!/bin/bash
# One call: tcp read-ahead / poll-first variants against main at the session's start and Open MPI (2 and
# 4 ranks), and shm at 16 ranks (small sizes) against d651309 and vader.
set -u
export NCCL_NVLS_ENABLE=0
T=devbin/t1; RES=$OUT/res; mkdir -p $RES
T0=$(date +%s); step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/res.tgz -C $RES . 2>/dev/null; }
{ nproc; uptime; cat /proc/sys/net/ipv4/tcp_congestion_control; mpirun --version | head -1; } | tee $RES/machine.txt
V="ra8k-poll: ra8k-nopoll:SUCL_TCP_POLL_FIRST=0 ra1k-poll:SUCL_TCP_READ_AHEAD_BYTES=1024 ra0-poll:SUCL_TCP_READ_AHEAD_BYTES=0 ra0-nopoll:SUCL_TCP_READ_AHEAD_BYTES=0,SUCL_TCP_POLL_FIRST=0"
step tcp-2r-small
BEFORE=$T/sucl-before AFTER=$T/sucl BACKEND=tcp R=2 ROUNDS=3 ITERS=5000 MINB=8 MAXB=4096 VARIANTS="$V" W=$RES/raw-2r-small timeout 120 scripts/bench-variants.sh > $RES/tcp-2r-small.md 2>&1; echo rc=$?
cat $RES/tcp-2r-small.md; pack
step tcp-2r
BEFORE=$T/sucl-before AFTER=$T/sucl BACKEND=tcp R=2 ROUNDS=3 ITERS=200 MINB=8 MAXB=16777216 VARIANTS="$V" W=$RES/raw-2r timeout 200 scripts/bench-variants.sh > $RES/tcp-2r.md 2>&1; echo rc=$?
cat $RES/tcp-2r.md; pack
step tcp-4r
BEFORE=$T/sucl-before AFTER=$T/sucl BACKEND=tcp R=4 ROUNDS=3 ITERS=2000 MINB=8 MAXB=65536 VARIANTS="ra8k-poll: ra0-nopoll:SUCL_TCP_READ_AHEAD_BYTES=0,SUCL_TCP_POLL_FIRST=0" W=$RES/raw-4r timeout 90 scripts/bench-variants.sh > $RES/tcp-4r.md 2>&1; echo rc=$?
cat $RES/tcp-4r.md; pack
step shm-16r-small
BACKENDS=shm R=16 ROUNDS=3 ITERS=3000 MAXB=4096 BEFORE=$T/sucl-d651309 AFTER=$T/sucl timeout 60 scripts/bench-before-after.sh > $RES/shm-16r-small.md 2>&1; echo rc=$?
cat $RES/shm-16r-small.md; pack
step done
