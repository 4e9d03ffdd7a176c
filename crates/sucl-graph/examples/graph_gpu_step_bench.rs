// Step rates on GPU ranks, task graph against hand-written sucl calls: see HELP at the end
// (`--help`).

#[path = "common/args.rs"]
mod args;

use args::Args;
use std::time::Instant;
use sucl_cuda::cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use sucl_cuda::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use sucl_graph::{mappers::*, Buffer, CudaSource, DistrQueue, GraphError, KernelArg};
use sucl_runtime::cuda::{Device, Queue};
use sucl_runtime::{Communicator, ReduceOp};

const SRC: &str = r#"
extern "C" __global__ void jacobi(sucl_chunk c, const float* u, sucl_extent ue, float* v, sucl_extent ve) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size n = ue.e[0], m = ue.e[1], x = i[0], y = i[1], at = x * m + y;
    if (x == 0 || x == n - 1 || y == 0 || y == m - 1) v[at] = u[at];
    else v[at] = 0.25f * (u[at - m] + u[at + m] + u[at - 1] + u[at + 1]);
}
extern "C" __global__ void nbody_vel(sucl_chunk c, const double* p, sucl_extent pe, double* v, sucl_extent ve, double dt) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size n = pe.e[0], b = i[0];
    double me0 = p[3 * b], me1 = p[3 * b + 1], me2 = p[3 * b + 2];
    double a0 = 0.0, a1 = 0.0, a2 = 0.0;
    for (sucl_size j = 0; j < n; j++) {
        double d0 = p[3 * j] - me0, d1 = p[3 * j + 1] - me1, d2 = p[3 * j + 2] - me2;
        double r2 = d0 * d0 + d1 * d1 + d2 * d2 + 1e-3;
        double inv = 1.0 / (r2 * sqrt(r2));
        a0 += d0 * inv; a1 += d1 * inv; a2 += d2 * inv;
    }
    v[3 * b] += a0 * dt; v[3 * b + 1] += a1 * dt; v[3 * b + 2] += a2 * dt;
}
extern "C" __global__ void nbody_pos(sucl_chunk c, double* p, sucl_extent pe, const double* v, sucl_extent ve, double dt) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size b = i[0];
    for (int a = 0; a < 3; a++) p[3 * b + a] += v[3 * b + a] * dt;
}
"#;

const DT: f64 = 0.01;

/// The prelude's `sucl_chunk`, for the hand-written launches.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChunkArg {
    offset: [u64; 3],
    range: [u64; 3],
    global: [u64; 3],
}
// SAFETY: nine u64 in C layout, the prelude's `struct sucl_chunk`.
unsafe impl DeviceRepr for ChunkArg {}

/// The prelude's `sucl_extent`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ExtentArg {
    e: [u64; 3],
}
// SAFETY: three u64 in C layout, the prelude's `struct sucl_extent`.
unsafe impl DeviceRepr for ExtentArg {}

fn slab(len: usize, parts: usize, i: usize) -> (usize, usize) {
    (i * len / parts, (i + 1) * len / parts)
}

fn fail(e: impl std::fmt::Display) -> GraphError {
    GraphError::InvalidArgument(e.to_string())
}

/// The hand-written versions' kernels: the same source and options, compiled and launched by hand.
struct Hand {
    queue: Queue,
    jacobi: CudaFunction,
    vel: CudaFunction,
    pos: CudaFunction,
}

impl Hand {
    fn new(dev: &Device, src: &CudaSource) -> Result<Hand, GraphError> {
        let opts = CompileOptions { options: src.options().to_vec(), ..Default::default() };
        let ptx = compile_ptx_with_opts(src.full_text(), opts).map_err(|e| fail(format!("{e:?}")))?;
        let m = dev.context().load_module(ptx).map_err(|e| fail(format!("{e:?}")))?;
        let f = |n: &str| m.load_function(n).map_err(|e| fail(format!("{e:?}")));
        Ok(Hand { queue: dev.queue()?, jacobi: f("jacobi")?, vel: f("nbody_vel")?, pos: f("nbody_pos")? })
    }

