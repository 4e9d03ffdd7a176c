//! Random programs of stream-triggered queue operations, run on real processes and checked
//! against a sequential model.
//!
//! A program is one list of steps that every rank reads the same way: point-to-point messages
//! (receive buffers longer than the message, bursts on one (peer, tag), `PROC_NULL` peers), every
//! collective, and starts — some followed by a wait, some not — over one to three queues, each on
//! its own communicator and host queue. A message is enqueued by its two ranks at the same step,
//! so a correct engine can always finish the program; the model says what each receive and
//! collective must hold (computed here from the step and the ranks' inputs, never by sucl) and
//! how many elements each request reports. A rank that sees anything else, or an error, fails.
//!
//! The tests run a few hundred seeds per transport (shm and tcp; mpi under `mpirun` with
//! `--features mpi`; device buffers on CUDA streams over the staged path where a GPU is); `scripts/random-programs.sh` runs thousands. A failing seed is shrunk: steps
//! are removed while the program still fails, and the smallest failing program is printed (and
//! written to `target/random-program-failure.json`) so that
//! `SUCL_RP_PROGRAM=<file> cargo test -p sucl-stream --test random_programs replay -- --ignored`
//! runs it again.
//!
//! Environment (all optional): `SUCL_RP_SEEDS` (`a..b`, default per test), `SUCL_RP_RANKS`
//! (2..=4; default: seeds cycle through 2, 3 and 4), `SUCL_RP_CHUNK` (seeds per launch),
//! `SUCL_RP_SHRINK=0` (report the failing seed without shrinking), `SUCL_RP_KEEP_GOING=1` (run
//! every seed, then report every failing one).

mod common;

use common::{launch, Outcome};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use sucl_runtime::{Communicator, ReduceOp};
use sucl_stream::{CommQueue, HostQueue, QueueBuffer, Request, SharedBuf, PROC_NULL};

/// One step of a program, as every rank reads it. Buffers are slots of a queue's pool
/// ([`Program::lens`]): every rank has its own buffer for each slot, all of the slot's length,
/// so a slot is reused across batches (what the engine must serialize) and a fresh slot is one
/// used once.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
enum Step {
    /// `src` sends slot `sbuf` to `dst` on `tag`; `dst` receives into its slot `rbuf` (at least
    /// as long).
    P2p {
        q: u8,
        src: u8,
        dst: u8,
        tag: u32,
        sbuf: u32,
        rbuf: u32,
    },
    /// `rank` sends slot `buf` to, or receives it from, `PROC_NULL`.
    Null {
        q: u8,
        rank: u8,
        send: bool,
        buf: u32,
    },
    /// `sbuf` may be `rbuf` (in place).
    AllReduce {
        q: u8,
        op: Op,
        sbuf: u32,
        rbuf: u32,
    },
    Broadcast {
        q: u8,
        root: u8,
        buf: u32,
    },
    AllGather {
        q: u8,
        sbuf: u32,
        rbuf: u32,
    },
    ReduceScatter {
        q: u8,
        op: Op,
        sbuf: u32,
        rbuf: u32,
    },
    AllToAll {
        q: u8,
        sbuf: u32,
        rbuf: u32,
    },
    /// Every rank starts queue `q`, then waits on it if `wait`.
    Start {
        q: u8,
        wait: bool,
    },
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
enum Op {
    Sum,
    Prod,
    Min,
    Max,
}

impl Op {
    fn reduce_op(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::Sum,
            Op::Prod => ReduceOp::Prod,
            Op::Min => ReduceOp::Min,
            Op::Max => ReduceOp::Max,
        }
    }

    /// The model's reduction (wrapping, as u64 arithmetic in sucl's reductions wraps).
    fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Op::Sum => a.wrapping_add(b),
            Op::Prod => a.wrapping_mul(b),
            Op::Min => a.min(b),
            Op::Max => a.max(b),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Program {
    seed: u64,
    ranks: usize,
    /// The length in elements of every slot of every queue's pool.
    lens: Vec<Vec<usize>>,
    steps: Vec<Step>,
}

/// splitmix64: the generator's random numbers and the programs' initial values.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A message length: mostly small, some medium, a few large enough to leave the shm ring's
    /// and tcp's small-message paths.
    fn len(&mut self, large_percent: u64) -> usize {
        match self.below(100) {
            p if p < large_percent => 50_000 + self.below(200_000) as usize,
            p if p < large_percent + 20 => 100 + self.below(5_000) as usize,
            _ => 1 + self.below(64) as usize,
        }
    }
}

/// What the generator knows while it writes one queue's batch: the slots each rank's
/// operations of the open batch read and write (one that another operation of the batch writes
/// may serve no other: the queue refuses it at enqueue).
struct Gen {
    g: Rng,
    ranks: usize,
    lens: Vec<Vec<usize>>,
    reads: Vec<Vec<std::collections::HashSet<u32>>>,
    writes: Vec<Vec<std::collections::HashSet<u32>>>,
    large: u64,
    /// Every receive buffer exactly as long as its message (device receives must be filled).
    exact: bool,
}

impl Gen {
    fn fresh(&mut self, q: usize, len: usize) -> u32 {
        self.lens[q].push(len);
        (self.lens[q].len() - 1) as u32
    }

