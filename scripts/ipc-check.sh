#!/usr/bin/env bash
# Peer-memory (ipc) device backend on 2 GPUs, in one call on the device machine. Builds nothing:
# takes the prebuilt `sucl` from BIN_DIR. Runs the correctness matrix over ipc (every op its
# kernels serve, f32/f16/bf16, sum/max/min/avg, 0 elements to 64 MiB, odd counts, slices; once
# with the defaults, once two-shot everywhere with a 64 KiB data area so every call runs in
# pieces), the fallback for calls it cannot serve, SUCL_IPC=off, a killed and a stalled rank
# (every rank must end with an error; NCCL must work on the GPUs afterwards), optional test
# binaries, then `sucl tune` (nccl, ipc, staged) and `sucl bench all_reduce --compare
# raw,nccl,ipc,auto` from 8 B to 64 MiB on 2 ranks. Prints one PASS/FAIL line per step and a
# verdict; exits non-zero on any FAIL. Nothing here skips: no GPU, one GPU or no ipc is a FAIL —
# except with SHARE=2 on a one-GPU machine: both ranks then share cuda:0 (peer memory between
# two processes on one GPU), NCCL's part becomes a one-rank NCCL job, and the benchmark compares
# ipc with staged only (NCCL refuses two ranks on one GPU). The verdict line says ONE GPU.
#
# usage: BIN_DIR=dir-holding-sucl [OUT=target/bench/gpu/ipc] [TESTS="test binaries"]
#        [FAULT_BIN=sucl built with --features fault-hook] [BENCH=0] [FACTOR=4] [ROUNDS=2]
#        scripts/ipc-check.sh
# TESTS: e.g. the sucl-cuda unit tests (NVRTC compiles every kernel module) and
#        crates/sucl-cli/tests/gpu_ipc.rs, from `cargo test --release --no-run`.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 SUCL_REQUIRE_GPU=1
BIN=${BIN_DIR:-target/release}/sucl
OUT=${OUT:-target/bench/gpu/ipc}
FACTOR=${FACTOR:-4}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
fails=0
verdict() { # name ok(0/1) detail
  if [ "$2" -eq 0 ]; then echo "PASS  $1  $3"; else echo "FAIL  $1  $3 (log: $OUT/$1.txt)"; fails=$((fails + 1)); fi
}
[ -x "$BIN" ] || { echo "FAIL  setup  no executable $BIN (set BIN_DIR)"; echo "ipc-check: FAIL"; exit 1; }
OPS=(--ops all_reduce,broadcast,all_gather,reduce_scatter --dtypes f32,f16,bf16 --redops sum,max,min,avg)
check2() { "$BIN" check --device cuda --ranks 2 "$@"; }
clean() { grep -q "checks, 0 wrong" "$1" && ! grep -q "WRONG" "$1"; }

# 1. Two GPUs that see each other.
"$BIN" info >"$OUT/info.txt" 2>&1
ngpu=$(grep -c "^  cuda:[0-9]" "$OUT/info.txt")
one=0; [ "$ngpu" -eq 1 ] && [ "${SHARE:-1}" = 2 ] && one=1
{ [ "$ngpu" -ge 2 ] || [ $one = 1 ]; } && grep -q "^  ipc   available" "$OUT/info.txt"; verdict info $? "$ngpu GPUs; $(grep '^  ipc' "$OUT/info.txt")"
[ "$ngpu" -ge 2 ] || [ $one = 1 ] || { echo "ipc-check: FAIL (needs 2 GPUs)"; exit 1; }
[ $one = 1 ] && echo "ipc-check: ONE GPU: both ranks share cuda:0; NCCL checked with one rank; no NCCL comparison"
# NCCL after a fault: both GPUs, or the one GPU alone.
nccl_after() { if [ $one = 1 ]; then "$BIN" check --device cuda --ranks 1 "$@"; else check2 "$@"; fi; }

