#!/usr/bin/env bash
# Reconnect before/after, side by side on one machine: remote_bench's reconnect section built
# against the library before this work (BASE, default 7812d61) and against this checkout, both
# from this checkout's bench source, run in alternating rounds; prints the summary table.
# usage (from the repository root):
#   [BEFORE=path/to/old/remote_bench] [AFTER=target/release/examples/remote_bench] \
#   [ROUNDS=7] [N=300] [OUT=dir] bench/results/remote/reconnect/before_after.sh
# Without BEFORE it builds one: BASE's sources with this checkout's examples/remote_bench.rs,
# in BEFORE_TARGET (default target/reconnect-base; the first build compiles every dependency).
set -euo pipefail
BASE=${BASE:-7812d61}; ROUNDS=${ROUNDS:-7}; N=${N:-300}
OUT=${OUT:-bench/results/remote/reconnect/runs}
HERE=$(dirname "$0")
if [ -z "${BEFORE:-}" ]; then
  SRC=$(mktemp -d); trap 'rm -rf "$SRC"' EXIT
  git archive "$BASE" | tar -C "$SRC" -xf -
  cp crates/sucl-remote/examples/remote_bench.rs "$SRC/crates/sucl-remote/examples/"
  find "$SRC" -name '*.rs' -exec touch {} + # cargo judges freshness by modification time
  T=${BEFORE_TARGET:-$PWD/target/reconnect-base}
  (cd "$SRC" && CARGO_TARGET_DIR="$T" cargo build --release -p sucl-remote --example remote_bench)
  cp "$T/release/examples/remote_bench" "$T/remote_bench_before"
  BEFORE="$T/remote_bench_before"
fi
if [ -z "${AFTER:-}" ]; then
  cargo build --release -p sucl-remote --example remote_bench
  AFTER=target/release/examples/remote_bench
fi
mkdir -p "$OUT"
{ uptime; echo "cores: $(nproc)"; grep -m1 "model name" /proc/cpuinfo || true; } >"$OUT/machine.txt"
for r in $(seq 1 "$ROUNDS"); do
  for v in before after; do
    b=$AFTER; [ $v = before ] && b=$BEFORE
    "$b" --only reconnect --reconnects "$N" --out "$OUT/$v-$r.md" >/dev/null 2>&1
  done
done
uptime >>"$OUT/machine.txt"
python3 "$HERE/summarize.py" "$OUT"
