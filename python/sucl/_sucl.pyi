"""Type stubs of the compiled module ``sucl._sucl`` (re-exported by ``sucl``)."""

from typing import Any, Optional, Sequence, Union

Buffer = Any
"""A C-contiguous buffer-protocol object (NumPy array, bytearray, memoryview, array.array) or a
torch CPU or CUDA tensor, an object with ``__cuda_array_interface__`` (v3, contiguous), or an
object whose ``__dlpack__`` exports contiguous host memory; element types: u8, i8, i32, u32, i64, u64, f16, bf16 (tensors), f32, f64. Calls on device memory
are enqueued on its current stream and return without waiting for the GPU."""

Op = Union["ReduceOp", str]
"""A :class:`ReduceOp` or its name: ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"``."""

Stream = Any
"""A CUDA stream: a ``torch.cuda.Stream`` (or any object with an integer ``.cuda_stream``), or a
``CUstream`` as an int (0: the legacy default stream), of this rank's GPU. The caller keeps an
int's stream alive; an object is kept referenced by the queue."""

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
    """Ranks called a collective with different arguments; the communicator is now unusable
    (later calls raise UnusableError)."""

class UnusableError(SuclError):
    """The communicator is unusable since an earlier call on it failed (the message names it
    and quotes its error); nothing was done. Free it and create a new one."""

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
    """The handle of a non-blocking call or of an operation enqueued on a :class:`StreamQueue`.
    Its buffers stay referenced until the call completes; dropping it does not cancel a
    collective, but withdraws an unfinished send or receive (a queue's operations stay
    enqueued)."""

    def wait(self) -> Optional[int]:
        """Blocks until the call completes (GIL released); raises the call's error. Returns the
        element count for a receive, else None. Ctrl-C raises KeyboardInterrupt: a send or
        receive stays posted; for a collective the job is aborted (later calls raise
        :class:`AbortedError`); a queue's operation stays enqueued. A queue's operation
        completes once its ``start()`` and a later ``wait()`` or ``synchronize()`` of the queue
        released it on the stream; waiting before that runs into ``SUCL_TIMEOUT``."""
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
    def stream_queue(self, stream: Optional[Stream] = None, transport: str = "auto") -> "StreamQueue":
        """A :class:`StreamQueue` on ``stream`` (None: torch's current stream of this rank's
        GPU) over ``transport`` (``"auto"``, ``"nccl"`` or ``"staged"``). Collective: the queue
        gets a communicator of its own, split from this one, which stays usable."""
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
        """Waits (bounded by ``SUCL_TIMEOUT``) until the calls on device buffers enqueued on ``stream`` (a
        ``CUstream`` as an int, e.g. ``torch.cuda.current_stream().cuda_stream``; 0: the legacy
        default stream) ran; raises NCCL's asynchronous errors, a lost rank or a timeout."""
    def isend(self, buf: Buffer, dest: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`send` (host memory only: device memory uses :meth:`send`)."""
    def irecv(self, buf: Buffer, source: int, tag: int = 0) -> Request:
        """Non-blocking :meth:`recv`; ``wait()`` returns the elements received."""

class StreamQueue:
    """A stream-triggered queue on one CUDA stream (MPI's stream-triggered operations; NCCL
    groups on torch's streams). Operations are *enqueued* — nothing moves — then :meth:`start`
    releases everything enqueued since the last start once the stream reaches that point, and
    :meth:`wait` makes later work on the stream wait until it completed. Neither blocks the
    host: torch kernels launched on the same stream between ``start()`` and ``wait()`` run
    while the data moves, and kernels after ``wait()`` see the received data.

    Buffers are torch CUDA tensors or ``__cuda_array_interface__`` objects of the queue's GPU,
    contiguous; host memory, another GPU's memory, a non-contiguous tensor, element types that
    differ between ``send`` and ``recv`` and a read-only result are refused with
    :class:`InvalidArgumentError` when enqueued, before anything moves. The queue keeps each
    buffer's object referenced until its operation completed, so dropping a tensor after
    enqueueing it is safe. Rules of the queue (explicit peer and tag; messages between two ranks
    match per (peer, tag) in enqueue order; over NCCL a receive must get exactly its length; a
    buffer written by one operation of a batch may not be used by another of the same batch)
    are checked when enqueued. Made by :meth:`Communicator.stream_queue`."""

    def __init__(self, comm: Communicator, stream: Optional[Stream] = None, transport: str = "auto") -> None:
        """Same as ``comm.stream_queue(stream, transport)``. Collective."""
    @property
    def transport(self) -> str:
        """How the queue moves data: ``"nccl"`` (NCCL groups on a side stream, issued at each
        wait) or ``"staged"`` (device ↔ pinned host copies, stream memory operations and a
        progress thread over the communicator's host backend)."""
    @property
    def stream(self) -> int:
        """The ``CUstream`` the queue is bound to."""
    @property
    def rank(self) -> int:
        """This process's rank in the queue's communicator (its rank in the parent)."""
    @property
    def size(self) -> int:
        """The number of ranks."""
    @property
    def enqueued(self) -> int:
        """Operations enqueued and not yet started."""
    def enqueue_send(self, buf: Buffer, dest: int, tag: int = 0) -> Request:
        """Enqueues a send of ``buf`` to rank ``dest`` with ``tag``; moves nothing yet."""
    def enqueue_recv(self, buf: Buffer, source: int, tag: int = 0) -> Request:
        """Enqueues a receive into ``buf`` from rank ``source`` with ``tag``; the request's
        ``wait()`` returns the number of elements received."""
    def enqueue_all_reduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Optional[Op] = None) -> Request:
        """Enqueues ``recv = op(every rank's send)`` (default sum); in place in ``send`` when
        ``recv`` is None (or the same tensor)."""
    def enqueue_broadcast(self, buf: Buffer, root: int = 0) -> Request:
        """Enqueues a copy of root's ``buf`` into every rank's ``buf``."""
    def enqueue_all_gather(self, send: Optional[Buffer], recv: Buffer) -> Request:
        """Enqueues an all_gather of every rank's ``send`` into ``recv`` (rank order); with
        ``send=None`` in place: this rank's block of ``recv`` is its contribution."""
    def enqueue_reduce_scatter(self, send: Buffer, recv: Buffer, op: Optional[Op] = None) -> Request:
        """Enqueues a reduce_scatter: every rank's ``send`` (size × ``recv``) reduced, block r
        to rank r's ``recv``. Two distinct buffers (not in place)."""
    def enqueue_all_to_all(self, send: Buffer, recv: Buffer) -> Request:
        """Enqueues an all_to_all: block j of ``send`` goes to block (this rank) of rank j's
        ``recv``. Two distinct buffers (not in place)."""
    def start(self) -> None:
        """Releases everything enqueued since the last start once the stream reaches this
        point; returns at once."""
    def wait(self) -> None:
        """Makes later work on the stream wait until everything started so far completed; the
        host does not wait for the data (over NCCL, the first group with a peer connects to
        that peer here, which waits until the peer takes part: bounded, and Ctrl-C interrupts
        it as it does :meth:`synchronize`). Refused (:class:`InvalidArgumentError`) while
        operations are enqueued and not started."""
    def wait_on(self, stream: Stream) -> None:
        """Makes another stream of this GPU wait for everything started so far (an event; the
        host does not wait)."""
    def synchronize(self) -> None:
        """Blocks (GIL released, bounded by ``SUCL_TIMEOUT``) until the stream ran everything
        enqueued on it and every started operation completed; raises the first error among
        them (a lost peer, a timeout, NCCL's asynchronous error). Ctrl-C raises
        KeyboardInterrupt and aborts the job, as in a blocking call."""
    def close(self) -> None:
        """Ends the queue and its communicator. Raises if operations were in flight (those
        never started are withdrawn, started ones waited for, bounded); later calls raise.
        Also done when the queue is garbage-collected."""
    def __enter__(self) -> "StreamQueue": ...
    def __exit__(self, exc_type: Any, exc: Any = None, tb: Any = None) -> None:
        """Closes the queue; a failing close does not hide the block's own exception."""

def init(
    rank: Optional[int] = None,
    size: Optional[int] = None,
    address: Optional[str] = None,
    secret: Optional[str] = None,
    local_rank: Optional[int] = None,
) -> Communicator:
    """Joins the job and returns the world communicator (see ``sucl.init``)."""

def unused_port() -> int:
    """A TCP port free now and below the kernel's ephemeral range: for an ``address`` that must
    be published before rank 0's ``init`` binds it (an ephemeral port may be taken in between)."""
