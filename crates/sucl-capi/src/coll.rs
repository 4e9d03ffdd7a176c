//! Collectives on host buffers. Counts are in elements. A send buffer that overlaps the receive
//! buffer is read as it was when the call began (the in-place forms: same pointer, or — for
//! all_gather — the send block at its place in the receive buffer, run in place by sucl; any
//! other overlap costs one copy of the send buffer).

use crate::error::{entry, Fail};
use crate::handles::COMMS;
use crate::mem::{Input, Region};
use crate::types::{self, sucl_comm, sucl_dtype, sucl_op, sucl_result, with_dtype};
use std::ffi::c_void;
use sucl::{Communicator, DType, Element, ReduceOp};

/// Runs a typed body on `comm` (checked out for the call) with the checked dtype.
fn on_comm(comm: sucl_comm, dtype: sucl_dtype, f: impl FnOnce(&Communicator, DType) -> Result<(), Fail>) -> sucl_result {
    entry(|| {
        let dt = types::dtype(dtype)?;
        let c = COMMS.checkout(comm)?;
        f(&c, dt)
    })
}

/// `count × factor` elements, or an error naming `arg`.
pub(crate) fn times(arg: &'static str, count: usize, factor: usize) -> Result<usize, Fail> {
    count.checked_mul(factor).ok_or_else(|| Fail::arg(arg, format!("{count} × {factor} elements overflow")))
}

pub(crate) fn root_of(c: &Communicator, root: i32) -> Result<usize, Fail> {
    let r = types::rank("root", root)?;
    if r >= c.size() {
        return Err(Fail::arg("root", format!("rank {r} out of range (communicator size {})", c.size())));
    }
    Ok(r)
}

/// Blocks until every rank of `comm` has called it. Collective.
///
/// Thread safety: one thread at a time per communicator (`SUCL_ERR_BUSY` otherwise), as for
/// every call on a `sucl_comm`. Ownership: nothing changes hands.
#[no_mangle]
pub extern "C" fn sucl_barrier(comm: sucl_comm) -> sucl_result {
    entry(|| Ok(COMMS.checkout(comm)?.barrier()?))
}

/// Copies root's `count` elements at `buf` into every rank's `buf`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: `buf` is only used during the call.
///
/// # Safety
/// `buf` must be valid for reads and writes of `count` elements (NULL when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn sucl_broadcast(comm: sucl_comm, buf: *mut c_void, count: usize, dtype: sucl_dtype, root: i32) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let root = root_of(c, root)?;
        with_dtype!(dt, T => {
            let b = Region::<T>::new("buf", buf, count)?;
            // SAFETY: the caller's contract for `buf`; no other slice of it exists.
            c.broadcast(unsafe { b.slice_mut() }, root)?;
        });
        Ok(())
    })
}

/// `recvbuf = reduce(op, every rank's sendbuf)` on every rank, `count` elements. In place when
/// `sendbuf == recvbuf`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads and `recvbuf` for writes of `count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_reduce(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    op: sucl_op,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let op = types::op(op)?;
        with_dtype!(dt, T => unsafe { all_reduce::<T>(c, sendbuf, recvbuf, count, op) })
    })
}

/// # Safety
/// As [`sucl_all_reduce`].
unsafe fn all_reduce<T: Element>(c: &Communicator, send: *const c_void, recv: *mut c_void, count: usize, op: ReduceOp) -> Result<(), Fail> {
    let (s, r) = (Region::<T>::new("sendbuf", send, count)?, Region::<T>::new("recvbuf", recv, count)?);
    if s.starts_at(&r, 0) && count > 0 {
        // SAFETY: the caller's contract for `recvbuf`; the only slice of it.
        return Ok(c.all_reduce_in_place(unsafe { r.slice_mut() }, op)?);
    }
    // SAFETY: the caller's contract; `Input::of` copies an overlapping send buffer before the
    // receive slice exists.
    let input = unsafe { Input::of(&s, &r) };
    Ok(c.all_reduce(&*input, unsafe { r.slice_mut() }, op)?)
}

/// Reduces every rank's `count` elements at `sendbuf` into root's `recvbuf`. `recvbuf` is used
/// on the root only (others may pass NULL). In place on the root when `sendbuf == recvbuf`.
/// Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads of `count` elements, and on the root `recvbuf` for writes
/// of `count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_reduce(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    op: sucl_op,
    root: i32,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let (op, root) = (types::op(op)?, root_of(c, root)?);
        with_dtype!(dt, T => unsafe { reduce::<T>(c, sendbuf, recvbuf, count, op, root) })
    })
}

