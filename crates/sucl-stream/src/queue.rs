//! [`CommQueue`]: the queue front end shared by every path, and the host-queue path.

use crate::buffer::{Lent, QueueBuffer};
#[cfg(feature = "cuda")]
use crate::device::{Coll, DeviceBuf, DevicePath};
use crate::engine::{Batch, Channel, Lease, Mem, Op, Signal, Work};
use crate::request::{OpState, Request, StatePool, What};
use crate::{HostQueue, SharedBuf, ANY_SOURCE, ANY_TAG, MAX_IN_FLIGHT, PROC_NULL};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sucl_runtime::{Communicator, Element, Error, ReduceOp, Result, MAX_TAG};

/// The counters of a host queue: plain atomics. The queue's wait task spins, then yields (as
/// the communicator's backoff says: not at all on an oversubscribed host), then blocks on a
/// condition variable that the engine notifies only when a task sleeps on it.
pub(crate) struct HostSignal {
    /// A wait task that ran out of time (the engine should have failed the batch first).
    stalled: Mutex<Option<Error>>,
    /// Whether `stalled` holds an error (every enqueue checks it: no lock when it does not).
    has_stalled: AtomicBool,
    trigger: AtomicU64,
    done: AtomicU64,
    /// Wait tasks blocked on `moved` (counted under `sleep`).
    sleepers: AtomicU32,
    sleep: Mutex<()>,
    moved: Condvar,
    spin: Duration,
    yield_for: Duration,
}

impl HostSignal {
    /// Holds the calling task (bounded by `bound`) until batch `epoch` completed. While it
    /// polls, it drives the channel's progress itself (the baseline's thread would be testing
    /// its requests at this point too), so the completion does not wait for the engine thread
    /// to be scheduled.
    fn wait_done(&self, epoch: u64, bound: Duration, ch: &Channel) -> bool {
        let start = Instant::now();
        let (mut rounds, mut spent) = (0u32, Duration::ZERO);
        loop {
            if self.done.load(Ordering::Acquire) >= epoch {
                return true;
            }
            if ch.progress(true) {
                continue;
            }
            rounds = rounds.wrapping_add(1);
            if rounds % 32 == 1 {
                spent = start.elapsed();
            }
            if spent < self.spin {
                std::hint::spin_loop();
            } else if spent < self.spin + self.yield_for {
                std::thread::yield_now();
            } else {
                break;
            }
        }
        // Out of patience: the engine drives the batch from here on.
        ch.strand();
        let deadline = start + bound;
        let mut g = self.sleep.lock().unwrap_or_else(|p| p.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.done.load(Ordering::SeqCst) < epoch {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self.moved.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        ch.unstrand();
        self.done.load(Ordering::Acquire) >= epoch
    }
}

impl Signal for Arc<HostSignal> {
    fn triggered(&self) -> u64 {
        self.trigger.load(Ordering::Acquire)
    }
    fn complete(&self, epoch: u64) {
        self.done.fetch_max(epoch, Ordering::SeqCst);
        // A sleeper counts itself before it checks `done` (both SeqCst), so it either sees this
        // store or is seen here; taking the lock makes sure it is inside its wait.
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.sleep.lock().unwrap_or_else(|p| p.into_inner());
            self.moved.notify_all();
        }
    }
    fn polled(&self) -> bool {
        false
    }
}

/// How a queue's operations run.
pub(crate) enum Path {
    /// A host queue; batches run on the progress engine.
    Host { ch: Arc<Channel>, q: HostQueue, sig: Arc<HostSignal> },
    /// A CUDA stream.
    #[cfg(feature = "cuda")]
    Device(Box<DevicePath>),
}

/// A communicator bound to one in-order queue: operations are enqueued (nothing moves), a
/// [`start`](CommQueue::start) on the queue releases every operation enqueued since the last
/// one, and a [`wait`](CommQueue::wait) on the queue holds later queue work until every started
/// operation completed. See the crate documentation for the rules.
pub struct CommQueue {
    pub(crate) path: Path,
    /// Host-path operations enqueued since the last start.
    pending: Vec<Op>,
    /// The epoch of the last start (0: none yet).
    pub(crate) started: u64,
    /// Requests of started operations, for `synchronize` (pruned as they complete).
    pub(crate) outstanding: Vec<Request>,
    /// Requests of operations enqueued since the last start.
    pub(crate) unstarted: Vec<Request>,
    /// The last completed requests handed out for `PROC_NULL` operations (see
    /// [`CommQueue::null_request`]).
    nulls: [Option<Request>; 2],
    /// Host time this queue's calls spent blocked (throttled starts, synchronize).
    blocked: Duration,
    /// The buffers lent to operations enqueued since the last start, each with the first
    /// operation that writes it (else the first that reads it): see [`CommQueue::check_lent`].
    lent: HashMap<usize, Use, BuildHasherDefault<AddrHasher>>,
    /// States of completed operations, reused by later enqueues.
    pub(crate) states: StatePool,
    /// The buffers of the operation being enqueued (checked, recorded with its request).
    lending: [Option<(usize, bool)>; 2],
    /// `outstanding` is pruned when it reaches this length (then set to twice what is left), so
    /// that a start does not poll every request in flight.
    prune_at: usize,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) world_rank: usize,
    pub(crate) timeout: Duration,
    closed: bool,
}

