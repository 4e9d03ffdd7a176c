"""Every torch.distributed collective on the "sucl" backend, CPU tensors, against references
computed locally from every rank's (deterministic) input."""

import torch
import torch.distributed as dist

import sucl.torch  # noqa: F401  (registers the backend)

dist.init_process_group("sucl")
assert dist.get_backend() == "sucl"
r, n = dist.get_rank(), dist.get_world_size()


def inp(rank, count=6, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(100 * salt + rank)
    return torch.randint(1, 4, (count,), generator=g).to(dtype)


def same(got, want, what):
    assert torch.equal(got, want), f"rank {r}: {what}: {got} vs {want}"


ins = [inp(q) for q in range(n)]
for dtype in [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16]:
    x = inp(r, dtype=dtype)
    allx = torch.stack([inp(q, dtype=dtype) for q in range(n)])
    for op, ref in [(dist.ReduceOp.SUM, allx.sum(0)), (dist.ReduceOp.MAX, allx.max(0).values), (dist.ReduceOp.MIN, allx.min(0).values), (dist.ReduceOp.PRODUCT, allx.prod(0))]:
        y = x.clone()
        dist.all_reduce(y, op=op)
        same(y, ref.to(dtype), f"all_reduce {op} {dtype}")
    y = x.clone()
    w = dist.all_reduce(y, async_op=True)
    w.wait()
    same(y, allx.sum(0).to(dtype), "async all_reduce")
    fut = dist.all_reduce(x.clone(), async_op=True).get_future()
    same(fut.wait()[0], allx.sum(0).to(dtype), "all_reduce future")

x = ins[r].clone()
dist.broadcast(x, src=n - 1)
same(x, ins[n - 1], "broadcast")
x = ins[r].clone()
dist.reduce(x, dst=0)
if r == 0:
    same(x, sum(ins), "reduce")
outs = [torch.zeros(6) for _ in range(n)]
dist.all_gather(outs, ins[r])
for q in range(n):
    same(outs[q], ins[q], "all_gather")
flat = torch.zeros(6 * n)
dist.all_gather_into_tensor(flat, ins[r])
same(flat, torch.cat(ins), "all_gather_into_tensor")
big = [inp(q, 6 * n, salt=3) for q in range(n)]
rs = torch.zeros(6)
dist.reduce_scatter_tensor(rs, big[r])
same(rs, sum(big)[r * 6 : (r + 1) * 6], "reduce_scatter_tensor")
rs = torch.zeros(6)
dist.reduce_scatter(rs, list(big[r].chunk(n)))
same(rs, sum(big)[r * 6 : (r + 1) * 6], "reduce_scatter")
a2a = torch.zeros(6 * n)
dist.all_to_all_single(a2a, big[r])
same(a2a, torch.cat([big[q][r * 6 : (r + 1) * 6] for q in range(n)]), "all_to_all_single")
# uneven all_to_all_single: rank i sends i + j + 1 rows to rank j
isz = [r + j + 1 for j in range(n)]
osz = [i + r + 1 for i in range(n)]
src = torch.arange(sum(isz) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * r
dst = torch.zeros(sum(osz), 2)
dist.all_to_all_single(dst, src, osz, isz)
want = []
for i in range(n):
    off = sum(i + j + 1 for j in range(r))
    want.append((torch.arange(sum(i + j + 1 for j in range(n)) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * i)[off : off + i + r + 1])
same(dst, torch.cat(want), "uneven all_to_all_single")
outs = [torch.zeros(r + q + 1) for q in range(n)]
dist.all_to_all(outs, [torch.full((r + q + 1,), float(10 * r + q)) for q in range(n)])
for q in range(n):
    same(outs[q], torch.full((r + q + 1,), float(10 * q + r)), "all_to_all")
gl = [torch.zeros(6) for _ in range(n)] if r == 0 else None
dist.gather(ins[r], gl, dst=0)
if r == 0:
    for q in range(n):
        same(gl[q], ins[q], "gather")
sc = torch.zeros(6)
dist.scatter(sc, [inp(q, salt=9) for q in range(n)] if r == 0 else None, src=0)
same(sc, inp(r, salt=9), "scatter")
if n >= 2:
    if r == 0:
        dist.send(ins[0], dst=1)
    elif r == 1:
        t = torch.zeros(6)
        dist.recv(t, src=0)
        same(t, ins[0], "send/recv")
    t = torch.zeros(6)
    reqs = [dist.isend(ins[r], (r + 1) % n), dist.irecv(t, (r - 1) % n)]
    for q in reqs:
        q.wait()
    same(t, ins[(r - 1) % n], "isend/irecv")
# Further groups: the whole world again, and ranks 0 and 1 alone (created by every rank, joined
# by members only), each meeting through torch's store under its own prefix.
whole = dist.new_group(backend="sucl")
t = torch.full((3,), float(r))
dist.all_reduce(t, group=whole)
same(t, torch.full((3,), float(sum(range(n)))), "new_group all_reduce")
pair = dist.new_group(ranks=[0, 1], backend="sucl")
if r < 2:
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, group=pair)
    same(t, torch.full((3,), 3.0), "two-rank group all_reduce")
dist.barrier()
objs = [None] * n
dist.all_gather_object(objs, {"rank": r})
assert objs == [{"rank": q} for q in range(n)], objs
print(f"OK rank {r}", flush=True)
dist.destroy_process_group()
