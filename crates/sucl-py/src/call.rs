//! One communication call, its arguments checked and its buffers held, ready to run on a
//! communicator now (blocking) or later on the communicator's worker thread (non-blocking).

use crate::errors::invalid;
use crate::region::{typed, Region};
use pyo3::PyResult;
use sucl::{Communicator, ReduceOp};

/// A call with everything it needs. Built (and validated) while holding the GIL; run without it.
pub enum Call {
    Barrier,
    Broadcast {
        buf: Region,
        root: usize,
    },
    /// `recv == None`: in place in `send`.
    AllReduce {
        send: Region,
        recv: Option<Region>,
        op: ReduceOp,
    },
    /// `recv == None`: in place in `send` (written on the root only).
    Reduce {
        send: Region,
        recv: Option<Region>,
        op: ReduceOp,
        root: usize,
    },
    /// `recv` is needed on the root only.
    Gather {
        send: Region,
        recv: Option<Region>,
        root: usize,
    },
    /// `send == None`: in place (this rank's block of `recv` is its contribution).
    AllGather {
        send: Option<Region>,
        recv: Region,
    },
    /// `send` is needed on the root only.
    Scatter {
        send: Option<Region>,
        recv: Region,
        root: usize,
    },
    AllToAll {
        send: Region,
        recv: Region,
    },
    ReduceScatter {
        send: Region,
        recv: Region,
        op: ReduceOp,
    },
    Gatherv {
        send: Region,
        recv: Option<Region>,
        counts: Vec<usize>,
        displs: Vec<usize>,
        root: usize,
    },
    Scatterv {
        send: Option<Region>,
        recv: Region,
        counts: Vec<usize>,
        displs: Vec<usize>,
        root: usize,
    },
    AllGatherv {
        send: Region,
        recv: Region,
        counts: Vec<usize>,
        displs: Vec<usize>,
    },
    AllToAllv {
        send: Region,
        sdispls: Vec<usize>,
        recv: Region,
        rdispls: Vec<usize>,
        counts: Vec<usize>,
    },
    Send {
        buf: Region,
        dest: usize,
        tag: u32,
    },
    Recv {
        buf: Region,
        src: usize,
        tag: u32,
    },
}

/// Checks that `recv` may receive what `send` holds: same element type, writable, and either
/// no overlap or (where `same_ok`) exactly the same memory. Returns `recv` writable.
pub fn pair(send: &Region, recv: Region, same_ok: bool) -> PyResult<Region> {
    if send.device.is_some() != recv.device.is_some() {
        return Err(invalid("recv", "mixes host and device (CUDA) memory with send: pass both on the same side"));
    }
    if recv.dtype != send.dtype {
        return Err(invalid("recv", format!("element type {} differs from send's {}", recv.dtype, send.dtype)));
    }
    if recv.overlaps(send) && !(same_ok && recv.same_memory(send)) {
        return Err(invalid("recv", "overlaps send (pass recv=None to work in place)"));
    }
    recv.writable("recv")
}

impl Call {
    /// The call's buffers (send side first), `None` where it has none.
    fn buffers(&self) -> [Option<&Region>; 2] {
        match self {
            Call::Barrier => [None, None],
            Call::Broadcast { buf, .. } | Call::Send { buf, .. } | Call::Recv { buf, .. } => [Some(buf), None],
            Call::AllReduce { send, recv, .. }
            | Call::Reduce { send, recv, .. }
            | Call::Gather { send, recv, .. }
            | Call::Gatherv { send, recv, .. } => [Some(send), recv.as_ref()],
            Call::AllGather { send, recv } | Call::Scatter { send, recv, .. } | Call::Scatterv { send, recv, .. } => {
                [send.as_ref(), Some(recv)]
            }
            Call::AllToAll { send, recv }
            | Call::ReduceScatter { send, recv, .. }
            | Call::AllGatherv { send, recv, .. }
            | Call::AllToAllv { send, recv, .. } => [Some(send), Some(recv)],
        }
    }

    /// Runs the call; returns the number of elements received (`Recv`) or 0.
    pub fn run(&self, c: &Communicator) -> sucl::Result<usize> {
        let on_device = self.buffers().into_iter().flatten().filter_map(|r| r.device.map(|d| (d, r.len)));
        let Some((first, _)) = on_device.clone().next() else { return self.run_on_host(c) };
        // The GPU is the one a non-empty buffer lives on; the stream the first buffer's.
        let gpu = on_device.filter(|(_, len)| *len > 0).map(|(d, _)| d).next();
        self.run_on_device(c, &crate::device::queue(c, gpu, first.stream)?)
    }

