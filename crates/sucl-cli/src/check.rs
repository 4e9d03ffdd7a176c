//! `sucl check`: the correctness matrix — every collective, dtype, reduce op and a spread of
//! sizes (0, 1, counts not divisible by the rank count, pipelined and chunked sizes), plus
//! point-to-point, in-place forms and split — run inside one world and checked element by
//! element against serial references. Hidden flags inject faults for the failure tests.

use crate::ops::run_op;
use crate::pattern::{buffer_lens, count_wrong, fill, fill_input, value, Case};
use sucl::{CollOp, Communicator, DType, Element, ReduceOp, Result};

/// What to check.
pub struct CheckArgs {
    pub ops: Vec<CollOp>,
    pub dtypes: Vec<DType>,
    pub redops: Vec<ReduceOp>,
    pub sizes: Option<Vec<usize>>,
    pub big_mib: usize,
    pub seed: u64,
    pub inject_exit: Option<usize>,
    pub inject_kill: Option<usize>,
    pub inject_mismatch: Option<usize>,
    pub inject_stall: Option<usize>,
    pub inject_after: usize,
}

struct State<'a> {
    comm: &'a Communicator,
    args: &'a CheckArgs,
    checks: u64,
    failures: u64,
    ops_done: usize,
}

impl State<'_> {
    fn record(&mut self, what: &str, wrong: usize) {
        self.checks += 1;
        if wrong > 0 {
            self.failures += 1;
            eprintln!("WRONG {what}: {wrong} wrong elements");
        }
    }

    /// Fault injection points (hidden flags, used by the failure tests).
    fn before_op(&mut self) -> Result<()> {
        self.ops_done += 1;
        if self.ops_done != self.args.inject_after {
            return Ok(());
        }
        let me = Some(self.comm.rank());
        if me == self.args.inject_exit {
            eprintln!("injected fault: rank {} exits now", self.comm.rank());
            std::process::exit(3);
        }
        if me == self.args.inject_kill {
            eprintln!("injected fault: rank {} kills itself now", self.comm.rank());
            // SAFETY: raise(2) has no memory preconditions; SIGKILL ends this process at once.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        if me == self.args.inject_stall {
            eprintln!("injected fault: rank {} stops answering", self.comm.rank());
            std::thread::sleep(std::time::Duration::from_secs(120));
            std::process::exit(5);
        }
        if let Some(bad) = self.args.inject_mismatch {
            let n = if self.comm.rank() == bad { 1001 } else { 1000 };
            let mut v = vec![1.0f32; n];
            self.comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            eprintln!("injected mismatch was not detected");
            std::process::exit(4);
        }
        Ok(())
    }
}

fn sizes_for(n: usize, custom: &Option<Vec<usize>>) -> Vec<usize> {
    custom.clone().unwrap_or_else(|| vec![0, 1, 7, 3 * n + 1, 1000, 70_001])
}

fn check_collective<T: Element>(st: &mut State, op: CollOp, redop: ReduceOp, count: usize, root: usize, seed: u64) -> Result<()> {
    let (comm, n, r) = (st.comm, st.comm.size(), st.comm.rank());
    let (sl, rl) = buffer_lens(op, count, n, r, root);
    let mut send = vec![T::from_i64(0); sl];
    let poison = T::from_i64(-77);
    let mut recv = vec![poison; rl];
    fill_input(op, &mut send, &mut recv, r, n, root, seed, redop);
    st.before_op()?;
    run_op(comm, op, &send, &mut recv, redop, root)?;
    let case = Case { op, count, n, rank: r, root, seed, redop };
    let wrong = count_wrong(&case, &recv);
    st.record(&format!("{} {} {} count={count} root={root}", op.name(), T::DTYPE, redop), wrong);
    // In-place forms.
    if matches!(op, CollOp::AllReduce | CollOp::AllGather | CollOp::Reduce) {
        let seed = seed + 1;
        let case = Case { seed, ..case };
        let mut buf = vec![poison; rl.max(sl)];
        let mut wrong = 0;
        match op {
            CollOp::AllReduce => {
                fill(&mut buf, r, n, 0, seed, Some(redop));
                comm.all_reduce_in_place(&mut buf, redop)?;
                wrong = count_wrong(&case, &buf);
            }
            CollOp::Reduce => {
                let mut b = vec![T::from_i64(0); count];
                fill(&mut b, r, n, 0, seed, Some(redop));
                comm.reduce_in_place(&mut b, redop, root)?;
                if r == root {
                    wrong = count_wrong(&case, &b);
                }
            }
            _ => {
                for i in 0..count {
                    buf[r * count + i] = value(r, i, n, seed, None);
                }
                comm.all_gather_in_place(&mut buf)?;
                wrong = count_wrong(&case, &buf);
            }
        }
        st.record(&format!("{} (in place) {} {} count={count}", op.name(), T::DTYPE, redop), wrong);
    }
    Ok(())
}

