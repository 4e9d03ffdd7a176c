//! The progress engine: one thread per process that serves every host-backed [`CommQueue`]
//! (host queues, and CUDA streams on the staged path). It owns their communicators, watches each
//! queue's trigger counter, runs a started batch on the host backend and stores the completion
//! counter. It makes no CUDA call, so it can never block behind a stream that waits for it.
//!
//! [`CommQueue`]: crate::CommQueue

use crate::request::OpState;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use sucl_runtime::{Communicator, Error, Result, UnscopedRequest};

/// The completion value stored when a queue failed: above every epoch (so a stream waiting with
/// the cyclic `>=` of `cuStreamWaitValue64` is released), far below the wrap-around point.
pub(crate) const FAILED_DONE: u64 = 1 << 62;

/// The two counters of a queue: the trigger the queue stores at each start, the completion the
/// engine stores when a batch finished.
pub(crate) trait Signal: Send + Sync {
    /// The highest epoch the queue has triggered.
    fn triggered(&self) -> u64;
    /// Records that every batch up to `epoch` completed (or `FAILED_DONE`).
    fn complete(&self, epoch: u64);
    /// Whether a trigger can arrive without a wake-up (a device writes it), so the engine must
    /// poll while batches wait for their trigger.
    fn polled(&self) -> bool;
}

/// Memory lent to the backend by one point-to-point operation.
pub(crate) trait Lend: Send {
    /// Takes the memory for the backend (waiting, bounded, for tasks that use it) and returns
    /// its address and length. The memory stays valid until `give_back`.
    fn lend(&mut self, deadline: Instant) -> Result<(*mut u8, usize)>;
    /// The backend no longer touches the memory.
    fn give_back(&mut self);
}

/// A collective run to completion on the engine thread (by the deadline); returns the bytes it
/// produced.
pub(crate) type CollFn = Box<dyn FnOnce(&Communicator, Instant) -> Result<usize> + Send>;

/// What one operation does on the host backend.
pub(crate) enum Work {
    /// Nothing: a `PROC_NULL` peer.
    Null,
    /// A send of the lent memory.
    Send { peer: usize, tag: u32, mem: Box<dyn Lend> },
    /// A receive into the lent memory.
    Recv { peer: usize, tag: u32, mem: Box<dyn Lend> },
    /// A collective, run to completion on the engine thread; returns the bytes it produced.
    Coll(CollFn),
}

/// An enqueued operation.
pub(crate) struct Op {
    pub(crate) work: Work,
    pub(crate) state: Arc<OpState>,
    /// Handles that keep the program's buffers alive until the operation completed.
    pub(crate) keep: Option<Box<dyn Send>>,
    /// A receive that must fill exactly this many bytes (staged device receives).
    pub(crate) exact: Option<usize>,
}

/// A batch released by one start.
pub(crate) struct Batch {
    pub(crate) epoch: u64,
    pub(crate) ops: Vec<Op>,
}

/// A batch the engine is running.
struct Active {
    epoch: u64,
    ops: Vec<(Op, Option<UnscopedRequest>)>,
    deadline: Instant,
}

/// One queue as the engine sees it.
pub(crate) struct Channel {
    pub(crate) comm: Mutex<Option<Communicator>>,
    pub(crate) batches: Mutex<VecDeque<Batch>>,
    pub(crate) signal: Box<dyn Signal>,
    failed: Mutex<Option<Error>>,
    has_failed: AtomicBool,
    active: Mutex<Option<Active>>,
    /// Started operations not yet completed (the cap on operations in flight counts these).
    pub(crate) in_flight: AtomicU64,
    pub(crate) closed: AtomicBool,
    pub(crate) rank: usize,
    pub(crate) timeout: Duration,
    /// The communicator's backoff: how long the engine spins, then yields, before it naps.
    spin: Duration,
    yield_for: Duration,
    /// How long the engine spins while a batch of this channel waits for a trigger that only
    /// polling can see (a stream stores it): the communicator's whole spin, not the short one of
    /// host queues — no queue worker of this rank competes for the core, and each round of
    /// yielding adds a system call to the trigger round trip.
    poll_spin: Duration,
    /// The newest batch handed to the engine.
    submitted: AtomicU64,
    /// The newest batch holding a collective (run by the engine thread only).
    coll_epoch: AtomicU64,
    /// Every batch up to this one completed (or failed).
    finished: AtomicU64,
    /// The newest batch that a wait task of the host queue will drive to completion itself
    /// (see [`Channel::delegate`]).
    delegated: AtomicU64,
    /// Delegated wait tasks that stopped driving and sleep until their batch completes.
    stranded: AtomicU32,
}

