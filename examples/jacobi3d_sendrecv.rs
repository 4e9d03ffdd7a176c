//! Jacobi 3D (7-point, f32) on GPU ranks, halo planes exchanged with device send/recv: the
//! same stencil `remote_bench --jacobi-weak --jacobi-f32` runs over remote GPU daemons, written
//! with sucl's `Communicator` on CUDA buffers (one GPU per rank), to compare their step rates.
//! See HELP (`--help`).

use std::process::ExitCode;
use std::time::Instant;
use sucl::cuda::{Buffer, Device, Kernel, Queue};
use sucl::remote::kernels::cuda_src::JACOBI3D_F32;
use sucl::{Communicator, ReduceOp};
use sucl_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};

const HELP: &str = "\
jacobi3d_sendrecv: weak-scaling Jacobi 3D (7-point, f32; the CUDA kernel remote_bench runs on
remote GPU daemons, sucl_remote::kernels::cuda_src::JACOBI3D_F32) on ranks of one GPU each
(GPU = local rank % GPUs). Every rank holds N x N x NZ cells (z-slabs, global plane order by
rank) plus one halo plane below and above; every step it runs the kernel, then exchanges one
N x N plane each way with each neighbour through Communicator::sendrecv on device buffers.
Cell (x, y, z) starts at (7x + 13y + 31z) mod 97, as in remote_bench.

