#!/usr/bin/env bash
# Sweep of the peer-memory (ipc) kernels' settings on RANKS GPUs (default 2), in one call on the device machine.
# Builds nothing: takes the prebuilt `sucl` from BIN_DIR. For each combination of SUCL_IPC_BLOCKS
# (grid cap), SUCL_IPC_UNROLL (slots per thread per loop iteration), SUCL_IPC_TWO_SHOT_BYTES and
# SUCL_IPC_END_BARRIER (1: the kernels also meet at their end, as before the alternating halves;
# 32:1:-:1 is the closest to the kernels before this sweep's change):
#   1. a correctness check over ipc (must print "0 wrong"): the full matrix (all_reduce,
#      all_gather, reduce_scatter, broadcast; f32, f16, bf16; sum, max, avg; --big-mib 8) the
#      first time an unroll/end-barrier pair is met (the compiled kernels depend only on it), else the
#      same ops in f32/sum only (the grid cap and threshold are run-time values); the full
#      checks also replay all_reduce captured into CUDA graphs (`--graph`);
#   2. `sucl bench all_reduce --device cuda --compare nccl,ipc` from 8 B to 8 MiB (every row
#      checked: its #wrong must be 0).
# Before the combinations, one check with the defaults where every call runs two-shot in pieces
# of a 64 KiB data area (consecutive launches alternate between its halves); after them, the
# benchmark with the defaults (no SUCL_IPC_* set) under CUDA-graph capture (`--graph`).
# At the end: one table (per size: nccl µs, and per combination ipc µs and ipc/nccl against that
# run's nccl), and per size band (8 B–256 KiB, 512 KiB–4 MiB, 8 MiB) the combination with the
# lowest geometric mean of ipc/nccl. Exits non-zero if any check or row was wrong or failed.
#
# usage: BIN_DIR=dir-holding-sucl [RANKS=2] [OUT=target/bench/gpu/ipc-sweep] [COMBOS="b:u:t ..."]
#        [ITERS=100] [ROUNDS=2] [MAX_BYTES=8M] scripts/ipc-sweep.sh
# COMBOS: space-separated blocks:unroll:two_shot_bytes[:end_barrier[:push]] (two_shot_bytes "-":
#         the default for RANKS; end_barrier 0 and push the default unless given). To see the
#         one-/two-shot crossover, give two_shot_bytes 0 (two-shot at every size) and
#         1099511627776 (one-shot at every size) for the same blocks and unroll, e.g. on 4 GPUs:
#         RANKS=4 MAX_BYTES=16M COMBOS="128:2:1099511627776 128:2:0 64:2:1099511627776 64:2:0
#         128:4:1099511627776 128:4:0 128:2:1099511627776:0:0"
set -uo pipefail
export NCCL_NVLS_ENABLE=0 SUCL_REQUIRE_GPU=1
BIN=${BIN_DIR:-target/release}/sucl
OUT=${OUT:-target/bench/gpu/ipc-sweep}
RANKS=${RANKS:-2}
ITERS=${ITERS:-100}
ROUNDS=${ROUNDS:-2}
MAX_BYTES=${MAX_BYTES:-8M}
COMBOS=${COMBOS:-"32:1:-:1 32:4:- 64:1:- 64:2:- 64:4:- 64:8:- 128:1:- 128:2:- 128:4:- 64:4:1048576 128:4:1048576 64:4:-:1"}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "FAIL  setup  no executable $BIN (set BIN_DIR)"; echo "ipc-sweep: FAIL"; exit 1; }
fails=0
checked_kernels=" "
names=()
BENCH=(bench all_reduce --device cuda --ranks "$RANKS" --min-bytes 8 --max-bytes "$MAX_BYTES" --factor 2
  --rounds "$ROUNDS" --iters "$ITERS" --warmup 20)

# A bench table is clean when it has rows and every row's last column (#wrong) is 0.
bench_clean() { awk '/^ *[0-9]+ / { n++; if ($NF != "0") bad++ } END { exit !(n > 0 && bad == 0) }' "$1"; }

start=$SECONDS
SUCL_IPC_TWO_SHOT_BYTES=16 SUCL_IPC_BUFFER_BYTES=65536 timeout 120 "$BIN" check --device cuda --ranks "$RANKS" \
  --device-backends ipc --ops all_reduce,all_gather,reduce_scatter,broadcast --dtypes f32,f16,bf16 --redops sum,max,avg \
  --big-mib 3 --graph >"$OUT/pieces-check.txt" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q ", 0 wrong" "$OUT/pieces-check.txt" && ! grep -q "WRONG" "$OUT/pieces-check.txt"; then
  echo "pieces (defaults, two-shot from 16 B, 64 KiB data area): check ok ($((SECONDS - start)) s)"
else
  echo "pieces: check FAILED (rc $rc, log $OUT/pieces-check.txt)"; fails=$((fails + 1))
fi

