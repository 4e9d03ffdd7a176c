//! The progress engine: one thread per host-backed [`CommQueue`] (host queues, and CUDA streams
//! on the staged path), so that queues never wait for each other. It owns the queue's
//! communicator, watches the queue's trigger counter, posts each started batch on the host
//! backend and stores the completion counter. It makes no CUDA call, so it can never block
//! behind a stream that waits for it.
//!
//! Each start releases its batch on its own: a triggered batch is posted at once, whatever the
//! batches before it are still doing, and batches complete in any order (each operation's
//! request as soon as it is done); the completion counter (what a queue's `wait` holds on)
//! advances to the newest batch whose predecessors all completed too.
//! Operations are posted in enqueue order (what makes messages match in that order): one whose
//! buffer is still in use — by a task, or by an earlier batch's operation that writes it or
//! reads what this one writes — holds the operations behind it until the buffer is free,
//! bounded by the timeout.
//!
//! [`CommQueue`]: crate::CommQueue

use crate::request::OpState;
use crate::wakeup;
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
    /// Takes the memory for the backend if nothing else uses it now (a task, or an earlier
    /// operation that writes it) and returns its address and length; `None`: try again later.
    /// Never blocks. The memory stays valid until `give_back`.
    fn try_lend(&mut self) -> Option<(*mut u8, usize)>;
    /// The backend no longer touches the memory.
    fn give_back(&mut self);
}

/// Host memory that operations can lend to the backend (a `SharedBuf`'s, its element type
/// erased).
pub(crate) trait Lendable: Send + Sync {
    /// Takes shared (`exclusive` false) or exclusive access if nothing else holds the memory in
    /// a conflicting way now; its address and length in bytes. Never blocks.
    fn try_take(&self, exclusive: bool) -> Option<(*mut u8, usize)>;
    /// Gives back access taken by `try_take`.
    fn release(&self, exclusive: bool);
}

/// One operation's lease on host memory: the handle keeps the memory alive from enqueue, the
/// access (taken when the operation is posted) keeps tasks off it until the operation
/// completed. Costs no allocation: the handle is the buffer's own reference count.
pub(crate) struct Lease {
    mem: Arc<dyn Lendable>,
    exclusive: bool,
    taken: bool,
}

impl Lease {
    pub(crate) fn new(mem: Arc<dyn Lendable>, exclusive: bool) -> Lease {
        Lease { mem, exclusive, taken: false }
    }
}

impl Lend for Lease {
    fn try_lend(&mut self) -> Option<(*mut u8, usize)> {
        let got = self.mem.try_take(self.exclusive)?;
        self.taken = true;
        Some(got)
    }

