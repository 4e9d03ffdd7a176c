"""sucl: one communication API over shared memory, TCP and MPI, for NumPy arrays and torch tensors.

    import numpy as np, sucl
    comm = sucl.init()                      # under `sucl run`, torchrun, mpirun or srun
    x = np.full(4, comm.rank, np.float32)
    comm.all_reduce(x)                      # in place: x = sum over ranks
    comm.close()

Buffers are used in place (no copy): NumPy arrays or any C-contiguous buffer-protocol object,
torch CPU and CUDA tensors, ``__cuda_array_interface__`` objects, and objects whose
``__dlpack__`` exports host memory. Blocking calls release the GIL, and Ctrl-C interrupts them
(raising KeyboardInterrupt and aborting the job); the ``i``-prefixed calls return a
:class:`Request`. ``comm.stream_queue()`` gives a :class:`StreamQueue`: operations enqueued on a
CUDA stream and triggered by it, without the host waiting. sucl's errors are raised as
:class:`SuclError` subclasses.
``import sucl.torch`` registers the ``"sucl"`` backend of ``torch.distributed``.
"""

import atexit as _atexit
import weakref as _weakref

from ._sucl import (
    MAX_TAG,
    AbortedError,
    BackendUnavailableError,
    Communicator,
    ConfigError,
    InvalidArgumentError,
    IoError,
    LostPeerError,
    MismatchError,
    UnusableError,
    ProtocolError,
    ReduceOp,
    Request,
    StreamQueue,
    SuclError,
    TimeoutError,
    unused_port,
)
from ._sucl import init as _init

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG

_open = _weakref.WeakSet()


def init(rank=None, size=None, address=None, secret=None, local_rank=None):
    """Joins the job and returns the world :class:`Communicator`.

    With no arguments the launch environment says who this process is (``sucl run``,
    torchrun, mpirun, srun; none: a world of one). With ``rank``, ``size`` and ``address``
    (``"host:port"``), rank 0 starts the rendezvous store there and the others connect;
    ``secret`` (the same string on every rank) authenticates them, else one is derived from
    the address. The communicator is closed at interpreter exit if not before.
    """
    comm = _init(rank, size, address, secret, local_rank)
    _open.add(comm)
    return comm


def wait_all(requests):
    """Waits for every request in ``requests``; returns their results in order."""
    return [r.wait() for r in requests]


@_atexit.register
def _close_open():
    # Leaving cleanly tells the rendezvous store this rank is done (not lost).
    for comm in list(_open):
        comm.close()


__all__ = [
    "init",
    "wait_all",
    "unused_port",
    "Communicator",
    "Request",
    "StreamQueue",
    "ReduceOp",
    "SUM",
    "PROD",
    "MIN",
    "MAX",
    "AVG",
    "MAX_TAG",
    "SuclError",
    "InvalidArgumentError",
    "LostPeerError",
    "TimeoutError",
    "MismatchError",
    "UnusableError",
    "AbortedError",
    "BackendUnavailableError",
    "ConfigError",
    "ProtocolError",
    "IoError",
]
