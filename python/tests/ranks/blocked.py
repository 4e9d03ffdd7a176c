"""Two ranks (explicit init: RANK ADDRESS MODE). Rank 0 blocks in a call rank 1 never joins
(MODE: recv, all_reduce, iall_reduce + wait, cuda: a receive into a CUDA tensor on the
current stream, then synchronize on that stream, or stream-TRANSPORT: a receive enqueued and
started on a StreamQueue over TRANSPORT, then the queue's synchronize) and is sent
SIGINT by the test; it must raise KeyboardInterrupt, and its later calls AbortedError. Rank 1
blocks in a receive rank 0 never sends, and must get the abort as an error."""

import sys

import numpy as np

import sucl

rank, address, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
comm = sucl.init(rank=rank, size=2, address=address)
x = np.ones(1 << 16, np.float32)
comm.barrier()
if mode == "cuda":
    import torch

    torch.cuda.set_device(rank)
    t = torch.ones(1 << 16, device="cuda")
    comm.all_reduce(t)  # both ranks set up the device side first
    comm.synchronize(torch.cuda.current_stream().cuda_stream)
if mode.startswith("stream-"):
    import torch

    torch.cuda.set_device(rank)
    t = torch.ones(1 << 16, device="cuda")
    q = comm.stream_queue(transport=mode.removeprefix("stream-"))  # collective
if rank == 1:
    try:
        comm.recv(x, 0, tag=9)
        print("PEER RETURNED", flush=True)
    except sucl.SuclError as e:
        print(f"PEER {type(e).__name__}: {e}", flush=True)
    sys.exit(0)

print("BLOCKING", flush=True)
try:
    if mode == "recv":
        comm.recv(x, 1, tag=3)
    elif mode == "cuda":
        comm.recv(t, 1, tag=3)
        comm.synchronize(torch.cuda.current_stream().cuda_stream)
    elif mode.startswith("stream-"):
        q.enqueue_recv(t, 1, tag=3)
        q.start()
        q.wait()
        q.synchronize()
    elif mode == "all_reduce":
        comm.all_reduce(x)
    else:
        comm.iall_reduce(x).wait()
    print("RETURNED", flush=True)
    sys.exit(1)
except KeyboardInterrupt:
    print("KEYBOARDINTERRUPT", flush=True)
try:
    comm.barrier()
    print("LATER RETURNED", flush=True)
except sucl.AbortedError as e:
    print(f"LATER AbortedError: {e}", flush=True)
