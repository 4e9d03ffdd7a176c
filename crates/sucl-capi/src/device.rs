//! Collectives, v-collectives and point-to-point on CUDA device pointers, ordered on the
//! caller's stream (`void *stream`: a `cudaStream_t` or `CUstream`; NULL is the legacy default
//! stream), as NCCL orders its calls: each call enqueues its work on the stream and returns
//! (NCCL); the staged path (no NCCL) is ordered on the stream too, and its point-to-point calls
//! wait for the transfer. `sucl_synchronize_device` waits for the stream (bounded) and reports
//! asynchronous errors.
//!
//! Every device pointer is checked with the CUDA driver (`cuPointerGetAttributes`) before
//! anything moves: host memory, or memory of another GPU than the call's, is
//! `SUCL_ERR_INVALID_ARGUMENT`. Without a CUDA driver or GPU — or in a library built without
//! the `cuda` feature — every call here is `SUCL_ERR_BACKEND_UNAVAILABLE`. The GPU of a call is
//! the one its first non-empty buffer lives on (v-collectives, barrier and synchronize: the
//! communicator's); the stream must belong to that GPU's primary context (the one the CUDA
//! runtime uses).
//!
//! Overlap: only the in-place forms may share memory (all_reduce and, on the root, reduce with
//! `sendbuf == recvbuf`; all_gather with `sendbuf == recvbuf + rank × count`); any other
//! overlap of a call on device memory's buffers is refused (sucl does not copy device memory aside).

#![cfg_attr(not(feature = "cuda"), allow(unused_variables))]

use crate::error::{entry, Fail};
use crate::types::{sucl_comm, sucl_dtype, sucl_op, sucl_result};
use std::ffi::c_void;

#[cfg(feature = "cuda")]
use gpu::*;

/// Every entry point's answer in a library built without CUDA.
#[cfg(not(feature = "cuda"))]
fn without_cuda() -> sucl_result {
    entry(|| {
        Err(Fail::Sucl(sucl::Error::BackendUnavailable {
            rank: 0,
            backend: "cuda".into(),
            why: "libsucl was built without CUDA support (the sucl-capi crate's `cuda` feature)".into(),
        }))
    })
}

