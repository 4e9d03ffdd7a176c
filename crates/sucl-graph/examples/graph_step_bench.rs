// Step rates of a Jacobi stencil and an N-body, task graph against hand-written sucl calls:
// see HELP at the end (`--help`).

#[path = "common/args.rs"]
mod args;

use args::Args;
use std::time::Instant;
use sucl_graph::{mappers::*, Buffer, DistrQueue, GraphError, QueueOptions};
use sucl_runtime::{Communicator, ReduceOp};

/// One Jacobi row: boundary columns copied, interior the four-point average.
#[inline]
fn jacobi_row(up: &[f32], mid: &[f32], down: &[f32], out: &mut [f32]) {
    let n = mid.len();
    // Equal lengths up front, so the loop runs without bounds checks (and vectorises).
    let (up, down, out) = (&up[..n], &down[..n], &mut out[..n]);
    out[0] = mid[0];
    out[n - 1] = mid[n - 1];
    for j in 1..n - 1 {
        out[j] = 0.25 * (up[j] + down[j] + mid[j - 1] + mid[j + 1]);
    }
}

fn jacobi_init(n: usize) -> Vec<f32> {
    (0..n * n).map(|i| ((i * 2654435761usize) % 1000) as f32 * 0.001).collect()
}

fn bits_f32(v: &[f32]) -> u64 {
    v.iter().fold(0u64, |a, x| a.wrapping_add(x.to_bits() as u64))
}

fn bits_f64(v: &[f64]) -> u64 {
    v.iter().fold(0u64, |a, x| a.wrapping_add(x.to_bits()))
}

fn slab(len: usize, parts: usize, i: usize) -> (usize, usize) {
    (i * len / parts, (i + 1) * len / parts)
}

fn max_over_ranks(comm: &Communicator, secs: f64) -> f64 {
    let mut v = [secs];
    comm.all_reduce_in_place(&mut v, ReduceOp::Max).expect("all_reduce of the time");
    v[0]
}

struct JacobiGraph {
    u: Buffer<f32, 2>,
    v: Buffer<f32, 2>,
}

impl JacobiGraph {
    fn steps(&mut self, q: &mut DistrQueue<'_>, n: usize, steps: usize) -> Result<(), GraphError> {
        for _ in 0..steps {
            q.submit(|cgh| {
                let src = cgh.read(&self.u, neighborhood(&[1, 1]));
                let dst = cgh.discard_write(&self.v, one_to_one());
                cgh.parallel_for([n, n], move |c, k| {
                    let (src, mut dst) = (k.read(&src), k.write(&dst));
                    assert!(c.offset[1] == 0 && c.range[1] == n, "rows are split, not columns");
                    for i in c.offset[0]..c.offset[0] + c.range[0] {
                        if i == 0 || i == n - 1 {
                            dst.slice_mut([i, 0], n).copy_from_slice(src.slice([i, 0], n));
                        } else {
                            jacobi_row(src.slice([i - 1, 0], n), src.slice([i, 0], n), src.slice([i + 1, 0], n), dst.slice_mut([i, 0], n));
                        }
                    }
                })
            })?;
            std::mem::swap(&mut self.u, &mut self.v);
        }
        q.sync()
    }

    fn checksum(&self, q: &mut DistrQueue<'_>) -> Result<u64, GraphError> {
        let mut sum = [0u64];
        let u = self.u;
        let out = &mut sum;
        q.submit(|cgh| {
            let all_u = cgh.read(&u, all());
            cgh.master_task([1], move |_, k| out[0] = bits_f32(k.read(&all_u).as_slice()))
        })?;
        q.comm().broadcast(&mut sum, 0)?;
        Ok(sum[0])
    }
}

struct JacobiHand {
    lo: usize,
    hi: usize,
    cur: Vec<f32>,
    next: Vec<f32>,
}

impl JacobiHand {
    fn new(comm: &Communicator, n: usize) -> Self {
        let (lo, hi) = slab(n, comm.size(), comm.rank());
        let init = jacobi_init(n);
        // Local rows lo-1 ..= hi (halo rows at both ends, unused at the edges).
        let mut cur = vec![0.0f32; (hi - lo + 2) * n];
        cur[n..(hi - lo + 1) * n].copy_from_slice(&init[lo * n..hi * n]);
        JacobiHand { lo, hi, next: cur.clone(), cur }
    }

