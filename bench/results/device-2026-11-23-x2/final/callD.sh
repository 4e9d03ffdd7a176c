#!/bin/bash
# Call D (2 GPUs): the task graph's GPU tests with the Table 3 programs (discovery off and on) and
# a sabotaged build that must fail; N-body strong scaling at a size that fills the GPUs; the ipc
# kernels' settings sweep and the ipc correctness steps.
. devbin/z2/common.sh
nvidia-smi -L; uptime
step graph-gpu-tests
SUCL_REQUIRE_GPU=1 SUCL_REQUIRE_GPUS=2 timeout 150 $Z/graph_gpu_tests --skip gpu_tests_skipped_no_gpu --test-threads=1 --nocapture > $RES/graph-gpu-tests.txt 2>&1; echo "rc=$?"
grep -E "bit-identical|test result|SKIPPED|panicked" $RES/graph-gpu-tests.txt
step graph-gpu-tests-sabotaged
SUCL_REQUIRE_GPU=1 timeout 90 $Z/graph_gpu_tests_sab gpu_programs_match_the_host_ranks_bit_for_bit --test-threads=1 --nocapture > $RES/graph-gpu-tests-sabotaged.txt 2>&1; echo "rc=$? (must be non-zero)"
grep -E "differ|test result|panicked" $RES/graph-gpu-tests-sabotaged.txt | head -5
pack D
step nbody-262144
for g in 1 2; do for cpd in 0 1; do
  dev=0; [ $g = 2 ] && dev=0,1
  CUDA_VISIBLE_DEVICES=$dev SUCL_GRAPH_CPD=$cpd SUCL_TIMEOUT=60 timeout 45 $Z/sucl run -n $g -- $Z/graph_gpu_step_bench nbody --size 262144 --steps 2 --rounds 2 \
    > $RES/nbody262144-gpu$g-cpd$cpd.txt 2>&1; echo "gpus=$g cpd=$cpd rc=$?"; grep '"bench"' $RES/nbody262144-gpu$g-cpd$cpd.txt
done; done
pack D
step ipc-sweep
BIN_DIR=$Z OUT=$RES/ipc-sweep ROUNDS=2 COMBOS="32:1:-:1 64:1:- 64:2:- 64:4:- 128:2:- 128:4:- 64:4:1048576 128:4:1048576 64:4:-:1" timeout 320 scripts/ipc-sweep.sh > $RES/ipc-sweep.txt 2>&1; echo "rc=$?"
tail -45 $RES/ipc-sweep.txt
pack D
step ipc-check
BIN_DIR=$Z OUT=$RES/ipc BENCH=0 TESTS="$Z/sucl_cuda_tests $Z/cli_gpu_ipc_tests" timeout 120 scripts/ipc-check.sh > $RES/ipc-check.txt 2>&1; echo "rc=$?"
grep -E "^(PASS|FAIL)|ipc-check" $RES/ipc-check.txt
pack D
step done