    /// A slot of `len` elements (or, with `at_least`, of `len` or more) that `ranks` may use in
    /// this batch as `write` says: a pooled one when one fits and is free, else a fresh one.
    fn slot(&mut self, q: usize, len: usize, at_least: bool, ranks: &[usize], write: bool) -> u32 {
        if self.g.chance(70) {
            let fits: Vec<u32> = (0..self.lens[q].len() as u32)
                .filter(|&s| {
                    let l = self.lens[q][s as usize];
                    (l == len || (at_least && l >= len && l <= len + 16))
                        && ranks.iter().all(|&r| !(self.writes[q][r].contains(&s) || (write && self.reads[q][r].contains(&s))))
                })
                .collect();
            if !fits.is_empty() {
                return fits[self.g.below(fits.len() as u64) as usize];
            }
        }
        let extra = if at_least && self.g.chance(50) { 1 + self.g.below(16) as usize } else { 0 };
        self.fresh(q, len + extra)
    }

    /// Any slot `ranks` may use as `write` says (a pooled one, or a fresh one).
    fn any_slot(&mut self, q: usize, ranks: &[usize], write: bool) -> u32 {
        let pooled = self.g.below(self.lens[q].len() as u64) as usize;
        let len = if self.g.chance(60) { self.lens[q][pooled] } else { self.g.len(self.large) };
        self.slot(q, len, false, ranks, write)
    }

    fn mark(&mut self, q: usize, ranks: &[usize], s: u32, write: bool) {
        for &r in ranks {
            if write { &mut self.writes[q][r] } else { &mut self.reads[q][r] }.insert(s);
        }
    }

    fn start(&mut self, q: usize) {
        self.reads[q].iter_mut().chain(self.writes[q].iter_mut()).for_each(|s| s.clear());
    }
}

/// The program of `seed` on `ranks` ranks (`exact`: no receive longer than its message).
fn generate(seed: u64, ranks: usize, exact: bool) -> Program {
    let mut g = Rng(seed ^ 0x5eed_0000);
    let queues = 1 + g.below(3) as usize;
    let large = [2, 6, 20][g.below(3) as usize];
    let lens = (0..queues).map(|_| (0..2 + g.below(5)).map(|_| g.len(large)).collect()).collect();
    let empty = || vec![std::collections::HashSet::new(); ranks];
    let mut gen = Gen { ranks, lens, reads: vec![empty(); queues], writes: vec![empty(); queues], large, exact, g };
    let mut steps = vec![];
    let mut pending = vec![0usize; queues];
    let ops = 4 + gen.g.below(28) as usize;
    for _ in 0..ops {
        let q = gen.g.below(queues as u64) as usize;
        let burst = if gen.g.chance(15) { 2 + gen.g.below(4) } else { 1 };
        match gen.g.below(100) {
            0..=44 => {
                let src = gen.g.below(ranks as u64) as usize;
                let dst = (src + 1 + gen.g.below(ranks as u64 - 1) as usize) % ranks;
                let tag = gen.g.below(3) as u32;
                for _ in 0..burst {
                    steps.push(gen.p2p(q, src, dst, tag));
                }
            }
            45..=51 => steps.push(gen.null(q)),
            _ => steps.push(gen.collective(q)),
        }
        pending[q] += 1;
        if gen.g.chance(30) {
            let q = gen.g.below(queues as u64) as usize;
            if pending[q] > 0 {
                pending[q] = 0;
                gen.start(q);
                steps.push(Step::Start { q: q as u8, wait: gen.g.chance(60) });
            }
        }
    }
    Program { seed, ranks, lens: gen.lens, steps }
}

impl Gen {
    fn p2p(&mut self, q: usize, src: usize, dst: usize, tag: u32) -> Step {
        let sbuf = self.any_slot(q, &[src], false);
        self.mark(q, &[src], sbuf, false);
        let len = self.lens[q][sbuf as usize];
        let rbuf = self.slot(q, len, !self.exact, &[dst], true);
        self.mark(q, &[dst], rbuf, true);
        Step::P2p { q: q as u8, src: src as u8, dst: dst as u8, tag, sbuf, rbuf }
    }

    fn null(&mut self, q: usize) -> Step {
        let rank = self.g.below(self.ranks as u64) as u8;
        let buf = self.g.below(self.lens[q].len() as u64) as u32;
        Step::Null { q: q as u8, rank, send: self.g.chance(50), buf }
    }

    fn collective(&mut self, q: usize) -> Step {
        let all: Vec<usize> = (0..self.ranks).collect();
        let n = self.ranks;
        let op = [Op::Sum, Op::Prod, Op::Min, Op::Max][self.g.below(4) as usize];
        let qq = q as u8;
        // Collectives move every rank's share at once: keep the large ones rarer.
        let len = |g: &mut Gen| if g.g.chance(50) { 1 + g.g.below(64) as usize } else { g.g.len(g.large / 2) };
        match self.g.below(5) {
            0 => {
                let rbuf = self.any_slot(q, &all, true);
                let sbuf = if self.g.chance(30) { rbuf } else { self.slot(q, self.lens[q][rbuf as usize], false, &all, false) };
                self.mark(q, &all, sbuf, false);
                self.mark(q, &all, rbuf, true);
                Step::AllReduce { q: qq, op, sbuf, rbuf }
            }
            1 => {
                let buf = self.any_slot(q, &all, true);
                self.mark(q, &all, buf, true);
                Step::Broadcast { q: qq, root: self.g.below(n as u64) as u8, buf }
            }
            2 => {
                let l = len(self);
                let (sbuf, rbuf) = (self.slot(q, l, false, &all, false), self.slot(q, l * n, false, &all, true));
                self.mark(q, &all, sbuf, false);
                self.mark(q, &all, rbuf, true);
                Step::AllGather { q: qq, sbuf, rbuf }
            }
            3 => {
                let l = len(self);
                let (sbuf, rbuf) = (self.slot(q, l * n, false, &all, false), self.slot(q, l, false, &all, true));
                self.mark(q, &all, sbuf, false);
                self.mark(q, &all, rbuf, true);
                Step::ReduceScatter { q: qq, op, sbuf, rbuf }
            }
            _ => {
                let l = len(self) * n;
                let sbuf = self.slot(q, l, false, &all, false);
                self.mark(q, &all, sbuf, false);
                let rbuf = self.slot(q, l, false, &all, true);
                let rbuf = if rbuf == sbuf { self.fresh(q, l) } else { rbuf };
                self.mark(q, &all, rbuf, true);
                Step::AllToAll { q: qq, sbuf, rbuf }
            }
        }
    }
}