    fn steps(&mut self, comm: &Communicator, n: usize, steps: usize) -> sucl_runtime::Result<()> {
        let (r, p, rows) = (comm.rank(), comm.size(), self.hi - self.lo);
        for _ in 0..steps {
            let (top, rest) = self.cur.split_at_mut(n);
            let (inner, bottom) = rest.split_at_mut(rows * n);
            comm.nonblocking(|s| {
                if r > 0 {
                    s.irecv(top, r - 1, 1)?;
                    s.isend(&inner[..n], r - 1, 2)?;
                }
                if r + 1 < p {
                    s.irecv(bottom, r + 1, 2)?;
                    s.isend(&inner[(rows - 1) * n..], r + 1, 1)?;
                }
                s.wait_all()
            })?;
            for li in 1..=rows {
                let i = self.lo + li - 1;
                let (src, out) = (&self.cur, &mut self.next[li * n..(li + 1) * n]);
                if i == 0 || i == n - 1 {
                    out.copy_from_slice(&src[li * n..(li + 1) * n]);
                } else {
                    jacobi_row(&src[(li - 1) * n..li * n], &src[li * n..(li + 1) * n], &src[(li + 1) * n..(li + 2) * n], out);
                }
            }
            std::mem::swap(&mut self.cur, &mut self.next);
        }
        comm.barrier()
    }

    fn checksum(&self, comm: &Communicator, n: usize) -> sucl_runtime::Result<u64> {
        let mut v = [bits_f32(&self.cur[n..(self.hi - self.lo + 1) * n])];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(v[0])
    }
}

const DT: f64 = 0.01;

/// The N-body force on body `me` from all `pos` (the same order of operations in both versions).
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

fn nbody_init(n: usize) -> Vec<f64> {
    (0..n * 3).map(|i| ((i * 7919) % 1009) as f64 / 10.0).collect()
}

struct NbodyGraph {
    pos: Buffer<f64, 2>,
    vel: Buffer<f64, 2>,
}

impl NbodyGraph {
    fn steps(&self, q: &mut DistrQueue<'_>, n: usize, steps: usize) -> Result<(), GraphError> {
        let (pos, vel) = (self.pos, self.vel);
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
                    let (lo, len) = (c.offset[0], c.range[0]);
                    for i in lo..lo + len {
                        let vi = v.slice([i, 0], 3);
                        let row = p.slice_mut([i, 0], 3);
                        for a in 0..3 {
                            row[a] += vi[a] * DT;
                        }
                    }
                })
            })?;
        }
        q.sync()
    }

    fn checksum(&self, q: &mut DistrQueue<'_>) -> Result<u64, GraphError> {
        let mut sum = [0u64];
        let pos = self.pos;
        let out = &mut sum;
        q.submit(|cgh| {
            let all_p = cgh.read(&pos, all());
            cgh.master_task([1], move |_, k| out[0] = bits_f64(k.read(&all_p).as_slice()))
        })?;
        q.comm().broadcast(&mut sum, 0)?;
        Ok(sum[0])
    }
}

struct NbodyHand {
    lo: usize,
    all: Vec<f64>,
    mine: Vec<f64>,
    vel: Vec<f64>,
}

impl NbodyHand {
    fn new(comm: &Communicator, n: usize) -> Self {
        let (lo, hi) = slab(n, comm.size(), comm.rank());
        let init = nbody_init(n);
        NbodyHand { lo, all: init.clone(), mine: init[3 * lo..3 * hi].to_vec(), vel: vec![0.0; 3 * (hi - lo)] }
    }

    fn steps(&mut self, comm: &Communicator, steps: usize) -> sucl_runtime::Result<()> {
        for _ in 0..steps {
            comm.all_gather(&self.mine, &mut self.all)?;
            for (k, v) in self.vel.chunks_exact_mut(3).enumerate() {
                let i = self.lo + k;
                let acc = accel(&self.all, [self.all[3 * i], self.all[3 * i + 1], self.all[3 * i + 2]]);
                for a in 0..3 {
                    v[a] += acc[a] * DT;
                }
            }
            for (p, v) in self.mine.iter_mut().zip(&self.vel) {
                *p += v * DT;
            }
        }
        comm.barrier()
    }

    fn checksum(&self, comm: &Communicator) -> sucl_runtime::Result<u64> {
        let mut v = [bits_f64(&self.mine)];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        Ok(v[0])
    }
}

fn main() {
    let args = Args::from_env(HELP);
    let program = args.positional(0).unwrap_or("").to_string();
    if !["jacobi", "nbody"].contains(&program.as_str()) {
        args.fail(format!("want `jacobi` or `nbody`, got {program:?}"));
    }
    let verbose = args.flag("--verbose");
    let (n, steps, rounds) = (args.num("--size", 4096), args.num("--steps", 10), args.num("--rounds", 3));
    if n < 3 || steps == 0 {
        args.fail(format!("--size (at least 3) and --steps (at least 1) must be positive, got {n} and {steps}"));
    }
    if let Err(e) = run(&program, n, steps, rounds, verbose) {
        eprintln!("graph_step_bench: {e}");
        std::process::exit(1);
    }
}

