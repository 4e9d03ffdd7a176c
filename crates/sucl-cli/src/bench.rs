//! `sucl bench OP`: micro-benchmarks in the style of nccl-tests and the OSU suite. Time is the
//! mean over timed iterations after warm-up, max over ranks; algbw = bytes / time; busbw applies
//! nccl-tests' factor; every size is checked against the serial reference (`#wrong`: the first call and the
//! last timed call, outside the timed loop, counted over every rank through the rendezvous store).
//!
//! Unless `--iters` fixes it, the number of timed iterations of each size fills a time budget
//! ([`Iters::Budget`]): a sub-microsecond call timed 20 times measures the clock, not the call.

use crate::ops::run_op;
use crate::pattern::{buffer_lens, count_wrong_vs, fill_input, Case};
use serde::Serialize;
use std::time::{Duration, Instant};
use sucl::{CollOp, Communicator, DType, Element, ReduceOp, Result};

/// A benchmark operation: a collective or the point-to-point ring exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// Every rank sends to rank+1 and receives from rank-1.
    SendRecv,
    /// A collective.
    Coll(CollOp),
    /// The v-form of gather, all_gather, scatter or all_to_all with even counts (every block
    /// `count` elements, displacements back to back), so its rows compare with the plain op's.
    V(CollOp),
}

impl BenchOp {
    pub fn parse(s: &str) -> Option<BenchOp> {
        if s == "sendrecv" {
            return Some(BenchOp::SendRecv);
        }
        if let Some(c) = s.strip_suffix('v').and_then(CollOp::parse) {
            if matches!(c, CollOp::Gather | CollOp::AllGather | CollOp::Scatter | CollOp::AllToAll) {
                return Some(BenchOp::V(c));
            }
        }
        CollOp::parse(s).map(BenchOp::Coll)
    }
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::SendRecv => "sendrecv",
            BenchOp::Coll(c) => c.name(),
            BenchOp::V(CollOp::Gather) => "gatherv",
            BenchOp::V(CollOp::AllGather) => "all_gatherv",
            BenchOp::V(CollOp::Scatter) => "scatterv",
            BenchOp::V(_) => "all_to_allv",
        }
    }
    /// nccl-tests' bus bandwidth factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::SendRecv => 1.0,
            BenchOp::Coll(c) | BenchOp::V(c) => match c {
                CollOp::AllReduce => 2.0 * (n - 1.0) / n,
                CollOp::AllGather | CollOp::ReduceScatter | CollOp::AllToAll | CollOp::Gather | CollOp::Scatter => (n - 1.0) / n,
                _ => 1.0,
            },
        }
    }
}

/// How many timed iterations one measurement runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Iters {
    /// Exactly this many (`--iters`).
    Fixed(usize),
    /// As many as fill `budget` at the estimated time of one call, within `min..=max` (as the
    /// OSU benchmarks scale their iterations to the message size, but from a measurement).
    Budget {
        /// Time the timed iterations of one size should take.
        budget: Duration,
        /// Fewest timed iterations.
        min: usize,
        /// Most timed iterations.
        max: usize,
    },
}

/// Default of `--budget-ms`.
pub const DEFAULT_BUDGET: Duration = Duration::from_millis(100);
/// Default of `--min-iters`.
pub const DEFAULT_MIN_ITERS: usize = 10;
/// Default of `--max-iters`.
pub const DEFAULT_MAX_ITERS: usize = 100_000;
/// The estimate of one call's time comes from a batch of calls that lasts at least this part of
/// the budget (so its own timing error is small beside it).
const ESTIMATE_PART: u32 = 10;
/// Each estimation batch is this many times the last.
const ESTIMATE_GROWTH: usize = 4;

impl Iters {
    /// The timed iterations for calls of `per_call` seconds (at least 1).
    pub fn count(self, per_call: f64) -> usize {
        match self {
            Iters::Fixed(n) => n.max(1),
            Iters::Budget { budget, min, max } => {
                let (min, max) = (min.max(1), max.max(min.max(1)));
                let fill = if per_call > 0.0 { budget.as_secs_f64() / per_call } else { f64::INFINITY };
                // `as` saturates: an infinite or huge quotient becomes usize::MAX, then `max`.
                (fill as usize).clamp(min, max)
            }
        }
    }