fn check_p2p(st: &mut State) -> Result<()> {
    let (comm, n, r) = (st.comm, st.comm.size(), st.comm.rank());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    // Ring exchange at several sizes, through sendrecv.
    for count in [0usize, 1, 4097, 300_001] {
        let out: Vec<u32> = (0..count).map(|i| (r * 31 + i) as u32).collect();
        let mut got = vec![u32::MAX; count];
        st.before_op()?;
        let status = comm.sendrecv(&out, right, &mut got, left, 9)?;
        let wrong = (0..count).filter(|&i| got[i] != (left * 31 + i) as u32).count() + usize::from(status.count != count);
        st.record(&format!("sendrecv ring count={count}"), wrong);
    }
    // Tags: two messages posted in one order, received in the other; same-tag messages in order.
    if n > 1 {
        let a = [r as i64 * 10 + 1; 3];
        let b = [r as i64 * 10 + 2; 5];
        let c = [r as i64 * 10 + 3; 2];
        let (mut ga, mut gb, mut gc) = ([0i64; 3], [0i64; 8], [0i64; 2]);
        st.before_op()?;
        let lens = comm.nonblocking(|s| {
            s.isend(&a, right, 1)?;
            s.isend(&b, right, 2)?;
            s.isend(&c, right, 2)?;
            let rb = s.irecv(&mut gb, left, 2)?;
            let rc = s.irecv(&mut gc, left, 2)?;
            let mut ra = s.irecv(&mut ga, left, 1)?;
            let nb = rb.wait()?;
            let nc = rc.wait()?;
            let na = loop {
                if let Some(k) = ra.test()? {
                    break k;
                }
            };
            Ok((na, nb, nc))
        })?;
        let l = left as i64 * 10;
        let wrong = usize::from(lens != (3, 5, 2))
            + ga.iter().filter(|&&x| x != l + 1).count()
            + gb[..5].iter().filter(|&&x| x != l + 2).count()
            + gc.iter().filter(|&&x| x != l + 3).count();
        st.record("isend/irecv tag matching and ordering", wrong);
    }
    // Self send.
    let mine = [r as f64; 4];
    let mut back = [0f64; 4];
    comm.nonblocking(|s| {
        let q = s.irecv(&mut back, r, 5)?;
        s.isend(&mine, r, 5)?;
        q.wait().map(|_| ())
    })?;
    st.record("send to self", back.iter().filter(|&&x| x != r as f64).count());
    // Split into even/odd ranks, reversed order by key.
    let sub = comm.split(Some((r % 2) as u32), -(r as i64))?.expect("member");
    let members: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).collect();
    let want_rank = members.len() - 1 - members.iter().position(|&q| q == r).unwrap();
    let mut v = [r as u64];
    sub.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
    let wrong = usize::from(sub.rank() != want_rank)
        + usize::from(sub.size() != members.len())
        + usize::from(v[0] != members.iter().sum::<usize>() as u64);
    st.record("split(color = rank % 2, key = -rank) + all_reduce", wrong);
    let none = comm.split(None, 0)?;
    st.record("split with no color", usize::from(none.is_some()));
    Ok(())
}

/// Runs the matrix; returns the process exit code (0 only if every check passed on every rank).
pub fn run(comm: &Communicator, args: &CheckArgs) -> Result<i32> {
    let mut st = State { comm, args, checks: 0, failures: 0, ops_done: 0 };
    let n = comm.size();
    let t0 = std::time::Instant::now();
    check_p2p(&mut st)?;
    crate::vcheck::run(comm, &mut |what, wrong| st.record(what, wrong))?;
    let mut seed = args.seed;
    for &op in &args.ops {
        for &dt in &args.dtypes {
            let redops: &[ReduceOp] = if op.reduces() { &args.redops } else { &[ReduceOp::Sum] };
            for &redop in redops {
                for count in sizes_for(n, &args.sizes) {
                    seed += 1;
                    let root = (count + seed as usize) % n;
                    sucl::with_dtype!(dt, T => check_collective::<T>(&mut st, op, redop, count, root, seed)?);
                }
            }
        }
    }
    if args.big_mib > 0 {
        let count = (args.big_mib << 20) / 4;
        for op in [CollOp::AllReduce, CollOp::Broadcast, CollOp::ReduceScatter] {
            let c = if op == CollOp::ReduceScatter { count / n } else { count };
            seed += 1;
            check_collective::<f32>(&mut st, op, ReduceOp::Sum, c, n - 1, seed)?;
        }
    }
    // Through the rendezvous store: a broken backend must not be the one adding up its failures.
    let totals = [crate::ops::oob_sum(comm, "check/checks", st.checks)?, crate::ops::oob_sum(comm, "check/failures", st.failures)?];
    if comm.rank() == 0 {
        println!(
            "sucl check: {n} ranks, backend {}: {} checks, {} wrong ({:.1} s)",
            comm.backend_label(),
            totals[0],
            totals[1],
            t0.elapsed().as_secs_f64()
        );
    }
    crate::ops::reported(comm)?;
    Ok(if totals[1] == 0 { 0 } else { 1 })
}
