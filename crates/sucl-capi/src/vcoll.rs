//! V-collectives on host buffers: per-rank counts and displacements (in elements), MPI style.
//! As in the facade, every rank passes the *whole* counts table of the call (`size` entries;
//! `size × size`, row-major, for all_to_allv), so that ranks that disagree get an error instead
//! of a truncation or a hang. A buffer addressed by displacements is taken to end where its last
//! block ends.

use crate::coll::{root_of, times};
use crate::error::{entry, Fail};
use crate::handles::COMMS;
use crate::mem::{extent, table, Input, Region};
use crate::types::{self, sucl_comm, sucl_dtype, sucl_result, with_dtype};
use std::ffi::c_void;
use sucl::Communicator;

/// Checks out `comm` and reads its `counts` table (`size × rows` entries) for one call.
fn on_comm(
    comm: sucl_comm,
    dtype: sucl_dtype,
    counts: *const usize,
    square: bool,
    f: impl FnOnce(&Communicator, sucl::DType, &[usize]) -> Result<(), Fail>,
) -> sucl_result {
    entry(|| {
        let dt = types::dtype(dtype)?;
        let c = COMMS.checkout(comm)?;
        let n = c.size();
        let len = if square { times("counts", n, n)? } else { n };
        // SAFETY: the caller's contract: `counts` holds the whole table.
        let counts = unsafe { table("counts", counts, len)? };
        f(&c, dt, counts)
    })
}

/// Gathers `counts[r]` elements from every rank `r` (its `sendbuf`) into root's `recvbuf` at
/// element offset `displs[r]`. `counts` (`size` entries) is passed by every rank; `displs` and
/// `recvbuf` are used on the root only (others may pass NULL). Receive blocks may not overlap.
/// Collective.
///
/// Thread safety: one thread at a time per communicator (`SUCL_ERR_BUSY` otherwise).
/// Ownership: the buffers and tables are only used during the call.
///
/// # Safety
/// `counts` must hold `size` entries; `sendbuf` must be valid for reads of `counts[rank]`
/// elements; on the root `displs` must hold `size` entries and `recvbuf` be valid for writes up
/// to the end of its last block.
#[no_mangle]
pub unsafe extern "C" fn sucl_gatherv(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    displs: *const usize,
    dtype: sucl_dtype,
    root: i32,
) -> sucl_result {
    on_comm(comm, dtype, counts, false, |c, dt, counts| {
        let (root, me) = (root_of(c, root)?, c.rank());
        // SAFETY: the caller's contract for `displs` on the root.
        let displs = if me == root { unsafe { table("displs", displs, c.size())? } } else { &[] };
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, counts[me])?;
            let r = if me == root { Region::<T>::new("recvbuf", recvbuf, extent("displs", counts.iter().copied(), displs)?)? } else { Region::unused() };
            // SAFETY: the caller's contract; an overlapping send buffer is copied first.
            let input = unsafe { Input::of(&s, &r) };
            c.gatherv(&*input, unsafe { r.slice_mut() }, counts, displs, root)?;
        });
        Ok(())
    })
}

/// Sends `counts[r]` elements at element offset `displs[r]` of root's `sendbuf` to every rank
/// `r`'s `recvbuf`. `counts` (`size` entries) is passed by every rank; `displs` and `sendbuf`
/// are used on the root only (others may pass NULL). Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv`.
///
/// # Safety
/// `counts` must hold `size` entries; `recvbuf` must be valid for writes of `counts[rank]`
/// elements; on the root `displs` must hold `size` entries and `sendbuf` be valid for reads up
/// to the end of its last block.
#[no_mangle]
pub unsafe extern "C" fn sucl_scatterv(
    comm: sucl_comm,
    sendbuf: *const c_void,
    counts: *const usize,
    displs: *const usize,
    recvbuf: *mut c_void,
    dtype: sucl_dtype,
    root: i32,
) -> sucl_result {
    on_comm(comm, dtype, counts, false, |c, dt, counts| {
        let (root, me) = (root_of(c, root)?, c.rank());
        // SAFETY: the caller's contract for `displs` on the root.
        let displs = if me == root { unsafe { table("displs", displs, c.size())? } } else { &[] };
        with_dtype!(dt, T => {
            let s = if me == root { Region::<T>::new("sendbuf", sendbuf, extent("displs", counts.iter().copied(), displs)?)? } else { Region::unused() };
            let r = Region::<T>::new("recvbuf", recvbuf, counts[me])?;
            // SAFETY: as in `sucl_gatherv`.
            let input = unsafe { Input::of(&s, &r) };
            c.scatterv(&*input, unsafe { r.slice_mut() }, counts, displs, root)?;
        });
        Ok(())
    })
}