    /// How the header line describes the iterations.
    pub fn describe(self) -> String {
        match self {
            Iters::Fixed(n) => format!("{n} iters"),
            Iters::Budget { budget, min, max } => format!("iters per size to fill {} ms ({min}..{max})", budget.as_millis()),
        }
    }
}

/// Benchmark settings.
#[derive(Clone, Copy)]
pub struct BenchArgs {
    pub op: BenchOp,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub iters: Iters,
    pub warmup: usize,
    pub dtype: DType,
    pub redop: ReduceOp,
    pub root: usize,
    pub json: bool,
    pub check: bool,
    /// Device benchmarks: time replays of a CUDA graph that captured a batch of calls.
    pub graph: bool,
}

/// One measured size.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Row {
    pub op: String,
    pub backend: String,
    pub ranks: usize,
    pub bytes: u64,
    pub count: usize,
    pub dtype: String,
    pub redop: String,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Wrong elements over every rank (first and last timed call); None: not checked.
    pub wrong: Option<u64>,
    /// Timed iterations (0 in rows written before the count was recorded).
    #[serde(default)]
    pub iters: usize,
}

impl Row {
    /// A row for `shown` elements of `dtype` (the largest buffer of one rank) that took `secs`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(a: &BenchArgs, backend: &str, ranks: usize, shown: usize, dtype: DType, secs: f64, wrong: Option<u64>, iters: usize) -> Row {
        let bytes = (shown * dtype.size()) as u64;
        let algbw = bytes as f64 / secs / 1e9;
        Row {
            op: a.op.name().into(),
            backend: backend.into(),
            ranks,
            bytes,
            count: shown,
            dtype: dtype.name().into(),
            redop: a.redop.name().into(),
            time_us: secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * a.op.bus_factor(ranks),
            wrong,
            iters,
        }
    }
}

/// A `#wrong` cell: the count, or `-` where nothing was checked.
pub fn wrong_cell(w: Option<u64>) -> String {
    w.map_or_else(|| "-".into(), |w| w.to_string())
}

/// The sizes swept: min, min×factor, ... up to max (always at least one).
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = vec![];
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        s = s.saturating_mul(factor.max(2));
    }
    if v.is_empty() {
        v.push(min);
    }
    v
}

/// The per-rank count of a benchmark of `bytes` (the largest buffer of one rank, as nccl-tests
/// counts it) and the element count shown in its row.
pub fn counts(op: BenchOp, bytes: u64, es: usize, n: usize) -> (usize, usize) {
    let total = (bytes as usize / es).max(1);
    match op {
        BenchOp::SendRecv => (total, total),
        BenchOp::Coll(CollOp::Barrier) => (0, 0),
        BenchOp::Coll(c) | BenchOp::V(c) if splits_buffer(c) => (total / n, total / n * n),
        BenchOp::Coll(_) | BenchOp::V(_) => (total, total),
    }
}

/// Whether `op`'s largest buffer holds one block per rank.
fn splits_buffer(op: CollOp) -> bool {
    matches!(op, CollOp::AllGather | CollOp::Gather | CollOp::Scatter | CollOp::AllToAll | CollOp::ReduceScatter)
}

/// A benchmark's test data: what was filled in and the expected output.
struct Checked<T> {
    case: Case,
    want: Option<Vec<T>>,
    /// The receive buffer is the input (broadcast's root): it is never poisoned.
    recv_is_input: bool,
}

