// Task-graph programs on host ranks, written with the DistrQueue API; rank 0 prints every
// result exactly, so runs on different rank counts can be compared byte for byte.
//
// `target/debug/sucl run -n 3 -- target/debug/examples/graph_programs`
//
// (Plain comments: tests/execution.rs includes this file as a module and runs `run()` in its
// own re-executed ranks, so the test never runs a stale example binary.)

use sucl_graph::{mappers::*, DistrQueue, GraphError, SplitHint};

const HELP: &str = "Usage: graph_programs (no arguments; start it on any number of ranks with `sucl run`)

Task-graph programs on host ranks, written with the DistrQueue API: 1D and 2D stencils, reads
of a whole buffer, master and collective host tasks, a matrix transpose, a direct N-body and the
Table 3 programs of collective pattern discovery (all-gather, gather-scatter, gather-broadcast,
all-to-all). Rank 0 prints every result exactly, one line per program, so runs on different
rank counts (and with SUCL_GRAPH_CPD=0 or 1) can be compared byte for byte.

Example:
  target/debug/sucl run -n 3 -- target/debug/examples/graph_programs

Settings (environment): SUCL_GRAPH_THREADS (worker threads per rank), SUCL_GRAPH_CPD (0: no
collective pattern discovery), SUCL_GRAPH_DUMP=dir (each rank writes its graphs as JSON).
";

fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            print!("{HELP}");
            return;
        }
        eprintln!("graph_programs: takes no arguments, got {arg:?} (--help for usage)");
        std::process::exit(2);
    }
    if let Err(e) = run() {
        eprintln!("graph_programs: {e}");
        std::process::exit(1);
    }
}

fn print<T: std::fmt::Debug>(comm: &sucl_runtime::Communicator, name: &str, v: &[T]) {
    if comm.rank() == 0 {
        let cells: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
        println!("{name}: {}", cells.join(" "));
    }
}

/// The name (with its colon) that starts each program's output line, in the order `run`
/// prints them (the tests pick the lines out by these).
pub const PROGRAMS: [&str; 15] = [
    "stencil:",
    "all:",
    "collective:",
    "master:",
    "stencil2d:",
    "transpose:",
    "nbody:",
    "allgather:",
    "gatherscatter:",
    "gatherbcast:",
    "alltoall:",
    "allgather-odd:",
    "gatherscatter-odd:",
    "gatherbcast-odd:",
    "alltoall-odd:",
];

pub fn run() -> Result<(), GraphError> {
    let comm = sucl_runtime::init()?;
    let mut q = DistrQueue::new(&comm)?;
    stencil_1d(&mut q)?;
    all_and_host_tasks(&mut q)?;
    stencil_2d(&mut q)?;
    transpose(&mut q)?;
    nbody(&mut q)?;
    table3::<24, 10>(&mut q, "")?;
    table3::<23, 11>(&mut q, "-odd")?;
    q.sync()?;
    Ok(())
}

/// A 1D three-point stencil, ping-ponging between two buffers (a halo exchange every step).
fn stencil_1d(q: &mut DistrQueue<'_>) -> Result<(), GraphError> {
    const N: usize = 32;
    let init: Vec<f64> = (0..N).map(|i| (i * i % 7) as f64).collect();
    let mut u = q.buffer_from::<f64, 1>([N], init)?;
    let mut v = q.buffer::<f64, 1>([N])?;
    for _ in 0..5 {
        q.submit(|cgh| {
            let src = cgh.read(&u, neighborhood(&[1]));
            let dst = cgh.discard_write(&v, one_to_one());
            cgh.parallel_for([N], move |c, k| {
                let (src, mut dst) = (k.read(&src), k.write(&dst));
                for i in c.offset[0]..c.offset[0] + c.range[0] {
                    let at = |j: usize| src.get([j.min(N - 1)]);
                    dst.set([i], (at(i.saturating_sub(1)) + at(i) + at(i + 1)) / 3.0);
                }
            })
        })?;
        std::mem::swap(&mut u, &mut v);
    }
    let r = q.fence_all(&u)?;
    print(q.comm(), "stencil", &r);
    Ok(())
}