impl Channel {
    pub(crate) fn new(comm: Communicator, signal: Box<dyn Signal>) -> Arc<Channel> {
        let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
        let timeout = comm.config().host.timeout;
        let backoff = comm.config().host.backoff;
        Arc::new(Channel {
            // Busy-poll only briefly, then yield: each rank adds two polling threads (the engine
            // and the queue's worker) to the ones the backoff was sized for.
            spin: backoff.spin.min(crate::SHORT_SPIN),
            poll_spin: backoff.spin,
            yield_for: backoff.yield_for + backoff.spin.saturating_sub(crate::SHORT_SPIN),
            comm: Mutex::new(Some(comm)),
            batches: Mutex::default(),
            signal,
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            active: Mutex::new(None),
            in_flight: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            rank,
            timeout,
            submitted: AtomicU64::new(0),
            coll_epoch: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            delegated: AtomicU64::new(0),
            stranded: AtomicU32::new(0),
        })
    }

    /// Records that a wait task on the host queue will drive every batch up to `epoch` itself
    /// (its thread would otherwise only wait there, as the baseline's thread tests its own
    /// requests): the engine then keeps off the cores and the queue's locks while those
    /// batches run, instead of polling them beside the queue's worker.
    pub(crate) fn delegate(&self, epoch: u64) {
        self.delegated.fetch_max(epoch, Ordering::AcqRel);
    }

    /// A delegated wait task stops driving (out of patience, it sleeps): the engine drives
    /// until [`Channel::unstrand`].
    pub(crate) fn strand(&self) {
        self.stranded.fetch_add(1, Ordering::AcqRel);
        engine().wake();
    }

    /// The sleeping wait task woke up.
    pub(crate) fn unstrand(&self) {
        self.stranded.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the engine thread must poll this channel now: a started batch that no wait task
    /// will drive, a collective (only the engine runs those), a wait task asleep, or a thread
    /// blocked on a request. Otherwise the queue's own wait tasks complete the batches and the
    /// engine only looks in at [`DELEGATED_NAP`] (what bounds the delay of an unusual program,
    /// say one whose task waits for a received buffer before the queue's wait).
    pub(crate) fn wants_engine(&self) -> bool {
        let finished = self.finished.load(Ordering::Acquire);
        let submitted = self.submitted.load(Ordering::Acquire);
        submitted > finished
            && (submitted > self.delegated.load(Ordering::Acquire)
                || self.coll_epoch.load(Ordering::Acquire) > finished
                || self.stranded.load(Ordering::Acquire) > 0
                || HOST_WAITERS.load(Ordering::Acquire) > 0)
    }

    /// The error that failed this queue, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().cloned()
    }

    /// Hands a started batch to the engine (the queue's trigger releases it).
    pub(crate) fn submit(&self, batch: Batch) {
        // Each batch counts once more for its trigger and completion on the queue.
        self.in_flight.fetch_add(batch.ops.len() as u64 + 1, Ordering::AcqRel);
        if let Some(e) = self.error() {
            // A failed queue runs nothing more: every later operation gets the error at once.
            let n = batch.ops.len() as u64 + 1;
            fail_ops(batch.ops.into_iter().map(|o| (o, None)), &e, None);
            self.in_flight.fetch_sub(n, Ordering::AcqRel);
            return;
        }
        if batch.ops.iter().any(|o| matches!(o.work, Work::Coll(_))) {
            self.coll_epoch.fetch_max(batch.epoch, Ordering::AcqRel);
        }
        self.submitted.fetch_max(batch.epoch, Ordering::AcqRel);
        self.batches.lock().unwrap_or_else(|p| p.into_inner()).push_back(batch);
        if self.signal.polled() || self.wants_engine() {
            engine().wake();
        }
    }