impl<T: Element> Checked<T> {
    /// Fresh test data for `a` (see [`crate::pattern::value`]): the send and receive buffers
    /// (`sl`, `rl` elements) and what is expected.
    #[allow(clippy::too_many_arguments)]
    fn new(a: &BenchArgs, bytes: u64, count: usize, n: usize, r: usize, root: usize, sl: usize, rl: usize) -> (Checked<T>, Vec<T>, Vec<T>) {
        let seed = bytes ^ 0x5eed;
        let (op, from) = match a.op {
            // sendrecv checks as a broadcast from the left neighbour would: recv = left's data.
            BenchOp::SendRecv => (CollOp::Broadcast, (r + n - 1) % n),
            BenchOp::Coll(c) | BenchOp::V(c) => (c, root),
        };
        let case = Case { op, count, n, rank: r, root: from, seed, redop: a.redop };
        let inputs = crate::pattern::inputs(a.op.name(), &case, sl, rl, a.check, |send, recv| {
            if a.op == BenchOp::SendRecv {
                crate::pattern::fill(send, r, n, 0, seed, None);
            } else {
                fill_input(op, send, recv, r, n, root, seed, a.redop);
            }
        });
        let recv_is_input = a.op != BenchOp::SendRecv && op == CollOp::Broadcast && r == root;
        (Checked { case, want: inputs.want, recv_is_input }, inputs.send, inputs.recv)
    }

    /// Overwrites an output buffer with a value no result has, so that an unwritten output shows.
    fn poison(&self, recv: &mut [T]) {
        if !self.recv_is_input {
            recv.fill(T::from_i64(-77));
        }
    }

    fn wrong(&self, recv: &[T]) -> u64 {
        self.want.as_ref().map_or(0, |w| count_wrong_vs(&self.case, w, recv) as u64)
    }
}

/// What makes each measured call: the communicator (through whichever backend is pinned or
/// selected), or MPI called directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// `sucl::Communicator`'s typed API.
    Sucl,
    /// The same collective through MPI's blocking call on `MPI_COMM_WORLD`, nothing of sucl
    /// around it (the `raw-mpi` choice of `--compare`; needs the `mpi` feature).
    RawMpi,
}

/// `--compare`'s name for MPI called directly.
pub const RAW_MPI: &str = "raw-mpi";
/// `--compare`'s name for the mpi backend with MPI's non-blocking collectives (see
/// `sucl_mpi::set_nonblocking_collectives`).
pub const MPI_NONBLOCKING: &str = "mpi-nonblocking";

/// Runs collective `op` on this rank's buffers through MPI directly (see [`Runner::RawMpi`]).
#[cfg(feature = "mpi")]
fn raw_mpi<T: Element>(comm: &Communicator, op: CollOp, send: &[T], recv: &mut [T], redop: ReduceOp, root: usize) -> Result<()> {
    let (n, r) = (comm.size(), comm.rank());
    let count = match op {
        CollOp::Barrier => 0,
        CollOp::Broadcast | CollOp::Scatter | CollOp::ReduceScatter => recv.len(),
        CollOp::AllToAll => send.len() / n,
        _ => send.len(),
    };
    let d = sucl_core::CollDesc { op, dtype: T::DTYPE, redop, root, count };
    let send = (op != CollOp::Broadcast && op != CollOp::Barrier).then(|| bytemuck::cast_slice::<T, u8>(send));
    let send = if op == CollOp::Scatter && r != root { None } else { send };
    sucl_mpi::raw::world_collective(&d, send, bytemuck::cast_slice_mut(recv)).map_err(|why| sucl::Error::BackendUnavailable {
        rank: r,
        backend: RAW_MPI.into(),
        why,
    })
}

#[cfg(not(feature = "mpi"))]
fn raw_mpi<T: Element>(comm: &Communicator, _: CollOp, _: &[T], _: &mut [T], _: ReduceOp, _: usize) -> Result<()> {
    Err(sucl::Error::BackendUnavailable { rank: comm.rank(), backend: RAW_MPI.into(), why: "built without the `mpi` feature".into() })
}

/// Measures one size through the communicator ([`measure_with`] and [`Runner::Sucl`]).
pub fn measure<T: Element>(comm: &Communicator, a: &BenchArgs, bytes: u64) -> Result<Row> {
    measure_with::<T>(comm, a, bytes, Runner::Sucl)
}