/// Runs `$body` (an expression giving a `sucl_result`) in a CUDA build, else refuses the call.
macro_rules! cuda {
    ($body:expr) => {{
        #[cfg(not(feature = "cuda"))]
        return without_cuda();
        #[cfg(feature = "cuda")]
        $body
    }};
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use crate::types;
    use sucl::cuda::{driver_available, pointer_device, DeviceElement, ForeignBuffer, Queue};
    use sucl::{Communicator, DType};

    pub(super) use crate::coll::{root_of, times};
    pub(super) use crate::handles::COMMS;
    pub(super) use crate::mem::{extent, table, Out};
    pub(super) use crate::types::with_dtype;

    /// A device buffer argument as C passed it: its name, address and length in elements.
    #[derive(Clone, Copy)]
    pub(super) struct Arg {
        pub(super) name: &'static str,
        pub(super) ptr: *const c_void,
        pub(super) count: usize,
    }

    pub(super) fn arg(name: &'static str, ptr: *const c_void, count: usize) -> Arg {
        Arg { name, ptr, count }
    }

    /// One call on device memory: the communicator and the caller's stream as a queue on the call's GPU.
    pub(super) struct Gpu<'c> {
        pub(super) c: &'c Communicator,
        pub(super) queue: Queue,
    }

    impl Gpu<'_> {
        /// `a` as device memory of this call's GPU (checked with the driver).
        ///
        /// # Safety
        /// The C caller's contract: `a` is device memory of `a.count` elements that stays
        /// valid, and is not used by other work, until the stream ran the call.
        pub(super) unsafe fn buf<T: DeviceElement>(&self, a: Arg) -> Result<ForeignBuffer<T>, Fail> {
            // SAFETY: forwarded to the caller; `ForeignBuffer::new` checks what it can.
            Ok(unsafe { ForeignBuffer::new(&self.queue, a.name, a.ptr as u64, a.count)? })
        }

        /// A send and a receive buffer that share no byte, each checked as by [`Gpu::buf`].
        ///
        /// # Safety
        /// As [`Gpu::buf`], for both.
        pub(super) unsafe fn pair<T: DeviceElement>(&self, s: Arg, r: Arg) -> Result<(ForeignBuffer<T>, ForeignBuffer<T>), Fail> {
            separate(s, r, std::mem::size_of::<T>())?;
            // SAFETY: forwarded to the caller.
            unsafe { Ok((self.buf(s)?, self.buf(r)?)) }
        }

        /// A buffer this rank does not use (non-root buffers of rooted collectives).
        pub(super) fn unused<T: DeviceElement>(&self) -> ForeignBuffer<T> {
            // SAFETY: an empty buffer is never read or written.
            unsafe { ForeignBuffer::new_unchecked(&self.queue, 0, 0) }
        }
    }

    /// The byte span of `a` for element size `es`.
    fn span(a: Arg, es: usize) -> Result<(usize, usize), Fail> {
        let bytes = a.count.checked_mul(es).ok_or_else(|| Fail::arg(a.name, format!("{} elements do not fit in memory", a.count)))?;
        let start = a.ptr as usize;
        Ok((start, start.saturating_add(bytes)))
    }

    /// Refuses two device buffers that share a byte (the in-place forms are dispatched before).
    pub(super) fn separate(s: Arg, r: Arg, es: usize) -> Result<(), Fail> {
        let ((a0, a1), (b0, b1)) = (span(s, es)?, span(r, es)?);
        if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
            return Err(Fail::arg(
                s.name,
                format!("overlaps `{}`: device buffers may share memory only in the in-place forms (see sucl.h)", r.name),
            ));
        }
        Ok(())
    }

    /// Checks out `comm`, checks `dtype`, and runs `f` with the caller's `stream` as a queue on the
    /// GPU of the first non-empty buffer in `bufs` (else the communicator's GPU).
    pub(super) fn on_device(
        comm: sucl_comm,
        dtype: sucl_dtype,
        stream: *mut c_void,
        bufs: &[Arg],
        f: impl FnOnce(&Gpu, DType) -> Result<(), Fail>,
    ) -> sucl_result {
        entry(|| {
            let dt = types::dtype(dtype)?;
            let c = COMMS.checkout(comm)?;
            let gpu = open(&c, stream, bufs, dt.size())?;
            f(&gpu, dt)
        })
    }

    /// The caller's stream on the GPU the buffers live on (see [`on_device`]).
    pub(super) fn open<'c>(c: &'c Communicator, stream: *mut c_void, bufs: &[Arg], es: usize) -> Result<Gpu<'c>, Fail> {
        let rank = c.rank();
        driver_available().map_err(|why| sucl::Error::BackendUnavailable {
            rank,
            backend: "cuda".into(),
            why: format!("device pointers need a CUDA driver and GPU: {why}"),
        })?;
        let first = bufs.iter().find(|a| a.count > 0);
        let dev = match first {
            Some(&a) => {
                let (start, end) = span(a, es)?;
                c.cuda_device_at(pointer_device(rank, a.name, start as u64, end - start)?)?
            }
            None => match c.attached_device() {
                Some(d) => d,
                None => c.cuda_device()?,
            },
        };
        // SAFETY: the C caller's contract: `stream` is a live stream of this GPU (or NULL) for
        // the call and the work it enqueues; the queue is dropped when the call returns.
        let queue = unsafe { dev.borrowed_queue(stream as sucl::cuda::CUstream)? };
        Ok(Gpu { c, queue })
    }
}

/// Sets up this communicator's device side on CUDA device `device` (`-1`: local rank modulo
/// the number of GPUs): NCCL when every rank can load it, else the staged path. Collective.
/// Device point-to-point and v-collectives need it (a device collective does it too, on the GPU
/// of its buffers).
///
/// Thread safety: as `sucl_barrier`. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_comm_attach_device(comm: sucl_comm, device: i32) -> sucl_result {
    cuda!(entry(|| {
        let c = COMMS.checkout(comm)?;
        let dev = match usize::try_from(device) {
            Ok(d) => c.cuda_device_at(d)?,
            Err(_) => c.cuda_device()?,
        };
        Ok(c.attach_device(&dev)?)
    }))
}

