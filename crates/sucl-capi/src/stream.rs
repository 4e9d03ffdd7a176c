//! Stream-triggered communication on host queues (ST-MPI's model): a host queue runs tasks in
//! order on one worker thread; a stream-triggered queue binds a communicator to it; operations
//! on shared buffers are *enqueued* (nothing moves), a `start` on the queue releases them and a
//! `wait` on the queue holds later tasks until they completed — the host thread never blocks.

use crate::error::{entry, Fail};
use crate::handles::{AnyBuffer, AnyRequest, StreamEntry, BUFFERS, COMMS, HOST_QUEUES, REQUESTS, STREAMS};
use crate::mem::{Out, Region};
use crate::types::{self, *};
use std::ffi::c_void;
use std::time::Duration;
use sucl::stream::{CommQueue, HostQueue, Request, PROC_NULL};

/// Creates a host queue with its own worker thread.
///
/// Thread safety: any thread; a host queue may be used from several threads at once.
/// Ownership: the caller owns `*queue` and frees it with `sucl_host_queue_free`.
///
/// # Safety
/// `queue` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_host_queue_create(queue: *mut sucl_host_queue) -> sucl_result {
    entry(|| {
        let out = Out::new("queue", queue)?;
        out.set(HOST_QUEUES.insert(HostQueue::new()));
        Ok(())
    })
}

/// A C task: a function and its argument, run on a queue's worker thread.
struct Task {
    f: extern "C" fn(*mut c_void),
    arg: *mut c_void,
}

// SAFETY: the C caller of `sucl_host_queue_submit` promises that `f(arg)` may run on another
// thread (stated in its documentation); sucl never dereferences `arg`.
unsafe impl Send for Task {}

/// Appends `fn(arg)` to `queue`; it runs on the queue's worker thread after every task
/// submitted before it (including the starts and waits of stream-triggered queues on it).
///
/// Thread safety: any thread. Ownership: `arg` stays the caller's; it must remain valid until
/// the task ran. `fn` must not unwind or longjmp out.
///
/// # Safety
/// `fn(arg)` must be safe to call from another thread, once, at any later time.
#[no_mangle]
pub unsafe extern "C" fn sucl_host_queue_submit(
    queue: sucl_host_queue,
    r#fn: Option<extern "C" fn(*mut c_void)>,
    arg: *mut c_void,
) -> sucl_result {
    entry(|| {
        let f = r#fn.ok_or_else(|| Fail::arg("fn", "is NULL"))?;
        let q = HOST_QUEUES.with(queue, |q| q.clone())?;
        let task = Task { f, arg };
        q.submit(move || {
            let t = task;
            (t.f)(t.arg)
        });
        Ok(())
    })
}

/// Waits (at most `timeout_ms` milliseconds) until every task submitted to `queue` so far ran.
///
/// Thread safety: any thread. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_host_queue_synchronize(queue: sucl_host_queue, timeout_ms: u64) -> sucl_result {
    entry(|| {
        let q = HOST_QUEUES.with(queue, |q| q.clone())?;
        Ok(q.synchronize(Duration::from_millis(timeout_ms))?)
    })
}

/// Frees the handle `queue`. Its worker ends once every task ran and no stream-triggered queue
/// uses it any more.
///
/// Thread safety: any thread. Ownership: ends the caller's ownership.
#[no_mangle]
pub extern "C" fn sucl_host_queue_free(queue: sucl_host_queue) -> sucl_result {
    entry(|| {
        HOST_QUEUES.remove(queue)?;
        Ok(())
    })
}

/// Creates a shared buffer of `count` zeroed elements of `dtype`: host memory that host-queue
/// tasks and stream-triggered operations share safely (an access waits while an operation
/// holds the buffer).
///
/// Thread safety: any thread; a buffer may be used from several threads at once.
/// Ownership: the caller owns `*buffer` (free it with `sucl_buffer_free`; operations in flight
/// keep the memory alive until they complete).
///
/// # Safety
/// `buffer` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_buffer_create(dtype: sucl_dtype, count: usize, buffer: *mut sucl_buffer) -> sucl_result {
    entry(|| {
        let out = Out::new("buffer", buffer)?;
        let dt = types::dtype(dtype)?;
        count
            .checked_mul(dt.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Fail::arg("count", format!("{count} elements of {dt} do not fit in memory")))?;
        out.set(BUFFERS.insert(AnyBuffer::zeroed(dt, count)));
        Ok(())
    })
}

