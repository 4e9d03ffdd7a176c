//! `sucl.StreamQueue`: sucl's stream-triggered queue (`sucl::stream::CommQueue`) bound to one
//! CUDA stream — a torch stream, an object with `.cuda_stream`, or a raw `CUstream` — for torch
//! CUDA tensors and `__cuda_array_interface__` objects. It only translates: each tensor becomes a
//! [`DeviceBuf::foreign`] that keeps the tensor alive until its operation completed, arguments
//! become calls of the queue, errors become Python exceptions. The queue owns a communicator of
//! its own (a collective split of the Python communicator, as MPI's stream communicators are),
//! so the Python communicator stays usable beside it.

use crate::comm::Communicator;
use crate::errors::{invalid, to_py};
use crate::exec::lock;
use crate::region::{typed, Region};
use pyo3::intern;
use pyo3::prelude::*;
use std::sync::Mutex;
use sucl::cuda::{DeviceElement, ForeignBuffer, Queue};
use sucl::stream::device::{DeviceBuf, Transport};
use sucl::stream::CommQueue;

type Obj<'py> = Bound<'py, PyAny>;

/// The transport named by `name`.
fn transport_of(name: &str) -> PyResult<Transport> {
    match name.to_ascii_lowercase().as_str() {
        "auto" => Ok(Transport::Auto),
        "nccl" => Ok(Transport::Nccl),
        "staged" => Ok(Transport::Staged),
        other => Err(invalid("transport", format!("{other:?} is not one of \"auto\", \"nccl\", \"staged\""))),
    }
}

fn transport_name(t: Option<Transport>) -> &'static str {
    match t {
        Some(Transport::Nccl) => "nccl",
        Some(Transport::Staged) => "staged",
        Some(Transport::Auto) => "auto",
        None => "closed",
    }
}

/// The `CUstream` of `stream` (an int, or an object with `.cuda_stream`), checked to be of GPU
/// `gpu` where the object says its device (`.device.index`, as torch streams do).
fn stream_handle(stream: &Obj<'_>, gpu: usize) -> PyResult<u64> {
    let py = stream.py();
    if let Ok(h) = stream.extract::<u64>() {
        return Ok(h);
    }
    let Ok(h) = stream.getattr(intern!(py, "cuda_stream")) else {
        return Err(invalid("stream", "not a CUDA stream: pass a torch.cuda.Stream, an object with .cuda_stream, or a CUstream as an int"));
    };
    let handle: u64 = h.extract().map_err(|_| invalid("stream", ".cuda_stream is not an integer"))?;
    if let Ok(index) = stream.getattr(intern!(py, "device")).and_then(|d| d.getattr(intern!(py, "index"))) {
        if let Ok(index) = index.extract::<usize>() {
            if index != gpu {
                return Err(invalid("stream", format!("is a stream of GPU {index} but this rank's GPU is {gpu}")));
            }
        }
    }
    Ok(handle)
}

/// torch's current stream of GPU `gpu`.
fn torch_current_stream<'py>(py: Python<'py>, gpu: usize) -> PyResult<Obj<'py>> {
    let torch = py.import(intern!(py, "torch")).map_err(|_| {
        invalid("stream", "stream=None takes torch's current stream, but torch is not importable: pass a CUstream as an int")
    })?;
    torch.getattr(intern!(py, "cuda"))?.call_method1(intern!(py, "current_stream"), (gpu,))
}

/// A stream-triggered queue on a CUDA stream: operations are *enqueued* (nothing moves), then
/// `start()` releases everything enqueued since the last start when the stream reaches that
/// point, and `wait()` makes later work on the stream wait for what was started — all without
/// the host waiting for the GPU. Made by `Communicator.stream_queue()` (collective).
#[pyclass(module = "sucl")]
pub struct StreamQueue {
    inner: Mutex<Option<CommQueue>>,
    /// The stream (borrowed: `stream_obj` or the caller keeps it alive).
    queue: Queue,
    stream: u64,
    _stream_obj: Option<Py<PyAny>>,
    /// The communicator it was split from: its waits are interruptible through it.
    parent: Py<Communicator>,
    transport: Transport,
    rank: usize,
    size: usize,
    world_rank: usize,
    gpu: usize,
}

