"""dist.all_reduce on CUDA tensors over the "sucl" backend and over nccl, side by side in one job
(one group of each, interleaved rounds, best round per size; every result checked against the
exact integer sum). Prints one table on rank 0. Needs one GPU per rank.

    torchrun --standalone --nproc-per-node 2 python/bench/torch_cuda_vs_nccl.py [--rounds 3]
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import sucl.torch  # noqa: F401

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
args = p.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
    sys.exit("torch_cuda_vs_nccl: needs one GPU per rank")
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl")  # no device_id: a bound device makes new_group look for a cuda backend by type
r, n = dist.get_rank(), dist.get_world_size()
groups = {"sucl": dist.new_group(backend="sucl"), "nccl": dist.new_group(backend="nccl")}
sizes = [8 << (2 * i) for i in range(9)] + [1 << 20, 16 << 20, 128 << 20]  # 8 B .. 512 KiB by 4x
wrong = 0


def iters_for(nbytes):
    return max(10, min(1000, (256 << 20) // max(nbytes, 1)))


def time_one(group, t, iters):
    for _ in range(3):
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def check(group, nbytes):
    """One all_reduce of small integers (exact in f32) against the sum computed here."""
    count = max(1, nbytes // 4)
    t = (torch.arange(count, device=dev, dtype=torch.float32) % 7) + r
    dist.all_reduce(t, group=group)
    want = (torch.arange(count, device=dev, dtype=torch.float32) % 7) * n + n * (n - 1) / 2
    return int((t != want).sum().item())


best = {}
for rnd in range(args.rounds):
    names = list(groups) if rnd % 2 == 0 else list(reversed(groups))
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), device=dev, dtype=torch.float32)
        for name in names:
            dt = time_one(groups[name], t, iters_for(nbytes))
            # the slowest rank's time, as nccl-tests -a 3
            x = torch.tensor([dt], device=dev)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            key = (name, nbytes)
            best[key] = min(best.get(key, float("inf")), x.item())
            if rnd == 0:
                wrong += check(groups[name], nbytes)

w = torch.tensor([wrong], device=dev)
dist.all_reduce(w)
if r == 0:
    print(f"# dist.all_reduce f32 sum on {n} GPUs: best of {args.rounds} interleaved rounds, time max over ranks")
    print("| bytes | sucl µs | nccl µs | sucl / nccl | sucl busbw GB/s | nccl busbw GB/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for nbytes in sizes:
        a, b = best[("sucl", nbytes)], best[("nccl", nbytes)]
        f = 2 * (n - 1) / n
        print(f"| {nbytes} | {a * 1e6:.1f} | {b * 1e6:.1f} | {a / b:.2f} | {nbytes / a * f / 1e9:.2f} | {nbytes / b * f / 1e9:.2f} |")
    print(f"wrong values: {int(w.item())}")
dist.destroy_process_group()
sys.exit(1 if int(w.item()) else 0)