fn buffer(h: sucl_buffer) -> Result<AnyBuffer, Fail> {
    BUFFERS.with(h, |b| b.clone())
}

/// The elements `offset .. offset + count` of a buffer of `len`, or an error.
fn window(offset: usize, count: usize, len: usize) -> Result<std::ops::Range<usize>, Fail> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(Fail::arg("count", format!("elements {offset} + {count} are past the buffer's end ({len} elements)"))),
    }
}

/// Copies `count` elements from `src` into `buffer` at element `offset` (the buffer's dtype),
/// waiting while a communication operation holds the buffer.
///
/// Thread safety: any thread. Ownership: `src` is only read during the call.
///
/// # Safety
/// `src` must be valid for reads of `count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_buffer_write(buffer: sucl_buffer, offset: usize, src: *const c_void, count: usize) -> sucl_result {
    entry(|| {
        let b = self::buffer(buffer)?;
        with_dtype!(b.dtype, T => {
            let s = Region::<T>::new("src", src, count)?;
            let shared = b.get::<T>().expect("a buffer holds its dtype");
            let range = window(offset, count, shared.len())?;
            // SAFETY: the caller's contract for `src`, which cannot alias the buffer's own
            // memory (sucl allocated it and hands out no pointer to it).
            shared.write()[range].copy_from_slice(unsafe { s.slice() });
        });
        Ok(())
    })
}

/// Copies `count` elements of `buffer` from element `offset` into `dst`, waiting while an
/// operation receives into the buffer.
///
/// Thread safety: any thread. Ownership: `dst` is only written during the call.
///
/// # Safety
/// `dst` must be valid for writes of `count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_buffer_read(buffer: sucl_buffer, offset: usize, dst: *mut c_void, count: usize) -> sucl_result {
    entry(|| {
        let b = self::buffer(buffer)?;
        with_dtype!(b.dtype, T => {
            let d = Region::<T>::new("dst", dst, count)?;
            let shared = b.get::<T>().expect("a buffer holds its dtype");
            let range = window(offset, count, shared.len())?;
            // SAFETY: the caller's contract for `dst` (not the buffer's memory, as above).
            unsafe { d.slice_mut() }.copy_from_slice(&shared.read()[range]);
        });
        Ok(())
    })
}

/// The number of elements of `buffer`.
///
/// Thread safety: any thread. Ownership: nothing changes hands.
///
/// # Safety
/// `count` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_buffer_count(buffer: sucl_buffer, count: *mut usize) -> sucl_result {
    entry(|| {
        let out = Out::new("count", count)?;
        out.set(self::buffer(buffer)?.len());
        Ok(())
    })
}

/// Frees the handle `buffer`; operations still holding the buffer keep its memory until they
/// complete.
///
/// Thread safety: any thread. Ownership: ends the caller's ownership.
#[no_mangle]
pub extern "C" fn sucl_buffer_free(buffer: sucl_buffer) -> sucl_result {
    entry(|| {
        BUFFERS.remove(buffer)?;
        Ok(())
    })
}