impl StreamQueue {
    /// Binds a new queue to `stream` (None: torch's current stream of the communicator's GPU)
    /// over `transport`. Collective over `parent`.
    pub fn open(parent: &Bound<'_, Communicator>, stream: Option<&Obj<'_>>, transport: &str) -> PyResult<StreamQueue> {
        let py = parent.py();
        let transport = transport_of(transport)?;
        let comm = parent.borrow();
        let world_rank = comm.world_rank();
        let gpu = comm.gpu(py)?;
        let stream_obj = match stream.filter(|s| !s.is_none()) {
            Some(s) => s.clone(),
            None => torch_current_stream(py, gpu)?,
        };
        let handle = stream_handle(&stream_obj, gpu)?;
        let keep = (!stream_obj.is_instance_of::<pyo3::types::PyInt>()).then(|| stream_obj.unbind());
        let (cq, queue) = comm.run(py, |c| {
            let queue = crate::device::queue(c, None, handle)?;
            // Every rank joins color 0, so every rank gets a communicator.
            let own = c
                .split(Some(0), c.rank() as i64)?
                .ok_or_else(|| sucl::Error::Config("the queue's split gave this rank no communicator".into()))?;
            Ok((CommQueue::on_stream(own, &queue, transport)?, queue))
        })?;
        let transport = cq.transport().unwrap_or(transport);
        let (rank, size) = (cq.rank(), cq.size());
        Ok(StreamQueue {
            inner: Mutex::new(Some(cq)),
            queue,
            stream: handle,
            _stream_obj: keep,
            parent: parent.clone().unbind(),
            transport,
            rank,
            size,
            world_rank,
            gpu,
        })
    }

    /// Device memory of this queue's GPU for `obj` (`arg` names it in errors).
    fn region(&self, arg: &str, obj: &Obj<'_>) -> PyResult<Region> {
        // The queue orders its buffers on its own stream: no current stream is looked up.
        let r = Region::of_unordered(arg, obj, self.world_rank)?;
        match r.device {
            None => Err(invalid(
                arg,
                format!("is host memory: a StreamQueue takes CUDA tensors (or __cuda_array_interface__ objects) of GPU {}", self.gpu),
            )),
            Some(d) if r.len > 0 && d.ordinal != self.gpu => {
                Err(invalid(arg, format!("is memory of GPU {} but this queue's stream is on GPU {}", d.ordinal, self.gpu)))
            }
            Some(_) => Ok(r),
        }
    }

    /// Runs `f` on the open queue, with the GIL released.
    fn with<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut CommQueue) -> sucl::Result<R> + Send) -> PyResult<R> {
        py.detach(|| match lock(&self.inner).as_mut() {
            Some(cq) => f(cq),
            None => Err(self.closed()),
        })
        .map_err(to_py)
    }

    /// Runs `f` on the open queue as [`StreamQueue::with`] does, and so that Ctrl-C interrupts
    /// its waits (through the parent communicator, which aborts the job): for the calls that
    /// can wait — a start held back by the cap on operations in flight, the first NCCL group
    /// with a peer (which connects to it), synchronize, close.
    fn waiting<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut CommQueue) -> sucl::Result<R> + Send) -> PyResult<R> {
        let parent = self.parent.borrow(py);
        parent.interruptible(py, || match lock(&self.inner).as_mut() {
            Some(cq) => f(cq),
            None => Err(self.closed()),
        })
    }

    fn closed(&self) -> sucl::Error {
        sucl::Error::invalid(self.world_rank, "queue", "is closed")
    }

    /// Enqueues `op`; its request (`counts`: `wait()` returns the element count).
    fn enqueue(&self, py: Python<'_>, op: Op, counts: bool) -> PyResult<crate::Request> {
        let q = &self.queue;
        let req = self.with(py, move |cq| op.enqueue(cq, q))?;
        Ok(crate::Request::stream(req, counts))
    }

    /// `send` and `recv` of a collective: the same element type, `recv` writable, and either
    /// apart or (where `same_ok`) the same memory, which yields `None` for `recv` (in place).
    fn pair(&self, send: &Obj<'_>, recv: Option<&Obj<'_>>, same_ok: bool) -> PyResult<(Region, Option<Region>)> {
        let s = self.region("send", send)?;
        let Some(r) = recv.filter(|r| !r.is_none()) else {
            return Ok((s.writable("send")?, None));
        };
        let r = crate::call::pair(&s, self.region("recv", r)?, same_ok)?;
        if r.same_memory(&s) {
            return Ok((r, None));
        }
        Ok((s, Some(r)))
    }
}