/// An operation's use of a buffer lent to it.
#[derive(Clone, Copy)]
struct Use {
    what: What,
    writes: bool,
}

/// Hashes the buffer keys of [`CommQueue::check_lent`] (addresses: distinct, aligned) with one
/// folded multiply, where the default SipHash costs tens of nanoseconds per lookup and insert —
/// twice per enqueued operation. Not for keys a peer chooses (no flooding resistance needed).
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // The high and low halves of the 128-bit product folded: every input bit reaches the
        // low bits (the bucket index) and the high ones (the control tag).
        let p = u128::from(n ^ self.0) * 0x9e37_79b9_7f4a_7c15;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Slack added to the communicator's timeout for host-side waits, so that the engine (which
/// fails a batch after the timeout) reports first and its error, naming the peer, is the one
/// seen.
const SLACK: Duration = Duration::from_secs(2);

/// Fewest outstanding requests at which a start prunes the completed ones.
const PRUNE_MIN: usize = 256;

impl CommQueue {
    /// Binds `comm` to the host queue `queue`. The queue takes the communicator (its progress
    /// thread drives it); [`close`](CommQueue::close) gives it back. Ordinary sends and receives
    /// of the same communicator on other ranks match this queue's operations. Local.
    pub fn on_host(comm: Communicator, queue: &HostQueue) -> Result<CommQueue> {
        let backoff = comm.config().host.backoff;
        let sig = Arc::new(HostSignal {
            stalled: Mutex::new(None),
            has_stalled: AtomicBool::new(false),
            trigger: AtomicU64::new(0),
            done: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
            sleep: Mutex::new(()),
            moved: Condvar::new(),
            // Busy-poll only briefly, then yield: each rank adds two polling threads (the engine
            // and the queue's worker) to the ones the backoff was sized for.
            spin: backoff.spin.min(crate::SHORT_SPIN),
            yield_for: backoff.yield_for + backoff.spin.saturating_sub(crate::SHORT_SPIN),
        });
        let (rank, size, timeout) = (comm.rank(), comm.size(), comm.config().host.timeout);
        let world_rank = comm.world_rank_of(rank).unwrap_or(rank);
        let ch = Channel::new(comm, Box::new(sig.clone()))?;
        Ok(CommQueue::with_path(Path::Host { ch, q: queue.clone(), sig }, rank, size, world_rank, timeout))
    }