    fn cfg(items: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (items.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }
}

fn chunk(offset: [usize; 3], range: [usize; 3], global: [usize; 3]) -> ChunkArg {
    let w = |a: [usize; 3]| a.map(|x| x as u64);
    ChunkArg { offset: w(offset), range: w(range), global: w(global) }
}

fn jacobi_init(n: usize) -> Vec<f32> {
    (0..n * n).map(|i| ((i * 2654435761usize) % 1000) as f32 * 0.001).collect()
}

fn nbody_init(n: usize) -> Vec<f64> {
    (0..n * 3).map(|i| ((i * 7919) % 1009) as f64 / 10.0).collect()
}

/// Hand-written Jacobi: whole-grid device buffers per rank, this rank's rows plus one halo row
/// each side exchanged per step.
struct JacobiHand {
    n: usize,
    lo: usize,
    hi: usize,
    u: sucl_runtime::cuda::Buffer<f32>,
    v: sucl_runtime::cuda::Buffer<f32>,
    /// This rank's first and last row, copied out for sending.
    edge: sucl_runtime::cuda::Buffer<f32>,
}

impl JacobiHand {
    fn new(comm: &Communicator, h: &Hand, n: usize) -> Result<Self, GraphError> {
        let (lo, hi) = slab(n, comm.size(), comm.rank());
        let init = jacobi_init(n);
        Ok(JacobiHand { n, lo, hi, u: h.queue.upload(&init)?, v: h.queue.upload(&init)?, edge: h.queue.alloc::<f32>(2 * n)? })
    }

    fn exchange(&mut self, comm: &Communicator, h: &Hand) -> Result<(), GraphError> {
        let (r, p, n) = (comm.rank(), comm.size(), self.n);
        if p == 1 {
            return Ok(());
        }
        let s = h.queue.stream();
        let (first, last) = (self.lo * n, (self.hi - 1) * n);
        s.memcpy_dtod(
            &self.u.cuda_slice().expect("grid").slice(first..first + n),
            &mut self.edge.cuda_slice_mut().expect("edge").slice_mut(0..n),
        )
        .map_err(|e| fail(format!("{e:?}")))?;
        s.memcpy_dtod(
            &self.u.cuda_slice().expect("grid").slice(last..last + n),
            &mut self.edge.cuda_slice_mut().expect("edge").slice_mut(n..2 * n),
        )
        .map_err(|e| fail(format!("{e:?}")))?;
        // Downwards: my last row to r+1, r-1's last row into my upper halo.
        let up_halo = (self.lo.max(1) - 1) * n;
        let down_halo = self.hi.min(n - 1) * n;
        match (r > 0, r + 1 < p) {
            (true, true) => {
                comm.sendrecv(&self.edge.slice(n..2 * n)?, r + 1, &mut self.u.slice_mut(up_halo..up_halo + n)?, r - 1, 1)?;
            }
            (false, true) => comm.send(&self.edge.slice(n..2 * n)?, r + 1, 1)?,
            (true, false) => {
                comm.recv(&mut self.u.slice_mut(up_halo..up_halo + n)?, r - 1, 1)?;
            }
            (false, false) => {}
        }
        // Upwards: my first row to r-1, r+1's first row into my lower halo.
        match (r + 1 < p, r > 0) {
            (true, true) => {
                comm.sendrecv(&self.edge.slice(0..n)?, r - 1, &mut self.u.slice_mut(down_halo..down_halo + n)?, r + 1, 2)?;
            }
            (false, true) => comm.send(&self.edge.slice(0..n)?, r - 1, 2)?,
            (true, false) => {
                comm.recv(&mut self.u.slice_mut(down_halo..down_halo + n)?, r + 1, 2)?;
            }
            (false, false) => {}
        }
        Ok(())
    }

