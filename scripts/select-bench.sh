#!/usr/bin/env bash
# Backend selection on this host: `sucl tune` measures shm, tcp and mpi per op and size and
# writes the winners as a tuning table; then `sucl bench --compare shm,tcp,mpi,auto` measures
# every fixed backend and `auto` (following that table) side by side in one job.
# usage: [SUCL=path] [OUT=dir] scripts/select-bench.sh [RANKS]   -> OUT/selection-<RANKS>r.md (OUT: target/bench/selection;
#        bench/host-selection.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-2}
OPS=${OPS:-"all_reduce broadcast all_to_all"}
MAXB=${MAXB:-16M}
ITERS=${ITERS:-200}
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null
fi
# SUCL=path: a prebuilt sucl with the mpi feature.
if [ -z "${SUCL:-}" ]; then cargo build --release -q -p sucl-cli --features mpi; fi
SUCL=${SUCL:-target/release/sucl}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
BIND=(--bind-to core)
[ "$RANKS" -gt "$(nproc)" ] && BIND=(--oversubscribe --bind-to none)
MPIRUN=(mpirun -n "$RANKS" "${BIND[@]}")
DIR=${OUT:-target/bench/selection}
RAW=$DIR/select-${RANKS}r
rm -rf "$RAW" && mkdir -p "$RAW"
TABLE=$DIR/tuning-host-${RANKS}r.toml
"${MPIRUN[@]}" "$SUCL" tune --ops "$(echo $OPS | tr ' ' ,)" --max-bytes "$MAXB" --factor 4 --iters "$ITERS" --rounds 3 --out "$TABLE" | tee "$RAW/tune.txt"
for op in $OPS; do
  "${MPIRUN[@]}" "$SUCL" bench "$op" --compare shm,tcp,mpi,auto --config "$TABLE" --max-bytes "$MAXB" --factor 4 --iters "$ITERS" --warmup 20 --rounds 3 --json | tee "$RAW/$op.txt"
done
python3 scripts/compare_select.py "$RAW" "$RANKS" "$OPS" "$TABLE" >"$DIR/selection-${RANKS}r.md"
cat "$DIR/selection-${RANKS}r.md"
