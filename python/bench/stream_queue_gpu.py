"""A ring exchange per batch (each rank receives from its left neighbour and sends to its right
one) on torch CUDA tensors, side by side in one job: sucl.StreamQueue (enqueue_recv,
enqueue_send, start, wait) against torch's `dist.batch_isend_irecv` on the nccl backend (its
works waited for, which makes the current stream wait: no host sync either). Per size: the time
of a batch (iterations back to back on one stream, mean over the timed ones after a warm-up,
max over ranks) and the host time the loop took per batch (what the Python calls cost), with
the queue's host time split into its two enqueues, its start and its wait (rank 0's). The
received data is checked on both sides. Needs one GPU per rank.

    torchrun --standalone --nproc-per-node 2 python/bench/stream_queue_gpu.py
    torchrun --standalone --nproc-per-node 2 python/bench/stream_queue_gpu.py --transport staged --iters 200
"""

import argparse
import time

import torch
import torch.distributed as dist

import sucl

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--transport", default="nccl", choices=["auto", "nccl", "staged"], help="the queue's transport")
p.add_argument("--sizes", default="8,65536,1048576,16777216", help="message sizes in bytes, comma-separated")
p.add_argument("--iters", type=int, default=500, help="timed batches per size")
p.add_argument("--warmup", type=int, default=50, help="untimed batches per size")
args = p.parse_args()

comm = sucl.init()
r, n = comm.rank, comm.size
dev = torch.device("cuda", comm.local_rank % torch.cuda.device_count())
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
stream = torch.cuda.Stream(dev)
q = comm.stream_queue(stream, transport=args.transport)
left, right = (r - 1) % n, (r + 1) % n


# Host seconds spent in the queue's calls, by kind, since the last timed() began.
spent = {"enqueue": 0.0, "start": 0.0, "wait": 0.0}


def sucl_batch(got, out):
    t0 = time.perf_counter()
    q.enqueue_recv(got, left)
    q.enqueue_send(out, right)
    t1 = time.perf_counter()
    q.start()
    t2 = time.perf_counter()
    q.wait()
    t3 = time.perf_counter()
    spent["enqueue"] += t1 - t0
    spent["start"] += t2 - t1
    spent["wait"] += t3 - t2


def torch_batch(got, out):
    ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, out, right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def timed(batch, count):
    """(seconds per batch on the stream, host seconds per batch), max over ranks."""
    out = torch.full((count,), float(r + 1), device=dev)
    got = torch.zeros(count, device=dev)
    for _ in range(args.warmup):
        batch(got, out)
    torch.cuda.synchronize(dev)
    for k in spent:
        spent[k] = 0.0
    t0 = time.perf_counter()
    for _ in range(args.iters):
        batch(got, out)
    host = time.perf_counter() - t0
    torch.cuda.synchronize(dev)
    total = time.perf_counter() - t0
    assert torch.equal(got, torch.full_like(got, float(left + 1))), f"rank {r}: wrong data"
    t = torch.tensor([total / args.iters, host / args.iters], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


with torch.cuda.stream(stream):
    rows = []
    for size in map(int, args.sizes.split(",")):
        count = max(1, size // 4)
        s = timed(sucl_batch, count)
        calls = [spent[k] / args.iters for k in ("enqueue", "start", "wait")]
        q.synchronize()
        t = timed(torch_batch, count)
        rows.append((count * 4, s, t, calls))
q.close()
if r == 0:
    print(f"ring exchange per batch, {n} ranks, queue transport {q.transport}, {args.iters} batches")
    print(f"{'bytes':>10} {'sucl us':>9} {'nccl us':>9} {'ratio':>6} {'sucl host us':>13} {'nccl host us':>13}"
          f" {'2 enqueues us':>14} {'start us':>9} {'wait us':>8}")
    for size, s, t, c in rows:
        print(f"{size:>10} {s[0] * 1e6:>9.2f} {t[0] * 1e6:>9.2f} {s[0] / t[0]:>6.2f} {s[1] * 1e6:>13.2f} {t[1] * 1e6:>13.2f}"
              f" {c[0] * 1e6:>14.2f} {c[1] * 1e6:>9.2f} {c[2] * 1e6:>8.2f}")
dist.destroy_process_group()
comm.close()