/// Every rank reads all of a buffer written in slabs; a master task and a collective host task.
fn all_and_host_tasks(q: &mut DistrQueue<'_>) -> Result<(), GraphError> {
    let a = q.buffer::<f64, 1>([16])?;
    let s = q.buffer::<f64, 1>([16])?;
    q.submit(|cgh| {
        let a = cgh.discard_write(&a, one_to_one());
        cgh.parallel_for([16], move |c, k| {
            let mut a = k.write(&a);
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                a.set([i], (i * i) as f64 + 0.5);
            }
        })
    })?;
    q.submit(|cgh| {
        let all_a = cgh.read(&a, all());
        let s = cgh.discard_write(&s, one_to_one());
        cgh.parallel_for([16], move |c, k| {
            let (a, mut s) = (k.read(&all_a), k.write(&s));
            let total: f64 = a.as_slice().iter().sum();
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                s.set([i], total / (i + 1) as f64);
            }
        })
    })?;
    print(q.comm(), "all", &q.fence_all(&s)?);

    // The master rank produces; every rank updates its slab in place.
    let m = q.buffer::<f64, 1>([10])?;
    q.submit(|cgh| {
        let w = cgh.discard_write(&m, all());
        cgh.master_task([1], move |_, k| {
            let mut m = k.write(&w);
            for (i, x) in m.slice_mut([0], 10).iter_mut().enumerate() {
                *x = 7.0 * i as f64 - 3.25;
            }
        })
    })?;
    q.submit(|cgh| {
        let m = cgh.read_write(&m, one_to_one());
        cgh.parallel_for([10], move |c, k| {
            let mut m = k.write(&m);
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                let x = m.get([i]);
                m.set([i], x * 1.5);
            }
        })
    })?;
    // A collective host task sees the whole buffer on every rank and checks agreement.
    q.submit(|cgh| {
        let m = cgh.read(&m, all());
        cgh.collective_task(move |_, k| {
            let comm = k.comm().expect("a collective host task has the communicator");
            let sum: f64 = k.read(&m).slice([0], 10).iter().sum();
            let (mut lo, mut hi) = ([sum], [sum]);
            comm.all_reduce_in_place(&mut lo, sucl_runtime::ReduceOp::Min).unwrap();
            comm.all_reduce_in_place(&mut hi, sucl_runtime::ReduceOp::Max).unwrap();
            assert_eq!(lo, hi, "ranks disagree on the collective task's input");
            if comm.rank() == 0 {
                println!("collective: {sum:?}");
            }
        })
    })?;
    print(q.comm(), "master", &q.fence_all(&m)?);
    Ok(())
}

/// A 2D Jacobi stencil (with diagonals) on a 2D split.
fn stencil_2d(q: &mut DistrQueue<'_>) -> Result<(), GraphError> {
    const N: usize = 24;
    const M: usize = 17;
    let init: Vec<f32> = (0..N * M).map(|i| ((i * 37) % 11) as f32 * 0.25).collect();
    let mut u = q.buffer_from::<f32, 2>([N, M], init)?;
    let mut v = q.buffer::<f32, 2>([N, M])?;
    for _ in 0..4 {
        q.submit(|cgh| {
            let src = cgh.read(&u, neighborhood(&[1, 1]));
            let dst = cgh.discard_write(&v, one_to_one());
            cgh.split(SplitHint::Split2D);
            cgh.parallel_for([N, M], move |c, k| {
                let (src, mut dst) = (k.read(&src), k.write(&dst));
                for i in c.offset[0]..c.offset[0] + c.range[0] {
                    for j in c.offset[1]..c.offset[1] + c.range[1] {
                        let mut acc = 0.0f32;
                        for di in 0..3 {
                            for dj in 0..3 {
                                let (x, y) = ((i + di).saturating_sub(1).min(N - 1), (j + dj).saturating_sub(1).min(M - 1));
                                acc += src.get([x, y]) * if di == 1 && dj == 1 { 0.5 } else { 0.0625 };
                            }
                        }
                        dst.set([i, j], acc);
                    }
                }
            })
        })?;
        std::mem::swap(&mut u, &mut v);
    }
    print(q.comm(), "stencil2d", &q.fence_all(&u)?);
    Ok(())
}