    fn steps(&mut self, comm: &Communicator, h: &Hand, steps: usize) -> Result<(), GraphError> {
        let n = self.n;
        let ext = ExtentArg { e: [n as u64, n as u64, 1] };
        let c = chunk([self.lo, 0, 0], [self.hi - self.lo, n, 1], [n, n, 1]);
        for _ in 0..steps {
            self.exchange(comm, h)?;
            let mut l = h.queue.stream().launch_builder(&h.jacobi);
            l.arg(&c).arg(self.u.cuda_slice().expect("grid")).arg(&ext).arg(self.v.cuda_slice_mut().expect("grid")).arg(&ext);
            // SAFETY: jacobi's parameters (chunk, u, extent, v, extent); the chunk's rows and
            // their neighbours lie in the n×n buffers.
            unsafe { l.launch(Hand::cfg((self.hi - self.lo) * n)) }.map_err(|e| fail(format!("{e:?}")))?;
            std::mem::swap(&mut self.u, &mut self.v);
        }
        comm.synchronize(&h.queue)?;
        Ok(comm.barrier()?)
    }

    fn rows(&self) -> Result<Vec<f32>, GraphError> {
        Ok(self.u.to_vec()?[self.lo * self.n..self.hi * self.n].to_vec())
    }
}

/// Hand-written N-body: every rank holds all positions, updates its slab, all-gathers.
struct NbodyHand {
    n: usize,
    lo: usize,
    hi: usize,
    pos: sucl_runtime::cuda::Buffer<f64>,
    vel: sucl_runtime::cuda::Buffer<f64>,
}

impl NbodyHand {
    fn new(comm: &Communicator, h: &Hand, n: usize) -> Result<Self, GraphError> {
        let (lo, hi) = slab(n, comm.size(), comm.rank());
        Ok(NbodyHand { n, lo, hi, pos: h.queue.upload(&nbody_init(n))?, vel: h.queue.alloc::<f64>(3 * n)? })
    }

    fn steps(&mut self, comm: &Communicator, h: &Hand, steps: usize) -> Result<(), GraphError> {
        let n = self.n;
        let ext = ExtentArg { e: [n as u64, 3, 1] };
        let c = chunk([self.lo, 0, 0], [self.hi - self.lo, 1, 1], [n, 1, 1]);
        for _ in 0..steps {
            if comm.size() > 1 {
                comm.all_gather_in_place(&mut self.pos)?;
            }
            let mut l = h.queue.stream().launch_builder(&h.vel);
            l.arg(&c).arg(self.pos.cuda_slice().expect("pos")).arg(&ext).arg(self.vel.cuda_slice_mut().expect("vel")).arg(&ext).arg(&DT);
            // SAFETY: nbody_vel's parameters; the chunk's bodies lie in both n×3 buffers.
            unsafe { l.launch(Hand::cfg(self.hi - self.lo)) }.map_err(|e| fail(format!("{e:?}")))?;
            let mut l = h.queue.stream().launch_builder(&h.pos);
            l.arg(&c).arg(self.pos.cuda_slice_mut().expect("pos")).arg(&ext).arg(self.vel.cuda_slice().expect("vel")).arg(&ext).arg(&DT);
            // SAFETY: nbody_pos's parameters, as above.
            unsafe { l.launch(Hand::cfg(self.hi - self.lo)) }.map_err(|e| fail(format!("{e:?}")))?;
        }
        comm.synchronize(&h.queue)?;
        Ok(comm.barrier()?)
    }

