#!/usr/bin/env bash
# Remote GPU daemons that scale (device machine, 2+ GPUs): one `sucld --cuda` per GPU on
# loopback (TLS), the applications of remote_bench over 1, 2 and 4 of them, run twice side by
# side — daemons started with `--peer-path network` (every migration over the TLS peer link,
# through host memory: the "before" column) and with `--peer-path auto` (GPU to GPU through
# peer memory, CUDA IPC) — each checked bit for bit (#wrong) against the same kernels on GPU 0:
#   - Jacobi 3D, weak scaling: JACOBI_N² × JACOBI_NZ f32 per daemon (default 512³), halos every step;
#   - blocked matmul, strong scaling: MATMUL_NS (default "4096 8192"), f64.
# PATHS (default "network auto") picks the runs; MATMUL_NS="" leaves matmul out.
# First the remote_cuda_check example against one daemon (every device operation on a GPU).
# With SENDRECV (and SUCL_BIN), the same Jacobi written with sucl's device send/recv on 1, 2, 4
# ranks of one GPU each (the jacobi3d_sendrecv example, best of ROUNDS=3 rounds) as reference.
# Writes OUT/{check.txt, network.md, peer.md, reference.jsonl, sucld-*.log} and
# OUT/remote-scale.csv; fails if a check fails or any #wrong is not 0, or the peer-memory run's
# migrations did not take peer memory.
# usage: SUCLD=path BENCH=path CHECK=path [SENDRECV=path SUCL_BIN=path] [OUT=dir] scripts/remote-scale.sh
#        (build here: cargo build --release -p sucl-remote --bin sucld --example remote_bench
#         --example remote_cuda_check; cargo build --release -p sucl-cli --bin sucl;
#         cargo build --release -p sucl --example jacobi3d_sendrecv)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
SUCLD=${SUCLD:-target/release/sucld}
BENCH=${BENCH:-target/release/examples/remote_bench}
CHECK=${CHECK:-target/release/examples/remote_cuda_check}
OUT=${OUT:-target/bench/remote-scale}
JACOBI_N=${JACOBI_N:-512}; JACOBI_NZ=${JACOBI_NZ:-512}; JACOBI_STEPS=${JACOBI_STEPS:-20}
MATMUL_NS=${MATMUL_NS-4096 8192}  # set but empty: no matmul
mkdir -p "$OUT"
TMP=$(mktemp -d)
PIDS=()
stop_daemons() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; PIDS=(); }
trap 'stop_daemons; rm -rf "$TMP"' EXIT
"$SUCLD" --gen-token "$TMP/token" >/dev/null || exit 1
status=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$ngpu" -ge 1 ] || { echo "remote-scale: no GPU" >&2; exit 1; }
n=$(( ngpu >= 4 ? 4 : ngpu ))

# start_daemons PATH: one sucld per GPU (0..n-1) with --peer-path PATH; sets SERVERS and PINS.
start_daemons() {
  local path=$1 addrs=() pins=()
  for i in $(seq 0 $((n - 1))); do
    CUDA_VISIBLE_DEVICES=$i "$SUCLD" --cuda --listen 127.0.0.1:0 --print-address --tls-ephemeral \
      --token-file "$TMP/token" --max-session-bytes $((16 << 30)) --peer-path "$path" \
      >"$TMP/$path$i.addr" 2>"$OUT/sucld-$path$i.log" &
    PIDS+=($!)
  done
  for i in $(seq 0 $((n - 1))); do
    for _ in $(seq 200); do grep -q "^tls " "$TMP/$path$i.addr" && break; sleep 0.05; done
    local a p
    a=$(sed -n 's/^listening on //p' "$TMP/$path$i.addr"); p=$(sed -n 's/^tls pin //p' "$TMP/$path$i.addr")
    [ -n "$a" ] && [ -n "$p" ] || { echo "remote-scale: sucld $path$i did not start:" >&2; cat "$OUT/sucld-$path$i.log" >&2; exit 1; }
    addrs+=("$a"); pins+=("$p")
  done
  SERVERS=$(IFS=,; echo "${addrs[*]}"); PINS=$(IFS=,; echo "${pins[*]}")
}

# every_right FILE: the application tables ran and every #wrong (last column) is 0.
every_right() {
  awk -F'|' '/^\| [0-9]+ \| [0-9]/ { rows++; if ($(NF-1) + 0 != 0) bad = 1 } END { exit (bad || rows == 0) }' "$1" \
    || { echo "remote-scale: $1: an application run is missing or computed wrong results" >&2; status=1; }
}

for path in ${PATHS:-network auto}; do
  start_daemons "$path"
  if [ "$path" = auto ]; then
    SUCL_REMOTE=${SERVERS%%,*} SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=${PINS%%,*} "$CHECK" >"$OUT/check.txt" 2>&1 || status=1
    grep -q "NVRTC kernel, events: OK" "$OUT/check.txt" || { echo "remote-scale: remote_cuda_check failed" >&2; status=1; }
  fi
  md=$OUT/$([ "$path" = auto ] && echo peer || echo network).md
  : >"$md"
  export SUCL_REMOTE_TOKEN_FILE=$TMP/token SUCL_REMOTE_TLS_PIN=$PINS
  timeout 100 "$BENCH" --only jacobi --cuda --servers "$SERVERS" --jacobi-weak --jacobi-f32 --jacobi-n "$JACOBI_N" \
    --jacobi-nz "$JACOBI_NZ" --jacobi-steps "$JACOBI_STEPS" --out "$TMP/j.md" >/dev/null || { echo "remote-scale: jacobi ($path) failed" >&2; status=1; }
  cat "$TMP/j.md" >>"$md" 2>/dev/null
  for m in $MATMUL_NS; do
    timeout 50 "$BENCH" --only matmul --cuda --servers "$SERVERS" --matmul-n "$m" --out "$TMP/m.md" >/dev/null \
      || { echo "remote-scale: matmul $m ($path) failed" >&2; status=1; }
    cat "$TMP/m.md" >>"$md" 2>/dev/null
  done
  stop_daemons
  every_right "$md"
