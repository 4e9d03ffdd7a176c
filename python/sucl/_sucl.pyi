"""Type stubs of the compiled module ``sucl._sucl`` (re-exported by ``sucl``)."""

from typing import Any, Optional, Sequence, Union

Buffer = Any
"""A C-contiguous buffer-protocol object (NumPy array, bytearray, memoryview, array.array) or a
torch CPU or CUDA tensor, an object with ``__cuda_array_interface__`` (v3, contiguous), or an
object whose ``__dlpack__`` exports contiguous host memory; element types: u8, i8, i32, u32, i64, u64, f16, bf16 (tensors), f32, f64. Calls on device memory
are enqueued on its current stream and return without waiting for the GPU."""

Op = Union["ReduceOp", str]
"""A :class:`ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"``."""

MAX_TAG: int
"""Largest tag a send or receive accepts."""

class ReduceOp:
    """A reduce operation (compare with ``==``; ``int(op)`` gives its code)."""

    SUM: "ReduceOp"
    """Sum (integers wrap)."""
    PROD: "ReduceOp"
    """Product (integers wrap)."""
    MIN: "ReduceOp"
    """Minimum."""
    MAX: "ReduceOp"
    """Maximum."""
    AVG: "ReduceOp"
    """Sum divided by the number of ranks (integer division for integers)."""
    def __int__(self) -> int: ...

class SuclError(RuntimeError):
    """Base class of every error sucl raises."""

class InvalidArgumentError(SuclError):
    """An argument was invalid; no data moved."""

class LostPeerError(SuclError):
    """A peer process died or closed its connections."""

class TimeoutError(SuclError):
    """A bounded wait ran out (SUCL_TIMEOUT)."""

class MismatchError(SuclError):
    """Ranks called a collective with different arguments; the communicator is poisoned."""

class AbortedError(SuclError):
    """The communicator was aborted because some rank failed."""

class BackendUnavailableError(SuclError):
    """A backend cannot serve this communicator or call."""

class ConfigError(SuclError):
    """A configuration or launch-environment problem."""

class ProtocolError(SuclError):
    """A peer sent bytes that do not follow the wire format."""

class IoError(SuclError):
    """An operating-system error."""

class Request:
    """The handle of a non-blocking call. Its buffers stay referenced until the call completes;
    dropping it does not cancel a collective, but withdraws an unfinished send or receive."""

    def wait(self) -> Optional[int]:
        """Blocks until the call completes (GIL released); raises the call's error. Returns the
        element count for a receive, else None. Ctrl-C raises KeyboardInterrupt: a send or
        receive stays posted; for a collective the job is aborted (later calls raise
        :class:`AbortedError`)."""
    def test(self) -> bool:
        """Whether the call completed; raises its error."""

