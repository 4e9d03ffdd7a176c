#!/usr/bin/env bash
# Server-to-server migration between two sucld *processes* (host devices), TLS and plain TCP,
# next to raw TCP and rustls streams between two processes, all from remote_bench's migrate
# section (`--servers A,B`; the client's links paced at 1 Gbit/s by its proxy).
# usage: [REPS=5] [OUT=file.md] bench/results/remote/s2s_processes.sh   (release binaries built)
set -uo pipefail
SUCLD=${SUCLD:-target/release/sucld}
BENCH=${BENCH:-target/release/examples/remote_bench}
OUT=${OUT:-bench/results/remote/s2s_processes.md}
REPS=${REPS:-5}
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
"$SUCLD" --gen-token "$TMP/token" >/dev/null || exit 1

# start NAME [sucld options...]: sets ADDR_NAME and PIN_NAME (empty with --no-tls).
start() {
  local name=$1; shift
  "$SUCLD" --listen 127.0.0.1:0 --print-address --token-file "$TMP/token" --log warn "$@" >"$TMP/$name.addr" &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "^tls " "$TMP/$name.addr" && break; sleep 0.1; done
  printf -v "ADDR_$name" %s "$(sed -n 's/^listening on //p' "$TMP/$name.addr")"
  printf -v "PIN_$name" %s "$(sed -n 's/^tls pin //p' "$TMP/$name.addr")"
}

start a --tls-ephemeral
start b --tls-ephemeral
start c --no-tls
start d --no-tls
{
  echo "# S2S between two sucld processes ($(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo
  echo "Command: \`bench/results/remote/s2s_processes.sh\` (REPS=$REPS)"
  SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PIN_a,$PIN_b \
    "$BENCH" --only migrate --migrate-reps "$REPS" --servers "$ADDR_a,$ADDR_b" 2>/dev/null | sed -n '/^## /,$p'
  SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS=off \
    "$BENCH" --only migrate --migrate-reps "$REPS" --servers "$ADDR_c,$ADDR_d" 2>/dev/null | sed -n '/^## /,$p'
} >"$OUT"
cat "$OUT"
