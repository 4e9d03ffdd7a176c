//! The `sucl` command: `run` launches ranks, `bench` measures, `check` verifies correctness.

mod bench;
mod check;
#[cfg(feature = "cuda")]
mod gpu;
mod graph;
mod info;
mod launcher;
mod ops;
mod pattern;
mod plot;
mod tune;
mod vcheck;

use clap::{Args, Parser, Subcommand};
use std::time::Duration;
use sucl::{CollOp, DType, ReduceOp};

#[derive(Parser)]
#[command(name = "sucl", version, about = "sucl: one communication API over shared memory, TCP and more")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Launch N ranks of a program on this machine.
    Run {
        /// Number of ranks.
        #[arg(short = 'n', long = "ranks")]
        ranks: usize,
        /// Do not prefix output lines with the rank.
        #[arg(long)]
        no_prefix: bool,
        /// Seconds between SIGTERM and SIGKILL when a rank fails (0 to 86400).
        #[arg(long, default_value = "2", value_parser = grace_seconds)]
        grace: Duration,
        /// Do not bind the ranks to CPUs. By default, when the ranks fit the CPUs this process
        /// may use, each rank is bound to its own contiguous block of them (all CPUs / ranks each).
        #[arg(long)]
        no_bind: bool,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Benchmark one operation over a range of sizes (nccl-tests style).
    Bench(BenchCli),
    /// Check every collective, dtype and reduce op against serial references.
    Check(CheckCli),
    /// Measure every usable backend per op and size; write the winners as a tuning table.
    Tune(TuneCli),
    /// Draw JSON rows written by `sucl bench --json` as an SVG (time and busbw against size).
    Plot {
        /// The JSON-lines file.
        input: String,
        /// The SVG to write.
        #[arg(long)]
        out: String,
        /// Only rows of this op.
        #[arg(long)]
        op: Option<String>,
    },
    /// Print the task graph and every rank's command graph of a scenario file (no kernels run).
    Graph {
        /// The scenario (TOML: buffers, tasks with ranges, split hints and accessors).
        scenario: String,
        /// Ranks to generate command graphs for.
        #[arg(long)]
        nodes: usize,
        /// Print JSON (per rank every command with id, kind, task, buffer, regions, peers, deps).
        #[arg(long, conflicts_with = "dot")]
        json: bool,
        /// Print Graphviz dot.
        #[arg(long)]
        dot: bool,
        /// Turn collective pattern discovery off (every transfer as push / await-push).
        #[arg(long)]
        no_cpd: bool,
    },
    /// Show devices, backends, the configuration in force and the launch environment.
    Info {
        /// Config file (sets SUCL_CONFIG).
        #[arg(long)]
        config: Option<String>,
    },
}

#[derive(Args)]
struct TuneCli {
    #[command(flatten)]
    common: Common,
    /// Comma-separated ops.
    #[arg(long, default_value = "all_reduce,broadcast,all_to_all")]
    ops: String,
    /// Smallest size.
    #[arg(long, default_value = "8")]
    min_bytes: String,
    /// Largest size.
    #[arg(long, default_value = "16M")]
    max_bytes: String,
    /// Size multiplier between steps.
    #[arg(long, default_value_t = 2)]
    factor: u64,
    /// Timed iterations per measurement.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Warm-up iterations per measurement.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Interleaved rounds per backend and size (the median counts; with --device, three times
    /// as many up to 1 MiB). Backends within 5 % of each other count as tied: the built-in
    /// choice (devices) or the neighbouring sizes' winner takes the size.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where to write the tuning table (TOML, usable as --config).
    #[arg(long)]
    out: String,
    /// `cuda`: choose between the device backends (nccl, ipc, staged) instead.
    #[arg(long)]
    device: Option<String>,
}

#[derive(Args)]
struct Common {
    /// Ranks to launch when not already inside a launched job.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// Host backend: auto, shm, tcp, mpi or hier (sets SUCL_BACKEND); under `bench --device
    /// cuda`, a device backend (see --device).
    #[arg(long)]
    backend: Option<String>,
    /// Config file (sets SUCL_CONFIG).
    #[arg(long)]
    config: Option<String>,
}

