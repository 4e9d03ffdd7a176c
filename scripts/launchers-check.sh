#!/usr/bin/env bash
# Launchers check, for the device machine (torch and torchrun installed; no GPU is used): sucl
# programs started by real torchrun, with no sucl-specific variable, rendezvous through the
# agent's c10d store. Host backends only. Fails loudly (exit 1, a FAIL line) if any run or rank fails.
#
# Needs, built in release:  cargo build --release -p sucl-cli --bin sucl
#                           cargo build --release -p sucl --example hello_allreduce --example ping_pong
# usage: [OUT=dir] [TORCHRUN=torchrun] scripts/launchers-check.sh
# Logs go to target/bench/launchers/ (LOGS=dir to change) and are copied into $OUT when it is set.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export SUCL_TIMEOUT=${SUCL_TIMEOUT:-60}
# Host backends only: no device backend is loaded for these host-memory programs.
export SUCL_BACKENDS=shm,tcp
SUCL=${SUCL:-target/release/sucl}
HELLO=${HELLO:-target/release/examples/hello_allreduce}
PING=${PING:-target/release/examples/ping_pong}
LOGS=${LOGS:-target/bench/launchers}
if [ -z "${TORCHRUN:-}" ]; then
  if command -v torchrun >/dev/null; then TORCHRUN=torchrun; else TORCHRUN="python3 -m torch.distributed.run"; fi
fi
mkdir -p "$LOGS"
status=0
fail() { echo "launchers-check: FAIL: $*" | tee -a "$LOGS/summary.txt" >&2; status=1; }
pass() { echo "launchers-check: ok: $*" | tee -a "$LOGS/summary.txt"; }
: >"$LOGS/summary.txt"
# Whatever happens, the logs reach $OUT.
copy_out() { if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp -r "$LOGS"/. "$OUT"/; fi; }
trap copy_out EXIT
for b in "$SUCL" "$HELLO" "$PING"; do
  [ -x "$b" ] || { fail "$b is not built (see the usage lines at the top of this script)"; exit 1; }
done
{ date -u; uname -a; $TORCHRUN --help >/dev/null 2>&1 && python3 -c 'import torch; print("torch", torch.__version__)'; } >"$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"
FREE_PORT="$(cd "$(dirname "$0")" && pwd)/free_port.py"
port() { python3 "$FREE_PORT"; }

# run NAME EXPECTED_LINES_REGEX EXPECTED_COUNT -- torchrun args...: one torchrun job, bounded.
run() {
  local name=$1 pattern=$2 want=$3; shift 4
  local log="$LOGS/$name.txt"
  echo "+ $TORCHRUN $*" >"$log"
  timeout 180 $TORCHRUN "$@" >>"$log" 2>&1
  local rc=$?
  local got; got=$(grep -cE "$pattern" "$log")
  if [ $rc -ne 0 ]; then fail "$name: torchrun exited with $rc (see $log)"; tail -n 30 "$log" >&2
  elif [ "$got" -ne "$want" ]; then fail "$name: $got lines match /$pattern/, want $want (see $log)"; tail -n 30 "$log" >&2
  else pass "$name ($got matching lines)"; fi
}

# 1. The plain command: torchrun's default static rendezvous, the agent listening on MASTER_PORT.
run hello_2 "rank [01]/2 via .*: sum 1 " 2 -- --nproc_per_node 2 --master_port "$(port)" --no-python "$HELLO"
run hello_4_tcp "rank [0-3]/4 via tcp: sum 6 " 4 -- --nproc_per_node 4 --master_port "$(port)" --no-python env SUCL_BACKEND=tcp "$HELLO"
run ping_pong_2 " B  one-way .* via " 4 -- --nproc_per_node 2 --master_port "$(port)" --no-python "$PING"
# 2. The whole correctness matrix under torchrun, over shm and over tcp.
for be in shm tcp; do
  run "check_3_$be" "checks, 0 wrong" 1 -- --nproc_per_node 3 --master_port "$(port)" --no-python env SUCL_BACKEND=$be "$SUCL" check
done
# 3. --standalone: c10d rendezvous; MASTER_ADDR/MASTER_PORT name the agent's separate store.
run hello_standalone "rank [01]/2 via .*: sum 1 " 2 -- --standalone --nproc_per_node 2 --no-python "$HELLO"
# 4. Two "nodes" on this machine: two agents, static rendezvous, node 1 joining node 0's store.
#    The ranks span two groups, so rank 0 advertises a non-loopback address of this machine.
p=$(port)
for node in 0 1; do
  timeout 180 $TORCHRUN --nnodes 2 --node_rank $node --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$p" \
    --no-python "$HELLO" >"$LOGS/two_nodes_$node.txt" 2>&1 &
  pids[$node]=$!
done
for node in 0 1; do
  wait "${pids[$node]}"; rc=$?
  [ $rc -eq 0 ] || { fail "two_nodes: node $node's torchrun exited with $rc (see $LOGS/two_nodes_$node.txt)"; tail -n 30 "$LOGS/two_nodes_$node.txt" >&2; }
done
got=$(cat "$LOGS"/two_nodes_[01].txt | grep -cE "rank [0-3]/4 via .*: sum 6 ")
[ "$got" -eq 4 ] && pass "two_nodes (4 ranks over 2 agents)" || fail "two_nodes: $got of 4 ranks reported the right sum"
# 5. A failing rank fails the job: torchrun must exit non-zero and sucl must name the lost rank.
log="$LOGS/lost_rank.txt"
timeout 180 $TORCHRUN --nproc_per_node 3 --master_port "$(port)" --no-python "$SUCL" check --ops all_reduce --dtypes f32 \
  --inject-exit 1 --inject-after 4 >"$log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then fail "lost_rank: torchrun exited 0 although rank 1 exited"
elif ! grep -qE "lost peer rank 1|rank +: 1 \(local_rank" "$log"; then fail "lost_rank: no rank named the lost rank 1 (see $log)"
else pass "lost_rank (torchrun exited $rc, rank 1 named)"; fi

[ $status -eq 0 ] && echo "launchers-check: PASS" || echo "launchers-check: FAIL"
exit $status
