//! Hierarchical collectives: for a communicator whose ranks sit on several hosts, several per
//! host, one call runs shared memory inside each host and tcp between hosts.
//!
//! The ranks form a grid: host `h` (hosts numbered by their lowest rank) and local index `l`
//! (position among that host's ranks, by rank). Every host has a shared-memory communicator of
//! its `L` ranks; every local index has a tcp communicator of the `H` ranks that hold it, one
//! per host. So each byte crosses the network once per host, carried by `L` connections in
//! parallel, and all other traffic stays in shared memory:
//!
//! - all_reduce: intra-host reduce-scatter → inter-host all_reduce of each slice by the ranks
//!   that own it → intra-host all_gather (a tail shorter than `L` elements: all_reduce inside,
//!   then across);
//! - broadcast: the root's local index broadcasts across hosts, then every host inside;
//! - reduce: reduce inside every host to the root's local index, then across to the root;
//! - all_gather: across hosts (each rank's block), then inside (each host's share), reordered;
//! - reduce_scatter: inside (each local index's blocks of every host), then across;
//! - barrier: inside, across, inside.
//!
//! Large all_reduces run as a pipeline of chunks: a helper thread per `Hier` owns the right to
//! call the cross-host backend while a call is in flight, so the inter-host all_reduce of
//! chunk `i` runs while this thread does the shared-memory reduce-scatter of chunk `i + 1` and
//! the all-gather of chunk `i - 1`. Chunks go to the helper and come back as owned buffers
//! through bounded channels (at most [`PIPE_DEPTH`] in flight), so no memory is shared between
//! the threads. Every rank cuts the buffer the same way and issues its shared-memory calls in
//! the same order, so results are bitwise the same on every rank; a failure on either thread
//! ends the call with an error after the other thread's chunks in flight came back (each is
//! bounded by the backend's timeout and ends at once on an abort).
//!
//! Gather, scatter and all_to_all have no hierarchical form here: [`Hier::supports`] declines
//! them, so the communicator's default backend carries them. `avg` reduces with `sum` on every
//! level and divides once at the end, so integer averages round as on one level. The layout
//! needs the same number (≥ 2) of ranks on every one of ≥ 2 hosts; otherwise
//! [`Layout::of`] declines and selection never offers `hier`.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use sucl_core::backend::{Backend, CollDesc, CollOp, ReqId};
use sucl_core::dtype::finish_reduce;
use sucl_core::wait::{Backoff, Phase, Waiter};
use sucl_core::{AbortState, Error, ReduceOp, Result};

/// Chunks of one pipelined call in flight between this thread and the helper at once.
pub const PIPE_DEPTH: usize = 2;
/// Most chunks a pipelined call is cut into (each chunk costs a hand-off and the fixed cost of
/// three collectives).
const MAX_CHUNKS: usize = 8;
/// Default smallest chunk (bytes of the input); `SUCL_HIER_CHUNK_BYTES` overrides it, and 0
/// turns the pipeline off. A call of fewer than two chunks runs unpipelined.
const DEFAULT_CHUNK_BYTES: usize = 256 << 10;

/// The grid of a communicator's ranks over hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `at[h][l]`: the communicator rank with local index `l` on host `h`.
    pub at: Vec<Vec<usize>>,
    /// Per communicator rank: its host and local index.
    pub pos: Vec<(usize, usize)>,
}

impl Layout {
    /// The grid of ranks whose hosts are `hosts` (by communicator rank), or `None` unless there
    /// are at least two hosts with the same number, at least two, of ranks each.
    pub fn of<S: AsRef<str>>(hosts: &[S]) -> Option<Layout> {
        let mut names: Vec<&str> = vec![];
        let mut at: Vec<Vec<usize>> = vec![];
        let mut pos = Vec::with_capacity(hosts.len());
        for (r, h) in hosts.iter().enumerate() {
            let h = h.as_ref();
            let i = names.iter().position(|&n| n == h).unwrap_or_else(|| {
                names.push(h);
                at.push(vec![]);
                names.len() - 1
            });
            pos.push((i, at[i].len()));
            at[i].push(r);
        }
        let per = at.first()?.len();
        (at.len() >= 2 && per >= 2 && at.iter().all(|g| g.len() == per)).then_some(Layout { at, pos })
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.at.len()
    }

