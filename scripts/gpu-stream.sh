#!/usr/bin/env bash
# Stream-triggered communication on the GPU machine (2 GPUs), in one call:
#  1. the GPU checks of CommQueue over nccl and staged (kernel → start ordering, wait → kernel
#     ordering, `recv; start; send; start; wait` completing (each start on its own), host returns while the stream is busy, 1000 start/wait pairs without a host sync,
#     a killed peer releases the stream with an error);
#  2. the GPU test binary of sucl-stream (tests/gpu.rs: ordinary staged collectives ordered with
#     kernels on the stream, returning once enqueued, a lost peer releasing the stream with an
#     error naming it), with SUCL_REQUIRE_GPU=1 so that nothing skips;
#  3. the benchmarks: trigger round trip; 26 send/recv pairs through the queue against the same
#     NCCL group called directly (same communicator, stream and buffers, alternated rounds), and
#     issued on a side stream with the queue's fork and join events; the queue's host time split
#     into enqueues, start and wait;
#     Faces on the 2 GPUs (baseline over NCCL; stream-triggered over nccl and staged) and on 2,
#     4 and 8 host ranks, each with the host time blocked per share;
#  4. stream.jsonl (every JSON result line) and stream.svg (the plot) from them.
# Fails — never skips — when no GPU, fewer than 2 GPUs, NCCL missing, or any check fails.
# With one GPU, TRANSPORTS=staged runs the staged half with both ranks on cuda:0 (NCCL refuses
# two ranks on one GPU) and says so; the nccl half is then not run.
#
# build first (here): scripts/gpu-stream-build.sh (stripped binaries into devbin/), then on the
# GPU machine:
#   BIN=devbin/sucl ST=devbin/st_gpu FACES=devbin/faces PLOT=devbin/stream_plot \
#     ST_TEST=devbin/stream_gpu_tests OUT=target/bench/stream scripts/gpu-stream.sh
# (BIN, ST, FACES, PLOT default to target/release/{sucl,examples/st_gpu,examples/faces,
# examples/stream_plot}; ST_TEST defaults to the target/release/deps/gpu-* binary that lists
# sucl-stream's GPU tests.)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-target/release/sucl}
ST=${ST:-target/release/examples/st_gpu}
FACES=${FACES:-target/release/examples/faces}
PLOT=${PLOT:-target/release/examples/stream_plot}
if [ -z "${ST_TEST:-}" ]; then
  # sucl-cli has a tests/gpu.rs too: take the binary that lists this crate's tests.
  for t in $(ls -t target/release/deps/gpu-* 2>/dev/null | grep -v '\.d$'); do
    if [ -x "$t" ] && "$t" --list 2>/dev/null | grep -q a_staged_collective_returns_once_enqueued; then ST_TEST=$t; break; fi
  done
fi
ST_TEST=${ST_TEST:-}
OUT=${OUT:-target/bench/stream}
mkdir -p "$OUT"
status=0
fail() { echo "gpu-stream: $*" >&2; status=1; }
"$BIN" info >"$OUT/info.txt" 2>&1
grep -q "^  cuda:0 " "$OUT/info.txt" || { echo "gpu-stream: no CUDA device: failing instead of skipping" >&2; exit 1; }
TRANSPORTS=${TRANSPORTS:-nccl staged}
if ! grep -q "^  cuda:1 " "$OUT/info.txt"; then
  [ "$TRANSPORTS" = staged ] || { echo "gpu-stream: fewer than 2 GPUs: failing instead of skipping (TRANSPORTS=staged runs the staged half on one GPU)" >&2; exit 1; }
  echo "gpu-stream: ONE GPU: both ranks share cuda:0; staged only; the nccl half is NOT RUN" | tee "$OUT/one-gpu.txt"
