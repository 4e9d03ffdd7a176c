// Scheduler throughput (command generation on one rank, no kernels): see HELP below
// (`--help`).

#[path = "common/args.rs"]
mod args;

use args::Args;
use std::time::{Duration, Instant};
use sucl_graph::{AccessMode::*, GraphError, RangeMapper, Scheduler, TaskSpec};

/// CPU time this thread has used: on a shared, oversubscribed machine wall time counts the
/// waits for a core too, CPU time only the scheduler's own work.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

struct Row {
    program: &'static str,
    cpd: bool,
    ranks: usize,
    tasks: usize,
    seconds: f64,
    cpu_seconds: f64,
    commands: usize,
}

/// Submits `step(i)` for i = 0.. until `min` has passed (at least 8 tasks after 4 of warm-up);
/// (tasks timed, (wall seconds, CPU seconds), commands generated during them).
fn measure(
    s: &mut Scheduler,
    min: Duration,
    mut step: impl FnMut(&mut Scheduler, usize) -> Result<usize, GraphError>,
) -> (usize, (f64, f64), usize) {
    let mut i = 0;
    for _ in 0..4 {
        i += step(s, i).expect("warm-up task");
    }
    s.take_commands(0);
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let (mut tasks, mut commands) = (0, 0);
    // Until `min` of CPU time (what the figure divides by) has been spent. Commands are taken
    // after every task, as a live rank's executor does (the scheduler then drops them).
    while tasks < 8 || thread_cpu() - cpu0 < min {
        let n = step(s, i).expect("task");
        i += n;
        tasks += n;
        commands += s.take_commands(0).map_or(0, |c| c.len());
    }
    let secs = (start.elapsed().as_secs_f64(), (thread_cpu() - cpu0).as_secs_f64());
    (tasks, secs, commands)
}

