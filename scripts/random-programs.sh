#!/usr/bin/env bash
# Random programs of stream-queue operations (crates/sucl-stream/tests/random_programs.rs) over
# many seeds: each transport's programs, steps and failures. A failing seed is shrunk to the
# smallest failing program, printed and written to target/random-program-failure.json.
#
# Usage: scripts/random-programs.sh [--seeds A..B] [--transports shm,tcp,mpi] [--ranks N]
#   --seeds       seed range (default 0..2000)
#   --transports  comma-separated (default shm,tcp, and mpi where mpirun exists)
#   --ranks       run every seed at N ranks (default: seeds cycle through 2, 3 and 4)
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=0..2000
transports=shm,tcp
command -v mpirun >/dev/null && transports=shm,tcp,mpi
ranks=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --transports) transports=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
features=""
case ",$transports," in *,mpi,*) features="--features mpi" ;; esac
# shellcheck disable=SC2086
cargo test -q --release -p sucl-stream $features --test random_programs --no-run
status=0
for t in ${transports//,/ }; do
  start=$(date +%s)
  # shellcheck disable=SC2086
  if ! SUCL_RP_SEEDS=$seeds SUCL_RP_CHUNK=50 SUCL_RP_KEEP_GOING=1 ${ranks:+SUCL_RP_RANKS=$ranks} \
      cargo test -q --release -p sucl-stream $features --test random_programs "random_programs_$t" -- --exact --nocapture 2>&1 \
      | grep -E "random programs over|failing seeds|random program seed|smallest failing|^ +[0-9]+: |its failure|RANDOM-PROGRAM-FAILURE"; then
    status=1
  fi
  echo "  ($t: $(( $(date +%s) - start )) s, seeds $seeds)"
done
exit $status
