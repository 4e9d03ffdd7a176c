#!/usr/bin/env bash
# Figure remote-latency: a no-op command to a `sucld` on loopback (TLS and plain TCP) against a raw
# TCP round trip, and the time to re-attach after a cut connection (remote_bench, which starts its
# own daemons; 20 000 no-ops after 2 000 warm-up, 100 reconnects per link).
# usage: [BENCH=target/release/examples/remote_bench] [ITERS=20000] [OUT=target/bench/remote] bench/remote-latency.sh
# Writes OUT/noop_latency.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-target/release/examples/remote_bench}; OUT=${OUT:-target/bench/remote}
[ -x "$BENCH" ] || cargo build --release -q -p sucl-remote --example remote_bench
mkdir -p "$OUT"
"$BENCH" --only latency,reconnect --iters "${ITERS:-20000}" --out "$OUT/noop_latency.md"
cat "$OUT/noop_latency.md"