    /// Whether this channel has started batches the engine has not finished.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Fails every operation the engine holds and releases the queue's waits.
    fn fail(&self, e: Error, active: Option<Active>, comm: Option<&Communicator>) {
        tracing::error!(rank = self.rank, error = %e, "stream-triggered queue failed; releasing every wait");
        {
            let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_none() {
                *f = Some(e.clone());
            }
            self.has_failed.store(true, Ordering::Release);
        }
        let mut n = 0u64;
        if let Some(a) = active {
            n += a.ops.len() as u64 + 1;
            fail_ops(a.ops.into_iter(), &e, comm);
        }
        let queued: Vec<Batch> = self.batches.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for b in queued {
            n += b.ops.len() as u64 + 1;
            fail_ops(b.ops.into_iter().map(|o| (o, None)), &e, comm);
        }
        self.in_flight.fetch_sub(n, Ordering::AcqRel);
        self.finished.store(u64::MAX, Ordering::Release);
        self.signal.complete(FAILED_DONE);
    }

    /// One round of progress. Returns whether anything happened. Whoever calls it does the
    /// work: the engine thread, or a host queue's task that would otherwise wait for the engine
    /// (see [`Channel::drive`]); a round another thread is already doing is skipped, so the
    /// engine never blocks behind a queue's task. With `collectives` false, a batch holding a
    /// collective is left for the engine (it runs to completion where it is started).
    pub(crate) fn progress(&self, collectives: bool) -> bool {
        let mut active = match self.active.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let comm_guard = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let Some(comm) = comm_guard.as_ref() else { return false };
        if let Some(a) = active.as_mut() {
            return match test_batch(comm, a) {
                Ok(false) if Instant::now() > a.deadline => {
                    let what =
                        a.ops.iter().find(|(o, _)| !o.state.is_done()).map_or("a batch".to_string(), |(o, _)| o.state.what.to_string());
                    let e = Error::Timeout { rank: self.rank, op: format!("stream-triggered {what}"), after: self.timeout };
                    self.fail(e, active.take(), Some(comm));
                    true
                }
                Ok(false) => false,
                Ok(true) => {
                    self.finish(active.take().expect("active"));
                    true
                }
                Err(e) => {
                    self.fail(e, active.take(), Some(comm));
                    true
                }
            };
        }
        let batch = {
            let mut q = self.batches.lock().unwrap_or_else(|p| p.into_inner());
            match q.front() {
                Some(b)
                    if b.epoch <= self.signal.triggered() && (collectives || !b.ops.iter().any(|o| matches!(o.work, Work::Coll(_)))) =>
                {
                    q.pop_front()
                }
                _ => None,
            }
        };
        let Some(batch) = batch else { return false };
        let deadline = Instant::now() + self.timeout;
        match activate(comm, batch, deadline) {
            Ok(mut a) => match test_batch(comm, &mut a) {
                // Complete at once what needs no second look (an empty batch, collectives, a
                // message already there): one round less between trigger and completion.
                Ok(true) => self.finish(a),
                Ok(false) => *active = Some(a),
                Err(e) => self.fail(e, Some(a), Some(comm)),
            },
            Err((e, a)) => self.fail(e, Some(a), Some(comm)),
        }
        true
    }

    /// A batch all of whose operations completed: it leaves the count in flight and the queue
    /// learns its completion.
    fn finish(&self, a: Active) {
        self.in_flight.fetch_sub(a.ops.len() as u64 + 1, Ordering::AcqRel);
        self.finished.fetch_max(a.epoch, Ordering::AcqRel);
        self.signal.complete(a.epoch);
    }

