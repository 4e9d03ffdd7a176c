"""A sucl.StreamQueue on a torch CUDA stream, one GPU per rank: `stream_queue.py TRANSPORT PARTS`.

PARTS is a comma-separated list of
- exchange: each step, a ring exchange (recv from the left, send to the right) started, torch
  kernels launched on the same stream between start() and wait(), then an all_reduce batch; the
  results feed the next step on the stream with no host sync, and are checked at the end
  against a NumPy simulation of every rank. Then one batch of broadcast, all_gather (out of
  place and in place), reduce_scatter and all_to_all, checked against NumPy references.
- bad_input: host memory, a non-contiguous tensor, mismatched element types, another GPU's
  memory or stream, a buffer two operations of one batch write, and wait() before start() are
  refused with InvalidArgumentError, nothing enqueued; a correct exchange then still works.
- drop: tensors dropped right after they were enqueued (their memory free for torch to reuse
  while the operation is in flight) are still sent and received correctly.
Prints "OK rank R" at the end."""

import gc
import sys

import numpy as np
import torch

import sucl

transport, parts = sys.argv[1], sys.argv[2]
comm = sucl.init()
r, n = comm.rank, comm.size
ngpu = torch.cuda.device_count()
dev = torch.device("cuda", comm.local_rank % ngpu)
torch.cuda.set_device(dev)
stream = torch.cuda.Stream(dev)
q = comm.stream_queue(stream, transport=transport)
assert q.transport == transport, (q, transport)
assert q.stream == stream.cuda_stream, q
assert (q.rank, q.size) == (r, n), q
left, right = (r - 1) % n, (r + 1) % n
N = 4099  # not a power of two: a length NCCL and the staging slots must both honour


def exchange():
    steps = 4
    x = [np.full(N, float(k + 1), np.float64) for k in range(n)]  # every rank's x, simulated
    with torch.cuda.stream(stream):
        mine = torch.full((N,), float(r + 1), dtype=torch.float64, device=dev)
        a = torch.randn(512, 512, device=dev)
        for step in range(steps):
            out = mine * 2 + step  # a torch kernel writes what the queue sends
            got = torch.empty(N, dtype=torch.float64, device=dev)
            rr = q.enqueue_recv(got, left, tag=step)
            q.enqueue_send(out, right, tag=step)
            q.start()
            for _ in range(4):  # torch kernels on the stream while the ring moves
                a = torch.tanh(a @ a)
            q.wait()
            summed = torch.empty(N, dtype=torch.float64, device=dev)
            q.enqueue_all_reduce(got, summed)  # got: written by the ring batch, read here
            q.enqueue_all_reduce(out)  # in place
            q.start()
            q.wait()
            mine = summed + out  # uses both results on the stream: no host wait before
            if step == 0:
                assert rr.wait() == N, "a receive reports its element count"
            outs = [2 * xk + step for xk in x]
            gots = [outs[(k - 1) % n] for k in range(n)]
            total, total_out = sum(gots), sum(outs)
            x = [total + total_out for _ in range(n)]
        q.synchronize()
        assert np.array_equal(mine.cpu().numpy(), x[r]), f"rank {r}: {mine.cpu()[:4]} vs {x[r][:4]}"
        collectives()


def collectives():
    def inp(rank, count, salt):
        g = torch.Generator().manual_seed(1000 * salt + rank)
        return torch.randint(-50, 50, (count,), generator=g).to(torch.float32)

    every = [inp(k, 6 * n, 1) for k in range(n)]
    b = inp(r, 7, 2).to(dev)
    send = every[r].to(dev)
    gathered = torch.empty(6 * n * n, device=dev)
    in_place = torch.zeros(5 * n, device=dev)
    in_place[5 * r : 5 * r + 5] = inp(r, 5, 3).to(dev)
    scattered = torch.empty(6, device=dev)
    swapped = torch.empty(6 * n, device=dev)
    q.enqueue_broadcast(b, root=n - 1)
    q.enqueue_all_gather(send, gathered)
    q.enqueue_all_gather(None, in_place)
    q.enqueue_reduce_scatter(send, scattered, op="max")
    q.enqueue_all_to_all(send, swapped)
    q.start()
    q.wait()
    q.synchronize()
    blocks = [e.reshape(n, 6) for e in every]
    want = {
        "broadcast": (b, inp(n - 1, 7, 2)),
        "all_gather": (gathered, torch.cat(every)),
        "all_gather in place": (in_place, torch.cat([inp(k, 5, 3) for k in range(n)])),
        "reduce_scatter max": (scattered, torch.stack(every).max(0).values[6 * r : 6 * r + 6]),
        "all_to_all": (swapped, torch.cat([blocks[k][r] for k in range(n)])),
    }
    for what, (got, ref) in want.items():
        assert torch.equal(got.cpu(), ref), f"rank {r}: {what}: {got.cpu()} vs {ref}"


