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

/// Relative difference of two backends' median times within which `sucl tune` counts them as
/// tied: a choice between tied backends costs at most this much, and run-to-run noise of one size
/// was of this order on 4 × H100 and 2 × H200 (2026-11: ±1 µs on device collectives of 10–20 µs).
pub const TIE_MARGIN: f64 = 0.05;

/// One measured size: every round's time of each backend (`times[backend][round]`, backends in
/// the communicator's order; rounds interleaved across backends).
pub struct Measured {
    pub bytes: u64,
    pub times: Vec<Vec<f64>>,
}

/// The median of `xs` (the upper one of an even count); infinite when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
}

/// The backends whose time `m[k]` is within `margin` of the fastest (the fastest first).
fn tied(m: &[f64], margin: f64) -> Vec<usize> {
    let best = fastest(m);
    let mut t: Vec<usize> = (0..m.len()).filter(|&k| m[k] <= m[best] * (1.0 + margin)).collect();
    t.sort_by(|&a, &b| m[a].total_cmp(&m[b]));
    t
}

fn fastest(m: &[f64]) -> usize {
    (0..m.len()).min_by(|&a, &b| m[a].total_cmp(&m[b])).unwrap_or(0)
}

/// The backend chosen at each size, from the median of its rounds: the fastest where it is
/// ahead by more than `margin`; among backends tied within `margin`, the built-in rules' choice
/// (`builtin[i]`, if it is among them), else the clear winner of the nearest size that had one
/// among them (the smaller size first at equal distance), else the fastest median. So a near-tie
/// decided by noise neither overrides the built-in rules nor splits a range into islands.
pub fn choose(points: &[Measured], builtin: &[Option<usize>], margin: f64) -> Vec<usize> {
    let medians: Vec<Vec<f64>> = points.iter().map(|p| p.times.iter().map(|t| median(t)).collect()).collect();
    let ties: Vec<Vec<usize>> = medians.iter().map(|m| tied(m, margin)).collect();
    let clear: Vec<Option<usize>> = ties.iter().map(|t| (t.len() == 1).then(|| t[0])).collect();
    let n = points.len();
    (0..n)
        .map(|i| {
            let t = &ties[i];
            if let Some(w) = clear[i] {
                return w;
            }
            if let Some(b) = builtin.get(i).copied().flatten().filter(|b| t.contains(b)) {
                return b;
            }
            let near = (1..n).find_map(|d| {
                [i.checked_sub(d), Some(i + d).filter(|&j| j < n)].into_iter().flatten().find_map(|j| clear[j].filter(|w| t.contains(w)))
            });
            near.unwrap_or_else(|| fastest(&medians[i]))
        })
        .collect()
}

/// Rounds of crossover refinement at most: each puts a size between every pair of neighbouring
/// sizes whose choices differ, halving (in powers of two) the range where the table could be
/// wrong; a factor-4 sweep needs one round, and a crossover that moves with noise stops after these.
pub const REFINE_ROUNDS: usize = 4;

/// Sizes to measure next so that the table's boundaries lie near where the choice really
/// changes. A rule ends at the next measured size with another choice, so without this a
/// factor-4 sweep that finds ipc at 512 KiB and nccl at 2 MiB gives ipc at 1 MiB, where it may
/// already be far slower. For neighbouring sizes whose choices differ and that lie more than 2×
/// apart: the power of two nearest their geometric middle (in log scale), which lies strictly
/// between them since they span more than one doubling.
pub fn between_crossovers(points: &[Measured], chosen: &[usize]) -> Vec<u64> {
    points
        .windows(2)
        .zip(chosen.windows(2))
        .filter(|(p, c)| c[0] != c[1] && p[1].bytes / 2 > p[0].bytes)
        .filter_map(|(p, _)| {
            let (lo, hi) = (p[0].bytes, p[1].bytes);
            let middle = ((lo as f64) * (hi as f64)).sqrt();
            let pow = 1u64.checked_shl(middle.log2().round() as u32).unwrap_or(u64::MAX);
            (pow > lo && pow < hi).then_some(pow)
        })
        .collect()
}

/// Measures every size of `sizes` (ascending), then refines the crossovers
/// ([`between_crossovers`], at most [`REFINE_ROUNDS`] rounds). Returns the points in size order
/// and each one's built-in choice. Every rank makes the same decisions: the times it decides on
/// are the slowest rank's, the same on every rank.
pub fn sweep(
    sizes: &[u64],
    builtin: impl Fn(u64) -> Option<usize>,
    mut measure: impl FnMut(u64) -> Result<Measured>,
) -> Result<(Vec<Measured>, Vec<Option<usize>>)> {
    let mut points = sizes.iter().map(|&b| measure(b)).collect::<Result<Vec<_>>>()?;
    for _ in 0..REFINE_ROUNDS {
        let known: Vec<Option<usize>> = points.iter().map(|p| builtin(p.bytes)).collect();
        let extra = between_crossovers(&points, &choose(&points, &known, TIE_MARGIN));
        if extra.is_empty() {
            break;
        }
        for bytes in extra {
            points.push(measure(bytes)?);
        }
        points.sort_by_key(|p| p.bytes);
    }
    let known = points.iter().map(|p| builtin(p.bytes)).collect();
    Ok((points, known))
}