for combo in $COMBOS; do
  IFS=: read -r blocks unroll two_shot end_barrier push <<<"$combo"
  end_barrier=${end_barrier:-0}
  name="b${blocks}u${unroll}"
  envs=(SUCL_IPC_BLOCKS="$blocks" SUCL_IPC_UNROLL="$unroll" SUCL_IPC_END_BARRIER="$end_barrier")
  if [ "$two_shot" != "-" ]; then name="${name}t$((two_shot >> 10))K"; envs+=(SUCL_IPC_TWO_SHOT_BYTES="$two_shot"); fi
  [ "$end_barrier" = 1 ] && name="${name}e"
  if [ -n "$push" ]; then name="${name}p$push"; envs+=(SUCL_IPC_PUSH="$push"); fi
  names+=("$name")
  start=$SECONDS
  if [[ "$checked_kernels" != *" $unroll:$end_barrier:$push "* ]]; then
    what=(--dtypes f32,f16,bf16 --redops sum,max,avg --graph)
    checked_kernels+="$unroll:$end_barrier:$push "
  else
    what=(--dtypes f32 --redops sum)
  fi
  env "${envs[@]}" timeout 120 "$BIN" check --device cuda --ranks "$RANKS" --device-backends ipc \
    --ops all_reduce,all_gather,reduce_scatter,broadcast "${what[@]}" --big-mib 8 >"$OUT/$name-check.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q ", 0 wrong" "$OUT/$name-check.txt" && ! grep -q "WRONG" "$OUT/$name-check.txt"; then
    ck="check ok ($(grep -ho '[0-9]* checks' "$OUT/$name-check.txt"))"
  else
    ck="check FAILED (rc $rc, log $OUT/$name-check.txt)"; fails=$((fails + 1))
  fi
  env "${envs[@]}" timeout 120 "$BIN" "${BENCH[@]}" --compare nccl,ipc >"$OUT/$name-bench.txt" 2>"$OUT/$name-bench.err"
  rc=$?
  if [ $rc -eq 0 ] && bench_clean "$OUT/$name-bench.txt"; then bk="bench ok"; else
    bk="bench FAILED (rc $rc, log $OUT/$name-bench.txt/.err)"; fails=$((fails + 1)); fi
  echo "$name  ${envs[*]}: $ck, $bk ($((SECONDS - start)) s)"
done

# The defaults under CUDA-graph capture.
start=$SECONDS
timeout 120 "$BIN" "${BENCH[@]}" --graph --compare nccl,ipc >"$OUT/graph-bench.txt" 2>"$OUT/graph-bench.err"
rc=$?
if [ $rc -eq 0 ] && bench_clean "$OUT/graph-bench.txt"; then gk="ok"; else
  gk="FAILED (rc $rc, log $OUT/graph-bench.txt/.err)"; fails=$((fails + 1)); fi
echo "graph (defaults, --graph): $gk ($((SECONDS - start)) s)"

# One table: per size, nccl (the least of every run's) and per combination ipc µs and the ratio
# to that run's own nccl; then the best combination per size band.
{
  for name in "${names[@]}" graph; do
    awk -v n="$name" '/^ *[0-9]+ / && NF >= 4 { print n, $1, $2, $3 }' "$OUT/$name-bench.txt"
  done
} >"$OUT/points.txt"
awk -v order="${names[*]} graph" '
  BEGIN { nn = split(order, names, " ") }
  { key = $1 SUBSEP $2; nccl[key] = $3; ipc[key] = $4; if (!($2 in seen)) { seen[$2] = 1; sizes[++ns] = $2 }
    if ($1 != "graph" && (!($2 in best) || $3 < best[$2])) best[$2] = $3 }
  END {
    printf "%10s %8s", "bytes", "nccl"
    for (i = 1; i <= nn; i++) printf " %15s", names[i]
    printf "\n"
    for (s = 1; s <= ns; s++) {
      b = sizes[s]; printf "%10s %8.2f", b, best[b]
      for (i = 1; i <= nn; i++) {
        k = names[i] SUBSEP b
        if (k in ipc) printf " %7.2f (%4.2fx)", ipc[k], ipc[k] / nccl[k]; else printf " %15s", "-"
      }
      printf "\n"
    }
    printf "(graph column: defaults under --graph, ratio to nccl under --graph)\n"
    split("8 262144 524288 4194304 8388608 1e18", edge, " ")
    split("8B-256KiB 512KiB-4MiB 8MiB+", band, " ")
    line = "best per band (geometric mean of ipc/nccl):"
    for (j = 1; j <= 3; j++) {
      lo = edge[2 * j - 1] + 0; hi = edge[2 * j] + 0; bestname = ""; bestv = 0
      for (i = 1; i <= nn; i++) {
        if (names[i] == "graph") continue
        sum = 0; cnt = 0
        for (s = 1; s <= ns; s++) { b = sizes[s] + 0; k = names[i] SUBSEP sizes[s]
          if (b >= lo && b <= hi && (k in ipc) && nccl[k] > 0) { sum += log(ipc[k] / nccl[k]); cnt++ } }
        if (cnt > 0 && (bestname == "" || sum / cnt < bestv)) { bestv = sum / cnt; bestname = names[i] }
      }
      if (bestname != "") line = line sprintf("  %s: %s (%.2fx)", band[j], bestname, exp(bestv))
    }
    print line
  }' "$OUT/points.txt" | tee "$OUT/table.txt"
if [ $fails -eq 0 ]; then echo "ipc-sweep: PASS"; else echo "ipc-sweep: FAIL ($fails failed steps)"; exit 1; fi
