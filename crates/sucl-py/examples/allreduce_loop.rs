//! The Rust side of the Python binding's overhead measurement: times `iters` in-place
//! all_reduces of `bytes` bytes (f64 elements) and prints the mean time per call, in the same
//! format as `python/bench/overhead.py`.
//!
//! Usage: `sucl run -n 2 -- allreduce_loop [ITERS] [BYTES]` (defaults 200000 and 8), e.g.
//! `sucl run -n 2 -- target/release/examples/allreduce_loop 200000 8`.

use std::time::Instant;

fn main() -> sucl::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("allreduce_loop [ITERS] [BYTES]: mean time of an in-place f64 all_reduce of BYTES bytes over ITERS calls");
        println!("run it under a launcher, e.g.: sucl run -n 2 -- target/release/examples/allreduce_loop 200000 8");
        return Ok(());
    }
    let iters: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let bytes: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    let comm = sucl::init()?;
    let mut v = vec![1.0f64; (bytes / 8).max(1)];
    for _ in 0..iters / 10 {
        comm.all_reduce_in_place(&mut v, sucl::ReduceOp::Sum)?;
    }
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        comm.all_reduce_in_place(&mut v, sucl::ReduceOp::Sum)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    if comm.rank() == 0 {
        println!("rust all_reduce {bytes} B on {}: {us:.3} us/call", comm.backend_for(sucl::CollOp::AllReduce, bytes));
    }
    Ok(())
}