#[derive(Args)]
struct BenchCli {
    /// sendrecv, broadcast, reduce, all_reduce, gather, all_gather, scatter, all_to_all,
    /// reduce_scatter or barrier; or gatherv, all_gatherv, scatterv, all_to_allv (even counts).
    op: String,
    #[command(flatten)]
    common: Common,
    /// Smallest size (suffixes K, M, G).
    #[arg(long, default_value = "8")]
    min_bytes: String,
    /// Largest size.
    #[arg(long, default_value = "128M")]
    max_bytes: String,
    /// Size multiplier between steps.
    #[arg(long, default_value_t = 2)]
    factor: u64,
    /// Timed iterations per size, fixed (default: as many as fill --budget-ms).
    #[arg(long)]
    iters: Option<usize>,
    /// Without --iters: milliseconds the timed iterations of each size should take, at the time
    /// per call estimated after the warm-up (all ranks run the count the slowest rank's
    /// estimate gives).
    #[arg(long, default_value_t = bench::DEFAULT_BUDGET.as_millis() as u64)]
    budget_ms: u64,
    /// Without --iters: fewest timed iterations per size.
    #[arg(long, default_value_t = bench::DEFAULT_MIN_ITERS)]
    min_iters: usize,
    /// Without --iters: most timed iterations per size.
    #[arg(long, default_value_t = bench::DEFAULT_MAX_ITERS)]
    max_iters: usize,
    /// Warm-up iterations per size.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Reduce operation.
    #[arg(long, default_value = "sum")]
    redop: String,
    /// Root of rooted operations.
    #[arg(long, default_value_t = 0)]
    root: usize,
    /// Print one JSON object per size on stdout.
    #[arg(long)]
    json: bool,
    /// Draw time and busbw against size into this SVG file.
    #[arg(long)]
    plot: Option<String>,
    /// Skip the per-size correctness check.
    #[arg(long)]
    no_check: bool,
    /// Measure these choices side by side in one job instead (comma-separated backends and/or
    /// `auto`), best of --rounds interleaved rounds per size.
    #[arg(long)]
    compare: Option<String>,
    /// Rounds of --compare.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `cuda`: benchmark device buffers; --backend is then nccl, ipc, staged, auto or raw (NCCL
    /// called directly, bypassing sucl).
    #[arg(long)]
    device: Option<String>,
    /// With `--device cuda`: capture a batch of calls (up to 20, at most the iterations) into a CUDA
    /// graph per choice and size, and time its replays (after the checked first call and the
    /// warm-up, uncaptured); the replays' last output is checked as usual.
    #[arg(long)]
    graph: bool,
}

#[derive(Args)]
struct CheckCli {
    #[command(flatten)]
    common: Common,
    /// Comma-separated ops (default: all).
    #[arg(long)]
    ops: Option<String>,
    /// Comma-separated dtypes (default: all).
    #[arg(long)]
    dtypes: Option<String>,
    /// Comma-separated reduce ops (default: all).
    #[arg(long)]
    redops: Option<String>,
    /// Comma-separated element counts (default: 0,1,7,3n+1,1000,70001).
    #[arg(long)]
    sizes: Option<String>,
    /// Also check all_reduce, broadcast and reduce_scatter of this many MiB of f32.
    #[arg(long, default_value_t = 0)]
    big_mib: usize,
    /// Seed of the test patterns.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `cuda`: check device buffers over every device backend instead.
    #[arg(long)]
    device: Option<String>,
    /// With `--device cuda`: only these device backends (comma-separated: nccl, ipc, staged);
    /// one that the communicator could not set up is an error, not a skip.
    #[arg(long)]
    device_backends: Option<String>,
    /// With `--device cuda`: also capture all_reduce calls into a CUDA graph and check replays
    /// (on nccl and ipc; the staged path waits on the host and cannot be captured).
    #[arg(long)]
    graph: bool,
    #[arg(long, hide = true)]
    inject_exit: Option<usize>,
    #[arg(long, hide = true)]
    inject_kill: Option<usize>,
    #[arg(long, hide = true)]
    inject_mismatch: Option<usize>,
    #[arg(long, hide = true)]
    inject_stall: Option<usize>,
    #[arg(long, hide = true, default_value_t = 3)]
    inject_after: usize,
}