/// Binds `comm` to `queue` as a stream-triggered queue. The queue takes the communicator: until
/// `sucl_stream_close`, calls with `comm` return `SUCL_ERR_BUSY`. Ordinary sends and receives of
/// the same communicator on other ranks match this queue's operations. Local.
///
/// Thread safety: one thread at a time per stream-triggered queue (`SUCL_ERR_BUSY`
/// otherwise), as for every function taking a `sucl_stream`. Ownership: the caller owns
/// `*stream` and ends it with `sucl_stream_close`.
///
/// # Safety
/// `stream` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_create(comm: sucl_comm, queue: sucl_host_queue, stream: *mut sucl_stream) -> sucl_result {
    entry(|| {
        let out = Out::new("stream", stream)?;
        let q = HOST_QUEUES.with(queue, |q| q.clone())?;
        if REQUESTS.any(|r| matches!(r, AnyRequest::P2p { comm: c, .. } if *c == comm)) {
            return Err(Fail::arg("comm", "has non-blocking requests pending: complete them first"));
        }
        let c = COMMS.take_out(comm, "a stream-triggered queue (close it first)")?;
        match CommQueue::on_host(*c, &q) {
            Ok(queue) => {
                out.set(STREAMS.insert(StreamEntry { queue, comm }));
                Ok(())
            }
            Err(e) => {
                // The queue keeps the communicator on failure; its handle cannot be served.
                COMMS.retire(comm);
                Err(e.into())
            }
        }
    })
}

/// Checks out the queue, runs `f` and registers the request it returns.
fn enqueue(stream: sucl_stream, request: *mut sucl_request, f: impl FnOnce(&mut CommQueue) -> Result<Request, Fail>) -> sucl_result {
    entry(|| {
        let out = Out::new("request", request)?;
        let mut s = STREAMS.checkout(stream)?;
        let r = f(&mut s.queue)?;
        out.set(REQUESTS.insert(AnyRequest::Stream(r)));
        Ok(())
    })
}

fn peer(arg: &'static str, p: i32) -> Result<usize, Fail> {
    if p == SUCL_PROC_NULL {
        return Ok(PROC_NULL);
    }
    types::rank(arg, p)
}

/// Two buffers of one dtype.
fn pair(a: sucl_buffer, b: sucl_buffer) -> Result<(AnyBuffer, AnyBuffer), Fail> {
    let (a, b) = (buffer(a)?, buffer(b)?);
    if a.dtype != b.dtype {
        return Err(Fail::arg("recv", format!("holds {} but the send buffer holds {}", b.dtype, a.dtype)));
    }
    Ok((a, b))
}

/// Enqueues a send of the whole `buf` to `peer` (or `SUCL_PROC_NULL`) with `tag`; nothing moves
/// until a `sucl_stream_start`. `*request` completes with `sucl_wait` / `sucl_test`.
///
/// Thread safety: as `sucl_stream_create`. Ownership: the queue keeps `buf` alive until the
/// operation completed; the caller owns `*request`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_send(
    stream: sucl_stream,
    buf: sucl_buffer,
    peer: i32,
    tag: i32,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let (b, peer, tag) = (buffer(buf)?, self::peer("peer", peer)?, types::tag(tag)?);
        Ok(with_dtype!(b.dtype, T => q.enqueue_send(b.get::<T>().expect("a buffer holds its dtype"), peer, tag)?))
    })
}

/// Enqueues a receive into `buf` (a message up to its length) from `peer` (or
/// `SUCL_PROC_NULL`) with `tag`.
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_recv(
    stream: sucl_stream,
    buf: sucl_buffer,
    peer: i32,
    tag: i32,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let (b, peer, tag) = (buffer(buf)?, self::peer("peer", peer)?, types::tag(tag)?);
        Ok(with_dtype!(b.dtype, T => q.enqueue_recv(b.get::<T>().expect("a buffer holds its dtype"), peer, tag)?))
    })
}

/// Enqueues `recv = reduce(op, every rank's send)`; `send` may be `recv` (in place).
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_all_reduce(
    stream: sucl_stream,
    send: sucl_buffer,
    recv: sucl_buffer,
    op: sucl_op,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let ((s, r), op) = (pair(send, recv)?, types::op(op)?);
        Ok(with_dtype!(s.dtype, T => q.enqueue_all_reduce(s.get::<T>().expect("dtype"), r.get::<T>().expect("dtype"), op)?))
    })
}

/// Enqueues a broadcast of root's `buf` into every rank's `buf`.
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_broadcast(
    stream: sucl_stream,
    buf: sucl_buffer,
    root: i32,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let (b, root) = (buffer(buf)?, types::rank("root", root)?);
        Ok(with_dtype!(b.dtype, T => q.enqueue_broadcast(b.get::<T>().expect("a buffer holds its dtype"), root)?))
    })
}