/// Waits (bounded by `SUCL_TIMEOUT`) until everything enqueued on `stream` ran, failing when
/// NCCL reports an asynchronous error, a rank is lost or the wait times out (NCCL is then
/// aborted: no kernel stays hung). Use it, rather than `cudaStreamSynchronize`, to see errors
/// of the calls on device memory enqueued before.
///
/// Thread safety: as `sucl_barrier`. Ownership: nothing changes hands.
///
/// # Safety
/// `stream` must be a live stream of the communicator's GPU, or NULL.
#[no_mangle]
pub unsafe extern "C" fn sucl_synchronize_device(comm: sucl_comm, stream: *mut c_void) -> sucl_result {
    cuda!(entry(|| {
        let c = COMMS.checkout(comm)?;
        let g = open(&c, stream, &[], 1)?;
        Ok(c.synchronize(&g.queue)?)
    }))
}

/// Orders every rank on `stream`: work enqueued on it after this call starts once every rank
/// reached it. Over NCCL the calling thread does not wait. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: nothing changes hands.
///
/// # Safety
/// `stream` must be a live stream of the communicator's GPU, or NULL.
#[no_mangle]
pub unsafe extern "C" fn sucl_barrier_device(comm: sucl_comm, stream: *mut c_void) -> sucl_result {
    cuda!(entry(|| {
        let c = COMMS.checkout(comm)?;
        let g = open(&c, stream, &[], 1)?;
        Ok(c.barrier_on(&g.queue)?)
    }))
}

/// `sucl_broadcast` on device memory, enqueued on `stream`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: `buf` must stay valid until `stream` ran the call.
///
/// # Safety
/// `buf` must be device memory of `count` elements on the GPU of `stream` (a live stream, or
/// NULL), untouched by other work until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_broadcast_device(
    comm: sucl_comm,
    buf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let b = arg("buf", buf, count);
        on_device(comm, dtype, stream, &[b], |g, dt| {
            let root = root_of(g.c, root)?;
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for `buf`.
                let mut b = unsafe { g.buf::<T>(b)? };
                g.c.broadcast(&mut b, root)?;
            });
            Ok(())
        })
    })
}

/// `sucl_all_reduce` on device memory, enqueued on `stream`; in place when
/// `sendbuf == recvbuf`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers must stay valid until `stream` ran
/// the call.
///
/// # Safety
/// Both buffers must be device memory of `count` elements on the GPU of `stream` (a live
/// stream, or NULL), untouched by other work until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_reduce_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    op: sucl_op,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let (s, r) = (arg("sendbuf", sendbuf, count), arg("recvbuf", recvbuf, count));
        on_device(comm, dtype, stream, &[s, r], |g, dt| {
            let op = crate::types::op(op)?;
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for the buffers (both calls below).
                let mut rb = unsafe { g.buf::<T>(r)? };
                if std::ptr::eq(sendbuf, recvbuf) && count > 0 {
                    g.c.all_reduce_in_place(&mut rb, op)?;
                } else {
                    separate(s, r, std::mem::size_of::<T>())?;
                    g.c.all_reduce(&unsafe { g.buf::<T>(s)? }, &mut rb, op)?;
                }
            });
            Ok(())
        })
    })
}

/// `sucl_reduce` on device memory, enqueued on `stream`; `recvbuf` is used on the root only
/// (others may pass NULL); in place on the root when `sendbuf == recvbuf`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// `sendbuf` (and on the root `recvbuf`) must be device memory of `count` elements on the GPU
/// of `stream` (a live stream, or NULL), untouched by other work until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_reduce_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    op: sucl_op,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let (s, r) = (arg("sendbuf", sendbuf, count), arg("recvbuf", recvbuf, count));
        on_device(comm, dtype, stream, &[s], |g, dt| {
            let (op, root) = (crate::types::op(op)?, root_of(g.c, root)?);
            let is_root = g.c.rank() == root;
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for the buffers (all calls below).
                let mut rb = if is_root { unsafe { g.buf::<T>(r)? } } else { g.unused() };
                if is_root && std::ptr::eq(sendbuf, recvbuf) && count > 0 {
                    g.c.reduce_in_place(&mut rb, op, root)?;
                } else {
                    if is_root {
                        separate(s, r, std::mem::size_of::<T>())?;
                    }
                    g.c.reduce(&unsafe { g.buf::<T>(s)? }, &mut rb, op, root)?;
                }
            });
            Ok(())
        })
    })
}

