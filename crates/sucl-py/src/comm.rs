//! `sucl.Communicator`: the Python face of a sucl communicator. Every method builds a checked
//! [`Call`] from its Python arguments, then runs it inline with the GIL released (blocking
//! form) or queues it (the `i`-prefixed non-blocking form, returning a [`Request`]).

use crate::call::{pair, Call};
use crate::errors::{invalid, to_py};
use crate::exec::{Executor, SLICE};
use crate::interrupt;
use crate::region::Region;
use crate::request::{P2p, Request};
use pyo3::prelude::*;
use pyo3::types::PyString;
use sucl::ReduceOp;

/// A group of ranks that communicate: the world from `sucl.init()`, or a part of it from
/// `split()`. Buffers are NumPy arrays (or any C-contiguous buffer-protocol object), torch CPU
/// and CUDA tensors, `__cuda_array_interface__` objects and objects whose `__dlpack__` exports
/// host memory, used in place (no copy); calls on device memory are enqueued on its current
/// stream and return without waiting for the GPU. Collectives must be called by every rank in
/// the same order; blocking calls release the GIL while they wait, and Ctrl-C interrupts them
/// (KeyboardInterrupt; the job is aborted, later calls raise `AbortedError`).
#[pyclass(module = "sucl", weakref)]
pub struct Communicator {
    exec: Executor,
    rank: usize,
    size: usize,
    local_rank: usize,
    /// This process's rank in the world (sucl's errors name it).
    world_rank: usize,
}

pub(crate) type Obj<'py> = Bound<'py, PyAny>;

/// The reduce operation named by `op` (a `sucl.ReduceOp` or its name, e.g. `"sum"`).
pub(crate) fn reduce_op(op: Option<&Obj<'_>>) -> PyResult<ReduceOp> {
    let Some(op) = op else { return Ok(ReduceOp::Sum) };
    if let Ok(op) = op.extract::<PyRef<'_, crate::PyReduceOp>>() {
        return Ok(op.to_sucl());
    }
    let name: String = op.cast::<PyString>().map_err(|_| invalid("op", "not a sucl.ReduceOp or a name"))?.to_str()?.to_lowercase();
    ReduceOp::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| invalid("op", format!("unknown reduce operation {name:?}")))
}

pub(crate) fn tag_of(tag: i64) -> PyResult<u32> {
    u32::try_from(tag).map_err(|_| invalid("tag", format!("{tag} is not in 0..={}", sucl::MAX_TAG)))
}

impl Communicator {
    pub fn wrap(c: sucl::Communicator) -> Communicator {
        let (rank, size, local_rank) = (c.rank(), c.size(), c.local_rank());
        let world_rank = c.world_rank_of(rank).unwrap_or(rank);
        Communicator { exec: Executor::new(c), rank, size, local_rank, world_rank }
    }

    /// The memory of `obj` (`arg` names it in errors).
    fn region(&self, arg: &str, obj: &Obj<'_>) -> PyResult<Region> {
        Region::of(arg, obj, self.world_rank)
    }

    /// As [`Communicator::region`]; None for an absent argument or None.
    fn opt_region(&self, arg: &str, obj: Option<&Obj<'_>>) -> PyResult<Option<Region>> {
        obj.filter(|o| !o.is_none()).map(|o| self.region(arg, o)).transpose()
    }

