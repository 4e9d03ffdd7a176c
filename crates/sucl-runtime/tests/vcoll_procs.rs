//! Host v-collectives across real processes: every block lands where its table says, on shm
//! (the native path: mailbox-sized calls in one step, larger ones in arena windows) and tcp
//! (point-to-point), at 2–4 ranks; and a rank that dies before a v-collective is an error on
//! every other rank, well before the timeout.
//!
//! The calls draw their counts tables from a generator seeded alike on every rank: zeros,
//! small blocks and blocks larger than the shm window (so one block spans several windows and
//! one window holds pieces of several blocks), every root, displacements with gaps in shuffled
//! order. Receive buffers start filled with a sentinel and are compared element by element —
//! gaps included — with a reference built from the value function alone, so a block that lands
//! at the wrong place, from the wrong rank or with the wrong length is caught.
//!
//! The test re-runs its own binary as the ranks: with `SUCL_VTEST_RANK` set it is a rank,
//! otherwise the parent that starts them and checks their outcome.

mod common;
use common::spawn_ranks;
use std::io::Read;
use std::time::{Duration, Instant};
use sucl_runtime::{Communicator, Error, Result};

const SENTINEL: u32 = 0xdead_beef;

/// A small deterministic generator (the same sequence on every rank).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// A block length: zero, small, or up to `big` elements.
    fn count(&mut self, big: usize) -> usize {
        match self.below(4) {
            0 => 0,
            1 | 2 => self.below(40),
            _ => big / 2 + self.below(big / 2 + 1),
        }
    }
}

/// The value of element `k` of the block rank `src` sends to rank `dst` in call `call`.
fn val(call: usize, src: usize, dst: usize, k: usize) -> u32 {
    (call as u32).wrapping_mul(0x9e37_79b9) ^ (src as u32) << 24 ^ (dst as u32) << 16 ^ (k as u32).wrapping_mul(2654435761) >> 8
}

/// Displacements for blocks of `counts`, each after a gap of 0–3 elements, in shuffled order;
/// returns them and the buffer length.
fn layout(g: &mut Gen, counts: &[usize]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..counts.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, g.below(i + 1));
    }
    let mut displs = vec![0; counts.len()];
    let mut at = 0;
    for r in order {
        at += g.below(4);
        displs[r] = at;
        at += counts[r];
    }
    (displs, at + g.below(4))
}

/// What a receive buffer of `len` must hold: `blocks` = (displacement, count, source, dest).
fn reference(len: usize, call: usize, blocks: impl Iterator<Item = (usize, usize, usize, usize)>) -> Vec<u32> {
    let mut want = vec![SENTINEL; len];
    for (d, c, src, dst) in blocks {
        for k in 0..c {
            want[d + k] = val(call, src, dst, k);
        }
    }
    want
}

/// Records the first difference of `got` from `want` in `failed` (the rank keeps calling, so
/// that the others are not left waiting for it).
fn compare(failed: &mut Option<String>, what: &str, got: &[u32], want: &[u32]) {
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        let wrong = got.iter().zip(want).filter(|(a, b)| a != b).count();
        let why = format!("{what}: {wrong} of {} elements wrong, first at {i}: {:#x}, want {:#x}", want.len(), got[i], want[i]);
        failed.get_or_insert(why);
    }
}