# 2. The matrix over ipc with the defaults (one-shot below 256 KiB, two-shot above, 32 MiB area).
check2 --device-backends ipc "${OPS[@]}" --big-mib 64 >"$OUT/matrix.txt" 2>&1 && clean "$OUT/matrix.txt"
verdict matrix $? "$(grep -h 'sucl check' "$OUT/matrix.txt")"

# 3. Two-shot from 16 B on, 64 KiB data area: small odd counts two-shot, everything else in pieces.
SUCL_IPC_TWO_SHOT_BYTES=16 SUCL_IPC_BUFFER_BYTES=65536 check2 --device-backends ipc "${OPS[@]}" --big-mib 3 \
  >"$OUT/matrix-two-shot-pieces.txt" 2>&1 && clean "$OUT/matrix-two-shot-pieces.txt"
verdict matrix-two-shot-pieces $? "$(grep -h 'sucl check' "$OUT/matrix-two-shot-pieces.txt")"

# 4. Pinned to ipc, calls its kernels lack (reduce, gather, all_to_all, i32, prod) fall back.
SUCL_IPC=force check2 --device-backends ipc --ops all_reduce,reduce,all_to_all,gather --dtypes f32,i32 --redops sum,prod \
  >"$OUT/fallback.txt" 2>&1 && clean "$OUT/fallback.txt"
verdict fallback $? "$(grep -h 'sucl check' "$OUT/fallback.txt")"

# 4b. all_reduce captured into a CUDA graph (3 calls) and replayed 4 times, output poisoned
# between replays: no host work per call.
check2 --device-backends ipc --ops all_reduce --dtypes f32 --redops sum --graph >"$OUT/graph.txt" 2>&1 && clean "$OUT/graph.txt"
verdict graph-capture $? "$(grep -h 'sucl check' "$OUT/graph.txt")"

# 5. SUCL_IPC=off: asking for ipc is refused with the reason.
SUCL_IPC=off check2 --device-backends ipc --ops all_reduce --dtypes f32 --redops sum >"$OUT/off.txt" 2>&1
rc=$?; [ "$rc" -ne 0 ] && grep -q "disabled by the configuration" "$OUT/off.txt"; verdict off $? "exit $rc"

# 6-7. A killed and a stalled rank (started directly, rank 0 hosting the store, so that no
# launcher ends the survivor first): rank 0 must fail with the reason, in bounded time; then
# NCCL must work on both GPUs.
fault() { # name inject SUCL_TIMEOUT limit pattern
  local name=$1 inject=$2 to=$3 limit=$4 pat=$5 port=$((29600 + RANDOM % 300)) start r rc0
  start=$(date +%s)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SUCL_TIMEOUT=$to timeout "$limit" \
      "$BIN" check --device cuda --device-backends ipc --ops all_reduce --dtypes f32 --redops sum "$inject" 1 --inject-after 3 \
      >"$OUT/$name-$r.txt" 2>&1 &
    pids[r]=$!
  done
  wait "${pids[0]}"; rc0=$?
  local el=$(( $(date +%s) - start ))
  kill "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
  cat "$OUT/$name-0.txt" "$OUT/$name-1.txt" >"$OUT/$name.txt"; rm -f "$OUT/$name-0.txt" "$OUT/$name-1.txt"
  nccl_after --device-backends nccl --ops all_reduce --dtypes f32 --redops sum >"$OUT/$name-nccl-after.txt" 2>&1 && clean "$OUT/$name-nccl-after.txt"
  local nccl=$?
  [ "$rc0" -ne 0 ] && [ "$rc0" -ne 124 ] && grep -Eq "$pat" "$OUT/$name.txt" && [ "$nccl" -eq 0 ]
  verdict "$name" $? "rank 0 exit $rc0 after $el s: $(grep -Eo "$pat.*" "$OUT/$name.txt" | head -1); NCCL afterwards: $([ $nccl -eq 0 ] && echo ok || echo FAILED)"
}
fault killed-rank --inject-kill 30 120 "rank 0: lost peer rank 1"
fault stalled-rank --inject-stall 5 60 "rank 0: .*timed out after"

