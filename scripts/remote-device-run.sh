#!/usr/bin/env bash
# One device-machine run of the remote figures (4 GPUs, root), from stripped binaries in BIN:
#   1. Jacobi 3D weak scaling, 512³ f32 per GPU, 20 steps: remote daemons through peer memory
#      (scripts/remote-scale.sh, PATHS=auto, no matmul) beside the same stencil written with
#      sucl's device send/recv on 1, 2, 4 ranks (jacobi3d_sendrecv), one CSV of both;
#   2. host daemons in network namespaces joined by veth (bench/remote-host-netns.sh), where
#      `ip netns` works (else it says why and skips): the default sizes, then larger blocks.
# Writes RESULTS/log.txt and RESULTS/remote-scale.csv; every step is bounded by `timeout`.
# usage: BIN=dir SCRIPTS=dir RESULTS=dir scripts/remote-device-run.sh
#        (BIN: sucld remote_bench remote_cuda_check sucl jacobi3d_sendrecv; SCRIPTS: remote-scale.sh
#         remote-host-netns.sh)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BIN=$(cd "${BIN:?}" && pwd); SCRIPTS=$(cd "${SCRIPTS:?}" && pwd)
mkdir -p "${RESULTS:?}"; RESULTS=$(cd "$RESULTS" && pwd)
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

# bounded SECS CMD...: runs CMD in a process group of its own; after SECS seconds the whole
# group gets TERM (the scripts' traps stop their daemons and namespaces), 5 s later KILL.
bounded() {
  local secs=$1 pid rc; shift
  setsid "$@" &
  pid=$!
  if ! timeout "$secs" tail --pid="$pid" -f /dev/null; then
    echo "bounded: $* ran past ${secs} s: stopped" >&2
    kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null
  fi
  wait "$pid"; rc=$?
  return $rc
}
{
  date -u; nvidia-smi -L; nproc
  echo "== 1. Jacobi 3D 512^3 f32 per GPU, weak scaling: remote daemons (peer memory) and device send/recv"
  t=$SECONDS
  SUCLD=$BIN/sucld BENCH=$BIN/remote_bench CHECK=$BIN/remote_cuda_check SENDRECV=$BIN/jacobi3d_sendrecv SUCL_BIN=$BIN/sucl \
    OUT=$WORK/scale PATHS=auto MATMUL_NS="" bounded 80 bash "$SCRIPTS/remote-scale.sh"
  echo "remote-scale: exit $? after $((SECONDS - t)) s"
  cp "$WORK/scale/remote-scale.csv" "$RESULTS/remote-scale.csv" 2>/dev/null
  echo "-- reference stderr"; tail -n 30 "$WORK/scale/reference.err" 2>/dev/null
  echo "-- check"; tail -n 5 "$WORK/scale/check.txt" 2>/dev/null
  for f in "$WORK"/scale/sucld-*.log; do echo "-- $f"; grep -iE "error|warn|panic" "$f" | tail -n 5; done
  echo "== 2. host daemons in network namespaces (veth), Jacobi 3D f64 weak + matmul f64"
  t=$SECONDS
  probe=sucl-probe-$$; probe_br=spb$(($$ % 100000))
  if ! command -v ip >/dev/null; then
    echo "remote-host-netns: skipped: no \`ip\` command on this machine"
  elif [ "$(id -u)" != 0 ]; then
    echo "remote-host-netns: skipped: not root"
  elif ! ip netns add "$probe" 2>&1 || ! ip link add "$probe_br" type bridge 2>&1; then
    ip netns del "$probe" 2>/dev/null
    echo "remote-host-netns: skipped: network namespaces or bridges cannot be made here"
  else
    ip link del "$probe_br"; ip netns del "$probe"
    # The sizes measured before on a 2-core machine, then larger blocks (more compute per halo).
    SUCLD=$BIN/sucld BENCH=$BIN/remote_bench OUT=$WORK/netns DAEMONS=4 bounded 12 bash "$SCRIPTS/remote-host-netns.sh"
    echo "remote-host-netns: exit $? after $((SECONDS - t)) s"
    t=$SECONDS
    SUCLD=$BIN/sucld BENCH=$BIN/remote_bench OUT=$WORK/netns-large DAEMONS=4 JACOBI_N=256 JACOBI_NZ=128 MATMUL_N=960 \
      bounded 15 bash "$SCRIPTS/remote-host-netns.sh"
    echo "remote-host-netns (256^2x128, matmul 960): exit $? after $((SECONDS - t)) s"
  fi
  date -u
} >"$RESULTS/log.txt" 2>&1
