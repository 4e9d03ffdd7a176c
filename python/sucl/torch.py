"""The ``"sucl"`` backend of ``torch.distributed``, for CPU and CUDA tensors.

    import sucl.torch                       # registers the backend
    import torch.distributed as dist
    dist.init_process_group("sucl")         # under torchrun

Rendezvous goes through torch's own store: the group's rank 0 publishes the address of sucl's
rendezvous store (and a random job secret) there, and every rank joins it. Collectives are
sucl's; ``async_op=True`` returns a Work whose ``wait()`` waits for the sucl request.

CUDA tensors, as with torch's NCCL backend: each call is enqueued on the calling thread on a
stream of the group's own (one per device) that first waits for the caller's current stream, and
returns without waiting for the GPU, so that work the caller enqueues next (the rest of a backward
pass) overlaps the communication; ``Work.wait()`` and the Work's future make the then-current
stream wait for the call (an event, no host wait). The tensors are marked in use on the group's
stream (``record_stream``) until the call ran.
"""

import logging
import os
import secrets
import threading

import torch
import torch.distributed as dist

from . import _sucl

__all__ = ["ProcessGroupSucl", "BACKEND_NAME"]

BACKEND_NAME = "sucl"

_log = logging.getLogger("sucl.torch")

_OPS = {
    dist.ReduceOp.SUM: _sucl.ReduceOp.SUM,
    dist.ReduceOp.PRODUCT: _sucl.ReduceOp.PROD,
    dist.ReduceOp.MIN: _sucl.ReduceOp.MIN,
    dist.ReduceOp.MAX: _sucl.ReduceOp.MAX,
    dist.ReduceOp.AVG: _sucl.ReduceOp.AVG,
}


def _op(opts):
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for k, v in _OPS.items():
        if op == k:
            return v
    raise _sucl.InvalidArgumentError(f"reduce operation {op} is not supported by the sucl backend")


def _flat(tensors):
    """One contiguous tensor holding ``tensors`` end to end."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat(flat, tensors):
    at = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[at : at + n].view_as(t))
        at += n


class _Work(dist._Work):
    """A sucl request (or several) as a torch Work. ``then`` runs once after they complete
    (copying temporaries into the caller's tensors)."""

    def __init__(self, requests, result, then=None):
        super().__init__()
        self._requests = requests
        self._result = result
        self._then = then
        self._lock = threading.Lock()
        self._done = False

    def wait(self, timeout=None):
        """Waits for the sucl requests, then copies results out; True."""
        with self._lock:
            if not self._done:
                for r in self._requests:
                    r.wait()
                if self._then is not None:
                    self._then()
                self._done = True
        return True

    def is_completed(self):
        """Whether every request completed."""
        return self._done or all(r.test() for r in self._requests)

    def is_success(self):
        """Whether the work completed (failures raise from wait())."""
        return self._done

    def exception(self):
        """None: failures raise from wait()."""
        return None

    def result(self):
        """The output tensors."""
        return self._result

    def get_future(self):
        """A future completed with the output tensors once the work is."""
        fut = torch.futures.Future()
        if self._done:
            fut.set_result(self._result)
            return fut

        def complete():
            try:
                self.wait()
            except BaseException as e:
                # torch crashes on an errored future handed to DDP: end the process instead,
                # as NCCL's tear-down mode does; the launcher then ends the other ranks.
                _log.critical("sucl: a collective failed after it was started: %s", e)
                os.abort()
            fut.set_result(self._result)

        threading.Thread(target=complete, name="sucl-torch-future", daemon=True).start()
        return fut


class _CudaWork(dist._Work):
    """A call enqueued on the group's CUDA stream ``stream``: done for the host once enqueued;
    ``wait()`` makes the current stream wait for the event recorded after it."""

    def __init__(self, result, device, stream):
        super().__init__()
        self._result = result
        self._device = device
        self._stream = stream
        self._event = torch.cuda.Event()
        self._event.record(stream)

    def wait(self, timeout=None):
        """Orders the current stream after the call (the host does not wait); True."""
        torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self):
        """Whether the GPU ran the call."""
        return self._event.query()

    def is_success(self):
        """Whether the GPU ran the call (errors raise from ``comm.synchronize``)."""
        return self.is_completed()

    def exception(self):
        """None: failures raise when the call is made or from ``comm.synchronize``."""
        return None

    def result(self):
        """The output tensors."""
        return self._result

    def get_future(self):
        """A future completed with the output tensors. It is completed on the group's stream,
        so a CUDA-aware consumer (``wait()``, ``value()``, ``then``) orders its own current
        stream after the call, when it consumes it, not now: DDP chains its bucket futures
        this way while the backward pass goes on."""
        fut = torch.futures.Future(devices=[self._device])
        with torch.cuda.stream(self._stream):
            fut.set_result(self._result)
        return fut