/// `sucl_gather` on device memory, enqueued on `stream`: root's `recvbuf` holds
/// `size × count` elements (others may pass NULL). Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// `sendbuf` must be device memory of `count` elements, and on the root `recvbuf` of
/// `size × count`, on the GPU of `stream` (a live stream, or NULL), untouched by other work
/// until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_gather_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let s = arg("sendbuf", sendbuf, count);
        on_device(comm, dtype, stream, &[s], |g, dt| {
            let root = root_of(g.c, root)?;
            let is_root = g.c.rank() == root;
            let r = arg("recvbuf", recvbuf, times("count", count, g.c.size())?);
            with_dtype!(dt, T => {
                if is_root {
                    separate(s, r, std::mem::size_of::<T>())?;
                }
                // SAFETY: the caller's contract for the buffers.
                let mut rb = if is_root { unsafe { g.buf::<T>(r)? } } else { g.unused() };
                g.c.gather(&unsafe { g.buf::<T>(s)? }, &mut rb, root)?;
            });
            Ok(())
        })
    })
}

/// `sucl_all_gather` on device memory, enqueued on `stream`: `recvbuf` holds `size × count`
/// elements; in place when `sendbuf == recvbuf + rank × count`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// `sendbuf` must be device memory of `count` elements and `recvbuf` of `size × count` on the
/// GPU of `stream` (a live stream, or NULL), untouched by other work until the stream ran the
/// call.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_gather_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let s = arg("sendbuf", sendbuf, count);
        on_device(comm, dtype, stream, &[s], |g, dt| {
            let r = arg("recvbuf", recvbuf, times("count", count, g.c.size())?);
            with_dtype!(dt, T => {
                let es = std::mem::size_of::<T>();
                // SAFETY: the caller's contract for the buffers (all calls below).
                let mut rb = unsafe { g.buf::<T>(r)? };
                let own_block = (recvbuf as usize).checked_add(g.c.rank() * count * es);
                if count > 0 && own_block == Some(sendbuf as usize) {
                    g.c.all_gather_in_place(&mut rb)?;
                } else {
                    separate(s, r, es)?;
                    g.c.all_gather(&unsafe { g.buf::<T>(s)? }, &mut rb)?;
                }
            });
            Ok(())
        })
    })
}

/// `sucl_scatter` on device memory, enqueued on `stream`: root's `sendbuf` holds
/// `size × count` elements (others may pass NULL). Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// `recvbuf` must be device memory of `count` elements, and on the root `sendbuf` of
/// `size × count`, on the GPU of `stream` (a live stream, or NULL), untouched by other work
/// until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_scatter_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let r = arg("recvbuf", recvbuf, count);
        on_device(comm, dtype, stream, &[r], |g, dt| {
            let root = root_of(g.c, root)?;
            let is_root = g.c.rank() == root;
            let s = arg("sendbuf", sendbuf, times("count", count, g.c.size())?);
            with_dtype!(dt, T => {
                if is_root {
                    separate(s, r, std::mem::size_of::<T>())?;
                }
                // SAFETY: the caller's contract for the buffers.
                let sb = if is_root { unsafe { g.buf::<T>(s)? } } else { g.unused() };
                g.c.scatter(&sb, &mut unsafe { g.buf::<T>(r)? }, root)?;
            });
            Ok(())
        })
    })
}