    pub(crate) fn with_path(path: Path, rank: usize, size: usize, world_rank: usize, timeout: Duration) -> CommQueue {
        CommQueue {
            path,
            pending: vec![],
            started: 0,
            outstanding: vec![],
            unstarted: vec![],
            nulls: [None, None],
            lent: HashMap::default(),
            states: StatePool::default(),
            lending: [None, None],
            prune_at: PRUNE_MIN,
            blocked: Duration::ZERO,
            rank,
            size,
            world_rank,
            timeout,
            closed: false,
        }
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks of the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Operations enqueued and not yet started (`PROC_NULL` ones complete at enqueue and are
    /// not counted).
    pub fn enqueued(&self) -> usize {
        self.unstarted.len()
    }

    pub(crate) fn bound(&self) -> Duration {
        self.timeout + SLACK
    }

    pub(crate) fn invalid(&self, arg: &'static str, why: impl Into<String>) -> Error {
        Error::invalid(self.world_rank, arg, why)
    }

    /// Checks an explicit peer and tag (no wildcards); `PROC_NULL` passes.
    pub(crate) fn check_peer_tag(&self, peer: usize, tag: u32, dir: &str) -> Result<()> {
        if peer == ANY_SOURCE {
            return Err(
                self.invalid("peer", format!("a stream-triggered {dir} needs an explicit peer: wildcards (ANY_SOURCE) are not allowed"))
            );
        }
        if peer != PROC_NULL && peer >= self.size {
            return Err(self.invalid("peer", format!("rank {peer} out of range (communicator size {})", self.size)));
        }
        if tag == ANY_TAG {
            return Err(self.invalid("tag", format!("a stream-triggered {dir} needs an explicit tag: wildcards (ANY_TAG) are not allowed")));
        }
        if tag > MAX_TAG {
            return Err(self.invalid("tag", format!("{tag} exceeds the largest tag {MAX_TAG}")));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size {
            return Err(self.invalid("root", format!("rank {root} out of range (communicator size {})", self.size)));
        }
        Ok(())
    }

    fn check_len(&self, arg: &'static str, got: usize, want: usize, what: &str) -> Result<()> {
        if got != want {
            return Err(self.invalid(arg, format!("has {got} elements but {what} needs {want}")));
        }
        Ok(())
    }

    fn check_open(&self) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        Ok(())
    }

    /// Refuses a buffer that two operations of one batch would use where one of them writes
    /// it (a receive, a collective's result): a batch is released as one unit (over NCCL one
    /// group, whose operations run at once in no defined order), so the outcome would depend on
    /// the transport — on a host queue the second would silently wait for the first to
    /// complete. Two reads (sends) of one buffer are fine, and so is using it again in a later
    /// batch (there the later operation waits for the earlier one to give the buffer back,
    /// as documented). `uses`: the buffers of the operation `what` about to be enqueued, each
    /// with whether it writes it.
    fn check_lent(&mut self, what: What, uses: [Option<(usize, bool)>; 2]) -> Result<()> {
        for (key, writes) in uses.iter().flatten() {
            if let Some(first) = self.lent.get(key).filter(|first| first.writes || *writes) {
                let (fw, w) = (if first.writes { "writes" } else { "reads" }, if *writes { "write" } else { "read" });
                return Err(self.invalid(
                    "buffer",
                    format!(
                        "one buffer lent to two operations of one batch: the {} {fw} it and the {what} would {w} it; \
                         lend another buffer, or start() between the two",
                        first.what
                    ),
                ));
            }
        }
        self.lending = uses;
        Ok(())
    }

    /// [`CommQueue::check_lent`] for a collective: `recv` is written, `send` read (unless the
    /// same buffer: in place).
    fn check_coll<T: Element>(&mut self, name: &'static str, send: Option<Lent<'_, T>>, recv: Lent<'_, T>) -> Result<()> {
        let r = recv.key();
        let s = send.map(|s| s.key()).filter(|&s| s != r);
        self.check_lent(What::Coll(name), [Some((r, true)), s.map(|s| (s, false))])
    }

    /// The error that failed this queue (a lost peer, a timeout), if any.
    pub fn failure(&self) -> Option<Error> {
        match &self.path {
            Path::Host { ch, sig, .. } => ch.error().or_else(|| {
                sig.has_stalled
                    .load(Ordering::Acquire)
                    .then(|| sig.stalled.lock().unwrap_or_else(|p| p.into_inner()).as_ref().cloned())
                    .flatten()
            }),
            #[cfg(feature = "cuda")]
            Path::Device(d) => d.failure(),
        }
    }

    pub(crate) fn new_request(&mut self, elem: usize, what: What) -> (Arc<OpState>, Request) {
        let state = self.states.make(elem, what, self.world_rank, None);
        let req = self.push_request(state.clone());
        (state, req)
    }

    /// Records the request of a new operation among those enqueued since the last start, and
    /// the buffers [`CommQueue::check_lent`] let it use.
    pub(crate) fn push_request(&mut self, state: Arc<OpState>) -> Request {
        for (key, writes) in std::mem::take(&mut self.lending).into_iter().flatten() {
            let first = self.lent.entry(key).or_insert(Use { what: state.what, writes });
            if writes {
                *first = Use { what: state.what, writes };
            }
        }
        let req = Request { state, bound: self.bound() };
        self.unstarted.push(req.clone());
        req
    }

    /// The request of an operation with the `PROC_NULL` peer: complete at once, moving
    /// nothing, and never part of a batch (so it costs the queue, its tasks and the cap on
    /// operations in flight nothing: at the edges of a Faces grid most of a step's 52
    /// operations are such). Consecutive ones with the same direction and tag share one
    /// completed state.
    pub(crate) fn null_request(&mut self, elem: usize, what: What) -> Request {
        let slot = usize::from(matches!(what, What::Recv { .. }));
        if let Some(r) = &self.nulls[slot] {
            if r.state.what == what && r.state.elem() == elem.max(1) {
                return r.clone();
            }
        }
        let state = OpState::new(elem, what, self.world_rank);
        state.complete(Ok(0));
        let req = Request { state, bound: self.bound() };
        self.nulls[slot] = Some(req.clone());
        req
    }

    fn host_only(&self, what: &str) -> Error {
        self.invalid("buffer", format!("{what}: this queue is bound to a CUDA stream, so its buffers must be device buffers"))
    }

    /// Enqueues a send of `buf` to `peer` with `tag`; returns at once, moving nothing.
    pub fn enqueue_send<T: Element, B: QueueBuffer<T>>(&mut self, buf: &B, peer: usize, tag: u32) -> Result<Request> {
        self.enqueue_p2p(buf.lent(), peer, tag, true)
    }

    /// Enqueues a receive into `buf` from `peer` with `tag` (a message up to `buf`'s length on
    /// host backends, a whole number of its elements; exactly its length over NCCL); returns at
    /// once, moving nothing.
    pub fn enqueue_recv<T: Element, B: QueueBuffer<T>>(&mut self, buf: &B, peer: usize, tag: u32) -> Result<Request> {
        self.enqueue_p2p(buf.lent(), peer, tag, false)
    }

    fn enqueue_p2p<T: Element>(&mut self, buf: Lent<'_, T>, peer: usize, tag: u32, send: bool) -> Result<Request> {
        let dir = if send { "send" } else { "receive" };
        self.check_open()?;
        self.check_peer_tag(peer, tag, dir)?;
        match (&self.path, &buf) {
            (Path::Host { .. }, Lent::Host(_)) => {}
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(_)) => {}
            #[cfg(feature = "cuda")]
            (Path::Host { .. }, Lent::Device(_)) => return Err(self.invalid("buffer", "a host queue's buffers must be host SharedBufs")),
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Host(_)) => return Err(self.host_only(dir)),
        }
        let (elem, what) = (std::mem::size_of::<T>(), if send { What::Send { peer, tag } } else { What::Recv { peer, tag } });
        if peer == PROC_NULL {
            return Ok(self.null_request(elem, what));
        }
        self.check_lent(what, [Some((buf.key(), !send)), None])?;
        match (&mut self.path, buf) {
            (Path::Host { .. }, Lent::Host(b)) => {
                let mem = Mem::Host(Lease::new(b.lendable(), !send));
                let work = if send { Work::Send { peer, tag, mem } } else { Work::Recv { peer, tag, mem } };
                Ok(self.push_host(work, elem, what))
            }
            #[cfg(feature = "cuda")]
            (Path::Device(d), Lent::Device(b)) => {
                let state = d.enqueue_p2p(b, peer, tag, send, self.started + 1, &mut self.states)?;
                Ok(self.push_request(state))
            }
            #[cfg(feature = "cuda")]
            _ => unreachable!("buffer kinds checked above"),
        }
    }

