// Scheduler throughput: tasks per second of command generation on one rank (graph only, no
// kernels, no communication) for a stencil loop and an N-body loop at 1, 4, 16, 64 and 256
// simulated ranks.
//
// cargo run --release -p sucl-graph --example graph_sched_bench -- [--ranks 1,4,16,64,256]
//     [--min-seconds 1.0] [--json]
//
// Every rank generates only its own commands; rank 0 is measured (the others do the same work
// for their own chunks). A horizon every 4 tasks keeps the graph bounded, as in a real run.

use std::time::{Duration, Instant};
use sucl_graph::{AccessMode::*, GraphError, RangeMapper, Scheduler, TaskSpec};

struct Row {
    program: &'static str,
    ranks: usize,
    tasks: usize,
    seconds: f64,
    commands: usize,
}

/// Submits `step(i)` for i = 0.. until `min` has passed (at least 8 tasks after 4 of warm-up);
/// (tasks timed, seconds, commands generated during them).
fn measure(
    s: &mut Scheduler,
    min: Duration,
    mut step: impl FnMut(&mut Scheduler, usize) -> Result<usize, GraphError>,
) -> (usize, f64, usize) {
    let mut i = 0;
    for _ in 0..4 {
        i += step(s, i).expect("warm-up task");
    }
    let before = s.commands(0).map_or(0, |c| c.len());
    let start = Instant::now();
    let mut tasks = 0;
    while tasks < 8 || start.elapsed() < min {
        let n = step(s, i).expect("task");
        i += n;
        tasks += n;
    }
    let secs = start.elapsed().as_secs_f64();
    (tasks, secs, s.commands(0).map_or(0, |c| c.len()) - before)
}

/// A 2D Jacobi loop (8192², split in row slabs, halo 1), ping-ponging two buffers.
fn stencil(ranks: usize, min: Duration) -> Row {
    const N: usize = 8192;
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    let u = s.create_buffer(&[N, N], true).unwrap();
    let v = s.create_buffer(&[N, N], false).unwrap();
    let (tasks, seconds, commands) = measure(&mut s, min, |s, i| {
        let (src, dst) = if i % 2 == 0 { (u, v) } else { (v, u) };
        let spec = TaskSpec::parallel_for("jacobi", &[N, N]).access(src, RangeMapper::Neighborhood([1, 1, 0]), Read).access(
            dst,
            RangeMapper::OneToOne,
            DiscardWrite,
        );
        s.submit(spec)?;
        Ok(1)
    });
    Row { program: "stencil", ranks, tasks, seconds, commands }
}

/// A direct N-body loop (65536 bodies): forces read all positions, then positions move.
fn nbody(ranks: usize, min: Duration) -> Row {
    const N: usize = 65536;
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    let pos = s.create_buffer(&[N, 3], true).unwrap();
    let vel = s.create_buffer(&[N, 3], true).unwrap();
    let (tasks, seconds, commands) = measure(&mut s, min, |s, _| {
        s.submit(TaskSpec::parallel_for("forces", &[N]).access(pos, RangeMapper::All, Read).access(vel, RangeMapper::Slice(1), ReadWrite))?;
        s.submit(TaskSpec::parallel_for("move", &[N]).access(pos, RangeMapper::Slice(1), ReadWrite).access(
            vel,
            RangeMapper::Slice(1),
            Read,
        ))?;
        Ok(2)
    });
    Row { program: "nbody", ranks, tasks, seconds, commands }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let ranks: Vec<usize> = arg("--ranks")
        .unwrap_or_else(|| "1,4,16,64,256".into())
        .split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| panic!("--ranks: bad number {x:?}")))
        .collect();
    let min = Duration::from_secs_f64(arg("--min-seconds").map_or(1.0, |x| x.parse().expect("--min-seconds: a number")));
    let json = args.iter().any(|a| a == "--json");
    if !json {
        println!("{:>8} {:>6} {:>8} {:>10} {:>12} {:>14}", "program", "ranks", "tasks", "seconds", "tasks/s", "commands/task");
    }
    for program in ["stencil", "nbody"] {
        for &n in &ranks {
            let r = if program == "stencil" { stencil(n, min) } else { nbody(n, min) };
            let rate = r.tasks as f64 / r.seconds;
            let per = r.commands as f64 / r.tasks as f64;
            if json {
                println!(
                    "{{\"program\":\"{}\",\"ranks\":{},\"tasks\":{},\"seconds\":{:.4},\"tasks_per_s\":{:.1},\"commands_per_task\":{:.2}}}",
                    r.program, r.ranks, r.tasks, r.seconds, rate, per
                );
            } else {
                println!("{:>8} {:>6} {:>8} {:>10.3} {:>12.1} {:>14.2}", r.program, r.ranks, r.tasks, r.seconds, rate, per);
            }
        }
    }
}