fi
NT=$(echo $TRANSPORTS | wc -w)
grep -q "^  nccl  available" "$OUT/info.txt" || { echo "gpu-stream: NCCL unavailable: failing instead of skipping" >&2; exit 1; }
[ -x "$ST" ] || { echo "gpu-stream: $ST missing (cargo build --release -p sucl-stream --examples)" >&2; exit 1; }
LOG="$OUT/gpu-checks.txt"
: >"$LOG"
for t in $TRANSPORTS; do
  for c in order apart busy many; do
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
# Ordinary staged device collectives: stream order, return once enqueued, lost peer. A failure
# here fails the run but does not keep the benchmarks below from running.
if [ -n "$ST_TEST" ] && [ -x "$ST_TEST" ]; then
  echo "== sucl-stream GPU tests: SUCL_REQUIRE_GPU=1 $ST_TEST --skip gpu_tests_skipped_no_gpu" >>"$LOG"
  SUCL_REQUIRE_GPU=1 timeout 600 "$ST_TEST" --skip gpu_tests_skipped_no_gpu --test-threads=1 >>"$LOG" 2>&1 || fail "sucl-stream GPU tests failed"
  grep -q "test result: ok. 3 passed" "$LOG" || fail "sucl-stream GPU tests: not all 3 passed"
else
  fail "the sucl-stream GPU test binary is missing (cargo test --release -p sucl-stream --test gpu --no-run; ST_TEST=path)"
fi
grep -h "^test \|test result" "$LOG"
BENCH="$OUT/gpu-bench.txt"
: >"$BENCH"
for t in $TRANSPORTS; do
  echo "== bench $t: $BIN run -n 2 -- $ST bench $t" >>"$BENCH"
  timeout 300 "$BIN" run -n 2 -- "$ST" bench "$t" >>"$BENCH" 2>&1 || fail "bench over $t failed"
done
[ -x "$FACES" ] || fail "$FACES missing (cargo build --release -p sucl-stream --examples)"
if [ -x "$FACES" ]; then
  # Faces on the 2 GPUs: baseline over NCCL and stream-triggered over nccl and staged, checked
  # against the host reference; a small-message case and a P3HPC-like size.
  for t in $TRANSPORTS; do
    for sz in "4 4 4 4 1 2 50" "15 14 13 12 1 2 20"; do
      echo "== faces 2 GPUs: $BIN run -n 2 -- $FACES --gpu $t 2 1 1 $sz" >>"$BENCH"
      SUCL_TIMEOUT=60 timeout 600 "$BIN" run -n 2 -- "$FACES" --gpu "$t" 2 1 1 $sz >>"$BENCH" 2>&1 || fail "faces on 2 GPUs over $t failed"
    done
  done
  [ "$(grep -c "2 tasks passed correctness check" "$BENCH")" -ge $((2 * NT)) ] || fail "faces on GPUs: a correctness check did not pass"
  for n in 2 4 8; do
    case $n in 2) g="2 1 1";; 4) g="2 2 1";; 8) g="2 2 2";; esac
    for sz in "4 4 4 4" "15 14 13 12"; do
      echo "== faces host ranks $n: $BIN run -n $n -- $FACES $g $sz 1 2 20" >>"$BENCH"
      timeout 300 "$BIN" run -n "$n" -- "$FACES" $g $sz 1 2 20 >>"$BENCH" 2>&1 || fail "faces on $n host ranks failed"
    done
  done
fi
cat "$BENCH"
# Every JSON result line (without the launcher's rank prefix), and the plot.
sed -n 's/^\(\[[0-9]*\] \)\{0,1\}\({"bench".*\)$/\2/p' "$BENCH" >"$OUT/stream.jsonl"
if [ -x "$PLOT" ]; then
  "$PLOT" "$OUT/stream.svg" "$OUT/stream.jsonl" || fail "plotting failed"
else
  fail "$PLOT missing (cargo build --release -p sucl-stream --examples)"
fi
echo "gpu-stream: exit $status"
exit $status
