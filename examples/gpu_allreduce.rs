//! Every rank all-reduces a device buffer over NCCL (or the staged path), ordered on the GPU
//! stream, then checks the result on the host.
//!
//! Build with `cargo build --release --examples` (feature `cuda`, on by default through sucl-cli)
//! and run with `target/release/sucl run -n 2 -- target/release/examples/gpu_allreduce`.

fn main() -> sucl::Result<()> {
    let comm = sucl::init()?;
    let gpu = match comm.cuda(None) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("rank {}: no GPU here ({e})", comm.rank());
            return Ok(());
        }
    };
    let n = 1 << 20;
    let mut x = gpu.stream().clone_htod(&vec![(comm.rank() + 1) as f32; n]).expect("upload");
    gpu.all_reduce_in_place(&mut x, sucl::ReduceOp::Sum)?; // enqueued; the CPU does not wait
    gpu.synchronize()?;
    let back = gpu.stream().clone_dtoh(&x).expect("download");
    let want = (comm.size() * (comm.size() + 1) / 2) as f32;
    assert!(back.iter().all(|&v| v == want), "rank {}: got {}", comm.rank(), back[0]);
    println!(
        "rank {}: {n} floats all-reduced on {} via {}",
        comm.rank(),
        gpu.device().name(),
        gpu.backend_for(sucl::CollOp::AllReduce, n * 4)
    );
    Ok(())
}