    /// Waits for queued non-blocking calls, so that this call comes after them. Ctrl-C
    /// interrupts the wait and aborts the job (the queued call cannot be left half done).
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(done) = self.exec.unfinished() {
            while py.detach(|| done.wait_slice(SLICE)).is_none() {
                py.check_signals().inspect_err(|_| self.exec.interrupter.interrupt())?;
            }
        }
        Ok(())
    }

    /// Runs `call` now, on this thread, with the GIL released (Ctrl-C interrupts its waits).
    fn block(&self, py: Python<'_>, call: Call) -> PyResult<usize> {
        self.run(py, |c| call.run(c))
    }

    /// This process's rank in the world (sucl's errors name it).
    pub(crate) fn world_rank(&self) -> usize {
        self.world_rank
    }

    /// The ordinal of this rank's GPU (the one its collectives on device buffers use).
    pub(crate) fn gpu(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| {
            self.exec.with_comm(|c| match c.attached_device() {
                Some(d) => Ok(d.ordinal()),
                None => c.cuda_device().map(|d| d.ordinal()),
            })
        })
        .map_err(to_py)
    }

    /// Runs `f` with the GIL released so that Ctrl-C interrupts the waits of this job it makes
    /// (aborting the job, as in a blocking call). Once the communicator is closed, `f` still
    /// runs (bounded), without that check.
    pub(crate) fn interruptible<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> sucl::Result<R> + Send) -> PyResult<R> {
        interrupt::result(py.detach(|| match crate::exec::lock(&self.exec.comm).as_ref() {
            Some(c) => interrupt::run(c, f),
            None => f(),
        }))
    }

    /// Runs `f` on the communicator after the queued calls, on this thread, with the GIL
    /// released; Ctrl-C interrupts its waits (and aborts the job).
    pub(crate) fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&sucl::Communicator) -> sucl::Result<R> + Send) -> PyResult<R> {
        self.drain(py)?;
        interrupt::result(py.detach(|| self.exec.with_comm(|c| interrupt::run(c, || f(c)))))
    }

    /// Queues `call` on the worker thread.
    fn post(&self, call: Call) -> PyResult<Request> {
        self.exec.submit(call).map(|done| Request::queued(done, self.exec.interrupter.clone())).map_err(to_py)
    }

    fn all_reduce_call(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>) -> PyResult<Call> {
        let send = self.region("send", send)?;
        let op = reduce_op(op)?;
        Ok(match self.opt_region("recv", recv)? {
            Some(r) => Call::AllReduce { recv: Some(pair(&send, r, true)?), send, op },
            None => Call::AllReduce { send: send.writable("send")?, recv: None, op },
        })
    }

    fn reduce_call(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>, root: usize) -> PyResult<Call> {
        let send = self.region("send", send)?;
        let op = reduce_op(op)?;
        Ok(match self.opt_region("recv", recv)? {
            Some(r) => Call::Reduce { recv: Some(pair(&send, r, true)?), send, op, root },
            None => Call::Reduce { send: send.writable("send")?, recv: None, op, root },
        })
    }

    fn gather_call(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, root: usize) -> PyResult<Call> {
        let send = self.region("send", send)?;
        let recv = self.opt_region("recv", recv)?.map(|r| pair(&send, r, false)).transpose()?;
        Ok(Call::Gather { send, recv, root })
    }

    fn all_gather_call(&self, send: Option<&Obj<'_>>, recv: &Obj<'_>) -> PyResult<Call> {
        let recv = self.region("recv", recv)?;
        Ok(match self.opt_region("send", send)? {
            Some(s) => Call::AllGather { recv: pair(&s, recv, false)?, send: Some(s) },
            None => Call::AllGather { send: None, recv: recv.writable("recv")? },
        })
    }

    fn scatter_call(&self, send: Option<&Obj<'_>>, recv: &Obj<'_>, root: usize) -> PyResult<Call> {
        let recv = self.region("recv", recv)?;
        Ok(match self.opt_region("send", send)? {
            Some(s) => Call::Scatter { recv: pair(&s, recv, false)?, send: Some(s), root },
            None => Call::Scatter { send: None, recv: recv.writable("recv")?, root },
        })
    }

    fn two(&self, send: &Obj<'_>, recv: &Obj<'_>) -> PyResult<(Region, Region)> {
        let s = self.region("send", send)?;
        let r = pair(&s, self.region("recv", recv)?, false)?;
        Ok((s, r))
    }

    fn gatherv_call(
        &self,
        send: &Obj<'_>,
        recv: Option<&Obj<'_>>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<Call> {
        let send = self.region("send", send)?;
        let recv = self.opt_region("recv", recv)?.map(|r| pair(&send, r, false)).transpose()?;
        let displs = displs.unwrap_or_else(|| packed(&counts));
        Ok(Call::Gatherv { send, recv, counts, displs, root })
    }

    fn scatterv_call(
        &self,
        send: Option<&Obj<'_>>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<Call> {
        let recv = self.region("recv", recv)?;
        let displs = displs.unwrap_or_else(|| packed(&counts));
        Ok(match self.opt_region("send", send)? {
            Some(s) => Call::Scatterv { recv: pair(&s, recv, false)?, send: Some(s), counts, displs, root },
            None => Call::Scatterv { send: None, recv: recv.writable("recv")?, counts, displs, root },
        })
    }

    fn all_gatherv_call(&self, send: &Obj<'_>, recv: &Obj<'_>, counts: Vec<usize>, displs: Option<Vec<usize>>) -> PyResult<Call> {
        let (send, recv) = self.two(send, recv)?;
        let displs = displs.unwrap_or_else(|| packed(&counts));
        Ok(Call::AllGatherv { send, recv, counts, displs })
    }

    fn all_to_allv_call(
        &self,
        send: &Obj<'_>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        sdispls: Option<Vec<usize>>,
        rdispls: Option<Vec<usize>>,
    ) -> PyResult<Call> {
        let (send, recv) = self.two(send, recv)?;
        let n = self.size;
        if counts.len() != n * n {
            return Err(invalid("counts", format!("has {} entries but needs size × size = {}", counts.len(), n * n)));
        }
        let me = self.rank;
        let sdispls = sdispls.unwrap_or_else(|| packed(&counts[me * n..(me + 1) * n]));
        let rdispls = rdispls.unwrap_or_else(|| packed(&(0..n).map(|i| counts[i * n + me]).collect::<Vec<_>>()));
        Ok(Call::AllToAllv { send, sdispls, recv, rdispls, counts })
    }

    /// Posts a send or receive in the backend (no worker thread: the backend progresses it).
    fn post_p2p(&self, py: Python<'_>, buf: Region, peer: usize, tag: u32, receive: bool) -> PyResult<Request> {
        if buf.device.is_some() {
            return Err(invalid("buf", "is device (CUDA) memory: use send/recv, which are enqueued on its stream and return"));
        }
        self.drain(py)?;
        let (addr, bytes) = (buf.addr(), buf.bytes());
        let req = py
            .detach(|| {
                self.exec.with_comm(|c| {
                    // SAFETY: the request keeps `buf` (and so its memory) alive until it
                    // completed or was cancelled (`P2p`'s Drop cancels an unfinished one), and
                    // `buf` was checked writable for a receive.
                    unsafe {
                        if receive {
                            c.post_recv_unscoped(addr as *mut u8, bytes, peer, tag)
                        } else {
                            c.post_send_unscoped(addr as *const u8, bytes, peer, tag)
                        }
                    }
                })
            })
            .map_err(to_py)?;
        Ok(Request::p2p(P2p::new(self.exec.comm.clone(), req, buf, self.world_rank), receive))
    }
}

