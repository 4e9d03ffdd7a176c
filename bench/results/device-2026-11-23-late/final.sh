#!/bin/bash
# The session's one device call: graph GPU tests (scheduler change), v-collectives before/after,
# reconnect before/after, hier chunk sizes. Everything bounded; results under $OUT.
export NCCL_NVLS_ENABLE=0
Z=devbin/z; R=$OUT; t0=$(date +%s)
nproc; uptime
mkdir -p /work/main/target/release && cp $Z/g/sucl /work/main/target/release/sucl
echo "== graph GPU tests"; SUCL_REQUIRE_GPU=1 timeout 60 $Z/g/graph_gpu_tests --skip gpu_tests_skipped_no_gpu --test-threads=1 --nocapture > $R/graph-gpu-tests.txt 2>&1
echo "rc=$? $(( $(date +%s) - t0 )) s"; grep -E "test result|bit-identical|SKIPPED|FAILED|panicked" $R/graph-gpu-tests.txt | head
echo "== device v-collectives (1 rank, nccl; agreement path)"
for op in gatherv all_gatherv scatterv all_to_allv; do timeout 30 $Z/after/sucl bench $op --device cuda --min-bytes 8 --max-bytes 1048576 --iters 20 --json 2>&1; done > $R/device-vbench.txt
grep -c '"wrong":0' $R/device-vbench.txt; grep -v '"wrong":0' $R/device-vbench.txt | head -5
t2=$(date +%s)
echo "== reconnect"; BEFORE=$Z/before/remote_bench AFTER=$Z/after/remote_bench ROUNDS=2 N=300 OUT=$R/reconnect timeout 60 bench/results/remote/reconnect/before_after.sh > $R/reconnect.log 2>&1
echo "rc=$? $(( $(date +%s) - t2 )) s"; tail -30 $R/reconnect.log
t1=$(date +%s)
echo "== vcoll"; BEFORE=$Z/before/sucl AFTER=$Z/after/sucl OUT=$R/vcoll-raw timeout 100 bench/results/vcoll/run.sh > $R/vcoll.md 2> $R/vcoll.err
echo "rc=$? $(( $(date +%s) - t1 )) s"; cat $R/vcoll.md | head -80
t3=$(date +%s)
echo "== hier chunks"
for c in 262144 524288 0; do
  SUCL_HIER_CHUNK_BYTES=$c MINB=262144 MAXB=4194304 ROUNDS=3 ITERS=50 W=/tmp/hier$c timeout 60 scripts/bench-hier.sh $Z/after/sucl > $R/hier-chunk-$c.md 2>$R/hier-chunk-$c.err
  echo "chunk $c rc=$? $(( $(date +%s) - t3 )) s"; grep -E "^\| [0-9]" $R/hier-chunk-$c.md
done
echo "total $(( $(date +%s) - t0 )) s"
