#!/usr/bin/env bash
# Settings side by side: Open MPI, a BEFORE sucl build and the AFTER build under each of VARIANTS
# (environment settings), all_reduce f32 at R ranks on one backend; the order reverses every other round.
# usage: BEFORE=old/sucl AFTER=new/sucl BACKEND=tcp VARIANTS="ra8k:SUCL_TCP_READ_AHEAD_BYTES=8K ra0:SUCL_TCP_READ_AHEAD_BYTES=0,SUCL_TCP_POLL_FIRST=0" \
#        scripts/bench-variants.sh > table.md     (R, ROUNDS, ITERS, MINB, MAXB (plain bytes) as in bench-before-after.sh)
set -uo pipefail
R=${R:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-200}; MINB=${MINB:-8}; MAXB=${MAXB:-16777216}; BACKEND=${BACKEND:-tcp}
VARIANTS=${VARIANTS:-default:}
W=${W:-/tmp/variants}; rm -rf "$W"; mkdir -p "$W"
mpicc -O2 -o "$W/mpi_ref" bench/mpi/mpi_ref.c || exit 1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -n "$R" --bind-to core)
if [ "$BACKEND" = shm ]; then btl=(--mca btl self,vader); else btl=(--mca btl tcp,self --mca btl_tcp_if_include lo); fi
for round in $(seq 1 "$ROUNDS"); do
  "${MPIRUN[@]}" "${btl[@]}" "$W/mpi_ref" all_reduce "$MINB" "$MAXB" "$ITERS" 20 >"$W/mpi-$round.txt" 2>&1
  run() { timeout 300 env $2 "$1" bench all_reduce --ranks "$R" --backend "$BACKEND" --min-bytes "$MINB" --max-bytes "$MAXB" \
            --iters "$ITERS" --warmup 20 --json >"$3.jsonl" 2>"$3.err"; }
  # Odd rounds run before first and the variants in order, even rounds the reverse: no choice
  # always runs right after MPI or always last.
  order="before $VARIANTS"
  [ $((round % 2)) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    if [ "$v" = before ]; then run "${BEFORE:?set BEFORE to the old sucl binary}" "" "$W/before-$round"; continue; fi
    name=${v%%:*}; envs=${v#*:}
    run "${AFTER:?set AFTER to the new sucl binary}" "${envs//,/ }" "$W/$name-$round"
  done
done
python3 scripts/variants_table.py "$W" "$ROUNDS" "$R" "$BACKEND" "$(mpirun --version | head -1)" "$VARIANTS"