/// t[i][j] = x[j][i] on a 2D split.
fn transpose(q: &mut DistrQueue<'_>) -> Result<(), GraphError> {
    let (rows, cols) = (6, 4);
    let x = q.buffer::<f64, 2>([rows, cols])?;
    let t = q.buffer::<f64, 2>([cols, rows])?;
    q.submit(|cgh| {
        let x = cgh.discard_write(&x, one_to_one());
        cgh.split(SplitHint::Split2D);
        cgh.parallel_for([rows, cols], move |c, k| {
            let mut x = k.write(&x);
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in c.offset[1]..c.offset[1] + c.range[1] {
                    x.set([i, j], (i * 10 + j) as f64);
                }
            }
        })
    })?;
    q.submit(|cgh| {
        let x = cgh.read(&x, transposed(0, 1));
        let t = cgh.discard_write(&t, one_to_one());
        cgh.split(SplitHint::Split2D);
        cgh.parallel_for([cols, rows], move |c, k| {
            let (x, mut t) = (k.read(&x), k.write(&t));
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in c.offset[1]..c.offset[1] + c.range[1] {
                    t.set([i, j], x.get([j, i]));
                }
            }
        })
    })?;
    print(q.comm(), "transpose", &q.fence_all(&t)?);
    Ok(())
}

/// The Table 3 programs of the collective pattern discovery paper: all-gather, gather-scatter,
/// gather-broadcast and all-to-all (with discovery on they run as collectives) over `N` cells
/// (the all-to-all over `M`×`M`); results print with `suffix` after the name. Sizes that split
/// evenly run the plain collectives, others the v-forms.
fn table3<const N: usize, const M: usize>(q: &mut DistrQueue<'_>, suffix: &str) -> Result<(), GraphError> {
    let fill = |q: &mut DistrQueue<'_>, a: &sucl_graph::Buffer<f64, 1>, k0: f64| {
        q.submit(|cgh| {
            let a = cgh.discard_write(a, one_to_one());
            cgh.parallel_for([N], move |c, k| {
                let mut a = k.write(&a);
                for i in c.offset[0]..c.offset[0] + c.range[0] {
                    a.set([i], k0 + (i * i % 11) as f64);
                }
            })
        })
    };
    // all-gather: an N kernel reads all, writes identity.
    let (a, b) = (q.buffer::<f64, 1>([N])?, q.buffer::<f64, 1>([N])?);
    fill(q, &a, 1.0)?;
    q.submit(|cgh| {
        let (a, b) = (cgh.read(&a, all()), cgh.discard_write(&b, one_to_one()));
        cgh.parallel_for([N], move |c, k| {
            let (a, mut b) = (k.read(&a), k.write(&b));
            let sum: f64 = a.as_slice().iter().sum();
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                b.set([i], sum - a.get([i]));
            }
        })
    })?;
    print(q.comm(), &format!("allgather{suffix}"), &q.fence_all(&b)?);
    // gather-scatter and gather-broadcast: a 1-item kernel reads and writes all (gather), then
    // an N kernel reads identity (scatter) or all (broadcast).
    let one_item = |q: &mut DistrQueue<'_>, a: &sucl_graph::Buffer<f64, 1>| {
        q.submit(|cgh| {
            let a = cgh.read_write(a, all());
            cgh.parallel_for([1], move |_, k| {
                let mut a = k.write(&a);
                let mut acc = 0.0;
                for i in 0..N {
                    acc += a.get([i]);
                    a.set([i], acc);
                }
            })
        })
    };
    let c = q.buffer::<f64, 1>([N])?;
    fill(q, &c, 2.0)?;
    one_item(q, &c)?;
    q.submit(|cgh| {
        let c = cgh.read_write(&c, one_to_one());
        cgh.parallel_for([N], move |ch, k| {
            let mut c = k.write(&c);
            for i in ch.offset[0]..ch.offset[0] + ch.range[0] {
                c.set([i], c.get([i]) * 0.5 + i as f64);
            }
        })
    })?;
    print(q.comm(), &format!("gatherscatter{suffix}"), &q.fence_all(&c)?);
    let (d, e) = (q.buffer::<f64, 1>([N])?, q.buffer::<f64, 1>([N])?);
    fill(q, &d, 3.0)?;
    one_item(q, &d)?;
    q.submit(|cgh| {
        let (d, e) = (cgh.read(&d, all()), cgh.discard_write(&e, one_to_one()));
        cgh.parallel_for([N], move |ch, k| {
            let (d, mut e) = (k.read(&d), k.write(&e));
            for i in ch.offset[0]..ch.offset[0] + ch.range[0] {
                e.set([i], d.get([N - 1 - i]) - d.get([i]));
            }
        })
    })?;
    print(q.comm(), &format!("gatherbcast{suffix}"), &q.fence_all(&e)?);
    // all-to-all: an N×N kernel reads transposed(0, 1) of a row-split producer.
    let (x, t) = (q.buffer::<f64, 2>([M, M])?, q.buffer::<f64, 2>([M, M])?);
    q.submit(|cgh| {
        let x = cgh.discard_write(&x, one_to_one());
        cgh.parallel_for([M, M], move |c, k| {
            let mut x = k.write(&x);
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in 0..M {
                    x.set([i, j], (i * 100 + j) as f64);
                }
            }
        })
    })?;
    q.submit(|cgh| {
        let (x, t) = (cgh.read(&x, transposed(0, 1)), cgh.discard_write(&t, one_to_one()));
        cgh.parallel_for([M, M], move |c, k| {
            let (x, mut t) = (k.read(&x), k.write(&t));
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in 0..M {
                    t.set([i, j], x.get([j, i]));
                }
            }
        })
    })?;
    print(q.comm(), &format!("alltoall{suffix}"), &q.fence_all(&t)?);
    Ok(())
}

