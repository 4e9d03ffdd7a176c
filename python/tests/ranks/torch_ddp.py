"""DDP on a small model for a few steps over the backend named by argv[1]; rank 0 saves the
final parameters to argv[2]. Ranks start from different weights (DDP broadcasts rank 0's) and
train on different data, so the result depends on every collective DDP makes."""

import gc
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sucl.torch  # noqa: F401

backend, out = sys.argv[1], sys.argv[2]
dist.init_process_group(backend)
r = dist.get_rank()
torch.manual_seed(r)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
ddp = DDP(model, bucket_cap_mb=0.001)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(1234 + r)
for step in range(5):
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
if r == 0:
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
print(f"OK rank {r} loss {loss.item():.6f}", flush=True)
# DDP holds the process group: destroy_process_group alone leaves it to the interpreter's
# teardown, where gloo's threads can abort the process ("terminate called without an active
# exception") after all the work is done. Dropped here, the group ends while Python is alive.
del ddp, opt
gc.collect()
dist.destroy_process_group()
