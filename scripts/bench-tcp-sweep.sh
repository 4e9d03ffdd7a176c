#!/bin/bash
# Side by side, alternating per round: Open MPI btl tcp (2 ranks, loopback) and each given sucl binary's tcp all_reduce.
# usage: [MIN=524288 MAX=16777216 IT=40] scripts/bench-tcp-sweep.sh ROUNDS "label:ENV=VAL;path/to/sucl" ...
# Prints one line per (label, round, bytes, µs); summarize with medians per label and size.
cd "$(dirname "$0")/.."
mkdir -p target/bench && mpicc -O2 -o target/bench/mpi_ref bench/mpi/mpi_ref.c || exit 1
R=$1; shift
MIN=${MIN:-524288}; MAX=${MAX:-16777216}; IT=${IT:-40}
for r in $(seq 1 $R); do
  mpirun --allow-run-as-root --oversubscribe -n 2 --bind-to core --mca btl tcp,self --mca btl_tcp_if_include lo target/bench/mpi_ref all_reduce $MIN $MAX $IT 5 | awk -v r=$r '/^ *[0-9]/{print "mpi", r, $1, $3}'
  for v in "$@"; do
    label=${v%%:*}; rest=${v#*:}; envs=${rest%%;*}; bin=${rest#*;}
    env $envs $bin bench all_reduce --ranks 2 --backend tcp --min-bytes $MIN --max-bytes $MAX --iters $IT --warmup 5 | awk -v r=$r -v l=$label '/^ *[0-9]/{print l, r, $1, $5}'
  done
done