def _is_block_of(block, whole, index):
    """Whether ``block`` is exactly block ``index`` of ``whole`` (same memory, contiguous)."""
    n = block.numel()
    return (
        block.dtype == whole.dtype
        and block.device == whole.device
        and block.is_contiguous()
        and whole.is_contiguous()
        and whole.numel() >= (index + 1) * n
        and block.data_ptr() == whole.data_ptr() + index * n * block.element_size()
    )


def _tensors_in(items):
    """Every tensor in ``items`` (nested lists and tuples allowed; other values skipped)."""
    for t in items:
        if isinstance(t, (list, tuple)):
            yield from _tensors_in(t)
        elif isinstance(t, torch.Tensor):
            yield t


def _cuda_device(tensors):
    """The CUDA device of the first tensor in ``tensors`` (nested lists allowed), or None."""
    first = next(_tensors_in(tensors), None)
    return first.device if first is not None and first.is_cuda else None


class ProcessGroupSucl(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on a sucl communicator (CPU and CUDA
    tensors)."""

    def __init__(self, comm, rank, size):
        super().__init__(rank, size)
        self._comm = comm
        self._streams = {}

    def _stream(self, device):
        """The stream this group's CUDA calls on ``device`` are enqueued on (made at first use),
        as torch's NCCL backend keeps one of its own."""
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device)
        return s

    @property
    def comm(self):
        """The sucl :class:`~sucl.Communicator` under this group."""
        return self._comm

    def _set_group_name(self, name):
        """Remembers the name torch gives the group (a Python group has no C++ backend that
        would keep it; DeviceMesh and FSDP2 look groups up by it)."""
        self._group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        """The name torch gave the group when it made it."""
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def getBackendName(self):
        """The backend's name, ``"sucl"``."""
        return BACKEND_NAME

    def _start(self, calls, result, then=None, tensors=None):
        """Starts ``calls`` (``(method, args)`` pairs of the communicator's blocking names).
        CPU tensors: as non-blocking requests on sucl's worker thread. CUDA tensors: enqueued
        now on the group's stream after the caller's current stream, as NCCL is; ``then``
        (copies out of temporaries) follows on the same stream."""
        device = _cuda_device(tensors if tensors is not None else [a for _, args in calls for a in args if isinstance(a, (torch.Tensor, list))])
        if device is None:
            return _Work([getattr(self._comm, "i" + name)(*args) for name, args in calls], result, then)
        stream = self._stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for name, args in calls:
                getattr(self._comm, name)(*args)
            if then is not None:
                then()
        # The caching allocator must not hand this memory out again before the group's
        # stream ran the call (the caller's stream may free it first).
        for t in _tensors_in([args for _, args in calls] + [result]):
            if t.is_cuda:
                t.record_stream(stream)
        return _CudaWork(result, device, stream)

    # --- collectives -------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        """All-reduce each tensor in place (``opts.reduceOp``)."""
        op = _op(opts)
        return self._start([("all_reduce", (t, None, op)) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """All-reduce each tensor in place, one request each."""
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        """Broadcast each tensor from ``opts.rootRank``."""
        root = opts.rootRank if opts is not None else 0
        return self._start([("broadcast", (t, root)) for t in tensors], tensors)

    def reduce(self, tensors, opts=None):
        """Reduce each tensor in place onto ``opts.rootRank``."""
        op, root = _op(opts), opts.rootRank
        return self._start([("reduce", (t, None, op, root)) for t in tensors], tensors)

    def allgather(self, output_lists, inputs, opts=None):
        """Gather every rank's input into each rank's list of outputs."""
        calls, thens = [], []
        for outs, inp in zip(output_lists, inputs):
            flat = inp.new_empty((self.size() * inp.numel(),))
            calls.append(("all_gather", (inp.contiguous(), flat)))
            thens.append((flat, outs))
        return self._start(calls, output_lists, lambda: [_unflat(f, o) for f, o in thens], inputs)

    def _allgather_base(self, output, input, opts=None):
        """Gather every rank's input into one output tensor (``all_gather_into_tensor``); in
        place when ``input`` is this rank's block of ``output`` (as FSDP2 passes it)."""
        if _is_block_of(input, output, self.rank()):
            return self._start([("all_gather", (None, output))], [output])
        return self._start([("all_gather", (input, output))], [output])

    all_gather_single = _allgather_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        """Reduce the ranks' input lists; block r lands in rank r's output."""
        op = _op(opts)
        return self._start([("reduce_scatter", (_flat(ins), out, op)) for out, ins in zip(outputs, input_lists)], outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        """Reduce the ranks' inputs; block r lands in rank r's output (``reduce_scatter_tensor``)."""
        return self._start([("reduce_scatter", (input, output, _op(opts)))], [output])

    reduce_scatter_single = _reduce_scatter_base

    def _split_table(self, mine):
        """Every rank's ``mine`` (a list of ``size`` ints), as a size × size row-major list."""
        t = torch.tensor(mine, dtype=torch.int64)
        table = torch.empty(self.size() * self.size(), dtype=torch.int64)
        self._comm.all_gather(t, table)
        return table.tolist()

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """``all_to_all_single``: even blocks, or rows split by ``input_split_sizes`` per rank."""
        n = self.size()
        if not input_split_sizes and not output_split_sizes:
            return self._start([("all_to_all", (input, output))], [output])
        row = max(input.numel() // max(input.shape[0], 1), 1) if input.dim() > 0 else 1
        ins = list(input_split_sizes) or [input.shape[0] // n] * n
        counts = [c * row for c in self._split_table(ins)]
        return self._start([("all_to_allv", (input, output, counts))], [output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        """``all_to_all`` on lists of tensors of any sizes."""
        counts = self._split_table([t.numel() for t in inputs])
        flat_in = _flat(inputs)
        n, me = self.size(), self.rank()
        flat_out = flat_in.new_empty((sum(counts[i * n + me] for i in range(n)),))
        return self._start([("all_to_allv", (flat_in, flat_out, counts))], outputs, lambda: _unflat(flat_out, outputs), inputs)

    def gather(self, output_lists, inputs, opts=None):
        """Gather every rank's input into the root's output list."""
        root = opts.rootRank
        inp = inputs[0].contiguous()
        if self.rank() == root:
            flat = inp.new_empty((self.size() * inp.numel(),))
            return self._start([("gather", (inp, flat, root))], output_lists, lambda: _unflat(flat, output_lists[0]), inputs)
        return self._start([("gather", (inp, None, root))], output_lists, tensors=inputs)

    def scatter(self, outputs, input_lists, opts=None):
        """Scatter the root's input list, one tensor per rank."""
        root = opts.rootRank
        send = _flat(input_lists[0]) if self.rank() == root else None
        return self._start([("scatter", (send, outputs[0], root))], outputs, tensors=outputs)

    def barrier(self, opts=None):
        """Wait for every rank."""
        return _Work([self._comm.ibarrier()], [])

    # --- point to point ----------------------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        """Send each tensor to group rank ``dst``."""
        return self._start([("send", (t, dst, tag)) for t in tensors], tensors)

    def recv(self, tensors, src, tag=0):
        """Receive each tensor from group rank ``src``."""
        return self._start([("recv", (t, src, tag)) for t in tensors], tensors)


def _create(store, rank, size, timeout):
    """torch's creator hook: one sucl communicator per process group, met through ``store``."""
    if rank == 0:
        host = os.environ.get("SUCL_PY_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        if host == "localhost":
            host = "127.0.0.1"
        store.set("sucl/secret", secrets.token_hex(16))
        store.set("sucl/addr", f"{host}:{_sucl.unused_port()}")
    addr = store.get("sucl/addr").decode()
    secret = store.get("sucl/secret").decode()
    local_rank = int(os.environ.get("LOCAL_RANK", rank)) if size == int(os.environ.get("WORLD_SIZE", -1)) else rank
    from . import init

    comm = init(rank=rank, size=size, address=addr, secret=secret, local_rank=local_rank)
    return ProcessGroupSucl(comm, rank, size)


def _register():
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


_register()
