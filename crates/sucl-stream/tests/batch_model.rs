//! The batch rules of host-backed stream queues, model-checked: every interleaving of a small
//! model of posting, progress and completion is explored, for many small programs over two or
//! three ranks and one or two queues, with and without a rank that dies.
//!
//! What the model keeps of the engine (`src/engine.rs`) and the backends under it:
//! - each queue (one communicator) has, per rank, a host queue whose tasks are the program's
//!   triggers and waits in order — a trigger releases its batch at once, a wait holds the tasks
//!   behind it until every batch up to its own completed (or the queue failed);
//! - a progress thread per queue and rank, whose round (atomic: it holds the engine's lock) posts
//!   the triggered batches' operations in enqueue order across batches and stops inside a
//!   collective, which it runs to completion (a barrier: every rank entered the same collective);
//! - small messages are eager (a send completes when posted); large ones move only while both
//!   ranks progress their communicator: the sender's progress pushes the data, the receiver's
//!   delivers it;
//! - [`Rules::coll_progresses_p2p`]: whether a rank blocked in a collective still progresses its
//!   posted messages (the shared-memory backend does since its barriers drive the engine; without
//!   it a large send posted before a collective hangs, which the checker finds below);
//! - a rank may die at any point: the ranks that wait on it time out, and a time-out aborts the
//!   communicator, failing every rank's operations on it ([`Rules::abort_propagates`]).
//!
//! Checked in every reachable state: the k-th collective each rank enters on a queue is the same
//! one; with no rank dead, some step can always be taken until the program completed (no hang);
//! with a rank dead, every state where nothing can move has every other rank's queues complete
//! or failed, with all their waits released.

use std::collections::{HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    /// `buf`: the rank's buffer it reads (`None`: one no other operation uses).
    Send {
        peer: u8,
        tag: u8,
        large: bool,
        buf: Option<u8>,
    },
    /// `buf`: the rank's buffer it writes.
    Recv {
        peer: u8,
        tag: u8,
        large: bool,
        buf: Option<u8>,
    },
    Coll(u8),
}