/// Direct N-body (f64): every body feels every other; velocities then positions each step.
fn nbody(q: &mut DistrQueue<'_>) -> Result<(), GraphError> {
    const N: usize = 40;
    let pos0: Vec<f64> = (0..N * 3).map(|i| ((i * 7919) % 101) as f64 / 10.0).collect();
    let pos = q.buffer_from::<f64, 2>([N, 3], pos0)?;
    let vel = q.buffer_from::<f64, 2>([N, 3], vec![0.0; N * 3])?;
    for _ in 0..3 {
        nbody_step(q, pos, vel, N, 0.01)?;
    }
    print(q.comm(), "nbody", &q.fence_all(&pos)?);
    Ok(())
}

/// One direct N-body step over `n` bodies (shared with the benchmark).
pub fn nbody_step(
    q: &mut DistrQueue<'_>,
    pos: sucl_graph::Buffer<f64, 2>,
    vel: sucl_graph::Buffer<f64, 2>,
    n: usize,
    dt: f64,
) -> Result<(), GraphError> {
    q.submit(|cgh| {
        let p = cgh.read(&pos, all());
        let v = cgh.read_write(&vel, slice(1));
        cgh.parallel_for([n], move |c, k| {
            let (p, mut v) = (k.read(&p), k.write(&v));
            let all = p.as_slice();
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                let me = [all[3 * i], all[3 * i + 1], all[3 * i + 2]];
                let mut acc = [0.0f64; 3];
                for j in 0..n {
                    let d = [all[3 * j] - me[0], all[3 * j + 1] - me[1], all[3 * j + 2] - me[2]];
                    let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + 1e-3;
                    let inv = 1.0 / (r2 * r2.sqrt());
                    for a in 0..3 {
                        acc[a] += d[a] * inv;
                    }
                }
                let row = v.slice_mut([i, 0], 3);
                for a in 0..3 {
                    row[a] += acc[a] * dt;
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
                    row[a] += vi[a] * dt;
                }
            }
        })
    })?;
    Ok(())
}
