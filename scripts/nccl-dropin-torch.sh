#!/bin/bash
# PyTorch over the drop-in libnccl.so.2 and over the real NCCL, side by side: torchrun of a script
# doing all_reduce (f32, bf16, f16; sum, max, avg; small ones served by sucl, large and int32 ones
# forwarded), all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv, a new_group
# all_reduce, a DDP training step and a CUDA-graph-captured all_reduce, then small all_reduce
# latency. Every result is saved per rank; the last step compares the two runs tensor by tensor.
# usage: SHIM=path/to/libnccl.so.2 OUT=dir [NPROC=2] scripts/nccl-dropin-torch.sh
case "${1:-}" in -h|--help) sed -n 2,7p "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
set -u
: "${SHIM:?path of the drop-in libnccl.so.2}" "${OUT:?output directory}"
NPROC=${NPROC:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PY="$OUT/nccl_dropin_torch.py"
cat >"$PY" <<'PYEOF'
import json, os, sys, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

out, tag = sys.argv[1], sys.argv[2]
lr = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)
dev = torch.device("cuda", lr)
dist.init_process_group("nccl", device_id=dev)
r, n = dist.get_rank(), dist.get_world_size()
maps = open("/proc/self/maps").read()
libs = sorted({l.split()[-1] for l in maps.splitlines() if "libnccl" in l})
if r == 0:
    print(f"[{tag}] libnccl objects mapped: {libs}; NCCL version {torch.cuda.nccl.version()}")

def ints(k, dtype=torch.float32, shift=0):
    # Small integers: every sum is exact in every dtype, whatever the reduction order.
    return ((torch.arange(k, device=dev) % 13) + r + shift).to(dtype)

res = {}
for dt in (torch.float32, torch.bfloat16, torch.float16):
    x = ints(1000, dt); dist.all_reduce(x); res[f"all_reduce_sum_{dt}"] = x
x = ints(4096); dist.all_reduce(x, op=dist.ReduceOp.MAX); res["all_reduce_max"] = x
x = ints(4096); dist.all_reduce(x, op=dist.ReduceOp.MIN); res["all_reduce_min"] = x
x = ints(4096); dist.all_reduce(x, op=dist.ReduceOp.AVG); res["all_reduce_avg"] = x
x = ints(1 << 20); dist.all_reduce(x); res["all_reduce_4MiB_forwarded"] = x
x = ints(1000, torch.int32); dist.all_reduce(x); res["all_reduce_int32_forwarded"] = x
o = torch.empty(n * 1000, device=dev); dist.all_gather_into_tensor(o, ints(1000)); res["all_gather"] = o
o = torch.empty(1000, device=dev); dist.reduce_scatter_tensor(o, ints(n * 1000)); res["reduce_scatter"] = o
x = ints(1000); dist.broadcast(x, src=0); res["broadcast"] = x
if n >= 2:
    if r == 0:
        dist.send(ints(100, shift=5), 1)
    elif r == 1:
        y = torch.empty(100, device=dev); dist.recv(y, 0); res["recv"] = y
dist.barrier()
g = dist.new_group(list(range(n)))
x = ints(512); dist.all_reduce(x, group=g); res["new_group_all_reduce"] = x
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
ddp = DDP(model, device_ids=[lr])
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator(device=dev).manual_seed(100 + r)
for _ in range(2):
    opt.zero_grad()
    ddp(torch.randn(32, 64, device=dev, generator=gen)).square().mean().backward()
    opt.step()
res["ddp_params"] = torch.cat([p.detach().flatten() for p in model.parameters()])
# A CUDA-graph-captured all_reduce, replayed twice on new inputs.
x = torch.zeros(1024, device=dev)
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        dist.all_reduce(x)
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    dist.all_reduce(x)
for k in range(2):
    x.copy_(ints(1024, shift=k)); graph.replay(); torch.cuda.synchronize(); res[f"graph_replay_{k}"] = x.clone()
torch.cuda.synchronize()
torch.save({k: v.cpu() for k, v in res.items()}, f"{out}/torch-{tag}-{r}.pt")

# Latency: eager calls (host loop, synchronized at the end) and 100 calls captured in a graph.
lat = {}
for nbytes in (1024, 16384, 262144, 4 << 20):
    x = torch.ones(nbytes // 4, device=dev)
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
    iters = 300
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    lat[f"eager_{nbytes}"] = (time.perf_counter() - t0) / iters * 1e6
    g2 = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g2):
        for _ in range(100):
            dist.all_reduce(x)
    g2.replay(); torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        g2.replay()
    torch.cuda.synchronize()
    lat[f"graph_{nbytes}"] = (time.perf_counter() - t0) / 500 * 1e6
json.dump(lat, open(f"{out}/torch-lat-{tag}-{r}.json", "w"))
if r == 0:
    print(f"[{tag}] latency us: " + ", ".join(f"{k} {v:.1f}" for k, v in lat.items()))
# Teardown (comm destroy goes through the drop-in too), bounded: the results are saved already.
import threading
del graph, g2
torch.cuda.synchronize()
t = threading.Thread(target=dist.destroy_process_group, daemon=True)
t.start(); t.join(60)
print(f"[{tag}] rank {r}: destroy_process_group {'returned' if not t.is_alive() else 'still running after 60 s'}")
sys.stdout.flush()
os._exit(0)
PYEOF
status=0
echo "== torchrun, real NCCL"
timeout 150 torchrun --nproc_per_node "$NPROC" "$PY" "$OUT" real >"$OUT/torch-real.log" 2>&1 || { echo "real run failed"; status=1; }
tail -n 3 "$OUT/torch-real.log"
echo "== torchrun, LD_PRELOAD=$SHIM"
SUCL_NCCL_DEBUG=1 LD_PRELOAD="$SHIM" timeout 150 torchrun --nproc_per_node "$NPROC" "$PY" "$OUT" shim >"$OUT/torch-shim.log" 2>&1 || { echo "shim run failed"; status=1; }
grep -E "sucl-nccl|\[shim\]" "$OUT/torch-shim.log" | sort | uniq -c | head -20
tail -n 3 "$OUT/torch-shim.log"
python3 - "$OUT" "$NPROC" <<'PYEOF' || status=1
import json, sys, torch
out, n = sys.argv[1], int(sys.argv[2])
bad = 0
for r in range(n):
    a, b = torch.load(f"{out}/torch-real-{r}.pt"), torch.load(f"{out}/torch-shim-{r}.pt")
    for k in a:
        same = k in b and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
        if not same:
            bad += 1
            d = (a[k].double() - b[k].double()).abs().max().item() if k in b and a[k].shape == b[k].shape else "shape"
            print(f"rank {r}: {k} differs (max abs diff {d})")
print(f"results compared: {len(a)} tensors x {n} ranks, {bad} differ")
print("| latency (us, rank 0) | real NCCL | drop-in | ratio |")
print("|---|---:|---:|---:|")
la, lb = json.load(open(f"{out}/torch-lat-real-0.json")), json.load(open(f"{out}/torch-lat-shim-0.json"))
for k in la:
    print(f"| {k} | {la[k]:.1f} | {lb[k]:.1f} | {lb[k] / la[k]:.2f} |")
sys.exit(1 if bad else 0)
PYEOF
exit $status