impl Op {
    /// The buffer and whether the operation writes it.
    fn buffer(self) -> Option<(u8, bool)> {
        match self {
            Op::Send { buf, .. } => buf.map(|b| (b, false)),
            Op::Recv { buf, .. } => buf.map(|b| (b, true)),
            Op::Coll(_) => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Batch {
    ops: Vec<Op>,
    wait: bool,
}

/// `batches[q][rank]`: every rank has the same number of batches on a queue.
#[derive(Clone, Debug)]
struct Program {
    ranks: usize,
    batches: Vec<Vec<Vec<Batch>>>,
}

#[derive(Clone, Copy, Debug)]
struct Rules {
    coll_progresses_p2p: bool,
    abort_propagates: bool,
    /// Whether one rank may die (at any point of the run).
    crash: bool,
}

const SOUND: Rules = Rules { coll_progresses_p2p: true, abort_propagates: true, crash: false };

#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
struct Chan {
    /// Next host-queue task.
    task: u8,
    /// Batches triggered (0..triggered).
    triggered: u8,
    /// Per batch: how many operations are posted (a prefix).
    posted: Vec<u8>,
    /// The collective this rank's progress thread is blocked in: its index among the rank's
    /// collectives on this queue.
    in_coll: Option<u8>,
    /// Collectives entered, in order (their ids), and how many of them completed.
    entered: Vec<u8>,
    colls_done: u8,
    failed: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
struct Msg {
    send_posted: bool,
    recv_posted: bool,
    pushed: bool,
    delivered: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct State {
    ch: Vec<Vec<Chan>>,
    msgs: Vec<Vec<Msg>>,
    dead: Option<u8>,
}

/// The program with its messages matched (per queue, (src, dst, tag): the k-th send with the
/// k-th receive) and its host-queue tasks.
struct Model {
    p: Program,
    rules: Rules,
    /// `msg_of[q][rank][batch][op]`: the message a send or receive belongs to.
    msg_of: Vec<Vec<Vec<Vec<usize>>>>,
    /// `msg_large[q][m]`.
    msg_large: Vec<Vec<bool>>,
    /// `tasks[q][rank]`: (batch, is_wait).
    tasks: Vec<Vec<Vec<(u8, bool)>>>,
}

impl Model {
    fn new(p: Program, rules: Rules) -> Model {
        let mut msg_of = vec![];
        let mut msg_large = vec![];
        let mut tasks = vec![];
        for q in &p.batches {
            // First pass: each send's and receive's index among those of its (src, dst, tag).
            let mut count: HashMap<(u8, u8, u8, bool), usize> = HashMap::new();
            let mut large = vec![];
            let mut of = vec![];
            for (r, bs) in q.iter().enumerate() {
                let r = r as u8;
                let mut per_batch = vec![];
                for b in bs {
                    let mut ops = vec![];
                    for op in &b.ops {
                        let key = match *op {
                            Op::Send { peer, tag, .. } => (r, peer, tag, true),
                            Op::Recv { peer, tag, .. } => (peer, r, tag, false),
                            Op::Coll(_) => {
                                ops.push(usize::MAX);
                                continue;
                            }
                        };
                        let k = count.entry(key).or_default();
                        ops.push(*k);
                        *k += 1;
                    }
                    per_batch.push(ops);
                }
                of.push(per_batch);
            }
            // Second pass: give the k-th send and the k-th receive of a (src, dst, tag) one id.
            let mut id_of: HashMap<(u8, u8, u8, usize), usize> = HashMap::new();
            for (r, bs) in q.iter().enumerate() {
                for (bi, b) in bs.iter().enumerate() {
                    for (oi, op) in b.ops.iter().enumerate() {
                        let (key, l) = match *op {
                            Op::Send { peer, tag, large, .. } => ((r as u8, peer, tag), large),
                            Op::Recv { peer, tag, large, .. } => ((peer, r as u8, tag), large),
                            Op::Coll(_) => continue,
                        };
                        let k = of[r][bi][oi];
                        let next = id_of.len();
                        let id = *id_of.entry((key.0, key.1, key.2, k)).or_insert(next);
                        if id == large.len() {
                            large.push(l);
                        }
                        of[r][bi][oi] = id;
                    }
                }
            }
            msg_of.push(of);
            msg_large.push(large);
            tasks.push(
                q.iter()
                    .map(|bs| {
                        bs.iter()
                            .enumerate()
                            .flat_map(|(i, b)| std::iter::once((i as u8, false)).chain(b.wait.then_some((i as u8, true))))
                            .collect()
                    })
                    .collect(),
            );
        }
        Model { p, rules, msg_of, msg_large, tasks }
    }

    fn initial(&self) -> State {
        let ch =
            self.p.batches.iter().map(|q| q.iter().map(|bs| Chan { posted: vec![0; bs.len()], ..Chan::default() }).collect()).collect();
        let msgs = self.msg_large.iter().map(|l| vec![Msg::default(); l.len()]).collect();
        State { ch, msgs, dead: None }
    }

    fn ops(&self, q: usize, r: usize, b: usize) -> &[Op] {
        &self.p.batches[q][r][b].ops
    }

    fn op_done(&self, s: &State, q: usize, r: usize, b: usize, i: usize) -> bool {
        let c = &s.ch[q][r];
        if i >= c.posted[b] as usize {
            return false;
        }
        match self.ops(q, r, b)[i] {
            Op::Send { large, .. } => !large || s.msgs[q][self.msg_of[q][r][b][i]].delivered,
            Op::Recv { .. } => s.msgs[q][self.msg_of[q][r][b][i]].delivered,
            Op::Coll(_) => {
                let k = self.ops(q, r, b)[..i].iter().filter(|o| matches!(o, Op::Coll(_))).count()
                    + (0..b).map(|bb| self.ops(q, r, bb).iter().filter(|o| matches!(o, Op::Coll(_))).count()).sum::<usize>();
                k < c.colls_done as usize
            }
        }
    }

    /// Every batch up to `b` completed.
    fn finished(&self, s: &State, q: usize, r: usize, b: usize) -> bool {
        (0..=b).all(|bb| (0..self.ops(q, r, bb).len()).all(|i| self.op_done(s, q, r, bb, i)))
    }

    fn all_done(&self, s: &State, q: usize, r: usize) -> bool {
        let c = &s.ch[q][r];
        c.task as usize == self.tasks[q][r].len()
            && (c.failed || self.p.batches[q][r].is_empty() || self.finished(s, q, r, self.p.batches[q][r].len() - 1))
    }

    fn alive(&self, s: &State, r: usize) -> bool {
        s.dead != Some(r as u8)
    }

    /// The host queue's next task: a trigger, or a wait whose batches completed.
    fn step_worker(&self, s: &State, q: usize, r: usize) -> Option<State> {
        let c = &s.ch[q][r];
        let &(b, wait) = self.tasks[q][r].get(c.task as usize)?;
        if !self.alive(s, r) || (wait && !c.failed && !self.finished(s, q, r, b as usize)) {
            return None;
        }
        let mut n = s.clone();
        let c = &mut n.ch[q][r];
        c.task += 1;
        if !wait {
            c.triggered = b + 1;
        }
        Some(n)
    }

    /// One progress round of the queue's progress thread: posts in order, stops inside a
    /// collective, moves messages.
    fn step_progress(&self, s: &State, q: usize, r: usize) -> Option<State> {
        if !self.alive(s, r) || s.ch[q][r].failed || s.ch[q][r].in_coll.is_some() {
            return None;
        }
        let mut n = s.clone();
        'batches: for b in 0..n.ch[q][r].triggered as usize {
            while (n.ch[q][r].posted[b] as usize) < self.ops(q, r, b).len() {
                let i = n.ch[q][r].posted[b] as usize;
                if self.buffer_held(&n, q, r, b, i) {
                    // The engine's rule: an operation whose buffer an earlier one still uses
                    // holds every operation behind it.
                    break 'batches;
                }
                n.ch[q][r].posted[b] += 1;
                match self.ops(q, r, b)[i] {
                    Op::Send { .. } => n.msgs[q][self.msg_of[q][r][b][i]].send_posted = true,
                    Op::Recv { .. } => n.msgs[q][self.msg_of[q][r][b][i]].recv_posted = true,
                    Op::Coll(id) => {
                        let c = &mut n.ch[q][r];
                        c.in_coll = Some(c.entered.len() as u8);
                        c.entered.push(id);
                        break 'batches;
                    }
                }
            }
        }
        self.drive(&mut n, q, r);
        (n != *s).then_some(n)
    }

    /// Whether an earlier batch's operation that is not complete uses the buffer of operation
    /// `i` of batch `b` in a conflicting way (one of the two writes it).
    fn buffer_held(&self, s: &State, q: usize, r: usize, b: usize, i: usize) -> bool {
        let Some((buf, writes)) = self.ops(q, r, b)[i].buffer() else { return false };
        (0..b).any(|bb| {
            self.ops(q, r, bb)
                .iter()
                .enumerate()
                .any(|(j, o)| o.buffer().is_some_and(|(ob, ow)| ob == buf && (ow || writes)) && !self.op_done(s, q, r, bb, j))
        })
    }

    /// The backend's progress of rank `r`'s messages on queue `q`.
    fn drive(&self, n: &mut State, q: usize, r: usize) {
        for (b, ops) in self.p.batches[q][r].iter().enumerate() {
            for (i, op) in ops.ops.iter().enumerate() {
                let m = match *op {
                    Op::Send { .. } | Op::Recv { .. } => self.msg_of[q][r][b][i],
                    Op::Coll(_) => continue,
                };
                let large = self.msg_large[q][m];
                let msg = &mut n.msgs[q][m];
                match op {
                    Op::Send { .. } if msg.send_posted && msg.recv_posted && large => msg.pushed = true,
                    Op::Recv { .. } if msg.recv_posted && msg.send_posted && (!large || msg.pushed) => msg.delivered = true,
                    _ => {}
                }
            }
        }
    }

    /// A rank blocked in a collective: it leaves once every rank entered it; meanwhile its
    /// backend may progress its messages.
    fn step_in_coll(&self, s: &State, q: usize, r: usize) -> Option<State> {
        let k = s.ch[q][r].in_coll?;
        if !self.alive(s, r) || s.ch[q][r].failed {
            return None;
        }
        let everyone = (0..self.p.ranks).all(|o| s.ch[q][o].entered.len() > k as usize);
        let mut n = s.clone();
        if everyone && (0..self.p.ranks).all(|o| self.alive(s, o)) {
            let c = &mut n.ch[q][r];
            c.in_coll = None;
            c.colls_done += 1;
        } else if self.rules.coll_progresses_p2p {
            self.drive(&mut n, q, r);
        }
        (n != *s).then_some(n)
    }

    /// Whether (q, r) waits on the dead rank itself: in a collective, or a posted message with it.
    fn waits_on_dead(&self, s: &State, q: usize, r: usize) -> bool {
        let Some(d) = s.dead else { return false };
        let c = &s.ch[q][r];
        if c.failed || !self.alive(s, r) {
            return false;
        }
        if c.in_coll.is_some() {
            return true;
        }
        (0..c.triggered as usize).any(|b| {
            self.ops(q, r, b).iter().enumerate().any(|(i, op)| match *op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } => peer == d && i < c.posted[b] as usize && !self.op_done(s, q, r, b, i),
                Op::Coll(_) => false,
            })
        })
    }

    /// A time-out of a wait on the dead rank: the queue fails (every wait released) and, where
    /// abort propagates, so does every rank's queue of that communicator.
    fn step_timeout(&self, s: &State, q: usize, r: usize) -> Option<State> {
        if !self.waits_on_dead(s, q, r) {
            return None;
        }
        let mut n = s.clone();
        n.ch[q][r].failed = true;
        n.ch[q][r].in_coll = None;
        if self.rules.abort_propagates {
            for o in 0..self.p.ranks {
                n.ch[q][o].failed = true;
                n.ch[q][o].in_coll = None;
            }
        }
        Some(n)
    }

    fn successors(&self, s: &State) -> Vec<State> {
        let mut out = vec![];
        for q in 0..self.p.batches.len() {
            for r in 0..self.p.ranks {
                out.extend(self.step_worker(s, q, r));
                out.extend(self.step_progress(s, q, r));
                out.extend(self.step_in_coll(s, q, r));
                out.extend(self.step_timeout(s, q, r));
            }
        }
        if self.rules.crash && s.dead.is_none() {
            for r in 0..self.p.ranks {
                out.push(State { dead: Some(r as u8), ..s.clone() });
            }
        }
        out
    }

    /// A broken rule in `s`, if any.
    fn violation(&self, s: &State, stuck: bool) -> Option<String> {
        for q in 0..self.p.batches.len() {
            let longest = (0..self.p.ranks).map(|r| s.ch[q][r].entered.len()).max().unwrap_or(0);
            for k in 0..longest {
                let ids: HashSet<u8> = (0..self.p.ranks).filter_map(|r| s.ch[q][r].entered.get(k).copied()).collect();
                if ids.len() > 1 {
                    return Some(format!("queue {q}: the ranks' collective #{k} differ ({ids:?})"));
                }
            }
        }
        if !stuck {
            return None;
        }
        let open: Vec<String> = (0..self.p.batches.len())
            .flat_map(|q| (0..self.p.ranks).map(move |r| (q, r)))
            .filter(|&(q, r)| self.alive(s, r) && !self.all_done(s, q, r))
            .map(|(q, r)| format!("queue {q} rank {r} at task {} of {}", s.ch[q][r].task, self.tasks[q][r].len()))
            .collect();
        (!open.is_empty()).then(|| format!("nothing can move and {} is not done (dead: {:?})", open.join(", "), s.dead))
    }

    /// Explores every reachable state; the first violation with its depth, and the number of
    /// states seen.
    fn check(&self) -> (Option<String>, usize) {
        let mut seen: HashSet<State> = HashSet::new();
        let mut stack = vec![self.initial()];
        seen.insert(stack[0].clone());
        while let Some(s) = stack.pop() {
            let next = self.successors(&s);
            if let Some(v) = self.violation(&s, next.is_empty()) {
                return (Some(v), seen.len());
            }
            for n in next {
                if seen.insert(n.clone()) {
                    stack.push(n);
                }
            }
            assert!(seen.len() < 2_000_000, "state space too large for a test");
        }
        (None, seen.len())
    }
}

// ---------------------------------------------------------------------------------------------
// Programs.

/// One step every rank reads, as in `tests/random_programs.rs`.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `sbuf`/`rbuf`: the buffers of the sender and the receiver (`None`: fresh ones).
    P2p {
        q: usize,
        src: u8,
        dst: u8,
        tag: u8,
        large: bool,
        sbuf: Option<u8>,
        rbuf: Option<u8>,
    },
    Coll {
        q: usize,
        id: u8,
    },
    Start {
        q: usize,
        wait: bool,
    },
}

fn build(ranks: usize, queues: usize, steps: &[Step]) -> Program {
    let mut batches: Vec<Vec<Vec<Batch>>> = vec![vec![vec![]; ranks]; queues];
    let mut open: Vec<Vec<Vec<Op>>> = vec![vec![vec![]; ranks]; queues];
    let close = |batches: &mut Vec<Vec<Vec<Batch>>>, open: &mut Vec<Vec<Vec<Op>>>, q: usize, wait: bool| {
        for r in 0..ranks {
            batches[q][r].push(Batch { ops: std::mem::take(&mut open[q][r]), wait });
        }
    };
    for s in steps {
        match *s {
            Step::P2p { q, src, dst, tag, large, sbuf, rbuf } => {
                // Within a batch the queue refuses a buffer that one operation writes and
                // another uses: give such an operation a fresh buffer instead.
                let free = |ops: &[Op], buf: Option<u8>, writes: bool| {
                    buf.filter(|&b| !ops.iter().any(|o| o.buffer().is_some_and(|(ob, ow)| ob == b && (ow || writes))))
                };
                let sbuf = free(&open[q][src as usize], sbuf, false);
                let rbuf = free(&open[q][dst as usize], rbuf, true);
                open[q][src as usize].push(Op::Send { peer: dst, tag, large, buf: sbuf });
                open[q][dst as usize].push(Op::Recv { peer: src, tag, large, buf: rbuf });
            }
            Step::Coll { q, id } => (0..ranks).for_each(|r| open[q][r].push(Op::Coll(id))),
            Step::Start { q, wait } => close(&mut batches, &mut open, q, wait),
        }
    }
    for q in 0..queues {
        if open[q].iter().any(|o| !o.is_empty()) {
            close(&mut batches, &mut open, q, true);
        }
    }
    Program { ranks, batches }
}

/// The shape of the hang the random programs found over shared memory (3 ranks): a large send
/// in a batch started without a wait, then a batch whose first operation on the receiver can
/// only be posted once that receive completed, and a collective.
fn large_send_before_collective() -> Program {
    use Step::*;
    build(
        3,
        1,
        &[
            P2p { q: 0, src: 0, dst: 1, tag: 2, large: true, sbuf: None, rbuf: Some(0) },
            Start { q: 0, wait: false },
            P2p { q: 0, src: 1, dst: 2, tag: 1, large: false, sbuf: Some(0), rbuf: None },
            Coll { q: 0, id: 7 },
            Start { q: 0, wait: true },
        ],
    )
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small random program: 2 or 3 ranks, 1 or 2 queues, up to 5 operations.
fn small_program(seed: u64) -> Program {
    let mut x = seed;
    let mut next = |n: u64| {
        x = mix(x);
        x % n
    };
    let ranks = 2 + next(2) as usize;
    let queues = 1 + next(2) as usize;
    let mut steps = vec![];
    let mut coll_id = 0u8;
    for _ in 0..2 + next(4) {
        let q = next(queues as u64) as usize;
        if next(3) == 0 {
            coll_id += 1;
            steps.push(Step::Coll { q, id: coll_id });
        } else {
            let src = next(ranks as u64) as u8;
            let dst = (src + 1 + next(ranks as u64 - 1) as u8) % ranks as u8;
            let mut buf = || [None, Some(0), Some(1)][next(3) as usize];
            let (sbuf, rbuf) = (buf(), buf());
            steps.push(Step::P2p { q, src, dst, tag: next(2) as u8, large: next(2) == 0, sbuf, rbuf });
        }
        if next(2) == 0 {
            steps.push(Step::Start { q, wait: next(2) == 0 });
        }
    }
    build(ranks, queues, &steps)
}

const SEEDS: u64 = 150;
/// Programs checked with a rank that may die (each explores every point of death).
const CRASH_SEEDS: u64 = 40;

#[test]
fn no_program_hangs_or_reorders_collectives() {
    let mut states = 0;
    for seed in 0..SEEDS {
        let p = small_program(seed);
        let (v, n) = Model::new(p.clone(), SOUND).check();
        assert!(v.is_none(), "seed {seed}: {}\n{p:?}", v.unwrap());
        states += n;
    }
    let (v, _) = Model::new(large_send_before_collective(), SOUND).check();
    assert!(v.is_none(), "{}", v.unwrap());
    println!("{SEEDS} programs, {states} states, no violation");
}

/// The checker finds the hang when a rank blocked in a collective does not progress its posted
/// messages (the shared-memory backend before its barriers drove the engine).
#[test]
fn without_progress_in_collectives_the_checker_finds_the_hang() {
    let rules = Rules { coll_progresses_p2p: false, ..SOUND };
    let (v, _) = Model::new(large_send_before_collective(), rules).check();
    let v = v.expect("the checker must find the hang");
    assert!(v.contains("nothing can move"), "{v}");
    let found = (0..SEEDS).filter(|&s| Model::new(small_program(s), rules).check().0.is_some()).count();
    println!("without progress in collectives: {found} of {SEEDS} small programs hang");
}

/// A rank that dies at any point: every other rank's queues end complete or failed, with every
/// wait released — on both queues of a two-queue program.
#[test]
fn a_dead_rank_fails_every_wait_on_it() {
    let rules = Rules { crash: true, ..SOUND };
    let mut two_queues = 0;
    for seed in 0..CRASH_SEEDS {
        let p = small_program(seed);
        two_queues += usize::from(p.batches.len() == 2);
        let (v, _) = Model::new(p.clone(), rules).check();
        assert!(v.is_none(), "seed {seed}: {}\n{p:?}", v.unwrap());
    }
    assert!(two_queues > 5, "too few two-queue programs ({two_queues})");
}

/// Without the abort that a time-out raises on its communicator, a rank that waits on a live
/// peer stuck behind the dead one would wait forever: the checker sees it.
#[test]
fn without_abort_propagation_a_dead_rank_strands_others() {
    let rules = Rules { crash: true, abort_propagates: false, ..SOUND };
    let found = (0..CRASH_SEEDS).filter(|&s| Model::new(small_program(s), rules).check().0.is_some()).count();
    assert!(found > 0, "no program strands a rank without abort propagation");
}