done
# The reference: the same stencil written with sucl's device send/recv on ranks of one GPU each
# (jacobi3d_sendrecv: the same f32 kernel, JACOBI_N² × JACOBI_NZ per rank, halo planes by
# Communicator::sendrecv, checked bit for bit against the whole domain on one GPU), on 1, 2 and
# 4 ranks; SUCL_BIN and SENDRECV name the binaries. Its rows join the CSV.
if [ -n "${SENDRECV:-}" ]; then
  : >"$OUT/reference.jsonl"
  for r in 1 2 4; do
    [ "$r" -le "$n" ] || continue
    SUCL_TIMEOUT=60 timeout 90 "${SUCL_BIN:-target/release/sucl}" run -n "$r" --no-prefix -- "$SENDRECV" --n "$JACOBI_N" --nz "$JACOBI_NZ" \
      --steps "$JACOBI_STEPS" --rounds "${ROUNDS:-3}" >>"$OUT/reference.jsonl" 2>>"$OUT/reference.err" \
      || { echo "remote-scale: the send/recv reference on $r ranks failed" >&2; status=1; }
  done
  grep -q '"wrong":0}' "$OUT/reference.jsonl" || { echo "remote-scale: no send/recv reference row computed right" >&2; status=1; }
  if grep -q '"wrong":[1-9]' "$OUT/reference.jsonl"; then echo "remote-scale: the send/recv reference computed wrong results" >&2; status=1; fi
fi
if [ -f "$OUT/peer.md" ]; then
  grep -q "| peer memory |" "$OUT/peer.md" || { echo "remote-scale: no migration took peer memory" >&2; status=1; }
fi
if [ -f "$OUT/network.md" ] && grep -q "| peer memory |" "$OUT/network.md"; then
  echo "remote-scale: --peer-path network still took peer memory" >&2; status=1
fi
# One CSV (bench/data/remote-scale.csv's shape): app, size, daemons (ranks for the reference),
# path, time, time per step, speedup and efficiency vs 1, host wait per migration command, #wrong.
cube=$([ "$JACOBI_N" = "$JACOBI_NZ" ] && echo "${JACOBI_N}^3" || echo "${JACOBI_N}^2x${JACOBI_NZ}")
awk -F'|' -v jsize="$cube per daemon" -v steps="$JACOBI_STEPS" '
  function trim(x) { gsub(/^ +| +$/, "", x); return x }
  /^## Jacobi/ { app = "jacobi3d_f32_weak"; size = jsize } /^## Blocked matmul/ { app = "matmul_f64"; split($0, w, "[ ×,]+"); size = w[5] }
  /^\| [0-9]+ \| [0-9]+ GPU/ {
    d = trim($2); path = trim($4); if (path == "—") path = "-"; t = trim($5); sp = trim($7); sub(/×/, "", sp)
    if (app ~ /^jacobi/) { e = trim($8); sub(/%/, "", e); eff = sprintf("%.2f", e / 100); step = sprintf("%.3f", t / steps) }
    else { eff = sprintf("%.2f", sp / d); step = "" }
    n++; row[n] = app "," size "," d "," path "," t "," step "," sp "," eff; wrong[n] = trim($(NF-1)); key[n] = app size d path
  }
  /^\| [0-9]+ \| [^|0-9][^|]* \| [0-9.]+ \|/ && !/GPU/ { waits[app size trim($2) (trim($3) == "—" ? "-" : trim($3))] = trim($(NF-2)) }
  BEGIN { print "app,size,daemons,path,time_ms,step_ms,speedup_vs_1,efficiency_vs_1,host_wait_per_migration_us,wrong" }
  END { for (i = 1; i <= n; i++) print row[i] "," waits[key[i]] "," wrong[i] }
' $(ls "$OUT/network.md" "$OUT/peer.md" 2>/dev/null) /dev/null >"$OUT/remote-scale.csv"
# The reference's rows: step time, and its efficiency against one rank.
sed -n 's/.*"ranks":\([0-9]*\),.*"backends":"\([^"]*\)".*"step_ms":\([0-9.]*\),.*"wrong":\(-\?[0-9]*\)}/\1 \2 \3 \4/p' "$OUT/reference.jsonl" 2>/dev/null |
  awk -v size="$cube per rank" -v steps="$JACOBI_STEPS" '
    $1 == 1 { one = $3 }
    { printf "reference_sendrecv_jacobi3d_f32,%s,%s,%s,%.1f,%s,%s,%s,,%s\n", size, $1, $2, $3 * steps, $3,
        one ? sprintf("%.2f", one / $3) : "", one ? sprintf("%.2f", one / $3) : "", $4 }' >>"$OUT/remote-scale.csv"
cat "$OUT/network.md" "$OUT/peer.md" "$OUT/reference.jsonl" 2>/dev/null
exit $status
