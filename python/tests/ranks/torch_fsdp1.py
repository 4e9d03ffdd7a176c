"""FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`, full sharding, on CPU) on a small
model for a few steps over the backend named by argv[1]; rank 0 saves the final (unsharded)
parameters to argv[2]. Ranks start from the same weights (FSDP1's sync_module_states needs a
GPU) and train on different data, so the result depends on every collective FSDP makes
(all_gather_into_tensor of the shards, reduce_scatter_tensor of the gradients)."""

import gc
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

import sucl.torch  # noqa: F401

backend, out = sys.argv[1], sys.argv[2]
dist.init_process_group(backend)
r = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=torch.device("cpu"))
opt = torch.optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(1234 + r)
for step in range(5):
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(fsdp(x), y)
    loss.backward()
    opt.step()
with FSDP.summon_full_params(fsdp):
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
if r == 0:
    torch.save(params, out)
print(f"OK rank {r} loss {loss.item():.6f}", flush=True)
# FSDP holds the process group, as DDP does (torch_ddp.py): dropped here, the group ends while
# Python is alive, not in the interpreter's teardown, where gloo's threads can abort the
# process ("terminate called without an active exception") after all the work is done.
del fsdp, opt, loss
gc.collect()
dist.destroy_process_group()
