"""sucl.StreamQueue: the stream-triggered queue on a torch CUDA stream.

Without a GPU (CI), what can be checked honestly: asking for a queue raises sucl's errors
(an unknown transport before anything else, then no CUDA device), and the stubs name what the
compiled class has. With 2 GPUs, 2 ranks under `sucl run` and under torchrun, over both
transports: a ring exchange and all_reduce with torch kernels between start and wait, every
other collective, bad input refused before anything moves, tensors dropped while in flight
(see ranks/stream_queue.py); and Ctrl-C ending a synchronize that waits for a receive. SUCL_REQUIRE_GPU=1 turns the GPU skips into failures."""

import ast
from pathlib import Path

import pytest

import sucl
from conftest import sucl_run, torchrun
from test_cuda import REQUIRE_GPU, _gpu_count
from test_numpy import interrupt_blocked_rank


@pytest.fixture
def world():
    comm = sucl.init()
    yield comm
    comm.close()


def test_an_unknown_transport_is_refused_before_anything_else(world):
    with pytest.raises(sucl.InvalidArgumentError, match='"fast" is not one of "auto", "nccl", "staged"'):
        world.stream_queue(transport="fast")


def test_without_cuda_a_stream_queue_is_a_clear_error(world):
    if _gpu_count()[0] > 0:
        pytest.skip("CUDA is available here: the GPU tests below cover the queue")
    for stream in [None, 0, 12345]:
        with pytest.raises(sucl.BackendUnavailableError, match="cuda"):
            world.stream_queue(stream)
        with pytest.raises(sucl.BackendUnavailableError, match="cuda"):
            sucl.StreamQueue(world, stream, "staged")
    world.barrier()  # the communicator is still usable


def test_the_stubs_name_every_method_of_the_compiled_class():
    stubs = ast.parse((Path(sucl.__file__).parent / "_sucl.pyi").read_text())
    cls = next(c for c in stubs.body if isinstance(c, ast.ClassDef) and c.name == "StreamQueue")
    stubbed = {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("__")}
    compiled = {m for m in dir(sucl.StreamQueue) if not m.startswith("__")}
    assert stubbed == compiled, f"only in the stubs: {stubbed - compiled}; only compiled: {compiled - stubbed}"
    for name in stubbed:
        assert getattr(sucl.StreamQueue, name).__doc__, f"StreamQueue.{name} has no docstring"
    assert "stream_queue" in dir(sucl.Communicator)


needs_gpus = pytest.mark.skipif(not REQUIRE_GPU and _gpu_count()[0] < 2, reason="needs 2 GPUs")
# Every part in one job per launcher and transport (each job pays for torch's import and the
# communicator's setup once); run one part alone with ranks/stream_queue.py to narrow a failure.
PARTS = "exchange,bad_input,drop"


@needs_gpus
@pytest.mark.parametrize("transport", ["nccl", "staged"])
@pytest.mark.parametrize("launch", [sucl_run, torchrun], ids=["sucl_run", "torchrun"])
def test_stream_queue_on_a_torch_stream(launch, transport):
    rc, out = launch(2, "stream_queue.py", transport, PARTS, timeout=240)
    assert rc == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out


@needs_gpus
@pytest.mark.parametrize("transport", ["nccl", "staged"])
def test_ctrl_c_interrupts_a_stream_queue_synchronize_that_waits_for_a_receive(transport):
    # The stream waits on a receive that is never sent; the host waits in the queue's
    # synchronize. SIGINT ends it with KeyboardInterrupt (the job aborted), later calls raise,
    # and the peer's wait ends with the news.
    interrupt_blocked_rank(f"stream-{transport}")