/// What slot `slot` of queue `q` holds on `rank` before the program touches it.
fn initial(seed: u64, q: usize, slot: usize, rank: usize, len: usize) -> Vec<u64> {
    (0..len).map(|i| 1 + mix(seed ^ mix(((q as u64) << 48) ^ ((slot as u64) << 24) ^ rank as u64) ^ i as u64) % 64).collect()
}

/// The sequential model: every rank's buffers after each step, in program order, and the
/// element count each of this rank's requests must report.
struct Model {
    /// `bufs[q][rank][slot]`.
    bufs: Vec<Vec<Vec<Vec<u64>>>>,
}

impl Model {
    fn new(p: &Program) -> Model {
        let bufs = (0..p.lens.len())
            .map(|q| (0..p.ranks).map(|r| p.lens[q].iter().enumerate().map(|(s, &l)| initial(p.seed, q, s, r, l)).collect()).collect())
            .collect();
        Model { bufs }
    }

    /// Applies `step`; returns the element count each rank's request reports (`None`: the rank
    /// takes no part).
    fn apply(&mut self, step: &Step, n: usize) -> Vec<Option<usize>> {
        let mut counts = vec![None; n];
        match *step {
            Step::P2p { q, src, dst, sbuf, rbuf, .. } => {
                let b = &mut self.bufs[q as usize];
                let data = b[src as usize][sbuf as usize].clone();
                b[dst as usize][rbuf as usize][..data.len()].copy_from_slice(&data);
                counts[src as usize] = Some(data.len());
                counts[dst as usize] = Some(data.len());
            }
            Step::Null { rank, .. } => counts[rank as usize] = Some(0),
            Step::AllReduce { q, op, sbuf, rbuf } => {
                let b = &mut self.bufs[q as usize];
                let out = reduce(op, (0..n).map(|r| b[r][sbuf as usize].clone()).collect());
                (0..n).for_each(|r| b[r][rbuf as usize] = out.clone());
                counts = vec![Some(out.len()); n];
            }
            Step::Broadcast { q, root, buf } => {
                let b = &mut self.bufs[q as usize];
                let data = b[root as usize][buf as usize].clone();
                (0..n).for_each(|r| b[r][buf as usize] = data.clone());
                counts = vec![Some(data.len()); n];
            }
            Step::AllGather { q, sbuf, rbuf } => {
                let b = &mut self.bufs[q as usize];
                let out: Vec<u64> = (0..n).flat_map(|r| b[r][sbuf as usize].clone()).collect();
                (0..n).for_each(|r| b[r][rbuf as usize] = out.clone());
                counts = vec![Some(out.len()); n];
            }
            Step::ReduceScatter { q, op, sbuf, rbuf } => {
                let b = &mut self.bufs[q as usize];
                let out = reduce(op, (0..n).map(|r| b[r][sbuf as usize].clone()).collect());
                let l = out.len() / n;
                (0..n).for_each(|r| b[r][rbuf as usize] = out[r * l..(r + 1) * l].to_vec());
                counts = vec![Some(l); n];
            }
            Step::AllToAll { q, sbuf, rbuf } => {
                let b = &mut self.bufs[q as usize];
                let l = b[0][sbuf as usize].len() / n;
                let outs: Vec<Vec<u64>> =
                    (0..n).map(|r| (0..n).flat_map(|j| b[j][sbuf as usize][r * l..(r + 1) * l].to_vec()).collect()).collect();
                (0..n).for_each(|r| b[r][rbuf as usize] = outs[r].clone());
                counts = vec![Some(l * n); n];
            }
            Step::Start { .. } => {}
        }
        counts
    }
}

fn reduce(op: Op, inputs: Vec<Vec<u64>>) -> Vec<u64> {
    let mut it = inputs.into_iter();
    let first = it.next().expect("one rank at least");
    it.fold(first, |acc, x| acc.iter().zip(&x).map(|(&a, &b)| op.apply(a, b)).collect())
}

/// One request and the element count the model says it reports.
struct Expect {
    step: usize,
    req: Request,
    elements: usize,
}

/// Where a program's buffers live: host memory on host queues, or (feature `cuda`) device
/// memory on CUDA streams over the staged path.
trait Memory {
    type Buf: QueueBuffer<u64> + Clone;
    /// A queue of the program's queue `q` over `comm`.
    fn open(&mut self, q: usize, comm: Communicator) -> sucl_runtime::Result<CommQueue>;
    /// A buffer of queue `q` holding `data`.
    fn make(&self, q: usize, data: Vec<u64>) -> Self::Buf;
    /// What `b` holds (after the queues synchronized).
    fn read(b: &Self::Buf) -> Vec<u64>;
}

/// Host queues with `SharedBuf`s.
#[derive(Default)]
struct Host(Vec<HostQueue>);

