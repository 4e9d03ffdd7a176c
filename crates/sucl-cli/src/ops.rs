//! Runs any collective by its [`CollOp`] through the typed API (for `check` and `bench`).

use sucl::{CollOp, Communicator, Element, ReduceOp, Result};

/// Calls `op` on `comm`; `count` is per rank (see [`crate::pattern::buffer_lens`]).
pub fn run_op<T: Element>(comm: &Communicator, op: CollOp, send: &[T], recv: &mut [T], redop: ReduceOp, root: usize) -> Result<()> {
    match op {
        CollOp::Barrier => comm.barrier(),
        CollOp::Broadcast => comm.broadcast(recv, root),
        CollOp::AllReduce => comm.all_reduce(send, recv, redop),
        CollOp::Reduce => comm.reduce(send, recv, redop, root),
        CollOp::Gather => comm.gather(send, recv, root),
        CollOp::AllGather => comm.all_gather(send, recv),
        CollOp::Scatter => comm.scatter(send, recv, root),
        CollOp::AllToAll => comm.all_to_all(send, recv),
        CollOp::ReduceScatter => comm.reduce_scatter(send, recv, redop),
    }
}

/// Holds every rank until rank 0 has printed its report (call it after that print): a rank
/// that exits non-zero makes the launcher end the others, which must not cut the report short.
pub fn reported(comm: &Communicator) -> Result<()> {
    oob_sum(comm, "reported", 0).map(|_| ())
}

/// The sum over every rank of `value`, added up through the rendezvous store (never through the
/// backend being checked or measured). Collective; every rank calls it with the same `what` in
/// the same order (a per-process counter makes each call's store keys unique).
pub fn oob_sum(comm: &Communicator, what: &str, value: u64) -> Result<u64> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let all = comm.oob_all_gather(&format!("sucl-cli/{what}/{k}"), &value.to_le_bytes())?;
    all.iter().enumerate().try_fold(0u64, |acc, (r, b)| {
        let b: [u8; 8] = b.as_slice().try_into().map_err(|_| sucl::Error::Mismatch {
            rank: comm.rank(),
            what: format!("rank {r} sent {} bytes for the total `{what}` (expected 8)", b.len()),
        })?;
        Ok(acc.saturating_add(u64::from_le_bytes(b)))
    })
}
