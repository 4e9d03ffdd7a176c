"""dist.all_reduce on CPU tensors over the "sucl" backend and over gloo, side by side in one job
(one group of each, interleaved rounds, best round per size). Prints one table on rank 0.

    torchrun --standalone --nproc-per-node 2 python/bench/torch_vs_gloo.py [--rounds 3]
"""

import argparse
import time

import torch
import torch.distributed as dist

import sucl.torch  # noqa: F401

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept")
args = p.parse_args()

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
groups = {"sucl": dist.new_group(backend="sucl"), "gloo": dist.new_group(backend="gloo")}
sizes = [8 << (2 * i) for i in range(9)] + [16 << 20]  # 8 B .. 512 KiB by 4x, then 1 MiB, 16 MiB
sizes = sorted(set(sizes + [1 << 20]))


def iters_for(nbytes):
    return max(10, min(2000, (64 << 20) // max(nbytes, 1) // 4))


def time_one(group, t, iters):
    for _ in range(max(3, iters // 10)):
        dist.all_reduce(t, group=group)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


best = {}
for _ in range(args.rounds):
    for nbytes in sizes:
        t = torch.ones(max(nbytes // 4, 2), dtype=torch.float32)
        for name, g in groups.items():
            s = time_one(g, t, iters_for(nbytes))
            key = (nbytes, name)
            best[key] = min(best.get(key, s), s)
if r == 0:
    print(f"{n} ranks, float32 sum, best of {args.rounds} rounds")
    print(f"{'bytes':>10} {'sucl us':>10} {'gloo us':>10} {'sucl/gloo':>10} {'sucl busbw':>11} {'gloo busbw':>11}")
    for nbytes in sizes:
        a, b = best[(nbytes, "sucl")], best[(nbytes, "gloo")]
        bw = lambda s: 2 * (n - 1) / n * nbytes / s / 1e9  # noqa: E731
        print(f"{nbytes:>10} {a * 1e6:>10.2f} {b * 1e6:>10.2f} {a / b:>10.2f} {bw(a):>10.2f}G {bw(b):>10.2f}G")
dist.destroy_process_group()
