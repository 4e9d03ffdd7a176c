#!/usr/bin/env bash
# Figures gpu-ipc-4gpu and gpu-staged-lanes (device machine, RANKS GPUs that reach each other's
# memory, default 4), side by side in one job, every row checked (#wrong):
#  1. the peer-memory correctness matrix at RANKS ranks (all_reduce, all_gather, reduce_scatter,
#     broadcast; f32, f16, bf16, f64; sum, max, avg; CUDA-graph replays);
#  2. all_reduce 8 B-16 MiB (--compare raw,nccl,ipc,auto) with the defaults, with SUCL_IPC_PUSH=0
#     (one-shot reading the peers' buffers) and, if BEFORE names an older sucl, with it; then the
#     same captured into CUDA graphs (8 B-4 MiB);
#  3. torch's symmetric-memory one-/two-shot (also between copies in and out of ordinary memory)
#     and torch's NCCL, graph-captured (bench/torch_symm_mem.py), and nccl-tests' all_reduce_perf -a 3 if NCCL_TESTS names a build;
#  4. the staged all_reduce at 2 and RANKS ranks with SUCL_STAGED_LANES=1 (one progress thread,
#     the pipeline before lanes), 4 (the default) and 8.
# usage: [SUCL=target/release/sucl] [BEFORE=old/sucl] [NCCL_TESTS=nccl-tests-dir] [RANKS=4]
#        [OUT=target/bench/ipc4] bench/gpu-ipc-4gpu.sh
# Writes OUT/gpu-ipc-4gpu.csv (ipc_us: the defaults, i.e. the push run below the two-shot
# threshold and the pull run from it, which run the same kernels there) and OUT/gpu-staged-lanes.csv.
case "${1:-}" in -h|--help) sed -n 2,18p "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SUCL_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
SUCL=${SUCL:-target/release/sucl}; RANKS=${RANKS:-4}; OUT=${OUT:-target/bench/ipc4}
mkdir -p "$OUT"
status=0
"$SUCL" check --device cuda --ranks "$RANKS" --device-backends ipc --ops all_reduce,all_gather,reduce_scatter,broadcast \
  --dtypes f32,f16,bf16,f64 --redops sum,max,avg --big-mib 8 --graph >"$OUT/check.txt" 2>&1 || status=1
grep -q ", 0 wrong" "$OUT/check.txt" || { echo "gpu-ipc-4gpu: the ipc check failed ($OUT/check.txt)" >&2; exit 1; }
BA=(bench all_reduce --device cuda --ranks "$RANKS" --min-bytes 8 --factor 2 --rounds 2 --iters 100 --warmup 10)
run() { local name=$1; shift; "$@" >"$OUT/$name.txt" 2>&1 || { echo "gpu-ipc-4gpu: $name failed" >&2; status=1; }; }
run push "$SUCL" "${BA[@]}" --max-bytes 16M --compare raw,nccl,ipc,auto
run pull env SUCL_IPC_PUSH=0 "$SUCL" "${BA[@]}" --max-bytes 16M --compare nccl,ipc
[ -n "${BEFORE:-}" ] && run before "$BEFORE" "${BA[@]}" --max-bytes 16M --compare raw,nccl,ipc,auto
run graph-push "$SUCL" "${BA[@]}" --max-bytes 4M --graph --compare nccl,ipc
run graph-pull env SUCL_IPC_PUSH=0 "$SUCL" "${BA[@]}" --max-bytes 4M --graph --compare nccl,ipc
[ -n "${BEFORE:-}" ] && run graph-before "$BEFORE" "${BA[@]}" --max-bytes 4M --graph --compare nccl,ipc
python3 -m torch.distributed.run --nproc_per_node "$RANKS" bench/torch_symm_mem.py "$OUT/torch.tsv" >"$OUT/torch.txt" 2>&1 || status=1
if [ -n "${NCCL_TESTS:-}" ]; then
  mpirun --allow-run-as-root -np "$RANKS" -x NCCL_NVLS_ENABLE "$NCCL_TESTS/build/all_reduce_perf" \
    -b 8 -e 16M -f 2 -g 1 -w 20 -n 100 -a 3 >"$OUT/nccl-tests.txt" 2>&1 || status=1
