#!/bin/bash
# Call Z4 (same machine as Z1-Z3): the mpi backend of the final tree (built here with --features mpi against
# Debian's Open MPI 4.1.4, libmpi.so.40; run under the device's Open MPI 4.1.6) against MPI called directly,
# 2 ranks, 8 B-16 MiB, 5 interleaved rounds: scripts/bench-mpi-backend.sh.
set -u
export NCCL_NVLS_ENABLE=0
RES=$OUT/res; mkdir -p $RES
SUCL=devbin/z/sucl-mpi ITERS=50 MINB=8 MAXB=16M TAG=-z timeout 500 scripts/bench-mpi-backend.sh 5 "all_reduce broadcast all_gather" > $RES/mpi-backend.log 2>&1; echo rc=$?
cp bench/results/mpi-backend-2r-z.md $RES/ 2>/dev/null; cp -r bench/results/raw-mpi-backend-2r-z $RES/ 2>/dev/null
grep -E "^#|^\| [0-9]" $RES/mpi-backend-2r-z.md | awk -F'|' '/^#/{print; next} {print $2,$3,$4,$6,$7,$8,$10}'
tail -5 $RES/mpi-backend.log
tar czf $OUT/res.tgz -C $RES .