Timing as remote_bench: one untimed warm-up (a kernel launch and a halo exchange that change
nothing), then each round times STEPS steps from the first launch to the queue synchronized,
max over ranks; per step = that / STEPS. Afterwards every rank runs all ROUNDS x STEPS steps
of the whole domain (all ranks' planes) on its own GPU with the same kernel and no
communication, and compares its slab bit for bit: #wrong counts the cells that differ, over
all ranks (must be 0; --no-check skips this).

Prints one JSON line (rank 0): ranks, gpu, backends, n, nz, steps, rounds, step_ms (best
round), first_step_ms (first round), step_ms_rounds, wrong.

Usage: jacobi3d_sendrecv [--n N] [--nz NZ] [--steps STEPS] [--rounds ROUNDS] [--no-check]
  --n N           cells along x and y (default 512)
  --nz NZ         interior planes per rank (default 512)
  --steps STEPS   steps per timed round (default 20)
  --rounds R      timed rounds (default 3)
  --no-check      skip the whole-domain reference

Example:
  sucl run -n 4 -- target/release/examples/jacobi3d_sendrecv --n 512 --nz 512 --steps 20";

/// What to run.
struct Opts {
    n: usize,
    nz: usize,
    steps: usize,
    rounds: usize,
    check: bool,
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("jacobi3d_sendrecv: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jacobi3d_sendrecv: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The options, or `None` when help was asked for.
fn parse_args() -> Result<Option<Opts>, String> {
    let mut o = Opts { n: 512, nz: 512, steps: 20, rounds: 3, check: true };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            let v = args.next().ok_or(format!("{name} needs a number"))?;
            v.parse().map_err(|_| format!("{name} `{v}` is not a number"))
        };
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--n" => o.n = num("--n")?,
            "--nz" => o.nz = num("--nz")?,
            "--steps" => o.steps = num("--steps")?,
            "--rounds" => o.rounds = num("--rounds")?,
            "--no-check" => o.check = false,
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if o.n < 3 || o.nz == 0 || o.steps == 0 || o.rounds == 0 {
        return Err(format!("want --n ≥ 3 and --nz, --steps, --rounds ≥ 1, got {}, {}, {}, {}", o.n, o.nz, o.steps, o.rounds));
    }
    Ok(Some(o))
}

/// Global planes `z` of the initial domain (`n`×`n` cells each).
fn planes(n: usize, z: std::ops::Range<usize>) -> Vec<f32> {
    let base: Vec<usize> = (0..n * n).map(|i| (i % n) * 7 + (i / n) * 13).collect();
    let mut v = Vec::with_capacity(z.len() * n * n);
    for z in z {
        v.extend(base.iter().map(|b| ((b + z * 31) % 97) as f32));
    }
    v
}

/// The stencil kernel on one queue.
struct Stencil {
    queue: Queue,
    kernel: Kernel,
    n: usize,
}

impl Stencil {
    /// One step: `out`'s `nz` interior planes from `input` (both `nz + 2` planes).
    fn step(&self, out: &mut Buffer<f32>, input: &Buffer<f32>, nz: usize) -> Result<(), String> {
        let (nx, planes) = (self.n as u64, nz as u64);
        let cells = self.n * self.n * nz;
        let cfg = LaunchConfig { grid_dim: (cells.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (o, i) = (out.cuda_slice_mut().ok_or("empty buffer")?, input.cuda_slice().ok_or("empty buffer")?);
        let mut l = self.queue.stream().launch_builder(self.kernel.function());
        l.arg(o).arg(i).arg(&nx).arg(&nx).arg(&planes);
        // SAFETY: jacobi3d_f32(float* out, const float* in, u64 nx, u64 ny, u64 nz) over
        // nx·ny·nz threads; both buffers hold nz + 2 planes of nx·ny floats (checked by the caller).
        unsafe { l.launch(cfg) }.map(|_| ()).map_err(|e| format!("launching jacobi3d_f32: {e:?}"))
    }
}

/// One rank's slab: `nz` interior planes and a halo plane each side, in two buffers.
struct Slab {
    nz: usize,
    cur: Buffer<f32>,
    next: Buffer<f32>,
    /// This rank's bottom and top interior planes, copied out for sending.
    edge: Buffer<f32>,
}

impl Slab {
    /// Copies `next`'s outermost interior planes into `edge`, then trades them with the
    /// neighbours' into `next`'s halo planes: up with tag 1, down with tag 2.
    fn exchange(&mut self, comm: &Communicator, s: &Stencil) -> Result<(), sucl::Error> {
        let (r, p, plane) = (comm.rank(), comm.size(), s.n * s.n);
        if p == 1 {
            return Ok(());
        }
        let stream = s.queue.stream();
        let cuda = |e| sucl::Error::BackendUnavailable { rank: r, backend: "cuda".into(), why: format!("copying a plane: {e:?}") };
        let next = self.next.cuda_slice().expect("non-empty");
        let edge = self.edge.cuda_slice_mut().expect("non-empty");
        stream.memcpy_dtod(&next.slice(plane..2 * plane), &mut edge.slice_mut(0..plane)).map_err(cuda)?;
        stream.memcpy_dtod(&next.slice(self.nz * plane..(self.nz + 1) * plane), &mut edge.slice_mut(plane..2 * plane)).map_err(cuda)?;
        let (bottom_halo, top_halo) = (0..plane, (self.nz + 1) * plane..(self.nz + 2) * plane);
        // Up: my top interior plane to r+1, r-1's into my bottom halo.
        match (r > 0, r + 1 < p) {
            (true, true) => {
                comm.sendrecv(&self.edge.slice(plane..2 * plane)?, r + 1, &mut self.next.slice_mut(bottom_halo)?, r - 1, 1)?;
            }
            (false, true) => {
                comm.send(&self.edge.slice(plane..2 * plane)?, r + 1, 1)?;
            }
            (true, false) => {
                comm.recv(&mut self.next.slice_mut(bottom_halo)?, r - 1, 1)?;
            }
            (false, false) => {}
        }
        // Down: my bottom interior plane to r-1, r+1's into my top halo.
        match (r + 1 < p, r > 0) {
            (true, true) => {
                comm.sendrecv(&self.edge.slice(0..plane)?, r - 1, &mut self.next.slice_mut(top_halo)?, r + 1, 2)?;
            }
            (false, true) => {
                comm.send(&self.edge.slice(0..plane)?, r - 1, 2)?;
            }
            (true, false) => {
                comm.recv(&mut self.next.slice_mut(top_halo)?, r + 1, 2)?;
            }
            (false, false) => {}
        }
        Ok(())
    }

    /// `steps` steps: kernel into `next`, halos of `next`, swap.
    fn steps(&mut self, comm: &Communicator, s: &Stencil, steps: usize) -> Result<(), String> {
        for _ in 0..steps {
            s.step(&mut self.next, &self.cur, self.nz)?;
            self.exchange(comm, s).map_err(|e| e.to_string())?;
            std::mem::swap(&mut self.cur, &mut self.next);
        }
        Ok(())
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let comm = sucl::init().map_err(|e| e.to_string())?;
    let (rank, size, plane) = (comm.rank(), comm.size(), o.n * o.n);
    let dev: Device = comm.cuda_device().map_err(|e| format!("rank {rank}: no usable GPU: {e}"))?;
    let on_dev = |e: sucl::Error| format!("rank {rank} on {}: {e}", dev.name());
    if size > 1 {
        // Device point-to-point needs the communicator's device side set up.
        comm.attach_device(&dev).map_err(on_dev)?;
    }
    let queue = dev.queue().map_err(on_dev)?;
    let kernel = Kernel::compile(&dev, JACOBI3D_F32, "jacobi3d_f32").map_err(on_dev)?;
    let st = Stencil { queue, kernel, n: o.n };
    // Rank k holds global planes k·nz ..= (k+1)·nz + 1: its interior and two halos.
    let block = planes(o.n, rank * o.nz..(rank + 1) * o.nz + 2);
    let mut slab = Slab {
        nz: o.nz,
        cur: st.queue.upload(&block).map_err(on_dev)?,
        next: st.queue.upload(&block).map_err(on_dev)?,
        edge: st.queue.alloc::<f32>(2 * plane).map_err(on_dev)?,
    };
    drop(block);
    // Warm-up: the first step's kernel and an exchange of both buffers' halos, which already
    // hold the neighbours' planes: nothing changes, and the step's paths are set up.
    st.step(&mut slab.next, &slab.cur, o.nz)?;
    for _ in 0..2 {
        slab.exchange(&comm, &st).map_err(on_dev)?;
        std::mem::swap(&mut slab.cur, &mut slab.next);
    }
    comm.synchronize(&st.queue).map_err(on_dev)?;
    let mut per_round = Vec::with_capacity(o.rounds);
    for _ in 0..o.rounds {
        comm.barrier().map_err(on_dev)?;
        let t = Instant::now();
        slab.steps(&comm, &st, o.steps)?;
        comm.synchronize(&st.queue).map_err(on_dev)?;
        let mut dt = [t.elapsed().as_secs_f64() / o.steps as f64];
        comm.all_reduce_in_place(&mut dt, ReduceOp::Max).map_err(on_dev)?;
        per_round.push(dt[0] * 1e3);
    }
    let wrong = if o.check { wrong_cells(&comm, &st, &slab, o)? } else { -1 };
    if rank == 0 {
        let best = per_round.iter().cloned().fold(f64::INFINITY, f64::min);
        let rounds: Vec<String> = per_round.iter().map(|t| format!("{t:.4}")).collect();
        println!(
            "{{\"bench\":\"jacobi3d_sendrecv\",\"ranks\":{size},\"gpu\":\"{}\",\"backends\":\"{}\",\"n\":{},\"nz\":{},\"steps\":{},\"rounds\":{},\"step_ms\":{best:.4},\"first_step_ms\":{:.4},\"step_ms_rounds\":[{}],\"wrong\":{wrong}}}",
            dev.name(),
            if size > 1 { comm.device_backends().join("+") } else { "local".into() },
            o.n,
            o.nz,
            o.steps,
            o.rounds,
            per_round[0],
            rounds.join(",")
        );
    }
    if wrong != 0 && o.check {
        return Err(format!("rank {rank}: {wrong} cells differ from the whole-domain reference"));
    }
    Ok(())
}

/// Cells of every rank's slab that differ from the whole domain stepped as often on this
/// rank's GPU without communication (summed over ranks).
fn wrong_cells(comm: &Communicator, st: &Stencil, slab: &Slab, o: &Opts) -> Result<i64, String> {
    let (rank, plane, total) = (comm.rank(), o.n * o.n, o.nz * comm.size());
    let err = |e: sucl::Error| format!("rank {rank}, reference: {e}");
    let whole = planes(o.n, 0..total + 2);
    let (mut a, mut b) = (st.queue.upload(&whole).map_err(err)?, st.queue.upload(&whole).map_err(err)?);
    drop(whole);
    for _ in 0..o.rounds * o.steps {
        st.step(&mut b, &a, total)?;
        std::mem::swap(&mut a, &mut b);
    }
    drop(b);
    let mine = (1 + rank * o.nz) * plane..(1 + (rank + 1) * o.nz) * plane;
    st.queue.synchronize().map_err(err)?; // bounded; the copy below then finds the stream idle
    let want = st.queue.stream().clone_dtoh(&a.cuda_slice().expect("non-empty").slice(mine)).map_err(|e| format!("rank {rank}: {e:?}"))?;
    let got = slab.cur.to_vec().map_err(err)?;
    let differ = got[plane..(o.nz + 1) * plane].iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    let mut w = [differ as i64];
    comm.all_reduce_in_place(&mut w, ReduceOp::Sum).map_err(err)?;
    Ok(w[0])
}
