#!/usr/bin/env bash
# Before/after host benchmark: two sucl builds (BEFORE, AFTER) and Open MPI (vader, tcp), alternating
# per round, all_reduce f32 at R ranks. usage: BEFORE=old/sucl AFTER=new/sucl scripts/bench-before-after.sh
set -uo pipefail
R=${R:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-200}; MAXB=${MAXB:-16777216}
W=/tmp/hostbench; rm -rf $W; mkdir -p $W
mpicc -O2 -o $W/mpi_ref bench/mpi/mpi_ref.c || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -n "$R" --bind-to core)
for round in $(seq 1 $ROUNDS); do
  for be in shm tcp; do
    if [ $be = shm ]; then btl=(--mca btl self,vader); else btl=(--mca btl tcp,self --mca btl_tcp_if_include lo); fi
    "${MPIRUN[@]}" "${btl[@]}" $W/mpi_ref all_reduce 8 "$MAXB" "$ITERS" 20 >$W/mpi-$be-$round.txt 2>&1
    for v in before after; do
      b=${AFTER:-target/release/sucl}; [ $v = before ] && b=${BEFORE:?set BEFORE to the old sucl binary}
      timeout 300 $b bench all_reduce --ranks "$R" --backend $be --min-bytes 8 --max-bytes "$MAXB" --iters "$ITERS" --warmup 20 --json >$W/$v-$be-$round.jsonl 2>$W/$v-$be-$round.err
    done
  done
done
python3 scripts/beforeafter.py $W "$ROUNDS" "$R" "$(mpirun --version | head -1)"