    /// Whether a batch waits for a trigger that only polling can see.
    fn needs_poll(&self) -> bool {
        self.signal.polled() && !self.batches.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    fn idle(&self) -> bool {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).is_none() && self.batches.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

/// Posts a batch's operations in enqueue order (collectives run to completion where they stand).
fn activate(comm: &Communicator, batch: Batch, deadline: Instant) -> std::result::Result<Active, (Error, Active)> {
    let mut a = Active { epoch: batch.epoch, ops: Vec::with_capacity(batch.ops.len()), deadline };
    let mut ops = batch.ops.into_iter();
    while let Some(mut op) = ops.next() {
        let posted = match std::mem::replace(&mut op.work, Work::Null) {
            Work::Null => {
                op.state.complete(Ok(0));
                Ok(None)
            }
            Work::Send { peer, tag, mut mem } => {
                let r = mem.lend(deadline).and_then(|(p, len)| {
                    // SAFETY: the lease keeps the memory valid and unmodified until `give_back`,
                    // which runs only after the request completed or was cancelled.
                    unsafe { comm.post_send_unscoped(p, len, peer, tag) }
                });
                op.work = Work::Send { peer, tag, mem };
                r.map(Some)
            }
            Work::Recv { peer, tag, mut mem } => {
                let r = mem.lend(deadline).and_then(|(p, len)| {
                    // SAFETY: as for the send; the lease is exclusive.
                    unsafe { comm.post_recv_unscoped(p, len, peer, tag) }
                });
                op.work = Work::Recv { peer, tag, mem };
                r.map(Some)
            }
            Work::Coll(f) => f(comm, deadline).map(|bytes| {
                op.state.complete(Ok(bytes));
                None
            }),
        };
        match posted {
            Ok(req) => a.ops.push((op, req)),
            Err(e) => {
                a.ops.push((op, None));
                a.ops.extend(ops.map(|o| (o, None)));
                return Err((e, a));
            }
        }
    }
    Ok(a)
}

/// Tests every posted operation once; true when all completed.
fn test_batch(comm: &Communicator, a: &mut Active) -> Result<bool> {
    let mut all = true;
    for (op, req) in a.ops.iter_mut() {
        let Some(r) = req.as_ref() else { continue };
        match comm.test_unscoped(r)? {
            Some(bytes) => {
                *req = None;
                give_back(&mut op.work);
                match op.exact {
                    Some(want) if want != bytes => op.state.complete(Err(Error::Mismatch {
                        rank: op.state.rank,
                        what: format!("message length: the {} brought {bytes} bytes, the device buffer has {want} (a stream receive must be filled exactly)", op.state.what),
                    })),
                    _ => op.state.complete(Ok(bytes)),
                }
                op.keep.take();
            }
            None => all = false,
        }
    }
    Ok(all)
}

fn give_back(w: &mut Work) {
    if let Work::Send { mem, .. } | Work::Recv { mem, .. } = w {
        mem.give_back();
    }
}

/// Withdraws posted operations (so the backend no longer touches their memory), returns their
/// memory and records `e` on every one not already complete.
fn fail_ops(ops: impl Iterator<Item = (Op, Option<UnscopedRequest>)>, e: &Error, comm: Option<&Communicator>) {
    for (mut op, req) in ops {
        if let Some(r) = req {
            match comm {
                Some(c) => c.cancel_unscoped(r),
                // Unreachable by construction (posted requests always come with their
                // communicator); keep the memory rather than free it under the backend.
                None => {
                    std::mem::forget(op);
                    continue;
                }
            }
        }
        give_back(&mut op.work);
        op.state.complete(Err(e.clone()));
    }
}

/// The process's progress engine.
pub(crate) struct Engine {
    channels: Mutex<Vec<Arc<Channel>>>,
    generation: AtomicU64,
    thread: std::thread::Thread,
}

impl Engine {
    /// Wakes the engine thread (a host queue stored a trigger, or work was submitted).
    pub(crate) fn wake(&self) {
        self.thread.unpark();
    }

    pub(crate) fn register(&self, ch: Arc<Channel>) {
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).push(ch);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake();
    }
}

static ENGINE: OnceLock<Engine> = OnceLock::new();

/// Threads blocked in a host-side [`Request::wait`](crate::Request::wait) on an operation the
/// engine completes: while there are any, the engine polls every channel it serves.
pub(crate) static HOST_WAITERS: AtomicU32 = AtomicU32::new(0);

/// How often the engine looks at batches that a queue's wait task drives.
const DELEGATED_NAP: Duration = Duration::from_millis(1);

/// The engine, started on first use.
pub(crate) fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let t = std::thread::Builder::new().name("sucl-stream-progress".into()).spawn(run).expect("spawning the progress thread");
        Engine { channels: Mutex::default(), generation: AtomicU64::new(0), thread: t.thread().clone() }
    })
}