fi
SB=(bench all_reduce --device cuda --min-bytes 16M --max-bytes 128M --factor 2 --rounds 1 --iters 5 --warmup 1 --compare staged)
for n in 2 "$RANKS"; do
  for lanes in 1 4 8; do run "staged-$n-$lanes" env SUCL_STAGED_LANES=$lanes "$SUCL" "${SB[@]}" --ranks "$n"; done
done
python3 - "$OUT" "$RANKS" <<'PY'
import os, sys
out, ranks = sys.argv[1], sys.argv[2]
def table(name):
    d, hdr = {}, None
    path = os.path.join(out, name + ".txt")
    if not os.path.exists(path):
        return d
    for line in open(path):
        p = line.split()
        if p and p[0] == "bytes":
            hdr = p[1:]
        elif hdr and p and p[0].isdigit():
            d[int(p[0])] = dict(zip(hdr, p[1:]))
    return d
nt = {}
if os.path.exists(os.path.join(out, "nccl-tests.txt")):
    for line in open(os.path.join(out, "nccl-tests.txt")):
        p = line.split()
        if len(p) >= 12 and p[0].isdigit() and p[1].isdigit():
            nt[int(p[0])] = p[5]
torch = {}
if os.path.exists(os.path.join(out, "torch.tsv")):
    for line in open(os.path.join(out, "torch.tsv")).readlines()[1:]:
        b, *v = line.split()
        torch[int(b)] = ["%.2f" % float(x) for x in v]
two_shot_from = (4 << 20) // int(ranks)
with open(os.path.join(out, "gpu-ipc-4gpu.csv"), "w") as f:
    f.write("mode,bytes,nccl_tests_us,sucl_nccl_us,ipc_us,ipc_push_run_us,ipc_pull_run_us,ipc_before_us,auto_before_us,"
            "torch_nccl_us,torch_one_shot_us,torch_two_shot_us,torch_copy_us,torch_two_shot_copied_us,wrong\n")
    for mode, pre in (("stream", ""), ("graph", "graph-")):
        push, pull, before = table(pre + "push"), table(pre + "pull"), table(pre + "before")
        for s in sorted(push):
            b = before.get(s, {})
            wrong = sum(int(t.get(s, {}).get("#wrong", 0)) for t in (push, pull, before))
            ipc = push[s]["ipc"] if s < two_shot_from else pull.get(s, {}).get("ipc", "")
            t = (torch.get(s, []) + [""] * 5)[:5] if mode == "graph" else [""] * 5
            f.write(f"{mode},{s},{nt.get(s, '') if mode == 'stream' else ''},{push[s]['nccl']},{ipc},{push[s]['ipc']},"
                    f"{pull.get(s, {}).get('ipc', '')},{b.get('ipc', '')},{b.get('auto', '')},{t[0]},{t[1]},{t[2]},{t[3]},{t[4]},{wrong}\n")
with open(os.path.join(out, "gpu-staged-lanes.csv"), "w") as f:
    f.write("ranks,lanes,bytes,time_us,algbw_gbs,wrong\n")
    for n in sorted({2, int(ranks)}):
        for lanes in (1, 4, 8):
            path = os.path.join(out, f"staged-{n}-{lanes}.txt")
            for line in open(path) if os.path.exists(path) else []:
                p = line.split()
                if p and p[0].isdigit():
                    f.write(f"{n},{lanes},{p[0]},{p[3]},{p[4]},{p[6]}\n")
PY
cat "$OUT/gpu-ipc-4gpu.csv"
exit $status
