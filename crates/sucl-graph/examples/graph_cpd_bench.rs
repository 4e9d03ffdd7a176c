// Collective pattern discovery on real ranks, with and without discovery side by side: see
// HELP below (`--help`).

#[path = "common/args.rs"]
mod args;

use args::Args;
use std::time::Instant;
use sucl_graph::{mappers::*, Buffer, CudaSource, DistrQueue, GraphError, Handler, QueueOptions, SplitHint};
use sucl_runtime::{Communicator, ReduceOp};

/// No-op kernels for GPU ranks: the chunk, then one or two (pointer, extent) accessor pairs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const NOOP_SRC: &str = r#"
extern "C" __global__ void noop1(sucl_chunk c, float* a, sucl_extent ae) {}
extern "C" __global__ void noop2(sucl_chunk c, float* a, sucl_extent ae, float* b, sucl_extent be) {}
"#;

/// Where the (empty) kernels of the comm programs run.
#[derive(Clone, Copy)]
enum Kernels<'s> {
    Host,
    Device(&'s CudaSource),
}

/// Declares an empty kernel over `range` for a task with `accessors` (1 or 2) accessors.
fn noop<const R: usize>(cgh: &mut Handler<'_>, k: Kernels<'_>, range: [usize; R], accessors: usize) {
    match k {
        Kernels::Host => cgh.parallel_for(range, |_, _| {}),
        // SAFETY: noop1/noop2 declare the chunk and one or two (float*, extent) pairs, matching
        // the task's accessors, and touch no memory.
        Kernels::Device(src) => unsafe { cgh.parallel_for_cuda(range, src, if accessors == 1 { "noop1" } else { "noop2" }, &[]) },
    }
}

fn options(discovery: bool) -> QueueOptions {
    QueueOptions { horizon_step: 4, threads: 1, dump_dir: None, discovery }
}

fn max_over_ranks(comm: &Communicator, secs: f64) -> Result<f64, GraphError> {
    let mut v = [secs];
    comm.all_reduce_in_place(&mut v, ReduceOp::Max)?;
    Ok(v[0])
}

/// The buffers of one comm program: 1D of `n` cells or 2D of `side`² cells.
enum Bufs {
    One(Buffer<f32, 1>, Buffer<f32, 1>),
    Two(Buffer<f32, 2>, Buffer<f32, 2>),
}

fn write_1d(q: &mut DistrQueue<'_>, k: Kernels<'_>, a: Buffer<f32, 1>, n: usize) -> Result<(), GraphError> {
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        noop(cgh, k, [n], 1)
    })
    .map(|_| ())
}

fn one_item(q: &mut DistrQueue<'_>, k: Kernels<'_>, a: Buffer<f32, 1>) -> Result<(), GraphError> {
    q.submit(|cgh| {
        cgh.read_write(&a, all());
        noop(cgh, k, [1], 1)
    })
    .map(|_| ())
}

fn read_all(q: &mut DistrQueue<'_>, k: Kernels<'_>, a: Buffer<f32, 1>, b: Buffer<f32, 1>, n: usize) -> Result<(), GraphError> {
    q.submit(|cgh| {
        cgh.read(&a, all());
        cgh.discard_write(&b, one_to_one());
        noop(cgh, k, [n], 2)
    })
    .map(|_| ())
}

/// Creates the program's buffers and runs what must precede the first iteration.
fn setup(q: &mut DistrQueue<'_>, k: Kernels<'_>, program: &str, cells: usize) -> Result<Bufs, GraphError> {
    Ok(match program {
        "alltoall" | "stencil" => {
            let side = (cells as f64).sqrt() as usize;
            Bufs::Two(q.buffer_from([side, side], vec![0.0; side * side])?, q.buffer([side, side])?)
        }
        _ => {
            let (a, b) = (q.buffer::<f32, 1>([cells])?, q.buffer::<f32, 1>([cells])?);
            if program == "gather_scatter" {
                write_1d(q, k, a, cells)?;
            }
            Bufs::One(a, b)
        }
    })
}

