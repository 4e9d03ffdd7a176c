"""Every collective and send/recv on torch CUDA tensors (one GPU per rank), in place and out of
place, enqueued on a non-default stream, against references computed on the CPU from every
rank's (deterministic) input. Also: mixed host/device arguments are refused before data moves."""

import torch

import sucl

comm = sucl.init()
r, n = comm.rank, comm.size
dev = torch.device("cuda", comm.local_rank % torch.cuda.device_count())
torch.cuda.set_device(dev)
stream = torch.cuda.Stream(dev)


def inp(rank, count=6, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(100 * salt + rank)
    return torch.randint(1, 4, (count,), generator=g).to(dtype)


def done():
    """Waits for the stream through sucl (reports asynchronous errors), then as torch does."""
    comm.synchronize(stream.cuda_stream)
    stream.synchronize()


def same(got, want, what):
    done()
    assert torch.equal(got.cpu(), want), f"rank {r}: {what}: {got.cpu()} vs {want}"


def gpu(t):
    return t.to(dev)


with torch.cuda.stream(stream):
    for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.float64]:
        x = inp(r, dtype=dtype)
        allx = torch.stack([inp(q, dtype=dtype) for q in range(n)])
        for op, ref in [("sum", allx.sum(0)), ("max", allx.max(0).values), ("min", allx.min(0).values)]:
            y = gpu(x)
            comm.all_reduce(y, op=op)
            same(y, ref.to(dtype), f"all_reduce in place {op} {dtype}")
            out = gpu(torch.zeros_like(x))
            comm.all_reduce(gpu(x), out, op=op)
            same(out, ref.to(dtype), f"all_reduce {op} {dtype}")

    x, allx = inp(r), torch.stack([inp(q) for q in range(n)])
    for root in range(n):
        b = gpu(x)
        comm.broadcast(b, root)
        same(b, inp(root), f"broadcast root {root}")

        y = gpu(x)
        comm.reduce(y, None, "sum", root)
        if r == root:
            same(y, allx.sum(0), f"reduce in place root {root}")
        out = gpu(torch.zeros(6))
        comm.reduce(gpu(x), out, "sum", root)
        if r == root:
            same(out, allx.sum(0), f"reduce root {root}")

        g = gpu(torch.zeros(6 * n)) if r == root else None
        comm.gather(gpu(x), g, root)
        if r == root:
            same(g, allx.reshape(-1), f"gather root {root}")

        s = gpu(torch.cat([inp(q, salt=root) for q in range(n)])) if r == root else None
        got = gpu(torch.zeros(6))
        comm.scatter(s, got, root)
        same(got, inp(r, salt=root), f"scatter root {root}")

    ag = gpu(torch.zeros(6 * n))
    comm.all_gather(gpu(x), ag)
    same(ag, allx.reshape(-1), "all_gather")
    ag = gpu(torch.zeros(6 * n))
    ag[6 * r : 6 * (r + 1)] = gpu(x)
    comm.all_gather(None, ag)
    same(ag, allx.reshape(-1), "all_gather in place")

    big = [inp(q, count=6 * n, salt=7) for q in range(n)]
    rs = gpu(torch.zeros(6))
    comm.reduce_scatter(gpu(big[r]), rs, "sum")
    same(rs, torch.stack(big).sum(0)[6 * r : 6 * (r + 1)], "reduce_scatter")

    a2a = gpu(torch.zeros(6 * n))
    comm.all_to_all(gpu(big[r]), a2a)
    same(a2a, torch.cat([big[q][6 * r : 6 * (r + 1)] for q in range(n)]), "all_to_all")

    # Ring send/recv: even ranks send first, odd ranks receive first.
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = gpu(torch.zeros(6))
    if r % 2 == 0:
        comm.send(gpu(x), nxt, 5)
        comm.recv(got, prv, 5)
    else:
        comm.recv(got, prv, 5)
        comm.send(gpu(x), nxt, 5)
    same(got, inp(prv), "send/recv")

    # v-collectives on the device need NCCL; without it they must say so.
    counts = [q + 1 for q in range(n)]
    mine = gpu(torch.full((r + 1,), float(r)))
    av = gpu(torch.zeros(sum(counts)))
    try:
        comm.all_gatherv(mine, av, counts)
        same(av, torch.cat([torch.full((q + 1,), float(q)) for q in range(n)]), "all_gatherv")
        print(f"rank {r}: all_gatherv over NCCL")
    except sucl.BackendUnavailableError as e:
        print(f"rank {r}: all_gatherv refused without NCCL: {e}")

    # Mixed host and device memory: refused before anything moves, output untouched.
    out = gpu(torch.full((6,), -1.0))
    try:
        comm.all_reduce(x, out)
    except sucl.InvalidArgumentError as e:
        assert "host and device" in str(e), e
    else:
        raise AssertionError(f"rank {r}: mixed host/device accepted")
    same(out, torch.full((6,), -1.0), "untouched after refusal")
    # Device memory in a non-blocking point-to-point call is refused (use send/recv).
    try:
        comm.isend(gpu(x), nxt)
    except sucl.InvalidArgumentError as e:
        assert "device" in str(e), e
    else:
        raise AssertionError(f"rank {r}: isend of device memory accepted")

# The calls on device buffers return without waiting for the GPU: work queued behind a slow kernel on the
# stream is still ordered after it (the result is right once the stream ran).
with torch.cuda.stream(stream):
    y = gpu(inp(r))
    torch.cuda._sleep(50_000_000)
    y.mul_(2)
    comm.all_reduce(y)
    same(y, 2 * torch.stack([inp(q) for q in range(n)]).sum(0), "ordered after earlier work")

comm.barrier()
print(f"OK rank {r}")
comm.close()