/// One operation to enqueue, its buffers checked (device memory of the queue's GPU, element
/// types agreeing, results writable).
enum Op {
    Send {
        buf: Region,
        peer: usize,
        tag: u32,
    },
    Recv {
        buf: Region,
        peer: usize,
        tag: u32,
    },
    /// `recv == None`: in place.
    AllReduce {
        send: Region,
        recv: Option<Region>,
        op: sucl::ReduceOp,
    },
    Broadcast {
        buf: Region,
        root: usize,
    },
    /// `send == None`: in place (this rank's block of `recv` is its contribution).
    AllGather {
        send: Option<Region>,
        recv: Region,
    },
    ReduceScatter {
        send: Region,
        recv: Region,
        op: sucl::ReduceOp,
    },
    AllToAll {
        send: Region,
        recv: Region,
    },
}

impl Op {
    fn dtype(&self) -> sucl::DType {
        match self {
            Op::Send { buf, .. } | Op::Recv { buf, .. } | Op::Broadcast { buf, .. } => buf.dtype,
            Op::AllReduce { send, .. } | Op::ReduceScatter { send, .. } | Op::AllToAll { send, .. } => send.dtype,
            Op::AllGather { recv, .. } => recv.dtype,
        }
    }

    fn enqueue(self, cq: &mut CommQueue, q: &Queue) -> sucl::Result<sucl::stream::Request> {
        typed!(self.dtype(), T => self.enqueue_as::<T>(cq, q))
    }

    fn enqueue_as<T: DeviceElement>(self, cq: &mut CommQueue, q: &Queue) -> sucl::Result<sucl::stream::Request> {
        let buf = |r: Region| foreign::<T>(q, r);
        match self {
            Op::Send { buf: b, peer, tag } => cq.enqueue_send(&buf(b), peer, tag),
            Op::Recv { buf: b, peer, tag } => cq.enqueue_recv(&buf(b), peer, tag),
            Op::AllReduce { send, recv, op } => {
                let s = buf(send);
                let r = recv.map(buf).unwrap_or_else(|| s.clone());
                cq.enqueue_all_reduce(&s, &r, op)
            }
            Op::Broadcast { buf: b, root } => cq.enqueue_broadcast(&buf(b), root),
            Op::AllGather { send, recv } => {
                let r = buf(recv);
                let s = send.map(buf).unwrap_or_else(|| r.clone());
                cq.enqueue_all_gather(&s, &r)
            }
            Op::ReduceScatter { send, recv, op } => cq.enqueue_reduce_scatter(&buf(send), &buf(recv), op),
            Op::AllToAll { send, recv } => cq.enqueue_all_to_all(&buf(send), &buf(recv)),
        }
    }
}

/// `r` as a buffer of the queue on `q` that keeps `r` (and so its tensor) alive until the
/// queue lets go of it, i.e. until the stream ran its operation. `r` was checked when it was
/// made (the driver: device memory of one GPU from its first byte to its last, aligned) and by
/// [`StreamQueue::region`] (that GPU is `q`'s), so the driver is not asked twice.
fn foreign<T: DeviceElement>(q: &Queue, r: Region) -> DeviceBuf<T> {
    // SAFETY: `T` is the region's element type (`typed!` chose it from `r.dtype`) and its
    // address is aligned for it (`Region::checked`); the memory is device memory of `q`'s GPU
    // (checked as above) and stays allocated while `r` lives, which the DeviceBuf keeps until
    // the queue released it after the stream ran the operation; the caller keeps other work
    // off the memory until then unless ordered by the stream (the documented rule, as NCCL's).
    let fb = unsafe { ForeignBuffer::<T>::new_unchecked(q, r.addr() as u64, r.len) };
    DeviceBuf::foreign(fb, Box::new(r))
}