/// `sucl_all_to_all` on device memory, enqueued on `stream`: both buffers hold `size × count`
/// elements and may not overlap. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// Both buffers must be device memory of `size × count` elements on the GPU of `stream` (a
/// live stream, or NULL), untouched by other work until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_to_all_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        on_device(comm, dtype, stream, &[arg("recvbuf", recvbuf, count)], |g, dt| {
            let n = times("count", count, g.c.size())?;
            let (s, r) = (arg("sendbuf", sendbuf, n), arg("recvbuf", recvbuf, n));
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for the buffers.
                let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
                g.c.all_to_all(&sb, &mut rb)?;
            });
            Ok(())
        })
    })
}

/// `sucl_reduce_scatter` on device memory, enqueued on `stream`: `sendbuf` holds
/// `size × recvcount` elements, `recvbuf` `recvcount`; they may not overlap. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: as `sucl_all_reduce_device`.
///
/// # Safety
/// The buffers must be device memory of those sizes on the GPU of `stream` (a live stream, or
/// NULL), untouched by other work until the stream ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_reduce_scatter_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: sucl_dtype,
    op: sucl_op,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let r = arg("recvbuf", recvbuf, recvcount);
        on_device(comm, dtype, stream, &[r], |g, dt| {
            let op = crate::types::op(op)?;
            let s = arg("sendbuf", sendbuf, times("recvcount", recvcount, g.c.size())?);
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for the buffers.
                let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
                g.c.reduce_scatter(&sb, &mut rb, op)?;
            });
            Ok(())
        })
    })
}

/// Reads `comm`'s counts table (`size × rows` entries) and runs `f` with the caller's stream on
/// the communicator's GPU (v-collectives: it must be set up, `sucl_comm_attach_device`).
#[cfg(feature = "cuda")]
fn on_device_v(
    comm: sucl_comm,
    dtype: sucl_dtype,
    counts: *const usize,
    square: bool,
    stream: *mut c_void,
    f: impl FnOnce(&Gpu, sucl::DType, &[usize]) -> Result<(), Fail>,
) -> sucl_result {
    on_device(comm, dtype, stream, &[], |g, dt| {
        let n = g.c.size();
        let len = if square { times("counts", n, n)? } else { n };
        // SAFETY: the caller's contract: `counts` holds the whole table.
        let counts = unsafe { table("counts", counts, len)? };
        f(g, dt, counts)
    })
}

/// `sucl_gatherv` on device memory (one NCCL group of sends and receives), enqueued on
/// `stream`. Needs NCCL and the communicator's device set up (`sucl_comm_attach_device`);
/// without NCCL it is `SUCL_ERR_BACKEND_UNAVAILABLE`. Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: the tables are only read during the call; the
/// buffers must stay valid until `stream` ran it.
///
/// # Safety
/// As `sucl_gatherv`, with the buffers device memory of the communicator's GPU, untouched by
/// other work until `stream` (a live stream, or NULL) ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_gatherv_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    displs: *const usize,
    dtype: sucl_dtype,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!(on_device_v(comm, dtype, counts, false, stream, |g, dt, counts| {
        let (root, me) = (root_of(g.c, root)?, g.c.rank());
        // SAFETY: the caller's contract for `displs` on the root.
        let displs = if me == root { unsafe { table("displs", displs, g.c.size())? } } else { &[] };
        let s = arg("sendbuf", sendbuf, counts[me]);
        let r = arg("recvbuf", recvbuf, if me == root { extent("displs", counts.iter().copied(), displs)? } else { 0 });
        with_dtype!(dt, T => {
            // SAFETY: the caller's contract for the buffers.
            let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
            g.c.gatherv(&sb, &mut rb, counts, displs, root)?;
        });
        Ok(())
    }))
}

/// `sucl_scatterv` on device memory, enqueued on `stream` (as `sucl_gatherv_device`).
/// Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv_device`.
///
/// # Safety
/// As `sucl_scatterv`, with the buffers device memory of the communicator's GPU, untouched by
/// other work until `stream` (a live stream, or NULL) ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_scatterv_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    counts: *const usize,
    displs: *const usize,
    recvbuf: *mut c_void,
    dtype: sucl_dtype,
    root: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!(on_device_v(comm, dtype, counts, false, stream, |g, dt, counts| {
        let (root, me) = (root_of(g.c, root)?, g.c.rank());
        // SAFETY: the caller's contract for `displs` on the root.
        let displs = if me == root { unsafe { table("displs", displs, g.c.size())? } } else { &[] };
        let s = arg("sendbuf", sendbuf, if me == root { extent("displs", counts.iter().copied(), displs)? } else { 0 });
        let r = arg("recvbuf", recvbuf, counts[me]);
        with_dtype!(dt, T => {
            // SAFETY: the caller's contract for the buffers.
            let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
            g.c.scatterv(&sb, &mut rb, counts, displs, root)?;
        });
        Ok(())
    }))
}