class Communicator:
    """A group of ranks that communicate (see ``sucl.init`` and :meth:`split`). Blocking calls
    release the GIL; Ctrl-C while one waits raises KeyboardInterrupt and aborts the job: later
    calls on this process raise :class:`AbortedError` ("rank R was interrupted"), and so do
    the other ranks' waits."""

    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
    @property
    def size(self) -> int:
        """The number of ranks."""
    @property
    def local_rank(self) -> int:
        """The rank among this communicator's ranks on the same host."""
    @property
    def backends(self) -> list[str]:
        """The backends this communicator can use, in selection order."""
    def split(self, color: Optional[int], key: int = 0) -> Optional["Communicator"]:
        """Communicators of the ranks with the same ``color``, ordered by ``key`` then rank;
        ``color=None`` joins none and gets None. Collective."""
    def close(self) -> None:
        """Finishes queued non-blocking calls and leaves the job; later calls raise."""
    def __enter__(self) -> "Communicator": ...
    def __exit__(self, *args: Any) -> None: ...
    def barrier(self) -> None:
        """Blocks until every rank has called it."""
    def ibarrier(self) -> Request:
        """Non-blocking :meth:`barrier`."""
    def broadcast(self, buf: Buffer, root: int = 0) -> None:
        """Copies root's ``buf`` into every rank's ``buf``."""
    def ibroadcast(self, buf: Buffer, root: int = 0) -> Request:
        """Non-blocking :meth:`broadcast`."""
    def all_reduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Optional[Op] = None) -> None:
        """``recv = op(every rank's send)`` on every rank; in place in ``send`` if ``recv`` is None."""
    def iall_reduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Optional[Op] = None) -> Request:
        """Non-blocking :meth:`all_reduce`."""
    def reduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Optional[Op] = None, root: int = 0) -> None:
        """``recv = op(every rank's send)`` on the root; in place in ``send`` if ``recv`` is None."""
    def ireduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Optional[Op] = None, root: int = 0) -> Request:
        """Non-blocking :meth:`reduce`."""
    def gather(self, send: Buffer, recv: Optional[Buffer] = None, root: int = 0) -> None:
        """Root's ``recv`` gets every rank's ``send`` in rank order (``recv``: root only)."""
    def igather(self, send: Buffer, recv: Optional[Buffer] = None, root: int = 0) -> Request:
        """Non-blocking :meth:`gather`."""
    def all_gather(self, send: Optional[Buffer], recv: Buffer) -> None:
        """Every rank's ``recv`` gets every rank's ``send`` in rank order; ``send=None``: in
        place (each rank's block of ``recv`` is its contribution)."""
    def iall_gather(self, send: Optional[Buffer], recv: Buffer) -> Request:
        """Non-blocking :meth:`all_gather`."""
    def scatter(self, send: Optional[Buffer], recv: Buffer, root: int = 0) -> None:
        """Rank r's ``recv`` gets block r of root's ``send`` (``send``: root only)."""
    def iscatter(self, send: Optional[Buffer], recv: Buffer, root: int = 0) -> Request:
        """Non-blocking :meth:`scatter`."""
    def all_to_all(self, send: Buffer, recv: Buffer) -> None:
        """Block j of rank i's ``send`` goes to block i of rank j's ``recv``."""
    def iall_to_all(self, send: Buffer, recv: Buffer) -> Request:
        """Non-blocking :meth:`all_to_all`."""
    def reduce_scatter(self, send: Buffer, recv: Buffer, op: Optional[Op] = None) -> None:
        """Reduces every rank's ``send``; block r of the result lands in rank r's ``recv``."""
    def ireduce_scatter(self, send: Buffer, recv: Buffer, op: Optional[Op] = None) -> Request:
        """Non-blocking :meth:`reduce_scatter`."""
    def gatherv(self, send: Buffer, recv: Optional[Buffer], counts: Sequence[int], displs: Optional[Sequence[int]] = None, root: int = 0) -> None:
        """Gathers ``counts[r]`` elements of each rank r into root's ``recv`` at ``displs[r]``
        (default: packed). Every rank passes the whole ``counts``."""
    def igatherv(self, send: Buffer, recv: Optional[Buffer], counts: Sequence[int], displs: Optional[Sequence[int]] = None, root: int = 0) -> Request:
        """Non-blocking :meth:`gatherv`."""
    def scatterv(self, send: Optional[Buffer], recv: Buffer, counts: Sequence[int], displs: Optional[Sequence[int]] = None, root: int = 0) -> None:
        """Rank r's ``recv`` gets ``counts[r]`` elements of root's ``send`` from ``displs[r]``."""
    def iscatterv(self, send: Optional[Buffer], recv: Buffer, counts: Sequence[int], displs: Optional[Sequence[int]] = None, root: int = 0) -> Request:
        """Non-blocking :meth:`scatterv`."""
    def all_gatherv(self, send: Buffer, recv: Buffer, counts: Sequence[int], displs: Optional[Sequence[int]] = None) -> None:
        """Every rank's ``recv`` gets ``counts[r]`` elements from each rank r at ``displs[r]``."""
    def iall_gatherv(self, send: Buffer, recv: Buffer, counts: Sequence[int], displs: Optional[Sequence[int]] = None) -> Request:
        """Non-blocking :meth:`all_gatherv`."""
    def all_to_allv(self, send: Buffer, recv: Buffer, counts: Sequence[int], sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None) -> None:
        """All-to-all with the size × size row-major ``counts`` table (``counts[i*size+j]``
        elements from rank i to rank j), the same on every rank; displacements default to packed."""
    def iall_to_allv(self, send: Buffer, recv: Buffer, counts: Sequence[int], sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None) -> Request:
        """Non-blocking :meth:`all_to_allv`."""
    def send(self, buf: Buffer, dest: int, tag: int = 0) -> None:
        """Sends ``buf`` to rank ``dest`` with ``tag``."""
    def recv(self, buf: Buffer, source: int, tag: int = 0) -> int:
        """Receives from ``source`` with ``tag`` into ``buf``; returns the elements received."""
    def synchronize(self, stream: int = 0) -> None:
        """Waits (bounded by ``SUCL_TIMEOUT``) until the device calls enqueued on ``stream`` (a
        ``CUstream`` as an int, e.g. ``torch.cuda.current_stream().cuda_stream``; 0: the legacy
        default stream) ran; raises NCCL's asynchronous errors, a lost rank or a timeout."""
    def isend(self, buf: Buffer, dest: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`send` (host memory only: device memory uses :meth:`send`)."""
    def irecv(self, buf: Buffer, source: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`recv`; ``wait()`` returns the elements received."""

def init(
    rank: Optional[int] = None,
    size: Optional[int] = None,
    address: Optional[str] = None,
    secret: Optional[str] = None,
    local_rank: Optional[int] = None,
) -> Communicator:
    """Joins the job and returns the world communicator (see ``sucl.init``)."""