impl Memory for Host {
    type Buf = SharedBuf<u64>;
    fn open(&mut self, _q: usize, comm: Communicator) -> sucl_runtime::Result<CommQueue> {
        self.0.push(HostQueue::new());
        CommQueue::on_host(comm, self.0.last().expect("pushed"))
    }
    fn make(&self, _q: usize, data: Vec<u64>) -> SharedBuf<u64> {
        SharedBuf::new(data)
    }
    fn read(b: &SharedBuf<u64>) -> Vec<u64> {
        b.to_vec()
    }
}

/// Runs `p` as `rank` of `world`; returns a description of the first disagreement with the
/// model, or of the first error.
fn execute<M: Memory>(p: &Program, world: &Communicator, mem: &mut M) -> Result<(), String> {
    let rank = world.rank();
    let err = |what: &str, e: sucl_runtime::Error| format!("{what}: {e}");
    let mut queues = vec![];
    for q in 0..p.lens.len() {
        let c = world.split(Some(0), rank as i64).map_err(|e| err("split", e))?.ok_or("split left this rank out")?;
        queues.push(mem.open(q, c).map_err(|e| err("opening a queue", e))?);
    }
    let mut bufs: Vec<Vec<Option<M::Buf>>> = p.lens.iter().map(|l| vec![None; l.len()]).collect();
    let mut expects = vec![];
    let mut model = Model::new(p);
    let run = enqueue_all(p, rank, &mut queues, mem, &mut bufs, &mut model, &mut expects);
    let mut first = run.err();
    for (i, q) in queues.iter_mut().enumerate() {
        if q.enqueued() > 0 {
            if let Err(e) = q.start() {
                first.get_or_insert(format!("final start of queue {i}: {e}"));
            }
        }
        if let Err(e) = q.synchronize() {
            first.get_or_insert(format!("synchronize of queue {i}: {e}"));
        }
    }
    if first.is_none() {
        first = check::<M>(&expects, &bufs, &model, rank).err();
    }
    drop(expects);
    for (i, q) in queues.into_iter().enumerate() {
        if let Err(e) = q.close() {
            first.get_or_insert(format!("close of queue {i}: {e}"));
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Enqueues this rank's part of every step, advancing the model alongside.
fn enqueue_all<M: Memory>(
    p: &Program,
    rank: usize,
    queues: &mut [CommQueue],
    mem: &M,
    bufs: &mut [Vec<Option<M::Buf>>],
    model: &mut Model,
    expects: &mut Vec<Expect>,
) -> Result<(), String> {
    let n = p.ranks;
    for (s, step) in p.steps.iter().enumerate() {
        let fail = |e: sucl_runtime::Error| format!("step {s} ({step:?}): {e}");
        let q = match *step {
            Step::P2p { q, .. }
            | Step::Null { q, .. }
            | Step::AllReduce { q, .. }
            | Step::Broadcast { q, .. }
            | Step::AllGather { q, .. }
            | Step::ReduceScatter { q, .. }
            | Step::AllToAll { q, .. }
            | Step::Start { q, .. } => q as usize,
        };
        let mut buf = |slot: u32| -> M::Buf {
            let b = &mut bufs[q][slot as usize];
            b.get_or_insert_with(|| mem.make(q, initial(p.seed, q, slot as usize, rank, p.lens[q][slot as usize]))).clone()
        };
        let cq = &mut queues[q];
        let req = match *step {
            Step::P2p { src, dst, tag, sbuf, .. } if rank == src as usize => Some(cq.enqueue_send(&buf(sbuf), dst as usize, tag)),
            Step::P2p { src, dst, tag, rbuf, .. } if rank == dst as usize => Some(cq.enqueue_recv(&buf(rbuf), src as usize, tag)),
            Step::Null { rank: who, send, buf: b, .. } if who as usize == rank => {
                let b = buf(b);
                Some(if send { cq.enqueue_send(&b, PROC_NULL, 5) } else { cq.enqueue_recv(&b, PROC_NULL, 5) })
            }
            Step::AllReduce { op, sbuf, rbuf, .. } => Some(cq.enqueue_all_reduce(&buf(sbuf), &buf(rbuf), op.reduce_op())),
            Step::Broadcast { root, buf: b, .. } => Some(cq.enqueue_broadcast(&buf(b), root as usize)),
            Step::AllGather { sbuf, rbuf, .. } => Some(cq.enqueue_all_gather(&buf(sbuf), &buf(rbuf))),
            Step::ReduceScatter { op, sbuf, rbuf, .. } => Some(cq.enqueue_reduce_scatter(&buf(sbuf), &buf(rbuf), op.reduce_op())),
            Step::AllToAll { sbuf, rbuf, .. } => Some(cq.enqueue_all_to_all(&buf(sbuf), &buf(rbuf))),
            Step::Start { wait, .. } => {
                cq.start().map_err(fail)?;
                if wait {
                    cq.wait().map_err(fail)?;
                }
                None
            }
            _ => None,
        };
        let counts = model.apply(step, n);
        if let Some(req) = req {
            let elements = counts[rank].expect("the model counts every operation this rank takes part in");
            expects.push(Expect { step: s, req: req.map_err(fail)?, elements });
        }
    }
    Ok(())
}

/// Compares every request and buffer with the model.
fn check<M: Memory>(expects: &[Expect], bufs: &[Vec<Option<M::Buf>>], model: &Model, rank: usize) -> Result<(), String> {
    for e in expects {
        let got = e.req.wait().map_err(|err| format!("step {}: request failed: {err}", e.step))?;
        if got != e.elements {
            return Err(format!("step {}: the request reported {got} elements, the model {}", e.step, e.elements));
        }
    }
    for (q, slots) in bufs.iter().enumerate() {
        for (slot, b) in slots.iter().enumerate() {
            let Some(b) = b else { continue };
            let (have, want) = (M::read(b), &model.bufs[q][rank][slot]);
            if let Some(i) = (0..have.len()).find(|&i| have[i] != want[i]) {
                return Err(format!(
                    "queue {q} slot {slot} ({} elements): element {i} is {}, the model says {}",
                    have.len(),
                    have[i],
                    want[i]
                ));
            }
        }
    }
    Ok(())
}

/// Device buffers on CUDA streams, the staged path (every receive filled exactly: a device
/// receive must be, so these programs have no slack).
#[cfg(feature = "cuda")]
mod device {
    use super::*;
    use sucl_runtime::cuda::Queue;
    use sucl_stream::device::{DeviceBuf, Transport};

    pub struct Device {
        pub dev: sucl_runtime::cuda::Device,
        pub streams: Vec<Queue>,
    }

    impl Memory for Device {
        type Buf = DeviceBuf<u64>;
        fn open(&mut self, _q: usize, comm: Communicator) -> sucl_runtime::Result<CommQueue> {
            self.streams.push(self.dev.queue()?);
            CommQueue::on_stream(comm, self.streams.last().expect("pushed"), Transport::Staged)
        }
        fn make(&self, q: usize, data: Vec<u64>) -> DeviceBuf<u64> {
            DeviceBuf::new(self.streams[q].upload(&data).expect("upload"))
        }
        fn read(b: &DeviceBuf<u64>) -> Vec<u64> {
            b.lock().to_vec().expect("download")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The launcher side: seeds in chunks, a failing chunk narrowed to its seed, the seed's program
// shrunk.

/// How the ranks of one launch find their programs: a list of seeds, or one program in a file.
enum Work<'a> {
    Seeds(&'a [u64]),
    Program(&'a std::path::Path),
}

/// The ranks' side: runs each program of the launch in turn; the first failure ends the rank
/// with its seed and description on stderr.
fn rank_main(rank: usize) {
    let world = sucl_runtime::init().expect("init");
    assert_eq!(world.rank(), rank, "the launcher's rank and the communicator's");
    let n = world.size();
    let device = std::env::var("SUCL_RP_MEMORY").is_ok_and(|v| v == "device");
    let programs: Vec<Program> = match std::env::var("SUCL_RP_PROGRAM_FILE") {
        Ok(path) => vec![serde_json::from_str(&std::fs::read_to_string(path).expect("program file")).expect("program json")],
        Err(_) => {
            std::env::var("SUCL_RP_RUN_SEEDS").expect("seeds").split(',').map(|s| generate(s.parse().expect("seed"), n, device)).collect()
        }
    };
    for p in &programs {
        if let Err(e) = execute_in(p, &world, device) {
            eprintln!("RANDOM-PROGRAM-FAILURE seed={} rank={rank}: {e}", p.seed);
            std::process::exit(3);
        }
    }
    println!("{RANK_DONE} rank={rank}");
}

/// Runs `p` in host memory, or in device memory (feature `cuda`).
fn execute_in(p: &Program, world: &Communicator, device: bool) -> Result<(), String> {
    if !device {
        return execute(p, world, &mut Host::default());
    }
    #[cfg(feature = "cuda")]
    {
        let dev = world.cuda_device().map_err(|e| format!("no device: {e}"))?;
        execute(p, world, &mut device::Device { dev, streams: vec![] })
    }
    #[cfg(not(feature = "cuda"))]
    Err("device memory needs the cuda feature".into())
}

/// What a rank prints once it ran every program of its launch (a rank that ran no test at all
/// exits 0 too, so success is this line, not the exit status alone).
const RANK_DONE: &str = "RANDOM-PROGRAMS-DONE";

/// This process's rank when it runs as a rank of a launch (the common harness's variable, or
/// Open MPI's under `mpirun`).
fn child_rank() -> Option<usize> {
    let mpi = || std::env::var("SUCL_RP_MPI_CHILD").ok().and(std::env::var("OMPI_COMM_WORLD_RANK").ok()).and_then(|r| r.parse().ok());
    common::child_rank().or_else(mpi)
}

/// The transports a test runs over, as the launch environment selects them.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Shm,
    Tcp,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Mpi,
    /// Device buffers on CUDA streams, staged over shm.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Staged,
}

impl Transport {
    fn device(self) -> bool {
        matches!(self, Transport::Staged)
    }
}

/// Launches `ranks` ranks of test `name` on `work`; Ok or the ranks' failure text.
fn launch_once(name: &str, t: Transport, ranks: usize, work: &Work) -> Result<(), String> {
    let seeds;
    let file;
    let mut env: Vec<(&str, &str)> = vec![("SUCL_TIMEOUT", "8")];
    match work {
        Work::Seeds(s) => {
            seeds = s.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            env.push(("SUCL_RP_RUN_SEEDS", &seeds));
        }
        Work::Program(path) => {
            file = path.display().to_string();
            env.push(("SUCL_RP_PROGRAM_FILE", &file));
        }
    }
    let limit = Duration::from_secs(60 + 10 * seeds_in(work) as u64);
    // The harness picks a free port and lets it go before the ranks bind it; a launch running
    // beside this one may take it meanwhile. That is the harness's race, not the program's:
    // launch again on a new port.
    for _ in 0..3 {
        match launch_on(name, t, ranks, &env, limit) {
            Err(why) if why.contains("Address already in use") && why.contains("rendezvous store") => continue,
            r => return r,
        }
    }
    launch_on(name, t, ranks, &env, limit)
}

/// One launch of `ranks` ranks of test `name` over `t` with `env`.
fn launch_on(name: &str, t: Transport, ranks: usize, env: &[(&str, &str)], limit: Duration) -> Result<(), String> {
    let env = env.to_vec();
    let outs = match t {
        Transport::Shm => launch_with(name, ranks, &[env.as_slice(), &[("SUCL_BACKEND", "shm")]].concat(), limit),
        Transport::Tcp => launch_with(name, ranks, &[env.as_slice(), &[("SUCL_BACKEND", "tcp")]].concat(), limit),
        Transport::Mpi => mpi::launch(name, ranks, &[env.as_slice(), &[("SUCL_BACKEND", "mpi")]].concat(), limit),
        Transport::Staged => {
            launch_with(name, ranks, &[env.as_slice(), &[("SUCL_BACKEND", "shm"), ("SUCL_RP_MEMORY", "device")]].concat(), limit)
        }
    }?;
    let done: usize = outs.iter().map(|o| o.stdout.matches(RANK_DONE).count()).sum();
    let bad: Vec<&Outcome> = outs.iter().filter(|o| !o.status.success() || !o.stdout.contains(RANK_DONE)).collect();
    if bad.is_empty() && done == ranks {
        return Ok(());
    }
    Err(bad.iter().map(|o| failure_lines(o)).collect::<Vec<_>>().join("\n"))
}

fn seeds_in(w: &Work) -> usize {
    match w {
        Work::Seeds(s) => s.len(),
        Work::Program(_) => 1,
    }
}

/// The launch of the common harness, a hang turned into a failure instead of a panic.
fn launch_with(name: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Result<Vec<Outcome>, String> {
    std::panic::catch_unwind(|| launch(name, n, env, limit)).map_err(|p| {
        let text = p.downcast_ref::<String>().cloned().unwrap_or_else(|| "the launch panicked".into());
        text.lines().take(40).collect::<Vec<_>>().join("\n")
    })
}

/// A rank's failure line (a panic's with the message after it), or the end of its stderr.
fn failure_lines(o: &Outcome) -> String {
    let all: Vec<&str> = o.stderr.lines().collect();
    let mut lines = vec![];
    for (i, l) in all.iter().enumerate() {
        if l.contains("RANDOM-PROGRAM-FAILURE") {
            lines.push(l.to_string());
        } else if l.contains("panicked") {
            lines.push(format!("{l} {}", all.get(i + 1).unwrap_or(&"")));
        }
    }
    if lines.is_empty() {
        let tail: Vec<&str> = all.iter().rev().take(6).copied().collect();
        format!("rank {} exited with {}: {}", o.rank, o.status, tail.into_iter().rev().collect::<Vec<_>>().join(" | "))
    } else {
        lines.join("\n")
    }
}

/// The seed range of a test: `SUCL_RP_SEEDS=a..b` or the default.
fn seed_range(default: std::ops::Range<u64>) -> Vec<u64> {
    let Ok(v) = std::env::var("SUCL_RP_SEEDS") else { return default.collect() };
    let (a, b) = v.split_once("..").expect("SUCL_RP_SEEDS=a..b");
    (a.parse().expect("seed")..b.parse().expect("seed")).collect()
}

fn ranks_of(seed: u64) -> usize {
    match std::env::var("SUCL_RP_RANKS") {
        Ok(r) => r.parse().expect("SUCL_RP_RANKS"),
        Err(_) => 2 + (seed % 3) as usize,
    }
}

/// Runs every seed of `default` (or `SUCL_RP_SEEDS`) over `t`; on a failure, narrows it to one
/// seed, shrinks that seed's program and panics with the smallest failing program. With
/// `SUCL_RP_KEEP_GOING=1` every seed runs first and the count of failing seeds is reported too.
fn run_seeds(name: &str, t: Transport, default: std::ops::Range<u64>) {
    if let Some(rank) = child_rank() {
        return rank_main(rank);
    }
    let chunk: usize = std::env::var("SUCL_RP_CHUNK").ok().and_then(|c| c.parse().ok()).unwrap_or(25);
    let keep_going = std::env::var("SUCL_RP_KEEP_GOING").is_ok_and(|v| v == "1");
    let seeds = seed_range(default);
    let (mut programs, mut ops) = (0usize, 0usize);
    let mut failed: Vec<(u64, usize, String)> = vec![];
    for ranks in 2..=4 {
        let mine: Vec<u64> = seeds.iter().copied().filter(|&s| ranks_of(s) == ranks).collect();
        for group in mine.chunks(chunk) {
            if let Err(why) = launch_once(name, t, ranks, &Work::Seeds(group)) {
                let bad = narrow(name, t, ranks, group);
                let bad = if bad.is_empty() { vec![(group[0], why)] } else { bad };
                failed.extend(bad.into_iter().map(|(s, w)| (s, ranks, w)));
                if !keep_going {
                    break;
                }
            }
            programs += group.len();
            ops += group.iter().map(|&s| generate(s, ranks, t.device()).steps.len()).sum::<usize>();
        }
        if !keep_going && !failed.is_empty() {
            break;
        }
    }
    println!("random programs over {t:?}: {programs} programs, {ops} steps, {} failures", failed.len());
    if let Some((seed, ranks, why)) = failed.first() {
        let all: Vec<String> = failed.iter().map(|(s, r, _)| format!("{s} ({r} ranks)")).collect();
        println!("failing seeds over {t:?}: {}", all.join(", "));
        report_failure(name, t, generate(*seed, *ranks, t.device()), why);
    }
}

/// The seeds of `group` that fail on their own (a seed that only fails after another one of its
/// launch is not found here), with their failures; the first only unless `SUCL_RP_KEEP_GOING=1`.
fn narrow(name: &str, t: Transport, ranks: usize, group: &[u64]) -> Vec<(u64, String)> {
    let keep_going = std::env::var("SUCL_RP_KEEP_GOING").is_ok_and(|v| v == "1");
    let mut bad = vec![];
    for &s in group {
        if let Err(why) = launch_once(name, t, ranks, &Work::Seeds(&[s])) {
            bad.push((s, why));
            if !keep_going {
                break;
            }
        }
    }
    bad
}

/// Shrinks `p` (unless `SUCL_RP_SHRINK=0`), writes the smallest failing program and panics.
fn report_failure(name: &str, t: Transport, p: Program, why: &str) -> ! {
    let shrink = std::env::var("SUCL_RP_SHRINK").map_or(true, |v| v != "0");
    let (small, small_why) = if shrink { shrink_program(name, t, p.clone(), why) } else { (p.clone(), why.to_string()) };
    let path = failure_path();
    let _ = std::fs::write(&path, serde_json::to_string_pretty(&small).expect("json"));
    let listing: String = small.steps.iter().enumerate().map(|(i, s)| format!("  {i:3}: {s:?}\n")).collect();
    panic!(
        "random program seed {} ({} ranks, {} queues, over {t:?}) fails: {why}\n\
         smallest failing program ({} of {} steps, written to {}):\n{listing}its failure: {small_why}",
        p.seed,
        p.ranks,
        p.lens.len(),
        small.steps.len(),
        p.steps.len(),
        path.display()
    );
}

fn failure_path() -> std::path::PathBuf {
    let dir = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let _ = std::fs::create_dir_all(&dir);
    dir.join("random-program-failure.json")
}

/// Removes steps (halves, then quarters, ..., then single steps; a message or collective goes
/// with the steps it needs on every rank by construction) while the program still fails.
fn shrink_program(name: &str, t: Transport, mut p: Program, why: &str) -> (Program, String) {
    let mut last_why = why.to_string();
    let file = tempfile_path(&p);
    let fails = |cand: &Program, last: &mut String| {
        std::fs::write(&file, serde_json::to_string(cand).expect("json")).expect("program file");
        match launch_once(name, t, cand.ranks, &Work::Program(&file)) {
            Err(w) => {
                *last = w;
                true
            }
            Ok(()) => false,
        }
    };
    let mut cut = p.steps.len().div_ceil(2);
    let mut tries = 0;
    while cut >= 1 && tries < 200 {
        let mut at = 0;
        let mut removed_any = false;
        while at < p.steps.len() && tries < 200 {
            let mut cand = p.clone();
            cand.steps.drain(at..(at + cut).min(cand.steps.len()));
            tries += 1;
            if !cand.steps.is_empty() && valid(&cand) && fails(&cand, &mut last_why) {
                p = cand;
                removed_any = true;
            } else {
                at += cut;
            }
        }
        if !removed_any {
            cut /= 2;
        }
    }
    let _ = std::fs::remove_file(&file);
    (p, last_why)
}

/// Whether `p` keeps the queue's rule (a buffer that one operation of a batch writes serves no
/// other operation of that batch): removing a start merges two batches, which may break it.
fn valid(p: &Program) -> bool {
    let n = p.ranks;
    let mut uses: Vec<std::collections::HashMap<(usize, u32), bool>> = vec![Default::default(); p.lens.len()];
    fn take(uses: &mut [std::collections::HashMap<(usize, u32), bool>], q: u8, ranks: &[usize], slot: u32, write: bool) -> bool {
        ranks.iter().all(|&r| {
            let prev = uses[q as usize].insert((r, slot), write);
            match prev {
                None => true,
                Some(w) => !w && !write,
            }
        })
    }
    let u = &mut uses;
    let all: Vec<usize> = (0..n).collect();
    for step in &p.steps {
        let ok = match *step {
            Step::P2p { q, src, dst, sbuf, rbuf, .. } => {
                take(u, q, &[src as usize], sbuf, false) && take(u, q, &[dst as usize], rbuf, true)
            }
            Step::Null { .. } => true,
            Step::AllReduce { q, sbuf, rbuf, .. } if sbuf == rbuf => take(u, q, &all, rbuf, true),
            Step::AllReduce { q, sbuf, rbuf, .. }
            | Step::AllGather { q, sbuf, rbuf }
            | Step::ReduceScatter { q, sbuf, rbuf, .. }
            | Step::AllToAll { q, sbuf, rbuf } => take(u, q, &all, sbuf, false) && take(u, q, &all, rbuf, true),
            Step::Broadcast { q, buf, .. } => take(u, q, &all, buf, true),
            Step::Start { q, .. } => {
                u[q as usize].clear();
                true
            }
        };
        if !ok {
            return false;
        }
    }
    true
}

fn tempfile_path(p: &Program) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sucl-rp-{}-{}.json", std::process::id(), p.seed))
}

/// Launching ranks under the system's `mpirun`.
#[cfg(feature = "mpi")]
mod mpi {
    use super::common::Outcome;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    pub fn launch(name: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Result<Vec<Outcome>, String> {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("mpirun");
        c.args(["-n", &n.to_string(), "--oversubscribe", "--bind-to", "none"]);
        if nix_root() {
            c.arg("--allow-run-as-root");
        }
        c.args(["-x", "SUCL_RP_MPI_CHILD=1"]);
        for (k, v) in env {
            c.args(["-x", &format!("{k}={v}")]);
        }
        c.arg(&exe).args(["--exact", name, "--nocapture", "--test-threads=1"]);
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("mpirun: {e}"))?;
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                return Ok(vec![Outcome { rank: 0, status, stdout: text(&out.stdout), stderr: text(&out.stderr) }]);
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("mpirun -n {n}: still running after {limit:?} (hang)"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn nix_root() -> bool {
        std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    }
}

#[cfg(not(feature = "mpi"))]
mod mpi {
    use super::common::Outcome;
    use std::time::Duration;
    pub fn launch(_: &str, _: usize, _: &[(&str, &str)], _: Duration) -> Result<Vec<Outcome>, String> {
        Err("built without the mpi feature".into())
    }
}

/// The programs the generator once found failing (`tests/programs/*.json`, shrunk), run over shm
/// and tcp: each hung its ranks before its fix.
#[test]
fn programs_that_once_failed() {
    if let Some(rank) = child_rank() {
        return rank_main(rank);
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("tests/programs").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no program in {}", dir.display());
    for f in &files {
        let p: Program = serde_json::from_str(&std::fs::read_to_string(f).expect("program file")).expect("program json");
        for t in [Transport::Shm, Transport::Tcp] {
            if let Err(why) = launch_once("programs_that_once_failed", t, p.ranks, &Work::Program(f)) {
                panic!("{} fails over {t:?}: {why}", f.display());
            }
        }
    }
}

#[test]
fn random_programs_shm() {
    run_seeds("random_programs_shm", Transport::Shm, 0..240);
}

#[test]
fn random_programs_tcp() {
    run_seeds("random_programs_tcp", Transport::Tcp, 0..240);
}

#[cfg(feature = "mpi")]
#[test]
fn random_programs_mpi() {
    run_seeds("random_programs_mpi", Transport::Mpi, 0..200);
}

/// Device buffers on CUDA streams, staged over shm (a skip without a GPU; a failure then under
/// `SUCL_REQUIRE_GPU=1`).
#[cfg(feature = "cuda")]
#[test]
fn random_programs_staged() {
    if child_rank().is_none() && common::gpus_or_skip().is_none() {
        return;
    }
    run_seeds("random_programs_staged", Transport::Staged, 0..60);
}

/// Runs the program in `SUCL_RP_PROGRAM` (a file a failure wrote) over `SUCL_BACKEND`
/// (default shm).
#[test]
#[ignore = "replays a program file named by SUCL_RP_PROGRAM"]
fn replay() {
    let path = std::path::PathBuf::from(std::env::var("SUCL_RP_PROGRAM").expect("SUCL_RP_PROGRAM=<file>"));
    let p: Program = serde_json::from_str(&std::fs::read_to_string(&path).expect("program file")).expect("program json");
    let t = match std::env::var("SUCL_BACKEND").as_deref() {
        Ok("tcp") => Transport::Tcp,
        Ok("mpi") => Transport::Mpi,
        _ if std::env::var("SUCL_RP_MEMORY").is_ok_and(|v| v == "device") => Transport::Staged,
        _ => Transport::Shm,
    };
    let name = match t {
        Transport::Shm => "random_programs_shm",
        Transport::Tcp => "random_programs_tcp",
        Transport::Mpi => "random_programs_mpi",
        Transport::Staged => "random_programs_staged",
    };
    if let Err(why) = launch_once(name, t, p.ranks, &Work::Program(&path)) {
        panic!("program {} fails over {t:?}: {why}", path.display());
    }
}

/// Prints the program of `SUCL_RP_DUMP=<seed>,<ranks>[,exact]` as JSON (a replayable file).
#[test]
#[ignore = "prints the program named by SUCL_RP_DUMP"]
fn dump() {
    let spec = std::env::var("SUCL_RP_DUMP").expect("SUCL_RP_DUMP=<seed>,<ranks>[,exact]");
    let parts: Vec<&str> = spec.split(',').collect();
    let p = generate(parts[0].parse().expect("seed"), parts[1].parse().expect("ranks"), parts.get(2) == Some(&"exact"));
    println!("{}", serde_json::to_string_pretty(&p).expect("json"));
}

/// The generator itself: deterministic, every program balanced (each message enqueued by both
/// of its ranks at one step) and ending started.
#[test]
fn generator_is_deterministic_and_covers_every_kind() {
    if child_rank().is_some() {
        return;
    }
    let mut kinds = std::collections::BTreeSet::new();
    for seed in 0..300 {
        let p = generate(seed, 2 + (seed % 3) as usize, seed % 2 == 0);
        assert_eq!(p, generate(seed, p.ranks, seed % 2 == 0));
        assert!(valid(&p), "seed {seed} breaks the one-writer rule of a batch");
        for s in &p.steps {
            let k = format!("{s:?}");
            kinds.insert(k.split([' ', '{']).next().unwrap().to_string());
            if let Step::P2p { src, dst, .. } = s {
                assert_ne!(src, dst);
                assert!((*dst as usize) < p.ranks);
            }
        }
    }
    for k in ["P2p", "Null", "AllReduce", "Broadcast", "AllGather", "ReduceScatter", "AllToAll", "Start"] {
        assert!(kinds.contains(k), "no program of 300 holds a {k}");
    }
}
