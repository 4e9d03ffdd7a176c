#!/usr/bin/env bash
# A real Slurm on this machine, and sucl's examples under its srun and sbatch: starts munged,
# slurmctld and slurmd (Debian's slurm-wlm and munge; one node, a private config, spool and
# munge socket in a temporary directory), then runs
#   - the Rust example hello_allreduce with `srun -n 4` (sucl meets through Slurm's variables),
#   - the C example crates/sucl-capi/examples/c/collectives.c (every call of the C API, checked),
#     built against libsucl installed by scripts/install-capi.sh, with `srun -n 3`,
#   - a Python all_reduce with `srun -n 2`, when a Python with the sucl package is given,
#   - the Rust example again from an sbatch script (`sbatch --wait`),
# and stops every daemon it started (by pid) and removes its files, also when a step fails.
# Needs root (slurmd runs jobs as their user, and here that is root) and the packages
# slurm-wlm and munge (installed with apt-get when missing).
# usage: scripts/slurm-check.sh [--python PYTHON_WITH_SUCL]
#   SUCL_BUILD=0 skips `cargo build` (the binaries must be in target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=""
case "${1:-}" in
  -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --python) PY="${2:?--python needs a Python interpreter}" ;;
  "") ;;
  *) echo "slurm-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurm-wlm and munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi
repo=$PWD
if [ "${SUCL_BUILD:-1}" != 0 ]; then
  cargo build -q --release -p sucl --example hello_allreduce
fi
hello="$repo/target/release/examples/hello_allreduce"
[ -x "$hello" ] || { echo "slurm-check: $hello is missing" >&2; exit 1; }

tmp=$(mktemp -d /tmp/sucl-slurm.XXXXXX)
chmod 755 "$tmp"
pids=()
# Stops one daemon this script started: SIGTERM, up to 10 s, then SIGKILL; always reaped.
stop() {
  local p=$1 st
  kill "$p" 2>/dev/null || { wait "$p" 2>/dev/null || true; return 0; }
  for _ in $(seq 100); do
    st=$(ps -o stat= -p "$p" 2>/dev/null || true)
    case "$st" in "" | Z*) break ;; esac
    sleep 0.1
  done
  kill -9 "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
# Jobs first (their steps report to slurmctld through munge), then the daemons in the reverse
# order of their start: slurmd, slurmctld, munged.
cleanup() {
  local i
  if [ -n "${SLURM_CONF:-}" ] && [ "${#pids[@]}" -ge 3 ]; then
    scancel --full --quiet "--partition=check" 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp"/{spool,state,log,munge}
host=$(hostname -s)
ncpu=8 # declared, not measured: lets 4 tasks share this machine's cores

# munged with a private socket and key (a copy of the system key, or a fresh one).
if [ -r /etc/munge/munge.key ]; then cp /etc/munge/munge.key "$tmp/munge/key"; else mungekey -c -k "$tmp/munge/key"; fi
chmod 600 "$tmp/munge/key"
munged -F --force --socket="$tmp/munge/socket" --key-file="$tmp/munge/key" --pid-file="$tmp/munge/pid" \
  --seed-file="$tmp/munge/seed" >"$tmp/log/munged.log" 2>&1 &
pids+=($!)

cat >"$tmp/slurm.conf" <<EOF
ClusterName=suclcheck
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket
CredType=cred/munge
SlurmctldPort=$((6800 + RANDOM % 100))
SlurmdPort=$((6900 + RANDOM % 100))
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$host CPUs=$ncpu State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=30 State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$tmp/slurm.conf"
for _ in $(seq 50); do [ -S "$tmp/munge/socket" ] && break; sleep 0.1; done
slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 60); do
  if sinfo -h -o '%t' 2>/dev/null | grep -q idle; then up=1; break; fi
  sleep 0.5
done
if [ "$up" != 1 ]; then
  echo "slurm-check: the node did not come up; logs:" >&2
  tail -n 20 "$tmp"/log/* >&2 || true
  exit 1
fi
sinfo
status=0
run() { # name, command...: runs one step, its output kept and shown
  local name=$1
  shift
  echo "== slurm-check: $name: $*"
  if timeout 120 "$@" >"$tmp/$name.out" 2>&1; then
    cat "$tmp/$name.out"
    echo "== $name: PASS"
  else
    cat "$tmp/$name.out"
    echo "== $name: FAIL"
    status=1
  fi
}
run rust srun -n 4 "$hello"

# The C example against the library installed as the C guide says (scripts/install-capi.sh into
# a temporary prefix, then pkg-config).
if scripts/install-capi.sh --prefix "$tmp/prefix" >"$tmp/install-capi.log" 2>&1 \
  && PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" cc -std=c11 crates/sucl-capi/examples/c/collectives.c -o "$tmp/collectives" \
    $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs sucl) -Wl,-rpath,"$tmp/prefix/lib" 2>"$tmp/cc.log"; then
  run c srun -n 3 "$tmp/collectives"
else
  tail -n 20 "$tmp/install-capi.log" "$tmp/cc.log" 2>/dev/null || true
  echo "== c: FAIL (install or compile)"
  status=1
fi

if [ -n "$PY" ]; then
  cat >"$tmp/allreduce.py" <<'EOF'
import numpy as np, sucl
comm = sucl.init()
x = np.full(4, comm.rank + 1, dtype=np.float64)
comm.all_reduce(x)
want = comm.size * (comm.size + 1) / 2
assert (x == want).all(), x
print(f"python rank {comm.rank} of {comm.size}: all_reduce ok ({x[0]})")
comm.close()
EOF
  run python srun -n 2 "$PY" "$tmp/allreduce.py"
fi

cat >"$tmp/job.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --output=$tmp/job.out
srun $hello
EOF
run sbatch sbatch --wait "$tmp/job.sh"
cat "$tmp/job.out" 2>/dev/null || true
if [ "$(grep -cE '^rank [0-3]/4 ' "$tmp/job.out" 2>/dev/null)" != 4 ]; then
  echo "== sbatch: FAIL (the job's output lacks a line from each of its 4 ranks)"
  status=1
fi

[ "$status" -eq 0 ] && echo "slurm-check: all passed" || echo "slurm-check: FAILED" >&2
exit "$status"