/// Measures one size. With `a.check`, the inputs are the test pattern and the outputs of the
/// first call (before warm-up) and of the last timed call are checked against the serial
/// reference (outside the timed loop; the output is poisoned before each), and the row's
/// `wrong` is the number of wrong elements over every rank, added up through the rendezvous
/// store. Without it `wrong` is None: nothing was checked. `runner` makes the measured calls.
pub fn measure_with<T: Element>(comm: &Communicator, a: &BenchArgs, bytes: u64, runner: Runner) -> Result<Row> {
    let (n, r) = (comm.size(), comm.rank());
    let root = a.root % n;
    let (count, shown) = counts(a.op, bytes, std::mem::size_of::<T>(), n);
    let (sl, rl) = match a.op {
        BenchOp::SendRecv => (count, count),
        BenchOp::Coll(c) | BenchOp::V(c) => buffer_lens(c, count, n, r, root),
    };
    // Even tables for the v-forms, built once outside the timed loop.
    let v_counts = vec![count; if matches!(a.op, BenchOp::V(CollOp::AllToAll)) { n * n } else { n }];
    let v_displs: Vec<usize> = (0..n).map(|i| i * count).collect();
    let (checked, send, mut recv) = Checked::<T>::new(a, bytes, count, n, r, root, sl, rl);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    if runner == Runner::RawMpi && matches!(a.op, BenchOp::SendRecv | BenchOp::V(_)) {
        return Err(sucl::Error::invalid(r, "op", "the raw MPI baseline measures the plain collectives only"));
    }
    let once = |send: &[T], recv: &mut [T]| -> Result<()> {
        match (a.op, runner) {
            (BenchOp::SendRecv, _) => comm.sendrecv(send, right, recv, left, 1).map(|_| ()),
            (BenchOp::Coll(c), Runner::Sucl) => run_op(comm, c, send, recv, a.redop, root),
            (BenchOp::Coll(c), Runner::RawMpi) => raw_mpi(comm, c, send, recv, a.redop, root),
            (BenchOp::V(CollOp::Gather), _) => comm.gatherv(send, recv, &v_counts, &v_displs, root),
            (BenchOp::V(CollOp::AllGather), _) => comm.all_gatherv(send, recv, &v_counts, &v_displs),
            (BenchOp::V(CollOp::Scatter), _) => comm.scatterv(send, recv, &v_counts, &v_displs, root),
            (BenchOp::V(_), _) => comm.all_to_allv(send, &v_displs, recv, &v_displs, &v_counts),
        }
    };
    checked.poison(&mut recv);
    once(&send, &mut recv)?;
    let mut wrong = checked.wrong(&recv);
    let iters = warm_up(comm, a, || once(&send, &mut recv))?;
    checked.poison(&mut recv);
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        once(&send, &mut recv)?;
    }
    let mut time = [t.elapsed().as_secs_f64() / iters as f64];
    wrong += checked.wrong(&recv);
    comm.all_reduce_in_place(&mut time, ReduceOp::Max)?;
    let wrong = if a.check { Some(crate::ops::oob_sum(comm, "bench/wrong", wrong)?) } else { None };
    let label = if runner == Runner::RawMpi { RAW_MPI } else { comm.backend_label() };
    Ok(Row::new(a, label, n, shown, T::DTYPE, time[0], wrong, iters))
}

/// Runs `a.warmup` calls of `once`, then returns how many timed iterations to run. With a
/// budget, batches of calls (1, 4, 16, ... up to the most allowed) are timed until one lasts a
/// tenth of the budget; its time per call sets the count. Every rank decides from the slowest
/// rank's batch time (a max-reduction, which every rank receives bit for bit), so all run the
/// same batches and the same count: ranks that ran different counts would deadlock.
pub fn warm_up(comm: &Communicator, a: &BenchArgs, mut once: impl FnMut() -> Result<()>) -> Result<usize> {
    for _ in 0..a.warmup {
        once()?;
    }
    let Iters::Budget { budget, max, .. } = a.iters else { return Ok(a.iters.count(0.0)) };
    let enough = (budget / ESTIMATE_PART).as_secs_f64();
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            once()?;
        }
        let mut took = [t.elapsed().as_secs_f64()];
        comm.all_reduce_in_place(&mut took, ReduceOp::Max)?;
        if took[0] >= enough || batch >= max {
            return Ok(a.iters.count(took[0] / batch as f64));
        }
        batch = batch.saturating_mul(ESTIMATE_GROWTH).min(max.max(1));
    }
}

