//! Every rank all-reduces a device buffer through the same call it would use for a host slice:
//! over NCCL (enqueued on the buffer's queue after the upload, no CPU wait) or staged through
//! host memory, as sucl selects. Then it checks the result on the host.
//!
//! Build with `cargo build --release --examples` (feature `cuda`, on by default) and run with
//! `target/release/sucl run -n 2 -- target/release/examples/gpu_allreduce`.

fn main() -> sucl::Result<()> {
    let comm = sucl::init()?;
    let dev = match comm.cuda_device() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rank {}: no GPU here ({e})", comm.rank());
            return Ok(());
        }
    };
    let queue = dev.queue()?;
    let n = 1 << 20;
    let mut x = queue.upload(&vec![(comm.rank() + 1) as f32; n])?;
    let mut host = vec![(comm.rank() + 1) as f32; n];
    // One API: the same call on device and host memory.
    comm.all_reduce_in_place(&mut x, sucl::ReduceOp::Sum)?;
    comm.all_reduce_in_place(&mut host, sucl::ReduceOp::Sum)?;
    comm.synchronize(&queue)?;
    let back = x.to_vec()?;
    let want = (comm.size() * (comm.size() + 1) / 2) as f32;
    assert!(back.iter().all(|&v| v == want) && host == back, "rank {}: got {}", comm.rank(), back[0]);
    println!(
        "rank {}: {n} floats all-reduced on {} via {}",
        comm.rank(),
        dev.name(),
        comm.device_backend_for(sucl::CollOp::AllReduce, n * 4)
    );
    Ok(())
}
