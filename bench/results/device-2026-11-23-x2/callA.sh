#!/bin/bash
# Call A: peer-memory backend on 2 GPUs (issue 15), stream-triggered on 2 GPUs (issue 10).
. devbin/x/common.sh
nvidia-smi -L; nproc; nvidia-smi topo -m | head -5; $X/sucl info > $RES/info.txt 2>&1; head -30 $RES/info.txt
step ipc
BIN_DIR=$X OUT=$RES/ipc TESTS="$X/sucl_cuda_tests $X/cli_gpu_ipc_tests" FAULT_BIN=$X/fault/sucl FACTOR=4 ROUNDS=2 \
  timeout 270 scripts/ipc-check.sh > $RES/ipc-check.txt 2>&1; echo "rc=$?"
grep -E "^(PASS|FAIL)|ipc-check" $RES/ipc-check.txt; cat $RES/ipc/bench-all_reduce-ratios.txt 2>/dev/null
pack A
step stream
BIN=$X/sucl ST=$X/st_gpu FACES=$X/faces PLOT=$X/stream_plot ST_TEST=$X/stream_gpu_tests OUT=$RES/stream \
  timeout 280 scripts/gpu-stream.sh > $RES/gpu-stream.txt 2>&1; echo "rc=$?"
grep -E "st-gpu|test result|gpu-stream:|round trip|pairs|faces|per step|blocked" $RES/gpu-stream.txt | head -60
pack A
step done
