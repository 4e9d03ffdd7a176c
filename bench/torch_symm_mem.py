"""The bar for sucl's peer-memory all_reduce: torch's symmetric-memory one-shot and two-shot
kernels and torch's NCCL all_reduce, f32 sum, each captured 100 times into one CUDA graph and
replayed (best of 20 replays), so that no Python launch cost is counted.

usage: torchrun --nproc_per_node N bench/torch_symm_mem.py OUT.tsv
(set TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 where NVLink multicast must stay off)
Writes OUT.tsv on rank 0: bytes, nccl_us, one_shot_us, two_shot_us (nan where a kernel refused),
then copy_us (one device-to-device copy of the message, torch's `copy_`) and two_shot_copied_us:
the two-shot on a symmetric buffer that the input is first copied into and the result copied out
of, which is what an all_reduce from and into memory the caller allocated itself costs (sucl's
peer-memory kernels work from such memory, copying it into their shared buffer inside the kernel).
"""
import sys

if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)
    sys.exit(0)

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

SIZES = [8, 64, 512, 4096, 32768, 262144, 524288, 1 << 20, 2 << 20, 4 << 20]


def replay_us(call, per_graph=100, replays=20):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(5):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            call()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / per_graph)
    return best


def symm_us(kernel, n, group):
    try:
        buf = symm_mem.empty(n, device="cuda", dtype=torch.float32)
        symm_mem.rendezvous(buf, group)
        buf.fill_(1.0)
        return replay_us(lambda: kernel(buf, group))
    except Exception as e:  # noqa: BLE001 - a size the kernel refuses is a row of nan
        print(f"{kernel.__name__} refused {n * 4} bytes: {str(e)[:160]}", flush=True)
        return float("nan")


def copied_us(kernel, n, group):
    """The kernel on a symmetric buffer between a copy in from and a copy out to ordinary memory."""
    try:
        buf = symm_mem.empty(n, device="cuda", dtype=torch.float32)
        symm_mem.rendezvous(buf, group)
        x, out = torch.ones(n, device="cuda"), torch.empty(n, device="cuda")

        def call():
            buf.copy_(x)
            kernel(buf, group)
            out.copy_(buf)

        return replay_us(call)
    except Exception as e:  # noqa: BLE001 - as in symm_us
        print(f"{kernel.__name__} (copied) refused {n * 4} bytes: {str(e)[:160]}", flush=True)
        return float("nan")


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    group = dist.group.WORLD.group_name
    symm_mem.enable_symm_mem_for_group(group)

    def one_shot(buf, g):
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", g)

    def two_shot(buf, g):
        return torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", g)

    rows = []
    for nbytes in SIZES:
        n = max(nbytes // 4, 2)
        x = torch.ones(n, device="cuda")
        y = torch.empty_like(x)
        row = (
            nbytes,
            replay_us(lambda: dist.all_reduce(x)),
            symm_us(one_shot, n, group),
            symm_us(two_shot, n, group),
            replay_us(lambda: y.copy_(x)),
            copied_us(two_shot, n, group),
        )
        rows.append(row)
        if rank == 0:
            print("%d bytes: nccl %.2f us, one-shot %.2f us, two-shot %.2f us, copy %.2f us, two-shot copied in and out %.2f us" % row, flush=True)
    if rank == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write("bytes\tnccl_us\tone_shot_us\ttwo_shot_us\tcopy_us\ttwo_shot_copied_us\n")
            for r in rows:
                f.write("\t".join(str(v) for v in r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