    fn give_back(&mut self) {
        if std::mem::take(&mut self.taken) {
            self.mem.release(self.exclusive);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// The memory of one point-to-point operation: a host buffer's lease (no allocation), or other
/// memory behind its own [`Lend`].
pub(crate) enum Mem {
    Host(Lease),
    Other(Box<dyn Lend>),
}

impl Mem {
    fn lend(&mut self) -> &mut dyn Lend {
        match self {
            Mem::Host(l) => l,
            Mem::Other(b) => &mut **b,
        }
    }
}

/// A collective run to completion on the progress thread (by the deadline); returns the bytes it
/// produced, or `None` (having done nothing) while one of its buffers is in use — it is then
/// called again later.
pub(crate) type CollFn = Box<dyn FnMut(&Communicator, Instant) -> Result<Option<usize>> + Send>;

/// What one operation does on the host backend.
pub(crate) enum Work {
    /// Nothing: a `PROC_NULL` peer, or a collective already run.
    Null,
    /// A send of the lent memory.
    Send { peer: usize, tag: u32, mem: Mem },
    /// A receive into the lent memory.
    Recv { peer: usize, tag: u32, mem: Mem },
    /// A collective, run to completion on the progress thread; returns the bytes it produced.
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
    /// The backend's request while the operation is posted and not complete.
    req: Option<UnscopedRequest>,
}

impl Op {
    /// An operation not posted yet.
    pub(crate) fn new(work: Work, state: Arc<OpState>, exact: Option<usize>) -> Op {
        Op { work, state, keep: None, exact, req: None }
    }
}

/// A batch released by one start.
pub(crate) struct Batch {
    pub(crate) epoch: u64,
    pub(crate) ops: Vec<Op>,
}

/// A triggered batch on its way: its operations are posted in order (`ops[..posted]`), each
/// with its backend request until it completes.
struct Running {
    epoch: u64,
    ops: Vec<Op>,
    posted: usize,
    /// Operations not complete yet.
    left: usize,
    /// Whether every operation completed and the batch left the count in flight (it may do so
    /// before the batches started before it: only the completion counter waits for those).
    released: bool,
    deadline: Instant,
}

/// What one progress round works on, under one lock (a round takes it once, not once each).
struct Engine {
    /// The communicator, until the queue is closed.
    comm: Option<Communicator>,
    /// Triggered batches not yet complete, oldest first.
    running: VecDeque<Running>,
    /// Emptied operation lists of finished batches, on their way back to the queue (through
    /// [`Queued::spare`] at the next admission, which takes that lock anyway).
    spare: Vec<Vec<Op>>,
}

/// Batches handed to the engine and not triggered yet, and operation lists to reuse.
#[derive(Default)]
struct Queued {
    batches: VecDeque<Batch>,
    /// Emptied operation lists that `submit` hands back to the queue for its next batch, so
    /// that neither the queue (growing a fresh list per batch) nor the engine allocates per
    /// batch once the queue runs.
    spare: Vec<Vec<Op>>,
}

/// Most operation lists kept for reuse (a queue has about this many batches in flight at once
/// in a pipelined program), and the largest one kept.
const SPARE_LISTS: usize = 8;
const SPARE_CAPACITY: usize = 1024;

/// One queue as the engine sees it.
pub(crate) struct Channel {
    queued: Mutex<Queued>,
    pub(crate) signal: Box<dyn Signal>,
    failed: Mutex<Option<Error>>,
    has_failed: AtomicBool,
    engine: Mutex<Engine>,
    /// Started operations of batches not yet complete, and one per such batch (the cap on
    /// operations in flight counts these). A batch leaves the count when its own operations
    /// completed, whatever the batches before it are doing.
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
    /// The newest batch moved to the running ones (changed under the `engine` lock).
    admitted: AtomicU64,
    /// The newest batch holding a collective (run by the progress thread only).
    coll_epoch: AtomicU64,
    /// Every batch up to this one completed (or failed).
    finished: AtomicU64,
    /// The newest batch that a wait task of the host queue will drive to completion itself
    /// (see [`Channel::delegate`]).
    delegated: AtomicU64,
    /// Delegated wait tasks that stopped driving and sleep until their batch completes.
    stranded: AtomicU32,
    /// This channel's progress thread (to wake it without a lock).
    thread: OnceLock<std::thread::Thread>,
    /// The same thread, joined when the queue is closed.
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Channel {
    /// A channel over `comm`, with its own progress thread (which ends once the channel is
    /// closed and holds no batch).
    pub(crate) fn new(comm: Communicator, signal: Box<dyn Signal>) -> Result<Arc<Channel>> {
        let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
        let timeout = comm.config().host.timeout;
        let backoff = comm.config().host.backoff;
        let ch = Arc::new(Channel {
            // Busy-poll only briefly, then yield: each rank adds two polling threads (the engine
            // and the queue's worker) to the ones the backoff was sized for.
            spin: backoff.spin.min(crate::SHORT_SPIN),
            poll_spin: backoff.spin,
            yield_for: backoff.yield_for + backoff.spin.saturating_sub(crate::SHORT_SPIN),
            queued: Mutex::default(),
            signal,
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            engine: Mutex::new(Engine { comm: Some(comm), running: VecDeque::new(), spare: vec![] }),
            in_flight: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            rank,
            timeout,
            submitted: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            coll_epoch: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            delegated: AtomicU64::new(0),
            stranded: AtomicU32::new(0),
            thread: OnceLock::new(),
            handle: Mutex::new(None),
        });
        let served = ch.clone();
        let t = std::thread::Builder::new().name("sucl-stream-progress".into()).spawn(move || run(served)).map_err(|source| Error::Io {
            rank,
            during: "spawning a queue's progress thread".into(),
            source,
        })?;
        let _ = ch.thread.set(t.thread().clone());
        *ch.handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(ch)
    }

    /// Wakes this channel's progress thread (a trigger was stored, or work was submitted).
    pub(crate) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
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
        self.wake();
    }

    /// The sleeping wait task woke up.
    pub(crate) fn unstrand(&self) {
        self.stranded.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the progress thread must poll this channel now: a started batch that no wait
    /// task will drive, a collective (only the progress thread runs those), a wait task asleep,
    /// or a thread blocked on a request. Otherwise the queue's own wait tasks complete the
    /// batches and the engine only looks in at [`DELEGATED_NAP`] (what bounds the delay of an
    /// unusual program, say one whose task waits for a received buffer before the queue's wait).
    pub(crate) fn wants_engine(&self) -> bool {
        let finished = self.finished.load(Ordering::Acquire);
        let submitted = self.submitted.load(Ordering::Acquire);
        submitted > finished
            && (submitted > self.delegated.load(Ordering::Acquire)
                || self.coll_epoch.load(Ordering::Acquire) > finished
                || self.stranded.load(Ordering::Acquire) > 0
                || wakeup::HOST_WAITERS.load(Ordering::Acquire) > 0)
    }

    /// The error that failed this queue, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().cloned()
    }

    /// Hands a started batch to the engine (the queue's trigger releases it); returns an empty
    /// operation list (a finished batch's, when there is one) for the queue's next batch.
    pub(crate) fn submit(&self, batch: Batch) -> Vec<Op> {
        // Each batch counts once more for its trigger and completion on the queue.
        self.in_flight.fetch_add(batch.ops.len() as u64 + 1, Ordering::AcqRel);
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let spare = queued.spare.pop().unwrap_or_default();
        // Asked under the lock that `fail` drains the queued batches under (after recording
        // the error): either this sees the failure or `fail` sees this batch, so no batch of a
        // failed queue is ever posted.
        if let Some(e) = self.error() {
            drop(queued);
            // A failed queue runs nothing more: every later operation gets the error at once.
            let n = batch.ops.len() as u64 + 1;
            fail_ops(batch.ops.into_iter(), &e, None);
            self.in_flight.fetch_sub(n, Ordering::AcqRel);
            return spare;
        }
        if batch.ops.iter().any(|o| matches!(o.work, Work::Coll(_))) {
            self.coll_epoch.fetch_max(batch.epoch, Ordering::AcqRel);
        }
        self.submitted.fetch_max(batch.epoch, Ordering::AcqRel);
        queued.batches.push_back(batch);
        drop(queued);
        if self.signal.polled() || self.wants_engine() {
            self.wake();
        }
        spare
    }

    /// Whether this channel has started batches the engine has not finished.
    pub(crate) fn busy(&self) -> bool {
        self.submitted.load(Ordering::Acquire) > self.finished.load(Ordering::Acquire)
    }

    /// Fails every operation the engine holds and releases the queue's waits.
    fn fail(&self, e: Error, running: &mut VecDeque<Running>, comm: Option<&Communicator>) {
        tracing::error!(rank = self.rank, error = %e, "stream-triggered queue failed; releasing every wait");
        {
            let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_none() {
                *f = Some(e.clone());
            }
            self.has_failed.store(true, Ordering::Release);
        }
        let mut n = 0u64;
        for r in running.drain(..) {
            if !r.released {
                n += r.ops.len() as u64 + 1;
            }
            fail_ops(r.ops.into_iter(), &e, comm);
        }
        let queued = std::mem::take(&mut self.queued.lock().unwrap_or_else(|p| p.into_inner()).batches);
        for b in queued {
            n += b.ops.len() as u64 + 1;
            fail_ops(b.ops.into_iter(), &e, comm);
        }
        self.in_flight.fetch_sub(n, Ordering::AcqRel);
        self.finished.store(u64::MAX, Ordering::Release);
        self.signal.complete(FAILED_DONE);
    }

    /// One round of progress: takes in the batches triggered since the last round, posts what
    /// can be posted, tests what is posted and records the batches that completed. Returns
    /// whether anything happened. Whoever calls it does the work: the progress thread, or a
    /// host queue's task that would otherwise wait for it; a round another thread is already
    /// doing is skipped, so neither blocks behind the other. With `collectives` false, posting
    /// stops at a collective (it runs to completion where it is posted), leaving it to the
    /// progress thread.
    pub(crate) fn progress(&self, collectives: bool) -> bool {
        let mut engine = match self.engine.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let Engine { comm, running, spare } = &mut *engine;
        let Some(comm) = comm.as_ref() else { return false };
        let mut moved = self.admit(running, spare);
        match advance(comm, running, collectives, &self.in_flight) {
            Ok(m) => moved |= m,
            Err(e) => {
                self.fail(e, running, Some(comm));
                return true;
            }
        }
        while running.front().is_some_and(|r| r.posted == r.ops.len() && r.left == 0) {
            let mut r = running.pop_front().expect("front");
            self.finish(r.epoch);
            if spare.len() < SPARE_LISTS && r.ops.capacity() <= SPARE_CAPACITY {
                r.ops.clear();
                spare.push(r.ops);
            }
            moved = true;
        }
        if !moved && !running.is_empty() {
            if let Some(e) = self.overdue(running) {
                self.fail(e, running, Some(comm));
                return true;
            }
        }
        moved
    }

    /// Moves the batches whose trigger the queue stored to the running ones.
    fn admit(&self, running: &mut VecDeque<Running>, spare: &mut Vec<Vec<Op>>) -> bool {
        // Two loads instead of a lock in the usual round, where nothing new was triggered.
        let next = self.admitted.load(Ordering::Acquire) + 1;
        if self.submitted.load(Ordering::Acquire) < next || self.signal.triggered() < next {
            return false;
        }
        let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let room = SPARE_LISTS.saturating_sub(q.spare.len());
        q.spare.extend(spare.drain(..).take(room));
        let mut admitted = false;
        while q.batches.front().is_some_and(|b| b.epoch <= self.signal.triggered()) {
            let b = q.batches.pop_front().expect("front");
            let left = b.ops.len();
            self.admitted.store(b.epoch, Ordering::Release);
            let deadline = Instant::now() + self.timeout;
            running.push_back(Running { epoch: b.epoch, ops: b.ops, posted: 0, left, released: false, deadline });
            admitted = true;
        }
        admitted
    }

    /// The timeout error of the first running batch past its deadline, naming its first
    /// incomplete operation.
    fn overdue(&self, running: &VecDeque<Running>) -> Option<Error> {
        let now = Instant::now();
        let r = running.iter().find(|r| r.left > 0 && now > r.deadline)?;
        let (i, op) = r.ops.iter().enumerate().find(|(_, o)| !o.state.is_done())?;
        let why = if i >= r.posted { " (never posted: its buffer stayed in use by a task or by an earlier operation)" } else { "" };
        Some(Error::Timeout { rank: self.rank, op: format!("stream-triggered {}{why}", op.state.what), after: self.timeout })
    }

    /// A batch all of whose operations completed, as had every batch started before it: the
    /// queue learns its completion (reported in start order: an earlier batch still running
    /// holds this report back, though not the batch's leaving the count in flight).
    fn finish(&self, epoch: u64) {
        self.finished.fetch_max(epoch, Ordering::AcqRel);
        self.signal.complete(epoch);
    }

    /// Whether a batch waits for a trigger that only polling can see (atomics only: the
    /// progress thread asks this every idle round).
    fn needs_poll(&self) -> bool {
        self.signal.polled() && self.busy() && self.submitted.load(Ordering::Acquire) > self.admitted.load(Ordering::Acquire)
    }

    /// Takes the communicator back once the engine holds no batch of this channel, and ends
    /// the progress thread (joined before this returns). Batches still held after `bound` are
    /// failed here: posted operations are withdrawn (so the backend no longer touches their
    /// memory) and every buffer is given back — a batch whose trigger never came (its queue is
    /// stuck behind a task) would otherwise never time out, keeping the thread, the
    /// communicator and the buffers forever and posting its operations whenever the trigger
    /// came after all.
    pub(crate) fn take_comm(&self, bound: Duration) -> Result<Communicator> {
        self.closed.store(true, Ordering::Release);
        let deadline = Instant::now() + bound;
        while self.busy() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        let late = self.busy().then(|| {
            let left = self.in_flight.load(Ordering::Acquire);
            Error::Timeout {
                rank: self.rank,
                op: format!("closing a stream-triggered queue ({left} operations and triggers still held, withdrawn)"),
                after: bound,
            }
        });
        let comm = {
            // Blocks at most for a collective the progress thread is running (its own timeout).
            let mut engine = self.engine.lock().unwrap_or_else(|p| p.into_inner());
            let Engine { comm, running, .. } = &mut *engine;
            if let Some(e) = &late {
                self.fail(e.clone(), running, comm.as_ref());
            }
            comm.take()
        };
        self.join_progress_thread(bound);
        match (late, comm) {
            (Some(e), _) => Err(e),
            (None, Some(comm)) => Ok(comm),
            (None, None) => Err(Error::Config("the queue's communicator was already taken".into())),
        }
    }

    /// Waits (at most `bound`) for the progress thread to end — it does once the channel is
    /// closed and holds nothing — and joins it; one still running then is left to end alone.
    fn join_progress_thread(&self, bound: Duration) {
        let Some(handle) = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let deadline = Instant::now() + bound;
        while !handle.is_finished() && Instant::now() < deadline {
            self.wake();
            std::thread::sleep(Duration::from_micros(100));
        }
        if handle.is_finished() {
            let _ = handle.join();
        } else {
            tracing::warn!(rank = self.rank, "a stream-triggered queue's progress thread did not end within {bound:?} of closing");
        }
    }
}

/// Posts what can be posted of the running batches, in order, then tests every posted
/// operation once. Returns whether anything happened.
/// A batch whose operations all completed leaves `in_flight` here.
fn advance(comm: &Communicator, running: &mut VecDeque<Running>, collectives: bool, in_flight: &AtomicU64) -> Result<bool> {
    let mut moved = false;
    let mut held = false;
    for r in running.iter_mut() {
        while !held && r.posted < r.ops.len() {
            let op = &mut r.ops[r.posted];
            match post(comm, op, collectives, r.deadline)? {
                Posted::Request(q) => op.req = Some(q),
                Posted::Complete => r.left -= 1,
                Posted::NotYet => {
                    held = true;
                    break;
                }
            }
            r.posted += 1;
            moved = true;
        }
        moved |= test_posted(comm, r)?;
        if !r.released && r.posted == r.ops.len() && r.left == 0 {
            r.released = true;
            in_flight.fetch_sub(r.ops.len() as u64 + 1, Ordering::AcqRel);
        }
    }
    Ok(moved)
}

/// What posting one operation did.
enum Posted {
    /// In flight on the backend.
    Request(UnscopedRequest),
    /// Done already (a null peer, a collective).
    Complete,
    /// Not posted: its buffer is in use, or a collective left for the progress thread.
    NotYet,
}

fn post(comm: &Communicator, op: &mut Op, collectives: bool, deadline: Instant) -> Result<Posted> {
    match &mut op.work {
        Work::Null => {
            op.state.complete(Ok(0));
            Ok(Posted::Complete)
        }
        Work::Send { peer, tag, mem } => match mem.lend().try_lend() {
            // SAFETY: the lease keeps the memory valid and unmodified until `give_back`, which
            // runs only after the request completed or was cancelled.
            Some((p, len)) => unsafe { comm.post_send_unscoped(p, len, *peer, *tag) }.map(Posted::Request),
            None => Ok(Posted::NotYet),
        },
        Work::Recv { peer, tag, mem } => match mem.lend().try_lend() {
            // SAFETY: as for the send; the lease is exclusive.
            Some((p, len)) => unsafe { comm.post_recv_unscoped(p, len, *peer, *tag) }.map(Posted::Request),
            None => Ok(Posted::NotYet),
        },
        Work::Coll(_) if !collectives => Ok(Posted::NotYet),
        Work::Coll(f) => match f(comm, deadline)? {
            Some(bytes) => {
                op.work = Work::Null;
                op.state.complete(Ok(bytes));
                op.keep.take();
                Ok(Posted::Complete)
            }
            None => Ok(Posted::NotYet),
        },
    }
}

/// Tests every posted operation of `r` in flight once; returns whether any completed.
fn test_posted(comm: &Communicator, r: &mut Running) -> Result<bool> {
    let mut moved = false;
    for op in r.ops[..r.posted].iter_mut() {
        let Some(q) = op.req.as_ref() else { continue };
        if let Some(bytes) = comm.test_unscoped(q)? {
            op.req = None;
            give_back(&mut op.work);
            op.state.complete(check_length(op, bytes));
            op.keep.take();
            r.left -= 1;
            moved = true;
        }
    }
    Ok(moved)
}

/// The outcome of an operation that moved `bytes`: a received message must fill a staged
/// device buffer exactly, and any buffer with a whole number of elements.
fn check_length(op: &Op, bytes: usize) -> Result<usize> {
    let elem = op.state.elem();
    let what = op.state.what;
    match op.exact {
        Some(want) if want != bytes => Err(Error::Mismatch {
            rank: op.state.rank,
            what: format!(
                "message length: the {what} brought {bytes} bytes, the device buffer has {want} (a stream receive must be filled exactly)"
            ),
        }),
        _ if !bytes.is_multiple_of(elem) => Err(Error::Mismatch {
            rank: op.state.rank,
            what: format!("message length: the {what} brought {bytes} bytes, not a whole number of the buffer's {elem}-byte elements"),
        }),
        _ => Ok(bytes),
    }
}

fn give_back(w: &mut Work) {
    if let Work::Send { mem, .. } | Work::Recv { mem, .. } = w {
        mem.lend().give_back();
    }
}

/// Withdraws posted operations (so the backend no longer touches their memory), returns their
/// memory and records `e` on every one not already complete.
fn fail_ops(ops: impl Iterator<Item = Op>, e: &Error, comm: Option<&Communicator>) {
    for mut op in ops {
        if let Some(r) = op.req.take() {
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

/// How often the progress thread looks at batches that a queue's wait task drives.
const DELEGATED_NAP: Duration = Duration::from_millis(1);

/// A channel's progress thread: drives its batches until the channel is closed and idle.
fn run(ch: Arc<Channel>) {
    wakeup::register_progress_thread();
    let (spin, yield_for) = (ch.spin, ch.yield_for);
    let poll_spin = if ch.signal.polled() { ch.poll_spin.max(spin) } else { spin };
    let mut idle_rounds = 0u32;
    let mut idle_since = Instant::now();
    let mut idle = Duration::ZERO;
    loop {
        // A stream's queue that may store a trigger any moment (the program issues start/wait
        // pairs back to back).
        let stream_live = ch.signal.polled() && !ch.closed.load(Ordering::Acquire);
        if ch.progress(true) {
            idle_rounds = 0;
            continue;
        }
        let busy = ch.busy();
        if !busy && ch.closed.load(Ordering::Acquire) {
            break;
        }
        let poll = ch.needs_poll();
        let inflight = busy && ch.wants_engine();
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
        } else if busy {
            // Only batches that the queue's wait tasks drive: look in now and then (a wait task
            // that gives up driving, a host waiter or an undelegated batch wakes us).
            std::thread::park_timeout(DELEGATED_NAP);
        } else {
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }
    wakeup::unregister_progress_thread(std::thread::current().id());
}
