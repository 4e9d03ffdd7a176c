"""Training steps of a small model under DDP (or FSDP2, fully_shard) over the "sucl" backend and over a
baseline (nccl on CUDA, gloo on CPU), side by side in one job. Each round trains a fresh copy
of the model from the same weights on the same data per backend, interleaved; the time of a
step is the mean over the timed steps, max over ranks, and the best round is kept. Checked:
after training, every rank holds the same parameters, and the sucl run's parameters equal the
baseline run's within float tolerance. Prints one table on rank 0; exit status 1 if a check
failed. Needs one GPU per rank for --device cuda.

    torchrun --standalone --nproc-per-node 2 python/bench/ddp_gpu.py --model mlp
    torchrun --standalone --nproc-per-node 2 python/bench/ddp_gpu.py --model transformer --wrap fsdp
    torchrun --standalone --nproc-per-node 2 python/bench/ddp_gpu.py --device cpu --model tiny
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sucl.torch  # noqa: F401

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--model", choices=["mlp", "transformer", "tiny"], default="mlp", help="what to train (tiny: a quick check)")
p.add_argument("--wrap", choices=["ddp", "fsdp"], default="ddp", help="DistributedDataParallel or FSDP2 (fully_shard)")
p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda: one GPU per rank, baseline nccl; cpu: baseline gloo")
p.add_argument("--steps", type=int, default=20, help="timed steps per round")
p.add_argument("--warmup", type=int, default=3, help="untimed steps first in each round")
p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per backend; the best is kept")
p.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance of sucl's parameters against the baseline's")
args = p.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
if args.device == "cuda":
    if not torch.cuda.is_available() or torch.cuda.device_count() <= local:
        sys.exit("ddp_gpu: --device cuda needs one GPU per rank")
    torch.cuda.set_device(local)
    dev, baseline = torch.device("cuda", local), "nccl"
else:
    dev, baseline = torch.device("cpu"), "gloo"
dist.init_process_group(baseline)  # no device_id: a bound device makes new_group look for a cuda backend by type
rank, world = dist.get_rank(), dist.get_world_size()
groups = {"sucl": dist.new_group(backend="sucl"), baseline: dist.new_group(backend=baseline)}
check_group = groups[baseline]


def build():
    """The model, the same weights on every rank and for every backend."""
    torch.manual_seed(0)
    if args.model == "tiny":
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    elif args.model == "mlp":
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
        m = torch.nn.Sequential(*layers)
    else:
        layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, dropout=0.0, batch_first=True)
        m = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    return m.to(dev)


def batch(step):
    """This rank's input and target for `step` (different on every rank)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    shape = {"tiny": (16, 64), "mlp": (256, 2048), "transformer": (8, 256, 1024)}[args.model]
    x, y = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    return x.to(dev), y.to(dev)


def wrap(model, group):
    if args.wrap == "ddp":
        return DDP(model, device_ids=[local] if dev.type == "cuda" else None, process_group=group)
    # FSDP2: every block sharded on its own, then the root (all_gather_into_tensor and
    # reduce_scatter_tensor on the group).
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, dev.type)
    blocks = model.layers if isinstance(model, torch.nn.TransformerEncoder) else [m for m in model if isinstance(m, torch.nn.Linear)]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full_parameters(model):
    """Every parameter, flattened into one tensor. Sharded (FSDP2) parameters are gathered over
    the baseline's group: DTensor's own `full_tensor()` needs a group with a C++ backend."""
    parts = []
    for q in model.parameters():
        if not hasattr(q, "to_local"):
            parts.append(q.detach().reshape(-1).clone())
            continue
        local = q.to_local().detach().reshape(-1)  # dim-0 shards, in rank order
        sizes = [None] * world
        dist.all_gather_object(sizes, local.numel(), group=check_group)
        padded = torch.zeros(max(sizes), dtype=local.dtype, device=dev)
        padded[: local.numel()] = local
        shards = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(shards, padded, group=check_group)
        parts.append(torch.cat([s[:n] for s, n in zip(shards, sizes)]))
    return torch.cat(parts)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train(name):
    """One round on `name`'s group: seconds per step (max over ranks) and the final parameters."""
    model = build()
    wrapped = wrap(model, groups[name])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)

    def step(i):
        x, y = batch(i)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(wrapped(x), y)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    sync()
    dist.barrier(group=check_group)
    sync()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - start) / args.steps], dtype=torch.float64, device=dev)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=check_group)
    params = full_parameters(model)
    del wrapped, opt
    return elapsed.item(), params


def same_on_every_rank(params):
    """Whether rank 0's parameters equal this rank's exactly, agreed over all ranks."""
    ref = params.clone()
    dist.broadcast(ref, 0, group=check_group)
    differ = torch.tensor([0 if torch.equal(ref, params) else 1], dtype=torch.int32, device=dev)
    dist.all_reduce(differ, group=check_group)
    return differ.item() == 0


best = {}
final = {}
for _ in range(args.rounds):
    for name in ("sucl", baseline):
        t, params = train(name)
        best[name] = min(best.get(name, float("inf")), t)
        final[name] = params
consistent = {name: same_on_every_rank(final[name]) for name in final}
scale = final[baseline].abs().max().item()
diff = (final["sucl"] - final[baseline]).abs().max().item()
close = torch.allclose(final["sucl"], final[baseline], rtol=args.rtol, atol=args.rtol * scale * 1e-2)
ok = all(consistent.values()) and close
if rank == 0:
    n = final[baseline].numel()
    print(f"# {args.wrap} {args.model} ({n / 1e6:.1f} M parameters) on {world} ranks ({dev.type}), torch {torch.__version__}")
    print(f"# {args.steps} timed steps after {args.warmup}, best of {args.rounds} interleaved rounds; ms per step (max over ranks)")
    print(f"{'backend':>8} {'ms/step':>9} {'same on all ranks':>18}")
    for name in ("sucl", baseline):
        print(f"{name:>8} {best[name] * 1e3:9.3f} {str(consistent[name]):>18}")
    print(f"sucl / {baseline} = {best['sucl'] / best[baseline]:.3f}")
    print(f"parameters: max |sucl - {baseline}| = {diff:.3e} (largest |parameter| {scale:.3e}), within rtol {args.rtol}: {close}")
    print("RESULT OK" if ok else "RESULT WRONG", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