/// Every rank's `sendbuf` (`counts[rank]` elements) lands in every rank's `recvbuf` at element
/// offset `displs[sender]`. Every rank passes the whole `counts` table and its own `displs`
/// (`size` entries each). Receive blocks may not overlap. Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv`.
///
/// # Safety
/// `counts` and `displs` must hold `size` entries; `sendbuf` must be valid for reads of
/// `counts[rank]` elements, `recvbuf` for writes up to the end of its last block.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_gatherv(
    comm: sucl_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    counts: *const usize,
    displs: *const usize,
    dtype: sucl_dtype,
) -> sucl_result {
    on_comm(comm, dtype, counts, false, |c, dt, counts| {
        let me = c.rank();
        // SAFETY: the caller's contract for `displs`.
        let displs = unsafe { table("displs", displs, c.size())? };
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, counts[me])?;
            let r = Region::<T>::new("recvbuf", recvbuf, extent("displs", counts.iter().copied(), displs)?)?;
            // SAFETY: as in `sucl_gatherv`.
            let input = unsafe { Input::of(&s, &r) };
            c.all_gatherv(&*input, unsafe { r.slice_mut() }, counts, displs)?;
        });
        Ok(())
    })
}

/// All-to-all with per-pair counts: `counts` is the whole `size × size` table, row-major —
/// `counts[i * size + j]` elements go from rank `i` to rank `j`, the same table on every rank.
/// This rank's block for `j` starts at element `sdispls[j]` of `sendbuf`; the block from `j`
/// lands at element `rdispls[j]` of `recvbuf`. Receive blocks may not overlap. Collective.
///
/// Thread safety: as `sucl_gatherv`. Ownership: as `sucl_gatherv`.
///
/// # Safety
/// `counts` must hold `size × size` entries, `sdispls` and `rdispls` `size` each; the buffers
/// must be valid (reads for `sendbuf`, writes for `recvbuf`) up to the end of their last block.
#[no_mangle]
pub unsafe extern "C" fn sucl_all_to_allv(
    comm: sucl_comm,
    sendbuf: *const c_void,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    rdispls: *const usize,
    counts: *const usize,
    dtype: sucl_dtype,
) -> sucl_result {
    on_comm(comm, dtype, counts, true, |c, dt, counts| {
        let (n, me) = (c.size(), c.rank());
        // SAFETY: the caller's contract for the displacement tables.
        let (sd, rd) = unsafe { (table("sdispls", sdispls, n)?, table("rdispls", rdispls, n)?) };
        let row = counts[me * n..(me + 1) * n].iter().copied();
        let column = (0..n).map(|i| counts[i * n + me]);
        with_dtype!(dt, T => {
            let s = Region::<T>::new("sendbuf", sendbuf, extent("sdispls", row, sd)?)?;
            let r = Region::<T>::new("recvbuf", recvbuf, extent("rdispls", column, rd)?)?;
            // SAFETY: as in `sucl_gatherv`.
            let input = unsafe { Input::of(&s, &r) };
            c.all_to_allv(&*input, sd, unsafe { r.slice_mut() }, rd, counts)?;
        });
        Ok(())
    })
}
