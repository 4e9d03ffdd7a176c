//! Faces on host ranks: the baseline and the stream-triggered variant side by side, each checked
//! against the host reference (relative difference < 1e-15).
//!
//! Input as the public Faces benchmark reads it, `lx ly lz mx my mz n nk nj ni`: on stdin (a
//! world of one, or launchers that give rank 0 a stdin) or as the ten arguments (`sucl run`
//! gives ranks no stdin):
//!
//! `target/release/sucl run -n 8 -- target/release/examples/faces 2 2 2 15 14 13 12 1 2 20`
//!
//! With `--gpu nccl|staged` first, both variants run on one GPU per rank instead (the baseline
//! over NCCL where the job has it, else staged; the stream-triggered variant over the transport named):
//!
//! `target/release/sucl run -n 2 -- target/release/examples/faces --gpu staged 2 1 1 15 14 13 12 1 2 20`

use clap::{Parser, ValueEnum};
use std::io::Read;
use sucl_runtime::ReduceOp;
use sucl_stream::faces::{run_baseline, run_triggered, Grid, Input, DIRS};

/// Faces (a halo exchange of a 3-D spectral-element grid): the baseline and the
/// stream-triggered variant side by side, each checked against the host reference. Rank 0
/// prints the time per share of each, the host time blocked, and one JSON line.
#[derive(Parser)]
#[command(
    name = "faces",
    after_help = "Examples:\n  \
      sucl run -n 8 -- target/release/examples/faces 2 2 2 15 14 13 12 1 2 20\n  \
      sucl run -n 2 -- target/release/examples/faces --gpu staged 2 1 1 15 14 13 12 1 2 20\n  \
      echo 1 1 1 4 4 4 4 1 1 10 | target/release/examples/faces\n\n\
      The job must have lx·ly·lz ranks; --gpu needs one GPU per rank."
)]
struct Args {
    /// Run both variants on one GPU per rank instead, the stream-triggered one over this
    /// transport (the baseline over NCCL where the job has it, else staged).
    #[arg(long, value_enum)]
    gpu: Option<Gpu>,
    /// The input as the public Faces benchmark reads it: `lx ly lz mx my mz n nk nj ni` (ranks
    /// per axis, elements per rank per axis, points per element edge, outer, middle and inner
    /// loop counts). Read from stdin on rank 0 when absent (`sucl run` gives ranks no stdin).
    #[arg(value_name = "INPUT")]
    input: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Gpu {
    /// NCCL groups on a side stream of the queue, issued at the wait.
    Nccl,
    /// Stream memory operations and the progress thread over the host backend.
    Staged,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("faces: {e}");
        std::process::exit(1);
    }
}