/// One call of each kind per round, `rounds` rounds, blocks up to `big` elements.
fn rank_main(comm: &Communicator, rounds: usize, big: usize) -> Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    let mut g = Gen(0x5eed + n as u64);
    let mut failed = None;
    for call in 0..4 * rounds {
        let root = g.below(n);
        let counts: Vec<usize> = (0..n).map(|_| g.count(big)).collect();
        let (displs, len) = layout(&mut g, &counts);
        let what = format!(
            "call {call} ({} at {n} ranks, root {root}, counts {counts:?})",
            ["gatherv", "scatterv", "all_gatherv", "all_to_allv"][call % 4]
        );
        match call % 4 {
            0 => {
                let send: Vec<u32> = (0..counts[me]).map(|k| val(call, me, root, k)).collect();
                let mut recv = vec![SENTINEL; if me == root { len } else { 0 }];
                comm.gatherv(&send[..], &mut recv[..], &counts, &displs, root)?;
                if me == root {
                    compare(&mut failed, &what, &recv, &reference(len, call, (0..n).map(|r| (displs[r], counts[r], r, root))));
                }
            }
            1 => {
                let send = if me == root { reference(len, call, (0..n).map(|r| (displs[r], counts[r], root, r))) } else { Vec::new() };
                let mut recv = vec![SENTINEL; counts[me]];
                comm.scatterv(&send[..], &mut recv[..], &counts, &displs, root)?;
                compare(&mut failed, &what, &recv, &reference(counts[me], call, std::iter::once((0, counts[me], root, me))));
            }
            2 => {
                let send: Vec<u32> = (0..counts[me]).map(|k| val(call, me, n, k)).collect();
                let mut recv = vec![SENTINEL; len];
                comm.all_gatherv(&send[..], &mut recv[..], &counts, &displs)?;
                compare(&mut failed, &what, &recv, &reference(len, call, (0..n).map(|r| (displs[r], counts[r], r, n))));
            }
            _ => {
                let matrix: Vec<usize> = (0..n * n).map(|_| g.count(big)).collect();
                let row = &matrix[me * n..(me + 1) * n];
                let col: Vec<usize> = (0..n).map(|i| matrix[i * n + me]).collect();
                let (sd, slen) = layout(&mut g, row);
                let (rd, rlen) = layout(&mut g, &col);
                let send = reference(slen, call, (0..n).map(|j| (sd[j], row[j], me, j)));
                let mut recv = vec![SENTINEL; rlen];
                comm.all_to_allv(&send[..], &sd, &mut recv[..], &rd, &matrix)?;
                let what = format!("{what}, matrix {matrix:?}");
                compare(&mut failed, &what, &recv, &reference(rlen, call, (0..n).map(|i| (rd[i], col[i], i, me))));
            }
        }
        if call % 3 == 0 {
            // A plain collective in between shifts the shared-memory step parity.
            comm.barrier()?;
        }
    }
    failed.map_or(Ok(()), |why| Err(Error::Config(why)))
}

/// The victim (rank `victim`) exits before the `at`-th call, or with `midway` from another
/// thread 50 ms into a stream of large calls (most likely inside one); the others must fail.
fn lost_main(comm: &Communicator, victim: usize, at: usize, midway: bool) -> Result<()> {
    let n = comm.size();
    let each = if midway { 1 << 18 } else { 5000 };
    let counts = vec![each; n * n];
    let d: Vec<usize> = (0..n).map(|r| r * each).collect();
    let send = vec![comm.rank() as u32; each * n];
    let mut recv = vec![0u32; each * n];
    if midway && comm.rank() == victim {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            eprintln!("rank {victim} exits now");
            std::process::exit(3);
        });
    }
    for call in 0..if midway { 100_000 } else { at + 1 } {
        if call == at && comm.rank() == victim && !midway {
            eprintln!("rank {victim} exits now");
            std::process::exit(3);
        }
        comm.all_to_allv(&send[..], &d, &mut recv[..], &d, &counts)?;
    }
    Ok(())
}