/// One pass of the program's tasks.
fn iteration(q: &mut DistrQueue<'_>, k: Kernels<'_>, program: &str, bufs: &mut Bufs) -> Result<(), GraphError> {
    match (program, bufs) {
        ("allgather", Bufs::One(a, b)) => {
            let n = a.extent()[0];
            write_1d(q, k, *a, n)?;
            read_all(q, k, *a, *b, n)
        }
        ("gather_scatter", Bufs::One(a, _)) => {
            let (a, n) = (*a, a.extent()[0]);
            one_item(q, k, a)?;
            q.submit(|cgh| {
                cgh.read_write(&a, one_to_one());
                noop(cgh, k, [n], 1)
            })
            .map(|_| ())
        }
        ("gather_bcast", Bufs::One(a, b)) => {
            let n = a.extent()[0];
            write_1d(q, k, *a, n)?;
            one_item(q, k, *a)?;
            read_all(q, k, *a, *b, n)
        }
        ("alltoall", Bufs::Two(x, t)) => {
            let ([s, _], x, t) = (x.extent(), *x, *t);
            q.submit(|cgh| {
                cgh.discard_write(&x, one_to_one());
                noop(cgh, k, [s, s], 1)
            })?;
            q.submit(|cgh| {
                cgh.read(&x, transposed(0, 1));
                cgh.discard_write(&t, one_to_one());
                noop(cgh, k, [s, s], 2)
            })
            .map(|_| ())
        }
        ("stencil", Bufs::Two(u, v)) => {
            let ([s, _], src, dst) = (u.extent(), *u, *v);
            q.submit(|cgh| {
                cgh.read(&src, neighborhood(&[1, 1]));
                cgh.discard_write(&dst, one_to_one());
                cgh.split(SplitHint::Split1D);
                noop(cgh, k, [s, s], 2)
            })?;
            std::mem::swap(u, v);
            Ok(())
        }
        (other, _) => Err(GraphError::InvalidArgument(format!("unknown program {other:?}"))),
    }
}

/// This rank's GPU and the no-op kernels (`comm --device`).
struct Gpu {
    #[cfg(feature = "cuda")]
    device: sucl_runtime::cuda::Device,
    src: CudaSource,
}

impl Gpu {
    #[cfg(feature = "cuda")]
    fn open(comm: &Communicator) -> Result<Gpu, GraphError> {
        Ok(Gpu { device: comm.cuda_device()?, src: CudaSource::new(NOOP_SRC) })
    }

    #[cfg(not(feature = "cuda"))]
    fn open(_: &Communicator) -> Result<Gpu, GraphError> {
        Err(GraphError::InvalidArgument("--device needs sucl-graph built with the `cuda` feature".into()))
    }
}

/// A host queue, or a GPU queue on `gpu`, with discovery on or off.
fn queue<'c>(comm: &'c Communicator, gpu: Option<&Gpu>, discovery: bool) -> Result<DistrQueue<'c>, GraphError> {
    match gpu {
        None => DistrQueue::with_options(comm, options(discovery)),
        #[cfg(feature = "cuda")]
        Some(g) => DistrQueue::on_device_with(comm, options(discovery), &g.device, sucl_graph::TransportChoice::from_env()?),
        #[cfg(not(feature = "cuda"))]
        Some(_) => unreachable!("a Gpu exists only with the cuda feature"),
    }
}

/// Iterations per second of `program` over `bytes`-byte buffers with discovery on or off, and
/// how the queue moved data ("host", or the GPU queue's transport).
fn comm_rate(
    comm: &Communicator,
    gpu: Option<&Gpu>,
    program: &str,
    bytes: usize,
    iters: usize,
    discovery: bool,
) -> Result<(f64, &'static str), GraphError> {
    let mut q = queue(comm, gpu, discovery)?;
    let transport = q.device_transport().map_or("host", |t| t.name());
    let k = gpu.map_or(Kernels::Host, |g| Kernels::Device(&g.src));
    let mut bufs = setup(&mut q, k, program, bytes / 4)?;
    iteration(&mut q, k, program, &mut bufs)?; // warm-up: first touch of every buffer
    q.sync()?;
    let t = Instant::now();
    for _ in 0..iters {
        iteration(&mut q, k, program, &mut bufs)?;
    }
    q.sync()?;
    Ok((iters as f64 / max_over_ranks(comm, t.elapsed().as_secs_f64())?, transport))
}