fn run(Args { gpu, input: args }: Args) -> sucl_runtime::Result<()> {
    let gpu = gpu.map(|g| match g {
        Gpu::Nccl => sucl_stream::device::Transport::Nccl,
        Gpu::Staged => sucl_stream::device::Transport::Staged,
    });
    let comm = sucl_runtime::init()?;
    // Rank 0 reads the input; every rank uses rank 0's.
    let mut text = [0u8; 256];
    if comm.rank() == 0 {
        let s = if args.is_empty() {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| sucl_runtime::Error::io(0, "reading stdin", e))?;
            s
        } else {
            args.join(" ")
        };
        let b = s.trim().as_bytes();
        if b.len() > text.len() {
            return Err(sucl_runtime::Error::Config("faces input longer than 256 bytes".into()));
        }
        text[..b.len()].copy_from_slice(b);
    }
    comm.broadcast(&mut text[..], 0)?;
    let s = String::from_utf8_lossy(&text).trim_end_matches('\0').to_string();
    let inp = Input::parse(&s)?;
    let g = Grid::new(inp, comm.rank(), comm.size())?;
    let peers = g.peers.iter().filter(|&&p| p != sucl_stream::PROC_NULL).count();
    let biggest = (0..DIRS.len()).map(|d| g.message_len(d)).max().unwrap_or(0) * 8;
    let (base, st, comm, label) = match gpu {
        None => {
            let base = run_baseline(&comm, &g, 1)?;
            let (st, comm) = run_triggered(comm, &g, 1)?;
            (base, st, comm, "host ranks".to_string())
        }
        Some(t) => {
            let dev = comm.cuda_device()?;
            let q = dev.queue()?;
            comm.attach_device(&dev)?;
            let base = sucl_stream::faces_gpu::run_baseline(&comm, &g, &q)?;
            let (st, comm) = sucl_stream::faces_gpu::run_triggered(comm, &g, &q, t)?;
            // Device point-to-point goes over NCCL where the job set it up, else staged (two
            // ranks sharing one GPU, or NCCL missing on a rank).
            let base_path = if comm.device_backends().contains(&"nccl") { "nccl" } else { "staged" };
            (base, st, comm, format!("GPUs ({}; baseline over {base_path}, triggered over {t:?})", dev.name()))
        }
    };
    let stats = |v: f64| -> sucl_runtime::Result<(f64, f64, f64)> {
        let mut mx = [v];
        let mut mn = [v];
        let mut sum = [v];
        comm.all_reduce_in_place(&mut mx, ReduceOp::Max)?;
        comm.all_reduce_in_place(&mut mn, ReduceOp::Min)?;
        comm.all_reduce_in_place(&mut sum, ReduceOp::Sum)?;
        Ok((sum[0] / comm.size() as f64, mn[0], mx[0]))
    };
    let mut worst = [base.max_diff.max(st.max_diff)];
    comm.all_reduce_in_place(&mut worst, ReduceOp::Max)?;
    let b = stats(base.per_step)?;
    let t = stats(st.per_step)?;
    let bb = stats(base.blocked)?;
    let tb = stats(st.blocked)?;
    let mut most = [peers as u64];
    comm.all_reduce_in_place(&mut most, ReduceOp::Max)?;
    if comm.rank() == 0 {
        println!(
            "faces: input `{s}` on {label}: {} ranks, {} points each, up to {} messages per share, largest {biggest} bytes",
            comm.size(),
            g.points(),
            most[0]
        );
        if worst[0] < 1e-15 {
            println!("faces: {} tasks passed correctness check (max relative difference {:e})", comm.size(), worst[0]);
        } else {
            println!("faces: correctness check FAILED: max relative difference {:e}", worst[0]);
        }
        println!("faces: baseline  time per share avg {:.3} us, min {:.3}, max {:.3}", b.0 * 1e6, b.1 * 1e6, b.2 * 1e6);
        println!("faces: triggered time per share avg {:.3} us, min {:.3}, max {:.3}", t.0 * 1e6, t.1 * 1e6, t.2 * 1e6);
        println!("faces: triggered / baseline (max over ranks) = {:.3}", t.2 / b.2);
        println!("faces: host time blocked per share (avg over ranks): baseline {:.3} us, triggered {:.3} us", bb.0 * 1e6, tb.0 * 1e6);
        // One JSON line for scripts/stream_plot.py.
        println!(
            "{{\"bench\":\"faces\",\"on\":\"{}\",\"transport\":\"{}\",\"input\":\"{s}\",\"ranks\":{},\"baseline_us\":{:.3},\"triggered_us\":{:.3},\"baseline_blocked_us\":{:.3},\"triggered_blocked_us\":{:.3},\"max_rel_diff\":{:e}}}",
            if gpu.is_some() { "gpu" } else { "host" },
            gpu.map_or("host".to_string(), |t| format!("{t:?}").to_lowercase()),
            comm.size(),
            b.2 * 1e6,
            t.2 * 1e6,
            bb.0 * 1e6,
            tb.0 * 1e6,
            worst[0]
        );
    }
    if worst[0] >= 1e-15 {
        std::process::exit(2);
    }
    Ok(())
}