/// # Safety
/// As [`sucl_reduce`].
unsafe fn reduce<T: Element>(
    c: &Communicator,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    op: ReduceOp,
    root: usize,
) -> Result<(), Fail> {
    let s = Region::<T>::new("sendbuf", send, count)?;
    let r = if c.rank() == root { Region::<T>::new("recvbuf", recv, count)? } else { Region::unused() };
    if c.rank() == root && s.starts_at(&r, 0) && count > 0 {
        // SAFETY: the caller's contract for `recvbuf`; the only slice of it.
        return Ok(c.reduce_in_place(unsafe { r.slice_mut() }, op, root)?);
    }
    // SAFETY: as in `all_reduce`.
    let input = unsafe { Input::of(&s, &r) };
    Ok(c.reduce(&*input, unsafe { r.slice_mut() }, op, root)?)
}

/// Concatenates every rank's `count` elements at `sendbuf`, in rank order, into root's
/// `recvbuf` (`size × count` elements; used on the root only, others may pass NULL).
/// Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads of `count` elements, and on the root `recvbuf` for writes
/// of `size × count`.
#[no_mangle]
pub unsafe extern "C" fn sucl_gather(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    root: i32,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let root = root_of(c, root)?;
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, count)?;
            let r = if c.rank() == root { Region::<T>::new("recvbuf", recvbuf, times("count", count, c.size())?)? } else { Region::unused() };
            // SAFETY: as in `all_reduce`.
            let input = unsafe { Input::of(&s, &r) };
            c.gather(&*input, unsafe { r.slice_mut() }, root)?;
        });
        Ok(())
    })
}

/// Concatenates every rank's `count` elements at `sendbuf`, in rank order, into every rank's
/// `recvbuf` (`size × count` elements). In place when `sendbuf` is this rank's block of
/// `recvbuf` (`recvbuf + rank × count` elements). Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads of `count` elements, `recvbuf` for writes of `size × count`.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_gather(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, count)?;
            let r = Region::<T>::new("recvbuf", recvbuf, times("count", count, c.size())?)?;
            if count > 0 && s.starts_at(&r, c.rank() * count) {
                // SAFETY: the caller's contract for `recvbuf`; the only slice of it.
                c.all_gather_in_place(unsafe { r.slice_mut() })?;
            } else {
                // SAFETY: as in `all_reduce`.
                let input = unsafe { Input::of(&s, &r) };
                c.all_gather(&*input, unsafe { r.slice_mut() })?;
            }
        });
        Ok(())
    })
}

/// Sends block `j` (`count` elements) of root's `sendbuf` (`size × count` elements; used on the
/// root only, others may pass NULL) to rank `j`'s `recvbuf`. Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// On the root `sendbuf` must be valid for reads of `size × count` elements; `recvbuf` for
/// writes of `count`.
#[no_mangle]
pub unsafe extern "C" fn sucl_scatter(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
    root: i32,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let root = root_of(c, root)?;
        with_dtype!(dt, T => {
            let s = if c.rank() == root { Region::<T>::new("sendbuf", sendbuf, times("count", count, c.size())?)? } else { Region::unused() };
            let r = Region::<T>::new("recvbuf", recvbuf, count)?;
            // SAFETY: as in `all_reduce`.
            let input = unsafe { Input::of(&s, &r) };
            c.scatter(&*input, unsafe { r.slice_mut() }, root)?;
        });
        Ok(())
    })
}

/// Block `j` (`count` elements) of every rank's `sendbuf` goes to block `i` (the sender's rank)
/// of rank `j`'s `recvbuf`; both hold `size × count` elements. `sendbuf == recvbuf` works (at
/// the cost of one copy). Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads and `recvbuf` for writes of `size × count` elements.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_to_all(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: sucl_dtype,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        with_dtype!(dt, T => {
            let n = times("count", count, c.size())?;
            let (s, r) = (Region::<T>::new("sendbuf", sendbuf, n)?, Region::<T>::new("recvbuf", recvbuf, n)?);
            // SAFETY: as in `all_reduce`.
            let input = unsafe { Input::of(&s, &r) };
            c.all_to_all(&*input, unsafe { r.slice_mut() })?;
        });
        Ok(())
    })
}

/// Reduces every rank's `sendbuf` (`size × recvcount` elements); rank `r` receives block `r`
/// in `recvbuf` (`recvcount` elements). `recvbuf` may lie inside `sendbuf` (at the cost of one
/// copy). Collective.
///
/// Thread safety: as `sucl_barrier`. Ownership: the buffers are only used during the call.
///
/// # Safety
/// `sendbuf` must be valid for reads of `size × recvcount` elements, `recvbuf` for writes of
/// `recvcount`.
#[no_mangle]
pub unsafe extern "C" fn sucl_reduce_scatter(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: sucl_dtype,
    op: sucl_op,
) -> sucl_result {
    on_comm(comm, dtype, |c, dt| {
        let op = types::op(op)?;
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, times("recvcount", recvcount, c.size())?)?;
            let r = Region::<T>::new("recvbuf", recvbuf, recvcount)?;
            // SAFETY: as in `all_reduce`.
            let input = unsafe { Input::of(&s, &r) };
            c.reduce_scatter(&*input, unsafe { r.slice_mut() }, op)?;
        });
        Ok(())
    })
}