fn comm_bench(comm: &Communicator, args: &Args) -> Result<(), GraphError> {
    let programs = args.value("--programs").unwrap_or(PROGRAMS).to_string();
    let (min, max) = (args.num("--min-bytes", 4096), args.num("--max-bytes", 64 << 20));
    let (rounds, budget, max_iters) = (args.num("--rounds", 3), args.num("--budget-mib", 256) << 20, args.num("--max-iters", 200));
    let gpu = if args.flag("--device") { Some(Gpu::open(comm)?) } else { None };
    for program in programs.split(',') {
        let mut bytes = min;
        while bytes <= max {
            let iters = (budget / bytes).clamp(3, max_iters.max(3));
            for round in 0..rounds {
                let order = if round % 2 == 0 { [false, true] } else { [true, false] };
                for cpd in order {
                    let (rate, transport) = comm_rate(comm, gpu.as_ref(), program, bytes, iters, cpd)?;
                    if comm.rank() == 0 {
                        println!(
                            "{{\"bench\":\"comm\",\"program\":\"{program}\",\"ranks\":{},\"transport\":\"{transport}\",\"bytes\":{bytes},\"round\":{round},\"cpd\":{cpd},\"iterations\":{iters},\"iterations_per_s\":{rate:.3}}}",
                            comm.size()
                        );
                    }
                }
            }
            bytes *= 4;
        }
    }
    Ok(())
}

const DT: f64 = 1e-3;

#[inline]
fn accel(all: &[f64], me: [f64; 3]) -> [f64; 3] {
    let mut acc = [0.0f64; 3];
    for b in all.chunks_exact(3) {
        let d = [b[0] - me[0], b[1] - me[1], b[2] - me[2]];
        let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + 1e-3;
        let inv = 1.0 / (r2 * r2.sqrt());
        for a in 0..3 {
            acc[a] += d[a] * inv;
        }
    }
    acc
}

/// `steps` N-body steps over `n` bodies; the final positions, every rank.
fn nbody_run(comm: &Communicator, n: usize, steps: usize, discovery: bool) -> Result<(f64, Vec<f64>), GraphError> {
    let mut q = DistrQueue::with_options(comm, options(discovery))?;
    let init: Vec<f64> = (0..n * 3).map(|i| ((i * 7919) % 1009) as f64 / 10.0).collect();
    let pos: Buffer<f64, 2> = q.buffer_from([n, 3], init)?;
    let vel: Buffer<f64, 2> = q.buffer_from([n, 3], vec![0.0; 3 * n])?;
    q.sync()?;
    let t = Instant::now();
    for _ in 0..steps {
        q.submit(|cgh| {
            let p = cgh.read(&pos, all());
            let v = cgh.read_write(&vel, slice(1));
            cgh.parallel_for([n], move |c, k| {
                let (p, mut v) = (k.read(&p), k.write(&v));
                let all = p.as_slice();
                for i in c.offset[0]..c.offset[0] + c.range[0] {
                    let acc = accel(all, [all[3 * i], all[3 * i + 1], all[3 * i + 2]]);
                    let row = v.slice_mut([i, 0], 3);
                    for a in 0..3 {
                        row[a] += acc[a] * DT;
                    }
                }
            })
        })?;
        q.submit(|cgh| {
            let p = cgh.read_write(&pos, slice(1));
            let v = cgh.read(&vel, slice(1));
            cgh.parallel_for([n], move |c, k| {
                let (mut p, v) = (k.write(&p), k.read(&v));
                for i in c.offset[0]..c.offset[0] + c.range[0] {
                    let vi = v.slice([i, 0], 3);
                    let row = p.slice_mut([i, 0], 3);
                    for a in 0..3 {
                        row[a] += vi[a] * DT;
                    }
                }
            })
        })?;
    }
    q.sync()?;
    let secs = max_over_ranks(comm, t.elapsed().as_secs_f64())?;
    let result = q.fence_all(&pos)?;
    Ok((steps as f64 / secs, result))
}