/// Runs the sweep; rank 0 prints the table (or JSON lines) and returns the rows.
pub fn run(comm: &Communicator, a: &BenchArgs) -> Result<Vec<Row>> {
    let list = if a.op == BenchOp::Coll(CollOp::Barrier) { vec![0] } else { sizes(a.min_bytes, a.max_bytes, a.factor) };
    let lead = comm.rank() == 0;
    let bar = if lead { indicatif::ProgressBar::new(list.len() as u64) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    if lead && !a.json {
        println!(
            "# sucl bench {}: {} ranks, backend {} (loaded: {}), {}, {} warmup",
            a.op.name(),
            comm.size(),
            comm.backend_label(),
            comm.backends().join(", "),
            a.iters.describe(),
            a.warmup
        );
        println!(
            "{:>12} {:>12} {:>6} {:>6} {:>12} {:>10} {:>10} {:>7} {:>8}",
            "bytes", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters"
        );
    }
    let mut rows = vec![];
    for bytes in list {
        bar.set_message(format!("{bytes} B"));
        let row = sucl::with_dtype!(a.dtype, T => measure::<T>(comm, a, bytes)?);
        if lead {
            if a.json {
                bar.suspend(|| println!("{}", serde_json::to_string(&row).expect("row serializes")));
            } else {
                bar.suspend(|| {
                    println!(
                        "{:>12} {:>12} {:>6} {:>6} {:>12.2} {:>10.3} {:>10.3} {:>7} {:>8}",
                        row.bytes,
                        row.count,
                        row.dtype,
                        row.redop,
                        row.time_us,
                        row.algbw_gbps,
                        row.busbw_gbps,
                        wrong_cell(row.wrong),
                        row.iters
                    )
                });
            }
        }
        rows.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// Measures several choices side by side in this one job: `auto`, a backend name, [`RAW_MPI`]
/// (MPI called directly) or [`MPI_NONBLOCKING`] (the mpi backend on MPI's non-blocking
/// collectives). Per size, `rounds` rounds that each run every choice in turn; the best time of
/// each counts. Rank 0 prints a table with the fastest fixed backend, auto's ratio to it and,
/// with `raw-mpi` among the choices, the mpi backend's ratio to MPI called directly. Every
/// measurement is checked as in [`measure`] (unless `a.check` is off); returns per size the
/// best time and the wrong elements (over every round and rank) of each choice.
#[allow(clippy::type_complexity)]
pub fn compare(comm: &Communicator, a: &BenchArgs, choices: &[String], rounds: usize) -> Result<Vec<(u64, Vec<f64>, Vec<Option<u64>>)>> {
    let list = if a.op == BenchOp::Coll(CollOp::Barrier) { vec![0] } else { sizes(a.min_bytes, a.max_bytes, a.factor) };
    let lead = comm.rank() == 0;
    let mut out = vec![];
    if lead {
        println!("# sucl bench {} --compare: {} ranks, best of {rounds} interleaved rounds, time (µs)", a.op.name(), comm.size());
        let mut h = format!("{:>12}", "bytes");
        for c in choices {
            h += &format!(" {c:>10}");
        }
        let raw = if raw_pair(choices).is_some() { format!(" {:>8}", "mpi/raw") } else { String::new() };
        println!("{h} {:>8} {:>10}{raw} {:>7}", "best", "auto/best", "#wrong");
    }
    let quiet = BenchArgs { json: false, ..*a };
    for bytes in list {
        let mut best = vec![f64::INFINITY; choices.len()];
        let mut wrong: Vec<Option<u64>> = vec![None; choices.len()];
        for round in 0..rounds.max(1) {
            for k in round_order(choices.len(), round) {
                let row = measure_choice(comm, &quiet, bytes, &choices[k])?;
                best[k] = best[k].min(row.time_us);
                if let Some(w) = row.wrong {
                    wrong[k] = Some(wrong[k].unwrap_or(0) + w);
                }
            }
        }
        comm.pin_backend(None)?;
        if lead {
            let fixed: Vec<usize> = (0..choices.len()).filter(|&k| choices[k] != "auto" && choices[k] != RAW_MPI).collect();
            let b = fixed.iter().copied().min_by(|&x, &y| best[x].total_cmp(&best[y]));
            let auto = choices.iter().position(|c| c == "auto");
            let mut line = format!("{bytes:>12}");
            for t in &best {
                line += &format!(" {t:>10.2}");
            }
            let ratio = match (auto, b) {
                (Some(au), Some(bb)) => format!("{:>10.3}", best[au] / best[bb]),
                _ => format!("{:>10}", "-"),
            };
            let raw = raw_pair(choices).map_or_else(String::new, |(m, raw)| format!(" {:>8.3}", best[m] / best[raw]));
            let total = wrong.iter().flatten().copied().reduce(|x, y| x + y);
            println!("{line} {:>8} {ratio}{raw} {:>7}", b.map(|x| choices[x].as_str()).unwrap_or("-"), wrong_cell(total));
            if a.json {
                for (k, c) in choices.iter().enumerate() {
                    println!(
                        "{}",
                        serde_json::json!({"op": a.op.name(), "backend": c, "ranks": comm.size(), "bytes": bytes, "time_us": best[k], "wrong": wrong[k]})
                    );
                }
            }
        }
        out.push((bytes, best, wrong));
    }
    Ok(out)
}

/// Positions of `mpi` and [`RAW_MPI`] among `choices`, if both are there.
fn raw_pair(choices: &[String]) -> Option<(usize, usize)> {
    Some((choices.iter().position(|c| c == "mpi")?, choices.iter().position(|c| c == RAW_MPI)?))
}

/// Measures one size with one `--compare` choice (see [`compare`]).
fn measure_choice(comm: &Communicator, a: &BenchArgs, bytes: u64, choice: &str) -> Result<Row> {
    let (pin, runner) = match choice {
        "auto" => (None, Runner::Sucl),
        RAW_MPI => (None, Runner::RawMpi),
        MPI_NONBLOCKING => (Some("mpi"), Runner::Sucl),
        other => (Some(other), Runner::Sucl),
    };
    comm.pin_backend(pin)?;
    #[cfg(feature = "mpi")]
    sucl_mpi::set_nonblocking_collectives(choice == MPI_NONBLOCKING);
    let row = sucl::with_dtype!(a.dtype, T => measure_with::<T>(comm, a, bytes, runner));
    #[cfg(feature = "mpi")]
    sucl_mpi::set_nonblocking_collectives(false);
    let mut row = row?;
    row.backend = choice.to_string();
    Ok(row)
}

/// The order choices are measured in during `round`: forward, then backward, so that no choice
/// always runs right after the same other one (a slow predecessor can leave the GPU clocked
/// down or the caches cold for whatever comes next).
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    if round.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_fills_its_time_within_the_bounds() {
        let b = Iters::Budget { budget: Duration::from_millis(100), min: 10, max: 1000 };
        assert_eq!(b.count(1e-3), 100, "100 ms of 1 ms calls");
        assert_eq!(b.count(1e-6), 1000, "capped at max");
        assert_eq!(b.count(1.0), 10, "at least min");
        assert_eq!(b.count(0.0), 1000, "a call too quick to time runs the most");
        assert_eq!(b.count(f64::NAN), 1000, "nor does a bad estimate run fewer");
        assert_eq!(Iters::Fixed(7).count(1e-9), 7, "--iters is exact");
        assert_eq!(Iters::Fixed(0).count(1.0), 1);
    }
}