    /// Enqueues a collective over device buffers.
    #[cfg(feature = "cuda")]
    fn device_coll<T: Element>(&mut self, c: Coll, send: &DeviceBuf<T>, recv: &DeviceBuf<T>) -> Result<Request> {
        let epoch = self.started + 1;
        let Path::Device(d) = &mut self.path else { unreachable!("device collectives are dispatched only on device queues") };
        let state = d.enqueue_coll(c, send, recv, epoch, &mut self.states)?;
        Ok(self.push_request(state))
    }

    fn push_host(&mut self, work: Work, elem: usize, what: What) -> Request {
        let (state, req) = self.new_request(elem, what);
        self.pending.push(Op::new(work, state, None));
        req
    }

    /// Enqueues a collective over host buffers: `f` runs on the progress thread with the
    /// buffers' contents once the batch is triggered.
    fn enqueue_host_coll<T: Element>(
        &mut self,
        name: &'static str,
        send: Option<&SharedBuf<T>>,
        recv: &SharedBuf<T>,
        f: impl FnOnce(&Communicator, Option<&[T]>, &mut [T]) -> Result<()> + Send + 'static,
    ) -> Result<Request> {
        let send = send.filter(|s| !s.same(recv)).cloned();
        let recv = recv.clone();
        let rank = self.world_rank;
        let mut f = Some(f);
        let work = Work::Coll(Box::new(move |comm, _deadline| {
            // Run only once both buffers are free (an earlier operation may still use them).
            let s = match &send {
                Some(s) => match s.read_now() {
                    Some(g) => Some(g),
                    None => return Ok(None),
                },
                None => None,
            };
            let Some(mut r) = recv.write_now() else { return Ok(None) };
            let f = f.take().expect("a collective runs once");
            f(comm, s.as_deref(), &mut r).map_err(|e| at_rank(e, rank))?;
            Ok(Some(r.len() * std::mem::size_of::<T>()))
        }));
        Ok(self.push_host(work, std::mem::size_of::<T>(), What::Coll(name)))
    }

