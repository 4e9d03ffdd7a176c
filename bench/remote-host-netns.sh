#!/usr/bin/env bash
# Figure remote-host-netns (any Linux machine, as root): remote daemons serving *host* devices on
# posed hosts — one network namespace per daemon, joined to the client's by veth pairs on a
# bridge, so halos and blocks cross real network stacks (TLS over veth, never loopback) — running
# remote_bench's Jacobi 3D (weak scaling) and blocked matmul over 1, 2 and 4 daemons, checked bit
# for bit against the same kernels run in the client. Efficiency is against one daemon; each
# daemon's kernels run on one thread, so a machine with fewer free cores than daemons caps it.
# usage: [SUCLD=target/release/sucld] [BENCH=target/release/examples/remote_bench] [DAEMONS=4]
#        [JACOBI_N=128] [JACOBI_NZ=64] [JACOBI_STEPS=10] [MATMUL_N=480] [OUT=target/bench/remote-host-netns]
#        bench/remote-host-netns.sh
# Writes OUT/host-netns.md; removes every namespace, link and process it made, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
SUCLD=${SUCLD:-target/release/sucld}; BENCH=${BENCH:-target/release/examples/remote_bench}
OUT=${OUT:-target/bench/remote-host-netns}; DAEMONS=${DAEMONS:-4}
[ -x "$SUCLD" ] && [ -x "$BENCH" ] || cargo build --release -p sucl-remote --bin sucld --example remote_bench
[ "$(id -u)" = 0 ] || { echo "remote-host-netns: needs root (ip netns)" >&2; exit 1; }
mkdir -p "$OUT"
tag=$$; bridge=brs$((tag % 100000)); TMP=$(mktemp -d); PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for h in $(seq 0 $((DAEMONS - 1))); do ip netns del "sucl-rs-$tag-$h" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
ip link add "$bridge" type bridge && ip link set "$bridge" up
ip addr add 10.232.0.254/24 dev "$bridge"    # the client's address on the posed network
"$SUCLD" --gen-token "$TMP/token" >/dev/null
addrs=(); pins=()
for h in $(seq 0 $((DAEMONS - 1))); do
  ns=sucl-rs-$tag-$h; outer=vrs$((tag % 100000))h$h; a=10.232.0.$((h + 1))
  ip netns add "$ns"
  ip link add "$outer" type veth peer name eth0 netns "$ns"
  ip link set "$outer" master "$bridge" && ip link set "$outer" up
  ip -n "$ns" addr add "$a/24" dev eth0 && ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up
  ip netns exec "$ns" "$SUCLD" --listen "$a:7790" --print-address --tls-ephemeral --token-file "$TMP/token" \
    --max-session-bytes $((4 << 30)) >"$TMP/$h.addr" 2>"$OUT/sucld-$h.log" &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "^tls " "$TMP/$h.addr" && break; sleep 0.05; done
  pin=$(sed -n 's/^tls pin //p' "$TMP/$h.addr")
  [ -n "$pin" ] || { echo "remote-host-netns: sucld in $ns did not start" >&2; cat "$OUT/sucld-$h.log" >&2; exit 1; }
  addrs+=("$a:7790"); pins+=("$pin")
done
SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$(IFS=,; echo "${pins[*]}") \
  "$BENCH" --only jacobi,matmul --servers "$(IFS=,; echo "${addrs[*]}")" --jacobi-weak \
  --jacobi-n "${JACOBI_N:-128}" --jacobi-nz "${JACOBI_NZ:-64}" --jacobi-steps "${JACOBI_STEPS:-10}" \
  --matmul-n "${MATMUL_N:-480}" --out "$OUT/host-netns.md" >/dev/null
cat "$OUT/host-netns.md"
awk -F'|' '/^\| [0-9]+ \| host \|/ { rows++; if ($(NF-1) + 0 != 0) bad = 1 } END { exit (bad || rows == 0) }' "$OUT/host-netns.md" \
  || { echo "remote-host-netns: a run is missing or computed wrong results" >&2; exit 1; }
