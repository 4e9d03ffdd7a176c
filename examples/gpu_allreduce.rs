//! Every rank all-reduces a device buffer through the same call it would use for a host slice:
//! over NCCL or peer memory (enqueued on the buffer's queue after the upload, no CPU wait) or
//! staged through host memory, as sucl selects. Then it checks the result on the host.
//!
//! Build with `cargo build --release -p sucl --example gpu_allreduce` (feature `cuda`, on by
//! default) and run with `target/release/sucl run -n 2 -- target/release/examples/gpu_allreduce`.

use std::process::ExitCode;

const HELP: &str = "\
gpu_allreduce: every rank uploads COUNT floats to its GPU (GPU = local rank % GPUs), all-reduces
them (sum) with the same call it also makes on a host vector, waits for its stream and checks
both results. Prints per rank the GPU's name and the device backend sucl chose (nccl, ipc or
staged). Needs a CUDA GPU on every rank; without one it stops with a one-line error.

Usage: gpu_allreduce [--count COUNT] [--help]
  --count COUNT   floats per rank (default 1048576)

Example:
  sucl run -n 2 -- target/release/examples/gpu_allreduce --count 4096";

fn main() -> ExitCode {
    let count = match parse_args() {
        Ok(Some(n)) => n,
        Ok(None) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpu_allreduce: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    match run(count) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The floats per rank, or `None` when help was asked for.
fn parse_args() -> Result<Option<usize>, String> {
    let mut count = 1 << 20;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--count" => {
                let v = args.next().ok_or("--count needs a number")?;
                count = v.parse().map_err(|_| format!("--count `{v}` is not a number"))?;
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    Ok(Some(count))
}

fn run(n: usize) -> Result<(), String> {
    let comm = sucl::init().map_err(|e| e.to_string())?;
    let rank = comm.rank();
    let dev = comm.cuda_device().map_err(|e| format!("no usable GPU: {e}"))?;
    let on_device = |e: sucl::Error| format!("rank {rank} on {}: {e}", dev.name());
    let queue = dev.queue().map_err(on_device)?;
    let mut x = queue.upload(&vec![(rank + 1) as f32; n]).map_err(on_device)?;
    let mut host = vec![(rank + 1) as f32; n];
    // One API: the same call on device and host memory.
    comm.all_reduce_in_place(&mut x, sucl::ReduceOp::Sum).map_err(on_device)?;
    comm.all_reduce_in_place(&mut host, sucl::ReduceOp::Sum).map_err(on_device)?;
    comm.synchronize(&queue).map_err(on_device)?;
    let back = x.to_vec().map_err(on_device)?;
    let want = (comm.size() * (comm.size() + 1) / 2) as f32;
    if let Some(i) = back.iter().zip(&host).position(|(&d, &h)| d != want || h != want) {
        return Err(format!("rank {rank}: element {i} is {} on the GPU and {} on the host, expected {want}", back[i], host[i]));
    }
    println!("rank {rank}: {n} floats all-reduced on {} via {}", dev.name(), comm.device_backend_for(sucl::CollOp::AllReduce, n * 4));
    Ok(())
}