/// Displacements of blocks laid end to end.
fn packed(counts: &[usize]) -> Vec<usize> {
    counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect()
}

#[pymethods]
impl Communicator {
    /// This process's rank in the communicator.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The rank among this communicator's ranks on the same host.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The backends this communicator can use (`["shm", "tcp"]`, ...), in selection order.
    #[getter]
    fn backends(&self, py: Python<'_>) -> PyResult<Vec<&'static str>> {
        py.detach(|| self.exec.with_comm(|c| Ok(c.backends()))).map_err(to_py)
    }

    /// Splits into communicators of the ranks that pass the same `color`, ordered by `key`
    /// then rank; `color=None` joins none and gets None. Collective.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Communicator>> {
        self.drain(py)?;
        let c = self.run(py, |c| c.split(color, key))?;
        Ok(c.map(Communicator::wrap))
    }

    /// A stream-triggered queue on the CUDA stream `stream` (a torch.cuda.Stream, an object
    /// with `.cuda_stream`, or a CUstream int; None: torch's current stream of this rank's
    /// GPU) over `transport` ("auto", "nccl" or "staged"). Collective: the queue gets a
    /// communicator of its own, split from this one, which stays usable.
    #[pyo3(signature = (stream=None, transport="auto"))]
    fn stream_queue(slf: &Bound<'_, Self>, stream: Option<&Obj<'_>>, transport: &str) -> PyResult<crate::stream::StreamQueue> {
        crate::stream::StreamQueue::open(slf, stream, transport)
    }