    /// Runs the call on device buffers, enqueued on `q`.
    fn run_on_device(&self, c: &Communicator, q: &sucl::cuda::Queue) -> sucl::Result<usize> {
        use crate::device::wrap;
        // SAFETY (every `wrap` below): each region's dtype selected `T` through `typed!`; the
        // call holds every region's object until it returns, and the caller keeps the memory
        // untouched until the stream ran the call (NCCL's rule, documented); same-memory pairs
        // run through the in-place forms.
        match self {
            Call::Barrier => c.barrier_on(q).map(|_| 0),
            Call::Broadcast { buf, root } => typed!(buf.dtype, T => c.broadcast(&mut unsafe { wrap::<T>(q, "buf", Some(buf))? }, *root)).map(|_| 0),
            Call::AllReduce { send, recv, op } => typed!(send.dtype, T => match recv {
                Some(r) if !r.same_memory(send) => c.all_reduce(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", Some(r))? }, *op),
                _ => c.all_reduce_in_place(&mut unsafe { wrap::<T>(q, "send", Some(send))? }, *op),
            })
            .map(|_| 0),
            Call::Reduce { send, recv, op, root } => typed!(send.dtype, T => match recv {
                Some(r) if !r.same_memory(send) => c.reduce(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", Some(r))? }, *op, *root),
                _ => c.reduce_in_place(&mut unsafe { wrap::<T>(q, "send", Some(send))? }, *op, *root),
            })
            .map(|_| 0),
            Call::Gather { send, recv, root } => typed!(send.dtype, T =>
                c.gather(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", recv.as_ref())? }, *root))
            .map(|_| 0),
            Call::AllGather { send, recv } => typed!(recv.dtype, T => match send {
                Some(s) => c.all_gather(&unsafe { wrap::<T>(q, "send", Some(s))? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }),
                None => c.all_gather_in_place(&mut unsafe { wrap::<T>(q, "recv", Some(recv))? }),
            })
            .map(|_| 0),
            Call::Scatter { send, recv, root } => typed!(recv.dtype, T =>
                c.scatter(&unsafe { wrap::<T>(q, "send", send.as_ref())? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }, *root))
            .map(|_| 0),
            Call::AllToAll { send, recv } => typed!(send.dtype, T =>
                c.all_to_all(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }))
            .map(|_| 0),
            Call::ReduceScatter { send, recv, op } => typed!(send.dtype, T =>
                c.reduce_scatter(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }, *op))
            .map(|_| 0),
            Call::Gatherv { send, recv, counts, displs, root } => typed!(send.dtype, T =>
                c.gatherv(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", recv.as_ref())? }, counts, displs, *root))
            .map(|_| 0),
            Call::Scatterv { send, recv, counts, displs, root } => typed!(recv.dtype, T =>
                c.scatterv(&unsafe { wrap::<T>(q, "send", send.as_ref())? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }, counts, displs, *root))
            .map(|_| 0),
            Call::AllGatherv { send, recv, counts, displs } => typed!(send.dtype, T =>
                c.all_gatherv(&unsafe { wrap::<T>(q, "send", Some(send))? }, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }, counts, displs))
            .map(|_| 0),
            Call::AllToAllv { send, sdispls, recv, rdispls, counts } => typed!(send.dtype, T =>
                c.all_to_allv(&unsafe { wrap::<T>(q, "send", Some(send))? }, sdispls, &mut unsafe { wrap::<T>(q, "recv", Some(recv))? }, rdispls, counts))
            .map(|_| 0),
            Call::Send { buf, dest, tag } => typed!(buf.dtype, T => c.send(&unsafe { wrap::<T>(q, "buf", Some(buf))? }, *dest, *tag)).map(|_| 0),
            Call::Recv { buf, src, tag } => typed!(buf.dtype, T => c.recv(&mut unsafe { wrap::<T>(q, "buf", Some(buf))? }, *src, *tag)).map(|s| s.count),
        }
    }

    /// Runs the call on host buffers.
    fn run_on_host(&self, c: &Communicator) -> sucl::Result<usize> {
        // SAFETY (every `slice`/`slice_mut` below): each region's dtype selected `T` through
        // `typed!`; `pair` guaranteed that a call's send and receive regions either do not
        // overlap or are the same memory, and same-memory pairs run through the in-place
        // forms, so no mutable slice aliases another slice.
        match self {
            Call::Barrier => c.barrier().map(|_| 0),
            Call::Broadcast { buf, root } => typed!(buf.dtype, T => c.broadcast(unsafe { buf.slice_mut::<T>() }, *root)).map(|_| 0),
            Call::AllReduce { send, recv, op } => typed!(send.dtype, T => match recv {
                Some(r) if !r.same_memory(send) => c.all_reduce(unsafe { send.slice::<T>() }, unsafe { r.slice_mut::<T>() }, *op),
                _ => c.all_reduce_in_place(unsafe { send.slice_mut::<T>() }, *op),
            })
            .map(|_| 0),
            Call::Reduce { send, recv, op, root } => typed!(send.dtype, T => match recv {
                Some(r) if !r.same_memory(send) => c.reduce(unsafe { send.slice::<T>() }, unsafe { r.slice_mut::<T>() }, *op, *root),
                _ => c.reduce_in_place(unsafe { send.slice_mut::<T>() }, *op, *root),
            })
            .map(|_| 0),
            Call::Gather { send, recv, root } => typed!(send.dtype, T => match recv {
                Some(r) => c.gather(unsafe { send.slice::<T>() }, unsafe { r.slice_mut::<T>() }, *root),
                None => c.gather(unsafe { send.slice::<T>() }, &mut Vec::<T>::new(), *root),
            })
            .map(|_| 0),
            Call::AllGather { send, recv } => typed!(recv.dtype, T => match send {
                Some(s) => c.all_gather(unsafe { s.slice::<T>() }, unsafe { recv.slice_mut::<T>() }),
                None => c.all_gather_in_place(unsafe { recv.slice_mut::<T>() }),
            })
            .map(|_| 0),
            Call::Scatter { send, recv, root } => typed!(recv.dtype, T => match send {
                Some(s) => c.scatter(unsafe { s.slice::<T>() }, unsafe { recv.slice_mut::<T>() }, *root),
                None => c.scatter(&Vec::<T>::new(), unsafe { recv.slice_mut::<T>() }, *root),
            })
            .map(|_| 0),
            Call::AllToAll { send, recv } => {
                typed!(send.dtype, T => c.all_to_all(unsafe { send.slice::<T>() }, unsafe { recv.slice_mut::<T>() })).map(|_| 0)
            }
            Call::ReduceScatter { send, recv, op } => {
                typed!(send.dtype, T => c.reduce_scatter(unsafe { send.slice::<T>() }, unsafe { recv.slice_mut::<T>() }, *op)).map(|_| 0)
            }
            Call::Gatherv { send, recv, counts, displs, root } => typed!(send.dtype, T => match recv {
                Some(r) => c.gatherv(unsafe { send.slice::<T>() }, unsafe { r.slice_mut::<T>() }, counts, displs, *root),
                None => c.gatherv(unsafe { send.slice::<T>() }, &mut Vec::<T>::new(), counts, displs, *root),
            })
            .map(|_| 0),
            Call::Scatterv { send, recv, counts, displs, root } => typed!(recv.dtype, T => match send {
                Some(s) => c.scatterv(unsafe { s.slice::<T>() }, unsafe { recv.slice_mut::<T>() }, counts, displs, *root),
                None => c.scatterv(&Vec::<T>::new(), unsafe { recv.slice_mut::<T>() }, counts, displs, *root),
            })
            .map(|_| 0),
            Call::AllGatherv { send, recv, counts, displs } => typed!(send.dtype, T =>
                c.all_gatherv(unsafe { send.slice::<T>() }, unsafe { recv.slice_mut::<T>() }, counts, displs))
            .map(|_| 0),
            Call::AllToAllv { send, sdispls, recv, rdispls, counts } => typed!(send.dtype, T =>
                c.all_to_allv(unsafe { send.slice::<T>() }, sdispls, unsafe { recv.slice_mut::<T>() }, rdispls, counts))
            .map(|_| 0),
            Call::Send { buf, dest, tag } => typed!(buf.dtype, T => c.send(unsafe { buf.slice::<T>() }, *dest, *tag)).map(|_| 0),
            Call::Recv { buf, src, tag } => typed!(buf.dtype, T => c.recv(unsafe { buf.slice_mut::<T>() }, *src, *tag)).map(|s| s.count),
        }
    }
}