    fn rows(&self) -> Result<Vec<f64>, GraphError> {
        Ok(self.pos.to_vec()?[3 * self.lo..3 * self.hi].to_vec())
    }
}

fn jacobi_graph(
    q: &mut DistrQueue<'_>,
    src: &CudaSource,
    u: &mut Buffer<f32, 2>,
    v: &mut Buffer<f32, 2>,
    steps: usize,
) -> Result<(), GraphError> {
    let n = u.extent()[0];
    for _ in 0..steps {
        q.submit(|cgh| {
            cgh.read(u, neighborhood(&[1, 1]));
            cgh.discard_write(v, one_to_one());
            // SAFETY: jacobi declares (chunk, u, extent, v, extent), both f32, and reads the
            // four neighbours of the chunk's cells only.
            unsafe { cgh.parallel_for_cuda([n, n], src, "jacobi", &[]) }
        })?;
        std::mem::swap(u, v);
    }
    q.sync()
}

fn nbody_graph(q: &mut DistrQueue<'_>, src: &CudaSource, pos: Buffer<f64, 2>, vel: Buffer<f64, 2>, steps: usize) -> Result<(), GraphError> {
    let n = pos.extent()[0];
    for _ in 0..steps {
        q.submit(|cgh| {
            cgh.read(&pos, all());
            cgh.read_write(&vel, slice(1));
            // SAFETY: nbody_vel declares (chunk, p, extent, v, extent, dt), f64.
            unsafe { cgh.parallel_for_cuda([n], src, "nbody_vel", &[KernelArg::F64(DT)]) }
        })?;
        q.submit(|cgh| {
            cgh.read_write(&pos, slice(1));
            cgh.read(&vel, slice(1));
            // SAFETY: nbody_pos declares (chunk, p, extent, v, extent, dt), f64.
            unsafe { cgh.parallel_for_cuda([n], src, "nbody_pos", &[KernelArg::F64(DT)]) }
        })?;
    }
    q.sync()
}

/// Cells of this rank's slab that differ, summed over ranks.
fn wrong<T: PartialEq>(comm: &Communicator, a: &[T], b: &[T]) -> Result<u64, GraphError> {
    let mut w = [a.iter().zip(b).filter(|(x, y)| x != y).count() as u64 + a.len().abs_diff(b.len()) as u64];
    comm.all_reduce_in_place(&mut w, ReduceOp::Sum)?;
    Ok(w[0])
}

fn main() {
    let args = Args::from_env(HELP);
    let program = args.positional(0).unwrap_or("").to_string();
    if !["jacobi", "nbody"].contains(&program.as_str()) {
        args.fail(format!("want `jacobi` or `nbody`, got {program:?}"));
    }
    let default_size = if program == "nbody" { 32768 } else { 8192 };
    let (n, steps, rounds) =
        (args.num("--size", default_size), args.num("--steps", if program == "nbody" { 5 } else { 50 }), args.num("--rounds", 3));
    if n < 3 || steps == 0 {
        args.fail(format!("--size (at least 3) and --steps (at least 1) must be positive, got {n} and {steps}"));
    }
    if let Err(e) = run(&program, n, steps, rounds, args.flag("--verbose")) {
        eprintln!("graph_gpu_step_bench: {e}");
        std::process::exit(1);
    }
}

fn run(program: &str, n: usize, steps: usize, rounds: usize, verbose: bool) -> Result<(), GraphError> {
    let comm = sucl_runtime::init()?;
    if !n.is_multiple_of(comm.size()) {
        return Err(fail(format!("--size {n} must divide among {} ranks", comm.size())));
    }
    let dev = comm.cuda_device()?;
    let mut q = DistrQueue::on_device(&comm, &dev)?;
    let transport = q.device_transport().map_or("none", |t| t.name());
    if comm.size() > 1 {
        // The hand-written version's device point-to-point needs the device side set up.
        comm.attach_device(&dev)?;
    }
    let src = CudaSource::with_options(SRC, &["--fmad=false"]);
    let hand = Hand::new(&dev, &src)?;
    let (mut best_graph, mut best_hand) = (f64::INFINITY, f64::INFINITY);
    let time = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> Result<f64, GraphError> {
        comm.barrier()?;
        let t = Instant::now();
        f()?;
        let mut v = [t.elapsed().as_secs_f64() / steps as f64];
        comm.all_reduce_in_place(&mut v, ReduceOp::Max)?;
        Ok(v[0])
    };
    let mut round = |r: usize, graph: &mut dyn FnMut() -> Result<(), GraphError>, by_hand: &mut dyn FnMut() -> Result<(), GraphError>| {
        let (tg, th) = if r.is_multiple_of(2) {
            let tg = time(graph)?;
            (tg, time(by_hand)?)
        } else {
            let th = time(by_hand)?;
            (time(graph)?, th)
        };
        if verbose && comm.rank() == 0 {
            eprintln!("round {r}: graph {:.3} ms/step, hand {:.3} ms/step{}", tg * 1e3, th * 1e3, if r == 0 { " (warm-up)" } else { "" });
        }
        if r > 0 {
            (best_graph, best_hand) = (best_graph.min(tg), best_hand.min(th));
        }
        Ok::<(), GraphError>(())
    };
    let wrong_cells = match program {
        "jacobi" => {
            let (mut u, mut v) = (q.buffer_from([n, n], jacobi_init(n))?, q.buffer_from([n, n], jacobi_init(n))?);
            let mut h = JacobiHand::new(&comm, &hand, n)?;
            for r in 0..=rounds {
                round(r, &mut || jacobi_graph(&mut q, &src, &mut u, &mut v, steps), &mut || h.steps(&comm, &hand, steps))?;
            }
            let (lo, hi) = slab(n, comm.size(), comm.rank());
            // A fence is a task like any other: every rank must submit the same one (a region
            // that differs per rank makes each rank push to the others what it thinks they
            // fence, and no one receives). Fence the whole grid, keep this rank's rows.
            let all = q.fence_all(&u)?;
            let mine = all[lo * n..hi * n].to_vec();
            wrong(&comm, &mine, &h.rows()?)?
        }
        "nbody" => {
            let pos = q.buffer_from([n, 3], nbody_init(n))?;
            let vel = q.buffer_from([n, 3], vec![0.0f64; 3 * n])?;
            let mut h = NbodyHand::new(&comm, &hand, n)?;
            for r in 0..=rounds {
                round(r, &mut || nbody_graph(&mut q, &src, pos, vel, steps), &mut || h.steps(&comm, &hand, steps))?;
            }
            let (lo, hi) = slab(n, comm.size(), comm.rank());
            let all = q.fence_all(&pos)?;
            let mine = all[3 * lo..3 * hi].to_vec();
            wrong(&comm, &mine, &h.rows()?)?
        }
        other => return Err(fail(format!("want `jacobi` or `nbody`, got {other:?}"))),
    };
    if comm.rank() == 0 {
        println!(
            "{{\"bench\":\"graph_gpu\",\"program\":\"{program}\",\"ranks\":{},\"gpu\":\"{}\",\"transport\":\"{transport}\",\"hand_backend\":\"{}\",\"size\":{n},\"steps\":{steps},\"rounds\":{rounds},\"graph_ms_per_step\":{:.4},\"hand_ms_per_step\":{:.4},\"graph_steps_per_s\":{:.2},\"hand_steps_per_s\":{:.2},\"ratio\":{:.3},\"wrong\":{wrong_cells}}}",
            comm.size(),
            dev.name(),
            if comm.size() > 1 { comm.device_backends().join("+") } else { "local".into() },
            best_graph * 1e3,
            best_hand * 1e3,
            1.0 / best_graph,
            1.0 / best_hand,
            best_hand / best_graph,
        );
    }
    if wrong_cells != 0 {
        return Err(fail(format!("rank {}: {wrong_cells} cells differ between the graph and the hand-written version", comm.rank())));
    }
    Ok(())
}

const HELP: &str = "Usage: graph_gpu_step_bench jacobi|nbody [--size N] [--steps S] [--rounds R] [--verbose]

Step rates on GPU ranks: a 2D Jacobi stencil (f32) and a direct N-body (f64) written with the
task graph (DistrQueue::on_device, kernels by NVRTC) against the same algorithm written by
hand with sucl calls on device buffers (the same CUDA kernels, launched by hand; halo rows by
device send/recv/sendrecv, positions by a device all_gather), side by side in one run.

sucl run -n 2 -- target/release/examples/graph_gpu_step_bench jacobi --size 8192 --steps 50 --rounds 3
sucl run -n 2 -- target/release/examples/graph_gpu_step_bench nbody --size 32768 --steps 5 --rounds 3

Two ranks on one GPU need the communicator's device-buffer traffic staged (NCCL refuses two ranks on
one GPU): SUCL_CONFIG naming a file with `[platforms.cuda] backends = [\"staged\"]`.

Time per step = wall time of `steps` steps ending with a device synchronize and a barrier,
max over ranks; one untimed warm-up round, then the best of `rounds` rounds of each version
(rounds alternate which goes first). Both versions then hold the same number of steps:
#wrong counts the cells where their results differ (all ranks' slabs), which must be 0.
";
