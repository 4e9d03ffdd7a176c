//! `sucl tune`: measures every backend this communicator can use, op by op and size by size,
//! finds the crossovers, and writes them as a tuning table that `--backend auto` then follows.

use crate::bench::{self, BenchArgs, BenchOp};
use std::fmt::Write as _;
use sucl::{CollOp, Communicator, DType, ReduceOp, Result};

/// Tuning settings.
pub struct TuneArgs {
    pub ops: Vec<CollOp>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub iters: usize,
    pub warmup: usize,
    pub rounds: usize,
    pub dtype: DType,
    pub out: String,
}

/// One measured size: the best time of each backend (same order as the communicator's list).
struct Point {
    bytes: u64,
    times: Vec<f64>,
}

impl Point {
    fn winner(&self) -> usize {
        (0..self.times.len()).min_by(|&a, &b| self.times[a].total_cmp(&self.times[b])).unwrap_or(0)
    }
    fn margin(&self) -> f64 {
        let w = self.winner();
        let second = self.times.iter().enumerate().filter(|(i, _)| *i != w).map(|(_, t)| *t).fold(f64::INFINITY, f64::min);
        second / self.times[w]
    }
}

/// Tuning rules for `op` on `n` ranks from per-size winners (sizes ascending): consecutive sizes
/// with the same winner become one rule, which ends where the next measured size has another.
pub fn rules(op: CollOp, n: usize, winners: &[(u64, &str)]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < winners.len() {
        let w = winners[i].1;
        let mut j = i;
        while j + 1 < winners.len() && winners[j + 1].1 == w {
            j += 1;
        }
        let lo = if i == 0 { 0 } else { winners[i].0 };
        let hi = if j + 1 == winners.len() { i64::MAX as u64 } else { winners[j + 1].0 };
        let _ = write!(out, "\n[[tuning]]\nop = \"{}\"\nranks = [{n}, {n}]\nbytes = [{lo}, {hi}]\nbackend = \"{w}\"\n", op.name());
        i = j + 1;
    }
    out
}

/// Runs the measurements; rank 0 prints the table and writes the file. Returns the exit code.
pub fn run(comm: &Communicator, a: &TuneArgs) -> Result<i32> {
    let names = comm.backends();
    let lead = comm.rank() == 0;
    if names.len() < 2 && lead {
        eprintln!("sucl tune: only {names:?} can serve this job; nothing to choose between");
    }
    let mut file = format!(
        "# Tuning table written by `sucl tune` for {} ranks on {} ({}), dtype {}.\n# Per op and size range, the backend that was fastest (best of {} rounds, {} iterations each).\n",
        comm.size(),
        sucl_core::bootstrap::hostname(),
        names.join(", "),
        a.dtype,
        a.rounds,
        a.iters
    );
    let sizes = bench::sizes(a.min_bytes, a.max_bytes, a.factor);
    // Every measurement is checked; a backend that computes wrong results wins nothing.
    let mut wrong = vec![];
    for &op in &a.ops {
        let mut points = vec![];
        for &bytes in &sizes {
            let mut times = vec![f64::INFINITY; names.len()];
            for round in 0..a.rounds.max(1) {
                for k in crate::bench::round_order(names.len(), round) {
                    let name = names[k];
                    comm.pin_backend(Some(name))?;
                    let args = BenchArgs {
                        op: BenchOp::Coll(op),
                        min_bytes: bytes,
                        max_bytes: bytes,
                        factor: 2,
                        iters: bench::Iters::Fixed(a.iters),
                        warmup: a.warmup,
                        dtype: a.dtype,
                        redop: ReduceOp::Sum,
                        root: 0,
                        json: false,
                        check: true,
                        graph: false,
                    };
                    let row = sucl::with_dtype!(a.dtype, T => bench::measure::<T>(comm, &args, bytes)?);
                    times[k] = times[k].min(row.time_us);
                    if let Some(w) = row.wrong.filter(|&w| w > 0) {
                        wrong.push(format!("{} {} B on {name}: {w} wrong elements", op.name(), bytes));
                    }
                }
            }
            comm.pin_backend(None)?;
            points.push(Point { bytes, times });
        }
        if lead {
            println!("# {} on {} ranks: best time (µs) per backend", op.name(), comm.size());
            let mut header = format!("{:>12}", "bytes");
            for n in &names {
                header += &format!(" {n:>10}");
            }
            println!("{header} {:>8} {:>7}", "winner", "margin");
            for p in &points {
                let mut line = format!("{:>12}", p.bytes);
                for t in &p.times {
                    line += &format!(" {t:>10.2}");
                }
                println!("{line} {:>8} {:>6.2}x", names[p.winner()], p.margin());
            }
            let winners: Vec<(u64, &str)> = points.iter().map(|p| (p.bytes, names[p.winner()])).collect();
            file += &rules(op, comm.size(), &winners);
        }
    }
    if !wrong.is_empty() {
        if lead {
            for w in &wrong {
                eprintln!("sucl tune: WRONG {w}");
            }
            eprintln!("sucl tune: some results were wrong; {} not written", a.out);
        }
        return fail_together(comm);
    }
    if lead {
        if let Err(e) = std::fs::write(&a.out, file) {
            eprintln!("sucl tune: cannot write {}: {e}", a.out);
            return Ok(1);
        }
        println!("# wrote {}", a.out);
    }
    Ok(0)
}

/// The exit code of a tune whose results were wrong, returned only once every rank is here. Every
/// rank saw the same (store-summed) counts, so every rank fails; but none may exit before the lead
/// has printed its report, or the launcher ends the lead mid-report (seen once in CI).
pub fn fail_together(comm: &Communicator) -> Result<i32> {
    comm.oob_all_gather("sucl-cli/tune/reported", &[])?;
    Ok(1)
}
