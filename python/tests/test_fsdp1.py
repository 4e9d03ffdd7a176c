"""FSDP1 (`torch.distributed.fsdp.FullyShardedDataParallel`) over the "sucl" backend on CPU
tensors, under real torchrun: the parameters after a few training steps equal those of the same
run over gloo. FSDP1 runs on CPU when given `device_id=torch.device("cpu")` (without it, it asks
for an accelerator; `sync_module_states` needs a GPU, so every rank starts from the same seed)."""

import pytest

from conftest import torchrun

torch = pytest.importorskip("torch")


def test_fsdp1_over_sucl_equals_fsdp1_over_gloo(tmp_path):
    params = {}
    for backend in ["sucl", "gloo"]:
        path = tmp_path / f"{backend}.pt"
        rc, out = torchrun(2, "torch_fsdp1.py", backend, path)
        assert rc == 0, out
        assert "OK rank 0" in out and "OK rank 1" in out, out
        params[backend] = torch.load(path)
    assert params["sucl"].keys() == params["gloo"].keys()
    for k in params["gloo"]:
        a, b = params["sucl"][k], params["gloo"][k]
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (k, (a - b).abs().max())
    # The check means something only if training moved the weights away from the start.
    torch.manual_seed(0)
    start = torch.nn.Linear(16, 32)
    assert not torch.allclose(start.weight, params["gloo"]["0.weight"])