/// A 2D Jacobi loop (8192², split in row slabs, halo 1), ping-ponging two buffers.
fn stencil(ranks: usize, min: Duration, cpd: bool) -> Row {
    const N: usize = 8192;
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let u = s.create_buffer(&[N, N], true).unwrap();
    let v = s.create_buffer(&[N, N], false).unwrap();
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, i| {
        let (src, dst) = if i % 2 == 0 { (u, v) } else { (v, u) };
        let spec = TaskSpec::parallel_for("jacobi", &[N, N]).access(src, RangeMapper::Neighborhood([1, 1, 0]), Read).access(
            dst,
            RangeMapper::OneToOne,
            DiscardWrite,
        );
        s.submit(spec)?;
        Ok(1)
    });
    Row { program: "stencil", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

/// A direct N-body loop (65536 bodies): forces read all positions, then positions move.
fn nbody(ranks: usize, min: Duration, cpd: bool) -> Row {
    const N: usize = 65536;
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let pos = s.create_buffer(&[N, 3], true).unwrap();
    let vel = s.create_buffer(&[N, 3], true).unwrap();
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, _| {
        s.submit(TaskSpec::parallel_for("forces", &[N]).access(pos, RangeMapper::All, Read).access(vel, RangeMapper::Slice(1), ReadWrite))?;
        s.submit(TaskSpec::parallel_for("move", &[N]).access(pos, RangeMapper::Slice(1), ReadWrite).access(
            vel,
            RangeMapper::Slice(1),
            Read,
        ))?;
        Ok(2)
    });
    Row { program: "nbody", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

const N1: usize = 1 << 20;
const N2: usize = 4096;

fn one_item(a: sucl_graph::BufferId) -> TaskSpec {
    TaskSpec::parallel_for("one", &[1]).access(a, RangeMapper::All, ReadWrite)
}

fn write_1d(a: sucl_graph::BufferId) -> TaskSpec {
    TaskSpec::parallel_for("write", &[N1]).access(a, RangeMapper::OneToOne, DiscardWrite)
}

/// Table 3 all-gather: an N kernel writes identity, the next reads all.
fn allgather(ranks: usize, min: Duration, cpd: bool) -> Row {
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let (a, b) = (s.create_buffer(&[N1], false).unwrap(), s.create_buffer(&[N1], false).unwrap());
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, _| {
        s.submit(write_1d(a))?;
        s.submit(TaskSpec::parallel_for("use", &[N1]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))?;
        Ok(2)
    });
    Row { program: "allgather", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

/// Table 3 gather-scatter: a 1-item kernel reads and writes all, then an N kernel
/// reads and writes identity.
fn gather_scatter(ranks: usize, min: Duration, cpd: bool) -> Row {
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let a = s.create_buffer(&[N1], false).unwrap();
    s.submit(write_1d(a)).unwrap();
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, _| {
        s.submit(one_item(a))?;
        s.submit(TaskSpec::parallel_for("back", &[N1]).access(a, RangeMapper::OneToOne, ReadWrite))?;
        Ok(2)
    });
    Row { program: "gather_scatter", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

/// Table 3 gather-broadcast: an N kernel writes identity, a 1-item kernel reads and writes
/// all, an N kernel reads all.
fn gather_bcast(ranks: usize, min: Duration, cpd: bool) -> Row {
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let (a, b) = (s.create_buffer(&[N1], false).unwrap(), s.create_buffer(&[N1], false).unwrap());
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, _| {
        s.submit(write_1d(a))?;
        s.submit(one_item(a))?;
        s.submit(TaskSpec::parallel_for("use", &[N1]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))?;
        Ok(3)
    });
    Row { program: "gather_bcast", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

/// Table 3 all-to-all: an N×N kernel writes identity, the next reads transposed(0, 1).
fn alltoall(ranks: usize, min: Duration, cpd: bool) -> Row {
    let mut s = Scheduler::for_rank(ranks, 0, 4).unwrap();
    s.set_discovery(cpd);
    let (a, b) = (s.create_buffer(&[N2, N2], false).unwrap(), s.create_buffer(&[N2, N2], false).unwrap());
    let (tasks, (seconds, cpu_seconds), commands) = measure(&mut s, min, |s, _| {
        s.submit(TaskSpec::parallel_for("write", &[N2, N2]).access(a, RangeMapper::OneToOne, DiscardWrite))?;
        s.submit(TaskSpec::parallel_for("t", &[N2, N2]).access(a, RangeMapper::Transposed(0, 1), Read).access(
            b,
            RangeMapper::OneToOne,
            DiscardWrite,
        ))?;
        Ok(2)
    });
    Row { program: "alltoall", cpd, ranks, tasks, seconds, cpu_seconds, commands }
}

const HELP: &str = "Usage: graph_sched_bench [--ranks LIST] [--min-seconds S] [--json] [--programs LIST] [--cpd both|on|off] [--rounds R]

Scheduler throughput: tasks per second of command generation on one rank (graph only, no
kernels, no communication) for a stencil loop and an N-body loop, and the collective pattern
discovery paper's Table 3 programs (allgather, gather_scatter, gather_bcast, alltoall, and the
stencil control) with and without discovery side by side, at 1, 4, 16, 64 and 256 simulated
ranks.

cargo run --release -p sucl-graph --example graph_sched_bench -- [--ranks 1,4,16,64,256]
    [--min-seconds 1.0] [--json] [--programs stencil,nbody,allgather,...] [--cpd both|on|off]
    [--rounds 1]

With --rounds R every (program, ranks) runs R rounds; with --cpd both a round runs both modes,
alternating which goes first, and every round prints a line (field \"round\"), so a table can
take medians of rates measured side by side (the machines we share are noisy).

Every rank generates only its own commands; rank 0 is measured (the others do the same work
for their own chunks). A horizon every 4 tasks keeps the graph bounded, and commands are
taken (and dropped) after every task, as in a real run.
";

fn main() {
    let args = Args::from_env(HELP);
    let ranks: Vec<usize> = args
        .value("--ranks")
        .unwrap_or("1,4,16,64,256")
        .split(',')
        .map(|x| x.trim().parse().ok().filter(|&n: &usize| n > 0).unwrap_or_else(|| args.fail(format!("--ranks: bad rank count {x:?}"))))
        .collect();
    let seconds: f64 = args.num("--min-seconds", 1.0);
    if !(0.0..=1e9).contains(&seconds) {
        args.fail(format!("--min-seconds: want a duration in seconds (0 to 1e9), got {seconds}"));
    }
    let min = Duration::from_secs_f64(seconds);
    let json = args.flag("--json");
    let programs = args.value("--programs").unwrap_or("stencil,nbody,allgather,gather_scatter,gather_bcast,alltoall").to_string();
    let modes: Vec<bool> = match args.value("--cpd").unwrap_or("both") {
        "both" => vec![false, true],
        "on" => vec![true],
        "off" => vec![false],
        other => args.fail(format!("--cpd: both, on or off, not {other:?}")),
    };
    let rounds: usize = args.num("--rounds", 1);
    let runs: Vec<fn(usize, Duration, bool) -> Row> = programs
        .split(',')
        .map(|p| match p.trim() {
            "stencil" => stencil as fn(usize, Duration, bool) -> Row,
            "nbody" => nbody,
            "allgather" => allgather,
            "gather_scatter" => gather_scatter,
            "gather_bcast" => gather_bcast,
            "alltoall" => alltoall,
            other => args.fail(format!("--programs: unknown program {other:?}")),
        })
        .collect();
    if !json {
        println!(
            "{:>14} {:>4} {:>6} {:>8} {:>10} {:>12} {:>14}",
            "program", "cpd", "ranks", "tasks", "cpu s", "tasks/cpu-s", "commands/task"
        );
    }
    for run in runs {
        for &n in &ranks {
            for round in 0..rounds {
                let order: Vec<bool> = if round % 2 == 0 { modes.clone() } else { modes.iter().rev().copied().collect() };
                for &cpd in &order {
                    let r = run(n, min, cpd);
                    let rate = r.tasks as f64 / r.cpu_seconds;
                    let per = r.commands as f64 / r.tasks as f64;
                    if json {
                        println!(
                            "{{\"program\":\"{}\",\"cpd\":{},\"ranks\":{},\"round\":{},\"tasks\":{},\"seconds\":{:.4},\"cpu_seconds\":{:.4},\"tasks_per_s\":{:.1},\"commands_per_task\":{:.2}}}",
                            r.program, r.cpd, r.ranks, round, r.tasks, r.seconds, r.cpu_seconds, rate, per
                        );
                    } else {
                        println!(
                            "{:>14} {:>5} {:>6} {:>8} {:>10.3} {:>14.1} {:>14.2}",
                            r.program, r.cpd, r.ranks, r.tasks, r.cpu_seconds, rate, per
                        );
                    }
                }
            }
        }
    }
}
