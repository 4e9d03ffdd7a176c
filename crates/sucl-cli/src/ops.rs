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
