//! Random programs against a cell-by-cell oracle: every await-push is met by pushes of exactly
//! its region, only the last writer of a cell pushes it, nothing moves twice, and a kernel that
//! reads received data depends on the await-push that receives it. Tasks may read one buffer
//! through several accessors (collective pattern discovery then works per accessor).

use proptest::prelude::*;
use std::collections::BTreeSet;
use sucl_graph::{AccessMode, CommandKind, GridBox, RangeMapper, Region, Scheduler, TaskSpec};

const LEN: usize = 12;

#[derive(Clone, Debug)]
enum M {
    OneToOne,
    All,
    Halo,
    /// `slice(0)`: the whole (1D) buffer for every non-empty chunk.
    Slice,
    /// The chunk mirrored in the range.
    Reverse,
    Fixed(usize, usize),
}

#[derive(Clone, Debug)]
struct Acc {
    buffer: usize,
    mapper: M,
    mode: AccessMode,
}

#[derive(Clone, Debug)]
struct Step {
    master: bool,
    accessors: Vec<Acc>,
}

fn arb_mapper() -> impl Strategy<Value = M> {
    prop_oneof![
        Just(M::OneToOne),
        Just(M::All),
        Just(M::Halo),
        Just(M::Slice),
        (0..LEN, 0..LEN).prop_map(|(a, b)| M::Fixed(a.min(b), a.max(b) + 1)),
    ]
}

fn arb_step() -> impl Strategy<Value = Step> {
    let acc = (0..2usize, arb_mapper(), 0..5usize).prop_map(|(buffer, mapper, m)| {
        let mode = [AccessMode::Read, AccessMode::Write, AccessMode::ReadWrite, AccessMode::DiscardWrite, AccessMode::DiscardReadWrite][m];
        Acc { buffer, mapper, mode }
    });
    (any::<bool>(), prop::collection::vec(acc, 1..3)).prop_map(|(master, mut accessors)| {
        if !master {
            // Distributed tasks write one to one or reversed (all writers of a buffer alike),
            // so ranks never overlap.
            for b in 0..2 {
                let first = accessors.iter().find(|a| a.buffer == b && a.mode.writes()).map(|a| a.mapper.clone());
                let mapper = if matches!(first, Some(M::Reverse)) { M::Reverse } else { M::OneToOne };
                for a in accessors.iter_mut().filter(|a| a.buffer == b && a.mode.writes()) {
                    a.mapper = mapper.clone();
                }
            }
        }
        Step { master, accessors }
    })
}

/// The cells a rank's chunk `[lo, hi)` maps to, computed cell by cell.
fn cells(m: &M, lo: usize, hi: usize) -> BTreeSet<usize> {
    if lo >= hi {
        return BTreeSet::new();
    }
    match m {
        M::OneToOne => (lo..hi).collect(),
        M::All | M::Slice => (0..LEN).collect(),
        M::Reverse => (LEN - hi..LEN - lo).collect(),
        M::Halo => (lo.saturating_sub(1)..(hi + 1).min(LEN)).collect(),
        M::Fixed(a, b) => (*a..*b).collect(),
    }
}

fn to_mapper(m: &M) -> RangeMapper {
    match m {
        M::OneToOne => RangeMapper::OneToOne,
        M::All => RangeMapper::All,
        M::Halo => RangeMapper::Neighborhood([1, 0, 0]),
        M::Slice => RangeMapper::Slice(0),
        M::Reverse => RangeMapper::Reverse,
        M::Fixed(a, b) => RangeMapper::Fixed(GridBox::new([*a, 0, 0], [*b, 1, 1])),
    }
}

fn region_cells(r: &Region) -> BTreeSet<usize> {
    (0..LEN).filter(|&c| r.contains_point([c, 0, 0])).collect()
}

/// (task, buffer, source, destination, cell)
type Moves = BTreeSet<(usize, usize, usize, usize, usize)>;

