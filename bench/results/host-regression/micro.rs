//! Micro benchmark (temporary, for a before/after comparison): all_reduce f32 sum of 2..64 elements.
fn main() -> sucl::Result<()> {
    let comm = sucl::init()?;
    let iters: usize = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200000);
    for count in [2usize, 4, 8, 16, 32, 64] {
        let send = vec![1.0f32; count];
        let mut recv = vec![0.0f32; count];
        for _ in 0..iters / 10 {
            comm.all_reduce(&send, &mut recv, sucl::ReduceOp::Sum)?;
        }
        comm.barrier()?;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&send, &mut recv, sucl::ReduceOp::Sum)?;
        }
        let mut us = [t.elapsed().as_secs_f64() * 1e6 / iters as f64];
        comm.all_reduce_in_place(&mut us, sucl::ReduceOp::Max)?;
        if comm.rank() == 0 {
            println!("{} {:.4}", count * 4, us[0]);
        }
    }
    Ok(())
}