def refused(what, f, says):
    try:
        f()
    except sucl.InvalidArgumentError as e:
        assert says in str(e), f"rank {r}: {what}: {e}"
        assert q.enqueued == 0, f"rank {r}: {what} left {q.enqueued} operation(s) enqueued"
        return
    raise AssertionError(f"rank {r}: {what} was accepted")


def bad_input():
    with torch.cuda.stream(stream):
        t = torch.zeros(8, device=dev)
        refused("a CPU tensor", lambda: q.enqueue_send(torch.zeros(8), right), "is host memory")
        refused("a NumPy array", lambda: q.enqueue_all_reduce(np.zeros(8, np.float32)), "is host memory")
        refused("a non-contiguous tensor", lambda: q.enqueue_recv(torch.zeros(4, 4, device=dev).t(), left), "not contiguous")
        refused("mixed element types", lambda: q.enqueue_all_reduce(t, torch.zeros(8, dtype=torch.float64, device=dev)), "element type")
        refused("a CPU result", lambda: q.enqueue_all_reduce(t, torch.zeros(8)), "host memory")
        refused("reduce_scatter in place", lambda: q.enqueue_reduce_scatter(t, t), "overlaps send")
        refused("a peer out of range", lambda: q.enqueue_send(t, n + 3), "out of range")
        refused("a bad transport", lambda: comm.stream_queue(stream, transport="fast"), "transport")
        if ngpu > 1:
            other = torch.device("cuda", (dev.index + 1) % ngpu)
            refused("another GPU's tensor", lambda: q.enqueue_send(torch.zeros(8, device=other), right), "GPU")
            refused("another GPU's stream", lambda: q.wait_on(torch.cuda.Stream(other)), "is a stream of GPU")
        got = torch.zeros(8, device=dev)
        q.enqueue_recv(got, left, tag=1)
        try:
            q.enqueue_recv(got, right, tag=2)
            raise AssertionError(f"rank {r}: one tensor received twice in a batch was accepted")
        except sucl.InvalidArgumentError as e:
            assert "one buffer lent to two operations of one batch" in str(e), e
        try:
            q.wait()
            raise AssertionError(f"rank {r}: wait() before start() was accepted")
        except sucl.InvalidArgumentError as e:
            assert "never started" in str(e), e
        q.enqueue_send(torch.full((8,), float(r), device=dev), right, tag=1)
        q.start()
        q.wait()
        q.synchronize()
        assert torch.equal(got.cpu(), torch.full((8,), float(left))), f"rank {r}: {got.cpu()}"


def drop():
    with torch.cuda.stream(stream):
        for step in range(3):
            got = torch.zeros(N, device=dev)
            got_ptr = got.data_ptr()
            rr = q.enqueue_recv(got, left, tag=10 + step)
            del got  # only the queue holds it now
            q.enqueue_send(torch.full((N,), 7.0 + r + step, device=dev), right, tag=10 + step)
            gc.collect()
            # Were the two tensors free, torch would hand their blocks out again here (same
            # size, same stream) and these writes would land before the queue's copies.
            junk = [torch.full((N,), -1.0, device=dev) for _ in range(2)]
            assert got_ptr not in [j.data_ptr() for j in junk], f"rank {r}: a received tensor's memory was reused while in flight"
            q.start()
            q.wait()
            assert rr.wait() == N
            del junk
        q.synchronize()
        # A send whose tensor is dropped at once delivers its data, not whatever reuses it.
        got = torch.zeros(N, device=dev)
        q.enqueue_recv(got, left, tag=20)
        q.enqueue_send(torch.full((N,), 100.0 + r, device=dev), right, tag=20)
        gc.collect()
        junk = [torch.full((N,), -1.0, device=dev) for _ in range(2)]
        q.start()
        q.wait()
        q.synchronize()
        assert torch.equal(got.cpu(), torch.full((N,), 100.0 + left)), f"rank {r}: received {got.cpu()[:4]} (a dropped send's memory reused?)"
        del junk


for part in parts.split(","):
    {"exchange": exchange, "bad_input": bad_input, "drop": drop}[part]()
q.close()
assert "closed" in repr(q), repr(q)
try:
    q.start()
    raise AssertionError("start() on a closed queue was accepted")
except sucl.InvalidArgumentError:
    pass
comm.barrier()  # the parent communicator is still usable
comm.close()
print(f"OK rank {r}", flush=True)
