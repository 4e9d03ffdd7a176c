#!/usr/bin/env bash
# Before/after host benchmark: two sucl builds (BEFORE, AFTER) and Open MPI (vader, tcp), alternating
# per round, all_reduce f32 at R ranks. usage: BEFORE=old/sucl AFTER=new/sucl scripts/bench-before-after.sh
# BACKENDS="tcp" limits it to some backends; MINB/MAXB the sizes.
set -uo pipefail
R=${R:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-200}; MINB=${MINB:-8}; MAXB=${MAXB:-16777216}; BACKENDS=${BACKENDS:-shm tcp}
W=/tmp/hostbench; rm -rf $W; mkdir -p $W
mpicc -O2 -o $W/mpi_ref bench/mpi/mpi_ref.c || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -n "$R" --bind-to core)
for round in $(seq 1 $ROUNDS); do
  for be in $BACKENDS; do
    if [ $be = shm ]; then btl=(--mca btl self,vader); else btl=(--mca btl tcp,self --mca btl_tcp_if_include lo); fi
    "${MPIRUN[@]}" "${btl[@]}" $W/mpi_ref all_reduce "$MINB" "$MAXB" "$ITERS" 20 >$W/mpi-$be-$round.txt 2>&1
    for v in before after; do
      b=${AFTER:-target/release/sucl}; [ $v = before ] && b=${BEFORE:?set BEFORE to the old sucl binary}
      timeout 300 $b bench all_reduce --ranks "$R" --backend $be --min-bytes "$MINB" --max-bytes "$MAXB" --iters "$ITERS" --warmup 20 --json >$W/$v-$be-$round.jsonl 2>$W/$v-$be-$round.err
    done
  done
done
BACKENDS="$BACKENDS" python3 scripts/beforeafter.py $W "$ROUNDS" "$R" "$(mpirun --version | head -1)"