fn parse_list<T>(s: &Option<String>, all: &[T], parse: impl Fn(&str) -> Option<T>, what: &str) -> Result<Vec<T>, String>
where
    T: Copy,
{
    match s {
        None => Ok(all.to_vec()),
        Some(s) => s.split(',').map(|x| parse(x.trim()).ok_or_else(|| format!("unknown {what} `{x}`"))).collect(),
    }
}

fn bytes_arg(name: &str, s: &str) -> Result<u64, String> {
    sucl::config::parse_bytes(s).ok_or_else(|| format!("--{name} {s:?}: expected a byte size such as 8, 64K, 128M"))
}

/// If asked for N ranks outside a launched job, relaunch this same command under `sucl run`.
fn maybe_self_launch(common: &Common, prefix: bool) -> Option<i32> {
    if let Some(b) = &common.backend {
        std::env::set_var("SUCL_BACKEND", b);
    }
    if let Some(c) = &common.config {
        std::env::set_var("SUCL_CONFIG", c);
    }
    let env = sucl_core::bootstrap::detect(&|k| std::env::var(k).ok()).ok()?;
    if env.launcher != sucl::Launcher::None || common.ranks <= 1 {
        return None;
    }
    let exe = std::env::current_exe().ok()?.to_string_lossy().into_owned();
    let argv: Vec<String> = std::iter::once(exe).chain(std::env::args().skip(1)).collect();
    Some(launcher::launch(&launcher::LaunchOpts { ranks: common.ranks, argv, prefix, grace: Duration::from_secs(2), bind: true }))
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("sucl: {msg}");
    2
}

fn init_checked(common: &Common) -> Result<sucl::Communicator, i32> {
    let comm = sucl::init().map_err(|e| {
        eprintln!("sucl: init failed: {e}");
        1
    })?;
    if common.ranks > 1 && comm.size() != common.ranks {
        eprintln!("sucl: --ranks {} but the job has {} ranks", common.ranks, comm.size());
        return Err(2);
    }
    Ok(comm)
}