    /// Finishes queued non-blocking calls and leaves the job; later calls raise. Also done when
    /// the communicator is garbage-collected and (for the world) at interpreter exit.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.exec.close());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!("<sucl.Communicator rank {} of {}>", self.rank, self.size)
    }

    /// Blocks until every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.block(py, Call::Barrier).map(drop)
    }

    /// Non-blocking `barrier`.
    fn ibarrier(&self) -> PyResult<Request> {
        self.post(Call::Barrier)
    }

    /// Copies root's `buf` into every rank's `buf`.
    #[pyo3(signature = (buf, root=0))]
    fn broadcast(&self, py: Python<'_>, buf: &Obj<'_>, root: usize) -> PyResult<()> {
        let buf = self.region("buf", buf)?.writable("buf")?;
        self.block(py, Call::Broadcast { buf, root }).map(drop)
    }

    /// Non-blocking `broadcast`.
    #[pyo3(signature = (buf, root=0))]
    fn ibroadcast(&self, buf: &Obj<'_>, root: usize) -> PyResult<Request> {
        let buf = self.region("buf", buf)?.writable("buf")?;
        self.post(Call::Broadcast { buf, root })
    }

    /// `recv = op(every rank's send)` on every rank; in place in `send` when `recv` is None.
    #[pyo3(signature = (send, recv=None, op=None))]
    fn all_reduce(&self, py: Python<'_>, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>) -> PyResult<()> {
        self.block(py, self.all_reduce_call(send, recv, op)?).map(drop)
    }

    /// Non-blocking `all_reduce`.
    #[pyo3(signature = (send, recv=None, op=None))]
    fn iall_reduce(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>) -> PyResult<Request> {
        self.post(self.all_reduce_call(send, recv, op)?)
    }

    /// `recv = op(every rank's send)` on the root; in place in `send` when `recv` is None.
    #[pyo3(signature = (send, recv=None, op=None, root=0))]
    fn reduce(&self, py: Python<'_>, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>, root: usize) -> PyResult<()> {
        self.block(py, self.reduce_call(send, recv, op, root)?).map(drop)
    }

    /// Non-blocking `reduce`.
    #[pyo3(signature = (send, recv=None, op=None, root=0))]
    fn ireduce(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>, root: usize) -> PyResult<Request> {
        self.post(self.reduce_call(send, recv, op, root)?)
    }

    /// Root's `recv` gets every rank's `send`, in rank order (`recv` is needed on the root only).
    #[pyo3(signature = (send, recv=None, root=0))]
    fn gather(&self, py: Python<'_>, send: &Obj<'_>, recv: Option<&Obj<'_>>, root: usize) -> PyResult<()> {
        self.block(py, self.gather_call(send, recv, root)?).map(drop)
    }

    /// Non-blocking `gather`.
    #[pyo3(signature = (send, recv=None, root=0))]
    fn igather(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, root: usize) -> PyResult<Request> {
        self.post(self.gather_call(send, recv, root)?)
    }

    /// Every rank's `recv` gets every rank's `send`, in rank order. With `send=None`, in place:
    /// each rank's block of `recv` is its contribution.
    #[pyo3(signature = (send, recv))]
    fn all_gather(&self, py: Python<'_>, send: Option<&Obj<'_>>, recv: &Obj<'_>) -> PyResult<()> {
        self.block(py, self.all_gather_call(send, recv)?).map(drop)
    }

    /// Non-blocking `all_gather`.
    #[pyo3(signature = (send, recv))]
    fn iall_gather(&self, send: Option<&Obj<'_>>, recv: &Obj<'_>) -> PyResult<Request> {
        self.post(self.all_gather_call(send, recv)?)
    }

    /// Rank r's `recv` gets block r of root's `send` (`send` is needed on the root only).
    #[pyo3(signature = (send, recv, root=0))]
    fn scatter(&self, py: Python<'_>, send: Option<&Obj<'_>>, recv: &Obj<'_>, root: usize) -> PyResult<()> {
        self.block(py, self.scatter_call(send, recv, root)?).map(drop)
    }

    /// Non-blocking `scatter`.
    #[pyo3(signature = (send, recv, root=0))]
    fn iscatter(&self, send: Option<&Obj<'_>>, recv: &Obj<'_>, root: usize) -> PyResult<Request> {
        self.post(self.scatter_call(send, recv, root)?)
    }

    /// Block j of rank i's `send` goes to block i of rank j's `recv`.
    fn all_to_all(&self, py: Python<'_>, send: &Obj<'_>, recv: &Obj<'_>) -> PyResult<()> {
        let (send, recv) = self.two(send, recv)?;
        self.block(py, Call::AllToAll { send, recv }).map(drop)
    }

    /// Non-blocking `all_to_all`.
    fn iall_to_all(&self, send: &Obj<'_>, recv: &Obj<'_>) -> PyResult<Request> {
        let (send, recv) = self.two(send, recv)?;
        self.post(Call::AllToAll { send, recv })
    }

    /// Reduces every rank's `send` and leaves block r of the result in rank r's `recv`.
    #[pyo3(signature = (send, recv, op=None))]
    fn reduce_scatter(&self, py: Python<'_>, send: &Obj<'_>, recv: &Obj<'_>, op: Option<&Obj<'_>>) -> PyResult<()> {
        let (send, recv) = self.two(send, recv)?;
        self.block(py, Call::ReduceScatter { send, recv, op: reduce_op(op)? }).map(drop)
    }

    /// Non-blocking `reduce_scatter`.
    #[pyo3(signature = (send, recv, op=None))]
    fn ireduce_scatter(&self, send: &Obj<'_>, recv: &Obj<'_>, op: Option<&Obj<'_>>) -> PyResult<Request> {
        let (send, recv) = self.two(send, recv)?;
        self.post(Call::ReduceScatter { send, recv, op: reduce_op(op)? })
    }

    /// Gathers `counts[r]` elements from each rank r into root's `recv` at `displs[r]`
    /// (default: packed end to end). Every rank passes the whole `counts`.
    #[pyo3(signature = (send, recv, counts, displs=None, root=0))]
    fn gatherv(
        &self,
        py: Python<'_>,
        send: &Obj<'_>,
        recv: Option<&Obj<'_>>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<()> {
        self.block(py, self.gatherv_call(send, recv, counts, displs, root)?).map(drop)
    }

    /// Non-blocking `gatherv`.
    #[pyo3(signature = (send, recv, counts, displs=None, root=0))]
    fn igatherv(
        &self,
        send: &Obj<'_>,
        recv: Option<&Obj<'_>>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<Request> {
        self.post(self.gatherv_call(send, recv, counts, displs, root)?)
    }

    /// Rank r's `recv` gets `counts[r]` elements of root's `send` from `displs[r]` (default:
    /// packed). Every rank passes the whole `counts`.
    #[pyo3(signature = (send, recv, counts, displs=None, root=0))]
    fn scatterv(
        &self,
        py: Python<'_>,
        send: Option<&Obj<'_>>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<()> {
        self.block(py, self.scatterv_call(send, recv, counts, displs, root)?).map(drop)
    }

    /// Non-blocking `scatterv`.
    #[pyo3(signature = (send, recv, counts, displs=None, root=0))]
    fn iscatterv(
        &self,
        send: Option<&Obj<'_>>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
        root: usize,
    ) -> PyResult<Request> {
        self.post(self.scatterv_call(send, recv, counts, displs, root)?)
    }

    /// Every rank's `recv` gets `counts[r]` elements from each rank r at `displs[r]` (default:
    /// packed).
    #[pyo3(signature = (send, recv, counts, displs=None))]
    fn all_gatherv(&self, py: Python<'_>, send: &Obj<'_>, recv: &Obj<'_>, counts: Vec<usize>, displs: Option<Vec<usize>>) -> PyResult<()> {
        self.block(py, self.all_gatherv_call(send, recv, counts, displs)?).map(drop)
    }

    /// Non-blocking `all_gatherv`.
    #[pyo3(signature = (send, recv, counts, displs=None))]
    fn iall_gatherv(&self, send: &Obj<'_>, recv: &Obj<'_>, counts: Vec<usize>, displs: Option<Vec<usize>>) -> PyResult<Request> {
        self.post(self.all_gatherv_call(send, recv, counts, displs)?)
    }

    /// All-to-all with per-pair counts: `counts` is the size × size table, row-major
    /// (`counts[i*size + j]` elements go from rank i to rank j), the same on every rank. Blocks
    /// start at `sdispls[j]` in `send` and land at `rdispls[j]` in `recv` (default: packed).
    #[pyo3(signature = (send, recv, counts, sdispls=None, rdispls=None))]
    fn all_to_allv(
        &self,
        py: Python<'_>,
        send: &Obj<'_>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        sdispls: Option<Vec<usize>>,
        rdispls: Option<Vec<usize>>,
    ) -> PyResult<()> {
        let call = self.all_to_allv_call(send, recv, counts, sdispls, rdispls)?;
        self.block(py, call).map(drop)
    }

    /// Non-blocking `all_to_allv`.
    #[pyo3(signature = (send, recv, counts, sdispls=None, rdispls=None))]
    fn iall_to_allv(
        &self,
        send: &Obj<'_>,
        recv: &Obj<'_>,
        counts: Vec<usize>,
        sdispls: Option<Vec<usize>>,
        rdispls: Option<Vec<usize>>,
    ) -> PyResult<Request> {
        self.post(self.all_to_allv_call(send, recv, counts, sdispls, rdispls)?)
    }

    /// Sends `buf` to rank `dest` with `tag`.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn send(&self, py: Python<'_>, buf: &Obj<'_>, dest: usize, tag: i64) -> PyResult<()> {
        let call = Call::Send { buf: self.region("buf", buf)?, dest, tag: tag_of(tag)? };
        self.block(py, call).map(drop)
    }

    /// Receives from rank `source` with `tag` into `buf`; returns the number of elements
    /// received (a longer message is an error).
    #[pyo3(signature = (buf, source, tag=0))]
    fn recv(&self, py: Python<'_>, buf: &Obj<'_>, source: usize, tag: i64) -> PyResult<usize> {
        let call = Call::Recv { buf: self.region("buf", buf)?.writable("buf")?, src: source, tag: tag_of(tag)? };
        self.block(py, call)
    }

    /// Waits (bounded by `SUCL_TIMEOUT`) until the collectives and sends/receives on device
    /// memory enqueued on `stream` ran: `stream` is a `CUstream` as an int (`torch.cuda.current_stream().cuda_stream`; 0, the
    /// default, is the legacy default stream) of the communicator's GPU. Raises when NCCL
    /// reported an asynchronous error, a rank was lost or the wait timed out. Those
    /// return without waiting for the GPU; this (or torch's stream sync) waits for them.
    #[pyo3(signature = (stream=0))]
    fn synchronize(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        self.run(py, |c| c.synchronize(&crate::device::queue(c, None, stream)?))
    }

    /// Non-blocking `send`.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn isend(&self, py: Python<'_>, buf: &Obj<'_>, dest: usize, tag: i64) -> PyResult<Request> {
        self.post_p2p(py, self.region("buf", buf)?, dest, tag_of(tag)?, false)
    }

    /// Non-blocking `recv`; the request's `wait()` returns the number of elements received.
    #[pyo3(signature = (buf, source, tag=0))]
    fn irecv(&self, py: Python<'_>, buf: &Obj<'_>, source: usize, tag: i64) -> PyResult<Request> {
        self.post_p2p(py, self.region("buf", buf)?.writable("buf")?, source, tag_of(tag)?, true)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        Python::attach(|py| py.detach(|| self.exec.close()));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn packed_displacements_lay_blocks_end_to_end() {
        assert_eq!(super::packed(&[3, 0, 2, 5]), vec![0, 3, 3, 5]);
        assert!(super::packed(&[]).is_empty());
    }
}