/// Rank 1's call differs: its table gives rank 0 one element more than everyone else's, or
/// (`invalid`) its own arguments are wrong (a send or receive buffer one element too long, a
/// send block past the end). Every rank must get `Mismatch` — rank 1 its `InvalidArgument`
/// when invalid — with nothing delivered: its receive buffer, the root's own block included,
/// still all sentinel.
fn mismatch_main(comm: &Communicator, op: usize, each: usize, invalid: bool) -> Result<()> {
    let (n, me) = (comm.size(), comm.rank());
    let bad = me == 1;
    let mut counts = vec![each; if op == 3 { n * n } else { n }];
    if bad && !invalid {
        counts[0] += 1;
    }
    let d: Vec<usize> = (0..n).map(|r| r * (each + 1)).collect();
    let mut sd = d.clone();
    if bad && invalid {
        sd[n - 1] = n * (each + 1);
    }
    let send = vec![7u32; n * (each + 1)];
    let mut recv = vec![SENTINEL; n * (each + 1)];
    let own = counts[me] + usize::from(bad && invalid);
    let r = match op {
        0 => comm.gatherv(&send[..own], &mut recv[..], &counts, &d, 0),
        1 => comm.scatterv(&send[..], &mut recv[..own], &counts, &d, 0),
        2 => comm.all_gatherv(&send[..own], &mut recv[..], &counts, &d),
        _ => comm.all_to_allv(&send[..], &sd, &mut recv[..], &d, &counts),
    };
    match r {
        Err(Error::InvalidArgument { .. }) if bad && invalid => {}
        Err(Error::Mismatch { .. }) if !(bad && invalid) => {}
        other => return Err(Error::Config(format!("op {op}: rank 1's differing call gave {other:?} here"))),
    }
    match recv.iter().position(|&x| x != SENTINEL) {
        Some(i) => Err(Error::Config(format!("op {op}: element {i} was written although the calls differ"))),
        None => Ok(()),
    }
}

/// A rank's exit status, output and how long it ran.
struct RankOutcome {
    ok: bool,
    out: String,
    elapsed: Duration,
}