fn bench_main(b: BenchCli) -> i32 {
    let Some(op) = bench::BenchOp::parse(&b.op) else {
        return fail(format!(
            "unknown op `{}` (sendrecv, broadcast, reduce, all_reduce, gather, all_gather, scatter, all_to_all, reduce_scatter, barrier)",
            b.op
        ));
    };
    let (min, max) = match (bytes_arg("min-bytes", &b.min_bytes), bytes_arg("max-bytes", &b.max_bytes)) {
        (Ok(a), Ok(z)) => (a, z),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    if min > max {
        return fail(format!("--min-bytes {min} is larger than --max-bytes {max}"));
    }
    let Some(dtype) = DType::parse(&b.dtype) else { return fail(format!("unknown dtype `{}`", b.dtype)) };
    let Some(redop) = ReduceOp::parse(&b.redop) else { return fail(format!("unknown reduce op `{}`", b.redop)) };
    let iters = match b.iters {
        Some(0) => return fail("--iters must be at least 1"),
        Some(n) => bench::Iters::Fixed(n),
        None if b.budget_ms == 0 || b.min_iters == 0 || b.min_iters > b.max_iters => {
            return fail("--budget-ms and --min-iters must be at least 1, and --min-iters at most --max-iters")
        }
        None => bench::Iters::Budget { budget: Duration::from_millis(b.budget_ms), min: b.min_iters, max: b.max_iters },
    };
    if b.graph && b.device.is_none() {
        return fail("--graph times CUDA-graph replays: it needs --device cuda");
    }
    if let Some(code) = maybe_self_launch(&b.common, false) {
        return code;
    }
    let device_choice = b.common.backend.clone().unwrap_or_else(|| "auto".into());
    if b.compare.is_some() || b.device.is_some() {
        // Comparing needs every backend loaded; on devices --backend names a device backend.
        std::env::set_var("SUCL_BACKEND", "auto");
    }
    let comm = match init_checked(&b.common) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let args = bench::BenchArgs {
        op,
        min_bytes: min,
        max_bytes: max,
        factor: b.factor,
        iters,
        warmup: b.warmup,
        dtype,
        redop,
        root: b.root,
        json: b.json,
        check: !b.no_check,
        graph: b.graph,
    };
    if let Some(dev) = &b.device {
        let choice = b.compare.clone().unwrap_or(device_choice);
        return device_bench(&comm, &args, dev, &choice, b.rounds);
    }
    if let Some(list) = &b.compare {
        let choices: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
        return match bench::compare(&comm, &args, &choices, b.rounds) {
            Ok(points) if points.iter().any(|p| p.2.iter().any(|w| w.is_some_and(|w| w > 0))) => {
                eprintln!("sucl bench --compare: some results were wrong");
                1
            }
            Ok(_) => 0,
            Err(e) => {
                eprintln!("sucl bench: {e}");
                1
            }
        };
    }
    match bench::run(&comm, &args) {
        Ok(rows) => {
            if let (Some(path), 0) = (&b.plot, comm.rank()) {
                let title = format!("{} {} ranks", op.name(), comm.size());
                if let Err(e) = plot::plot(path, &title, &rows) {
                    return fail(format!("cannot draw {path}: {e}"));
                }
            }
            if rows.iter().any(|r| r.wrong.is_some_and(|w| w > 0)) {
                eprintln!("sucl bench: some results were wrong");
                return 1;
            }
            0
        }
        Err(e) => {
            eprintln!("sucl bench: {e}");
            1
        }
    }
}

#[cfg(feature = "cuda")]
fn device_bench(comm: &sucl::Communicator, args: &bench::BenchArgs, dev: &str, choice: &str, rounds: usize) -> i32 {
    if dev != "cuda" {
        return fail(format!("unknown device `{dev}` (cuda)"));
    }
    let r = if choice.contains(',') {
        let choices: Vec<String> = choice.split(',').map(|s| s.trim().to_string()).collect();
        gpu::compare(comm, args, &choices, rounds)
    } else {
        gpu::bench(comm, args, choice).map(|rows| rows.iter().filter_map(|r| r.wrong).sum())
    };
    match r {
        Ok(wrong) if wrong > 0 => {
            eprintln!("sucl bench --device cuda: {wrong} wrong elements");
            1
        }
        Ok(_) => 0,
        Err(e) => {
            eprintln!("sucl bench --device cuda: {e}");
            1
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn device_bench(_comm: &sucl::Communicator, _args: &bench::BenchArgs, _dev: &str, _choice: &str, _rounds: usize) -> i32 {
    fail("this build has no CUDA support (feature `cuda`)")
}

fn check_main(c: CheckCli) -> i32 {
    let parsed = (|| -> Result<check::CheckArgs, String> {
        Ok(check::CheckArgs {
            ops: parse_list(&c.ops, &CollOp::ALL, CollOp::parse, "op")?,
            dtypes: parse_list(&c.dtypes, &DType::ALL, DType::parse, "dtype")?,
            redops: parse_list(&c.redops, &ReduceOp::ALL, ReduceOp::parse, "reduce op")?,
            sizes: c
                .sizes
                .as_ref()
                .map(|s| {
                    s.split(',').map(|x| x.trim().parse::<usize>().map_err(|_| format!("bad size `{x}`"))).collect::<Result<Vec<_>, _>>()
                })
                .transpose()?,
            big_mib: c.big_mib,
            seed: c.seed,
            inject_exit: c.inject_exit,
            inject_kill: c.inject_kill,
            inject_mismatch: c.inject_mismatch,
            inject_stall: c.inject_stall,
            inject_after: c.inject_after,
        })
    })();
    let args = match parsed {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    if let Some(code) = maybe_self_launch(&c.common, true) {
        return code;
    }
    let comm = match init_checked(&c.common) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let result = match c.device.as_deref() {
        None => check::run(&comm, &args),
        #[cfg(feature = "cuda")]
        Some("cuda") => {
            let after = |r| (r, args.inject_after);
            gpu::check(
                &comm,
                &args.ops,
                &args.dtypes,
                &args.redops,
                args.big_mib,
                args.inject_kill.map(after),
                args.inject_stall.map(after),
                c.device_backends.as_deref(),
                c.graph,
            )
        }
        Some(other) => {
            return fail(format!("unknown or unsupported device `{other}` in this build"));
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sucl check: error: {e}");
            1
        }
    }
}

fn plot_main(input: &str, out: &str, op: Option<&str>) -> i32 {
    let text = match std::fs::read_to_string(input) {
        Ok(t) => t,
        Err(e) => return fail(format!("{input}: {e}")),
    };
    let mut rows = vec![];
    for (i, line) in text.lines().enumerate().filter(|(_, l)| l.starts_with('{')) {
        match serde_json::from_str::<bench::Row>(line) {
            Ok(r) if op.is_none_or(|o| o == r.op) => rows.push(r),
            Ok(_) => {}
            Err(e) => return fail(format!("{input}:{}: {e}", i + 1)),
        }
    }
    if rows.is_empty() {
        return fail(format!("{input}: no rows to draw"));
    }
    let title = op.unwrap_or("sucl bench").to_string();
    match plot::plot(out, &title, &rows) {
        Ok(()) => 0,
        Err(e) => fail(format!("cannot draw {out}: {e}")),
    }
}

fn tune_main(t: TuneCli) -> i32 {
    let ops = match parse_list(&Some(t.ops.clone()), &CollOp::ALL, CollOp::parse, "op") {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let (min, max) = match (bytes_arg("min-bytes", &t.min_bytes), bytes_arg("max-bytes", &t.max_bytes)) {
        (Ok(a), Ok(z)) => (a, z),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let Some(dtype) = DType::parse(&t.dtype) else { return fail(format!("unknown dtype `{}`", t.dtype)) };
    if t.iters == 0 || min > max {
        return fail("--iters must be at least 1 and --min-bytes at most --max-bytes");
    }
    if let Some(code) = maybe_self_launch(&t.common, false) {
        return code;
    }
    // Tuning compares every backend, whatever the environment forces.
    std::env::set_var("SUCL_BACKEND", "auto");
    let comm = match init_checked(&t.common) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(dev) = t.device.as_deref() {
        #[cfg(feature = "cuda")]
        if dev == "cuda" {
            let args = bench::BenchArgs {
                op: bench::BenchOp::Coll(CollOp::AllReduce),
                min_bytes: min,
                max_bytes: max,
                factor: t.factor,
                iters: bench::Iters::Fixed(t.iters),
                warmup: t.warmup,
                dtype,
                redop: ReduceOp::Sum,
                root: 0,
                json: false,
                check: true,
                graph: false,
            };
            return match gpu::tune(&comm, &args, &ops, t.rounds, &t.out) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("sucl tune: {e}");
                    1
                }
            };
        }
        return fail(format!("unknown or unsupported device `{dev}` in this build"));
    }
    let args = tune::TuneArgs {
        ops,
        min_bytes: min,
        max_bytes: max,
        factor: t.factor,
        iters: t.iters,
        warmup: t.warmup,
        rounds: t.rounds,
        dtype,
        out: t.out,
    };
    match tune::run(&comm, &args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sucl tune: {e}");
            1
        }
    }
}

/// `--grace`: seconds from 0 to a day.
fn grace_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (0.0..=86400.0).contains(&v) {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!("{s} seconds: the grace is 0 to 86400 seconds"))
    }
}

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Run { ranks, no_prefix, grace, no_bind, argv } => {
            if ranks == 0 {
                fail("-n must be at least 1")
            } else {
                launcher::launch(&launcher::LaunchOpts { ranks, argv, prefix: !no_prefix, grace, bind: !no_bind })
            }
        }
        Cmd::Bench(b) => bench_main(b),
        Cmd::Check(c) => check_main(c),
        Cmd::Tune(t) => tune_main(t),
        Cmd::Plot { input, out, op } => plot_main(&input, &out, op.as_deref()),
        Cmd::Graph { scenario, nodes, json, dot, no_cpd } => {
            let format = if json {
                graph::Format::Json
            } else if dot {
                graph::Format::Dot
            } else {
                graph::Format::Text
            };
            graph::run(&scenario, nodes, format, no_cpd)
        }
        Cmd::Info { config } => {
            if let Some(c) = config {
                std::env::set_var("SUCL_CONFIG", c);
            }
            info::run()
        }
    };
    std::process::exit(code);
}
