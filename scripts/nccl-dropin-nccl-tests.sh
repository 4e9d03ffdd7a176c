#!/bin/bash
# nccl-tests on the real NCCL and on the drop-in libnccl.so.2 (LD_LIBRARY_PATH), side by side in
# one job: built once against the real NCCL's nccl.h (the nvidia-nccl wheel beside PyTorch, or
# NCCL_HOME), run multi-process (mpirun -np N, one GPU each) with -c 1 (nccl-tests' own check),
# then a table of the drop-in's time over the real NCCL's per size.
# usage: SHIM_DIR=dir-holding-libnccl.so.2 SRC=nccl-tests-source OUT=dir [NP=2] [OPS="all_reduce all_gather ..."] [NCCL_HOME=...] scripts/nccl-dropin-nccl-tests.sh
case "${1:-}" in -h|--help) sed -n 2,6p "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
set -u
: "${SHIM_DIR:?}" "${SRC:?}" "${OUT:?}"
NP=${NP:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p "$OUT"
if [ -z "${NCCL_HOME:-}" ]; then
  NCCL_HOME=$(python3 -c 'import importlib.util as u; print(list(u.find_spec("nvidia.nccl").submodule_search_locations)[0])')
fi
REAL="$NCCL_HOME/lib/libnccl.so.2"
[ -f "$REAL" ] && [ -f "$NCCL_HOME/include/nccl.h" ] || { echo "no NCCL at $NCCL_HOME"; exit 1; }
echo "real NCCL: $REAL ($(grep -m1 'define NCCL_VERSION_CODE' "$NCCL_HOME/include/nccl.h"))"
# nccl-tests links with -lnccl: a dev link beside the headers.
H=/tmp/nccl-home; mkdir -p $H/lib; ln -sfn "$NCCL_HOME/include" $H/include; ln -sf "$REAL" $H/lib/libnccl.so
MPI_HOME=${MPI_HOME:-/usr/lib/x86_64-linux-gnu/openmpi}
B=/tmp/nccl-tests-build; rm -rf $B; cp -r "$SRC" $B
OPS=${OPS:-"all_reduce all_gather broadcast reduce_scatter sendrecv alltoall"}
( cd $B/src && make -j16 build MPI=1 MPI_HOME="$MPI_HOME" NCCL_HOME=$H CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BIN_FILES_LIST="$OPS" ) >"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
status=0
run() { # tag op args...
  local tag=$1 op=$2; shift 2
  local lib=$NCCL_HOME/lib env=()
  [ "$tag" = shim ] && { lib=$SHIM_DIR; env=(-x SUCL_NCCL_REAL_PATH="$REAL" -x SUCL_NCCL_DEBUG); }
  SUCL_NCCL_DEBUG=1 timeout 180 mpirun --allow-run-as-root -np "$NP" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64" "${env[@]}" \
    $B/build/${op}_perf -g 1 "$@" >"$OUT/$tag-$op.txt" 2>&1
  local rc=$?
  local wrong=$(grep -m1 "Out of bounds values" "$OUT/$tag-$op.txt")
  echo "$tag $op: exit $rc; $wrong"
  [ $rc -eq 0 ] || status=1
}
# The timed all_reduce (max over ranks, as sucl bench), both libraries interleaved twice.
for rep in 1 2; do
  for tag in real shim; do
    run $tag all_reduce -b 8 -e 128M -f 4 -w 20 -n 100 -a 3 -c 1; mv "$OUT/$tag-all_reduce.txt" "$OUT/$tag-all_reduce-$rep.txt"
  done
done
# Every dtype and op at small sizes (served and forwarded alike), checked.
for tag in real shim; do run $tag all_reduce -d all -o all -b 8 -e 1M -f 16 -w 2 -n 5 -c 1; mv "$OUT/$tag-all_reduce.txt" "$OUT/$tag-all_reduce-all.txt"; done
for op in $OPS; do
  [ "$op" = all_reduce ] && continue
  for tag in real shim; do run $tag "$op" -b 8 -e 32M -f 16 -w 5 -n 20 -c 1; done
done
grep -h "sucl-nccl" "$OUT"/shim-*.txt | sed 's/0x[0-9a-f]*/C/' | sort | uniq -c | head
python3 - "$OUT" <<'PY'
import sys, glob
out = sys.argv[1]
def times(f):
    d = {}
    for l in open(f):
        p = l.split()
        if len(p) >= 12 and p[0].isdigit() and p[1].isdigit():
            try: d[int(p[0])] = (float(p[5]), float(p[7]))  # out-of-place time (us), busbw
            except ValueError: pass
    return d
for rep in (1, 2):
    a, b = times(f"{out}/real-all_reduce-{rep}.txt"), times(f"{out}/shim-all_reduce-{rep}.txt")
    print(f"## all_reduce float sum, run {rep}: out-of-place time (us, max over ranks) and busbw (GB/s)")
    print("| bytes | real µs | drop-in µs | ratio | real busbw | drop-in busbw |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in sorted(a):
        if s in b:
            print(f"| {s} | {a[s][0]:.2f} | {b[s][0]:.2f} | {b[s][0] / a[s][0]:.2f} | {a[s][1]:.2f} | {b[s][1]:.2f} |")
PY
exit $status