fn oracle(ranks: usize, steps: &[Step]) -> Moves {
    let mut owner = vec![[None::<usize>; LEN]; 2];
    let mut fresh = vec![vec![[false; LEN]; ranks]; 2];
    let mut moves = Moves::new();
    for (t, step) in steps.iter().enumerate() {
        let chunk = |r: usize| {
            if step.master {
                if r == 0 {
                    (0, LEN)
                } else {
                    (0, 0)
                }
            } else {
                (r * LEN / ranks, (r + 1) * LEN / ranks)
            }
        };
        for b in 0..2 {
            for (s, fresh_s) in fresh[b].iter().enumerate() {
                let (lo, hi) = chunk(s);
                for a in step.accessors.iter().filter(|a| a.buffer == b && a.mode.needs_prior_contents()) {
                    for c in cells(&a.mapper, lo, hi) {
                        if let (false, Some(o)) = (fresh_s[c], owner[b][c]) {
                            moves.insert((t, b, o, s, c));
                        }
                    }
                }
            }
            for &(_, bb, _, s, c) in moves.iter().filter(|m| m.0 == t && m.1 == b) {
                fresh[bb][s][c] = true;
            }
            for s in 0..ranks {
                let (lo, hi) = chunk(s);
                for a in step.accessors.iter().filter(|a| a.buffer == b && a.mode.writes()) {
                    for c in cells(&a.mapper, lo, hi) {
                        owner[b][c] = Some(s);
                        for (r, f) in fresh[b].iter_mut().enumerate() {
                            f[c] = r == s;
                        }
                    }
                }
            }
        }
    }
    moves
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pushes_match_await_pushes_and_the_oracle(
        ranks in 1usize..=8,
        steps in prop::collection::vec(arb_step(), 1..8),
        horizon in prop_oneof![Just(0usize), Just(3usize)],
        discovery in any::<bool>(),
    ) {
        let mut s = Scheduler::simulate(ranks, horizon).unwrap();
        s.set_discovery(discovery);
        let bufs = [s.create_buffer(&[LEN], false).unwrap(), s.create_buffer(&[LEN], false).unwrap()];
        let mut ids = Vec::new();
        for step in &steps {
            let mut spec = if step.master {
                TaskSpec::master_host_task("t", &[LEN])
            } else {
                TaskSpec::parallel_for("t", &[LEN])
            };
            for a in &step.accessors {
                spec = spec.access(bufs[a.buffer], to_mapper(&a.mapper), a.mode);
            }
            ids.push(s.submit(spec).unwrap().0);
        }
        // Task ids count horizons too: map them back to step indices.
        let step_of = |task: usize| ids.iter().position(|&t| t == task).unwrap();
        let (mut pushed, mut awaited) = (Moves::new(), Moves::new());
        for g in s.rank_graphs() {
            let mut seen = BTreeSet::new();
            for c in &g.commands {
                let kind = c.kind;
                if !matches!(kind, CommandKind::Push | CommandKind::AwaitPush | CommandKind::Collective) {
                    continue;
                }
                prop_assert!(discovery || kind != CommandKind::Collective, "no collective with discovery off");
                let b = c.buffer.unwrap().0;
                // One push and one await-push per task and buffer; collectives one per reading
                // accessor that needs data, each over its own (disjoint) forwarded cells.
                let cells = c.collective.as_ref().map(|coll| format!("{:?}", coll.region));
                prop_assert!(seen.insert((format!("{kind:?}"), c.task, b, cells)), "one command per task, buffer (and collective region)");
                // A collective both sends (like a push) and receives (like an await-push).
                let (out, inc) = match (&c.collective, kind) {
                    (Some(coll), _) => (coll.sends(g.rank), coll.recvs(g.rank)),
                    (None, CommandKind::Push) => (c.peers.clone(), Vec::new()),
                    (None, _) => (Vec::new(), c.peers.clone()),
                };
                let mut union = BTreeSet::new();
                for (p, sending) in out.iter().map(|p| (p, true)).chain(inc.iter().map(|p| (p, false))) {
                    prop_assert!(p.rank != g.rank);
                    for cell in region_cells(&p.region) {
                        if sending == (kind == CommandKind::Push) || kind == CommandKind::AwaitPush {
                            union.insert(cell);
                        }
                        let (src, dst) = if sending { (g.rank, p.rank) } else { (p.rank, g.rank) };
                        let set = if sending { &mut pushed } else { &mut awaited };
                        prop_assert!(set.insert((step_of(c.task.0), b, src, dst, cell)), "a cell moves once");
                    }
                }
                if kind != CommandKind::Collective {
                    prop_assert_eq!(union, region_cells(&c.region));
                } else {
                    let received: BTreeSet<usize> = inc.iter().flat_map(|p| region_cells(&p.region)).collect();
                    prop_assert_eq!(received, region_cells(&c.region));
                }
                if kind == CommandKind::AwaitPush || (kind == CommandKind::Collective && !inc.is_empty()) {
                    let exec = g.commands.iter().find(|e| e.task == c.task && e.kind == CommandKind::Execution);
                    let exec = exec.expect("a rank that receives runs the task");
                    prop_assert!(exec.dependencies.iter().any(|d| d.command == c.id), "kernel waits for its await-push");
                }
            }
        }
        prop_assert_eq!(&pushed, &awaited);
        prop_assert_eq!(pushed, oracle(ranks, &steps));
    }
}
