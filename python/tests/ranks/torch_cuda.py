"""torch.distributed on the "sucl" backend with CUDA tensors under torchrun: all_reduce (sync and
async_op), broadcast, all_gather_into_tensor and reduce_scatter_tensor, against CPU references."""

import os

import torch
import torch.distributed as dist

import sucl.torch  # noqa: F401  (registers the backend)

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("sucl")
r, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", local)


def inp(rank, count=8, dtype=torch.float32):
    return (torch.arange(count) % 5 + rank + 1).to(dtype)


def same(got, want, what):
    torch.cuda.current_stream(dev).synchronize()
    assert torch.equal(got.cpu(), want), f"rank {r}: {what}: {got.cpu()} vs {want}"


allx = torch.stack([inp(q) for q in range(n)])
for dtype in [torch.float32, torch.bfloat16, torch.float16]:
    y = inp(r, dtype=dtype).to(dev)
    dist.all_reduce(y)
    same(y, allx.sum(0).to(dtype), f"all_reduce {dtype}")

s = torch.cuda.Stream(dev)
with torch.cuda.stream(s):
    y = inp(r).to(dev)
    work = dist.all_reduce(y, op=dist.ReduceOp.MAX, async_op=True)
work.wait()  # the current (default) stream now waits for the call on s
z = y * 1  # runs on the default stream, after the all_reduce
same(z, allx.max(0).values, "async all_reduce on a side stream")

b = inp(r).to(dev)
dist.broadcast(b, src=n - 1)
same(b, inp(n - 1), "broadcast")

out = torch.zeros(8 * n, device=dev)
dist.all_gather_into_tensor(out, inp(r).to(dev))
same(out, allx.reshape(-1), "all_gather_into_tensor")

big = torch.stack([torch.arange(8 * n, dtype=torch.float32) + q for q in range(n)])
rs = torch.zeros(8, device=dev)
dist.reduce_scatter_tensor(rs, big[r].to(dev))
same(rs, big.sum(0)[8 * r : 8 * (r + 1)], "reduce_scatter_tensor")

dist.barrier()
dist.destroy_process_group()
print(f"OK rank {r}")
