#!/usr/bin/env bash
# Side-by-side host benchmark: sucl (shm, tcp) against Open MPI (vader, tcp) on this machine.
# Runs each pair ROUNDS times, alternating, and reports per-size medians and sucl/MPI ratios.
# usage: scripts/bench-vs-mpi.sh [RANKS] [ROUNDS] [OPS]   (defaults: 2 3 "all_reduce")
# Writes bench/results/host-vs-mpi-<ranks>r.md and the raw runs beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-2}
ROUNDS=${2:-3}
OPS=${3:-all_reduce}
ITERS=${ITERS:-200}
MAXB=${MAXB:-16777216}

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "installing Open MPI (Debian packages)..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null
fi
mkdir -p target/bench bench/results
mpicc -O2 -o target/bench/mpi_ref bench/mpi/mpi_ref.c
cargo build --release -q -p sucl-cli
SUCL=target/release/sucl
RAW=target/bench/raw-${RANKS}r
rm -rf "$RAW" && mkdir -p "$RAW"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -n "$RANKS" --bind-to core)

for op in $OPS; do
  for round in $(seq 1 "$ROUNDS"); do
    echo "round $round/$ROUNDS: $op" >&2
    "${MPIRUN[@]}" --mca btl self,vader target/bench/mpi_ref "$op" 8 "$MAXB" "$ITERS" 20 >"$RAW/mpi-shm-$op-$round.txt"
    "$SUCL" bench "$op" --ranks "$RANKS" --backend shm --min-bytes 8 --max-bytes "$MAXB" --iters "$ITERS" --warmup 20 --json >"$RAW/sucl-shm-$op-$round.jsonl"
    "${MPIRUN[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo target/bench/mpi_ref "$op" 8 "$MAXB" "$ITERS" 20 >"$RAW/mpi-tcp-$op-$round.txt"
    "$SUCL" bench "$op" --ranks "$RANKS" --backend tcp --min-bytes 8 --max-bytes "$MAXB" --iters "$ITERS" --warmup 20 --json >"$RAW/sucl-tcp-$op-$round.jsonl"
  done
done

OUT=bench/results/host-vs-mpi-${RANKS}r.md
python3 scripts/compare_mpi.py "$RAW" "$RANKS" "$OPS" "$ROUNDS" "$(mpirun --version | head -1)" >"$OUT"
cp -r "$RAW" "bench/results/raw-host-${RANKS}r"
cat "$OUT"
