#!/bin/bash
# Call B: task graph on 2 GPUs (issues 11, 12), remote daemons on 2 GPUs (issue 13).
. devbin/x/common.sh
step graph-gpu
BIN=$X/sucl PROGRAMS=$X/graph_gpu_programs STEP=$X/graph_gpu_step_bench GPU_TEST=$X/graph_gpu_tests OUT=$RES/graph \
  timeout 200 scripts/graph-gpu.sh > $RES/graph-gpu.txt 2>&1; echo "rc=$?"
grep -E "test result|bit-identical|SKIPPED|graph-gpu:|^\|" $RES/graph-gpu.txt | head -30
pack B
step nbody-cpd
for g in 1 2; do for cpd in 0 1; do
  dev=0; [ $g = 2 ] && dev=0,1
  CUDA_VISIBLE_DEVICES=$dev SUCL_GRAPH_CPD=$cpd SUCL_TIMEOUT=60 timeout 60 $X/sucl run -n $g -- $X/graph_gpu_step_bench nbody --size 32768 --steps 5 --rounds 3 \
    > $RES/nbody-gpu$g-cpd$cpd.txt 2>&1; echo "gpus=$g cpd=$cpd rc=$?"; grep '"bench"' $RES/nbody-gpu$g-cpd$cpd.txt
done; done
pack B
step cpd-comm-gpu
SUCL_TIMEOUT=60 timeout 150 $X/sucl run -n 2 -- $X/graph_cpd_bench comm --device --min-bytes 4096 --max-bytes 67108864 --rounds 2 \
  > $RES/cpd-comm-2gpu.txt 2>&1; echo "rc=$?"; grep -c '"bench"' $RES/cpd-comm-2gpu.txt; tail -3 $RES/cpd-comm-2gpu.txt
pack B
step remote
SUCLD=$X/sucld CHECK=$X/remote_cuda_check BENCH=$X/remote_bench HOST_BENCH=0 OUT=$RES/remote \
  timeout 170 scripts/remote-gpu-check.sh > $RES/remote-gpu.txt 2>&1; echo "rc=$?"
tail -5 $RES/remote-gpu.txt; cat $RES/remote/apps_gpu.md 2>/dev/null | head -30; grep -A6 "S2S\|via" $RES/remote/migrate_2gpu.md 2>/dev/null | head -12
pack B
step done