fn run() {
    // The spawning thread publishes the engine right after this thread starts.
    let eng = loop {
        if let Some(e) = ENGINE.get() {
            break e;
        }
        std::thread::park_timeout(Duration::from_millis(1));
    };
    let mut chans: Vec<Arc<Channel>> = vec![];
    let mut seen = u64::MAX;
    let (mut spin, mut yield_for, mut poll_spin) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut idle_rounds = 0u32;
    let mut idle_since = Instant::now();
    let mut idle = Duration::ZERO;
    loop {
        let g = eng.generation.load(Ordering::Acquire);
        if g != seen {
            chans = eng.channels.lock().unwrap_or_else(|p| p.into_inner()).clone();
            seen = g;
            // The most patient backoff among the queues served (none spins on an
            // oversubscribed host, where every spin takes a core from a rank).
            spin = chans.iter().map(|c| c.spin).max().unwrap_or_default();
            yield_for = chans.iter().map(|c| c.yield_for).max().unwrap_or_default();
            poll_spin = chans.iter().filter(|c| c.signal.polled()).map(|c| c.poll_spin).max().unwrap_or_default().max(spin);
        }
        let mut moved = false;
        let mut poll = false;
        let mut inflight = false;
        let mut watched = false;
        // A stream's queue that may store a trigger any moment (the program issues start/wait
        // pairs back to back).
        let mut stream_live = false;
        for ch in &chans {
            stream_live |= ch.signal.polled() && !ch.closed.load(Ordering::Acquire);
            moved |= ch.progress(true);
            poll |= ch.needs_poll();
            let busy = !ch.idle();
            inflight |= busy && ch.wants_engine();
            watched |= busy;
        }
        if chans.iter().any(|c| c.closed.load(Ordering::Acquire) && c.idle()) {
            let mut all = eng.channels.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|c| !(c.closed.load(Ordering::Acquire) && c.idle()));
            eng.generation.fetch_add(1, Ordering::AcqRel);
        }
        if moved {
            idle_rounds = 0;
            continue;
        }
        if idle_rounds == 0 {
            idle_since = Instant::now();
            idle = Duration::ZERO;
        }
        idle_rounds = idle_rounds.saturating_add(1);
        if inflight || poll {
            // Operations in flight, or a batch whose trigger is near: the program's next step
            // usually follows within microseconds, and a nap (or a wake-up from one) would add
            // its length to the step. So spin, then yield, for the communicator's backoff
            // (longer while a device may store a trigger any moment), and only then nap.
            // Reading the clock costs more than a spin round on some virtual machines.
            if idle_rounds % 32 == 1 {
                idle = idle_since.elapsed();
            }
            let patience = if poll { yield_for.max(Duration::from_millis(2)) } else { yield_for };
            let spin = if poll { poll_spin } else { spin };
            if idle < spin {
                std::hint::spin_loop();
            } else if idle < spin + patience {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(Duration::from_micros(50));
            }
        } else if stream_live && idle_rounds > 0 && {
            if idle_rounds % 32 == 1 {
                idle = idle_since.elapsed();
            }
            idle < poll_spin + yield_for
        } {
            // A stream queue just went quiet: its next start usually follows within
            // microseconds, and a trigger stored while this thread sleeps would wait for the
            // start's wake-up (a system call on the program's thread) and for this thread to be
            // scheduled — both on the round trip. Stay awake for the backoff, then nap.
            if idle < poll_spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        } else if watched {
            // Only batches that their queues' wait tasks drive: look in now and then (a wait
            // task that gives up driving, a host waiter or an undelegated batch wakes us).
            std::thread::park_timeout(DELEGATED_NAP);
        } else {
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }
}
