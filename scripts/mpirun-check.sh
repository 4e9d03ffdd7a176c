#!/usr/bin/env bash
# Runs README's "mpirun across hosts" command line for real on this one machine, with Open MPI:
# the line is taken from README.md, with `node1:8,node2:8` replaced by two names of this host
# (2 slots each) and -np 16 by -np 4. Then the same program as 4 ranks that each get a host name
# of their own (`unshare --uts`, where permitted) while the launcher's variables say 2 hosts and
# no MASTER_ADDR is set, so that the ranks can meet only over MPI, as across real hosts.
# Needs: cargo build --release -p sucl --features mpi --example hello_allreduce
# Logs: target/bench/launchers/mpirun_*.txt (LOGS=dir to change). Exit 1 and a FAIL line on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${LOGS:-target/bench/launchers}
HELLO=target/release/examples/hello_allreduce
mkdir -p "$LOGS"
[ -x "$HELLO" ] || { echo "mpirun-check: FAIL: build $HELLO first (see the top of this script)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SUCL_TIMEOUT=${SUCL_TIMEOUT:-60}
unset MASTER_ADDR MASTER_PORT SUCL_STORE_ADDR
status=0
H=$(hostname)
line=$(grep -m1 '^mpirun -np 16 --host node1:8,node2:8' README.md) || { echo "mpirun-check: FAIL: README has no mpirun line" >&2; exit 1; }
cmd=$(printf '%s' "$line" | sed -e 's/-np 16/-np 4/' -e "s/node1:8,node2:8/$H:2,localhost:2/")
# check LOG: 4 ranks said the right sum, and the job ended well.
check() {
  local log=$1 rc=$2
  local good
  good=$(grep -c '^rank [0-3]/4 via .*: sum 6 (my half has 2 ranks)' "$log")
  if [ "$rc" = 0 ] && [ "$good" = 4 ]; then echo "mpirun-check: ok: $log"; else echo "mpirun-check: FAIL: $log (exit $rc, $good of 4 ranks right)" >&2; status=1; fi
}
{ date -u; echo "\$ $cmd"; } >"$LOGS/mpirun_readme.txt"
timeout 120 sh -c "$cmd" >>"$LOGS/mpirun_readme.txt" 2>&1
check "$LOGS/mpirun_readme.txt" $?

if unshare --uts true 2>/dev/null; then
  wrap='export OMPI_COMM_WORLD_LOCAL_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_MCA_orte_num_nodes=2
exec unshare --uts sh -c '\''hostname "fakehost$OMPI_COMM_WORLD_RANK" && exec "$@"'\'' sh "$@"'
  { date -u; echo "\$ mpirun -np 4 sh -c '<own host name per rank; launcher says 2 hosts>' $HELLO"; } >"$LOGS/mpirun_own_host_names.txt"
  timeout 120 mpirun --oversubscribe -np 4 sh -c "$wrap" sh "$HELLO" >>"$LOGS/mpirun_own_host_names.txt" 2>&1
  check "$LOGS/mpirun_own_host_names.txt" $?
  # Different host names: no shared memory between the ranks, whatever the selection.
  [ "$(grep -c ' via shm' "$LOGS/mpirun_own_host_names.txt")" = 0 ] \
    || { echo "mpirun-check: FAIL: ranks with different host names used shm" >&2; status=1; }
else
  echo "mpirun-check: skipped the own-host-names run: unshare --uts is not permitted here"
fi
exit $status