/// Runs test `test` as `n` ranks (torchrun's variables, rank 0 hosting the store) with `env`;
/// a rank still running after `limit` is a hang and fails the test.
fn world(test: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Vec<RankOutcome> {
    let mut ranks = spawn_ranks(test, "SUCL_VTEST_RANK", n, env);
    let start = Instant::now();
    let mut done: Vec<Option<(std::process::ExitStatus, Duration)>> = vec![None; n];
    while done.iter().any(Option::is_none) {
        for (r, c) in ranks.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.0.try_wait().expect("try_wait").map(|s| (s, start.elapsed()));
            }
        }
        if start.elapsed() > limit {
            let mut all = String::new();
            for c in &mut ranks {
                let _ = c.0.kill();
                let _ = c.0.stderr.take().unwrap().read_to_string(&mut all);
            }
            panic!("{test}: ranks still running after {limit:?} (a hang): {all}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ranks
        .iter_mut()
        .zip(done)
        .map(|(c, d)| {
            let (status, elapsed) = d.unwrap();
            let mut out = String::new();
            let _ = c.0.stdout.take().unwrap().read_to_string(&mut out);
            let _ = c.0.stderr.take().unwrap().read_to_string(&mut out);
            RankOutcome { ok: status.success(), out, elapsed }
        })
        .collect()
}

/// In a rank: runs `f` on a fresh communicator and reports as the parent expects.
fn as_rank(f: impl FnOnce(&Communicator) -> Result<()>) -> bool {
    let Ok(rank) = std::env::var("SUCL_VTEST_RANK") else { return false };
    let comm = sucl_runtime::init().expect("init");
    match f(&comm) {
        Ok(()) => println!("RANK {rank} OK"),
        Err(e) => println!("RANK {rank} FAILED: {e}"),
    }
    true
}

fn env_usize(key: &str) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{key} not set"))
}

#[test]
fn v_collectives_put_every_block_in_its_place() {
    if as_rank(|c| rank_main(c, env_usize("SUCL_VTEST_ROUNDS"), env_usize("SUCL_VTEST_BIG"))) {
        return;
    }
    // (backend, ranks, big block in elements, extra settings). The shm window is 256 KiB by
    // default (blocks of 70000 u32 span two); the small settings make it 4 KiB in 4 KiB arena
    // halves, so 3000-element blocks span three and every all_to_allv row many.
    let small: &[(&str, &str)] = &[("SUCL_SHM_ARENA_BYTES", "8192"), ("SUCL_SHM_CHUNK_BYTES", "4096")];
    type Run<'a> = (&'a str, usize, usize, &'a [(&'a str, &'a str)]);
    let runs: [Run; 5] =
        [("shm", 2, 70000, &[]), ("shm", 3, 3000, small), ("shm", 4, 3000, small), ("shm", 4, 70000, &[]), ("tcp", 3, 20000, &[])];
    for (backend, n, big, extra) in runs {
        let big = big.to_string();
        let mut env = vec![("SUCL_BACKEND", backend), ("SUCL_TIMEOUT", "30"), ("SUCL_VTEST_ROUNDS", "6"), ("SUCL_VTEST_BIG", &big)];
        env.extend_from_slice(extra);
        let outcomes = world("v_collectives_put_every_block_in_its_place", n, &env, Duration::from_secs(120));
        for (r, o) in outcomes.iter().enumerate() {
            assert!(o.ok && o.out.contains(&format!("RANK {r} OK")), "{backend} x{n} {extra:?}: rank {r} failed:\n{}", o.out);
        }
    }
}

#[test]
fn a_rank_lost_before_or_during_v_collectives_is_an_error_on_every_other_rank() {
    let midway = std::env::var("SUCL_VTEST_MIDWAY").is_ok();
    if as_rank(|c| lost_main(c, 2, 3, midway)) {
        return;
    }
    for (backend, midway) in [("shm", false), ("tcp", false), ("shm", true)] {
        let mut env = vec![("SUCL_BACKEND", backend), ("SUCL_TIMEOUT", "30")];
        if midway {
            env.push(("SUCL_VTEST_MIDWAY", "1"));
        }
        let outcomes =
            world("a_rank_lost_before_or_during_v_collectives_is_an_error_on_every_other_rank", 3, &env, Duration::from_secs(60));
        let case = format!("{backend}{}", if midway { " (midway)" } else { "" });
        assert!(!outcomes[2].ok && outcomes[2].out.contains("rank 2 exits now"), "{case}: the victim:\n{}", outcomes[2].out);
        for (r, o) in outcomes.iter().enumerate().take(2) {
            assert!(o.out.contains(&format!("RANK {r} FAILED")), "{case}: rank {r} must fail:\n{}", o.out);
            assert!(o.out.contains("lost peer rank 2"), "{case}: rank {r} must name rank 2:\n{}", o.out);
            assert!(o.elapsed < Duration::from_secs(20), "{case}: rank {r} waited {:?}, near its 30 s timeout", o.elapsed);
        }
    }
}

#[test]
fn a_differing_call_is_an_error_everywhere_and_delivers_nothing() {
    let invalid = std::env::var("SUCL_VTEST_INVALID").is_ok();
    if as_rank(|c| mismatch_main(c, env_usize("SUCL_VTEST_OP"), env_usize("SUCL_VTEST_BIG"), invalid)) {
        return;
    }
    // Small calls (shm: one mailbox step with the data) and large ones (the first window in the
    // arena with the agreement); a differing table, and invalid arguments on one rank.
    for (backend, invalid) in [("shm", false), ("shm", true), ("tcp", false), ("tcp", true)] {
        for op in 0..4 {
            for each in [10, 100_000] {
                let (op_s, each_s) = (op.to_string(), each.to_string());
                let mut env =
                    vec![("SUCL_BACKEND", backend), ("SUCL_TIMEOUT", "30"), ("SUCL_VTEST_OP", &op_s), ("SUCL_VTEST_BIG", &each_s)];
                if invalid {
                    env.push(("SUCL_VTEST_INVALID", "1"));
                }
                let outcomes = world("a_differing_call_is_an_error_everywhere_and_delivers_nothing", 3, &env, Duration::from_secs(60));
                for (r, o) in outcomes.iter().enumerate() {
                    assert!(
                        o.out.contains(&format!("RANK {r} OK")),
                        "{backend} op {op}, {each} elements, invalid {invalid}: rank {r}:\n{}",
                        o.out
                    );
                }
            }
        }
    }
}
