"""CUDA tensors through sucl, on a machine with at least 2 GPUs: every collective and send/recv
under `sucl run -n 2`, and `dist.all_reduce` & co. on the "sucl" torch backend under torchrun.

Without CUDA (CI) these tests skip; with SUCL_REQUIRE_GPU=1 set, a machine with fewer than 2
GPUs (or no torch) fails them instead, so a GPU run cannot pass by skipping."""

import os

import pytest

from conftest import sucl_run, torchrun
from test_numpy import interrupt_blocked_rank

REQUIRE_GPU = os.environ.get("SUCL_REQUIRE_GPU") == "1"


def _gpu_count():
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if not torch.cuda.is_available():
        return 0, "CUDA is not available to torch"
    return torch.cuda.device_count(), f"{torch.cuda.device_count()} CUDA device(s)"


@pytest.fixture(autouse=True)
def two_gpus():
    count, why = _gpu_count()
    if count < 2:
        if REQUIRE_GPU:
            pytest.fail(f"SUCL_REQUIRE_GPU=1 but fewer than 2 GPUs: {why}")
        pytest.skip(f"needs 2 GPUs: {why}")


def test_every_collective_on_cuda_tensors_under_sucl_run():
    rc, out = sucl_run(2, "cuda_collectives.py", timeout=300)
    assert rc == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out


def test_torch_backend_on_cuda_tensors_under_torchrun():
    rc, out = torchrun(2, "torch_cuda.py", timeout=300)
    assert rc == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out


def test_ctrl_c_interrupts_a_synchronize_on_a_stream_that_waits_for_a_receive():
    # The GPU waits on a receive that is never sent; the host waits in synchronize. SIGINT ends
    # it with KeyboardInterrupt (NCCL aborted), later calls raise, the peer gets the error.
    interrupt_blocked_rank("cuda")
