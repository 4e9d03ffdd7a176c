//! Point-to-point on host buffers: blocking send, recv and sendrecv, and non-blocking isend and
//! irecv whose requests complete with `sucl_wait` / `sucl_test` (see `request`).

use crate::error::{entry, Fail};
use crate::handles::{AnyRequest, COMMS, REQUESTS};
use crate::mem::{Input, Out, Region};
use crate::types::{self, sucl_comm, sucl_dtype, sucl_request, sucl_result, with_dtype};
use std::ffi::c_void;

/// Sends `count` elements at `buf` to rank `dest` with `tag` (0 ... INT_MAX); returns once
/// `buf` may be reused. Messages from one sender with one tag arrive in order.
///
/// Thread safety: one thread at a time per communicator (`SUCL_ERR_BUSY` otherwise).
/// Ownership: `buf` is only used during the call.
///
/// # Safety
/// `buf` must be valid for reads of `count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_send(
    comm: sucl_comm,
    buf: *const c_void,
    count: usize,
    dtype: sucl_dtype,
    dest: i32,
    tag: i32,
) -> sucl_result {
    entry(|| {
        let (dt, dest, tag) = (types::dtype(dtype)?, types::rank("dest", dest)?, types::tag(tag)?);
        let c = COMMS.checkout(comm)?;
        with_dtype!(dt, T => {
            let b = Region::<T>::new("buf", buf, count)?;
            // SAFETY: the caller's contract for `buf`.
            c.send(unsafe { b.slice() }, dest, tag)?;
        });
        Ok(())
    })
}

/// Receives a message from rank `src` with `tag` into `buf` (room for `count` elements); a
/// longer message is an error. `*received` (if not NULL) gets the number of elements received.
///
/// Thread safety: as `sucl_send`. Ownership: `buf` is only used during the call.
///
/// # Safety
/// `buf` must be valid for writes of `count` elements; `received` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_recv(
    comm: sucl_comm,
    buf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    src: i32,
    tag: i32,
    received: *mut usize,
) -> sucl_result {
    entry(|| {
        let (dt, src, tag) = (types::dtype(dtype)?, types::rank("src", src)?, types::tag(tag)?);
        let out = Out::optional("received", received)?;
        let c = COMMS.checkout(comm)?;
        let n = with_dtype!(dt, T => {
            let b = Region::<T>::new("buf", buf, count)?;
            // SAFETY: the caller's contract for `buf`; the only slice of it.
            c.recv(unsafe { b.slice_mut() }, src, tag)?.count
        });
        if let Some(o) = out {
            o.set(n);
        }
        Ok(())
    })
}

/// Sends `sendcount` elements at `sendbuf` to `dest` while receiving up to `recvcount` into
/// `recvbuf` from `src`, both with `tag` (a ring shift does not deadlock). `*received` (if not
/// NULL) gets the number of elements received.
///
/// Thread safety: as `sucl_send`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads of `sendcount` elements, `recvbuf` for writes of
/// `recvcount`; `received` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_sendrecv(
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
) -> sucl_result {
    entry(|| {
        let (dt, dest, src, tag) = (types::dtype(dtype)?, types::rank("dest", dest)?, types::rank("src", src)?, types::tag(tag)?);
        let out = Out::optional("received", received)?;
        let c = COMMS.checkout(comm)?;
        let n = with_dtype!(dt, T => {
            let (s, r) = (Region::<T>::new("sendbuf", sendbuf, sendcount)?, Region::<T>::new("recvbuf", recvbuf, recvcount)?);
            // SAFETY: the caller's contract; an overlapping send buffer is copied first.
            let input = unsafe { Input::of(&s, &r) };
            c.sendrecv(&*input, dest, unsafe { r.slice_mut() }, src, tag)?.count
        });
        if let Some(o) = out {
            o.set(n);
        }
        Ok(())
    })
}

/// Starts sending `count` elements at `buf` to `dest` with `tag`; `*request` completes it
/// (`sucl_wait`, `sucl_test`).
///
/// Thread safety: as `sucl_send`. Ownership: sucl borrows `buf` until the request completed
/// (or was withdrawn by `sucl_request_free` / `sucl_comm_free`); do not modify or free it
/// before. The caller owns `*request`.
///
/// # Safety
/// `buf` must stay valid for reads of `count` elements until the request completed;
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_isend(
    comm: sucl_comm,
    buf: *const c_void,
    count: usize,
    dtype: sucl_dtype,
    dest: i32,
    tag: i32,
    request: *mut sucl_request,
) -> sucl_result {
    // SAFETY: forwarded: the caller keeps `buf` valid and unmodified until the request completed.
    unsafe { post(comm, buf, count, dtype, ("dest", dest), tag, request, Direction::Send) }
}

/// Starts receiving up to `count` elements into `buf` from `src` with `tag`; `*request`
/// completes it (`sucl_wait`, `sucl_test`, which report the elements received).
///
/// Thread safety: as `sucl_send`. Ownership: sucl borrows `buf` until the request completed
/// (or was withdrawn); do not read, modify or free it before. The caller owns `*request`.
///
/// # Safety
/// `buf` must stay valid for writes of `count` elements until the request completed;
/// `request` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_irecv(
    comm: sucl_comm,
    buf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    src: i32,
    tag: i32,
    request: *mut sucl_request,
) -> sucl_result {
    // SAFETY: forwarded: the caller keeps `buf` valid and untouched until the request completed.
    unsafe { post(comm, buf as *const c_void, count, dtype, ("src", src), tag, request, Direction::Recv) }
}

/// Which way a non-blocking operation moves data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Recv,
}

/// Posts a non-blocking send or receive and registers its request.
///
/// # Safety
/// `buf` stays valid for `count` elements (reads for a send, writes for a receive) and is not
/// otherwise touched until the request completed or was withdrawn.
#[allow(clippy::too_many_arguments)]
unsafe fn post(
    comm: sucl_comm,
    buf: *const c_void,
    count: usize,
    dtype: sucl_dtype,
    (peer_arg, peer): (&'static str, i32),
    tag: i32,
    request: *mut sucl_request,
    dir: Direction,
) -> sucl_result {
    entry(|| {
        let (dt, peer, tag) = (types::dtype(dtype)?, types::rank(peer_arg, peer)?, types::tag(tag)?);
        let out = Out::new("request", request)?;
        let c = COMMS.checkout(comm)?;
        let elem = with_dtype!(dt, T => {
            Region::<T>::new("buf", buf, count)?;
            std::mem::size_of::<T>()
        });
        let bytes = count * elem;
        // SAFETY: the caller's promise above, and the request is completed or cancelled on this
        // communicator (`sucl_wait`/`sucl_test`/`sucl_request_free`, or `sucl_comm_free`, which
        // cancels it).
        let req = unsafe {
            match dir {
                Direction::Send => c.post_send_unscoped(buf as *const u8, bytes, peer, tag)?,
                Direction::Recv => c.post_recv_unscoped(buf as *mut u8, bytes, peer, tag)?,
            }
        };
        out.set(REQUESTS.insert(AnyRequest::P2p { comm, req, elem }));
        Ok(())
    })
}

/// Elements in `bytes` of `elem`-byte elements; a partial element is a mismatch.
pub(crate) fn elements(bytes: usize, elem: usize) -> Result<usize, Fail> {
    if !bytes.is_multiple_of(elem) {
        return Err(Fail::Sucl(sucl::Error::Mismatch {
            rank: 0,
            what: format!("message size: {bytes} bytes is not a whole number of {elem}-byte elements"),
        }));
    }
    Ok(bytes / elem)
}