fn nbody_bench(comm: &Communicator, args: &Args) -> Result<bool, GraphError> {
    let (n, steps, rounds) = (args.num("--size", 4096), args.num("--steps", 3), args.num("--rounds", 3));
    let mut agree = true;
    for round in 0..rounds {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        let mut results = Vec::new();
        for cpd in order {
            let (rate, pos) = nbody_run(comm, n, steps, cpd)?;
            results.push(pos);
            if comm.rank() == 0 {
                println!(
                    "{{\"bench\":\"nbody\",\"ranks\":{},\"bodies\":{n},\"steps\":{steps},\"round\":{round},\"cpd\":{cpd},\"steps_per_s\":{rate:.4}}}",
                    comm.size()
                );
            }
        }
        let same = results[0].iter().zip(&results[1]).all(|(a, b)| a.to_bits() == b.to_bits());
        if comm.rank() == 0 {
            println!(
                "{{\"bench\":\"nbody_check\",\"ranks\":{},\"bodies\":{n},\"round\":{round},\"wrong\":{}}}",
                comm.size(),
                u8::from(!same)
            );
        }
        agree &= same;
    }
    Ok(agree)
}

const HELP: &str = "Usage: graph_cpd_bench comm [options] | graph_cpd_bench nbody [options]

Collective pattern discovery on real ranks, with and without discovery side by side in one
run (rounds alternate which mode goes first; a fresh DistrQueue per measurement).

  sucl run -n 4 -- target/release/examples/graph_cpd_bench comm [--programs allgather,...]
      [--min-bytes 4096] [--max-bytes 67108864] [--rounds 3] [--budget-mib 256] [--max-iters 200]
  sucl run -n 4 -- target/release/examples/graph_cpd_bench nbody [--size 4096] [--steps 3] [--rounds 3]
  sucl run -n 2 -- target/release/examples/graph_cpd_bench comm --device ...   (GPU ranks)

comm: communication-only throughput (kernels do nothing) of the paper's Table 3 programs —
allgather (N kernel writes one_to_one, next reads all), gather_scatter (a 1-item kernel
reads and writes all, then an N kernel reads and writes one_to_one), gather_bcast (N kernel
writes, 1-item kernel reads and writes all, N kernel reads all), alltoall (N×N kernel
writes rows, next reads transposed(0, 1)) and the stencil control (2D Jacobi,
neighborhood(1, 1)) — over f32 buffers of 4 KiB .. 64 MiB (×4 steps). An iteration is one
pass of the program's tasks; iterations/s = iterations / (wall time of the iterations and a
final sync, max over ranks). Iterations per size: budget / size, clamped to [3, max-iters].
With --device every rank is a GPU queue (DistrQueue::on_device: buffers in device memory,
moved by the queue's device transport, NCCL or staged) and the kernels are CUDA no-ops.

nbody: a direct N-body (f64, one worker thread per rank, forces read all positions, then
positions move), steps/s; the final positions of both modes are compared bit for bit
(`wrong` = 1 if they differ).

Output: one JSON line per (program, size, round, mode) on rank 0's stdout.
";

/// The comm programs, in the default order.
const PROGRAMS: &str = "allgather,gather_scatter,gather_bcast,alltoall,stencil";

fn main() {
    let args = Args::from_env(HELP);
    let bench = args.positional(0).unwrap_or("");
    if !["comm", "nbody"].contains(&bench) {
        args.fail(format!("want `comm` or `nbody`, got {bench:?}"));
    }
    if let Some(list) = args.value("--programs") {
        if let Some(p) = list.split(',').find(|p| !PROGRAMS.split(',').any(|q| q == *p)) {
            args.fail(format!("--programs: unknown program {p:?} (of {PROGRAMS})"));
        }
    }
    let result = sucl_runtime::init().map_err(GraphError::from).and_then(|comm| {
        if bench == "comm" {
            return comm_bench(&comm, &args);
        }
        if !nbody_bench(&comm, &args)? {
            return Err(GraphError::InvalidArgument(format!("rank {}: N-body positions differ with and without discovery", comm.rank())));
        }
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("graph_cpd_bench: {e}");
        std::process::exit(1);
    }
}