    /// Ranks per host.
    pub fn per_host(&self) -> usize {
        self.at[0].len()
    }
}

/// The hierarchical backend of one communicator (see the module documentation).
pub(crate) struct Hier {
    rank: usize,
    world_rank: usize,
    layout: Layout,
    /// This host's ranks, over shared memory (rank = local index).
    local: Box<dyn Backend>,
    /// The ranks of this local index on every host, over tcp (rank = host index). This thread
    /// locks it for unpipelined calls; the helper locks it for each chunk of a pipelined one
    /// (never both: this thread waits for every chunk before it returns).
    cross: Arc<Mutex<Box<dyn Backend>>>,
    scratch: Vec<u8>,
    scratch2: Vec<u8>,
    /// Chunk buffers not lent to the helper.
    slots: Vec<Vec<u8>>,
    helper: Option<Helper>,
    /// Smallest pipeline chunk in bytes (0: never pipeline).
    chunk_bytes: usize,
    timeout: Duration,
    backoff: Backoff,
    /// A pipelined call failed with chunks the helper never returned: the cross level is
    /// unusable.
    broken: bool,
    prof: Profile,
}

/// Settings of a [`Hier`] beyond its two levels.
pub(crate) struct HierSettings {
    /// Bound of every wait.
    pub timeout: Duration,
    /// How waits for the helper poll before they block.
    pub backoff: Backoff,
}

/// One chunk's inter-host all_reduce, handed to the helper.
struct Job {
    desc: CollDesc,
    buf: Vec<u8>,
    len: usize,
}

/// A chunk back from the helper: its buffer and how its all_reduce ended (with the time the
/// helper spent on it, for the profile).
struct Done {
    buf: Vec<u8>,
    res: Result<()>,
    busy: Duration,
}