/// `sucl_all_gatherv` on device memory, enqueued on `stream` (as `sucl_gatherv_device`).
/// Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv_device`.
///
/// # Safety
/// As `sucl_all_gatherv`, with the buffers device memory of the communicator's GPU, untouched
/// by other work until `stream` (a live stream, or NULL) ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_gatherv_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    displs: *const usize,
    dtype: sucl_dtype,
    stream: *mut c_void,
) -> sucl_result {
    cuda!(on_device_v(comm, dtype, counts, false, stream, |g, dt, counts| {
        // SAFETY: the caller's contract for `displs`.
        let displs = unsafe { table("displs", displs, g.c.size())? };
        let s = arg("sendbuf", sendbuf, counts[g.c.rank()]);
        let r = arg("recvbuf", recvbuf, extent("displs", counts.iter().copied(), displs)?);
        with_dtype!(dt, T => {
            // SAFETY: the caller's contract for the buffers.
            let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
            g.c.all_gatherv(&sb, &mut rb, counts, displs)?;
        });
        Ok(())
    }))
}

/// `sucl_all_to_allv` on device memory, enqueued on `stream` (as `sucl_gatherv_device`).
/// Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv_device`.
///
/// # Safety
/// As `sucl_all_to_allv`, with the buffers device memory of the communicator's GPU, untouched
/// by other work until `stream` (a live stream, or NULL) ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_to_allv_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    rdispls: *const usize,
    counts: *const usize,
    dtype: sucl_dtype,
    stream: *mut c_void,
) -> sucl_result {
    cuda!(on_device_v(comm, dtype, counts, true, stream, |g, dt, counts| {
        let (n, me) = (g.c.size(), g.c.rank());
        // SAFETY: the caller's contract for the displacement tables.
        let (sd, rd) = unsafe { (table("sdispls", sdispls, n)?, table("rdispls", rdispls, n)?) };
        let s = arg("sendbuf", sendbuf, extent("sdispls", counts[me * n..(me + 1) * n].iter().copied(), sd)?);
        let r = arg("recvbuf", recvbuf, extent("rdispls", (0..n).map(|i| counts[i * n + me]), rd)?);
        with_dtype!(dt, T => {
            // SAFETY: the caller's contract for the buffers.
            let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
            g.c.all_to_allv(&sb, sd, &mut rb, rd, counts)?;
        });
        Ok(())
    }))
}

/// Sends `count` elements of device memory at `buf` to `dest`, ordered on `stream`. Over NCCL
/// it is enqueued (the thread does not wait; NCCL carries no tags: messages between two ranks
/// match in call order, and the receive must have the sent length); staged (no NCCL) it returns
/// once sent. Needs the communicator's device set up (`sucl_comm_attach_device`, or a device
/// collective).
///
/// Thread safety: as `sucl_send`. Ownership: `buf` must stay valid until `stream` ran the call.
///
/// # Safety
/// `buf` must be device memory of `count` elements on the communicator's GPU, not written by
/// other work until `stream` (a live stream, or NULL) ran the call.
#[no_mangle]
pub unsafe extern "C" fn sucl_send_device(
    comm: sucl_comm,
    buf: *const c_void,
    count: usize,
    dtype: sucl_dtype,
    dest: i32,
    tag: i32,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let b = arg("buf", buf, count);
        on_device(comm, dtype, stream, &[b], |g, dt| {
            let (dest, tag) = (crate::types::rank("dest", dest)?, crate::types::tag(tag)?);
            with_dtype!(dt, T => {
                // SAFETY: the caller's contract for `buf`.
                g.c.send(&unsafe { g.buf::<T>(b)? }, dest, tag)?;
            });
            Ok(())
        })
    })
}