fn run(program: &str, n: usize, steps: usize, rounds: usize, verbose: bool) -> Result<(), GraphError> {
    let comm = sucl_runtime::init()?;
    let mut q = DistrQueue::with_options(&comm, QueueOptions { horizon_step: 4, threads: 1, dump_dir: None, discovery: true })?;
    let (mut best_graph, mut best_hand) = (f64::INFINITY, f64::INFINITY);
    // Rounds alternate which version goes first (the first after a barrier measures slower on
    // a busy machine); the best round of each counts.
    let mut round = |r: usize,
                     graph: &mut dyn FnMut() -> Result<(), GraphError>,
                     hand: &mut dyn FnMut() -> Result<(), GraphError>|
     -> Result<(), GraphError> {
        let time = |f: &mut dyn FnMut() -> Result<(), GraphError>| -> Result<f64, GraphError> {
            comm.barrier()?;
            let t = Instant::now();
            f()?;
            Ok(max_over_ranks(&comm, t.elapsed().as_secs_f64()) / steps as f64)
        };
        let (tg, th) = if r.is_multiple_of(2) {
            let tg = time(graph)?;
            (tg, time(hand)?)
        } else {
            let th = time(hand)?;
            (time(graph)?, th)
        };
        if verbose && comm.rank() == 0 {
            eprintln!("round {r}: graph {:.3} ms/step, hand {:.3} ms/step{}", tg * 1e3, th * 1e3, if r == 0 { " (warm-up)" } else { "" });
        }
        if r > 0 {
            (best_graph, best_hand) = (best_graph.min(tg), best_hand.min(th));
        }
        Ok(())
    };
    let (graph_sum, hand_sum);
    match program {
        "jacobi" => {
            let mut g = JacobiGraph { u: q.buffer_from([n, n], jacobi_init(n))?, v: q.buffer([n, n])? };
            let mut h = JacobiHand::new(&comm, n);
            for r in 0..=rounds {
                round(r, &mut || g.steps(&mut q, n, steps), &mut || Ok(h.steps(&comm, n, steps)?))?;
            }
            (graph_sum, hand_sum) = (g.checksum(&mut q)?, h.checksum(&comm, n)?);
        }
        "nbody" => {
            let g = NbodyGraph { pos: q.buffer_from([n, 3], nbody_init(n))?, vel: q.buffer_from([n, 3], vec![0.0; 3 * n])? };
            let mut h = NbodyHand::new(&comm, n);
            for r in 0..=rounds {
                round(r, &mut || g.steps(&mut q, n, steps), &mut || Ok(h.steps(&comm, steps)?))?;
            }
            (graph_sum, hand_sum) = (g.checksum(&mut q)?, h.checksum(&comm)?);
        }
        other => return Err(GraphError::InvalidArgument(format!("want `jacobi` or `nbody`, got {other:?}"))),
    }
    let wrong = usize::from(graph_sum != hand_sum);
    if comm.rank() == 0 {
        println!(
            "{{\"program\":\"{program}\",\"ranks\":{},\"size\":{n},\"steps\":{steps},\"rounds\":{rounds},\"graph_ms_per_step\":{:.3},\"hand_ms_per_step\":{:.3},\"graph_steps_per_s\":{:.3},\"hand_steps_per_s\":{:.3},\"ratio\":{:.3},\"wrong\":{wrong}}}",
            comm.size(),
            best_graph * 1e3,
            best_hand * 1e3,
            1.0 / best_graph,
            1.0 / best_hand,
            best_hand / best_graph,
        );
    }
    if wrong != 0 {
        return Err(GraphError::InvalidArgument(format!(
            "rank {}: graph checksum {graph_sum:#x} != hand-written {hand_sum:#x}",
            comm.rank()
        )));
    }
    Ok(())
}

const HELP: &str = "Usage: graph_step_bench jacobi|nbody [--size N] [--steps S] [--rounds R] [--verbose]

Step rates of a 2D Jacobi stencil (f32) and a direct N-body (f64) written with the task
graph (DistrQueue) against the same algorithm written by hand with sucl calls, side by side
in one run (rounds alternate graph / hand), every result checked: both must end bit-identical.

sucl run -n 4 -- target/release/examples/graph_step_bench jacobi --size 4096 --steps 10 --rounds 3
sucl run -n 4 -- target/release/examples/graph_step_bench nbody --size 4096 --steps 4 --rounds 3

Time per step = wall time of `steps` steps (ending with a barrier) / steps, max over ranks;
after one untimed warm-up round (first touch of the buffers), the best of `rounds` rounds
of each version is reported, and the ratio graph/hand of step rates.
Both versions split rows (bodies) in equal contiguous slabs and run one thread per rank.
";