    /// Enqueues `recv = reduce(op, every rank's send)`; `send` may be `recv` (in place).
    pub fn enqueue_all_reduce<T: Element, B: QueueBuffer<T>>(&mut self, send: &B, recv: &B, op: ReduceOp) -> Result<Request> {
        self.check_open()?;
        self.check_len("recv", recv.lent().len(), send.lent().len(), "all_reduce (same as send)")?;
        self.check_coll("all_reduce", Some(send.lent()), recv.lent())?;
        match (&self.path, send.lent(), recv.lent()) {
            (Path::Host { .. }, Lent::Host(s), Lent::Host(r)) => self.enqueue_host_coll("all_reduce", Some(s), r, move |c, s, r| match s {
                Some(s) => c.all_reduce(s, r, op),
                None => c.all_reduce_in_place(r, op),
            }),
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(s), Lent::Device(r)) => self.device_coll(Coll::AllReduce(op), s, r),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed()),
        }
    }

    /// Enqueues a broadcast of root's `buf` into every rank's `buf`.
    pub fn enqueue_broadcast<T: Element, B: QueueBuffer<T>>(&mut self, buf: &B, root: usize) -> Result<Request> {
        self.check_open()?;
        self.check_root(root)?;
        self.check_coll("broadcast", None, buf.lent())?;
        match (&self.path, buf.lent()) {
            (Path::Host { .. }, Lent::Host(b)) => self.enqueue_host_coll("broadcast", None, b, move |c, _, r| c.broadcast(r, root)),
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(b)) => self.device_coll(Coll::Broadcast(root), b, b),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed()),
        }
    }

    /// Enqueues an all_gather: every rank's `send` concatenated in rank order into `recv`
    /// (`size × send`). With `send` the same buffer as `recv`, in place: this rank's block of
    /// `recv` (a multiple of the communicator size) is its contribution.
    pub fn enqueue_all_gather<T: Element, B: QueueBuffer<T>>(&mut self, send: &B, recv: &B) -> Result<Request> {
        self.check_open()?;
        let rl = recv.lent().len();
        if send.lent().key() == recv.lent().key() {
            if rl % self.size != 0 {
                return Err(self.invalid("recv", format!("length {rl} is not a multiple of the communicator size {}", self.size)));
            }
        } else {
            self.check_len("recv", rl, send.lent().len() * self.size, "all_gather (size × send)")?;
        }
        self.check_coll("all_gather", Some(send.lent()), recv.lent())?;
        match (&self.path, send.lent(), recv.lent()) {
            (Path::Host { .. }, Lent::Host(s), Lent::Host(r)) => self.enqueue_host_coll("all_gather", Some(s), r, |c, s, r| match s {
                Some(s) => c.all_gather(s, r),
                None => c.all_gather_in_place(r),
            }),
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(s), Lent::Device(r)) => self.device_coll(Coll::AllGather, s, r),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed()),
        }
    }

    /// Enqueues a reduce_scatter: `send` (`size × recv`) reduced, rank r keeps block r.
    pub fn enqueue_reduce_scatter<T: Element, B: QueueBuffer<T>>(&mut self, send: &B, recv: &B, op: ReduceOp) -> Result<Request> {
        self.check_open()?;
        self.check_len("send", send.lent().len(), recv.lent().len() * self.size, "reduce_scatter (size × recv)")?;
        self.check_coll("reduce_scatter", Some(send.lent()), recv.lent())?;
        match (&self.path, send.lent(), recv.lent()) {
            (Path::Host { .. }, Lent::Host(s), Lent::Host(r)) => {
                self.enqueue_host_coll("reduce_scatter", Some(s), r, move |c, s, r| c.reduce_scatter(s.unwrap_or(&[]), r, op))
            }
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(s), Lent::Device(r)) => self.device_coll(Coll::ReduceScatter(op), s, r),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed()),
        }
    }

    /// Enqueues an all_to_all: block j of `send` goes to block (this rank) of rank j's `recv`.
    pub fn enqueue_all_to_all<T: Element, B: QueueBuffer<T>>(&mut self, send: &B, recv: &B) -> Result<Request> {
        self.check_open()?;
        let (sl, rl) = (send.lent().len(), recv.lent().len());
        self.check_len("recv", rl, sl, "all_to_all (same as send)")?;
        if sl % self.size != 0 {
            return Err(self.invalid("send", format!("length {sl} is not a multiple of the communicator size {}", self.size)));
        }
        if send.lent().key() == recv.lent().key() {
            return Err(self.invalid("recv", "all_to_all cannot run in place: pass two buffers"));
        }
        self.check_coll("all_to_all", Some(send.lent()), recv.lent())?;
        match (&self.path, send.lent(), recv.lent()) {
            (Path::Host { .. }, Lent::Host(s), Lent::Host(r)) => {
                self.enqueue_host_coll("all_to_all", Some(s), r, |c, s, r| c.all_to_all(s.unwrap_or(&[]), r))
            }
            #[cfg(feature = "cuda")]
            (Path::Device(_), Lent::Device(s), Lent::Device(r)) => self.device_coll(Coll::AllToAll, s, r),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed()),
        }
    }

    fn mixed(&self) -> Error {
        match self.path {
            Path::Host { .. } => self.invalid("buffer", "a host queue's buffers must all be host SharedBufs"),
            #[cfg(feature = "cuda")]
            Path::Device(_) => self.host_only("collective"),
        }
    }

    /// Host time the calling thread spent blocked in this queue's calls so far: in starts held
    /// back by the cap on operations in flight and in [`synchronize`](CommQueue::synchronize)
    /// (benchmarks report it: the point of a stream-triggered queue is that the host does not
    /// wait at every exchange).
    pub fn host_blocked(&self) -> Duration {
        self.blocked
    }

    /// Blocks (bounded) while more than [`MAX_IN_FLIGHT`] started operations are incomplete.
    fn throttle(&mut self, in_flight: &dyn Fn() -> u64) -> Result<()> {
        if in_flight() <= MAX_IN_FLIGHT {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = self.throttle_wait(in_flight);
        self.blocked += t0.elapsed();
        r
    }

    fn throttle_wait(&self, in_flight: &dyn Fn() -> u64) -> Result<()> {
        let deadline = Instant::now() + self.bound();
        let mut pause = Duration::from_micros(5);
        while in_flight() > MAX_IN_FLIGHT {
            self.check_open()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    rank: self.world_rank,
                    op: format!("start: more than {MAX_IN_FLIGHT} operations stayed in flight"),
                    after: self.bound(),
                });
            }
            std::thread::sleep(pause);
            // Short naps: the queue drains about one batch per nap, so a long one leaves it idle.
            pause = (pause * 2).min(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Puts one trigger on the queue: every operation enqueued since the last start is posted
    /// once the queue reaches this point — at once, whatever the operations of earlier starts
    /// are still doing (only [`wait`](CommQueue::wait) orders later work). Returns at once (it
    /// blocks, bounded, only while more than [`MAX_IN_FLIGHT`] operations are in flight).
    /// Over NCCL the batch starts from this point of the stream but is issued at the next
    /// `wait` or `synchronize`, together with the other starts before it (NCCL runs a
    /// communicator's kernels in issue order, so a group per start would hold later starts
    /// behind this one); its requests complete only after that.
    pub fn start(&mut self) -> Result<()> {
        self.check_open()?;
        if self.outstanding.len() >= self.prune_at {
            self.prune();
            self.prune_at = (2 * self.outstanding.len()).max(PRUNE_MIN);
        }
        let epoch = self.started + 1;
        // Queues whose batches the progress thread runs hold the cap on operations in flight
        // (the channel's handle is cloned only when the start must wait for it).
        let ch = match &self.path {
            Path::Host { ch, .. } => Some(ch),
            #[cfg(feature = "cuda")]
            Path::Device(d) => d.channel(),
        };
        if let Some(ch) = ch.filter(|ch| ch.in_flight.load(Ordering::Acquire) > MAX_IN_FLIGHT).cloned() {
            self.throttle(&|| ch.in_flight.load(Ordering::Acquire))?;
        }
        self.lent.clear();
        self.lending = [None, None];
        match &mut self.path {
            Path::Host { ch, q, sig } => {
                let ops = std::mem::take(&mut self.pending);
                self.pending = ch.submit(Batch { epoch, ops });
                let (sig, ch) = (sig.clone(), ch.clone());
                q.submit(move || {
                    sig.trigger.store(epoch, Ordering::Release);
                    // Post the batch's sends and receives from this task at once (a batch with
                    // a collective is left to the engine, so the tasks behind this one are not
                    // held while it runs); the engine picks up whatever this does not, woken
                    // only if no wait task of this queue will drive the batch.
                    ch.progress(false);
                    if ch.wants_engine() {
                        ch.wake();
                    }
                });
            }
            #[cfg(feature = "cuda")]
            Path::Device(d) => d.start(epoch, self.timeout + SLACK)?,
        }
        self.started = epoch;
        self.outstanding.append(&mut self.unstarted);
        Ok(())
    }

    /// Puts one wait on the queue: later work on the queue runs once every operation started so
    /// far completed (or failed — the error is then on the requests and [`synchronize`]). The
    /// host does not block. With operations enqueued since the last start it is refused (an
    /// `InvalidArgument` naming how many, nothing put on the queue): it would cover none of
    /// them, so a task after it would read what they have not received yet.
    ///
    /// [`synchronize`]: CommQueue::synchronize
    pub fn wait(&mut self) -> Result<()> {
        self.check_open()?;
        if !self.unstarted.is_empty() {
            let n = self.unstarted.len();
            return Err(self.invalid(
                "queue",
                format!(
                    "wait() with {n} operation{} enqueued but never started: a wait covers only started operations, \
                     so call start() first (nothing was put on the queue)",
                    if n == 1 { "" } else { "s" }
                ),
            ));
        }
        let epoch = self.started;
        if epoch == 0 {
            return Ok(());
        }
        match &mut self.path {
            Path::Host { q, sig, ch } => {
                let (sig, ch, bound, world_rank) = (sig.clone(), ch.clone(), self.timeout + SLACK, self.world_rank);
                // The wait task drives the batches it waits for (`wait_done`).
                ch.delegate(epoch);
                q.submit(move || {
                    if !sig.wait_done(epoch, bound, &ch) {
                        // Never hold the queue forever; keep the error for `synchronize`.
                        let e = Error::Timeout { rank: world_rank, op: format!("the queue's wait for start {epoch}"), after: bound };
                        sig.stalled.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                        sig.has_stalled.store(true, Ordering::Release);
                    }
                });
            }
            #[cfg(feature = "cuda")]
            Path::Device(d) => d.wait(epoch, self.timeout + SLACK)?,
        }
        Ok(())
    }

    /// Drops the requests of completed operations from the front of `outstanding` (start
    /// order), stopping at the first one in flight. It only reads what is known already (no
    /// event is recorded or queried, no request's lock taken for a device-completed one): the
    /// device path learns completions at its waits, so a start makes no CUDA call here.
    fn prune(&mut self) {
        let live = self.outstanding.iter().position(|r| !r.state.known_done()).unwrap_or(self.outstanding.len());
        for r in self.outstanding.drain(..live) {
            self.states.give(r.state);
        }
    }

    /// Drops every completed request from `outstanding` (before counting what is in flight).
    fn prune_all(&mut self) {
        let mut live = 0;
        for i in 0..self.outstanding.len() {
            if !self.outstanding[i].state.is_done() {
                self.outstanding.swap(live, i);
                live += 1;
            }
        }
        for r in self.outstanding.drain(live..) {
            self.states.give(r.state);
        }
    }

    /// Waits on the host (bounded) until the queue ran everything submitted to it and every
    /// started operation completed, its received data in the buffers (a stream queue first puts
    /// a [`wait`](CommQueue::wait) on the stream for starts not waited for); returns the first
    /// error among them.
    pub fn synchronize(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let r = self.synchronize_inner();
        self.blocked += t0.elapsed();
        r
    }

    fn synchronize_inner(&mut self) -> Result<()> {
        let bound = self.bound();
        let settled = match &mut self.path {
            Path::Host { q, .. } => {
                q.synchronize(bound)?;
                false
            }
            #[cfg(feature = "cuda")]
            Path::Device(d) => {
                // Starts not waited for: the staged path uploads their received data at a wait,
                // so put one on the stream first (nothing if the last start was waited).
                if self.started > 0 {
                    d.wait(self.started, self.timeout + SLACK)?;
                }
                d.synchronize()?
            }
        };
        if settled {
            // Every started operation completed without an error of its own (the device path
            // says so after synchronizing its stream): nothing to ask the requests, which
            // learn their completion when asked.
            for r in self.outstanding.drain(..) {
                self.states.give(r.state);
            }
        }
        let mut first = None;
        for r in self.outstanding.drain(..) {
            if let Err(e) = r.wait() {
                first.get_or_insert(e);
            }
            self.states.give(r.state);
        }
        if let Some(e) = self.failure() {
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }

    /// Ends the queue and gives the communicator back. Closing with operations in flight is an
    /// error: operations enqueued but never started are withdrawn (their requests fail), started
    /// ones are waited for (bounded, so no buffer is freed under a transfer) and those still
    /// held after the bound are withdrawn (cancelled on the backend, their requests failed), and
    /// the error says how many there were; the communicator is then dropped. Either way the
    /// queue's progress thread has ended when this returns. Call
    /// [`synchronize`](CommQueue::synchronize) first to close cleanly.
    pub fn close(mut self) -> Result<Communicator> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<Communicator> {
        self.closed = true;
        self.prune_all();
        let never_started = self.unstarted.len();
        let withdrawn = Error::invalid(self.world_rank, "queue", "closed before this operation was started");
        for r in self.unstarted.drain(..) {
            r.state.complete(Err(withdrawn.clone()));
        }
        self.pending.clear();
        let in_flight = self.outstanding.len();
        let settled = self.synchronize();
        let bound = self.bound();
        let comm = match &mut self.path {
            Path::Host { ch, .. } => ch.take_comm(bound),
            #[cfg(feature = "cuda")]
            Path::Device(d) => d.take_comm(bound),
        };
        if never_started + in_flight > 0 {
            return Err(Error::invalid(
                self.world_rank,
                "queue",
                format!(
                    "closed with operations in flight: {never_started} enqueued but never started (withdrawn), \
                     {in_flight} started and not complete (waited for: {})",
                    match &settled {
                        Ok(()) => "completed".to_string(),
                        Err(e) => e.to_string(),
                    }
                ),
            ));
        }
        settled?;
        comm
    }
}

impl Drop for CommQueue {
    /// Dropping an open queue closes it; operations in flight make that an error, which is
    /// logged (never a panic, never a silent leak: started operations are waited for, bounded).
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Err(e) = self.shut_down() {
            tracing::error!(rank = self.world_rank, error = %e, "stream-triggered queue dropped with operations in flight");
        }
    }
}

fn at_rank(e: Error, rank: usize) -> Error {
    match e {
        Error::Timeout { op, after, .. } => Error::Timeout { rank, op, after },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::AddrHasher;
    use std::hash::Hasher;

    fn hash(n: usize) -> u64 {
        let mut h = AddrHasher::default();
        h.write_usize(n);
        h.finish()
    }

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        // 64 buffers 16 bytes apart: their low bits pick the bucket, their top 7 the tag.
        let low: std::collections::HashSet<u64> = (0..64).map(|i| hash(0x7f00_0000_1000 + 16 * i) & 63).collect();
        let top: std::collections::HashSet<u64> = (0..64).map(|i| hash(0x7f00_0000_1000 + 16 * i) >> 57).collect();
        assert!(low.len() >= 32, "only {} of 64 low-bit buckets used", low.len());
        assert!(top.len() >= 24, "only {} of 64 tags used", top.len());
    }
}