/// Prints one op's table (median µs per backend, the choice, and `tie` where the choice was
/// within the margin of another backend) and returns its tuning rules.
pub fn report(op: CollOp, n: usize, names: &[&str], points: &[Measured], builtin: &[Option<usize>]) -> String {
    let chosen = choose(points, builtin, TIE_MARGIN);
    let mut header = format!("{:>12}", "bytes");
    for name in names {
        header += &format!(" {name:>10}");
    }
    println!("# {} on {n} ranks: median time (µs) per backend", op.name());
    println!("{header} {:>8}", "chosen");
    for (p, &c) in points.iter().zip(&chosen) {
        let m: Vec<f64> = p.times.iter().map(|t| median(t)).collect();
        let mut line = format!("{:>12}", p.bytes);
        for t in &m {
            line += &format!(" {t:>10.2}");
        }
        let tie = if tied(&m, TIE_MARGIN).len() > 1 { " tie" } else { "" };
        println!("{line} {:>8}{tie}", names[c]);
    }
    let winners: Vec<(u64, &str)> = points.iter().zip(&chosen).map(|(p, &c)| (p.bytes, names[c])).collect();
    rules(op, n, &winners)
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
        "# Tuning table written by `sucl tune` for {} ranks on {} ({}), dtype {}.\n# Per op and size range, the backend chosen from the median of {} interleaved rounds ({} iterations each); near-ties (within {:.0} %) go to the backend that won the neighbouring sizes.\n",
        comm.size(),
        sucl_core::bootstrap::hostname(),
        names.join(", "),
        a.dtype,
        a.rounds,
        a.iters,
        TIE_MARGIN * 100.0
    );
    let sizes = bench::sizes(a.min_bytes, a.max_bytes, a.factor);
    // Every measurement is checked; a backend that computes wrong results wins nothing.
    let mut wrong = vec![];
    for &op in &a.ops {
        // Host calls have no built-in choice apart from the threshold: ties follow the
        // neighbouring sizes.
        let (points, _) = sweep(&sizes, |_| None, |bytes| measure_host(comm, a, op, &names, bytes, &mut wrong))?;
        if lead {
            file += &report(op, comm.size(), &names, &points, &[]);
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

/// One size of `op` on every backend, `a.rounds` interleaved rounds; wrong results are noted in
/// `wrong`.
fn measure_host(comm: &Communicator, a: &TuneArgs, op: CollOp, names: &[&str], bytes: u64, wrong: &mut Vec<String>) -> Result<Measured> {
    let mut times = vec![vec![]; names.len()];
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
            times[k].push(row.time_us);
            if let Some(w) = row.wrong.filter(|&w| w > 0) {
                wrong.push(format!("{} {} B on {name}: {w} wrong elements", op.name(), bytes));
            }
        }
    }
    comm.pin_backend(None)?;
    Ok(Measured { bytes, times })
}