/// The helper thread that drives the cross-host backend during pipelined calls.
struct Helper {
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

/// Where the time of large all_reduces went (logged at debug level when the backend drops).
#[derive(Default)]
struct Profile {
    calls: u64,
    pipelined: u64,
    bytes: u64,
    /// Wall time of the calls.
    total: Duration,
    /// Shared-memory reduce-scatters and all-gathers on this thread.
    local: Duration,
    /// This thread waiting for the cross level (all of it when unpipelined).
    cross_wait: Duration,
    /// The cross level's own time (on the helper when pipelined).
    cross_busy: Duration,
}

/// Calls smaller than this are not profiled (the clock reads would show).
const PROFILE_MIN_BYTES: usize = 64 << 10;

impl Hier {
    /// Composes the two levels for communicator rank `rank` (world rank `world_rank`).
    pub fn new(rank: usize, world_rank: usize, layout: Layout, local: Box<dyn Backend>, cross: Box<dyn Backend>, s: HierSettings) -> Hier {
        let chunk_bytes = std::env::var("SUCL_HIER_CHUNK_BYTES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_CHUNK_BYTES);
        Hier {
            rank,
            world_rank,
            layout,
            local,
            cross: Arc::new(Mutex::new(cross)),
            scratch: vec![],
            scratch2: vec![],
            slots: vec![],
            helper: None,
            chunk_bytes,
            timeout: s.timeout,
            backoff: s.backoff,
            broken: false,
            prof: Profile::default(),
        }
    }

    /// The cross-host backend, for a call on this thread.
    fn cross(&self) -> Result<MutexGuard<'_, Box<dyn Backend>>> {
        if self.broken {
            return Err(Error::Aborted {
                rank: self.world_rank,
                reason: "an earlier pipelined hierarchical call failed; the cross-host level is unusable".into(),
            });
        }
        Ok(self.cross.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn local_index(&self) -> usize {
        self.layout.pos[self.rank].1
    }

    fn not_p2p(&self) -> Error {
        Error::BackendUnavailable {
            rank: self.world_rank,
            backend: "hier".into(),
            why: "hier carries collectives only; point-to-point goes to another backend".into(),
        }
    }

    fn all_reduce(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (l, es) = (self.layout.per_host(), d.dtype.size());
        let redop = inner_op(d.redop);
        let blk = d.count / l;
        let main = blk * l * es;
        let started = (main >= PROFILE_MIN_BYTES).then(Instant::now);
        let chunks = self.chunks_of(main, l * es);
        if chunks >= 2 {
            self.pipelined_all_reduce(d, send, &mut recv[..main], chunks)?;
        } else if blk > 0 {
            let mut slice = std::mem::take(&mut self.scratch);
            slice.resize(blk * es, 0);
            let res = (|| -> Result<()> {
                let input = &send.unwrap_or(recv)[..main];
                let t = started.map(|_| Instant::now());
                self.local.collective(&coll(CollOp::ReduceScatter, d, blk, redop, 0), Some(input), &mut slice)?;
                let t1 = t.map(|_| Instant::now());
                self.cross()?.collective(&coll(CollOp::AllReduce, d, blk, redop, 0), None, &mut slice)?;
                let t2 = t.map(|_| Instant::now());
                self.local.collective(&coll(CollOp::AllGather, d, blk, redop, 0), Some(&slice), &mut recv[..main])?;
                if let (Some(t), Some(t1), Some(t2)) = (t, t1, t2) {
                    let cross = t2 - t1;
                    self.prof.local += t.elapsed() - cross;
                    self.prof.cross_wait += cross;
                    self.prof.cross_busy += cross;
                }
                Ok(())
            })();
            self.scratch = slice;
            res?;
        }
        let tail = d.count - blk * l;
        if tail > 0 {
            if let Some(s) = send {
                recv[main..].copy_from_slice(&s[main..]);
            }
            self.local.collective(&coll(CollOp::AllReduce, d, tail, redop, 0), None, &mut recv[main..])?;
            self.cross()?.collective(&coll(CollOp::AllReduce, d, tail, redop, 0), None, &mut recv[main..])?;
        }
        finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
        if let Some(t) = started {
            self.prof.calls += 1;
            self.prof.pipelined += (chunks >= 2) as u64;
            self.prof.bytes += main as u64;
            self.prof.total += t.elapsed();
        }
        Ok(())
    }

    /// How many chunks a pipelined call over `bytes` cuts them into (each a multiple of
    /// `unit` bytes); fewer than 2 means no pipeline. The same on every rank.
    fn chunks_of(&self, bytes: usize, unit: usize) -> usize {
        if self.chunk_bytes == 0 || unit == 0 {
            return 1;
        }
        (bytes / self.chunk_bytes).min(MAX_CHUNKS).min(bytes / unit)
    }

    /// The main part of an all_reduce (a multiple of `L` elements) in `chunks` chunks: for each,
    /// reduce-scatter inside the host here, all_reduce of this rank's slice across hosts on
    /// the helper, all-gather inside here, with up to [`PIPE_DEPTH`] chunks in flight.
    fn pipelined_all_reduce(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8], chunks: usize) -> Result<()> {
        let (l, es) = (self.layout.per_host(), d.dtype.size());
        let redop = inner_op(d.redop);
        let units = recv.len() / (l * es);
        // Chunk c covers units [c*units/chunks, (c+1)*units/chunks) of L elements each.
        let range = |c: usize| (c * units / chunks) * l * es..((c + 1) * units / chunks) * l * es;
        let slice_cap = units.div_ceil(chunks) * es;
        self.ensure_helper()?;
        while self.slots.len() < PIPE_DEPTH {
            self.slots.push(vec![]);
        }
        let (mut issued, mut completed) = (0usize, 0usize);
        let mut first_err: Option<Error> = None;
        while completed < issued || (issued < chunks && first_err.is_none()) {
            // Keep the helper fed: reduce-scatter the next chunks while it works.
            while first_err.is_none() && issued < chunks && issued - completed < PIPE_DEPTH {
                let rg = range(issued);
                let blk = rg.len() / (l * es);
                let mut slot = self.slots.pop().expect("a free slot while fewer than PIPE_DEPTH chunks are in flight");
                if slot.len() < slice_cap {
                    slot.resize(slice_cap, 0);
                }
                let t = Instant::now();
                let input = &send.unwrap_or(recv)[rg];
                let res = self.local.collective(&coll(CollOp::ReduceScatter, d, blk, redop, 0), Some(input), &mut slot[..blk * es]);
                self.prof.local += t.elapsed();
                match res.and_then(|_| self.hand_over(Job { desc: coll(CollOp::AllReduce, d, blk, redop, 0), buf: slot, len: blk * es })) {
                    Ok(()) => issued += 1,
                    Err(e) => first_err = Some(e),
                }
            }
            if completed == issued {
                break;
            }
            // The oldest chunk in flight comes back; gather it inside the host.
            let t = Instant::now();
            let back = self.take_back();
            self.prof.cross_wait += t.elapsed();
            let done = match back {
                Ok(done) => done,
                Err(e) => {
                    // The helper did not answer within the bound: its chunks are lost to us.
                    self.broken = true;
                    return Err(first_err.unwrap_or(e));
                }
            };
            self.prof.cross_busy += done.busy;
            let rg = range(completed);
            completed += 1;
            let blk = rg.len() / (l * es);
            if first_err.is_none() {
                let t = Instant::now();
                let res = done.res.and_then(|_| {
                    self.local.collective(&coll(CollOp::AllGather, d, blk, redop, 0), Some(&done.buf[..blk * es]), &mut recv[rg])
                });
                self.prof.local += t.elapsed();
                if let Err(e) = res {
                    first_err = Some(e);
                }
            }
            self.slots.push(done.buf);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts the helper thread on first use.
    fn ensure_helper(&mut self) -> Result<()> {
        if self.broken {
            drop(self.cross()?);
        }
        if self.helper.is_some() {
            return Ok(());
        }
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(PIPE_DEPTH);
        let (done_tx, done_rx) = mpsc::sync_channel::<Done>(PIPE_DEPTH);
        let cross = self.cross.clone();
        let spin = self.backoff.spin;
        let thread = std::thread::Builder::new()
            .name(format!("sucl-hier-{}", self.world_rank))
            .spawn(move || helper_loop(cross, jobs_rx, done_tx, spin))
            .map_err(|e| Error::io(self.world_rank, "starting the hierarchical pipeline's helper thread", e))?;
        self.helper = Some(Helper { jobs: Some(jobs_tx), done: done_rx, thread: Some(thread) });
        Ok(())
    }

    /// Gives a chunk to the helper (there is room: at most PIPE_DEPTH are in flight).
    fn hand_over(&mut self, job: Job) -> Result<()> {
        let h = self.helper.as_ref().expect("the helper runs during a pipelined call");
        h.jobs.as_ref().expect("jobs open while the backend lives").send(job).map_err(|_| self.helper_gone())
    }

    /// The next chunk back from the helper, waiting at most the timeout (plus a margin: the
    /// helper's own waits end by then).
    fn take_back(&mut self) -> Result<Done> {
        let h = self.helper.as_ref().expect("the helper runs during a pipelined call");
        let mut waiter = Waiter::new(self.timeout + Duration::from_secs(5), self.backoff);
        let never = AbortState::default();
        let what = || "all_reduce (waiting for the cross-host level of hier)".to_string();
        loop {
            match h.done.try_recv() {
                Ok(d) => return Ok(d),
                Err(TryRecvError::Disconnected) => return Err(self.helper_gone()),
                Err(TryRecvError::Empty) => {}
            }
            if waiter.phase() == Phase::Block {
                // The abort flag is not checked while blocked here: the helper's own waits
                // check it and answer at once.
                match h.done.recv_timeout(waiter.remaining().min(Duration::from_millis(10))) {
                    Ok(d) => return Ok(d),
                    Err(RecvTimeoutError::Disconnected) => return Err(self.helper_gone()),
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            // Never ends on an abort here (the helper answers it); only the clock bounds it.
            waiter.pause(&never, self.world_rank, &what, true)?;
        }
    }

    fn helper_gone(&self) -> Error {
        Error::Aborted { rank: self.world_rank, reason: "the hierarchical pipeline's helper thread ended (it panicked)".into() }
    }

    fn broadcast(&mut self, d: &CollDesc, buf: &mut [u8]) -> Result<()> {
        let (rh, rl) = self.layout.pos[d.root];
        if self.local_index() == rl {
            self.cross()?.collective(&coll(CollOp::Broadcast, d, d.count, d.redop, rh), None, buf)?;
        }
        self.local.collective(&coll(CollOp::Broadcast, d, d.count, d.redop, rl), None, buf)
    }

    fn reduce(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (rh, rl) = self.layout.pos[d.root];
        let redop = inner_op(d.redop);
        let len = d.count * d.dtype.size();
        let local_desc = coll(CollOp::Reduce, d, d.count, redop, rl);
        let cross_desc = coll(CollOp::Reduce, d, d.count, redop, rh);
        if self.rank == d.root {
            self.local.collective(&local_desc, send, recv)?;
            self.cross()?.collective(&cross_desc, None, recv)?;
            finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
            return Ok(());
        }
        let input = send.expect("a non-root reduce has a send buffer");
        if self.local_index() != rl {
            return self.local.collective(&local_desc, Some(input), &mut []);
        }
        // This host's partial result, on its way to the root's host.
        let mut part = std::mem::take(&mut self.scratch);
        part.resize(len, 0);
        let res = self
            .local
            .collective(&local_desc, Some(input), &mut part[..len])
            .and_then(|_| self.cross()?.collective(&cross_desc, Some(&part[..len]), &mut []));
        self.scratch = part;
        res
    }

    fn all_gather(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (h, l) = (self.layout.hosts(), self.layout.per_host());
        let b = d.count * d.dtype.size();
        let (mut across, mut inside) = (std::mem::take(&mut self.scratch), std::mem::take(&mut self.scratch2));
        across.resize(h * b, 0);
        inside.resize(h * l * b, 0);
        let res = (|| -> Result<()> {
            let mine = match send {
                Some(s) => s,
                None => &recv[self.rank * b..(self.rank + 1) * b],
            };
            // across[h'] = the block of (h', my local index); then inside[l'][h'] = block (h', l').
            self.cross()?.collective(&coll(CollOp::AllGather, d, d.count, d.redop, 0), Some(mine), &mut across)?;
            self.local.collective(&coll(CollOp::AllGather, d, d.count * h, d.redop, 0), Some(&across), &mut inside)?;
            for (hi, ranks) in self.layout.at.iter().enumerate() {
                for (li, &r) in ranks.iter().enumerate() {
                    let from = (li * h + hi) * b;
                    recv[r * b..(r + 1) * b].copy_from_slice(&inside[from..from + b]);
                }
            }
            Ok(())
        })();
        (self.scratch, self.scratch2) = (across, inside);
        res
    }

    fn reduce_scatter(&mut self, d: &CollDesc, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (h, l) = (self.layout.hosts(), self.layout.per_host());
        let b = d.count * d.dtype.size();
        let redop = inner_op(d.redop);
        let (mut order, mut part) = (std::mem::take(&mut self.scratch), std::mem::take(&mut self.scratch2));
        order.resize(h * l * b, 0);
        part.resize(h * b, 0);
        let res = (|| -> Result<()> {
            // order[l'][h'] = the input block of rank (h', l'): local index l' reduces, over this
            // host, the blocks of its own index on every host; then the hosts reduce across.
            for (hi, ranks) in self.layout.at.iter().enumerate() {
                for (li, &r) in ranks.iter().enumerate() {
                    let to = (li * h + hi) * b;
                    order[to..to + b].copy_from_slice(&send[r * b..(r + 1) * b]);
                }
            }
            self.local.collective(&coll(CollOp::ReduceScatter, d, d.count * h, redop, 0), Some(&order), &mut part)?;
            self.cross()?.collective(&coll(CollOp::ReduceScatter, d, d.count, redop, 0), Some(&part), recv)
        })();
        (self.scratch, self.scratch2) = (order, part);
        res?;
        finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.local.collective(&CollDesc::BARRIER, None, &mut [])?;
        self.cross()?.collective(&CollDesc::BARRIER, None, &mut [])?;
        self.local.collective(&CollDesc::BARRIER, None, &mut [])
    }
}

/// The helper thread: runs each chunk's cross-host all_reduce as it comes, in order, until the
/// backend drops its end of the job channel.
fn helper_loop(cross: Arc<Mutex<Box<dyn Backend>>>, jobs: Receiver<Job>, done: SyncSender<Done>, spin: Duration) {
    while let Some(job) = next_job(&jobs, spin) {
        let t = Instant::now();
        let mut buf = job.buf;
        let res = cross.lock().unwrap_or_else(|p| p.into_inner()).collective(&job.desc, None, &mut buf[..job.len]);
        if done.send(Done { buf, res, busy: t.elapsed() }).is_err() {
            return;
        }
    }
}

/// The next job: polled for `spin` (the next chunk is usually queued already, or about to be),
/// then waited for in the kernel; `None` once the backend is gone.
fn next_job(jobs: &Receiver<Job>, spin: Duration) -> Option<Job> {
    let start = Instant::now();
    loop {
        match jobs.try_recv() {
            Ok(j) => return Some(j),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if start.elapsed() < spin => std::hint::spin_loop(),
            // Idle between calls: nothing to bound (no peer is waited for here).
            Err(TryRecvError::Empty) => return jobs.recv().ok(),
        }
    }
}

impl Drop for Hier {
    fn drop(&mut self) {
        if let Some(mut h) = self.helper.take() {
            drop(h.jobs.take());
            // A broken pipeline may leave the helper in a cross-host wait (bounded by the
            // timeout): let it finish on its own rather than hold this thread.
            if let (Some(t), false) = (h.thread.take(), self.broken) {
                let _ = t.join();
            }
        }
        let p = &self.prof;
        if p.calls > 0 {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            tracing::debug!(
                rank = self.world_rank,
                "hier all_reduce profile: {} calls ({} pipelined, {:.1} MiB), {:.2} ms in all: shm reduce-scatter + all-gather {:.2} ms, waiting for tcp {:.2} ms (tcp busy {:.2} ms)",
                p.calls,
                p.pipelined,
                p.bytes as f64 / (1 << 20) as f64,
                ms(p.total),
                ms(p.local),
                ms(p.cross_wait),
                ms(p.cross_busy)
            );
        }
    }
}

/// The op every level reduces with: `avg` sums, and the caller divides once at the end.
fn inner_op(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    }
}

/// A descriptor of one level's call.
fn coll(op: CollOp, d: &CollDesc, count: usize, redop: ReduceOp, root: usize) -> CollDesc {
    CollDesc { op, dtype: d.dtype, redop, root, count }
}

impl Backend for Hier {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.layout.pos.len()
    }

    unsafe fn post_send(&mut self, _peer: usize, _tag: u64, _ptr: *const u8, _len: usize) -> Result<ReqId> {
        Err(self.not_p2p())
    }
    unsafe fn post_recv(&mut self, _peer: usize, _tag: u64, _ptr: *mut u8, _cap: usize) -> Result<ReqId> {
        Err(self.not_p2p())
    }
    fn test(&mut self, _req: ReqId) -> Result<Option<usize>> {
        Err(self.not_p2p())
    }
    fn wait(&mut self, _req: ReqId) -> Result<usize> {
        Err(self.not_p2p())
    }
    fn cancel(&mut self, _req: ReqId) {}

    fn supports(&self, desc: &CollDesc) -> bool {
        !matches!(desc.op, CollOp::Gather | CollOp::Scatter | CollOp::AllToAll)
            && self.local.supports(desc)
            && self.cross.lock().unwrap_or_else(|p| p.into_inner()).supports(desc)
    }

    fn collective(&mut self, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        match desc.op {
            CollOp::Barrier => self.barrier(),
            CollOp::Broadcast => self.broadcast(desc, recv),
            CollOp::AllReduce => self.all_reduce(desc, send, recv),
            CollOp::Reduce => self.reduce(desc, send, recv),
            CollOp::AllGather => self.all_gather(desc, send, recv),
            CollOp::ReduceScatter => self.reduce_scatter(desc, send.expect("reduce_scatter has a send buffer"), recv),
            CollOp::Gather | CollOp::Scatter | CollOp::AllToAll => Err(Error::BackendUnavailable {
                rank: self.world_rank,
                backend: "hier".into(),
                why: format!("{} has no hierarchical form (the default backend carries it)", desc.op.name()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_groups_ranks_by_host_in_rank_order() {
        let l = Layout::of(&["a", "b", "a", "b", "a", "b"]).unwrap();
        assert_eq!(l.at, vec![vec![0, 2, 4], vec![1, 3, 5]]);
        assert_eq!(l.pos[3], (1, 1));
        assert_eq!((l.hosts(), l.per_host()), (2, 3));
    }

    #[test]
    fn layout_declines_one_host_one_rank_per_host_and_uneven_hosts() {
        assert!(Layout::of(&["a", "a", "a"]).is_none(), "one host");
        assert!(Layout::of(&["a", "b", "c"]).is_none(), "one rank per host");
        assert!(Layout::of(&["a", "a", "b", "b", "b"]).is_none(), "2 + 3 ranks");
        assert!(Layout::of::<&str>(&[]).is_none());
    }
}