#[pymethods]
impl StreamQueue {
    /// Binds a queue to `stream` (see `Communicator.stream_queue`). Collective.
    #[new]
    #[pyo3(signature = (comm, stream=None, transport="auto"))]
    fn new(comm: &Bound<'_, Communicator>, stream: Option<&Obj<'_>>, transport: &str) -> PyResult<Self> {
        Self::open(comm, stream, transport)
    }

    /// How the queue moves data: "nccl" or "staged".
    #[getter]
    fn transport(&self) -> &'static str {
        transport_name(Some(self.transport))
    }

    /// The `CUstream` it is bound to, as an int.
    #[getter]
    fn stream(&self) -> u64 {
        self.stream
    }

    /// This process's rank in the queue's communicator (its rank in the parent communicator).
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Operations enqueued and not yet started.
    #[getter]
    fn enqueued(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |cq| Ok(cq.enqueued()))
    }

    /// Enqueues a send of `buf` to rank `dest` with `tag`; moves nothing until `start()`.
    #[pyo3(signature = (buf, dest, tag=0))]
    fn enqueue_send(&self, py: Python<'_>, buf: &Obj<'_>, dest: usize, tag: i64) -> PyResult<crate::Request> {
        let op = Op::Send { buf: self.region("buf", buf)?, peer: dest, tag: crate::comm::tag_of(tag)? };
        self.enqueue(py, op, false)
    }

    /// Enqueues a receive into `buf` from rank `source` with `tag`; the request's `wait()`
    /// returns the number of elements received.
    #[pyo3(signature = (buf, source, tag=0))]
    fn enqueue_recv(&self, py: Python<'_>, buf: &Obj<'_>, source: usize, tag: i64) -> PyResult<crate::Request> {
        let op = Op::Recv { buf: self.region("buf", buf)?.writable("buf")?, peer: source, tag: crate::comm::tag_of(tag)? };
        self.enqueue(py, op, true)
    }

    /// Enqueues `recv = op(every rank's send)`; in place in `send` when `recv` is None.
    #[pyo3(signature = (send, recv=None, op=None))]
    fn enqueue_all_reduce(&self, py: Python<'_>, send: &Obj<'_>, recv: Option<&Obj<'_>>, op: Option<&Obj<'_>>) -> PyResult<crate::Request> {
        let op = crate::comm::reduce_op(op)?;
        let (send, recv) = self.pair(send, recv, true)?;
        self.enqueue(py, Op::AllReduce { send, recv, op }, false)
    }

    /// Enqueues a broadcast of root's `buf` into every rank's `buf`.
    #[pyo3(signature = (buf, root=0))]
    fn enqueue_broadcast(&self, py: Python<'_>, buf: &Obj<'_>, root: usize) -> PyResult<crate::Request> {
        self.enqueue(py, Op::Broadcast { buf: self.region("buf", buf)?.writable("buf")?, root }, false)
    }

    /// Enqueues an all_gather of every rank's `send` into `recv`, in rank order; with
    /// `send=None`, in place (this rank's block of `recv` is its contribution).
    #[pyo3(signature = (send, recv))]
    fn enqueue_all_gather(&self, py: Python<'_>, send: Option<&Obj<'_>>, recv: &Obj<'_>) -> PyResult<crate::Request> {
        let recv_region = self.region("recv", recv)?;
        let op = match send.filter(|s| !s.is_none()) {
            None => Op::AllGather { send: None, recv: recv_region.writable("recv")? },
            Some(s) => {
                let s = self.region("send", s)?;
                Op::AllGather { recv: crate::call::pair(&s, recv_region, false)?, send: Some(s) }
            }
        };
        self.enqueue(py, op, false)
    }

    /// Enqueues a reduce_scatter: every rank's `send` (size × recv) reduced, block r to rank
    /// r's `recv`. Not in place (two buffers).
    #[pyo3(signature = (send, recv, op=None))]
    fn enqueue_reduce_scatter(&self, py: Python<'_>, send: &Obj<'_>, recv: &Obj<'_>, op: Option<&Obj<'_>>) -> PyResult<crate::Request> {
        let op = crate::comm::reduce_op(op)?;
        let s = self.region("send", send)?;
        let r = crate::call::pair(&s, self.region("recv", recv)?, false)?;
        self.enqueue(py, Op::ReduceScatter { send: s, recv: r, op }, false)
    }

    /// Enqueues an all_to_all: block j of `send` goes to block (this rank) of rank j's `recv`.
    /// Not in place (two buffers).
    fn enqueue_all_to_all(&self, py: Python<'_>, send: &Obj<'_>, recv: &Obj<'_>) -> PyResult<crate::Request> {
        let s = self.region("send", send)?;
        let r = crate::call::pair(&s, self.region("recv", recv)?, false)?;
        self.enqueue(py, Op::AllToAll { send: s, recv: r }, false)
    }

    /// Releases everything enqueued since the last start once the stream reaches this point.
    /// Returns at once.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        self.waiting(py, |cq| cq.start())
    }

    /// Makes later work on the stream wait until everything started so far completed; the host
    /// does not wait for the data (over NCCL, the first group with a peer connects to that peer
    /// here, which waits until the peer takes part: bounded, and Ctrl-C interrupts it as it
    /// does `synchronize`). Refused while operations are enqueued and not started.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        self.waiting(py, |cq| cq.wait())
    }

    /// Makes `stream` (another stream of this GPU: a torch.cuda.Stream, an object with
    /// `.cuda_stream`, or a CUstream int) wait for everything started so far; the host does
    /// not wait.
    fn wait_on(&self, py: Python<'_>, stream: &Obj<'_>) -> PyResult<()> {
        let handle = stream_handle(stream, self.gpu)?;
        let dev = self.queue.device().clone();
        self.waiting(py, move |cq| {
            // SAFETY: `stream` (the caller's object, or the int the caller vouches for) is alive
            // for this call; the queue only records an event and makes the stream wait for it.
            let other = unsafe { dev.borrowed_queue(handle as sucl::cuda::CUstream)? };
            cq.wait_on(&other)
        })
    }

    /// Blocks (GIL released, bounded by SUCL_TIMEOUT) until the stream ran everything enqueued
    /// on it and every started operation completed; raises the first error among them. Ctrl-C
    /// interrupts it (KeyboardInterrupt; the job is aborted, as for a blocking call).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.waiting(py, |cq| cq.synchronize())
    }

    /// Ends the queue (and its communicator). Raises if operations were in flight: those never
    /// started are withdrawn, started ones waited for (bounded). Later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(cq) = lock(&self.inner).take() else { return Ok(()) };
        self.parent.borrow(py).interruptible(py, || cq.close().map(drop))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the queue; when the block raised, a failing close does not hide its exception.
    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(&self, py: Python<'_>, exc_type: Option<&Obj<'_>>, _exc: Option<&Obj<'_>>, _tb: Option<&Obj<'_>>) -> PyResult<()> {
        let closed = self.close(py);
        match exc_type.filter(|t| !t.is_none()) {
            Some(_) => Ok(()),
            None => closed,
        }
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.inner).is_some() { transport_name(Some(self.transport)) } else { "closed" };
        format!("<sucl.StreamQueue rank {} of {} on GPU {}, stream {:#x}, {state}>", self.rank, self.size, self.gpu, self.stream)
    }
}

impl Drop for StreamQueue {
    fn drop(&mut self) {
        // Closing waits (bounded) for operations in flight: not while holding the GIL.
        if let Some(cq) = lock(&self.inner).take() {
            Python::attach(|py| py.detach(|| drop(cq)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_are_named_case_insensitively_and_others_refused() {
        assert!(matches!(transport_of("auto"), Ok(Transport::Auto)));
        assert!(matches!(transport_of("NCCL"), Ok(Transport::Nccl)));
        assert!(matches!(transport_of("staged"), Ok(Transport::Staged)));
        assert!(transport_of("fast").is_err());
        assert_eq!(transport_name(Some(Transport::Staged)), "staged");
    }
}