/// The exit code of a tune whose results were wrong, returned only once every rank is here. Every
/// rank saw the same (store-summed) counts, so every rank fails; but none may exit before the lead
/// has printed its report, or the launcher ends the lead mid-report (seen once in CI).
pub fn fail_together(comm: &Communicator) -> Result<i32> {
    comm.oob_all_gather("sucl-cli/tune/reported", &[])?;
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(bytes: u64, times: &[&[f64]]) -> Measured {
        Measured { bytes, times: times.iter().map(|t| t.to_vec()).collect() }
    }

    // Backends in these tests: 0 = nccl, 1 = ipc.

    #[test]
    fn a_clear_winner_takes_its_size_whatever_the_built_in_rules_say() {
        let points = [at(1 << 20, &[&[20.0, 20.5, 19.8], &[15.0, 15.2, 14.9]])];
        assert_eq!(choose(&points, &[Some(0)], TIE_MARGIN), vec![1]);
    }

    #[test]
    fn the_median_of_the_rounds_decides_not_one_lucky_round() {
        // One fast round of ipc (best-of would tie it with nccl, or pick it); its median is slow.
        let points = [at(1 << 20, &[&[12.8, 13.1, 12.9, 13.0, 12.7], &[12.6, 16.5, 16.4, 16.6, 16.2]])];
        assert_eq!(choose(&points, &[None], TIE_MARGIN), vec![0]);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 3.0);
        assert!(median(&[]).is_infinite());
    }

    #[test]
    fn a_near_tie_goes_to_the_built_in_choice() {
        // broadcast at 1 MiB on 4 GPUs: 17.80 vs 17.80 µs, once decided by noise.
        let points = [at(1 << 20, &[&[17.80, 17.81, 17.79], &[17.80, 17.78, 17.82]])];
        assert_eq!(choose(&points, &[Some(0)], TIE_MARGIN), vec![0]);
        assert_eq!(choose(&points, &[Some(1)], TIE_MARGIN), vec![1]);
        // Within the margin, though slower: the built-in choice still.
        let points = [at(1 << 20, &[&[18.5, 18.6, 18.4], &[17.9, 18.0, 17.8]])];
        assert_eq!(choose(&points, &[Some(0)], TIE_MARGIN), vec![0]);
    }

    #[test]
    fn without_a_built_in_choice_a_near_tie_follows_the_nearest_clear_neighbour() {
        let points = [
            at(1 << 10, &[&[12.0], &[6.0]]),  // ipc clearly
            at(1 << 12, &[&[12.0], &[6.5]]),  // ipc clearly
            at(1 << 14, &[&[10.0], &[10.1]]), // a tie: its lower neighbour says ipc
            at(1 << 16, &[&[20.0], &[30.0]]), // nccl clearly
            at(1 << 18, &[&[40.0], &[40.5]]), // a tie: both neighbours say nccl at distance 1
            at(1 << 20, &[&[60.0], &[80.0]]), // nccl clearly
        ];
        assert_eq!(choose(&points, &[], TIE_MARGIN), vec![1, 1, 1, 0, 0, 0]);
        // The built-in choice, where given, comes before the neighbours.
        let builtin = [None, None, Some(0), None, Some(1), None];
        assert_eq!(choose(&points, &builtin, TIE_MARGIN), vec![1, 1, 0, 0, 1, 0]);
        // No neighbour with a clear winner among the tied: the fastest median.
        let alone = [at(8, &[&[10.0], &[9.9]])];
        assert_eq!(choose(&alone, &[], TIE_MARGIN), vec![1]);
        // A zero margin: the fastest median everywhere.
        assert_eq!(choose(&points, &builtin, 0.0), vec![1, 1, 0, 0, 0, 0]);
    }

    /// A model of two backends: ipc (1) fast up to about 768 KiB, nccl (0) faster beyond,
    /// as broadcast measured on 4 × H100 (2026-11-27); counts the sizes measured.
    fn model(bytes: u64, measured: &mut Vec<u64>) -> Result<Measured> {
        measured.push(bytes);
        let mib = bytes as f64 / (1 << 20) as f64;
        Ok(at(bytes, &[&[11.0 + 8.0 * mib], &[6.0 + 14.0 * mib]]))
    }

    #[test]
    fn a_crossover_between_far_apart_sizes_is_measured_in_between() {
        let sizes = bench::sizes(8, 8 << 20, 4);
        let mut measured = vec![];
        let (points, builtin) = sweep(&sizes, |_| None, |b| model(b, &mut measured)).unwrap();
        // 512 KiB (ipc) and 2 MiB (nccl) differ: 1 MiB is measured, and it is nccl's.
        assert!(measured.contains(&(1 << 20)), "{measured:?}");
        assert_eq!(measured.len(), sizes.len() + 1, "one crossover, one added size: {measured:?}");
        assert!(points.windows(2).all(|w| w[0].bytes < w[1].bytes), "in size order");
        assert_eq!(builtin.len(), points.len());
        let chosen = choose(&points, &builtin, TIE_MARGIN);
        let winners: Vec<(u64, &str)> = points.iter().zip(&chosen).map(|(p, &c)| (p.bytes, ["nccl", "ipc"][c])).collect();
        let text = rules(CollOp::Broadcast, 4, &winners);
        assert!(text.contains("bytes = [0, 1048576]\nbackend = \"ipc\""), "{text}");
    }

    #[test]
    fn without_a_crossover_nothing_more_is_measured() {
        let sizes = bench::sizes(8, 256 << 10, 4);
        let mut measured = vec![];
        sweep(&sizes, |_| None, |b| model(b, &mut measured)).unwrap();
        assert_eq!(measured, sizes);
        // Neighbours at most 2× apart are not split, crossover or not.
        let points = [at(1 << 19, &[&[1.0], &[2.0]]), at(1 << 20, &[&[2.0], &[1.0]])];
        assert!(between_crossovers(&points, &[0, 1]).is_empty());
        // Sizes that are not powers of two: the power of two nearest their middle (12).
        let points = [at(3, &[&[1.0], &[2.0]]), at(48, &[&[2.0], &[1.0]])];
        assert_eq!(between_crossovers(&points, &[0, 1]), vec![16]);
    }

    #[test]
    fn rules_cover_every_size_from_zero_without_gaps() {
        let text = rules(CollOp::AllReduce, 4, &[(8, "ipc"), (1024, "ipc"), (1 << 20, "nccl"), (1 << 24, "nccl")]);
        assert_eq!(text.matches("[[tuning]]").count(), 2, "{text}");
        assert!(text.contains("bytes = [0, 1048576]\nbackend = \"ipc\""), "{text}");
        assert!(text.contains(&format!("bytes = [1048576, {}]\nbackend = \"nccl\"", i64::MAX)), "{text}");
        assert!(text.contains("ranks = [4, 4]"), "{text}");
    }
}