/// Enqueues an all_gather: every rank's `send` concatenated in rank order into `recv`
/// (`size ×` the length of `send`).
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_all_gather(
    stream: sucl_stream,
    send: sucl_buffer,
    recv: sucl_buffer,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let (s, r) = pair(send, recv)?;
        Ok(with_dtype!(s.dtype, T => q.enqueue_all_gather(s.get::<T>().expect("dtype"), r.get::<T>().expect("dtype"))?))
    })
}

/// Enqueues a reduce_scatter: `send` (`size ×` the length of `recv`) reduced; rank `r` keeps
/// block `r` in `recv`.
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_reduce_scatter(
    stream: sucl_stream,
    send: sucl_buffer,
    recv: sucl_buffer,
    op: sucl_op,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let ((s, r), op) = (pair(send, recv)?, types::op(op)?);
        Ok(with_dtype!(s.dtype, T => q.enqueue_reduce_scatter(s.get::<T>().expect("dtype"), r.get::<T>().expect("dtype"), op)?))
    })
}

/// Enqueues an all_to_all: block `j` of `send` goes to block (this rank) of rank `j`'s `recv`
/// (two distinct buffers of the same length, a multiple of the size).
///
/// Thread safety and ownership: as `sucl_stream_send`.
///
/// # Safety
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_stream_all_to_all(
    stream: sucl_stream,
    send: sucl_buffer,
    recv: sucl_buffer,
    request: *mut sucl_request,
) -> sucl_result {
    enqueue(stream, request, |q| {
        let (s, r) = pair(send, recv)?;
        Ok(with_dtype!(s.dtype, T => q.enqueue_all_to_all(s.get::<T>().expect("dtype"), r.get::<T>().expect("dtype"))?))
    })
}

/// Runs `f` on the checked-out queue.
fn on_stream(stream: sucl_stream, f: impl FnOnce(&mut CommQueue) -> sucl::Result<()>) -> sucl_result {
    entry(|| Ok(f(&mut STREAMS.checkout(stream)?.queue)?))
}

/// Puts one trigger on the host queue: every operation enqueued since the last start becomes
/// eligible once the queue reaches this point. Returns at once (it blocks, bounded, only while
/// too many operations are in flight).
///
/// Thread safety: as `sucl_stream_create`. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_stream_start(stream: sucl_stream) -> sucl_result {
    on_stream(stream, |q| q.start())
}

/// Puts one wait on the host queue: later tasks on it run once every operation started so far
/// completed (or failed: the error is then on the requests and `sucl_stream_synchronize`). The
/// calling thread does not block.
///
/// Thread safety: as `sucl_stream_create`. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_stream_wait(stream: sucl_stream) -> sucl_result {
    on_stream(stream, |q| q.wait())
}

/// Blocks (bounded) until the host queue ran everything submitted to it and every started
/// operation completed; returns the first error among them.
///
/// Thread safety: as `sucl_stream_create`. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_stream_synchronize(stream: sucl_stream) -> sucl_result {
    on_stream(stream, |q| q.synchronize())
}

/// Ends the stream-triggered queue and gives its communicator back (the `sucl_comm` handle
/// works again). Closing with operations in flight is an error: those never started are
/// withdrawn (their requests fail), started ones are waited for (bounded), and the communicator
/// is then freed too (its handle dies). Call `sucl_stream_synchronize` first to close cleanly.
///
/// Thread safety: as `sucl_stream_create`. Ownership: ends the caller's ownership of `stream`.
#[no_mangle]
pub extern "C" fn sucl_stream_close(stream: sucl_stream) -> sucl_result {
    entry(|| {
        let StreamEntry { queue, comm } = STREAMS.remove(stream)?;
        match queue.close() {
            Ok(c) => {
                COMMS.put_back(comm, Box::new(c));
                Ok(())
            }
            Err(e) => {
                COMMS.retire(comm);
                Err(e.into())
            }
        }
    })
}
