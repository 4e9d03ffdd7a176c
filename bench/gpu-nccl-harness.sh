#!/usr/bin/env bash
# Figure gpu-nccl-harness (device machine, RANKS GPUs, default 4): small all_reduce (8 B-128 KiB,
# f32 sum) timed by nccl-tests and by sucl's harness in one job, to tell the harness from the
# launch path: nccl-tests' all_reduce_perf (-w 20 -n 100 -a 3: the max over ranks) under mpirun
# bound to a core and unbound, then `sucl bench --compare raw,nccl,ipc` (raw: NCCL called
# directly in sucl's binary) with each rank on its block of CPUs (the launcher's default) and
# pinned to one core. Every sucl row checked (#wrong).
# usage: NCCL_TESTS=dir-with-build/all_reduce_perf [SUCL=target/release/sucl] [RANKS=4]
#        [OUT=target/bench/harness] bench/gpu-nccl-harness.sh
# Writes OUT/*.txt and OUT/gpu-nccl-harness.csv (µs per size; nccl-tests: out-of-place time).
case "${1:-}" in -h|--help) sed -n 2,10p "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 SUCL_REQUIRE_GPU=1
SUCL=$(realpath "${SUCL:-target/release/sucl}"); RANKS=${RANKS:-4}; OUT=${OUT:-target/bench/harness}
NT="${NCCL_TESTS:?the nccl-tests build directory}/build/all_reduce_perf -b 8 -e 128K -f 2 -g 1 -w 20 -n 100 -a 3"
SA=(bench all_reduce --device cuda --min-bytes 8 --max-bytes 128K --factor 2 --rounds 2 --iters 100 --warmup 20 --compare raw,nccl,ipc)
mkdir -p "$OUT"
mpirun --allow-run-as-root -np "$RANKS" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH --bind-to core $NT >"$OUT/nt-core.txt"
mpirun --allow-run-as-root -np "$RANKS" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH --bind-to none $NT >"$OUT/nt-none.txt"
"$SUCL" "${SA[@]}" --ranks "$RANKS" >"$OUT/sucl-block.txt"
# shellcheck disable=SC2016 # expanded by the rank's shell
"$SUCL" run -n "$RANKS" --no-bind --no-prefix -- bash -c 'exec taskset -c "$SUCL_RANK" "$0" "$@"' "$SUCL" "${SA[@]}" >"$OUT/sucl-core.txt"
python3 - "$OUT" "$(dirname "$0")" <<'PY'
import os, sys
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from tocsv import ws_table
def nccl_tests(name):
    """nccl-tests rows by size: the out-of-place time (field 6)."""
    d = {}
    for line in open(os.path.join(out, name)):
        p = line.split()
        if len(p) >= 12 and p[0].isdigit() and p[1].isdigit():
            d[int(p[0])] = p[5]
    return d
def sucl(name):
    """`sucl bench --compare raw,nccl,ipc` rows by size."""
    head, body = ws_table(open(os.path.join(out, name)).read().splitlines())
    return {int(r[0]): dict(zip(head, r)) for r in body}
nc, nn = nccl_tests("nt-core.txt"), nccl_tests("nt-none.txt")
sb, sc = sucl("sucl-block.txt"), sucl("sucl-core.txt")
cols = ("raw", "nccl", "ipc")
with open(os.path.join(out, "gpu-nccl-harness.csv"), "w") as f:
    f.write("bytes,nccl_tests_core_us,nccl_tests_none_us,raw_block_us,nccl_block_us,ipc_block_us,raw_core_us,nccl_core_us,ipc_core_us,wrong\n")
    for b in sorted(sb):
        core = sc.get(b, {})
        w = int(sb[b]["#wrong"]) + int(core.get("#wrong", 0))
        f.write(f"{b},{nc.get(b, '')},{nn.get(b, '')},{','.join(sb[b][c] for c in cols)},{','.join(core.get(c, '') for c in cols)},{w}\n")
PY
cat "$OUT/gpu-nccl-harness.csv"