# 8. Test binaries (they fail rather than skip with SUCL_REQUIRE_GPU=1).
for t in ${TESTS:-}; do
  n=$(basename "$t")
  "$t" --skip gpu_tests_skipped_no_gpu >"$OUT/test-$n.txt" 2>&1; verdict "test-$n" $? "$(grep -h 'test result' "$OUT/test-$n.txt" | tail -1)"
done

# 9. The fault hook corrupts one element of every ipc output: check and bench must notice.
if [ -n "${FAULT_BIN:-}" ]; then
  SUCL_FAULT_CORRUPT=ipc "$FAULT_BIN" check --device cuda --ranks 2 --device-backends ipc --ops all_reduce,all_gather --dtypes f32 \
    --redops sum >"$OUT/fault-hook.txt" 2>&1
  rc=$?; [ "$rc" -ne 0 ] && grep -q "WRONG device ipc " "$OUT/fault-hook.txt"; verdict fault-hook-check $? "exit $rc"
  SUCL_FAULT_CORRUPT=ipc "$FAULT_BIN" bench all_reduce --device cuda --ranks 2 --compare "$([ $one = 1 ] && echo ipc,staged || echo nccl,ipc)" --min-bytes 1K --max-bytes 1M --factor 32 \
    --iters 5 --warmup 2 --rounds 1 --json >"$OUT/fault-hook-bench.txt" 2>&1
  rc=$?; [ "$rc" -ne 0 ] && grep '"backend":"ipc"' "$OUT/fault-hook-bench.txt" | grep -q '"wrong":[1-9]'; verdict fault-hook-bench $? "exit $rc"
fi

# 10. Benchmarks: tune nccl/ipc/staged, then raw NCCL, nccl, ipc and auto (following the table)
# side by side, every row checked.
if [ "${BENCH:-1}" != 0 ] && [ "$fails" -eq 0 ]; then
  "$BIN" tune --device cuda --ranks 2 --ops all_reduce --min-bytes 8 --max-bytes 64M --factor 4 --iters 50 --rounds 2 \
    --out "$OUT/tuning-cuda-2gpu.toml" >"$OUT/tune.txt" 2>&1
  verdict tune $? "$(grep -c 'backend = "ipc"' "$OUT/tuning-cuda-2gpu.toml" 2>/dev/null) ipc rules"
  cfg=(); [ -s "$OUT/tuning-cuda-2gpu.toml" ] && cfg=(--config "$OUT/tuning-cuda-2gpu.toml")
  cmp=raw,nccl,ipc,auto; [ $one = 1 ] && cmp=ipc,staged,auto
  "$BIN" bench all_reduce --device cuda --ranks 2 "${cfg[@]}" --compare "$cmp" --min-bytes 8 --max-bytes 64M \
    --factor "$FACTOR" --rounds "$ROUNDS" --iters 100 --warmup 20 >"$OUT/bench-all_reduce.txt" 2>&1
  rc=$?; [ "$rc" -eq 0 ] && ! grep -Eq '^ +[0-9]+ .* [1-9][0-9]*$' "$OUT/bench-all_reduce.txt"
  verdict bench-all_reduce $? "exit $rc"
  # Columns: bytes raw nccl ipc auto #wrong. Ratios: ipc over raw NCCL and over sucl's nccl,
  # auto over the better of nccl and ipc.
  [ $one = 1 ] || awk '/^ +[0-9]+ / { b = $4 < $3 ? $4 : $3; printf "%12d  ipc/raw %5.2f  ipc/nccl %5.2f  auto/best %5.2f\n", $1, $4 / $2, $4 / $3, $5 / b }' \
    "$OUT/bench-all_reduce.txt" >"$OUT/bench-all_reduce-ratios.txt"
  cat "$OUT/bench-all_reduce.txt" "$OUT/bench-all_reduce-ratios.txt" 2>/dev/null
fi
if [ "$fails" -eq 0 ]; then echo "ipc-check: PASS"; else echo "ipc-check: FAIL ($fails steps)"; fi
[ "$fails" -eq 0 ]