/// Receives into `count` elements of device memory at `buf` from `src`, ordered on `stream`
/// (as `sucl_send_device`). `*received` (if not NULL) gets the number of elements received:
/// over NCCL that is `count` (NCCL receives exactly the length posted).
///
/// Thread safety: as `sucl_send`. Ownership: `buf` must stay valid until `stream` ran the call.
///
/// # Safety
/// `buf` must be device memory of `count` elements on the communicator's GPU, untouched by
/// other work until `stream` (a live stream, or NULL) ran the call; `received` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_recv_device(
    comm: sucl_comm,
    buf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    src: i32,
    tag: i32,
    received: *mut usize,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let b = arg("buf", buf, count);
        on_device(comm, dtype, stream, &[b], |g, dt| {
            let (src, tag) = (crate::types::rank("src", src)?, crate::types::tag(tag)?);
            let out = Out::optional("received", received)?;
            let n = with_dtype!(dt, T => {
                // SAFETY: the caller's contract for `buf`.
                g.c.recv(&mut unsafe { g.buf::<T>(b)? }, src, tag)?.count
            });
            if let Some(o) = out {
                o.set(n);
            }
            Ok(())
        })
    })
}

/// Sends `sendcount` elements at `sendbuf` to `dest` while receiving `recvcount` into
/// `recvbuf` from `src`, device memory ordered on `stream` (one NCCL group: a ring shift does
/// not deadlock). The buffers may not overlap. `*received` as in `sucl_recv_device`.
///
/// Thread safety: as `sucl_send`. Ownership: the buffers must stay valid until `stream` ran the
/// call.
///
/// # Safety
/// The buffers must be device memory of those sizes on the communicator's GPU, untouched by
/// other work until `stream` (a live stream, or NULL) ran the call; `received` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_sendrecv_device(
    comm: sucl_comm,
    sendbuf: *const c_void,
    sendcount: usize,
    dest: i32,
    recvbuf: *mut c_void,
    recvcount: usize,
    src: i32,
    dtype: sucl_dtype,
    tag: i32,
    received: *mut usize,
    stream: *mut c_void,
) -> sucl_result {
    cuda!({
        let (s, r) = (arg("sendbuf", sendbuf, sendcount), arg("recvbuf", recvbuf, recvcount));
        on_device(comm, dtype, stream, &[r, s], |g, dt| {
            let (dest, src, tag) = (crate::types::rank("dest", dest)?, crate::types::rank("src", src)?, crate::types::tag(tag)?);
            let out = Out::optional("received", received)?;
            let n = with_dtype!(dt, T => {
                // SAFETY: the caller's contract for the buffers.
                let (sb, mut rb) = unsafe { g.pair::<T>(s, r)? };
                g.c.sendrecv(&sb, dest, &mut rb, src, tag)?.count
            });
            if let Some(o) = out {
                o.set(n);
            }
            Ok(())
        })
    })
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    fn at(name: &'static str, addr: usize, count: usize) -> Arg {
        arg(name, addr as *const c_void, count)
    }

    #[test]
    fn overlapping_device_buffers_are_refused_and_disjoint_ones_pass() {
        let s = at("sendbuf", 0x1000, 4);
        assert!(separate(s, at("recvbuf", 0x1010, 4), 4).is_ok(), "adjacent");
        assert!(separate(s, at("recvbuf", 0x1000, 0), 4).is_ok(), "an empty buffer overlaps nothing");
        assert!(separate(s, at("recvbuf", 0x100c, 4), 4).is_err(), "one element shared");
        let Err(Fail::Arg { arg, why }) = separate(s, at("recvbuf", 0x0ff0, 8), 4) else { panic!("overlap accepted") };
        assert_eq!(arg, "sendbuf");
        assert!(why.contains("overlaps `recvbuf`"), "{why}");
        assert!(separate(at("sendbuf", 0x1000, usize::MAX), s, 4).is_err(), "a size that overflows");
    }
}
