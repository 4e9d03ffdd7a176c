#!/bin/bash
# Call V1 (nvidia-h200-x2): hierarchical vs flat tcp all_reduce, 2 posed hosts x 2 ranks, main before the tcp
# read-ahead work (073c4cc) and now (58dbc99), 4 alternating rounds.
set -u
export NCCL_NVLS_ENABLE=0
V=devbin/v; RES=$OUT/res; mkdir -p $RES
{ nproc; uptime; } | tee $RES/machine.txt
ROUNDS=4 ITERS=100 W=/tmp/hier timeout 300 scripts/bench-hier.sh $V/sucl-073c4cc $V/sucl-final > $RES/hier-2x2.md 2> $RES/hier-2x2.err; echo "rc=$?"
cat $RES/hier-2x2.md
tar czf $OUT/res.tgz -C $RES . /tmp/hier 2>/dev/null
