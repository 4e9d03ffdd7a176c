#!/usr/bin/env bash
# Stream-triggered queues on the GPU machine, in one call: the GPU checks over nccl and staged
# (kernel → start ordering, wait → kernel ordering, host returns while the stream is busy, 1000
# start/wait pairs without a host sync, a killed peer releases the stream with an error), then
# the benchmarks (trigger round trip; 26 send/recv pairs through the queue vs the same NCCL
# group called directly) and Faces on the host ranks of that machine.
# Fails — never skips — when no GPU, fewer than 2 GPUs, NCCL missing, or any check fails.
# usage: BIN=target/release/sucl ST=target/release/examples/st_gpu FACES=target/release/examples/faces \
#        OUT=bench/results/stream scripts/gpu-stream.sh
# build first (here): cargo build --release -p sucl-cli -p sucl-stream --examples
set -uo pipefail
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-target/release/sucl}
ST=${ST:-target/release/examples/st_gpu}
FACES=${FACES:-target/release/examples/faces}
OUT=${OUT:-bench/results/stream}
mkdir -p "$OUT"
status=0
fail() { echo "gpu-stream: $*" >&2; status=1; }
"$BIN" info >"$OUT/info.txt" 2>&1
grep -q "^  cuda:0 " "$OUT/info.txt" || { echo "gpu-stream: no CUDA device: failing instead of skipping" >&2; exit 1; }
grep -q "^  cuda:1 " "$OUT/info.txt" || { echo "gpu-stream: fewer than 2 GPUs: failing instead of skipping" >&2; exit 1; }
grep -q "^  nccl  available" "$OUT/info.txt" || { echo "gpu-stream: NCCL unavailable: failing instead of skipping" >&2; exit 1; }
[ -x "$ST" ] || { echo "gpu-stream: $ST missing (cargo build --release -p sucl-stream --examples)" >&2; exit 1; }
LOG="$OUT/gpu-checks.txt"
: >"$LOG"
for t in nccl staged; do
  for c in order busy many; do
    echo "== $c $t" >>"$LOG"
    SUCL_TIMEOUT=60 timeout 300 "$BIN" run -n 2 -- "$ST" "$c" "$t" >>"$LOG" 2>&1 || fail "$c over $t failed"
    [ "$(grep -c "st-gpu: $c $t: ok" "$LOG")" -ge 2 ] || fail "$c over $t: not every rank reported ok"
  done
  # A killed peer: started without the launcher (torchrun's variables), which would otherwise end
  # the survivor first. The survivor must report an error naming rank 1 and exit 0, not hang.
  echo "== killed $t" >>"$LOG"
  port=$((29600 + RANDOM % 300))
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SUCL_TIMEOUT=10 timeout 120 \
      "$ST" killed "$t" >"$OUT/killed-$r.txt" 2>&1 &
    pids[$r]=$!
  done
  wait "${pids[0]}"; rc0=$?
  wait "${pids[1]}"; rc1=$?
  cat "$OUT/killed-0.txt" "$OUT/killed-1.txt" >>"$LOG"; rm -f "$OUT/killed-0.txt" "$OUT/killed-1.txt"
  echo "killed $t: rank 0 exit $rc0, rank 1 exit $rc1" >>"$LOG"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 7 ] || fail "killed over $t: exits $rc0/$rc1 (want 0/7)"
  grep -q "st-gpu: killed $t: ok" "$LOG" || fail "killed over $t: the stream was not released with an error naming rank 1"
done
grep -h "st-gpu\|FAILED\|panicked" "$LOG"
[ "$status" -eq 0 ] || { echo "gpu-stream: checks failed; no benchmarks" >&2; exit 1; }
BENCH="$OUT/gpu-bench.txt"
: >"$BENCH"
for t in nccl staged; do
  echo "== bench $t: $BIN run -n 2 -- $ST bench $t" >>"$BENCH"
  timeout 300 "$BIN" run -n 2 -- "$ST" bench "$t" >>"$BENCH" 2>&1 || fail "bench over $t failed"
done
[ -x "$FACES" ] || fail "$FACES missing (cargo build --release -p sucl-stream --examples)"
if [ -x "$FACES" ]; then
  # Faces on the 2 GPUs: baseline over NCCL and stream-triggered over nccl and staged, checked
  # against the host reference; a small-message case and a P3HPC-like size.
  for t in nccl staged; do
    for sz in "4 4 4 4 1 2 50" "15 14 13 12 1 2 20"; do
      echo "== faces 2 GPUs: $BIN run -n 2 -- $FACES --gpu $t 2 1 1 $sz" >>"$BENCH"
      SUCL_TIMEOUT=60 timeout 600 "$BIN" run -n 2 -- "$FACES" --gpu "$t" 2 1 1 $sz >>"$BENCH" 2>&1 || fail "faces on 2 GPUs over $t failed"
    done
  done
  [ "$(grep -c "2 tasks passed correctness check" "$BENCH")" -ge 4 ] || fail "faces on GPUs: a correctness check did not pass"
  for n in 2 4 8; do
    case $n in 2) g="2 1 1";; 4) g="2 2 1";; 8) g="2 2 2";; esac
    for sz in "4 4 4 4" "15 14 13 12"; do
      echo "== faces host ranks $n: $BIN run -n $n -- $FACES $g $sz 1 2 20" >>"$BENCH"
      timeout 300 "$BIN" run -n "$n" -- "$FACES" $g $sz 1 2 20 >>"$BENCH" 2>&1 || fail "faces on $n host ranks failed"
    done
  done
fi
cat "$BENCH"
echo "gpu-stream: exit $status"
exit $status
