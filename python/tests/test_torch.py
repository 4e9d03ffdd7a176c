"""The torch.distributed backend under real torchrun, CPU tensors."""

import pytest

from conftest import REPO, torchrun

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 3])
def test_every_torch_collective(n):
    rc, out = torchrun(n, "torch_collectives.py")
    assert rc == 0, out
    for r in range(n):
        assert f"OK rank {r}" in out, out


def test_ddp_over_sucl_equals_ddp_over_gloo(tmp_path):
    params = {}
    for backend in ["sucl", "gloo"]:
        path = tmp_path / f"{backend}.pt"
        rc, out = torchrun(2, "torch_ddp.py", backend, path)
        assert rc == 0, out
        params[backend] = torch.load(path)
    assert params["sucl"].keys() == params["gloo"].keys()
    for k in params["gloo"]:
        a, b = params["sucl"][k], params["gloo"][k]
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), (k, a, b)
    # The check means something only if training moved the weights away from rank 0's start.
    torch.manual_seed(0)
    start = torch.nn.Linear(16, 32)
    assert not torch.allclose(start.weight, params["gloo"]["0.weight"])


def test_sucl_init_under_torchrun_meets_at_torchruns_store():
    # No torch.distributed here: sucl.init() reads torchrun's environment itself.
    rc, out = torchrun(2, "collectives.py", timeout=300)
    assert rc == 0, out
    assert "OK rank 0 of 2" in out and "OK rank 1 of 2" in out, out


def test_fsdp2_over_sucl_equals_fsdp2_over_gloo():
    # FSDP2 (fully_shard) uses all_gather_into_tensor in place and reduce_scatter_tensor; the
    # script trains on both backends and exits 1 unless every rank holds the same parameters
    # and sucl's equal gloo's.
    bench = REPO / "python/bench/ddp_gpu.py"
    rc, out = torchrun(2, str(bench), "--device", "cpu", "--model", "tiny", "--wrap", "fsdp", "--steps", "3", "--warmup", "1", "--rounds", "1")
    assert rc == 0, out
    assert "RESULT OK" in out, out
